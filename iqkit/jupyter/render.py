"""How an ``IQResult`` looks: HTML for Jupyter, plain text for terminals and logs.

Every table is written here with ``html.escape`` rather than ``DataFrame.to_html``:
that is several times slower (see ``bench/bench_render.py``) and escapes nothing inside
structured values the way we need. Everything that comes from the data or the user —
keys, values, field names, store names, messages, trace details, the ``%iq`` line — is
escaped: keys can contain ``<script>``. Charts are plain HTML boxes with inline styles:
no JavaScript, no matplotlib, nothing a notebook viewer would strip.

The HTML carries timings (it is for people); the text form (``repr``/``str``) does not,
so nbval can compare it between runs. With ``IQKIT_STABLE_TIMINGS=1`` in the
environment every wall-clock figure iqkit shows (a result's time, the partitions'
``elapsed``, the trace's ``nanoseconds``, and the commit times of a version result:
``history`` and ``get --as-of``'s ``timestamp`` and ``valid_to``) is
:data:`TIME_PLACEHOLDER` instead: that is how the stored outputs of ``notebooks/`` stay
comparable. :func:`shown_time` and :func:`with_stable_timings` are the one place that
rule lives; the data (``.trace``, ``.partitions``, ``execution_info``, a result's
``.rows`` and ``.arrow()``) always keeps the measured numbers and the real times.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Sequence
from datetime import date, datetime
from html import escape
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from ..query.lag import NO_SOURCE
from .history import VERSION_QUERIES

if TYPE_CHECKING:
    from .result import IQResult

__all__ = [
    "STABLE_TIMINGS_ENV",
    "TIME_PLACEHOLDER",
    "clip",
    "frame_html",
    "lag_html",
    "result_html",
    "result_text",
    "shown_time",
    "stable_timings",
    "table_html",
    "text_table",
    "truncation_note",
    "with_stable_timings",
]

#: Characters of one cell shown before it is cut with "…" (the data keeps them all).
CELL_CHARS = 200
#: Width in pixels of the longest bar of an inline chart.
BAR_PX = 80

_TABLE_CSS = """<style>
.SCOPE table{border-collapse:collapse;font-size:12px;margin:4px 0}
.SCOPE th,.SCOPE td{border:1px solid #ddd;padding:2px 6px;text-align:left;
vertical-align:top;white-space:pre-wrap}
.SCOPE th{background:#f4f4f4}
.SCOPE td.n{text-align:right;font-variant-numeric:tabular-nums}
.SCOPE td.null{color:#999;font-style:italic}
.SCOPE .iq-note{color:#555;font-size:12px}
.SCOPE summary{cursor:pointer;font-size:12px;color:#333}
</style>"""


def table_style(scope: str) -> str:
    """The ``<style>`` of iqkit's HTML tables inside elements of class ``scope``: results
    (``iqkit-result``) and the panel (``iqkit-panel``) look alike because both use it."""
    return _TABLE_CSS.replace("SCOPE", scope)


_STYLE = table_style("iqkit-result")

_NULL_CELL = '<td class="null">null</td>'

#: Set (to anything but "" or "0") to show wall-clock figures as :data:`TIME_PLACEHOLDER`.
STABLE_TIMINGS_ENV = "IQKIT_STABLE_TIMINGS"
#: What a wall-clock figure shows when :func:`stable_timings` is on.
TIME_PLACEHOLDER = "‹time›"
#: The columns of iqkit's frames that hold wall-clock measurements.
TIMING_COLUMNS = ("elapsed_ms", "nanoseconds")
#: The columns of a version result's rows that hold commit times (wall clock too).
COMMIT_TIME_COLUMNS = ("timestamp", "valid_to")
_FAILED_ROW = ' style="background:#fdecea"'
#: A row whose key changed since the previous refresh of ``%iq watch``.
CHANGED_ROW = ' class="iq-changed" style="background:#fff3c4"'


def clip(text: str, limit: int = CELL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in "…" when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- wall-clock figures --------------------------------------------------------------------
def stable_timings() -> bool:
    """Whether ``$IQKIT_STABLE_TIMINGS`` asks for wall-clock figures as a placeholder.

    For documentation whose stored outputs are compared between runs (the notebooks
    under nbval, ``make notebooks``): the same query never takes the same nanoseconds
    twice. Read at display time, so it needs no plumbing and applies everywhere iqkit
    shows a time (results, ``%iq trace``, the panel); it also keeps the read progress
    bar, which appears only when reading takes half a second, from showing."""
    return os.environ.get(STABLE_TIMINGS_ENV, "") not in ("", "0")


def shown_time(text: str) -> str:
    """``text`` (a formatted duration) as shown: :data:`TIME_PLACEHOLDER` when
    :func:`stable_timings` is on."""
    return TIME_PLACEHOLDER if stable_timings() else text


def with_stable_timings(
    frame: pd.DataFrame, timing_columns: Sequence[str] = TIMING_COLUMNS
) -> pd.DataFrame:
    """``frame`` as shown: with :func:`stable_timings` on, a copy whose measured values
    in ``timing_columns`` are :data:`TIME_PLACEHOLDER` (nulls stay null)."""
    columns = [c for c in timing_columns if c in frame.columns]
    if not columns or not stable_timings():
        return frame
    shown = pd.DataFrame(frame).copy()
    for name in columns:
        shown[name] = [None if _is_null(v) else TIME_PLACEHOLDER for v in shown[name]]
    return shown


def _commit_times(r: IQResult) -> Sequence[str]:
    """The columns of ``r``'s rows shown as :data:`TIME_PLACEHOLDER`: a version result's
    commit times (a key-value row's own ``timestamp`` field is data, never hidden)."""
    return COMMIT_TIME_COLUMNS if isinstance(r.query, VERSION_QUERIES) else ()


def _shown_rows(r: IQResult, limit: int) -> pa.Table:
    """The first ``limit`` rows (0 = all) of ``r`` as shown: with :func:`stable_timings`
    on, a version result's commit times are :data:`TIME_PLACEHOLDER` (nulls stay null)."""
    table = r.arrow()
    if limit and table.num_rows > limit:
        table = table.slice(0, limit)
    if not stable_timings():
        return table
    for name in _commit_times(r):
        if name in table.column_names:
            shown = [None if v is None else TIME_PLACEHOLDER for v in table[name].to_pylist()]
            i = table.column_names.index(name)
            table = table.set_column(i, name, pa.array(shown, pa.string()))
    return table


# -- cells ---------------------------------------------------------------------------------
def _plain(value: Any) -> str:
    """One value as text (not escaped): what a cell shows."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):  # bool too
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return repr(bytes(value))
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=_plain)
    return str(value)


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and value != value  # NaN


def _cell(value: Any, numeric: bool) -> str:
    if _is_null(value):
        return _NULL_CELL
    text = escape(clip(_plain(value)))
    return f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>"


def _column_cells(values: list[Any], kind: str) -> list[str]:
    """The ``<td>``s of one column; ``kind``: "int", "float", "str" or "any".
    Type-specific loops because this is the hot path of a 10,000-row render."""
    null = _NULL_CELL
    if kind == "int":
        return [null if v is None else f'<td class="n">{v}</td>' for v in values]
    if kind == "str":
        return [
            null if v is None else f"<td>{escape(v if len(v) <= CELL_CHARS else clip(v))}</td>"
            for v in values
        ]
    if kind == "float":
        return [_cell(v, True) for v in values]
    return [_cell(v, False) for v in values]


def _arrow_kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    return "any"


def _rows_html(header: Sequence[str], columns: list[list[str]], attrs: list[str] | None) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    if attrs is None:
        body = "".join(["<tr>" + "".join(cells) + "</tr>" for cells in zip(*columns, strict=True)])
    else:
        body = "".join(
            [
                f"<tr{a}>" + "".join(cells) + "</tr>"
                for a, cells in zip(attrs, zip(*columns, strict=True), strict=True)
            ]
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def table_html(table: pa.Table, limit: int = 0, highlight: Collection[int] = ()) -> str:
    """The first ``limit`` rows (0 = all) of an Arrow table as an HTML table; the rows
    numbered in ``highlight`` are marked (:data:`CHANGED_ROW`)."""
    if limit and table.num_rows > limit:
        table = table.slice(0, limit)
    columns = [
        _column_cells(table.column(i).to_pylist(), _arrow_kind(f.type))
        for i, f in enumerate(table.schema)
    ]
    attrs = None
    if highlight:
        attrs = [CHANGED_ROW if i in highlight else "" for i in range(table.num_rows)]
    return _rows_html(table.schema.names, columns, attrs)


def frame_html(
    frame: pd.DataFrame,
    *,
    cells: dict[str, Callable[[Any], str]] | None = None,
    row_attrs: list[str] | None = None,
) -> str:
    """A DataFrame as an HTML table (index left out); ``cells`` overrides how a column's
    cells are written (must return a full, escaped ``<td>``)."""
    cells = cells or {}
    frame = with_stable_timings(frame)
    columns = []
    for name in frame.columns:
        values = frame[name].tolist()
        if name in cells:
            columns.append([cells[name](v) for v in values])
        else:
            numeric = pd.api.types.is_numeric_dtype(frame[name].dtype) and not (
                pd.api.types.is_bool_dtype(frame[name].dtype)
            )
            columns.append([_cell(v, numeric) for v in values])
    return _rows_html([str(c) for c in frame.columns], columns, row_attrs)


# -- small charts --------------------------------------------------------------------------
def _bar_cell(value: Any, largest: int, color: str, unknown: str = "unknown") -> str:
    """A number with a bar proportional to it (pure HTML)."""
    if _is_null(value):
        return f'<td class="null">{escape(unknown)}</td>'
    value = int(value)
    width = 0 if largest <= 0 else max(1 if value else 0, round(BAR_PX * value / largest))
    bar = (
        f'<span style="display:inline-block;width:{width}px;height:0.75em;'
        f'background:{color};vertical-align:middle;margin-right:4px"></span>'
    )
    return f'<td class="n" style="white-space:nowrap">{bar}{value:,}</td>'


def _ms(ns: float) -> str:
    ms = ns / 1e6
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 1000:
        return f"{ms:.1f} ms"
    return f"{ms / 1000:.2f} s"


# -- the result --------------------------------------------------------------------------
def _summary(r: IQResult) -> str:
    failed = len(r.result.partition_results) - r.ok_partitions
    parts = [
        f"<b>{escape(r.store)}</b>",
        escape(r.query_type),
        f"{len(r):,} row{'s' if len(r) != 1 else ''}",
        f"partitions {r.ok_partitions} ok / "
        + (f'<span style="color:#b00020">{failed} failed</span>' if failed else "0 failed"),
        shown_time(_ms(r.elapsed_ns)),
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
    html = table_html(_shown_rows(r, limit), 0, highlight)
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
        "rows": lambda v: _bar_cell(v, largest_rows, "#5b8def", unknown="—"),
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
        cells["lag"] = lambda v: _bar_cell(v, largest_lag, "#e8a33d")
    show["elapsed"] = [
        None if pd.isna(v) else shown_time(f"{v:.3f} ms") for v in frame["elapsed_ms"]
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
    return frame_html(show, cells=cells, row_attrs=attrs)


def _trace_section(r: IQResult) -> str:
    trace = r.trace
    opened = " open" if r.show_trace else ""
    if trace.empty:
        body = (
            '<div class="iq-note">No execution info: run the query with '
            "<code>--trace</code> to see each layer and its time.</div>"
        )
    else:
        body = frame_html(trace)
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
    return frame_html(r.lag)


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


# -- text ----------------------------------------------------------------------------------
def text_table(frame: pd.DataFrame, width: int = 40) -> list[str]:
    """A DataFrame as aligned text lines (cells clipped to ``width``; nulls as ``null``):
    the terminal's view of what the notebook shows as HTML (results, the demo's tour)."""
    header = [str(c) for c in frame.columns]
    columns = [
        # tolist(): Python scalars; iterating a nullable column yields numpy ones
        [
            clip("null" if _is_null(v) else _plain(v), width).replace("\n", " ")
            for v in frame[c].tolist()
        ]
        for c in frame.columns
    ]
    widths = [max([len(h), *map(len, col)]) for h, col in zip(header, columns, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for cells in zip(*columns, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return lines


def result_text(r: IQResult, highlight: Collection[int] = ()) -> str:
    """``repr`` plus the first ``display_limit`` rows and any failure, as plain text
    (no timings: the same data always prints the same); the rows numbered in
    ``highlight`` start with ``*``."""
    lines = [repr(r)]
    n = len(r)
    limit = r.display_limit
    if n:
        shown = r.rows if not limit else r.rows.head(limit)
        table = text_table(with_stable_timings(shown, _commit_times(r)))
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
