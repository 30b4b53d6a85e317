"""Progress of a long Spark write where the user is looking: a tqdm bar (a widget in
Jupyter, text in a terminal) fed by Spark's status tracker, not only Spark's log.

One bar at a time: Spark draws its own console bar (``spark.ui.showConsoleProgress``,
on by default in PySpark, whose JVM starts as a ``pyspark-shell``) on the same stderr
line, and the two wrote over each other. While an iqkit bar runs, Spark's is set aside
(:class:`_SparkConsoleBarPause`) and put back when the write ends, so every other job
keeps the bar the session was configured with; no setting of the session changes.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from pyspark import SparkContext

_POLL_SECONDS = 0.5


class WriteProgress:
    """Tasks done / total of the running Spark stages, then the partitions and rows
    written. A context manager; ``enabled=False`` shows nothing (and leaves Spark's own
    console bar alone)."""

    def __init__(self, sc: SparkContext, store: str, *, enabled: bool = True) -> None:
        # Imported here, not at the top: this module is imported wherever iqkit.spark is,
        # Spark's Python workers included, and tqdm.auto costs ~60 ms there for nothing.
        from tqdm.auto import tqdm

        self._sc = sc
        self._spark_bar = _SparkConsoleBarPause(sc) if enabled else None
        self._bar = tqdm(total=0, desc=f"iqkit write {store!r}", unit="task", disable=not enabled)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="iqkit-progress", daemon=True)

    def __enter__(self) -> WriteProgress:
        if self._spark_bar is not None:
            self._spark_bar.__enter__()
            self._thread.start()
        return self

    def _poll(self) -> None:
        tracker = self._sc.statusTracker()
        while not self._stop.wait(_POLL_SECONDS):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                self._bar.total = max(self._bar.total or 0, total)
                self._bar.n = min(done, self._bar.total)
                self._bar.refresh()

    def finish(self, *, partitions: int, rows: int, version: int) -> None:
        """Report what was written (always shown, however fast the job was): ``rows``
        counts records (a window store's window is one row, not its two RocksDB keys)."""
        self._bar.set_postfix(version=version, partitions=partitions, rows=rows, refresh=False)
        self._bar.n = self._bar.total or 0

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._bar.close()
        if self._spark_bar is not None:
            self._spark_bar.__exit__(*exc_info)


class _SparkConsoleBarPause:
    """Sets Spark's console progress bar aside while iqkit's own bar runs.

    Quirk: Spark 4.1–4.3 have no switch for that. ``spark.ui.showConsoleProgress`` is read
    once, when the ``SparkContext`` starts, into ``SparkContext._progressBar`` (an
    ``Option[ConsoleProgressBar]`` whose timer redraws every 200 ms); a
    ``ConsoleProgressBar`` can be stopped but not restarted. So: clear its line and stop
    it, leave ``_progressBar`` empty while iqkit's bar runs (``runJob`` then has no bar
    to finish), and put a new ``ConsoleProgressBar`` there afterwards — the same class
    Spark itself builds from the same configuration. The field is private, so it is set
    by Java reflection through py4j. Nested or concurrent iqkit writes share one pause.
    If any step fails (another Spark version), Spark's bar is left as it is and a
    warning says so: two bars again, nothing worse."""

    _lock = threading.Lock()
    _depth = 0
    _restore: Callable[[], None] | None = None

    def __init__(self, sc: SparkContext) -> None:
        self._sc = sc

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth += 1
            if cls._depth == 1:
                cls._restore = _guarded(lambda: _set_aside(self._sc), "set aside")

    def __exit__(self, *exc_info: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0 and cls._restore is not None:
                restore, cls._restore = cls._restore, None
                _guarded(restore, "restore")


def _set_aside(sc: SparkContext) -> Callable[[], None] | None:
    """Stop Spark's console bar; return what puts a new one back (None: there was none)."""
    jvm = sc._jvm  # type: ignore[attr-defined]
    jsc = sc._jsc.sc()  # type: ignore[union-attr]
    field = jsc.getClass().getDeclaredField("_progressBar")
    field.setAccessible(True)
    current = field.get(jsc)
    if not current.isDefined():
        return None  # spark.ui.showConsoleProgress is off: nothing to set aside
    field.set(jsc, jvm.scala.Option.empty())
    old = current.get()
    old.finishAll()  # clears the line if the bar is showing
    old.stop()

    def restore() -> None:
        if jsc.isStopped():
            return
        field.set(jsc, jvm.scala.Option.apply(jvm.org.apache.spark.ui.ConsoleProgressBar(jsc)))

    return restore


def _guarded(step: Callable[[], Any], what: str) -> Any:
    try:
        return step()
    except Exception as exc:  # py4j errors: a Spark without these private members
        warnings.warn(
            f"iqkit could not {what} Spark's console progress bar ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); both bars may show",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
