"""iqkit's Spark writers and reader on a real multi-process cluster (``local-cluster``:
two executor JVMs, each in a working folder of its own; ``tests/spark/cluster.py``).

Each test's body runs on the cluster's driver (``spark_cluster.run``); functions passed to
Spark run in the executors' Python workers. The root is an absolute path on this
machine's disk, which every executor sees (today's format needs that); nothing else may
be shared: no test relies on an executor's working folder being the driver's.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster


def _where_tasks_run(spark, tasks: int) -> list[dict]:
    """Per task: the executor JVM (pid, id, command line) running it, and the Python
    worker's interpreter, working folder and spill folder."""

    def where(_):
        import sys

        from cluster import process_ancestry

        from iqkit.spark.workers import spill_dir

        jvm = next((pid, cmd) for pid, cmd in process_ancestry(os.getpid()) if " -cp " in cmd)
        words = jvm[1].split()
        yield {
            "jvm_pid": jvm[0],
            "executor_id": words[words.index("--executor-id") + 1]
            if "--executor-id" in words
            else None,
            "jvm_args": words,
            "python": sys.executable,
            "cwd": os.getcwd(),
            "spill_dir": spill_dir(),
        }

    return spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(where).collect()


def test_tasks_run_in_two_executor_processes_with_their_own_folders(spark_cluster):
    tasks = spark_cluster.run(_where_tasks_run, 8)
    facts = spark_cluster.facts
    jvms = {t["jvm_pid"] for t in tasks}
    assert len(jvms) == 2, tasks
    assert jvms == set(spark_cluster.executor_pids())
    assert len({t["executor_id"] for t in tasks} - {None}) == 2
    cwds = {t["executor_id"]: t["cwd"] for t in tasks}
    assert len(set(cwds.values())) == 2  # one folder per executor...
    for cwd in cwds.values():  # ...neither of them the driver's, all in the test's scratch
        assert cwd != facts["driver_cwd"]
        assert Path(cwd).is_relative_to(spark_cluster.scratch)
    # The venv's Python; JVM scratch and spills under the test's folder, no perf data.
    assert {t["python"] for t in tasks} == {sys.executable}
    for t in tasks:
        assert f"-Djava.io.tmpdir={spark_cluster.scratch / 'tmp'}" in t["jvm_args"]
        assert "-XX:-UsePerfData" in t["jvm_args"]
    spills = {t["executor_id"]: t["spill_dir"] for t in tasks}
    assert len(set(spills.values())) == 2
    assert all(Path(s).is_relative_to(spark_cluster.scratch / "local") for s in spills.values())


def _write_store_and_read(spark, root: str, store: str) -> dict:
    """``write_store`` into ``root`` (as given: absolute or relative), then every row back
    through ``spark.read.format("iqkit")`` (given the absolute folder: Spark plans a data
    source in a Python worker whose working folder is the driver JVM's, like its own file
    sources) and the driver's ``iqkit.open`` (given ``root``)."""
    from helpers import kv_rows

    import iqkit
    from iqkit.spark import write_store

    df = spark.createDataFrame([(f"k{i}", i) for i in range(400)], "k string, n long")
    version = write_store(df, root, store, key="k", value="n", partitions=4, progress=True)
    folder = os.path.abspath(root)
    read = spark.read.format("iqkit").option("store", store).load(folder)
    rows = sorted((r["key"], r["value"], r["partition"]) for r in read.collect())
    with iqkit.open(root) as engine:
        engine_rows = len(kv_rows(engine, store))
    return {"version": version, "rows": rows, "engine_rows": engine_rows, "cwd": os.getcwd()}


def test_write_store_and_read_back_with_an_absolute_root(spark_cluster):
    root = spark_cluster.scratch / "abs-stores"
    out = spark_cluster.run(_write_store_and_read, str(root), "counts")
    assert out["version"] == 1
    assert [(k, v) for k, v, _ in out["rows"]] == sorted((f"k{i}", i) for i in range(400))
    assert {p for *_, p in out["rows"]} == {0, 1, 2, 3}
    assert out["engine_rows"] == 400
    assert (root / "counts").is_dir()
    # The progress bar followed the tasks through the status tracker, then said what was
    # written (tqdm writes to the driver's stderr, in its log).
    log = (spark_cluster.scratch / "driver.log").read_text(errors="replace")
    final = r"iqkit write 'counts':[^\r\n]* 4/4 [^\r\n]*partitions=4, rows=400, version=1"
    assert re.search(final, log)


def _datasource_write_and_read(spark, root: str) -> list[tuple]:
    df = spark.createDataFrame(
        [(i, f"name{i}", i * 1.5) for i in range(300)], "id int, name string, score double"
    ).repartition(3)
    df.write.format("iqkit").mode("append").option("store", "people").option("key", "id").option(
        "partitions", "3"
    ).save(root)
    read = spark.read.format("iqkit").option("store", "people").load(root)
    # The written record's columns read back typed, the key under its own name.
    return sorted((r["id"], {"name": r["name"], "score": r["score"]}) for r in read.collect())


def test_datasource_write_and_read_with_an_absolute_root(spark_cluster):
    root = spark_cluster.scratch / "ds-stores"
    rows = spark_cluster.run(_datasource_write_and_read, str(root))
    assert [k for k, _ in rows] == list(range(300))
    assert [v for _, v in rows[:2]] == [
        {"name": "name0", "score": 0.0},
        {"name": "name1", "score": 1.5},
    ]


def _relative_root_from(spark, folder: str, store: str) -> dict:
    os.chdir(folder)  # what a notebook does; the executors' working folders do not follow
    return _write_store_and_read(spark, "rel-stores", store)


def test_relative_root_is_resolved_on_the_driver(spark_cluster):
    folder = spark_cluster.scratch / "notebook-folder"
    folder.mkdir()
    out = spark_cluster.run(_relative_root_from, str(folder), "relative")
    assert out["cwd"] == str(folder) != spark_cluster.facts["driver_cwd"]
    assert out["version"] == 1
    assert out["engine_rows"] == len(out["rows"]) == 400
    assert (folder / "rel-stores" / "relative").is_dir()
    # Nothing landed beside the executors' working folders, where a relative root would
    # point in the tasks.
    work = spark_cluster.spark_home / "work"
    assert list(work.rglob("rel-stores")) == []


def _stream_into_store(spark, folder: str) -> dict:
    """Three micro-batches from the local Kafka stand-in through ``store_sink``."""
    from helpers import kv_rows, orders, run_available_now

    import iqkit
    from iqkit.spark import store_sink
    from iqkit.spark.kafka_local import LocalKafkaTopic

    topic = LocalKafkaTopic(os.path.join(folder, "topics"), "orders", 2)
    for start in (0, 10, 20):
        topic.produce(orders(start, 10))
    root = os.path.join(folder, "stores")
    sink = store_sink(
        root, "latest", key="user", value="amount", partitions=2, end_offsets=topic.end_position
    )
    checkpoint = os.path.join(folder, "checkpoint")
    run_available_now(spark, topic, sink, checkpoint, max_files_per_trigger=1)
    with iqkit.open(root) as engine:
        return {
            "versions": len(engine.versions("latest")),
            "values": {k: v for _, k, v in kv_rows(engine, "latest")},
        }


def test_store_sink_commits_micro_batches(spark_cluster):
    folder = spark_cluster.scratch / "streaming"
    out = spark_cluster.run(_stream_into_store, str(folder))
    assert out["versions"] >= 2  # several micro-batches, one version each
    # the last record of each user wins: amounts 23..29 belong to users 2..6, 0, 1
    assert out["values"] == {f"user-{i % 7}": i for i in range(23, 30)}
