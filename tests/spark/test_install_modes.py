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
import io, json, pkgutil, struct

import iqkit

top = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_"))
# Spark's own lookup of Python data sources, as a Python worker runs it when a session
# first meets one (it writes the count, then each name and pickled class, to the JVM).
from pyspark.sql.worker.lookup_data_sources import _main as lookup
found = io.BytesIO()
lookup(None, found)
found.seek(0)
count = struct.unpack("!i", found.read(4))[0]
names = []
for _ in range(count):
    size = struct.unpack("!i", found.read(4))[0]
    names.append(found.read(size).decode())
    found.read(struct.unpack("!i", found.read(4))[0])  # the pickled class
import pyspark_iqkit
print("RESULT" + json.dumps({
    "iqkit": iqkit.__file__, "pyspark_iqkit": pyspark_iqkit.__file__, "top": top,
    "sources": names,
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


def _install(mode: str, project_copy: Path, where: Path, env: dict[str, str]) -> Path:
    """A fresh venv under ``where`` with iqkit installed in ``mode``; its python."""
    project = where / "project"
    shutil.copytree(project_copy, project)  # each mode builds in a copy of its own
    python = _offline_venv(where / "venv")
    if MODES[mode] is None:
        _run([python, "-m", "pip", "wheel", *OFFLINE, "-w", where / "dist", "."], project, env)
        (wheel,) = (where / "dist").glob("iqkit-*.whl")
        _run([python, "-m", "pip", "install", *OFFLINE, wheel], project, env)
    else:
        _run([python, "-m", "pip", *MODES[mode], *OFFLINE], project, env)
    return python


def test_format_iqkit_is_found_without_registration_under_every_install_mode(
    project_copy, tmp_path
):
    # Every mode: Spark's own lookup of Python data sources (the code a Python worker runs
    # at a session's first data-source call) must find "iqkit" in the fresh venv. That
    # lookup is the only step an install mode changes; a whole session reading rows
    # through format("iqkit") with no registration, under the Makefile's install (the
    # default editable mode), is test_startup_order's.
    # No PYTHONPATH: the venv alone decides what is imported (a test run sets it), and
    # no Spark interpreter of this process's (the session fixture sets them).
    unset = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    pythons = {mode: _install(mode, project_copy, tmp_path / mode, env) for mode in MODES}
    running = {}
    for mode, python in pythons.items():  # the checks run at once
        elsewhere = tmp_path / mode / "elsewhere"
        elsewhere.mkdir()
        running[mode] = _start_script(python, elsewhere, env)
    results = {mode: _result(done) for mode, done in running.items()}
    for mode, result in results.items():
        installed = tmp_path / mode / ("project" if mode.startswith("editable") else "venv")
        for module in ("iqkit", "pyspark_iqkit"):
            assert Path(result[module]).is_relative_to(installed), (mode, module, result[module])
        assert "pyspark_iqkit" in result["top"], mode
        assert result["sources"] == ["iqkit"], f"{mode}: Spark's lookup found {result['sources']}"


def _start_script(python: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [python, "-c", SCRIPT],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=600)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"the script failed:\n{stdout[-3000:]}\n{stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT") :])
