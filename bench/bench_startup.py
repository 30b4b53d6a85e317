"""Start-up (issue 37): ``import iqkit`` and the first commit of a process, each in fresh
processes, against a bare interpreter and rocksdict on its own.

    .venv/bin/python bench/bench_startup.py [--runs 21] [--rows 5] [--no-bytecode]
        [--source DIR]      # DIR: another checkout's iqkit measured (e.g. before a change)

Cases, each run ``--runs`` times in a fresh interpreter (the cases interleaved, so a
load that comes and goes falls on all of them alike):

* ``python -c pass``: the interpreter alone (the floor under every case);
* ``import iqkit``: timed inside the process (``perf_counter`` around the import);
* ``first commit``: ``import iqkit``, then one ``StoreWriter`` block putting ``--rows``
  rows (string keys, JSON values) into a store made beforehand by another process (one
  store per run, 4 partitions, on local disk); timed inside from just before the
  ``with`` to just after it (the import not included: it is the case above);
* ``rocksdict put``: ``import rocksdict``, then the same rows put into a new RocksDB
  folder and the database closed, timed inside from the import on: the floor a commit's
  own writes have.

Byte-code: by default the runs have it cached, as an installed iqkit has (pip compiles
at install): ``PYTHONPYCACHEPREFIX`` points at a folder of this run's (the checkout is
left alone) and one round, not counted, writes it. ``--no-bytecode`` runs with
``PYTHONDONTWRITEBYTECODE=1`` and no prefix: a checkout without ``__pycache__`` folders
then compiles iqkit's source in every process (installed packages keep theirs).

Printed per case: the median (and min, max) of the time inside the process, of the
process's wall time (start to exit, as a shell sees it) and of its CPU time (user + sys,
``getrusage(RUSAGE_CHILDREN)`` around each run); the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1]

IMPORT = """
import time
t0 = time.perf_counter()
import iqkit
print(json.dumps({"inside": time.perf_counter() - t0}))
"""

COMMIT = """
import time
import iqkit
root, rows = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
with iqkit.StoreWriter(root, "totals") as w:
    for i in range(rows):
        w.put(f"user-{i}", {"total": i, "name": f"n{i}"})
print(json.dumps({"inside": time.perf_counter() - t0}))
"""

ROCKSDICT = """
import time
t0 = time.perf_counter()
import rocksdict
root, rows = sys.argv[1], int(sys.argv[2])
db = rocksdict.Rdict(root + "/raw", options=rocksdict.Options(raw_mode=True))
for i in range(rows):
    db[f"user-{i}".encode()] = json.dumps({"total": i, "name": f"n{i}"}).encode()
db.close()
print(json.dumps({"inside": time.perf_counter() - t0}))
"""

CASES = {
    "python -c pass": "pass",
    "import iqkit": "import json\n" + IMPORT,
    "first commit": "import json, sys\n" + COMMIT,
    "rocksdict put": "import json, sys\n" + ROCKSDICT,
}


def child_env(workdir: Path, bytecode: bool) -> dict[str, str]:
    """The environment of every run: the measured checkout's iqkit; byte-code as the
    module docstring says."""
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(code: str, *args: str, env: dict[str, str]) -> dict[str, float]:
    """One fresh interpreter running ``code``: its wall time, CPU time and, when it
    printed one, the time it measured inside."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    argv = [sys.executable, "-c", code, *args]
    try:
        done = subprocess.run(argv, cwd=SOURCE, env=env, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"a run failed:\n{exc.stderr[-3000:]}") from None
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    return {"wall": wall, "cpu": cpu, **out}


def make_stores(workdir: Path, runs: int, env: dict[str, str]) -> list[Path]:
    """One store per run (``totals``, 4 partitions), made by one other process."""
    roots = [workdir / f"root{i}" for i in range(runs)]
    code = (
        "import sys, iqkit\n"
        "for root in sys.argv[1:]:\n"
        "    iqkit.create_store(root, 'totals', partitions=4)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, *map(str, roots)],
        cwd=SOURCE,
        env=env,
        check=True,
    )
    return roots


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):7.0f} ms ({min(ms):.0f}-{max(ms):.0f})"


def main() -> None:
    global SOURCE  # the checkout measured: run() and make_stores() import iqkit from it
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--no-bytecode", action="store_true")
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args()
    SOURCE = args.source.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="iqkit-startup-"))
    env = child_env(workdir, not args.no_bytecode)
    try:
        warm = 0 if args.no_bytecode else 1  # the uncounted round that writes byte-code
        roots = make_stores(workdir, args.runs + warm, env)
        load_before = os.getloadavg()
        results: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
        for i in range(args.runs + warm):
            for case, code in CASES.items():
                extra: tuple[str, ...] = ()
                if case == "first commit":
                    extra = (str(roots[i]), str(args.rows))
                elif case == "rocksdict put":
                    target = workdir / f"raw{i}"
                    target.mkdir()
                    extra = (str(target), str(args.rows))
                result = run(code, *extra, env=env)
                if i >= warm:
                    results[case].append(result)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cached = "not cached (PYTHONDONTWRITEBYTECODE=1)" if args.no_bytecode else "cached"
    print(f"iqkit from {SOURCE}")
    print(f"python {sys.version.split()[0]}, {args.runs} runs per case, {args.rows} rows")
    print(f"byte-code {cached}")
    print(f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min)")
    print(f"{'case':16} {'inside the process':>26} {'process wall':>26} {'process CPU':>26}")
    for case, rows in results.items():
        inside = [r["inside"] for r in rows if "inside" in r]
        print(
            f"{case:16} {summary(inside) if inside else '':>26} "
            f"{summary([r['wall'] for r in rows]):>26} {summary([r['cpu'] for r in rows]):>26}"
        )


if __name__ == "__main__":
    main()
