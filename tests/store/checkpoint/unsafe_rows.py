"""UnsafeRows written in Python, for tests that need many rows without a Spark query: flat
rows of numbers, booleans, strings and binaries, laid out as Spark lays them out
(store/checkpoint/unsafe_row.py's docstring), with whatever bytes ``filler`` gives in the
unused part of each fixed-width slot (Spark zeroes them; decoders must not read them).
Hypothesis strategies for such rows, and the records of a state laid back to back."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from hypothesis import strategies as st

from iqkit.store.checkpoint.state_records import StateRecords

#: struct codes of the fixed-width kinds, as Spark writes them into a slot.
CODES = {
    "boolean": "?",
    "byte": "b",
    "short": "h",
    "integer": "i",
    "long": "q",
    "float": "f",
    "double": "d",
}
NUMBERS = {
    "boolean": st.booleans(),
    "byte": st.integers(-128, 127),
    "short": st.integers(-(2**15), 2**15 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32),
    "double": st.floats(),
}
#: Text with multi-byte UTF-8 and the odd control character; bytes that may not be UTF-8.
TEXT = st.text(alphabet=st.sampled_from('aZ09 -"\\%é日本😀\x00\n\u00a0'), max_size=20)
BLOBS = st.binary(max_size=20)


def schema(kinds: list[str], names: list[str] | None = None) -> dict[str, Any]:
    """A flat StructType (Spark's JSON form) of ``kinds``, named ``names`` or f0, f1, ..."""
    names = names or [f"f{i}" for i in range(len(kinds))]
    pairs = zip(names, kinds, strict=True)
    fields = [{"name": n, "type": k, "nullable": True, "metadata": {}} for n, k in pairs]
    return {"type": "struct", "fields": fields}


def encode_row(kinds: list[str], values: list[Any], filler: bytes = bytes(8)) -> bytes:
    """One UnsafeRow of ``values`` (None: null; a string field takes ``str`` or raw
    ``bytes``). ``filler``: 8 bytes whose tail fills each fixed-width slot past its value."""
    words = (len(kinds) + 63) // 64
    fixed = bytearray(8 * (words + len(kinds)))
    variable = bytearray()
    nulls = 0
    for index, (kind, value) in enumerate(zip(kinds, values, strict=True)):
        slot = 8 * (words + index)
        if value is None:
            nulls |= 1 << index
            continue
        if kind in ("string", "binary"):
            data = value.encode() if isinstance(value, str) else value
            offset = len(fixed) + len(variable)
            fixed[slot : slot + 8] = struct.pack("<Q", offset << 32 | len(data))
            variable += data + bytes(-len(data) % 8)
            continue
        packed = struct.pack("<" + CODES[kind], value)
        fixed[slot : slot + 8] = packed + filler[len(packed) :]
    fixed[: 8 * words] = nulls.to_bytes(8 * words, "little")
    return bytes(fixed + variable)


def records_of(pairs: list[tuple[bytes, bytes | None]]) -> StateRecords:
    """Records of ``pairs`` in replay order (a value None: a removal), laid out key,
    value, key, value, ..."""
    data = b"".join(k + (v or b"") for k, v in pairs)
    sizes = [(len(k), len(v or b"")) for k, v in pairs]
    lengths = np.array(sizes, dtype=np.int64).reshape(-1, 2)
    starts = np.cumsum(lengths.sum(axis=1)) - lengths.sum(axis=1)
    removed = np.array([v is None for _, v in pairs], dtype=bool)
    return StateRecords(
        data, starts, lengths[:, 0], starts + lengths[:, 0], lengths[:, 1],
        removed if removed.any() else None,
    )  # fmt: skip
