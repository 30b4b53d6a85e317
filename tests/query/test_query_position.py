"""Position and PositionBound: value semantics, validation and merge algebra."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iqkit.query import Position, PositionBound

topics = st.sampled_from(["in", "other", "t-2", ""])
offsets = st.integers(min_value=-1, max_value=10**12)
maps = st.dictionaries(
    topics, st.dictionaries(st.integers(min_value=0, max_value=8), offsets, max_size=5), max_size=4
)
positions = maps.map(Position.from_map)


def components(p: Position) -> dict[tuple[str, int], int]:
    return {(t, part): o for t, parts in p.to_map().items() for part, o in parts.items()}


# -- construction and accessors -----------------------------------------------------------


def test_empty_position():
    p = Position.empty()
    assert p.is_empty
    assert p.topics == set()
    assert p.to_map() == {}
    assert p.partition_positions("in") == {}
    assert p.offset("in", 0) is None
    assert repr(p) == "Position({})"


def test_from_map_and_accessors():
    p = Position.from_map({"in": {1: 3, 0: 5}, "b": {2: -1}})
    assert not p.is_empty
    assert p.topics == {"in", "b"}
    assert p.partition_positions("in") == {0: 5, 1: 3}
    assert p.partition_positions("missing") == {}
    assert p.offset("in", 0) == 5
    assert p.offset("in", 7) is None
    assert p.offset("b", 2) == -1
    assert p.offset("nope", 0) is None
    assert p.to_map() == {"b": {2: -1}, "in": {0: 5, 1: 3}}


def test_repr_is_sorted_and_readable():
    p = Position.from_map({"in": {1: 3, 0: 5}})
    assert repr(p) == "Position({'in': {0: 5, 1: 3}})"


def test_direct_constructor_is_refused():
    with pytest.raises(TypeError, match=r"Position\.empty"):
        Position()


def test_from_map_is_a_deep_copy():
    source = {"in": {0: 5}}
    p = Position.from_map(source)
    source["in"][0] = 99
    source["in"][1] = 1
    source["new"] = {0: 1}
    assert p.to_map() == {"in": {0: 5}}


def test_returned_collections_are_copies():
    p = Position.from_map({"in": {0: 5}})
    p.to_map()["in"][0] = 1
    p.partition_positions("in")[0] = 1
    p.topics.add("x")
    assert p == Position.from_map({"in": {0: 5}})
    assert p.topics == {"in"}


def test_empty_topic_is_dropped():
    assert Position.from_map({"t": {}}) == Position.empty()
    assert Position.from_map({"t": {}}).is_empty


@pytest.mark.parametrize(
    ("m", "error"),
    [
        ({"t": {0: -2}}, ValueError),
        ({"t": {-1: 0}}, ValueError),
        ({"t": {0: 1.5}}, TypeError),
        ({"t": {0: "3"}}, TypeError),
        ({"t": {0: True}}, TypeError),
        ({"t": {True: 1}}, TypeError),
        ({"t": {"0": 1}}, TypeError),
        ({1: {0: 1}}, TypeError),
        ({"t": [1, 2]}, TypeError),
        ([("t", {0: 1})], TypeError),
    ],
)
def test_from_map_validates(m, error):
    with pytest.raises(error):
        Position.from_map(m)


def test_offset_minus_one_is_allowed():
    assert Position.from_map({"t": {0: -1}}).offset("t", 0) == -1


def test_index_like_ints_are_accepted_as_plain_ints():
    class Int64:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    p = Position.from_map({"t": {Int64(1): Int64(7)}})
    assert p.to_map() == {"t": {1: 7}}
    assert type(p.offset("t", 1)) is int


# -- with_component -----------------------------------------------------------------------


def test_with_component_adds_and_returns_new_object():
    p = Position.empty()
    q = p.with_component("in", 0, 5)
    assert q is not p
    assert p.is_empty
    assert q.to_map() == {"in": {0: 5}}
    r = q.with_component("in", 1, 2).with_component("x", 0, 0)
    assert r.to_map() == {"in": {0: 5, 1: 2}, "x": {0: 0}}
    assert q.to_map() == {"in": {0: 5}}


def test_with_component_never_lowers():
    p = Position.from_map({"in": {0: 5}})
    assert p.with_component("in", 0, 3).offset("in", 0) == 5
    assert p.with_component("in", 0, 9).offset("in", 0) == 9
    assert p.with_component("in", 0, 3) is not p


def test_with_component_validates():
    p = Position.empty()
    with pytest.raises(ValueError):
        p.with_component("in", -1, 0)
    with pytest.raises(ValueError):
        p.with_component("in", 0, -5)
    with pytest.raises(TypeError):
        p.with_component(None, 0, 0)
    with pytest.raises(TypeError):
        p.with_component("in", 0, 1.0)


@given(positions, topics, st.integers(0, 8), offsets)
def test_with_component_property(p, topic, partition, offset):
    q = p.with_component(topic, partition, offset)
    before = p.offset(topic, partition)
    expected = offset if before is None else max(before, offset)
    assert q.offset(topic, partition) == expected
    # nothing else changes
    others = {k: v for k, v in components(q).items() if k != (topic, partition)}
    assert others == {k: v for k, v in components(p).items() if k != (topic, partition)}


# -- merge --------------------------------------------------------------------------------


def test_merge_example():
    a = Position.from_map({"in": {0: 5, 1: 1}, "a": {0: 1}})
    b = Position.from_map({"in": {0: 3, 1: 4, 2: 0}, "b": {3: 3}})
    assert a.merge(b).to_map() == {"in": {0: 5, 1: 4, 2: 0}, "a": {0: 1}, "b": {3: 3}}


def test_merge_none_is_noop_and_new_object():
    a = Position.from_map({"in": {0: 5}})
    m = a.merge(None)
    assert m == a
    assert m is not a


def test_merge_rejects_non_positions():
    with pytest.raises(TypeError):
        Position.empty().merge({"in": {0: 1}})


@given(positions, positions)
def test_merge_is_commutative(a, b):
    assert a.merge(b) == b.merge(a)


@given(positions, positions, positions)
def test_merge_is_associative(a, b, c):
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@given(positions)
def test_merge_is_idempotent_and_has_identities(a):
    assert a.merge(a) == a
    assert a.merge(None) == a
    assert a.merge(Position.empty()) == a
    assert Position.empty().merge(a) == a


@given(positions, positions)
def test_merge_dominates_inputs_and_is_their_max(a, b):
    m = components(a.merge(b))
    ca, cb = components(a), components(b)
    assert set(m) == set(ca) | set(cb)
    for key, offset in m.items():
        assert offset >= ca.get(key, -1)
        assert offset >= cb.get(key, -1)
        assert offset == max(ca.get(key, -1), cb.get(key, -1))


@given(maps)
def test_from_map_round_trips(m):
    p = Position.from_map(m)
    assert p.to_map() == {t: parts for t, parts in m.items() if parts}
    assert Position.from_map(p.to_map()) == p


# -- value semantics ----------------------------------------------------------------------


def test_equality_and_hash_ignore_construction_order():
    a = Position.from_map({"x": {1: 1, 0: 0}, "a": {0: 2}})
    b = (
        Position.empty()
        .with_component("a", 0, 2)
        .with_component("x", 0, 0)
        .with_component("x", 1, 1)
    )
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != Position.from_map({"x": {1: 1, 0: 0}})
    assert a != {"x": {1: 1, 0: 0}, "a": {0: 2}}


def test_position_is_immutable():
    p = Position.from_map({"in": {0: 5}})
    with pytest.raises(AttributeError):
        p._components = ()
    with pytest.raises(AttributeError):
        p.is_empty = True
    with pytest.raises(AttributeError):
        del p._components
    assert p.to_map() == {"in": {0: 5}}


def test_position_is_not_iterable():
    with pytest.raises(TypeError):
        iter(Position.empty())


def test_position_pickles_and_copies():
    p = Position.from_map({"in": {0: 5}})
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.copy(p) == p
    assert copy.deepcopy(p) == p


# -- PositionBound ------------------------------------------------------------------------


def test_unbounded():
    b = PositionBound.unbounded()
    assert b.is_unbounded
    assert b.position == Position.empty()
    assert repr(b) == "PositionBound(unbounded)"


def test_at():
    p = Position.from_map({"in": {0: 5}})
    b = PositionBound.at(p)
    assert not b.is_unbounded
    assert b.position == p
    assert repr(b) == "PositionBound(at=Position({'in': {0: 5}}))"


def test_at_empty_equals_unbounded():
    assert PositionBound.at(Position.empty()) == PositionBound.unbounded()
    assert PositionBound.at(Position.empty()).is_unbounded
    assert hash(PositionBound.at(Position.empty())) == hash(PositionBound.unbounded())


def test_bound_equality():
    p = Position.from_map({"in": {0: 5}})
    assert PositionBound.at(p) == PositionBound.at(Position.from_map({"in": {0: 5}}))
    assert PositionBound.at(p) != PositionBound.unbounded()
    assert PositionBound.at(p) != PositionBound.at(p.with_component("in", 0, 6))
    assert PositionBound.at(p) != p
    assert len({PositionBound.at(p), PositionBound.at(p), PositionBound.unbounded()}) == 2


def test_bound_validation_and_immutability():
    with pytest.raises(TypeError):
        PositionBound.at({"in": {0: 1}})
    with pytest.raises(TypeError):
        PositionBound()
    b = PositionBound.unbounded()
    with pytest.raises(AttributeError):
        b._position = Position.from_map({"in": {0: 1}})
    assert b.is_unbounded
    assert pickle.loads(pickle.dumps(b)) == b
