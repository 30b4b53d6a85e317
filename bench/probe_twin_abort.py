"""Which Parquet reader aborts the process on a damaged columnar twin, and on what input.

    .venv/bin/python bench/probe_twin_abort.py                    # 2,000 random bit flips
    .venv/bin/python bench/probe_twin_abort.py --all              # every bit of the twin
    .venv/bin/python bench/probe_twin_abort.py --flips 500 --readers duckdb,read_table
    .venv/bin/python bench/probe_twin_abort.py --region size_statistics   # every bit there
    .venv/bin/python bench/probe_twin_abort.py --flip 1656:0      # one flip (byte:bit)
    .venv/bin/python bench/probe_twin_abort.py --cost 1000000     # what page CRCs cost
    .venv/bin/python bench/probe_twin_abort.py --replay out/abort-*.parquet   # one input

A store is made as a user makes one (``create_store``, one ``StoreWriter`` commit of 300
JSON records ``{"price", "qty", "tag"}``, 2 partitions); partition 0's twin is then
damaged one bit at a time, each flip in a fresh copy, and read by each reader in a
*child process* (a pool of workers; a worker that dies is replaced), so an abort
(``std::terminate`` -> SIGABRT) or a crash (SIGSEGV) of a C++ reader is recorded, not
suffered. Every outcome is one of:

* ``abort``/``signal``: the child died by SIGABRT / another signal (its stderr kept);
* ``error``: a clean Python exception (its type and first line kept);
* ``wrong``: rows (or column names/types) that differ from the undamaged file's;
* ``correct``: the undamaged file's rows (the flip hit something the reader ignores);
* ``hang``: no answer within ``--timeout`` seconds.

Readers (``--readers``; the pyarrow ones also run with ``+crc``, i.e.
``page_checksum_verification=True``):

* ``read_table``: ``pq.read_table(path)``;
* ``row_groups``: ``pq.ParquetFile(path).read_row_group(i)`` for each group, no
  metadata touched beyond what opening the file reads;
* ``iter_batches``: ``pq.ParquetFile(path).iter_batches(batch_size=64)``;
* ``stats_then_read``: the footer's every column chunk's statistics read first
  (``metadata.to_dict()``, as a planner does), then ``read_row_groups``;
* ``footer_walk``: ``pq.read_metadata(path)``, then ``row_group(g).column(c).statistics``
  of every column chunk and nothing else (what iqkit's planners do with a footer:
  ``scan._Footer.read``, ``columns._has_live_rows``);
* ``twinscan``: iqkit's own pyarrow reader (``TwinScan``) over the file alone, with the
  options its call sites pass (so ``+crc`` is not run for it);
* ``duckdb``: ``duckdb.sql("select * from read_parquet(path)")``;
* ``iqkit_sql``: (not by default) the whole store copied, the twin damaged in place and
  ``iqkit.sql("SELECT key, price, qty, tag FROM t")`` run on a fresh cache: what a user
  sees, with whatever checks the store's readers make.

Every flip is located in the file (``layout``): the magic, a page header (which field),
a page body, or the footer's Thrift structure (which field of which column chunk), so an
abort is reported with the structure it hit. The report is printed and written as JSON
(``--out``); each input that killed a reader is saved beside it (``abort-*.parquet``).

``--cost N`` instead times what page checksums cost: a twin of N rows (the probe's
columns) written by ``twins.write_twin`` with and without ``write_page_checksum``, and
scanned by ``TwinScan`` with and without ``page_checksum_verification``, by
``pq.read_table`` both ways, and by DuckDB (which reads the CRCs of neither).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

PYARROW_READERS = ("read_table", "row_groups", "iter_batches", "stats_then_read", "footer_walk")
_CRC = [r + "+crc" for r in PYARROW_READERS if r != "footer_walk"]  # footers have no CRC
DEFAULT_READERS = (*PYARROW_READERS, *_CRC, "twinscan", "duckdb")
QUERY = "SELECT key, price, qty, tag FROM t"

# --------------------------------------------------------------------------------------
# Where a byte of a Parquet file lies: a minimal Thrift compact-protocol walker that
# records every field's byte span, named by parquet.thrift's field names.
# --------------------------------------------------------------------------------------

_STATISTICS = {
    1: ("max", None), 2: ("min", None), 3: ("null_count", None), 4: ("distinct_count", None),
    5: ("max_value", None), 6: ("min_value", None), 7: ("is_max_value_exact", None),
    8: ("is_min_value_exact", None),
}  # fmt: skip
_SIZE_STATISTICS = {
    1: ("unencoded_byte_array_data_bytes", None),
    2: ("repetition_level_histogram", None),
    3: ("definition_level_histogram", None),
}
_KEY_VALUE = {1: ("key", None), 2: ("value", None)}
_ENCODING_STATS = {1: ("page_type", None), 2: ("encoding", None), 3: ("count", None)}
_COLUMN_META = {
    1: ("type", None), 2: ("encodings", None), 3: ("path_in_schema", None), 4: ("codec", None),
    5: ("num_values", None), 6: ("total_uncompressed_size", None),
    7: ("total_compressed_size", None), 8: ("key_value_metadata", _KEY_VALUE),
    9: ("data_page_offset", None), 10: ("index_page_offset", None),
    11: ("dictionary_page_offset", None), 12: ("statistics", _STATISTICS),
    13: ("encoding_stats", _ENCODING_STATS), 14: ("bloom_filter_offset", None),
    15: ("bloom_filter_length", None), 16: ("size_statistics", _SIZE_STATISTICS),
    17: ("geospatial_statistics", None),
}  # fmt: skip
_COLUMN_CHUNK = {
    1: ("file_path", None), 2: ("file_offset", None), 3: ("meta_data", _COLUMN_META),
    4: ("offset_index_offset", None), 5: ("offset_index_length", None),
    6: ("column_index_offset", None), 7: ("column_index_length", None),
    8: ("crypto_metadata", None), 9: ("encrypted_column_metadata", None),
}  # fmt: skip
_ROW_GROUP = {
    1: ("columns", _COLUMN_CHUNK), 2: ("total_byte_size", None), 3: ("num_rows", None),
    4: ("sorting_columns", None), 5: ("file_offset", None),
    6: ("total_compressed_size", None), 7: ("ordinal", None),
}  # fmt: skip
_SCHEMA_ELEMENT = {
    1: ("type", None), 2: ("type_length", None), 3: ("repetition_type", None),
    4: ("name", None), 5: ("num_children", None), 6: ("converted_type", None),
    7: ("scale", None), 8: ("precision", None), 9: ("field_id", None),
    10: ("logicalType", None),
}  # fmt: skip
_FILE_META = {
    1: ("version", None), 2: ("schema", _SCHEMA_ELEMENT), 3: ("num_rows", None),
    4: ("row_groups", _ROW_GROUP), 5: ("key_value_metadata", _KEY_VALUE),
    6: ("created_by", None), 7: ("column_orders", None), 8: ("encryption_algorithm", None),
    9: ("footer_signing_key_metadata", None),
}  # fmt: skip
_DATA_PAGE = {
    1: ("num_values", None), 2: ("encoding", None), 3: ("definition_level_encoding", None),
    4: ("repetition_level_encoding", None), 5: ("statistics", _STATISTICS),
}  # fmt: skip
_DATA_PAGE_V2 = {
    1: ("num_values", None), 2: ("num_nulls", None), 3: ("num_rows", None),
    4: ("encoding", None), 5: ("definition_levels_byte_length", None),
    6: ("repetition_levels_byte_length", None), 7: ("is_compressed", None),
    8: ("statistics", _STATISTICS),
}  # fmt: skip
_DICT_PAGE = {1: ("num_values", None), 2: ("encoding", None), 3: ("is_sorted", None)}
_PAGE_HEADER = {
    1: ("type", None), 2: ("uncompressed_page_size", None), 3: ("compressed_page_size", None),
    4: ("crc", None), 5: ("data_page_header", _DATA_PAGE), 6: ("index_page_header", None),
    7: ("dictionary_page_header", _DICT_PAGE), 8: ("data_page_header_v2", _DATA_PAGE_V2),
}  # fmt: skip
_COLUMN_INDEX = {
    1: ("null_pages", None), 2: ("min_values", None), 3: ("max_values", None),
    4: ("boundary_order", None), 5: ("null_counts", None),
    6: ("repetition_level_histograms", None), 7: ("definition_level_histograms", None),
}  # fmt: skip
_OFFSET_INDEX = {
    1: ("page_locations", {1: ("offset", None), 2: ("compressed_page_size", None),
                           3: ("first_row_index", None)}),
    2: ("unencoded_byte_array_data_bytes", None),
}  # fmt: skip
_PAGE_TYPES = {0: "DATA_PAGE", 1: "INDEX_PAGE", 2: "DICTIONARY_PAGE", 3: "DATA_PAGE_V2"}


class _Thrift:
    """Walks one compact-protocol struct at ``pos`` of ``buf``; ``spans`` gets
    ``(start, end, path)`` for every field, list element and struct; ``values`` the
    scalar values by path (for the page walk)."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.spans: list[tuple[int, int, str]] = []
        self.values: dict[str, Any] = {}

    def _byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def _varint(self) -> int:
        shift = result = 0
        while True:
            b = self._byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _value(self, ttype: int, path: str, schema: dict | None) -> Any:
        start = self.pos
        if ttype in (1, 2):  # bool in a field header: no bytes
            value: Any = ttype == 1
        elif ttype == 3:
            value = self._byte()
        elif ttype in (4, 5, 6):
            value = self._zigzag()
        elif ttype == 7:
            value = struct.unpack_from("<d", self.buf, self.pos)[0]
            self.pos += 8
        elif ttype == 8:
            n = self._varint()
            value = bytes(self.buf[self.pos : self.pos + n])
            self.pos += n
        elif ttype in (9, 10):
            head = self._byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self._varint()
            value = []
            for i in range(size):
                if etype in (1, 2):  # a bool element is one byte
                    value.append(self._byte() == 1)
                    self.spans.append((self.pos - 1, self.pos, f"{path}[{i}]"))
                else:
                    value.append(self._value(etype, f"{path}[{i}]", schema))
        elif ttype == 11:
            size = self._varint()
            if size:
                kv = self._byte()
                for i in range(size):
                    self._value(kv >> 4, f"{path}{{{i}}}.key", None)
                    self._value(kv & 0x0F, f"{path}{{{i}}}.value", None)
            value = None
        elif ttype == 12:
            value = self.struct(path, schema)
        else:
            raise ValueError(f"thrift type {ttype} at {start}")
        self.spans.append((start, self.pos, path))
        if ttype not in (9, 10, 11, 12):
            self.values[path] = value
        return value

    def struct(self, path: str, schema: dict | None) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            start = self.pos
            head = self._byte()
            if head == 0:
                return fields
            delta, ttype = head >> 4, head & 0x0F
            fid = last + delta if delta else self._zigzag()
            last = fid
            name, sub = (schema or {}).get(fid, (f"field{fid}", None))
            sub_path = f"{path}.{name}" if path else name
            header_end = self.pos
            fields[fid] = self._value(ttype, sub_path, sub)
            self.spans.append((start, header_end, f"{sub_path} (field header)"))
            self.spans.append((start, self.pos, sub_path))


def layout(data: bytes) -> tuple[list[tuple[int, int, str]], dict[str, Any]]:
    """The named byte spans of Parquet file ``data`` (innermost spans are the most
    specific names) and a few facts about it."""
    spans: list[tuple[int, int, str]] = [(0, 4, "magic (head)")]
    n = len(data)
    spans.append((n - 4, n, "magic (tail)"))
    spans.append((n - 8, n - 4, "footer length"))
    (footer_len,) = struct.unpack_from("<I", data, n - 8)
    footer_start = n - 8 - footer_len
    t = _Thrift(data, footer_start)
    meta = t.struct("", _FILE_META)
    spans.append((footer_start, n - 8, "footer"))
    names = [e.get(4, b"?").decode("utf-8", "replace") for e in meta[2]][1:]  # leaves (flat)
    for s, e, p in t.spans:
        spans.append((s, e, "footer." + _name_columns(p, names)))
    facts: dict[str, Any] = {"size": n, "footer_start": footer_start, "footer_len": footer_len}
    pages: list[dict[str, Any]] = []
    for g, rg in enumerate(meta.get(4, [])):
        for c, chunk in enumerate(rg.get(1, [])):
            cm = chunk.get(3, {})
            col = names[c] if c < len(names) else f"col{c}"
            pos = cm.get(11) or cm.get(9)
            end = pos + cm.get(7, 0)
            i = 0
            while pos is not None and pos < end:
                ph = _Thrift(data, pos)
                try:
                    header = ph.struct("", _PAGE_HEADER)
                except (IndexError, ValueError):
                    break
                kind = _PAGE_TYPES.get(header.get(1), "?")
                label = f"page[rg{g} {col} #{i} {kind}]"
                spans.append((pos, ph.pos, f"{label}.header"))
                for s, e, p in ph.spans:
                    spans.append((s, e, f"{label}.header.{p}"))
                body_end = ph.pos + header.get(3, 0)
                spans.append((ph.pos, body_end, f"{label}.body"))
                pages.append({"label": label, "header": [pos, ph.pos], "body": [ph.pos, body_end],
                              "crc": header.get(4)})  # fmt: skip
                pos, i = body_end, i + 1
            for what, off_f, len_f, schema in (
                ("column_index", 6, 7, _COLUMN_INDEX),
                ("offset_index", 4, 5, _OFFSET_INDEX),
            ):
                if chunk.get(off_f) is not None:
                    start, length = chunk[off_f], chunk.get(len_f, 0)
                    spans.append((start, start + length, f"{what}[rg{g} {col}]"))
                    ti = _Thrift(data, start)
                    try:
                        ti.struct("", schema)
                        spans.extend((s, e, f"{what}[rg{g} {col}].{p}") for s, e, p in ti.spans)
                    except (IndexError, ValueError):
                        pass
    facts["pages"] = pages
    facts["columns"] = names
    return spans, facts


def _name_columns(path: str, names: list[str]) -> str:
    """``row_groups[0].columns[2]...`` -> ``row_groups[0].columns[2:price]...``."""
    import re

    return re.sub(
        r"columns\[(\d+)\]",
        lambda m: f"columns[{m[1]}:{names[int(m[1])] if int(m[1]) < len(names) else '?'}]",
        path,
    )


def where(spans: list[tuple[int, int, str]], offset: int) -> str:
    """The innermost named span holding byte ``offset``."""
    best = None
    for s, e, p in spans:
        if s <= offset < e and (best is None or (e - s) < (best[1] - best[0])):
            best = (s, e, p)
    return best[2] if best else "unmapped"


def category(path: str) -> str:
    """A coarse name for a span path, for counting (indices and columns dropped)."""
    import re

    p = path.replace(" (field header)", "")
    if p.startswith("page["):
        kind = "dict page" if "DICTIONARY_PAGE" in p else "data page"
        return f"{kind} body" if p.endswith(".body") else f"{kind} header"
    p = re.sub(r"\[[^\]]*\]|\{[^}]*\}", "", p)
    parts = p.split(".")
    if parts[0] == "footer" and len(parts) > 1:
        if parts[1] == "row_groups":
            tail = [x for x in parts[2:] if x not in ("columns", "meta_data")]
            return "footer.row_groups." + ".".join(tail[:2]) if tail else "footer.row_groups"
        if parts[1] == "key_value_metadata":
            return "footer.key_value_metadata (ARROW:schema, iqkit layout)"
        return "footer." + parts[1]
    return parts[0]


# --------------------------------------------------------------------------------------
# The readers (run in a worker process).
# --------------------------------------------------------------------------------------


def _read(reader: str, path: str, ctx: dict[str, Any]) -> Any:
    """The table ``reader`` reads from ``path`` (compared with the undamaged file's)."""
    crc = reader.endswith("+crc")
    name = reader.removesuffix("+crc")
    if name in PYARROW_READERS:
        import pyarrow as pa
        import pyarrow.parquet as pq

        opts = {"page_checksum_verification": True} if crc else {}
        if name == "footer_walk":
            meta = pq.read_metadata(path)
            found = []
            for g in range(meta.num_row_groups):
                for c in range(meta.num_columns):
                    stats = meta.row_group(g).column(c).statistics
                    found.append(str(stats.min) if stats is not None and stats.has_min_max else "")
            return pa.table({"stats": found})
        if name == "read_table":
            return pq.read_table(path, **opts)
        with pq.ParquetFile(path, **opts) as pf:
            if name == "row_groups":
                return pa.concat_tables(pf.read_row_group(i) for i in range(pf.num_row_groups))
            if name == "iter_batches":
                batches = list(pf.iter_batches(batch_size=64))
                return pa.Table.from_batches(batches, schema=pf.schema_arrow)
            json.dumps(pf.metadata.to_dict(), default=str)  # every chunk's statistics
            for g in range(pf.metadata.num_row_groups):
                for c in range(pf.metadata.num_columns):
                    stats = pf.metadata.row_group(g).column(c).statistics
                    if stats is not None and stats.has_min_max:
                        _ = (stats.min, stats.max)
            return pf.read_row_groups(list(range(pf.num_row_groups)))
    if name == "twinscan":
        from iqkit.store.columnar.scan import TwinScan
        from iqkit.store.encoding.keyspace import KV_LOWER, KV_UPPER

        return TwinScan([path], KV_LOWER, KV_UPPER, manifest=ctx["manifest"]).table()
    if name == "duckdb":
        con = ctx.setdefault("duckdb", None)
        if con is None:
            import duckdb

            con = ctx["duckdb"] = duckdb.connect()
        quoted = path.replace("'", "''")
        return _arrow(con.sql(f"select * from read_parquet('{quoted}')"))
    if name == "iqkit_sql":
        import pyarrow as pa

        import iqkit

        frame = iqkit.sql(QUERY + " ORDER BY key", root=ctx["root_copy"])
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise ValueError(f"unknown reader {reader!r}")


def _arrow(relation: Any) -> Any:
    """A DuckDB relation's rows as one Arrow table (the method's name varies by release)."""
    to_table = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    return to_table()


def _same(got: Any, want: Any) -> bool:
    if got.schema.names != want.schema.names or got.schema.types != want.schema.types:
        return False
    return got.equals(want)


def worker(args: argparse.Namespace) -> None:
    """Read jobs ``{"job", "offset", "bit", "reader"}`` from stdin, one per line; answer
    one line each. A job's file is a fresh copy of the twin with one bit flipped."""
    original = Path(args.twin).read_bytes()
    scratch = Path(tempfile.mkdtemp(prefix="probe-worker-", dir=args.scratch))
    ctx: dict[str, Any] = {}
    if args.store_root:
        from iqkit.store.manifest import StoreManifest

        root = Path(args.store_root)
        ctx["manifest"] = StoreManifest.from_json((root / "t" / "manifest.json").read_text())
    refs: dict[str, Any] = {}
    for n, line in enumerate(sys.stdin, 1):
        job = json.loads(line)
        reader = job["reader"]
        data = bytearray(original)
        if job["offset"] >= 0:
            data[job["offset"]] ^= 1 << job["bit"]
        job_dir = scratch / str(n)
        job_dir.mkdir()
        try:
            if reader == "iqkit_sql":
                root_copy = job_dir / "root"
                shutil.copytree(args.store_root, root_copy)
                (root_copy / args.twin_key).write_bytes(bytes(data))
                ctx["root_copy"] = os.fspath(root_copy)
                os.environ["IQKIT_CACHE"] = os.fspath(job_dir / "cache")
                path = ""
            else:
                path = os.fspath(job_dir / "twin.parquet")
                Path(path).write_bytes(bytes(data))
            try:
                table = _read(reader, path, ctx)
            except Exception as exc:  # every clean failure is an outcome
                msg = str(exc).splitlines()[0] if str(exc) else ""
                answer = {"status": "error", "detail": f"{type(exc).__name__}: {msg}"[:300]}
            else:
                if job["offset"] < 0:  # the undamaged file: the reference
                    refs[reader] = table
                    answer = {"status": "reference", "rows": table.num_rows}
                elif refs.get(reader) is None:
                    answer = {"status": "error", "detail": "no reference read"}
                else:
                    try:
                        ok = _same(table, refs[reader])
                    except Exception as exc:  # e.g. a column name not UTF-8
                        ok = False
                        note = f"read, not comparable: {type(exc).__name__}"
                        answer = {"status": "wrong", "rows": table.num_rows, "detail": note}
                    else:
                        answer = {"status": "correct" if ok else "wrong", "rows": table.num_rows}
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)
        sys.stdout.write(json.dumps({"job": job["job"], **answer}) + "\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------------------
# The parent: a pool of workers, each replaced when it dies.
# --------------------------------------------------------------------------------------


class Worker:
    def __init__(self, args: argparse.Namespace, base: list[str]) -> None:
        self.base = base
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.err_path = Path(tempfile.mkstemp(prefix="probe-stderr-", dir=args.scratch)[1])

    def start(self) -> None:
        self.err = open(self.err_path, "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.base, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
            text=True, bufsize=1,
        )  # fmt: skip

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        err_from = os.path.getsize(self.err_path)
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else None
        if line:
            return json.loads(line)
        if line is None:  # no answer in time
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"job": job["job"], "status": "hang", "detail": f"> {timeout} s"}
        rc = self.proc.wait()
        self.proc = None
        with open(self.err_path, errors="replace") as fh:
            fh.seek(err_from)
            stderr = fh.read().strip()
        status = "abort" if rc == -signal.SIGABRT else "signal" if rc < 0 else "exit"
        name = signal.Signals(-rc).name if rc < 0 else f"exit {rc}"
        return {"job": job["job"], "status": status, "detail": f"{name}: {stderr[-400:]}"}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        self.err_path.unlink(missing_ok=True)


def make_store(root: Path, records: int, seed: int) -> None:
    import iqkit

    iqkit.create_store(root, "t", partitions=2, key_serde="string", value_serde="json")
    rnd = random.Random(seed)
    tags = ["red", "green", "blue", "amber", "violet", "teal", "ochre", "slate"]
    with iqkit.StoreWriter(root, "t") as w:
        for i in range(records):
            value = {
                "price": round(rnd.uniform(0.5, 500.0), 2),
                "qty": rnd.randrange(0, 1000),
                "tag": rnd.choice(tags),
            }
            w.put(f"sku-{i:05d}", value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flips", type=int, default=2000, help="random single-bit flips")
    ap.add_argument("--all", action="store_true", help="flip every bit of the twin")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--readers", default=",".join(DEFAULT_READERS))
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2))))
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument(
        "--out",
        default=os.path.join(tempfile.gettempdir(), "probe-twin-abort"),
        help="folder for the report and the inputs that killed a reader",
    )
    ap.add_argument("--flip", action="append", metavar="BYTE:BIT", help="flip just these")
    ap.add_argument("--region", help="flip only bytes whose region name holds this text")
    ap.add_argument("--cost", type=int, metavar="ROWS", help="time page CRCs on a twin")
    ap.add_argument("--repeat", type=int, default=7, help="timings per case (--cost)")
    ap.add_argument("--replay", help="read one saved input with every reader and stop")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--twin", help=argparse.SUPPRESS)
    ap.add_argument("--twin-key", help=argparse.SUPPRESS)
    ap.add_argument("--store-root", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    if args.cost:
        cost(args.cost, args.repeat)
        return
    readers = [r for r in args.readers.split(",") if r]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="probe-twin-abort-"))
    args.scratch = os.fspath(scratch)
    try:
        root = scratch / "root"
        make_store(root, args.records, args.seed)
        twins = sorted((root / "t" / "sst" / "0").glob("*.parquet"))
        assert len(twins) == 1, twins
        twin = twins[0]
        twin_key = os.fspath(twin.relative_to(root))
        if args.replay:
            twin = Path(args.replay).resolve()
        data = twin.read_bytes()
        spans, facts = layout(data)
        base = [sys.executable, os.path.abspath(__file__), "--worker", "--twin", os.fspath(twin),
                "--twin-key", twin_key, "--store-root", os.fspath(root),
                "--scratch", os.fspath(scratch)]  # fmt: skip
        if args.replay:
            run_replay(args, readers, base, Path(args.replay))
            return
        import duckdb
        import pyarrow

        crcs = sum(1 for p in facts["pages"] if p["crc"] is not None)
        print(f"pyarrow {pyarrow.__version__}, duckdb {duckdb.__version__}")
        print(
            f"twin {twin_key}: {facts['size']} bytes, footer {facts['footer_len']} bytes at "
            f"{facts['footer_start']}, {len(facts['pages'])} pages ({crcs} with a CRC), "
            f"columns {facts['columns']}"
        )
        bits = len(data) * 8
        if args.flip:
            flips = [(int(o), int(b)) for o, b in (f.split(":") for f in args.flip)]
        elif args.region:
            hit = [o for o in range(len(data)) if args.region in where(spans, o)]
            flips = [(o, b) for o in hit for b in range(8)]
        elif args.all:
            flips = [(b // 8, b % 8) for b in range(bits)]
        else:
            chosen = random.Random(args.seed).sample(range(bits), min(args.flips, bits))
            flips = [(b // 8, b % 8) for b in sorted(chosen)]
        results = probe(args, readers, base, flips, spans)
        report(args, readers, flips, spans, results, data, out, facts, twin_key)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def probe(
    args: argparse.Namespace,
    readers: list[str],
    base: list[str],
    flips: list[tuple[int, int]],
    spans: list[tuple[int, int, str]],
) -> dict[tuple[int, int, str], dict[str, Any]]:
    """Every reader on every flip; the outcomes by (offset, bit, reader)."""
    jobs: collections.deque[dict[str, Any]] = collections.deque()
    n = 0
    for o, b in flips:
        for r in readers:
            jobs.append({"job": n, "offset": o, "bit": b, "reader": r})
            n += 1
    results: dict[tuple[int, int, str], dict[str, Any]] = {}
    lock = threading.Lock()
    t0 = time.perf_counter()
    done = [0]

    def run(w: Worker) -> None:
        # Every worker first reads the undamaged file with each reader (its references).
        for r in readers:
            ref = w.run({"job": -1, "offset": -1, "bit": 0, "reader": r}, args.timeout)
            if ref["status"] != "reference":
                raise SystemExit(f"reader {r} fails on the undamaged twin: {ref}")
        while True:
            with lock:
                if not jobs:
                    return
                job = jobs.popleft()
            answer = w.run(job, args.timeout)
            if answer["status"] in ("abort", "signal", "exit", "hang"):
                # A replacement worker must read its references again.
                for r in readers:
                    w.run({"job": -1, "offset": -1, "bit": 0, "reader": r}, args.timeout)
            with lock:
                results[(job["offset"], job["bit"], job["reader"])] = answer
                done[0] += 1
                if done[0] % 2000 == 0:
                    rate = done[0] / (time.perf_counter() - t0)
                    print(f"  {done[0]}/{n} reads, {rate:.0f}/s", file=sys.stderr)

    workers = [Worker(args, base) for _ in range(args.workers)]
    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workers:
        w.stop()
    print(f"{n} reads in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return results


def report(
    args: argparse.Namespace,
    readers: list[str],
    flips: list[tuple[int, int]],
    spans: list[tuple[int, int, str]],
    results: dict[tuple[int, int, str], dict[str, Any]],
    data: bytes,
    out: Path,
    facts: dict[str, Any],
    twin_key: str,
) -> None:
    statuses = ("abort", "signal", "exit", "hang", "error", "wrong", "correct")
    counts = {r: collections.Counter() for r in readers}
    by_region: dict[str, dict[str, collections.Counter[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(collections.Counter)
    )
    kills: list[dict[str, Any]] = []
    for (o, b, r), answer in sorted(results.items()):
        s = answer["status"]
        counts[r][s] += 1
        region = where(spans, o)
        by_region[category(region)][r][s] += 1
        if s in ("abort", "signal", "exit"):
            kills.append({"offset": o, "bit": b, "reader": r, "region": region,
                          "detail": answer.get("detail", "")})  # fmt: skip
    width = max(len(r) for r in readers)
    print(f"\n{len(flips)} single-bit flips of {twin_key} ({len(data)} bytes), per reader:")
    print(f"{'reader':<{width}}  " + "  ".join(f"{s:>7}" for s in statuses))
    for r in readers:
        print(f"{r:<{width}}  " + "  ".join(f"{counts[r][s]:>7}" for s in statuses))
    print("\nby region (reader: abort/error/wrong/correct):")
    for region in sorted(by_region):
        cells = by_region[region]
        flips_here = sum(cells[readers[0]].values())
        line = "; ".join(
            f"{r} {c['abort'] + c['signal']}/{c['error']}/{c['wrong']}/{c['correct']}"
            for r, c in cells.items()
            if c["abort"] + c["signal"] + c["error"] + c["wrong"]
        )
        print(f"  {region} ({flips_here} flips): {line or 'all correct'}")
    saved = []
    seen_regions: set[tuple[str, str]] = set()
    for k in kills:
        key = (k["reader"], k["region"])
        if key in seen_regions or len(saved) >= 20:
            continue
        seen_regions.add(key)
        damaged = bytearray(data)
        damaged[k["offset"]] ^= 1 << k["bit"]
        name = f"abort-{k['offset']}-{k['bit']}.parquet"
        (out / name).write_bytes(bytes(damaged))
        saved.append({**k, "file": name})
    if kills:
        print(f"\n{len(kills)} reads killed their process; first of each (reader, region):")
        for k in saved:
            print(f"  {k['reader']}: byte {k['offset']} bit {k['bit']} in {k['region']}"
                  f" -> {k['detail'][-160:]!r}  [{k['file']}]")  # fmt: skip
    errors = {r: collections.Counter() for r in readers}
    for (_o, _b, r), answer in results.items():
        if answer["status"] == "error":
            errors[r][answer["detail"].split(":")[0]] += 1
    (out / "original.parquet").write_bytes(data)
    (out / "report.json").write_text(
        json.dumps(
            {
                "twin": twin_key,
                "size": len(data),
                "facts": {k: v for k, v in facts.items() if k != "pages"},
                "pages": facts["pages"],
                "flips": len(flips),
                "counts": {r: dict(c) for r, c in counts.items()},
                "by_region": {g: {r: dict(c) for r, c in v.items()} for g, v in by_region.items()},
                "error_types": {r: dict(c) for r, c in errors.items()},
                "kills": kills,
                "saved": saved,
                "outcomes": [
                    {"offset": o, "bit": b, "reader": r, "region": where(spans, o), **a}
                    for (o, b, r), a in sorted(results.items())
                ],
            },
            indent=1,
            default=str,
        )
    )
    print(f"\nreport: {out / 'report.json'}")


def run_replay(args: argparse.Namespace, readers: list[str], base: list[str], file: Path) -> None:
    """Read the saved input ``file`` (the worker's twin) undamaged with every reader."""
    w = Worker(args, base)
    try:
        for r in readers:
            answer = w.run({"job": 0, "offset": -1, "bit": 0, "reader": r}, args.timeout)
            print(f"{r}: {answer['status']} {answer.get('detail', '')}")
    finally:
        w.stop()


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - t0[0], cpu - t0[1]


def cost(rows: int, repeat: int) -> None:
    """Write and scan time of a ``rows``-row twin with and without page checksums
    (``repeat`` runs each, interleaved; one thread each, so CPU time, which other work
    on the machine disturbs less than wall time, is comparable)."""
    import statistics

    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import iqkit
    from iqkit.store.columnar import scan, twins
    from iqkit.store.encoding.keyspace import KV_LOWER, KV_UPPER
    from iqkit.store.manifest import StoreManifest

    folder = Path(tempfile.mkdtemp(prefix="probe-cost-"))
    try:
        iqkit.create_store(folder / "root", "t", partitions=1, key_serde="string",
                           value_serde="json")  # fmt: skip
        manifest = StoreManifest.from_json((folder / "root/t/manifest.json").read_text())
        rnd = np.random.default_rng(1)
        tags = pa.array(["red", "green", "blue", "amber", "violet", "teal", "ochre", "slate"])
        metadata = {twins.LAYOUT: twins.layout_of(manifest), twins.KEY_FROM: b"key"}
        table = pa.table(
            {
                twins.DELETED: pa.array(np.zeros(rows, dtype=bool)),
                "key": pa.array([f"sku-{i:09d}" for i in range(rows)]),
                "price": pa.array(np.round(rnd.uniform(0.5, 500.0, rows), 2)),
                "qty": pa.array(rnd.integers(0, 1000, rows)),
                "tag": tags.take(pa.array(rnd.integers(0, 8, rows))),
            },
            schema=pa.schema(
                [pa.field(twins.DELETED, pa.bool_(), nullable=False),
                 pa.field("key", pa.string()), pa.field("price", pa.float64()),
                 pa.field("qty", pa.int64()), pa.field("tag", pa.string())],
                metadata=metadata,
            ),
        )  # fmt: skip
        original = pq.write_table

        def write(path: Path, crc: bool) -> tuple[float, float]:
            def forced(*a: Any, **k: Any) -> Any:
                k["write_page_checksum"] = crc
                return original(*a, **k)

            pq.write_table = forced  # what twins.write_twin calls, its other options kept
            try:
                t0 = _clock()
                twins.write_twin(path, table)
                return _since(t0)
            finally:
                pq.write_table = original

        plain_open = scan._parquet

        def twinscan(path: Path, verify: bool) -> tuple[float, float]:
            def opened(fh: Any) -> Any:
                return pq.ParquetFile(scan._native(fh), page_checksum_verification=verify)

            scan._parquet = opened
            try:
                t0 = _clock()
                got = scan.TwinScan([path], KV_LOWER, KV_UPPER, manifest=manifest).table()
                took = _since(t0)
            finally:
                scan._parquet = plain_open
            assert got.num_rows == rows
            return took

        def read_table(path: Path, verify: bool) -> tuple[float, float]:
            t0 = _clock()
            pq.read_table(path, page_checksum_verification=verify, use_threads=False)
            return _since(t0)

        con = duckdb.connect(config={"threads": 1})

        def duck(path: Path, _verify: bool) -> tuple[float, float]:
            t0 = _clock()
            _arrow(con.sql(f"select * from read_parquet('{path}')"))
            return _since(t0)

        paths = {crc: folder / f"twin-{'crc' if crc else 'plain'}.parquet" for crc in (False, True)}
        times: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for _ in range(repeat):
            for crc in (False, True):
                times[f"write crc={crc}"].append(write(paths[crc], crc))
        for _ in range(repeat):
            for crc in (False, True):
                times[f"TwinScan verify={crc}"].append(twinscan(paths[crc], crc))
                times[f"pq.read_table verify={crc}"].append(read_table(paths[crc], crc))
                times[f"duckdb file crc={crc}"].append(duck(paths[crc], crc))
        meta = pq.read_metadata(paths[True])
        pages = sum(1 for _ in range(meta.num_row_groups) for _ in range(meta.num_columns))
        print(f"pyarrow {pa.__version__}, duckdb {duckdb.__version__}; {rows} rows, "
              f"{meta.num_row_groups} row groups, {pages} column chunks")  # fmt: skip
        for crc in (False, True):
            print(f"  size crc={crc}: {paths[crc].stat().st_size} bytes")
        print("  (one thread each; wall ms and CPU ms of this process: median, min)")
        med = {}
        for k, v in times.items():
            wall, cpu = [x[0] for x in v], [x[1] for x in v]
            med[k] = (statistics.median(wall), statistics.median(cpu), min(wall), min(cpu))
            print(f"  {k:<28} wall {med[k][0] * 1000:7.1f} ({med[k][2] * 1000:7.1f})"
                  f"   cpu {med[k][1] * 1000:7.1f} ({med[k][3] * 1000:7.1f})")  # fmt: skip
        for what in ("write crc", "TwinScan verify", "pq.read_table verify", "duckdb file crc"):
            on, off = med[f"{what}=True"], med[f"{what}=False"]
            print(f"  ratio {what}=True / False: wall median {on[0] / off[0]:.3f}, "
                  f"cpu median {on[1] / off[1]:.3f}, cpu min {on[3] / off[3]:.3f}")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
