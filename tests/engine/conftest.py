"""The engine's query tests run over both partition backends, as Kafka Streams runs its
store tests over every store supplier: the published RocksDB folders, and in-memory
copies of them (``MemoryPartition``, the model RocksDB must agree with)."""

from __future__ import annotations

from pathlib import Path

import pytest

import iqkit
from iqkit.store.memory import MemoryPartition

BACKENDS = {"rocksdb": None, "memory": MemoryPartition.load}


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path: Path, monkeypatch) -> None:
    """Each test's readers build chain stores' databases in a cache of its own
    (``IQKIT_CACHE``): never the user's home, and no cache shared by the whole run (its
    eviction scans every database it holds, slower as the run goes)."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "iqkit-cache"))


@pytest.fixture(scope="session", params=sorted(BACKENDS))
def open_engine(request):
    """``iqkit.open`` for one backend: ``open_engine(root, as_of=...)``."""
    opener = BACKENDS[request.param]

    def open_(root, **options) -> iqkit.StateEngine:
        return iqkit.StateEngine(root, partition_opener=opener, **options)

    return open_
