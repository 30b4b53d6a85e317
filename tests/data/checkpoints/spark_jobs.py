"""Small Structured Streaming queries that leave frozen state checkpoints, run inside a
throwaway venv of one PySpark version (plain PySpark: this file must not import iqkit).

Also the catalog of cells (``CELLS``, ``cells_for``) that ``make_checkpoints.py`` (the
driver) and ``statestore_oracle.py`` import: importing this module does not import
pyspark.

Run by the driver as::

    <venv>/bin/python spark_jobs.py --out tests/data/checkpoints/<version> --work DIR CELL...

Each cell is one query run over fixed inputs: a file source (JSON files, one per
micro-batch, ``maxFilesPerTrigger=1``) read with ``trigger(availableNow=True)``, no-data
batches off, so every input file is exactly one micro-batch and state version N is the
state after batch N - 1. The sink is ``foreachBatch``, which collects each batch's rows
into ``output.json``. The cell folder gets ``checkpoint/`` (as Spark left it, ``.crc``
files included), ``output.json`` and ``cell.json``. The inputs are written to ``--work``
(outside the repository) and copied, as records, into ``cell.json``.

JSON conversion of Spark values (``jsonable``), used for ``output.json`` and by the oracle
for ``statestore.json``:

* struct -> object (field order kept), array -> list,
* map -> list of ``[key, value]`` pairs sorted by the JSON text of the key,
* timestamp / timestamp_ntz -> integer microseconds since the Unix epoch (UTC),
* date -> ISO text ``YYYY-MM-DD``, binary -> lower-case hex text, decimal -> text,
* float/double NaN and infinities -> ``"NaN"``, ``"Infinity"``, ``"-Infinity"``,
* other values (long, int, string, boolean) as they are; null -> null.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------
# catalog

LINES = ("3.5", "4.0", "4.1", "4.2", "4.3")

PROVIDER_CLASSES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "rocksdb-changelog": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}

INPUT_SCHEMA = "id long, user string, amount long, ts timestamp"
# the rows applyInPandasWithState's and transformWithStateInPandas' functions yield
OUTPUT_SCHEMA = "user string, total long, count long"
WATERMARK = "10 seconds"
PARTITIONS = 3


@dataclass(frozen=True)
class Cell:
    """One checkpoint to make: ``op`` is the query (see ``build_query``), ``provider`` a
    key of ``PROVIDER_CLASSES``; ``conf`` adds session settings; ``since`` is the first
    Spark line that has the operator or option (older lines record the cell as "not
    available", with ``why``); ``repartition`` re-partitions the state to that many
    partitions after batch ``repartition_after`` (4.2+ offline repartition); ``lines``
    limits the cell to some lines' default set, to keep the folder small (the driver's
    ``--all-cells`` makes it on every line)."""

    name: str
    op: str
    provider: str
    codec: str = "lz4"
    conf: dict[str, str] = field(default_factory=dict)
    since: str = "3.5"
    why: str = ""
    repartition: int = 0
    repartition_after: int = 1
    note: str = ""
    lines: tuple[str, ...] = ()  # the lines whose default set has the cell; () = all


# Which lines' default set has a cell (the whole matrix on every line would be ~150 cells
# and far too many small files); cells not listed here are on every line.
LINE_SETS: dict[str, tuple[str, ...]] = {
    "window-hdfs": ("3.5", "4.3"),
    "dedup-rocksdb-changelog": ("4.0", "4.3"),
    "dedup-within-wm-hdfs": ("3.5", "4.3"),
    "apply-pandas-hdfs": ("3.5", "4.3"),
    "dedup-wm-hdfs": ("3.5", "4.3"),
    "join-inner-v1-rocksdb-changelog": ("3.5", "4.3"),
    "join-leftouter-v1-hdfs": ("3.5", "4.3"),
    "join-inner-v2-rocksdb-changelog": ("4.0", "4.3"),
    "join-leftouter-v2-hdfs": ("3.5", "4.3"),
    "join-agg-rocksdb-changelog": ("4.0", "4.3"),
    "tws-avro-rocksdb-changelog": ("4.0", "4.3"),
    "agg-ckptv2-rocksdb": ("4.0", "4.3"),
    "join-inner-v2-ckptv2-rocksdb-changelog": ("4.3",),
    "join-inner-v4-rocksdb-changelog": ("4.3",),
    **{
        f"agg-{codec}-{provider}": ("3.5", "4.3")
        for codec in ("lzf", "snappy", "zstd")
        for provider in ("hdfs", "rocksdb-changelog")
    },
}


def _cells() -> list[Cell]:
    cells: list[Cell] = []
    add = cells.append
    for provider in ("hdfs", "rocksdb", "rocksdb-changelog"):
        add(Cell(f"agg-{provider}", "agg", provider))
    for op in ("window", "dedup", "dedup-within-wm", "apply-pandas"):
        for provider in ("hdfs", "rocksdb-changelog"):
            add(Cell(f"{op}-{provider}", op, provider))
    add(Cell("dedup-wm-hdfs", "dedup-wm", "hdfs"))
    for provider in ("hdfs", "rocksdb"):
        add(Cell(f"session-{provider}", "session", provider))
    for kind in ("inner", "leftouter"):
        for version in ("1", "2"):
            for provider in ("hdfs", "rocksdb-changelog"):
                name = f"join-{kind}-v{version}-{provider}"
                add(
                    Cell(
                        name,
                        f"join-{kind}",
                        provider,
                        conf={"spark.sql.streaming.join.stateFormatVersion": version},
                    )
                )
        # v3 (virtual column families): tried on every line, so older lines record the
        # exact refusal.
        add(
            Cell(
                f"join-{kind}-v3-rocksdb-changelog",
                f"join-{kind}",
                "rocksdb-changelog",
                conf={"spark.sql.streaming.join.stateFormatVersion": "3"},
            )
        )
    add(
        Cell(
            "join-inner-v4-rocksdb-changelog",
            "join-inner",
            "rocksdb-changelog",
            conf={
                "spark.sql.streaming.join.stateFormatVersion": "4",
                "spark.sql.streaming.join.stateFormatV4.enabled": "true",
            },
            since="4.2",
            why="join state format v4 (SPARK-55144) is not in this line",
        )
    )
    add(Cell("join-agg-hdfs", "join-agg", "hdfs"))
    add(Cell("join-agg-rocksdb-changelog", "join-agg", "rocksdb-changelog"))
    for encoding in ("unsaferow", "avro"):
        add(
            Cell(
                f"tws-{encoding}-rocksdb-changelog",
                "tws",
                "rocksdb-changelog",
                conf={"spark.sql.streaming.stateStore.encodingFormat": encoding},
                since="4.0",
                why="transformWithStateInPandas is PySpark 4.0+",
            )
        )
    for codec in ("lzf", "snappy", "zstd"):
        for provider in ("hdfs", "rocksdb-changelog"):
            add(Cell(f"agg-{codec}-{provider}", "agg", provider, codec=codec))
    ckpt_v2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}
    for provider in ("rocksdb", "rocksdb-changelog"):
        add(
            Cell(
                f"agg-ckptv2-{provider}",
                "agg",
                provider,
                conf=ckpt_v2,
                since="4.0",
                why="spark.sql.streaming.stateStore.checkpointFormatVersion is 4.0+",
            )
        )
    add(
        Cell(
            "join-inner-v2-ckptv2-rocksdb-changelog",
            "join-inner",
            "rocksdb-changelog",
            conf={"spark.sql.streaming.join.stateFormatVersion": "2", **ckpt_v2},
            since="4.0",
            why="spark.sql.streaming.stateStore.checkpointFormatVersion is 4.0+",
        )
    )
    for provider in ("hdfs", "rocksdb-changelog"):
        add(
            Cell(
                f"agg-repartition-{provider}",
                "agg",
                provider,
                repartition=5,
                since="4.2",
                why="offline state repartition "
                "(SparkSession._streamingCheckpointManager.repartition) is 4.2+",
            )
        )
    return cells


CELLS: dict[str, Cell] = {
    cell.name: Cell(**{**cell.__dict__, "lines": LINE_SETS.get(cell.name, ())}) for cell in _cells()
}


def line_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def planned(cell: Cell, version: str) -> bool:
    """Whether the line's default set has the cell."""
    return not cell.lines or line_of(version) in cell.lines


def available(cell: Cell, version: str) -> bool:
    key = lambda line: tuple(int(p) for p in line.split("."))  # noqa: E731
    return key(line_of(version)) >= key(cell.since)


# --------------------------------------------------------------------------------------
# inputs: fixed records, one list per micro-batch

T0 = datetime(2024, 1, 1, tzinfo=UTC)
BATCHES = 4


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def single_inputs() -> list[list[dict[str, Any]]]:
    """12 users (u00..u11) over 4 batches; event time moves 15 s a batch. Batch 2 repeats
    a record of batch 1 (same id and ts: dropped by the dedups) and has a negative amount
    (u11: removes its state in applyInPandasWithState, registers a timer in
    transformWithState that fires in batch 3 and clears u11), batch 3 a late record
    (behind the watermark)."""
    batches: list[list[dict[str, Any]]] = []
    rid = 0
    for b in range(BATCHES):
        records = []
        for j in range(6):
            records.append(
                {
                    "id": rid,
                    "user": f"u{(b * 5 + j) % 12:02d}",
                    "amount": (b + 1) * 10 + j,
                    "ts": _iso(b * 15 + j * 2),
                }
            )
            rid += 1
        # a second event of the batch's first user, 3 s later: a longer session
        records.append({"id": rid, "user": records[0]["user"], "amount": 1, "ts": _iso(b * 15 + 3)})
        rid += 1
        batches.append(records)
    batches[2].append(dict(batches[1][1]))
    batches[2].append({"id": 100, "user": "u11", "amount": -5, "ts": _iso(2 * 15 + 1)})
    batches[3].append({"id": 101, "user": "u01", "amount": 7, "ts": _iso(1)})
    return batches


def join_inputs() -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """(left batches, right batches). Left: 4 records a batch; right: matches for the
    first 3 within the batch (3 s later) and, for even batches, one for the previous
    batch's 4th left record (8 s after it: joined against buffered state); odd batches'
    4th left records stay unmatched (left-outer null rows once evicted)."""
    left: list[list[dict[str, Any]]] = []
    right: list[list[dict[str, Any]]] = []
    for b in range(BATCHES):
        lrecs, rrecs = [], []
        for j in range(4):
            lrecs.append(
                {
                    "id": b * 10 + j,
                    "user": f"u{(b * 3 + j) % 12:02d}",
                    "amount": b * 10 + j,
                    "ts": _iso(b * 15 + j * 2),
                }
            )
        for j in range(3):
            rrecs.append(
                {
                    "id": 1000 + b * 10 + j,
                    "user": lrecs[j]["user"],
                    "amount": 100 + b * 10 + j,
                    "ts": _iso(b * 15 + j * 2 + 3),
                }
            )
        if b > 0 and b % 2 == 0:
            prev = left[b - 1][3]
            rrecs.append(
                {
                    "id": 1000 + b * 10 + 9,
                    "user": prev["user"],
                    "amount": 199,
                    "ts": _iso((b - 1) * 15 + 3 * 2 + 8),
                }
            )
        left.append(lrecs)
        right.append(rrecs)
    return left, right


# --------------------------------------------------------------------------------------
# JSON conversion (module docstring)


def _micros(value: datetime) -> int:
    if value.tzinfo is None:  # PySpark's local time; the processes run with TZ=UTC
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def jsonable(value: Any, data_type: Any) -> Any:
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(data_type, T.StructType):
        return {f.name: jsonable(value[i], f.dataType) for i, f in enumerate(data_type.fields)}
    if isinstance(data_type, T.ArrayType):
        return [jsonable(v, data_type.elementType) for v in value]
    if isinstance(data_type, T.MapType):
        pairs = [
            [jsonable(k, data_type.keyType), jsonable(v, data_type.valueType)]
            for k, v in value.items()
        ]
        return sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))
    if isinstance(data_type, T.TimestampType) or type(data_type).__name__ == "TimestampNTZType":
        return _micros(value)
    if isinstance(data_type, T.DateType):
        return value.isoformat()
    if isinstance(data_type, T.BinaryType):
        return bytes(value).hex()
    if isinstance(data_type, T.DecimalType):
        return str(value)
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    return value


def row_key(row: Any) -> str:
    return json.dumps(row, sort_keys=True)


def dumps(value: Any, indent: int = 0, width: int = 110) -> str:
    """JSON with containers on one line when they fit in ``width``, else one item a
    line: readable diffs, small files."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + indent <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1, width)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{dumps(v, indent + 1, width)}" for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def first_line(error: BaseException) -> str:
    """The error's first line; for a failed query (``[STREAM_FAILED]``, a foreachBatch
    wrapper), the first line of the root cause found in the message instead. Long
    ``StateSourceOptions(...)`` dumps are cut."""
    text = str(error).strip() or type(error).__name__
    java = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    if java is not None:  # the JVM's message, plus its root cause's first line
        try:
            text = str(java.toString())
            root = java
            while root.getCause() is not None and root.getCause() != root:
                root = root.getCause()
            if not root.equals(java):
                text = (
                    text.splitlines()[0]
                    + " (root cause: "
                    + str(root.toString()).splitlines()[0]
                    + ")"
                )
        except Exception:
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0]
    if "[STREAM_FAILED]" in line or "FOREACH_BATCH_USER_FUNCTION_ERROR" in line:
        causes = [
            candidate
            for candidate in lines[1:]
            if re.match(r"^([\w.$]+(Error|Exception)(:|$)|\[[A-Z_]+\])", candidate)
            and "Traceback" not in candidate
        ]
        line = causes[-1] if causes else line.split("terminated with exception: ", 1)[-1]
    line = line.split(" options: StateSourceOptions(", 1)[0]
    return f"{type(error).__name__}: {line}"[:400]


def read_log_json(path: Path) -> dict[str, Any]:
    """The JSON line of a streaming log file (offsets/commits: ``v1`` then JSON...): the
    first line after the version line that parses as a JSON object."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for line in lines[1:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


# --------------------------------------------------------------------------------------
# queries (pyspark imported lazily)


def running_total_fn():
    """applyInPandasWithState's function: a running (total, count) per user; a record with
    a negative amount removes the user's state. Returned from a function so cloudpickle
    ships it by value (Spark's Python workers cannot import this file). Also the function
    of the suite's own ``flatmap`` jobs (tests/store/checkpoint/jobs.py)."""

    def running_total(key, frames, state):
        import pandas as pd

        total, count = state.get if state.exists else (0, 0)
        removed = False
        for frame in frames:
            if (frame["amount"] < 0).any():
                removed = True
            total += int(frame["amount"].sum())
            count += len(frame)
        if removed:
            state.remove()
        else:
            state.update((total, count))
        yield pd.DataFrame({"user": [key[0]], "total": [total], "count": [count]})

    return running_total


def _tws_processor():
    """A StatefulProcessor with a ValueState (TTL), a ListState, a MapState (TTL) and
    processing-time timers. Built in a function so cloudpickle ships it by value."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class Totals(StatefulProcessor):
        def init(self, handle) -> None:
            self.handle = handle
            self.total = handle.getValueState("total", "total long, count long", 3_600_000)
            self.recent = handle.getListState("recent", "id long, amount long")
            self.amounts = handle.getMapState(
                "amounts", "id long", "amount long, note string", 3_600_000
            )

        def handleInputRows(self, key, rows, timerValues=None):
            user = key[0]
            now = timerValues.getCurrentProcessingTimeInMs()
            if self.total.exists():
                total, count = self.total.get()
            else:
                total, count = 0, 0
                self.handle.registerTimer(now + 3_600_000)  # never fires in the run
            recent = list(self.recent.get()) if self.recent.exists() else []
            negative = False
            for frame in rows:
                for rid, amount in zip(frame["id"], frame["amount"], strict=True):
                    rid, amount = int(rid), int(amount)
                    total += amount
                    count += 1
                    recent.append((rid, amount))
                    self.amounts.updateValue((rid,), (amount, f"n{rid}"))
                    negative = negative or amount < 0
            self.total.update((total, count))
            if len(recent) > 3:
                self.recent.put(recent[-3:])
            else:
                self.recent.put(recent)
            if negative:
                self.handle.registerTimer(now)  # fires in the next batch: clears the user
            yield pd.DataFrame({"user": [user], "total": [total], "count": [count]})

        def handleExpiredTimer(self, key, timerValues=None, expiredTimerInfo=None):
            self.total.clear()
            self.recent.clear()
            self.amounts.clear()
            for expiry in list(self.handle.listTimers()):
                self.handle.deleteTimer(expiry)
            yield pd.DataFrame({"user": [key[0]], "total": [-1], "count": [-1]})

        def close(self) -> None:
            pass

    return Totals()


def build_query(spark, op: str, inputs: Path):
    """(streaming DataFrame, output mode) of ``op`` over the JSON files in ``inputs``
    (``inputs/left``, ``inputs/right`` for joins)."""
    from pyspark.sql import functions as F

    def source(folder: Path):
        return (
            spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
        )

    if op.startswith("join"):

        def side(name: str):  # the left/right stream, its columns prefixed l/r
            prefix = name[0]
            columns = [F.col(c).alias(prefix + c) for c in ("id", "user", "amount", "ts")]
            return source(inputs / name).select(*columns).withWatermark(f"{prefix}ts", WATERMARK)

        left, right = side("left"), side("right")
        condition = F.expr("luser = ruser AND rts >= lts AND rts <= lts + interval 10 seconds")
        how = "leftOuter" if op == "join-leftouter" else "inner"
        joined = left.join(right, condition, how)
        if op == "join-agg":
            agg = joined.groupBy(F.window("lts", "10 seconds")).agg(
                F.count("*").alias("n"), F.sum("ramount").alias("ramount")
            )
            return agg, "append"
        return joined, "append"

    frame = source(inputs)
    if op == "agg":
        return frame.groupBy("user").agg(F.sum("amount"), F.count("*")), "update"
    if op in ("window", "session"):  # time windows (update) and session windows (append)
        window = (
            F.window("ts", "10 seconds") if op == "window" else F.session_window("ts", "5 seconds")
        )
        grouped = frame.withWatermark("ts", WATERMARK).groupBy(window, "user")
        totals = grouped.agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
        return totals, "update" if op == "window" else "append"
    if op == "dedup":
        return frame.dropDuplicates(["id"]), "append"
    if op == "dedup-wm":
        return frame.withWatermark("ts", WATERMARK).dropDuplicates(["user", "ts"]), "append"
    if op == "dedup-within-wm":
        return frame.withWatermark("ts", WATERMARK).dropDuplicatesWithinWatermark(
            ["user"]
        ), "append"
    if op in ("apply-pandas", "tws"):
        grouped = frame.groupBy("user")
        if op == "tws":
            return grouped.transformWithStateInPandas(
                _tws_processor(), OUTPUT_SCHEMA, "Update", "ProcessingTime"
            ), "update"
        from pyspark.sql.streaming.state import GroupStateTimeout

        return grouped.applyInPandasWithState(
            running_total_fn(),
            OUTPUT_SCHEMA,
            "total long, count long",
            "Update",
            GroupStateTimeout.NoTimeout,
        ), "update"
    raise ValueError(f"unknown op {op!r}")


# --------------------------------------------------------------------------------------
# running a cell

# static settings of the job's session (also recorded in cell.json)
SESSION_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.shuffle.partitions": str(PARTITIONS),
    # snapshots early and often, so that deltas/changelogs and snapshots both appear
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
}


def each_in_session(app_name: str, items: list[str], run) -> None:
    """``run(spark, item)`` for each item on one local session (``SESSION_CONF``, quiet
    logs), printing the line it returns: the jobs' and the oracle's main loop."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.streams  # noqa: B018 - the statestore reader wants the query manager made
    for item in items:
        print(run(spark, item), flush=True)
    spark.stop()


def cell_conf(cell: Cell) -> dict[str, str]:
    conf = {
        "spark.sql.shuffle.partitions": str(PARTITIONS),
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASSES[cell.provider],
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(
            cell.provider == "rocksdb-changelog"
        ).lower(),
        "spark.sql.streaming.stateStore.compression.codec": cell.codec,
    }
    conf.update(cell.conf)
    return conf


def _write_inputs(folder: Path, batches: list[list[dict[str, Any]]], upto: int) -> None:
    """Files batch-00000.json.. for batches < upto (the existing ones are kept), each with
    an mtime one minute after the previous, so the file source takes them in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(upto):
        path = folder / f"batch-{number:05d}.json"
        if path.exists():
            continue
        path.write_text("".join(json.dumps(r) + "\n" for r in batches[number]), encoding="utf-8")
        stamp = 1_700_000_000 + number * 60
        os.utime(path, (stamp, stamp))


def _conf_set(spark, conf: dict[str, str]) -> dict[str, str | None]:
    before = {k: spark.conf.get(k, None) for k in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    return before


def _conf_restore(spark, before: dict[str, str | None]) -> None:
    for key, value in before.items():
        try:
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        except Exception:
            pass


def run_cell(spark, cell: Cell, out: Path, work: Path) -> dict[str, Any]:
    import pyspark

    folder = out / cell.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    checkpoint = folder / "checkpoint"
    inputs = work / cell.name
    if inputs.exists():
        shutil.rmtree(inputs)
    joined = cell.op.startswith("join")
    if joined:
        left, right = join_inputs()
        records: Any = {"left": left, "right": right}
    else:
        records = single_inputs()
    conf = cell_conf(cell)
    info: dict[str, Any] = {
        "cell": cell.name,
        "spark_version": pyspark.__version__,
        "operator": cell.op,
        "provider": cell.provider,
        "provider_class": PROVIDER_CLASSES[cell.provider],
        "changelog_checkpointing": cell.provider == "rocksdb-changelog",
        "codec": cell.codec,
        "checkpoint_format_version": int(
            conf.get("spark.sql.streaming.stateStore.checkpointFormatVersion", "1")
        ),
        "note": cell.note,
        "session_conf": {**SESSION_CONF, **conf},
        "query": {
            "source": f"json files, schema {INPUT_SCHEMA!r}, maxFilesPerTrigger=1",
            "trigger": "availableNow",
            "sink": "foreachBatch (rows collected into output.json)",
            "watermark": WATERMARK,
        },
        "inputs": records,
    }
    outputs: list[dict[str, Any]] = []

    def sink(frame, batch_id):
        rows = [jsonable(r, frame.schema) for r in frame.collect()]
        outputs.append({"batchId": batch_id, "rows": sorted(rows, key=row_key)})

    phases = [(0, BATCHES)]
    if cell.repartition:
        phases = [(0, cell.repartition_after + 1), (cell.repartition_after + 1, BATCHES)]
    before = {key: spark.conf.get(key, None) for key in conf}
    started = time.time()
    try:
        _conf_set(spark, conf)  # may refuse a value the line does not know: data too
        for number, (_, upto) in enumerate(phases):
            if joined:
                _write_inputs(inputs / "left", left, upto)
                _write_inputs(inputs / "right", right, upto)
            else:
                _write_inputs(inputs, records, upto)
            if number > 0:
                # 4.2+: SparkSession._streamingCheckpointManager (not public yet)
                spark._streamingCheckpointManager.repartition(str(checkpoint), cell.repartition)
                info["repartitioned"] = {
                    "after_batch": cell.repartition_after,
                    "num_partitions": cell.repartition,
                    "api": "spark._streamingCheckpointManager.repartition(checkpoint, n)",
                }
            frame, mode = build_query(spark, cell.op, inputs)
            info["query"]["output_mode"] = mode
            query = (
                frame.writeStream.outputMode(mode)
                .foreachBatch(sink)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        info["status"] = "made"
    except Exception as error:
        info["status"] = "failed"
        info["error"] = first_line(error)
        info["traceback_tail"] = traceback.format_exc().strip().splitlines()[-3:]
    finally:
        _conf_restore(spark, before)
    info["seconds"] = round(time.time() - started, 1)
    commits = (
        sorted(int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit())
        if (checkpoint / "commits").exists()
        else []
    )
    info["batches"] = len(commits)
    info["committed_batches"] = commits
    offsets = (
        sorted(int(p.name) for p in (checkpoint / "offsets").glob("*") if p.name.isdigit())
        if (checkpoint / "offsets").exists()
        else []
    )
    if offsets:
        log_conf = read_log_json(checkpoint / "offsets" / str(offsets[-1])).get("conf", {})
        info["offset_log_conf"] = log_conf
        info["state_format_versions"] = {
            k: v
            for k, v in log_conf.items()
            if "FormatVersion" in k or "formatVersion" in k or k.endswith("encodingFormat")
        }
    (folder / "output.json").write_text(
        dumps(sorted(outputs, key=lambda o: o["batchId"])) + "\n", encoding="utf-8"
    )
    (folder / "cell.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    if info["status"] != "made":  # a half-made cell keeps no checkpoint: no oracle for it
        shutil.rmtree(checkpoint, ignore_errors=True)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the version's folder")
    parser.add_argument("--work", required=True, help="a scratch folder for the inputs")
    parser.add_argument("cells", nargs="+")
    args = parser.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)

    def make(spark, name: str) -> str:
        info = run_cell(spark, CELLS[name], out, work)
        return (
            f"[{info['spark_version']}] {name}: {info['status']} "
            f"({info['batches']} batches, {info['seconds']} s) {info.get('error', '')}"
        )

    each_in_session("iqkit-checkpoints", args.cells, make)
    return 0


if __name__ == "__main__":
    sys.exit(main())
