"""A store whose writer is hostile (or whose folder was damaged): nothing iqkit does on a
local root follows a symbolic link, or anything else that is not a plain file, planted
below the root — not the commit lock, not retention's listing and deletes, not a reader
or a compaction reading a version's files — and a record naming a file outside its own
store and partition is a damaged record. Real symlinks, FIFOs and folders in a tmp root;
real RocksDB behind every read. The last test has another real user (``nobody``) plant
the links in a store it owns on a shared root, and root use that store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import folder_for_other_users, kv_rows, tree_digest

import iqkit
from iqkit.store.chain.retention import collect_chain_garbage
from iqkit.store.names import twin_key
from iqkit.store.objects import open_objects

#: What a hostile writer would like to read or destroy: outside the root.
SECRET = b"top-secret-line\n" * 16 + b"TAILBYTE"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def commit(root: Path, store: str, **rows: int) -> int:
    with iqkit.StoreWriter(root, store) as w:
        for key, value in rows.items():
            w.put(key, value)
    return w.version


def make_store(root: Path, store: str, **rows: int) -> None:
    iqkit.create_store(root, store, partitions=1, value_serde="int64")
    commit(root, store, **rows)


def query_all(root: Path, store: str) -> iqkit.QueryResult:
    request = iqkit.StateQueryRequest.in_store(store).with_query(iqkit.RangeQuery.with_no_bounds())
    with iqkit.open(root) as engine:
        result = engine.query(request).only_partition_result()
        if result.is_success:
            with result.result as it:
                list(it)
        return result


def the_sst(root: Path, store: str) -> Path:
    (sst,) = (root / store / "sst" / "0").glob("*.sst")
    return sst


def add_record(root: Path, store: str, extra: list[str]) -> None:
    """Publish, by hand, the next record of ``store``: its latest one with ``extra`` file
    names appended to partition 0's chain (what a hostile or broken writer could do)."""
    records = sorted((root / store / "chain").glob("*.json"))
    data = json.loads(records[-1].read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    data["version"] += 1
    data["partitions"]["0"]["files"] += [{"name": n, "size": 1} for n in extra]
    (root / store / "chain" / f"{data['version']:012d}.json").write_text(json.dumps(data))


def assert_one_line_leaking_nothing(message: str) -> None:
    assert "\n" not in message, message
    # RocksDB's footer check quotes a file's last 8 bytes as a number (its "magic").
    tail = int.from_bytes(SECRET[-8:], "little")
    for secret in ("TAILBYTE", "top-secret", f"{tail:x}", f"{tail:X}", str(tail)):
        assert secret not in message, message


# -- item 1: the commit lock ---------------------------------------------------------------


@pytest.mark.parametrize("planted", ["symlink", "fifo", "folder"])
def test_a_commit_refuses_a_writer_lock_that_is_not_a_plain_file(root, victim, planted):
    make_store(root, "s", a=1)
    lock = root / "s" / "writer.lock"
    lock.unlink()
    if planted == "symlink":
        lock.symlink_to(victim)
    elif planted == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    with pytest.raises(iqkit.IqkitError) as caught:
        commit(root, "s", b=2)
    message = str(caught.value)
    assert "writer.lock" in message and "\n" not in message, message
    assert victim.read_bytes() == SECRET  # never truncated nor written
    assert [v for _, _, v in kv_rows_of(root, "s")] == [1]  # nothing published


def kv_rows_of(root: Path, store: str) -> list:
    with iqkit.open(root) as engine:
        return kv_rows(engine, store)


# -- item 2: retention never lists or deletes through a link --------------------------------


@pytest.mark.parametrize("linked", ["sst", "chain"])
def test_a_store_whose_folder_links_to_another_store_leaves_that_store_alone(root, linked):
    make_store(root, "s", a=1)
    make_store(root, "t", x=10)
    commit(root, "t", y=20)
    shutil.rmtree(root / "s" / linked)
    (root / "s" / linked).symlink_to(root / "t" / linked)
    before = tree_digest(root / "t")
    with pytest.raises(iqkit.IqkitError) as caught:
        commit(root, "s", b=2)
    assert "symbolic link" in str(caught.value) and "\n" not in str(caught.value)
    # Retention as it runs once every grace is over: nothing of t listed, nothing deleted.
    with pytest.raises(iqkit.IqkitError, match="symbolic link"):
        collect_chain_garbage(open_objects(root), "s", retain=1, grace_seconds=0)
    assert tree_digest(root / "t") == before
    assert sorted(v for _, _, v in kv_rows_of(root, "t")) == [10, 20]


def test_a_listing_skips_links_and_folders_it_may_not_enter(root, victim):
    make_store(root, "s", a=1)
    sst = the_sst(root, "s")
    (sst.parent / "planted.sst").symlink_to(victim)
    (root / "s" / "sst" / "9").symlink_to(root / "s" / "sst" / "0")
    objects = open_objects(root)
    sst_key = f"s/sst/0/{sst.name}"
    assert objects.list("s/sst") == sorted([sst_key, twin_key(sst_key)])  # the SST, its twin
    # A planted link itself may be removed (that removes the link, never its target).
    objects.delete("s/sst/0/planted.sst")
    assert not (sst.parent / "planted.sst").is_symlink() and victim.read_bytes() == SECRET


# -- item 4: a version's files must be plain files inside the store ------------------------


@pytest.mark.parametrize("cache_on", ["same file system", "another file system"])
@pytest.mark.parametrize("target", ["another store's SST", "a file outside the root"])
def test_a_record_listing_a_symlink_fails_that_partition_and_reads_nothing(
    root, victim, target, cache_on, monkeypatch, tmp_path
):
    if cache_on == "another file system":  # the cache copies instead of linking
        if not os.access("/dev/shm", os.W_OK):
            pytest.skip("no /dev/shm")
        shm = Path("/dev/shm") / f"iqkit-hostile-{os.getpid()}-{tmp_path.name}"
        monkeypatch.setenv("IQKIT_CACHE", str(shm))
    make_store(root, "s", a=1)
    make_store(root, "t", secret=42)
    planted = root / "s" / "sst" / "0" / "000000000002-0000000000000-planted.sst"
    planted.symlink_to(the_sst(root, "t") if target == "another store's SST" else victim)
    add_record(root, "s", [f"s/sst/0/{planted.name}"])
    before = tree_digest(root / "t")
    try:
        failed = query_all(root, "s")
        assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
        message = failed.failure_message
        assert planted.name in message and "symbolic link" in message, message
        assert_one_line_leaking_nothing(message)
    finally:
        if cache_on == "another file system":
            shutil.rmtree(shm, ignore_errors=True)
    assert tree_digest(root / "t") == before and victim.read_bytes() == SECRET


def test_a_compaction_refuses_a_listed_file_that_is_a_symlink(root):
    make_store(root, "t", secret=42)
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for i in range(1, 10):  # a base and 8 deltas: the next commit compacts
        commit(root, "s", **{f"k{i}": i})
    listed = sorted((root / "s" / "sst" / "0").glob("*.sst"))[4]
    listed.unlink()
    listed.symlink_to(the_sst(root, "t"))
    with pytest.raises(iqkit.IqkitError) as caught:
        commit(root, "s", k10=10)
    message = str(caught.value)
    assert listed.name in message and "symbolic link" in message and "\n" not in message
    assert len(list((root / "s" / "chain").glob("*.json"))) == 9  # nothing published
    # Nothing of t was copied into s as a regular SST.
    for sst in (root / "s" / "sst" / "0").iterdir():
        assert sst.is_symlink() or sst.read_bytes() != the_sst(root, "t").read_bytes()


# -- item 14: a record naming what is not a file of its own partition ----------------------


@pytest.mark.parametrize(
    "name",
    [
        "../x.sst",
        "s/sst/0/../../../t/sst/0/x.sst",
        "/etc/passwd",
        "s/sst/0",
        "s/sst",
        "t/sst/0/000000000001-0000000000000-abc.sst",
        "s/sst/1/000000000001-0000000000000-abc.sst",
        "s/chain/000000000001.json",
        "s/sst/0/.iqkit-tmp-x.sst",
        "",
    ],
)
def test_a_record_naming_a_file_outside_its_partition_is_a_damaged_record(root, name):
    make_store(root, "s", a=1)
    make_store(root, "t", secret=42)
    add_record(root, "s", [name])
    failed = query_all(root, "s")
    assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
    message = failed.failure_message
    assert "000000000002.json is damaged" in message and "\n" not in message, message


def test_a_record_naming_a_folder_of_its_partition_fails_that_partition(root):
    make_store(root, "s", a=1)
    (root / "s" / "sst" / "0" / "sub.sst").mkdir()
    add_record(root, "s", ["s/sst/0/sub.sst"])
    failed = query_all(root, "s")
    assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
    message = failed.failure_message
    assert "sub.sst" in message and "not a plain file" in message and "\n" not in message


# -- the same attacks planted by another real user -----------------------------------------


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A root every user can reach (pytest's tmp folders are root's only), as on a shared
    cluster or notebook server; removed afterwards."""
    base = folder_for_other_users("iqkit-cotenant-")
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
@pytest.mark.parametrize("attack", ["writer.lock", "sst folder", "listed SST"])
def test_links_a_cotenant_plants_in_its_store_are_never_followed_by_root(shared_root, attack):
    """``nobody`` owns store ``s`` on a shared root and plants a link in it; root (whose
    own store ``t`` and a secret file sit beside it) then commits to or reads ``s``: the
    commit or the partition fails in one line, and the secret and ``t`` stay as they were."""
    root = shared_root / "stores"
    victim = shared_root / "secret.txt"
    victim.write_bytes(SECRET)
    make_store(root, "t", x=10)
    make_store(root, "s", a=1)
    subprocess.run(["chown", "-R", "nobody", os.fspath(root / "s")], check=True)
    os.chmod(root, 0o1777)  # a shared root: every user may make a store there
    before = tree_digest(root / "t")
    if attack == "writer.lock":
        as_nobody("rm", "-f", os.fspath(root / "s" / "writer.lock"))
        as_nobody("ln", "-s", os.fspath(victim), os.fspath(root / "s" / "writer.lock"))
    elif attack == "sst folder":
        as_nobody("rm", "-rf", os.fspath(root / "s" / "sst"))
        as_nobody("ln", "-s", os.fspath(root / "t" / "sst"), os.fspath(root / "s" / "sst"))
    if attack == "listed SST":
        planted = root / "s" / "sst" / "0" / "000000000002-0000000000000-planted.sst"
        as_nobody("ln", "-s", os.fspath(the_sst(root, "t")), os.fspath(planted))
        as_nobody("chmod", "a+w", os.fspath(root / "s" / "chain"))
        add_record(root, "s", [f"s/sst/0/{planted.name}"])
        failed = query_all(root, "s")
        assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
        assert "symbolic link" in failed.failure_message
        assert_one_line_leaking_nothing(failed.failure_message)
    else:
        with pytest.raises(iqkit.IqkitError) as caught:
            commit(root, "s", b=2)
        assert "symbolic link" in str(caught.value) and "\n" not in str(caught.value)
        if attack == "sst folder":
            with pytest.raises(iqkit.IqkitError, match="symbolic link"):
                collect_chain_garbage(open_objects(root), "s", retain=1, grace_seconds=0)
    assert victim.read_bytes() == SECRET
    assert tree_digest(root / "t") == before
    assert [v for _, _, v in kv_rows_of(root, "t")] == [10]
