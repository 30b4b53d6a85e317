"""Shared fixtures: every test gets a fresh root folder on disk (real RocksDB)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import iqkit


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root folder for stores (created by the writer side on first use)."""
    return tmp_path / "stores"


def request(store: str, query: iqkit.Query) -> iqkit.StateQueryRequest:
    return iqkit.StateQueryRequest.in_store(store).with_query(query)


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below ``folder`` (to prove nothing changed)."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def rows(result: iqkit.QueryResult) -> list[tuple]:
    """Drain an iterator result into (key, value) tuples."""
    with result.result as it:
        return [(kv.key, kv.value) for kv in it]
