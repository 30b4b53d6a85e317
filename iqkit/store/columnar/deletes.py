"""Position deletes: which rows of a chain's older twins a newer file supersedes, found
when a delta is written, so readers merge a chain by row position instead of joining on
keys (Iceberg v2 position deletes, Delta Lake deletion vectors).

A delta's twin carries, in its footer (schema metadata ``SUPERSEDED``), one bitmap per
older file of its chain: bit ``i`` set when row ``i`` of that file is superseded by a
newer file of the chain (the delta itself included), i.e. a newer file holds its key.
The bitmaps are cumulative: the newest file's alone say which rows of every older file
are dead, so a reader reads them from one footer. Each entry names the older file (its
SST's name without folders) and its rows; a reader whose chain does not match (another
chain, an earlier iqkit's files) ignores them and merges on keys as before.

Why in the twin's footer and not a file of their own: the bitmaps are then covered by the
twin's checksum (integrity.py), published, fetched, pinned and removed by retention with
it, and a crash can never leave a version listing a twin without its deletes. A
compacted base has no older file, so compaction drops them.

What a reader does with them (``newest wins`` with no key comparison):

* ``iqkit.sql``'s view (sqlsession/twins.py) reads every file of such chains in one
  ``read_parquet(..., file_row_number = true)`` and joins, per file (a build side of one
  row per file), its bitmap as a DuckDB ``BIT``: ``get_bit(bitmap, file_row_number)``;
* ``TwinScan`` (scan.py) filters each older file's rows by the bitmap as a numpy mask.

Cost to the writer: the key columns of the older twins are read and probed with the
newer keys (``pyarrow.compute.is_in``), once per commit: about 0.3 s per million rows of
the chain (BENCHMARKS.md "Merge-on-read").
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..names import TWIN_SUFFIX
from .twins import KEY_BYTES, KEY_FROM, key_bytes

__all__ = [
    "SUPERSEDED",
    "Superseded",
    "read_superseded",
    "superseded_metadata",
    "writing",
    "writing_enabled",
]

#: Schema metadata of a delta's twin: its chain's position deletes (module docstring).
SUPERSEDED = b"iqkit.superseded"
_FORMAT = 1
_WRITING = True
_SST_SUFFIX = ".sst"


@contextlib.contextmanager
def writing(enabled: bool) -> Iterator[None]:
    """Within the block, commits write their deltas' twins with position deletes
    (``True``, the default) or without, as iqkit did before them (``False``: tests mix
    such chains with new ones). Process-wide, like ``layers.twin_scans``."""
    global _WRITING
    old, _WRITING = _WRITING, enabled
    try:
        yield
    finally:
        _WRITING = old


def writing_enabled() -> bool:
    return _WRITING


def _base_name(name: str) -> str:
    """A chain file's name without folders and suffix (an SST's and its twin's are the
    same then): what the bitmaps are recorded under."""
    base = os.path.basename(name)
    for suffix in (TWIN_SUFFIX, _SST_SUFFIX):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _rocks_keys(path: str | os.PathLike[str], manifest: StoreManifest) -> pa.Array:
    """Every RocksDB key of the twin at ``path``, in its row order."""
    schema = pq.read_schema(path)
    derived = (schema.metadata or {}).get(KEY_FROM)
    if derived is None:
        return pq.read_table(path, columns=[KEY_BYTES]).column(KEY_BYTES).combine_chunks()
    column = derived.decode()
    table = pq.read_table(path, columns=[column])
    return key_bytes(table, column, get_serde(manifest.key_serde))


def footer_schema(meta: pq.FileMetaData) -> pa.Schema:
    """A twin's Arrow schema from its footer, with its position deletes in the schema's
    metadata wherever the writer put them: a twin written a piece at a time
    (``twins.TwinWriter``) adds them to the file's key-value metadata when it closes,
    after the Arrow schema it stores (``ARROW:schema``) was fixed."""
    schema = meta.schema.to_arrow_schema()
    extra = (meta.metadata or {}).get(SUPERSEDED)
    if extra is None or (schema.metadata or {}).get(SUPERSEDED) == extra:
        return schema
    return schema.with_metadata({**(schema.metadata or {}), SUPERSEDED: extra})


def superseded_metadata(
    manifest: StoreManifest,
    older: Sequence[tuple[str, str | os.PathLike[str]]],
    new_keys: Sequence[bytes] | pa.Array,
) -> dict[bytes, bytes]:
    """The schema metadata a delta's twin carries (module docstring): ``older`` are the
    chain's files below the delta, oldest first, each as ``(its name on the root, the
    local path of its twin, checked whole)``; ``new_keys`` the delta's RocksDB keys."""
    newer = new_keys if isinstance(new_keys, pa.Array) else pa.array(new_keys, pa.binary())
    entries = []
    for name, path in reversed(older):  # newest first: ``newer`` gathers the keys above
        keys = _rocks_keys(path, manifest)
        dead = pc.is_in(keys, value_set=newer).to_numpy(zero_copy_only=False)
        entries.append(
            {
                "name": _base_name(name),
                "rows": len(keys),
                "bits": base64.b64encode(
                    pa.compress(np.packbits(dead).tobytes(), "zstd", asbytes=True)
                ).decode("ascii"),
            }
        )
        newer = pa.concat_arrays([newer, keys.cast(pa.binary())])
    entries.reverse()
    text = json.dumps({"format": _FORMAT, "files": entries}, separators=(",", ":"))
    return {SUPERSEDED: text.encode()}


class Superseded:
    """The position deletes a chain's newest twin carries for its older files, oldest
    first: per file, its packed bitmap (``numpy.packbits``, first row in the highest bit
    of the first byte, the order of a DuckDB ``BIT``), or None when none of its rows is
    superseded."""

    __slots__ = ("bitmaps", "rows")

    def __init__(self, bitmaps: list[bytes | None], rows: list[int]) -> None:
        self.bitmaps = bitmaps
        self.rows = rows

    def mask(self, i: int) -> np.ndarray | None:
        """The rows of older file ``i`` still live (a boolean array), or None: all."""
        packed = self.bitmaps[i]
        if packed is None:
            return None
        bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=self.rows[i])
        return ~bits.astype(bool)


def read_superseded(
    metadata: dict[bytes, bytes] | None, older: Sequence[tuple[str, int]]
) -> Superseded | None:
    """The position deletes in a chain's newest twin's schema ``metadata`` for its
    ``older`` files (oldest first, each as ``(its name, its rows)``), or None when it
    has none for exactly these files (an earlier iqkit's twin, another chain): the
    reader merges on keys then."""
    raw = (metadata or {}).get(SUPERSEDED)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        files = data["files"]
        if data.get("format") != _FORMAT or len(files) != len(older):
            return None
        bitmaps: list[bytes | None] = []
        for entry, (name, rows) in zip(files, older, strict=True):
            if entry["name"] != _base_name(name) or int(entry["rows"]) != rows:
                return None
            packed = base64.b64decode(entry["bits"])
            size = (rows + 7) // 8
            bitmap = pa.decompress(packed, size, "zstd", asbytes=True) if size else b""
            if len(bitmap) != size:
                return None
            bitmaps.append(bitmap if np.frombuffer(bitmap, np.uint8).any() else None)
    except (ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return Superseded(bitmaps, [rows for _, rows in older])
