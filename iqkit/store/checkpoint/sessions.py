"""Session windows' state (``groupBy(session_window(...), ...)``: Spark's operator
``sessionWindowStateStoreSaveExec``) as an iqkit store: the one home of its layout facts.

What Spark keeps (state format 1, the only one, Spark 3.5 to 4.3): one row per (group
key, session). The key row is the group key's columns, then ``sessionStartTime``
(timestamp); the value row is the aggregated row as the query outputs it: the group key's
columns again, ``session_window`` (``struct<start, end>``) and the aggregation buffers.
The operator opens its store for prefix scans over the group key (a key's sessions are
read together, in session-start order, to merge a batch's rows into them), so its
metadata records the group key's columns as the store's prefix columns
(``numColsPrefixKey``). The RocksDB provider then stores each key as two rows, the group
key and the session start (``rocksdb_files``); the default provider as one row, like any
other key. Spark 3.5 writes no operator metadata: the group key is then every key column
but the last, the session start, which is what any Spark's session store holds.

What iqkit serves (store ``sessions``; ``sessions-<operator id>`` beside other stores): a
key-value store keyed by the group key (one column a plain value, several a tuple, as for
an aggregation) whose value is the list of the key's sessions, each a dict of the value
row's columns (timestamps as ISO-8601 text, as every checkpoint value), ordered by session
start. That is what a user asks of a session window ("which sessions does u01 have open,
and what have they gathered so far"), one lookup, and what Spark's own reader shows once
its rows are grouped by the group key. Spark shuffles a session aggregation's rows by the
group key alone (the sessions are merged after the shuffle), so a key lookup goes to the
partition ``pmod(hash(group key columns), n)`` names.

A stored value gathers several of Spark's rows, so a version is always rebuilt in full
(``replays_changes``), never as an older version's database plus the rows a batch
changed: one session changed rewrites its key's whole list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any, ClassVar

from ..encoding import keyspace
from ..encoding.serdes import JsonSerde, get_serde
from ..manifest import StoreManifest
from .layout import OperatorStore
from .shape import StateShape, UnsupportedStateError
from .state_schema import StoreSchema

__all__ = ["SESSION_OPERATOR", "SessionShape", "session_schema", "session_shape"]

#: The operator's name in its metadata.
SESSION_OPERATOR = "sessionWindowStateStoreSaveExec"
#: The key column after the group key's: the session's start.
SESSION_START = "sessionStartTime"


def _group_columns(key_schema: Mapping[str, Any], where: str) -> int:
    """How many leading key columns are the group key (``UnsupportedStateError`` naming
    ``where`` when the key schema is not a session store's)."""
    fields = list(key_schema.get("fields", []))
    last = fields[-1] if fields else {}
    if len(fields) < 2 or last.get("name") != SESSION_START or last.get("type") != "timestamp":
        names = ", ".join(str(f.get("name")) for f in fields)
        raise UnsupportedStateError(
            f"not supported yet: a session window store whose key ({names}) does not end with "
            f"{SESSION_START} ({where})"
        )
    return len(fields) - 1


def session_schema(store: OperatorStore, schema: StoreSchema) -> StoreSchema:
    """``schema`` with the prefix columns a session store's keys are encoded with: the
    group key's. The operator's metadata must record that many, or none (Spark 3.5 writes
    no metadata); any other count is one line naming the metadata file."""
    group = _group_columns(schema.key_schema, schema.source)
    recorded = store.info.num_cols_prefix_key
    if recorded not in (0, group):
        raise UnsupportedStateError(
            f"not supported yet: {store.operator.source} records numColsPrefixKey {recorded} "
            f"for a session window store, whose group key has {group} column(s) "
            f"(store {store.name!r})"
        )
    return dataclasses.replace(schema, num_cols_prefix_key=group)


def session_shape(
    store: OperatorStore, key_schema: Mapping[str, Any], value_schema: Mapping[str, Any]
) -> StateShape:
    """The shape ``store`` is served in: a session window's (``SessionShape``) for the
    session operator's store, else the shape every other store has."""
    if store.operator_name == SESSION_OPERATOR:
        return SessionShape(key_schema, value_schema)
    return StateShape(key_schema, value_schema)


@dataclasses.dataclass(frozen=True)
class SessionShape(StateShape):
    """A session window store's shape (module docstring): keyed by the group key, a
    value the list of the key's sessions."""

    replays_changes: ClassVar[bool] = False

    @cached_property
    def key_columns(self) -> list[Mapping[str, Any]]:
        """The group key's columns (the session start left out)."""
        return self.key_fields[: _group_columns(self.key_schema, "its key schema")]

    @cached_property
    def _key_parts(self) -> list[tuple[int, Any]]:
        # Every key column (a session store has no window column) less the session start.
        return StateShape._key_parts.func(self)[: len(self.key_columns)]

    def manifest(
        self, store: OperatorStore, window_size_ms: int | None, provider: str
    ) -> StoreManifest:
        """As any store's, less ``value_schema``: a value is a list of sessions, not one
        record whose members a reader could show as typed columns (Spark's value schema,
        each session's columns, stays in ``spark_value_schema``)."""
        manifest = super().manifest(store, window_size_ms, provider)
        properties = {k: v for k, v in manifest.properties.items() if k != "value_schema"}
        properties["spark_session_start"] = SESSION_START
        return dataclasses.replace(manifest, properties=properties)

    def store_rows(
        self, rows: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]
    ) -> Iterator[tuple[bytes, bytes]]:
        """Spark's (key row, value row) pairs, one per session, as one stored row per
        group key: its sessions' values, ordered by session start."""
        start = len(self.key_fields) - 1
        sessions: dict[Any, list[tuple[Any, dict[str, Any]]]] = {}
        key_of, value_of = self.key_value, self.value_of
        for key_row, value_row in rows:
            sessions.setdefault(key_of(key_row), []).append((key_row[start], value_of(value_row)))
        serialize_key = get_serde(self.key_serde).serialize
        serialize = JsonSerde().serialize_keeping_non_finite
        for key, found in sessions.items():
            found.sort(key=lambda session: session[0])
            value = [session for _, session in found]
            yield keyspace.kv_key(serialize_key(key)), serialize(value)

    def stored_keys(self, key_row: tuple[Any, ...]) -> list[bytes]:
        raise AssertionError("unreachable: a session store is never built on an older one")

    def stored_columns(self, rows: Any) -> None:
        return None  # one stored row gathers several of Spark's: the row path
