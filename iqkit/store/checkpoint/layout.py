"""What a Structured Streaming checkpoint folder holds, as iqkit sees it: whether a root
is one, its committed batches, and its stateful operators' stores under stable names.

A checkpoint folder holds ``metadata`` (the query's id), ``offsets/<batch>`` (what each
batch read), ``commits/<batch>`` (present once the batch is done) and, for a stateful
query, ``state/<operator id>/`` with one folder per state partition. Each operator keeps
one store (``default``) or several (a stream-stream join's four); its
``_metadata/metadata`` names the operator and lists its stores with their partition
counts; Spark before 4.0 writes none, and ``operators`` tells the operator from its state.
An operator may be served as parts other than the stores it lists: a stream-stream join
as its two sides, ``left`` and ``right``, each read from the operator's internal stores
by ``joins``; a transformWithState operator as its state variables and its timers, each
read from the operator's one store by ``transform`` (its variables listed by
``variables``).

Versions: Spark's state version N is the state after batch N - 1, and only a committed
batch counts (``commits/<N - 1>`` exists). A batch still running has written no commit,
so a reader never serves its half-written state.

Store names (written in the README too):

* an operator's store is named after what the operator does: ``aggregate`` (a
  ``groupBy().agg()``, windowed or not), ``dedup`` (``dropDuplicates``), ``groups``
  (``applyInPandasWithState`` / ``flatMapGroupsWithState``), ``join`` (a stream-stream
  join), ``sessions`` (``groupBy(session_window(...))``), ``transform``
  (``transformWithState``); an operator iqkit does not know keeps
  Spark's own operator name;
* a transformWithState operator's stores are one per state variable and one of its
  timers, always named ``<operator>.<variable>`` (``transform.total``,
  ``transform.$timers``; ``transform-<operator id>.total`` beside other operators);
* a checkpoint with a single store names it just that (``aggregate``);
* a checkpoint with a single operator serving several stores names each
  ``<operator>.<store name>`` (``join.left``, ``join.right``);
* otherwise every name has ``-<operator id>`` after the operator's (``aggregate-0``,
  ``dedup-1``), and a store other than an operator's ``default`` adds ``.<store name>``
  (``join-2.left``).

The names depend only on the checkpoint's own operator metadata (or, without it, on its
state's schema files and folders), so they are the same in every process and every session
that opens it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ...errors import IqkitError, ObjectMissingError, StoreCorruptedError
from ..objects import ObjectStore, open_objects
from ..roots import StoreRoot
from .codecs import UnknownFormatError
from .operators import INFERRED, operator_metadata
from .state_schema import DEFAULT_STORE, OperatorMetadata, StoreInfo
from .variables import OPERATORS, StateVariable, not_supported, store_variables, variable_of

__all__ = [
    "OperatorStore",
    "batch_metadata",
    "committed_batches",
    "is_checkpoint",
    "operator_stores",
    "state_folder",
    "state_partitions",
]

#: What a checkpoint has at its top (a root holding these is read as one).
_MARKS = ("metadata",)
_FOLDERS = ("offsets", "commits")

#: iqkit's name for each stateful operator Spark records (``operatorName``).
_FRIENDLY = {
    "stateStoreSave": "aggregate",
    "dedupe": "dedup",
    "dedupeWithinWatermark": "dedup",
    "flatMapGroupsWithState": "groups",
    "applyInPandasWithState": "groups",
    "symmetricHashJoin": "join",
    "transformWithStateExec": "transform",
    "transformWithStateInPandasExec": "transform",
    "transformWithStateInPySparkExec": "transform",
    "sessionWindowStateStoreSaveExec": "sessions",
}

#: Operators served as parts other than the stores their metadata lists (module
#: docstring): a stream-stream join's two sides.
_PARTS = {"symmetricHashJoin": ("left", "right")}

_BATCH = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class OperatorStore:
    """One state store of one stateful operator, under the name iqkit serves it by:
    ``operator`` and ``info`` are what the operator's metadata says of them."""

    name: str
    operator: OperatorMetadata
    info: StoreInfo
    #: transformWithState: the state variable (or ``$timers``) the store serves.
    variable: str | None = None

    @property
    def operator_id(self) -> int:
        return self.operator.operator_id

    @property
    def operator_name(self) -> str:
        return self.operator.operator_name

    @property
    def store_name(self) -> str:
        return self.info.name

    @property
    def partitions(self) -> int:
        return self.info.num_partitions

    @property
    def folder(self) -> str:
        """The operator's state folder, relative to the checkpoint."""
        return f"state/{self.operator_id}"

    @property
    def known_operator(self) -> bool:
        """Whether iqkit knows the operator's name (a newer Spark's operator, or a damaged
        metadata file, names one it does not: Spark's metadata files carry no checksum)."""
        return self.operator_name in _FRIENDLY

    @property
    def not_supported(self) -> str | None:
        """Why iqkit does not serve this store yet (one line), or ``None``."""
        if not self.known_operator:
            names = "reads as" if self.operator.format_version == INFERRED else "names"
            return (
                f"not supported yet: {self.operator.source} {names} the operator "
                f"{self.operator_name!r}, which iqkit does not know (store {self.name!r})"
            )
        if self.operator_name in OPERATORS:
            return not_supported(self.operator, self.variable, self.name)
        return None

    @property
    def state_variable(self) -> StateVariable:
        """transformWithState: the state variable the store serves (``StateFileError``
        if the operator's metadata lists none)."""
        return variable_of(self.operator, self.variable)

    @property
    def note(self) -> str:
        """What a list of stores says of this one ("" for nothing): for an unknown
        operator, the file that names it (what a user asking for another store needs)."""
        if self.known_operator:
            return ""
        return f"an operator iqkit does not know, as {self.operator.source} names it"


def is_checkpoint_root(root: StoreRoot) -> bool:
    """Whether ``root`` is a checkpoint folder (``is_checkpoint``): what chooses its
    format (``store.formats``). A root that cannot be looked at (no credentials,
    unreachable) is not one: the chain format's own check then says why, in its one
    line."""
    local = root.local
    if local is not None and not os.path.isdir(local):
        return False
    try:
        return is_checkpoint(open_objects(root))
    except IqkitError:
        return False


def is_checkpoint(objects: ObjectStore) -> bool:
    """Whether the root is a Structured Streaming checkpoint: ``metadata`` and an
    ``offsets/`` or ``commits/`` folder at its top (an iqkit root has neither)."""
    if not all(objects.exists(mark) for mark in _MARKS):
        return False
    return any(objects.list(folder) for folder in _FOLDERS)


def committed_batches(objects: ObjectStore) -> list[int]:
    """The batch ids with a commit file, ascending (Hadoop's ``.crc`` files and
    temporary files beside them are not batches)."""
    batches = []
    for key in objects.list("commits"):
        name = key.rsplit("/", 1)[-1]
        if _BATCH.fullmatch(name):
            batches.append(int(name))
    return sorted(batches)


def state_folder(store: OperatorStore, partition: int) -> str:
    """Partition ``partition``'s folder of ``store``: the operator's folder for the
    ``default`` store, else a subfolder named after the store."""
    base = f"{store.folder}/{partition}"
    return base if store.store_name == DEFAULT_STORE else f"{base}/{store.store_name}"


def operator_stores(objects: ObjectStore) -> list[OperatorStore]:
    """Every store of every stateful operator, named by the rule of the module docstring,
    in operator order. An operator folder whose metadata is unreadable (or, without
    metadata, whose schema file is) is ``StateFileError`` naming the file (its stores
    cannot be named or sized)."""
    listing = objects.list("state")
    ids = sorted({int(part) for key in listing if _BATCH.fullmatch(part := key.split("/")[1])})
    found: list[tuple[OperatorMetadata, StoreInfo, str | None]] = []
    for op in ids:
        metadata = operator_metadata(objects, op, listing)
        found.extend((metadata, info, variable) for info, variable in _served(metadata))
    single = len(found) == 1
    one_operator = len(ids) == 1
    stores = []
    for metadata, info, variable in found:
        base = _FRIENDLY.get(metadata.operator_name, metadata.operator_name)
        name = base if one_operator else f"{base}-{metadata.operator_id}"
        if variable is not None:  # a transformWithState variable's: always named
            name = f"{name}.{variable}"
        elif not single and info.name != DEFAULT_STORE:
            name = f"{name}.{info.name}"
        stores.append(OperatorStore(name, metadata, info, variable))
    return stores


def _served(metadata: OperatorMetadata) -> list[tuple[StoreInfo, str | None]]:
    """The stores ``metadata``'s operator is served as, each (the store read, the state
    variable served from it): a join's parts (``_PARTS``), each with the partitions of
    the operator's first store; a transformWithState operator's state variables and
    timers (``variables.store_variables``), each from its one store; else the stores it
    lists."""
    parts = _PARTS.get(metadata.operator_name)
    if parts is not None and metadata.stores:
        first = metadata.stores[0]
        return [(StoreInfo(part, 0, first.num_partitions), None) for part in parts]
    if metadata.operator_name in OPERATORS and metadata.stores:
        variables = store_variables(metadata)
        if variables:
            return [(metadata.stores[0], v.name) for v in variables]
    return [(info, None) for info in metadata.stores]


#: The offsets log's header line; the batch's metadata (watermark, trigger time, the
#: SQL settings the query started with) is the JSON line after it.
_OFFSETS_HEADER = "v1"
_VERSION_LINE = re.compile(r"v[0-9]+")


def batch_metadata(objects: ObjectStore, batch: int) -> dict[str, Any]:
    """The metadata line of ``offsets/<batch>`` (``batchWatermarkMs``,
    ``batchTimestampMs``, ``conf``); ``StoreCorruptedError`` naming the file when it is
    not the offsets log's format."""
    key = f"offsets/{batch}"
    lines = objects.read_bytes(key).decode("utf-8", "replace").split("\n")
    header = lines[0].strip()
    if header != _OFFSETS_HEADER and _VERSION_LINE.fullmatch(header):
        # A later Spark's offsets log (its metadata line may mean something else there).
        raise UnknownFormatError(
            f"{objects.where(key)}: offsets log format {header} is not supported yet "
            f"(known: {_OFFSETS_HEADER})"
        )
    try:
        if header != _OFFSETS_HEADER:
            raise ValueError(f"header {lines[0][:20]!r}")
        metadata = json.loads(lines[1])
        if not isinstance(metadata, dict):
            raise ValueError("not an object")
    except (IndexError, ValueError) as exc:
        raise StoreCorruptedError(
            f"checkpoint file {key} is not an offsets log entry: {exc}"
        ) from None
    return metadata


#: The shuffle partition count a batch ran with, as its offsets log entry records it: the
#: number of state partitions of every stateful operator at that batch.
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def state_partitions(
    objects: ObjectStore,
    store: OperatorStore,
    version: int,
    *,
    metadata: dict[str, Any] | None = None,
) -> int:
    """How many partitions ``store`` has at state ``version`` (after batch ``version -
    1``): the shuffle partition count that batch's offsets log entry records. Quirk:
    Spark 4.2+'s offline repartitioning writes a batch of its own with the new count and
    leaves the operator metadata's ``numPartitions`` as it was, so the metadata is only
    the fallback (no entry for the batch, or no count in it). ``metadata``: the batch's
    metadata (``batch_metadata``), when read already."""
    if version < 1:
        return store.partitions
    try:
        conf = (metadata or batch_metadata(objects, version - 1)).get("conf")
    except ObjectMissingError:
        return store.partitions
    count = conf.get(_SHUFFLE_PARTITIONS) if isinstance(conf, dict) else None
    if count is None:
        return store.partitions
    if not str(count).isdigit() or int(count) < 1:
        raise StoreCorruptedError(
            f"checkpoint file offsets/{version - 1}: {_SHUFFLE_PARTITIONS} is {count!r}"
        )
    return int(count)
