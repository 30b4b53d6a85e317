"""The tasks' side of ``df.write.format("iqkit")``: each task encodes and sorts its rows
(``write_encode``) and writes them as *fragments*, one per store partition it holds,
and sends the driver an :class:`IqkitCommitMessage` saying what it wrote. A fragment is
one sorted SST of puts and tombstones (``rocks.write_arrow_sst``) and its columnar twin
(``twins.TwinWriter``, from the task's own typed columns where it kept them), both
streamed from the task's sorted rows, written in the executor's scratch folder
(``workers.spill_dir``), uploaded through the job spec (``WriteJob.uploads``, the
format's: a task's fragments through one connection) under a fresh key no version lists,
and removed locally; the message names the uploaded keys, so the driver never needs the
executor's files.

Memory: past ``job.run_rows`` rows the task's rows are spilled to the scratch folder as a
run grouped by store partition (``SortedRows``); each store partition's rows are sorted
as its fragment is written, in pieces of at most a run's size merged block by block, so a
task of any size holds about ``run_rows`` rows, and still writes one
fragment per store partition: a job's chains grow by one file per task, not per run
(with a fragment per run, 20M rows in 2 tasks made 20 files per partition, and the
commit compacted all of them on the driver: 250 s of a 390 s write).

Nothing here publishes: the driver's commit (``write_commit``) chains the fragments. A
task that fails removes what it uploaded."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from ..store.names import twin_key
from ..store.partitions import rocks
from ..store.sorted_rows import ArrowRows
from .workers import consume_marker, keep_spark_archive_indexes, spill_dir
from .write_encode import RowEncoder
from .write_options import WriteJob


@dataclass(frozen=True)
class Fragment:
    """One task's fragment for one store partition."""

    partition: int
    #: (Spark partition index, run): the order fragments are applied in (later wins).
    order: tuple[int, int]
    puts: int
    deletes: int
    #: The uploaded SST (puts and tombstones, sorted by key) on the root (the format's
    #: file record: ``name`` is its key).
    run: Any = None


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
    """One task attempt: encode and sort the rows ``iterator`` holds (spilling a run
    every ``job.run_rows`` rows; a later row wins) and write them as one fragment per
    store partition; on failure the fragments written so far are removed."""
    from pyspark import TaskContext

    keep_spark_archive_indexes()
    ctx = TaskContext.get()
    spark_partition = ctx.partitionId() if ctx else 0
    if job.skip:
        # The input is never read. Spark 4.1 refuses a None message (DATA_SOURCE_TYPE_
        # MISMATCH), although its docstring allows one: send an empty message.
        return IqkitCommitMessage(spark_partition=spark_partition)
    manifest = job.uploads.manifest
    twin_columns = None
    if manifest.kind.has_twins:
        from ..store.columnar.twins import twin_source_columns  # pyarrow, writers only

        twin_columns = twin_source_columns(manifest)
    encoder = RowEncoder(job, twin_columns, spill_dir=spill_dir())
    written: list[Fragment] = []
    # One connection for every fragment the task uploads.
    objects = job.uploads.objects()
    try:
        for batch in iterator:
            # Pieces of at most run_rows rows, so a run never holds more than that; a run
            # is spilled only when more rows come (the last one is sorted in memory).
            for start in range(0, batch.num_rows, job.run_rows):
                piece = batch.slice(start, job.run_rows)
                if encoder.buffered and encoder.buffered + piece.num_rows > job.run_rows:
                    encoder.spill()
                encoder.add(piece)
        for p, rows in encoder.partitions():
            written.append(_write_fragment(job, p, rows, spark_partition, objects))
            _maybe_crash(job)
    except BaseException:
        remove_fragments(job, written, objects=objects)
        raise
    finally:
        encoder.close()
    return IqkitCommitMessage(
        spark_partition=spark_partition,
        rows=encoder.rows,
        fragments=written,
        offsets=encoder.offsets,
        window_sizes=encoder.window_sizes,
    )


def _write_fragment(
    job: WriteJob, p: int, rows: ArrowRows, spark_partition: int, objects: Any
) -> Fragment:
    """Store partition ``p``'s rows (sorted, each key once, ``None`` values deletes) as
    one SST of puts and tombstones and, for stores with twins, its twin, streamed from
    ``rows`` in the scratch folder and uploaded through ``objects`` (``upload_runs``: one
    connection); the local files are gone when this returns."""
    manifest = job.uploads.manifest
    with tempfile.TemporaryDirectory(prefix="iqkit-run-", dir=spill_dir()) as scratch:
        sst = os.path.join(scratch, f"{p}.sst")
        chunks: Any = rows.sequenced_chunks()
        twin = None
        if manifest.kind.has_twins:
            from ..store.columnar.twins import TwinWriter  # pyarrow, writers only

            # From the input's own columns where the chunks carry them, else shaped.
            twin = TwinWriter(twin_key(sst), manifest)
            chunks = twin.tee(chunks)
        puts, deletes = rocks.write_arrow_sst(sst, (chunk[:2] for chunk in chunks))
        if twin is not None:
            twin.close()  # no twin file when it has none (``try_write``'s rule)
        [uploaded] = job.uploads.upload_runs([(p, sst)], objects=objects)
    return Fragment(
        partition=p, order=(spark_partition, 0), puts=puts, deletes=deletes, run=uploaded
    )


def _maybe_crash(job: WriteJob) -> None:
    """Tests only: the first attempt that finds the marker dies like a killed executor
    process would (``os._exit``: no cleanup runs), leaving its fragments behind."""
    if job.fail_marker is not None and consume_marker(job.fail_marker):
        os._exit(17)


def remove_fragments(
    job: WriteJob,
    fragments: list[Fragment],
    *,
    keep: frozenset[str] = frozenset(),
    objects: Any = None,
    unpublished: bool = False,
) -> None:
    """Remove the uploaded runs ``fragments`` name, except the keys in ``keep`` (a
    published version lists them); ``unpublished``: also except what the store's latest
    version lists, and the empty folders of a store never created go too (the job
    spec's ``discard``). Best effort: what cannot be removed now is an orphan that
    retention removes."""
    if job.uploads is None:
        return
    job.uploads.discard(
        [key for f in fragments if f.run is not None for key in f.run.object_keys()],
        keep=keep,
        objects=objects,
        unpublished=unpublished,
    )
