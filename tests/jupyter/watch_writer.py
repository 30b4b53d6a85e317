"""A writer in a process of its own, for the ``%iq watch`` tests (tests/jupyter and the
browser test): commits a plan of writes to a store, one commit at a time.

    python watch_writer.py ROOT STORE PLAN_JSON [--handshake FOLDER] [--pause SECONDS]

``PLAN_JSON``: a list of commits, each a list of ``[key, value]`` (``value`` null
deletes the key) or ``[key, value, window_start]`` for a window store. Before each
commit the writer waits: with ``--handshake``, until the file ``seen-<V>`` exists in
FOLDER, ``V`` being the store's version then (the watcher showed it); otherwise
``--pause`` seconds. It prints ``ready`` once imported and ``committed <V>`` after each
commit, and gives up (exit 3) when a handshake does not come within two minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import iqkit

HANDSHAKE_SECONDS = 120


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("store")
    parser.add_argument("plan")
    parser.add_argument("--handshake")
    parser.add_argument("--pause", type=float, default=0.5)
    args = parser.parse_args()
    plan = json.loads(args.plan)
    print("ready", flush=True)
    for writes in plan:
        with iqkit.open(args.root) as engine:
            version = engine.version(args.store)
        if args.handshake:
            seen = Path(args.handshake) / f"seen-{version}"
            deadline = time.monotonic() + HANDSHAKE_SECONDS
            while not seen.exists():
                if time.monotonic() > deadline:
                    print(f"no handshake for version {version}", flush=True)
                    return 3
                time.sleep(0.02)
        else:
            time.sleep(args.pause)
        with iqkit.StoreWriter(args.root, args.store) as w:
            for key, value, *start in writes:
                window = {"window_start": start[0]} if start else {}
                w.put(key, value, **window)
        print(f"committed {w.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
