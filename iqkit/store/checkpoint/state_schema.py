"""What a checkpoint says about a stateful operator's stores: the operator's metadata
(id, name, stores, partitions) and each store's key and value schemas, read from the
files Spark writes beside the state (PySpark 4.1 to 4.3).

Why: state files hold bare UnsafeRows; only these files say which columns the rows have,
so nothing can be decoded without them.

Where they are, for the operator folder ``state/<operator id>``:

- ``_metadata/metadata``: ``"v1\\n"`` and one JSON object, ``{"operatorInfo":
  {"operatorId", "operatorName"}, "stateStoreInfo": [{"storeName", "numColsPrefixKey",
  "numPartitions"}]}``. Operators that evolve their schema (transformWithState) write
  ``_metadata/v2/<batch id>`` instead, one per batch that changed it: ``"v2\\n"`` and the
  same object, whose stores also name their schema files (``stateSchemaFilePaths``, a
  list, in 4.3; or one ``stateSchemaFilePath``) and which carries an
  ``operatorPropertiesJson`` text (the state variables of transformWithState).
- ``0/_metadata/schema`` (``0/<store name>/_metadata/schema`` for a store not named
  "default"): only partition 0 holds it. Java ``DataOutputStream`` data: ``writeUTF("v2")``,
  then for the key and then the value schema an int32 count of chunks and that many
  ``writeUTF`` chunks of the StructType's JSON (a chunk is at most 65535 characters).
  ``"v1"`` files hold the two JSON texts as one ``writeUTF`` each.
- ``_stateSchema/<store name>/<batch id>_<uuid>``: the ``"v3"`` files the v2 metadata
  points at, one entry per column family: ``writeUTF("v3")``, an int32 count, then per
  family ``writeUTF(name)``, key schema id (int16), key schema JSON (chunked as above),
  value schema id (int16), value schema JSON, key encoder spec JSON, and the user key
  schema JSON (``"{    }"`` when there is none).

``writeUTF`` is a 2-byte big-endian length and Java's modified UTF-8: NUL as C0 80, and a
character outside the Basic Multilingual Plane as its two UTF-16 surrogates, each encoded
on its own. Missing or damaged files raise ``StateFileError`` naming the file.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from ...errors import ObjectMissingError
from ..objects import ObjectStore
from .codecs import StateFileError, UnknownFormatError

__all__ = [
    "ColumnFamilySchema",
    "OperatorMetadata",
    "StoreInfo",
    "StoreSchema",
    "parse_operator_metadata",
    "parse_schema_file",
    "read_operator_metadata",
    "read_store_schema",
]

DEFAULT_STORE = "default"
_VERSION_LINE = re.compile(r"v(\d+)")
_V3_SCHEMA_NAME = re.compile(r"(\d+)_[0-9A-Za-z-]+")


@dataclass(frozen=True)
class StoreInfo:
    """One state store of an operator, as its metadata describes it."""

    name: str
    num_cols_prefix_key: int
    num_partitions: int
    #: Keys (relative to the checkpoint root) of the v3 schema files v2 metadata names,
    #: oldest first: one more each time the operator's schema evolved.
    schema_files: tuple[str, ...] = ()

    @property
    def schema_file(self) -> str | None:
        """The newest v3 schema file, or None (v1 metadata: no v3 file)."""
        return self.schema_files[-1] if self.schema_files else None


@dataclass(frozen=True)
class OperatorMetadata:
    """A stateful operator's metadata file (or what ``operators`` infers where Spark
    wrote none)."""

    operator_id: int
    operator_name: str
    stores: tuple[StoreInfo, ...]
    #: 1 or 2: which metadata format the file is in; 0: no file, inferred from the state.
    format_version: int
    #: The file read (inferred: the schema file or folder it was told from), as a user
    #: would write it (for messages).
    source: str
    #: v2's ``operatorPropertiesJson``, parsed (empty for v1).
    properties: dict[str, Any] = field(default_factory=dict)

    def store(self, name: str = DEFAULT_STORE) -> StoreInfo:
        """The store called ``name``; ``StateFileError`` when the operator has none."""
        for info in self.stores:
            if info.name == name:
                return info
        names = ", ".join(info.name for info in self.stores) or "none"
        raise StateFileError(f"{self.source}: no state store {name!r} (stores: {names})")


@dataclass(frozen=True)
class ColumnFamilySchema:
    """The key and value schemas (StructType JSON dicts) of one column family; v1 and v2
    schema files have exactly one, "default"."""

    name: str
    key_schema: dict[str, Any]
    value_schema: dict[str, Any]
    key_schema_id: int = 0
    value_schema_id: int = 0
    #: v3: how keys are encoded (``{"keyStateEncoderType": ..., ...}``), else None.
    key_encoder_spec: dict[str, Any] | None = None
    #: v3: the user key's schema where the family has one, else None.
    user_key_schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class StoreSchema:
    """A store's schemas: what its rows are and how its keys are encoded."""

    #: The schema file read, as a user would write it (for messages).
    source: str
    #: 1, 2 or 3: the schema file's format.
    format_version: int
    column_families: tuple[ColumnFamilySchema, ...]
    #: How many leading key columns form the prefix of prefix scans (0: none), from the
    #: operator's metadata, else from the default family's key encoder spec.
    num_cols_prefix_key: int = 0

    def family(self, name: str = DEFAULT_STORE) -> ColumnFamilySchema:
        """The column family ``name``; ``StateFileError`` when there is none."""
        for family in self.column_families:
            if family.name == name:
                return family
        names = ", ".join(f.name for f in self.column_families)
        raise StateFileError(f"{self.source}: no column family {name!r} (families: {names})")

    @property
    def key_schema(self) -> dict[str, Any]:
        """The default column family's key schema."""
        return self.family().key_schema

    @property
    def value_schema(self) -> dict[str, Any]:
        """The default column family's value schema."""
        return self.family().value_schema


# -- operator metadata ------------------------------------------------------------------
def read_operator_metadata(
    objects: ObjectStore, operator_dir: str, *, batch_id: int | None = None
) -> OperatorMetadata:
    """The metadata of the operator in ``operator_dir`` (``state/<operator id>``, relative
    to the checkpoint root): the newest ``_metadata/v2`` file at or before ``batch_id``
    (any batch when None) where there are such files, else ``_metadata/metadata``."""
    folder = operator_dir.strip("/")
    v2_dir = f"{folder}/_metadata/v2"
    batches = sorted(
        int(name)
        for key in objects.list(v2_dir)
        if (name := key.rpartition("/")[2]).isdigit() and key.rpartition("/")[0] == v2_dir
    )
    eligible = [b for b in batches if batch_id is None or b <= batch_id]
    key = f"{v2_dir}/{eligible[-1]}" if eligible else f"{folder}/_metadata/metadata"
    return parse_operator_metadata(_read(objects, key), objects.where(key), operator_dir=folder)


def parse_operator_metadata(data: bytes, source: str, *, operator_dir: str) -> OperatorMetadata:
    """An operator metadata file's bytes (``source`` names it in errors); ``operator_dir``
    is the operator's folder, to which v2's absolute schema paths are made relative."""
    try:
        version_line, _, body = data.decode("utf-8").partition("\n")
        version = _version(version_line, source, known=(1, 2))
        document = json.loads(body)
        operator = document["operatorInfo"]
        stores = tuple(
            StoreInfo(
                name=str(store["storeName"]),
                num_cols_prefix_key=int(store["numColsPrefixKey"]),
                num_partitions=int(store["numPartitions"]),
                schema_files=_relative_schema_files(store, operator_dir),
            )
            for store in document["stateStoreInfo"]
        )
        properties_text = document.get("operatorPropertiesJson")
        properties = json.loads(properties_text) if properties_text else {}
        return OperatorMetadata(
            operator_id=int(operator["operatorId"]),
            operator_name=str(operator["operatorName"]),
            stores=stores,
            format_version=version,
            source=source,
            properties=properties if isinstance(properties, dict) else {},
        )
    except StateFileError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateFileError(f"{source}: not an operator metadata file ({exc!r})") from None


def _relative_schema_files(store: dict[str, Any], operator_dir: str) -> tuple[str, ...]:
    """v2 metadata's absolute schema paths (``file:/…/state/0/_stateSchema/default/0_<uuid>``),
    as keys under ``operator_dir``: the checkpoint may have moved since they were written.
    PySpark 4.3 writes a list, ``stateSchemaFilePaths``; a single ``stateSchemaFilePath``
    is read too."""
    paths = store.get("stateSchemaFilePaths")
    if paths is None:
        single = store.get("stateSchemaFilePath")
        paths = [single] if single else []
    marker = "/_stateSchema/"
    keys = []
    for path in paths:
        if not isinstance(path, str) or marker not in path:
            raise ValueError(f"a schema path outside _stateSchema: {path!r}")
        keys.append(f"{operator_dir}/_stateSchema/{path.rsplit(marker, 1)[1]}")
    return tuple(keys)


# -- schema files -----------------------------------------------------------------------
def read_store_schema(
    objects: ObjectStore,
    operator_dir: str,
    store_name: str = DEFAULT_STORE,
    *,
    metadata: OperatorMetadata | None = None,
    batch_id: int | None = None,
) -> StoreSchema:
    """The schemas of store ``store_name`` of the operator in ``operator_dir``: the v3 file
    the operator's metadata names, else partition 0's ``_metadata/schema``, else the newest
    ``_stateSchema/<store>`` file at or before ``batch_id``. ``metadata`` is the operator's
    (read when not given; a checkpoint without it has no prefix key columns)."""
    folder = operator_dir.strip("/")
    if metadata is None and objects.list(f"{folder}/_metadata"):
        metadata = read_operator_metadata(objects, folder, batch_id=batch_id)
    info = metadata.store(store_name) if metadata is not None else None
    key = info.schema_file if info is not None else None
    if key is None:
        partition = f"{folder}/0" if store_name == DEFAULT_STORE else f"{folder}/0/{store_name}"
        key = f"{partition}/_metadata/schema"
        if not objects.exists(key):
            key = _newest_v3_file(objects, folder, store_name, batch_id) or key
    schema = parse_schema_file(_read(objects, key), objects.where(key))
    if info is not None:
        prefix = info.num_cols_prefix_key
    else:
        spec = schema.column_families[0].key_encoder_spec or {}
        prefix = int(spec.get("numColsPrefixKey", 0) or 0)
    return StoreSchema(schema.source, schema.format_version, schema.column_families, prefix)


def _newest_v3_file(
    objects: ObjectStore, operator_dir: str, store_name: str, batch_id: int | None
) -> str | None:
    folder = f"{operator_dir}/_stateSchema/{store_name}"
    found = []
    for key in objects.list(folder):
        match = _V3_SCHEMA_NAME.fullmatch(key.rpartition("/")[2])
        in_folder = match is not None and key.rpartition("/")[0] == folder
        if in_folder and (batch_id is None or int(match[1]) <= batch_id):
            found.append((int(match[1]), key))
    return max(found)[1] if found else None


def parse_schema_file(data: bytes, source: str) -> StoreSchema:
    """A schema file's bytes (v1, v2 or v3; ``source`` names it in errors)."""
    reader = _JavaDataReader(data)
    try:
        version = _version(reader.utf(), source, known=(1, 2, 3))
        if version == 3:
            families = tuple(_v3_family(reader) for _ in range(reader.int32()))
        else:
            if version == 1:
                key, value = reader.utf(), reader.utf()
            else:
                key, value = reader.chunked_utf(), reader.chunked_utf()
            families = (ColumnFamilySchema(DEFAULT_STORE, _struct(key), _struct(value)),)
        if reader.position != len(data):
            raise ValueError(f"{len(data) - reader.position} bytes after the schemas")
    except StateFileError:
        raise
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise StateFileError(f"{source}: not a state schema file ({exc})") from None
    return StoreSchema(source, version, families)


def _v3_family(reader: _JavaDataReader) -> ColumnFamilySchema:
    name = reader.utf()
    key_id = reader.int16()
    key = _struct(reader.chunked_utf())
    value_id = reader.int16()
    value = _struct(reader.chunked_utf())
    spec = json.loads(reader.chunked_utf())
    user_key_text = reader.chunked_utf()
    # No user key schema is written as "{    }", which is no StructType.
    user_key = json.loads(user_key_text) if user_key_text.strip() not in ("", "{}") else None
    if not (isinstance(user_key, dict) and user_key.get("type") == "struct"):
        user_key = None
    return ColumnFamilySchema(
        name, key, value, key_id, value_id, spec if isinstance(spec, dict) else None, user_key
    )


def _struct(text: str) -> dict[str, Any]:
    parsed = json.loads(text)
    if not isinstance(parsed, dict) or parsed.get("type") != "struct":
        raise ValueError(f"not a StructType: {text[:100]}")
    _check_fields(parsed)
    return parsed


def _check_fields(struct_type: dict[str, Any]) -> None:
    """``ValueError`` unless every field of ``struct_type`` (and of the structs nested in
    it) has a name and a type, as Spark writes them: a schema file carries no checksum,
    and a damaged member name would otherwise surface later as a ``KeyError``."""
    fields = struct_type.get("fields")
    if not isinstance(fields, list):
        raise ValueError("a StructType without a list of fields")
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
            raise ValueError(f"a field without a name or a type: {str(f)[:100]}")
        kind = f["type"]
        if not isinstance(kind, str | dict):
            raise ValueError(f"field {f['name']!r} has no type Spark writes")
        if isinstance(kind, dict) and kind.get("type") == "struct":
            _check_fields(kind)


def _version(line: str, source: str, known: tuple[int, ...]) -> int:
    match = _VERSION_LINE.fullmatch(line.strip())
    if not match:
        raise StateFileError(f"{source}: no format version line (found {line[:20]!r})")
    version = int(match[1])
    if version not in known:
        raise UnknownFormatError(
            f"{source}: format v{version} is not supported yet (known: "
            f"{', '.join(f'v{k}' for k in known)})"
        )
    return version


def _read(objects: ObjectStore, key: str) -> bytes:
    try:
        return objects.read_bytes(key)
    except ObjectMissingError:
        raise StateFileError(f"{objects.where(key)}: missing") from None


class _JavaDataReader:
    """Reads what Java's ``DataOutputStream`` wrote: big-endian ints, ``writeUTF`` texts."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def _take(self, size: int) -> bytes:
        end = self.position + size
        if end > len(self.data):
            raise ValueError(f"cut short at byte {len(self.data)}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int16(self) -> int:
        return int.from_bytes(self._take(2), "big", signed=True)

    def int32(self) -> int:
        return int.from_bytes(self._take(4), "big", signed=True)

    def utf(self) -> str:
        return _modified_utf8(self._take(int.from_bytes(self._take(2), "big")))

    def chunked_utf(self) -> str:
        count = self.int32()
        if count < 0:
            raise ValueError(f"a negative chunk count ({count})")
        # A chunk may end between the two halves of a surrogate pair: join, then pair.
        text = "".join(self.utf() for _ in range(count))
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def _modified_utf8(raw: bytes) -> str:
    """Java's modified UTF-8 as text (surrogates left unpaired: ``chunked_utf`` pairs
    them after joining; a single ``utf`` text is paired here too)."""
    text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
