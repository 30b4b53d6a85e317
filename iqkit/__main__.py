"""``python -m iqkit``: a small command line over the stores under a root.

python -m iqkit demo [ROOT]            write a demo store and query it
python -m iqkit stores ROOT            list stores with kind, partitions, version
python -m iqkit get ROOT STORE KEY     a KeyQuery (KEY parsed by the key serde)
python -m iqkit scan ROOT STORE [--prefix P] [--limit N] [--desc]
python -m iqkit lag ROOT
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from itertools import islice

from . import (
    IqkitError,
    KeyQuery,
    Position,
    PositionBound,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    StoreWriter,
    WindowKeyQuery,
    create_store,
)
from . import open as open_engine
from .query.lag import NO_SOURCE
from .store.serdes import get_serde


def _demo(root: str | None) -> int:
    root = root or tempfile.mkdtemp(prefix="iqkit-demo-")
    print(f"Writing demo stores under {root}")
    create_store(root, "totals", partitions=4, value_serde="json")
    create_store(
        root, "clicks", partitions=2, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    with StoreWriter(root, "totals", who="iqkit demo") as w:
        for offset, (customer, amount) in enumerate(
            [("alice", 30), ("bob", 12), ("carol", 7), ("alice", 12), ("dave", 99), ("bob", 1)]
        ):
            w.put(
                customer,
                {"customer": customer, "last": amount},
                source=("orders", offset % 2, offset),
            )
        # Every partition of a murmur2 store reads every input partition: say the whole
        # input is applied (the last offsets), so partitions no record reached are not
        # "behind"; the log-end offsets (next offset to write) then give lag 0.
        w.record_applied({"orders": {0: 4, 1: 5}})
        w.record_source_end({"orders": {0: 5, 1: 6}})
    with StoreWriter(root, "clicks", who="iqkit demo") as w:
        for minute in range(5):
            w.put("alice", minute * 3, window_start=minute * 60_000)
    print(f"Published version {w.version} of 'clicks'\n")
    with open_engine(root) as engine:
        r = engine.query(
            StateQueryRequest.in_store("totals")
            .with_query(KeyQuery.with_key("alice"))
            .enable_execution_info()
        )
        only = r.only_partition_result()
        print(f"KeyQuery('alice') -> {only.result}  (position {only.position.to_map()})")
        for line in only.execution_info:
            print(f"    {line}")
        r = engine.query(
            StateQueryRequest.in_store("totals").with_query(RangeQuery.with_no_bounds())
        )
        print("\nRangeQuery, all keys, per partition:")
        for p, qr in r.partition_results.items():
            if qr.is_failure:  # a partition-level problem is a result, not an exception
                print(f"  partition {p}: {qr.failure_reason.name} ({qr.failure_message})")
                continue
            with qr.result as it:
                print(f"  partition {p}: {[kv.key for kv in it]}")
        q = WindowKeyQuery.with_key_and_window_start_range(
            "alice", 0, 10**12
        ).with_descending_keys()
        r = engine.query(StateQueryRequest.in_store("clicks").with_query(q))
        print("\nWindowKeyQuery('alice'), newest first:")
        for qr in r.partition_results.values():
            if qr.is_success:
                with qr.result as it:
                    for kv in islice(it, 3):
                        print(f"  [{kv.key.start}, {kv.key.end}) -> {kv.value}")
        bound = PositionBound.at(Position.from_map({"orders": {0: 100}}))
        r = engine.query(
            StateQueryRequest.in_store("totals")
            .with_query(KeyQuery.with_key("bob"))
            .with_position_bound(bound)
        )
        failed = r.only_partition_result()
        print(f"\nWith a bound beyond the data: {failed.failure_reason.name}:")
        print(f"  {failed.failure_message}")
        print("\nLag per partition of 'totals':")
        for p, lag in engine.lags()["totals"].items():
            print(f"  partition {p}: {lag.offset_lag} records behind")
        print(f"Lag of 'clicks': {NO_SOURCE}")
    return 0


def _stores(root: str) -> int:
    with open_engine(root) as engine:
        for name in engine.store_names():
            m = engine.manifest(name)
            serdes = f"{m.key_serde}->{m.value_serde}"
            version = engine.version(name)
            written = "not written yet" if version is None else f"version {version}"
            print(f"{name}\t{m.kind}\t{m.partitions} partitions\t{serdes}\t{written}")
    return 0


def _get(root: str, store: str, key_text: str) -> int:
    with open_engine(root) as engine:
        key = get_serde(engine.manifest(store).key_serde).parse_text(key_text)
        only = engine.query(
            StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
        ).only_partition_result()
        if only is None:
            print("(not found)")
        elif only.is_failure:
            print(f"{only.failure_reason.name}: {only.failure_message}")
            return 1
        else:
            print(only.result)
    return 0


def _scan(root: str, store: str, prefix: str | None, limit: int, desc: bool) -> int:
    with open_engine(root) as engine:
        serde = get_serde(engine.manifest(store).key_serde)
        query = (
            PrefixScanQuery.with_prefix(serde.parse_text(prefix))
            if prefix is not None
            else RangeQuery.with_no_bounds()
        )
        if desc:
            query = query.with_descending_keys()
        r = engine.query(StateQueryRequest.in_store(store).with_query(query))
        left = limit  # in all, as %iq's --limit: partition by partition, keys in order
        for p, qr in r.partition_results.items():
            if qr.is_failure:
                print(f"partition {p}: {qr.failure_reason.name}: {qr.failure_message}")
                continue
            with qr.result as it:
                for kv in islice(it, max(left, 0)):
                    print(f"{p}\t{kv.key!r}\t{kv.value!r}")
                    left -= 1
    return 0


def _lag(root: str) -> int:
    with open_engine(root) as engine:
        for store, parts in engine.lags().items():
            if all(lag.end_position is None for lag in parts.values()):
                print(f"{store}\t{NO_SOURCE}")  # one line in words, not a row of unknowns
                continue
            for p, lag in parts.items():
                print(f"{store}\t{p}\t{lag.current_position.to_map()}\t{lag.offset_lag}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m iqkit", description="Query iqkit state stores."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write demo stores and query them")
    demo.add_argument("root", nargs="?")
    sub.add_parser("stores", help="list stores").add_argument("root")
    get = sub.add_parser("get", help="look up one key")
    get.add_argument("root")
    get.add_argument("store")
    get.add_argument("key")
    scan = sub.add_parser("scan", help="scan a store (or a key prefix)")
    scan.add_argument("root")
    scan.add_argument("store")
    scan.add_argument("--prefix")
    scan.add_argument("--limit", type=int, default=20, help="rows in all (default 20)")
    scan.add_argument("--desc", action="store_true")
    sub.add_parser("lag", help="lag per store partition").add_argument("root")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args.root)
        if args.command == "stores":
            return _stores(args.root)
        if args.command == "get":
            return _get(args.root, args.store, args.key)
        if args.command == "scan":
            return _scan(args.root, args.store, args.prefix, args.limit, args.desc)
        return _lag(args.root)
    except (IqkitError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `python -m iqkit scan ... | head`: the reader left. Point stdout at /dev/null so
        # the interpreter's final flush does not raise again (Python's documented recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
