"""The frozen checkpoints of every Spark line (3.5, 4.0, 4.1, 4.3; 4.2 when made) read as
Spark 4.3's ``format("statestore")`` reads them, for the operators iqkit serves:
streaming aggregation (``agg``, ``window``), ``dropDuplicates`` (``dedup``,
``dedup-wm``), ``dropDuplicatesWithinWatermark`` (``dedup-within-wm``) and
``applyInPandasWithState`` (``apply-pandas``), on every provider and codec.

For each cell: every committed version, partition by partition, holds exactly the rows of
the cell's ``statestore.json`` (converted by its README's rules), and each key asked for
alone (``KeyQuery``) is answered by the partition Spark put it in, and only by it. No
Spark runs: the oracle was recorded when the cells were made.

Then what a line writes that iqkit must tell apart: a checkpoint without operator
metadata (Spark 3.5) names its store by what its schema file says the operator is; a
format iqkit does not know yet is refused in one line naming the file and the format.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import iqkit
from iqkit import KeyQuery, RangeQuery, StateQueryRequest
from iqkit.errors import IqkitError
from iqkit.query.window import WindowKeyQuery, WindowRangeQuery
from iqkit.store.checkpoint.spark_release import written_by
from iqkit.store.objects import open_objects

CELLS_ROOT = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
#: The cells' operators this module covers, and the store iqkit names each one's state.
STORE_OF = {
    "agg": "aggregate",
    "window": "aggregate",
    "dedup": "dedup",
    "dedup-wm": "dedup",
    "dedup-within-wm": "dedup",
    "apply-pandas": "groups",
}


def _cells() -> list[Any]:
    """Every made cell of the covered operators, on every line (``pytest.param`` ids
    ``<line>/<cell>``); a cell Spark refused to make (``"status": "failed"``) is left
    out."""
    found = []
    for cell_json in sorted(CELLS_ROOT.glob("*/*/cell.json")):
        cell = json.loads(cell_json.read_text())
        if cell.get("operator") not in STORE_OF or cell.get("status") == "failed":
            continue
        if not (cell_json.parent / "statestore.json").exists():
            continue
        found.append(
            pytest.param(cell_json.parent, id=f"{cell_json.parent.parent.name}/{cell['cell']}")
        )
    return found


CELLS = _cells()


def _micros(text: str) -> int:
    """An ISO-8601 instant as iqkit writes it, as the oracle's microseconds."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _as_oracle(value: Any, kind: Any) -> Any:
    """An iqkit value of Spark type ``kind`` (its JSON form) as ``statestore.json`` has
    it: timestamps as microseconds, binary as bare hex, structs as objects."""
    if value is None:
        return None
    if isinstance(kind, dict) and kind.get("type") == "struct":
        return {f["name"]: _as_oracle(value.get(f["name"]), f["type"]) for f in kind["fields"]}
    if isinstance(kind, dict) and kind.get("type") == "array":
        return [_as_oracle(v, kind["elementType"]) for v in value]
    if kind in ("timestamp", "timestamp_ntz"):
        return _micros(value)
    if kind == "binary":
        return value.removeprefix("0x")
    return value


def _oracle_row(kv: Any, manifest: Any) -> dict[str, Any]:
    """An iqkit row of a checkpoint store as a ``statestore.json`` row."""
    props = manifest.properties
    key_schema, value_schema = props["spark_key_schema"], props["spark_value_schema"]
    if manifest.kind == "window":
        parts = iter(kv.key.key if isinstance(kv.key.key, tuple) else (kv.key.key,))
        window = {"start": kv.key.start * 1000, "end": kv.key.end * 1000}
        key = {
            f["name"]: window if f["name"] == "window" else _as_oracle(next(parts), f["type"])
            for f in key_schema["fields"]
        }
    else:
        parts = kv.key if isinstance(kv.key, tuple) else (kv.key,)
        key = {
            f["name"]: _as_oracle(v, f["type"])
            for f, v in zip(key_schema["fields"], parts, strict=True)
        }
    return {"key": key, "value": _as_oracle(kv.value, {"type": "struct", **value_schema})}


def _text(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


def _oracle_batches(cell: Path) -> list[dict[str, Any]]:
    """The batches Spark's reader read of the cell's one operator (a batch it failed on
    is left out: nothing to compare with)."""
    oracle = json.loads((cell / "statestore.json").read_text())
    (operator,) = oracle["operators"]
    (read,) = operator["reads"]
    return [b for b in read["batches"] if "partitions" in b]


def _aggregates_from_output(cell: Path) -> dict[int, list[str]]:
    """Where Spark 4.3's reader fails (checkpoint format v2: it cannot parse the state
    file names), the oracle is the sink: an aggregation without a watermark in update
    mode emits each key's new value in every batch that changed it, so the state after
    batch b is each key's last emitted row. Per state version, the rows as
    ``statestore.json`` has them (key ``user``; the value columns in output order, under
    the state's names ``sum`` and ``count``)."""
    states: dict[int, list[str]] = {}
    latest: dict[str, dict[str, Any]] = {}
    for batch in json.loads((cell / "output.json").read_text()):
        for row in batch["rows"]:
            latest[row["user"]] = {"sum": row["sum(amount)"], "count": row["count(1)"]}
        states[batch["batchId"] + 1] = _text(
            [{"key": {"user": user}, "value": value} for user, value in latest.items()]
        )
    return states


@pytest.mark.parametrize("cell", CELLS)
def test_every_version_and_partition_reads_as_spark_43(cell: Path) -> None:
    cell_info = json.loads((cell / "cell.json").read_text())
    store = STORE_OF[cell_info["operator"]]
    checkpoint = cell / "checkpoint"
    batches = _oracle_batches(cell)
    from_output = None
    if not batches:
        assert cell_info["operator"] == "agg", "Spark's reader read no batch, and no sink oracle"
        from_output = _aggregates_from_output(cell)
        batches = [{"stateVersion": version} for version in from_output]
    for batch in batches:
        version = batch["stateVersion"]
        with iqkit.open(checkpoint, as_of=version) as engine:
            assert engine.store_names() == [store]
            manifest = engine.manifest(store)
            query = (
                WindowRangeQuery.with_window_start_range(0, 2**62)
                if manifest.kind == "window"
                else RangeQuery.with_no_bounds()
            )
            result = engine.query(StateQueryRequest.in_store(store).with_query(query))
            got: dict[str, list[Any]] = {}
            for p, partition in result.partition_results.items():
                assert partition.is_success, partition.failure_message
                with partition.result as rows:
                    got[str(p)] = list(rows)
            mine = {p: _text([_oracle_row(kv, manifest) for kv in rows]) for p, rows in got.items()}
            if from_output is None:
                expected = {p: _text(rows) for p, rows in batch["partitions"].items()}
                assert mine == expected, f"version {version}"
            else:  # no partitions in the sink: the rows of all of them (their keys routed below)
                assert sorted(r for rows in mine.values() for r in rows) == from_output[version]
            # Each key alone: answered by the partition Spark keeps it in, and only by it.
            for p, rows in got.items():
                for kv in rows:
                    if manifest.kind == "window":
                        ask = WindowKeyQuery.with_key_and_window_start_range(
                            kv.key.key, kv.key.start, kv.key.start
                        )
                    else:
                        ask = KeyQuery.with_key(kv.key)
                    answer = engine.query(StateQueryRequest.in_store(store).with_query(ask))
                    if manifest.kind == "window":
                        found = {
                            q: [(w.key, w.value) for w in r.result]
                            for q, r in answer.partition_results.items()
                        }
                        holders = {q for q, w in found.items() if w}
                        assert holders == {int(p)}, (version, kv.key)
                        assert found[int(p)] == [(kv.key, kv.value)]
                    else:
                        assert set(answer.partition_results) == {int(p)}, (version, kv.key)
                        assert answer.partition_results[int(p)].result == kv.value


def test_the_cells_cover_every_line_and_provider() -> None:
    """The matrix above is not empty by accident: every line made, every provider."""
    seen = {
        (c.values[0].parent.name, json.loads((c.values[0] / "cell.json").read_text())["provider"])
        for c in CELLS
    }
    lines = {line for line, _ in seen}
    assert {"3.5.9", "4.0.5", "4.1.4", "4.3.0"} <= lines
    assert {p for _, p in seen} == {"hdfs", "rocksdb", "rocksdb-changelog"}


# -- Spark 3.5: no operator metadata ---------------------------------------------------------
@pytest.mark.parametrize(
    ("cell", "operator", "store"),
    [
        ("agg-hdfs", "stateStoreSave", "aggregate"),
        ("window-rocksdb-changelog", "stateStoreSave", "aggregate"),
        ("dedup-hdfs", "dedupe", "dedup"),
        ("dedup-wm-hdfs", "dedupe", "dedup"),
        ("dedup-within-wm-hdfs", "dedupeWithinWatermark", "dedup"),
        ("apply-pandas-hdfs", "flatMapGroupsWithState", "groups"),
    ],
)
def test_a_35_checkpoint_names_its_operator_from_the_schema_file(cell, operator, store) -> None:
    """Spark 3.5 writes no ``state/<op>/_metadata/metadata``: the operator is what its
    store's schema says (the manifest records it as inferred), partitions are the offsets
    log's ``spark.sql.shuffle.partitions``."""
    with iqkit.open(CELLS_ROOT / "3.5.9" / cell / "checkpoint") as engine:
        assert engine.store_names() == [store]
        props = engine.manifest(store).properties
        assert props["spark_operator"] == operator
        assert props["spark_operator_id"] == 0
        assert engine.manifest(store).partitions == 3


def test_a_35_join_and_aggregation_are_listed_under_their_inferred_names() -> None:
    with iqkit.open(CELLS_ROOT / "3.5.9" / "join-agg-hdfs" / "checkpoint") as engine:
        assert engine.store_names() == ["aggregate-0", "join-1.left", "join-1.right"]


@pytest.mark.parametrize("cell", ["session-hdfs", "session-rocksdb"])
def test_a_35_session_window_is_told_from_an_aggregation(cell) -> None:
    """A 3.5 session window's key ends in ``sessionStartTime``: it is served as the
    session store (test_sessions reads it), never as an aggregation's rows."""
    checkpoint = CELLS_ROOT / "3.5.9" / cell / "checkpoint"
    with iqkit.open(checkpoint) as engine:
        assert engine.store_names() == ["sessions"]
        assert engine.manifest("sessions").kind != "window"


def _copy(cell: str, tmp_path: Path, line: str = "3.5.9") -> Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(CELLS_ROOT / line / cell / "checkpoint", target)
    return target


def _first_line_error(checkpoint: Path, store: str) -> str:
    with pytest.raises(IqkitError) as caught, iqkit.open(checkpoint) as engine:
        result = engine.query(
            StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds())
        )
        for partition in result.partition_results.values():
            if partition.is_failure:
                raise IqkitError(partition.failure_message)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_schema_file_of_an_unknown_format_version_is_refused_naming_it(tmp_path) -> None:
    checkpoint = _copy("agg-hdfs", tmp_path)
    schema = checkpoint / "state/0/0/_metadata/schema"
    data = schema.read_bytes()
    assert data[:4] == b"\x00\x02v2"
    schema.write_bytes(b"\x00\x02v9" + data[4:])
    message = _first_line_error(checkpoint, "aggregate")
    assert "state/0/0/_metadata/schema" in message and "v9" in message
    assert message.endswith("the checkpoint was written by Spark 3.5 or earlier"), message


def test_a_35_state_folder_whose_schema_says_no_known_operator_is_refused(tmp_path) -> None:
    """A schema whose columns match no operator's (here: a key of one null column and a
    value of one long, a streaming limit's) is listed, and reading it is refused naming
    the schema file: never served as rows of a guessed meaning."""
    checkpoint = _copy("agg-hdfs", tmp_path)
    schema = checkpoint / "state/0/0/_metadata/schema"

    def utf(text: str) -> bytes:
        raw = text.encode()
        return len(raw).to_bytes(2, "big") + raw

    key = '{"type":"struct","fields":[{"name":"key","type":"null","nullable":true,"metadata":{}}]}'
    value = (
        '{"type":"struct","fields":[{"name":"value","type":"long","nullable":false,"metadata":{}}]}'
    )
    schema.write_bytes(
        utf("v2") + (1).to_bytes(4, "big") + utf(key) + (1).to_bytes(4, "big") + utf(value)
    )
    with iqkit.open(checkpoint) as engine:
        (name,) = engine.store_names()
    message = _first_line_error(checkpoint, name)
    assert "state/0/0/_metadata/schema" in message and "not supported" in message


@pytest.mark.parametrize(
    ("line", "cell", "path", "old", "new", "named", "writer"),
    [
        # The offsets log every line writes is v1; a later one is refused, not misread
        # (and the newest entry being a later format, the Spark is a later one).
        ("3.5.9", "agg-hdfs", "offsets/3", b"v1\n", b"v2\n", "offsets log format v2",
         "a Spark newer than 4.3 (its offsets log is format v2)"),
        # Operator metadata v1 (4.0+) and v2 (transformWithState, joins v3+).
        ("4.3.0", "agg-hdfs", "state/0/_metadata/metadata", b"v1\n", b"v3\n", "format v3",
         "Spark 4.3"),
        # The commit log is v1, and v2 with checkpoint format v2 (state file ids).
        ("4.3.0", "agg-ckptv2-rocksdb-changelog", "commits/3", b"v2\n", b"v7\n",
         "commit log format v7", "Spark 4.3"),
    ],
)  # fmt: skip
def test_a_log_or_metadata_file_of_a_later_format_is_refused_naming_it(
    tmp_path, line, cell, path, old, new, named, writer
) -> None:
    checkpoint = _copy(cell, tmp_path, line)
    target = checkpoint / path
    data = target.read_bytes()
    assert data.startswith(old)
    target.write_bytes(new + data[len(old) :])
    message = _first_line_error(checkpoint, "aggregate")
    assert path in message and named in message, message
    assert message.endswith(f"the checkpoint was written by {writer}"), message


#: The release line each frozen line's folder is, as ``spark_release`` names it (4.0 and
#: 4.1 record the same settings, so they are one answer).
_LINE_NAMES = {
    "3.5.9": "Spark 3.5 or earlier",
    "4.0.5": "Spark 4.0 or 4.1",
    "4.1.4": "Spark 4.0 or 4.1",
    "4.2.1": "Spark 4.2",
    "4.3.0": "Spark 4.3",
}


@pytest.mark.parametrize("line", sorted(_LINE_NAMES))
def test_the_spark_that_wrote_a_checkpoint_is_told_from_its_offsets_log(line) -> None:
    objects = open_objects(str(CELLS_ROOT / line / "agg-hdfs" / "checkpoint"))
    assert written_by(objects) == _LINE_NAMES[line]


def test_settings_no_known_line_records_are_a_newer_spark(tmp_path) -> None:
    checkpoint = _copy("agg-hdfs", tmp_path, "4.3.0")
    newest = max(checkpoint.glob("offsets/[0-9]*"), key=lambda p: int(p.name))
    header, metadata, *sources = newest.read_text().split("\n")
    entry = json.loads(metadata)
    entry["conf"]["spark.sql.streaming.someFutureSetting"] = "true"
    newest.write_text("\n".join([header, json.dumps(entry), *sources]))
    assert written_by(open_objects(str(checkpoint))) == (
        "a Spark newer than 4.3 (its offsets log records settings 4.3 does not)"
    )


@pytest.mark.parametrize("line", ["4.3.0"])
def test_an_unknown_join_state_format_is_refused_naming_the_spark(line) -> None:
    checkpoint = CELLS_ROOT / line / "join-inner-v4-rocksdb-changelog" / "checkpoint"
    message = _first_line_error(checkpoint, "join.left")
    assert "stream-stream join state format 4" in message
    assert message.endswith(f"the checkpoint was written by {_LINE_NAMES[line]}"), message


def test_an_unknown_operator_is_refused_naming_it_and_the_spark(tmp_path) -> None:
    checkpoint = _copy("agg-hdfs", tmp_path, "4.3.0")
    metadata = checkpoint / "state/0/_metadata/metadata"
    text = metadata.read_text()
    assert "stateStoreSave" in text
    metadata.write_text(text.replace("stateStoreSave", "futureStatefulOperator"))
    with iqkit.open(checkpoint) as engine:
        (name,) = engine.store_names()
    message = _first_line_error(checkpoint, name)
    assert "futureStatefulOperator" in message
    assert message.endswith("the checkpoint was written by Spark 4.3"), message
