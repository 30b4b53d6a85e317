"""Interrupting SQL: statements run on a worker thread while the caller waits, so the
kernel's stop button (Ctrl-C) or :meth:`QueryWorker.interrupt` from another thread stops
a query at once, raises ``KeyboardInterrupt`` (never a DuckDB error: that is what stops
"Run all") and leaves the connection usable."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import duckdb

T = TypeVar("T")

#: DuckDB's message when a Python interrupt (SIGINT) stops a query it is executing: the
#: client turns the pending ``KeyboardInterrupt`` into ``RuntimeError("Query interrupted")``.
_SIGINT_MESSAGE = "Query interrupted"


def interrupted() -> KeyboardInterrupt:
    return KeyboardInterrupt("SQL query interrupted")


class QueryWorker:
    """Runs one query at a time (the caller serialises them) on a worker thread.

    Quirk: DuckDB notices a pending SIGINT only when the calling thread checks for
    signals between the tasks it executes itself, and with the pool's threads busy
    that may not happen until the query ends (measured with duckdb 2.0: about half
    of the Ctrl-Cs during a long scan were ignored). Here the calling thread only
    waits, which Python interrupts at once; it then interrupts DuckDB, waits for the
    worker to clean up, and raises ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self._cancel = threading.Event()  # set when the waiting caller was interrupted
        self._executing = False  # the worker is running statements (not cleaning up)

    def run(self, con: duckdb.DuckDBPyConnection, work: Callable[[], T]) -> T:
        """``work()`` on a worker thread; its result, or its exception raised here."""
        outcome: list[tuple[bool, Any]] = []
        done = threading.Event()
        cancel = self._cancel = threading.Event()

        def target() -> None:
            try:
                outcome.append((True, work()))
            except BaseException as e:
                outcome.append((False, e))
            finally:
                done.set()

        threading.Thread(target=target, name="iqkit-sql", daemon=True).start()
        try:
            done.wait()
        except KeyboardInterrupt:
            cancel.set()
            while not done.is_set():
                if self._executing:  # not once the worker is cleaning up
                    con.interrupt()  # a no-op between statements: `cancel` stops those
                # Pressed again: still let the worker finish cleaning up.
                with contextlib.suppress(KeyboardInterrupt):
                    done.wait(0.05)
            raise interrupted() from None
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    @contextlib.contextmanager
    def executing(self) -> Iterator[None]:
        """Around the statements (not their cleanup), on the worker thread: DuckDB's
        ways of saying it was interrupted become ``KeyboardInterrupt``."""
        import duckdb

        self._executing = True
        try:
            yield
        except duckdb.InterruptException:
            # con.interrupt() stopped the query (interrupt() or a Ctrl-C).
            raise interrupted() from None
        except RuntimeError as e:
            # DuckDB's reaction to a SIGINT it noticed itself. It cannot from this worker
            # thread (Python hands signals to the main thread only); mapped all the same.
            if str(e) != _SIGINT_MESSAGE:
                raise
            raise interrupted() from None
        finally:
            self._executing = False

    def check_cancel(self) -> None:
        """Raise ``KeyboardInterrupt`` if the running query was interrupted."""
        if self._cancel.is_set():
            raise interrupted()

    def interrupt(self, con: duckdb.DuckDBPyConnection) -> None:
        """Stop the query running on ``con`` (from any thread)."""
        self._cancel.set()
        con.interrupt()
