"""The RocksDB state store provider's files, read by iqkit without Spark, against Spark's
own state reader: every committed version of every operator kind, partition by partition,
with and without changelog checkpointing (snapshots restored and scanned, changelogs
replayed on top of them), in checkpoint format v2 with row checksums, then missing,
cut-short and damaged files (one ``StateFileError`` naming the file, never rows).

Every checkpoint comes from real streaming queries on the shared local Spark session
(tests/store/checkpoint/jobs.py)."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from jobs import restart_state_store_maintenance, run_stream, session_conf, state_rows
from test_hdfs_state import lz4_block_stream

from iqkit.store.checkpoint.codecs import decompress_state_file
from iqkit.store.checkpoint.rocksdb_files import (
    StateFileError,
    list_files,
    list_versions,
    load_records,
    load_state,
    oldest_version,
)
from iqkit.store.checkpoint.shape import UnsupportedStateError
from iqkit.store.checkpoint.state_schema import read_store_schema
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.objects import open_objects

PARTITIONS = 2


def record(i: int, user: str, amount: int, second: int) -> dict:
    return {"id": i, "user": user, "amount": amount, "ts": f"2024-01-01T00:00:{second:02d}Z"}


#: Four micro-batches: new keys, updates and duplicates, then event time moving on so the
#: watermark (10 s behind the newest event) evicts the old windows in the last batches.
BATCHES = [
    [record(0, "u0", 1, 1), record(1, "u1", 2, 2), record(2, "u2", 3, 3), record(3, "u3", 4, 4)],
    [record(2, "u1", 5, 12), record(4, "u4", 6, 13), record(5, "ü5", 7, 14), record(1, "u1", 1, 2)],
    [record(6, "u0", 1, 41), record(7, "u2", 8, 42), record(8, "日本", 9, 43)],
    [record(9, "u3", 10, 45), record(10, "u1", 11, 47), record(6, "u0", 1, 41)],
]
#: Changelog checkpointing with a snapshot due every second version, uploaded by the
#: maintenance task: some versions get a zip, others (version 1 always) only a changelog.
#: Quirk: stopping the maintenance task after a query (``restart_state_store_maintenance``)
#: sometimes blocked for 360 s here, its graceful then forced shutdown timeouts (300 s and
#: 60 s by default); the query that starts the task fixes them, so these runs set 2 s.
CHANGELOG_CONF = {
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    "spark.sql.streaming.stateStore.maintenanceShutdownTimeout": "2",
    "spark.sql.streaming.stateStore.maintenanceForceShutdownTimeout": "2",
}
VARIANTS = {
    "rocksdb": ("rocksdb", {}),
    "rocksdb-changelog": ("rocksdb-changelog", CHANGELOG_CONF),
    # Checkpoint format v2 (files named <version>_<unique id>) with row checksums.
    "rocksdb-changelog-v2": (
        "rocksdb-changelog",
        {
            **CHANGELOG_CONF,
            "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
            "spark.sql.streaming.stateStore.rowChecksum.enabled": "true",
        },
    ),
}


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """(variant, kind) → its checkpoint after the four batches, built on first use."""
    built: dict[tuple[str, str], Path] = {}

    def build(variant: str, kind: str) -> Path:
        if (variant, kind) not in built:
            provider, conf = VARIANTS[variant]
            folder = tmp_path_factory.mktemp(f"{variant}-{kind}") / "ckpt"
            restart_state_store_maintenance(spark)
            try:
                run_stream(
                    spark,
                    kind,
                    folder,
                    BATCHES,
                    provider=provider,
                    partitions=PARTITIONS,
                    conf=conf,
                )
            finally:
                restart_state_store_maintenance(spark)  # the next query starts its own
            built[variant, kind] = folder
        return built[variant, kind]

    return build


def partition_rows(
    checkpoint: Path, version: int, partition: int, work_dir: Path, *, row_checksums=False
) -> list[tuple[tuple, tuple]]:
    """iqkit's reading of ``partition`` of operator 0 at state ``version``: sorted rows."""
    objects = open_objects(checkpoint)
    schema = read_store_schema(objects, "state/0")
    keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
    state = load_state(
        objects, f"state/0/{partition}", version, work_dir=work_dir, row_checksums=row_checksums
    )
    return sorted(((keys.decode(k), values.decode(v)) for k, v in state.items()), key=repr)


def decoded_rows(checkpoint: Path, version: int, work_dir: Path, **options) -> dict:
    """Partition → sorted rows of state ``version``, for the partitions that have any (as
    ``jobs.state_rows`` gives Spark's)."""
    found = {}
    for partition in range(PARTITIONS):
        rows = partition_rows(checkpoint, version, partition, work_dir, **options)
        if rows:
            found[partition] = rows
    return found


def committed_versions(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) + 1 for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def replayed_on_a_snapshot(checkpoint: Path) -> list[tuple[int, int]]:
    """(partition, version) pairs rebuilt from an earlier snapshot plus changelogs."""
    objects = open_objects(checkpoint)
    found = []
    for partition in range(PARTITIONS):
        files = list_files(objects, f"state/0/{partition}")
        for version in files.versions():
            if version not in files.snapshots and any(s < version for s in files.snapshots):
                found.append((partition, version))
    return found


@pytest.mark.parametrize(
    ("variant", "kind"),
    [
        *((variant, kind) for variant in ("rocksdb", "rocksdb-changelog")
          for kind in ("agg", "window", "dedup")),
        ("rocksdb-changelog", "flatmap"),  # applyInPandasWithState
    ],
)  # fmt: skip
def test_every_committed_version_matches_sparks_state_reader(
    spark, checkpoints, variant, kind, tmp_path
):
    checkpoint = checkpoints(variant, kind)
    versions = committed_versions(checkpoint)
    assert versions == [1, 2, 3, 4]  # each batch was exactly one micro-batch
    objects = open_objects(checkpoint)
    for partition in range(PARTITIONS):
        folder = f"state/0/{partition}"
        files = list_files(objects, folder)
        assert list_versions(objects, folder) == versions
        assert oldest_version(objects, folder) == 1
        if variant == "rocksdb":  # a snapshot at every commit, no changelog
            assert sorted(files.snapshots) == versions and not files.changelogs
        else:
            assert sorted(files.changelogs) == versions
    # Whether a snapshot is uploaded here depends on when Spark's maintenance task runs
    # (each batch is a query of its own, stopped right after); a version replayed on a
    # snapshot is met for certain in the frozen cells (the test below).
    for version in versions:
        expected = state_rows(spark, checkpoint, version - 1)
        assert decoded_rows(checkpoint, version, tmp_path) == expected, f"version {version}"
    assert expected
    assert not any(tmp_path.iterdir())  # each restored database was removed after reading


FROZEN = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


@pytest.mark.parametrize("line", ["3.5.9", "4.0.5", "4.1.4", "4.2.1", "4.3.0"])
def test_a_frozen_changelog_version_replayed_on_a_snapshot_matches_spark(line, tmp_path):
    """Both paths of the changelog provider, for certain: version 3 of the frozen cell is
    version 2's snapshot plus version 3's changelog, compared with Spark 4.3's reading
    stored beside it (``statestore.json``: a partition's rows per batch)."""
    checkpoint = FROZEN / line / "agg-rocksdb-changelog" / "checkpoint"
    assert (0, 3) in replayed_on_a_snapshot(checkpoint)
    oracle = json.loads((checkpoint.parent / "statestore.json").read_text())
    (read,) = oracle["operators"][0]["reads"]
    (batch,) = [b for b in read["batches"] if b["stateVersion"] == 3]
    expected = sorted(
        ((tuple(r["key"].values()), tuple(r["value"].values())) for r in batch["partitions"]["0"]),
        key=repr,
    )
    assert expected and partition_rows(checkpoint, 3, 0, tmp_path) == expected


def test_checkpoint_format_v2_with_row_checksums_matches(spark, checkpoints, tmp_path):
    checkpoint = checkpoints("rocksdb-changelog-v2", "window")
    objects = open_objects(checkpoint)
    assert list_files(objects, "state/0/0").unique_ids
    assert replayed_on_a_snapshot(checkpoint)
    versions = committed_versions(checkpoint)
    assert versions == [1, 2, 3, 4]
    for version in versions:
        # Quirk: Spark's state reader looks for unique ids only when the session's
        # setting says format v2 (else it fails parsing "<version>_<id>" as a number).
        with session_conf(spark, {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}):
            expected = state_rows(spark, checkpoint, version - 1)
        found = decoded_rows(checkpoint, version, tmp_path, row_checksums=True)
        assert found == expected, f"version {version}"
    # Without row_checksums, a value's checksum header is refused (its first byte is a
    # CRC's, not the encoding's version byte 0).
    with pytest.raises(StateFileError):
        decoded_rows(checkpoint, versions[-1], tmp_path)


# -- damaged, cut short, missing ----------------------------------------------------------
def damaged_copy(checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    return copy


def assert_names_file(error: pytest.ExceptionInfo, name: str) -> None:
    """The error is one line, and names the file."""
    assert name in str(error.value) and len(str(error.value).splitlines()) == 1


def test_a_cut_short_changelog_raises_naming_it(checkpoints, tmp_path):
    copy = damaged_copy(checkpoints("rocksdb-changelog", "agg"), tmp_path)
    objects = open_objects(copy)
    # The largest changelog of a version with no snapshot: the version needs it.
    needed = [
        path
        for p in range(PARTITIONS)
        for path in copy.glob(f"state/0/{p}/*.changelog")
        if int(path.stem) not in list_files(objects, f"state/0/{p}").snapshots
    ]
    path = max(needed, key=lambda p: p.stat().st_size)
    partition, version = int(path.parent.name), int(path.stem)
    for crc in copy.rglob(".*.crc"):  # as on object storage: only the lz4 stream can tell
        crc.unlink()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(StateFileError) as error:
        load_state(objects, f"state/0/{partition}", version, work_dir=tmp_path / "work")
    assert_names_file(error, f"state/0/{partition}/{version}.changelog")


FROZEN = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


@pytest.mark.parametrize(
    ("cell", "deletes"),
    [
        ("4.3.0/agg-rocksdb-changelog", False),
        ("4.3.0/window-rocksdb-changelog", True),  # the watermark evicts windows
        ("3.5.9/dedup-within-wm-rocksdb-changelog", True),
        ("4.3.0/agg-ckptv2-rocksdb-changelog", False),  # files named <version>_<id>
    ],
)
def test_changelogs_framed_in_bulk_give_the_state_the_dict_replay_gives(cell, deletes, tmp_path):
    """``load_records`` (changelogs framed column-wise, for the first open) keeps, key by
    key, what ``load_state`` keeps, on snapshot + changelog and changelog-only versions
    alike, deletes included."""
    checkpoint = FROZEN / cell / "checkpoint"
    objects = open_objects(checkpoint)
    checked = removals = 0
    for folder in sorted(checkpoint.glob("state/0/[0-9]*")):
        partition = f"state/0/{folder.name}"
        for version in list_versions(objects, partition):
            want = load_state(objects, partition, version, work_dir=tmp_path / "a")
            records = load_records(objects, partition, version, work_dir=tmp_path / "b")
            assert records is not None, (partition, version)
            assert records.to_dict() == want, (partition, version)
            removals += records.removed is not None
            checked += 1
    assert checked and bool(removals) == deletes


def test_a_cut_short_changelog_framed_in_bulk_raises_naming_it(tmp_path):
    copy = tmp_path / "checkpoint"
    shutil.copytree(FROZEN / "4.3.0/agg-rocksdb-changelog/checkpoint", copy)
    for crc in copy.rglob(".*.crc"):  # only the framing can tell
        crc.unlink()
    objects = open_objects(copy)
    needed = [  # changelogs of versions with no snapshot: the version needs them
        path
        for path in copy.glob("state/0/*/*.changelog")
        if int(path.stem) not in list_files(objects, f"state/0/{path.parent.name}").snapshots
    ]
    path = max(needed, key=lambda p: p.stat().st_size)
    records = decompress_state_file(path.read_bytes(), "x")
    path.write_bytes(lz4_block_stream(records[: len(records) - 5]))  # into the last record
    partition, version = f"state/0/{path.parent.name}", int(path.stem)
    with pytest.raises(StateFileError) as error:
        load_records(objects, partition, version, work_dir=tmp_path / "work")
    assert_names_file(error, f"{partition}/{version}.changelog")


def snapshot_ssts(checkpoint: Path, partition: int, version: int) -> list[Path]:
    """The SST files ``version``'s snapshot of ``partition`` lists, largest first."""
    folder = checkpoint / f"state/0/{partition}"
    with zipfile.ZipFile(folder / f"{version}.zip") as archive:
        metadata = json.loads(archive.read("metadata").split(b"\n", 1)[1])
    listed = sorted(metadata["sstFiles"], key=lambda f: f["sizeBytes"], reverse=True)
    return [folder / "SSTs" / f["dfsSstFileName"] for f in listed]


@pytest.mark.parametrize(
    ("damage", "kind"),
    # A flipped byte is looked for in a checkpoint read nowhere before: RocksDB's block
    # cache, shared by the process, would serve the blocks of the undamaged original.
    # A damaged properties block: RocksDB blames the MANIFEST ("properties unsorted").
    [
        ("missing", "agg"),
        ("cut-short", "agg"),
        ("flipped-bytes", "dedup-watermark"),
        ("damaged-properties", "agg"),
    ],
)
def test_a_damaged_sst_raises_naming_it(spark, checkpoints, tmp_path, damage, kind):
    copy = damaged_copy(checkpoints("rocksdb", kind), tmp_path)
    objects = open_objects(copy)
    partition = 1
    sst = snapshot_ssts(copy, partition, 4)[0]
    name = f"state/0/{partition}/SSTs/{sst.name}"
    if damage == "missing":
        sst.unlink()
    elif damage == "cut-short":
        sst.write_bytes(sst.read_bytes()[:-100])
    elif damage == "damaged-properties":  # the length of the key that shares its start
        data = bytearray(sst.read_bytes())
        data[data.index(b"filter_entries") - 3] ^= 0x01
        sst.write_bytes(bytes(data))
    else:  # inside the first data block, at the start of the file
        data = bytearray(sst.read_bytes())
        for position in range(8, 40):
            data[position] ^= 0x5A
        sst.write_bytes(bytes(data))
    with pytest.raises(StateFileError) as error:
        load_state(objects, f"state/0/{partition}", 4, work_dir=tmp_path / "work")
    assert_names_file(error, name)
    # Versions whose snapshots do not list it still load.
    unaffected = [v for v in (1, 2, 3) if sst not in snapshot_ssts(copy, partition, v)]
    assert unaffected
    for version in unaffected:
        expected = state_rows(spark, copy, version - 1).get(partition, [])
        assert partition_rows(copy, version, partition, tmp_path / "work") == expected


def test_a_cut_short_zip_raises_naming_it(checkpoints, tmp_path):
    copy = damaged_copy(checkpoints("rocksdb", "agg"), tmp_path)
    for crc in copy.rglob(".*.crc"):
        crc.unlink()
    path = copy / "state/0/0/3.zip"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(StateFileError) as error:
        load_state(open_objects(copy), "state/0/0", 3, work_dir=tmp_path / "work")
    assert_names_file(error, "state/0/0/3.zip")


def test_a_missing_changelog_raises_naming_it(checkpoints, tmp_path):
    copy = damaged_copy(checkpoints("rocksdb-changelog", "agg"), tmp_path)
    objects = open_objects(copy)
    files = list_files(objects, "state/0/0")
    version = min(v for v in files.changelogs if v not in files.snapshots)
    (copy / f"state/0/0/{version}.changelog").unlink()
    with pytest.raises(StateFileError) as error:
        load_state(objects, "state/0/0", version, work_dir=tmp_path / "work")
    assert_names_file(error, f"state/0/0/{version}.changelog")


def test_column_families_are_refused_in_one_line(checkpoints, tmp_path):
    # transformWithState keeps its state variables in column families, which a snapshot's
    # metadata lists: a copy whose metadata lists one stands in for such a checkpoint.
    copy = damaged_copy(checkpoints("rocksdb", "agg"), tmp_path)
    path = copy / "state/0/0/2.zip"
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    header, body = entries["metadata"].split(b"\n", 1)
    metadata = {**json.loads(body), "columnFamilyMapping": {"default": 0, "countState": 1}}
    entries["metadata"] = header + b"\n" + json.dumps(metadata).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())
    (copy / "state/0/0/.2.zip.crc").unlink()
    with pytest.raises(UnsupportedStateError) as error:
        load_state(open_objects(copy), "state/0/0", 2, work_dir=tmp_path / "work")
    assert "not supported yet: transformWithState's column families" in str(error.value)
    assert "\n" not in str(error.value)
