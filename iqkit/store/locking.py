"""The writers' commit lock: one commit at a time per store, and it says who holds it.

An ``flock`` on ``<store>/writer.lock``: the kernel drops it when its holder dies, so a
crashed writer never leaves the store locked. The holder writes a line about itself
(host, pid, what it is doing, since when) so a waiting writer's error names it, rather
than RocksDB's bare "lock hold by current process", which says neither who nor since
when: the first thing a person asks when two writers collide.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import StoreIOError, StoreLockedError
from .objects import refused

_POLL_SECONDS = 0.02


def lock_file(
    path: str | os.PathLike[str] | Path,
    *,
    timeout: float,
    on_timeout: Callable[[int], BaseException],
) -> int:
    """An exclusive ``flock`` on ``path`` (created if missing), waited for up to ``timeout``
    seconds; returns the open descriptor (``unlock_file`` releases it). On timeout,
    ``on_timeout(fd)`` builds the error (it may read the file, e.g. who holds it), the
    descriptor is closed and the error raised. The one home of the lock-with-deadline
    loop: the store's commit lock and the local Kafka topic's produce lock use it. A
    non-blocking ``flock`` polled, since ``flock`` itself takes no timeout. A ``path``
    that is a symbolic link, or not a plain file, is refused (``StoreIOError``)."""
    fd = _open_lock(path)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                try:
                    error = on_timeout(fd)
                finally:
                    os.close(fd)
                raise error from None
            time.sleep(_POLL_SECONDS)


def _open_lock(path: str | os.PathLike[str] | Path) -> int:
    """``path`` opened (created if missing) for locking and writing: never through a
    symbolic link, and only a plain file. Whoever can write the folder (a store's
    writer) could plant a link named like the lock, and the holder truncates the lock
    file to write its line: a root-run commit would truncate the link's target, say
    ``/etc/passwd``. ``O_NONBLOCK``: a FIFO planted there must not hang the open."""
    flags = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        mode = os.stat(path, follow_symlinks=False).st_mode
        raise StoreIOError(_not_a_lock(path, mode)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreIOError(_not_a_lock(path, mode))
    return fd


def _not_a_lock(path: str | os.PathLike[str] | Path, mode: int) -> str:
    return f"cannot lock: {refused(os.fspath(path), mode).strerror}; remove it and retry"


def unlock_file(fd: int) -> None:
    """Release a lock ``lock_file`` took and close its descriptor."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def describe_holder(info: dict[str, object]) -> str:
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since))) if since else "?"
    who, pid, host = info.get("who", "?"), info.get("pid", "?"), info.get("host", "?")
    return f"{who} (pid {pid} on {host}) since {when}"


class CommitLock:
    """Exclusive commit lock for one store (its lock file ``path``); waits up to
    ``timeout`` seconds."""

    def __init__(
        self, path: str | os.PathLike[str], store: str, *, who: str, timeout: float
    ) -> None:
        self._path = path
        self._store = store
        self._who = who
        self._timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> CommitLock:
        fd = lock_file(self._path, timeout=self._timeout, on_timeout=self._locked)
        info = {
            "who": self._who,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def _locked(self, fd: int) -> StoreLockedError:
        return StoreLockedError(
            f"store {self._store!r} is being committed by "
            f"{describe_holder(self._read_holder(fd))}; gave up after {self._timeout:g}s"
        )

    @staticmethod
    def _read_holder(fd: int) -> dict[str, object]:
        try:
            return json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            return {}

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            unlock_file(self._fd)
            self._fd = None
