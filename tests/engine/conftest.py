"""The engine tests' fixtures: each test reads through a file cache of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

import iqkit


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path: Path, monkeypatch) -> None:
    """Each test's readers build chain stores' databases in a cache of its own
    (``IQKIT_CACHE``): never the user's home, and no cache shared by the whole run (its
    eviction scans every database it holds, slower as the run goes)."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "iqkit-cache"))


@pytest.fixture(scope="session")
def open_engine():
    """``iqkit.open``: ``open_engine(root, as_of=...)``."""

    def open_(root, **options) -> iqkit.StateEngine:
        return iqkit.StateEngine(root, **options)

    return open_
