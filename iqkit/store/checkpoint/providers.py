"""Which state store provider wrote a checkpoint's state, and its state read through it.

Spark records the provider a query started with in every batch's offsets log entry
(``spark.sql.streaming.stateStore.providerClass`` in its ``conf``), and a query keeps it
for life: it is chosen once per checkpoint here, and everything else asks
``StateReader`` for decoded rows, never which provider wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..objects import ObjectStore
from . import hdfs_files
from .layout import OperatorStore, batch_metadata, state_folder
from .shape import UnsupportedStateError
from .state_schema import read_store_schema
from .unsafe_row import RowDecoder

__all__ = [
    "HDFS_PROVIDER",
    "ROCKSDB_PROVIDER",
    "StateReader",
    "VersionFiles",
    "provider_of",
    "recorded_conf",
]

#: The providers Spark ships, by the class name the offsets log records.
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
_ROW_CHECKSUMS = "spark.sql.streaming.stateStore.rowChecksum.enabled"
_SHORT = {HDFS_PROVIDER: "hdfs", ROCKSDB_PROVIDER: "rocksdb"}


def recorded_conf(objects: ObjectStore) -> dict[str, str]:
    """The SQL settings the checkpoint's newest batch recorded (the ones a query keeps
    for life: provider, codec, row checksums); empty before the first batch."""
    batches = [int(k.rsplit("/", 1)[-1]) for k in objects.list("offsets")
               if k.rsplit("/", 1)[-1].isdigit()]  # fmt: skip
    if not batches:
        return {}
    conf = batch_metadata(objects, max(batches)).get("conf") or {}
    return {str(k): str(v) for k, v in conf.items()} if isinstance(conf, dict) else {}


def provider_of(conf: dict[str, str]) -> str:
    """The provider class ``conf`` names (Spark's default, the HDFS-backed one, when none
    is recorded: a checkpoint with no batch yet)."""
    return conf.get(_PROVIDER_SETTING) or HDFS_PROVIDER


@dataclass(frozen=True)
class VersionFiles:
    """The files one partition version is rebuilt from: its ``folder``, the provider's
    ``listing`` of it, and ``names``, which say exactly which files (and whose query):
    what the version's database in the cache is named after."""

    folder: str
    listing: Any
    names: str


class StateReader:
    """A checkpoint's state, decoded: one per checkpoint (module docstring)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        conf = recorded_conf(objects)
        self.provider = provider_of(conf)
        #: Whether Spark put a CRC32-C before each value (and each removed key).
        self.row_checksums = conf.get(_ROW_CHECKSUMS, "false").strip().lower() == "true"
        self.provider_name = _SHORT.get(self.provider, self.provider.rsplit(".", 1)[-1])
        if self.provider != HDFS_PROVIDER:
            raise UnsupportedStateError(
                f"not supported yet: state written by {self.provider_name} "
                f"({self.provider.rsplit('.', 1)[-1]})"
            )
        self._decoders: dict[str, tuple[RowDecoder, RowDecoder]] = {}
        self._query_id: str | None = None

    def schemas(self, store: OperatorStore) -> tuple[dict[str, Any], dict[str, Any]]:
        """``store``'s key and value schemas (Spark's JSON ``StructType`` dicts)."""
        schema = read_store_schema(self.objects, store.folder, store.store_name)
        return dict(schema.key_schema), dict(schema.value_schema)

    def _decoders_of(self, store: OperatorStore) -> tuple[RowDecoder, RowDecoder]:
        pair = self._decoders.get(store.name)
        if pair is None:
            key_schema, value_schema = self.schemas(store)
            pair = self._decoders[store.name] = (RowDecoder(key_schema), RowDecoder(value_schema))
        return pair

    def version_files(self, store: OperatorStore, partition: int, version: int) -> VersionFiles:
        """The state files partition ``partition`` of ``store`` is rebuilt from at
        ``version`` (one listing; ``StateFileError`` naming a file the version needs
        that is missing)."""
        folder = state_folder(store, partition)
        listing = hdfs_files.list_files(self.objects, folder)
        base, deltas = listing.replay_plan(version)
        names = [listing.key(base, "snapshot")] if base else []
        names += [listing.key(d, "delta") for d in deltas]
        return VersionFiles(folder, listing, f"{self.query_id}\n" + "\n".join(names))

    @property
    def query_id(self) -> str:
        """The streaming query's id (``metadata``): a checkpoint started again under the
        same path is another query, whose files must never be taken for the old one's."""
        if self._query_id is None:
            try:
                text = json.loads(self.objects.read_bytes("metadata")).get("id", "")
            except (ValueError, AttributeError):
                text = ""
            self._query_id = str(text)
        return self._query_id

    def state_rows(
        self, store: OperatorStore, version: int, files: VersionFiles
    ) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """The live ``(key row, value row)`` pairs ``files`` rebuild at ``version``,
        decoded; ``StateFileError`` naming the file when one is missing or damaged."""
        keys, values = self._decoders_of(store)
        state = hdfs_files.load_state(
            self.objects,
            files.folder,
            version,
            files=files.listing,
            row_checksums=self.row_checksums,
        )
        decode_key, decode_value = keys.decode, values.decode
        return ((decode_key(k), decode_value(v)) for k, v in state.items())

    def oldest_version(self, store: OperatorStore) -> int | None:
        """The oldest version Spark can still rebuild (partition 0's files say: its oldest
        snapshot, or version 1 while every delta from the first is kept; ``None``: no
        state files yet)."""
        files = hdfs_files.list_files(self.objects, state_folder(store, 0))
        if not files.deltas and not files.snapshots:
            return None
        if 1 in files.deltas:
            return 1
        return min(files.snapshots, default=min(files.deltas))

    def where(self, store: OperatorStore, partition: int, version: int) -> str:
        return f"{state_folder(store, partition)} version {version}"

    def trace_line(self, store: OperatorStore, partition: int, version: int, built: bool) -> str:
        """What opening the partition version cost, for the execution trace."""
        what = f"Spark state ({self.provider_name} provider) {state_folder(store, partition)}"
        if built:
            return f"{what} replayed to version {version} and decoded; database built in the cache"
        return f"{what} version {version}: database reused from the cache (nothing read)"

    def first_key_rows(self, store: OperatorStore, version: int) -> Iterator[tuple[Any, ...]]:
        """Decoded key rows of ``version``, partition after partition (a window store's
        window size is read off its first window)."""
        for p in range(store.partitions):
            files = self.version_files(store, p, version)
            for key_row, _ in self.state_rows(store, version, files):
                yield key_row
