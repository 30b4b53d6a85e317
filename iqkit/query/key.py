"""Point lookups: one key (Kafka's ``KeyQuery``) or several at once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from .base import _ImmutableQuery, require_key

__all__ = ["KeyQuery", "MultiKeyQuery"]

K = TypeVar("K")
V = TypeVar("V")


class KeyQuery(_ImmutableQuery[V | None], Generic[K, V]):
    """Look up one key; the result is its value, or ``None`` when the key is absent.

    >>> KeyQuery.with_key("alice")
    KeyQuery(key='alice')
    """

    __slots__ = ("_key", "_skip_cache")
    _FIELDS = ("key", "skip_cache")
    _FACTORIES = "KeyQuery.with_key(key)"
    _key: K
    _skip_cache: bool

    @classmethod
    def with_key(cls, key: K) -> KeyQuery[K, Any]:
        """A query for the value of ``key`` (``None`` raises ``ValueError``)."""
        require_key(key, "KeyQuery")
        return cls._of(key, False)

    @classmethod
    def _of(cls, key: Any, skip_cache: bool) -> KeyQuery[Any, Any]:
        # ``_build`` with the two fields set directly: a notebook loop builds one per key.
        obj = object.__new__(cls)
        object.__setattr__(obj, "_key", key)
        object.__setattr__(obj, "_skip_cache", skip_cache)
        return obj

    def skip_cache(self) -> KeyQuery[K, V]:
        """A copy that reads the store itself, bypassing any cache layer (Kafka's
        ``KeyQuery.skipCache``), e.g. to check what was really committed."""
        return self._of(self._key, True)

    @property
    def key(self) -> K:
        """The key to look up."""
        return self._key

    @property
    def is_skip_cache(self) -> bool:
        """True when the cache layer must be bypassed."""
        return self._skip_cache

    def __repr__(self) -> str:
        extra = ", skip_cache=True" if self._skip_cache else ""
        return f"KeyQuery(key={self._key!r}{extra})"


def _dedupe(keys: Iterable[object]) -> tuple[Any, ...]:
    """Keys in first-seen order without duplicates; unhashable keys (JSON lists) are
    compared by equality instead of hashing."""
    seen: set[object] = set()
    out: list[object] = []
    for i, key in enumerate(keys):
        require_key(key, "MultiKeyQuery", f"key (at index {i})")
        try:
            if key in seen:
                continue
            seen.add(key)
        except TypeError:
            if any(key == other for other in out):
                continue
        out.append(key)
    return tuple(out)


class MultiKeyQuery(_ImmutableQuery[dict[K, V]], Generic[K, V]):
    """Look up several keys at once; the result is a dict with the keys that were found.

    Duplicate keys are dropped, keeping the first occurrence's place; an empty key list
    is allowed and yields an empty dict.
    """

    __slots__ = ("_keys", "_skip_cache")
    _FIELDS = ("keys", "skip_cache")
    _FACTORIES = "MultiKeyQuery.with_keys(keys)"
    _keys: tuple[K, ...]
    _skip_cache: bool

    @classmethod
    def with_keys(cls, keys: Iterable[K]) -> MultiKeyQuery[K, Any]:
        """A query for the values of ``keys`` (any iterable; ``None`` keys raise
        ``ValueError``).

        A ``str`` or ``bytes`` is refused with ``TypeError``: iterating it would look up
        each character, which is never what was meant (wrap it: ``with_keys(["ab"])``).
        """
        if isinstance(keys, str | bytes | bytearray | memoryview):
            raise TypeError(
                f"MultiKeyQuery.with_keys expects an iterable of keys, got the single "
                f"{type(keys).__name__} {keys!r}; did you mean with_keys([{keys!r}])?"
            )
        if keys is None:
            raise ValueError("MultiKeyQuery: keys must not be None")
        try:
            iterator = iter(keys)
        except TypeError:
            raise TypeError(
                f"MultiKeyQuery.with_keys expects an iterable of keys, got {type(keys).__name__}"
            ) from None
        return cls._build(keys=_dedupe(iterator), skip_cache=False)

    def skip_cache(self) -> MultiKeyQuery[K, V]:
        """A copy that reads the store itself, bypassing any cache layer."""
        return self._replace(skip_cache=True)

    @property
    def keys(self) -> tuple[K, ...]:
        """The keys to look up, in the order given, without duplicates."""
        return self._keys

    @property
    def is_skip_cache(self) -> bool:
        """True when the cache layer must be bypassed."""
        return self._skip_cache

    def __repr__(self) -> str:
        extra = ", skip_cache=True" if self._skip_cache else ""
        return f"MultiKeyQuery(keys={self._keys!r}{extra})"
