"""Spark's own reading of the frozen checkpoints: ``format("statestore")`` rows of every
committed batch of every stateful operator, with every option set that applies, written
to ``<cell>/statestore.json``. Run with a PySpark 4.3 (the project's ``.venv`` has it):

    .venv/bin/python tests/data/checkpoints/statestore_oracle.py CELL_FOLDER...

Plain PySpark, no iqkit. A reader failure is data: the error's first line is recorded in
place of the rows, and summed up in ``cell.json`` (``reader``).

Option sets per operator (the operator's kind comes from the 4.x operator metadata, or for
a checkpoint without it (3.5), from its store folders):

* joins: ``joinSide=left``, ``joinSide=right``, and ``storeName=`` each of the four
  internal stores (``<side>-keyToNumValues``, ``<side>-keyWithIndexToValue``) read raw
  (these keep the ``matched`` column of state format v2+);
* transformWithState: ``stateVarName=`` each state variable (list and map variables with
  ``flattenCollectionTypes`` true and false), and ``readRegisteredTimers=true``;
* everything else: no option (the ``default`` store).

``statestore.json``::

    {"spark_version": "4.3.0",            # the reader's
     "conversion": "...",                  # spark_jobs.jsonable
     "state_metadata": {"rows": [...]} | {"error": "..."},
     "operators": [
       {"operatorId": 0, "operatorName": "stateStoreSave", "kind": "default",
        "reads": [
          {"options": {...},               # besides batchId and operatorId
           "schema": "<the DataFrame's simpleString>",
           "batches": [
             {"batchId": 0, "stateVersion": 1,
              "partitions": {"0": [row, ...], "1": [...], "2": [...]}}  # rows sorted
             | {"batchId": 0, "stateVersion": 1, "error": "<first line>"}]}]}]}

A row is an object of the DataFrame's columns but ``partition_id`` (``key``, ``value``,
``user_map_key``, ``list_value``, ``expiration_timestamp_ms``, ...), converted as
``spark_jobs.jsonable`` says; rows are sorted by their JSON text (sorted keys). Every
partition of the batch (``spark.sql.shuffle.partitions`` in ``offsets/<batch>``) is
listed, empty ones as ``[]``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_jobs import dumps, each_in_session, first_line, jsonable, read_log_json, row_key

JOIN_STORES = (
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
)


def _numeric_dirs(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def operator_info(checkpoint: Path, op: int) -> dict[str, Any]:
    """operatorName, kind (join / tws / default) and the TWS variables of operator ``op``,
    from its metadata files (4.x) or its folders (3.5)."""
    folder = checkpoint / "state" / str(op)
    info: dict[str, Any] = {"operatorId": op, "operatorName": None, "metadata": None}
    v2 = folder / "_metadata" / "v2"
    v1 = folder / "_metadata" / "metadata"
    v2_batches = (
        sorted(int(p.name) for p in v2.iterdir() if p.name.isdigit()) if v2.is_dir() else []
    )
    if v2_batches:
        meta = read_log_json(v2 / str(v2_batches[-1]))
        info["metadata"] = f"_metadata/v2/{v2_batches[-1]}"
    elif v1.exists():
        meta = read_log_json(v1)
        info["metadata"] = "_metadata/metadata"
    else:
        meta = {}
    info["operatorName"] = meta.get("operatorInfo", {}).get("operatorName")
    stores = [s.get("storeName") for s in meta.get("stateStoreInfo", [])]
    props = meta.get("operatorPropertiesJson")
    variables = []
    if props:
        try:
            variables = json.loads(props).get("stateVariables", [])
        except ValueError:
            variables = []
    name = (info["operatorName"] or "").lower()
    partition0 = folder / "0"
    if "transformwithstate" in name:
        info["kind"] = "tws"
        info["stateVariables"] = variables
    elif (
        "join" in name
        or "left-keyToNumValues" in stores
        or (partition0 / "left-keyToNumValues").is_dir()
    ):
        info["kind"] = "join"
        info["stores"] = join_stores(checkpoint, op)
    else:
        info["kind"] = "default"
    return info


def join_stores(checkpoint: Path, op: int) -> list[str]:
    """The join's internal store names: the column families named in its v3 schema files
    (join state format v3/v4), else the four v1/v2 stores."""
    found: set[str] = set()
    for path in (checkpoint / "state" / str(op) / "_stateSchema").glob("*/*"):
        if path.is_file() and not path.name.endswith(".crc") and not path.name.startswith("."):
            found.update(
                m.decode() for m in re.findall(rb"(?:left|right)-[A-Za-z]+", path.read_bytes())
            )
    return sorted(found) or list(JOIN_STORES)


def option_sets(info: dict[str, Any]) -> list[dict[str, str]]:
    if info["kind"] == "join":
        sets = [{"joinSide": "left"}, {"joinSide": "right"}]
        sets += [{"storeName": store} for store in info["stores"]]
        return sets
    if info["kind"] == "tws":
        sets = []
        for var in info.get("stateVariables", []):
            kind = var.get("stateVariableType")
            name = var.get("stateName")
            if kind == "TimerState":
                continue
            if kind in ("ListState", "MapState"):
                sets.append({"stateVarName": name, "flattenCollectionTypes": "true"})
                sets.append({"stateVarName": name, "flattenCollectionTypes": "false"})
            else:
                sets.append({"stateVarName": name})
        sets.append({"readRegisteredTimers": "true"})
        return sets
    return [{}]


def read_state(spark, checkpoint: Path, op: int, batch: int, options: dict[str, str]):
    reader = spark.read.format("statestore").option("batchId", batch).option("operatorId", op)
    for key, value in options.items():
        reader = reader.option(key, value)
    frame = reader.load(str(checkpoint))
    rows = frame.collect()
    return frame.schema, rows


def partitions_of(checkpoint: Path, batch: int, default: int = 3) -> int:
    path = checkpoint / "offsets" / str(batch)
    if path.exists():
        conf = read_log_json(path).get("conf", {})
        try:
            return int(conf.get("spark.sql.shuffle.partitions", default))
        except ValueError:
            return default
    return default


def oracle_cell(spark, cell: Path) -> dict[str, Any]:
    import pyspark

    checkpoint = cell / "checkpoint"
    meta_path = cell / "cell.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    result: dict[str, Any] = {
        "spark_version": pyspark.__version__,
        "conversion": (
            "struct->object, array->list, map->[[k,v],...] sorted by JSON of k, "
            "timestamp->int microseconds since epoch (UTC), date->ISO text, binary->hex, "
            "decimal->text, NaN/Infinity->text; rows sorted by JSON text (sorted keys)"
        ),
        "operators": [],
    }
    started = time.time()
    batches = _numeric_dirs(checkpoint / "commits")
    try:
        frame = spark.read.format("state-metadata").load(str(checkpoint))
        result["state_metadata"] = {
            "rows": sorted((jsonable(r, frame.schema) for r in frame.collect()), key=row_key)
        }
    except Exception as error:
        result["state_metadata"] = {"error": first_line(error)}
    errors: dict[str, int] = {}
    ok = failed = 0
    for op in _numeric_dirs(checkpoint / "state"):
        info = operator_info(checkpoint, op)
        reads = []
        for options in option_sets(info):
            read: dict[str, Any] = {"options": options, "schema": None, "batches": []}
            for batch in batches:
                entry: dict[str, Any] = {"batchId": batch, "stateVersion": batch + 1}
                try:
                    schema, rows = read_state(spark, checkpoint, op, batch, options)
                    read["schema"] = read["schema"] or schema.simpleString()
                    parts: dict[str, list] = {
                        str(p): [] for p in range(partitions_of(checkpoint, batch))
                    }
                    fields = [f for f in schema.fields if f.name != "partition_id"]
                    for row in rows:
                        value = {f.name: jsonable(row[f.name], f.dataType) for f in fields}
                        parts.setdefault(str(row["partition_id"]), []).append(value)
                    entry["partitions"] = {
                        p: sorted(v, key=row_key)
                        for p, v in sorted(parts.items(), key=lambda kv: int(kv[0]))
                    }
                    ok += 1
                except Exception as error:
                    entry["error"] = first_line(error)
                    summary = re.sub(
                        r"(\d+_)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                        lambda m: ("<v>_" if m.group(1) else "") + "<uuid>",
                        entry["error"],
                    )
                    errors[summary] = errors.get(summary, 0) + 1
                    failed += 1
                read["batches"].append(entry)
            reads.append(read)
        info["reads"] = reads
        result["operators"].append(info)
    (cell / "statestore.json").write_text(dumps(result) + "\n", encoding="utf-8")
    if meta:
        meta["reader"] = {
            "spark_version": pyspark.__version__,
            "reads_ok": ok,
            "reads_failed": failed,
            "errors": errors,
            "seconds": round(time.time() - started, 1),
        }
        meta_path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return {"cell": str(cell), "ok": ok, "failed": failed, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__)
        return 2

    def read(spark, folder: str) -> str:
        cell = Path(folder)
        if not (cell / "checkpoint" / "commits").is_dir():
            return f"[oracle] {cell}: no checkpoint, skipped"
        summary = oracle_cell(spark, cell)
        return (
            f"[oracle] {cell.parent.name}/{cell.name}: {summary['ok']} reads ok, "
            f"{summary['failed']} failed {list(summary['errors'])[:2]}"
        )

    each_in_session("iqkit-statestore-oracle", args, read)
    return 0


if __name__ == "__main__":
    sys.exit(main())
