"""Which state store provider wrote a checkpoint's state, and its state read through it.

Spark records the provider a query started with in every batch's offsets log entry
(``spark.sql.streaming.stateStore.providerClass`` in its ``conf``), and a query keeps it
for life: it is chosen once per checkpoint here, and everything else asks
``StateReader`` for decoded rows, never which provider wrote them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import IqkitError, StoreCorruptedError
from ..objects import ObjectStore
from . import hdfs_files, rocksdb_files, transform
from .layout import OperatorStore, batch_metadata, state_folder, state_partitions
from .sessions import SESSION_OPERATOR, session_schema, session_shape
from .shape import StateShape, UnsupportedStateError
from .state_records import StateRecords, StateRows
from .state_schema import StoreSchema, read_store_schema
from .unsafe_row import RowDecoder, UnsupportedStateTypeError

__all__ = [
    "HDFS_PROVIDER",
    "ROCKSDB_PROVIDER",
    "StateReader",
    "VersionFiles",
    "newest_offsets_batch",
    "provider_of",
    "recorded_conf",
]

#: The providers Spark ships, by the class name the offsets log records.
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
_ROW_CHECKSUMS = "spark.sql.streaming.stateStore.rowChecksum.enabled"
_SHORT = {HDFS_PROVIDER: "hdfs", ROCKSDB_PROVIDER: "rocksdb"}


def newest_offsets_batch(objects: ObjectStore) -> int | None:
    """The newest batch with an offsets log file; ``None`` before the first batch."""
    batches = [int(k.rsplit("/", 1)[-1]) for k in objects.list("offsets")
               if k.rsplit("/", 1)[-1].isdigit()]  # fmt: skip
    return max(batches) if batches else None


def recorded_conf(objects: ObjectStore) -> dict[str, str]:
    """The SQL settings the checkpoint's newest batch recorded (the ones a query keeps
    for life: provider, codec, row checksums); empty before the first batch."""
    batch = newest_offsets_batch(objects)
    if batch is None:
        return {}
    conf = batch_metadata(objects, batch).get("conf") or {}
    conf = {str(k): str(v) for k, v in conf.items()} if isinstance(conf, dict) else {}
    if conf and _PROVIDER_SETTING not in conf:
        # Every Spark iqkit reads (3.5 on) records the provider with the other settings:
        # a conf without it is a damaged entry (a flipped bit in the key's name), and a
        # guess of the default provider would fail later naming a state file instead.
        raise StoreCorruptedError(
            f"checkpoint file offsets/{batch} records no state store provider "
            f"({_PROVIDER_SETTING}) among its settings: the file is damaged"
        )
    return conf


def provider_of(conf: dict[str, str]) -> str:
    """The provider class ``conf`` names (Spark's default, the HDFS-backed one, when none
    is recorded: a checkpoint with no batch yet)."""
    return conf.get(_PROVIDER_SETTING) or HDFS_PROVIDER


@dataclass(frozen=True)
class VersionFiles:
    """The files one partition version is rebuilt from: its ``folder``, the provider's
    ``plan`` for them, and ``names``, which say exactly which files (and whose query):
    what the version's database in the cache is named after."""

    folder: str
    plan: Any
    names: str
    #: How the keys are laid out in the files (the RocksDB provider's prefix-scan keys).
    key_form: rocksdb_files.KeyForm = rocksdb_files.PLAIN_KEYS

    @property
    def keys(self) -> list[str]:
        """The keys of the files, in replay order (``names`` without the query id)."""
        return self.names.split("\n")[1:]


class _HdfsBackedFiles:
    """The default provider's files (``hdfs_files``): ``<v>.snapshot`` and ``<v>.delta``."""

    name = "hdfs"
    #: Keys with prefix columns are stored as one UnsafeRow, as any other.
    splits_prefix_keys = False

    def plan(self, objects: ObjectStore, folder: str, version: int) -> tuple[Any, list[str]]:
        listing = hdfs_files.list_files(objects, folder)
        base, deltas = listing.replay_plan(version)
        keys = [listing.key(base, "snapshot")] if base else []
        return listing, keys + [listing.key(d, "delta") for d in deltas]

    def load(
        self, objects: ObjectStore, files: VersionFiles, version: int, *,
        row_checksums: bool, work_dir: str | os.PathLike[str],
    ) -> dict[bytes, bytes]:  # fmt: skip
        return hdfs_files.load_state(
            objects, files.folder, version, files=files.plan, row_checksums=row_checksums
        )

    def load_records(
        self, objects: ObjectStore, files: VersionFiles, version: int, *,
        row_checksums: bool, work_dir: str | os.PathLike[str],
    ) -> StateRecords:  # fmt: skip
        # Replayed straight into columns: a dict of a million keys and values costs more
        # than decoding them does.
        return hdfs_files.load_records(
            objects, files.folder, version, files=files.plan, row_checksums=row_checksums
        )

    def change_records(
        self, objects: ObjectStore, files: VersionFiles, since: int, *, row_checksums: bool
    ) -> StateRecords | None:
        """The records of ``files``' files after its first ``since`` (all deltas: what the
        batches after an older version changed); ``None`` when they are not all deltas."""
        added = files.keys[since:]
        versions = [hdfs_files.delta_version(key) for key in added]
        if not added or None in versions:
            return None
        return hdfs_files.delta_records(
            objects,
            files.plan,
            versions,
            row_checksums=row_checksums,  # type: ignore[arg-type]
        )

    def oldest(self, objects: ObjectStore, folder: str) -> int | None:
        files = hdfs_files.list_files(objects, folder)
        if not files.deltas and not files.snapshots:
            return None
        if 1 in files.deltas:
            return 1
        return min(files.snapshots, default=min(files.deltas))


class _RocksDBFiles:
    """``RocksDBStateStoreProvider``'s files (``rocksdb_files``): ``<v>.zip`` snapshots
    over shared SSTs, and ``<v>.changelog`` with changelog checkpointing."""

    name = "rocksdb"
    #: Keys with prefix columns are stored as two rows (the prefix, then the rest).
    splits_prefix_keys = True

    def plan(self, objects: ObjectStore, folder: str, version: int) -> tuple[Any, list[str]]:
        plan = rocksdb_files.plan_replay(objects, folder, version)
        return plan, plan.keys()

    def load(
        self, objects: ObjectStore, files: VersionFiles, version: int, *,
        row_checksums: bool, work_dir: str | os.PathLike[str],
    ) -> dict[bytes, bytes]:  # fmt: skip
        return rocksdb_files.load_state(
            objects, files.folder, version, plan=files.plan, work_dir=work_dir,
            row_checksums=row_checksums, key_form=files.key_form,
        )  # fmt: skip

    def load_records(
        self, objects: ObjectStore, files: VersionFiles, version: int, *,
        row_checksums: bool, work_dir: str | os.PathLike[str],
    ) -> StateRecords:  # fmt: skip
        # Changelogs framed straight into columns, as delta files are (row checksums and
        # prefix-scan keys go through the dict replay).
        if not row_checksums:
            records = rocksdb_files.load_records(
                objects, files.folder, version, plan=files.plan, work_dir=work_dir,
                key_form=files.key_form,
            )  # fmt: skip
            if records is not None:
                return records
        state = self.load(objects, files, version, row_checksums=row_checksums, work_dir=work_dir)
        return StateRecords.of_mapping(state)

    def change_records(
        self, objects: ObjectStore, files: VersionFiles, since: int, *, row_checksums: bool
    ) -> StateRecords | None:
        """The records of ``files``' files after its first ``since`` (all changelogs:
        what the batches after an older version changed); ``None`` when they are not all
        changelogs (without changelog checkpointing every version is a snapshot)."""
        added = files.keys[since:]
        if not added or not all(key.endswith(".changelog") for key in added):
            return None
        changes = rocksdb_files.changelog_changes(
            objects, files.plan, added, row_checksums=row_checksums, key_form=files.key_form
        )
        return StateRecords.of_changes(changes)

    def oldest(self, objects: ObjectStore, folder: str) -> int | None:
        return rocksdb_files.oldest_version(objects, folder)


_PROVIDERS: dict[str, _HdfsBackedFiles | _RocksDBFiles] = {
    HDFS_PROVIDER: _HdfsBackedFiles(),
    ROCKSDB_PROVIDER: _RocksDBFiles(),
}


class StateReader:
    """A checkpoint's state, decoded: one per checkpoint (module docstring)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        conf = recorded_conf(objects)
        self.provider = provider_of(conf)
        #: The SQL settings the checkpoint's newest batch recorded.
        self.conf = conf
        #: Whether Spark put a CRC32-C before each value (and each removed key).
        self.row_checksums = conf.get(_ROW_CHECKSUMS, "false").strip().lower() == "true"
        files = _PROVIDERS.get(self.provider)
        if files is None:
            # A newer provider, or a damaged offsets file (Spark's logs carry no
            # checksum): the message names the file that says so.
            batch = newest_offsets_batch(objects)
            named = f" ({objects.where(f'offsets/{batch}')} names it)" if batch is not None else ""
            raise UnsupportedStateError(
                f"not supported yet: state written by {self.provider.rsplit('.', 1)[-1]}{named}"
            )
        self._files = files
        self.provider_name = files.name
        self._decoders: dict[str, tuple[RowDecoder, RowDecoder]] = {}
        self._schemas: dict[str, StoreSchema] = {}
        self._query_id: str | None = None

    def _schema(self, store: OperatorStore) -> StoreSchema:
        schema = self._schemas.get(store.name)
        if schema is None:
            schema = read_store_schema(
                self.objects, store.folder, store.store_name, metadata=store.operator
            )
            if store.operator_name == SESSION_OPERATOR:
                schema = session_schema(store, schema)
            if len(schema.column_families) > 1 or store.variable is not None:
                # A store in several column families (transformWithState, join state
                # format 3) is decoded family by family, by ``transform`` or ``joins``:
                # it may have no default family to make decoders of. A transformWithState
                # of one variable and no timers has one family, named after the variable,
                # and no ``default`` either.
                self._schemas[store.name] = schema
                return schema
            try:
                keys = RowDecoder(dict(schema.key_schema))
                if self._splits_keys(schema):
                    prefix = schema.num_cols_prefix_key
                    keys = rocksdb_files.PrefixKeyDecoder(dict(schema.key_schema), prefix)
                decoders = (keys, RowDecoder(dict(schema.value_schema)))
            except UnsupportedStateTypeError as exc:
                # A newer type, or a damaged schema file (Spark's carry no checksum): the
                # message names the file.
                raise UnsupportedStateTypeError(f"{exc} (in {schema.source})") from None
            self._decoders[store.name] = decoders
            self._schemas[store.name] = schema
        return schema

    def schemas(self, store: OperatorStore) -> tuple[dict[str, Any], dict[str, Any]]:
        """``store``'s key and value schemas (Spark's JSON ``StructType`` dicts)."""
        if store.variable is not None:
            shape = self.shape(store)
            return dict(shape.key_schema), dict(shape.value_schema)
        schema = self._schema(store)
        return dict(schema.key_schema), dict(schema.value_schema)

    def shape(self, store: OperatorStore) -> StateShape:
        """``store``'s shape: its rows as iqkit serves them, chosen here once for every
        operator this reader reads (a join side has a reader of its own:
        ``joins.open_store``): a transformWithState variable's (``transform``), a session
        window's (``sessions``), else any store's (``shape``)."""
        schema = self._schema(store)
        if store.variable is not None:
            return transform.shape_of(schema, store.state_variable)
        return session_shape(store, dict(schema.key_schema), dict(schema.value_schema))

    def _decoders_of(self, store: OperatorStore) -> tuple[RowDecoder, RowDecoder]:
        self._schema(store)  # reads the schema and makes its decoders, once
        return self._decoders[store.name]

    def version_files(self, store: OperatorStore, partition: int, version: int) -> VersionFiles:
        """The state files partition ``partition`` of ``store`` is rebuilt from at
        ``version`` (``StateFileError`` naming a file the version needs that is
        missing)."""
        folder = state_folder(store, partition)
        plan, keys = self._files.plan(self.objects, folder, version)
        names = f"{self.query_id}\n" + "\n".join(keys)
        form = rocksdb_files.KeyForm(prefix_scan=self._prefix_keys(store))
        return VersionFiles(folder, plan, names, key_form=form)

    def _prefix_keys(self, store: OperatorStore) -> bool:
        """Whether ``store``'s keys are in the files as the two rows of a prefix-scan key."""
        return self._splits_keys(self._schema(store))

    def _splits_keys(self, schema: StoreSchema) -> bool:
        """Whether keys of ``schema`` are in this provider's files as two rows."""
        return bool(schema.num_cols_prefix_key) and self._files.splits_prefix_keys

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

    def raw_state(
        self, version: int, files: VersionFiles, work_dir: str | os.PathLike[str]
    ) -> dict[bytes, bytes]:
        """The live keys of ``files`` at ``version``: key UnsafeRow bytes → value UnsafeRow
        bytes. ``work_dir`` is a private scratch folder the provider may use (a RocksDB
        snapshot is restored there while it is read). ``StateFileError`` naming the file
        when one is missing or damaged."""
        return self._files.load(
            self.objects, files, version, row_checksums=self.row_checksums, work_dir=work_dir
        )

    def state_rows(
        self,
        store: OperatorStore,
        version: int,
        files: VersionFiles,
        work_dir: str | os.PathLike[str],
    ) -> StateRows:
        """The live ``(key row, value row)`` pairs ``files`` rebuild at ``version``
        (``raw_state``), decoded as they are iterated, or in bulk (``StateRows``); a
        transformWithState variable's, decoded (``transform.state_rows``)."""
        if store.variable is not None:
            if not isinstance(self._files, _RocksDBFiles):
                raise UnsupportedStateError(
                    f"not supported yet: transformWithState state of the {self.provider_name} "
                    f"provider ({store.name})"
                )
            return transform.state_rows(  # type: ignore[return-value]
                self.objects, files.folder, version, files.plan, work_dir,
                schema=self._schema(store), variable=store.state_variable,
                conf=self.conf, row_checksums=self.row_checksums,
            )  # fmt: skip
        keys, values = self._decoders_of(store)
        records = self._files.load_records(
            self.objects, files, version, row_checksums=self.row_checksums, work_dir=work_dir
        )
        return StateRows(records, keys, values)

    def oldest_version(self, store: OperatorStore, partition: int = 0) -> int | None:
        """The oldest version Spark can still rebuild (``partition``'s files say, one
        listing; ``None``: no state files yet)."""
        return self._files.oldest(self.objects, state_folder(store, partition))

    def where(self, store: OperatorStore, partition: int, version: int) -> str:
        return f"{state_folder(store, partition)} version {version}"

    def changed_state(
        self, store: OperatorStore, files: VersionFiles, since: int
    ) -> tuple[StateRows, list[tuple[Any, ...]]] | None:
        """What the files of ``files`` after its first ``since`` changed: the keys whose
        last record there is a put, with that value (``StateRows``: decoded in bulk where
        the shape allows), and the key rows of the keys they removed. ``None`` when the
        provider cannot replay those files alone (or the store is a transformWithState
        variable's: a key's list or timers gather several records)."""
        if store.variable is not None:
            return None
        records = self._files.change_records(
            self.objects, files, since, row_checksums=self.row_checksums
        )
        if records is None:
            return None
        keys, values = self._decoders_of(store)
        removed: list[tuple[Any, ...]] = []
        if records.removed is not None:
            last: dict[bytes, bool] = {}
            for (key, _), removal in zip(records.items(), records.removed.tolist(), strict=True):
                last[key] = removal
            removed = [keys.decode(k) for k, removal in last.items() if removal]
        return StateRows(records, keys, values), removed

    def trace_line(
        self,
        store: OperatorStore,
        partition: int,
        version: int,
        built: bool,
        base: int | None = None,
    ) -> str:
        """What opening the partition version cost, for the execution trace (``base``:
        the older version whose database it was built on)."""
        what = f"Spark state ({self.provider_name} provider) {state_folder(store, partition)}"
        if built and base is not None:
            return (
                f"{what} version {version}: the files since version {base} replayed on its "
                "database in the cache; database built in the cache"
            )
        if built:
            return f"{what} replayed to version {version} and decoded; database built in the cache"
        return f"{what} version {version}: database reused from the cache (nothing read)"

    def first_key_rows(
        self, store: OperatorStore, version: int, work_dir: str | os.PathLike[str]
    ) -> Iterator[tuple[Any, ...]]:
        """Decoded key rows of ``version``, partition after partition (a window store's
        window size is read off its first window). A partition whose files cannot be
        read is passed over (its own queries fail, naming the file): a damaged partition
        must not fail the whole store; when none can be read, the first one's error."""
        first_error: IqkitError | None = None
        for p in range(state_partitions(self.objects, store, version)):
            try:
                files = self.version_files(store, p, version)
                for key_row, _ in self.state_rows(store, version, files, work_dir):
                    yield key_row
            except IqkitError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
