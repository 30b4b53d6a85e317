"""The tasks' side of ``df.write.format("iqkit")``: each task encodes and sorts its rows
(``write_encode``) and writes them as *fragments*, one per store partition and sorted run,
and sends the driver an :class:`IqkitCommitMessage` saying what it wrote. Where a
fragment goes depends on the store's format (``WriteJob.uploads``, asked in
``write_options``):

* a folder store (a local root's): one sorted SST file of puts (plus, if any, a small Arrow file
  of deletes) beside the partition folders, under hidden names
  (``partitions/<p>/.job-<job>-<task>-<attempt>-<token>-r<run>.sst``) that readers never
  look at;
* a chain store (every store on an object root): one sorted SST of puts and tombstones
  (``rocks.write_changes_sst``) written in the executor's scratch folder
  (``workers.spill_dir``), uploaded as the chain job spec's ``upload_run`` does
  (``chain_jobs.upload_runs``: a run's SSTs through one connection) under a fresh key
  no version lists, and removed locally; the message names the uploaded keys, so the
  driver never needs the executor's files.

Nothing here publishes: the driver's commit (``write_commit``) ingests (folders) or
chains (chain stores) the fragments. A task that fails removes what it wrote."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from ..errors import IqkitError
from ..store import rocks
from ..store.chain import ChainFile
from ..store.chain_jobs import ChainJobSpec, upload_runs
from ..store.commit import remove_tree_or_file
from ..store.layout import StoreLayout
from ..store.objects import ObjectStore
from .workers import consume_marker, keep_spark_archive_indexes, spill_dir
from .write_encode import RowEncoder
from .write_options import WriteJob

DELETES_SCHEMA = pa.schema([("k", pa.binary())])


@dataclass(frozen=True)
class Fragment:
    """One sorted run of one task for one store partition."""

    partition: int
    #: (Spark partition index, run): the order fragments are applied in (later wins).
    order: tuple[int, int]
    sst: str | None  # folders: puts, sorted by key; None when the run only deletes
    deletes_file: str | None  # folders: keys to delete (Arrow IPC), None when none
    puts: int
    deletes: int
    #: Chain stores: the uploaded SST (puts and tombstones, sorted by key) on the root.
    run: ChainFile | None = None


@dataclass
class IqkitCommitMessage(WriterCommitMessage):
    """What one task attempt staged (sent back to ``commit()`` on the driver)."""

    spark_partition: int
    rows: int = 0
    fragments: list[Fragment] = field(default_factory=list)
    #: Highest input offset per (topic, partition), for Kafka-shaped input.
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Smallest and largest window size (ms) seen, for window stores.
    window_sizes: tuple[int, int] | None = None


def write_task(job: WriteJob, iterator: Iterator[pa.RecordBatch]) -> IqkitCommitMessage:
    """One task attempt: encode, sort and write the rows ``iterator`` holds as fragments,
    a sorted run per ``job.run_rows`` rows (a later run wins); on failure the fragments
    written so far are removed."""
    from pyspark import TaskContext

    keep_spark_archive_indexes()
    ctx = TaskContext.get()
    spark_partition = ctx.partitionId() if ctx else 0
    if job.skip:
        # The input is never read. Spark 4.1 refuses a None message (DATA_SOURCE_TYPE_
        # MISMATCH), although its docstring allows one: send an empty message.
        return IqkitCommitMessage(spark_partition=spark_partition)
    attempt = f"{spark_partition}-{ctx.attemptNumber() if ctx else 0}-{uuid.uuid4().hex[:8]}"
    encoder = RowEncoder(job)
    written: list[Fragment] = []
    run = 0
    # Chain stores: one connection for every run the task uploads (made at first use).
    objects = job.uploads.objects() if job.uploads is not None else None
    try:
        for batch in iterator:
            # Pieces of at most run_rows rows, so a run never holds much more than that.
            for start in range(0, batch.num_rows, job.run_rows):
                encoder.add(batch.slice(start, job.run_rows))
                if encoder.buffered >= job.run_rows:
                    written += _write_run(job, encoder, spark_partition, attempt, run, objects)
                    run += 1
                    _maybe_crash(job)
        written += _write_run(job, encoder, spark_partition, attempt, run, objects)
        _maybe_crash(job)
    except BaseException:
        remove_fragments(job, written, objects=objects)
        raise
    return IqkitCommitMessage(
        spark_partition=spark_partition,
        rows=encoder.rows,
        fragments=written,
        offsets=encoder.offsets,
        window_sizes=encoder.window_sizes,
    )


def _write_run(
    job: WriteJob,
    encoder: RowEncoder,
    spark_partition: int,
    attempt: str,
    run: int,
    objects: ObjectStore | None,
) -> list[Fragment]:
    """Sort what the encoder holds; one fragment per store partition it touches."""
    if job.uploads is not None:
        return _upload_run(job.uploads, encoder, (spark_partition, run), objects)
    layout = StoreLayout.of(job.root, job.store)
    fragments = []
    for p, keys, values in encoder.drain():
        name = f"{attempt}-r{run:04d}"
        base = layout.job_staging_dir(p, job.job_id, name)
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
            Fragment(
                partition=p,
                order=(spark_partition, run),
                sst=sst,
                deletes_file=deletes_file,
                puts=len(puts_k),
                deletes=len(dels),
            )
        )
    return fragments


def _upload_run(
    spec: ChainJobSpec, encoder: RowEncoder, order: tuple[int, int], objects: ObjectStore | None
) -> list[Fragment]:
    """Chain stores: what the encoder holds, one SST of puts and tombstones per store
    partition (keys ascending, each once; ``None`` values are deletes), written in the
    scratch folder and uploaded through ``objects`` (``chain_jobs.upload_runs``); the
    local files are gone when this returns."""
    with tempfile.TemporaryDirectory(prefix="iqkit-run-", dir=spill_dir()) as scratch:
        written: list[tuple[int, str]] = []
        counts: list[tuple[int, int]] = []
        for p, keys, values in encoder.drain():
            sst = os.path.join(scratch, f"{p}.sst")
            rocks.write_changes_sst(sst, zip(keys, values, strict=True))
            deletes = values.count(None)
            written.append((p, sst))
            counts.append((len(keys) - deletes, deletes))
        uploaded = upload_runs(spec, written, objects=objects)
    return [
        Fragment(
            partition=p,
            order=order,
            sst=None,
            deletes_file=None,
            puts=puts,
            deletes=deletes,
            run=run,
        )
        for (p, _), (puts, deletes), run in zip(written, counts, uploaded, strict=True)
    ]


def _maybe_crash(job: WriteJob) -> None:
    """Tests only: the first attempt that finds the marker dies like a killed executor
    process would (``os._exit``: no cleanup runs), leaving its fragments behind."""
    if job.fail_marker is not None and consume_marker(job.fail_marker):
        os._exit(17)


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
    table = pa.table({"k": pa.array(keys, pa.binary())}, schema=DELETES_SCHEMA)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, DELETES_SCHEMA) as out:
        out.write_table(table)


def read_deletes(path: str) -> list[bytes]:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().column("k").to_pylist()


def remove_fragments(
    job: WriteJob,
    fragments: list[Fragment],
    *,
    keep: frozenset[str] = frozenset(),
    objects: ObjectStore | None = None,
) -> None:
    """Remove what ``fragments`` name: their local files (folders), their uploaded runs
    (chains, through ``objects`` or a new connection; except the keys in ``keep``: a
    published version lists them). Best effort for uploads: what cannot be removed now
    is an orphan that chain retention removes."""
    if objects is None and job.uploads is not None:
        objects = job.uploads.objects()
    for f in fragments:
        for path in (f.sst, f.deletes_file):
            if path is not None:
                remove_tree_or_file(Path(path))
        if f.run is not None and objects is not None and f.run.name not in keep:
            with contextlib.suppress(IqkitError, OSError):
                objects.delete(f.run.name)
