"""Fault machinery shared by the tests and the reliability probes (``tests/reliability``).

* ``tree_state``: every file, folder and link under a folder with its bytes and mtime,
  to prove a reader changed nothing.
* ``read_session``: a query session touching every kind of read (key, multi-key, range,
  prefix, scan, window, lags, versions, ``as_of``), summarised as JSON-able data, so a
  session run elsewhere (a read-only copy, another process) can be compared.
* ``run_read_only``: run Python code in a process for which a folder is really
  read-only, by whatever this machine allows (see its docstring).
* The *generation store* and its killable writer process (``Child``), for crash
  consistency under SIGKILL (see that section).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from helpers import (
    folder_for_other_users,
    in_private_mount_namespace,
    kv_rows,
    mount_namespaces_work,
)

import iqkit
from iqkit.store.encoding.partitioners import murmur2_partition
from iqkit.store.names import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """Environment for a child Python that imports iqkit and these helpers from here."""
    env = dict(os.environ)
    paths = [str(REPO), str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def tree_state(folder: Path) -> dict[str, tuple[str, str, int]]:
    """Relative path -> (kind, content digest or link target, mtime in ns) of everything
    below ``folder``, folders included (a created or removed entry changes a folder's
    mtime)."""
    out: dict[str, tuple[str, str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), st.st_mtime_ns)
            elif path.is_dir():
                out[rel] = ("dir", "", st.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", digest, st.st_mtime_ns)
    return out


def describe_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(
        f"{path}: {before.get(path)} -> {after.get(path)}"
        for path in set(before) | set(after)
        if before.get(path) != after.get(path)
    )


def _rows(result: iqkit.QueryResult) -> list[list[Any]]:
    with result.result as it:
        return [[repr(kv.key), repr(kv.value)] for kv in it]


def read_session(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Read every store under ``root`` every way the engine offers; a JSON-able summary
    (failures included, as ``[reason, message]``)."""

    def req(store: str, query: iqkit.Query) -> iqkit.StateQueryRequest:
        return iqkit.StateQueryRequest.in_store(store).with_query(query)

    def summary(result: iqkit.StateQueryResult, rows: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p, r in sorted(result.partition_results.items()):
            if r.is_failure:
                out[str(p)] = [r.failure_reason.name, r.failure_message]
            elif rows:
                out[str(p)] = [_rows(r), r.position.to_map()]
            else:
                out[str(p)] = [repr(r.result), r.position.to_map()]
        return out

    report: dict[str, Any] = {}
    with iqkit.open(root) as engine:
        for store in engine.store_names():
            manifest = engine.manifest(store)
            s: dict[str, Any] = {
                "version": engine.version(store),
                "versions": engine.versions(store),
            }
            if manifest.kind == "window":
                s["windows"] = summary(
                    engine.query(
                        req(store, iqkit.WindowRangeQuery.with_window_start_range(0, 10**12))
                    ),
                    True,
                )
            else:
                keys: list[Any] = []
                scan = engine.query(req(store, iqkit.RangeQuery.with_no_bounds()))
                for r in scan.partition_results.values():
                    if r.is_success:
                        with r.result as it:
                            keys.extend(kv.key for kv in it)
                s["scan"] = summary(
                    engine.query(req(store, iqkit.RangeQuery.with_no_bounds())), True
                )
                s["desc"] = summary(
                    engine.query(
                        req(store, iqkit.RangeQuery.with_no_bounds().with_descending_keys())
                    ),
                    True,
                )
                s["raw"] = summary(engine.query(req(store, iqkit.RawScanQuery.scan())), True)
                if manifest.key_serde == "string":
                    s["prefix"] = summary(
                        engine.query(req(store, iqkit.PrefixScanQuery.with_prefix("a"))), True
                    )
                    typed = sorted(keys)
                    s["multi"] = summary(
                        engine.query(req(store, iqkit.MultiKeyQuery.with_keys(typed))), False
                    )
                    for key in typed[:3]:
                        s[f"key {key}"] = summary(
                            engine.query(req(store, iqkit.KeyQuery.with_key(key))), False
                        )
            for version in engine.versions(store)[:-1]:
                with iqkit.open(root, as_of={store: version}) as pinned:
                    query = (
                        iqkit.WindowRangeQuery.with_window_start_range(0, 10**12)
                        if manifest.kind == "window"
                        else iqkit.RangeQuery.with_no_bounds()
                    )
                    s[f"as_of {version}"] = summary(pinned.query(req(store, query)), True)
            report[store] = s
        report["lags"] = {
            store: {
                str(p): [info.current_position.to_map(), info.offset_lag]
                for p, info in sorted(parts.items())
            }
            for store, parts in engine.lags().items()
        }
    return json.loads(json.dumps(report))


# -- what a process holds open ----------------------------------------------------------------
def open_store_files(folder: Path) -> list[str]:
    """Paths under the store folder ``folder`` this process holds open (/proc/self/fd)."""
    store = os.fspath(folder) + os.sep
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(store):
            out.append(target)
    return out


_READ_ONLY_CHILD = r"""
import errno, json, os, sys
import faults
root = sys.argv[1]
try:
    open(os.path.join(root, "written-by-a-reader"), "w").close()
except OSError as exc:
    proof = errno.errorcode.get(exc.errno, str(exc.errno))
else:
    raise SystemExit("the folder is writable: this run would prove nothing")
print(json.dumps({"proof": proof, "session": faults.read_session(root)}))
"""


@contextmanager
def read_only_copy(root: Path) -> Iterator[tuple[Path, list[str], dict[str, Any], str]]:
    """Copy ``root`` somewhere every user can reach; yield (copy, argv prefix, Popen
    keyword arguments, how) for a child process that sees the copy read-only.

    Root ignores permission bits, so for root the copy is made read-only with a
    read-only bind mount inside a private mount namespace (``unshare --mount``) when the
    kernel allows it (it does in this project's containers), else the child runs as user
    ``nobody`` over a copy without write permission. A non-root user just gets a copy
    without write permission. The child proves the copy is read-only before reading.
    """
    base = folder_for_other_users("iqkit-ro-")
    copy = base / "stores"
    shutil.copytree(root, copy, symlinks=True)
    try:
        if os.geteuid() != 0:
            _chmod_tree(copy, writable=False)
            yield copy, [], {}, "a copy without write permission (not root)"
        elif mount_namespaces_work():
            mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
            prefix = in_private_mount_namespace(mount, str(copy))
            yield copy, prefix, {}, "a read-only bind mount in a private mount namespace"
        else:
            _chmod_tree(copy, writable=False)

            def become_nobody() -> None:
                os.setgid(65534)
                os.setuid(65534)

            yield copy, [], {"preexec_fn": become_nobody}, "user nobody over a read-only copy"
    finally:
        _chmod_tree(copy, writable=True)
        shutil.rmtree(base, ignore_errors=True)


def _chmod_tree(folder: Path, *, writable: bool) -> None:
    for dirpath, _, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755 if writable else 0o555)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644 if writable else 0o444)


def run_read_only(root: Path) -> tuple[dict[str, Any], str, str]:
    """``read_session`` of a read-only copy of ``root``, run in a child process; returns
    (session, the errno that proved the copy read-only, how it was made read-only)."""
    with read_only_copy(root) as (copy, prefix, kwargs, how):
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _READ_ONLY_CHILD, str(copy)],
            capture_output=True,
            env=child_env(),
            cwd=tempfile.gettempdir(),
            timeout=300,
            **kwargs,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"read-only reader ({how}) failed: rc={proc.returncode}\n"
                f"{proc.stderr.decode()[-4000:]}"
            )
        out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        return out["session"], out["proof"], how


# -- the generation store: crash consistency under SIGKILL ---------------------------------
# Every commit writes a whole *generation* g: keys ``k0..k49`` (string keys, int64 values,
# 4 partitions, murmur2) all get the value g with ``source=("in", 0, g)``, and the version
# record gets ``metadata["generation"] = g``. A commit touches all four partitions and
# publishes one version, so in every consistent version, each partition holds exactly its
# keys, all with value g, at position ``{"in": {0: g}}``, and all four partitions have the
# same g. Writers are separate processes running ``CHILD`` against real RocksDB folders,
# killed with SIGKILL (no ``finally``, no ``atexit``, no RocksDB shutdown: open files, the
# ``flock`` on ``writer.lock`` and RocksDB's LOCK go away only because the kernel cleans
# them up). The probes using this are in ``tests/store/probes_store.py``.
STORE = "gens"
PARTITIONS = 4
RETENTION = 2
KEYS = [f"k{i}" for i in range(50)]
KEYS_BY_PARTITION = {
    p: sorted(k for k in KEYS if murmur2_partition(k.encode(), PARTITIONS) == p)
    for p in range(PARTITIONS)
}

# -- the writer process ------------------------------------------------------------------
# argv: root, first generation, mode. Mode "loop" commits generations first, first+1, ...
# until killed. Each commit that returns is reported as "committed <generation> <version>".
CHILD = r"""
import sys
root, first, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import iqkit

KEYS = [f"k{i}" for i in range(50)]
if mode != "loop":
    raise SystemExit(f"unknown mode {mode!r}")


def commit(g):
    with iqkit.StoreWriter(root, "gens", who="crash-child") as w:
        for k in KEYS:
            w.put(k, g, source=("in", 0, g))
        w.set_metadata(generation=g)
    print(f"committed {g} {w.version}", flush=True)


print("ready", flush=True)
g = first
while True:
    commit(g)
    g += 1
"""


class Child:
    """A writer process running ``CHILD``."""

    def __init__(self, root: Path, first: int, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(first), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        self.stdout = b""
        self.stderr = b""
        self.done = False

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else b""
        if line.strip() != b"ready":
            self.kill()
            raise AssertionError(f"writer process did not start: {line!r} {self.stderr.decode()}")

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.finish()

    def finish(self, timeout: float = 60.0) -> int:
        if not self.done:
            out, err = self.proc.communicate(timeout=timeout)
            self.stdout += out
            self.stderr += err
            self.done = True
        return self.proc.returncode

    def committed(self) -> list[tuple[int, int]]:
        """(generation, version) of every commit that returned in the child."""
        return [
            (int(g), int(v))
            for kind, g, v in (line.split() for line in self.stdout.decode().splitlines())
            if kind == "committed"
        ]

    def describe(self) -> str:
        return f"rc={self.proc.returncode} stderr:\n{self.stderr.decode()[-3000:]}"


def request(query: iqkit.Query) -> iqkit.StateQueryRequest:
    return iqkit.StateQueryRequest.in_store(STORE).with_query(query)


def position(g: int) -> iqkit.Position:
    return iqkit.Position.from_map({"in": {0: g}})


def new_store(root: Path) -> Path:
    """The generation store under ``root``; its folder."""
    iqkit.create_store(
        root,
        STORE,
        partitions=PARTITIONS,
        key_serde="string",
        value_serde="int64",
        partitioner="murmur2",
        retention=RETENTION,
    )
    return root / STORE


def commit_generation(root: Path, g: int) -> int:
    """Commit generation ``g`` from this process; the dead writer must not block it."""
    with iqkit.StoreWriter(root, STORE, lock_timeout=5.0, who="test-parent") as w:
        for k in KEYS:
            w.put(k, g, source=("in", 0, g))
        w.set_metadata(generation=g)
    assert w.version is not None
    return w.version


def drain(result: iqkit.QueryResult) -> dict[str, int]:
    with result.result as it:
        return {kv.key: kv.value for kv in it}


def partition_generation(p: int, qr: iqkit.QueryResult, values: dict[str, int]) -> int:
    """The one generation partition ``p``'s result holds (all its keys, one value)."""
    assert sorted(values) == KEYS_BY_PARTITION[p], f"partition {p}: keys {sorted(values)}"
    gens = set(values.values())
    assert len(gens) == 1, f"partition {p} mixes generations {sorted(gens)}"
    g = gens.pop()
    assert qr.position == position(g), f"partition {p}: position {qr.position} for g={g}"
    return g


def query_generation(engine: iqkit.StateEngine, rng: random.Random) -> int:
    """Read the store every way the tests use; all must agree on one generation."""
    multi = engine.query(request(iqkit.MultiKeyQuery.with_keys(KEYS))).partition_results
    scan = engine.query(request(iqkit.RangeQuery.with_no_bounds())).partition_results
    assert sorted(multi) == sorted(scan) == list(range(PARTITIONS))
    gens = set()
    for p in range(PARTITIONS):
        for qr in (multi[p], scan[p]):
            assert qr.is_success, f"partition {p}: {qr.failure_reason} {qr.failure_message}"
        gens.add(partition_generation(p, multi[p], multi[p].result))
        gens.add(partition_generation(p, scan[p], drain(scan[p])))
    key = rng.choice(KEYS)
    single = engine.query(request(iqkit.KeyQuery.with_key(key))).only_partition_result()
    assert single is not None and single.is_success
    gens.add(single.result)
    assert single.position == position(single.result)
    assert len(gens) == 1, f"one engine version, several generations: {sorted(gens)}"
    return gens.pop()


def commit_one_key_and_read(
    root: Path, engine: iqkit.StateEngine, rng: random.Random, value: int, expected: dict
) -> tuple[int, int]:
    """The long-lived-engine round: commit one random key of store ``s`` (k0-k39) as
    ``value`` (recorded in ``expected``), then read the whole store through ``engine``,
    which must see every committed key at once. (keys lost or stale, version committed)"""
    key = f"k{rng.randrange(40)}"
    with iqkit.StoreWriter(root, "s") as w:
        w.put(key, value)
    expected[key] = value
    found = {k: v for _, k, v in kv_rows(engine, "s")}
    return sum(1 for k, v in expected.items() if found.get(k) != v), w.version


def kill_at_random(
    child: Child, rng: random.Random, folder: Path, label: str
) -> list[tuple[int, int]]:
    """SIGKILL the writer ``child`` 0-300 ms after it is ready; check it died of the
    signal and left the commit lock free; the commits that returned in it."""
    child.wait_ready()
    time.sleep(rng.uniform(0.0, 0.3))
    rc = child.kill()
    assert rc == -signal.SIGKILL, f"{label}: writer died on its own: {child.describe()}"
    assert_lock_free(folder)
    return child.committed()


def assert_lock_free(folder: Path) -> None:
    """The dead writer's flock on the store's ``writer.lock`` is gone (the kernel released
    it)."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
    finally:
        os.close(fd)


def fault_rng() -> tuple[int, random.Random]:
    seed = int(os.environ.get("IQKIT_FAULT_SEED", str(time.time_ns() % 1_000_000)))
    return seed, random.Random(seed)
