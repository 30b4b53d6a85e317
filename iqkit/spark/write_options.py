"""The write options of ``df.write.format("iqkit")`` and the plan made from them on the
driver before any row is read (``writer()``): options, columns and types
(``schema.plan_columns``, the same checks as ``write_store``), the existing store's
settings, the pinned base version and the job id. Nothing is written here, so every
error leaves the store as it was. The result, a :class:`WriteJob`, is all the tasks and
the commit know of the job.

The root is parsed here, once per write, and its format chosen
(``store.formats.format_for``); the plan carries the parsed root (``WriteJob.where``)
and the format's job spec (``WriteJob.uploads``), with which the tasks upload their
sorted runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from ..errors import UnknownStoreError
from ..store.format import StoreFormat
from ..store.formats import format_for
from ..store.manifest import StoreManifest
from ..store.roots import StoreRoot
from .roots import driver_root
from .schema import KAFKA_COLUMNS, ColumnPlan, ensure_spark_store, plan_columns

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

#: Encoded rows a task holds in memory before it spills them to local disk (roughly 150
#: bytes each with a twin's columns, twice that while sorting); the runs are sorted and
#: merged into one fragment per store partition (``write_tasks``).
RUN_ROWS = 1_000_000


class _SchemaOnly:
    """``plan_columns`` reads only ``df.schema``; the writer has a schema, no DataFrame."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema


@dataclass(frozen=True)
class WriteJob:
    """One write, planned on the driver by :func:`plan_job`, pickled to every task and
    back to the driver for the commit (each phase in its own Python worker: they share
    no state but these fields)."""

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
    fail_marker: str | None = None  # tests only: see write_tasks.write_task
    run_rows: int = RUN_ROWS
    #: The root, parsed once when the job was planned.
    where: StoreRoot | None = None
    #: The format's job spec (``JobCommit.spec``: picklable), whose ``upload_runs`` the
    #: tasks upload their runs with (``None``: a skipped write).
    uploads: Any = None
    #: What a new store's manifest says made it.
    written_by: str = "iqkit.spark data source"

    def root_format(self) -> StoreFormat:
        """The root's format (the commit, in its own Python worker, asks it again)."""
        assert self.where is not None
        return format_for(self.where)


def existing_manifest(fmt: StoreFormat, store: str) -> StoreManifest | None:
    """``store``'s manifest, or None when there is no such store yet."""
    try:
        return fmt.read_manifest(store)
    except UnknownStoreError:
        return None


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


def plan_job(
    options: Mapping[str, Any],
    where: StoreRoot,
    store: str,
    schema: StructType,
    overwrite: bool,
    *,
    written_by: str = "iqkit.spark data source",
) -> WriteJob:
    """Check everything that can be checked without the rows; return the job. ``where``:
    the root, parsed once by the data source (``spark/roots.driver_store_root``).
    ``written_by``: what a new store's manifest says made it (``write_store`` writing in
    place plans its job here too)."""
    root = driver_root(where)
    unknown = sorted(k for k in options if k.lower() not in WRITE_OPTIONS)
    if unknown:
        raise ValueError(
            f"iqkit: unknown write option(s) {', '.join(map(repr, unknown))} for store "
            f"{store!r} (known: {', '.join(sorted(o for o in WRITE_OPTIONS if o[0] != '_'))})"
        )
    fmt = format_for(where)
    existing = existing_manifest(fmt, store)
    if_exists = _text_option(options, "if_exists")
    if if_exists is not None and if_exists.lower() not in _IF_EXISTS:
        raise ValueError(
            f"iqkit: option 'if_exists' must be one of {', '.join(_IF_EXISTS)}, got {if_exists!r}"
        )
    if existing is not None and if_exists is not None:
        if if_exists.lower() == "ignore":
            return WriteJob(root=root, store=store, skip=True)
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
    elif partitions is None:
        raise ValueError(f"iqkit: option 'partitions' is required to create store {store!r}")
    # An existing store's settings must fit (checked again at commit, with the window size
    # known). A new store's manifest is the one the commit will create, but for a window
    # store's size: the tasks write each twin for this manifest's layout (``layout_of``),
    # which must be the published one's, or the twins are never read.
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    key_types = tuple(types[k] for k in plan.key_columns)
    manifest = ensure_spark_store(
        fmt,
        store,
        plan,
        partitions=partitions,
        partitioner=existing.partitioner if existing is not None else None,
        window_size=None,
        retention=retention,
        key_types=key_types,
        written_by=written_by,
    )
    mode = "overwrite" if overwrite else "upsert"
    # The job commit's own pin (the latest version and a job id; nothing is written) and
    # its spec, which the tasks upload their runs with. For a new window store
    # ``manifest`` holds a stand-in window size: the spec's manifest only counts records,
    # and the commit opens the job again with the real one.
    uploads = fmt.open_job_commit(store, mode=mode, create=manifest).spec
    return WriteJob(
        root=root,
        store=store,
        plan=plan,
        mode=mode,
        partitions=partitions,
        partitioner=(existing.partitioner if existing else None)
        or ("explicit" if mark else "murmur2"),
        retention=retention,
        key_types=key_types,
        kafka=set(KAFKA_COLUMNS) <= set(types),
        base_version=uploads.base_version,
        job_id=uploads.job_id,
        fail_marker=_text_option(options, "_fail_task_once"),
        run_rows=_int_option(options, "_run_rows", minimum=1) or RUN_ROWS,
        where=where,
        uploads=uploads,
        written_by=written_by,
    )
