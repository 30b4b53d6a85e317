"""The one lock-with-deadline (``lock_file``) the store's commit lock and the local Kafka
topic's produce lock share, against real ``flock``s on disk."""

from __future__ import annotations

import os

import pytest

from iqkit.store.locking import lock_file, unlock_file


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_lock_file_waits_then_raises_the_callers_error_and_leaks_no_descriptor(tmp_path):
    path = tmp_path / "x.lock"
    held = lock_file(path, timeout=5, on_timeout=lambda fd: AssertionError("free lock"))
    os.pwrite(held, b"holder-1", 0)
    before = _open_fds()
    seen: list[bytes] = []

    def refused(fd: int) -> TimeoutError:
        seen.append(os.pread(fd, 64, 0))  # the error may read who holds the lock
        return TimeoutError("busy")

    # A second open file description conflicts even in one process (flock semantics).
    with pytest.raises(TimeoutError, match="busy"):
        lock_file(path, timeout=0.05, on_timeout=refused)
    assert seen == [b"holder-1"]
    assert _open_fds() == before
    unlock_file(held)
    again = lock_file(path, timeout=0.05, on_timeout=lambda fd: AssertionError("still held"))
    unlock_file(again)
