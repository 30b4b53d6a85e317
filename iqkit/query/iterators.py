"""Records and iterators returned by range, prefix, scan and window queries.

Scans over a RocksDB partition hold resources (an open iterator, a reader lease on a
published version) until they are closed, and may cover far more records than fit in
memory.  :class:`KeyValueIterator` therefore stays lazy (nothing is read before the
first ``next``), closes itself as soon as it is exhausted, and can be closed early
explicitly or with ``with``, the way Kafka's ``KeyValueIterator`` is ``Closeable``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["KeyValue", "KeyValueIterator", "Windowed"]

K = TypeVar("K")
V = TypeVar("V")


class KeyValue(NamedTuple, Generic[K, V]):
    """One record of an iterator result, Kafka's ``KeyValue``.

    A tuple, so ``for key, value in iterator`` and ``dict(iterator)`` just work.
    """

    key: K
    value: V


@dataclass(frozen=True, slots=True)
class Windowed(Generic[K]):
    """The key of a window-store record: the user key plus its window, Kafka's
    ``Windowed<K>``.

    ``start`` and ``end`` are epoch milliseconds (``end`` is ``start`` plus the store's
    window size).  Two ``Windowed`` are equal when key and window are.
    """

    key: K
    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"Windowed.{name} must be epoch milliseconds as an int, got {value!r}"
                )
        if self.start > self.end:
            raise ValueError(
                f"Windowed window start {self.start} must not be after its end {self.end}"
            )


_NOTHING: Any = object()


class KeyValueIterator(Generic[K, V]):
    """A lazy, closeable iterator of :class:`KeyValue` records.

    ``source`` is any iterable of ``(key, value)`` pairs; it is not even ``iter()``-ed
    until the first record is requested.  ``on_close`` is called exactly once, when the
    iterator is closed explicitly, leaves a ``with`` block, is exhausted, or its source
    raises.  When the source iterator has a ``close()`` (generators do) it is closed too,
    so a generator's ``finally`` releases what it holds.  A closed iterator yields
    nothing more.
    """

    __slots__ = ("_closed", "_iterator", "_key_values", "_on_close", "_peeked", "_source")

    def __init__(
        self,
        source: Iterable[tuple[K, V]],
        on_close: Callable[[], object] | None = None,
    ) -> None:
        if on_close is not None and not callable(on_close):
            raise TypeError(f"on_close must be callable, got {type(on_close).__name__}")
        self._source: Iterable[tuple[K, V]] | None = source
        self._iterator: Iterator[tuple[K, V]] | None = None
        self._on_close = on_close
        self._peeked: KeyValue[K, V] = _NOTHING
        self._closed = False
        self._key_values = False

    @classmethod
    def of_key_values(
        cls, source: Iterable[KeyValue[K, V]], on_close: Callable[[], object] | None = None
    ) -> KeyValueIterator[K, V]:
        """An iterator over a source that already yields ``KeyValue``s.

        Skips the per-record check and conversion, so ``for``/``list()`` delegate to
        the source in C: how the engine returns scans of millions of rows.
        """
        it = cls(source, on_close)
        it._key_values = True
        return it

    @classmethod
    def empty(cls) -> KeyValueIterator[Any, Any]:
        """An iterator with no records (e.g. a range whose lower bound is above its
        upper bound)."""
        return cls(())

    @property
    def is_closed(self) -> bool:
        """True once the iterator was closed or exhausted."""
        return self._closed

    def _advance(self) -> KeyValue[K, V]:
        """Read the next record from the source, closing on exhaustion or error."""
        if self._iterator is None:
            assert self._source is not None
            self._iterator = iter(self._source)
        try:
            item = next(self._iterator)
            if isinstance(item, KeyValue):
                return item
            key, value = item
            return KeyValue(key, value)
        except BaseException:
            # StopIteration (exhausted), a read error or a malformed record: nothing
            # more will come, so release resources now, not whenever the caller notices.
            self.close()
            raise

    def __iter__(self) -> Iterator[KeyValue[K, V]]:
        """Iterate the remaining records.

        Returns an iterator over the source rather than ``self``, so ``for`` loops and
        ``list()`` run in C instead of calling a Python ``__next__`` per record (scans
        of millions of rows are dominated by per-row overhead). It shares this
        iterator's state: ``next(it)`` and a ``for`` loop can be mixed, and exhausting
        either closes the iterator.
        """
        head: tuple[KeyValue[K, V], ...] = ()
        if self._peeked is not _NOTHING:
            head, self._peeked = (self._peeked,), _NOTHING
        if self._closed:
            return iter(head)
        if self._iterator is None:
            assert self._source is not None
            self._iterator = iter(self._source)
        if self._key_values:
            return chain(head, self._iterator, self._close_when_reached())
        return chain(head, self._converted())

    def _close_when_reached(self) -> Iterator[KeyValue[K, V]]:
        """An empty iterator that closes this one when iteration reaches it."""
        self.close()
        yield from ()

    def _converted(self) -> Iterator[KeyValue[K, V]]:
        """Records of an arbitrary source, converted and checked one by one."""
        while not self._closed:
            try:
                yield self._advance()
            except StopIteration:
                return

    def __next__(self) -> KeyValue[K, V]:
        if self._peeked is not _NOTHING:
            item, self._peeked = self._peeked, _NOTHING
            return item
        if self._closed:
            raise StopIteration
        return self._advance()

    def peek_next_key(self) -> K | None:
        """The key of the next record without consuming it, or ``None`` at the end
        (Kafka's ``peekNextKey``)."""
        if self._peeked is _NOTHING:
            if self._closed:
                return None
            try:
                self._peeked = self._advance()
            except StopIteration:
                return None
        return self._peeked.key

    def close(self) -> None:
        """Release the underlying resources; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._peeked = _NOTHING
        iterator = self._iterator
        if iterator is None and isinstance(self._source, Iterator):
            iterator = self._source
        self._iterator = None
        self._source = None
        try:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
        finally:
            callback, self._on_close = self._on_close, None
            if callback is not None:
                callback()

    def to_list(self) -> list[KeyValue[K, V]]:
        """Drain the remaining records into a list and close the iterator."""
        try:
            return list(self)
        finally:
            self.close()

    def __enter__(self) -> KeyValueIterator[K, V]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KeyValueIterator({'closed' if self._closed else 'open'})"
