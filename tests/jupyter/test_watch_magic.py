"""``%iq watch`` in a real IPython shell while a writer in another process commits
(tests/jupyter/watch_writer.py): one display, updated in place once per new version,
marking the rows whose key changed; it stops on an interrupt or after ``--for`` and
leaves no thread behind.

The displays are read where IPython publishes them (its ``CapturingDisplayPublisher``,
``capture_output``). So that "once per version" is exact rather than a matter of
timing, the writer waits before each commit until the watcher has shown the version
before it: a thread of the test reads the published displays and leaves a ``seen-<V>``
file for the writer, and sends the interrupt (a real SIGINT) once the last version shows.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import iqkit
from iqkit.jupyter.testing import IQTestShell, new_shell
from iqkit.jupyter.watch import WatchRun

WRITER = Path(__file__).resolve().parent / "watch_writer.py"
#: The display's header names the version it shows: "watching · version 3 · ...".
_VERSION = re.compile(r"· version (\d+) ·")
_CHANGED_ROW = re.compile(r'<tr class="iq-changed"[^>]*>(.*?)</tr>', re.S)
_CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)


def shown_version(output: dict) -> int:
    m = _VERSION.search(output["data"]["text/plain"])
    assert m, output["data"]["text/plain"][:300]
    return int(m.group(1))


def changed_rows(output: dict) -> set[tuple[str, ...]]:
    """The marked rows of a display, as their cells' text after the partition column."""
    rows = _CHANGED_ROW.findall(output["data"]["text/html"])
    return {tuple(html.unescape(c) for c in _CELL.findall(row)[1:]) for row in rows}


def start_writer(root: Path, store: str, plan: list, *extra: str) -> subprocess.Popen:
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), str(root), store, json.dumps(plan), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"  # imported: commits come quickly now
    return writer


def finish(writer: subprocess.Popen, *, stop: bool = False) -> str:
    """The writer's output once it ended (``stop``: ended by the test, its plan unfinished)."""
    if stop and writer.poll() is None:
        writer.terminate()
    try:
        out, _ = writer.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        writer.kill()
        out, _ = writer.communicate()
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "stores"


@pytest.fixture
def watch_shell(root: Path, sigint_raises):
    sh = new_shell(root=str(root), progress=False)
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()


def expected_kv_steps(first: dict, plan: list) -> list[tuple[set, set]]:
    """Per commit of ``plan`` (after ``first``): the rows a scan marks (changed keys
    with a value after it, with that value) and the keys it deleted."""
    state = dict(first)
    steps = []
    for writes in plan:
        changed = {k: v for k, v in writes if state.get(k) != v}
        marked = {(k, str(v)) for k, v in changed.items() if v is not None}
        deleted = {k for k, v in changed.items() if v is None and k in state}
        for k, v in writes:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
        steps.append((marked, deleted))
    return steps


def expected_window_steps(first: list, plan: list) -> list[set]:
    """Per commit: the window rows (key, start, value) that are new or changed."""
    state = {(k, s): v for k, v, s in first}
    steps = []
    for writes in plan:
        before = dict(state)
        for k, v, s in writes:
            state[(k, s)] = v
        steps.append({(k, s, v) for (k, s), v in state.items() if before.get((k, s)) != v})
    return steps


def watch_until_last(shell, root: Path, line: str, last: int, handshake: Path) -> tuple:
    """Run ``line`` with a thread answering the writer's handshakes, interrupting the
    watch (SIGINT) once version ``last`` shows; the displays, the cell's result."""
    handshake.mkdir()
    threads_before = set(threading.enumerate())
    with capture_output() as captured:
        publisher = shell.display_pub

        def answer() -> None:
            deadline = time.monotonic() + 120
            done = 0
            while time.monotonic() < deadline:
                outputs = list(publisher.outputs)
                for output in outputs[done:]:
                    version = shown_version(output)
                    (handshake / f"seen-{version}").touch()
                    if version >= last:
                        os.kill(os.getpid(), signal.SIGINT)
                        return
                done = len(outputs)
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGINT)  # stuck: the assertions say where

        helper = threading.Thread(target=answer, name="test-handshake")
        helper.start()
        try:
            result = shell.run_cell(line).result
        finally:
            helper.join(timeout=150)
        outputs = list(publisher.outputs)
    assert not helper.is_alive()
    assert set(threading.enumerate()) <= threads_before, "watch left a thread running"
    return outputs, result, captured


def test_watch_updates_one_display_per_version_marking_changed_keys(
    root: Path, watch_shell, tmp_path: Path
) -> None:
    iqkit.create_store(root, "t", partitions=3, value_serde="int64")
    first = {"alice": 1, "bob": 2, "carol": 3}
    with iqkit.StoreWriter(root, "t") as w:
        for key, value in first.items():
            w.put(key, value)
    plan = [
        [["alice", 10], ["zed", 1]],
        [["alice", 10], ["bob", None]],  # alice written again unchanged: no change
        [["carol", 30], ["dave", 4], ["erin", 5]],
    ]
    handshake = tmp_path / "seen"
    writer = start_writer(root, "t", plan, "--handshake", str(handshake))
    try:
        outputs, run, captured = watch_until_last(
            watch_shell, root, "%iq watch scan t --every 0.05", 1 + len(plan), handshake
        )
    finally:
        log = finish(writer)
    assert writer.returncode == 0, log

    # One display, made once and then updated in place: once per version, once at the end.
    first_out, *updates = outputs
    display_id = first_out["transient"]["display_id"]
    assert not first_out["update"]
    assert all(u["update"] and u["transient"]["display_id"] == display_id for u in updates)
    versions = [shown_version(o) for o in outputs]
    assert versions == [1, 2, 3, 4, 4]
    assert "interrupted" in outputs[-1]["data"]["text/plain"]
    assert changed_rows(first_out) == set()

    for output, (marked, deleted) in zip(updates, expected_kv_steps(first, plan), strict=False):
        assert changed_rows(output) == marked, output["data"]["text/plain"][:400]
        text = output["data"]["text/plain"]
        for key in deleted:
            assert f"deleted: {key!r}" in text
    # The returned run says the same, and the cell ended without a traceback.
    assert isinstance(run, WatchRun)
    assert run.stopped == "interrupted" and run.versions == [1, 2, 3, 4]
    assert [u.deleted for u in run.updates] == [(), (), ("bob",), ()]
    assert "Traceback" not in captured.stdout + captured.stderr
    assert sorted(run.df()["key"]) == ["alice", "carol", "dave", "erin", "zed"]


def test_watch_of_a_window_store_marks_the_rows_that_are_new(
    root: Path, watch_shell, tmp_path: Path
) -> None:
    iqkit.create_store(
        root, "w", partitions=2, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    first = [["alice", 1, 0], ["bob", 1, 0]]
    with iqkit.StoreWriter(root, "w") as w:
        for key, value, start in first:
            w.put(key, value, window_start=start)
    plan = [[["alice", 2, 0], ["alice", 1, 60_000]], [["bob", 7, 120_000]]]
    handshake = tmp_path / "seen"
    writer = start_writer(root, "w", plan, "--handshake", str(handshake))
    try:
        outputs, run, _ = watch_until_last(
            watch_shell, root, "%iq watch scan w --every 0.05", 1 + len(plan), handshake
        )
    finally:
        log = finish(writer)
    assert writer.returncode == 0, log
    assert [shown_version(o) for o in outputs] == [1, 2, 3, 3]
    for output, rows in zip(outputs[1:], expected_window_steps(first, plan), strict=False):
        # cells after the partition: key, window_start, window_end, value
        shown = {(c[0], c[1], c[3]) for c in changed_rows(output)}
        assert {key for key, _, _ in shown} == {key for key, _, _ in rows}
        assert {int(v) for _, _, v in shown} == {v for _, _, v in rows}
    assert run.updates[1].changed is None  # a window store: rows compared, no key list


def test_watch_of_history_marks_the_records_of_new_versions(
    root: Path, watch_shell, tmp_path: Path
) -> None:
    iqkit.create_store(root, "h", partitions=2, value_serde="int64")
    with iqkit.StoreWriter(root, "h") as w:
        w.put("alice", 1)
    plan = [[["alice", 2]], [["bob", 1]], [["alice", 3]]]
    handshake = tmp_path / "seen"
    writer = start_writer(root, "h", plan, "--handshake", str(handshake))
    try:
        outputs, run, _ = watch_until_last(
            watch_shell, root, "%iq watch history h alice --every 0.05", 4, handshake
        )
    finally:
        finish(writer)
    # cells after the partition: key, value, timestamp, valid_to, version
    marked = [{(c[1], c[4]) for c in changed_rows(o)} for o in outputs[1:4]]
    assert marked == [{("2", "2")}, set(), {("3", "4")}]
    assert [len(u.result) for u in run.updates] == [1, 2, 2, 3]


def test_watch_stops_after_for_seconds_and_leaves_no_thread(root: Path, watch_shell) -> None:
    iqkit.create_store(root, "c", partitions=2, value_serde="int64")
    with iqkit.StoreWriter(root, "c") as w:
        w.put("alice", 0)
    plan = [[["alice", n], ["other", n]] for n in range(1, 200)]
    threads_before = set(threading.enumerate())
    writer = start_writer(root, "c", plan, "--pause", "0.2")
    try:
        with capture_output() as captured:
            run = watch_shell.run_cell("%iq watch get c alice --for 2 --every 0.1").result
            outputs = list(watch_shell.display_pub.outputs)
    finally:
        finish(writer, stop=True)
    assert isinstance(run, WatchRun)
    assert run.stopped == "for" and run.seconds >= 2
    assert set(threading.enumerate()) <= threads_before
    assert "--for ran out" in outputs[-1]["data"]["text/plain"]
    assert "--for ran out" in repr(run)
    versions = run.versions
    assert versions == sorted(set(versions))  # each display a newer version
    for update in run.updates[1:]:
        assert update.changed == ("alice",)  # "other" is outside the key looked up
        assert len(update.highlighted) == 1
    assert "Traceback" not in captured.stdout + captured.stderr


def test_watch_names_its_last_result_and_refuses_a_pinned_version(root: Path, watch_shell):
    iqkit.create_store(root, "n", partitions=1, value_serde="int64")
    with iqkit.StoreWriter(root, "n") as w:
        w.put("a", 1)
    with capture_output():
        watch_shell.run_cell("%iq watch get n a --as latest --for 0.2 --every 0.05")
    assert watch_shell.user_ns["latest"].df()["value"].tolist() == [1]
    with pytest.raises(UsageError, match="reads one fixed version"):
        watch_shell.run_cell("%iq watch get n a --as-of 1 --for 1")
    with pytest.raises(UsageError, match="unknown store 'nope'"):
        watch_shell.run_cell("%iq watch get nope a --for 1")
