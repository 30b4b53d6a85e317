"""Versions as data in a notebook: the rows of ``get --as-of``, ``history`` and
``changes`` results, and a key's history drawn over time.

The engine answers these queries with records, not key-value rows (``VersionedRecord``
per value a key held, ``Change`` per key a version changed), so they are tabulated by
``tables.history_table`` / ``tables.changes_table`` rather than ``collect``: the same
row layout (partition, the key's columns, the value's columns) plus the records' own
columns. The records are already in memory when the engine returns, so a limit only
cuts the table; nothing is left to stream.

The plot reads the records themselves (``VersionedRecord.value``), not the table: a
value is a number, or a record whose numeric fields are the lines to draw, and the
record's ``timestamp`` / ``valid_to`` say exactly where each step starts and ends.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from ..query import (
    ChangesQuery,
    MultiVersionedKeyQuery,
    StateQueryResult,
    VersionedKeyQuery,
    VersionedRecord,
)
from ..store.manifest import StoreManifest
from ..tables import Collected, changes_table, history_table

__all__ = ["VERSION_QUERIES", "history_plot", "numeric_series", "version_rows"]

#: The query types whose results are records (``version_rows`` tabulates them).
VERSION_QUERIES = (VersionedKeyQuery, MultiVersionedKeyQuery, ChangesQuery)


def version_rows(
    result: StateQueryResult[Any], manifest: StoreManifest, query: Any, *, limit: int | None
) -> Collected:
    """The rows of a version query's result, at most ``limit`` (``None``: all), with the
    rows kept per partition, as ``collect`` reports them (failed partitions have none)."""
    started = time.perf_counter_ns()
    if isinstance(query, ChangesQuery):
        table = changes_table(result, manifest)
    else:
        table = history_table(result, manifest, key=query.key)
    truncated = limit is not None and table.num_rows > limit
    if truncated:
        table = table.slice(0, limit)
    kept = Counter(table.column("partition").to_pylist()) if table.num_rows else Counter()
    rows_per = {p: kept.get(p, 0) for p, qr in result.partition_results.items() if qr.is_success}
    # Tabulating is what reading rows costs here: the partition of the most rows gets it.
    read_ns = dict.fromkeys(rows_per, 0)
    if rows_per:
        read_ns[max(rows_per, key=lambda p: rows_per[p])] = time.perf_counter_ns() - started
    return Collected(table, rows_per, read_ns, truncated)


def _records(result: StateQueryResult[Any]) -> list[VersionedRecord[Any]]:
    out: list[VersionedRecord[Any]] = []
    for qr in result.partition_results.values():
        if qr.is_success and qr.result is not None:
            value = qr.result
            out += [value] if isinstance(value, VersionedRecord) else list(value)
    return sorted(out, key=lambda r: r.timestamp)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def numeric_series(
    records: list[VersionedRecord[Any]], column: str | None = None
) -> dict[str, list[float | None]]:
    """Each numeric column of the records' values → its value per record (``None`` where
    a record has none): ``value`` for plain numbers, a record's numeric fields for JSON
    records. ``column`` keeps only that one (``ValueError`` naming the numeric ones when
    it is not among them)."""
    series: dict[str, list[float | None]] = {}
    if records and all(_is_number(r.value) or r.value is None for r in records):
        if any(_is_number(r.value) for r in records):
            series["value"] = [r.value for r in records]
    elif records and all(isinstance(r.value, dict) or r.value is None for r in records):
        fields = dict.fromkeys(f for r in records if r.value for f in r.value)
        for name in fields:
            values = [None if r.value is None else r.value.get(name) for r in records]
            present = [v for v in values if v is not None]
            if present and all(_is_number(v) for v in present):
                series[str(name)] = values
    if column is not None:
        if column not in series:
            have = ", ".join(series) if series else "none"
            raise ValueError(f"plot column {column!r} is not a numeric column (numeric: {have})")
        series = {column: series[column]}
    return series


def history_plot(result: Any, *, column: str | None = None, **kwargs: Any) -> Any:
    """A step plot of the key's numeric value over time: each value drawn from its
    ``timestamp`` to its ``valid_to`` (a gap where the key had no value), one line per
    numeric column. Returns the matplotlib Axes. ``ValueError`` (one line) when nothing
    numeric is there to draw."""
    records = _records(result.result)
    series = numeric_series(records, column)
    if not series:
        raise ValueError(
            f"store {result.store!r}: nothing numeric to plot in the history of "
            f"{result.query.key!r} ({len(records)} record(s)); r.df() shows the values"
        )
    import matplotlib.pyplot as plt

    ax = kwargs.pop("ax", None)
    if ax is None:
        _, ax = plt.subplots()
    for name, values in series.items():
        times, ys = _steps(records, values)
        ax.step(times, ys, where="post", marker="o", label=name)
    ax.set_title(kwargs.pop("title", f"{result.store}: {result.query.key!r} over time"))
    ax.set_xlabel(kwargs.pop("xlabel", "time (UTC)"))
    ax.set_ylabel(kwargs.pop("ylabel", next(iter(series)) if len(series) == 1 else "value"))
    if len(series) > 1:
        ax.legend()
    if kwargs:
        ax.set(**kwargs)
    return ax


def _steps(
    records: list[VersionedRecord[Any]], values: list[Any]
) -> tuple[list[datetime], list[float]]:
    """The corners of the step line: each record from its timestamp, then a break
    (NaN) at its ``valid_to`` when no record starts there (the key was deleted)."""
    times: list[datetime] = []
    ys: list[float] = []
    for i, (record, value) in enumerate(zip(records, values, strict=True)):
        times.append(_moment(record.timestamp))
        ys.append(float("nan") if value is None else float(value))
        following = records[i + 1].timestamp if i + 1 < len(records) else None
        if record.valid_to is not None and record.valid_to != following:
            times.append(_moment(record.valid_to))
            ys.append(float("nan"))
    return times, ys


def _moment(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=UTC)
