"""A real multi-process Spark cluster on this machine, for the tests that must not rely on
the driver's and the executors' files being the same (issue 13 item 4).

Spark's ``local-cluster[2,1,1024]`` master runs a standalone master and two workers inside
the driver JVM, and each worker starts its executor as a JVM process of its own
(``CoarseGrainedExecutorBackend``), which runs Python workers of its own. Each executor's
working folder is ``<SPARK_HOME>/work/<app id>/<executor id>``: not the driver's, and not
the other executor's.

Why a separate driver process: only one ``SparkContext`` may run in a Python process, and
the rest of the suite shares one local session (``tests/conftest.py``). The cluster's
driver is a Python process of its own (this file run as a script), which the tests drive
through a pipe: ``ClusterDriver.run(fn, *args)`` sends ``fn`` (cloudpickled by value, so
test modules need not be importable there), runs ``fn(spark, *args)`` on the cluster's
driver and returns its result. Starting it costs what starting the local session costs
(one driver JVM) plus two executor JVMs; stopping and restarting the suite's session
instead would cost the same and end the local session under the other tests.

Quirks worked around:
- A local-cluster worker's folder is ``$SPARK_HOME/work`` (Spark passes it no work-dir
  setting, ``SPARK_WORKER_DIR`` included), which would be inside the venv's pyspark. The
  driver process gets a ``SPARK_HOME`` of its own under the test's scratch folder:
  symlinks to every entry of the installed pyspark (``bin``, ``jars``, ``python``...).
- Executors are JVMs the driver never configures through ``SPARK_SUBMIT_OPTS``: their
  ``java.io.tmpdir`` and perf-data switch go in ``spark.executor.extraJavaOptions``, their
  local (spill) folders in ``spark.local.dir``, which the in-driver workers read.
- The executors register a moment after the session starts: ``_start_session`` waits
  until both have, so the first job can use both.

Spark itself reaches the test S3 server through Hadoop's S3A connector where
``IQKIT_TEST_S3A_JARS`` names the folder ``make test`` fetched it into (``s3a_jars``):
so a streaming query's checkpoint can live on ``s3a://``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from helpers import jvm_speed_flags

#: Executors (workers), cores each, MiB each: the ``local-cluster`` master.
EXECUTORS = 2
MASTER = f"local-cluster[{EXECUTORS},1,1024]"
#: How long the executors may take to register (seconds); a failure, not a wait, past it.
REGISTER_TIMEOUT = 120
#: The folder of Hadoop's S3A jars (``s3a_jars``), set by ``make test``.
S3A_JARS_VARIABLE = "IQKIT_TEST_S3A_JARS"
#: The cluster's ``IQKIT_CACHE``: relative, so each process resolves it in its own working
#: folder — the driver's, and each executor's (Python workers run in their executor's
#: folder) — and no two share a cache, as on a real cluster's separate hosts.
CLUSTER_CACHE = "iqkit-cache"


class ClusterError(RuntimeError):
    """The cluster's driver process failed (its output is in the message)."""


class ClusterDriver:
    """The driver process of a running ``local-cluster`` session (see the module)."""

    def __init__(self, scratch: Path, env: dict[str, str] | None = None) -> None:
        """``env``: variables the driver process, its executors and their Python workers
        get on top of this process's (executors inherit the driver's environment)."""
        self.scratch = Path(scratch)
        self.spark_home = _spark_home(self.scratch / "spark-home")
        self.driver_cwd = self.scratch / "driver"
        self.driver_cwd.mkdir(parents=True, exist_ok=True)
        self._log = open(self.scratch / "driver.log", "w+b")  # noqa: SIM115 (closed in stop)
        to_driver_r, to_driver_w = os.pipe()
        from_driver_r, from_driver_w = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(to_driver_r), str(from_driver_w)],
            cwd=self.driver_cwd,
            env={**_driver_env(self.scratch, self.spark_home), **(env or {})},
            pass_fds=(to_driver_r, from_driver_w),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        os.close(to_driver_r)
        os.close(from_driver_w)
        self._send = Connection(to_driver_w, readable=False)
        self._recv = Connection(from_driver_r, writable=False)
        try:
            self.facts: dict[str, Any] = self._answer()  # the session's start (see _serve)
        except ClusterError:
            self.stop()  # the driver process ends; no pipe, file or zombie is left
            raise

    def run(self, fn, *args: Any) -> Any:
        """``fn(spark, *args)`` on the cluster's driver; its (picklable) result."""
        from pyspark import cloudpickle

        module = sys.modules.get(fn.__module__)
        if module is not None and fn.__module__ != __name__:
            cloudpickle.register_pickle_by_value(module)  # test modules: by value
        try:
            self._send.send_bytes(cloudpickle.dumps((fn, args)))
        except OSError:
            raise ClusterError(f"the cluster's driver is gone:\n{self.output()}") from None
        return self._answer()

    def executor_pids(self) -> list[int]:
        """The pids of the executor JVMs this driver started (alive or not)."""
        return list(self.facts["executor_pids"])

    def output(self) -> str:
        """The driver process's output so far (Spark's log included), its last part."""
        return (self.scratch / "driver.log").read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        """Stop the session (the executors end with it) and the driver process."""
        with contextlib.suppress(OSError):  # a driver that already ended
            self._send.send_bytes(b"")  # an empty message: stop
        try:
            self._proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._send.close()
        self._recv.close()
        self._log.close()

    def _answer(self) -> Any:
        import pickle

        try:
            ok, value = pickle.loads(self._recv.recv_bytes())
        except (EOFError, OSError):
            raise ClusterError(f"the cluster's driver ended:\n{self.output()}") from None
        if not ok:
            raise ClusterError(f"on the cluster's driver:\n{value}")
        return value


def process_ancestry(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of ``pid`` and each of its ancestors, nearest first (Linux
    ``/proc``): how a Python worker finds the executor JVM that started it."""
    out = []
    while pid > 1:
        proc = Path("/proc") / str(pid)
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (proc / "stat").read_text()
        except OSError:
            break
        out.append((pid, cmdline))
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the command's ")"
    return out


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as ended)."""
    out = []
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def _spark_home(home: Path) -> Path:
    """A SPARK_HOME of symlinks to the installed pyspark's entries (see the module)."""
    import pyspark

    installed = Path(pyspark.__file__).parent
    home.mkdir(parents=True, exist_ok=True)
    for entry in installed.iterdir():
        if entry.name not in ("work", "__pycache__") and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    return home


def _driver_env(scratch: Path, spark_home: Path) -> dict[str, str]:
    """The driver process's environment: its JVM, the executors it starts and their
    Python workers keep their scratch files under ``scratch`` (nothing in /tmp)."""
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent  # tests/spark, then tests (helpers)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TMPDIR": str(tmp),
        "SPARK_SUBMIT_OPTS": f"-Djava.io.tmpdir={tmp} -XX:-UsePerfData {jvm_speed_flags()}",
        "SPARK_LAUNCHER_OPTS": f"-XX:-UsePerfData {jvm_speed_flags()}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            [str(here), str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }


def _start_session(scratch: Path):
    """The ``local-cluster`` session, once both executors have registered."""
    from pyspark.sql import SparkSession

    tmp = scratch / "tmp"
    spark = (
        SparkSession.builder.master(MASTER)
        .appName("iqkit-cluster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.executor.memory", "1g")
        .config(
            "spark.executor.extraJavaOptions",
            f"-Djava.io.tmpdir={tmp} -XX:-UsePerfData {jvm_speed_flags()}",
        )
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.task.maxFailures", "1")  # a failing task fails the test at once
    )
    jars = os.environ.get(S3A_JARS_VARIABLE)
    if jars:
        from s3a_jars import jar_paths, spark_s3a_conf

        env = os.environ
        conf = spark_s3a_conf(jar_paths(jars), env["AWS_ENDPOINT_URL"],
                              env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        for name, value in conf.items():
            spark = spark.config(name, value)
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while len(tracker.getExecutorInfos()) < EXECUTORS + 1:  # the driver is listed too
        if time.monotonic() > deadline:
            raise ClusterError(f"{EXECUTORS} executors did not register in {REGISTER_TIMEOUT} s")
        time.sleep(0.2)
    return spark


def _executor_jvm_pids() -> list[int]:
    """The executor JVMs started by this process's JVM (its child processes)."""
    me = os.getpid()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        ancestry = process_ancestry(int(proc.name))
        if any("CoarseGrainedExecutorBackend" in cmd for _, cmd in ancestry[:1]) and any(
            pid == me for pid, _ in ancestry
        ):
            out.append(int(proc.name))
    return sorted(out)


def _serve(to_driver: int, from_driver: int) -> None:
    """The driver process: start the session, report its facts, then run what it is sent
    until an empty message; stop the session."""
    import pickle

    from pyspark import cloudpickle

    recv = Connection(to_driver, writable=False)
    send = Connection(from_driver, readable=False)
    scratch = Path.cwd().parent
    began = time.monotonic()
    try:
        spark = _start_session(scratch)
    except BaseException:
        send.send_bytes(pickle.dumps((False, traceback.format_exc())))
        raise
    send.send_bytes(
        pickle.dumps(
            (
                True,
                {
                    "start_seconds": time.monotonic() - began,
                    "executor_pids": _executor_jvm_pids(),
                    "driver_pid": os.getpid(),
                    "driver_cwd": os.getcwd(),
                    "spark_home": os.environ["SPARK_HOME"],
                    "master": spark.sparkContext.master,
                },
            )
        )
    )
    try:
        while message := recv.recv_bytes():
            try:
                fn, args = cloudpickle.loads(message)
                reply = (True, fn(spark, *args))
                payload = cloudpickle.dumps(reply)
            except BaseException:
                payload = pickle.dumps((False, traceback.format_exc()))
            send.send_bytes(payload)
    except EOFError:
        pass  # the tests' process ended
    finally:
        spark.stop()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
