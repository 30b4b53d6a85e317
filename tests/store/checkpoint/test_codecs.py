"""State files compressed with each codec of ``spark.sql.streaming.stateStore.compression.codec``
(lz4, Spark's default; lzf; snappy; zstd), read without Spark (``checkpoint/codecs.py``).

For each codec, on both providers whose files Spark compresses (the default HDFS-backed one:
deltas and snapshots; RocksDB with changelog checkpointing: changelogs), a real checkpoint
from the shared local Spark session: every committed version read through ``iqkit.open``
is, partition by partition, what Spark's own state reader gives. Then damage: files cut at
every length and bits flipped in every byte give one line naming the file (or, where the
codec has no checksum and the bytes still frame and decode, rows: never another error);
a damaged file fails its partition only, naming it; a zstd frame carrying a content
checksum is checked.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
from pathlib import Path

import pytest
from jobs import restart_state_store_maintenance, run_stream, state_rows

import iqkit
from iqkit import RangeQuery, StateQueryRequest
from iqkit.errors import IqkitError
from iqkit.store.checkpoint.codecs import CODECS, StateFileError, decompress_state_file
from iqkit.store.checkpoint.hdfs_files import load_state
from iqkit.store.checkpoint.state_schema import read_store_schema
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.objects import open_objects

PARTITIONS = 2
PROVIDERS = ["hdfs", "rocksdb-changelog"]
#: Each codec's first bytes.
MAGIC = {"lz4": b"LZ4Block", "lzf": b"ZV", "snappy": b"\x82SNAPPY\x00", "zstd": b"\x28\xb5\x2f\xfd"}
#: The files each provider compresses.
COMPRESSED = {"hdfs": ("*.delta", "*.snapshot"), "rocksdb-changelog": ("*.changelog",)}
#: A snapshot due every second version, written by the maintenance task (HDFS: a
#: ``.snapshot`` in the codec; RocksDB: a ``.zip``, deflate whatever the codec). Short
#: shutdown timeouts: see ``test_rocksdb_state.CHANGELOG_CONF``.
SNAPSHOT_CONF = {
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.maintenanceInterval": "200ms",
    "spark.sql.streaming.stateStore.maintenanceShutdownTimeout": "2",
    "spark.sql.streaming.stateStore.maintenanceForceShutdownTimeout": "2",
}


def record(i: int, user: str, amount: int) -> dict:
    return {"id": i, "user": user, "amount": amount, "ts": f"2024-01-01T00:00:{i % 60:02d}Z"}


def random_text(rng: random.Random, size: int) -> str:
    return base64.b64encode(rng.randbytes(size * 3 // 4)).decode()


_RNG = random.Random(20260101)
#: New keys, then long keys of random text (blocks that do not compress: lz4 stores them as
#: they are, lzf in stored chunks; more than one 32 KiB block or 64 KiB chunk a file),
#: then updates of both.
BATCHES = [
    [record(i, f"u{i % 7}", i) for i in range(20)],
    [record(100 + i, random_text(_RNG, 6000), i) for i in range(24)]
    + [record(200 + i, f"ü{i}", 3) for i in range(400)],
    [record(300 + i, f"u{i}", -i) for i in range(12)],
]
#: Small batches fed after ``BATCHES`` until Spark has written a snapshot.
MORE = [[record(400 + i, f"w{i}", i)] for i in range(6)]


def has_snapshot(checkpoint: Path, provider: str) -> bool:
    pattern = "*.snapshot" if provider == "hdfs" else "*.zip"
    return any(checkpoint.glob(f"state/0/*/{pattern}"))


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """(codec, provider) → its checkpoint, built on first use: ``BATCHES``, then one small
    batch at a time until a snapshot was written (so versions read from one are met)."""
    built: dict[tuple[str, str], Path] = {}

    def build(codec: str, provider: str) -> Path:
        if (codec, provider) not in built:
            folder = tmp_path_factory.mktemp(f"{codec}-{provider}") / "ckpt"
            conf = {**SNAPSHOT_CONF, "spark.sql.streaming.stateStore.compression.codec": codec}
            restart_state_store_maintenance(spark)
            try:
                run_stream(spark, "agg", folder, BATCHES, provider=provider,
                           partitions=PARTITIONS, conf=conf)  # fmt: skip
                for batch in MORE:
                    if has_snapshot(folder, provider):
                        break
                    run_stream(spark, "agg", folder, [batch], provider=provider,
                               partitions=PARTITIONS, conf=conf)  # fmt: skip
            finally:
                restart_state_store_maintenance(spark)  # the next query starts its own
            built[codec, provider] = folder
        return built[codec, provider]

    return build


def committed_versions(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) + 1 for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def compressed_files(checkpoint: Path, provider: str) -> list[Path]:
    return sorted(
        f for pattern in COMPRESSED[provider] for f in checkpoint.glob(f"state/0/*/{pattern}")
    )


def iqkit_rows(checkpoint: Path, version: int) -> dict[int, list[tuple[tuple, tuple]]]:
    """``iqkit.open(checkpoint, as_of=version)``'s rows as ``jobs.state_rows`` gives
    Spark's: partition → sorted (key columns, value columns), partitions with rows only."""
    found: dict[int, list[tuple[tuple, tuple]]] = {}
    with iqkit.open(os.fspath(checkpoint), as_of=version) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
        for p, partition in engine.query(request).partition_results.items():
            assert partition.is_success, partition.failure_message
            rows = [((kv.key,), tuple(kv.value.values())) for kv in partition.result]
            if rows:
                found[p] = sorted(rows, key=repr)
    return found


# -- every version, every codec, both providers ---------------------------------------------
def lzf_chunk_types(raw: bytes) -> list[int]:
    """The type of each chunk of an lzf stream (0 stored, 1 compressed)."""
    types, position = [], 0
    while position < len(raw):
        kind = raw[position + 2]
        size = int.from_bytes(raw[position + 3 : position + 5], "big")
        types.append(kind)
        position += (5 if kind == 0 else 7) + size
    return types


def snappy_blocks(raw: bytes) -> int:
    """How many blocks a snappy-java stream of one header holds."""
    count, position = 0, 16
    while position < len(raw):
        position += 4 + int.from_bytes(raw[position : position + 4], "big")
        count += 1
    return count


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("codec", CODECS)
def test_every_version_reads_as_spark_reads_it(spark, checkpoints, codec, provider):
    checkpoint = checkpoints(codec, provider)
    files = compressed_files(checkpoint, provider)
    assert files and all(f.read_bytes().startswith(MAGIC[codec]) for f in files)
    assert has_snapshot(checkpoint, provider), "Spark wrote no snapshot"
    raws = [f.read_bytes() for f in files]
    if codec == "lzf":  # stored chunks (the random text) and files of several chunks
        assert any(0 in lzf_chunk_types(raw) for raw in raws)
        assert any(len(lzf_chunk_types(raw)) > 1 for raw in raws)
    if codec == "snappy":
        assert any(snappy_blocks(raw) > 1 for raw in raws)
    if codec == "lz4":
        assert any(raw.count(b"LZ4Block") > 2 for raw in raws)
    versions = committed_versions(checkpoint)
    assert versions[:3] == [1, 2, 3]
    for version in versions:
        expected = state_rows(spark, checkpoint, version - 1)
        assert iqkit_rows(checkpoint, version) == expected, f"version {version}"
    assert expected


# -- damage, file by file (no Spark) ---------------------------------------------------------
def hdfs_copy(checkpoints, codec: str, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoints(codec, "hdfs"), copy)
    for crc in copy.rglob(".*.crc"):  # as on object storage: only the file itself can tell
        crc.unlink()
    return copy


def first_delta(copy: Path) -> tuple[int, Path]:
    """(partition, file) of the smallest version-1 delta with records in it."""
    files = sorted(copy.glob("state/0/*/1.delta"), key=lambda p: p.stat().st_size)
    path = next(p for p in files if p.stat().st_size > 40)
    return int(path.parent.name), path


class Reader:
    """Version 1 of one partition of a copy of a checkpoint, read as ``load_state`` reads
    it and decoded: rows, or the one-line error naming the file."""

    def __init__(self, copy: Path, partition: int) -> None:
        self.objects = open_objects(copy)
        schema = read_store_schema(self.objects, "state/0")
        self.keys, self.values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
        self.partition = partition
        self.name = f"state/0/{partition}/1.delta"

    def rows(self) -> list | str:
        try:
            state = load_state(self.objects, f"state/0/{self.partition}", 1)
            return sorted(((self.keys.decode(k), self.values.decode(v)) for k, v in state.items()),
                          key=repr)  # fmt: skip
        except StateFileError as exc:
            message = str(exc)
            assert self.name in message and "\n" not in message, message
            return message
        except IqkitError as exc:  # a row that does not decode (no file named here)
            assert "\n" not in str(exc)
            return str(exc)


@pytest.mark.parametrize("codec", CODECS)
def test_a_file_cut_at_any_length_raises_naming_it(checkpoints, codec, tmp_path):
    """Every length short of the whole: the codec sees it, or (snappy and lzf have no end
    mark; a cut at a block's end leaves whole blocks) the records' end is missing."""
    copy = hdfs_copy(checkpoints, codec, tmp_path)
    partition, path = first_delta(copy)
    reader = Reader(copy, partition)
    original = path.read_bytes()
    assert isinstance(reader.rows(), list)
    for length in range(len(original)):
        path.write_bytes(original[:length])
        outcome = reader.rows()
        assert isinstance(outcome, str) and reader.name in outcome, (length, outcome)


#: The bytes of a stream's framing (magic, headers, sizes): a flipped bit there is seen by
#: every codec, or changes nothing (a bit the format ignores).
FRAMING = {"lz4": range(0, 21), "lzf": range(0, 7), "snappy": range(0, 20), "zstd": range(0, 5)}


@pytest.mark.parametrize("codec", CODECS)
def test_a_flipped_bit_raises_naming_the_file_or_gives_rows_only_where_nothing_can_tell(
    checkpoints, codec, tmp_path
):
    """One bit flipped in each byte in turn, without Hadoop's checksum file. lz4 checks
    every block: the error, or the same rows. The others carry no checksum (Spark's zstd
    frames have none): the framing bytes are checked; a flipped bit in compressed data
    gives the error, a row that does not decode, or rows, never another exception. With
    Hadoop's ``.crc`` beside the file (local and HDFS checkpoints), always the error."""
    copy = hdfs_copy(checkpoints, codec, tmp_path)
    partition, path = first_delta(copy)
    reader = Reader(copy, partition)
    original = path.read_bytes()
    expected = reader.rows()
    rng = random.Random(len(original))
    caught = 0
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        outcome = reader.rows()
        caught += isinstance(outcome, str)
        if codec == "lz4" or position in FRAMING[codec]:
            assert isinstance(outcome, str) or outcome == expected, position
    assert caught > len(original) // 4
    # With Hadoop's checksum file, as Spark wrote it beside the file.
    crc = f".{path.name}.crc"
    shutil.copy(checkpoints(codec, "hdfs") / f"state/0/{partition}" / crc, path.with_name(crc))
    for position in range(0, len(original), 3):
        damaged = bytearray(original)
        damaged[position] ^= 0x10
        path.write_bytes(bytes(damaged))
        outcome = reader.rows()
        assert isinstance(outcome, str) and "Hadoop checksum" in outcome, position


def test_a_zstd_frame_with_a_content_checksum_is_checked(checkpoints, tmp_path):
    """zstd-jni writes Spark's frames without a content checksum; a frame with one (and
    a stream of several frames) reads the same, and a flipped bit in it is always seen."""
    import zstandard

    copy = hdfs_copy(checkpoints, "zstd", tmp_path)
    partition, path = first_delta(copy)
    assert not zstandard.get_frame_parameters(path.read_bytes()).has_checksum  # Spark's
    reader = Reader(copy, partition)
    expected = reader.rows()
    data = decompress_state_file(path.read_bytes(), "test")
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    half = len(data) // 2
    two_frames = compressor.compress(data[:half]) + compressor.compress(data[half:])
    path.write_bytes(two_frames)
    assert reader.rows() == expected
    for position in range(len(two_frames)):
        damaged = bytearray(two_frames)
        damaged[position] ^= 0x04
        path.write_bytes(bytes(damaged))
        outcome = reader.rows()
        assert isinstance(outcome, str) or outcome == expected, position


@pytest.mark.parametrize("codec", CODECS)
def test_streams_one_after_the_other_read_as_one(checkpoints, codec):
    """Two of Spark's streams end to end: lzf chunks and zstd frames simply follow, a
    snappy-java stream's header comes again; lz4's end mark ends the stream (Spark never
    writes more than one, and iqkit refuses bytes after it)."""
    one, two = (
        p.read_bytes() for p in sorted(checkpoints(codec, "hdfs").glob("state/0/0/*.delta"))[:2]
    )
    if codec == "lz4":
        with pytest.raises(StateFileError, match="after the end mark"):
            decompress_state_file(one + two, "f")
        return
    both = decompress_state_file(one + two, "f")
    assert both == decompress_state_file(one, "f") + decompress_state_file(two, "f")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "f: empty"),
        (b"PK\x03\x04rest", "f: not a stream of any codec Spark compresses state with (lz4, lzf, "
                            "snappy, zstd; it starts with 50 4b 03 04 72 65 73 74)"),
        (b"\x82SNAPPY\x00\x00\x00\x00\x02\x00\x00\x00\x02", "f: a snappy-java stream of version 2"),
        (b"ZV\x02\x00", "f: damaged lzf chunk header at byte 0"),
        (b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x06\xff\xff\xff\xff\x0f\x00",
         "f: damaged snappy block at byte 16"),  # states 4 GiB in 6 bytes: never allocated
    ],
)  # fmt: skip
def test_what_is_no_stream_of_a_codec_is_refused_in_one_line(raw, message):
    with pytest.raises(StateFileError) as error:
        decompress_state_file(raw, "f")
    assert str(error.value).startswith(message), str(error.value)


# -- damage, through iqkit.open ----------------------------------------------------------------
def last_needed_file(checkpoint: Path, provider: str, partition: int) -> tuple[int, Path]:
    """(version, file): the newest version of ``partition`` without a snapshot file, and
    its delta or changelog, the last file that version's replay reads."""
    folder = checkpoint / "state" / "0" / str(partition)
    kind, snapshot = ("delta", "snapshot") if provider == "hdfs" else ("changelog", "zip")
    versions = [int(p.stem) for p in folder.glob(f"*.{kind}")
                if not (folder / f"{p.stem}.{snapshot}").exists()]  # fmt: skip
    version = max(versions)
    return version, folder / f"{version}.{kind}"


def partition_failures(checkpoint: Path, version: int) -> dict[int, str]:
    with iqkit.open(os.fspath(checkpoint), as_of=version) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
        failed = {}
        for p, partition in engine.query(request).partition_results.items():
            if partition.is_failure:
                failed[p] = partition.failure_message
            else:
                list(partition.result)
    return failed


@pytest.mark.parametrize("damage", ["cut", "flipped-framing", "flipped-with-crc"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("codec", CODECS)
def test_a_damaged_file_fails_its_partition_only_naming_it(
    checkpoints, codec, provider, damage, tmp_path
):
    """Cut in half, a bit flipped in the stream's framing (the first block's or chunk's
    sizes), or a byte changed anywhere with Hadoop's checksum file beside it: the
    partition that needs the file fails with one line naming it; the other answers."""
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoints(codec, provider), copy)
    version, path = last_needed_file(copy, provider, 0)
    data = bytearray(path.read_bytes())
    if damage == "cut":
        data = data[: len(data) // 2]
    elif damage == "flipped-framing":
        at = {"lz4": 13, "lzf": 3, "snappy": 17, "zstd": 4}[codec]  # a size, zstd's header
        data[at] ^= 0x40
    else:
        data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    if damage != "flipped-with-crc":
        for crc in copy.rglob(".*.crc"):
            crc.unlink()
    failed = partition_failures(copy, version)
    assert list(failed) == [0], failed
    message = failed[0]
    assert f"state/0/0/{path.name}" in message and "\n" not in message, message


@pytest.mark.parametrize("codec", ["lzf", "snappy", "zstd"])
def test_a_row_that_does_not_decode_fails_its_partition_naming_the_files(
    checkpoints, codec, tmp_path
):
    """A flipped bit that the codec cannot see (no checksum) and that still frames as
    records, but makes a row that does not decode: the partition fails naming the
    files its version is rebuilt from, never rows of it."""
    copy = hdfs_copy(checkpoints, codec, tmp_path)
    partition, path = first_delta(copy)
    reader = Reader(copy, partition)
    original = path.read_bytes()
    for position in range(len(original) - 1, 0, -1):
        damaged = bytearray(original)
        damaged[position] ^= 0x20
        path.write_bytes(bytes(damaged))
        outcome = reader.rows()
        if isinstance(outcome, str) and reader.name not in outcome:
            break  # a row that does not decode
    else:
        pytest.fail("no flipped bit made a row that does not decode")
    failed = partition_failures(copy, 1)
    assert list(failed) == [partition], failed
    message = failed[partition]
    assert f"state/0/{partition}/1.delta" in message and "does not decode" in message, message
    assert "\n" not in message
