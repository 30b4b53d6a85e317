"""The frozen checkpoint matrix (tests/data/checkpoints/): one case per cell Spark made,
``<spark-version>/<cell>``, reading only the frozen files (no Spark here).

A cell iqkit reads must equal Spark 4.3's own reading of it (``statestore.json``, through
``matrix_oracle``'s conversion): every committed version, partition by partition; a key
lookup of every key of the last version, on the partition Spark put it in; and the changes
between consecutive versions. A cell iqkit refuses is in ``REFUSED``: the refusal must be
one line holding the fragment written there, and a refused cell that starts reading fails
until it is taken out of ``REFUSED``, so the table stays what iqkit does today.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from matrix_oracle import (
    CHECKPOINTS,
    ORACLE_STAND_INS,
    Cell,
    cells,
    row_text,
    sorted_rows,
    spark_key,
    spark_row,
    spark_value,
)

import iqkit
from iqkit import (
    ChangesQuery,
    KeyQuery,
    RangeQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)
from iqkit.errors import IqkitError

#: What iqkit refuses today, cell id pattern (fnmatch) -> a fragment of the one-line
#: refusal; the first pattern a cell matches is its entry. Take a line out when its cells
#: start reading (the test fails until then).
REFUSED: dict[str, str] = {
    "*/join-*-v4-*": "not supported yet: stream-stream join state format 4",
}

#: Operators whose stores are shaped from several of Spark's rows (a join side's list of
#: buffered rows, a key's list of sessions, a state variable of a transformWithState):
#: their rows are compared with Spark's reading, version by version and partition by
#: partition, in the test module named here (each knows its oracle's options and how
#: Spark's rows group). Here every store of every version must read without a failure.
COMPARED_IN: dict[str, str] = {
    "*/join-*": "test_joins.py",
    "*/session-*": "test_sessions.py",
    "*/tws-*": "test_transform.py",
}

#: Cells iqkit opens but reads wrong today, pattern -> what is wrong: expected to fail
#: (strictly: a fix makes the case pass, and then its line must go).
WRONG: dict[str, str] = {}

#: ChangesQuery's answer on a window store (changes are for key-value stores).
WINDOW_CHANGES_REFUSAL = "ChangesQuery is not for window stores"

CELLS = cells()


def _entry(table: dict[str, str], cell_id: str) -> str | None:
    """The text of the first pattern of ``table`` that ``cell_id`` matches."""
    for pattern, text in table.items():
        if fnmatch.fnmatchcase(cell_id, pattern):
            return text
    return None


def refusal_fragment(cell_id: str) -> str | None:
    return _entry(REFUSED, cell_id)


def _case(cell: Cell) -> Any:
    wrong = _entry(WRONG, cell.id)
    marks = [pytest.mark.xfail(strict=True, reason=wrong)] if wrong else []
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.mark.parametrize("cell", [_case(cell) for cell in CELLS])
def test_a_cell_reads_as_spark_reads_it_or_is_refused_in_one_line(cell: Cell):
    fragment = refusal_fragment(cell.id)
    if fragment is None and _entry(COMPARED_IN, cell.id) is not None:
        refusal = _first_refusal(cell)
        assert refusal is None, f"{cell.id}: {refusal}"
        return
    if fragment is None:
        _assert_reads_as_the_oracle(cell)
        return
    refusal = _first_refusal(cell)
    assert refusal is not None, f"{cell.id} reads now: remove it from REFUSED"
    assert "\n" not in refusal and "Traceback" not in refusal, refusal
    assert fragment in refusal


def test_the_matrix_has_cells_of_every_line_and_every_pattern_names_a_cell():
    """The parametrization is not silently empty or one-sided (a moved data folder), and
    no line of ``REFUSED`` or ``WRONG`` outlives its cells."""
    lines = {cell.folder.parent.name for cell in CELLS}
    assert {"3.5.9", "4.0.5", "4.1.4", "4.2.1", "4.3.0"} <= lines
    refused = [cell for cell in CELLS if refusal_fragment(cell.id) is not None]
    assert refused and len(refused) < len(CELLS)
    for pattern in [*REFUSED, *COMPARED_IN, *WRONG]:
        assert any(fnmatch.fnmatchcase(cell.id, pattern) for cell in CELLS), pattern


# --------------------------------------------------------------------------------------
# the matrix in tests/data/checkpoints/README.md, written from the tables above

README = CHECKPOINTS / "README.md"
TABLE_START = (
    "<!-- iqkit:start (written by `python tests/store/checkpoint/test_checkpoint_matrix.py`) -->"
)
TABLE_END = "<!-- iqkit:end -->"


def iqkit_today(cell: Cell) -> str:
    refused, wrong = refusal_fragment(cell.id), _entry(WRONG, cell.id)
    if refused is not None:
        return f"refused: {refused}"
    if wrong is not None:
        return f"opens, reads wrong: {wrong}"
    elsewhere = _entry(COMPARED_IN, cell.id)
    if elsewhere is not None:
        return f"reads = oracle (compared in `{elsewhere}`)"
    if cell.folder.name in ORACLE_STAND_INS:
        return f"reads = oracle (that of `{ORACLE_STAND_INS[cell.folder.name]}`)"
    return "reads = oracle"


def matrix_table() -> str:
    rows = [
        "| line | cell | operator | provider | codec | format | iqkit today |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        meta = cell.meta
        conf = meta.get("session_conf", {})
        formats = [f"checkpoint v{meta.get('checkpoint_format_version', 1)}"]
        join = conf.get("spark.sql.streaming.join.stateFormatVersion")
        if join and meta["operator"].startswith("join"):
            formats.append(f"join state v{join}")
        encoding = conf.get("spark.sql.streaming.stateStore.encodingFormat")
        if encoding and meta["operator"] == "tws":
            formats.append(encoding)
        rows.append(
            f"| {meta['spark_version']} | `{cell.folder.name}` | {meta['operator']} "
            f"| {meta['provider']} | {meta['codec']} | {', '.join(formats)} "
            f"| {iqkit_today(cell)} |"
        )
    return "\n".join(rows)


def _readme_table() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index(TABLE_START) + len(TABLE_START) : text.index(TABLE_END)].strip()


def test_the_readme_matrix_says_what_iqkit_does_today():
    assert _readme_table() == matrix_table(), (
        "tests/data/checkpoints/README.md is stale: run "
        "python tests/store/checkpoint/test_checkpoint_matrix.py"
    )


def write_readme() -> None:
    text = README.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    README.write_text(text[:start] + "\n\n" + matrix_table() + "\n\n" + text[end:], "utf-8")


# --------------------------------------------------------------------------------------
# refused cells


def _first_refusal(cell: Cell) -> str | None:
    """iqkit's first refusal while reading every version of every store of ``cell``
    (an error's type and text, or a partition's failure message), or None: it read all."""
    try:
        with iqkit.open(cell.checkpoint) as engine:
            stores = {store: engine.versions(store) for store in engine.store_names()}
        for store, versions in stores.items():
            for version in versions:
                with iqkit.open(cell.checkpoint, as_of=version) as engine:
                    _request(engine, store, _everything(engine, store))
    except IqkitError as error:
        return f"{type(error).__name__}: {error}"
    except _PartitionFailed as failure:
        return str(failure)
    return None


class _PartitionFailed(Exception):
    pass


# --------------------------------------------------------------------------------------
# cells iqkit reads


def _request(engine: iqkit.StateEngine, store: str, query: Any) -> dict[int, Any]:
    """partition -> result of ``query`` (a failed partition raises)."""
    result = engine.query(StateQueryRequest.in_store(store).with_query(query))
    out = {}
    for partition, answer in result.partition_results.items():
        if answer.is_failure:
            raise _PartitionFailed(answer.failure_message)
        out[partition] = answer.result
    return out


def _rows(engine: iqkit.StateEngine, store: str) -> dict[int, list[dict[str, Any]]]:
    """Every row of ``store`` in the engine's version, partition by partition, in the
    oracle's form."""
    properties = engine.manifest(store).properties
    return {
        partition: sorted_rows([spark_row(kv.key, kv.value, properties) for kv in rows])
        for partition, rows in _request(engine, store, _everything(engine, store)).items()
    }


def _everything(engine: iqkit.StateEngine, store: str) -> Any:
    """The query for every row of ``store``: a window store's by window start."""
    if engine.manifest(store).kind.value == "window":
        return WindowRangeQuery.with_window_start_range(0, 2**62)
    return RangeQuery.with_no_bounds()


def _assert_reads_as_the_oracle(cell: Cell) -> None:
    with iqkit.open(cell.checkpoint) as engine:
        (store,) = engine.store_names()
        versions = engine.versions(store)
        operator_id = engine.manifest(store).properties["spark_operator_id"]
    oracle = cell.oracle(operator_id)
    assert versions == sorted(oracle), "committed versions"
    for version in versions:
        with iqkit.open(cell.checkpoint, as_of=version) as engine:
            expected = {p: sorted_rows(rows) for p, rows in oracle[version].items()}
            assert _rows(engine, store) == expected, f"version {version}"
            if version == versions[-1]:  # the engine of the last version serves the rest
                _assert_key_lookups(engine, store, oracle[version])
                _assert_changes(engine, store, oracle, versions, cell.checkpoint)


def _assert_key_lookups(
    engine: iqkit.StateEngine, store: str, partitions: dict[int, list[dict[str, Any]]]
) -> None:
    """Each key of the version is found, with the oracle's value, on the partition the
    oracle lists it in (and only there). The keys come from iqkit's own scan, which the
    caller has checked equals the oracle."""
    manifest = engine.manifest(store)
    scanned = _scan_keys(engine, store)
    assert sorted(map(row_text, (spark_key(k, manifest.properties) for k in scanned))) == sorted(
        row_text(row["key"]) for rows in partitions.values() for row in rows
    )
    owner = {
        row_text(row["key"]): (p, row["value"]) for p, rows in partitions.items() for row in rows
    }
    for key in scanned:
        expected_partition, expected_value = owner[row_text(spark_key(key, manifest.properties))]
        if manifest.kind.value == "window":
            query = WindowKeyQuery.with_key_and_window_start_range(key.key, key.start, key.start)
            found = {
                p: [spark_value(kv.value, manifest.properties) for kv in rows]
                for p, rows in _request(engine, store, query).items()
            }
            found = {p: values for p, values in found.items() if values}
            assert found == {expected_partition: [expected_value]}, key
        else:
            found = _request(engine, store, KeyQuery.with_key(key))
            found = {p: value for p, value in found.items() if value is not None}
            assert set(found) == {expected_partition}, key
            assert spark_value(found[expected_partition], manifest.properties) == expected_value


def _scan_keys(engine: iqkit.StateEngine, store: str) -> list[Any]:
    rows = _request(engine, store, _everything(engine, store)).values()
    return [kv.key for partition in rows for kv in partition]


def _assert_changes(
    engine: iqkit.StateEngine,
    store: str,
    oracle: dict[int, dict[int, list[dict[str, Any]]]],
    versions: list[int],
    checkpoint: Path,
) -> None:
    """``ChangesQuery.between(v - 1, v)`` = the oracle's rows of v against those of
    v - 1, partition by partition (partitions without a change left out on both sides).
    Across an offline repartition the engine of the newest version reports a change in
    the partition its key has now, Spark's reading in the one it had then: there the
    changes are the whole store's, compared as one list."""
    manifest = engine.manifest(store)
    newest = _shuffle_partitions(checkpoint, versions[-1])
    for before, after in itertools.pairwise(versions):
        query = ChangesQuery.between(before, after)
        if manifest.kind.value == "window":
            result = engine.query(StateQueryRequest.in_store(store).with_query(query))
            for answer in result.partition_results.values():
                assert answer.is_failure and WINDOW_CHANGES_REFUSAL in answer.failure_message
            continue
        got = {
            p: sorted(
                (
                    change.kind,
                    row_text(spark_key(change.key, manifest.properties)),
                    row_text(spark_value(change.value, manifest.properties)),
                    row_text(spark_value(change.old_value, manifest.properties)),
                    change.version,
                )
                for change in changes
            )
            for p, changes in _request(engine, store, query).items()
        }
        got = {p: c for p, c in got.items() if c}
        if newest == _shuffle_partitions(checkpoint, before) == _shuffle_partitions(
            checkpoint, after
        ):
            expected = _oracle_changes(oracle[before], oracle[after], after)
        else:  # keys diffed over the whole store: a key a repartition moved did not change
            got = {0: _as_one_list(got)} if got else {}
            expected = _oracle_changes(
                {0: _as_one_list(oracle[before])}, {0: _as_one_list(oracle[after])}, after
            )
        assert got == expected, f"changes {before} -> {after}"


def _shuffle_partitions(checkpoint: Path, version: int) -> int:
    """The state partitions of ``version``: its batch's offsets log entry's shuffle
    partitions (what an offline repartition changes)."""
    metadata = json.loads((checkpoint / "offsets" / str(version - 1)).read_text().split("\n")[1])
    return int(metadata["conf"]["spark.sql.shuffle.partitions"])


def _as_one_list(by_partition: dict[int, list[Any]]) -> list[Any]:
    return sorted((item for items in by_partition.values() for item in items), key=repr)


def _oracle_changes(
    before: dict[int, list[dict[str, Any]]], after: dict[int, list[dict[str, Any]]], version: int
) -> dict[int, list[tuple[str, str, str, str, int]]]:
    """partition -> sorted (kind, key, value, old value, version), the texts of the changes
    from ``before``'s rows to ``after``'s (those of ``version``)."""
    out = {}
    for partition in set(before) | set(after):
        old = {row_text(r["key"]): row_text(r["value"]) for r in before.get(partition, [])}
        new = {row_text(r["key"]): row_text(r["value"]) for r in after.get(partition, [])}
        changes = []
        for key in set(old) | set(new):
            if key not in old:
                changes.append(("insert", key, new[key], "null", version))
            elif key not in new:
                changes.append(("delete", key, "null", old[key], version))
            elif old[key] != new[key]:
                changes.append(("update", key, new[key], old[key], version))
        if changes:
            out[partition] = sorted(changes)
    return out


if __name__ == "__main__":  # rewrite the README's matrix
    write_readme()
    sys.exit(0)
