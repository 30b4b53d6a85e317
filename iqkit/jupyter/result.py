"""What a ``%iq`` query returns: :class:`IQResult`, and the frames of ``%iq lag`` and
``%iq stores``.

An ``IQResult`` keeps the request, the engine's ``StateQueryResult`` and the collected
rows (Arrow), and derives pandas DataFrames from them on first use (then caches them):
``.rows``, ``.partitions``, ``.trace``, ``.lag``. Display truncates, the data never
does: ``.rows`` always holds every row that was read.

How a result looks is here too (``result_html`` for Jupyter, ``result_text`` for
terminals and logs: what ``_repr_html_`` and ``str`` show, and what ``%iq watch`` and the
panel show of it), put together from ``render.py``'s escaped tables, cells and bars: a
result's view needs the result, and the result needs its view.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from html import escape
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa

from ..engine import served_version
from ..errors import IqkitError
from ..query import (
    LagInfo,
    MultiVersionedKeyQuery,
    Position,
    QueryResult,
    RangeQuery,
    StateQueryRequest,
    StateQueryResult,
    VersionedKeyQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from ..query.lag import NO_SOURCE
from ..store.encoding.ordered import short_repr
from ..store.encoding.partitioners import Partitioner, get_partitioner
from ..store.encoding.serdes import get_serde
from ..store.inputs import binds, offset_lag, records_behind
from ..store.manifest import StoreManifest
from ..tables import Collected, to_pandas
from . import render
from .history import VERSION_QUERIES, history_plot

__all__ = [
    "STORE_PROBLEMS",
    "IQResult",
    "LagFrame",
    "TimingFrame",
    "compact_position",
    "lag_frame",
    "lag_html",
    "parse_trace_line",
    "problem",
    "result_html",
    "result_text",
    "truncation_note",
]

PARTITION_COLUMNS = [
    "partition",
    "status",
    "failure_reason",
    "message",
    "rows",
    "position",
    "elapsed_ms",
]
TRACE_COLUMNS = ["partition", "step", "layer", "detail", "nanoseconds"]
LAG_COLUMNS = ["store", "partition", "topic", "input_partition", "current", "end", "lag"]
#: ``%iq lag`` and ``%iq stores`` add this column when some store cannot be read: why
#: (null on the healthy stores' rows). A root whose stores are all fine shows no such column.
ERROR_COLUMN = "error"

#: What reading one store can raise when that store is broken (a corrupt or missing
#: manifest or version record, a folder-format store to convert): ``%iq stores`` and
#: ``%iq lag`` report it on that store's row and go on with the others.
STORE_PROBLEMS = (IqkitError, OSError, ValueError, LookupError)

_TRACE_LINE = re.compile(r"Handled in (?P<layer>\S+) in (?P<ns>\d+)ns(?::\s?(?P<detail>.*))?", re.S)

LagSource = Mapping[int, LagInfo] | Callable[[], Mapping[int, LagInfo]] | None


def compact_position(position: Position | None) -> str:
    """``orders[0]=17,orders[1]=5``: a position on one line, topics and partitions
    sorted (empty string for an empty position)."""
    if position is None:
        return ""
    m = position.to_map()
    return ",".join(f"{t}[{p}]={o}" for t in sorted(m) for p, o in sorted(m[t].items()))


def problem(exc: BaseException) -> str:
    """An exception as one short line: ``TypeName: first line of the message``."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def parse_trace_line(line: str) -> tuple[str | None, str, int | None]:
    """``(layer, detail, nanoseconds)`` of one execution-info line; a line not in the
    ``"Handled in <layer> in <N>ns: <detail>"`` shape is all detail."""
    m = _TRACE_LINE.fullmatch(line)
    if m is None:
        return None, line, None
    return m["layer"], m["detail"] or "", int(m["ns"])


def _engine_ns(qr: QueryResult[Any]) -> int | None:
    """The partition's engine time: its ``StateEngine`` trace line(s), if any."""
    total = None
    for line in qr.execution_info:
        layer, _, ns = parse_trace_line(line)
        if layer == "StateEngine" and ns is not None:
            total = (total or 0) + ns
    return total


class IQResult:
    """The result of one ``%iq`` query: rows, per-partition status, trace and lag.

    ``x = %iq range orders --lo a --hi c`` then ``x.rows`` (DataFrame), ``x.arrow()``,
    ``x.partitions``, ``x.trace``, ``x.lag``, ``x.failures``, ``x.to_duckdb(con, name)``.
    ``lags`` may be a mapping partition → ``LagInfo`` or a function returning one
    (called on first use, so a query never waits for lag nobody looks at).
    """

    def __init__(
        self,
        request: StateQueryRequest[Any],
        result: StateQueryResult[Any],
        manifest: StoreManifest,
        collected: Collected,
        *,
        engine_ns: int,
        lags: LagSource = None,
        line: str | None = None,
        display_limit: int = 10,
        show_trace: bool = False,
        version: int | None = None,
    ) -> None:
        if not isinstance(collected, Collected):
            raise TypeError(f"collected must be a tables.Collected, got {type(collected).__name__}")
        self.request = request
        self.result = result
        self.manifest = manifest
        self.collected = collected
        self.engine_ns = int(engine_ns)
        self.line = line
        self.display_limit = display_limit
        self.show_trace = show_trace
        self._version = version
        self._lag_source = lags
        self._lag_infos: dict[int, LagInfo] | None = None
        self._lag_resolved = lags is None
        self._cache: dict[str, pd.DataFrame] = {}

    # -- what was asked ------------------------------------------------------------------
    @property
    def store(self) -> str:
        return self.request.store_name

    @property
    def query(self) -> Any:
        return self.request.query

    @property
    def query_type(self) -> str:
        return type(self.request.query).__name__

    @property
    def version(self) -> int | None:
        """The store version served, when known (given, or named by the trace)."""
        if self._version is not None:
            return self._version
        return served_version(self.result)

    # -- rows ----------------------------------------------------------------------------
    def arrow(self) -> pa.Table:
        """The rows as a pyarrow Table (no copy)."""
        return self.collected.table

    @property
    def rows(self) -> pd.DataFrame:
        """The rows as a DataFrame: ints stay ints even with nulls (``Int64``)."""
        if "rows" not in self._cache:
            self._cache["rows"] = to_pandas(self.collected.table)
        return self._cache["rows"]

    def df(self) -> pd.DataFrame:
        """The rows as a DataFrame (``.rows``)."""
        return self.rows

    def __len__(self) -> int:
        return self.collected.table.num_rows

    @property
    def truncated(self) -> bool:
        """True when the fetch limit stopped reading with rows left."""
        return self.collected.truncated

    @property
    def notes(self) -> list[str]:
        """One-line explanations of a result that could surprise: an empty range whose
        bounds are the wrong way round (IQv2 answers it with an empty success, which
        stays the rule; this only says why, and what to type instead)."""
        note = _reversed_bounds_note(self.query, self.manifest) if len(self) == 0 else None
        return [note] if note else []

    @property
    def position(self) -> Position:
        """The merged position of every partition that answered (or failed)."""
        return self.result.position

    @property
    def failures(self) -> dict[int, QueryResult[Any]]:
        """Partition → failed ``QueryResult``."""
        return {p: r for p, r in self.result.partition_results.items() if r.is_failure}

    @property
    def ok_partitions(self) -> int:
        return sum(1 for r in self.result.partition_results.values() if r.is_success)

    @property
    def elapsed_ns(self) -> int:
        """Engine time plus the time spent reading rows."""
        return self.engine_ns + sum(self.collected.read_ns.values())

    # -- per partition -------------------------------------------------------------------
    @property
    def partitions(self) -> pd.DataFrame:
        """One row per partition the query ran on: status, failure, rows, position and
        elapsed time (engine time from the trace when execution info was on, plus the
        time spent reading its rows; NA when neither was measured)."""
        if "partitions" not in self._cache:
            records = []
            read_ns = self.collected.read_ns
            for p, qr in self.result.partition_results.items():
                engine_ns = _engine_ns(qr)
                reading = read_ns.get(p)
                measured = engine_ns is not None or bool(reading)
                records.append(
                    {
                        "partition": p,
                        "status": "success" if qr.is_success else "failed",
                        "failure_reason": None if qr.is_success else qr.failure_reason.name,
                        "message": None if qr.is_success else qr.failure_message,
                        "rows": self.collected.rows_per_partition.get(p),
                        "position": compact_position(qr.position),
                        "elapsed_ms": ((engine_ns or 0) + (reading or 0)) / 1e6
                        if measured
                        else None,
                    }
                )
            frame = pd.DataFrame.from_records(records, columns=PARTITION_COLUMNS)
            self._cache["partitions"] = TimingFrame(
                frame.astype({"partition": "Int64", "rows": "Int64", "elapsed_ms": "Float64"})
            )
        return self._cache["partitions"]

    @property
    def trace(self) -> pd.DataFrame:
        """Every partition's execution-info lines, parsed: partition, step (0..n, the
        order the layers reported, innermost first), layer, detail, nanoseconds."""
        if "trace" not in self._cache:
            records = []
            for p, qr in self.result.partition_results.items():
                for step, line in enumerate(qr.execution_info):
                    layer, detail, ns = parse_trace_line(line)
                    records.append((p, step, layer, detail, ns))
            frame = pd.DataFrame.from_records(records, columns=TRACE_COLUMNS)
            self._cache["trace"] = TimingFrame(
                frame.astype({"partition": "Int64", "step": "Int64", "nanoseconds": "Int64"})
            )
        return self._cache["trace"]

    @property
    def lag_infos(self) -> dict[int, LagInfo] | None:
        """Partition → ``LagInfo`` for the partitions this query ran on (``None`` when
        no lag was given): a key lookup's lag is its owner's, not the whole store's."""
        if not self._lag_resolved:
            source = self._lag_source
            infos = source() if callable(source) else source
            touched = self.result.partition_results
            self._lag_infos = (
                None if infos is None else {p: infos[p] for p in sorted(infos) if p in touched}
            )
            self._lag_resolved = True
        return self._lag_infos

    @property
    def has_source(self) -> bool | None:
        """Whether the store's source end offsets are known (``None``: no lag given)."""
        infos = self.lag_infos
        if infos is None:
            return None
        return any(i.end_position is not None for i in infos.values())

    @property
    def lag(self) -> pd.DataFrame:
        """One row per input component of each partition the query ran on (see
        :func:`lag_frame`); empty when the store has no source recorded."""
        if "lag" not in self._cache:
            infos = self.lag_infos
            self._cache["lag"] = lag_frame(
                {} if infos is None else {self.store: infos}, manifests={self.store: self.manifest}
            )
        return self._cache["lag"]

    # -- elsewhere -----------------------------------------------------------------------
    def to_duckdb(self, con: Any, name: str) -> Any:
        """Register the rows in DuckDB connection ``con`` as view ``name`` (zero-copy,
        through Arrow); returns the relation ``con.table(name)``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        con.register(name, self.collected.table)
        return con.table(name)

    def plot(self, what: str | None = None, *, column: str | None = None, **kwargs: Any) -> Any:
        """A chart with matplotlib (imported on first use); returns the Axes.

        A ``history`` (or ``get --as-of``) result draws the key's numeric value over
        time by default (``what="history"``: a step per value, one line per numeric
        column of a record, or only ``column``). Any result draws a bar per partition
        of ``"rows"`` read (the default otherwise) or ``"lag"``."""
        versioned = isinstance(self.query, MultiVersionedKeyQuery | VersionedKeyQuery)
        if what is None:
            what = "history" if versioned else "rows"
        if what == "history" and versioned:
            return history_plot(self, column=column, **kwargs)
        if what not in ("rows", "lag"):
            kinds = "'history', 'rows' or 'lag'" if versioned else "'rows' or 'lag'"
            raise ValueError(f"plot what must be {kinds}, got {what!r}")
        if column is not None:
            raise ValueError("plot column= picks a line of a history plot: plot('history', ...)")
        if what == "rows":
            data = self.partitions.set_index("partition")["rows"].fillna(0).astype("int64")
        else:
            lag = self.lag.dropna(subset=["lag"])
            data = lag.groupby("partition")["lag"].sum().astype("int64")
        kwargs.setdefault("title", f"{self.store}: {what} per partition")
        kwargs.setdefault("xlabel", "partition")
        kwargs.setdefault("ylabel", what)
        return data.plot.bar(**kwargs)

    # -- display -------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        return result_html(self)

    def __repr__(self) -> str:
        ok = self.ok_partitions
        failed = len(self.result.partition_results) - ok
        return (
            f"IQResult(store={self.store!r}, query={render.clip(repr(self.query), 120)}, "
            f"rows={len(self)}, partitions={ok} ok/{failed} failed, "
            f"truncated={self.truncated})"
        )

    def __str__(self) -> str:
        return result_text(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self) if cycle else str(self))


def _reversed_bounds_note(query: Any, manifest: StoreManifest) -> str | None:
    """Why a range with ``lower > upper`` is empty. The stores compare the serialized
    bounds (``TypedLayer._range``: byte order is key order), so this does too."""
    if isinstance(query, WindowKeyQuery | WindowRangeQuery):
        if query.time_from <= query.time_to:
            return None
        return (
            f"No windows: --from ({query.time_from} ms) is later than --to ({query.time_to} "
            "ms), and a time range runs from the earlier to the later time. For the newest "
            "windows first, swap --from and --to and add --desc."
        )
    if not isinstance(query, RangeQuery) or None in (query.lower_bound, query.upper_bound):
        return None
    serde = get_serde(manifest.key_serde)
    try:
        lower, upper = serde.serialize(query.lower_bound), serde.serialize(query.upper_bound)
    except (TypeError, ValueError):
        return None
    if lower <= upper:
        return None
    lo, hi = short_repr(query.lower_bound), short_repr(query.upper_bound)
    numbers = all(
        isinstance(b, int | float) and not isinstance(b, bool)
        for b in (query.lower_bound, query.upper_bound)
    )
    if numbers and not serde.order_preserving and query.lower_bound <= query.upper_bound:
        return (
            f"No rows: in {serde.name} key order --from {lo} sorts after --to {hi} "
            "(keys sort by their big-endian bytes: negative numbers after positive ones); "
            "query the negative and the positive keys separately, or use the ordered serde."
        )
    return (
        f"No rows: --from {lo} sorts after --to {hi}, and a range runs from its lower "
        f"to its upper key. For keys from {lo} down to {hi}, swap --from and --to and add "
        "--desc."
    )


# -- how a result looks -------------------------------------------------------------------
#: The style of a result's HTML (render.py's tables, inside ``iqkit-result``).
_STYLE = render.table_style("iqkit-result")
_FAILED_ROW = ' style="background:#fdecea"'


def _commit_times(r: IQResult) -> Sequence[str]:
    """The columns of ``r``'s rows shown as :data:`render.TIME_PLACEHOLDER`: a version result's
    commit times (a key-value row's own ``timestamp`` field is data, never hidden)."""
    return render.COMMIT_TIME_COLUMNS if isinstance(r.query, VERSION_QUERIES) else ()


def _shown_rows(r: IQResult, limit: int) -> pa.Table:
    """The first ``limit`` rows (0 = all) of ``r`` as shown: with :func:`render.stable_timings`
    on, a version result's commit times are :data:`render.TIME_PLACEHOLDER` (nulls stay null)."""
    table = r.arrow()
    if limit and table.num_rows > limit:
        table = table.slice(0, limit)
    if not render.stable_timings():
        return table
    for name in _commit_times(r):
        if name in table.column_names:
            shown = [
                None if v is None else render.TIME_PLACEHOLDER for v in table[name].to_pylist()
            ]
            i = table.column_names.index(name)
            table = table.set_column(i, name, pa.array(shown, pa.string()))
    return table


def _summary(r: IQResult) -> str:
    failed = len(r.result.partition_results) - r.ok_partitions
    parts = [
        f"<b>{escape(r.store)}</b>",
        escape(r.query_type),
        f"{len(r):,} row{'s' if len(r) != 1 else ''}",
        f"partitions {r.ok_partitions} ok / "
        + (f'<span style="color:#b00020">{failed} failed</span>' if failed else "0 failed"),
        render.shown_time(render.duration_text(r.elapsed_ns)),
    ]
    if r.version is not None:
        parts.append(f"version {r.version}")
    if r.truncated:
        parts.append(f'<span style="color:#b26a00">truncated at {len(r):,} rows</span>')
    return '<div class="iq-summary">' + " · ".join(parts) + "</div>"


def truncation_note(r: IQResult) -> str:
    """What a result cut off by the fetch limit says (HTML and text alike): how many
    rows were read, that reading stopped there with rows left, how to read more."""
    return (
        f"Reading stopped at the fetch limit after {len(r):,} rows; the store has more. "
        "Read more with --limit N (--limit 0 reads everything), or for every query "
        "%config IQMagics.autolimit = N."
    )


def _rows_section(r: IQResult, highlight: Collection[int]) -> str:
    n = len(r)
    if n == 0:
        notes = "".join(f"<br>{escape(note)}" for note in r.notes)
        return f'<div class="iq-note">No rows.{notes}</div>'
    limit = r.display_limit
    html = render.table_html(_shown_rows(r, limit), 0, highlight)
    notes = []
    if limit and n > limit:
        notes.append(
            f"Showing the first {limit:,} of {n:,} rows. All rows: <code>.rows</code> "
            "(DataFrame) or <code>.arrow()</code> of the result; show more with "
            "<code>%config IQMagics.displaylimit = 0</code> (0 = all)."
        )
    if r.truncated:
        notes.append(escape(truncation_note(r)))
    if notes:
        html += '<div class="iq-note">' + "<br>".join(notes) + "</div>"
    return html


def _lags_or_error(r: IQResult) -> tuple[dict[int, Any] | None, str | None]:
    try:
        return r.lag_infos, None
    except Exception as exc:  # display must not fail because lag could not be read
        return None, f"{type(exc).__name__}: {exc}"


def _partitions_section(r: IQResult, lags: dict[int, Any] | None) -> str:
    frame = r.partitions
    if frame.empty:
        return '<div class="iq-note">The query ran on no partition.</div>'
    rows = frame["rows"]
    largest_rows = int(rows.max()) if rows.notna().any() else 0
    show = pd.DataFrame(
        {
            "partition": frame["partition"],
            "status": frame["status"],
            "rows": rows,
        }
    )
    cells: dict[str, Callable[[Any], str]] = {
        "rows": lambda v: render.bar_cell(v, largest_rows, "#5b8def", unknown="—"),
        "status": lambda v: (
            '<td style="color:#b00020;font-weight:bold">failed</td>'
            if v == "failed"
            else f"<td>{escape(str(v))}</td>"
        ),
    }
    if lags is not None:
        per = [None if (i := lags.get(p)) is None else i.offset_lag for p in frame["partition"]]
        known = [v for v in per if v is not None]
        largest_lag = max(known, default=0)
        show["lag"] = pd.array(per, dtype="Int64")
        cells["lag"] = lambda v: render.bar_cell(v, largest_lag, "#e8a33d")
    show["elapsed"] = [
        None if pd.isna(v) else render.shown_time(f"{v:.3f} ms") for v in frame["elapsed_ms"]
    ]
    show["position"] = frame["position"]
    failures = [
        None if reason is None else f"{reason}: {message}"
        for reason, message in zip(frame["failure_reason"], frame["message"], strict=True)
    ]
    if any(f is not None for f in failures):
        show["failure"] = failures
        cells["failure"] = lambda v: (
            "<td></td>" if v is None else f'<td style="color:#b00020">{escape(v)}</td>'
        )
    attrs = [_FAILED_ROW if s == "failed" else "" for s in frame["status"]]
    return render.frame_html(show, cells=cells, row_attrs=attrs)


def _trace_section(r: IQResult) -> str:
    trace = r.trace
    opened = " open" if r.show_trace else ""
    if trace.empty:
        body = (
            '<div class="iq-note">No execution info: run the query with '
            "<code>--trace</code> to see each layer and its time.</div>"
        )
    else:
        body = render.frame_html(trace)
    return (
        f"<details{opened}><summary>Execution trace ({len(trace)} steps)</summary>{body}</details>"
    )


def lag_html(r: IQResult) -> str:
    """A result's lag table, or, when its store has no source recorded, that in words
    (never a table of nulls). The result view and the panel's Lag tab both show this."""
    if r.has_source is False:
        return (
            f'<div class="iq-note">{escape(NO_SOURCE.capitalize())} for '
            f"{escape(r.store)}: its writer recorded no end offsets of an input (a "
            "batch <code>write_store</code> has no source), so its lag is unknown.</div>"
        )
    return render.frame_html(r.lag)


def _lag_section(r: IQResult, lags: dict[int, Any] | None, error: str | None) -> str:
    if error is not None:
        body = f'<div class="iq-note">Lag unavailable: {escape(error)}</div>'
        title = "Lag (unavailable)"
    elif not lags:  # not given, or the query ran on no partition that has a lag
        return ""
    elif not r.has_source:
        body = lag_html(r)
        title = f"Lag ({NO_SOURCE})"
    else:
        body = lag_html(r)
        known = [i.offset_lag for i in lags.values()]
        total = "unknown" if any(v is None for v in known) else f"{sum(known):,} records behind"
        title = f"Lag ({total})"
    return f"<details><summary>{escape(title)}</summary>{body}</details>"


def result_html(r: IQResult, highlight: Collection[int] = ()) -> str:
    """The notebook view of a result: summary, rows, partitions, trace, lag, line; the
    rows numbered in ``highlight`` marked as changed (``%iq watch``)."""
    lags, error = _lags_or_error(r)
    parts = [
        '<div class="iqkit-result">',
        _STYLE,
        _summary(r),
        _rows_section(r, highlight),
        _partitions_section(r, lags),
        _trace_section(r),
        _lag_section(r, lags, error),
    ]
    if r.line:
        parts.append(f'<div class="iq-note">Equivalent: <code>{escape(r.line)}</code></div>')
    parts.append("</div>")
    return "".join(parts)


def result_text(r: IQResult, highlight: Collection[int] = ()) -> str:
    """``repr`` plus the first ``display_limit`` rows and any failure, as plain text
    (no timings: the same data always prints the same); the rows numbered in
    ``highlight`` start with ``*``."""
    lines = [repr(r)]
    n = len(r)
    limit = r.display_limit
    if n:
        shown = r.rows if not limit else r.rows.head(limit)
        table = render.text_table(render.with_stable_timings(shown, _commit_times(r)))
        if highlight:
            marks = ["  "] + ["* " if i in highlight else "  " for i in range(len(shown))]
            table = [mark + line for mark, line in zip(marks, table, strict=True)]
        lines += table
        if len(shown) < n:
            where = " in .rows" if r.truncated else " (.rows has them all)"
            lines.append(f"… {n - len(shown):,} more rows{where}")
    if r.truncated:
        lines.append(truncation_note(r))
    lines += r.notes
    for p, qr in r.failures.items():
        lines.append(f"partition {p} failed: {qr.failure_reason.name}: {qr.failure_message}")
    return "\n".join(lines)


class TimingFrame(pd.DataFrame):
    """A frame with wall-clock columns (``.partitions``' ``elapsed_ms``, ``.trace``'s
    ``nanoseconds``): a plain DataFrame whose display shows them as a placeholder when
    ``IQKIT_STABLE_TIMINGS`` asks (:func:`render.with_stable_timings`); its data keeps
    the measured numbers. A subclass only for display, like :class:`LagFrame`."""

    @property
    def _constructor(self) -> type[TimingFrame]:
        return TimingFrame

    def _shown(self) -> pd.DataFrame:
        return render.with_stable_timings(pd.DataFrame(self))

    def __repr__(self) -> str:
        return repr(self._shown())

    def _repr_html_(self) -> str | None:
        return self._shown()._repr_html_()


# -- %iq lag -------------------------------------------------------------------------------
def nullable(value: int | None) -> Any:
    return pd.NA if value is None else value


def _partitioner_of(
    store: str, infos: Mapping[int, LagInfo], manifests: Mapping[str, StoreManifest] | None
) -> Partitioner:
    """The store's partitioner, which says which end components feed which partition.

    From the manifest when given; otherwise the one whose lag rule reproduces the
    engine's own sums (``murmur2`` counts every end component, ``explicit`` only input
    partition == store partition; when both agree everywhere, either gives the same
    table)."""
    if manifests is not None and store in manifests:
        return get_partitioner(manifests[store].partitioner)
    murmur2 = get_partitioner("murmur2")
    for p, info in infos.items():
        if info.offset_lag is None or info.end_position is None:
            continue
        if offset_lag(info.current_position, info.end_position, p, murmur2) != info.offset_lag:
            return get_partitioner("explicit")
    return murmur2


class LagFrame(pd.DataFrame):
    """A lag table (:func:`lag_frame`): a plain DataFrame that also says, in words,
    which stores have no source recorded (``.no_source``) instead of listing their
    partitions as rows of ``<NA>``: their end offsets were never recorded (a batch
    ``write_store`` has no source), so their lag is unknown.

    A subclass only for display: pandas keeps ``no_source`` through slicing (its
    ``_metadata`` mechanism), and everything else is a DataFrame's.
    """

    _metadata: ClassVar[list[str]] = ["no_source"]
    no_source: tuple[str, ...] = ()

    @property
    def _constructor(self) -> type[LagFrame]:
        return LagFrame

    def note(self) -> str:
        """``"clicks, counts: no source recorded (lag unknown)"``, or ``""``."""
        if not self.no_source:
            return ""
        return f"{', '.join(self.no_source)}: {NO_SOURCE} (lag unknown)"

    def __repr__(self) -> str:
        note = self.note()
        if not note:
            return super().__repr__()
        return note if self.empty else f"{super().__repr__()}\n{note}"

    def _repr_html_(self) -> str | None:
        table = super()._repr_html_()
        note = self.note()
        if not note:
            return table
        note_html = f"<p class='iqkit-note'>{escape(note)}</p>"
        return note_html if self.empty or table is None else table + note_html


def lag_frame(
    lags: Mapping[str, Mapping[int, LagInfo]],
    *,
    manifests: Mapping[str, StoreManifest] | None = None,
    errors: Mapping[str, str] | None = None,
) -> LagFrame:
    """``engine.lags()`` as a DataFrame: one row per (store, partition, input topic,
    input partition) — the components the partition has applied and the end offsets
    that bind it — with ``current`` (last offset applied, NA when none), ``end``
    (log-end offset) and ``lag`` (``max(0, end - current - 1)``, as ``LagInfo``).

    Unknown is never 0. A store whose end offsets are unknown (no source recorded) has
    no rows: it is named in the frame's ``no_source`` and its display says so in words.
    A component whose end is unknown has ``end`` and ``lag`` NA. A partition with no
    component at all still gets one row (topic NA, ``lag`` its ``offset_lag``).
    ``manifests`` (store → manifest) says which end components bind an ``explicit``
    store's partitions; without it this is inferred from ``offset_lag``.

    ``errors`` (store → one line) adds an ``error`` column: each store in it gets one
    row with nothing but its name and why its lag could not be read (``%iq lag``).
    """
    records: list[tuple[Any, ...]] = []
    no_source = []
    for store, infos in lags.items():
        if all(info.end_position is None for info in infos.values()):
            no_source.append(store)
            continue
        partitioner = _partitioner_of(store, infos, manifests)
        for p, info in sorted(infos.items()):
            current, end = info.current_position, info.end_position
            components: dict[tuple[str, int], None] = {}
            if end is not None:
                for topic in sorted(end.topics):
                    for in_p in sorted(end.partition_positions(topic)):
                        if binds(partitioner, in_p, p):
                            components[(topic, in_p)] = None
            for topic in sorted(current.topics):
                for in_p in sorted(current.partition_positions(topic)):
                    components.setdefault((topic, in_p), None)
            if not components:
                records.append((store, p, None, pd.NA, pd.NA, pd.NA, nullable(info.offset_lag)))
                continue
            for topic, in_p in sorted(components):
                have = current.offset(topic, in_p)
                end_offset = None if end is None else end.offset(topic, in_p)
                lag = (
                    records_behind(end_offset, have)
                    if end_offset is not None and binds(partitioner, in_p, p)
                    else None
                )
                records.append(
                    (store, p, topic, in_p, nullable(have), nullable(end_offset), nullable(lag))
                )
    columns = list(LAG_COLUMNS)
    if errors:
        columns.append(ERROR_COLUMN)
        records = [(*r, None) for r in records]
        records += [
            (store, *[pd.NA] * (len(LAG_COLUMNS) - 1), why) for store, why in errors.items()
        ]
        records.sort(key=lambda r: r[0])  # stores in name order, broken ones in place
    frame = LagFrame(pd.DataFrame.from_records(records, columns=columns)).astype(
        {
            "store": "object",
            "partition": "Int64",
            "topic": "object",
            "input_partition": "Int64",
            "current": "Int64",
            "end": "Int64",
            "lag": "Int64",
        }
    )
    frame.no_source = tuple(no_source)
    return frame
