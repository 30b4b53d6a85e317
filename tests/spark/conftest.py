"""Spark tests use the session-wide ``spark`` fixture of ``tests/conftest.py`` (one local
session); those marked ``cluster`` use ``spark_cluster``, a real multi-process cluster
driven from a separate driver process (``tests/spark/cluster.py``), so both run in one
pytest run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A ``local-cluster`` session's driver (``cluster.ClusterDriver``), started once for
    the run; afterwards, no process it started may be left running."""
    from cluster import ClusterDriver, alive
    from helpers import require_java

    require_java()

    driver = ClusterDriver(tmp_path_factory.mktemp("cluster"))
    yield driver
    started = [driver.facts["driver_pid"], *driver.executor_pids()]
    driver.stop()
    left = alive(started)
    assert not left, f"the cluster left processes running: {left}"
