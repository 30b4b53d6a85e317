"""What one ``spark.read.format("iqkit")`` reads: the read options, typed and checked, and
the plan they give (which store partitions, which IQv2 queries on each).

Why options and not Spark's filter pushdown: PySpark 4.1–4.3 keeps the read plan made by
a Python data source's ``pushFilters`` on the data source object that every DataFrame from
one ``load()`` shares, and a later scan with no pushable filter reuses it: after
``df.where("key = 'a'").count()``, ``df.count()`` counts only ``a``'s rows. Options belong
to the ``load()`` itself, so a narrowed read can never leak into another DataFrame: the
DataFrame *is* the narrowed set, like a table-valued function's result. ``where()``
filters stay correct (Spark applies them to the rows read).

Pure Python (no pyspark import): the data source calls it on Spark's planner workers, and
tests check it without a Spark session.

Options (all optional; values are text, as Spark passes every option):

``partitions``   ``"0,2"`` or ``"1-3"`` (or both, ``"0,4-6"``): read only these partitions.
``key``          one key, typed by the store's key serde (``42`` in an ``int32`` store,
                 ``0x0a`` in a ``bytes`` store, ``["eu", "ann"]`` in an ``ordered`` one;
                 the same text rules as ``%iq get``): a ``KeyQuery`` on the owning
                 partition only (``murmur2``), on every partition (``explicit``).
``keys``         several keys: a JSON array (``'["alice", "bob"]'``, ``'[1, 2]'``,
                 ``'[["eu", "ann"]]'``): one ``MultiKeyQuery`` per owning partition.
``prefix``       a ``PrefixScanQuery`` (key-value stores; KIP-614).
``key_from`` / ``key_to``  an inclusive ``RangeQuery`` (either may be left out), only where
                 the key serde's byte order is its value order.
``time_from`` / ``time_to``  window stores: window start range, inclusive; epoch
                 milliseconds or ISO-8601 (naive = UTC).

``key``/``keys`` exclude ``prefix`` and ``key_from``/``key_to``; window stores take
``key``/``keys`` and times, key-value stores the rest.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..query import (
    KeyQuery,
    MultiKeyQuery,
    PrefixScanQuery,
    Query,
    RangeQuery,
    WindowKeyQuery,
    WindowRangeQuery,
)
from ..query.window import to_epoch_millis
from ..store.encoding.partitioners import get_partitioner
from ..store.encoding.serdes import get_serde
from ..store.kinds import EARLIEST_WINDOW_START_MS, LATEST_WINDOW_START_MS, StoreKind
from ..store.manifest import StoreManifest

__all__ = ["READ_OPTIONS", "ReadSpec", "parse_read_options"]

#: Options that narrow a read (see the module docstring).
NARROWING_OPTIONS = ("partitions", "key", "keys", "prefix", "key_from", "key_to", "time_from",
                     "time_to")  # fmt: skip
#: Every option the read side takes (``path`` is what ``load(path)`` sets).
READ_OPTIONS = (
    "store",
    "root",
    "path",
    "as_of",
    "value_schema",
    "_trace_dir",
    "max_partition_bytes",  # how partitions are spread over tasks (read_tasks.py)
    *NARROWING_OPTIONS,
)

#: ``keys`` lists at most this many keys (one MultiKeyQuery per partition holds them all).
MAX_KEYS = 100_000


@dataclass(frozen=True)
class ReadSpec:
    """A checked read: ``None`` fields are "not narrowed"."""

    partitions: tuple[int, ...] | None = None
    keys: tuple[Any, ...] | None = None
    prefix: Any = None
    key_from: Any = None
    key_to: Any = None
    time_from: int | None = None
    time_to: int | None = None

    def plan(
        self,
        manifest: StoreManifest,
        owner_of: Callable[[Any], int | None] | None = None,
    ) -> list[tuple[int, tuple[Any, ...] | None]]:
        """``(store partition, keys it owns or None)`` for every partition to read, in
        partition order; key lookups read only the owning partitions where a key's owner
        is known. ``owner_of`` says a key's partition (``StateEngine.partition_for_key``,
        which knows every format's routing; ``None``: any partition may hold it); by
        default the partitioner the manifest names routes."""
        allowed = self.partitions if self.partitions is not None else range(manifest.partitions)
        if self.keys is None:
            return [(p, None) for p in allowed]
        if owner_of is None:
            partitioner = get_partitioner(manifest.partitioner)
            serde = get_serde(manifest.key_serde)

            def owner_of(key: Any) -> int | None:
                if not partitioner.routes_keys:
                    return None
                return partitioner.partition(serde.serialize(key), manifest.partitions)

        owned: dict[int, list[Any]] = {}
        for key in self.keys:
            owner = owner_of(key)
            for p in allowed if owner is None else (owner,):
                owned.setdefault(p, []).append(key)
        return [(p, tuple(owned[p])) for p in allowed if p in owned]

    def queries(self, kind: StoreKind | str, keys: tuple[Any, ...] | None) -> list[Query]:
        """The IQv2 queries one partition runs (``keys``: those it owns, from :meth:`plan`;
        ``kind``: the store's, or its name)."""
        if StoreKind(kind).windowed:
            lo = EARLIEST_WINDOW_START_MS if self.time_from is None else self.time_from
            hi = LATEST_WINDOW_START_MS if self.time_to is None else self.time_to
            if keys is not None:
                return [WindowKeyQuery.with_key_and_window_start_range(k, lo, hi) for k in keys]
            return [WindowRangeQuery.with_window_start_range(lo, hi)]
        if keys is not None:
            if len(keys) == 1:
                return [KeyQuery.with_key(keys[0])]
            return [MultiKeyQuery.with_keys(list(keys))]
        if self.prefix is not None:
            return [PrefixScanQuery.with_prefix(self.prefix)]
        return [RangeQuery.with_range(self.key_from, self.key_to)]


def parse_read_options(options: Mapping[str, Any], manifest: StoreManifest) -> ReadSpec:
    """Check and type the read options against the store (``ValueError`` naming the option
    and what it takes; unknown options are refused by name, so a typo never silently
    reads the whole store)."""
    given = {str(k).lower(): v for k, v in options.items() if v is not None}
    unknown = sorted(k for k in given if k not in READ_OPTIONS and not k.startswith("_"))
    if unknown:
        raise ValueError(
            f"iqkit: unknown read option(s) {', '.join(map(repr, unknown))}; the read side "
            f"takes {', '.join(READ_OPTIONS[:5])}, {', '.join(NARROWING_OPTIONS)}"
        )

    def text(name: str) -> str | None:
        value = given.get(name)
        return None if value is None or str(value) == "" else str(value)

    window = manifest.kind.windowed
    fits = ("key", "keys", "time_from", "time_to") if window else NARROWING_OPTIONS[1:6]
    misplaced = [n for n in NARROWING_OPTIONS[1:] if text(n) is not None and n not in fits]
    if misplaced:
        raise ValueError(
            f"iqkit: option {misplaced[0]!r} does not apply to store {manifest.name!r} "
            f"({manifest.kind} store); it takes {', '.join(('partitions', *fits))}"
        )
    if text("key") is not None and text("keys") is not None:
        raise ValueError("iqkit: give option 'key' or 'keys', not both")
    points = text("key") is not None or text("keys") is not None
    scans = [n for n in ("prefix", "key_from", "key_to") if text(n) is not None]
    if points and scans:
        raise ValueError(
            f"iqkit: option {scans[0]!r} cannot be combined with a key lookup "
            "('key'/'keys'); read one or the other"
        )
    if text("prefix") is not None and (text("key_from") or text("key_to")):
        raise ValueError("iqkit: give option 'prefix' or 'key_from'/'key_to', not both")

    serde = get_serde(manifest.key_serde)
    keys: tuple[Any, ...] | None = None
    if text("key") is not None:
        keys = (_key_from_text(text("key") or "", manifest, "key"),)
    elif text("keys") is not None:
        keys = _keys_from_text(text("keys") or "", manifest)
    if text("key") is not None:
        _serialized(serde, keys[0], "key")  # type: ignore[index]
    if (text("key_from") or text("key_to")) and not serde.order_preserving:
        raise ValueError(
            f"iqkit: options 'key_from'/'key_to' need keys whose byte order is their value "
            f"order; store {manifest.name!r} has {manifest.key_serde!r} keys (negative "
            "numbers sort after positive ones): filter with .where() instead"
        )
    return ReadSpec(
        partitions=_partitions_from_text(text("partitions"), manifest),
        keys=keys,
        prefix=_key_from_text(text("prefix"), manifest, "prefix"),
        key_from=_key_from_text(text("key_from"), manifest, "key_from"),
        key_to=_key_from_text(text("key_to"), manifest, "key_to"),
        time_from=_time_from_text(text("time_from"), "time_from"),
        time_to=_time_from_text(text("time_to"), "time_to"),
    )


def _partitions_from_text(text: str | None, manifest: StoreManifest) -> tuple[int, ...] | None:
    if text is None:
        return None
    n = manifest.partitions
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo_text, dash, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise ValueError(
                f"iqkit: option 'partitions' takes numbers and ranges like '0,2' or '1-3', "
                f"got {text!r}"
            ) from None
        if not 0 <= lo <= hi < n:
            raise ValueError(
                f"iqkit: option 'partitions': {part!r} is outside store {manifest.name!r}'s "
                f"partitions 0-{n - 1}"
            )
        chosen.update(range(lo, hi + 1))
    return tuple(sorted(chosen))


def _key_from_text(text: str | None, manifest: StoreManifest, option: str) -> Any:
    """A key typed by the store's key serde, by the rules ``%iq get`` uses."""
    if text is None:
        return None
    serde = get_serde(manifest.key_serde)
    try:
        return serde.parse_text(text)
    except ValueError as exc:
        if manifest.key_serde == "json":
            return text  # a bare word in a JSON-keyed store: the string itself
        raise ValueError(f"iqkit: option {option!r}: {exc}") from None


def _keys_from_text(text: str, manifest: StoreManifest) -> tuple[Any, ...]:
    """A JSON array of keys (a Python list literal is accepted too: PySpark turns
    ``.option("keys", ["a", "b"])`` into ``"['a', 'b']"``)."""
    try:
        items = json.loads(text)
    except ValueError:
        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            items = None
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(
            f"iqkit: option 'keys' takes a non-empty JSON array of keys, e.g. "
            f'\'["alice", "bob"]\', got {text[:60]!r}'
        )
    if len(items) > MAX_KEYS:
        raise ValueError(f"iqkit: option 'keys' lists {len(items)} keys; at most {MAX_KEYS}")
    serde = get_serde(manifest.key_serde)
    plain = serde.text_keys
    keys: dict[bytes, Any] = {}  # by serialized bytes: json keys may be unhashable lists
    for item in items:
        if plain and not isinstance(item, str):
            raise ValueError(
                f"iqkit: option 'keys': {item!r} is not a {manifest.key_serde} key of store "
                f"{manifest.name!r}"
            )
        key = _key_from_text(item if plain else json.dumps(item), manifest, "keys")
        keys.setdefault(_serialized(serde, key, "keys"), key)
    return tuple(keys.values())


def _serialized(serde: Any, key: Any, option: str) -> bytes:
    try:
        return serde.serialize(key)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"iqkit: option {option!r}: {exc}") from None


def _time_from_text(text: str | None, option: str) -> int | None:
    """Epoch milliseconds from ``1714564800000`` or ISO-8601 (naive = UTC)."""
    if text is None:
        return None
    stripped = text.strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"iqkit: option {option!r} takes epoch milliseconds or ISO-8601 "
            f"(2024-05-01T12:00), got {text!r}"
        ) from None
    return to_epoch_millis(moment if moment.tzinfo else moment.replace(tzinfo=UTC), option)
