"""Make the matrix of small frozen Spark checkpoints under tests/data/checkpoints/.

For each Spark line: a throwaway venv outside the repository (made once, cached) with
``pyspark==<version>`` and what the operators need; ``spark_jobs.py`` run in it makes the
cells' checkpoints; then ``statestore_oracle.py``, run with a PySpark 4.3 (by default the
project's ``.venv``), dumps Spark's own ``format("statestore")`` rows of every committed
batch into each cell's ``statestore.json``; last, the matrix table in README.md is
rewritten from the cells' ``cell.json`` files.

    .venv/bin/python tests/data/checkpoints/make_checkpoints.py                 # everything
    .venv/bin/python tests/data/checkpoints/make_checkpoints.py --lines 4.3 3.5 --cells 'agg-*'
    .venv/bin/python tests/data/checkpoints/make_checkpoints.py --readme-only

One Spark at a time, ``local[2]``. Re-running a cell overwrites it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

from spark_jobs import CELLS, LINES, available, line_of, planned  # noqa: E402

# newest patch release of each line on PyPI when this was written (`pip index versions
# pyspark`); --latest asks pip again.
VERSIONS = {"3.5": "3.5.9", "4.0": "4.0.5", "4.1": "4.1.4", "4.2": "4.2.1", "4.3": "4.3.0"}

# what the operators need besides pyspark: pandas + pyarrow (applyInPandasWithState,
# transformWithStateInPandas), protobuf (transformWithStateInPandas' state client; the
# runtime must not be older than, nor two majors past, the generated code's version).
PACKAGES = {
    "3.5": ["numpy<2", "pandas>=1.5,<2.2", "pyarrow>=12,<15"],
    "4.0": ["pandas<2.3", "pyarrow<21", "protobuf>=5.28,<6"],
    "4.1": ["pandas<3", "pyarrow<23", "protobuf>=6.33,<7"],
    "4.2": ["pandas<3", "pyarrow", "protobuf>=6.33,<8"],
    "4.3": ["pandas<3", "pyarrow", "protobuf>=6.33,<8"],
}

DEFAULT_VENVS = Path.home() / ".cache" / "iqkit-spark-venvs"
DEFAULT_WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "iqkit-checkpoint-inputs"
BASE_PYTHON = shutil.which("python3.11") or sys.executable


def log(message: str) -> None:
    print(f"[make] {message}", flush=True)


def latest_versions() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pyspark"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = next(line for line in out.splitlines() if line.startswith("Available versions:"))
    found: dict[str, str] = {}
    for version in listed.split(":", 1)[1].split(","):
        version = version.strip()
        if version and all(p.isdigit() for p in version.split(".")):
            found.setdefault(line_of(version), version)  # pip lists newest first
    return {line: found[line] for line in LINES if line in found}


def pyspark_version(python: str) -> str | None:
    try:
        return subprocess.run(
            [python, "-c", "import pyspark; print(pyspark.__version__)"],
            capture_output=True,
            text=True,
            check=True,
            env=clean_env(python),
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def clean_env(python: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env["TZ"] = "UTC"
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env["PYTHONHASHSEED"] = "0"
    return env


def ensure_venv(venvs: Path, version: str) -> str:
    """The python of a venv with pyspark==version (made and installed on first use)."""
    folder = venvs / version
    python = folder / "bin" / "python"
    if python.exists() and pyspark_version(str(python)) == version:
        return str(python)
    log(f"making venv {folder} (pyspark=={version}; downloads ~350 MB)")
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([BASE_PYTHON, "-m", "venv", str(folder)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            f"pyspark=={version}",
            *PACKAGES[line_of(version)],
        ],
        check=True,
    )
    if pyspark_version(str(python)) != version:
        raise SystemExit(f"pyspark {version} did not install in {folder}")
    return str(python)


def run_logged(cmd: list[str], env: dict[str, str], logfile: Path) -> int:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=out, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if line.startswith("["):
                print("   " + line.rstrip(), flush=True)
        return proc.wait()


def make_line(version: str, cells: list[str], args) -> None:
    out = args.out / version
    work = args.work / version
    line = line_of(version)
    if not args.all_cells:
        cells = [c for c in cells if planned(CELLS[c], version)]
    wanted = [c for c in cells if available(CELLS[c], version)]
    skipped = [c for c in cells if c not in wanted]
    for name in skipped:  # a cell the line cannot make leaves no folder
        if (out / name).exists():
            shutil.rmtree(out / name)
    if not wanted:
        return
    oracle_python = args.oracle_python
    if not args.skip_make:
        python = None
        if not args.isolated_43 and pyspark_version(oracle_python) == version:
            python = oracle_python  # the project's venv already is this version
        python = python or ensure_venv(args.venvs, version)
        env = clean_env(python)
        todo = list(wanted)
        for name in todo:
            if (out / name).exists():
                shutil.rmtree(out / name)
        for attempt in range(2):
            if not todo:
                break
            log(f"{version}: making {len(todo)} cells with {python} (attempt {attempt + 1})")
            code = run_logged(
                [
                    python,
                    str(HERE / "spark_jobs.py"),
                    "--out",
                    str(out),
                    "--work",
                    str(work),
                    *todo,
                ],
                env,
                args.logs / f"{version}-jobs.log",
            )
            todo = [n for n in todo if not (out / n / "cell.json").exists()]
            if code != 0 and todo:
                log(f"{version}: job process exited {code}; {len(todo)} cells left")
        for name in todo:  # crashed twice: recorded, not faked
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / "cell.json").write_text(
                json.dumps(
                    {
                        "cell": name,
                        "spark_version": version,
                        "status": "crashed",
                        "error": f"the job process died; see {args.logs / (version + '-jobs.log')}",
                    },
                    indent=1,
                )
                + "\n",
                encoding="utf-8",
            )
    if not args.skip_oracle:
        folders = [str(out / n) for n in wanted if (out / n / "checkpoint" / "commits").is_dir()]
        if folders:
            log(f"{version}: oracle over {len(folders)} cells with {oracle_python}")
            run_logged(
                [oracle_python, str(HERE / "statestore_oracle.py"), *folders],
                clean_env(oracle_python),
                args.logs / f"{version}-oracle.log",
            )
    del line


# --------------------------------------------------------------------------------------
# README matrix

MATRIX_START = "<!-- matrix:start (written by make_checkpoints.py) -->"
MATRIX_END = "<!-- matrix:end -->"


def _short(text: str, width: int = 240) -> str:
    """An error line for the table: without the JVM class prefix repeated, cut to width."""
    text = re.sub(r"^(\w+): ([\w.$]+\.)?(\w+(Exception|Error|Failure)): ", r"\1: ", text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell_status(folder: Path) -> tuple[str, str]:
    meta = json.loads((folder / "cell.json").read_text(encoding="utf-8"))
    if meta.get("status") != "made":
        return "not made: " + _short(meta.get("error", meta.get("status", "?"))), "–"
    reader = meta.get("reader")
    made = f"made ({meta.get('batches')} batches)"
    if reader is None:
        return made, "reader not run"
    if not reader["reads_failed"]:
        return made, f"reader ok ({reader['reads_ok']} reads)"
    merged: dict[str, int] = {}
    for error, count in reader["errors"].items():
        key = _short(re.sub(r"partitionId=\d+", "partitionId=<n>", error))
        merged[key] = merged.get(key, 0) + count
    errors = "; ".join(f"{e} (x{n})" for e, n in merged.items())
    total = reader["reads_ok"] + reader["reads_failed"]
    if reader["reads_ok"]:
        return made, f"reader failed {reader['reads_failed']}/{total}: {errors}"
    return made, f"reader failed: {errors}"


def matrix_rows(out: Path, versions: dict[str, str]) -> list[str]:
    rows = [
        "| line | cell | operator | provider | codec | extra conf | made | Spark 4.3 reader |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in LINES:
        version = versions.get(line)
        for cell in CELLS.values():
            extra = ", ".join(f"`{k.rsplit('.', 1)[-1]}={v}`" for k, v in cell.conf.items())
            if cell.repartition:
                extra = (
                    extra + ", " if extra else ""
                ) + f"repartition to {cell.repartition} after batch {cell.repartition_after}"
            base = (
                f"| {version or line} | `{cell.name}` | {cell.op} | {cell.provider} "
                f"| {cell.codec} | {extra} |"
            )
            folder = out / (version or "?") / cell.name
            if version and not (folder / "cell.json").exists() and not planned(cell, version):
                continue
            if version and not available(cell, version):
                rows.append(f"{base} not available: {cell.why} | – |")
            elif version and (folder / "cell.json").exists():
                made, reader = _cell_status(folder)
                rows.append(f"{base} {made.replace('|', '/')} | {reader.replace('|', '/')} |")
            else:
                rows.append(f"{base} not run yet | – |")
    return rows


def write_readme(out: Path, versions: dict[str, str]) -> None:
    readme = HERE / "README.md"
    text = (
        readme.read_text(encoding="utf-8") if readme.exists() else f"{MATRIX_START}\n{MATRIX_END}\n"
    )
    start, end = text.index(MATRIX_START), text.index(MATRIX_END)
    table = "\n".join(matrix_rows(out, versions))
    readme.write_text(
        text[: start + len(MATRIX_START)] + "\n\n" + table + "\n\n" + text[end:], encoding="utf-8"
    )
    log(f"matrix written to {readme}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", nargs="+", default=list(LINES), choices=LINES)
    parser.add_argument("--cells", nargs="+", default=["*"], help="cell names or fnmatch patterns")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument(
        "--venvs", type=Path, default=DEFAULT_VENVS, help="where the venvs are cached"
    )
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="scratch folder for inputs")
    parser.add_argument("--logs", type=Path, default=None, help="default: <work>/logs")
    parser.add_argument(
        "--oracle-python",
        default=str(REPO / ".venv" / "bin" / "python"),
        help="a python with pyspark 4.3 (the oracle)",
    )
    parser.add_argument(
        "--latest", action="store_true", help="ask pip for the newest patch releases"
    )
    parser.add_argument(
        "--isolated-43",
        action="store_true",
        help="make 4.3 cells in a venv of their own, not the oracle's python",
    )
    parser.add_argument(
        "--all-cells",
        action="store_true",
        help="make every cell on every line, not only the line's default set",
    )
    parser.add_argument("--skip-make", action="store_true", help="only run the oracle")
    parser.add_argument("--skip-oracle", action="store_true")
    parser.add_argument("--readme-only", action="store_true")
    args = parser.parse_args(argv)
    args.logs = args.logs or args.work / "logs"
    versions = latest_versions() if args.latest else dict(VERSIONS)
    if not args.readme_only:
        cells = [c for c in CELLS if any(fnmatch.fnmatch(c, p) for p in args.cells)]
        if not cells:
            raise SystemExit(f"no cell matches {args.cells}; cells: {', '.join(CELLS)}")
        for line in args.lines:
            started = time.time()
            make_line(versions[line], cells, args)
            log(f"{versions[line]}: done in {time.time() - started:.0f} s")
    write_readme(args.out, versions)
    size = subprocess.run(
        ["du", "-sh", str(args.out)], capture_output=True, text=True
    ).stdout.split()[0]
    log(f"{args.out}: {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
