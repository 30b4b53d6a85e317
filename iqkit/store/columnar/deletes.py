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

Cost to the writer: once per commit, the key column of each older twin is read and the
delta's keys are looked up in it by binary search (``_rows_holding``: a twin is sorted by
key), so the search costs ``log2(rows)`` key reads per delta key, not a hash of every
row; the marks of files below the previous delta are that delta's, with the new rows
added (``superseded_metadata``). What stays in proportion to the store is decoding the
older twins' key columns (about 0.05 s per million rows).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..encoding.keyspace import RAW_PREFIX_LEN, kv_keys_arrow
from ..encoding.partitioners import key_buffers
from ..encoding.serdes import get_serde
from ..manifest import StoreManifest
from ..names import DATA_PREFIX, TWIN_SUFFIX
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


def _twin_keys(path: str | os.PathLike[str], manifest: StoreManifest) -> tuple[pa.Array, bool]:
    """The keys of the twin at ``path``, in its row order (sorted), as bytes: its
    ``__key`` column (RocksDB keys: True), or its key column serialized (the RocksDB keys
    without their prefix: False), which saves joining a prefix to every row."""
    schema = pq.read_schema(path)
    derived = (schema.metadata or {}).get(KEY_FROM)
    if derived is None:
        return pq.read_table(path, columns=[KEY_BYTES]).column(KEY_BYTES).combine_chunks(), True
    column = derived.decode()
    values = pq.read_table(path, columns=[column]).column(column).combine_chunks()
    serde = get_serde(manifest.key_serde)
    encoded = serde.serialize_arrow(values)
    if encoded is None:
        return key_bytes(pa.table({column: values}), column, serde), True
    return encoded, False


def _rocks_keys(keys: pa.Array, prefixed: bool) -> pa.Array:
    """``_twin_keys``'s keys as RocksDB keys."""
    return keys.cast(pa.binary()) if prefixed else kv_keys_arrow(keys)


class _Needles:
    """Keys looked up in twins (``_rows_holding``): ``data``, ``starts``, ``lengths``
    as numpy arrays, and per key length their ``S<n>`` values (``fixed``), made once for
    all the files of a chain."""

    __slots__ = ("_fixed", "data", "lengths", "starts")

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.data, self.starts, self.lengths = data, starts, lengths
        self._fixed: dict[int, np.ndarray] = {}

    def fixed(self, size: int) -> np.ndarray:
        """The keys ``size`` bytes long as numpy ``S<size>`` values."""
        got = self._fixed.get(size)
        if got is None:
            starts = self.starts[self.lengths == size]
            words = _words(self.data, starts, np.full(len(starts), size), (size + 7) // 8)
            got = np.ascontiguousarray(words.view(np.uint8)[:, :size]).view(f"S{size}").ravel()
            self._fixed[size] = got
        return got


def _needles(keys: pa.Array, prefixed: bool) -> _Needles:
    """RocksDB ``keys`` in the form of a twin's keys: as they are (``prefixed``), or
    without the user rows' prefix (other keys dropped: no twin row has them)."""
    data, offsets = key_buffers(keys)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if prefixed:
        return _Needles(data, starts, lengths)
    user = lengths >= RAW_PREFIX_LEN
    for i, byte in enumerate(DATA_PREFIX):
        at = np.minimum(starts + i, max(len(data) - 1, 0))
        user &= (data[at] == byte) if len(data) else False
    return _Needles(data, starts[user] + RAW_PREFIX_LEN, lengths[user] - RAW_PREFIX_LEN)


def _words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """The first ``8 * width`` bytes of each key as ``width`` big-endian 64-bit words,
    zero past the key's end: words compare as the bytes do."""
    span = np.arange(8 * width)
    idx = starts[:, None] + span[None, :]
    got = data[np.minimum(idx, len(data) - 1)] if len(data) else np.zeros(idx.shape, np.uint8)
    got = np.where(span[None, :] < lengths[:, None], got, 0).astype(np.uint8)
    return np.ascontiguousarray(got).view(">u8")


def _rows_holding(hay: pa.Array, needles: _Needles) -> np.ndarray:
    """A boolean array over ``hay`` (binary keys sorted ascending bytewise, unique): True
    where the row's key is one of ``needles`` (``_needles``, any order). A vectorised
    binary search per needle, reading about ``log2(len(hay))`` keys of ``hay`` for each:
    its cost follows the needles, not ``hay`` (a hash probe hashes every row of ``hay``).

    Keys compare by 8-byte words (``_words``); when all of a needle's words are equal,
    the shorter key is the smaller (zeros past a key's end make a key and its extension
    by zero bytes equal in words, not in length)."""
    n_data, n_start, n_len = needles.data, needles.starts, needles.lengths
    n = len(hay)
    found = np.zeros(n, dtype=bool)
    if not n or not len(n_len):
        return found
    h_data, h_off = key_buffers(hay)
    h_start, h_len = h_off[:-1], np.diff(h_off)
    size = int(h_len[0])
    if size and (h_len == size).all():  # one length: numpy's own search (no Python loop)
        return _rows_holding_fixed(h_data[h_off[0] : h_off[-1]], size, needles, found)
    width = max(1, (int(n_len.max()) + 7) // 8)
    n_words = _words(n_data, n_start, n_len, width)
    m = len(n_len)
    lo = np.zeros(m, dtype=np.int64)
    hi = np.full(m, n, dtype=np.int64)
    active = np.arange(m)
    while active.size:  # lower bound: the first row whose key is not below the needle
        low, high = lo[active], hi[active]
        mid = (low + high) // 2
        words = _words(h_data, h_start[mid], h_len[mid], width)
        want = n_words[active]
        differs = words != want
        first = differs.argmax(axis=1)
        rows = np.arange(len(active))
        below = np.where(
            differs.any(axis=1),
            words[rows, first] < want[rows, first],
            h_len[mid] < n_len[active],
        )
        lo[active] = np.where(below, mid + 1, low)
        hi[active] = np.where(below, high, mid)
        active = active[lo[active] < hi[active]]
    inside = lo < n
    at = lo[inside]
    same = (_words(h_data, h_start[at], h_len[at], width) == n_words[inside]).all(axis=1)
    same &= h_len[at] == n_len[inside]
    found[at[same]] = True
    return found


def _rows_holding_fixed(data: np.ndarray, size: int, needles: _Needles, found: Any) -> np.ndarray:
    """``_rows_holding`` for keys all ``size`` bytes long, ``data`` end to end: as a
    numpy ``S<size>`` array searched by ``numpy.searchsorted``. Quirk: numpy compares
    ``S`` values without their trailing zero bytes; among keys of one length that is
    still the bytes' order (a key whose rest is zeros is the smaller either way) and
    equality. Needles of another length are in no row."""
    want = needles.fixed(size)
    if not len(want):
        return found
    hay = data.view(f"S{size}")
    at = np.searchsorted(hay, want)
    inside = at < len(hay)
    at, want = at[inside], want[inside]
    found[at[hay[at] == want]] = True
    return found


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
    local path of its twin, checked whole)``; ``new_keys`` the delta's RocksDB keys.

    When the newest older twin carries the marks of the files below it (the previous
    commit's delta did), only the delta's keys are looked up: a file's marks are then
    that twin's plus the rows holding one of the delta's keys. Otherwise the keys of
    every newer file are looked up in each older one."""
    newer = new_keys if isinstance(new_keys, pa.Array) else pa.array(new_keys, pa.binary())
    footers = [pq.read_metadata(path) for _, path in older]
    below = read_superseded(
        footer_schema(footers[-1]).metadata,
        [(name, meta.num_rows) for (name, _), meta in zip(older[:-1], footers, strict=False)],
    )
    marks: list[np.ndarray] = []
    found = [newer]  # the RocksDB keys of the files above the one looked at
    needles: dict[tuple[int, bool], _Needles] = {}  # by files above and form
    for i in range(len(older) - 1, -1, -1):  # newest first
        keys, prefixed = _twin_keys(older[i][1], manifest)
        wanted = needles.get((len(found), prefixed))
        if wanted is None:
            joined = pa.concat_arrays([k.cast(pa.binary()) for k in found])
            wanted = needles[(len(found), prefixed)] = _needles(joined, prefixed)
        dead = _rows_holding(keys, wanted)
        if below is not None and i < len(older) - 1:
            live = below.mask(i)
            if live is not None:
                dead |= ~live
        elif below is None and i:
            found.append(_rocks_keys(keys, prefixed))
        marks.append(dead)
    entries = [
        {
            "name": _base_name(name),
            "rows": len(dead),
            "bits": base64.b64encode(
                pa.compress(np.packbits(dead).tobytes(), "zstd", asbytes=True)
            ).decode("ascii"),
        }
        for (name, _), dead in zip(older, reversed(marks), strict=True)
    ]
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
