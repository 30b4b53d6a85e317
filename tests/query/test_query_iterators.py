"""KeyValue, Windowed and KeyValueIterator: laziness, closing, peeking."""

from __future__ import annotations

import dataclasses

import pytest

from iqkit.query import KeyValue, KeyValueIterator, Windowed


class Tracker:
    """A generator source that records how far it was advanced and whether it was closed."""

    def __init__(self, items):
        self.items = list(items)
        self.advanced = 0
        self.finalized = False
        self.callbacks = 0

    def gen(self):
        try:
            for item in self.items:
                self.advanced += 1
                yield item
        finally:
            self.finalized = True

    def on_close(self):
        self.callbacks += 1


# -- KeyValue / Windowed -----------------------------------------------------------------


def test_key_value_is_a_named_pair():
    kv = KeyValue("a", 1)
    assert kv.key == "a"
    assert kv.value == 1
    assert kv == ("a", 1)
    key, value = kv
    assert (key, value) == ("a", 1)
    assert repr(kv) == "KeyValue(key='a', value=1)"


def test_windowed():
    w = Windowed("k", 1000, 2000)
    assert (w.key, w.start, w.end) == ("k", 1000, 2000)
    assert repr(w) == "Windowed(key='k', start=1000, end=2000)"
    assert w == Windowed("k", 1000, 2000)
    assert w != Windowed("k", 1000, 3000)
    assert hash(w) == hash(Windowed("k", 1000, 2000))
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.start = 5


def test_windowed_validates():
    with pytest.raises(TypeError):
        Windowed("k", 1.5, 2)
    with pytest.raises(TypeError):
        Windowed("k", 0, True)
    with pytest.raises(ValueError, match="start"):
        Windowed("k", 10, 5)
    assert Windowed("k", -10, -10).start == -10


# -- KeyValueIterator --------------------------------------------------------------------


def test_is_lazy_until_first_next():
    t = Tracker([("a", 1), ("b", 2)])
    it = KeyValueIterator(t.gen(), t.on_close)
    assert t.advanced == 0
    assert next(it) == KeyValue("a", 1)
    assert t.advanced == 1


def test_does_not_call_iter_on_source_before_use():
    calls = []

    class Source:
        def __iter__(self):
            calls.append("iter")
            return iter([("a", 1)])

    it = KeyValueIterator(Source())
    assert calls == []
    assert list(it) == [KeyValue("a", 1)]
    assert calls == ["iter"]


def test_yields_key_value_records_from_pairs():
    it = KeyValueIterator(iter([("a", 1), ["b", 2], KeyValue("c", 3)]))
    items = list(it)
    assert items == [("a", 1), ("b", 2), ("c", 3)]
    assert all(isinstance(i, KeyValue) for i in items)
    assert items[1].key == "b"


def test_closes_itself_when_exhausted():
    t = Tracker([("a", 1)])
    it = KeyValueIterator(t.gen(), t.on_close)
    assert list(it) == [("a", 1)]
    assert it.is_closed
    assert t.callbacks == 1
    assert t.finalized
    assert list(it) == []
    with pytest.raises(StopIteration):
        next(it)
    it.close()
    assert t.callbacks == 1


def test_close_is_idempotent_and_calls_callback_once():
    t = Tracker([("a", 1), ("b", 2)])
    it = KeyValueIterator(t.gen(), t.on_close)
    next(it)
    it.close()
    it.close()
    assert t.callbacks == 1
    assert t.finalized  # the generator's finally ran: resources released
    with pytest.raises(StopIteration):
        next(it)
    assert t.advanced == 1


def test_close_before_iteration_never_reads():
    t = Tracker([("a", 1)])
    it = KeyValueIterator(t.gen(), t.on_close)
    it.close()
    assert t.callbacks == 1
    assert t.advanced == 0
    assert list(it) == []


def test_context_manager_closes_early_and_on_error():
    t = Tracker([("a", 1), ("b", 2)])
    with KeyValueIterator(t.gen(), t.on_close) as it:
        assert next(it).key == "a"
    assert it.is_closed
    assert t.callbacks == 1

    t2 = Tracker([("a", 1)])
    with pytest.raises(RuntimeError), KeyValueIterator(t2.gen(), t2.on_close):
        raise RuntimeError("boom")
    assert t2.callbacks == 1


def test_source_error_closes_and_propagates():
    closed = []

    def failing():
        yield ("a", 1)
        raise OSError("disk gone")

    it = KeyValueIterator(failing(), lambda: closed.append(True))
    assert next(it) == ("a", 1)
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert closed == [True]
    assert it.is_closed


def test_callback_runs_even_if_source_close_fails():
    calls = []

    class BadSource:
        def __iter__(self):
            return self

        def __next__(self):
            return ("a", 1)

        def close(self):
            raise RuntimeError("close failed")

    it = KeyValueIterator(BadSource(), lambda: calls.append(1))
    with pytest.raises(RuntimeError, match="close failed"):
        it.close()
    assert calls == [1]
    it.close()
    assert calls == [1]


def test_peek_next_key():
    t = Tracker([("a", 1), ("b", 2)])
    it = KeyValueIterator(t.gen(), t.on_close)
    assert t.advanced == 0
    assert it.peek_next_key() == "a"
    assert it.peek_next_key() == "a"
    assert t.advanced == 1
    assert next(it) == ("a", 1)
    assert it.peek_next_key() == "b"
    assert next(it) == ("b", 2)
    assert it.peek_next_key() is None
    assert it.is_closed
    assert t.callbacks == 1


def test_peek_after_close_and_close_discards_peeked():
    it = KeyValueIterator([("a", 1)])
    assert it.peek_next_key() == "a"
    it.close()
    assert it.peek_next_key() is None
    assert list(it) == []


def test_to_list_drains_and_closes():
    t = Tracker([("a", 1), ("b", 2), ("c", 3)])
    it = KeyValueIterator(t.gen(), t.on_close)
    next(it)
    assert it.to_list() == [("b", 2), ("c", 3)]
    assert it.is_closed
    assert t.callbacks == 1
    assert it.to_list() == []


def test_to_list_keeps_peeked_record():
    it = KeyValueIterator([("a", 1), ("b", 2)])
    assert it.peek_next_key() == "a"
    assert it.to_list() == [("a", 1), ("b", 2)]


def test_dict_of_iterator():
    assert dict(KeyValueIterator([("a", 1), ("b", 2)])) == {"a": 1, "b": 2}


def test_empty():
    it = KeyValueIterator.empty()
    assert it.peek_next_key() is None
    assert list(it) == []
    assert it.is_closed


def test_repr_shows_state():
    it = KeyValueIterator([("a", 1)])
    assert repr(it) == "KeyValueIterator(open)"
    it.close()
    assert repr(it) == "KeyValueIterator(closed)"


def test_on_close_must_be_callable():
    with pytest.raises(TypeError):
        KeyValueIterator([], on_close="nope")


def test_bad_items_raise():
    it = KeyValueIterator([("a", 1, 2)])
    with pytest.raises(ValueError):
        next(it)
    assert it.is_closed
