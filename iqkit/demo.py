"""``make demo`` / ``python -m iqkit demo``: the main job on a laptop, then a tour.

A local Spark session (``local[2]``) reads Kafka-shaped order events from a local topic
(:class:`~iqkit.spark.LocalKafkaTopic`) and writes three stores under ``demo-stores/``:

* ``totals`` — a keyed aggregate by a batch job (orders and spend per customer);
* ``per_minute`` — a window store (orders and spend per customer per minute, event time);
* ``latest`` — a latest-value store kept by Structured Streaming, one exactly-once commit
  per micro-batch, with positions and the topic's end offsets (so lag is real: a few
  orders arrive while the last micro-batch is written and stay unread).

A fourth job is a plain streaming aggregation with no iqkit in it at all (orders and
spend per item, written to Spark's ``noop`` sink): its state lives only in its checkpoint
(``_demo/checkpoints/items``), and the tour opens that checkpoint as a store.

Then it prints a tour: each step is the ``%iq`` line a notebook would run, executed by the
same :class:`~iqkit.jupyter.session.IQSession` and printed as the magic's text tables, so
``make lab`` continues exactly where the terminal stops.

A second run **replaces** the folder: the old one is moved aside, the new one is built
from nothing (topic, checkpoint and stores), and only when everything worked is the old
one deleted — an interrupted run puts the old folder back. Stores are never half from one
run and half from another, and the streaming checkpoint always names the folder it lives
in. A folder that is not a demo's (no ``_demo/`` inside) is never touched.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

__all__ = ["DEFAULT_ROOT", "DemoError", "run"]

#: Where ``make demo`` writes (relative to the current folder); ``make lab`` reads it.
DEFAULT_ROOT = "demo-stores"
#: The demo's own folder inside the root: the topic, the streaming checkpoint, Spark's
#: scratch space. Not a store (no manifest); its presence marks a root the demo may replace.
WORK_DIR = "_demo"
TOPIC = "orders"
TOPIC_PARTITIONS = 3
STORE_PARTITIONS = 4
#: Orders produced before the pipeline runs, in this many produce calls (one file per
#: topic partition each); the stream reads one call's files per micro-batch.
ORDERS = 1_200
PRODUCE_CALLS = 4
#: Orders that arrive while the stream writes its last micro-batch: unread, hence lag.
LATE_ORDERS = 9
#: The event time of the first order; orders are 3 s apart (an hour of orders).
START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
_STEP_MS = 3_000

REGIONS = ("eu", "us", "ap")
NAMES = ("ana", "ben", "cleo", "dan", "eva", "finn", "gus", "hana")
ITEMS = {"coffee": 3, "tea": 2, "bagel": 4, "salad": 9, "soup": 6, "juice": 5}
#: The customer the tour follows.
CUSTOMER = "eu-ana"


class DemoError(ValueError):
    """The demo cannot run with these arguments (one line, for the command line)."""


def run(
    root: str | os.PathLike[str] = DEFAULT_ROOT,
    *,
    out: TextIO | None = None,
    progress: bool = True,
) -> int:
    """Build the demo stores under ``root`` (replacing a previous demo's) and print the
    tour to ``out`` (stdout). ``progress``: Spark progress bars (on stderr)."""
    out = out if out is not None else sys.stdout
    started = time.monotonic()
    say = _Say(out, started)
    final = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
    say(f"iqkit demo: a Spark pipeline writes three state stores under {final}")
    with _fresh_root(final) as work:
        late = _pipeline(final, work, say, progress=progress)
    say.step("Spark stopped; the stores are published. The tour, as %iq lines:")
    _tour(final, late, out)
    elapsed = time.monotonic() - started
    print(
        f"\nDone in {elapsed:.0f} s. `make lab` opens the same stores in JupyterLab "
        f"(IQKIT_ROOT={final}): run these %iq lines there, or `%iq panel`.",
        file=out,
    )
    return 0


class _Say:
    """Step lines with the time since the start, flushed at once (Spark is slow)."""

    def __init__(self, out: TextIO, started: float) -> None:
        self.out = out
        self.started = started

    def __call__(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        self(f"[{time.monotonic() - self.started:5.1f} s] {text}")


# -- the folder ------------------------------------------------------------------------------
@contextmanager
def _fresh_root(final: Path) -> Any:
    """An empty ``final`` (with its ``_demo/`` work folder) to build in; the previous demo
    folder is moved aside and deleted on success, put back on any failure."""
    if final.exists() and not final.is_dir():
        raise DemoError(f"{final} is a file, not a folder for the demo stores")
    if final.is_dir() and any(final.iterdir()) and not (final / WORK_DIR).is_dir():
        raise DemoError(
            f"{final} exists and was not written by `iqkit demo` (no {WORK_DIR}/ inside); "
            "choose another --root or remove it"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_backups(final)
    backup = None
    if final.exists():
        backup = final.with_name(f".{final.name}.replaced-{os.getpid()}")
        os.rename(final, backup)
    work = final / WORK_DIR
    try:
        work.mkdir(parents=True)
        yield work
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        if backup is not None:
            os.rename(backup, final)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    shutil.rmtree(work / "spark", ignore_errors=True)


def _remove_stale_backups(final: Path) -> None:
    """Old demo folders a killed run left aside (``.<name>.replaced-<pid>``)."""
    for stale in final.parent.glob(f".{final.name}.replaced-*"):
        if (stale / WORK_DIR).is_dir():
            shutil.rmtree(stale, ignore_errors=True)


# -- the data --------------------------------------------------------------------------------
CUSTOMERS = tuple(f"{region}-{name}" for region in REGIONS for name in NAMES)


def _order(number: int, rng: random.Random, customer: str | None = None) -> tuple[str, str, int]:
    """One Kafka record ``(key, value, timestamp)``: the customer keys it, as a Kafka
    producer keying by customer would, so a customer's orders share a topic partition."""
    customer = customer or rng.choice(CUSTOMERS)
    item = rng.choice(tuple(ITEMS))
    quantity = rng.randint(1, 3)
    value = {"order": number, "customer": customer, "item": item, "amount": ITEMS[item] * quantity}
    timestamp = int(START.timestamp() * 1000) + number * _STEP_MS
    return customer, json.dumps(value), timestamp


def _orders(rng: random.Random) -> list[list[tuple[str, str, int]]]:
    """``ORDERS`` orders in ``PRODUCE_CALLS`` chunks (fixed seed: every run the same)."""
    orders = [_order(n, rng) for n in range(ORDERS)]
    size = ORDERS // PRODUCE_CALLS
    return [orders[i : i + size] for i in range(0, ORDERS, size)]


# -- the pipeline ----------------------------------------------------------------------------
def _pipeline(root: Path, work: Path, say: _Say, *, progress: bool) -> Any:
    """Produce, run the three Spark jobs, stop Spark; return the late order's metadata."""
    say.step("Starting Spark (local[2]) ...")
    import iqkit.spark  # noqa: F401  before the session: Spark's workers then run this Python

    from .spark import LocalKafkaTopic

    spark, owned = _spark_session(work / "spark")
    try:
        rng = random.Random(11)
        topic = LocalKafkaTopic(work / "topics", TOPIC, TOPIC_PARTITIONS)
        chunks = _orders(rng)
        say.step(
            f"Producing {ORDERS:,} orders to the local Kafka-shaped topic {TOPIC!r} "
            f"({TOPIC_PARTITIONS} partitions, {PRODUCE_CALLS} produce calls)"
        )
        for chunk in chunks:
            topic.produce(chunk)
        say(f"         log-end offsets: {topic.end_offsets()}")
        _batch_jobs(spark, topic, root, say, progress=progress)
        late = _stream(spark, topic, root, work, rng, say)
        _checkpoint_only_job(spark, topic, items_checkpoint(root), say)
    finally:
        if owned:
            spark.stop()
    return late


def _spark_session(scratch: Path) -> tuple[Any, bool]:
    """A quiet local session whose scratch files stay in ``scratch`` (removed after the
    run): nothing is left in the system's temporary folder. ``owned``: we started it."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    scratch.mkdir(parents=True, exist_ok=True)
    # Spark's default log4j profile prints WARN lines at start-up (loopback hostname,
    # native Hadoop, spark.local.dir) before setLogLevel can run: errors only, from here.
    log_config = scratch / "log4j2.properties"
    log_config.write_text(_LOG4J2, encoding="utf-8")
    java_options = (
        f"-Djava.io.tmpdir={scratch}"  # the JVM's temporary files (native libraries etc.)
        " -XX:-UsePerfData"  # no /tmp/hsperfdata_<user> entry for this JVM
        f" -Dlog4j2.configurationFile={log_config.as_uri()}"
    )
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("iqkit-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(STORE_PARTITIONS))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(scratch))
        .config("spark.driver.extraJavaOptions", java_options)
    )
    # spark-submit first runs a small launcher JVM, which would leave an empty
    # /tmp/hsperfdata_<user>; SPARK_LAUNCHER_OPTS reaches that JVM only, and only now.
    launcher_options = os.environ.get("SPARK_LAUNCHER_OPTS")
    os.environ["SPARK_LAUNCHER_OPTS"] = f"{launcher_options or ''} -XX:-UsePerfData".strip()
    try:
        session = builder.getOrCreate()
    finally:
        if launcher_options is None:
            del os.environ["SPARK_LAUNCHER_OPTS"]
        else:
            os.environ["SPARK_LAUNCHER_OPTS"] = launcher_options
    session.sparkContext.setLogLevel("ERROR")
    return session, True


_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
# PySpark counts as a shell: Spark prints "Setting default log level" unless the logger
# of the class that starts logging has a level of its own equal to the root's.
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def _orders_frame(df: Any) -> Any:
    """Kafka records → typed order columns (plus Kafka's topic/partition/offset)."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    return df.select(
        F.col("key").cast("string").alias("customer"),
        F.get_json_object(value, "$.order").cast("long").alias("order"),
        F.get_json_object(value, "$.item").alias("item"),
        F.get_json_object(value, "$.amount").cast("long").alias("amount"),
        "timestamp",
        "topic",
        "partition",
        "offset",
    )


def _batch_jobs(spark: Any, topic: Any, root: Path, say: _Say, *, progress: bool) -> None:
    from pyspark.sql import functions as F

    from .spark import write_store

    orders = _orders_frame(topic.read_batch(spark)).cache()
    end = topic.end_position()
    say.step("Batch job: orders and spend per customer -> store 'totals'")
    totals = orders.groupBy("customer").agg(
        F.count("*").alias("orders"),
        F.sum("amount").alias("spent"),
        F.max("timestamp").cast("string").alias("last_order_at"),
    )
    write_store(totals, root, "totals", key="customer", partitions=STORE_PARTITIONS,
                progress=progress)  # fmt: skip
    _record_input(root, "totals", end)
    say.step("Batch job: orders and spend per customer per minute -> window store 'per_minute'")
    minutes = orders.groupBy(F.window("timestamp", "1 minute"), "customer").agg(
        F.count("*").alias("orders"), F.sum("amount").alias("spent")
    )
    write_store(minutes, root, "per_minute", key="customer", window="window",
                partitions=STORE_PARTITIONS, progress=progress)  # fmt: skip
    _record_input(root, "per_minute", end)
    orders.unpersist()


def _record_input(root: Path, store: str, end: Any) -> None:
    """A batch aggregate has no Kafka columns left to take positions from: record that it
    applied the whole topic up to ``end`` (log-end offsets) and that end, for lag."""
    from .store.writer import StoreWriter

    applied = {
        t: {p: o - 1 for p, o in end.partition_positions(t).items() if o > 0} for t in end.topics
    }
    with StoreWriter(root, store, who="iqkit demo") as writer:
        writer.record_applied(applied)
        writer.record_source_end(end)


def _stream(spark: Any, topic: Any, root: Path, work: Path, rng: random.Random, say: _Say) -> Any:
    """Structured Streaming into ``latest``: one micro-batch per produce call; the late
    orders arrive while the last one is being written. Returns the late order for the
    tour's bound (a ``RecordMetadata``)."""
    from pyspark.sql import functions as F

    from . import open as open_engine
    from .jupyter.result import compact_position
    from .spark import store_sink

    say.step(
        "Structured Streaming: latest order per customer -> store 'latest' "
        "(exactly once per micro-batch, positions from Kafka's offsets)"
    )
    sink = store_sink(root, "latest", key="customer", value="last_order",
                      partitions=STORE_PARTITIONS, end_offsets=topic.end_position)  # fmt: skip
    late: list[Any] = []
    last = PRODUCE_CALLS - 1  # one micro-batch per produce call (see read_stream below)

    def each_batch(batch_df: Any, batch_id: int) -> None:
        if batch_id == last and not late:
            # New orders arrive while this micro-batch runs: it was planned without them,
            # but the sink records the topic's end offsets now, so the store knows it is
            # behind (lag) and a bound on the newest order fails until the next run.
            records = [_order(ORDERS + n, rng) for n in range(LATE_ORDERS - 1)]
            records.append(_order(ORDERS + LATE_ORDERS - 1, rng, CUSTOMER))
            late.extend(topic.produce(records))
        sink(batch_df, batch_id)
        with open_engine(root) as engine:
            position = compact_position(_store_position(engine, "latest"))
            version = engine.version("latest")
        note = f"; {LATE_ORDERS} new orders arrived meanwhile" if batch_id == last else ""
        say(f"         micro-batch {batch_id}: version {version}, position {position}{note}")

    stream = _orders_frame(topic.read_stream(spark, max_files_per_trigger=TOPIC_PARTITIONS))
    stream = stream.select(
        "customer",
        F.struct("order", "item", "amount", F.col("timestamp").cast("string").alias("at")).alias(
            "last_order"
        ),
        "topic",
        "partition",
        "offset",
    )
    query = (
        stream.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(work / "checkpoints" / "latest"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return late[-1] if late else None


def items_checkpoint(root: Path) -> Path:
    """The checkpoint of the job that keeps its state only in Spark's state store."""
    return root / WORK_DIR / "checkpoints" / "items"


def _checkpoint_only_job(spark: Any, topic: Any, checkpoint: Path, say: _Say) -> None:
    """A streaming aggregation as people write them, with no sink: orders and spend per
    item, one micro-batch per produce call, its state only in ``checkpoint``."""
    from pyspark.sql import functions as F

    say.step(
        "Structured Streaming with no sink: orders and spend per item, state kept only in "
        "Spark's checkpoint"
    )
    orders = _orders_frame(topic.read_stream(spark, max_files_per_trigger=TOPIC_PARTITIONS))
    per_item = orders.groupBy("item").agg(
        F.count("*").alias("orders"), F.sum("amount").alias("spend")
    )
    query = (
        per_item.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _store_position(engine: Any, store: str) -> Any:
    from .query.position import Position

    position = Position.empty()
    for info in engine.lags(stores=[store])[store].values():
        position = position.merge(info.current_position)
    return position


# -- the tour --------------------------------------------------------------------------------
def _tour(root: Path, late: Any, out: TextIO) -> None:
    """Each step: the ``%iq`` line, then what the magic shows for it, as text."""
    from .jupyter.parse import parse_line
    from .jupyter.render import text_table
    from .jupyter.session import IQSession

    session = IQSession(root, progress=False)

    def show(title: str, line: str, *views: Callable[[Any], str]) -> Any:
        print(f"\n## {title}\n\n>>> %iq {line}", file=out)
        value = session.execute(parse_line(line))
        for view in views or (str,):
            print(view(value), file=out)
        return value

    def partitions(r: Any) -> str:
        return "per partition:\n" + "\n".join(text_table(r.partitions))

    def trace(r: Any) -> str:
        return "trace:\n" + "\n".join(text_table(r.trace))

    def frame(f: Any) -> str:
        return "\n".join(text_table(f))

    try:
        show("The stores", "stores", frame)
        a, b, c = CUSTOMER, "us-ben", "ap-cleo"
        show(
            "Key lookup: each key runs on the partition that owns it (Kafka's murmur2)",
            f"get totals {a} {b} {c} --trace",
            str,
            partitions,
            trace,
        )
        show("Prefix scan: every EU customer, per partition", "prefix totals eu- --limit 8")
        show(
            f"The newest windows of {a}, newest first",
            f"window per_minute {a} --from 2024-05-01T12:00 --to 2024-05-01T13:00 --desc --limit 5",
        )
        if late is not None:
            bound = f"{late.topic}:{late.partition}={late.offset}"
            show(
                f"A bound: {a}'s newest order is {late.topic}[{late.partition}] offset "
                f"{late.offset} (the producer's RecordMetadata); the stream has not read it",
                f"get latest {a} --bound {bound}",
                str,
                partitions,
            )
        show(
            f"Lag: the {LATE_ORDERS} unread orders, per store partition (each store partition "
            f"reads all {TOPIC_PARTITIONS} topic partitions)",
            "lag latest",
            frame,
        )
        show(
            "A Spark checkpoint opened as stores: the per-item job has no sink, its state "
            "is read from Spark's own state files",
            f"open {items_checkpoint(root)}",
        )
        show("Its store: the operator, schemas and state store provider", "stores", frame)
        show(
            "Key lookup in Spark's state: only the partition Spark's hash put the key in",
            "get aggregate coffee tea --trace",
            str,
            trace,
        )
    finally:
        session.close()
