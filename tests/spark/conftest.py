"""Spark tests use the session-wide ``spark`` fixture of ``tests/conftest.py`` (one local
session); those marked ``cluster`` use ``spark_cluster``, a real multi-process cluster
driven from a separate driver process (``tests/spark/cluster.py``), so both run in one
pytest run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory, s3_endpoint):
    """A ``local-cluster`` session's driver (``cluster.ClusterDriver``), started once for
    the run; afterwards, no process it started may be left running. Its driver and
    executors reach the test S3 server through the standard AWS variables, each with a
    cache of its own (``CLUSTER_CACHE``)."""
    from cluster import CLUSTER_CACHE, ClusterDriver, alive
    from helpers import require_java
    from s3server import spark_worker_env

    require_java()

    env = spark_worker_env(s3_endpoint, CLUSTER_CACHE)
    driver = ClusterDriver(tmp_path_factory.mktemp("cluster"), env=env)
    yield driver
    started = [driver.facts["driver_pid"], *driver.executor_pids()]
    driver.stop()
    left = alive(started)
    assert not left, f"the cluster left processes running: {left}"
