"""Whole Arrow columns of serialized keys and values, decoded and encoded at once.

The serdes' bulk paths (``Serde.decode_arrow`` and ``serialize_arrow`` in
:mod:`iqkit.store.encoding.serdes`) share these: Arrow ``binary`` arrays built over many byte
strings in one call, numpy views of their buffers, fixed-width big-endian numbers read
without a Python object per value. Each serde keeps the facts about its own values; this
module only moves bytes. pyarrow and numpy are imported inside the functions, so
importing the serdes (every store operation does) never imports them.

Arrays are built from their buffers (``from_buffers``), not by ``pa.array``, wherever a
commit builds them: quirk of pyarrow, ``pa.array`` (and ``pa.scalar``) of anything
imports pandas, to ask whether the input is a pandas object, which costs a writing
process more than the rest of its first commit (docs/DECISIONS.md "Start-up").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


def arrow_numbers(values: pa.Array) -> Any:
    """The numpy view of a primitive Arrow column's values (null slots hold anything)."""
    import numpy as np

    dtype = np.dtype(values.type.to_pandas_dtype())
    raw = np.frombuffer(values.buffers()[1], dtype=dtype)
    return raw[values.offset : values.offset + len(values)]


def valid_mask(values: pa.Array) -> Any:
    import pyarrow.compute as pc

    return pc.is_valid(values).to_numpy(zero_copy_only=False)


def fixed_width_binary(values: pa.Array, big_endian: Any, width: int) -> pa.Array:
    """A ``binary`` array of ``width``-byte values from a numpy array, with the nulls of
    ``values`` (one buffer of bytes, offsets every ``width``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(values)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    validity = pc.is_valid(values).buffers()[1] if values.null_count else None
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(big_endian))],
        null_count=values.null_count,
    )


def numbers_array(numbers: Any, arrow_type: pa.DataType) -> pa.Array:
    """A primitive Arrow column of the values of a one-dimensional numpy array whose
    dtype is ``arrow_type``'s (native byte order), without nulls."""
    import numpy as np
    import pyarrow as pa

    values = np.ascontiguousarray(numbers)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def bools_array(n: int, value: bool) -> pa.Array:
    """A ``bool`` column of ``n`` times ``value``."""
    import pyarrow as pa

    bits = (b"\xff" if value else b"\x00") * ((n + 7) // 8)
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])


def binary_array(datas: Sequence[bytes]) -> pa.Array | pa.ChunkedArray:
    """``datas`` as an Arrow ``binary`` array: as ``pa.array(datas, pa.binary())`` gives
    (past 2 GiB in all, as it does: chunks)."""
    from itertools import accumulate

    import numpy as np
    import pyarrow as pa

    lengths = list(map(len, datas))
    if sum(lengths) >= 2**31:  # binary offsets are 32-bit
        return pa.array(datas, pa.binary())
    offsets = np.fromiter(accumulate(lengths, initial=0), np.int32, len(lengths) + 1)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(datas))]
    return pa.Array.from_buffers(pa.binary(), len(lengths), buffers)


def utf8_array(binary: pa.Array) -> pa.Array | None:
    """A ``binary`` array's values as ``string`` (the same buffers), or ``None`` when one
    is not valid UTF-8 (as ``bytes.decode`` decides). Arrow's own validation checks the
    UTF-8 here, not a ``cast``, which would import ``pyarrow.compute``."""
    import pyarrow as pa

    text = pa.Array.from_buffers(
        pa.string(), len(binary), binary.buffers(), binary.null_count, binary.offset
    )
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return text


def binary_scalar(data: bytes) -> pa.Scalar:
    """``data`` as an Arrow ``binary`` scalar (as ``pa.scalar(data, pa.binary())``)."""
    return binary_array([data])[0]


def _binary_buffers(datas: Sequence[bytes]) -> tuple[pa.Array, Any, Any] | None:
    """``datas`` as an Arrow ``binary`` array, plus numpy views of its offsets and bytes
    (``None`` past 2 GiB, where ``pa.array`` returns chunks)."""
    import numpy as np
    import pyarrow as pa

    array = binary_array(datas)
    if not isinstance(array, pa.BinaryArray):
        return None
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, len(datas) + 1)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    return array, offsets, data


def binary_after(datas: Sequence[bytes], offset: int) -> pa.Array | None:
    """``data[offset:]`` of every ``data`` as one ``binary`` array, without a Python
    slice per value (``None`` when a value is shorter than ``offset``, or past 2 GiB)."""
    import numpy as np
    import pyarrow as pa

    binary = _binary_buffers(datas)
    if binary is None:
        return None
    array, offsets, data = binary
    if not offset:
        return array
    n = len(datas)
    if (np.diff(offsets) < offset).any():
        return None
    keep = np.ones(int(offsets[-1]), dtype=bool)
    for i in range(offset):
        keep[offsets[:-1] + i] = False
    stripped = offsets - np.arange(0, offset * (n + 1), offset, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(stripped), pa.py_buffer(data[: int(offsets[-1])][keep])],
    )


def decode_fixed_arrow(
    datas: Sequence[bytes], offset: int, dtype: str, arrow_type: pa.DataType
) -> pa.Array | None:
    """``data[offset:]`` of equal-width big-endian numbers (numpy ``dtype``, e.g.
    ``">i4"``) as one Arrow column, or ``None`` when some value has another width."""
    import numpy as np

    binary = _binary_buffers(datas)
    if binary is None:
        return None
    _, offsets, data = binary
    n = len(datas)
    width = offset + np.dtype(dtype).itemsize
    if not (np.diff(offsets) == width).all():
        return None
    numbers = data[: n * width].reshape(n, width)[:, offset:].copy().view(dtype)
    # astype to native order swaps bytes (NaN payloads and -0.0 kept, as struct does)
    return numbers_array(numbers.reshape(n).astype(dtype.replace(">", "=")), arrow_type)
