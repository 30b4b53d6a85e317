"""Fault machinery shared by the tests and the reliability probes (``tests/reliability``).

* ``tree_state``: every file, folder and link under a folder with its bytes and mtime,
  to prove a reader changed nothing.
* ``read_session``: a query session touching every kind of read (key, multi-key, range,
  prefix, scan, window, lags, versions, ``as_of``), summarised as JSON-able data, so a
  session run elsewhere (a read-only copy, another process) can be compared.
* ``run_read_only``: run Python code in a process for which a folder is really
  read-only, by whatever this machine allows (see its docstring).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import iqkit
from iqkit.store.layout import StoreLayout
from iqkit.store.versions import read_version

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


# -- what a store holds and what a process holds open --------------------------------------
def folders_on_disk(layout: StoreLayout) -> set[tuple[int, int]]:
    return {
        (int(p), int(f))
        for p in os.listdir(layout.partitions_dir)
        for f in os.listdir(layout.partition_dir(int(p)))
        if f.isdigit()
    }


def referenced_folders(layout: StoreLayout, versions: list[int]) -> set[tuple[int, int]]:
    return {item for v in versions for item in read_version(layout, v).partitions.items()}


def open_store_files(layout: StoreLayout) -> list[str]:
    """Paths under the store this process holds open (from /proc/self/fd)."""
    store = os.fspath(layout.store_dir) + os.sep
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(store):
            out.append(target)
    return out


# -- read-only stores ----------------------------------------------------------------------
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


def _mount_namespaces_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount --bind / /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


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
    base = Path(tempfile.mkdtemp(prefix="iqkit-ro-"))
    os.chmod(base, 0o755)
    copy = base / "stores"
    shutil.copytree(root, copy, symlinks=True)
    try:
        if os.geteuid() != 0:
            _chmod_tree(copy, writable=False)
            yield copy, [], {}, "a copy without write permission (not root)"
        elif _mount_namespaces_work():
            mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
            prefix = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                mount,
                str(copy),
            ]
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
