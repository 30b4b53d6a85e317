"""The README runs as written: every ``python`` block, in order, in one real IPython shell
(plain Python, the Spark blocks on real local Spark, the ``%iq`` blocks), in a fresh
Python process whose working folder is empty — what a newcomer copying the blocks in
order gets. Then the ``sh`` block's ``python -m iqkit`` lines run as commands. A block
that needs something an earlier one did not define fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import run_python_script

import iqkit

#: Every README block in one fresh process, Spark jobs included: minutes (conftest.py runs
#: slow files first).
pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

# Runs in the fresh process: each block is one cell of a real IPython shell.
_RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from iqkit.jupyter.testing import new_shell
    blocks = json.loads(sys.argv[1])
    shell = new_shell()
    report = []
    for body in blocks:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                shell.run_cell(body)
            report.append(["ok", out.getvalue()])
        except BaseException as exc:
            report.append([f"{type(exc).__name__}: {exc}", out.getvalue()])
            break
    ns = shell.user_ns
    facts = {"alice_rows": ns["alice"].count() if "alice" in ns else None}
    spark = ns.get("spark")
    if spark is not None:
        spark.stop()
    print("RESULT" + json.dumps({"blocks": report, "facts": facts}))
    """
)


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path_factory, monkeypatch) -> None:
    """This process's readers of chain stores build their databases in a cache of the
    test's own (``IQKIT_CACHE``), never the user's home."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path_factory.mktemp("iqkit-cache")))


def blocks(language: str) -> list[str]:
    return [body for lang, body in _BLOCK.findall(README.read_text("utf-8")) if lang == language]


def test_no_link_points_outside_the_repository():
    text = README.read_text("utf-8")
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert "://" not in target and not target.startswith(".."), target
        assert (README.parent / target.split("#")[0]).exists(), target


def newcomer_env(cache: Path) -> dict[str, str]:
    """This environment, with the reader's cache (``IQKIT_CACHE``: the databases built
    for chain stores) in ``cache``, never the user's home."""
    return {**os.environ, "IQKIT_CACHE": os.fspath(cache)}


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    env = newcomer_env(tmp_path_factory.mktemp("readme-cache"))
    python = blocks("python")
    assert len(python) >= 3, "the quick start, Spark and Jupyter blocks"
    report = run_python_script(_RUNNER, json.dumps(python), cwd=folder, env=env, timeout=900)
    return folder, env, report


def test_every_python_block_runs_in_order(readme_run):
    folder, env, report = readme_run
    for i, (status, output) in enumerate(report["blocks"]):
        assert status == "ok", f"README python block {i + 1}: {status}\n{output[-1500:]}"
    assert len(report["blocks"]) == len(blocks("python"))
    quick_start = report["blocks"][0][1]
    assert quick_start.startswith("1\n")  # w.version
    assert "Handled in RocksDBLayer" in quick_start
    with iqkit.open(folder / "stores") as engine:
        assert engine.version("totals") == 4  # the quick start's commit, then "Versions as data"
    assert any(Path(env["IQKIT_CACHE"]).iterdir())  # its readers built databases there
    assert report["facts"]["alice_rows"] == 1  # the key lookup through the data source


def test_the_quick_start_s_lag_reads_zero_once_everything_is_applied(readme_run):
    folder, _, _ = readme_run
    with iqkit.open(folder / "stores") as engine:
        lags = engine.lags()["totals"]
    assert {p: lag.offset_lag for p, lag in lags.items()} == {p: 0 for p in lags}


def test_the_shell_commands_run(readme_run):
    folder, env, _ = readme_run
    commands = [
        line.strip()
        for body in blocks("sh")
        for line in body.splitlines()
        if line.strip().startswith("python -m iqkit")
    ]
    assert commands, "README has no python -m iqkit example"
    for command in commands:
        argv = [sys.executable, *shlex.split(command.split("#")[0])[1:]]
        done = subprocess.run(
            argv, cwd=folder, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert done.stdout.strip(), command
