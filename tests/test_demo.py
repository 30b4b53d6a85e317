"""``make demo`` (``python -m iqkit demo``): the Spark pipeline into three stores, the
tour, and what a second or an interrupted run does to the folder. The demo runs in its own
process, as ``make demo`` runs it (it starts and stops its own Spark session)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import (
    kv_rows,
    tree_digest,
    user_environment,
    with_private_tmp,
)

import iqkit
from iqkit import demo
from iqkit.__main__ import main


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path_factory, monkeypatch) -> None:
    """This process's readers of chain stores build their databases in a cache of the
    test's own (``IQKIT_CACHE``), never the user's home."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path_factory.mktemp("iqkit-cache")))


def demo_command(root: Path) -> list[str]:
    return [sys.executable, "-m", "iqkit", "demo", "--root", str(root), "--no-progress"]


def demo_environment(cache: Path) -> dict[str, str]:
    """The environment the demo runs in, as a user's, but with its reader's cache
    (``IQKIT_CACHE``: the databases built for chain stores) in ``cache``, never the
    user's home."""
    return {**user_environment(), "IQKIT_CACHE": str(cache)}


def run_demo(root: Path, cache: Path, *, check_tmp: bool = False) -> str:
    """Run the demo as ``make demo`` does (its cache in ``cache``); with ``check_tmp``
    (where this process may make a private /tmp), also assert it leaves nothing in /tmp."""
    listing = root.parent / "tmp-after-demo.txt"
    command = demo_command(root)
    private = with_private_tmp(command, listing) if check_tmp else None
    done = subprocess.run(
        private or command,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root.parent,
        env=demo_environment(cache),  # as a user runs it: the system's /tmp, not make test's
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    if private:
        assert listing.read_text(encoding="utf-8").split() == [], "the demo left this in /tmp"
        listing.unlink()
    return done.stdout


def produced_orders(root: Path) -> list[dict]:
    """Every order in the demo's topic, read from its Parquet files (not from iqkit)."""
    table = pq.ParquetDataset(root / demo.WORK_DIR / "topics" / demo.TOPIC).read()
    return [json.loads(v) for v in table.column("value").to_pylist()]


def stores_snapshot(root: Path) -> dict:
    with iqkit.open(root) as engine:
        return {
            name: (engine.manifest(name).kind, engine.version(name))
            for name in engine.store_names()
        } | {"totals rows": kv_rows(engine, "totals"), "latest rows": kv_rows(engine, "latest")}


@pytest.mark.slow
def test_demo_writes_three_stores_prints_the_tour_and_a_second_run_replaces_them(
    tmp_path, tmp_path_factory
):
    root = tmp_path / "demo-stores"
    cache = tmp_path_factory.mktemp("demo-cache")
    out = run_demo(root, cache, check_tmp=True)
    assert any(cache.iterdir())  # the tour's reader built its databases there

    orders = produced_orders(root)
    assert len(orders) == demo.ORDERS + demo.LATE_ORDERS
    read = [o for o in orders if o["order"] < demo.ORDERS]  # the late ones stay unread
    with iqkit.open(root) as engine:
        assert engine.store_names() == ["latest", "per_minute", "totals"]
        assert engine.manifest("per_minute").kind == "window"
        totals = {k: v for _, k, v in kv_rows(engine, "totals")}
        assert sum(v["orders"] for v in totals.values()) == demo.ORDERS
        for customer, total in totals.items():
            mine = [o for o in read if o["customer"] == customer]
            assert (total["orders"], total["spent"]) == (len(mine), sum(o["amount"] for o in mine))
        latest = {k: v["order"] for _, k, v in kv_rows(engine, "latest")}
        assert latest == {c: max(o["order"] for o in read if o["customer"] == c) for c in totals}
        # the stream committed once per produce call, and knows the late orders exist
        assert engine.version("latest") == demo.PRODUCE_CALLS
        assert {p: i.offset_lag for p, i in engine.lags()["latest"].items()} == dict.fromkeys(
            range(demo.STORE_PARTITIONS), demo.LATE_ORDERS
        )
        assert {i.offset_lag for i in engine.lags()["totals"].values()} == {0}
        windows = engine.query(
            iqkit.StateQueryRequest.in_store("per_minute").with_query(
                iqkit.WindowKeyQuery.with_key_and_window_start_range(
                    demo.CUSTOMER, 0, 2**62
                ).with_descending_keys()
            )
        )
        starts = []
        for result in windows.partition_results.values():
            with result.result as it:
                starts += [kv.key.start for kv in it]
        assert starts == sorted(starts, reverse=True) and len(starts) > 5

    # The job with no sink: its state read from its checkpoint, every order in it.
    with iqkit.open(demo.items_checkpoint(root)) as engine:
        assert engine.store_names() == ["aggregate"]
        assert engine.version("aggregate") == demo.PRODUCE_CALLS + 1  # late orders: a batch
        items = {k: v for _, k, v in kv_rows(engine, "aggregate")}
    assert items == {  # an aggregation's state keeps Spark's buffer names, not the aliases
        item: {
            "count": sum(1 for o in orders if o["item"] == item),
            "sum": sum(o["amount"] for o in orders if o["item"] == item),
        }
        for item in {o["item"] for o in orders}
    }

    # The tour: each step's %iq line, then what the magic shows.
    for line in (
        ">>> %iq stores",
        f">>> %iq get totals {demo.CUSTOMER} us-ben ap-cleo --trace",
        ">>> %iq prefix totals eu- --limit 8",
        f">>> %iq window per_minute {demo.CUSTOMER} --from 2024-05-01T12:00",
        f">>> %iq get latest {demo.CUSTOMER} --bound orders:",
        ">>> %iq lag latest",
        f">>> %iq open {demo.items_checkpoint(root)}",
        ">>> %iq get aggregate coffee tea --trace",
    ):
        assert line in out
    assert f"micro-batch {demo.PRODUCE_CALLS - 1}: version {demo.PRODUCE_CALLS}" in out
    assert "TypedKeyValueLayer" in out  # the trace
    assert "NOT_UP_TO_BOUND" in out
    assert "np.float64" not in out
    assert out.rstrip().splitlines()[-1].startswith("Done in ")
    assert "`make lab` opens the same stores in JupyterLab" in out
    assert not (root / demo.WORK_DIR / "spark").exists()  # Spark's scratch is removed

    # A second run replaces the folder: nothing of the first run survives, and the
    # stores are the same stores again (fixed data), not a continuation.
    first = stores_snapshot(root)
    (root / "left-over.txt").write_text("from the first run")
    run_demo(root, cache)
    assert not (root / "left-over.txt").exists()
    assert stores_snapshot(root) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-stores"]


def test_demo_never_replaces_a_folder_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["demo", "--root", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was not written by `iqkit demo`" in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupted_demo_puts_the_previous_folder_back(tmp_path):
    root = tmp_path / "demo-stores"
    (root / demo.WORK_DIR).mkdir(parents=True)  # a previous demo's folder
    iqkit.create_store(root, "totals", partitions=2)
    with iqkit.StoreWriter(root, "totals") as w:
        w.put("eu-ana", {"orders": 1})
    before = tree_digest(root)
    cli = subprocess.Popen(
        demo_command(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # IQKIT_CACHE: _own_reader_cache
    )
    assert cli.stdout is not None
    for line in cli.stdout:  # Spark is up and the old folder is aside: interrupt it
        if "Producing" in line:
            cli.send_signal(signal.SIGINT)
            break
    cli.stdout.read()
    assert cli.wait(timeout=300) == 130
    assert tree_digest(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-stores"]
