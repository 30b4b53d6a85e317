"""What an engine leaves behind: nothing written under a store, nothing kept it no longer
serves.

* A long-lived engine (a notebook's, never closed) releases the versions it no longer
  serves: with retention 2, after 150 commits each followed by a query, the versions on
  disk, the folders on disk and the store files the process has open are those of the
  retained versions (open files: only the version being served), however long it runs.
* A result still being read keeps its version readable until it is closed.
* A query session changes no byte and no mtime under the root, while the engine is open
  and after it is closed; a read-only store is fully readable; a reader that is killed
  while holding a version does not keep it.

The tests of versions kept and released (leases, partition folders, open files) are
about the folder format and make folder stores (``folder_format``); the others run on
whatever format new local stores get.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from faults import (
    child_env,
    describe_changes,
    folders_on_disk,
    open_store_files,
    read_session,
    referenced_folders,
    run_read_only,
    tree_state,
)
from helpers import kv_rows, request, write_notebook_stores

import iqkit
from iqkit.store.layout import StoreLayout
from iqkit.store.versions import list_versions, read_version

PARTITIONS = 4
RETENTION = 2


def commit(root, store, **puts) -> int | None:
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


# -- item 4: an engine releases what it no longer serves -----------------------------------
@pytest.mark.folder_format  # leases and open partition folders
def test_a_long_lived_engine_keeps_only_the_version_it_serves(root):
    iqkit.create_store(root, "s", partitions=PARTITIONS, retention=RETENTION)
    layout = StoreLayout.of(root, "s")
    expected: dict[str, int] = {}
    with iqkit.open(root) as engine:
        for i in range(150):
            key = f"k{i % 40}"
            version = commit(root, "s", **{key: i})
            expected[key] = i
            assert dict((k, v) for _, k, v in kv_rows(engine, "s")) == expected
            assert engine.version("s") == version

            retained = list_versions(layout)
            assert retained == list(range(max(1, version - RETENTION + 1), version + 1)), i
            assert folders_on_disk(layout) == referenced_folders(layout, retained), i

            served = read_version(layout, version)
            allowed = {
                os.fspath(layout.partition_version_dir(p, m)) for p, m in served.partitions.items()
            }
            for path in open_store_files(layout):
                if path == os.fspath(layout.version_record(version)):
                    continue  # the served version's lease
                assert os.path.dirname(path) in allowed, f"commit {i}: {path} is still open"


@pytest.mark.folder_format  # leases and open partition folders
def test_a_result_still_being_read_keeps_its_version_until_it_is_closed(root):
    iqkit.create_store(root, "s", partitions=1, retention=1)
    commit(root, "s", **{f"k{i:03}": 1 for i in range(300)})
    layout = StoreLayout.of(root, "s")
    with iqkit.open(root) as engine:
        result = engine.query(request("s", iqkit.RangeQuery.with_no_bounds())).partition_results[0]
        it = result.result
        first = [next(it) for _ in range(10)]
        for g in range(2, 6):
            commit(root, "s", **{f"k{i:03}": g for i in range(300)})
            assert engine.version("s") == g
            assert {kv.value for kv in kv_rows_of(engine)} == {g}
        assert layout.partition_version_dir(0, 1).exists()  # still being read
        rest = list(it)
        assert [kv.value for kv in first + rest] == [1] * 300
        it.close()
        engine.query(request("s", iqkit.KeyQuery.with_key("k000")))
        commit(root, "s", k000=6)
        # Version 1 is released; 5 is what the engine serves until it next looks.
        assert list_versions(layout) == [5, 6]
        assert folders_on_disk(layout) == {(0, 5), (0, 6)}


def kv_rows_of(engine):
    r = engine.query(request("s", iqkit.RangeQuery.with_no_bounds())).partition_results[0]
    with r.result as it:
        return list(it)


# -- item 5: readers write nothing ---------------------------------------------------------
def more_versions(root) -> None:
    """Two more commits of 'totals' (so as_of reads and several folders exist)."""
    for i in range(2):
        with iqkit.StoreWriter(root, "totals") as w:
            w.put(
                f"extra-{i}", {"customer": f"extra-{i}", "total": i}, source=("orders", 0, 30 + i)
            )


def test_a_query_session_changes_no_byte_and_no_mtime_under_the_root(root):
    from iqkit.jupyter.testing import IQTestShell, new_shell

    write_notebook_stores(root)
    more_versions(root)
    before = tree_state(root)

    engine = iqkit.open(root)  # a notebook's engine: never closed during the session
    assert kv_rows(engine, "counts")
    read_session(root)
    shell = new_shell(root=str(root), progress=False)
    try:
        for line in (
            "stores",
            "get totals alice bob",
            "range counts --from 1 --to 5",
            "prefix totals a",
            "scan totals",
            "window clicks alice --from 0 --to 600000",
            "lag",
        ):
            shell.run_line_magic("iq", line)
        assert describe_changes(before, tree_state(root)) == []
    finally:
        shell.run_line_magic("unload_ext", "iqkit")
        IQTestShell.clear_instance()
    engine.close()
    assert describe_changes(before, tree_state(root)) == []


def test_a_read_only_store_is_fully_readable(root):
    """The copy is made really read-only for the reading process (root ignores
    permission bits): here, running as root in a container that may create mount
    namespaces, by a read-only bind mount in a private namespace; as another user, by
    a copy without write permission; as root without mount rights, by reading as user
    ``nobody`` (see ``faults.read_only_copy``). The child proves it cannot write first."""
    write_notebook_stores(root)
    more_versions(root)
    expected = read_session(root)
    session, proof, how = run_read_only(root)
    assert proof in {"EROFS", "EACCES", "EPERM"}, how
    assert session == expected, how
    assert "STORE_EXCEPTION" not in json.dumps(session)
    rows = [
        row
        for part in session["totals"]["scan"].values()
        if isinstance(part[0], list)
        for row in part[0]
    ]
    assert len(rows) == 8  # 6 customers and 2 extra


def test_reads_go_on_when_the_temporary_folder_is_cleaned(root):
    """Published folders are opened through views in the system's temporary folder,
    which a cleaner (systemd-tmpfiles, tmpreaper) may empty under a long-lived kernel."""
    from iqkit.store import rocks

    iqkit.create_store(root, "s", partitions=1)
    commit(root, "s", a=1)
    with iqkit.open(root) as engine:
        assert kv_rows(engine, "s") == [(0, "a", 1)]
        assert rocks._views_home is not None
        shutil.rmtree(rocks._views_home[1])  # what the cleaner does
        commit(root, "s", a=2)
        assert kv_rows(engine, "s") == [(0, "a", 2)]


READER = r"""
import sys, time
import iqkit
engine = iqkit.open(sys.argv[1], as_of=1)
r = engine.query(iqkit.StateQueryRequest.in_store("s").with_query(iqkit.KeyQuery.with_key("a")))
assert r.only_partition_result().result == 1
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.folder_format  # leases and open partition folders
def test_a_reader_killed_while_holding_a_version_does_not_keep_it(root):
    iqkit.create_store(root, "s", partitions=1, retention=1)
    commit(root, "s", a=1)
    layout = StoreLayout.of(root, "s")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(root)], stdout=subprocess.PIPE, env=child_env()
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == b"ready"
        commit(root, "s", a=2)
        assert list_versions(layout) == [1, 2]  # the live reader holds version 1
        assert layout.partition_version_dir(0, 1).exists()
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    commit(root, "s", a=3)
    assert list_versions(layout) == [3]
    assert folders_on_disk(layout) == {(0, 3)}
