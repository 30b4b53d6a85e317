"""``python -m iqkit``: a small command line over the stores under a root.

python -m iqkit demo [--root ROOT]     the Spark pipeline into ./demo-stores, then a tour
python -m iqkit stores ROOT            list stores with kind, partitions, version
python -m iqkit get ROOT STORE KEY     a KeyQuery (KEY parsed by the key serde)
python -m iqkit scan ROOT STORE [--prefix P] [--limit N] [--desc]
python -m iqkit lag ROOT
python -m iqkit migrate ROOT [STORE...]   folder-format stores into chain stores, in place
python -m iqkit verify ROOT [STORE...] [--repair]   every retained file against its checksum
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from itertools import islice

from . import (
    IqkitError,
    KeyQuery,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    demo,
)
from . import open as open_engine
from .query.lag import NO_SOURCE
from .store.chain.migrate import migrate_store, store_names
from .store.encoding.serdes import get_serde


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


def _migrate(root: str, stores: list[str]) -> int:
    """One line per store; a store that cannot be migrated (a writer holds its lock, it
    is damaged, it is not there) is one ``error:`` line, the others go on; exit 1 then."""
    try:
        stores = stores or store_names(root)
    except (IqkitError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = False
    for store in stores:
        try:
            print(migrate_store(root, store).line(), flush=True)
        except (IqkitError, ValueError) as exc:  # ValueError: not a store name
            print(f"error: {exc}", file=sys.stderr, flush=True)
            failed = True
    return 1 if failed else 0


def _verify(root: str, stores: list[str], repair: bool) -> int:
    """One line per damaged file and a summary; exit 1 when anything is damaged."""
    from . import verify

    report = verify(root, stores or None, repair=repair)
    for line in report.lines():  # type: ignore[attr-defined]
        print(line, flush=True)
    return 0 if report.ok else 1  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m iqkit", description="Query iqkit state stores."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo_cmd = sub.add_parser(
        "demo", help="run the demo Spark pipeline into demo stores, then a tour of them"
    )
    demo_cmd.add_argument(
        "--root",
        default=demo.DEFAULT_ROOT,
        help=f"folder for the stores (default ./{demo.DEFAULT_ROOT}; replaces a previous demo's)",
    )
    demo_cmd.add_argument("--no-progress", action="store_true", help="no Spark progress bars")
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
    migrate = sub.add_parser(
        "migrate",
        help="turn stores in the folder format of earlier iqkits into chain stores, in place",
        description=(
            "Turn stores in the folder format of earlier iqkit versions into chain stores, "
            "in place, keeping every retained version with its number, positions and "
            "commit records. Safe to interrupt and run again; readers see the old store or "
            "the new one. Refused while a writer holds a store's commit lock (exit code 1)."
        ),
    )
    migrate.add_argument("root")
    migrate.add_argument("stores", nargs="*", metavar="STORE", help="default: every store")
    check = sub.add_parser(
        "verify",
        help="check every file of every retained version against its checksum",
        description=(
            "Check every file of every retained version (manifest, version records, SSTs, "
            "columnar twins) against the sizes and checksums the records keep, locally or "
            "on object storage. One line per damaged file, then a summary; exit code 1 "
            "when anything is damaged. --repair rebuilds a damaged columnar twin from its "
            "SST when the rebuilt file is the one its record describes."
        ),
    )
    check.add_argument("root")
    check.add_argument("stores", nargs="*", metavar="STORE", help="default: every store")
    check.add_argument(
        "--repair", action="store_true", help="rebuild damaged columnar twins from their SSTs"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            try:
                return demo.run(args.root, progress=not args.no_progress)
            except KeyboardInterrupt:
                print(f"interrupted: {args.root} is as it was before", file=sys.stderr)
                return 130
        if args.command == "stores":
            return _stores(args.root)
        if args.command == "get":
            return _get(args.root, args.store, args.key)
        if args.command == "scan":
            return _scan(args.root, args.store, args.prefix, args.limit, args.desc)
        if args.command == "migrate":
            return _migrate(args.root, args.stores)
        if args.command == "verify":
            return _verify(args.root, args.stores, args.repair)
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
