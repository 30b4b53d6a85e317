"""Stream-stream join state read from the frozen checkpoints, against Spark 4.3's own
state reader (``statestore.json``): every version and partition of every join cell, each
side a store keyed by the join key whose value is the key's buffered rows.

The oracle's ``joinSide`` rows are one row per buffered row (Spark's reader drops
``matched`` from them); its ``storeName=<side>-keyWithIndexToValue`` rows are the raw
rows with their index and ``matched``: iqkit's list is those rows in index order.

Spark 4.3's reader fails on the join in checkpoint format v2 (the ``ckptv2`` cell); that
query's inputs and output are its twin's (the same cell in format v1), so its state is
held to the twin's reading.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import iqkit
from iqkit import (
    ChangesQuery,
    KeyQuery,
    RangeQuery,
    StateQueryRequest,
    VersionedKeyQuery,
)

CELLS = Path("tests/data/checkpoints")
#: Cells Spark 4.3's reader reads, whose join state iqkit serves.
_READ = ("join-inner-v1-*", "join-inner-v2-*", "join-inner-v3-*", "join-leftouter-*", "join-agg-*")
#: Join state format 4 stays refused.
_REFUSED = ("join-inner-v4-*",)
#: Cells held to another cell's oracle (module docstring).
_TWINS = {"join-inner-v2-ckptv2-rocksdb-changelog": "join-inner-v2-rocksdb-changelog"}


def _cells(patterns: tuple[str, ...], exclude: tuple[str, ...] = ()) -> list[Any]:
    found = set()
    for pattern in patterns:
        for cell in CELLS.glob(f"*/{pattern}"):
            if (cell / "statestore.json").exists() and not any(cell.match(x) for x in exclude):
                found.add(cell)
    params = []
    for cell in sorted(found):
        params.append(pytest.param(cell, id=f"{cell.parent.name}/{cell.name}"))
    return params


READ_CELLS = _cells(_READ, exclude=_REFUSED)
REFUSED_CELLS = _cells(_REFUSED)


def _oracle(cell: Path) -> dict[str, Any]:
    twin = cell.parent / _TWINS.get(cell.name, cell.name)
    return json.loads((twin / "statestore.json").read_text())


def _joins(cell: Path) -> list[dict[str, Any]]:
    oracle = _oracle(cell)
    # Spark 3.5 wrote no operator metadata: its oracle entries name no operator, only the
    # kind of state the maker read them as.
    return [
        op
        for op in oracle["operators"]
        if op.get("operatorName") == "symmetricHashJoin"
        or (op.get("operatorName") is None and op.get("kind") == "join")
    ]


def _store(cell: Path, op: dict[str, Any], side: str) -> str:
    oracle = _oracle(cell)
    single = len(oracle["operators"]) == 1
    return f"join.{side}" if single else f"join-{op['operatorId']}.{side}"


def _read(op: dict[str, Any], option: str, value: str) -> dict[str, Any]:
    (read,) = [r for r in op["reads"] if r["options"].get(option) == value]
    return read


def _iso(micros: int) -> str:
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _as_iqkit(row: dict[str, Any], timestamps: set[str]) -> dict[str, Any]:
    """An oracle row's value as iqkit writes it (timestamps as ISO-8601 text)."""
    return {k: _iso(v) if k in timestamps and v is not None else v for k, v in row.items()}


def _timestamps(engine: iqkit.StateEngine, store: str) -> set[str]:
    schema = engine.manifest(store).properties["spark_value_schema"]
    return {f["name"] for f in schema["fields"] if f["type"] == "timestamp"}


def _key(key: dict[str, Any]) -> Any:
    parts = tuple(key[f"field{i}"] for i in range(len(key)))
    return parts[0] if len(parts) == 1 else parts


def _scan(engine: iqkit.StateEngine, store: str) -> dict[int, dict[Any, list[dict[str, Any]]]]:
    result = engine.query(StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds()))
    out = {}
    for p, partition in result.partition_results.items():
        assert partition.is_success, partition.failure_message
        out[p] = {kv.key: kv.value for kv in partition.result}
    return out


def _canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


@pytest.mark.parametrize("cell", READ_CELLS)
def test_every_version_and_partition_of_each_side_is_what_spark_reads(cell):
    checkpoint = str(cell / "checkpoint")
    joins = _joins(cell)
    assert joins
    for op in joins:
        for side in ("left", "right"):
            store = _store(cell, op, side)
            shaped = _read(op, "joinSide", side)
            raw = _read(op, "storeName", f"{side}-keyWithIndexToValue")
            raw_batches = {b["stateVersion"]: b for b in raw["batches"]}
            counted = _read(op, "storeName", f"{side}-keyToNumValues")
            counts = {b["stateVersion"]: b for b in counted["batches"]}
            rows_seen = 0
            for batch in shaped["batches"]:
                version = batch["stateVersion"]
                with iqkit.open(checkpoint, as_of=version) as engine:
                    assert store in engine.store_names()
                    timestamps = _timestamps(engine, store)
                    got = _scan(engine, store)
                assert sorted(got) == sorted(int(p) for p in batch["partitions"])
                for p, rows in batch["partitions"].items():
                    want: dict[Any, list[dict[str, Any]]] = defaultdict(list)
                    for row in rows:
                        want[_key(row["key"])].append(_as_iqkit(row["value"], timestamps))
                    mine = got[int(p)]
                    assert sorted(mine) == sorted(want), (store, version, p)
                    for key, values in mine.items():
                        plain = [{k: v for k, v in r.items() if k != "matched"} for r in values]
                        assert _canonical(plain) == _canonical(want[key]), (store, version, key)
                        rows_seen += len(values)
                    # The list is the raw store's rows in index order, ``matched`` kept.
                    indexed: dict[Any, dict[int, dict[str, Any]]] = defaultdict(dict)
                    for row in raw_batches[version]["partitions"][p]:
                        key = dict(row["key"])
                        index = key.pop("index")
                        indexed[_key(key)][index] = _as_iqkit(row["value"], timestamps)
                    for key, values in mine.items():
                        by_index = indexed[key]
                        assert values == [by_index[i] for i in range(len(values))], (store, key)
                    # As many rows as keyToNumValues counts.
                    number = {
                        _key(row["key"]): row["value"]["value"]
                        for row in counts[version]["partitions"][p]
                    }
                    assert {k: len(v) for k, v in mine.items()} == number
            assert rows_seen > 0, store


def _state(op: dict[str, Any], side: str, version: int) -> dict[Any, tuple[int, list[str]]]:
    """The oracle's side at ``version``: key -> (partition, its rows canonical)."""
    (batch,) = [b for b in _read(op, "joinSide", side)["batches"] if b["stateVersion"] == version]
    out: dict[Any, tuple[int, list[dict[str, Any]]]] = {}
    for p, rows in batch["partitions"].items():
        for row in rows:
            out.setdefault(_key(row["key"]), (int(p), []))[1].append(row["value"])
    return {k: (p, _canonical(rows)) for k, (p, rows) in out.items()}


@pytest.mark.parametrize("cell", READ_CELLS)
def test_key_lookups_go_to_the_partition_spark_keeps_the_key_in(cell):
    checkpoint = str(cell / "checkpoint")
    for op in _joins(cell):
        for side in ("left", "right"):
            store = _store(cell, op, side)
            version = max(b["stateVersion"] for b in op["reads"][0]["batches"])
            state = _state(op, side, version)
            assert state
            with iqkit.open(checkpoint, as_of=version) as engine:
                timestamps = _timestamps(engine, store)
                for key, (partition, rows) in state.items():
                    assert engine.partition_for_key(store, key) == partition
                    request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
                    result = engine.query(request)
                    assert list(result.partition_results) == [partition]
                    value = result.partition_results[partition].result
                    plain = [{k: v for k, v in r.items() if k != "matched"} for r in value]
                    want = [json.loads(r) for r in rows]
                    assert _canonical(plain) == _canonical([_as_iqkit(r, timestamps) for r in want])
                request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key("nobody"))
                results = engine.query(request).partition_results.values()
                assert all(r.result is None for r in results)


@pytest.mark.parametrize(
    "cell",
    [
        c
        for c in READ_CELLS
        if c.id
        in (
            "4.3.0/join-leftouter-v2-hdfs",
            "4.1.4/join-inner-v3-rocksdb-changelog",
            "4.3.0/join-agg-rocksdb-changelog",
        )
    ],
)
def test_range_and_version_queries_work_on_a_join_side(cell):
    checkpoint = str(cell / "checkpoint")
    (op, *_) = _joins(cell)
    store = _store(cell, op, "left")
    versions = sorted(b["stateVersion"] for b in _read(op, "joinSide", "left")["batches"])
    states = {v: _state(op, "left", v) for v in versions}
    with iqkit.open(checkpoint) as engine:
        # A range on the join key: the keys in it, from every partition.
        every = set().union(*states.values())
        latest = states[versions[-1]]
        lower, upper = sorted(latest)[0], sorted(latest)[-1]
        request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_range(lower, upper))
        keys = [kv.key for r in engine.query(request).partition_results.values() for kv in r.result]
        assert sorted(keys) == sorted(latest)
        # Changes between the first and last versions: one per version that changed a key.
        request = StateQueryRequest.in_store(store).with_query(
            ChangesQuery.between(versions[0], versions[-1])
        )
        changes = []
        for p, r in engine.query(request).partition_results.items():
            assert r.is_success, r.failure_message
            changes += [(c.version, c.key, c.kind, p) for c in r.result]
        want = []
        for before, version in pairwise(versions):
            old, new = states[before], states[version]
            for key in every:
                a, b = old.get(key), new.get(key)
                if (a and a[1]) != (b and b[1]):
                    kind = "insert" if a is None else "delete" if b is None else "update"
                    want.append((version, key, kind, (b or a)[0]))
        # ``matched`` flips with no row added or removed are changes too: at least these.
        assert set(want) <= set(changes)
        not_updates = {c[:3] for c in changes if c[2] != "update"}
        assert not_updates == {w[:3] for w in want if w[2] != "update"}
        # A key's value at each version.
        key = sorted(every)[0]
        for version in versions:
            request = StateQueryRequest.in_store(store).with_query(
                VersionedKeyQuery.with_key(key).as_of_version(version)
            )
            records = [r.result for r in engine.query(request).partition_results.values()]
            found = [record for record in records if record is not None]
            got = len(found[0].value) if found else None
            assert got == (len(states[version][key][1]) if key in states[version] else None)


@pytest.mark.parametrize("cell", REFUSED_CELLS)
def test_what_stays_unsupported_is_refused_in_one_line(cell):
    checkpoint = str(cell / "checkpoint")
    with iqkit.open(checkpoint) as engine:
        for op in _joins(cell):
            for side in ("left", "right"):
                store = _store(cell, op, side)
                assert store in engine.store_names()
                request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
                try:
                    result = engine.query(request)
                except iqkit.IqkitError as exc:
                    message = str(exc)
                else:
                    failures = [r for r in result.partition_results.values() if not r.is_success]
                    assert failures
                    message = failures[0].failure_message
                assert "not supported yet" in message
                assert "\n" not in message


def test_a_join_alone_is_two_stores_and_with_an_aggregation_every_store_is_named():
    (alone,) = [c for c in READ_CELLS if c.id == "4.3.0/join-inner-v2-hdfs"]
    with iqkit.open(str(alone.values[0] / "checkpoint")) as engine:
        assert engine.store_names() == ["join.left", "join.right"]
    (both,) = [c for c in READ_CELLS if c.id == "4.3.0/join-agg-rocksdb-changelog"]
    with iqkit.open(str(both.values[0] / "checkpoint")) as engine:
        assert engine.store_names() == ["aggregate-0", "join-1.left", "join-1.right"]
