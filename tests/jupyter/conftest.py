"""Fixtures for the Jupyter tests: real stores on disk and a real IPython shell with
``%load_ext iqkit`` (``iqkit.jupyter.testing``). Shared builders are in tests/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import write_notebook_stores

from iqkit.jupyter.testing import IQTestShell, new_shell


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path: Path, monkeypatch) -> None:
    """Each test's readers build chain stores' databases in a cache of its own
    (``IQKIT_CACHE``): never the user's home, and no cache shared by the whole run (its
    eviction scans every database it holds, slower as the run goes)."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "iqkit-cache"))


@pytest.fixture
def nb_root(tmp_path: Path) -> Path:
    """'totals' (kv, string → json, 4 partitions, fed by topic 'orders'), 'counts'
    (int32 → int64, 2 partitions) and 'clicks' (window store, string → int64)."""
    root = tmp_path / "stores"
    write_notebook_stores(root)
    return root


@pytest.fixture
def shell(nb_root: Path):
    sh: IQTestShell = new_shell(root=str(nb_root), progress=False)
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()
