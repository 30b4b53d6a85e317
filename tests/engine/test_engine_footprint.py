"""What an engine leaves behind: nothing written under a store.

A query session changes no byte and no mtime under the root, while the engine is open
and after it is closed; a read-only store is fully readable. (What a long-lived engine
keeps open as versions come and go: the probe ``long_lived_chain_engine``.)
"""

from __future__ import annotations

import json
import shutil

from faults import (
    describe_changes,
    read_session,
    run_read_only,
    tree_state,
)
from helpers import kv_rows, write_notebook_stores

import iqkit


def commit(root, store, **puts) -> int | None:
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


# -- readers write nothing ---------------------------------------------------------
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
    from iqkit.store.partitions import rocks

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
