"""The version queries against a model: random commit histories on real chain stores
(puts, deletes, re-inserts, rewrites of the same value, compactions, retention, several
partitions), and every VersionedKeyQuery, MultiVersionedKeyQuery and ChangesQuery checked
against what the model derives from the versions the store retains."""

from __future__ import annotations

import random
import time
from itertools import pairwise
from typing import Any

import pytest

import iqkit
from iqkit import (
    Change,
    ChangesQuery,
    FailureReason,
    MultiVersionedKeyQuery,
    StateQueryRequest,
    VersionedKeyQuery,
    VersionedRecord,
)
from iqkit.store.chain.records import read_version
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.chain.write import COMPACT_AFTER_DELTAS
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.objects import open_objects

MISSING = object()


class Model:
    """What a store held at each version, and when each version was committed."""

    def __init__(self) -> None:
        self.state: dict[int, dict[Any, Any]] = {}
        self.times: dict[int, int] = {}

    def value(self, version: int, key: Any) -> Any:
        return self.state[version].get(key)

    def runs(self, key: Any, versions: list[int]) -> list[VersionedRecord]:
        """The key's records over ``versions`` (ascending)."""
        out = []
        i = 0
        while i < len(versions):
            value = self.value(versions[i], key)
            if value is None:
                i += 1
                continue
            first = i
            while i + 1 < len(versions) and self.value(versions[i + 1], key) == value:
                i += 1
            end = versions[i + 1] if i + 1 < len(versions) else None
            out.append(
                VersionedRecord(
                    value, self.times[versions[first]], self.times.get(end), versions[first]
                )
            )
            i += 1
        return out

    def changes(self, versions: list[int], keep) -> list[Change]:
        out = []
        for before, version in pairwise(versions):
            old, new = self.state[before], self.state[version]
            for key in sorted(set(old) | set(new), key=_key_bytes):
                if not keep(key) or old.get(key) == new.get(key):
                    continue
                a, b = old.get(key), new.get(key)
                kind = "insert" if a is None else "delete" if b is None else "update"
                out.append(Change(key, kind, b, a, version))
        return out


_SERDE = get_serde("string")


def _key_bytes(key: str) -> bytes:
    return _SERDE.serialize(key)


def _request(query) -> StateQueryRequest:
    return StateQueryRequest.in_store("s").with_query(query)


def _history(root, seed: int, partitions: int, commits: int, retain_at: dict[int, int]):
    """Commit a random history; returns the model. ``retain_at``: after commit N, keep
    only the newest M versions (retention with no grace)."""
    rng = random.Random(seed)
    iqkit.create_store(root, "s", partitions=partitions, value_serde="json", retention=1000)
    keys = [f"k{i:02d}" for i in range(12)]
    model = Model()
    current: dict[str, Any] = {}
    objects = open_objects(root)
    for n in range(1, commits + 1):
        with iqkit.StoreWriter(root, "s") as w:
            for key in rng.sample(keys, rng.randint(1, 5)):
                roll = rng.random()
                if roll < 0.25 and key in current:
                    w.delete(key)
                    current.pop(key)
                elif roll < 0.4 and key in current:
                    w.put(key, current[key])  # the same value again: no change
                else:
                    value = {"n": rng.randint(0, 3), "tag": rng.choice("xy")}
                    w.put(key, value)
                    current[key] = value
        version = w.version
        assert version == n
        model.state[version] = dict(current)
        model.times[version] = int(read_version(objects, "s", version).created_at * 1000)
        time.sleep(0.003)  # distinct commit milliseconds
        if n in retain_at:
            collect_chain_garbage(objects, "s", retain=retain_at[n], grace_seconds=0)
    return model, keys


@pytest.mark.parametrize(
    ("seed", "partitions", "commits", "retain_at"),
    [
        (1, 1, 2 * COMPACT_AFTER_DELTAS + 3, {}),
        (2, 3, 2 * COMPACT_AFTER_DELTAS + 5, {COMPACT_AFTER_DELTAS + 2: 6}),
        (3, 2, COMPACT_AFTER_DELTAS + 4, {5: 3, COMPACT_AFTER_DELTAS + 3: 4}),
    ],
)
def test_version_queries_equal_the_model(tmp_path, seed, partitions, commits, retain_at):
    root = tmp_path / "root"
    model, keys = _history(root, seed, partitions, commits, retain_at)
    rng = random.Random(seed * 7)
    with iqkit.open(root) as engine:
        retained = engine.versions("s")
        assert retained[-1] == commits
        if any(keep < n for n, keep in retain_at.items()):
            assert retained[0] > 1  # retention removed the oldest versions
        for v in retained:
            model.state[v]  # every retained version is modelled
        latest = retained[-1]
        probe_keys = [*keys, "absent"]

        def one(query):
            result = engine.query(_request(query))
            (qr,) = result.partition_results.values()
            return qr

        for key in probe_keys:
            runs = model.runs(key, retained)
            owner = engine.partition_for_key("s", key)
            # VersionedKeyQuery: the served version, each retained one, times between.
            qr = engine.query(_request(VersionedKeyQuery.with_key(key))).partition_results
            assert list(qr) == [owner]
            expected = next((r for r in runs if r.version <= latest and (
                r.valid_to is None)), None)  # fmt: skip
            assert qr[owner].result == expected
            for v in retained:
                got = one(VersionedKeyQuery.with_key(key).as_of_version(v))
                want = next(
                    (r for r in runs if retained.index(r.version) <= retained.index(v)
                     and (r.valid_to is None or model.times[v] < r.valid_to)),
                    None,
                )  # fmt: skip
                assert got.is_success and got.result == want, (key, v)
                # a time between this commit and the next reads this version
                t = model.times[v] + 1
                got = one(VersionedKeyQuery.with_key(key).as_of(t))
                assert got.result == want, (key, v, "as_of")
            # before the oldest retained commit
            got = one(VersionedKeyQuery.with_key(key).as_of(model.times[retained[0]] - 1))
            if retained[0] == 1:
                assert got.is_success and got.result is None
            else:
                assert got.failure_reason is FailureReason.DOES_NOT_EXIST
                assert f"{retained[0]}..{latest}" in got.failure_message
            if retained[0] > 1:
                got = one(VersionedKeyQuery.with_key(key).as_of_version(retained[0] - 1))
                assert got.failure_reason is FailureReason.DOES_NOT_EXIST
                assert "no longer retained" in got.failure_message
            # MultiVersionedKeyQuery: both orders, random time bounds
            got = one(MultiVersionedKeyQuery.with_key(key))
            assert got.result == list(reversed(runs)), key
            got = one(MultiVersionedKeyQuery.with_key(key).with_ascending_timestamps())
            assert got.result == runs
            for _ in range(4):
                a, b = sorted(rng.sample(sorted(model.times.values()), 2))
                a, b = a + rng.choice((-1, 0, 1)), b + rng.choice((-1, 0, 1))
                want = [
                    r for r in runs if r.timestamp <= b and (r.valid_to is None or r.valid_to > a)
                ]
                got = one(
                    MultiVersionedKeyQuery.with_key(key)
                    .from_time(a)
                    .to_time(b)
                    .with_ascending_timestamps()
                )
                assert got.result == want, (key, a, b)

        # ChangesQuery: random pairs of retained versions, all keys, a prefix, a range.
        pairs = [(retained[0], latest)] + [tuple(sorted(rng.sample(retained, 2))) for _ in range(6)]
        for a, b in pairs:
            for shape, keep in [
                (ChangesQuery.between(a, b), lambda k: True),
                (ChangesQuery.between(a, b).with_prefix("k0"), lambda k: k.startswith("k0")),
                (ChangesQuery.between(a, b).with_range("k03", "k08"),
                 lambda k: "k03" <= k <= "k08"),
            ]:  # fmt: skip
                want = model.changes([v for v in retained if a <= v <= b], keep)
                result = engine.query(_request(shape))
                assert sorted(result.partition_results) == list(range(partitions))
                got = []
                for p, qr in sorted(result.partition_results.items()):
                    assert qr.is_success, qr.failure_message
                    for change in qr.result:
                        assert engine.partition_for_key("s", change.key) == p
                    got.extend(qr.result)
                got.sort(key=lambda c: (c.version, _key_bytes(c.key)))
                assert got == want, (a, b, shape)
                # each partition's own list is in version order, then key order
                for qr in result.partition_results.values():
                    order = [(c.version, _key_bytes(c.key)) for c in qr.result]
                    assert order == sorted(order)


def test_changes_read_deltas_and_say_where_they_compared(tmp_path):
    """Adjacent versions are read from their delta files; the step a compaction made is
    compared whole, and the execution trace says which."""
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for n in range(COMPACT_AFTER_DELTAS + 2):
        with iqkit.StoreWriter(root, "s") as w:
            w.put(f"k{n}", n)
            if n:
                w.delete(f"k{n - 1}")
    with iqkit.open(root) as engine:
        latest = engine.version("s")
        result = engine.query(_request(ChangesQuery.between(1, latest)).enable_execution_info())
        qr = result.partition_results[0]
        kinds = [(c.version, c.key, c.kind) for c in qr.result]
        want = []
        for v in range(2, latest + 1):
            want += [(v, f"k{v - 2}", "delete"), (v, f"k{v - 1}", "insert")]
        assert kinds == want
        trace = " ".join(qr.execution_info)
        assert "compared whole" in trace  # the compaction's version
        assert "read from their delta files" in trace


def test_a_window_store_refuses_version_queries_in_one_line(tmp_path):
    root = tmp_path / "root"
    iqkit.create_store(root, "w", partitions=1, kind="window", window_size_ms=1000)
    with iqkit.StoreWriter(root, "w") as w:
        w.put("a", {"n": 1}, window_start=0)
    with iqkit.open(root) as engine:
        for query in (
            VersionedKeyQuery.with_key("a"),
            MultiVersionedKeyQuery.with_key("a"),
            ChangesQuery.between(1, 1),
        ):
            request = StateQueryRequest.in_store("w").with_query(query)
            (qr,) = engine.query(request).partition_results.values()
            assert qr.failure_reason is FailureReason.UNKNOWN_QUERY_TYPE
            assert "window store" in qr.failure_message
            assert type(query).__name__ in qr.failure_message


def test_nothing_published_and_bad_versions(tmp_path):
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=2)
    with iqkit.open(root) as engine:
        (qr,) = engine.query(_request(VersionedKeyQuery.with_key("a"))).partition_results.values()
        assert qr.is_success and qr.result is None
        for qr in engine.query(_request(ChangesQuery.between(1))).partition_results.values():
            assert qr.is_success and qr.result == []
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    with iqkit.open(root) as engine:
        for qr in engine.query(_request(ChangesQuery.between(1, 3))).partition_results.values():
            assert qr.failure_reason is FailureReason.DOES_NOT_EXIST
            assert "version 3 is not published" in qr.failure_message
    with pytest.raises(ValueError, match="before from_version"):
        ChangesQuery.between(3, 2)
    with pytest.raises(TypeError, match="version number"):
        VersionedKeyQuery.with_key("a").as_of_version("2")
    with pytest.raises(TypeError, match="epoch milliseconds"):
        VersionedKeyQuery.with_key("a").as_of("yesterday")
