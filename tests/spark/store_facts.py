"""What the Spark tests read from a store's version records, in either on-disk format.

``helpers.written_counts`` reads the folder format's layout; these go through the store's
format (``store.formats.store_format``) so a test runs over folder and chain stores alike:
the version records (``PublishedVersion``: metadata, partitions) and each partition's
commit record (puts, deletes, position), as the writer left them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iqkit.store.formats import StoreFormat, store_format
from iqkit.store.versions import PublishedVersion


def is_chain(root: Path | str, store: str) -> bool:
    return store_format(root, store) is StoreFormat.CHAIN


def version_record(root: Path | str, store: str, version: int) -> PublishedVersion[Any]:
    """Version ``version``'s record of ``store``, in the store's format."""
    if is_chain(root, store):
        from iqkit.store.chain import read_version
        from iqkit.store.objects import open_objects

        return read_version(open_objects(root), store, version)
    from iqkit.store.layout import StoreLayout
    from iqkit.store.versions import read_version as read_folder_version

    return read_folder_version(StoreLayout.of(root, store), version)


def version_record_path(root: Path | str, store: str, version: int) -> Path:
    """The file holding version ``version``'s record (the same JSON layout in both
    formats: ``PublishedVersion.to_json``)."""
    if is_chain(root, store):
        from iqkit.store.chain import record_key

        return Path(root) / record_key(store, version)
    from iqkit.store.layout import StoreLayout

    return StoreLayout.of(root, store).version_record(version)


def commit_records(root: Path | str, store: str, version: int) -> dict[int, dict[str, Any]]:
    """Partition -> its commit record (``puts``, ``deletes``, ``position``, ...) as of
    ``version``, for the partitions that version lists."""
    record = version_record(root, store, version)
    if is_chain(root, store):
        return {p: chain.commit_record() for p, chain in record.partitions.items()}
    from iqkit.store.layout import StoreLayout
    from iqkit.store.partition import RocksDBPartition

    layout = StoreLayout.of(root, store)
    out = {}
    for p, folder in record.partitions.items():
        partition = RocksDBPartition(layout.partition_version_dir(p, folder), folder)
        try:
            out[p] = partition.commit_record()
        finally:
            partition.close()
    return out


def written_counts(root: Path | str, store: str) -> tuple[int, int | None]:
    """The latest version's ``rows_written`` and the puts its commit records count
    (``helpers.written_counts`` for either format); None for the puts when a commit
    record holds no count (``write_store``'s on a chain store: ``ChainJobSpec.stage``
    records none)."""
    from iqkit.store.jobs import latest_published

    latest = latest_published(root, store)
    assert latest is not None, f"store {store!r} has no version"
    records = commit_records(root, store, latest.version).values()
    puts = None if any("puts" not in r for r in records) else sum(r["puts"] for r in records)
    return latest.metadata["rows_written"], puts
