"""``store/chain/migrate.py`` and ``python -m iqkit migrate``: the frozen folder-format root of
``tests/data/folder_store`` (made by ``tests/data/make_folder_store.py`` with an iqkit
that still wrote that format) turned into chain stores, checked against what the folder
reader served from it (``tests/data/folder_store_expected.json``)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import iqkit
from iqkit import (
    IqkitError,
    KeyQuery,
    StateQueryRequest,
    StoreCorruptedError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownStoreError,
)
from iqkit.__main__ import main
from iqkit.store.chain import migrate
from iqkit.store.chain.migrate import migrate_root, migrate_store
from iqkit.store.chain.records import read_version
from iqkit.store.objects import open_objects

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
FROZEN = DATA / "folder_store"
EXPECTED: dict[str, Any] = json.loads((DATA / "folder_store_expected.json").read_text())
FOLDER_FILES = ("LATEST", "versions", "partitions", "leases", "jobs")


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path_factory, monkeypatch) -> None:
    """Readers of chain stores build their databases in a cache of the test's own."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path_factory.mktemp("iqkit-cache")))


@pytest.fixture
def folder_root(tmp_path: Path) -> Path:
    """A copy of the frozen folder-format root (the original stays as it is)."""
    root = tmp_path / "stores"
    shutil.copytree(FROZEN, root, symlinks=True)
    return root


# -- what a reader sees --------------------------------------------------------------------
def _json_key(key: Any) -> Any:
    return [key.key, key.start, key.end] if isinstance(key, iqkit.Windowed) else key


def served(root: Path, store: str, version: int) -> dict[str, Any]:
    """Rows and position of every partition of ``store`` as of ``version``, through
    ``iqkit.open(root, as_of=...)`` and each kind's full scan."""
    out = {}
    with iqkit.open(root, as_of={store: version}) as engine:
        kind = engine.manifest(store).kind
        for p in range(engine.manifest(store).partitions):
            req = StateQueryRequest.in_store(store).with_query(kind.scan_query())
            qr = engine.query(req.with_partitions({p})).partition_results[p]
            assert not qr.is_failure, qr.failure_message
            with qr.result as it:
                rows = [[_json_key(kv.key), kv.value] for kv in it]
            position = {
                t: {str(ip): o for ip, o in sorted(m.items())}
                for t, m in sorted(qr.position.to_map().items())
            }
            out[str(p)] = {"rows": rows, "position": position}
    return out


def expected_served(store: str, version: int) -> dict[str, Any]:
    parts = EXPECTED[store]["by_version"][str(version)]["partitions"]
    return {p: {"rows": e["rows"], "position": e["position"]} for p, e in parts.items()}


def chain_facts(root: Path, store: str, version: int) -> dict[str, Any]:
    """What the chain record of ``version`` keeps of the folder version: its facts and,
    per partition, the version that wrote it and its commit record."""
    record = read_version(open_objects(root), store, version)
    data = json.loads(record.to_json())
    return {
        "created_at": data["created_at"],
        "source_end": data["source_end"],
        "metadata": data["metadata"],
        "partitions": {
            str(p): {"written_by": c.written_by, "commit": json.loads(c.commit)}
            for p, c in record.partitions.items()
        },
    }


def expected_facts(store: str, version: int) -> dict[str, Any]:
    v = EXPECTED[store]["by_version"][str(version)]
    return {
        "created_at": v["created_at"],
        "source_end": v["source_end"],
        "metadata": v["metadata"],
        "partitions": {
            p: {"written_by": e["written_by"], "commit": e["commit"]}
            for p, e in v["partitions"].items()
            if e["written_by"] is not None
        },
    }


def assert_as_expected(root: Path, store: str) -> None:
    """Every retained version of ``store`` serves what the folder reader served, and its
    chain record keeps the folder version's facts and commit records."""
    with iqkit.open(root) as engine:
        assert engine.versions(store) == EXPECTED[store]["versions"]
    for v in EXPECTED[store]["versions"]:
        assert served(root, store, v) == expected_served(store, v), (store, v)
        assert chain_facts(root, store, v) == expected_facts(store, v), (store, v)


def manifest_format(root: Path, store: str) -> int:
    return json.loads((root / store / "manifest.json").read_text())["format_version"]


def contents(folder: Path) -> dict[str, str]:
    """Relative path -> kind and bytes' digest of everything under ``folder``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(folder))
            out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def tree_state(folder: Path) -> dict[str, tuple[str, int]]:
    """``contents`` with every entry's mtime: changing, adding or removing anything shows."""
    return {
        rel: (digest, (folder / rel).lstat().st_mtime_ns)
        for rel, digest in contents(folder).items()
    }


# -- migration keeps every version ---------------------------------------------------------
def test_every_retained_version_serves_what_the_folder_reader_served(folder_root):
    reports = migrate_root(folder_root)
    assert [r.line() for r in reports] == [
        "clicks: 3 versions migrated (1..3)",
        "fresh: 0 versions migrated (nothing was published)",
        "totals: 4 versions migrated (3..6)",
    ]
    for store in ("totals", "clicks", "fresh"):
        assert manifest_format(folder_root, store) == 2
        assert not [n for n in FOLDER_FILES if (folder_root / store / n).exists()], store
    assert_as_expected(folder_root, "totals")
    assert_as_expected(folder_root, "clicks")
    with iqkit.open(folder_root) as engine:
        assert engine.versions("fresh") == []
    # Settings and retention are the folder store's.
    for store in ("totals", "clicks", "fresh"):
        before = {k: v for k, v in EXPECTED[store]["manifest"].items() if k != "format_version"}
        after = json.loads((folder_root / store / "manifest.json").read_text())
        assert after.pop("checksum").startswith("xxh3_128:")  # sealed (store/integrity.py)
        assert {k: v for k, v in after.items() if k != "format_version"} == before


def test_key_queries_of_every_version_after_migration(folder_root):
    """Every key any version held, asked of every version: its value there, or nothing
    (deleted, or not yet written), routed by the store's partitioner."""
    migrate_store(folder_root, "totals")
    versions = EXPECTED["totals"]["by_version"]
    keys = {
        row[0] for v in versions.values() for e in v["partitions"].values() for row in e["rows"]
    }
    assert len(keys) > 10
    for v, data in versions.items():
        values = {row[0]: row[1] for e in data["partitions"].values() for row in e["rows"]}
        with iqkit.open(folder_root, as_of={"totals": int(v)}) as engine:
            for key in sorted(keys):
                req = StateQueryRequest.in_store("totals").with_query(KeyQuery.with_key(key))
                only = engine.query(req).only_partition_result()
                assert (only.result if only is not None else None) == values.get(key), (v, key)


def test_a_partition_folder_shared_by_versions_becomes_one_shared_sst(folder_root):
    migrate_store(folder_root, "totals")
    objects = open_objects(folder_root)
    records = {v: read_version(objects, "totals", v) for v in EXPECTED["totals"]["versions"]}
    # Partition 1 was written by version 3 and carried unchanged by versions 4 and 5.
    assert records[3].partitions[1] == records[4].partitions[1] == records[5].partitions[1]
    assert records[3].partitions[1].written_by == 3
    listed = set().union(*(r.files() for r in records.values()))
    on_disk = {
        f"totals/{p.relative_to(folder_root / 'totals').as_posix()}"
        for p in (folder_root / "totals" / "sst").rglob("*")
        if p.is_file()
    }
    folders = {
        (p, e["written_by"])
        for v in EXPECTED["totals"]["by_version"].values()
        for p, e in v["partitions"].items()
    }
    assert on_disk == listed and len(listed) == len(folders)


# -- SIGKILL at every step -----------------------------------------------------------------
KILL_AT_STEP = """
import os, signal, sys
from iqkit.store.chain import migrate

def hook(step):
    if step == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)

migrate.step_hook = hook
migrate.migrate_store(sys.argv[1], sys.argv[2])
print("not killed")
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def folder_files(root: Path) -> dict[str, str]:
    """``contents`` of the folder format's files of 'totals'."""
    return {
        rel: digest
        for rel, digest in contents(root / "totals").items()
        if rel.split("/")[0] in (*FOLDER_FILES, "manifest.json")
    }


def steps_of_a_run(root: Path, store: str) -> list[str]:
    steps: list[str] = []
    migrate.step_hook = steps.append
    try:
        migrate_store(root, store)
    finally:
        migrate.step_hook = None
    return steps


def normalized(root: Path, store: str) -> dict[str, Any]:
    """The store's files with SST names reduced to ``sst/<p>/<written by>`` (the rest of
    a name is a clock and a random part), and its records with the same names."""

    def short(name: str) -> str:
        return re.sub(r"/(\d{12})-\d+-[0-9a-f]+\.sst$", r"/\1.sst", name)

    files = sorted(short(rel) for rel in contents(root / store))
    objects = open_objects(root)
    records = {}
    for v in EXPECTED[store]["versions"]:
        data = json.loads(read_version(objects, store, v).to_json())
        # Checksums differ between runs as the SSTs' own bytes do (RocksDB writes a
        # session id and times into each): what is compared is which files, by name.
        data.pop("checksum")
        for chain in data["partitions"].values():
            chain["files"] = [short(f["name"]) for f in chain["files"]]
        records[v] = data
    return {"files": files, "records": records}


def test_a_kill_at_each_step_then_a_rerun_gives_the_same_store(tmp_path):
    whole = tmp_path / "whole"
    shutil.copytree(FROZEN, whole)
    steps = steps_of_a_run(whole, "totals")
    assert steps[0] == "read" and "switched" in steps and steps[-1].startswith("removed ")
    assert len([s for s in steps if s.startswith("sst ")]) == 6
    want = normalized(whole, "totals")
    for i, step in enumerate(steps):
        root = tmp_path / f"killed-{i}"
        shutil.copytree(FROZEN, root)
        run = subprocess.run(
            [sys.executable, "-c", KILL_AT_STEP, str(root), "totals", step],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == -signal.SIGKILL, (step, run.stdout, run.stderr)
        switched = i >= steps.index("switched")
        assert manifest_format(root, "totals") == (2 if switched else 1), step
        if not switched:  # the folder files as they were: read, never written to
            assert folder_files(root) == folder_files(FROZEN), step
        # A reader now sees the folder store (whole, or refused in one line naming the
        # command, once the folder reader is gone) or the whole chain store.
        try:
            for v in EXPECTED["totals"]["versions"]:
                assert served(root, "totals", v) == expected_served("totals", v), (step, v)
        except IqkitError as exc:
            assert not switched and "python -m iqkit migrate" in str(exc), (step, exc)
        report = migrate_store(root, "totals")
        assert report.outcome == ("chain" if switched else "migrated"), step
        assert normalized(root, "totals") == want, step
        assert_as_expected(root, "totals")


def test_a_killed_run_leaves_chain_files_the_rerun_replaces(folder_root):
    """Killed after two SSTs: they are on disk, unread; the re-run removes them and
    writes the chain whole (no orphan left)."""
    run = subprocess.run(
        [sys.executable, "-c", KILL_AT_STEP, str(folder_root), "totals", "sst 0/5"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    partial = sorted(p.name for p in (folder_root / "totals" / "sst").rglob("*.sst"))
    assert len(partial) == 2 and not (folder_root / "totals" / "chain").exists()
    migrate_store(folder_root, "totals")
    now = sorted(p.name for p in (folder_root / "totals" / "sst").rglob("*.sst"))
    assert len(now) == 6 and not set(partial) & set(now)


# -- idempotent ----------------------------------------------------------------------------
def test_migrating_again_changes_nothing(folder_root):
    migrate_root(folder_root)
    before = tree_state(folder_root)
    again = migrate_root(folder_root)
    assert [r.line() for r in again] == [
        "clicks: already in the chain format",
        "fresh: already in the chain format",
        "totals: already in the chain format",
    ]
    assert tree_state(folder_root) == before


def test_an_old_format_reader_keeps_its_folder_files_until_it_is_done(folder_root):
    """A reader of the folder format leases a version with a shared flock on its record:
    the switch happens, the folder files stay while the lease is held, and the next run
    removes them."""
    fd = os.open(folder_root / "totals" / "versions" / "6.json", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        report = migrate_store(folder_root, "totals")
        assert report.leased == (6,)
        assert "run migrate again" in report.line()
        assert manifest_format(folder_root, "totals") == 2
        assert (folder_root / "totals" / "partitions" / "1" / "6").is_dir()
    finally:
        os.close(fd)
    assert_as_expected(folder_root, "totals")
    done = migrate_store(folder_root, "totals")
    assert done.line() == (
        "totals: already in the chain format "
        "(the folder format's files left by an interrupted run removed)"
    )
    assert not [n for n in FOLDER_FILES if (folder_root / "totals" / n).exists()]


# -- refusals: the store unchanged ---------------------------------------------------------
HOLD_LOCK = """
import sys
from iqkit.store.chain.stores import chain_commit_lock
from iqkit.store.objects import open_objects

with chain_commit_lock(open_objects(sys.argv[1]), sys.argv[2], who="StoreWriter", timeout=30):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_refused_in_one_line_while_a_writer_holds_the_lock(folder_root, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder_root), "totals"],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_state(folder_root)
        with pytest.raises(StoreLockedError) as caught:
            migrate_store(folder_root, "totals")
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(
            "cannot migrate: store 'totals' is being committed by StoreWriter"
        )
        assert f"pid {holder.pid}" in message
        assert main(["migrate", str(folder_root), "totals"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: cannot migrate: ")
        assert tree_state(folder_root) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert migrate_store(folder_root, "totals").line() == "totals: 4 versions migrated (3..6)"


def test_a_damaged_folder_store_is_refused_with_nothing_written(folder_root):
    shutil.rmtree(folder_root / "totals" / "partitions" / "2" / "4")
    before = contents(folder_root)
    with pytest.raises(StoreCorruptedError) as caught:
        migrate_store(folder_root, "totals")
    assert str(caught.value) == (
        f"store 'totals' was not migrated: {folder_root}/totals/partitions/2/4 "
        "(named by 4.json) holds no database"
    )
    assert contents(folder_root) == before


def test_a_partition_without_commit_record_is_refused_and_the_chain_files_removed(folder_root):
    """Found while the SSTs are written: those already written are removed again."""
    from iqkit.store.partitions import rocks

    target = folder_root / "totals" / "partitions" / "2" / "4"
    db = rocks.open_for_write(target, create=False)
    try:
        del db[b"\x00commit"]
        db.flush(True)
    finally:
        rocks.close_quietly(db)
    before = contents(folder_root)
    with pytest.raises(StoreCorruptedError, match=r"partitions/2/4 has no commit record$"):
        migrate_store(folder_root, "totals")
    assert contents(folder_root) == before
    assert manifest_format(folder_root, "totals") == 1


def test_a_damaged_latest_is_refused(folder_root):
    (folder_root / "totals" / "LATEST").write_text("six\n")
    with pytest.raises(StoreCorruptedError, match=r"^store 'totals' was not migrated: .*LATEST"):
        migrate_store(folder_root, "totals")
    assert manifest_format(folder_root, "totals") == 1


def test_unknown_store_and_root(folder_root, tmp_path):
    with pytest.raises(UnknownStoreError, match="stores: clicks, fresh, totals"):
        migrate_store(folder_root, "nope")
    with pytest.raises(StoreNotFoundError, match="no iqkit root folder"):
        migrate_store(tmp_path / "missing", "totals")


def test_stores_on_an_object_root_are_chain_stores_already(s3_root):
    iqkit.create_store(s3_root, "totals", partitions=2)
    assert [r.line() for r in migrate_root(s3_root)] == ["totals: already in the chain format"]
    with pytest.raises(UnknownStoreError, match="stores: totals"):
        migrate_store(s3_root, "nope")


# -- a migrated store takes commits --------------------------------------------------------
def test_a_migrated_store_takes_a_store_writer_commit(folder_root):
    migrate_store(folder_root, "totals")
    with iqkit.StoreWriter(folder_root, "totals") as w:
        w.put("new-key", {"total": 7}, source=("orders", 0, 70))
        w.delete("user-1")
    assert w.version == 7
    with iqkit.open(folder_root) as engine:
        assert engine.versions("totals")[-1] == 7
        get = StateQueryRequest.in_store("totals").with_query
        assert engine.query(get(KeyQuery.with_key("new-key"))).only_partition_result().result == {
            "total": 7
        }
        assert engine.query(get(KeyQuery.with_key("user-1"))).only_partition_result() is None
    # The versions before it still serve what they served.
    for v in EXPECTED["totals"]["versions"]:
        assert served(folder_root, "totals", v) == expected_served("totals", v), v
    # Position and sink progress carried forward from the migrated version 6.
    record = read_version(open_objects(folder_root), "totals", 7)
    assert record.metadata["sinks"] == EXPECTED["totals"]["by_version"]["6"]["metadata"]["sinks"]
    assert (
        json.loads(record.to_json())["source_end"]
        == (EXPECTED["totals"]["by_version"]["6"]["source_end"])
    )


def test_a_migrated_store_takes_a_spark_write(folder_root, spark):
    from iqkit.spark import write_store

    migrate_store(folder_root, "totals")
    df = spark.createDataFrame([("spark-a", 1), ("user-1", 2)], "key string, total long")
    version = write_store(df, str(folder_root), "totals", key="key", partitions=3, progress=False)
    assert version == 7
    with iqkit.open(folder_root) as engine:
        get = StateQueryRequest.in_store("totals").with_query
        for key, total in (("spark-a", 1), ("user-1", 2)):
            only = engine.query(get(KeyQuery.with_key(key))).only_partition_result()
            assert only.result == {"total": total}
    for v in EXPECTED["totals"]["versions"]:
        assert served(folder_root, "totals", v) == expected_served("totals", v), v


# -- the command line ----------------------------------------------------------------------
def test_cli_lines_and_exit_codes(folder_root, capsys):
    assert main(["migrate", str(folder_root), "totals"]) == 0
    assert capsys.readouterr().out == "totals: 4 versions migrated (3..6)\n"
    assert main(["migrate", str(folder_root)]) == 0
    assert capsys.readouterr().out == (
        "clicks: 3 versions migrated (1..3)\n"
        "fresh: 0 versions migrated (nothing was published)\n"
        "totals: already in the chain format\n"
    )
    assert main(["migrate", str(folder_root), "nope", "clicks"]) == 1
    out = capsys.readouterr()
    assert out.err == "error: unknown store 'nope'; stores: clicks, fresh, totals\n"
    assert out.out == "clicks: already in the chain format\n"
    assert main(["migrate", str(folder_root / "missing")]) == 1
    assert capsys.readouterr().err.startswith("error: no iqkit root folder at ")


def test_cli_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["migrate", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "usage: python -m iqkit migrate [-h] root [STORE ...]" in text
    assert "folder format" in text and "chain stores" in text


def test_a_symlinked_partition_folder_is_refused_and_nothing_outside_is_read(folder_root):
    # A link in a folder store could make the migration copy files from outside the
    # store into its SSTs: refused in one line, as everywhere below a root.
    version = folder_root / "totals" / "partitions" / "2" / "4"
    outside = folder_root.parent / "outside"
    shutil.move(version, outside)
    version.symlink_to(outside, target_is_directory=True)
    before = contents(folder_root)
    with pytest.raises(StoreCorruptedError, match="is a symbolic link, which iqkit never follows"):
        migrate_store(folder_root, "totals")
    assert contents(folder_root) == before


def test_a_symlinked_version_record_is_refused(folder_root):
    record = next((folder_root / "totals" / "versions").glob("*.json"))
    outside = folder_root.parent / "record.json"
    shutil.copy(record, outside)
    record.unlink()
    record.symlink_to(outside)
    before = contents(folder_root)
    with pytest.raises(StoreCorruptedError, match="is a symbolic link"):
        migrate_store(folder_root, "totals")
    assert contents(folder_root) == before
