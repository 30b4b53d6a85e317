"""Helpers shared by the tests (imported as ``helpers``; conftest files are not modules
to import from: several of them share the name ``conftest``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import iqkit


def folder_for_other_users(prefix: str) -> Path:
    """A new folder (0755) that another user (``nobody``, in the hostile-store and
    read-only tests) can reach: in the test scratch folder (TMPDIR) when every folder
    above it lets others through, else in ``/tmp`` (a clone inside a folder others cannot
    enter, such as root's home: nothing there is reachable by another user). The caller
    removes it."""
    scratch = Path(tempfile.gettempdir()).resolve()
    reachable = all(os.stat(p).st_mode & 0o001 for p in [scratch, *scratch.parents])
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=None if reachable else "/tmp"))
    os.chmod(folder, 0o755)
    return folder


def request(store: str, query: iqkit.Query) -> iqkit.StateQueryRequest:
    return iqkit.StateQueryRequest.in_store(store).with_query(query)


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below ``folder`` (to prove nothing changed)."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def rows(result: iqkit.QueryResult) -> list[tuple]:
    """Drain an iterator result into (key, value) tuples."""
    with result.result as it:
        return [(kv.key, kv.value) for kv in it]


def kv_rows(engine: iqkit.StateEngine, store: str) -> list[tuple[int, object, object]]:
    """(partition, key, value) of every row of a key-value store."""
    r = engine.query(request(store, iqkit.RangeQuery.with_no_bounds()))
    out = []
    for p, qr in sorted(r.partition_results.items()):
        if qr.is_success:
            with qr.result as it:
                out.extend((p, kv.key, kv.value) for kv in it)
    return out


# -- Spark writes -------------------------------------------------------------------------
def windowed_counts(spark, users: int, windows: int):
    """``users * windows`` rows of a windowed count (5-minute windows, one click each)."""
    import datetime as dt

    from pyspark.sql import functions as F

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clicks = spark.createDataFrame(
        [(f"u{u}", t0 + dt.timedelta(minutes=5 * w)) for u in range(users) for w in range(windows)],
        "user string, ts timestamp",
    )
    return clicks.groupBy(F.window("ts", "5 minutes"), "user").agg(F.count("*").alias("n"))


def written_counts(root, store: str) -> tuple[int, int]:
    """The latest version's ``rows_written`` and the puts its commit records count."""
    from iqkit.store.chain.records import latest_version
    from iqkit.store.objects import open_objects

    record = latest_version(open_objects(root), store)
    assert record is not None
    puts = sum(c.commit_record()["puts"] for c in record.partitions.values())
    return record.metadata["rows_written"], puts


#: The records behind the notebook test stores (see ``write_notebook_stores``).
NOTEBOOK_TOTALS = {
    "alice": {"customer": "alice", "total": 42, "orders": 3},
    "bob": {"customer": "bob", "total": 13, "orders": 2},
    "carol": {"customer": "carol", "total": 7, "orders": 1},
    "dave": {"customer": "dave", "total": 99, "orders": 5},
    "erin": {"customer": "erin", "total": 0, "orders": 0},
    "alfred": {"customer": "alfred", "total": 5, "orders": 1},
}


def write_notebook_stores(root: Path) -> None:
    """'totals' (kv, string → json, 4 partitions; source topic 'orders', 2 partitions,
    end offsets recorded), 'counts' (int32 → int64, 2 partitions) and 'clicks' (window
    store, 60 s windows, string → int64, minutes 0..4 for alice and 0..1 for bob)."""
    iqkit.create_store(root, "totals", partitions=4, value_serde="json")
    with iqkit.StoreWriter(root, "totals") as w:
        for offset, (key, value) in enumerate(NOTEBOOK_TOTALS.items()):
            w.put(key, value, source=("orders", offset % 2, offset))
        w.record_source_end({"orders": {0: 20, 1: 20}})
    iqkit.create_store(root, "counts", partitions=2, key_serde="int32", value_serde="int64")
    with iqkit.StoreWriter(root, "counts") as w:
        for k in range(-5, 20):
            w.put(k, k * k)
    iqkit.create_store(
        root, "clicks", partitions=2, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    with iqkit.StoreWriter(root, "clicks") as w:
        for minute in range(5):
            w.put("alice", minute + 1, window_start=minute * 60_000)
        for minute in range(2):
            w.put("bob", 10 * (minute + 1), window_start=minute * 60_000)


# -- builders for the notebook-result tests (tests/jupyter) --------------------------------
def write_store(root: Path, name: str, rows, *, partitions: int = 2, **settings) -> None:
    """``create_store`` plus one commit of ``rows``: ``(key, value)`` or
    ``(key, value, {put keyword arguments})`` (``partition=``, ``window_start=``,
    ``source=``)."""
    iqkit.create_store(root, name, partitions=partitions, **settings)
    with iqkit.StoreWriter(root, name) as w:
        for row in rows:
            key, value, *extra = row
            w.put(key, value, **(extra[0] if extra else {}))


def partition_files(root: Path, name: str, partition: int, version: int = 1) -> list[Path]:
    """The SST files the version record of a local root's store lists for a partition
    (oldest first; read in place by every reader)."""
    from iqkit.store.chain.records import read_version
    from iqkit.store.objects import open_objects

    record = read_version(open_objects(root), name, version)
    return [Path(root) / f.name for f in record.partitions[partition].files]


def twin_files(root: Path, name: str, partition: int, version: int = 1) -> list[Path]:
    """The columnar twins of ``partition_files`` (those that have one)."""
    return [
        p.with_suffix(".parquet")
        for p in partition_files(root, name, partition, version)
        if p.with_suffix(".parquet").exists()
    ]


def break_partition(root: Path, name: str, partition: int, version: int = 1) -> None:
    """Make a published partition unreadable, so queries report STORE_EXCEPTION for it:
    its SSTs and their columnar twins are emptied in place (so a reader building the
    partition's database in its cache fails, and so does a scan of its twins)."""
    for path in [
        *partition_files(root, name, partition, version),
        *twin_files(root, name, partition, version),
    ]:
        path.write_bytes(b"")


def damage_latest(root: Path, name: str) -> str:
    """Garble a store's newest version record, so reading the store fails; return that
    file's name (what the error names)."""
    from iqkit.store.names import CHAIN_RECORDS_DIR

    path = max((Path(root) / name / CHAIN_RECORDS_DIR).glob("*.json"))
    path.write_text("garbage")
    return path.name


def iq_result(engine, req, *, limit=None, lags=None, **kwargs):
    """What the %iq session does for a query: run it, collect the rows, wrap them."""
    import time

    from iqkit.jupyter.result import IQResult
    from iqkit.tables import collect

    manifest = engine.manifest(req.store_name)
    t0 = time.perf_counter_ns()
    result = engine.query(req)
    engine_ns = time.perf_counter_ns() - t0
    collected = collect(result, manifest, limit=limit, query=req.query)
    return IQResult(req, result, manifest, collected, engine_ns=engine_ns, lags=lags, **kwargs)


# Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/apache/kafka/common/utils).
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


# -- Spark writers (tests/spark) ------------------------------------------------------------
NON_FINITE_DDL = "k string, x double, xs array<double>, m map<string,double>, s struct<a:float>"


def non_finite_frames(spark, prefix="s_"):
    """(store name, DataFrame, the error expected): each frame holds one NaN or infinity,
    in one column only (a double, an array, a map, a struct's float); the store is named
    ``prefix`` + the column."""
    fine = ("a", 1.5, [1.0, 2.0], {"u": 1.0}, (0.5,))
    bad = {
        "x": ("b", float("nan"), [1.0], {"u": 1.0}, (0.5,)),
        "xs": ("b", 1.0, [1.0, float("inf")], {"u": 1.0}, (0.5,)),
        "m": ("b", 1.0, [1.0], {"u": 1.0, "v": float("-inf")}, (0.5,)),
        "s": ("b", 1.0, [1.0], None, (float("nan"),)),
    }
    return [
        (
            f"{prefix}{c}",
            spark.createDataFrame([fine, row], NON_FINITE_DDL),
            f"store '{prefix}{c}': value column '{c}' holds NaN or an infinity, which JSON "
            "cannot hold",
        )
        for c, row in bad.items()
    ]


# -- Structured Streaming ------------------------------------------------------------------
def orders(start: int, count: int) -> list[tuple[str, str]]:
    """Kafka records ``(user-<i % 7>, {"amount": i})`` for ``i`` from ``start``."""
    import json

    return [(f"user-{i % 7}", json.dumps({"amount": i})) for i in range(start, start + count)]


def run_available_now(spark, topic, sink, checkpoint, **read) -> None:
    """Stream ``topic``'s orders (user, amount and the Kafka columns) through ``sink``
    (a ``foreachBatch`` function) until it has read everything, then stop."""
    from pyspark.sql import functions as F

    stream = topic.read_stream(spark, **read).select(
        F.col("key").cast("string").alias("user"),
        F.get_json_object(F.col("value").cast("string"), "$.amount").cast("long").alias("amount"),
        "topic",
        "partition",
        "offset",
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None


def require_java() -> None:
    """Fail (not skip) a Spark test when Java is missing: ``make test`` installs Java first;
    this guards direct runs."""
    import pytest

    if shutil.which("java") is None:
        pytest.fail("Spark tests need Java 17+ on PATH (make check-java installs it)")


def run_python_script(script: str, *args: str, cwd=None, env=None, timeout: float = 600) -> dict:
    """Run ``script`` in a fresh Python process (this interpreter) and return the JSON it
    printed on its last line starting with ``RESULT``; fail with its output otherwise."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"the script failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT") :])


#: What ``make test`` points at its own scratch folder; unset, a command runs as a user's.
TEST_SCRATCH_VARIABLES = ("TMPDIR", "SPARK_SUBMIT_OPTS", "SPARK_LAUNCHER_OPTS")


def mount_namespaces_work() -> bool:
    """Whether this process may run a command in a private mount namespace (root, with
    ``unshare``, where the kernel allows it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount --bind / /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def in_private_mount_namespace(script: str, *args: str) -> list[str]:
    """An argv prefix running ``sh -c script args...`` in a mount namespace of its own:
    what the script mounts, nobody else sees, and it is gone when the script ends."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, *args]


def with_private_tmp(command: list[str], listing: Path) -> list[str] | None:
    """``command`` run with an empty ``/tmp`` of its own (a tmpfs in a private mount
    namespace), which it leaves listed in ``listing`` when it ends: the way to see
    what a program leaves in ``/tmp`` while other processes use the real one. ``None``
    where that needs rights this process lacks (not root, no ``unshare``), or where
    ``listing`` itself is under ``/tmp``, which the command would not see (pytest's
    tmp_path outside ``make test``, which points it into the clone)."""
    if Path(listing).resolve().is_relative_to("/tmp") or not mount_namespaces_work():
        return None
    script = 'mount -t tmpfs iqkit-tmp /tmp && "$@"; rc=$?; ls -A /tmp > "$LISTING"; exit $rc'
    return ["env", f"LISTING={listing}", *in_private_mount_namespace(script, "sh", *command)]


def jvm_speed_flags() -> str:
    """``make test``'s speed-only JVM flags (C1 only, and the class data sharing archive
    ``tests/spark/jvm_archive.py`` makes: the Makefile's ``ARCHIVED_JVM_FLAGS``),
    for a JVM a test starts with an environment of its own; empty outside ``make test``."""
    return os.environ.get("IQKIT_TEST_JVM_FLAGS", "")


def user_environment() -> dict[str, str]:
    """This process's environment without ``make test``'s scratch-folder settings (its JVM
    speed flags kept: they change no result, only the CPU a run takes)."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_SCRATCH_VARIABLES}
    if jvm_speed_flags():
        env["SPARK_SUBMIT_OPTS"] = jvm_speed_flags()
    return env


def store_manifest(kind="kv", key_serde="string", value_serde="json", **properties):
    """The manifest of a two-partition ``murmur2`` store ``s`` (``properties`` as given),
    for tests of what a manifest alone decides (row layouts)."""
    from iqkit.store.manifest import StoreManifest

    return StoreManifest(
        name="s",
        kind=kind,
        partitions=2,
        key_serde=key_serde,
        value_serde=value_serde,
        partitioner="murmur2",
        window_size_ms=1000 if kind == "window" else None,
        properties=properties,
    )
