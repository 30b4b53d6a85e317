"""Make ``tests/data/folder_store/`` and ``tests/data/folder_store_expected.json``: a
small root of stores in the FOLDER format of earlier iqkit versions, and what its
folder-format reader served from every retained version (the migration tests' oracle).

Runs only against iqkit at commit df93f26 (or earlier ones with the folder format),
where ``IQKIT_LOCAL_FORMAT=folder`` makes folder stores and ``iqkit.store.versions``,
``layout`` and the folder reader still exist; later iqkits have neither, which is why
its output is committed. From a checkout of that commit::

    PYTHONPATH=$PWD python tests/data/make_folder_store.py

The stores:

* ``totals``: key-value, 3 partitions, murmur2, string keys, json values, retention 4;
  six commits, so retention removed versions 1 and 2 and 3..6 remain. Puts, deletes and
  a re-insert across versions, positions from ``source=`` and ``record_applied``,
  source end offsets, a streaming sink's progress and a free-form fact. Commits touch
  some partitions only, so several retained versions share one partition folder.
* ``clicks``: window store, 2 partitions, 60 s windows; three commits (a put, a delete
  of a window, one partition only).
* ``fresh``: a store created and never committed to (a manifest only).

RocksDB's info logs (``LOG``) are emptied and ``LOG.old.*`` removed afterwards: they
are diagnostics RocksDB never reads back, and they were most of the bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ["IQKIT_LOCAL_FORMAT"] = "folder"

from iqkit.store.layout import StoreLayout
from iqkit.store.partitioners import get_partitioner

import iqkit
from iqkit import StateQueryRequest, StoreWriter
from iqkit.store import rocks
from iqkit.store.names import COMMIT_KEY
from iqkit.store.versions import list_versions, read_version

HERE = Path(__file__).resolve().parent
ROOT = HERE / "folder_store"
EXPECTED = HERE / "folder_store_expected.json"
TOPIC = "orders"
MURMUR2 = get_partitioner("murmur2")


def owned(partition: int, count: int, prefix: str) -> list[str]:
    """``count`` string keys that murmur2 sends to ``partition`` of 3."""
    keys, i = [], 0
    while len(keys) < count:
        key = f"{prefix}{i}"
        if MURMUR2.partition(get_string(key), 3) == partition:
            keys.append(key)
        i += 1
    return keys


def get_string(key: str) -> bytes:
    return iqkit.get_serde("string").serialize(key)


def make_totals() -> None:
    iqkit.create_store(ROOT, "totals", partitions=3, retention=4)
    k0, k1, k2 = owned(0, 4, "user-"), owned(1, 4, "user-"), owned(2, 3, "user-")
    # v1: every partition.
    with StoreWriter(ROOT, "totals") as w:
        for i, key in enumerate([*k0, *k1, *k2]):
            w.put(key, {"total": i, "tags": ["a", i % 2 == 0]}, source=(TOPIC, i % 2, i))
        w.record_source_end({TOPIC: {0: 20, 1: 20}})
    # v2: updates and a delete; the input applied up to 30/31 (every partition advances).
    with StoreWriter(ROOT, "totals") as w:
        w.put(k0[0], {"total": 100}, source=(TOPIC, 0, 25))
        w.delete(k1[1], source=(TOPIC, 1, 26))
        w.record_applied({TOPIC: {0: 30, 1: 31}})
        w.record_source_end({TOPIC: {0: 40, 1: 41}})
    # v3: partition 1 only: the deleted key inserted again, another deleted.
    with StoreWriter(ROOT, "totals") as w:
        w.put(k1[1], {"total": "back", "nested": {"x": [1, 2.5, None]}}, source=(TOPIC, 1, 35))
        w.delete(k1[2], source=(TOPIC, 1, 36))
    # v4: partition 2 only, through a streaming sink's progress.
    with StoreWriter(ROOT, "totals") as w:
        w.put(k2[0], {"total": 7}, source=(TOPIC, 0, 38))
        w.put(owned(2, 1, "ünïcode-✓")[0], {"total": -1}, source=(TOPIC, 0, 39))
        w.set_metadata(sinks={"totals_sink": {"query-1": 4}})
    # v5: partition 0: a put, a delete, a new key.
    with StoreWriter(ROOT, "totals") as w:
        w.delete(k0[1], source=(TOPIC, 0, 41))
        w.put(k0[2], {"total": 502}, source=(TOPIC, 1, 42))
        w.put(owned(0, 1, "late-")[0], {"total": 0}, source=(TOPIC, 0, 43))
        w.record_source_end({TOPIC: {0: 60, 1: 61}})
    # v6: partition 1, the sink's next batch and a fact of the writer's own.
    with StoreWriter(ROOT, "totals") as w:
        w.put(k1[0], {"total": 600}, source=(TOPIC, 1, 50))
        w.set_metadata(sinks={"totals_sink": {"query-1": 5}}, batch_label="six")


def make_clicks() -> None:
    iqkit.create_store(
        ROOT, "clicks", partitions=2, kind="window", key_serde="string", window_size_ms=60_000
    )
    minute = 60_000
    t0 = 1_700_000_000_000 - 1_700_000_000_000 % minute
    with StoreWriter(ROOT, "clicks") as w:
        for i, key in enumerate(["alice", "bob", "carol", "dave"]):
            for m in range(2):
                w.put(key, {"clicks": i + m}, window_start=t0 + m * minute, source=("clicks", 0, i))
    with StoreWriter(ROOT, "clicks") as w:
        w.put("alice", {"clicks": 10}, window_start=t0 + 2 * minute, source=("clicks", 0, 9))
        w.delete("bob", window_start=t0, source=("clicks", 0, 10))
    with StoreWriter(ROOT, "clicks") as w:
        w.put("carol", {"clicks": 99}, window_start=t0, source=("clicks", 0, 11))


def rows_json(value: object) -> object:
    if isinstance(value, iqkit.Windowed):
        return [value.key, value.start, value.end]
    return value


def expected() -> dict[str, object]:
    """What the folder reader serves, per store, version and partition."""
    out: dict[str, object] = {}
    for store in ("totals", "clicks", "fresh"):
        layout = StoreLayout.of(ROOT, store)
        manifest = json.loads(layout.manifest.read_text())
        numbers = list_versions(layout)
        versions: dict[str, object] = {}
        for v in numbers:
            record = read_version(layout, v)
            parts: dict[str, object] = {}
            with iqkit.open(ROOT, as_of={store: v}) as engine:
                kind = engine.manifest(store).kind
                for p in range(manifest["partitions"]):
                    req = StateQueryRequest.in_store(store).with_query(kind.scan_query())
                    qr = engine.query(req.with_partitions({p})).partition_results[p]
                    assert not qr.is_failure, qr.failure_message
                    with qr.result as it:
                        rows = [[rows_json(kv.key), kv.value] for kv in it]
                    written_by = record.partitions.get(p)
                    commit = None
                    if written_by is not None:
                        db = rocks.open_for_read(layout.partition_version_dir(p, written_by))
                        try:
                            commit = json.loads(db.get(COMMIT_KEY))
                        finally:
                            rocks.close_quietly(db)
                    parts[str(p)] = {
                        "written_by": written_by,
                        "commit": commit,
                        "position": {
                            t: {str(ip): o for ip, o in sorted(m.items())}
                            for t, m in sorted(qr.position.to_map().items())
                        },
                        "rows": rows,
                    }
            versions[str(v)] = {
                "created_at": record.created_at,
                "source_end": json.loads(record.to_json())["source_end"],
                "metadata": record.metadata,
                "partitions": parts,
            }
        out[store] = {"manifest": manifest, "versions": numbers, "by_version": versions}
    return out


def trim_logs() -> None:
    for path in sorted(ROOT.rglob("LOG*")):
        if path.name == "LOG":
            path.write_bytes(b"")
        else:
            path.unlink()


def main() -> int:
    if not hasattr(__import__("iqkit.store.formats").store.formats, "ENV_LOCAL_FORMAT"):
        print("needs an iqkit with the folder format (commit df93f26)", file=sys.stderr)
        return 1
    shutil.rmtree(ROOT, ignore_errors=True)
    make_totals()
    make_clicks()
    iqkit.create_store(ROOT, "fresh", partitions=2)
    data = expected()
    trim_logs()
    EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {ROOT} and {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
