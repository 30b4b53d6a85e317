"""The frozen checkpoint matrix (tests/data/checkpoints/, its README explains the folders)
as test data: the cells, Spark 4.3's reading of each (``statestore.json``), and iqkit's
rows turned into that file's JSON form, so the two compare with ``==``.

The conversion is the README's, applied to what iqkit gives, driven by the Spark schema
iqkit keeps in the store's manifest (``spark_key_schema``, ``spark_value_schema``):
struct -> object, array -> list, map -> ``[key, value]`` pairs sorted by the key's JSON
text, timestamp -> integer microseconds since the epoch (iqkit keeps timestamp *key*
columns as ISO text, value columns as datetimes), date -> ``YYYY-MM-DD``, binary -> hex,
decimal -> text, NaN/infinities -> text. iqkit's key shapes: one key column is a plain
value, several a tuple in the schema's order; a window store's key is
``Windowed(key, start, end)`` in epoch milliseconds, which becomes the ``window`` struct.

Reads only files: no Spark here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any

CHECKPOINTS = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Cells Spark 4.3's state reader cannot read (checkpoint format v2: it parses the
#: ``<version>_<uuid>`` file names as numbers and fails), read instead against the cell
#: that ran the same query over the same inputs with format v1 on the same line: the state's
#: rows and partitions follow from the inputs alone, not from the file format.
ORACLE_STAND_INS = {
    "agg-ckptv2-rocksdb": "agg-rocksdb",
    "agg-ckptv2-rocksdb-changelog": "agg-rocksdb-changelog",
    "join-inner-v2-ckptv2-rocksdb-changelog": "join-inner-v2-rocksdb-changelog",
}

Partitions = dict[int, list[dict[str, Any]]]


@dataclass(frozen=True)
class Cell:
    """One made cell: ``id`` is ``<spark-version>/<cell>``."""

    folder: Path

    @property
    def id(self) -> str:
        return f"{self.folder.parent.name}/{self.folder.name}"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"

    @cached_property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.folder / "cell.json").read_text(encoding="utf-8"))

    def oracle(self, operator_id: int = 0) -> dict[int, Partitions]:
        """Spark's rows of operator ``operator_id`` (read with no option): state version
        -> partition -> rows. Raises ``LookupError`` where Spark's reader failed and no
        stand-in is named (``ORACLE_STAND_INS``)."""
        source = self.folder
        if self.folder.name in ORACLE_STAND_INS:
            source = self.folder.parent / ORACLE_STAND_INS[self.folder.name]
        data = json.loads((source / "statestore.json").read_text(encoding="utf-8"))
        (operator,) = [op for op in data["operators"] if op["operatorId"] == operator_id]
        (read,) = [r for r in operator["reads"] if not r["options"]]
        versions: dict[int, Partitions] = {}
        for batch in read["batches"]:
            if "error" in batch:
                raise LookupError(f"{self.id}: Spark's reader failed: {batch['error']}")
            versions[batch["stateVersion"]] = {
                int(p): rows for p, rows in batch["partitions"].items()
            }
        return versions


def cells() -> list[Cell]:
    """Every cell whose checkpoint Spark made (``status`` ``made``), in folder order; the
    cells Spark refused to run keep no checkpoint and are not here."""
    found = []
    for meta in sorted(CHECKPOINTS.glob("*/*/cell.json")):
        cell = Cell(meta.parent)
        if cell.meta.get("status") != "failed":
            found.append(cell)
    return found


# --------------------------------------------------------------------------------------
# iqkit's values -> the oracle's JSON form


def _micros(value: Any) -> int:
    if isinstance(value, str):  # a timestamp key column, as iqkit keeps it: ISO text
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def spark_json(value: Any, spark_type: Any) -> Any:
    """``value`` (as iqkit gives it) of Spark type ``spark_type`` (a type of Spark's JSON
    schema) in the README's JSON form."""
    if value is None:
        return None
    if isinstance(spark_type, dict):
        kind = spark_type["type"]
        if kind == "struct":
            return {
                f["name"]: spark_json(value[f["name"]], f["type"]) for f in spark_type["fields"]
            }
        if kind == "array":
            return [spark_json(v, spark_type["elementType"]) for v in value]
        if kind == "map":
            pairs = [
                [spark_json(k, spark_type["keyType"]), spark_json(v, spark_type["valueType"])]
                for k, v in value.items()
            ]
            return sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))
        raise ValueError(f"unknown Spark type {spark_type!r}")
    if spark_type in ("timestamp", "timestamp_ntz"):
        return _micros(value)
    if spark_type == "date":
        return value.isoformat() if isinstance(value, date) else value
    if spark_type == "binary":
        return bytes(value).hex()
    if spark_type.startswith("decimal"):
        return str(Decimal(value))
    if spark_type in ("float", "double") and (math.isnan(value) or math.isinf(value)):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def is_window_field(spark_field: dict[str, Any]) -> bool:
    return bool(spark_field.get("metadata", {}).get("spark.timeWindow"))


def spark_key(key: Any, properties: dict[str, Any]) -> dict[str, Any]:
    """An iqkit key of a store with manifest ``properties`` as the oracle's ``key``."""
    columns = properties["key_columns"]
    window = None
    if hasattr(key, "start"):  # Windowed(key, start, end): epoch ms
        window = {"start": key.start * 1000, "end": key.end * 1000}
        key = key.key
    parts = dict(zip(columns, key if len(columns) > 1 else (key,), strict=True))
    return {
        f["name"]: window if is_window_field(f) else spark_json(parts[f["name"]], f["type"])
        for f in properties["spark_key_schema"]["fields"]
    }


def spark_value(value: Any, properties: dict[str, Any]) -> Any:
    """An iqkit value of a store with manifest ``properties`` as the oracle's ``value``."""
    return spark_json(value, properties["spark_value_schema"])


def spark_row(key: Any, value: Any, properties: dict[str, Any]) -> dict[str, Any]:
    """One iqkit row (``KeyValue``'s key and value) as the oracle's
    ``{"key": {...}, "value": {...}}``."""
    return {"key": spark_key(key, properties), "value": spark_value(value, properties)}


def row_text(row: Any) -> str:
    """A row's JSON text with sorted keys: the oracle's sort key and identity."""
    return json.dumps(row, sort_keys=True)


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=row_text)
