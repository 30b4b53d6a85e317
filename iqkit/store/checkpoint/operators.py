"""Which stateful operator an operator folder of a checkpoint holds, and its stores: read
from the operator's metadata where Spark wrote it, and inferred from the state itself
where it did not.

Why: Spark before 4.0 (3.5 included) writes no ``state/<operator id>/_metadata/``, yet
its checkpoints are read by Spark 4.3's own state reader, which needs no operator name
for them: it takes the key and value schemas from partition 0's
``_metadata/schema`` and the partitions from the numbered folders under the operator's
folder (they must be ``0`` to ``n - 1``), with no prefix key columns. iqkit must also
*name* the store (``layout``), so the operator is told from what the state says:

* the stores: partition 0 holds ``_metadata/schema`` for the ``default`` store, and
  ``<store>/_metadata/schema`` for each named one. The four stores
  ``left|right-keyToNumValues``, ``left|right-keyWithIndexToValue`` are a stream-stream
  join (``symmetricHashJoin``);
* otherwise the ``default`` store's schema, which each operator writes in a fixed shape:
  a value of one ``__dummy__`` column of the null type is ``dropDuplicates``
  (``dedupe``); of one ``expiresAtMicros`` long, ``dropDuplicatesWithinWatermark``
  (``dedupeWithinWatermark``); a value whose first column is ``groupState`` is
  ``flatMapGroupsWithState`` (``applyInPandasWithState`` keeps the same layout and
  cannot be told from it: both are named ``flatMapGroupsWithState``); a key ending in
  ``sessionStartTime`` is a session window (``sessionWindowStateStoreSaveExec``, every
  key column but that one a prefix column, as 4.x's metadata records); a key of one
  null-typed ``key`` column with a value of one long ``value`` is a streaming limit
  (``globalLimit``); anything else is a streaming aggregation (``stateStoreSave``:
  its value is the aggregation buffer, whatever the functions).

Spark 3.5's stateful operators are exactly these, so every 3.5 checkpoint is named; an
operator added later writes metadata. Other helpers plug an operator in here: one rule
in ``_infer_name`` (and its friendly name in ``layout``).
"""

from __future__ import annotations

import re

from ..objects import ObjectStore
from .codecs import StateFileError
from .state_schema import (
    DEFAULT_STORE,
    OperatorMetadata,
    StoreInfo,
    parse_schema_file,
    read_operator_metadata,
)
from .state_schema import _read as _read_file

__all__ = ["INFERRED", "operator_metadata"]

#: ``OperatorMetadata.format_version`` of metadata inferred from the state (no file).
INFERRED = 0

_NUMBER = re.compile(r"[0-9]+")
_SCHEMA = "_metadata/schema"
_JOIN_STORES = frozenset(
    f"{side}-{kind}"
    for side in ("left", "right")
    for kind in ("keyToNumValues", "keyWithIndexToValue")
)
#: Spark's JSON names for ``NullType``: "void" (as every frozen line writes it) or "null".
_NULL_TYPES = frozenset({"void", "null"})


def operator_metadata(
    objects: ObjectStore, operator_id: int, state_keys: list[str]
) -> OperatorMetadata:
    """The operator in ``state/<operator_id>``: its metadata file's, or, when the folder
    has no ``_metadata/`` at all (Spark before 4.0), inferred from its state (module
    docstring). ``state_keys`` is the listing of ``state/`` (every depth), so the
    checkpoint is listed once. ``StateFileError`` naming the file that is missing or
    damaged."""
    folder = f"state/{operator_id}"
    if any(key.startswith(f"{folder}/_metadata/") for key in state_keys):
        return read_operator_metadata(objects, folder)
    return _infer(objects, operator_id, state_keys)


def _infer(objects: ObjectStore, operator_id: int, state_keys: list[str]) -> OperatorMetadata:
    folder = f"state/{operator_id}"
    partitions = sorted(
        {
            int(parts[2])
            for key in state_keys
            if len(parts := key.split("/")) > 3 and parts[1] == str(operator_id)
            and _NUMBER.fullmatch(parts[2])
        }
    )  # fmt: skip
    if partitions != list(range(len(partitions))):
        shown = ", ".join(map(str, partitions)) or "none"
        raise StateFileError(
            f"{objects.where(folder)}: no operator metadata, and its partition folders "
            f"({shown}) are not 0 to n - 1"
        )
    # Partition 0's schema files name the stores: ``0/_metadata/schema`` is ``default``.
    first = f"{folder}/0/"
    names = sorted(
        DEFAULT_STORE if rest == _SCHEMA else rest[: -len(_SCHEMA) - 1]
        for key in state_keys
        if key.startswith(first)
        and (rest := key[len(first) :]).endswith(_SCHEMA)
        and rest.count("/") <= 2
    )  # fmt: skip
    default_schema = f"{first}{_SCHEMA}"
    if not names:
        raise StateFileError(f"{objects.where(default_schema)}: missing")
    if set(names) == _JOIN_STORES:
        name, prefix, source = "symmetricHashJoin", 0, objects.where(f"{first}{names[0]}/{_SCHEMA}")
    elif names == [DEFAULT_STORE]:
        source = objects.where(default_schema)
        schema = parse_schema_file(_read_file(objects, default_schema), source)
        name, prefix = _infer_name(schema.key_schema, schema.value_schema)
    else:
        name, prefix, source = "unknown", 0, objects.where(first)
    stores = tuple(StoreInfo(store, prefix, len(partitions)) for store in names)
    return OperatorMetadata(operator_id, name, stores, INFERRED, source)


def _fields(schema: dict) -> list[tuple[str, object]]:
    return [(f.get("name"), f.get("type")) for f in schema.get("fields", [])]


def _infer_name(key_schema: dict, value_schema: dict) -> tuple[str, int]:
    """The operator whose ``default`` store has these schemas, and its number of prefix
    key columns (module docstring)."""
    key, value = _fields(key_schema), _fields(value_schema)
    if len(value) == 1 and value[0][0] == "__dummy__" and value[0][1] in _NULL_TYPES:
        return "dedupe", 0
    if value == [("expiresAtMicros", "long")]:
        return "dedupeWithinWatermark", 0
    if value and value[0][0] == "groupState":
        return "flatMapGroupsWithState", 0
    if len(key) > 1 and key[-1][0] == "sessionStartTime":
        return "sessionWindowStateStoreSaveExec", len(key) - 1
    if (
        len(key) == 1
        and key[0][0] == "key"
        and key[0][1] in _NULL_TYPES
        and value == [("value", "long")]
    ):
        return "globalLimit", 0
    return "stateStoreSave", 0
