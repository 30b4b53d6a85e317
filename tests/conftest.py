"""Shared fixtures: every test gets a fresh root folder on disk (real RocksDB).
Helper functions live in ``tests/helpers.py``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root folder for stores (created by the writer side on first use)."""
    return tmp_path / "stores"
