"""Progress of a long Spark write where the user is looking: a tqdm bar (a widget in
Jupyter, text in a terminal) fed by Spark's status tracker, not only Spark's log."""

from __future__ import annotations

import threading
from types import TracebackType

from pyspark import SparkContext

_POLL_SECONDS = 0.5


class WriteProgress:
    """Tasks done / total of the running Spark stages, then the partitions and rows
    written. A context manager; ``enabled=False`` shows nothing."""

    def __init__(self, sc: SparkContext, store: str, *, enabled: bool = True) -> None:
        # Imported here, not at the top: this module is imported wherever iqkit.spark is,
        # Spark's Python workers included, and tqdm.auto costs ~60 ms there for nothing.
        from tqdm.auto import tqdm

        self._sc = sc
        self._bar = tqdm(total=0, desc=f"iqkit write {store!r}", unit="task", disable=not enabled)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="iqkit-progress", daemon=True)

    def __enter__(self) -> WriteProgress:
        if not self._bar.disable:
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
        """Report what was written (always shown, however fast the job was)."""
        self._bar.set_postfix(version=version, partitions=partitions, rows=rows, refresh=False)
        self._bar.n = self._bar.total or 0

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._bar.close()
