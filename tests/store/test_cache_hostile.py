"""The reader's cache in shared and odd environments (store/cache.py's folder choice):
a cache another user could write to is never trusted, a reader with no usable cache
still reads (a private temporary cache, said in the trace), a full cache disk is evicted
and retried once, and writers never need the cache's settings.

Another user is real: ``nobody`` (uid 65534) or a uid without a passwd entry, in a child
Python started as root that imports everything it needs, then drops to that uid (this
machine's interpreter is under root's home, which other users cannot reach)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import folder_for_other_users, in_private_mount_namespace, mount_namespaces_work

import iqkit
from iqkit.store.cache import FileCache
from iqkit.store.chain.read import database_folder
from iqkit.store.chain.records import latest_version
from iqkit.store.objects import open_objects

NOBODY = 65534
NO_PASSWD_UID = 54321
STORE = "t"
TRUE = {"a": "true-a", "b": "true-b"}
FALLBACK = "private temporary cache"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


def write_values(root: Path, prefix: str) -> None:
    iqkit.create_store(root, STORE, partitions=2, key_serde="string", value_serde="string")
    with iqkit.StoreWriter(root, STORE) as w:
        w.put("a", f"{prefix}-a")
        w.put("b", f"{prefix}-b")


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp folders are root's only), with a
    true store ``stores`` and a sticky world-writable ``tmp`` (other users' TMPDIR)."""
    base = folder_for_other_users("iqkit-hostile-")
    write_values(base / "stores", "true")
    (base / "tmp").mkdir()
    os.chmod(base / "tmp", 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def read_as_root(root: Path, cache: Path | str) -> dict:
    """The true keys read by this process (root) with ``IQKIT_CACHE`` at ``cache``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IQKIT_CACHE", os.fspath(cache))
        return _read(root)


def _read(root: Path) -> dict:
    out: dict = {"trace": []}
    with iqkit.open(root) as engine:
        for key in TRUE:
            r = engine.query(
                iqkit.StateQueryRequest.in_store(STORE)
                .with_query(iqkit.KeyQuery.with_key(key))
                .enable_execution_info()
            ).only_partition_result()
            out[key] = f"FAILED: {r.failure_message}" if r.is_failure else r.result
            out["trace"] += r.execution_info
    return out


def planted_paths(root: Path, cache: Path) -> dict[int, Path]:
    """Where a reader of ``root`` with cache folder ``cache`` finds each partition's
    database (computed from the public record, as an attacker would)."""
    objects = open_objects(os.fspath(root))
    record = latest_version(objects, STORE)
    probe = FileCache(root.parent / "probe-cache")
    return {
        p: cache / database_folder(probe, objects, STORE, p, chain).relative_to(probe.folder)
        for p, chain in record.partitions.items()
    }


def forged_databases(world: Path) -> dict[int, Path]:
    """Databases holding forged values, one per partition, readable by everyone."""
    forged = world / "forged"
    write_values(forged, "forged")
    cache = world / "forged-cache"
    read_as_root(forged, cache)
    found = {}
    for dirpath, _, files in os.walk(cache):
        if "CURRENT" in files and "/dbs/" in dirpath:
            found[int(Path(dirpath).parent.name)] = Path(dirpath)
    subprocess.run(["chmod", "-R", "a+rX", os.fspath(cache)], check=True)
    return found


def plant(world: Path, target_cache: Path, *, as_user: str | None) -> None:
    """Copy the forged databases to the exact paths a reader of the true store would
    open in ``target_cache`` (as ``as_user``, or as root)."""
    forged = forged_databases(world)
    prefix = ["runuser", "-u", as_user, "--"] if as_user else []
    for p, path in planted_paths(world / "stores", target_cache).items():
        subprocess.run([*prefix, "mkdir", "-p", os.fspath(path.parent)], check=True)
        subprocess.run([*prefix, "cp", "-r", os.fspath(forged[p]), os.fspath(path)], check=True)


# -- the child: another user reading -------------------------------------------------------
CHILD = r"""
import contextlib, io, json, os, shutil, sys, tempfile, traceback
import iqkit, iqkit.__main__
from iqkit.jupyter.testing import IQTestShell, new_shell
spec = json.loads(sys.argv[1])
root = spec["root"]


def engine_read():
    # Each key twice: a partition's first key lookup reads its files in place when its
    # database is not in the cache yet; the second opens or builds the database there,
    # which is what these tests are about. Both must read the true value.
    out = {"trace": []}
    with iqkit.open(root) as engine:
        for key in ("a", "b"):
            request = (
                iqkit.StateQueryRequest.in_store("t")
                .with_query(iqkit.KeyQuery.with_key(key))
                .enable_execution_info()
            )
            first = engine.query(request).only_partition_result()
            again = (
                iqkit.StateQueryRequest.in_store("t")
                .with_query(iqkit.KeyQuery.with_key(key).skip_cache())
                .enable_execution_info()
            )
            r = engine.query(again).only_partition_result()
            out[key] = f"FAILED: {r.failure_message}" if r.is_failure else r.result
            if first.is_failure:  # a first read that failed, or read another value
                out[key + "-first"] = f"FAILED: {first.failure_message}"
            elif r.is_success and first.result != r.result:
                out[key + "-first"] = first.result
            out["trace"] += first.execution_info + r.execution_info
    return out


def cli():
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = iqkit.__main__.main(["get", root, "t", "a"])
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


def magic():
    shell = new_shell(root=root, progress=False)
    try:
        result = shell.run_line_magic("iq", "get t a")
        results = result.result.partition_results.values()
        return {"values": [r.result for r in results if not r.is_failure],
                "failures": [r.failure_message for r in results if r.is_failure]}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        shell.run_line_magic("unload_ext", "iqkit")
        IQTestShell.clear_instance()


def guarded(fn):
    try:
        return fn()
    except BaseException as exc:
        return {"raised": traceback.format_exc(), "lines": len(traceback.format_exc().splitlines())}


# Everything imported and warmed up as root (lazy imports included), in a cache of its own:
# after setuid the other user may not reach this interpreter's files (a venv under root's
# home). traitlets imports its logging module only when it first logs.
import traitlets.log
warm = tempfile.mkdtemp()
os.environ["IQKIT_CACHE"] = warm
engine_read(); cli(); magic()
shutil.rmtree(warm)
# RocksDB's read views live in a folder per process, made on first use: the warm-up's is
# root's, so the other user gets one of its own.
from iqkit.store.partitions import rocks
if rocks._views_home is not None:
    os.close(rocks._views_home[2])
    shutil.rmtree(rocks._views_home[1])
    rocks._views_home = None
for name in ("HOME", "IQKIT_CACHE", "XDG_CACHE_HOME", "IQKIT_CACHE_SIZE"):
    os.environ.pop(name, None)
os.environ.update(spec["env"])
tempfile.tempdir = None
if spec["uid"] != 0:
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.chdir(spec["cwd"])
print("RESULT" + json.dumps({
    "engine": guarded(engine_read), "cli": guarded(cli), "magic": guarded(magic),
}))
"""


def read_as(world: Path, uid: int, env: dict[str, str], *, cwd: Path | None = None,
            prefix: list[str] | None = None) -> dict:  # fmt: skip
    """The true store read by ``uid`` with ``env`` (after HOME, IQKIT_CACHE and
    XDG_CACHE_HOME are unset): through the engine, the CLI and ``%iq``."""
    spec = {"root": os.fspath(world / "stores"), "uid": uid, "cwd": os.fspath(cwd or world / "tmp"),
            "env": {"TMPDIR": os.fspath(world / "tmp"), **env}}  # fmt: skip
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        [os.fspath(Path(__file__).resolve().parents[2]), child_env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [*(prefix or []), sys.executable, "-c", CHILD, json.dumps(spec)],
        capture_output=True, text=True, timeout=300, env=child_env, cwd=world,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"the child failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT") :])


def assert_reads_true(got: dict, *, note: str | None = None) -> None:
    """Every way in read the true values; ``note`` (when given) is in the trace, once
    per line, and no trace line is more than one line."""
    engine = got["engine"]
    assert "raised" not in engine, engine.get("raised")
    assert {k: engine[k] for k in TRUE} == TRUE
    assert not [k for k in engine if k.endswith("-first")], engine  # first reads agree
    if note is not None:
        assert any(note in line for line in engine["trace"]), engine["trace"]
    assert all("\n" not in line for line in engine["trace"])
    assert got["cli"] == {"rc": 0, "out": "true-a\n", "err": ""}, got["cli"]
    assert got["magic"] == {"values": ["true-a"], "failures": []}, got["magic"]


# -- item 3: a shared cache cannot be poisoned ---------------------------------------------
def test_a_database_planted_in_a_shared_cache_is_not_read(world):
    """``nobody`` pre-builds forged databases at the exact paths root's reader would
    use in a shared (1777) ``IQKIT_CACHE``: root reads the true values."""
    shared = world / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    plant(world, shared, as_user="nobody")
    got = read_as_root(world / "stores", shared)
    assert {k: got[k] for k in TRUE} == TRUE, got["trace"]
    assert not any("reused" in line for line in got["trace"])
    # Root's own entries are in a private subfolder of the shared one.
    mine = shared / str(os.getuid())
    assert mine.is_dir() and stat.S_IMODE(mine.stat().st_mode) == 0o700


def test_a_subfolder_another_user_made_for_us_is_not_used(world):
    """``nobody`` pre-creates root's per-user subfolder of the shared cache, forged
    databases inside: root refuses it, reads through a private temporary cache, and the
    trace says so in one line."""
    shared = world / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    plant(world, shared / str(os.getuid()), as_user="nobody")
    got = read_as_root(world / "stores", shared)
    assert {k: got[k] for k in TRUE} == TRUE, got["trace"]
    notes = [line for line in got["trace"] if FALLBACK in line]
    assert notes and "uid 65534" in notes[0], got["trace"]


def test_an_entry_another_user_put_in_a_private_cache_is_rebuilt(world):
    """Root plants forged databases inside ``nobody``'s own private cache: ``nobody``
    does not reuse them (built again) and says so."""
    cache = world / "nobody-cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, NOBODY, NOBODY)
    plant(world, cache, as_user=None)
    got = read_as(world, NOBODY, {"IQKIT_CACHE": os.fspath(cache), "HOME": "/nonexistent"})
    assert_reads_true(got, note="not owned by this user")


# -- item 12: no usable cache folder -------------------------------------------------------
def test_a_read_only_cache_folder_falls_back_to_a_private_temporary_cache(world):
    cache = world / "ro-cache"
    cache.mkdir(mode=0o755)  # root's, not writable by nobody
    got = read_as(world, NOBODY, {"IQKIT_CACHE": os.fspath(cache), "HOME": "/nonexistent"})
    assert_reads_true(got, note=FALLBACK)
    assert os.listdir(cache) == []
    # The temporary cache is removed at exit (IPython leaves a folder of its own there
    # when the home folder is not writable).
    assert [n for n in os.listdir(world / "tmp") if n.startswith("iqkit-")] == []


@pytest.mark.parametrize("home", ["/", "/nonexistent"])
def test_an_unusable_home_falls_back_to_a_private_temporary_cache(world, home):
    got = read_as(world, NOBODY, {"HOME": home})
    assert_reads_true(got, note=FALLBACK)
    assert not Path("/nonexistent").exists()


def test_a_file_where_the_cache_folder_should_be(world):
    cache = world / "a-file"
    cache.write_text("not a folder")
    got = read_as(world, 0, {"IQKIT_CACHE": os.fspath(cache)})
    assert_reads_true(got, note=FALLBACK)
    assert cache.read_text() == "not a folder"


# -- item 13: never a cache relative to the current folder ---------------------------------
def test_no_home_and_no_passwd_entry_never_caches_in_the_current_folder(world):
    cwd = world / "cwd"
    cwd.mkdir()
    os.chmod(cwd, 0o777)
    got = read_as(world, NO_PASSWD_UID, {}, cwd=cwd)
    assert_reads_true(got, note=FALLBACK)
    assert os.listdir(cwd) == []


def test_a_relative_iqkit_cache_is_the_folder_it_named_when_first_used(tmp_path, monkeypatch):
    """An explicit relative ``IQKIT_CACHE`` (what the Spark cluster tests use) is made
    absolute once: later changes of the working folder do not move the cache."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.setenv("IQKIT_CACHE", "iqkit-cache")
    cache = FileCache()
    monkeypatch.chdir(tmp_path / "b")
    assert cache.folder == tmp_path / "a" / "iqkit-cache"


# -- item 12: a full cache disk ------------------------------------------------------------
FILL = (
    'mount -t tmpfs -o size=8m iqkit-full "$0" && chmod 700 "$0" && '
    'mkdir -p "$0/$1" && (head -c 16m /dev/zero > "$0/$1/filler" || true) && '
    'touch -d "2000-01-01" "$0/$1/filler" && shift && exec "$@"'
)


@pytest.mark.skipif(not mount_namespaces_work(), reason="needs a private mount namespace")
@pytest.mark.parametrize("filler", ["objects/0123456789abcdef0123", "not-an-entry"])
def test_a_full_cache_disk_is_evicted_then_retried_once(world, filler):
    """The cache's disk is full (a tmpfs filled up): an evictable entry is evicted and
    the build retried; bytes that are not the cache's give one line per partition."""
    cache = world / "full-cache"
    cache.mkdir()
    prefix = in_private_mount_namespace(FILL, os.fspath(cache), filler)
    got = read_as(world, 0, {"IQKIT_CACHE": os.fspath(cache)}, prefix=prefix)
    engine = got["engine"]
    assert "raised" not in engine, engine.get("raised")
    if filler.startswith("objects/"):
        assert_reads_true(got, note="evicted")
        return
    # The partition's first lookup read its files in place (no cache needed): the true
    # value; the lookups after it need the database, which cannot be built.
    assert "a-first" not in engine, engine
    for key in TRUE:
        assert engine[key].startswith("FAILED: ") and "\n" not in engine[key]
        assert "No space left on device" in engine[key], engine[key]
        assert ".building-" not in engine[key]
    # A command line's or a magic's one lookup is a first one: read in place.
    assert got["cli"] == {"rc": 0, "out": "true-a\n", "err": ""}, got["cli"]
    assert got["magic"] == {"values": ["true-a"], "failures": []}, got["magic"]


# -- item 16: writers never need the cache's settings; odd records ---------------------------
def test_a_malformed_cache_size_does_not_stop_local_commits(root, monkeypatch, tmp_path):
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "cache"))
    monkeypatch.setenv("IQKIT_CACHE_SIZE", "lots")
    write_values(root, "true")
    with iqkit.StoreWriter(root, STORE) as w:
        w.put("a", "newer-a")
    assert w.version == 2
    with iqkit.open(root) as engine:
        req = iqkit.StateQueryRequest.in_store(STORE).with_query(iqkit.KeyQuery.with_key("a"))
        with pytest.raises(ValueError, match="IQKIT_CACHE_SIZE must be a size") as err:
            engine.query(req)
        assert "\n" not in str(err.value)


def test_a_huge_written_by_never_names_the_cache_build_folder(root, monkeypatch, tmp_path):
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "cache"))
    write_values(root, "true")
    record = root / STORE / "chain" / "000000000001.json"
    data = json.loads(record.read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    for chain in data["partitions"].values():
        chain["written_by"] = 10**400
    record.write_text(json.dumps(data))
    got = read_as_root(root, tmp_path / "cache")
    for key in TRUE:
        assert ".building-" not in got[key] and "\n" not in got[key]
    assert {k: got[k] for k in TRUE} == TRUE, got
