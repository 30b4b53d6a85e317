"""The child side of the damaged-files fault injection (``probes_integrity.py``): the
stores it damages, every query shape it runs over a damaged copy, each shape's answers in
a comparable form, and the verdict on a damaged answer.

The shapes over the stores (``build_stores``): key, multi-key, range, prefix, window,
versions, changes (the engine's), SQL, ``%iq`` in a real IPython shell, the widget
panel; over a Spark checkpoint folder (``Reader.stores`` names its stores): scans, key
lookups, versions listed and read ``as_of``, SQL. Spark's ``format("iqkit")`` reads
(``spark_answers``) run in the test's own process, on its session.

A child is forked from a multiprocessing *forkserver* whose server imported this module
(and with it iqkit, pandas, DuckDB, pyarrow, IPython and ipywidgets), so a child starts
in milliseconds, clean: no store opened, no cache, nothing known damaged. It reads one
damaged copy of the stores, with a cache folder of its own, runs the shapes it is given
one after the other (one engine for the engine shapes, as a notebook holds one), and
sends the parent, per shape, ``("start", shape)`` before it and ``("done", shape,
verdict, details, seconds, answers)`` after it. What kills the child (a signal, an
abort) or hangs it is the parent's to see: it knows the shape that was running.

The verdict on one shape (``classify``) compares each item (one query, one ``%iq``
line, one SQL statement) with the undamaged answer:

* ``same``: the undamaged answer;
* ``clean``: a failure, in one line naming the damaged file, of partitions the damage
  touches (a damaged SST or twin touches its partition; a damaged version record or
  manifest every partition of its store): a partition result failed with
  ``STORE_EXCEPTION`` (or an iqkit error raised while its rows are iterated), or, for
  the surfaces that report a failure as an error (SQL, ``%iq``, the panel, Spark, and
  the engine when the whole store is damaged), an iqkit error (``SQLError``, IPython's
  ``UsageError``) raised with such a line;
* ``WRONG:<why>``: anything else: different rows or positions reported as a success,
  a failure of an untouched partition or store, another failure reason, a message of
  several lines or naming no damaged file, an exception of any other type (a
  traceback), a traceback printed, an engine query raising for a one-partition damage.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Imported here so the forkserver's server has them loaded before it forks a child.
import duckdb  # noqa: F401
import ipywidgets  # noqa: F401
import pandas as pd
import pyarrow.parquet  # noqa: F401
from IPython.core.error import UsageError

import iqkit
from iqkit import (
    ChangesQuery,
    KeyQuery,
    MultiKeyQuery,
    MultiVersionedKeyQuery,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    VersionedKeyQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from iqkit.jupyter.builder import IQPanel
from iqkit.jupyter.session import IQSession
from iqkit.jupyter.testing import new_shell

#: Modules the shapes import on first use: imported here too, so a child does not.
for _name in (
    "IPython.core.application", "IPython.core.completer", "IPython.core.completerlib",
    "IPython.core.crashhandler", "IPython.core.magics", "IPython.core.oinspect",
    "IPython.utils.generics", "IPython.utils.wildcard", "asyncio", "sqlite3", "glob",
    "iqkit.jupyter.complete", "iqkit.jupyter.magic", "iqkit.jupyter.result",
    "iqkit.jupyter.render", "iqkit.jupyter.watch", "iqkit.store.columnar.columns",
    "iqkit.store.columnar.scan", "pandas.core.arrays.arrow._arrow_utils", "tqdm", "tzdata",
):  # fmt: skip
    importlib.import_module(_name)

# -- the stores ----------------------------------------------------------------------------
KV, WIN = "kv", "win"
PARTITIONS = {KV: 4, WIN: 2}
MINUTE = 60_000
#: Commits to the key-value store: a base, then deltas of updates, deletes, inserts.
KV_COMMITS = 5
N_KEYS = 320


def _text(i: int, version: int) -> str:
    """A string value long enough that an SST spans several 4 KiB blocks."""
    word = "abcdefghijklmnopqrstuvwxyz"[(i * 7 + version) % 26]
    return f"{word}{i:04d}-" + "xyzw"[i % 4] * (20 + (i * 37 + version * 11) % 90)


def _value(i: int, version: int) -> dict[str, Any]:
    # f is a multiple of 1/8: sums are exact in any order (DuckDB adds in parallel).
    return {"f": (i * 13 + version) / 8, "i": i * 1000 + version, "s": _text(i, version)}


def key(i: int) -> str:
    return f"k{i:03d}"


def build_stores(root: Path) -> None:
    """The two stores every damage starts from, with history: ``kv`` (4 partitions,
    string keys, JSON values of a float, an int and a string; ``KV_COMMITS`` versions:
    a base, then updates, deletes and inserts, each put with a source offset) and
    ``win`` (a window store, 2 partitions, int64 values, 2 versions)."""
    iqkit.create_store(root, KV, partitions=PARTITIONS[KV], key_serde="string",
                       value_serde="json", retention=20)  # fmt: skip
    offset = 0
    with iqkit.StoreWriter(root, KV) as w:
        for i in range(N_KEYS - 40):
            w.put(key(i), _value(i, 1), source=("orders", i % 3, offset))
            offset += 1
    for version in range(2, KV_COMMITS + 1):
        with iqkit.StoreWriter(root, KV) as w:
            for i in range(version, N_KEYS, 5 + version):  # updates (and inserts)
                w.put(key(i), _value(i, version), source=("orders", i % 3, offset))
                offset += 1
            for i in range(version * 3, N_KEYS, 9 + 2 * version):  # deletes
                w.delete(key(i), source=("orders", i % 3, offset))
                offset += 1
            for i in range(N_KEYS - 40 + (version - 2) * 10, N_KEYS - 30 + (version - 2) * 10):
                w.put(key(i), _value(i, version), source=("orders", i % 3, offset))
                offset += 1
    iqkit.create_store(root, WIN, partitions=PARTITIONS[WIN], kind="window",
                       value_serde="int64", window_size_ms=MINUTE)  # fmt: skip
    with iqkit.StoreWriter(root, WIN) as w:
        for i in range(240):
            w.put(f"u{i % 24:02d}", i * 7, window_start=(i // 24) * MINUTE)
    with iqkit.StoreWriter(root, WIN) as w:
        for i in range(0, 240, 5):
            w.put(f"u{i % 24:02d}", -i, window_start=(i // 24) * MINUTE)
        for i in range(1, 240, 13):
            w.delete(f"u{i % 24:02d}", window_start=(i // 24) * MINUTE)


#: Keys the key shapes ask for: kept, updated, deleted, inserted later, never written.
KEYS = [key(i) for i in (0, 1, 2, 6, 9, 13, 33, 47, 101, 150, 222, 279, 285, 299, 311)] + [
    "nobody",
    "k",
]
HISTORY_KEYS = [key(i) for i in (2, 6, 9, 47, 285, 311)]
TIME_TO = 20 * MINUTE


# -- answers in a comparable form ----------------------------------------------------------
# An answer is a tuple: ("ok", text) | ("fail", reason, message) |
# ("raised", type name, message, an error type iqkit reports failures with, traceback) |
# ("wrong", why) (a surface that showed something it must not, e.g. hid a store).
# An item is an answer, or {partition: answer}; a shape's answers are
# {label: (store, item)}.
Answer = tuple
Item = Answer | dict[int, Answer]
Answers = dict[str, tuple[str, Item]]

#: The exception types a surface reports a failure with (anything else is a traceback).
REPORTED = (iqkit.IqkitError, UsageError)


def raised(exc: BaseException) -> Answer:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    tb = "".join(traceback.format_exception(exc)[-12:])
    return ("raised", kind, str(exc), isinstance(exc, REPORTED), tb[-3000:])


def _rows_text(rows: list[Any]) -> str:
    return repr(rows)


def partition_answers(result: iqkit.StateQueryResult, rows: Callable[[Any], Any]) -> Item:
    """{partition: answer} of an engine result; ``rows(result.result)`` makes a
    successful partition's rows (an iqkit error raised there fails the partition)."""
    out: dict[int, Answer] = {}
    for p, r in sorted(result.partition_results.items()):
        if r.is_failure:
            out[p] = ("fail", r.failure_reason.name, r.failure_message)
            continue
        try:
            out[p] = ("ok", _rows_text([rows(r.result), r.position.to_map()]))
        except Exception as exc:
            out[p] = raised(exc)
    return out


def _iterated(it: Any) -> list[Any]:
    with it as rows:
        return [(kv.key, kv.value) for kv in rows]


def _plain(value: Any) -> Any:
    return value


def _multi(value: Any) -> Any:
    return sorted(value.items())


# -- the shapes ----------------------------------------------------------------------------
class Reader:
    """What one child reads with: one engine (opened on first use, as a notebook holds
    one; opened again after a failed open), the ``%iq`` shell, a panel session."""

    def __init__(self, root: str, stores: dict[str, str] | None = None) -> None:
        self.root = root
        #: A checkpoint's stores and their kinds (the checkpoint shapes read them).
        self.stores = stores or {}
        self._engine: iqkit.StateEngine | None = None

    def engine(self) -> iqkit.StateEngine:
        if self._engine is None:
            self._engine = iqkit.open(self.root)
        return self._engine

    def query(self, store: str, query: Any, rows: Callable[[Any], Any] = _iterated) -> Item:
        try:
            result = self.engine().query(StateQueryRequest.in_store(store).with_query(query))
        except Exception as exc:
            return raised(exc)
        return partition_answers(result, rows)


def shape_key(r: Reader) -> Answers:
    return {f"KeyQuery {k}": (KV, r.query(KV, KeyQuery.with_key(k), _plain)) for k in KEYS}


def shape_multi(r: Reader) -> Answers:
    return {
        "MultiKeyQuery": (KV, r.query(KV, MultiKeyQuery.with_keys(KEYS), _multi)),
        "MultiKeyQuery all": (
            KV,
            r.query(KV, MultiKeyQuery.with_keys([key(i) for i in range(0, N_KEYS, 3)]), _multi),
        ),
    }


def shape_range(r: Reader) -> Answers:
    return {
        "RangeQuery k050..k250": (KV, r.query(KV, RangeQuery.with_range(key(50), key(250)))),
        "RangeQuery all": (KV, r.query(KV, RangeQuery.with_no_bounds())),
        "RangeQuery all desc": (
            KV,
            r.query(KV, RangeQuery.with_no_bounds().with_descending_keys()),
        ),
    }


def shape_prefix(r: Reader) -> Answers:
    return {
        "PrefixScanQuery k1": (KV, r.query(KV, PrefixScanQuery.with_prefix("k1"))),
        "PrefixScanQuery k29 desc": (
            KV,
            r.query(KV, PrefixScanQuery.with_prefix("k29").with_descending_keys()),
        ),
    }


def _windows(it: Any) -> list[Any]:
    with it as rows:
        return [(kv.key.key, kv.key.start, kv.key.end, kv.value) for kv in rows]


def _window_values(it: Any) -> list[Any]:
    with it as rows:
        return [(kv.key, kv.value) for kv in rows]


def shape_window(r: Reader) -> Answers:
    out: Answers = {
        "WindowRangeQuery": (
            WIN,
            r.query(WIN, WindowRangeQuery.with_window_start_range(0, TIME_TO), _windows),
        ),
        "WindowRangeQuery desc": (
            WIN,
            r.query(
                WIN,
                WindowRangeQuery.with_window_start_range(0, TIME_TO).with_descending_keys(),
                _windows,
            ),
        ),
    }
    for k in ("u01", "u07", "u13", "u99"):
        query = WindowKeyQuery.with_key_and_window_start_range(k, 0, TIME_TO)
        out[f"WindowKeyQuery {k}"] = (WIN, r.query(WIN, query, _window_values))
    return out


def shape_versions(r: Reader) -> Answers:
    out: Answers = {}
    for k in HISTORY_KEYS:
        out[f"MultiVersionedKeyQuery {k}"] = (
            KV,
            r.query(KV, MultiVersionedKeyQuery.with_key(k), _plain),
        )
        for v in range(1, KV_COMMITS + 1):
            out[f"VersionedKeyQuery {k} v{v}"] = (
                KV,
                r.query(KV, VersionedKeyQuery.with_key(k).as_of_version(v), _plain),
            )
    for v in (2,):  # an older version read whole, through an engine pinned there
        try:
            with iqkit.open(r.root, as_of={KV: v}) as pinned:
                result = pinned.query(
                    StateQueryRequest.in_store(KV).with_query(RangeQuery.with_no_bounds())
                )
                item = partition_answers(result, _iterated)
        except Exception as exc:
            item = raised(exc)
        out[f"as_of v{v} RangeQuery all"] = (KV, item)
    return out


def shape_changes(r: Reader) -> Answers:
    out: Answers = {
        f"ChangesQuery {a}..{b}": (KV, r.query(KV, ChangesQuery.between(a, b), _plain))
        for a, b in ((1, KV_COMMITS), (2, 3), (KV_COMMITS - 1, KV_COMMITS))
    }
    out["ChangesQuery 1.. prefix k2"] = (
        KV,
        r.query(KV, ChangesQuery.between(1).with_prefix("k2"), _plain),
    )
    return out


SQL = {
    "SQL aggregate": (
        KV,
        "SELECT count(*) AS n, sum(i) AS i, sum(f) AS f, sum(length(s)) AS s, "
        "min(key) AS lo, max(key) AS hi, count(DISTINCT partition) AS parts FROM kv",
    ),
    "SQL SELECT *": (KV, "SELECT * FROM kv"),
    "SQL window SELECT *": (WIN, "SELECT * FROM win"),
    "SQL changes": (KV, "SELECT * FROM changes('kv', 1)"),
}


def frame_text(df: pd.DataFrame) -> str:
    """A DataFrame's rows in a comparable form, whatever order they came in."""
    rows = [repr(tuple(row)) for row in df.itertuples(index=False, name=None)]
    return repr([list(df.columns), sorted(rows)])


def shape_sql(r: Reader) -> Answers:
    out: Answers = {}
    for label, (store, text) in SQL.items():
        try:
            out[label] = (store, ("ok", frame_text(iqkit.sql(text, root=r.root))))
        except Exception as exc:
            out[label] = (store, raised(exc))
    return out


def result_answers(result: Any) -> Item:
    """{partition: answer} of an ``IQResult`` (its rows split by partition), after it was
    rendered the ways a notebook shows it."""
    result._repr_html_()
    repr(result)
    result.partitions  # noqa: B018  (the per-partition frame a notebook shows)
    rows = result.rows
    out: dict[int, Answer] = {}
    for p, r in sorted(result.result.partition_results.items()):
        if r.is_failure:
            out[p] = ("fail", r.failure_reason.name, r.failure_message)
            continue
        mine = rows[rows["partition"] == p] if "partition" in rows.columns else rows
        text = [repr(tuple(row)) for row in mine.itertuples(index=False, name=None)]
        out[p] = ("ok", repr([list(mine.columns), text, r.position.to_map()]))
    return out


IQ_LINES = {
    "%iq get": (KV, "get kv " + " ".join(KEYS)),
    "%iq scan": (KV, "scan kv"),
    "%iq range": (KV, f"range kv --from {key(50)} --to {key(250)} --desc"),
    "%iq prefix": (KV, "prefix kv k2"),
    "%iq history": (KV, f"history kv {HISTORY_KEYS[1]}"),
    "%iq changes": (KV, "changes kv --from 1"),
    "%iq window": (WIN, f"window win u07 --from 0 --to {TIME_TO}"),
    "%iq windows": (WIN, f"windows win --from 0 --to {TIME_TO}"),
}
IQ_SQL = (KV, "SELECT partition, count(*) AS n, sum(i) AS i FROM kv GROUP BY ALL")


def shape_iq(r: Reader) -> Answers:
    """``%iq`` lines in a real IPython shell (``IQTestShell``), results rendered."""
    out: Answers = {}
    shell = new_shell()
    try:
        try:
            shell.run_line_magic("iq", f"open {r.root}")
        except Exception as exc:
            return {"%iq open": ("", raised(exc))}
        for label, (store, line) in IQ_LINES.items():
            try:
                out[label] = (store, result_answers(shell.run_line_magic("iq", line)))
            except Exception as exc:
                out[label] = (store, raised(exc))
        try:
            frame = shell.run_cell_magic("iq", "sql", IQ_SQL[1])
            out["%%iq sql"] = (IQ_SQL[0], ("ok", frame_text(frame)))
        except Exception as exc:
            out["%%iq sql"] = (IQ_SQL[0], raised(exc))
    finally:
        shell.clear_instance()
    return out


PANEL_RUNS = {
    "panel get": (KV, {"query": "get", "key": ", ".join(KEYS[:8])}),
    "panel scan": (KV, {"query": "scan"}),
    "panel prefix": (KV, {"query": "prefix", "prefix": "k1", "desc": True}),
    "panel history": (KV, {"query": "history", "key": HISTORY_KEYS[0]}),
    "panel windows": (WIN, {"query": "windows", "lower": "0", "upper": str(TIME_TO)}),
}


PANEL_DEFAULTS = {"key": "", "prefix": "", "lower": "", "upper": "", "desc": False}


def shape_panel(r: Reader) -> Answers:
    """The widget panel driven from code: fields set, Run clicked, ``.result`` or
    ``.error`` read."""
    out: Answers = {}
    session = IQSession(r.root)
    try:
        panel = IQPanel(session)
        for label, (store, fields) in PANEL_RUNS.items():
            try:
                item = _panel_run(panel, store, fields)
            except Exception as exc:
                item = raised(exc)
            out[label] = (store, item)
    finally:
        session.close()
    return out


def _panel_error(panel: IQPanel) -> Answer:
    exc = panel.exception
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    tb = "".join(traceback.format_exception(exc)[-12:]) if exc is not None else ""
    return ("raised", kind, panel.error, isinstance(exc, REPORTED), tb)


def _panel_run(panel: IQPanel, store: str, fields: dict[str, Any]) -> Item:
    """What the panel shows for one run: its error (choosing the store already may show
    one), or its result."""
    if store not in panel.store.options:
        return ("wrong", f"the panel does not list store {store!r}: {panel.store.options}")
    if panel.store.value != store:
        panel.store.value = store
        if panel.error is not None:
            return _panel_error(panel)
    if fields["query"] not in panel.query.options:
        return ("wrong", f"the panel offers no {fields['query']!r} for store {store!r}")
    for name, value in {**PANEL_DEFAULTS, **fields}.items():  # nothing left from a run before
        getattr(panel, name).value = value
    panel.run.click()
    return _panel_error(panel) if panel.error is not None else result_answers(panel.result)


# -- Spark (run in the test's process, on its session: not in a child) ---------------------
SPARK_READS = {
    "spark kv": (KV, {}),
    "spark kv keys": (KV, {"keys": json.dumps(KEYS[:8])}),
    "spark win": (WIN, {}),
}
#: What Spark says when a Python worker died (a signal, an abort): a killed process.
SPARK_CRASHED = ("Python worker exited unexpectedly", "crashed")
_SPARK_ERROR_LINE = re.compile(r"^\s*(iqkit\.[\w.]*Error|IqkitError): (.*)$", re.M)


def spark_raised(exc: BaseException) -> Answer:
    """A Spark read's exception as an answer: an iqkit error raised on the driver as
    itself; a task's, found in the worker's traceback Spark passes on (its last line,
    ``iqkit.errors.IqkitError: <one line>``); a crashed worker as ``killed``."""
    if isinstance(exc, REPORTED):
        return raised(exc)
    text = str(exc)
    found = _SPARK_ERROR_LINE.findall(text)
    if found:
        kind, message = found[-1]
        return ("raised", f"{kind} (in a Spark task)", message, True, text[-2000:])
    if any(m in text for m in SPARK_CRASHED):
        return ("killed", text[:2000])
    return raised(exc)


def spark_answers(spark: Any, root: str, timeout: float = 120.0) -> Answers:
    """Each ``SPARK_READS`` read of ``root`` through ``format("iqkit")``, collected."""
    import threading

    out: Answers = {}
    for label, (store, options) in SPARK_READS.items():
        box: list[Answer] = []
        group = f"iqkit-integrity-{os.getpid()}-{time.monotonic_ns()}"

        def read(
            store: str = store, options: dict = options, group: str = group, box: list = box
        ) -> None:
            spark.sparkContext.setJobGroup(group, "damaged-files read", True)
            try:
                reader = spark.read.format("iqkit").option("store", store)
                for name, value in options.items():
                    reader = reader.option(name, value)
                rows = sorted(repr(tuple(r)) for r in reader.load(root).collect())
                box.append(("ok", repr(rows)))
            except Exception as exc:
                box.append(spark_raised(exc))

        worker = threading.Thread(target=read, daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            spark.sparkContext.cancelJobGroup(group)
            worker.join(30)
            box[:] = [("hang", f"over {timeout:.0f} s")]
        out[label] = (store, box[0])
    return out


# -- Spark Structured Streaming checkpoints (iqkit.open(checkpoint folder)) --------------
#: The users the checkpoint shapes look up (the test's streams write u0..u6).
CKPT_KEYS = [f"u{i}" for i in range(7)] + ["nobody"]
CKPT_TIME_TO = 10**13
#: Versions read whole through an engine pinned there (the latest is read anyway).
CKPT_OLD_VERSIONS = (1, 2)


def _ckpt_scan_query(kind: str) -> tuple[Any, Callable[[Any], Any]]:
    if kind == "window":
        return WindowRangeQuery.with_window_start_range(0, CKPT_TIME_TO), _windows
    return RangeQuery.with_no_bounds(), _iterated


def shape_ckpt_scan(r: Reader) -> Answers:
    out: Answers = {}
    for store, kind in r.stores.items():
        query, rows = _ckpt_scan_query(kind)
        out[f"{store} scan"] = (store, r.query(store, query, rows))
        if kind != "window":
            desc = RangeQuery.with_no_bounds().with_descending_keys()
            out[f"{store} scan desc"] = (store, r.query(store, desc))
    return out


def shape_ckpt_key(r: Reader) -> Answers:
    out: Answers = {}
    for store, kind in r.stores.items():
        for k in CKPT_KEYS:
            if kind == "window":
                query = WindowKeyQuery.with_key_and_window_start_range(k, 0, CKPT_TIME_TO)
                out[f"{store} WindowKeyQuery {k}"] = (store, r.query(store, query, _window_values))
            else:
                out[f"{store} KeyQuery {k}"] = (store, r.query(store, KeyQuery.with_key(k), _plain))
        if kind != "window":
            multi = MultiKeyQuery.with_keys(CKPT_KEYS)
            out[f"{store} MultiKeyQuery"] = (store, r.query(store, multi, _multi))
    return out


def shape_ckpt_versions(r: Reader) -> Answers:
    """The versions listed, and older versions read whole (``as_of``)."""
    out: Answers = {}
    for store, kind in r.stores.items():
        try:
            out[f"{store} versions"] = (store, ("ok", repr(r.engine().versions(store))))
        except Exception as exc:
            out[f"{store} versions"] = (store, raised(exc))
        query, rows = _ckpt_scan_query(kind)
        for v in CKPT_OLD_VERSIONS:
            try:
                with iqkit.open(r.root, as_of={store: v}) as pinned:
                    request = StateQueryRequest.in_store(store).with_query(query)
                    item = partition_answers(pinned.query(request), rows)
            except Exception as exc:
                item = raised(exc)
            out[f"{store} as_of v{v} scan"] = (store, item)
    return out


def shape_ckpt_sql(r: Reader) -> Answers:
    out: Answers = {}
    for store in r.stores:
        text = f'SELECT * FROM "{store}"'
        try:
            out[f"SQL {store}"] = (store, ("ok", frame_text(iqkit.sql(text, root=r.root))))
        except Exception as exc:
            out[f"SQL {store}"] = (store, raised(exc))
    return out


def shape_verify(r: Reader) -> Answers:
    """``iqkit.verify`` over the root: ("ok", "no damage"), or ("damaged", the files it
    names, its lines). Its verdict is ``verify_verdict``'s: it must find the damage."""
    try:
        report = iqkit.verify(r.root)
    except Exception as exc:
        return {"verify": ("", raised(exc))}
    if report.ok:
        return {"verify": ("", ("ok", "no damage"))}
    files = sorted({d.file for d in report.damaged})
    return {"verify": ("", ("damaged", files, "\n".join(report.lines())))}


SHAPES: dict[str, Callable[[Reader], Answers]] = {
    "key": shape_key,
    "multi": shape_multi,
    "range": shape_range,
    "prefix": shape_prefix,
    "window": shape_window,
    "versions": shape_versions,
    "changes": shape_changes,
    "sql": shape_sql,
    "iq": shape_iq,
    "panel": shape_panel,
    "verify": shape_verify,
    "ckpt scan": shape_ckpt_scan,
    "ckpt key": shape_ckpt_key,
    "ckpt versions": shape_ckpt_versions,
    "ckpt sql": shape_ckpt_sql,
}
ENGINE_SHAPES = ("key", "multi", "range", "prefix", "window", "versions", "changes")
#: The surfaces that report a failure by raising (or showing) one error, not per
#: partition: a raised error is a clean failure for them whatever the damage's scope.
RAISING_SURFACES = ("sql", "iq", "panel", "spark", "ckpt sql")
CKPT_SHAPES = ("ckpt scan", "ckpt key", "ckpt versions", "ckpt sql")


# -- the verdict ---------------------------------------------------------------------------
def names_file(message: str, names: list[str]) -> bool:
    return any(n in message for n in names)


_PARTITION = re.compile(r"partition (\d+)")


def failure_verdict(message: str, store: str, damage: dict[str, Any]) -> str:
    """The verdict on a failure of ``store`` reported with ``message``."""
    if store != damage["store"]:
        return "WRONG:failure of an untouched store"
    if "\n" in message.strip():
        return "WRONG:message of several lines"
    if not names_file(message, damage["names"]):
        return "WRONG:message names no damaged file"
    named = {int(n) for n in _PARTITION.findall(message)}
    if named - set(damage["touched"]):
        return "WRONG:message names an untouched partition"
    return "clean"


def answer_verdict(exp: Answer, got: Answer | None, store: str, p: int, damage: dict) -> str:
    if got == exp:
        return "same"
    if got is None:
        return "WRONG:partition missing"
    if got[0] == "ok":
        return "WRONG:different rows" if exp[0] == "ok" else "WRONG:rows where it failed"
    if got[0] == "wrong":
        return f"WRONG:{got[1]}"
    if got[0] == "raised" and not got[3]:
        return "WRONG:traceback"
    if got[0] == "fail" and got[1] != "STORE_EXCEPTION":
        return f"WRONG:failure {got[1]}"
    if store == damage["store"] and p not in damage["touched"]:
        return "WRONG:failure of an untouched partition"
    return failure_verdict(got[2], store, damage)


def item_verdict(shape: str, exp: Item, got: Item, store: str, damage: dict) -> list[tuple]:
    """[(verdict, partition or None, expected, got)] of one item (several partitions)."""
    if isinstance(got, tuple) and got[0] in ("killed", "hang"):
        verdict = "killed: a Spark Python worker crashed" if got[0] == "killed" else "hang"
        return [(verdict, None, exp, got)]
    if isinstance(got, tuple) and got[0] == "wrong":
        return [(f"WRONG:{got[1]}", None, exp, got)]
    if isinstance(got, tuple) and got[0] == "raised":
        if not got[3]:
            return [("WRONG:traceback", None, exp, got)]
        verdict = failure_verdict(got[2], store, damage)
        whole_store = set(damage["touched"]) == set(range(damage["partitions"]))
        if verdict == "clean" and shape not in RAISING_SURFACES and not whole_store:
            verdict = "WRONG:raised for a one-partition damage"
        return [(verdict, None, exp, got)]
    if isinstance(exp, dict) != isinstance(got, dict):
        return [("WRONG:different shape of answer", None, exp, got)]
    if not isinstance(exp, dict):
        return [("same" if got == exp else "WRONG:different rows", None, exp, got)]
    assert isinstance(got, dict)
    out = []
    for p in sorted(set(exp) | set(got)):
        if p not in exp:
            out.append(("WRONG:extra partition", p, None, got[p]))
            continue
        g = got.get(p)
        out.append((answer_verdict(exp[p], g, store, p, damage), p, exp[p], g))
    return out


def short(answer: Any, limit: int = 300) -> str:
    text = repr(answer)
    return text if len(text) <= limit else text[: limit - 40] + f"... ({len(text)} chars)"


def first_difference(exp: Any, got: Any) -> str:
    """Where two ``ok`` answers' texts part (a wrong answer's summary)."""
    a, b = repr(exp), repr(got)
    diff = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    at = next(diff, min(len(a), len(b)))
    lo, hi = max(0, at - 60), at + 80
    return f"at char {at}: expected …{a[lo:hi]}… got …{b[lo:hi]}…"


def verify_verdict(expected: Answers, got: Answers, damage: dict) -> tuple[str, list[str]]:
    """``verify`` must name the damaged file (``clean``: found), or, for a damage that
    changed no byte, find nothing (``same``); missing it, naming another file or a
    traceback is ``WRONG``. A damaged manifest may instead stop it with one clean line
    naming the manifest (an iqkit error)."""
    exp, got_a = expected["verify"][1], got.get("verify", ("", None))[1]
    where = damage["file"]
    if not damage["changed"]:
        verdict = "same" if got_a == exp else "WRONG:verify reports an unchanged file"
    elif got_a is None or got_a[0] == "ok":
        verdict = "WRONG:verify missed the damage"
    elif got_a[0] == "damaged":
        named = any(f.endswith(where) for f in got_a[1])
        others = [f for f in got_a[1] if not f.endswith(where)]
        verdict = (
            "WRONG:verify named another file" if others
            else "clean" if named else "WRONG:verify missed the damage"
        )  # fmt: skip
    elif got_a[0] == "raised" and got_a[3] and damage["kind"] == "manifest":
        verdict = failure_verdict(got_a[2], damage["store"], damage)
    else:
        verdict = "WRONG:traceback" if got_a[0] == "raised" else f"WRONG:{got_a[0]}"
    details = [] if verdict == "same" else [f"{verdict} [verify] got {short(got_a, 800)}"]
    return verdict, details


def classify(shape: str, expected: Answers, got: Answers, damage: dict) -> tuple[str, list[str]]:
    """The shape's verdict (its worst item's: WRONG over clean over same) and a line per
    item that is not the same, expected vs got."""
    if shape == "verify":
        return verify_verdict(expected, got, damage)
    worst, details = "same", []
    for label in sorted(set(expected) | set(got)):
        if label not in expected:
            store, item = got[label]
            verdicts = [("WRONG:unexpected item", None, None, item)]
        elif label not in got:
            store, item = expected[label]
            verdicts = [("WRONG:item missing", None, item, None)]
        else:
            store, exp = expected[label]
            verdicts = item_verdict(shape, exp, got[label][1], store, damage)
        for verdict, p, exp_a, got_a in verdicts:
            if verdict == "same":
                continue
            where = f"{label}" + ("" if p is None else f" p{p}")
            if verdict.startswith("WRONG") and got_a and got_a[0] == "ok":
                what = first_difference(exp_a, got_a)
            elif got_a and got_a[0] == "raised" and not got_a[3]:
                what = f"{got_a[1]}: {short(got_a[2], 200)}\n{got_a[4]}"
            else:
                what = f"expected {short(exp_a, 120)} got {short(got_a, 800)}"
            details.append(f"{verdict} [{where}] {what}")
            if rank(verdict) > rank(worst):
                worst = verdict
    details.sort(key=lambda line: -rank(line))  # the worst first
    return worst, details


def rank(verdict: str) -> int:
    """same < clean < WRONG < killed < hang (the first of a rank is kept)."""
    for n, start in enumerate(("same", "clean", "WRONG", "killed", "hang")):
        if verdict.startswith(start):
            return n
    return 2


# -- the child process ---------------------------------------------------------------------
def child_main(conn: Any, job: dict[str, Any]) -> None:
    """Run ``job["shapes"]`` over ``job["root"]`` (module docstring). ``job["expected"]``
    None: the undamaged run, whose answers are sent back."""
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    os.environ["IQKIT_CACHE"] = job["cache"]
    reader = Reader(job["root"], job.get("stores"))
    for shape in job["shapes"]:
        conn.send(("start", shape))
        started = time.monotonic()
        before = os.fstat(log).st_size
        try:
            got = SHAPES[shape](reader)
        except Exception as exc:
            got = {f"{shape} (the shape itself)": ("", raised(exc))}
        seconds = time.monotonic() - started
        sys.stdout.flush()
        sys.stderr.flush()
        printed = _printed_since(job["log"], before)
        if job["expected"] is None:
            conn.send(("done", shape, "baseline", [printed] if printed else [], seconds, got))
            continue
        verdict, details = classify(shape, job["expected"][shape], got, job["damage"])
        if "Traceback (most recent call last)" in printed:
            details.append(f"WRONG:traceback printed\n{printed[-3000:]}")
            verdict = verdict if verdict.startswith("WRONG") else "WRONG:traceback printed"
        conn.send(("done", shape, verdict, details, seconds, None))
    conn.send(("end",))
    conn.close()


def _printed_since(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(200_000).decode("utf-8", "replace")
