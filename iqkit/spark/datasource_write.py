"""``df.write.format("iqkit")``: the write side of the ``iqkit`` Spark data source.

    from iqkit.spark import register
    register(spark)
    (df.write.format("iqkit")
       .mode("append")                      # append = upsert, overwrite = overwrite
       .option("store", "totals")
       .option("key", "customer")           # "region,user" for a composite key
       .option("partitions", 8)
       .save("/shared/stores"))             # or "s3://bucket/stores", .option("root", ...)

It writes what ``write_store(df, root, store, key=..., ...)`` writes (same serdes, key
bytes, partitions, JSON records, positions), as one new store version, on a local root
or an object-storage root alike.

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
The root is parsed and its format chosen once, in step 1 (``store.formats.format_for``);
steps 2 and 3 follow the plan (``WriteJob.where`` and ``WriteJob.uploads``).

1. Driver, ``writer()``: options, columns and types (``schema.plan_columns``, the same
   checks as ``write_store``), the existing store's settings. The base version is pinned
   and a job id chosen by opening, and never publishing, the format's job commit, whose
   spec the tasks get. Nothing is written, so every error here leaves the store as it
   was.
2. Tasks, ``write()``: each Arrow batch is encoded (serdes, murmur2 or the named
   partition column, RocksDB key bytes), buffered, then sorted by (store partition, key,
   input order) in Arrow (past ``write_options.RUN_ROWS`` rows, runs are spilled to
   local disk, then sorted and merged back); the last row of each key is kept, and each
   store partition's rows become one *fragment*: one sorted SST of puts and tombstones and
   its twin, written in the executor's scratch folder (Spark's local dir:
   ``workers.spill_dir``), uploaded under a fresh key (the spec's ``upload_runs``) and
   removed locally; the task's commit message names the uploaded keys. No version lists
   them yet, so no reader sees them, and the driver never needs a file of the executor's:
   nothing but the root is shared. A null key fails the task (so the job) naming the
   column and the store.
3. Driver, ``commit()``: opens the store's job commit again (if any commit landed since
   step 1 the job publishes nothing: ``StoreConflictError``, as for ``write_store``;
   here also because ``writer()``, the tasks and ``commit()`` run in different Python
   workers, so nothing spans the job, and another commit's retention may have removed
   its fragments), chains each store partition's uploaded runs on top of the base chain
   (none for an overwrite) with one small SST holding the commit record
   (``stage_runs``), compacted into one base SST when the chain grows too long, and
   publishes exactly one version, creating the store if it is new (its manifest, too,
   only then). The driver reads no row (except to compact).

   ``abort()`` (and a failed commit) removes every run the tasks' messages name that no
   published version lists (so are runs a commit compacted away) and, under a local
   root, a never-created store's empty folders. A task attempt that dies leaves uploaded
   runs no version lists, which retention removes after its grace period; nothing is
   ever visible.

Duplicate keys: the later row wins. Within a task, by input order (by ``offset`` when the
input has Kafka's ``topic``/``partition``/``offset`` columns); across tasks, the task of
the higher Spark partition index wins — exactly ``write_store``'s rule
(``monotonically_increasing_id``) for non-Kafka input. For Kafka-shaped input, a key whose
rows sit in several Spark partitions keeps the row of the highest Spark partition, not
the highest offset (rows of one Kafka partition normally share a Spark partition). A task
holding more than ``write_options.RUN_ROWS`` encoded rows spills them in runs, which it
sorts and merges into its one fragment per store partition; a later run wins.

Positions: with Kafka-shaped input each task reports its highest offset per (topic,
partition); the driver merges them and advances positions exactly as ``write_store`` does.

Window stores: the window size is only known once the tasks saw the rows, so it is checked
(one size, and the existing store's) in ``commit()``, before anything is published.

Differences from ``write_store``: ``mark_as_partitioned`` needs no co-partitioned input
(fragments from any task are merged), and no progress bar (Spark shows its own).

One module per phase: ``write_options`` (options → :class:`~.write_options.WriteJob`, on
the driver), ``write_tasks`` with ``write_encode`` (the tasks' fragments),
``write_commit`` (the driver's commit). This module is Spark's entry point to them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..store.roots import StoreRoot
from .write_commit import commit_job, remove_job_fragments
from .write_options import WriteJob, plan_job
from .write_tasks import IqkitCommitMessage, write_task

__all__ = ["IqkitWriter", "plan_write"]


def plan_write(
    options: Mapping[str, Any], root: StoreRoot, store: str, schema: StructType, overwrite: bool
) -> IqkitWriter:
    """Check everything that can be checked without the rows; return the writer."""
    return IqkitWriter(plan_job(options, root, store, schema, overwrite))


@dataclass
class IqkitWriter(DataSourceArrowWriter):
    """Built on the driver by :func:`plan_write`, pickled to every task, and back to the
    driver for ``commit``/``abort`` (each in its own Python worker: it keeps no state
    between the phases but its ``job``)."""

    job: WriteJob

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IqkitCommitMessage:
        """A task (``write_tasks``)."""
        return write_task(self.job, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """The driver, once every task succeeded (``write_commit``)."""
        if not self.job.skip:
            commit_job(self.job, _ours(messages))  # removes the fragments, whatever happens

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The driver, when the job failed: what the tasks wrote is removed."""
        if not self.job.skip:
            remove_job_fragments(self.job, _ours(messages))


def _ours(messages: list[WriterCommitMessage | None]) -> list[IqkitCommitMessage]:
    """The tasks' messages (Spark passes ``None`` for a task that sent none)."""
    return [m for m in messages if isinstance(m, IqkitCommitMessage)]
