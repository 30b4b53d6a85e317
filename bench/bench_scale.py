"""Stores that keep changing (issue 36): a base plus 8 deltas, as readers see them, at
1M to 50M keys, against DuckDB over one zstd Parquet file of the same live rows.

    .venv/bin/python bench/bench_scale.py [--sizes 1m,10m,50m] [--work /tmp/iq/scalebench]

The shape (the issue's): ``StoreWriter``, 8 partitions, string keys, JSON records
``{total: random float, n: int, region: str}`` (floats uniform in [0, 1000), 200 region
names of random letters), no declared value schema; a base commit of N keys, then 8
delta commits, each updating 1% and deleting 0.1% of the live keys, drawn at random.
That is the longest chain today's policy keeps: a 9th delta compacts, so every reader
figure is taken before it. Rows are written with ``StoreWriter.put_table`` when it
exists, else with ``put`` (minutes at 10M). Each store is built once under ``--work``
and reused while its ``shape.json`` names the same shape; the Parquet reference file is
the store's own scan (``store_batches``), streamed to one zstd file.

Every figure where "first" or "fresh" matters comes from a fresh child process with an
empty ``IQKIT_CACHE`` (its modules imported, bytecode compiled, and the engine or
DuckDB connection opened first: those are a process's costs, bench_startup.py's), timed
inside the child from before the query to the result; the reference side runs in a
fresh child too. Where iqkit's side makes a DuckDB connection inside the timing (a new
``SQLSession``: the SQL aggregate and the join), the reference's new connection is timed
too (a new in-memory DuckDB database, ~30-40 ms, either way).
Writes and commits run on a copy of the store (SSTs hard-linked) whose newest version
record is dropped: its first commit is a 1% delta, its second the one that would compact.
Peak RSS is the child's ``VmHWM`` (``/proc/self/status``), next to its RSS before the
writer opened. Prints one table per size and writes them into BENCHMARKS.md's section
"Stores that keep changing (issue 36)" (a re-run replaces the tables of the sizes run).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_core import paired, print_table
from bench_explore import commit, fmt, row

import iqkit
from iqkit import ChangesQuery, KeyQuery, StateQueryRequest, StoreWriter

STORE = "scale"
SHAPE = {"partitions": 8, "deltas": 8, "update": 0.01, "delete": 0.001, "seed": 36}
CHUNK = 1_000_000  # rows generated (and handed to the writer) at a time
PUT_ROWS = 1_000_000  # rows the puts-rate child writes (a rate; the store's size aside)
FRAME = 10_000  # rows of the joined DataFrame
LOOKUPS = 10_000  # keys of the KeyQuery loop
AGG = "SELECT region, sum(total) AS total, count(*) AS n FROM {t} GROUP BY region ORDER BY region"
JOIN = "SELECT t.key, t.total, p.name FROM {t} t JOIN people p ON p.key = t.key"
BENCH_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
SECTION = "## Stores that keep changing (issue 36) — `bench/bench_scale.py`"
Row = tuple[str, str, str, str, str]


# -- the data ---------------------------------------------------------------------------
def regions(rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, size=rng.integers(4, 15))) for _ in range(200)]


def keys_of(ids: np.ndarray) -> pa.Array:
    digits = pc.utf8_lpad(pa.array(ids).cast(pa.string()), 9, "0")
    return pc.binary_join_element_wise("user", digits, "")


def records(ids: np.ndarray, rng: np.random.Generator, names: list[str]) -> pa.Table:
    """Rows for ``ids``: ``id`` (the key), ``total``, ``n``, ``region``, fresh random values."""
    return pa.table(
        {
            "id": keys_of(ids),
            "total": rng.random(len(ids)) * 1000,
            "n": rng.integers(0, 1000, len(ids)),
            "region": pa.array(names, pa.string()).take(rng.integers(0, len(names), len(ids))),
        }
    )


def write_rows(writer: StoreWriter, table: pa.Table) -> None:
    """``table`` into ``writer``: one bulk call when the writer has it, else a put per row
    of a JSON record (a user's loop)."""
    if hasattr(StoreWriter, "put_table"):
        writer.put_table(table, key="id")
        return
    put = writer.put
    for start in range(0, table.num_rows, 100_000):  # Python values a slice at a time
        part = table.slice(start, 100_000).to_pydict()
        for k, t, n, r in zip(part["id"], part["total"], part["n"], part["region"], strict=True):
            put(k, {"total": t, "n": n, "region": r})


def memory_kib(field: str) -> int:
    """``VmHWM`` (peak) or ``VmRSS`` of this process, KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


# -- building (once per shape) -----------------------------------------------------------
def build(folder: Path, n: int) -> dict[str, Any]:
    """The store of ``n`` keys (base + deltas), its Parquet reference, the joined frame
    and the key sample; runs in a child (its peak RSS is the base commit's)."""
    rng = np.random.default_rng(SHAPE["seed"])
    names = regions(rng)
    root = folder / "root"
    root.mkdir()
    iqkit.create_store(
        root, STORE, partitions=SHAPE["partitions"], key_serde="string", value_serde="json"
    )
    rss_before = memory_kib("VmRSS")
    write_s = 0.0
    with StoreWriter(root, STORE) as w:
        for start in range(0, n, CHUNK):
            table = records(np.arange(start, min(n, start + CHUNK)), rng, names)
            t0 = time.perf_counter()
            write_rows(w, table)
            write_s += time.perf_counter() - t0
        t0 = time.perf_counter()
    base = {
        "version": w.version,
        "write_s": write_s,
        "commit_s": time.perf_counter() - t0,
        "peak_kib": memory_kib("VmHWM"),
        "rss_before_kib": rss_before,
    }
    live = np.ones(n, dtype=bool)
    versions = [w.version]
    for _ in range(SHAPE["deltas"]):
        updates, deletes = delta_ids(rng, live, n)
        table = records(updates, rng, names)
        with StoreWriter(root, STORE) as w:
            write_rows(w, table)
            for key in keys_of(deletes).to_pylist():
                w.delete(key)
        live[deletes] = False
        versions.append(w.version)
    sample = table.slice(0, LOOKUPS // 2)  # the last delta's values, known here
    expected = dict(zip(sample["id"].to_pylist(), sample["total"].to_pylist(), strict=True))
    others = keys_of(rng.choice(np.flatnonzero(live), LOOKUPS - len(expected), replace=False))
    people = keys_of(rng.choice(np.flatnonzero(live), FRAME, replace=False))
    pq.write_table(
        pa.table({"key": people, "name": pc.binary_join_element_wise("person ", people, "")}),
        folder / "people.parquet",
    )
    rows = reference_parquet(root, folder / "reference.parquet")
    if rows != int(live.sum()):
        sys.exit(f"the store holds {rows:,} live rows, the builder wrote {int(live.sum()):,}")
    return {
        "base": base,
        "versions": versions,
        "live": rows,
        "changed": len(updates) + len(deletes),
        "expected": expected,
        "other_keys": others.to_pylist(),
        "writer": "put_table" if hasattr(StoreWriter, "put_table") else "put",
        "built_by": commit(),
    }


def delta_ids(rng: np.random.Generator, live: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """A delta's keys: 1% of ``n`` to update and 0.1% to delete, distinct live keys."""
    upd, dele = round(n * SHAPE["update"]), round(n * SHAPE["delete"])
    chosen = rng.choice(np.flatnonzero(live), upd + dele, replace=False)
    return np.sort(chosen[:upd]), chosen[upd:]


def reference_parquet(root: Path, path: Path) -> int:
    """The store's scan streamed into one zstd Parquet file by DuckDB's COPY (its row
    groups DuckDB's default size); its row count."""
    from iqkit.tables import store_batches

    with tempfile.TemporaryDirectory() as cache:
        os.environ["IQKIT_CACHE"] = cache
        with iqkit.open(root) as engine:
            con = duckdb_connect()
            con.register("scan", store_batches(engine, STORE))
            con.execute(f"COPY scan TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
    return pq.ParquetFile(path).metadata.num_rows


# -- the measurements, each in a fresh child ----------------------------------------------
def first_aggregate(folder: Path, side: str) -> dict[str, Any]:
    """The aggregate once, as a fresh process runs it: a new ``SQLSession``, as
    ``iqkit.sql`` makes (its DuckDB connection included), or a new DuckDB connection
    (~30-40 ms, a new in-memory database either way); then again on the same session
    or connection (median of 3)."""
    handle = opened(folder, side) if side == "iqkit" else None
    t0 = time.perf_counter()
    if side == "iqkit":
        from iqkit.sqlsession import SQLSession

        session = SQLSession(engine=handle)
        run = lambda: session.query(AGG.format(t=STORE))  # noqa: E731
    else:
        con = duckdb_connect()
        run = lambda: con.sql(AGG.format(t=parquet(folder))).df()  # noqa: E731
    first = run()
    took = time.perf_counter() - t0
    again = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        again.append(time.perf_counter() - t0)
    return {"s": took, "again_s": sorted(again)[1], "rows": first.values.tolist()}


def to_arrow(folder: Path, side: str) -> dict[str, Any]:
    """The whole store as one Arrow table."""
    from iqkit.tables import store_batches

    handle = opened(folder, side)
    t0 = time.perf_counter()
    if side == "iqkit":
        table = store_batches(handle, STORE).read_all()
    else:
        table = handle.sql(f"SELECT * FROM {parquet(folder)}").to_arrow_table()
    return {"s": time.perf_counter() - t0, "rows": table.num_rows}


def join(folder: Path, side: str) -> dict[str, Any]:
    """The store joined with a 10,000-row pandas DataFrame of keys: ``iqkit.sql`` (a new
    session each call), or a new DuckDB connection (as ``first_aggregate``)."""
    people = pd_read(folder / "people.parquet")
    handle = opened(folder, side) if side == "iqkit" else None
    t0 = time.perf_counter()
    if side == "iqkit":
        out = iqkit.sql(JOIN.format(t=STORE), engine=handle, people=people)
    else:
        con = duckdb_connect()
        con.register("people", people)
        out = con.sql(JOIN.format(t=parquet(folder))).df()
    return {"s": time.perf_counter() - t0, "rows": len(out), "total": float(out["total"].sum())}


def puts(folder: Path, side: str) -> dict[str, Any]:
    """Puts of ``PUT_ROWS`` JSON records into a new store (a rate: the store's size
    aside), then its commit."""
    n = json.loads((folder / "shape.json").read_text())["keys"]
    rng = np.random.default_rng(1)
    table = records(np.arange(min(n, PUT_ROWS)), rng, regions(rng)).to_pydict()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        iqkit.create_store(tmp, "puts", partitions=SHAPE["partitions"], value_serde="json")
        with StoreWriter(tmp, "puts") as w:
            t0 = time.perf_counter()
            put = w.put
            columns = (table["id"], table["total"], table["n"], table["region"])
            for k, t, m, r in zip(*columns, strict=True):
                put(k, {"total": t, "n": m, "region": r})
            took = time.perf_counter() - t0
            t0 = time.perf_counter()
    return {"rows": len(table["id"]), "s": took, "commit_s": time.perf_counter() - t0}


def bulk(folder: Path, side: str) -> dict[str, Any]:
    """The bulk call, when the writer has it: the store's size in one commit, ``CHUNK``
    rows a call (as rows arrive from a file or a stream): rows/s, commit s, peak RSS."""
    if not hasattr(StoreWriter, "put_table"):
        return {}
    n = json.loads((folder / "shape.json").read_text())["keys"]
    rng = np.random.default_rng(1)
    names = regions(rng)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        iqkit.create_store(tmp, "bulk", partitions=SHAPE["partitions"], value_serde="json")
        rss_before, took = memory_kib("VmRSS"), 0.0
        with StoreWriter(tmp, "bulk") as w:
            for start in range(0, n, CHUNK):
                chunk = records(np.arange(start, min(n, start + CHUNK)), rng, names)
                t0 = time.perf_counter()
                w.put_table(chunk, key="id")
                took += time.perf_counter() - t0
            t0 = time.perf_counter()
    return {
        "rows": n,
        "s": took,
        "commit_s": time.perf_counter() - t0,
        "peak_kib": memory_kib("VmHWM"),
        "rss_before_kib": rss_before,
    }


def commits(folder: Path, side: str) -> dict[str, Any]:
    """On a copy of the store without its newest version: a 1% delta commit (chain of 9
    files, no compaction), then the next, which would compact."""
    copy = folder / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    link_copy(folder / "root", copy)
    records_dir = copy / STORE / "chain"
    newest = max(records_dir.glob("*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem)))
    newest.unlink()
    n = json.loads((folder / "shape.json").read_text())["keys"]
    rng = np.random.default_rng(2)
    names = regions(rng)
    out = {}
    background = "compaction" in inspect.signature(StoreWriter).parameters
    try:
        for label in ("delta", "compacting", "background"):
            if label == "background":  # the same commit again, compacting off its path
                if not background:
                    break
                shutil.rmtree(copy)
                link_copy(folder / "root", copy)
                newest.unlink()
                commit_once(copy, n, rng, names)  # the chains of 9 files again
            got = commit_once(copy, n, rng, names, compaction=label == "background")
            out[label] = got
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return out


def commit_once(
    root: Path, n: int, rng: Any, names: Any, *, compaction: bool = False
) -> dict[str, Any]:
    """One 1% update commit (``compaction``: with ``compaction="background"``, whose
    compaction is then waited for and timed apart)."""
    upd = rng.choice(n, round(n * SHAPE["update"]), replace=False)
    gone = keys_of(rng.choice(n, round(n * SHAPE["delete"]), replace=False)).to_pylist()
    table = records(np.sort(upd), rng, names)
    extra = {"compaction": "background"} if compaction else {}
    with StoreWriter(root, STORE, **extra) as w:
        t0 = time.perf_counter()
        write_rows(w, table)
        for key in gone:
            w.delete(key)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
    got = {"write_s": write_s, "commit_s": time.perf_counter() - t0, "files": chain_files(root)}
    if compaction and w.compacting is not None:
        t0 = time.perf_counter()
        w.compacting.join()
        got["compaction_s"] = time.perf_counter() - t0
        got["files_after"] = chain_files(root)
    return got


def latest_chains(root: Path) -> list[Any]:
    """The partition chains of the store's latest version."""
    from iqkit.store.chain.records import latest_version
    from iqkit.store.objects import open_objects

    return list(latest_version(open_objects(root), STORE).partitions.values())


def chain_files(root: Path) -> int:
    """The longest partition chain of the store's latest version, in files."""
    return max(len(chain.files) for chain in latest_chains(root))


def link_copy(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst``: immutable SSTs and twins hard-linked, the rest (records,
    manifest, lock files) copied, so nothing the copy writes reaches ``src``."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif "sst" in path.relative_to(src).parts:
            os.link(path, target)
        else:
            shutil.copy2(path, target)


def changes(folder: Path, side: str) -> dict[str, Any]:
    """``ChangesQuery`` of the newest (1% delta) commit, over every partition."""
    newest = json.loads((folder / "shape.json").read_text())["versions"][-1]
    request = StateQueryRequest.in_store(STORE).with_query(ChangesQuery.between(newest - 1, newest))
    engine = opened(folder, side)
    t0 = time.perf_counter()
    results = engine.query(request).partition_results
    found = sum(len(r.result) for r in results.values() if r.is_success)
    return {"s": time.perf_counter() - t0, "changes": found}


def key_queries(folder: Path, side: str) -> dict[str, Any]:
    """The first routed KeyQuery of the version, then a warm loop over ``LOOKUPS`` keys
    (requests built once) against raw rocksdict ``get`` on the same databases."""
    from iqkit.store.cache import FileCache
    from iqkit.store.chain.read import database_folder
    from iqkit.store.chain.records import latest_version
    from iqkit.store.encoding.keyspace import kv_key
    from iqkit.store.objects import open_objects
    from iqkit.store.partitions import rocks

    shape = json.loads((folder / "shape.json").read_text())
    expected: dict[str, float] = shape["expected"]
    keys = [*expected, *shape["other_keys"]]
    requests = [
        StateQueryRequest.in_store(STORE).with_query(KeyQuery.with_key(k).skip_cache())
        for k in keys
    ]
    root = folder / "root"
    engine = opened(folder, side)
    t0 = time.perf_counter()
    engine.query(requests[0]).only_partition_result()
    first_s = time.perf_counter() - t0
    where = {}
    for key, request in zip(keys, requests, strict=True):  # twice: the databases get built
        engine.query(request)
        (p, result), *_ = engine.query(request).partition_results.items()
        value = result.result
        if value is None or (key in expected and value["total"] != expected[key]):
            sys.exit(f"KeyQuery({key!r}) returned {value!r}")
        where[key] = p
    objects = open_objects(root)
    chains = latest_version(objects, STORE).partitions
    dbs = {
        p: rocks.open_for_read(database_folder(FileCache(), objects, STORE, p, chain))
        for p, chain in chains.items()
    }
    raw = [(dbs[where[k]].get, kv_key(k.encode())) for k in keys]

    def raw_gets() -> None:
        for get, key in raw:
            get(key)

    def engine_gets() -> None:
        query = engine.query
        for request in requests:
            query(request)

    t_raw, t_iq = paired(raw_gets, engine_gets, 7)
    return {"first_s": first_s, "warm_s": t_iq / len(keys), "raw_s": t_raw / len(keys)}


CASES = {
    f.__name__: f
    for f in (first_aggregate, to_arrow, join, puts, bulk, commits, changes, key_queries)
}


def opened(folder: Path, side: str) -> Any:
    """The side's handle, opened before any timing: an engine on the store's root (its
    format module loaded: a process's cost, bench_startup.py's), or a DuckDB connection."""
    return iqkit.open(folder / "root") if side == "iqkit" else duckdb_connect()


def duckdb_connect() -> Any:
    import duckdb

    return duckdb.connect(":memory:")


def pd_read(path: Path) -> Any:
    import pandas as pd

    return pd.read_parquet(path)


def parquet(folder: Path) -> str:
    return f"read_parquet('{folder / 'reference.parquet'}')"


def child_env(folder: Path, cache: str) -> dict[str, str]:
    """A child's environment: this iqkit, an empty ``IQKIT_CACHE``, and bytecode kept
    under ``--work`` (as an installed package has it; without it every lazily imported
    module would be compiled inside the timings)."""
    env = {
        **os.environ,
        "IQKIT_CACHE": cache,
        "PYTHONPATH": os.fspath(Path(iqkit.__file__).parents[1]),
        "PYTHONPYCACHEPREFIX": os.fspath(folder.parent / "pycache"),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def child(case: str, folder: Path, side: str = "iqkit") -> dict[str, Any]:
    """``case`` run in a fresh Python process with an empty ``IQKIT_CACHE``; its result."""
    with tempfile.TemporaryDirectory(dir=folder) as cache:
        args = [sys.executable, __file__, "--child", case, "--side", side, "--work", str(folder)]
        done = subprocess.run(args, env=child_env(folder, cache), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{case} ({side}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def compile_iqkit(folder: Path) -> None:
    """iqkit's bytecode written where the children look for it, before any timing."""
    package = os.fspath(Path(iqkit.__file__).parent)
    args = [sys.executable, "-m", "compileall", "-q", package]
    subprocess.run(args, env=child_env(folder, ""), check=True)


# -- the table ---------------------------------------------------------------------------
def prepare(work: Path, n: int) -> dict[str, Any]:
    """The store of ``n`` keys under ``work``: reused when its ``shape.json`` matches."""
    folder = work / f"{n // 1_000_000}m" if n % 1_000_000 == 0 else work / str(n)
    shape_file = folder / "shape.json"
    if shape_file.exists():
        shape = json.loads(shape_file.read_text())
        if {k: shape.get(k) for k in (*SHAPE, "keys")} == {**SHAPE, "keys": n}:
            return {**shape, "folder": folder}
    print(f"building {n:,} keys under {folder} ...", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    built = child("build", folder, str(n))
    shape = {**SHAPE, "keys": n, **built, "build_s": time.perf_counter() - t0}
    shape_file.write_text(json.dumps(shape))
    return {**shape, "folder": folder}


def measure(shape: dict[str, Any], repeat: int) -> list[Row]:
    """The table's rows; each reader figure the median of ``repeat`` fresh children."""
    folder = shape["folder"]
    out: list[Row] = []
    compile_iqkit(folder)

    def reader(case: str, side: str = "iqkit") -> dict[str, Any]:
        runs = [child(case, folder, side) for _ in range(repeat)]
        timed = [k for k in runs[0] if k == "s" or k.endswith("_s")]
        return {**runs[-1], **{k: statistics.median(r[k] for r in runs) for k in timed}}

    agg = {side: reader("first_aggregate", side) for side in ("iqkit", "duckdb")}
    if not same_rows(agg["iqkit"]["rows"], agg["duckdb"]["rows"]):
        sys.exit("the aggregate differs between iqkit and DuckDB")
    iq, ref = agg["iqkit"], agg["duckdb"]
    out.append(row("first `iqkit.sql` aggregate of the version", iq["s"], ref["s"], "DuckDB", 2))
    again = "the same aggregate again, same session"
    out.append(row(again, iq["again_s"], ref["again_s"], "DuckDB", 1.3))
    for case, label, target in (
        (to_arrow, "the whole store to Arrow (`store_batches(...).read_all()`)", 1.5),
        (join, f"join with a {FRAME:,}-row pandas DataFrame (`iqkit.sql`)", 2),
    ):
        iq, ref = (reader(case.__name__, side) for side in ("iqkit", "duckdb"))
        same = math.isclose(iq.get("total", 0), ref.get("total", 0), rel_tol=1e-9)
        if iq["rows"] != ref["rows"] or not same:
            sys.exit(f"{case.__name__} differs between iqkit and DuckDB: {iq} vs {ref}")
        out.append(row(label, iq["s"], ref["s"], "DuckDB", target))
    writes = {"puts": child("puts", folder), "bulk": child("bulk", folder)}
    out += writer_rows(shape, {k: v for k, v in writes.items() if v})
    out += commit_rows(shape, child("commits", folder), reader("changes"))
    out += lookup_rows(reader("key_queries"))
    out.append(bytes_row(folder))
    return out


def same_rows(a: list[list[Any]], b: list[list[Any]]) -> bool:
    return len(a) == len(b) and all(
        ra[0] == rb[0] and math.isclose(ra[1], rb[1], rel_tol=1e-9) and ra[2] == rb[2]
        for ra, rb in zip(a, b, strict=True)
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def single(label: str, figure: str, target: str, met: bool, note: str = "") -> Row:
    """A row with no reference run: the figure against its target alone."""
    return (label, figure, note, "", f"{target} {verdict(met)}")


def rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1000:,.0f}k rows/s"


def gib(kib: int) -> str:
    return f"{kib / 2**20:.2f} GiB" if kib >= 2**20 else f"{kib / 1024:.0f} MiB"


def writer_rows(shape: dict[str, Any], got: dict[str, Any]) -> list[Row]:
    calls = {
        "puts": ("`StoreWriter.put` of JSON records", "≥ 300k rows/s", 300_000),
        "bulk": (
            f"`StoreWriter.put_table` from Arrow, ≤ {CHUNK:,} rows a call",
            "≥ 2M rows/s",
            2e6,
        ),
    }
    out = [
        single(
            f"{what} ({got[call]['rows']:,} rows; then commit {fmt(got[call]['commit_s'])})",
            rate(got[call]["rows"], got[call]["s"]),
            target,
            got[call]["rows"] / got[call]["s"] >= floor,
        )
        for call, (what, target, floor) in calls.items()
        if call in got
    ]
    if "bulk" in got:
        peak, before, what = (
            got["bulk"]["peak_kib"],
            got["bulk"]["rss_before_kib"],
            "that bulk commit",
        )
    else:
        out.append(("`StoreWriter.put_table` (bulk call)", "absent", "", "", "≥ 2M rows/s"))
        peak, before = shape["base"]["peak_kib"], shape["base"]["rss_before_kib"]
        what = "the base commit (at build, puts)"
    out.append(
        single(
            f"peak RSS of {what}, {shape['keys']:,} rows in one commit",
            gib(peak),
            "≤ 1.5 GB at 50M",
            peak * 1024 <= 1.5e9,
            note=f"{gib(before)} before the writer",
        )
    )
    return out


def commit_rows(shape: dict[str, Any], got: dict[str, Any], ch: dict[str, Any]) -> list[Row]:
    if ch["changes"] != shape["changed"]:
        sys.exit(f"ChangesQuery found {ch['changes']:,} changes, not {shape['changed']:,}")
    pairs = [("1% update commit", got["delta"]), ("the next, the 9th delta", got["compacting"])]
    if "background" in got:
        bg = got["background"]
        pairs.append(
            (
                'the 9th delta, `compaction="background"` (its compaction then took '
                f"{fmt(bg.get('compaction_s', 0.0))}, chains of {bg.get('files_after')} files)",
                bg,
            )
        )
    return [
        *(
            single(
                f"{label} (1% updates, 0.1% deletes; chains of {c['files']} files after)",
                fmt(c["commit_s"]),
                "≤ 3 s at 50M",
                c["commit_s"] <= 3,
                note=f"writes before it {fmt(c['write_s'])}",
            )
            for label, c in pairs
        ),
        single(
            f"`ChangesQuery` of the 1% commit ({ch['changes']:,} changes), fresh process",
            fmt(ch["s"]),
            "≤ 1 s",
            ch["s"] <= 1,
        ),
    ]


def lookup_rows(got: dict[str, Any]) -> list[Row]:
    allowed = 2 * got["warm_s"] + 0.005
    return [
        row(
            f"warm routed KeyQuery ({LOOKUPS:,} keys, requests built once)",
            got["warm_s"],
            got["raw_s"],
            "rocksdict `get`",
            5,
        ),
        single(
            "first KeyQuery of the version, fresh process",
            fmt(got["first_s"]),
            f"≤ 2× warm + 5 ms = {fmt(allowed)}",
            got["first_s"] <= allowed,
        ),
    ]


def bytes_row(folder: Path) -> Row:
    chains = latest_chains(folder / "root")
    store = sum(f.size + (f.twin or 0) for chain in chains for f in chain.files)
    twins = sum(f.twin or 0 for chain in chains for f in chain.files)
    ref = (folder / "reference.parquet").stat().st_size
    return (
        f"store bytes: SSTs + twins of the latest version (twins {twins / 2**20:,.0f} MiB)",
        f"{store / 2**20:,.0f} MiB",
        f"{ref / 2**20:,.0f} MiB (zstd Parquet)",
        f"{store / ref:.1f}×",
        "≤ 2.5× " + verdict(store / ref <= 2.5),
    )


def write_markdown(tables: dict[int, str]) -> None:
    """The section in BENCHMARKS.md: its tables of the sizes run replaced, others kept."""
    text = BENCH_MD.read_text()
    head, found, rest = text.partition(SECTION)
    body, nxt, tail = rest.partition("\n## ")
    kept = dict(re.findall(r"(?ms)^### (\S+) keys\n(.*?)(?=^### |\Z)", body)) if found else {}
    kept.update({f"{n:,}": t for n, t in tables.items()})
    ordered = sorted(kept.items(), key=lambda kv: int(kv[0].replace(",", "")))
    section = (
        f"{SECTION}\n\nIssue 36's shape (8 partitions, JSON records with no declared schema, "
        "a base plus 8 deltas of 1% updates and 0.1% deletes, read before the compaction a 9th "
        "delta runs) against DuckDB over one zstd Parquet file of the same live rows; every "
        "figure from a fresh child process (the docstring of `bench/bench_scale.py` says how). "
        "Targets marked *at 50M* are the issue's for 50M keys, shown at every size for the "
        "trend. One table per size, each from one run (a re-run replaces its size's).\n\n"
        + "".join(f"### {size} keys\n{t.strip()}\n\n" for size, t in ordered)
    )
    if not found:
        BENCH_MD.write_text(text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n")
    else:
        BENCH_MD.write_text(head + section.rstrip("\n") + "\n" + (nxt + tail if nxt else ""))


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([km]?)", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"a size is like 1m, 500k or 2000000, got {text!r}")
    return int(m[1]) * {"": 1, "k": 1_000, "m": 1_000_000}[m[2]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m", help="comma-separated: 1m,10m,50m")
    parser.add_argument("--work", type=Path, default=Path("/tmp/iq/scalebench"))
    parser.add_argument("--no-markdown", action="store_true", help="print only")
    parser.add_argument(
        "--repeat", type=int, default=1, help="fresh children per reader figure (median)"
    )
    parser.add_argument("--build-only", action="store_true", help="only build the stores")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="iqkit", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "build":
        print(json.dumps(build(args.work, int(args.side))))
        return
    if args.child:
        # Loaded before any timing, as in a notebook that has run a cell: the figures are
        # the query's, not Python's imports (bench_startup.py measures those).
        for module in ("duckdb", "pandas", "iqkit.engine", "iqkit.sqlsession", "iqkit.tables"):
            importlib.import_module(module)
        print(json.dumps(CASES[args.child](args.work, args.side)))
        return
    tables = {}
    for n in (parse_size(s) for s in args.sizes.split(",")):
        shape = prepare(args.work, n)
        if args.build_only:
            continue
        table = measure(shape, args.repeat)
        note = (
            f"commit {commit()}; {n:,} keys, {SHAPE['partitions']} partitions, base + "
            f"{SHAPE['deltas']} deltas ({shape['live']:,} live rows; built by "
            f"{shape['built_by']} with `{shape['writer']}`, "
            f"base written at {rate(n, shape['base']['write_s'])}, committed in "
            f"{fmt(shape['base']['commit_s'])}); reader figures the median of {args.repeat} "
            f"fresh children; load average {os.getloadavg()[0]:.1f}"
        )
        lines: list[str] = []
        print_table("scaling", note, table, out=lines.append)
        print("\n".join(lines))
        tables[n] = "\n".join(lines[1:])
    if tables and not args.no_markdown:
        write_markdown(tables)


if __name__ == "__main__":
    main()
