"""Session windows (``groupBy(session_window(...), ...)``) read without Spark, on the frozen
checkpoints of tests/data/checkpoints: the default provider's and RocksDB's (whose keys
are encoded for prefix scans: the group key and the session start as two rows).

The oracle is Spark 4.3's ``format("statestore")`` (``statestore.json``: one row per
(group key, session)), grouped by the group key: iqkit's store ``sessions`` holds one
value per group key, the list of its sessions ordered by session start. Every committed
version and every partition is compared; key lookups go to the partition Spark put the
key in; the versions-as-data queries see the lists change. Damaged or odd encodings are
refused in one line naming the file.

Spark 3.5's checkpoints keep no operator metadata (``iqkit.open`` infers the operator
from the state's schema), and Spark 4.3's reader fails on 3.5's RocksDB session state:
they are checked through ``iqkit.open`` against the 3.5 HDFS cell's oracle (the same
query on the same inputs) and against the query's output.
"""

from __future__ import annotations

import json
import shutil
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint_versions import state_changes
from test_hdfs_state import lz4_block_stream, records_file

import iqkit
from iqkit import (
    ChangesQuery,
    KeyQuery,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    VersionedKeyQuery,
)
from iqkit.errors import IqkitError
from iqkit.store.checkpoint import rocksdb_files
from iqkit.store.checkpoint.layout import OperatorStore
from iqkit.store.checkpoint.sessions import SESSION_OPERATOR, session_shape
from iqkit.store.checkpoint.state_schema import OperatorMetadata, StoreInfo
from iqkit.store.encoding.serdes import get_serde
from iqkit.store.names import DATA_PREFIX
from iqkit.store.objects import open_objects

CHECKPOINTS = Path("tests/data/checkpoints")
#: Every session cell with operator metadata (Spark 4.0+), both providers.
CELLS = sorted(
    f"{cell.parent.name}/{cell.name}"
    for cell in CHECKPOINTS.glob("*/session-*")
    if (cell / "checkpoint/state/0/_metadata").is_dir()
)
ROCKSDB_CELLS = [c for c in CELLS if "rocksdb" in c]
#: The newest RocksDB cell without changelog checkpointing (every version a snapshot: the
#: tests that put a changelog in a version's place start from it).
SNAPSHOTS_CELL = [c for c in ROCKSDB_CELLS if c.endswith("-rocksdb")][-1]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def test_the_cells_are_there():
    lines = {c.split("/")[0] for c in CELLS}
    assert {"4.0.5", "4.1.4", "4.3.0"} <= lines
    assert ROCKSDB_CELLS and len(ROCKSDB_CELLS) < len(CELLS)


def iso(micros: int) -> str:
    """A timestamp as the oracle writes it (microseconds) as iqkit writes it (ISO text)."""
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def session_value(value: dict[str, Any]) -> dict[str, Any]:
    window = value["session_window"]
    return {**value, "session_window": {"start": iso(window["start"]), "end": iso(window["end"])}}


def group_key(key: dict[str, Any]) -> Any:
    parts = [v for name, v in key.items() if name != "sessionStartTime"]
    return parts[0] if len(parts) == 1 else tuple(parts)


def grouped(rows: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Spark's rows, one per (group key, session), as iqkit's values: each group key's
    sessions, ordered by session start."""
    out: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for row in rows:
        start = row["key"]["sessionStartTime"]
        out.setdefault(group_key(row["key"]), []).append((start, session_value(row["value"])))
    return {k: [v for _, v in sorted(sessions, key=lambda s: s[0])] for k, sessions in out.items()}


def oracle(cell: str) -> dict[int, dict[int, dict[Any, list[dict[str, Any]]]]]:
    """state version -> partition -> group key -> sessions, from Spark 4.3's reader."""
    document = json.loads((CHECKPOINTS / cell / "statestore.json").read_text())
    (operator,) = document["operators"]
    assert operator["operatorName"] in (SESSION_OPERATOR, None)  # None: 3.5, no metadata
    (read,) = operator["reads"]
    out = {}
    for batch in read["batches"]:
        assert "error" not in batch, batch
        out[batch["stateVersion"]] = {
            int(p): grouped(rows) for p, rows in batch["partitions"].items()
        }
    return out


def checkpoint(cell: str) -> str:
    return str(CHECKPOINTS / cell / "checkpoint")


def all_rows(engine, store: str = "sessions") -> dict[int, dict[Any, Any]]:
    request = StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
    got = {}
    for p, result in engine.query(request).partition_results.items():
        assert result.is_success, result.failure_message
        got[p] = {kv.key: kv.value for kv in result.result}
    return got


@pytest.mark.parametrize("cell", CELLS)
def test_every_version_and_partition_reads_as_sparks_rows_grouped_by_key(cell):
    want = oracle(cell)
    assert sorted(want) == [1, 2, 3, 4]
    for version, partitions in want.items():
        with iqkit.open(checkpoint(cell), as_of=version) as engine:
            assert engine.store_names() == ["sessions"]
            got = all_rows(engine)
        assert got == partitions, f"{cell} version {version}"
    # Sessions closed by the watermark leave the state (a key with several sessions at once
    # is in no cell: test_several_sessions_of_a_key_are_one_value_in_start_order has them).
    keys = {v: {k for rows in parts.values() for k in rows} for v, parts in want.items()}
    assert any(keys[v] - keys[v + 1] for v in (1, 2, 3))


@pytest.mark.parametrize("cell", CELLS)
def test_the_manifest_names_the_group_key_and_keeps_sparks_schemas(cell):
    with iqkit.open(checkpoint(cell)) as engine:
        manifest = engine.manifest("sessions")
    assert manifest.kind == "kv"
    assert manifest.key_serde == "string"
    assert manifest.partitions == 3
    props = manifest.properties
    assert props["key_columns"] == ["user"]
    assert props["spark_operator"] == SESSION_OPERATOR
    assert [f["name"] for f in props["spark_key_schema"]["fields"]] == ["user", "sessionStartTime"]
    assert "value_schema" not in props  # a value is a list, not one record of columns
    assert props["spark_provider"] == ("rocksdb" if "rocksdb" in cell else "hdfs")


@pytest.mark.parametrize("cell", CELLS)
def test_a_key_lookup_goes_to_the_partition_spark_put_the_key_in(cell):
    want = oracle(cell)
    latest = want[max(want)]
    with iqkit.open(checkpoint(cell)) as engine:
        for p, rows in latest.items():
            for user, sessions in rows.items():
                request = StateQueryRequest.in_store("sessions").with_query(KeyQuery.with_key(user))
                result = engine.query(request)
                assert set(result.partition_results) == {p}, user
                assert result.partition_results[p].result == sessions
                assert engine.partition_for_key("sessions", user) == p
        request = StateQueryRequest.in_store("sessions").with_query(KeyQuery.with_key("nobody"))
        (result,) = engine.query(request).partition_results.values()
        assert result.is_success and result.result is None


@pytest.mark.parametrize("cell", ROCKSDB_CELLS[-1:] + [c for c in CELLS if "hdfs" in c][-1:])
def test_range_and_prefix_scans_work_on_the_group_key(cell):
    latest = oracle(cell)[4]
    merged = {k: v for rows in latest.values() for k, v in rows.items()}
    with iqkit.open(checkpoint(cell)) as engine:
        query = RangeQuery.with_range("u02", "u05")
        result = engine.query(StateQueryRequest.in_store("sessions").with_query(query))
        got = {kv.key: kv.value for r in result.partition_results.values() for kv in r.result}
        assert got == {k: v for k, v in merged.items() if "u02" <= k <= "u05"}
        query = PrefixScanQuery.with_prefix("u1")
        result = engine.query(StateQueryRequest.in_store("sessions").with_query(query))
        got = {kv.key: kv.value for r in result.partition_results.values() for kv in r.result}
        assert got == {k: v for k, v in merged.items() if k.startswith("u1")}


@pytest.mark.parametrize("cell", [SNAPSHOTS_CELL, [c for c in CELLS if "hdfs" in c][-1]])
def test_changes_and_versioned_lookups_see_the_session_lists_change(cell):
    want = oracle(cell)
    states = {
        v: {k: s for rows in parts.values() for k, s in rows.items()} for v, parts in want.items()
    }
    expected = state_changes(states)
    assert {e[2] for e in expected} == {"insert", "update", "delete"}
    with iqkit.open(checkpoint(cell)) as engine:
        request = StateQueryRequest.in_store("sessions").with_query(ChangesQuery.between(1, 4))
        got = []
        for result in engine.query(request).partition_results.values():
            assert result.is_success, result.failure_message
            got += [(c.version, c.key, c.kind, c.value, c.old_value) for c in result.result]
        assert sorted(got, key=lambda c: (c[0], c[1])) == expected
        for version, state in states.items():
            for user in sorted({k for s in states.values() for k in s}):
                query = VersionedKeyQuery.with_key(user).as_of_version(version)
                result = engine.query(StateQueryRequest.in_store("sessions").with_query(query))
                (routed,) = result.partition_results.values()
                record = routed.result
                assert (None if record is None else record.value) == state.get(user)


# -- RocksDB changelogs: a version replayed from a changelog of prefix-encoded keys -------------
def rocksdb_copy(tmp_path: Path, cell: str) -> Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(CHECKPOINTS / cell / "checkpoint", target)
    return target


def raw_state(folder: Path, partition: int, version: int, tmp_path: Path) -> dict[bytes, bytes]:
    return rocksdb_files.load_state(
        open_objects(str(folder)), f"state/0/{partition}", version,
        work_dir=tmp_path / "work", key_form=rocksdb_files.KeyForm(prefix_scan=True),
    )  # fmt: skip


def replace_snapshot_by_changelog(folder: Path, partition: int, version: int, records) -> None:
    """``version``'s snapshot of ``partition`` replaced by a changelog of ``records``
    (what changelog checkpointing writes: the batch's puts and deletes, lz4)."""
    part = folder / "state/0" / str(partition)
    for name in (f"{version}.zip", f".{version}.zip.crc"):
        (part / name).unlink(missing_ok=True)
    (part / f"{version}.changelog").write_bytes(lz4_block_stream(records_file(records, False)))


def diff_records(old: dict[bytes, bytes], new: dict[bytes, bytes]) -> list:
    records: list[tuple[bytes, bytes | None]] = [(k, None) for k in old if k not in new]
    records += [(k, b"\x00" + v) for k, v in new.items() if old.get(k) != v]
    return records


def test_a_version_replayed_from_a_changelog_of_prefix_keys_reads_as_spark(tmp_path):
    cell = SNAPSHOTS_CELL
    folder = rocksdb_copy(tmp_path, cell)
    want = oracle(cell)
    for p in range(3):
        old, new = raw_state(folder, p, 3, tmp_path), raw_state(folder, p, 4, tmp_path)
        # The keys as the files hold them: [prefix size: int32 LE][0][group key row][0][start row].
        for key in new:
            (size,) = struct.unpack_from("<i", key)
            assert key[4] == 0 and key[4 + size] == 0
        replace_snapshot_by_changelog(folder, p, 4, diff_records(old, new))
    assert any(diff_records(raw_state(folder, p, 3, tmp_path), {}) for p in range(3))
    with iqkit.open(str(folder), as_of=4) as engine:
        assert all_rows(engine) == want[4]


def test_several_sessions_of_a_key_are_one_value_in_start_order(tmp_path):
    """A changelog adds a session before an existing one of the same key (the cells' keys
    hold one session at a time): the key's value lists both, the earlier first."""
    cell = SNAPSHOTS_CELL
    folder = rocksdb_copy(tmp_path, cell)
    state = raw_state(folder, 0, 4, tmp_path)
    key, value = next(iter(state.items()))
    (size,) = struct.unpack_from("<i", key)
    (start,) = struct.unpack_from("<q", key, len(key) - 8)
    earlier = start - 60_000_000  # a minute before
    new_key = key[:-8] + struct.pack("<q", earlier)
    new_value = value.replace(struct.pack("<q", start), struct.pack("<q", earlier))
    assert new_value != value
    old = raw_state(folder, 0, 3, tmp_path)
    records = [*diff_records(old, state), (new_key, b"\x00" + new_value)]
    replace_snapshot_by_changelog(folder, 0, 4, records)
    want = oracle(cell)[4][0]
    user = key[4 + 1 + 16 : 4 + size].rstrip(b"\x00").decode()
    (first,) = want[user]
    added = {**first, "session_window": {**first["session_window"], "start": iso(earlier)}}
    with iqkit.open(str(folder), as_of=4) as engine:
        got = all_rows(engine)[0]
    assert got == {**want, user: [added, first]}


def test_session_rows_group_by_a_composite_key_in_start_order():
    """``SessionShape.store_rows``, on decoded rows of a two-column group key whose
    sessions come in no order: one stored row per group key, its sessions by start."""
    key_schema = {"type": "struct", "fields": [
        {"name": "user", "type": "string", "nullable": True, "metadata": {}},
        {"name": "day", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "sessionStartTime", "type": "timestamp", "nullable": False, "metadata": {}},
    ]}  # fmt: skip
    value_schema = {"type": "struct", "fields": [
        {"name": "session_window", "type": {"type": "struct", "fields": [
            {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}},
            {"name": "end", "type": "timestamp", "nullable": True, "metadata": {}},
        ]}, "nullable": False, "metadata": {}},
        {"name": "count", "type": "long", "nullable": False, "metadata": {}},
    ]}  # fmt: skip
    store = spark35_store("here")
    shape = session_shape(store, key_schema, value_schema)
    at = [EPOCH + timedelta(seconds=s) for s in (300, 5, 70)]
    rows = [
        (("a", 1, t), ({"start": t, "end": t + timedelta(seconds=5)}, n)) for n, t in enumerate(at)
    ] + [(("a", 2, at[0]), ({"start": at[0], "end": at[0]}, 9))]
    stored = {
        get_serde(shape.key_serde).deserialize(k[len(DATA_PREFIX) :]): json.loads(v)
        for k, v in shape.store_rows(rows)
    }
    text = lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    assert list(stored) == [("a", 1), ("a", 2)]
    assert [s["count"] for s in stored[("a", 1)]] == [1, 2, 0]
    assert [s["session_window"]["start"] for s in stored[("a", 1)]] == [
        text(at[1]), text(at[2]), text(at[0])
    ]  # fmt: skip
    assert shape.manifest(store, None, "hdfs").properties["key_columns"] == ["user", "day"]
    assert shape.partitioner().partition(get_serde("ordered").serialize(("a", 1)), 3) in range(3)


@pytest.mark.parametrize(
    "damage, what",
    [
        (lambda key: struct.pack("<i", 999) + key[4:], "runs past"),
        (lambda key: key[:4] + b"\x07" + key[5:], "version byte"),
        (lambda key: key[:-17] + b"\x07" + key[-16:], "version byte"),
        (lambda key: key[:3], "too short"),
    ],
)
def test_a_damaged_prefix_key_is_refused_naming_the_changelog(tmp_path, damage, what):
    cell = SNAPSHOTS_CELL
    folder = rocksdb_copy(tmp_path, cell)
    new = raw_state(folder, 0, 4, tmp_path)
    key, value = next(iter(new.items()))
    replace_snapshot_by_changelog(folder, 0, 4, [(damage(key), b"\x00" + value)])
    with iqkit.open(str(folder), as_of=4) as engine:
        request = StateQueryRequest.in_store("sessions").with_query(RangeQuery.with_no_bounds())
        result = engine.query(request).partition_results[0]
    assert result.is_failure
    message = result.failure_message
    assert "4.changelog" in message and what in message and "\n" not in message


def set_prefix_columns(folder: Path, count: int) -> Path:
    metadata = folder / "state/0/_metadata/metadata"
    text = metadata.read_text().replace('"numColsPrefixKey":1', f'"numColsPrefixKey":{count}')
    metadata.write_text(text)
    (metadata.parent / ".metadata.crc").unlink(missing_ok=True)
    return metadata


def test_a_session_store_with_no_prefix_columns_recorded_reads_the_same(tmp_path):
    """Spark 3.5 records no operator metadata: a session store's keys are prefix-encoded
    over its group key all the same (Spark always opens it so)."""
    cell = SNAPSHOTS_CELL
    folder = rocksdb_copy(tmp_path, cell)
    set_prefix_columns(folder, 0)
    with iqkit.open(str(folder)) as engine:
        assert all_rows(engine) == oracle(cell)[4]


def test_prefix_keys_in_a_store_whose_metadata_records_none_are_refused_naming_the_file(
    tmp_path,
):
    """A store of another operator whose RocksDB keys are prefix-encoded, though its
    metadata records no prefix columns: one line naming the snapshot."""
    folder = rocksdb_copy(tmp_path, SNAPSHOTS_CELL)
    metadata = set_prefix_columns(folder, 0)
    metadata.write_text(metadata.read_text().replace(SESSION_OPERATOR, "stateStoreSave"))
    with iqkit.open(str(folder)) as engine:
        assert engine.store_names() == ["aggregate"]
        request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
        result = engine.query(request).partition_results[0]
    assert result.is_failure
    message = result.failure_message
    assert "4.zip" in message and "prefix" in message and "\n" not in message


@pytest.mark.parametrize("cell", [SNAPSHOTS_CELL, [c for c in CELLS if "hdfs" in c][-1]])
def test_a_session_store_whose_prefix_is_not_its_group_key_is_refused_in_one_line(tmp_path, cell):
    folder = tmp_path / "checkpoint"
    shutil.copytree(CHECKPOINTS / cell / "checkpoint", folder)
    set_prefix_columns(folder, 2)
    with iqkit.open(str(folder)) as engine, pytest.raises(IqkitError) as error:
        engine.manifest("sessions")
    message = str(error.value)
    assert "metadata" in message and "numColsPrefixKey" in message and "\n" not in message


# -- Spark 3.5: no operator metadata (layout infers the operator) ----------------------------------
def spark35_store(folder: str) -> OperatorStore:
    """The session operator's store as a 3.5 checkpoint describes it once its operator is
    inferred: no prefix columns recorded."""
    info = StoreInfo("default", 0, 3)
    operator = OperatorMetadata(0, SESSION_OPERATOR, (info,), 1, f"{folder} (3.5: no metadata)")
    return OperatorStore("sessions", operator, info)


def spark35_rows(cell: str, version: int, work_dir: Path) -> dict[int, dict[Any, Any]]:
    """Every partition's rows of the 3.5 cell at ``version``, through ``iqkit.open``."""
    del work_dir  # the engine's own cache
    with iqkit.open(checkpoint(cell), as_of=version) as engine:
        assert engine.store_names() == ["sessions"]
        return all_rows(engine)


@pytest.mark.parametrize("cell", ["3.5.9/session-hdfs", "3.5.9/session-rocksdb"])
def test_spark35_session_state_reads_as_the_same_query_on_hdfs_does(cell, tmp_path):
    want = oracle("3.5.9/session-hdfs")  # Spark 4.3 reads 3.5's HDFS state; the inputs are one
    for version, partitions in want.items():
        assert spark35_rows(cell, version, tmp_path) == partitions, version


@pytest.mark.parametrize("cell", ["3.5.9/session-hdfs", "3.5.9/session-rocksdb"])
def test_spark35_sessions_the_query_emitted_were_in_the_state_until_then(cell, tmp_path):
    """The query's own output (append mode: each session once, when the watermark closes
    it, named ``n`` and ``total`` by the query): a session emitted by batch b is in the
    state batch b started from (version b), as emitted, and gone from version b + 1."""
    emitted = 0
    for batch in json.loads((CHECKPOINTS / cell / "output.json").read_text()):
        b = batch["batchId"]
        if not batch["rows"]:
            continue
        before, after = spark35_rows(cell, b, tmp_path), spark35_rows(cell, b + 1, tmp_path)
        held = {k: v for rows in before.values() for k, v in rows.items()}
        kept = {k: v for rows in after.values() for k, v in rows.items()}
        for row in batch["rows"]:
            session = session_value(row)
            count, total = session.pop("n"), session.pop("total")
            state = {**session, "count": count, "sum": total}
            assert state in held[row["user"]], (b, row)
            starts = [s["session_window"]["start"] for s in kept.get(row["user"], [])]
            assert state["session_window"]["start"] not in starts, (b, row)
            emitted += 1
    assert emitted >= 5
