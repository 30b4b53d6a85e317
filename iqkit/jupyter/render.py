"""How iqkit's tables look: HTML for Jupyter, plain text for terminals and logs.

The pieces every view is made of: escaped HTML tables of Arrow tables and DataFrames,
cells, inline bar charts, aligned text tables and the stable-timings rule. A result's
own view (``result.py``'s ``result_html`` and ``result_text``), the panel and ``%iq
watch`` are put together from them; this module knows no result.

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
from typing import Any

import pandas as pd
import pyarrow as pa

__all__ = [
    "COMMIT_TIME_COLUMNS",
    "STABLE_TIMINGS_ENV",
    "TIME_PLACEHOLDER",
    "bar_cell",
    "clip",
    "duration_text",
    "frame_html",
    "shown_time",
    "stable_timings",
    "table_html",
    "table_style",
    "text_table",
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


_NULL_CELL = '<td class="null">null</td>'

#: Set (to anything but "" or "0") to show wall-clock figures as :data:`TIME_PLACEHOLDER`.
STABLE_TIMINGS_ENV = "IQKIT_STABLE_TIMINGS"
#: What a wall-clock figure shows when :func:`stable_timings` is on.
TIME_PLACEHOLDER = "‹time›"
#: The columns of iqkit's frames that hold wall-clock measurements.
TIMING_COLUMNS = ("elapsed_ms", "nanoseconds")
#: The columns of a version result's rows that hold commit times (wall clock too).
COMMIT_TIME_COLUMNS = ("timestamp", "valid_to")
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
def bar_cell(value: Any, largest: int, color: str, unknown: str = "unknown") -> str:
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


def duration_text(ns: float) -> str:
    """A duration in nanoseconds as people read it (``0.042 ms``, ``12.5 ms``, ``1.20 s``)."""
    ms = ns / 1e6
    if ms < 1:
        return f"{ms:.3f} ms"
    if ms < 1000:
        return f"{ms:.1f} ms"
    return f"{ms / 1000:.2f} s"


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
