"""What the Spark tests read from a store's version records: the records (metadata,
partitions) and each partition's commit record (puts, deletes, position), as the writer
left them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iqkit.store.chain.records import ChainVersion, latest_version, read_version, record_key
from iqkit.store.objects import open_objects


def version_record(root: Path | str, store: str, version: int) -> ChainVersion:
    """Version ``version``'s record of ``store``."""
    return read_version(open_objects(root), store, version)


def version_record_path(root: Path | str, store: str, version: int) -> Path:
    """The file holding version ``version``'s record (a local root's)."""
    return Path(root) / record_key(store, version)


def commit_records(root: Path | str, store: str, version: int) -> dict[int, dict[str, Any]]:
    """Partition -> its commit record (``puts``, ``deletes``, ``position``, ...) as of
    ``version``, for the partitions that version lists."""
    record = version_record(root, store, version)
    return {p: chain.commit_record() for p, chain in record.partitions.items()}


def written_counts(root: Path | str, store: str) -> tuple[int, int | None]:
    """The latest version's ``rows_written`` and the puts its commit records count; None
    for the puts when a commit record holds no count (``write_store``'s:
    ``ChainJobSpec.stage`` records none)."""
    latest = latest_version(open_objects(root), store)
    assert latest is not None, f"store {store!r} has no version"
    records = commit_records(root, store, latest.version).values()
    puts = None if any("puts" not in r for r in records) else sum(r["puts"] for r in records)
    return latest.metadata["rows_written"], puts
