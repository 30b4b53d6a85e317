"""``%iq stores``' table: one row per store under an engine's root, with its settings,
version, rows, position and lag (and a Spark checkpoint's operator facts).

Why a module of its own: it reads a whole root, store by store, where ``result.py`` shows
one query's answer; it builds on that module's pieces (positions, problems, lag's
nullable counts), never the other way round.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..engine import StateEngine
from ..errors import IqkitError
from ..query import Position
from ..query.lag import NO_SOURCE
from .result import ERROR_COLUMN, STORE_PROBLEMS, compact_position, nullable, problem

__all__ = ["CHECKPOINT_COLUMNS", "STORES_COLUMNS", "stores_frame"]

STORES_COLUMNS = [
    "name",
    "kind",
    "partitions",
    "key_serde",
    "value_serde",
    "partitioner",
    "version",
    "approx_rows",
    "position",
    "lag",
]
#: ``%iq stores`` adds these for a Spark checkpoint's stores (their manifest's
#: ``spark_*`` properties, store/checkpoint/shape.py): the stateful operator, the key and
#: value schemas, and the state store provider that wrote them.
CHECKPOINT_COLUMNS = ["operator", "key_schema", "value_schema", "provider"]


def _approx_rows(engine: StateEngine, store: str) -> int | None:
    """The engine's row estimate (:meth:`StateEngine.approximate_rows`); ``None`` (shown
    as NA) when the store's partitions cannot be read: one column never hides a row."""
    try:
        return engine.approximate_rows(store)
    except (IqkitError, OSError):
        return None


def stores_frame(engine: Any) -> pd.DataFrame:
    """``%iq stores``: one row per store under the engine's root with its settings, the
    version served, approximate rows, merged position, total offset lag (in words,
    ``"no source recorded"``, when the store's end offsets are unknown: a table for
    reading, so its ``lag`` column mixes counts and that text) and, when some store is
    broken, ``error``: null, or why the store could not be read (its other columns are
    then NA; one broken store never hides the others)."""
    records = []
    errors = False
    for name in engine.store_names():
        try:
            records.append((*_store_row(engine, name), None))
        except STORE_PROBLEMS as exc:
            errors = True
            records.append((name, *[pd.NA] * (len(STORES_COLUMNS) - 1), problem(exc)))
    frame = pd.DataFrame.from_records(records, columns=[*STORES_COLUMNS, ERROR_COLUMN])
    spark_stores = _checkpoint_facts(engine, frame["name"])
    if spark_stores is not None:
        for i, column in enumerate(CHECKPOINT_COLUMNS):
            frame.insert(3 + i, column, [facts[i] for facts in spark_stores])
    frame = frame.astype(
        {
            "kind": "object",
            "partitions": "Int64",
            "version": "Int64",
            "approx_rows": "Int64",
            "lag": "object",
            ERROR_COLUMN: "object",
        }
    )
    return frame if errors else frame.drop(columns=[ERROR_COLUMN])


def _checkpoint_facts(engine: Any, names: Any) -> list[tuple[Any, ...]] | None:
    """Per store, ``CHECKPOINT_COLUMNS``' values; ``None`` when no store is a Spark
    checkpoint's (the columns are then left out)."""
    facts: list[tuple[Any, ...]] = []
    for name in names:
        try:
            properties = engine.manifest(name).properties
        except STORE_PROBLEMS:
            facts.append((pd.NA,) * len(CHECKPOINT_COLUMNS))
            continue
        if "spark_operator" not in properties:
            facts.append((pd.NA,) * len(CHECKPOINT_COLUMNS))
            continue
        columns = zip(properties["key_columns"], properties["key_types"], strict=True)
        keys = ", ".join(f"{c} {t}" for c, t in columns)
        facts.append(
            (
                f"{properties['spark_operator']} (id {properties['spark_operator_id']})",
                keys,
                properties.get("value_schema", ""),
                properties.get("spark_provider", pd.NA),
            )
        )
    if all(f[0] is pd.NA for f in facts):
        return None
    return facts


def _store_row(engine: Any, name: str) -> tuple[Any, ...]:
    manifest = engine.manifest(name)
    infos = engine.lags(stores=[name]).get(name, {})
    position = Position.empty()
    for info in infos.values():
        position = position.merge(info.current_position)
    known = [i.offset_lag for i in infos.values()]
    lag: Any = NO_SOURCE
    if known and all(v is not None for v in known):
        lag = sum(known)  # type: ignore[arg-type]
    return (
        name,
        manifest.kind.value,  # the kind's name, a plain str (not the StoreKind enum)
        manifest.partitions,
        manifest.key_serde,
        manifest.value_serde,
        manifest.partitioner,
        nullable(engine.version(name)),
        nullable(_approx_rows(engine, name)),
        compact_position(position),
        lag,
    )
