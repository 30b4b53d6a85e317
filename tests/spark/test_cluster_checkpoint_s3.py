"""A streaming query on the real multi-process cluster keeps its state in a checkpoint
on object storage (``s3a://`` on the test S3 server, through Hadoop's S3A connector:
``s3a_jars``), written by its executors. Another process, with only the endpoint and
the keys, opens that checkpoint with iqkit: every committed version, partition by
partition, holds exactly what Spark's own state reader (``format("statestore")``) read
on the cluster, and a key lookup reads one partition.
"""

from __future__ import annotations

import json
import os

import pytest
from cluster import S3A_JARS_VARIABLE
from helpers import run_python_script
from s3server import aws_env, new_bucket, reader_only_env

pytestmark = pytest.mark.cluster

#: Three micro-batches: new keys, then updates and new keys.
BATCHES = [
    [{"user": "alice", "amount": 5}, {"user": "bob", "amount": 2}],
    [
        {"user": "alice", "amount": 7},
        {"user": "carol", "amount": 1},
        {"user": "émile", "amount": 9},
    ],
    [{"user": "dave", "amount": 3}, {"user": "bob", "amount": 4}],
]  # fmt: skip
PARTITIONS = 4


@pytest.fixture(scope="module")
def checkpoint_on_s3(spark_cluster, s3_endpoint) -> tuple[str, dict]:
    """(the checkpoint's ``s3a://`` URL, Spark's state rows of each version as the
    cluster read them)."""
    if not os.environ.get(S3A_JARS_VARIABLE):
        pytest.fail(
            f"{S3A_JARS_VARIABLE} is not set: run the tests with `make test`, which fetches "
            "Hadoop's S3A jars (tests/spark/s3a_jars.py)"
        )
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, s3_endpoint)
        bucket = new_bucket(s3_endpoint)
    url = f"s3a://{bucket}/checkpoints/totals"
    return url, spark_cluster.run(_stream_on_s3, bucket, url)


def _stream_on_s3(spark, bucket: str, url: str) -> dict:
    """Run the aggregation one micro-batch per batch, its input files and checkpoint in
    ``bucket``; return the state reader's rows per version: {version: {partition:
    {user: [sum, count]}}}."""
    import boto3
    from pyspark.sql import functions as F

    s3 = boto3.client("s3")  # the driver's AWS variables: the test server
    inputs = f"s3a://{bucket}/input"
    for number, records in enumerate(BATCHES):
        body = "".join(json.dumps(r) + "\n" for r in records).encode()
        s3.put_object(Bucket=bucket, Key=f"input/batch-{number}.json", Body=body)
        totals = (
            spark.readStream.schema("user string, amount long")
            .json(inputs)
            .groupBy("user")
            .agg(F.sum("amount").alias("total"), F.count("*").alias("orders"))
        )
        spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
        query = (
            totals.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", url)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    versions = {}
    for version in range(1, len(BATCHES) + 1):
        rows = spark.read.format("statestore").option("batchId", version - 1).load(url)
        by_partition: dict[int, dict[str, list[int]]] = {}
        for row in rows.collect():
            value = row["value"]
            by_partition.setdefault(row["partition_id"], {})[row["key"]["user"]] = [
                value[0],
                value[1],
            ]
        versions[version] = by_partition
    return versions


_OPEN_AND_READ = r"""
import json, sys
import iqkit
from iqkit import KeyQuery, RangeQuery, StateQueryRequest

url, versions = sys.argv[1], int(sys.argv[2])
out = {"versions": {}}
with iqkit.open(url) as engine:
    out["stores"] = engine.store_names()
    out["committed"] = engine.versions("aggregate")
    request = StateQueryRequest.in_store("aggregate").with_query(KeyQuery.with_key("alice"))
    result = engine.query(request)
    out["alice"] = {p: r.result for p, r in result.partition_results.items()}
for version in range(1, versions + 1):
    with iqkit.open(url, as_of=version) as engine:
        request = StateQueryRequest.in_store("aggregate").with_query(RangeQuery.with_no_bounds())
        rows = {}
        for p, partition in engine.query(request).partition_results.items():
            assert partition.is_success, partition.failure_message
            found = {kv.key: [kv.value["sum"], kv.value["count"]] for kv in partition.result}
            if found:
                rows[p] = found
        out["versions"][version] = rows
print("RESULT" + json.dumps(out))
"""


def test_a_checkpoint_the_cluster_wrote_on_s3_opens_from_another_process(
    checkpoint_on_s3, s3_endpoint, tmp_path
):
    url, spark_rows = checkpoint_on_s3
    # Only the endpoint, the keys and a cache of its own: no Spark, no shared folder.
    env = reader_only_env(s3_endpoint, str(tmp_path / "home"))
    cwd = tmp_path / "reader"
    cwd.mkdir()
    out = run_python_script(_OPEN_AND_READ, url, str(len(BATCHES)), cwd=cwd, env=env)
    assert out["stores"] == ["aggregate"]
    assert out["committed"] == [1, 2, 3]
    expected = {
        str(v): {str(p): rows for p, rows in parts.items()} for v, parts in spark_rows.items()
    }
    assert out["versions"] == expected
    # The key lookup ran on the one partition Spark's hash put "alice" in.
    (owner,) = out["alice"]
    assert "alice" in expected["3"][owner]
    assert out["alice"][owner] == {"sum": 12, "count": 2}
    assert os.listdir(cwd) == []  # nothing written where the reader runs
