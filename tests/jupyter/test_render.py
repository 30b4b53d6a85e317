"""How an IQResult renders: HTML (escaped, truncated, with partitions, bars, trace and
lag) and plain text. The HTML is parsed back with the standard library's parser."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pyarrow as pa
import pytest
from helpers import break_partition, iq_result, request, write_store
from IPython.lib.pretty import pretty

import iqkit
from iqkit import RangeQuery, StateQueryRequest
from iqkit.jupyter import render, result
from iqkit.jupyter.result import IQResult

EVIL = "<script>alert(1)</script>"


class Page(HTMLParser):
    """Tables (rows of cell texts, with each row's and cell's attributes), tags seen,
    ``<details>`` sections and the visible text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.tables: list[list[dict]] = []
        self.details: list[dict] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._row: dict | None = None
        self._stack: list[list[dict]] = []
        self._summary: list[str] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "table":
            self._stack.append([])
        elif tag == "tr":
            self._row = {"attrs": attrs, "cells": [], "cell_attrs": []}
        elif tag in ("td", "th"):
            self._cell = []
            self._row["cell_attrs"].append(attrs)
        elif tag == "details":
            self.details.append({"open": "open" in attrs, "summary": ""})
        elif tag == "summary":
            self._summary = []
        elif tag == "span" and self._row is not None:
            self._row.setdefault("bars", []).append(attrs.get("style", ""))

    def handle_endtag(self, tag):
        if tag == "table":
            self.tables.append(self._stack.pop())
        elif tag == "tr":
            self._stack[-1].append(self._row)
            self._row = None
        elif tag in ("td", "th"):
            self._row["cells"].append("".join(self._cell))
            self._cell = None
        elif tag == "summary":
            self.details[-1]["summary"] = "".join(self._summary)
            self._summary = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._summary is not None:
            self._summary.append(data)

    @property
    def visible(self) -> str:
        return "".join(self.text)


result_of = iq_result


@pytest.fixture
def evil(root):
    """Keys, values, field names and messages full of markup."""
    rows = [
        (f"{EVIL}{i}", {EVIL: f"v{i}<b>", "n": i}, {"partition": i % 2, "source": ("t&t", 0, i)})
        for i in range(6)
    ]
    write_store(root, "evil", rows, partitions=3, partitioner="explicit")
    return root


@pytest.fixture
def totals(root):
    """Three partitions of different sizes, a broken fourth, known end offsets."""
    sizes = {0: 12, 1: 3, 2: 6, 3: 1}
    rows = [
        (f"p{p}-{i:02d}", {"n": i}, {"partition": p, "source": ("orders", p, i)})
        for p, n in sizes.items()
        for i in range(n)
    ]
    write_store(root, "totals", rows, partitions=4, partitioner="explicit")
    with iqkit.StoreWriter(root, "totals") as w:
        w.record_source_end({"orders": {0: 20, 1: 10, 2: 6, 3: 1}})
    break_partition(root, "totals", 3)
    return root


def scan(store: str) -> StateQueryRequest:
    return request(store, RangeQuery.with_no_bounds()).enable_execution_info()


# -- escaping ------------------------------------------------------------------------------
def test_everything_user_derived_is_escaped(evil):
    with iqkit.open(evil) as engine:
        r = result_of(
            engine,
            scan("evil").with_partitions({0, 1, 2, 7}),
            lags=engine.lags(stores=["evil"])["evil"],
            line=f"%iq scan evil --as {EVIL}",
            display_limit=0,
        )
    html = r._repr_html_()
    page = Page(html)
    assert "script" not in page.tags
    assert page.tags.count("b") == 1  # the summary's store name, none from the data
    rows_table = page.tables[0]
    assert rows_table[0]["cells"] == ["partition", "key", EVIL, "n"]
    assert {row["cells"][1] for row in rows_table[1:]} == {f"{EVIL}{i}" for i in range(6)}
    assert f"%iq scan evil --as {EVIL}" in page.visible  # the line, as text
    assert "t&t[0]=" in page.visible  # topic names in positions


# -- rows table ----------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [0, 5, 100])
def test_rows_table_is_cut_at_display_limit_with_a_footer(totals, limit):
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), display_limit=limit)
    page = Page(r._repr_html_())
    shown = len(page.tables[0]) - 1
    assert shown == (len(r) if limit == 0 or limit > len(r) else limit)
    expected_keys = r.rows["key"].tolist()[:shown]
    assert [row["cells"][1] for row in page.tables[0][1:]] == expected_keys
    cut = shown < len(r)
    assert ("Showing the first" in page.visible) is cut
    if cut:
        assert f"{shown:,} of {len(r):,} rows" in page.visible
        assert ".rows" in page.visible and "%config IQMagics.displaylimit = 0" in page.visible


def test_fetch_truncation_is_announced(totals):
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), limit=7, display_limit=0)
    page = Page(r._repr_html_())
    assert "truncated at 7 rows" in page.visible
    assert "--limit N" in page.visible and "Showing the first" not in page.visible


def test_cells_show_nulls_bytes_and_times(root):
    write_store(root, "b", [(b"\x00<", b"\xff")], partitions=1, key_serde="bytes",
                value_serde="bytes")  # fmt: skip
    write_store(root, "w", [("k", {"x": None, "y": 1.5}, {"window_start": 1_500})],
                partitions=1, kind="window", window_size_ms=1000)  # fmt: skip
    query = iqkit.WindowRangeQuery.with_window_start_range(0, 10_000)
    with iqkit.open(root) as engine:
        b = Page(result_of(engine, scan("b"))._repr_html_()).tables[0]
        w = Page(result_of(engine, request("w", query))._repr_html_()).tables[0]
    assert b[1]["cells"] == ["0", "b'\\x00<'", "b'\\xff'"]
    assert w[0]["cells"] == ["partition", "key", "window_start", "window_end", "x", "y"]
    assert w[1]["cells"] == [
        "0",
        "k",
        "1970-01-01 00:00:01.500Z",
        "1970-01-01 00:00:02.500Z",
        "null",
        "1.5",
    ]
    assert w[1]["cell_attrs"][4] == {"class": "null"}


def test_an_empty_result_says_so(totals):
    with iqkit.open(totals) as engine:
        r = result_of(engine, request("totals", RangeQuery.with_range("x", "y")))
    page = Page(r._repr_html_())
    assert "No rows." in page.visible
    assert "0 rows" in page.visible


# -- summary, partitions, bars -------------------------------------------------------------
def test_summary_line(totals):
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"))
    summary = Page(result._summary(r)).visible
    assert summary.startswith("totals · RangeQuery · 21 rows · partitions 3 ok / 1 failed · ")
    # the elapsed time (a chain store's first reader builds its databases: maybe seconds)
    assert re.search(r"\d m?s · version 2$", summary)


def test_never_written_partitions_read_ok_in_the_summary(root):
    # issue 10: a healthy store with untouched partitions read "1 ok / 3 failed" in red
    iqkit.create_store(root, "sparse", partitions=4, partitioner="explicit")
    with iqkit.StoreWriter(root, "sparse") as w:
        w.put("a", 1, partition=2)
    with iqkit.open(root) as engine:
        r = result_of(engine, scan("sparse"))
    summary = Page(result._summary(r)).visible
    assert summary.startswith("sparse · RangeQuery · 1 row · partitions 4 ok / 0 failed · ")
    page = Page(r._repr_html_())
    statuses = [row["cells"][1] for row in page.tables[1][1:]]
    assert statuses == ["success"] * 4 and "failure" not in page.tables[1][0]["cells"]
    assert r.partitions["rows"].tolist() == [0, 0, 1, 0]
    assert "partition 0 failed" not in str(r)


def test_partitions_table_highlights_failures_and_draws_bars(totals):
    with iqkit.open(totals) as engine:
        lags = engine.lags(stores=["totals"])["totals"]
        r = result_of(engine, scan("totals"), lags=lags)
    page = Page(r._repr_html_())
    table = page.tables[1]
    header = table[0]["cells"]
    assert header == ["partition", "status", "rows", "lag", "elapsed", "position", "failure"]
    body = {int(row["cells"][0]): row for row in table[1:]}
    assert body[3]["cells"][1] == "failed"
    assert "background" in body[3]["attrs"].get("style", "")
    assert body[3]["cells"][6].startswith("STORE_EXCEPTION: store 'totals' partition 3")
    assert all("style" not in body[p]["attrs"] for p in (0, 1, 2))
    rows = {p: r.collected.rows_per_partition[p] for p in (0, 1, 2)}
    largest = max(rows.values())
    for p, n in rows.items():
        assert body[p]["cells"][2] == str(n)
        rows_bar = body[p]["bars"][0]
        assert f"width:{round(render.BAR_PX * n / largest)}px" in rows_bar
    # Partition p applied offsets 0 to size-1 of orders partition p (12, 3, 6 rows), whose
    # ends are 20, 10, 6: lags 20-11-1, 10-2-1, 6-5-1; bars scaled to the largest (80px).
    lag_cells = {p: body[p]["cells"][3] for p in (0, 1, 2)}
    assert lag_cells == {0: "8", 1: "7", 2: "0"}
    widths = {0: 80, 1: round(80 * 7 / 8), 2: 0}
    for p, width in widths.items():
        assert f"width:{width}px" in body[p]["bars"][1], p
    assert body[0]["cells"][5] == "orders[0]=11"


# -- trace and lag sections ----------------------------------------------------------------
@pytest.mark.parametrize("show_trace", [False, True])
def test_trace_is_collapsible_and_open_on_request(totals, show_trace):
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), show_trace=show_trace)
    page = Page(r._repr_html_())
    trace = [d for d in page.details if d["summary"].startswith("Execution trace")]
    assert len(trace) == 1 and trace[0]["open"] is show_trace
    assert trace[0]["summary"] == f"Execution trace ({len(r.trace)} steps)"
    trace_table = page.tables[2]
    assert trace_table[0]["cells"] == ["partition", "step", "layer", "detail", "nanoseconds"]
    assert len(trace_table) - 1 == len(r.trace)


def test_lag_section(totals):
    with iqkit.open(totals) as engine:
        known = result_of(engine, scan("totals"), lags=engine.lags(stores=["totals"])["totals"])
        unknown = result_of(
            engine, scan("totals"), lags=engine.lags({}, stores=["totals"])["totals"]
        )
        none = result_of(engine, scan("totals"))

    def broken():
        raise iqkit.EngineClosedError("the engine is closed")

    failing = IQResult(none.request, none.result, none.manifest, none.collected,
                       engine_ns=1, lags=broken)  # fmt: skip
    total = sum(i.offset_lag for i in known.lag_infos.values())
    sections = {d["summary"] for d in Page(known._repr_html_()).details}
    assert f"Lag ({total:,} records behind)" in sections
    page = Page(unknown._repr_html_())
    # no end offsets: said in words, no table of nulls (issue 10; the title was "unknown")
    (lag,) = [d for d in page.details if d["summary"].startswith("Lag")]
    assert lag["summary"] == "Lag (no source recorded)"
    assert "No source recorded for totals" in page.visible
    assert len(page.tables) == 3  # rows, partitions, trace: the lag section has no table
    lag_cells = [row["cells"][3] for row in page.tables[1][1:]]
    assert set(lag_cells) == {"unknown"}  # never shown as 0
    assert not any(d["summary"].startswith("Lag") for d in Page(none._repr_html_()).details)
    html = failing._repr_html_()  # displaying never fails because lag could not be read
    assert "Lag unavailable: EngineClosedError: the engine is closed" in Page(html).visible


# -- text ----------------------------------------------------------------------------------
def test_text_form_shows_rows_and_failures_without_timings(totals):
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), display_limit=4)
    text = str(r)
    lines = text.splitlines()
    assert lines[0] == repr(r)
    assert lines[1].split() == ["partition", "key", "n"]
    assert [line.split()[1] for line in lines[2:6]] == r.rows["key"].tolist()[:4]
    assert lines[6] == f"… {len(r) - 4:,} more rows (.rows has them all)"
    assert lines[7].startswith("partition 3 failed: STORE_EXCEPTION: ")
    assert not re.search(r"\d ?(ms|ns|µs|s)\b", text.replace(repr(r), ""))
    assert pretty(r) == text  # IPython's text display


def test_text_tables_write_numbers_as_numbers(root):
    """A nullable column (the partitions frame's ``elapsed_ms`` is ``Float64``) hands
    numpy scalars to the text writer; NumPy 2's repr of them (``np.float64(0.25)``) must
    not reach the table the terminal tour prints."""
    write_store(root, "prices", [("tea", 1.5), ("soup", 2.25)], value_serde="double")
    with iqkit.open(root) as engine:
        r = iq_result(engine, request("prices", RangeQuery.with_no_bounds()))
    assert sorted(line.split()[-1] for line in str(r).splitlines()[2:]) == ["1.5", "2.25"]
    frame = r.partitions.assign(elapsed_ms=[0.25] * len(r.partitions)).astype(
        {"elapsed_ms": "Float64"}
    )
    lines = render.text_table(frame)
    assert lines[0].split()[-1] == "elapsed_ms"
    assert [line.split()[-1] for line in lines[1:]] == ["0.25"] * len(frame)


# -- the table writer ----------------------------------------------------------------------
def test_table_html_matches_the_arrow_table():
    table = pa.table(
        {
            "i": pa.array([1, None, 3], pa.int64()),
            "s": ["a", None, "x" * 500],
            "f": [0.5, float("nan"), None],
            "l": [[1, 2], None, []],
        }
    )
    page = Page(render.table_html(table))
    rows = page.tables[0]
    assert rows[0]["cells"] == ["i", "s", "f", "l"]
    assert rows[1]["cells"] == ["1", "a", "0.5", "[1, 2]"]
    assert rows[2]["cells"] == ["null", "null", "null", "null"]
    assert rows[3]["cells"][1] == "x" * (render.CELL_CHARS - 1) + "…"
    assert rows[3]["cells"][3] == "[]"
    assert rows[1]["cell_attrs"][0] == {"class": "n"}
    assert len(Page(render.table_html(table, 2)).tables[0]) == 3


def test_a_truncated_result_says_it_stopped_at_the_limit_not_that_rows_has_all(totals):
    # The text form used to say "… N more rows (.rows has them all)" for a scan the
    # fetch limit cut off: .rows held only what was read, the store had more.
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), limit=5, display_limit=2)
    assert r.truncated
    lines = str(r).splitlines()
    assert "… 3 more rows in .rows" in lines
    assert not any("has them all" in line for line in lines)
    stopped = [line for line in lines if "fetch limit" in line]
    assert stopped == [result.truncation_note(r)]
    assert "after 5 rows" in stopped[0] and "--limit 0" in stopped[0]
    assert "IQMagics.autolimit" in stopped[0]
    assert result.truncation_note(r) in Page(r._repr_html_()).visible


@pytest.mark.parametrize(
    ("store", "lo", "hi", "says"),
    [
        ("totals", "m", "a", "swap --from and --to and add --desc"),
        ("counts", -3, 7, "negative numbers after positive ones"),  # int32: bytes order
    ],
)
def test_a_range_with_its_bounds_reversed_says_why_it_is_empty(nb_root, store, lo, hi, says):
    # Still an empty success (IQv2's rule); a note says why, and what to type instead.
    with iqkit.open(nb_root) as engine:
        empty = result_of(engine, request(store, RangeQuery.with_range(lo, hi)))
        fine = result_of(engine, request(store, RangeQuery.with_range(hi, hi)))
    assert len(empty) == 0
    (note,) = empty.notes
    assert says in note and note in str(empty).splitlines()
    assert note in Page(empty._repr_html_()).visible
    assert fine.notes == []


# -- stable timings (IQKIT_STABLE_TIMINGS) -------------------------------------------------
def _timings_shown(r: IQResult) -> tuple[str, str, str, str]:
    """Everything a notebook stores for a result and its frames."""
    return (r._repr_html_(), repr(r.partitions), repr(r.trace), r.trace._repr_html_())


def test_stable_timings_show_a_placeholder_and_runs_display_the_same(totals, monkeypatch):
    monkeypatch.setenv(render.STABLE_TIMINGS_ENV, "1")
    with iqkit.open(totals) as engine:  # a chain store's first reader builds its databases
        result_of(engine, scan("totals"))
    shown = []
    for _ in range(2):  # two engines, so nothing but the wall clock differs
        with iqkit.open(totals) as engine:
            r = result_of(engine, scan("totals"), show_trace=True)
        shown.append(_timings_shown(r))
    assert shown[0] == shown[1]  # what nbval compares in a notebook's stored outputs
    page = Page(shown[0][0])
    placeholder = render.TIME_PLACEHOLDER
    assert f" · {placeholder} · " in Page(result._summary(r)).visible
    partitions, trace = page.tables[1], page.tables[2]
    elapsed = partitions[0]["cells"].index("elapsed")
    measured = r.partitions["elapsed_ms"].notna().tolist()
    assert [row["cells"][elapsed] for row in partitions[1:]] == [
        placeholder if m else "null" for m in measured
    ]
    assert {row["cells"][-1] for row in trace[1:]} == {placeholder}
    assert not re.search(r"\d ms\b|\d s\b", page.visible)
    for text in shown[0][1:]:
        assert placeholder in text
    # the data keeps the measured numbers
    assert r.trace["nanoseconds"].dtype == "Int64" and r.trace["nanoseconds"].notna().all()
    assert r.partitions["elapsed_ms"].dtype == "Float64" and any(measured)


@pytest.mark.parametrize("setting", [None, "", "0"])
def test_timings_are_shown_unless_asked(totals, monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv(render.STABLE_TIMINGS_ENV, raising=False)
    else:
        monkeypatch.setenv(render.STABLE_TIMINGS_ENV, setting)
    with iqkit.open(totals) as engine:
        r = result_of(engine, scan("totals"), show_trace=True)
    assert not any(render.TIME_PLACEHOLDER in text for text in _timings_shown(r))
    assert re.search(r"\d m?s\b", Page(result._summary(r)).visible)
    trace = Page(r._repr_html_()).tables[2]
    assert all(row["cells"][-1].isdigit() for row in trace[1:])
