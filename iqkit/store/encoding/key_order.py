"""Binary keys ordered and looked up in numpy: RocksDB's key order without a Python
comparison per key or an Arrow sort of every key.

RocksDB orders keys bytewise (``memcmp``, a shorter key before the longer keys it
starts), and a twin's rows are in that order, so two questions about many keys are
answered on their bytes (``partitioners.key_buffers``, read without copying):

* ``rows_holding``: which rows of a big sorted column hold one of a few keys (the
  writer's position deletes, ``columnar/deletes.py``: a 1% commit to a store of 10 to
  50 million keys). A vectorised binary search: its cost follows the needles, not the
  hay, which is never copied (a zero-copy ``S<n>`` view when its keys have one length)
  and is searched a piece at a time (its chunks as Parquet reads them, row groups),
  each for the needles between its first and last key;
* ``merge_order``: the order of several sorted files' rows merged (``columnar/scan.py``):
  every key made one comparable numpy value, the few rows of the deltas sorted and
  placed among the base's by ``searchsorted``;
* ``sort_columns``: numpy columns that sort as keys in any order do (``sorted_rows``'
  sort of a commit's rows by key: numpy's stable sorts of 8-byte words are 4-5x faster
  than Arrow's comparison sort of the binary keys).

Three algorithms, one per question, on shared helpers: keys' bytes padded with zero
bytes to one width (``_padded``), as big-endian 64-bit words (``_words``) or numpy
``S<n>`` values. Quirk: numpy compares ``S<n>`` values without their trailing zero
bytes, so a key and the same key with zero bytes after it compare equal. Keys of one
length never meet it (their order and equality are the bytes'); where lengths differ,
the search breaks ties on length and the merge appends each key's length after its
padded bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from .partitioners import key_buffers

__all__ = ["Needles", "merge_order", "needles", "rows_holding", "sort_columns"]

#: Keys wider than this (after the prefix they all share) are merged by Arrow's sort
#: (below 256: a key's length fits the byte ``_comparable`` puts after it).
_WIDEST = 128
#: Keys padded at a time (bounds the index arrays ``_padded`` makes).
_SCATTER_ROWS = 1 << 16
#: Rows of a sorted column searched at a time (``rows_holding``): a piece's offsets and
#: lengths stay in the CPU's cache.
_PIECE_ROWS = 1 << 16
#: Keys whose bytes past their shared prefix span more 8-byte words are left to Arrow's
#: sort (``sort_columns``: a stable numpy sort per word).
_SORT_WORDS = 4


def _padded(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, skip: int = 0
) -> np.ndarray:
    """Each key's bytes after its first ``skip`` (at most ``width`` of them) as a row of
    a ``uint8`` array ``width`` wide, zero past the key's end; a bounded number of keys
    at a time, each copying only its own bytes."""
    rows = np.zeros((len(lengths), width), dtype=np.uint8)
    for lo in range(0, len(lengths), _SCATTER_ROWS):
        n = lengths[lo : lo + _SCATTER_ROWS] - skip
        at = starts[lo : lo + len(n)] + skip
        row = np.repeat(np.arange(len(n)), n)
        column = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        rows[lo + row, column] = data[np.repeat(at, n) + column]
    return rows


def _words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """The first ``8 * width`` bytes of each key as ``width`` big-endian 64-bit words,
    zero past the key's end: words compare as the bytes do."""
    span = np.arange(8 * width)
    idx = starts[:, None] + span[None, :]
    got = data[np.minimum(idx, len(data) - 1)] if len(data) else np.zeros(idx.shape, np.uint8)
    got = np.where(span[None, :] < lengths[:, None], got, 0).astype(np.uint8)
    return np.ascontiguousarray(got).view(">u8")


class Needles:
    """Keys looked up in sorted columns (``rows_holding``): ``data``, ``starts``,
    ``lengths`` as numpy arrays, and what the searches compare, made once for all the
    columns they are looked up in: per key length, the keys of that length as ascending
    ``S<n>`` values (``fixed``); the keys' 8-byte words (``words``) and their byte order
    (``order``)."""

    __slots__ = ("_fixed", "_order", "_words", "data", "lengths", "starts")

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.data, self.starts, self.lengths = data, starts, lengths
        self._fixed: dict[int, np.ndarray] = {}
        self._words: tuple[np.ndarray, int] | None = None
        self._order: np.ndarray | None = None

    def fixed(self, size: int) -> np.ndarray:
        """The keys ``size`` bytes long as numpy ``S<size>`` values, ascending."""
        got = self._fixed.get(size)
        if got is None:
            starts = self.starts[self.lengths == size]
            got = self.data[starts[:, None] + np.arange(size)]  # a row of bytes a key
            got = np.sort(got.view(f"S{size}").ravel())
            self._fixed[size] = got
        return got

    def words(self) -> tuple[np.ndarray, int]:
        """Every key as ``width`` big-endian 64-bit words (``_words``), enough for the
        longest, and ``width``."""
        if self._words is None:
            width = max(1, (int(self.lengths.max()) + 7) // 8)
            self._words = _words(self.data, self.starts, self.lengths, width), width
        return self._words

    def order(self) -> np.ndarray:
        """The keys' indexes in ascending byte order (words, then the shorter first)."""
        if self._order is None:
            words, width = self.words()
            columns = [self.lengths, *(words[:, j] for j in range(width - 1, -1, -1))]
            self._order = np.lexsort(columns)
        return self._order

    def key(self, i: int) -> bytes:
        """Key ``i``'s bytes."""
        start = int(self.starts[i])
        return self.data[start : start + int(self.lengths[i])].tobytes()


def needles(keys: pa.Array, prefix: bytes = b"") -> Needles:
    """Binary ``keys`` as ``Needles``: those starting with ``prefix``, without it (the
    others dropped: a column of keys without that prefix holds none of them)."""
    data, offsets = key_buffers(keys)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if not prefix:
        return Needles(data, starts, lengths)
    user = lengths >= len(prefix)
    for i, byte in enumerate(prefix):
        at = np.minimum(starts + i, max(len(data) - 1, 0))
        user &= (data[at] == byte) if len(data) else False
    return Needles(data, starts[user] + len(prefix), lengths[user] - len(prefix))


def rows_holding(
    hay: pa.Array | pa.ChunkedArray | Iterable[pa.Array], needles: Needles
) -> np.ndarray:
    """A boolean array over ``hay`` (binary keys sorted ascending bytewise, unique: an
    array, a chunked one, or its chunks as they are decoded, ``deletes._twin_keys``):
    True where the row's key is one of ``needles`` (any order).

    ``hay`` is searched a piece at a time (its chunks, cut to at most ``_PIECE_ROWS``
    rows, never copied), each for the needles between its first and last key: a
    vectorised binary search reading about ``log2(rows)`` keys per needle, so the cost
    follows the needles, not the hay (a hash probe hashes every row). What is done per
    row of the hay is finding the lengths of a piece's keys from its offsets, which
    stay in the CPU's cache: a piece whose keys have one length is searched as numpy
    ``S<n>`` values (``_fixed_rows``), another by 8-byte words (``_rows_by_words``)."""
    if isinstance(hay, pa.Array):
        hay = [hay]
    elif isinstance(hay, pa.ChunkedArray):
        hay = hay.chunks
    marks = [np.zeros(0, dtype=bool)]
    for chunk in hay:
        for lo in range(0, len(chunk), _PIECE_ROWS):
            piece = chunk.slice(lo, _PIECE_ROWS)
            found = np.zeros(len(piece), dtype=bool)
            marks.append(found)
            if not len(needles.lengths):
                continue
            data, offsets = key_buffers(piece, widen=False)
            lengths = np.diff(offsets)
            size = int(lengths[0])
            if size and (lengths == size).all():
                found[_fixed_rows(data[offsets[0] : offsets[-1]], size, needles)] = True
            else:
                found[_rows_by_words(data, offsets[:-1], lengths, needles)] = True
    return np.concatenate(marks)


def _fixed_rows(data: np.ndarray, size: int, needles: Needles) -> np.ndarray:
    """The rows of a piece of keys all ``size`` bytes long, ``data`` end to end, that
    hold a needle: the piece as a numpy ``S<size>`` view searched by
    ``numpy.searchsorted`` (the module docstring's quirk keeps the bytes' order and
    equality among keys of one length) for the needles of that length between its
    first and last key (needles of another length are in no row)."""
    hay = data.view(f"S{size}")
    want = needles.fixed(size)
    lo = int(np.searchsorted(want, hay[:1])[0])
    hi = int(np.searchsorted(want, hay[-1:], side="right")[0])
    want = want[lo:hi]
    at = np.searchsorted(hay, want)  # inside the piece: no needle is above its last key
    return at[hay[at] == want]


def _rows_by_words(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, needles: Needles
) -> np.ndarray:
    """The rows of a piece of keys (``data`` at ``starts``, ``lengths`` long) that hold
    a needle, for keys of any lengths: each needle between the piece's first and last
    key is placed by a binary search comparing 8-byte words (``_words``); when all of a
    needle's words are equal, the shorter key is the smaller (zeros past a key's end make
    a key and its extension by zero bytes equal in words, not in length)."""
    order = needles.order()
    head = data[int(starts[0]) : int(starts[0]) + int(lengths[0])].tobytes()
    tail = data[int(starts[-1]) : int(starts[-1]) + int(lengths[-1])].tobytes()
    ids = order[_rank(needles, order, head, False) : _rank(needles, order, tail, True)]
    if not len(ids):
        return ids
    words, width = needles.words()
    want, n_len = words[ids], needles.lengths[ids]
    m = len(ids)
    lo = np.zeros(m, dtype=np.int64)
    hi = np.full(m, len(lengths), dtype=np.int64)
    active = np.arange(m)
    while active.size:  # lower bound: the first row whose key is not below the needle
        low, high = lo[active], hi[active]
        mid = (low + high) // 2
        got = _words(data, starts[mid], lengths[mid], width)
        wanted = want[active]
        differs = got != wanted
        first = differs.argmax(axis=1)
        rows = np.arange(len(active))
        below = np.where(
            differs.any(axis=1),
            got[rows, first] < wanted[rows, first],
            lengths[mid] < n_len[active],
        )
        lo[active] = np.where(below, mid + 1, low)
        hi[active] = np.where(below, high, mid)
        active = active[lo[active] < hi[active]]
    # inside the piece: no needle is above its last key
    same = (_words(data, starts[lo], lengths[lo], width) == want).all(axis=1)
    same &= lengths[lo] == n_len
    return lo[same]


def _rank(needles: Needles, order: np.ndarray, key: bytes, right: bool) -> int:
    """How many needles (in byte ``order``) are below ``key`` (``right``: not above it):
    a binary search comparing bytes as Python does, RocksDB's order."""
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        got = needles.key(int(order[mid]))
        if got < key or (right and got == key):
            lo = mid + 1
        else:
            hi = mid
    return lo


def merge_order(keys: list[pa.Array | pa.ChunkedArray], kept: list[np.ndarray]) -> np.ndarray:
    """The positions, in the files' rows one after the other, of their rows ``kept``
    (each file's ``keys``, binary or string, are in ascending order and no key is kept
    in two files) in ascending key order.

    The file with most kept rows (the base) keeps its order; the others' rows (the
    deltas: few) are sorted and each placed among the base's by binary search, at the
    count of base keys below it plus the count of delta keys below it: no sort of the
    base's keys (a full scan of a partition sorted a million keys for every read)."""
    starts = np.cumsum([0, *(len(k) for k in keys)])
    runs = [kept_rows + start for kept_rows, start in zip(kept, starts, strict=False)]
    big = max(range(len(runs)), key=lambda i: len(runs[i]))
    others = [i for i in range(len(runs)) if i != big and len(runs[i])]
    if not others:
        return runs[big]
    comparable = _comparable([keys[i] for i in (big, *others)])
    if comparable is None:  # keys too wide to compare in numpy: Arrow sorts them all
        import pyarrow.compute as pc

        every = pa.concat_arrays(
            [_binary(keys[i]).take(pa.array(kept[i])) for i in range(len(runs))]
        )
        order = pc.sort_indices(every).to_numpy()
        return np.concatenate(runs)[order]  # type: ignore[no-any-return]
    base = comparable[0][kept[big]]
    small = np.concatenate([c[kept[i]] for c, i in zip(comparable[1:], others, strict=True)])
    rows = np.concatenate([runs[i] for i in others])
    by_key = np.argsort(small, kind="stable")
    small, rows = small[by_key], rows[by_key]
    slots = np.searchsorted(base, small) + np.arange(len(small))
    order = np.empty(len(base) + len(small), dtype=np.int64)
    taken = np.zeros(len(order), dtype=bool)
    taken[slots] = True
    order[slots] = rows
    order[~taken] = runs[big]
    return order


def _binary(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
        return array.cast(pa.large_binary())
    return array.cast(pa.binary())


def _comparable(keys: list[pa.Array | pa.ChunkedArray]) -> list[np.ndarray] | None:
    """Byte-string arrays (binary or string) as numpy arrays whose order is the keys'
    byte order, or None when the keys are too wide for that to pay (``_WIDEST``).

    The bytes every key starts with are left out; the rest is padded with zero bytes to
    one width, and where lengths differ each key's length follows (the module
    docstring's quirk: a key and the same key with zero bytes after it then still
    differ, the shorter first). Up to 8 bytes that is one big-endian ``uint64``,
    compared as a number; wider, a fixed-width byte string (numpy compares those as
    ``memcmp`` does)."""
    buffers = [key_buffers(_binary(k)) for k in keys]
    lengths = [np.diff(offsets) for _, offsets in buffers]
    if not any(len(n) for n in lengths):
        return [np.zeros(0, dtype=np.uint64) for _ in keys]
    shared = _shared_prefix(buffers)
    widest = max(int(n.max()) for n in lengths if len(n)) - shared
    same = all((n == widest + shared).all() for n in lengths)
    width = widest + (0 if same else 1)  # a length after the key: one byte (_WIDEST)
    if width > _WIDEST:
        return None
    out = []
    for (data, offsets), n in zip(buffers, lengths, strict=True):
        if same:
            rows = np.zeros((len(n), 8 if width <= 8 else width), dtype=np.uint8)
            block = data[int(offsets[0]) : int(offsets[-1])].reshape(len(n), widest + shared)
            rows[:, :widest] = block[:, shared:]
        else:
            rows = _padded(data, offsets[:-1], n, 8 if width <= 8 else width, shared)
            rows[:, widest] = n - shared
        if width <= 8:
            out.append(rows.view(">u8").ravel().astype(np.uint64))
        else:
            out.append(rows.view(f"S{width}").ravel())
    return out


def sort_columns(keys: pa.Array) -> list[np.ndarray] | None:
    """Numpy columns, most significant first, whose stable sort (``np.lexsort``, the
    last column first) is the stable sort of the ``binary`` ``keys`` (any order, no
    nulls) by their bytes: past the prefix every key shares, the bytes padded with zero
    bytes as big-endian 64-bit words (``_padded``), then, where lengths differ, the
    length (a key before the same key with zero bytes after it: the module docstring's
    quirk). None past ``_SORT_WORDS`` words."""
    import pyarrow.compute as pc

    data, offsets = key_buffers(keys)
    lengths = np.diff(offsets)
    if not len(lengths):
        return []
    lo_hi = pc.min_max(keys)  # what the smallest and largest share, all share
    shared = _common_start(lo_hi["min"].as_py(), lo_hi["max"].as_py())
    width = int(lengths.max()) - shared
    count = -(-width // 8)
    if count > _SORT_WORDS:
        return None
    same = bool((lengths == lengths[0]).all())
    if same:
        rows = np.zeros((len(lengths), 8 * count), dtype=np.uint8)
        block = data[int(offsets[0]) : int(offsets[-1])].reshape(len(lengths), -1)
        rows[:, :width] = block[:, shared:]
    else:
        rows = _padded(data, offsets[:-1], lengths, 8 * count, shared)
    words = rows.view(">u8")
    columns = [words[:, j] for j in range(count)]
    return columns if same else [*columns, lengths]


def _common_start(lo: bytes, hi: bytes) -> int:
    """How many first bytes ``lo`` and ``hi`` have in common."""
    pairs = enumerate(zip(lo, hi, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(lo), len(hi)))


def _shared_prefix(buffers: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """How many first bytes every key of ``buffers`` (each file's keys, ascending) has
    in common: those of its smallest and largest keys, as every key lies between."""
    ends = []
    for data, offsets in buffers:
        if len(offsets) > 1:
            ends += [
                data[int(offsets[0]) : int(offsets[1])].tobytes(),
                data[int(offsets[-2]) : int(offsets[-1])].tobytes(),
            ]
    if not ends:
        return 0
    return _common_start(min(ends), max(ends))  # what they share, all share
