"""A helper process that builds the next partition of a checkpoint version into the file
cache while this process builds one.

Why: the first open of a version builds every partition (``materialize.open_partition``),
and a query that reads them all asks for them in turn, so one build after another runs
on one core; a build is mostly single-threaded work (threads would share the GIL). While
partition p is built here, the helper builds p + 1 into the shared cache; when p + 1 is
asked for, it is found there (a database in the cache is pinned, never built again).

Only ever an optimisation: every partition is still opened here, through the one build
path, which builds whatever the helper has not (and raises what is wrong with its
files: the helper's own failures are dropped). A partition the helper has not begun when
it is wanted is built here; the helper then finds it built and moves on (or both build
it, and the cache keeps one: ``partitions.builds``).

The helper is ``python -m iqkit.store.checkpoint.prebuild``, started on first use and kept
for the life of the process: it reads requests from its stdin, one JSON line each, says
``started <n>`` and ``done <n>`` on its stdout, and ends when its stdin closes (this
process exiting). It serves local checkpoints only (a remote root's storage options are
this process's), and none starts on one core or in a forked child of the process that
started it.

Off unless ``IQKIT_PREBUILD=1``: a library that starts a process of its own surprises
its host (a notebook kernel, a Spark Python worker, a test run counting processes), and
one process alone already opens a version faster than Spark's state reader reads it
(BENCHMARKS.md). Turn it on where first opens of many partitions matter and a core is
free.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

from ..cache import FileCache
from ..objects import ObjectStore

__all__ = ["ENV_PREBUILD", "Ahead", "ask"]

#: Set to 1 to start the helper (it is off by default: module docstring).
ENV_PREBUILD = "IQKIT_PREBUILD"
#: How long ``Ahead.wait`` waits for a build the helper began (a stuck helper costs this
#: much once, then the partition is built here).
_LONGEST_WAIT = 600.0


class _Helper:
    """This process's helper: its pipes and what it has said, behind one lock (queries
    may run on several threads)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self.lock = threading.Lock()
        self.asked = 0
        self.started: set[int] = set()
        self.done: set[int] = set()
        self.unread = b""
        self.alive = True

    def ask(self, request: dict[str, object]) -> int | None:
        with self.lock:
            if not self.alive:
                return None
            self.asked += 1
            line = json.dumps({**request, "id": self.asked}) + "\n"
            try:
                self.process.stdin.write(line.encode())  # type: ignore[union-attr]
            except OSError:
                self.alive = False
                return None
            return self.asked

    def wait(self, ticket: int) -> None:
        """Until the helper has finished ``ticket``, if it has begun it."""
        deadline = time.monotonic() + _LONGEST_WAIT
        with self.lock:
            self._read(0)
            while self.alive and ticket in self.started and ticket not in self.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._read(left)

    def _read(self, timeout: float) -> None:
        """What the helper has said, waiting up to ``timeout`` seconds for a first line."""
        out = self.process.stdout
        while self.alive:
            ready, _, _ = select.select([out], [], [], timeout)
            if not ready:
                return
            chunk = os.read(out.fileno(), 65536)  # type: ignore[union-attr]
            if not chunk:  # the helper is gone: nothing more is built ahead
                self.alive = False
                self.process.poll()
                return
            *lines, self.unread = (self.unread + chunk).split(b"\n")
            for line in lines:
                word, _, number = line.partition(b" ")
                if number.isdigit() and word in (b"started", b"done"):
                    (self.started if word == b"started" else self.done).add(int(number))
            timeout = 0

    def close(self) -> None:
        if self.pid == os.getpid():
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # type: ignore[union-attr]


_helper: _Helper | None = None
_helper_lock = threading.Lock()


class Ahead:
    """A partition the helper was asked to build."""

    __slots__ = ("_helper", "_ticket")

    def __init__(self, helper: _Helper, ticket: int) -> None:
        self._helper, self._ticket = helper, ticket

    def wait(self) -> None:
        """Return once the helper's build of it is over, if it has begun one."""
        self._helper.wait(self._ticket)


def ask(
    objects: ObjectStore, store: str, cache: FileCache, version: int, p: int, commit: bytes
) -> Ahead | None:
    """Ask the helper to build partition ``p`` of ``store`` at ``version`` into ``cache``
    (``materialize.open_partition``, with ``commit`` as its commit record); ``None`` when
    no helper serves this (module docstring)."""
    if objects.root.local is None or os.environ.get(ENV_PREBUILD, "0") != "1":
        return None
    helper = _running_helper()
    if helper is None:
        return None
    request = {
        "root": os.path.abspath(objects.root.local),
        "store": store,
        "cache": os.fspath(cache.folder),
        "limit": cache.limit,
        "version": version,
        "partition": p,
        "commit": commit.hex(),
    }
    ticket = helper.ask(request)
    return None if ticket is None else Ahead(helper, ticket)


def _running_helper() -> _Helper | None:
    global _helper
    with _helper_lock:
        if _helper is not None and _helper.pid == os.getpid():
            return _helper if _helper.alive else None
        if (os.cpu_count() or 1) < 2:
            return None
        try:
            _helper = _Helper()
        except OSError:
            return None
        atexit.register(_helper.close)
        return _helper


# -- the helper's side ---------------------------------------------------------------------
def _serve() -> None:
    """Build what each request line asks for, saying when each starts and ends."""
    import pyarrow as pa

    from ..objects import open_objects
    from .joins import open_store
    from .layout import operator_stores
    from .materialize import open_partition
    from .providers import StateReader

    # The protocol goes out on a copy of stdout; stdout itself goes where stderr goes
    # (nowhere), so that nothing a library prints can be taken for a reply.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    parent = os.getppid()
    # Quirk: pyarrow imports pandas on its first conversion of Python values (a second or
    # so): done before the first request is begun, so that no build waits on it (the
    # reader builds what the helper has not begun).
    pa.array([0])
    for line in sys.stdin:
        if os.getppid() != parent:
            return  # the reader is gone: what it asked for is nobody's now
        request = json.loads(line)
        ticket = request["id"]
        print(f"started {ticket}", file=replies, flush=True)
        # Its failures are dropped: the reader builds the partition itself, and raises.
        with contextlib.suppress(Exception):
            objects = open_objects(request["root"])
            (store,) = [s for s in operator_stores(objects) if s.name == request["store"]]
            reader, shape = open_store(StateReader(objects), store)
            cache = FileCache(request["cache"], limit=request["limit"])
            part = open_partition(
                reader, shape, store, cache, request["version"], request["partition"],
                bytes.fromhex(request["commit"]),
            )  # fmt: skip
            part.close()
        print(f"done {ticket}", file=replies, flush=True)


if __name__ == "__main__":
    _serve()
