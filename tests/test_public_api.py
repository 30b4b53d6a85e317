"""iqkit's public API: the IQv2 model's names (Kafka Streams' ``StateQueryRequest``,
queries, results, positions, iterators), the store writer and the engine are importable
from ``iqkit``, listed in ``iqkit.__all__``, and have the signatures users call."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import iqkit

PUBLIC_NAMES = [
    "Position", "PositionBound", "FailureReason", "ResultOrder", "KeyQuery", "MultiKeyQuery",
    "RangeQuery", "PrefixScanQuery", "WindowKeyQuery", "WindowRangeQuery", "RawKeyQuery",
    "RawScanQuery", "StateQueryRequest", "QueryResult", "StateQueryResult", "KeyValue",
    "KeyValueIterator", "Windowed", "LagInfo", "create_store", "StoreWriter", "open",
    "StateEngine", "UnknownStoreError", "EngineClosedError",
]  # fmt: skip


def test_public_names_are_exported():
    missing = [n for n in PUBLIC_NAMES if not hasattr(iqkit, n)]
    assert missing == []
    assert set(PUBLIC_NAMES) <= set(iqkit.__all__)


def test_public_signatures():
    params = inspect.signature(iqkit.create_store).parameters
    assert list(params)[:2] == ["root", "name"]
    for keyword, default in {
        "kind": "kv",
        "key_serde": "string",
        "value_serde": "json",
        "partitioner": "murmur2",
        "window_size_ms": None,
    }.items():
        assert params[keyword].default == default
        assert params[keyword].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["partitions"].kind is inspect.Parameter.KEYWORD_ONLY
    put = inspect.signature(iqkit.StoreWriter.put).parameters
    assert {"partition", "source", "window_start"} <= set(put)
    assert inspect.signature(iqkit.open).parameters["as_of"].default is None
    assert {m.name for m in iqkit.FailureReason} == {
        "UNKNOWN_QUERY_TYPE", "NOT_ACTIVE", "NOT_UP_TO_BOUND", "NOT_PRESENT", "DOES_NOT_EXIST",
        "STORE_EXCEPTION",
    }  # fmt: skip
    assert {m.name for m in iqkit.ResultOrder} == {"ANY", "ASCENDING", "DESCENDING"}


def test_notebook_entry_points():
    # iqkit.sql is only the function: no submodule of that name to import or shadow it
    # (issue 12.8; the SQL code is the iqkit.sqlsession package).
    assert importlib.util.find_spec("iqkit.sql") is None
    from iqkit.sqlsession import sql

    assert callable(iqkit.sql) and iqkit.sql is sql
    assert {"sql", "panel", "SQLSession", "SQLError", "load_ipython_extension"} <= set(
        iqkit.__all__
    )
    assert issubclass(iqkit.SQLError, iqkit.IqkitError)


def _literal_all(path: Path) -> set[str]:
    """The string literals written in the ``__all__`` assignment of module ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    raise AssertionError(f"no __all__ assignment in {path}")


def test_the_query_models_public_names_are_listed_once():
    # iqkit.__all__ is iqkit's own names plus iqkit.query.__all__: a query type added to
    # the model is public at both levels by one edit, never by two lists kept equal by hand.
    from iqkit import query

    model = set(query.__all__)
    assert model <= set(iqkit.__all__)
    assert {"KeyQuery", "StateQueryRequest", "Position"} <= model  # the list was read
    written = _literal_all(Path(iqkit.__file__))
    assert not written & set(query.__all__), "iqkit/__init__.py repeats query's names"
    for name in iqkit.__all__:
        assert hasattr(iqkit, name), name
    for name in model:
        assert getattr(iqkit, name) is getattr(query, name)
