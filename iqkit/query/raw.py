"""Queries on serialized bytes, bypassing the store's serdes (KIP-796's examples).

Useful to inspect what a pipeline really wrote, to debug a serde mismatch, or to read a
store whose value format iqkit does not know.  Keys and values go in and come out as
``bytes``.
"""

from __future__ import annotations

from .base import _ImmutableQuery, require_key
from .iterators import KeyValueIterator

__all__ = ["RawKeyQuery", "RawScanQuery"]


class RawKeyQuery(_ImmutableQuery[bytes | None]):
    """Look up one serialized key; the result is the serialized value or ``None``."""

    __slots__ = ("_key",)
    _FIELDS = ("key",)
    _FACTORIES = "RawKeyQuery.with_key(key_bytes)"
    _key: bytes

    @classmethod
    def with_key(cls, key: bytes | bytearray | memoryview) -> RawKeyQuery:
        """A query for the value stored under the serialized ``key``.

        ``bytearray`` and ``memoryview`` are copied to ``bytes`` (so later changes to
        them cannot alter the query); anything else, ``str`` included, is a
        ``TypeError``: a raw query needs the exact bytes, not text to be encoded somehow.
        """
        require_key(key, "RawKeyQuery")
        if not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(
                f"RawKeyQuery: key must be bytes, got {type(key).__name__} {key!r}; "
                f"use KeyQuery for typed keys"
            )
        return cls._build(key=bytes(key))

    @property
    def key(self) -> bytes:
        """The serialized key."""
        return self._key

    def __repr__(self) -> str:
        return f"RawKeyQuery(key={self._key!r})"


class RawScanQuery(_ImmutableQuery[KeyValueIterator[bytes, bytes]]):
    """Every record of the partition as serialized ``(key, value)`` bytes, in key-byte
    order."""

    __slots__ = ()
    _FIELDS = ()
    _FACTORIES = "RawScanQuery.scan()"

    @classmethod
    def scan(cls) -> RawScanQuery:
        """A query for all records."""
        return cls._build()

    def __repr__(self) -> str:
        return "RawScanQuery()"
