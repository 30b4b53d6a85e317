"""The engine's key-lookup path (``StateEngine._look_up``): a routed KeyQuery with
default options skips the general per-partition checks. It must answer exactly what the
general path answers (value, partition, position), see every new version at the next
query, and leave failures to the general path, which makes them the partition's result."""

from __future__ import annotations

import os

import iqkit
from iqkit import KeyQuery, StateQueryRequest


def _plain(store: str, key: object) -> StateQueryRequest:
    return StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))


def _traced(store: str, key: object) -> StateQueryRequest:
    # Execution info takes the general path (the look-up path takes only defaults).
    return _plain(store, key).enable_execution_info()


def _answer(result: iqkit.StateQueryResult) -> list[tuple[int, object, object]]:
    return [
        (p, r.result, r.position) for p, r in sorted(result.partition_results.items())
    ]


def test_the_look_up_path_answers_what_the_general_path_answers(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=5, value_serde="json")
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for i in range(200):
            w.put(f"k{i}", {"i": i}, source=("topic", i % 3, i))
    with iqkit.StoreWriter(tmp_path, "s") as w:  # a second version: deletes and updates
        for i in range(0, 200, 7):
            w.put(f"k{i}", None if i % 2 else {"i": -i}, source=("topic", 0, 1000 + i))
    keys = [f"k{i}" for i in range(220)]  # the last 20 were never written
    with iqkit.open(tmp_path) as engine:
        for key in keys:  # the general path first: every partition opened
            engine.query(_traced("s", key))
        plain = [_answer(engine.query(_plain("s", k))) for k in keys]
        traced = [_answer(engine.query(_traced("s", k))) for k in keys]
    assert plain == traced
    assert all(len(a) == 1 for a in plain)  # only the owner answered
    values = {k: a[0][1] for k, a in zip(keys, plain, strict=True)}
    assert values["k7"] is None and values["k14"] == {"i": -14} and values["k15"] == {"i": 15}
    assert values["k210"] is None
    assert {a[0][0] for a in plain} == set(range(5))  # every partition was the owner once


def test_each_new_version_is_seen_by_the_next_key_lookup(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=3, value_serde="int64", retention=1)
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for key in ("a", "b", "c", "d"):
            w.put(key, 0)
    with iqkit.open(tmp_path) as engine:
        for key in ("a", "b", "c", "d"):
            assert engine.query(_plain("s", key)).only_partition_result().result == 0
        for n in range(1, 25):
            key = "abcd"[n % 4]
            with iqkit.StoreWriter(tmp_path, "s") as w:
                w.put(key, n)
            # The changed key, and the others (whose partitions this version kept).
            assert engine.query(_plain("s", key)).only_partition_result().result == n
            assert engine.version("s") == n + 1
        expected = {"a": 24, "b": 21, "c": 22, "d": 23}
        for key, value in expected.items():
            assert engine.query(_plain("s", key)).only_partition_result().result == value


def test_a_key_the_serde_refuses_gets_the_general_paths_error(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=2, key_serde="int64")
    with iqkit.StoreWriter(tmp_path, "s") as w:
        w.put(1, "x")
    with iqkit.open(tmp_path) as engine:
        assert engine.query(_plain("s", 1)).only_partition_result().result == "x"
        try:
            engine.query(_plain("s", "not a number"))
        except (TypeError, ValueError) as exc:
            message = str(exc)
        else:
            raise AssertionError("a string key for an int64 store was accepted")
        assert "int64" in message or "int" in message


def test_a_closed_engine_refuses_key_lookups(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=1)
    with iqkit.StoreWriter(tmp_path, "s") as w:
        w.put("a", 1)
    engine = iqkit.open(tmp_path)
    assert engine.query(_plain("s", "a")).only_partition_result().result == 1
    engine.close()
    try:
        engine.query(_plain("s", "a"))
    except iqkit.EngineClosedError:
        pass
    else:
        raise AssertionError("a closed engine answered a key lookup")


#: The layers a key lookup walks down, highest first (docs/ARCHITECTURE.md, "A key
#: lookup, step by step"): a call into a higher layer than the caller's is a climb.
_LAYERS = (
    ("engine.py",),
    ("store/chain/", "store/format.py", "store/roots.py", "store/objects.py", "store/cache.py"),
    ("store/partitions/",),
    ("store/encoding/",),
    ("query/",),
)


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(_LAYERS):
        if module.startswith(prefixes):
            return rank
    raise AssertionError(f"a key lookup reached {module}, which no layer names")


def _walk(engine: iqkit.StateEngine, request: StateQueryRequest) -> list[tuple[str, str]]:
    """The iqkit calls (caller module, callee module) of one query, and rocksdict's get."""
    import sys

    calls: list[tuple[str, str]] = []

    # Relative to the package's own folder: a checkout may itself sit in a folder
    # called iqkit (a fresh clone does), so "/iqkit/" may appear twice in a path.
    package = os.path.dirname(os.path.abspath(iqkit.__file__)) + os.sep

    def module_of(frame) -> str | None:
        name = frame.f_code.co_filename
        return name[len(package) :].replace("\\", "/") if name.startswith(package) else None

    def profile(frame, event, arg):
        if event == "call":
            callee = module_of(frame)
            caller = module_of(frame.f_back) if frame.f_back is not None else None
            if callee is not None and caller is not None:
                calls.append((caller, callee))
        elif event == "c_call" and getattr(arg, "__qualname__", "") == "Rdict.get":
            calls.append((module_of(frame) or "?", "rocksdict"))

    sys.setprofile(profile)
    try:
        result = engine.query(request)
    finally:
        sys.setprofile(None)
    assert result.only_partition_result().is_success
    return calls


def test_a_key_lookup_walks_down_to_rocksdict_climbing_back_at_most_twice(tmp_path):
    # Partitions too big for a memory copy (incompressible values), so the walk ends in
    # RocksDB's get.
    import random

    rng = random.Random(7)
    iqkit.create_store(tmp_path, "s", partitions=2, value_serde="json")
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for i in range(6000):
            w.put(f"key-{i:05d}", {"payload": rng.randbytes(32).hex(), "i": i})
    query = KeyQuery.with_key("key-00042").skip_cache()
    request = StateQueryRequest.in_store("s").with_query(query)
    with iqkit.open(tmp_path) as engine:
        # The first query takes the general path and reads the owner's files in place;
        # the second opens its database; the walked one is the hot path.
        engine.query(request)
        engine.query(request)
        calls = _walk(engine, request)
    assert any(callee == "rocksdict" for _, callee in calls)  # the walk reached RocksDB
    iqkit_calls = [(a, b) for a, b in calls if b != "rocksdict"]
    climbs = [(a, b) for a, b in iqkit_calls if _layer(b) < _layer(a)]
    assert len(climbs) <= 2, f"the key lookup climbs back up {len(climbs)} times: {climbs}"
    modules = {b for _, b in iqkit_calls}
    assert "engine.py" in modules and any(m.startswith("store/partitions/") for m in modules)
