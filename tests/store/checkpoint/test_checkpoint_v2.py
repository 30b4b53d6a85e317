"""Checkpoint format v2 (``spark.sql.streaming.stateStore.checkpointFormatVersion=2``:
state files named ``<version>_<unique id>``, the commit log naming the one that counts)
and a state partition count that changes during a checkpoint's life (Spark 4.2+'s
offline repartitioning), read from the frozen checkpoints of tests/data/checkpoints.

Spark 4.3's own state reader fails on the v2 checkpoints (their ``statestore.json``
records its errors), so these are checked against the query's own output (update mode:
the state after batch b holds, for every key output in batches up to b, its latest
output row) and against a model computed from the inputs (a running sum and count per
user). The repartitioned checkpoint is checked against Spark's reader, which reads it."""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import iqkit
from iqkit import ChangesQuery, KeyQuery, MultiVersionedKeyQuery, RangeQuery, StateQueryRequest
from iqkit.errors import StoreCorruptedError
from iqkit.store.checkpoint.rocksdb_files import load_state
from iqkit.store.checkpoint.state_schema import read_store_schema
from iqkit.store.checkpoint.unsafe_row import RowDecoder
from iqkit.store.objects import open_objects

CELLS = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
V2_CELLS = [
    "4.3.0/agg-ckptv2-rocksdb",
    "4.3.0/agg-ckptv2-rocksdb-changelog",
    "4.1.4/agg-ckptv2-rocksdb-changelog",
]
REPARTITIONED = "4.3.0/agg-repartition-rocksdb-changelog"
STORE = "aggregate"


def cell_folder(cell: str) -> Path:
    folder = CELLS / cell
    if not (folder / "checkpoint").is_dir():
        pytest.skip(f"frozen checkpoint {cell} not here (tests/data/checkpoints)")
    return folder


def output_model(cell: str) -> dict[int, dict[str, dict[str, int]]]:
    """State version → user → {sum, count}, from the query's update-mode output."""
    state: dict[str, dict[str, int]] = {}
    versions = {}
    for batch in json.loads((cell_folder(cell) / "output.json").read_text()):
        for row in batch["rows"]:
            state[row["user"]] = {"sum": row["sum(amount)"], "count": row["count(1)"]}
        versions[batch["batchId"] + 1] = dict(state)
    return versions


def input_model(cell: str) -> dict[int, dict[str, dict[str, int]]]:
    """State version → user → {sum, count}: the running sum and count of the inputs (one
    input file per batch; a repartition's batch reads none)."""
    facts = json.loads((cell_folder(cell) / "cell.json").read_text())
    after = facts.get("repartitioned", {}).get("after_batch")
    state: dict[str, dict[str, int]] = {}
    versions, batch = {}, 0
    for records in facts["inputs"]:
        for r in records:
            old = state.get(r["user"], {"sum": 0, "count": 0})
            state[r["user"]] = {"sum": old["sum"] + r["amount"], "count": old["count"] + 1}
        versions[batch + 1] = dict(state)
        batch += 1
        if after is not None and batch == after + 1:  # the repartition's own batch
            versions[batch + 1] = dict(state)
            batch += 1
    return versions


def scan(checkpoint: Path, version: int) -> dict[int, dict[str, dict[str, int]]]:
    """Partition → user → value, as iqkit serves ``version``."""
    with iqkit.open(checkpoint, as_of=version) as engine:
        request = StateQueryRequest.in_store(STORE).with_query(RangeQuery.with_no_bounds())
        got = {}
        for p, partition in engine.query(request).partition_results.items():
            assert partition.is_success, partition.failure_message
            got[p] = {kv.key: kv.value for kv in partition.result}
        return got


def flat(partitions: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {k: v for rows in partitions.values() for k, v in rows.items()}


def committed(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) + 1 for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


# -- checkpoint format v2 ------------------------------------------------------------------
@pytest.mark.parametrize("cell", V2_CELLS)
def test_every_version_of_a_v2_checkpoint_is_the_querys_state(cell):
    checkpoint = cell_folder(cell) / "checkpoint"
    from_output, from_inputs = output_model(cell), input_model(cell)
    versions = committed(checkpoint)
    assert versions == [1, 2, 3, 4]
    with iqkit.open(checkpoint) as engine:
        assert engine.versions(STORE) == versions
    for version in versions:
        got = scan(checkpoint, version)
        assert set(got) == {0, 1, 2}
        assert flat(got) == from_output[version] == from_inputs[version], f"version {version}"
        with iqkit.open(checkpoint, as_of=version) as engine:
            for p, rows in got.items():
                for user in rows:  # each key where Spark's hash put it, and found there
                    assert engine.partition_for_key(STORE, user) == p
                    found = engine.query(
                        StateQueryRequest.in_store(STORE).with_query(KeyQuery.with_key(user))
                    ).partition_results[p]
                    assert found.result == rows[user]


def v2_copy(cell: str, tmp_path: Path) -> Path:
    copy = tmp_path / "checkpoint"
    shutil.copytree(cell_folder(cell) / "checkpoint", copy)
    return copy


def named_file(checkpoint: Path, version: int, partition: int, kind: str) -> Path:
    """The file of ``version`` of ``partition`` the commit log names (``kind``: zip or
    changelog)."""
    text = (checkpoint / "commits" / str(version - 1)).read_text().split("\n", 1)[1]
    uid = json.loads(text)["stateUniqueIds"]["0"][partition][0]
    return checkpoint / "state" / "0" / str(partition) / f"{version}_{uid}.{kind}"


@pytest.mark.parametrize("cell, kind", [(V2_CELLS[0], "zip"), (V2_CELLS[1], "changelog")])
def test_an_attempt_the_commit_log_does_not_name_is_ignored(cell, kind, tmp_path):
    """A retried batch leaves a file of each attempt for one version: the other attempt's
    file (here another version's state, with Spark's checksum sidecar) is never read."""
    checkpoint = v2_copy(cell, tmp_path)
    expected = output_model(cell)
    for partition in range(3):
        folder = checkpoint / "state" / "0" / str(partition)
        other = f"_{uuid.uuid4()}.{kind}"
        for version in (3, 4):
            source = named_file(checkpoint, 1 if kind == "zip" else 2, partition, kind)
            if not source.exists():
                source = next(folder.glob(f"1_*.{kind}"))
            stray = folder / f"{version}{other}"
            shutil.copyfile(source, stray)
            shutil.copyfile(f"{source}.crc", f"{stray}.crc")
    for version in (3, 4):
        assert flat(scan(checkpoint, version)) == expected[version]


@pytest.mark.parametrize(
    "cell, version, kind", [(V2_CELLS[0], 4, "zip"), (V2_CELLS[1], 3, "changelog")]
)
def test_a_missing_file_the_commit_log_names_is_refused_naming_it(cell, version, kind, tmp_path):
    checkpoint = v2_copy(cell, tmp_path)
    missing = named_file(checkpoint, version, 1, kind)
    missing.unlink()
    Path(f"{missing}.crc").unlink()
    with iqkit.open(checkpoint, as_of=version) as engine:
        request = StateQueryRequest.in_store(STORE).with_query(RangeQuery.with_no_bounds())
        results = engine.query(request).partition_results
    assert results[0].is_success and results[2].is_success
    failure = results[1].failure_message
    assert not results[1].is_success
    assert missing.name in failure and "missing" in failure and "\n" not in failure


def test_a_missing_changelog_a_lineage_names_is_refused_naming_it(tmp_path):
    """Version 3 of the changelog cell is replayed from version 2's snapshot with version
    3's changelog; version 4's own snapshot is there, so taking version 3's changelog away
    refuses version 3 alone, naming it."""
    cell = "4.3.0/agg-ckptv2-rocksdb-changelog"
    checkpoint = v2_copy(cell, tmp_path)
    for partition in range(3):
        gone = named_file(checkpoint, 2, partition, "zip")
        gone.unlink()
        Path(f"{gone}.crc").unlink()
    # Version 3 now replays versions 1 to 3's changelogs (its lineage names them).
    assert flat(scan(checkpoint, 3)) == output_model(cell)[3]
    # Partition 1's (partition 0's files say which versions are still kept).
    gone = named_file(checkpoint, 1, 1, "changelog")
    gone.unlink()
    with iqkit.open(checkpoint, as_of=3) as engine:
        request = StateQueryRequest.in_store(STORE).with_query(RangeQuery.with_no_bounds())
        results = engine.query(request).partition_results
    assert results[0].is_success and not results[1].is_success
    failure = results[1].failure_message
    assert gone.name in failure and "lineage" in failure and "\n" not in failure


def _json_value(value: Any) -> Any:
    """A decoded value as statestore.json writes it (timestamps in microseconds)."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1_000_000)
    return value


def test_a_joins_v2_stores_take_their_own_id_from_the_commit_log(tmp_path):
    """A stream-stream join keeps four stores in each partition folder; the commit log
    lists one id per store, in the order of the operator's metadata. Every version of
    every store reads as Spark reads the same query's checkpoint in format v1 (state
    contents are deterministic; Spark's reader fails on the v2 one)."""
    v2 = cell_folder("4.3.0/join-inner-v2-ckptv2-rocksdb-changelog") / "checkpoint"
    v1 = cell_folder("4.3.0/join-inner-v2-rocksdb-changelog")
    oracle = json.loads((v1 / "statestore.json").read_text())["operators"][0]["reads"]
    objects = open_objects(v2)
    for read in oracle:
        store = read["options"].get("storeName")
        if store is None:
            continue
        schema = read_store_schema(objects, "state/0", store)
        keys, values = RowDecoder(schema.key_schema), RowDecoder(schema.value_schema)
        for batch in read["batches"]:
            for p, rows in batch["partitions"].items():
                state = load_state(
                    objects, f"state/0/{p}/{store}", batch["stateVersion"], work_dir=tmp_path
                )
                got = sorted(
                    json.dumps([list(map(_json_value, keys.decode(k))),
                                list(map(_json_value, values.decode(v)))])
                    for k, v in state.items()
                )  # fmt: skip
                want = sorted(
                    json.dumps([list(r["key"].values()), list(r["value"].values())]) for r in rows
                )
                assert got == want, f"{store} partition {p} version {batch['stateVersion']}"


# -- a partition count that changes (offline repartitioning) --------------------------------
def spark_reading(cell: str) -> dict[int, dict[int, dict[str, dict[str, int]]]]:
    """State version → partition → user → value, as Spark 4.3's state reader read them."""
    facts = json.loads((cell_folder(cell) / "statestore.json").read_text())
    (read,) = facts["operators"][0]["reads"]
    return {
        batch["stateVersion"]: {
            int(p): {r["key"]["user"]: r["value"] for r in rows}
            for p, rows in batch["partitions"].items()
        }
        for batch in read["batches"]
    }


def test_each_version_has_the_partition_count_of_its_batch():
    """Batches 0-1 ran with 3 partitions, the repartition wrote batch 2 with 5, batches 3-4
    ran with 5; the operator's metadata still says 3. Every version holds, partition by
    partition, what Spark's reader gives, keys route with the version's own count, and the
    versions before the repartition keep theirs."""
    checkpoint = cell_folder(REPARTITIONED) / "checkpoint"
    oracle, model = spark_reading(REPARTITIONED), input_model(REPARTITIONED)
    assert '"numPartitions":3' in (checkpoint / "state/0/_metadata/metadata").read_text()
    counts = {1: 3, 2: 3, 3: 5, 4: 5, 5: 5}
    assert {v: len(p) for v, p in oracle.items()} == counts
    with iqkit.open(checkpoint) as engine:
        assert engine.versions(STORE) == [1, 2, 3, 4, 5]
        assert engine.manifest(STORE).partitions == 5
        assert sorted(engine.lags()[STORE]) == [0, 1, 2, 3, 4]
    for version, count in counts.items():
        got = scan(checkpoint, version)
        assert got == oracle[version], f"version {version}"
        assert flat(got) == model[version], f"version {version}"
        with iqkit.open(checkpoint, as_of=version) as engine:
            assert engine.manifest(STORE).partitions == count
            for p, rows in got.items():
                for user, value in rows.items():
                    assert engine.partition_for_key(STORE, user) == p
                    request = StateQueryRequest.in_store(STORE).with_query(KeyQuery.with_key(user))
                    assert engine.query(request).partition_results[p].result == value


def test_histories_and_changes_cross_the_repartition():
    """A key's history and the change feed of the newest version's partitions reach back
    past the repartition: an older version's rows are taken from the partition that held
    each key then (Spark's hash with that version's count)."""
    checkpoint = cell_folder(REPARTITIONED) / "checkpoint"
    model = input_model(REPARTITIONED)
    with iqkit.open(checkpoint) as engine:
        for user in sorted(model[5]):
            query = MultiVersionedKeyQuery.with_key(user).with_ascending_timestamps()
            request = StateQueryRequest.in_store(STORE).with_query(query)
            (result,) = engine.query(request).partition_results.values()
            assert result.is_success, result.failure_message
            want = []
            for version in range(1, 6):
                value = model[version].get(user)
                if value is not None and (not want or want[-1][1] != value):
                    want.append((version, value))
            assert [(r.version, r.value) for r in result.result] == want, user
        request = StateQueryRequest.in_store(STORE).with_query(ChangesQuery.between(1, 5))
        changes = []
        for result in engine.query(request).partition_results.values():
            assert result.is_success, result.failure_message
            changes += [(c.version, c.key, c.value) for c in result.result]
    want = [
        (v, user, value)
        for v in range(2, 6)
        for user, value in model[v].items()
        if model[v - 1].get(user) != value
    ]
    assert sorted(changes) == sorted(want)
    assert not [c for c in changes if c[0] == 3]  # the repartition changed no value


def test_an_engine_that_sees_the_count_change_under_it_refuses(tmp_path):
    """An engine routes with the count it opened the store with: a repartition committed
    while it stays open is refused in one line, and an engine opened again reads it."""
    copy = tmp_path / "checkpoint"
    shutil.copytree(cell_folder(REPARTITIONED) / "checkpoint", copy)
    later = tmp_path / "later"
    later.mkdir()
    for batch in (2, 3, 4):  # not committed yet: the repartition has not run
        (copy / "commits" / str(batch)).rename(later / str(batch))
    request = StateQueryRequest.in_store(STORE).with_query(RangeQuery.with_no_bounds())
    with iqkit.open(copy) as engine:
        assert engine.manifest(STORE).partitions == 3
        assert all(r.is_success for r in engine.query(request).partition_results.values())
        for batch in (2, 3, 4):
            (later / str(batch)).rename(copy / "commits" / str(batch))
        results = engine.query(request).partition_results
        assert sorted(results) == [0, 1, 2]
        for result in results.values():
            assert not result.is_success
            assert "repartitioned from 3 to 5" in result.failure_message
            assert "\n" not in result.failure_message
    assert flat(scan(copy, 5)) == input_model(REPARTITIONED)[5]


def test_a_damaged_partition_count_in_the_offsets_log_is_refused_naming_it(tmp_path):
    copy = tmp_path / "checkpoint"
    shutil.copytree(cell_folder(REPARTITIONED) / "checkpoint", copy)
    offsets = copy / "offsets" / "4"
    text = offsets.read_text()
    assert '"spark.sql.shuffle.partitions":"5"' in text
    offsets.write_text(
        text.replace('"spark.sql.shuffle.partitions":"5"', '"spark.sql.shuffle.partitions":"x5"')
    )
    (copy / "offsets" / ".4.crc").unlink(missing_ok=True)
    with iqkit.open(copy) as engine, pytest.raises(StoreCorruptedError) as error:
        engine.manifest(STORE)
    assert "offsets/4" in str(error.value) and "spark.sql.shuffle.partitions" in str(error.value)
    with iqkit.open(copy, as_of=4) as engine:  # the versions before it keep theirs
        assert engine.manifest(STORE).partitions == 5
