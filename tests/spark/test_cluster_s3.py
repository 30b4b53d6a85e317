"""iqkit's Spark writers and reader on a real multi-process cluster with the root on S3
(a real S3-compatible server on 127.0.0.1): the executors build and upload each
partition, the driver publishes, and each executor reads through a cache of its own.

Nothing on disk is shared between the driver and the executors: the root is a URL, and
each process's cache (``IQKIT_CACHE``, relative: ``cluster.CLUSTER_CACHE``) lies in its
own working folder. The store the cluster wrote is then explored with ``%iq`` from a
separate Python process whose only access is the S3 endpoint and its keys.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster import CLUSTER_CACHE
from helpers import run_python_script
from s3server import aws_env, new_bucket, reader_only_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def written(spark_cluster, s3_endpoint) -> tuple[str, dict]:
    """A fresh bucket's root and what ``_write_and_read_on_s3`` returned on the cluster
    (run once for the module: it is the slow part)."""
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, s3_endpoint)
        root = f"s3://{new_bucket(s3_endpoint)}/stores"
    scratch = spark_cluster.scratch / "s3-stream"  # the Kafka stand-in and checkpoint
    scratch.mkdir()
    return root, spark_cluster.run(_write_and_read_on_s3, root, str(scratch))


def _store_files(folder: Path) -> list[Path]:
    """The store's files under ``folder``: SSTs and their columnar twins (a scan of a
    twinned partition fetches its twins, a key lookup its SSTs)."""
    return [p for p in folder.rglob("*") if p.suffix in (".sst", ".parquet") and p.is_file()]


def _cached_files(folder: Path) -> list[Path]:
    """The store files a cache under ``folder`` fetched (``objects/``)."""
    return _store_files(folder / CLUSTER_CACHE / "objects")


def _write_and_read_on_s3(spark, root: str, scratch: str) -> dict:
    """``write_store``, ``df.write.format("iqkit")`` and ``store_sink`` into ``root``, then
    every store read back through ``spark.read.format("iqkit")`` (tasks on executors),
    with the executor that ran each read task."""
    from helpers import orders, run_available_now

    from iqkit.spark import store_sink, write_store
    from iqkit.spark.kafka_local import LocalKafkaTopic

    df = spark.createDataFrame([(f"k{i}", i) for i in range(400)], "k string, n long")
    write_store(df, root, "counts", key="k", value="n", partitions=4, progress=False)
    write_store(df.where("n < 10").selectExpr("k", "n * 10 AS n"), root, "counts", key="k",
                value="n", partitions=4, progress=False)  # fmt: skip
    people = spark.createDataFrame(
        [(i, f"name{i}") for i in range(300)], "id int, name string"
    ).repartition(3)
    (people.write.format("iqkit").mode("append").option("store", "people")
        .option("key", "id").option("partitions", "3").save(root))  # fmt: skip
    # The Kafka stand-in's files are on this machine's disk (a real broker cannot run
    # here); the store they stream into is on S3.
    topic = LocalKafkaTopic(os.path.join(scratch, "topics"), "orders", 2)
    for start in (0, 10, 20):
        topic.produce(orders(start, 10))
    sink = store_sink(
        root, "latest", key="user", value="amount", partitions=2, end_offsets=topic.end_position
    )
    run_available_now(spark, topic, sink, os.path.join(scratch, "checkpoint"),
                      max_files_per_trigger=1)  # fmt: skip

    def read(store: str) -> list[tuple]:
        rows = spark.read.format("iqkit").option("store", store).load(root).collect()
        if store == "people":  # a record of columns: typed, the key under its own name
            return sorted((r["id"], {"name": r["name"]}, r["partition"]) for r in rows)
        return sorted((r["key"], r["value"], r["partition"]) for r in rows)

    return {
        "counts": read("counts"),
        "people": read("people"),
        "latest": read("latest"),
    }


def test_cluster_writes_to_s3_and_reads_through_each_executors_cache(spark_cluster, written):
    _, out = written
    expected = {f"k{i}": i * 10 if i < 10 else i for i in range(400)}
    assert {k: v for k, v, _ in out["counts"]} == expected
    assert {p for *_, p in out["counts"]} == {0, 1, 2, 3}
    assert [k for k, _, _ in out["people"]] == list(range(300))
    assert out["people"][7][1] == {"name": "name7"}
    # store_sink: the last record of each user wins (amounts 23..29: users 2..6, 0, 1)
    assert {k: v for k, v, _ in out["latest"]} == {f"user-{i % 7}": i for i in range(23, 30)}
    # Each executor fetched SSTs into a cache in its own working folder.
    work = spark_cluster.spark_home / "work"
    executor_folders = [p for p in work.glob("*/*") if p.is_dir()]
    fetched = {p: _cached_files(p) for p in executor_folders}
    assert sum(1 for files in fetched.values() if files) == 2, fetched
    # Nothing of the store is on the driver's or the executors' disks but those caches.
    driver_cwd = Path(spark_cluster.facts["driver_cwd"])
    # (The driver's cache may hold databases of test_cluster.py's local-root stores.)
    outside = [p for p in _store_files(driver_cwd) if CLUSTER_CACHE not in p.parts]
    assert not list(work.rglob("stores")) and not outside, outside
    stream = spark_cluster.scratch / "s3-stream"  # the Kafka stand-in's topics are Parquet
    assert not [p for p in _store_files(stream) if "topics" not in p.relative_to(stream).parts]


def _explore_script() -> str:
    """A fresh Python process: a real IPython shell, ``%load_ext iqkit`` and ``%iq``."""
    return r"""
import json, sys
from iqkit.jupyter.testing import new_shell
sh = new_shell(progress=False)
run = lambda line: sh.run_cell(line).result
root = sys.argv[1]
opened = repr(run(f"%iq open {root}"))
got = run("%iq get counts k3 --trace")
trace = run("%iq trace")
fetch = trace[trace["layer"] == "FileCache"]["detail"].tolist()
scan = run("%iq scan people --limit 0").rows
print("RESULT" + json.dumps({
    "opened": opened,
    "k3": got.rows["value"].tolist(),
    "fetch": fetch,
    "people": int(scan.shape[0]),
}))
"""


def test_a_store_the_cluster_wrote_is_explored_with_iq_from_another_process(
    written, s3_endpoint, tmp_path
):
    root, _ = written
    # Only the endpoint, the keys and a cache of its own: no Spark, no shared folder.
    env = reader_only_env(s3_endpoint, str(tmp_path / "home"))
    cwd = tmp_path / "notebook"
    cwd.mkdir()
    out = run_python_script(_explore_script(), root, cwd=cwd, env=env)
    assert "3 store(s): counts, latest, people" in out["opened"]
    assert out["k3"] == [30]
    assert len(out["fetch"]) == 1 and "fetched" in out["fetch"][0]
    assert out["people"] == 300
    assert os.listdir(cwd) == []  # nothing written where the notebook runs
