"""Reliability probes of the store layer that hold in every format (rows of
RELIABILITY.md; see ``tests/reliability/registry.py``): read-only stores, readers that
write nothing, store names. The format's own crash and damage probes are in
``probes_chain.py``. Each raises ``AssertionError`` on a broken invariant and reports
what it checked and what was lost.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from faults import describe_changes, read_session, run_read_only, tree_state
from helpers import write_notebook_stores
from registry import Outcome, probe

import iqkit


def _random_stores(root: Path, rng: random.Random) -> None:
    write_notebook_stores(root)
    for i in range(rng.randint(0, 3)):
        with iqkit.StoreWriter(root, "totals") as w:
            for _ in range(rng.randint(1, 5)):
                k = f"x{rng.randrange(20)}"
                w.put(k, {"customer": k, "total": i}, source=("orders", i % 2, 40 + i))


@probe(
    "Read-only store",
    fault="a copy of the stores is made read-only for a reading process (read-only bind "
    "mount in a private mount namespace here; see tests/faults.py), which reads everything",
    unit="read-only session",
    fast=1,
    long=10,
)
def read_only_store(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    hows = set()
    for i in range(iterations):
        root = workdir / str(i) / "stores"
        _random_stores(root, rng)
        expected = read_session(root)
        session, proof, how = run_read_only(root)
        hows.add(f"{how} ({proof})")
        assert session == expected, f"{how}: the read-only session differs"
        assert "STORE_EXCEPTION" not in repr(session)
    return Outcome(
        checked=f"{iterations} full read sessions equal to the writable store's",
        notes=sorted(hows),
    )


@probe(
    "Readers write nothing",
    fault="a query session (every query kind, lags, versions, as_of) with an engine left "
    "open, as in a notebook; every file and folder under the root is compared",
    unit="session",
    fast=2,
    long=50,
)
def readers_write_nothing(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    entries = 0
    for i in range(iterations):
        root = workdir / str(i) / "stores"
        _random_stores(root, rng)
        before = tree_state(root)
        entries += len(before)
        engine = iqkit.open(root)
        read_session(root)
        for store in engine.store_names():
            engine.lags()
            engine.versions(store)
        assert describe_changes(before, tree_state(root)) == [], "changed while open"
        engine.close()
        assert describe_changes(before, tree_state(root)) == [], "changed after close"
    return Outcome(checked=f"{entries} files and folders (bytes and mtime), while open and after")


# -- store names ---------------------------------------------------------------------------
_NAME_PIECES = ["a", "Z", "9", "-", "_", " ", ".", "..", "/", "\\", "\x00", "é", "日本", "🙂",
                "\udc80", "\ud800", "\n", ":", "*"]  # fmt: skip


def _random_name(rng: random.Random) -> str:
    if rng.random() < 0.2:  # around the 255-byte limit
        piece = rng.choice(["a", "é", "日", "🙂"])
        return piece * (rng.randint(240, 270) // len(piece.encode()))
    return "".join(rng.choice(_NAME_PIECES) for _ in range(rng.randint(0, 6)))


@probe(
    "Store names",
    fault="random names: empty, dots, separators, NUL, newlines, lone surrogates, "
    "non-ASCII, around the 255-byte folder-name limit; create, write, read",
    unit="name",
    fast=150,
    long=3000,
)
def store_names(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    root = workdir / "stores"
    accepted = refused = 0
    for _ in range(iterations):
        name = _random_name(rng)
        try:
            iqkit.create_store(root, name, partitions=1)
        except ValueError as exc:
            message = str(exc)
            assert "store name" in message and len(message) < 200 and "\n" not in message[:-1], (
                f"{name!r}: {message!r}"
            )
            refused += 1
            continue
        accepted += 1
        with iqkit.StoreWriter(root, name) as w:
            w.put("k", 1)
        with iqkit.open(root) as engine:
            assert name in engine.store_names(), name
            result = engine.query(
                iqkit.StateQueryRequest.in_store(name).with_query(iqkit.KeyQuery.with_key("k"))
            ).only_partition_result()
            assert result is not None and result.result == 1, name
        shutil.rmtree(root / name)
    return Outcome(checked=f"{accepted} names accepted and usable, {refused} refused in one line")
