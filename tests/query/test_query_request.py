"""StateQueryRequest, its InStore builder, store-name validation, LagInfo, exports."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle

import pytest

import iqkit.query
from iqkit.query import (
    InStore,
    KeyQuery,
    LagInfo,
    Position,
    PositionBound,
    RangeQuery,
    StateQueryRequest,
    validate_store_name,
)

Q = KeyQuery.with_key("a")


def request():
    return StateQueryRequest.in_store("totals").with_query(Q)


def test_progressive_builder_and_defaults():
    step = StateQueryRequest.in_store("totals")
    assert isinstance(step, InStore)
    assert step.store_name == "totals"
    r = step.with_query(Q)
    assert isinstance(r, StateQueryRequest)
    assert r.store_name == "totals"
    assert r.query is Q
    assert r.position_bound == PositionBound.unbounded()
    assert r.is_all_partitions
    assert not r.is_require_active
    assert not r.execution_info_enabled
    with pytest.raises(ValueError, match="all partitions"):
        _ = r.partitions


def test_with_query_requires_a_query():
    with pytest.raises(TypeError, match="Query"):
        StateQueryRequest.in_store("t").with_query("get a")
    with pytest.raises(TypeError):
        StateQueryRequest.in_store("t").with_query(None)


def test_constructors_are_not_public():
    with pytest.raises(TypeError, match="in_store"):
        StateQueryRequest()


def test_with_partitions():
    r = request()
    p = r.with_partitions({2, 0})
    assert p is not r
    assert not p.is_all_partitions
    assert p.partitions == {0, 2}
    assert r.is_all_partitions
    assert request().with_partitions([1, 1, 3]).partitions == frozenset({1, 3})
    assert request().with_partitions(range(3)).partitions == {0, 1, 2}
    empty = request().with_partitions(set())
    assert not empty.is_all_partitions and empty.partitions == frozenset()
    back = p.with_all_partitions()
    assert back.is_all_partitions and p.partitions == {0, 2}


@pytest.mark.parametrize("bad", [{-1}, {1.0}, {"1"}, {True}, {None}])
def test_with_partitions_rejects_non_partitions(bad):
    with pytest.raises(ValueError, match="ints >= 0"):
        request().with_partitions(bad)


@pytest.mark.parametrize("bad", [3, "12", None])
def test_with_partitions_requires_a_collection(bad):
    with pytest.raises(TypeError):
        request().with_partitions(bad)


def test_partitions_snapshot_the_input():
    parts = {0}
    r = request().with_partitions(parts)
    parts.add(5)
    assert r.partitions == {0}


def test_flags_return_copies():
    r = request()
    a = r.require_active()
    e = r.enable_execution_info()
    assert a.is_require_active and not r.is_require_active
    assert e.execution_info_enabled and not r.execution_info_enabled
    assert not a.execution_info_enabled and not e.is_require_active


def test_with_position_bound():
    pos = Position.from_map({"in": {0: 5}})
    r = request()
    b = r.with_position_bound(PositionBound.at(pos))
    assert b.position_bound == PositionBound.at(pos)
    assert r.position_bound.is_unbounded
    assert r.with_position_bound(pos).position_bound == PositionBound.at(pos)
    with pytest.raises(TypeError):
        r.with_position_bound({"in": {0: 5}})


def test_request_is_an_immutable_value():
    r = request().with_partitions({1}).require_active()
    with pytest.raises(AttributeError):
        r._store_name = "other"
    with pytest.raises(AttributeError):
        r.query = RangeQuery.with_no_bounds()
    assert r == request().require_active().with_partitions({1})
    assert hash(r) == hash(request().require_active().with_partitions({1}))
    assert r != request()
    assert pickle.loads(pickle.dumps(r)) == r
    assert copy.deepcopy(r) == r
    step = StateQueryRequest.in_store("x")
    with pytest.raises(AttributeError):
        step._store_name = "y"
    assert step == StateQueryRequest.in_store("x")
    assert copy.copy(step) == step


def test_request_repr():
    assert repr(StateQueryRequest.in_store("t")) == "InStore('t')"
    assert repr(request()) == (
        "StateQueryRequest(store='totals', query=KeyQuery(key='a'), partitions=ALL, "
        "bound=PositionBound(unbounded), require_active=False, execution_info=False)"
    )
    assert "partitions=[0, 3]" in repr(request().with_partitions({3, 0}))


# -- store names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["totals", "page-views_v2", "a.b", "Ünïcode"])
def test_valid_store_names(name):
    assert validate_store_name(name) == name
    assert StateQueryRequest.in_store(name).store_name == name


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "/abs", "a\\b", "..x", "x..", "a..b", os.sep + "x", "a\x00b"],
)
def test_invalid_store_names(name):
    with pytest.raises(ValueError):
        validate_store_name(name)
    with pytest.raises(ValueError):
        StateQueryRequest.in_store(name)


def test_store_name_must_be_str():
    with pytest.raises(TypeError):
        validate_store_name(None)
    with pytest.raises(TypeError):
        StateQueryRequest.in_store(b"totals")


# -- LagInfo -------------------------------------------------------------------------------


def test_lag_info():
    cur = Position.from_map({"in": {0: 5}})
    end = Position.from_map({"in": {0: 10}})
    lag = LagInfo("totals", 0, cur, end, 4)
    assert (lag.store, lag.partition, lag.offset_lag) == ("totals", 0, 4)
    assert lag.current_position == cur and lag.end_position == end
    assert lag.is_known
    assert repr(lag) == (
        "LagInfo(store='totals', partition=0, current_position=Position({'in': {0: 5}}), "
        "end_position=Position({'in': {0: 10}}), offset_lag=4)"
    )
    unknown = LagInfo(store="totals", partition=1, current_position=cur, end_position=None,
                      offset_lag=None)  # fmt: skip
    assert not unknown.is_known
    with pytest.raises(dataclasses.FrozenInstanceError):
        lag.offset_lag = 0
    assert lag == LagInfo("totals", 0, cur, end, 4)


# -- package surface -----------------------------------------------------------------------


def test_all_exports_resolve():
    # __all__ is the model's public API (what iqkit re-exports); the helpers iqkit's own
    # layers use stay importable from the package without being listed.
    public = {
        "FailureReason", "KeyQuery", "KeyValue", "KeyValueIterator", "LagInfo",
        "MultiKeyQuery", "Position", "PositionBound", "PrefixScanQuery", "Query",
        "QueryResult", "RangeQuery", "RawKeyQuery", "RawScanQuery", "ResultOrder",
        "StateQueryRequest", "StateQueryResult", "WindowKeyQuery", "WindowRangeQuery",
        "Windowed", "VersionedKeyQuery", "MultiVersionedKeyQuery", "ChangesQuery",
        "VersionedRecord", "Change",
    }  # fmt: skip
    assert set(iqkit.query.__all__) == public
    for name in public | {"InStore", "to_epoch_millis", "validate_store_name"}:
        assert getattr(iqkit.query, name) is not None


def test_query_model_imports_only_the_standard_library():
    # The query model must stay pure: no rocksdict/pandas, and nothing from iqkit.store.
    import ast
    import pathlib
    import sys

    package = pathlib.Path(iqkit.query.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                if node.level > 1:
                    offenders.append(f"{path.name}: from {'.' * node.level}{node.module}")
                continue
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}:
                    offenders.append(f"{path.name}: import {name}")
    assert len(list(package.glob("*.py"))) >= 12
    assert offenders == []
