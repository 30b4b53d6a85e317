"""Shared fixtures: every test gets a fresh root folder on disk (real RocksDB); the
object-storage tests, wherever they are, get a real S3-compatible server (``s3_root``).
Helper functions live in ``tests/helpers.py`` and ``tests/s3server.py``."""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from s3server import aws_env, new_bucket, spark_worker_env

# No test asserts on time, Hypothesis' per-example deadline included: on a loaded 2-core
# machine a 200 ms deadline failed a correct bulk-decode example (DeadlineExceeded).
settings.register_profile("iqkit", deadline=None)
settings.load_profile("iqkit")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root folder for stores (created by the writer side on first use)."""
    return tmp_path / "stores"


@pytest.fixture(scope="session")
def spark(s3_endpoint, tmp_path_factory):
    """One local Spark session for every test that needs one (starting one costs seconds).
    Its Python workers can reach the test S3 server (``s3server.spark_worker_env``), with
    a cache folder of their own, so the Spark tests can use ``s3_root`` too."""
    from helpers import require_java

    require_java()
    from pyspark.sql import SparkSession

    # Executors must run this interpreter (the venv's), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cache = tmp_path_factory.mktemp("spark-workers-cache")
    for name, value in spark_worker_env(s3_endpoint, os.fspath(cache)).items():
        os.environ.setdefault(name, value)
    session = (
        SparkSession.builder.master("local[2, 4]")  # 2 threads, 4 attempts per task
        .appName("iqkit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- object storage: a real S3-compatible server (tests/s3server.py) -------------------
def _serialize_conditional_writes() -> None:
    """Make moto's conditional PUT atomic, as S3's is.

    Quirk: moto 5 checks ``If-None-Match`` and then stores the object as two steps with no
    lock, and its server handles requests on several threads, so two racing creators
    could both pass the check. Real S3 decides the race on the server; one lock around
    moto's object-writing handlers gives the tests the same guarantee (iqkit's code is
    untouched)."""
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_iqkit_serialized", False):
        return
    lock = threading.RLock()
    for name in ("put_object", "_key_response_post"):
        original = getattr(S3Response, name)

        @functools.wraps(original)
        def locked(self, *args, __original=original, **kwargs):
            with lock:
                return __original(self, *args, **kwargs)

        setattr(S3Response, name, locked)
    S3Response._iqkit_serialized = True


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server running for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    _serialize_conditional_writes()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_root(s3_endpoint, monkeypatch, tmp_path) -> str:
    """``s3://<fresh bucket>/stores``, with the AWS variables pointing at the server and
    ``IQKIT_CACHE`` at a fresh folder (never the user's cache)."""
    aws_env(monkeypatch, s3_endpoint)
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "iqkit-cache"))
    return f"s3://{new_bucket(s3_endpoint)}/stores"


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in the main thread during the test, as in a
    Jupyter kernel (what its stop button sends). Quirk: a process started in the
    background by a shell without job control (``make test &`` in a script) inherits
    SIGINT ignored, and Python then installs no handler: a test that interrupts itself
    would wait forever."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _no_damage_known_from_other_tests() -> Iterator[None]:
    """Each test starts with no file known damaged (store/integrity.py keeps what a
    process found damaged for the process's life; tests share worker processes)."""
    from iqkit.store.integrity import KNOWN_DAMAGE

    KNOWN_DAMAGE.clear()
    yield
    KNOWN_DAMAGE.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` or ``cluster`` test run first, then the notebooks (a
    stable sort: the order within each group stays). ``make test``'s ``--dist loadfile
    --no-loadscope-reorder`` hands out whole files in collection order (xdist's default
    hands out the files with most tests first), and the longest files (the README's
    blocks, the demo, the cluster), collected last by name, were the run's tail, with the
    other worker idle."""
    heavy = {
        item.path
        for item in items
        if item.get_closest_marker("slow") or item.get_closest_marker("cluster")
    }
    items.sort(key=lambda item: 0 if item.path in heavy else 1 if _is_notebook(item) else 2)


def _is_notebook(item: pytest.Item) -> bool:
    """A notebook's cell (nbval): each notebook is a kernel and often a Spark session,
    so the notebooks go right after the heavy files, before the many short tests."""
    return item.path.suffix == ".ipynb"


#: Test files that share one ``local-cluster`` (the session-scoped ``spark_cluster``
#: fixture: a driver, a master, a worker and two executor JVMs, ~25 CPU-s to start).
_CLUSTER_FILES = re.compile(r"(^|/)test_cluster[^/]*\.py$")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadfile``, the cluster's test files go to one worker as one unit,
    so one cluster starts per run, not one per worker that drew a cluster file."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _OneClusterScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "the local-cluster files" if _CLUSTER_FILES.search(scope) else scope

    return _OneClusterScheduling(config, log)
