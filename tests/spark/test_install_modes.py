"""``spark.read.format("iqkit")`` with no registration call, under every way of installing
iqkit: ``pip install .``, ``pip install -e .`` (setuptools' default editable mode), ``pip
install -e . --config-settings editable_mode=compat`` and a built wheel.

Why: Spark's Python worker finds ``pyspark_*`` packages with ``pkgutil.iter_modules()``.
An install that makes ``pyspark_iqkit`` importable without putting its folder on
``sys.path`` (setuptools' meta-path finder, which the default editable mode used for a
flat layout before ``package-dir`` named the project root) registers nothing, and
``format("iqkit")`` is then "not found" in a session that imports fine.

Each mode gets a fresh venv and a fresh copy of the project under the test's tmp folder,
so nothing is written into the repository. No network: the build runs without isolation
(``--no-deps --no-build-isolation``) and the venv reaches setuptools and iqkit's
dependencies through a ``.pth`` file naming the folders this interpreter imports them from.
A path line in a ``.pth`` file adds the folder without processing the ``.pth`` files in
it, so the project's own install of iqkit (an editable ``.pth`` there) does not leak in:
the script checks that ``iqkit`` and ``pyspark_iqkit`` come from the fresh install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

#: pip's arguments per mode ("wheel": built with ``pip wheel``, then installed).
MODES = {
    "regular": ["install", "."],
    "editable": ["install", "-e", "."],
    "editable-compat": ["install", "-e", ".", "--config-settings", "editable_mode=compat"],
    "wheel": None,
}
OFFLINE = ["--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
#: The oldest setuptools that reads ``license = "Apache-2.0"`` (an SPDX expression).
SETUPTOOLS_MIN = (77,)

SCRIPT = r"""
import json, os, pkgutil, sys
from pathlib import Path

import iqkit
from iqkit import StoreWriter

top = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_"))
root = Path(sys.argv[1])
iqkit.create_store(root, "totals", partitions=3)
with StoreWriter(root, "totals") as w:
    for i in range(10):
        w.put(f"k{i}", {"n": i})

from pyspark.sql import SparkSession

os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (
    SparkSession.builder.master("local[1]")
    .appName("iqkit-install-mode")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.driver.memory", "512m")
    .getOrCreate()
)
rows, error = None, None
try:
    df = spark.read.format("iqkit").option("root", str(root)).option("store", "totals").load()
    rows = sorted((r["key"], r["value"]) for r in df.collect())
except Exception as exc:  # py4j's text: a line naming the call, the JVM's message, its stack
    lines = [s.strip() for s in str(exc).splitlines()]
    error = next(s for s in lines[1:] + lines if s and not s.startswith("at "))
finally:
    spark.stop()
import pyspark_iqkit
print("RESULT" + json.dumps({
    "iqkit": iqkit.__file__, "pyspark_iqkit": pyspark_iqkit.__file__, "top": top,
    "rows": rows, "error": error,
}))
"""


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory) -> Path:
    """The project's files (what git tracks, plus new files it does not ignore), copied;
    without git (an unpacked archive), the tree less the venv, scratch and build folders."""
    copy = tmp_path_factory.mktemp("project") / "iqkit"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        skip = shutil.ignore_patterns(".git", ".venv", ".test-tmp", "build", "*.egg-info")
        shutil.copytree(REPO, copy, ignore=skip)
        return copy
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is skipped
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def _offline_venv(where: Path) -> Path:
    """A venv without pip of its own whose ``.pth`` file reaches this interpreter's
    setuptools and site-packages (where pip and iqkit's dependencies are); its python."""
    import setuptools

    found = tuple(int(p) for p in setuptools.__version__.split(".")[:1])
    assert found >= SETUPTOOLS_MIN, (
        f"setuptools {setuptools.__version__} cannot build iqkit (needs >=77): "
        "make install (the dev extra) brings a newer one"
    )
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # setuptools first: this interpreter may import a newer one than site-packages holds.
    lines = dict.fromkeys(
        [str(Path(setuptools.__file__).parent.parent), sysconfig.get_paths()["purelib"]]
    )
    Path(purelib, "iqkit-test-deps.pth").write_text("\n".join(lines) + "\n")
    return python


def _run(cmd: list, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("mode", list(MODES))
def test_format_iqkit_is_found_without_registration(mode, project_copy, tmp_path):
    from helpers import require_java

    require_java()
    project = tmp_path / "project"
    shutil.copytree(project_copy, project)  # each mode builds in a copy of its own
    python = _offline_venv(tmp_path / "venv")
    # No PYTHONPATH: the venv alone decides what is imported (a test run sets it), and
    # no Spark interpreter of this process's (the session fixture sets them).
    unset = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if MODES[mode] is None:
        _run([python, "-m", "pip", "wheel", *OFFLINE, "-w", tmp_path / "dist", "."], project, env)
        (wheel,) = (tmp_path / "dist").glob("iqkit-*.whl")
        _run([python, "-m", "pip", "install", *OFFLINE, wheel], project, env)
    else:
        _run([python, "-m", "pip", *MODES[mode], *OFFLINE], project, env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run_script(python, elsewhere, env, tmp_path / "stores")
    installed = project if mode.startswith("editable") else tmp_path / "venv"
    for module in ("iqkit", "pyspark_iqkit"):
        assert Path(result[module]).is_relative_to(installed), (module, result[module])
    assert result["error"] is None, f"{mode}: {result['error']} (pkgutil lists {result['top']})"
    assert "pyspark_iqkit" in result["top"]
    assert result["rows"] == [[f"k{i}", f'{{"n":{i}}}'] for i in range(10)]


def _run_script(python: Path, cwd: Path, env: dict[str, str], root: Path) -> dict:
    done = subprocess.run(
        [python, "-c", SCRIPT, root],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"the script failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT") :])
