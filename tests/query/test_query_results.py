"""FailureReason, ResultOrder, QueryResult and StateQueryResult."""

from __future__ import annotations

import copy
import pickle

import pytest

from iqkit.query import (
    FailureReason,
    KeyQuery,
    KeyValueIterator,
    Position,
    PositionBound,
    QueryResult,
    ResultOrder,
    StateQueryResult,
)

P1 = Position.from_map({"in": {0: 5}})
P2 = Position.from_map({"in": {0: 3, 1: 7}, "b": {0: 1}})


def test_enums_have_the_kafka_members():
    assert [r.name for r in FailureReason] == [
        "UNKNOWN_QUERY_TYPE",
        "NOT_ACTIVE",
        "NOT_UP_TO_BOUND",
        "NOT_PRESENT",
        "DOES_NOT_EXIST",
        "STORE_EXCEPTION",
    ]
    assert [o.name for o in ResultOrder] == ["ANY", "ASCENDING", "DESCENDING"]
    assert FailureReason("NOT_ACTIVE") is FailureReason.NOT_ACTIVE
    assert ResultOrder("DESCENDING") is ResultOrder.DESCENDING


# -- QueryResult success ------------------------------------------------------------------


def test_success():
    r = QueryResult.for_result(42)
    assert r.is_success and not r.is_failure
    assert r.result == 42
    assert r.position == Position.empty()
    assert r.execution_info == []
    with pytest.raises(ValueError, match="did not fail"):
        _ = r.failure_reason
    with pytest.raises(ValueError, match="did not fail"):
        _ = r.failure_message


def test_none_is_a_successful_result():
    r = QueryResult.for_result(None)
    assert r.is_success
    assert r.result is None


def test_success_with_position_and_info():
    r = QueryResult.for_result({"a": 1}, position=P1, execution_info=["one", "two"])
    assert r.position == P1
    assert r.execution_info == ["one", "two"]
    r.execution_info.append("three")
    assert r.execution_info == ["one", "two"]


def test_single_string_execution_info_is_one_line():
    r = QueryResult.for_result(1, execution_info="Handled in cache in 5ns")
    assert r.execution_info == ["Handled in cache in 5ns"]
    assert r.with_execution_info("next").execution_info == ["Handled in cache in 5ns", "next"]


def test_factory_validation():
    with pytest.raises(TypeError):
        QueryResult.for_result(1, position={"in": {0: 1}})
    with pytest.raises(TypeError):
        QueryResult.for_result(1, execution_info=[1])
    with pytest.raises(TypeError):
        QueryResult.for_failure("NOT_PRESENT", "x")
    with pytest.raises(TypeError):
        QueryResult.for_failure(FailureReason.NOT_PRESENT, None)
    with pytest.raises(TypeError):
        QueryResult()


# -- QueryResult failure ------------------------------------------------------------------


def test_failure():
    r = QueryResult.for_failure(FailureReason.NOT_PRESENT, "no data yet", position=P1)
    assert r.is_failure and not r.is_success
    assert r.failure_reason is FailureReason.NOT_PRESENT
    assert r.failure_message == "no data yet"
    assert r.position == P1
    with pytest.raises(ValueError, match="NOT_PRESENT: no data yet"):
        _ = r.result


def test_for_unknown_query_type_names_query_type_and_store():
    q = KeyQuery.with_key("a")
    r = QueryResult.for_unknown_query_type(q, "totals", position=P1)
    assert r.failure_reason is FailureReason.UNKNOWN_QUERY_TYPE
    assert "KeyQuery" in r.failure_message
    assert "'totals'" in r.failure_message
    assert r.position == P1

    class Store:
        name = "windows"

    msg = QueryResult.for_unknown_query_type(q, Store()).failure_message
    assert "'windows'" in msg and "Store" in msg


def test_not_up_to_bound():
    bound = PositionBound.at(Position.from_map({"in": {0: 9}}))
    r = QueryResult.not_up_to_bound(P1, bound, 2, execution_info=["checked bound"])
    assert r.failure_reason is FailureReason.NOT_UP_TO_BOUND
    assert r.position == P1
    assert r.execution_info == ["checked bound"]
    assert r.failure_message == (
        "For store partition 2, the current position Position({'in': {0: 5}}) is not yet "
        "up to the bound PositionBound(at=Position({'in': {0: 9}}))"
    )
    # a bare Position is accepted as the bound
    same = QueryResult.not_up_to_bound(P1, bound.position, 2)
    assert same.failure_message == r.failure_message
    with pytest.raises(TypeError):
        QueryResult.not_up_to_bound(P1, {"in": {0: 9}}, 2)


# -- QueryResult copies -------------------------------------------------------------------


def test_with_position_returns_a_copy():
    r = QueryResult.for_result(1, execution_info=["a"])
    s = r.with_position(P1)
    assert s is not r
    assert s.position == P1 and r.position == Position.empty()
    assert s.result == 1 and s.execution_info == ["a"]
    assert s.with_position(None).position == Position.empty()


def test_with_execution_info_appends_to_a_copy():
    r = QueryResult.for_failure(FailureReason.STORE_EXCEPTION, "boom", execution_info=["a"])
    s = r.with_execution_info(["b", "c"])
    assert s.execution_info == ["a", "b", "c"]
    assert r.execution_info == ["a"]
    assert s.failure_reason is FailureReason.STORE_EXCEPTION
    assert s.failure_message == "boom"


def test_swap_result():
    r = QueryResult.for_result(b"\x01", position=P1, execution_info=["bytes"])
    s = r.swap_result(1)
    assert (s.result, s.position, s.execution_info) == (1, P1, ["bytes"])
    assert r.result == b"\x01"
    with pytest.raises(ValueError, match="NOT_ACTIVE"):
        QueryResult.for_failure(FailureReason.NOT_ACTIVE, "old").swap_result(1)


def test_query_result_is_immutable():
    r = QueryResult.for_result(1)
    with pytest.raises(AttributeError):
        r._result = 2
    with pytest.raises(AttributeError):
        r.position = P1
    assert r.result == 1 and r.position == Position.empty()


def test_query_result_copies_and_pickles():
    r = QueryResult.for_failure(FailureReason.NOT_PRESENT, "x", position=P1, execution_info="i")
    for clone in (copy.copy(r), pickle.loads(pickle.dumps(r))):
        assert clone.failure_reason is FailureReason.NOT_PRESENT
        assert (clone.failure_message, clone.position, clone.execution_info) == ("x", P1, ["i"])


def test_query_result_repr():
    assert repr(QueryResult.for_result(5)) == "QueryResult(result=5, position=Position({}))"
    f = QueryResult.for_failure(FailureReason.NOT_PRESENT, "none", position=P1)
    assert repr(f) == (
        "QueryResult(failure=NOT_PRESENT, message='none', position=Position({'in': {0: 5}}))"
    )
    with_info = QueryResult.for_result(5, execution_info=["a", "b"])
    assert repr(with_info).endswith("execution_info=2 lines)")
    long = repr(QueryResult.for_result("x" * 10_000))
    assert len(long) < 200


# -- StateQueryResult ---------------------------------------------------------------------


def test_empty_state_query_result():
    s = StateQueryResult()
    assert s.partition_results == {}
    assert s.position == Position.empty()
    assert s.only_partition_result() is None
    assert repr(s) == "StateQueryResult({}, position=Position({}))"


def test_partition_results_is_a_sorted_copy():
    s = StateQueryResult()
    a, b = QueryResult.for_result(1), QueryResult.for_result(2)
    s.add_result(3, a)
    s.add_result(1, b)
    results = s.partition_results
    assert list(results) == [1, 3]
    assert results[3] is a and results[1] is b
    results.clear()
    assert len(s.partition_results) == 2


def test_add_result_replaces_and_validates():
    s = StateQueryResult()
    s.add_result(0, QueryResult.for_result(1))
    s.add_result(0, QueryResult.for_result(2))
    assert s.partition_results[0].result == 2
    with pytest.raises(ValueError):
        s.add_result(-1, QueryResult.for_result(1))
    with pytest.raises(ValueError):
        s.add_result("0", QueryResult.for_result(1))
    with pytest.raises(TypeError):
        s.add_result(1, 5)


def test_position_merges_every_partition_including_failures():
    s = StateQueryResult()
    s.add_result(0, QueryResult.for_result(1, position=P1))
    s.add_result(1, QueryResult.for_failure(FailureReason.NOT_UP_TO_BOUND, "x", position=P2))
    s.add_result(2, QueryResult.for_result(None))
    assert s.position == P1.merge(P2)
    assert s.position.to_map() == {"in": {0: 5, 1: 7}, "b": {0: 1}}


def test_only_partition_result_picks_the_one_meaningful_result():
    s = StateQueryResult()
    s.add_result(0, QueryResult.for_result(None))
    hit = QueryResult.for_result("v")
    s.add_result(1, hit)
    s.add_result(2, QueryResult.for_result(None))
    assert s.only_partition_result() is hit


def test_only_partition_result_counts_failures():
    s = StateQueryResult()
    failure = QueryResult.for_failure(FailureReason.NOT_PRESENT, "x")
    s.add_result(0, QueryResult.for_result(None))
    s.add_result(4, failure)
    assert s.only_partition_result() is failure
    s.add_result(2, QueryResult.for_result(0))  # 0 is not None: meaningful
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        s.only_partition_result()


def test_only_partition_result_none_when_nothing_meaningful():
    s = StateQueryResult()
    s.add_result(0, QueryResult.for_result(None))
    s.add_result(1, QueryResult.for_result(None))
    assert s.only_partition_result() is None


def test_only_partition_result_with_iterators_on_several_partitions():
    s = StateQueryResult()
    s.add_result(0, QueryResult.for_result(KeyValueIterator.empty()))
    s.add_result(1, QueryResult.for_result(KeyValueIterator.empty()))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        s.only_partition_result()


def test_state_query_result_repr():
    s = StateQueryResult()
    s.add_result(1, QueryResult.for_failure(FailureReason.NOT_PRESENT, "x"))
    s.add_result(0, QueryResult.for_result(1, position=P1))
    assert repr(s) == (
        "StateQueryResult({0: success, 1: NOT_PRESENT}, position=Position({'in': {0: 5}}))"
    )
