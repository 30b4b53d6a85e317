"""The SST-chain format on object storage (issue 13), as ratios in one run.

    .venv/bin/python bench/bench_object_store.py [--keys 1000000] [--share 0.01]

Starts moto's S3 server on 127.0.0.1 (a free port; only the standard AWS variables point
the client at it), then builds the same ``--keys`` rows two ways: an SST chain on a local
root and an SST chain on S3. It measures

1. a key lookup on S3 with a warm cache vs the same lookup on the local-root chain
   (target: within 1.5x);
2. the first lookup of a new version that changed ``--share`` of the keys, the previous
   version cached: bytes fetched and time, against the change's size;
3. the bytes a commit changing ``--share`` of the keys uploads, against the store's bytes
   (target: about ``--share``).

Prints a Markdown table for BENCHMARKS.md. Single thread; medians of several runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench_core import best, print_table

from iqkit.store.cache import FileCache
from iqkit.store.chain.read import open_partition
from iqkit.store.chain.records import list_versions, record_key
from iqkit.store.chain.write import commit_version
from iqkit.store.encoding.keyspace import kv_key
from iqkit.store.objects import open_objects

STORE = "bench"


def name(i: int) -> str:
    return f"key-{i:09d}"


def rows(n: int) -> Iterator[tuple[bytes, bytes]]:
    """Sorted raw rows, the bytes today's store holds for string keys and values."""
    for i in range(n):
        yield kv_key(name(i).encode()), b"value-%d" % i


def start_s3() -> tuple[object, str]:
    """moto's S3 server on 127.0.0.1 and a fresh bucket; the AWS variables point at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_EC2_METADATA_DISABLED="true",
    )
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
    return server, "s3://bench/stores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--share", type=float, default=0.01)
    args = parser.parse_args()
    n = args.keys
    rnd = random.Random(7)
    table: list[tuple[str, str, str, str, str]] = []
    server, s3_root = start_s3()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            t0 = time.perf_counter()
            local_chain = open_objects(folder / "chain-root")
            s3 = open_objects(s3_root)
            w_cache = FileCache(folder / "writer-cache")
            v1_local = commit_version(local_chain, STORE, None, {0: rows(n)}, cache=w_cache)
            t_up = time.perf_counter()
            v1 = commit_version(s3, STORE, None, {0: rows(n)}, cache=w_cache)
            upload_s = time.perf_counter() - t_up
            build_s = time.perf_counter() - t0
            store_bytes = v1.partitions[0].size

            # 1. warm-cache key lookup ------------------------------------------------------
            cache = FileCache(folder / "reader-cache")
            opened = [
                open_partition(cache, s3, STORE, 0, v1.partitions[0]),
                open_partition(cache, local_chain, STORE, 0, v1_local.partitions[0]),
            ]
            keys = [kv_key(name(rnd.randrange(n)).encode()) for _ in range(20_000)]
            assert len({p.get(keys[0]) for p in opened}) == 1

            def lookups(part) -> Callable[[], None]:
                def run() -> None:
                    get = part.get
                    for k in keys:
                        get(k)

                return run

            t_s3, t_chain = (best(lookups(p), 5) / len(keys) for p in opened)
            for p in opened:
                p.close()
            table.append(("Key lookup, S3 chain (warm cache) vs local-root chain",
                          f"{t_s3 * 1e6:.2f} µs", f"{t_chain * 1e6:.2f} µs",
                          f"{t_s3 / t_chain:.2f}×", "≤ 1.5×"))  # fmt: skip

            # 2. a commit changing --share of the keys: upload, then a reader's first lookup
            picked = sorted(rnd.sample(range(n), max(1, int(n * args.share))))
            change = [(kv_key(name(i).encode()), b"changed-%d" % i) for i in picked]
            t_commit = time.perf_counter()
            v2 = commit_version(s3, STORE, v1, {0: change}, cache=w_cache)
            commit_s = time.perf_counter() - t_commit
            delta = v2.partitions[0].files[-1].size
            record = len(s3.read_bytes(record_key(STORE, 2)))
            uploaded = delta + record
            table.append((f"Bytes uploaded by a commit changing {args.share:.0%} of {n:,} keys",
                          f"{uploaded / 1e6:.3f} MB in {commit_s:.2f} s",
                          f"store {store_bytes / 1e6:.1f} MB (first upload {upload_s:.1f} s)",
                          f"{uploaded / store_bytes:.2%}",
                          f"≈ {args.share:.0%}"))  # fmt: skip

            t_first = time.perf_counter()
            part = open_partition(cache, s3, STORE, 0, v2.partitions[0])
            got = part.get(change[0][0])
            first_s = time.perf_counter() - t_first
            assert got == change[0][1]
            fetched = part.fetch
            part.close()
            table.append(("First lookup of the new version (previous cached): fetched",
                          f"{fetched.bytes_fetched / 1e6:.3f} MB, {fetched.files_fetched} file, "
                          f"{first_s * 1e3:.0f} ms",
                          f"change {delta / 1e6:.3f} MB",
                          f"{fetched.bytes_fetched / delta:.2f}× the change",
                          "= the change"))  # fmt: skip
            t_again = time.perf_counter()
            part = open_partition(cache, s3, STORE, 0, v2.partitions[0])
            part.get(change[0][0])
            again_s = time.perf_counter() - t_again
            part.close()
            table.append(("Second open + lookup of the same version (database reused)",
                          f"{again_s * 1e3:.1f} ms", f"first {first_s * 1e3:.0f} ms",
                          f"{part.fetch.files_fetched} files fetched", "(info)"))  # fmt: skip

            # 3. what a reader does per query to see a new version: one check of the next
            # record (iqkit/store/chain/snapshot.py) instead of listing the store's records
            for label, objects in (("S3", s3), ("local-root chain", local_chain)):
                if objects is local_chain:
                    commit_version(objects, STORE, v1_local, {0: change}, cache=w_cache)
                nxt = record_key(STORE, 3)
                t_check = best(lambda o=objects, k=nxt: o.exists(k), 20)
                t_list = best(lambda o=objects: list_versions(o, STORE), 20)
                table.append((f"New-version check per query, {label}: next record vs listing",
                              f"{t_check * 1e6:.0f} µs", f"{t_list * 1e6:.0f} µs",
                              f"{t_check / t_list:.2f}×", "(info)"))  # fmt: skip
    finally:
        server.stop()

    print_table("object-store", f"{n:,} keys; stores built in {build_s:.1f}s", table)


if __name__ == "__main__":
    main()
