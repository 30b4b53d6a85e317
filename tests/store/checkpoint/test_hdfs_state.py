"""The default (HDFS-backed) state store provider's files, replayed and decoded by iqkit
without Spark, against Spark's own state reader: for every operator kind the provider
serves, every committed version, partition by partition. Then damaged, cut-short and
missing files (one ``StateFileError`` naming the file, never rows), and versions rebuilt
from a snapshot the maintenance task wrote. Last, without Spark, the record framing on
files written here: the records a plain dict replay gives, in its order, and its
failures, for runs of records of equal sizes as long and as short as they come.

Every checkpoint comes from real streaming queries on the shared local Spark session
(tests/store/checkpoint/jobs.py)."""

from __future__ import annotations

import itertools
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jobs import INPUT_SCHEMA, restart_state_store_maintenance, run_stream, state_rows

from iqkit.store.checkpoint.hdfs_files import (
    StateFileError,
    list_files,
    list_versions,
    load_records,
    load_state,
)
from iqkit.store.checkpoint.state_schema import read_operator_metadata, read_store_schema
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.objects import open_objects

PARTITIONS = 3


def record(i: int, user: str, amount: int, second: int) -> dict:
    minute, second = divmod(second, 60)
    return {
        "id": i,
        "user": user,
        "amount": amount,
        "ts": f"2024-01-01T00:{minute:02d}:{second:02d}Z",
    }


#: Four micro-batches: new keys, updates of existing keys, duplicates, then event time
#: moving on so the watermark (10 s behind the newest event) evicts old windows and
#: de-duplication keys in the last batch; u0's negative amount removes its flatmap state.
BATCHES = [
    [record(0, "u0", 1, 1), record(1, "u1", 2, 2), record(2, "u2", 3, 3), record(3, "u3", 4, 4)],
    [record(2, "u1", 5, 12), record(4, "u4", 6, 13), record(5, "ü5", 7, 14), record(1, "u1", 1, 2)],
    [record(6, "u0", -1, 41), record(7, "u2", 8, 42), record(8, "日本", 9, 43)],
    [record(9, "u3", 10, 45), record(10, "u1", 11, 47), record(6, "u0", 1, 41)],
]
KINDS = ["agg", "window", "dedup", "dedup-watermark", "flatmap"]


def partition_rows(checkpoint: Path, version: int, partition: int) -> list[tuple[tuple, tuple]]:
    """iqkit's reading of ``partition`` of operator 0 at state ``version``: sorted rows."""
    objects = open_objects(checkpoint)
    schema = read_store_schema(objects, "state/0")
    keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
    state = load_state(objects, f"state/0/{partition}", version)
    return sorted(((keys.decode(k), values.decode(v)) for k, v in state.items()), key=repr)


def decoded_rows(checkpoint: Path, version: int) -> dict[int, list[tuple[tuple, tuple]]]:
    """iqkit's reading of state ``version`` of operator 0: partition → sorted rows, for
    the partitions that have any (as ``jobs.state_rows`` gives Spark's)."""
    metadata = read_operator_metadata(open_objects(checkpoint), "state/0")
    found = {}
    for partition in range(metadata.store().num_partitions):
        rows = partition_rows(checkpoint, version, partition)
        if rows:
            found[partition] = rows
    return found


def committed_versions(checkpoint: Path) -> list[int]:
    """State versions whose batch is committed (``commits/<version - 1>`` exists)."""
    return sorted(int(p.name) + 1 for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory) -> dict[str, Path]:
    """Each kind's checkpoint after the four batches, built on first use."""
    built: dict[str, Path] = {}

    def build(kind: str) -> Path:
        if kind not in built:
            folder = tmp_path_factory.mktemp(kind) / "ckpt"
            built[kind] = run_stream(spark, kind, folder, BATCHES, partitions=PARTITIONS)
        return built[kind]

    return build  # type: ignore[return-value]


@pytest.mark.parametrize("kind", KINDS)
def test_every_committed_version_matches_sparks_state_reader(spark, checkpoints, kind):
    checkpoint = checkpoints(kind)
    versions = committed_versions(checkpoint)
    assert versions == [1, 2, 3, 4]  # each batch was exactly one micro-batch
    objects = open_objects(checkpoint)
    for partition in range(PARTITIONS):
        assert list_versions(objects, f"state/0/{partition}") == versions
    keys_by_version = []
    for version in versions:
        expected = state_rows(spark, checkpoint, version - 1)
        assert decoded_rows(checkpoint, version) == expected, f"version {version}"
        keys_by_version.append({repr(key) for rows in expected.values() for key, _ in rows})
    assert keys_by_version[0]
    pairs = list(itertools.pairwise(keys_by_version))
    assert any(after - before for before, after in pairs), "no batch added a key"
    if kind in ("window", "dedup-watermark", "flatmap"):
        assert any(before - after for before, after in pairs), "no batch removed a key"


def test_the_operator_metadata_describes_the_store(checkpoints):
    checkpoint = checkpoints("agg")
    objects = open_objects(checkpoint)
    metadata = read_operator_metadata(objects, "state/0")
    assert (metadata.operator_id, metadata.operator_name) == (0, "stateStoreSave")
    store = metadata.store()
    assert (store.name, store.num_partitions, store.num_cols_prefix_key) == ("default", 3, 0)
    schema = read_store_schema(objects, "state/0")
    assert [f["name"] for f in schema.key_schema["fields"]] == ["user"]
    assert schema.format_version == 2


def test_a_checkpoint_on_object_storage_reads_the_same(spark, checkpoints, s3_root):
    # Copied as Spark's S3 file system leaves it: no Hadoop .crc files beside the state.
    checkpoint = checkpoints("window")
    remote = open_objects(s3_root)
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file() and not path.name.endswith(".crc"):
            remote.put_immutable(path.relative_to(checkpoint).as_posix(), path)
    metadata = read_operator_metadata(remote, "state/0")
    schema = read_store_schema(remote, "state/0", metadata=metadata)
    keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
    for version in committed_versions(checkpoint):
        found = {}
        for partition in range(metadata.store().num_partitions):
            state = load_state(remote, f"state/0/{partition}", version)
            rows = sorted(((keys.decode(k), values.decode(v)) for k, v in state.items()), key=repr)
            if rows:
                found[partition] = rows
        assert found == state_rows(spark, checkpoint, version - 1)


def test_transform_with_state_schema_files_describe_each_state_variable(spark, tmp_path):
    # transformWithState (v2 operator metadata, v3 schema files, column families) runs on
    # the RocksDB provider only.
    checkpoint = run_transform_with_state(spark, tmp_path)
    objects = open_objects(checkpoint)
    metadata = read_operator_metadata(objects, "state/0")
    assert metadata.format_version == 2
    variables = {v["stateName"] for v in metadata.properties["stateVariables"]}
    schema = read_store_schema(objects, "state/0", metadata=metadata)
    assert schema.format_version == 3
    families = {family.name: family for family in schema.column_families}
    assert variables <= families.keys()
    for name in variables:
        frame = spark.read.format("statestore").option("stateVarName", name).load(str(checkpoint))
        family = families[name]
        key_type = frame.schema["key"].dataType.jsonValue()
        if name == "counts":  # a map state: (grouping key, user key) → value
            grouping, user_key = (f["type"] for f in family.key_schema["fields"])
            assert (grouping, user_key) == (key_type, family.user_key_schema)
            assert frame.schema["user_map_key"].dataType.jsonValue() == user_key
            assert frame.schema["user_map_value"].dataType.jsonValue() == family.value_schema
        else:  # a value state ("value") or a list state (one row per "list_element")
            assert family.key_schema == key_type
            column = "list_element" if name == "seen" else "value"
            assert frame.schema[column].dataType.jsonValue() == family.value_schema


def run_transform_with_state(spark, folder: Path) -> Path:
    """Two micro-batches of a transformWithStateInPandas query with a value, a list and
    a map state variable, on the RocksDB provider."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Totals(StatefulProcessor):
        def init(self, handle):
            self.total = handle.getValueState(
                "total", StructType([StructField("total", LongType())])
            )
            self.seen = handle.getListState("seen", StructType([StructField("id", LongType())]))
            self.counts = handle.getMapState(
                "counts",
                StructType([StructField("name", StringType())]),
                StructType([StructField("count", LongType())]),
            )

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd

            total = self.total.get()[0] if self.total.exists() else 0
            for frame in rows:
                total += int(frame["amount"].sum())
                for i in frame["id"]:
                    self.seen.appendValue((int(i),))
            self.total.update((total,))
            self.counts.updateValue((key[0],), (total,))
            yield pd.DataFrame({"user": [key[0]], "total": [total]})

        def close(self):
            pass

    return run_processor(spark, Totals(), "user string, total long", folder)


def run_processor(spark, processor, output_schema: str, folder: Path) -> Path:
    """``processor`` run by transformWithStateInPandas over the users of ``BATCHES[:2]``,
    one micro-batch each, on the RocksDB provider; its checkpoint folder."""
    import json

    from jobs import PROVIDERS, session_conf

    inputs, checkpoint = folder / "input", folder / "ckpt"
    inputs.mkdir()
    settings = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"]}
    with session_conf(spark, settings):
        for number, batch in enumerate(BATCHES[:2]):
            text = "".join(json.dumps(r) + "\n" for r in batch)
            (inputs / f"batch-{number}.json").write_text(text, encoding="utf-8")
            source = spark.readStream.schema(INPUT_SCHEMA).json(str(inputs))
            query = (
                source.groupBy("user")
                .transformWithStateInPandas(processor, output_schema, "Update", "None")
                .writeStream.format("noop")
                .outputMode("update")
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
    return checkpoint


# -- damaged, cut short, missing ----------------------------------------------------------
@pytest.fixture
def damaged_copy(checkpoints, tmp_path) -> Path:
    """A copy of the aggregation's checkpoint to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoints("agg"), copy)
    return copy


def biggest_delta(checkpoint: Path) -> tuple[int, int, Path]:
    """(partition, version, file) of the largest delta file: one with records in it."""
    files = sorted(checkpoint.glob("state/0/*/*.delta"), key=lambda p: p.stat().st_size)
    path = files[-1]
    return int(path.parent.name), int(path.stem), path


def assert_names_file(error: pytest.ExceptionInfo, name: str) -> None:
    message = str(error.value)
    assert name in message
    assert "\n" not in message


@pytest.mark.parametrize("with_hadoop_crc", [True, False], ids=["crc-file", "no-crc-file"])
def test_a_flipped_byte_raises_naming_the_file(damaged_copy, with_hadoop_crc):
    partition, version, path = biggest_delta(damaged_copy)
    if not with_hadoop_crc:  # as on object storage, where Hadoop writes no .crc files
        for crc in damaged_copy.rglob(".*.crc"):
            crc.unlink()
    data = bytearray(path.read_bytes())
    for position in range(25, len(data) - 21, 7):  # payload bytes, past the block header
        data[position] ^= 0x5A
    path.write_bytes(bytes(data))
    objects = open_objects(damaged_copy)
    with pytest.raises(StateFileError) as error:
        load_state(objects, f"state/0/{partition}", version)
    assert_names_file(error, f"state/0/{partition}/{version}.delta")


def test_a_cut_short_file_raises_naming_the_file(damaged_copy):
    partition, version, path = biggest_delta(damaged_copy)
    for crc in damaged_copy.rglob(".*.crc"):
        crc.unlink()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    objects = open_objects(damaged_copy)
    with pytest.raises(StateFileError) as error:
        load_state(objects, f"state/0/{partition}", version)
    assert_names_file(error, f"state/0/{partition}/{version}.delta")


def test_a_missing_delta_raises_naming_it_and_earlier_versions_still_load(spark, damaged_copy):
    (damaged_copy / "state/0/1/2.delta").unlink()
    objects = open_objects(damaged_copy)
    for version in (2, 3, 4):
        with pytest.raises(StateFileError) as error:
            load_state(objects, "state/0/1", version)
        assert_names_file(error, "state/0/1/2.delta")
    expected = state_rows(spark, damaged_copy, 0).get(1, [])
    assert partition_rows(damaged_copy, 1, 1) == expected


def test_a_damaged_schema_file_raises_naming_it(damaged_copy):
    path = damaged_copy / "state/0/0/_metadata/schema"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(StateFileError) as error:
        read_store_schema(open_objects(damaged_copy), "state/0")
    assert_names_file(error, "state/0/0/_metadata/schema")


# -- snapshots ------------------------------------------------------------------------------
SNAPSHOT_CONF = {
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    "spark.sql.streaming.stateStore.maintenanceInterval": "100ms",
}


def snapshot_with_later_delta(checkpoint: Path) -> tuple[int, int] | None:
    """(partition, snapshot version) of a snapshot that some later delta follows."""
    if not checkpoint.exists():
        return None
    objects = open_objects(checkpoint)
    for partition in range(PARTITIONS):
        files = list_files(objects, f"state/0/{partition}")
        later = [s for s in files.snapshots if any(d > s for d in files.deltas)]
        if later:
            return partition, min(later)
    return None


def test_versions_rebuilt_from_a_snapshot_match(spark, tmp_path):
    checkpoint = tmp_path / "ckpt"
    restart_state_store_maintenance(spark)
    try:
        batch = 0
        # The maintenance task writes snapshots in the background while a query runs:
        # feed batches until one partition has a snapshot followed by a delta.
        while snapshot_with_later_delta(checkpoint) is None:
            assert batch < 12, "Spark wrote no snapshot in 12 micro-batches"
            records = [record(100 * batch + i, f"u{i}", batch + i, batch) for i in range(6)]
            run_stream(
                spark, "agg", checkpoint, [records], partitions=PARTITIONS, conf=SNAPSHOT_CONF
            )
            batch += 1
    finally:
        restart_state_store_maintenance(spark)  # the next query starts it with its interval
    partition, snapshot = snapshot_with_later_delta(checkpoint)
    versions = committed_versions(checkpoint)
    for version in versions:
        assert decoded_rows(checkpoint, version) == state_rows(spark, checkpoint, version - 1)
    # Without the deltas up to the snapshot, the later versions still load: from it.
    latest = versions[-1]
    expected = state_rows(spark, checkpoint, latest - 1).get(partition, [])
    for delta in range(1, snapshot + 1):
        (checkpoint / f"state/0/{partition}/{delta}.delta").unlink()
    assert partition_rows(checkpoint, latest, partition) == expected
    assert expected


def test_a_state_of_many_lz4_blocks_matches(spark, tmp_path):
    # 40,000 keys: each partition's delta spans many 32 KiB lz4 blocks (their checksums
    # are verified in bulk, not one by one as in the small files above).
    records = [record(i, f"user-{i:05d}-ä", i % 97, i % 50) for i in range(40_000)]
    checkpoint = run_stream(spark, "agg", tmp_path / "ckpt", [records], partitions=2)
    for delta in checkpoint.glob("state/0/*/1.delta"):
        assert delta.read_bytes().count(b"LZ4Block") > 5  # blocks, and the end mark
    assert decoded_rows(checkpoint, 1) == state_rows(spark, checkpoint, 0)


# -- the record framing, on files written here ----------------------------------------------
def lz4_block_stream(payload: bytes, block: int = 1 << 16) -> bytes:
    """``payload`` as lz4-java writes it, in stored (uncompressed) blocks: what the
    framing reads is the same whichever way a block was packed."""
    from xxhash import xxh32_intdigest

    header = struct.Struct("<8sBiii")
    out = bytearray()
    for start in range(0, len(payload), block):
        chunk = payload[start : start + block]
        checksum = xxh32_intdigest(chunk, 0x9747B28C) & 0x0FFFFFFF
        out += header.pack(b"LZ4Block", 0x16, len(chunk), len(chunk), checksum) + chunk
    return bytes(out + header.pack(b"LZ4Block", 0x16, 0, 0, 0))


def records_file(records: list[tuple[bytes, bytes | None]], checksums: bool) -> bytes:
    """The records as a state file holds them (a value None: a removal), end mark last."""
    size = struct.Struct(">i").pack
    crc = b"CRC!" if checksums else b""
    out = bytearray()
    for key, value in records:
        if value is None:
            out += size(len(crc + key)) + crc + key + size(-1)
        else:
            out += size(len(key)) + key + size(len(crc + value)) + crc + value
    return bytes(out + size(-1))


def replayed(files: list[tuple[bytes, bool]], checksums: bool) -> dict[bytes, bytes]:
    """The module docstring's replay, plainly: each file's records in order, a value cut
    to whole 8-byte words; ``ValueError`` or ``struct.error`` for framing out of place."""
    unpack = struct.Struct(">i").unpack_from
    prefix = 4 if checksums else 0
    state: dict[bytes, bytes] = {}
    for data, removals in files:
        at = 0
        while True:
            (key_size,) = unpack(data, at)
            if key_size == -1:
                at += 4
                break
            if key_size < 0 or at + 4 + key_size > len(data):
                raise ValueError(f"bad key size {key_size} at byte {at}")
            key = data[at + 4 : at + 4 + key_size]
            at += 4 + key_size
            (value_size,) = unpack(data, at)
            if value_size == -1 and removals:
                state.pop(key[prefix:], None)
                at += 4
                continue
            if value_size < prefix or at + 4 + value_size > len(data):
                raise ValueError(f"bad value size {value_size} at byte {at}")
            state[key] = data[at + 4 + prefix : at + 4 + prefix + (value_size - prefix) // 8 * 8]
            at += 4 + value_size
        if at != len(data):
            raise ValueError(f"{len(data) - at} bytes after the last record")
    return state


@st.composite
def record_runs(draw, removals: bool):
    """A file's records: runs of records of equal key and value sizes (long ones, as
    most state files are, and short ones), keys drawn from few values so that later
    records replace and remove earlier ones."""
    records = []
    for _ in range(draw(st.integers(0, 6))):
        count = draw(st.sampled_from([1, 2, 3, 17, 300]))
        key_size = draw(st.sampled_from([0, 1, 8, 16, 24]))
        value_size = draw(st.sampled_from([0, 3, 8, 12, 24, 28]))
        removal = removals and draw(st.booleans())
        for _ in range(count):
            key = bytes([draw(st.integers(0, 5))]) * key_size
            value = None if removal else bytes([draw(st.integers(0, 255))]) * value_size
            records.append((key, value))
    return records


@st.composite
def versions(draw):
    """A snapshot (or none) and deltas after it: ``(files, row checksums)``."""
    checksums = draw(st.booleans())
    files = []
    if draw(st.booleans()):
        files.append(("snapshot", draw(record_runs(removals=False))))
    for _ in range(draw(st.integers(0 if files else 1, 3))):
        files.append(("delta", draw(record_runs(removals=True))))
    return files, checksums


def write_version(
    folder: Path, files, checksums: bool, damage=None
) -> tuple[int, list[tuple[bytes, bool]]]:
    """The files in ``folder`` (``state/0/0`` of a checkpoint), snapshot at version 1 if
    there is one; ``damage`` changes a file's records before it is packed. The version
    they rebuild, and each file's records with whether it may remove keys."""
    partition = folder / "state/0/0"
    partition.mkdir(parents=True, exist_ok=True)
    plain = []
    for number, (kind, records) in enumerate(files, start=1):
        data = records_file(records, checksums)
        if damage is not None and number == len(files):
            data = damage(data)
        (partition / f"{number}.{kind}").write_bytes(lz4_block_stream(data))
        plain.append((data, kind == "delta"))
    return len(files), plain


@given(versions())
def test_replayed_records_are_the_records_a_dict_replay_gives(tmp_path_factory, case):
    files, checksums = case
    folder = tmp_path_factory.mktemp("framing")
    version, plain = write_version(folder, files, checksums)
    objects = open_objects(folder)
    expected = replayed(plain, checksums)
    state = load_state(objects, "state/0/0", version, row_checksums=checksums)
    assert list(state.items()) == list(expected.items())  # the same order too
    records = load_records(objects, "state/0/0", version, row_checksums=checksums)
    assert list(records.live().items()) == list(expected.items())


@given(versions(), st.data())
def test_damaged_records_raise_as_a_dict_replay_fails_naming_the_file(tmp_path_factory, case, data):
    files, checksums = case
    folder = tmp_path_factory.mktemp("damaged")

    def damage(records: bytes) -> bytes:
        records = bytearray(records)
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(records) - 1))
            records[at] = data.draw(st.sampled_from([0x00, 0x07, 0x80, 0xFF]))
        if data.draw(st.booleans()):
            records = records[: data.draw(st.integers(0, len(records)))]
        return bytes(records)

    version, plain = write_version(folder, files, checksums, damage)
    name = f"state/0/0/{version}.{files[-1][0]}"
    try:
        expected = replayed(plain, checksums)
    except (ValueError, struct.error) as exc:
        with pytest.raises(StateFileError) as error:
            load_state(open_objects(folder), "state/0/0", version, row_checksums=checksums)
        assert_names_file(error, name)
        reason = str(exc)
        assert str(error.value).endswith(f"({reason})") or reason in str(error.value)
    else:  # bytes changed, the framing still whole: those records, as they now are
        state = load_state(open_objects(folder), "state/0/0", version, row_checksums=checksums)
        assert list(state.items()) == list(expected.items())
