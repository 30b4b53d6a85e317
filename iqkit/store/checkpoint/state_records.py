"""A partition version's state records held column-wise: one buffer of bytes, and for
each record where its key and its value lie in it.

Why: the first open of a checkpoint version handles every record of the state (a
million and more), and a Python object per key and per value costs more than everything
else together. The file readers hand the records over in this form, in replay order
(a key's last record says its state, a removal that it has none), and the bulk path
(``unsafe_row.RowDecoder.decode_columns``, ``shape.StateShape.stored_columns``) reads
them with numpy and Arrow, a whole column at a time, settling which record of a key is
live as it sorts them. The general path takes the live records one at a time, in the
order a dict replay gives them (``live``, ``items``).

``binary_slices`` is the one place slices of a buffer become an Arrow ``binary`` column.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .unsafe_row import RowDecoder

__all__ = ["StateRecords", "StateRows", "binary_slices"]

#: An Arrow view holds values of at most this many bytes inline (Arrow's layout).
_INLINE = 12


@dataclass(frozen=True, eq=False)  # numpy arrays: identity, not ==
class StateRecords:
    """Records in replay order: record ``i``'s key is
    ``data[key_starts[i]:key_starts[i] + key_lengths[i]]``, its value likewise (``int64``
    arrays of one length). ``removed`` marks the records that remove their key (no
    value; ``None``: no record does). A key may come more than once: its last record
    says its state."""

    data: bytes
    key_starts: np.ndarray
    key_lengths: np.ndarray
    value_starts: np.ndarray
    value_lengths: np.ndarray
    removed: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.key_starts)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Each record's ``(key, value)`` bytes, in order (a removal's value is empty)."""
        data = self.data
        key_ends = (self.key_starts + self.key_lengths).tolist()
        value_ends = (self.value_starts + self.value_lengths).tolist()
        keys = map(slice, self.key_starts.tolist(), key_ends)
        values = map(slice, self.value_starts.tolist(), value_ends)
        return zip(map(data.__getitem__, keys), map(data.__getitem__, values), strict=True)

    def keys(self, rows: np.ndarray | slice = slice(None)) -> pa.Array:
        """The key bytes of records ``rows`` (all by default), as an Arrow column."""
        return binary_slices(self.data, self.key_starts[rows], self.key_lengths[rows])

    def take(self, rows: np.ndarray | slice) -> StateRecords:
        """Records ``rows`` of these, in that order."""
        removed = None if self.removed is None else self.removed[rows]
        return StateRecords(
            self.data, self.key_starts[rows], self.key_lengths[rows],
            self.value_starts[rows], self.value_lengths[rows],
            removed if removed is not None and removed.any() else None,
        )  # fmt: skip

    def live(self) -> StateRecords:
        """The live records, each key once, in the order a dict replaying these records
        would hold them: a key keeps the place its first put gave it, with its last put's
        value; a removal drops it (a put after that gives it a new place at the end)."""
        removed = self.removed
        if removed is None:
            # A dict's order is then each key's first record: Arrow's dictionary encoding
            # numbers the keys in that order, and each number's last record is live.
            codes = np.asarray(pc.dictionary_encode(self.keys()).indices)
            distinct = int(codes.max()) + 1 if len(codes) else 0
            if distinct == len(codes):
                return self  # no key twice
            last = np.zeros(distinct, dtype=np.int64)
            np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
            return self.take(last)
        # Each key's place in a dict, mapping to its last record: runs of puts go in with
        # one ``update``, runs of removals out with ``pop``, in order.
        index: dict[bytes, int] = {}
        names = self.keys().to_pylist()
        cuts = (np.flatnonzero(np.diff(removed)) + 1).tolist()
        for lo, hi in zip([0, *cuts], [*cuts, len(names)], strict=True):
            if removed[lo]:
                deque(map(index.pop, names[lo:hi], repeat(None)), maxlen=0)
            else:
                index.update(zip(names[lo:hi], range(lo, hi), strict=True))
        return self.take(np.fromiter(index.values(), dtype=np.int64, count=len(index)))

    def live_sorted(self, by: list[pa.Array]) -> np.ndarray | None:
        """The live records' indices, ordered by the columns ``by`` (one value per
        record: what the caller stores each record's key as), each such key once: the
        bulk path's replay. A stable sort keeps a key's records in replay order, so each
        run of equal keys ends with its last record (its value, or a removal: gone).
        ``None`` when records of different key bytes sort as one key (the general path
        then meets them one by one)."""
        n = len(self)
        if len(by) == 1:
            order = pc.sort_indices(by[0])  # stable; binary sorts by its bytes, unsigned
        else:
            names = [f"c{i}" for i in range(len(by))]
            table = pa.table(dict(zip(names, by, strict=True)))
            order = pc.sort_indices(table, sort_keys=[(name, "ascending") for name in names])
        order = np.frombuffer(order.buffers()[1], dtype=np.uint64).astype(np.int64)
        last = np.ones(n, dtype=bool)  # the last record of each run of equal keys
        if n > 1:
            tied = np.ones(n - 1, dtype=bool)
            for column in by:
                ordered = column.take(pa.array(order))
                same = pc.equal(ordered.slice(0, n - 1), ordered.slice(1)).fill_null(False)
                tied &= np.asarray(same, dtype=bool)
            last[:-1] = ~tied
            if tied.any():
                ties = np.flatnonzero(tied)
                if not pc.all(pc.equal(self.keys(order[ties]), self.keys(order[ties + 1]))).as_py():
                    return None
        live = order[last]
        if self.removed is not None:
            live = live[~self.removed[live]]
        return live

    def to_dict(self) -> dict[bytes, bytes]:
        """The live records as a dict, key bytes → value bytes."""
        return dict(self.live().items())

    @classmethod
    def concat(cls, parts: list[StateRecords]) -> StateRecords:
        """The records of ``parts``, one after another (replay order), in one buffer."""
        if not parts:
            return cls.of_mapping({})
        if len(parts) == 1:
            return parts[0]
        bases = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        removed = np.concatenate(
            [np.zeros(len(p), dtype=bool) if p.removed is None else p.removed for p in parts]
        )
        return cls(
            b"".join(p.data for p in parts),
            np.concatenate([p.key_starts + base for p, base in zip(parts, bases, strict=True)]),
            np.concatenate([p.key_lengths for p in parts]),
            np.concatenate([p.value_starts + base for p, base in zip(parts, bases, strict=True)]),
            np.concatenate([p.value_lengths for p in parts]),
            removed if removed.any() else None,
        )

    @classmethod
    def of_changes(cls, changes: Mapping[bytes, bytes | None]) -> StateRecords:
        """The records of ``changes`` (key bytes → value bytes, ``None``: a removal), in
        its order."""
        records = cls.of_mapping({k: b"" if v is None else v for k, v in changes.items()})
        removed = np.fromiter((v is None for v in changes.values()), dtype=bool, count=len(changes))
        return replace(records, removed=removed if removed.any() else None)

    @classmethod
    def of_mapping(cls, state: Mapping[bytes, bytes]) -> StateRecords:
        """The records of ``state`` (key bytes → value bytes), in its order: its keys,
        then its values, joined into one buffer."""
        keys, values = list(state), list(state.values())
        key_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        value_lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        key_starts = _starts(key_lengths, 0)
        value_starts = _starts(value_lengths, int(key_lengths.sum()))
        data = b"".join(keys) + b"".join(values)
        return cls(data, key_starts, key_lengths, value_starts, value_lengths)


@dataclass(frozen=True, eq=False)
class StateRows:
    """A partition version's state: its ``records`` and the decoders of its key and value
    rows. Iterating gives each live record's decoded ``(key row, value row)``, one at a
    time (the general path); the bulk path decodes ``records`` column-wise."""

    records: StateRecords
    keys: RowDecoder
    values: RowDecoder

    def __iter__(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        decode_key, decode_value = self.keys.decode, self.values.decode
        for key, value in self.records.live().items():
            yield decode_key(key), decode_value(value)


def _starts(lengths: np.ndarray, first: int) -> np.ndarray:
    """Where each of ``lengths`` back-to-back values starts, the first at ``first``."""
    starts = np.empty(len(lengths), dtype=np.int64)
    if len(lengths):
        starts[0] = first
        np.cumsum(lengths[:-1], out=starts[1:])
        starts[1:] += first
    return starts


def binary_slices(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """``data[starts[i]:starts[i] + lengths[i]]`` for every ``i``, as an Arrow ``binary``
    array (no nulls), with no Python object per value. Slices of one length (fixed-width
    keys, words of a format) are one numpy gather; others are written as Arrow *views*
    into ``data`` (16 bytes each: the length, then a value of at most 12 bytes inline,
    zero-padded, or else its first 4 bytes, buffer 0 and its offset), and Arrow's cast
    copies them out in C. Every slice must lie inside ``data``, and ``data`` and the
    slices together be under 2 GiB (the caller checks; views and offsets are 32-bit)."""
    n = len(starts)
    size = int(lengths[0]) if n else 0
    if not n or (lengths == size).all():
        offsets = (np.arange(n + 1, dtype=np.int64) * size).astype(np.int32)
        gathered = b""
        if size:
            buffer = np.frombuffer(data, dtype=np.uint8)
            gathered = np.lib.stride_tricks.sliding_window_view(buffer, size)[starts]
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(gathered)]
        return pa.Array.from_buffers(pa.binary(), n, buffers)
    padded = np.frombuffer(data + bytes(_INLINE), dtype=np.uint8)
    views = np.zeros((n, 4), dtype=np.int32)  # length, prefix or inline bytes, buffer, offset
    views[:, 0] = lengths
    inline = lengths <= _INLINE
    if not inline.all():
        # Any 4 bytes from any start: ``data`` padded, then a sliding window (a view).
        window = np.lib.stride_tricks.sliding_window_view(padded, 4)
        views[:, 1] = window[starts].view(np.int32)[:, 0]
        views[:, 3] = starts
    if inline.any():
        small = np.flatnonzero(inline)
        window = np.lib.stride_tricks.sliding_window_view(padded, _INLINE)
        # An inline value's bytes past its length must be zero (Arrow compares views whole).
        kept = np.arange(_INLINE) < lengths[small, None]
        inlined = np.where(kept, window[starts[small]], 0).astype(np.uint8)
        views[small, 1:] = inlined.view(np.int32)
    buffers = [None, pa.py_buffer(views), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary_view(), n, buffers).cast(pa.binary())
