"""``df.write.format("iqkit")``: the write side of the ``iqkit`` Spark data source.

    from iqkit.spark import register
    register(spark)
    (df.write.format("iqkit")
       .mode("append")                      # append = upsert, overwrite = overwrite
       .option("store", "totals")
       .option("key", "customer")           # "region,user" for a composite key
       .option("partitions", 8)
       .save("/shared/stores"))             # or .option("root", ...)

It writes what ``write_store(df, root, store, key=..., ...)`` writes (same serdes, key
bytes, partitions, JSON records, positions), as one new store version.

Options (they mirror ``write_store``'s keyword arguments)
---------------------------------------------------------
``store``, ``root``/path  as on the read side.
``key``                 a column, or a comma list of columns (a composite ``ordered`` key).
``value``               a column; absent: every other column as a JSON record.
``partitions``          the store's partition count (required to create a store; for an
                        existing store it defaults to, and must equal, the store's).
``key_serde``, ``value_serde``, ``window``, ``mark_as_partitioned``, ``retention``
                        as in ``write_store``.
``if_exists``           ``error`` (or ``errorifexists``): fail if the store exists;
                        ``ignore``: write nothing if it exists. Spark's own
                        ``.mode("error")``/``.mode("ignore")`` (and no ``.mode()`` at all,
                        which means ``error``) cannot reach a Python data source: Spark 4.1
                        refuses them for every one with ``UNSUPPORTED_DATA_SOURCE_SAVE_MODE``
                        before the source runs, so this option carries those semantics.
For an existing store, ``key``, ``value`` and ``partitions`` default to what it was
created with. Every write publishes one version, an empty DataFrame's too (as
``write_store``); a first write that fails creates no store.

How a write runs, and why
-------------------------
Spark's Python ``DataSourceWriter`` writes each Spark partition of the DataFrame as it
comes (no shuffle by store partition is possible), then calls ``commit`` on the driver.

1. Driver, ``writer()``: options, columns and types (``schema.plan_columns``, the same
   checks as ``write_store``), the existing store's settings. The base version is pinned
   and a job id chosen. Nothing is written, so every error here leaves the store as it was.
2. Tasks, ``write()``: each Arrow batch is encoded (serdes, murmur2 or the named
   partition column, RocksDB key bytes), buffered, then sorted by (store partition, key,
   input order) in Arrow; the last row of each key is kept and written as one sorted SST
   file of puts (plus, if any, a small file of deletes) per store partition:
   ``partitions/<p>/.job-<job>-<task>-<attempt>-<token>-r<run>.sst``. Readers never look at
   such names; a null key fails the task (so the job) naming the column and the store.
3. Driver, ``commit()``: opens a ``JobCommit`` (if any commit landed since step 1 the
   job publishes nothing: ``StoreConflictError``, as for ``write_store``; here also
   because ``writer()``, the tasks and ``commit()`` run in different Python workers, so
   no job lease spans the job, and another commit's retention may have removed its
   fragments), builds each store partition by ingesting its fragments, in task order,
   into a checkpoint of the base partition (an empty one for a new partition or an
   overwrite) — RocksDB's bulk-load path, no Python per row on the driver — and
   publishes exactly one version, creating the store if it is new. ``abort()`` (and a
   failed commit) removes every fragment of the job, and the empty folders of a store
   that was never created. A task attempt that dies leaves fragments under hidden names
   that the commit (or, if the driver died too, the next commit's retention) removes;
   nothing is ever visible.

Duplicate keys: the later row wins. Within a task, by input order (by ``offset`` when the
input has Kafka's ``topic``/``partition``/``offset`` columns); across tasks, the task of
the higher Spark partition index wins — exactly ``write_store``'s rule
(``monotonically_increasing_id``) for non-Kafka input. For Kafka-shaped input, a key whose
rows sit in several Spark partitions keeps the row of the highest Spark partition, not
the highest offset (rows of one Kafka partition normally share a Spark partition). A task
holding more than ``_RUN_ROWS`` encoded rows writes them in runs; a later run wins.

Positions: with Kafka-shaped input each task reports its highest offset per (topic,
partition); the driver merges them and advances positions exactly as ``write_store`` does.

Window stores: the window size is only known once the tasks saw the rows, so it is checked
(one size, and the existing store's) in ``commit()``, before anything is published.

Differences from ``write_store``: ``mark_as_partitioned`` needs no co-partitioned input
(fragments from any task are merged), and no progress bar (Spark shows its own).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..query.position import Position
from ..store import keyspace, rocks
from ..store.commit import build_partition, remove_tree_or_file
from ..store.jobs import (
    JobCommit,
    JobSpec,
    StagedPartition,
    StoreConflictError,
    remove_uncreated_store,
    stage_partition,
)
from ..store.layout import StoreLayout
from ..store.manifest import StoreManifest
from ..store.names import JOB_STAGING_PREFIX
from ..store.partitioners import Partitioner, get_partitioner
from ..store.serdes import Serde, get_serde
from ..store.versions import read_latest_number
from ..store.writer import STORE_SETTINGS
from .schema import (
    KAFKA_COLUMNS,
    ColumnPlan,
    arrow_has_non_finite,
    ensure_spark_store,
    non_finite_message,
    one_window_size,
    plan_columns,
)
from .workers import consume_marker, keep_spark_archive_indexes

__all__ = ["WRITE_OPTIONS", "IqkitCommitMessage", "IqkitWriter", "plan_write"]

#: Options the writer understands (Spark lower-cases option names).
WRITE_OPTIONS = frozenset(
    {
        "path",
        "root",
        "store",
        "key",
        "value",
        "partitions",
        "key_serde",
        "value_serde",
        "window",
        "mark_as_partitioned",
        "retention",
        "if_exists",
        "_fail_task_once",
        "_run_rows",
    }
)
_IF_EXISTS = ("error", "errorifexists", "ignore")

#: Encoded rows a task buffers before it writes a sorted run (roughly 100 bytes each, twice
#: that while sorting). Every run is one more fragment per store partition to ingest.
_RUN_ROWS = 1_000_000

_ENCODED = pa.schema(
    [("p", pa.int32()), ("k", pa.binary()), ("v", pa.binary()), ("seq", pa.int64())]
)
_DELETES = pa.schema([("k", pa.binary())])
# NaN and infinities are refused before encoding (schema.arrow_has_non_finite); JSON has no
# such numbers, so one reaching the encoder fails the task rather than being written.
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
#: Characters a JSON string must escape (RE2 syntax): quote, backslash, controls.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


class _SchemaOnly:
    """``plan_columns`` reads only ``df.schema``; the writer has a schema, no DataFrame."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema


# -- commit messages -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Fragment:
    """One sorted run of one task for one store partition."""

    partition: int
    #: (Spark partition index, run): the order fragments are applied in (later wins).
    order: tuple[int, int]
    sst: str | None  # puts, sorted by key; None when the run only deletes
    deletes_file: str | None  # keys to delete (Arrow IPC), None when there are none
    puts: int
    deletes: int


@dataclass
class IqkitCommitMessage(WriterCommitMessage):
    """What one task attempt staged (sent back to ``commit()`` on the driver)."""

    spark_partition: int
    rows: int = 0
    fragments: list[_Fragment] = field(default_factory=list)
    #: Highest input offset per (topic, partition), for Kafka-shaped input.
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Smallest and largest window size (ms) seen, for window stores.
    window_sizes: tuple[int, int] | None = None


# -- planning on the driver ------------------------------------------------------------------
def _int_option(options: Mapping[str, Any], name: str, *, minimum: int) -> int | None:
    text = options.get(name)
    if text is None or str(text).strip() == "":
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"iqkit: option {name!r} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"iqkit: option {name!r} must be >= {minimum}, got {value}")
    return value


def _text_option(options: Mapping[str, Any], name: str) -> str | None:
    text = options.get(name)
    if text is None or str(text).strip() == "":
        return None
    return str(text).strip()


def plan_write(
    options: Mapping[str, Any], root: str, store: str, schema: StructType, overwrite: bool
) -> IqkitWriter:
    """Check everything that can be checked without the rows; return the writer."""
    unknown = sorted(k for k in options if k.lower() not in WRITE_OPTIONS)
    if unknown:
        raise ValueError(
            f"iqkit: unknown write option(s) {', '.join(map(repr, unknown))} for store "
            f"{store!r} (known: {', '.join(sorted(o for o in WRITE_OPTIONS if o[0] != '_'))})"
        )
    layout = StoreLayout.of(root, store)
    existing = StoreManifest.read(layout) if layout.manifest.exists() else None
    if_exists = _text_option(options, "if_exists")
    if if_exists is not None and if_exists.lower() not in _IF_EXISTS:
        raise ValueError(
            f"iqkit: option 'if_exists' must be one of {', '.join(_IF_EXISTS)}, got {if_exists!r}"
        )
    if existing is not None and if_exists is not None:
        if if_exists.lower() == "ignore":
            return IqkitWriter(root=root, store=store, skip=True)
        raise ValueError(
            f"iqkit: store {store!r} already exists under {root} (option if_exists={if_exists!r})"
        )

    props = existing.properties if existing is not None else {}
    key_text = _text_option(options, "key")
    if key_text is not None:
        keys: Sequence[str] = [k.strip() for k in key_text.split(",") if k.strip()]
    elif props.get("key_columns"):
        keys = list(props["key_columns"])
    else:
        raise ValueError(
            f"iqkit: store {store!r}: option 'key' is required (a column, or a comma list of "
            "columns for a composite key)"
        )
    value = _text_option(options, "value")
    if value is None and props.get("value_column"):
        value = str(props["value_column"])
    mark = _text_option(options, "mark_as_partitioned")
    plan = plan_columns(
        _SchemaOnly(schema),  # type: ignore[arg-type]
        store,
        key=keys[0] if len(keys) == 1 else keys,
        value=value,
        key_serde=_text_option(options, "key_serde"),
        value_serde=_text_option(options, "value_serde"),
        window=_text_option(options, "window"),
        partition_column=mark,
    )
    partitions = _int_option(options, "partitions", minimum=1)
    retention = _int_option(options, "retention", minimum=1)
    if existing is not None:
        if existing.partitioner == "explicit" and mark is None:
            raise ValueError(
                f"store {store!r} uses the explicit partitioner (KIP-759): option "
                "'mark_as_partitioned' must name the column holding each row's partition"
            )
        partitions = partitions or existing.partitions
        ensure_spark_store(  # checked again at commit, with the window size known
            root,
            store,
            plan,
            partitions=partitions,
            partitioner=existing.partitioner,
            window_size=None,
            retention=retention,
            key_types=(),
            written_by="iqkit.spark data source",
        )
    elif partitions is None:
        raise ValueError(f"iqkit: option 'partitions' is required to create store {store!r}")
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    return IqkitWriter(
        root=root,
        store=store,
        plan=plan,
        mode="overwrite" if overwrite else "upsert",
        partitions=partitions,
        partitioner=(existing.partitioner if existing else None)
        or ("explicit" if mark else "murmur2"),
        retention=retention,
        key_types=tuple(types[k] for k in plan.key_columns),
        kafka=set(KAFKA_COLUMNS) <= set(types),
        base_version=read_latest_number(layout) if existing is not None else None,
        job_id=uuid.uuid4().hex[:16],
        fail_marker=_text_option(options, "_fail_task_once"),
        run_rows=_int_option(options, "_run_rows", minimum=1) or _RUN_ROWS,
    )


# -- the writer ------------------------------------------------------------------------------
@dataclass
class IqkitWriter(DataSourceArrowWriter):
    """Built on the driver by :func:`plan_write`, pickled to every task, and back to the
    driver for ``commit``/``abort`` (each in its own Python worker: it keeps no state
    between the phases but these fields)."""

    root: str
    store: str
    skip: bool = False  # if_exists=ignore and the store exists: write nothing
    plan: ColumnPlan | None = None
    mode: str = "upsert"
    partitions: int = 0
    partitioner: str = "murmur2"
    retention: int | None = None
    key_types: tuple[str, ...] = ()
    kafka: bool = False
    base_version: int | None = None
    job_id: str = ""
    fail_marker: str | None = None
    run_rows: int = _RUN_ROWS

    # -- tasks ---------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> IqkitCommitMessage:
        from pyspark import TaskContext

        keep_spark_archive_indexes()
        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx else 0
        if self.skip:
            # The input is never read. Spark 4.1 refuses a None message (DATA_SOURCE_TYPE_
            # MISMATCH), although its docstring allows one: send an empty message.
            return IqkitCommitMessage(spark_partition=spark_partition)
        attempt = f"{spark_partition}-{ctx.attemptNumber() if ctx else 0}-{uuid.uuid4().hex[:8]}"
        message = IqkitCommitMessage(spark_partition=spark_partition)
        encoder = _Encoder(self)
        written: list[_Fragment] = []
        run = 0
        try:
            for batch in iterator:
                # Pieces of at most run_rows rows, so a run never holds much more than that.
                for start in range(0, batch.num_rows, self.run_rows):
                    encoder.add(batch.slice(start, self.run_rows), message)
                    if encoder.buffered >= self.run_rows:
                        written += self._write_run(encoder, spark_partition, attempt, run)
                        run += 1
                        self._maybe_crash()
            written += self._write_run(encoder, spark_partition, attempt, run)
            self._maybe_crash()
        except BaseException:
            for f in written:
                _remove_fragment(f)
            raise
        message.fragments = written
        return message

    def _write_run(
        self, encoder: _Encoder, spark_partition: int, attempt: str, run: int
    ) -> list[_Fragment]:
        """Sort what the encoder holds; one fragment per store partition it touches."""
        layout = StoreLayout.of(self.root, self.store)
        fragments = []
        for p, keys, values in encoder.drain():
            name = f"{attempt}-r{run:04d}"
            base = layout.job_staging_dir(p, self.job_id, name)
            base.parent.mkdir(parents=True, exist_ok=True)
            puts_k, puts_v, dels = _split_deletes(keys, values)
            sst = None
            if puts_k:
                sst = os.fspath(base.with_name(base.name + ".sst"))
                rocks.write_sst(sst, zip(puts_k, puts_v, strict=True))
            deletes_file = None
            if dels:
                deletes_file = os.fspath(base.with_name(base.name + ".del"))
                _write_deletes(deletes_file, dels)
            fragments.append(
                _Fragment(
                    partition=p,
                    order=(spark_partition, run),
                    sst=sst,
                    deletes_file=deletes_file,
                    puts=len(puts_k),
                    deletes=len(dels),
                )
            )
        return fragments

    def _maybe_crash(self) -> None:
        """Tests only: the first attempt that finds the marker dies like a killed executor
        process would (``os._exit``: no cleanup runs), leaving its fragments behind."""
        if self.fail_marker is not None and consume_marker(self.fail_marker):
            os._exit(17)

    # -- driver ----------------------------------------------------------------------------
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.skip:
            return
        try:
            self._commit([m for m in messages if isinstance(m, IqkitCommitMessage)])
        finally:
            self._remove_fragments()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.skip:
            self._remove_fragments()

    def _commit(self, messages: list[IqkitCommitMessage]) -> int:
        assert self.plan is not None
        plan = self.plan
        window_size = self._window_size(messages) if plan.window_column else None
        manifest = self._store_manifest(window_size)
        position = _merge_offsets(messages) if self.kafka else None
        by_partition: dict[int, list[_Fragment]] = {}
        for m in messages:
            for f in m.fragments:
                by_partition.setdefault(f.partition, []).append(f)
        with JobCommit(
            self.root, self.store, mode=self.mode, who="spark:iqkit-datasource", create=manifest
        ) as job:
            spec = job.spec
            if spec.base_version != self.base_version:
                raise StoreConflictError(
                    f"store {self.store!r} changed while the job ran (version "
                    f"{self.base_version} -> {spec.base_version}); nothing was published, "
                    "run the job again"
                )
            # Partitions build independently, mostly inside RocksDB (ingest, flush,
            # compaction), which releases the GIL: one thread per core.
            with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
                staged = list(
                    pool.map(
                        lambda item: _stage_fragments(
                            spec, item[0], sorted(item[1], key=lambda f: f.order), position
                        ),
                        sorted(by_partition.items()),
                    )
                )
            # As write_store: an overwrite empties the partitions no row reached, and with
            # Kafka input every partition of a murmur2 store applied the input (its position
            # advances even when no row landed in it).
            advance = position is not None and plan.partition_column is None
            if self.mode == "overwrite" or advance:
                for p in sorted(set(range(self.partitions)) - set(by_partition)):
                    staged.append(stage_partition(spec, p, [], attempt="driver", position=position))
            return job.publish(
                staged,
                metadata={
                    "rows_written": sum(s.puts for s in staged),
                    "rows_in": sum(m.rows for m in messages),
                    "spark_write": "datasource",
                },
            )

    def _window_size(self, messages: list[IqkitCommitMessage]) -> int | None:
        sizes = [m.window_sizes for m in messages if m.window_sizes is not None]
        if not sizes:  # no rows: an existing window store keeps its size
            layout = StoreLayout.of(self.root, self.store)
            if layout.manifest.exists():
                return StoreManifest.read(layout).window_size_ms
            return one_window_size(self.store, None, None, None)
        lo, hi = min(s[0] for s in sizes), max(s[1] for s in sizes)
        return one_window_size(self.store, self.plan.window_column if self.plan else None, lo, hi)

    def _store_manifest(self, window_size: int | None) -> StoreManifest:
        """The existing store's manifest, which must still match (the store may have been
        created since planning, or its window size was unknown until now), or the one a
        new store gets when the job publishes (see ``ensure_spark_store``)."""
        assert self.plan is not None
        return ensure_spark_store(
            self.root,
            self.store,
            self.plan,
            partitions=self.partitions,
            partitioner=self.partitioner,
            window_size=window_size,
            retention=self.retention,
            key_types=self.key_types,
            written_by="iqkit.spark data source",
            settings=STORE_SETTINGS,
        )

    def _remove_fragments(self) -> None:
        """Every file or folder this job's tasks left (any attempt, any partition), and
        the folders they were made in when the store was never created."""
        layout = StoreLayout.of(self.root, self.store)
        prefix = f"{JOB_STAGING_PREFIX}{self.job_id}-"
        try:
            pnames = os.listdir(layout.partitions_dir)
        except FileNotFoundError:
            pnames = []
        for pname in pnames:
            pdir = layout.partitions_dir / pname
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for fname in os.listdir(pdir):
                    if fname.startswith(prefix):
                        remove_tree_or_file(pdir / fname)
        remove_uncreated_store(layout)


# -- building partitions from fragments (driver) ---------------------------------------------
def _stage_fragments(
    spec: JobSpec, partition: int, fragments: list[_Fragment], position: Position | None
) -> StagedPartition:
    """Build ``partition`` from its base (upsert) or empty (overwrite, new partition) plus
    ``fragments`` in order, through ``commit.build_partition`` (checkpoint + ingest + one
    WriteBatch with the commit record).

    One ``ingest`` call takes every fragment in order (RocksDB gives overlapping files
    increasing sequence numbers in list order: a later file wins). Deletes cannot ride in
    an SST through ``rocks.write_sst``, so they go in the WriteBatch, which RocksDB
    applies after the ingested files: a fragment with deletes therefore ends a step, and
    the next step builds on a checkpoint of the previous one (rare: tombstones only).
    """
    layout = StoreLayout.of(spec.root, spec.store)
    steps: list[list[_Fragment]] = [[]]
    for f in fragments:
        steps[-1].append(f)
        if f.deletes_file is not None:
            steps.append([])
    steps = [s for s in steps if s]
    source: Path | None = None
    if spec.mode == "upsert" and partition in spec.base_partitions:
        source = layout.partition_version_dir(partition, spec.base_partitions[partition])
    # Records, not RocksDB keys (a window is two keys), as every writer counts them.
    kind = spec.manifest.kind
    puts = kind.records_in(sum(f.puts for f in fragments))
    deletes = kind.records_in(sum(f.deletes for f in fragments))
    previous: Path | None = None
    record: dict[str, Any] = {}
    staging = layout.job_staging_dir(partition, spec.job_id, "driver")
    try:
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            staging = layout.job_staging_dir(
                partition, spec.job_id, "driver" if last else f"driver-step{i}"
            )
            batch = rocks.new_write_batch()
            for f in step:
                if f.deletes_file is not None:
                    for key in _read_deletes(f.deletes_file):
                        batch.delete(key)
            record = build_partition(
                previous or source,
                staging,
                version=spec.planned_version,
                batch=batch,
                sst_files=[f.sst for f in step if f.sst is not None],
                position=position,
                counts={"puts": puts, "deletes": deletes},
            )
            if previous is not None:
                remove_tree_or_file(previous)
            previous = staging
    except BaseException:
        if previous is not None:
            remove_tree_or_file(previous)
        remove_tree_or_file(staging)
        raise
    return StagedPartition(
        partition=partition,
        path=os.fspath(staging),
        attempt="driver",
        puts=puts,
        deletes=deletes,
        position=record["position"].to_map(),
    )


def _merge_offsets(messages: list[IqkitCommitMessage]) -> Position:
    position = Position.empty()
    for m in messages:
        for topic, parts in m.offsets.items():
            for p, o in parts.items():
                position = position.with_component(topic, p, o)
    return position


# -- fragments on disk -------------------------------------------------------------------------
def _split_deletes(
    keys: list[bytes], values: list[bytes | None]
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    if None not in values:
        return keys, values, []  # type: ignore[return-value]
    puts_k, puts_v, dels = [], [], []
    for k, v in zip(keys, values, strict=True):
        if v is None:
            dels.append(k)
        else:
            puts_k.append(k)
            puts_v.append(v)
    return puts_k, puts_v, dels


def _write_deletes(path: str, keys: list[bytes]) -> None:
    table = pa.table({"k": pa.array(keys, pa.binary())}, schema=_DELETES)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, _DELETES) as out:
        out.write_table(table)


def _read_deletes(path: str) -> list[bytes]:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().column("k").to_pylist()


def _remove_fragment(f: _Fragment) -> None:
    for path in (f.sst, f.deletes_file):
        if path is not None:
            remove_tree_or_file(Path(path))


# -- encoding (tasks) ----------------------------------------------------------------------------
class _Encoder:
    """Arrow batches of the DataFrame → (store partition, RocksDB key, value, sequence),
    buffered until :meth:`drain` sorts them and keeps the last row of each key.

    The per-row work matches ``write_store``'s encoder (batch.py); it is duplicated here,
    not shared, while batch.py is being rewritten (see the report; to deduplicate)."""

    def __init__(self, w: IqkitWriter) -> None:
        assert w.plan is not None
        plan = w.plan
        self.plan = plan
        self.store = w.store
        self.key_serde = get_serde(plan.key_serde)
        self.value_serde = get_serde(plan.value_serde)
        self.partitioner = get_partitioner(w.partitioner)
        self.n = w.partitions
        self.kafka = w.kafka
        self.buffer: list[pa.RecordBatch] = []
        self.buffered = 0
        self.seq = 0  # input order within the task

    # -- one batch -----------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, message: IqkitCommitMessage) -> None:
        plan, n = self.plan, batch.num_rows
        message.rows += n
        key_bytes = self._keys(batch)
        if plan.partition_column is not None:
            parts = self._explicit_partitions(batch)
        else:
            parts = _partitions(self.partitioner, key_bytes, self.n)
        values = self._values(batch)
        if self.kafka:
            seq = pc.fill_null(batch.column("offset").cast(pa.int64()), -1)
            _max_offsets(batch, message.offsets)
        else:
            seq = pa.array(range(self.seq, self.seq + n), pa.int64())
            self.seq += n
        if plan.window_column is not None:
            window = batch.column(plan.window_column)
            if window.null_count:
                raise ValueError(
                    f"store {self.store!r}: window column {plan.window_column!r} holds nulls"
                )
            starts, sizes = _window_starts(window)
            message.window_sizes = _widen(message.window_sizes, sizes)
            wk, tk = keyspace.window_key, keyspace.window_time_key
            kbs = key_bytes.to_pylist()
            keys = [wk(kb, s) for kb, s in zip(kbs, starts, strict=True)]
            keys += [tk(kb, s) for kb, s in zip(kbs, starts, strict=True)]
            # The time index entry is b"" (a delete when the window's value is deleted).
            index_values = pc.if_else(pc.is_null(values), pa.scalar(None, pa.binary()), b"")
            encoded = pa.RecordBatch.from_arrays(
                [
                    pa.concat_arrays([parts, parts]),
                    pa.array(keys, pa.binary()),
                    pa.concat_arrays([values, index_values]),
                    pa.concat_arrays([seq, seq]),
                ],
                schema=_ENCODED,
            )
        else:
            encoded = pa.RecordBatch.from_arrays(
                [parts, _kv_keys(key_bytes), values, seq], schema=_ENCODED
            )
        self.buffer.append(encoded)
        self.buffered += encoded.num_rows

    def _keys(self, batch: pa.RecordBatch) -> pa.Array:
        """The serialized keys of a batch, a ``binary`` array (null keys refused)."""
        columns = []
        for name in self.plan.key_columns:
            col = batch.column(name)
            if col.null_count:
                raise ValueError(f"store {self.store!r}: key column {name!r} holds null keys")
            columns.append(col)
        if len(columns) == 1:
            return _serialize_column(self.key_serde, columns[0], self.store, "key")
        tuples = zip(*(c.to_pylist() for c in columns), strict=True)
        serialize = self.key_serde.serialize
        try:
            return pa.array([serialize(k) for k in tuples], pa.binary())
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"store {self.store!r}: key {exc}") from None

    def _explicit_partitions(self, batch: pa.RecordBatch) -> list[int]:
        name = self.plan.partition_column
        col = batch.column(name)
        lo_hi = pc.min_max(col)
        lo, hi = lo_hi["min"].as_py(), lo_hi["max"].as_py()
        if col.null_count or lo < 0 or hi >= self.n:
            bad = None if col.null_count else (lo if lo < 0 else hi)
            raise ValueError(
                f"store {self.store!r}: mark_as_partitioned column {name!r} must hold integers "
                f"in [0, {self.n}); found {bad!r}"
            )
        return col.cast(pa.int32())

    def _values(self, batch: pa.RecordBatch) -> pa.Array:
        plan = self.plan
        for name in plan.float_json_columns:  # JSON has no NaN: refused, as write_store does
            if arrow_has_non_finite(batch.column(name)):
                raise ValueError(non_finite_message(self.store, name))
        if plan.value_column is None:
            return _json_records(batch, plan.record_columns).cast(pa.binary())
        col = batch.column(plan.value_column)
        if plan.value_serde == "json":
            return _json_texts(col).cast(pa.binary())  # a null value stays null: a delete
        return _serialize_column(self.value_serde, col, self.store, "value")

    # -- sorting ------------------------------------------------------------------------------
    def drain(self) -> Iterator[tuple[int, list[bytes], list[bytes | None]]]:
        """Per store partition (ascending): keys ascending, the last row of each key."""
        if not self.buffer:
            return
        table = pa.Table.from_batches(self.buffer, schema=_ENCODED)
        self.buffer, self.buffered = [], 0
        # Arrow's sort is stable: rows already in sequence order (input order, not Kafka
        # offsets) need no sequence key.
        sort_keys = [("p", "ascending"), ("k", "ascending")]
        if self.kafka:
            sort_keys.append(("seq", "ascending"))
        order = pc.sort_indices(table, sort_keys=sort_keys)
        table = table.take(order).combine_chunks()
        p, k = table.column("p").chunk(0), table.column("k").chunk(0)
        if len(table) > 1:
            same_as_next = pc.and_(pc.equal(k[:-1], k[1:]), pc.equal(p[:-1], p[1:]))
            keep = pa.concat_arrays([pc.invert(same_as_next), pa.array([True])])
            table = table.filter(keep)
        parts = table.column("p").to_numpy()
        keys, values = table.column("k"), table.column("v")
        start = 0
        while start < len(parts):
            partition = int(parts[start])
            end = int(parts.searchsorted(partition, side="right"))
            # Python objects for one partition at a time keeps a task's memory near the
            # Arrow buffers' size.
            yield (
                partition,
                keys.slice(start, end - start).to_pylist(),
                values.slice(start, end - start).to_pylist(),
            )
            start = end


def _serialize_column(serde: Serde, col: pa.Array, store: str, role: str) -> pa.Array:
    """``serde.serialize`` of every value of ``col`` (nulls stay null), as a ``binary``
    array: the serde's vectorized ``serialize_arrow`` when it has one for the column's
    type, else value by value (which raises the serde's message, prefixed with the store).
    """
    # serialize_arrow arrives with the batch.py speed rewrite; older serdes lack it.
    fast = getattr(serde, "serialize_arrow", None)
    out = fast(col) if fast is not None else None
    if out is not None:
        return out
    serialize = serde.serialize
    try:
        return pa.array([None if v is None else serialize(v) for v in col.to_pylist()], pa.binary())
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"store {store!r}: {role} {exc}") from None


def _partitions(partitioner: Partitioner, key_bytes: pa.Array, n: int) -> pa.Array:
    """The store partition of every serialized key (an ``int32`` array)."""
    many = getattr(partitioner, "partition_many", None)  # vectorized murmur2, if present
    if many is not None:
        return pa.array(many(key_bytes, n), pa.int32())
    partition = partitioner.partition
    return pa.array([partition(kb, n) for kb in key_bytes.to_pylist()], pa.int32())


def _kv_keys(key_bytes: pa.Array) -> pa.Array:
    """``keyspace.kv_key`` of every serialized key."""
    many = getattr(keyspace, "kv_keys_arrow", None)
    if many is not None:
        return many(key_bytes)
    kv_key = keyspace.kv_key
    return pa.array([kv_key(kb) for kb in key_bytes.to_pylist()], pa.binary())


def _max_offsets(batch: pa.RecordBatch, into: dict[str, dict[int, int]]) -> None:
    """Highest ``offset`` per (``topic``, ``partition``) of Kafka-shaped rows (rows with a
    null topic, partition or offset are skipped, as in write_store)."""
    table = pa.table(
        {
            "t": batch.column("topic").cast(pa.string()),
            "p": batch.column("partition").cast(pa.int64()),
            "o": batch.column("offset").cast(pa.int64()),
        }
    )
    grouped = table.group_by(["t", "p"]).aggregate([("o", "max")])
    for t, p, o in zip(*(grouped.column(c).to_pylist() for c in ("t", "p", "o_max")), strict=True):
        if t is None or p is None or o is None:
            continue
        parts = into.setdefault(t, {})
        parts[p] = max(o, parts.get(p, o))


def _window_starts(col: pa.Array) -> tuple[list[int], tuple[int, int] | None]:
    """Window starts (epoch ms, floored like Spark's ``unix_millis``) and the smallest and
    largest window size of a Spark window struct column (nulls were refused already)."""
    start = pc.struct_field(col, "start").cast(pa.int64())  # microseconds
    end = pc.struct_field(col, "end").cast(pa.int64())
    starts = [us // 1000 for us in start.to_pylist()]
    ends = [us // 1000 for us in end.to_pylist()]
    if not starts:
        return [], None
    sizes = [e - s for s, e in zip(starts, ends, strict=True)]
    return starts, (min(sizes), max(sizes))


def _widen(current: tuple[int, int] | None, new: tuple[int, int] | None) -> tuple[int, int] | None:
    if new is None:
        return current
    if current is None:
        return new
    return min(current[0], new[0]), max(current[1], new[1])


# -- JSON records, as Spark's to_json writes them ----------------------------------------------
def _json_records(batch: pa.RecordBatch, names: Sequence[str]) -> pa.Array:
    """One JSON object per row (a ``string`` array, never null: a record of nulls is
    ``{}``), decoding to what ``to_json(struct(...))`` writes: null fields are left out.

    Built column by column in Arrow (``,"name":<value text>`` per present field, then
    ``{`` + the fields without the first comma + ``}``): no per-row Python for columns of
    strings, numbers and booleans."""
    fields = []
    for name in names:
        name_text = pa.scalar("," + _json_encode(name) + ":", pa.string())
        text = _json_texts(batch.column(name))
        field = pc.binary_join_element_wise(name_text, text, "", null_handling="emit_null")
        fields.append(pc.fill_null(field, ""))
    joined = pc.binary_join_element_wise(*fields, "") if len(fields) > 1 else fields[0]
    return pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(joined, 1), "}", "")


def _json_texts(col: pa.Array) -> pa.Array:
    """The JSON text of every value of ``col`` as Spark's ``to_json`` writes it (a
    ``string`` array; null stays null). Vectorized for integers, booleans, floats and
    strings that need no escaping; other types go value by value (``_json_converter``)."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return col.cast(pa.string())
    if pa.types.is_floating(t):
        # Arrow writes the shortest text that reads back exactly, float32 in float32
        # precision like Java's Float.toString; a JSON reader needs "1.0" (not "1") to
        # see a float. (NaN and infinities were refused before: ``_Encoder._values``.)
        text = col.cast(pa.string())
        integral = pc.match_substring_regex(text, r"^-?[0-9]+$")
        return pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    is_text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if is_text and not pc.any(pc.match_substring_regex(col, _NEEDS_ESCAPE)).as_py():
        return pc.binary_join_element_wise('"', col.cast(pa.string()), '"', "")
    convert = _json_converter(t)
    values = col.to_pylist()
    if convert is not None:
        values = [None if v is None else convert(v) for v in values]
    return pa.array([None if v is None else _json_encode(v) for v in values], pa.string())


def _json_converter(t: pa.DataType) -> Callable[[Any], Any] | None:
    """Python value of an Arrow type → the JSON-able value Spark's to_json would write, or
    ``None`` when the value is already that (strings, integers, booleans)."""
    if pa.types.is_floating(t):
        return _float32_json if pa.types.is_float32(t) else None
    if pa.types.is_timestamp(t):
        return _spark_timestamp if t.tz is not None else _spark_timestamp_ntz
    if pa.types.is_date(t):
        return _dt.date.isoformat
    if pa.types.is_decimal(t):
        return _decimal_json
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: base64.b64encode(v).decode("ascii")
    if pa.types.is_map(t):
        conv = _json_converter(t.item_type)
        if conv is None:
            return lambda v: dict(v)
        return lambda v: {k: None if x is None else conv(x) for k, x in v}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        conv = _json_converter(t.value_type)
        if conv is None:
            return None
        return lambda v: [None if x is None else conv(x) for x in v]
    if pa.types.is_struct(t):
        convs = {t.field(i).name: _json_converter(t.field(i).type) for i in range(t.num_fields)}

        # Spark's to_json leaves null struct fields out (ignoreNullFields), at every level.
        def struct(v: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for k, x in v.items():
                if x is not None:
                    conv = convs.get(k)
                    out[k] = x if conv is None else conv(x)
            return out

        return struct
    return None


def _float32_json(v: float) -> float:
    """A float32 as Java's ``Float.toString`` writes it: its shortest float32 text (Arrow
    hands it over widened to float64, 0.1f as 0.10000000149011612)."""
    return float(str(np.float32(v)))


def _spark_timestamp(v: _dt.datetime) -> str:
    """``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` (Spark's JSON timestamp format) in ``v``'s zone,
    which Arrow sets to the session time zone."""
    offset = v.utcoffset() or _dt.timedelta(0)
    if offset:
        minutes = int(offset.total_seconds()) // 60
        sign = "+" if minutes >= 0 else "-"
        zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    else:
        zone = "Z"
    return f"{v:%Y-%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}{zone}"


def _spark_timestamp_ntz(v: _dt.datetime) -> str:
    return f"{v:%Y-%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}"


def _decimal_json(d: decimal.Decimal) -> int | float:
    """Spark writes a decimal's digits (``1.10``, ``5``): JSON readers get a float, or an
    int for scale 0; the same here."""
    return int(d) if d.as_tuple().exponent == 0 else float(d)
