"""Fixtures for the SQL tests (shared builders are in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path: Path, monkeypatch) -> None:
    """Each test's readers build chain stores' databases in a cache of its own
    (``IQKIT_CACHE``): never the user's home, and no cache shared by the whole run (its
    eviction scans every database it holds, slower as the run goes)."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "iqkit-cache"))
