"""The local file cache (iqkit/store/cache.py): fetched once, bounded, least recently used
first, never a pinned file, safe with several processes, counted for traces."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from s3server import CuttingProxy

from iqkit.store.cache import (
    DEFAULT_LIMIT,
    FileCache,
    default_cache_dir,
    parse_size,
    reader_cache,
)
from iqkit.store.objects import TMP_PREFIX, open_objects


@pytest.fixture
def objects(tmp_path):
    """A local root holding f0..f7, 1000 bytes each (distinct contents)."""
    objects = open_objects(tmp_path / "root")
    for i in range(8):
        src = tmp_path / f"src{i}"
        src.write_bytes(bytes([65 + i]) * 1000)
        objects.put_immutable(f"t/sst/f{i}.sst", src)
    return objects


def _cached(cache: FileCache) -> list[str]:
    return sorted(p.name for p in cache.objects_dir.rglob("*.sst"))


def test_a_file_is_fetched_once_then_served_from_the_cache(objects, tmp_path):
    cache = FileCache(tmp_path / "cache", limit="1MB")
    with cache.pin(objects, "t/sst/f1.sst") as first:
        assert first.path.read_bytes() == b"B" * 1000
    with cache.pin(objects, "t/sst/f1.sst") as again:
        assert again.path == first.path
    s = cache.stats
    assert (s.files_fetched, s.bytes_fetched, s.hits, s.hit_bytes) == (1, 1000, 1, 1000)
    assert s.line().startswith("cache: fetched 1 file (0.0 MB) in ")
    assert s.line().endswith("; 1 from cache (0.0 MB)")


def test_a_warm_cache_needs_no_network(s3_root, s3_endpoint, monkeypatch, tmp_path):
    """Through a proxy that then goes away: the second pin never reaches the server."""
    proxy = CuttingProxy(s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    objects = open_objects(s3_root)
    src = tmp_path / "src"
    src.write_bytes(b"z" * 5000)
    objects.put_immutable("t/sst/a.sst", src)
    cache = FileCache(tmp_path / "cache")
    cache.pin(objects, "t/sst/a.sst").release()
    before = cache.stats.copy()
    proxy.stop()
    with cache.pin(objects, "t/sst/a.sst") as pin:
        assert pin.path.read_bytes() == b"z" * 5000
    delta = cache.stats.since(before)
    assert (delta.files_fetched, delta.hits) == (0, 1)


def test_least_recently_used_files_go_first(objects, tmp_path):
    cache = FileCache(tmp_path / "cache", limit=2500)
    for key in ("t/sst/f0.sst", "t/sst/f1.sst"):
        cache.pin(objects, key).release()
        time.sleep(0.01)
    cache.pin(objects, "t/sst/f0.sst").release()  # f0 is now more recent than f1
    time.sleep(0.01)
    cache.pin(objects, "t/sst/f2.sst").release()
    assert _cached(cache) == ["f0.sst", "f2.sst"]
    assert cache.usage() == 2000 and cache.stats.files_evicted == 1


def test_caches_of_one_folder_share_this_process_running_count(objects, tmp_path, monkeypatch):
    """Every engine has a cache object of its own: a second one of the same folder does
    not walk the whole cache again at its first fetch, yet what the first added counts
    toward the limit, so a fetch past it still evicts."""
    walks = []
    census = FileCache._census
    monkeypatch.setattr(FileCache, "_census", lambda self: walks.append(self) or census(self))
    first = FileCache(tmp_path / "cache", limit=3500)
    for key in ("t/sst/f0.sst", "t/sst/f1.sst"):
        first.pin(objects, key).release()
        time.sleep(0.01)
    assert walks == [first]  # its first fetch counted the (empty) cache, then it added
    second = FileCache(tmp_path / "cache", limit=3500)
    second.pin(objects, "t/sst/f2.sst").release()  # 3000 bytes: within the limit
    assert walks == [first]
    time.sleep(0.01)
    second.pin(objects, "t/sst/f3.sst").release()  # 4000 bytes: past it
    assert walks == [first, second]
    assert _cached(second) == ["f1.sst", "f2.sst", "f3.sst"]
    other = FileCache(tmp_path / "other", limit=3500)
    other.pin(objects, "t/sst/f4.sst").release()
    assert walks == [first, second, other]  # another folder has a count of its own


def test_a_pinned_file_is_never_evicted(objects, tmp_path):
    cache = FileCache(tmp_path / "cache", limit=1000)
    held = cache.pin(objects, "t/sst/f0.sst")
    for i in (1, 2, 3):
        cache.pin(objects, f"t/sst/f{i}.sst").release()
    assert "f0.sst" in _cached(cache)
    assert held.path.read_bytes() == b"A" * 1000
    held.release()
    cache.pin(objects, "t/sst/f4.sst").release()
    assert _cached(cache) == ["f4.sst"]


def test_pinned_context_pins_every_key_for_the_block(objects, tmp_path):
    cache = FileCache(tmp_path / "cache", limit=0)
    with cache.pinned(objects, ["t/sst/f0.sst", "t/sst/f1.sst"]) as paths:
        assert [p.read_bytes()[:1] for p in paths] == [b"A", b"B"]
        cache.evict()
        assert _cached(cache) == ["f0.sst", "f1.sst"]
    cache.evict()
    assert _cached(cache) == []


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from iqkit.store.cache import FileCache
    from iqkit.store.objects import open_objects
    root, cache_dir, key, release = sys.argv[1:5]
    pin = FileCache(cache_dir, limit=0).pin(open_objects(root), key)
    print("pinned", flush=True)
    while not Path(release).exists():
        time.sleep(0.01)
    print(pin.path.read_bytes()[:3].decode(), flush=True)
    """
)


def test_a_file_pinned_by_another_process_survives_eviction(objects, tmp_path):
    cache_dir, release = tmp_path / "cache", tmp_path / "release"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, os.fspath(objects.root.local), os.fspath(cache_dir),
         "t/sst/f5.sst", os.fspath(release)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "pinned"
    cache = FileCache(cache_dir, limit=0)
    for i in range(4):
        cache.pin(objects, f"t/sst/f{i}.sst").release()
    cache.evict()
    assert _cached(cache) == ["f5.sst"]  # everything else went; the pinned file stayed
    release.touch()
    out, _ = holder.communicate(timeout=60)
    assert holder.returncode == 0 and out.strip() == "FFF"
    cache.evict()
    assert _cached(cache) == []  # the pin died with its holder


WORKER = textwrap.dedent(
    """
    import sys
    from iqkit.store.cache import FileCache
    from iqkit.store.objects import open_objects
    root, cache_dir = sys.argv[1:3]
    objects, cache = open_objects(root), FileCache(cache_dir, limit=2500)
    bad = 0
    for round in range(15):
        for i in range(8):
            with cache.pin(objects, f"t/sst/f{i}.sst") as pin:
                bad += pin.path.read_bytes() != bytes([65 + i]) * 1000
    print(bad, cache.stats.files_fetched, cache.stats.hits)
    """
)


def test_several_processes_share_a_small_cache_safely(objects, tmp_path):
    """Four processes fetch, pin and evict in one cache far smaller than their files:
    every read sees the right bytes, no call fails, and nothing is left half-written."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                os.fspath(objects.root.local),
                os.fspath(tmp_path / "cache"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        bad, fetched, hits = map(int, out.split())
        # a file evicted by another process between its fetch and its pin is fetched again
        assert bad == 0 and fetched + hits >= 15 * 8
    assert not [p for p in (tmp_path / "cache").rglob(f"{TMP_PREFIX}*")]
    assert FileCache(tmp_path / "cache", limit=2500).usage() <= 2500


def test_stale_temporary_downloads_are_removed(objects, tmp_path):
    cache = FileCache(tmp_path / "cache", limit="1MB")
    cache.pin(objects, "t/sst/f0.sst").release()
    folder = cache.path_of(objects, "t/sst/f0.sst").parent
    stale, fresh = folder / f"{TMP_PREFIX}dead", folder / f"{TMP_PREFIX}busy"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    cache.evict()
    assert not stale.exists() and fresh.exists()


def test_cache_folder_and_limit_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("IQKIT_CACHE", raising=False)
    monkeypatch.delenv("IQKIT_CACHE_SIZE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "iqkit"
    assert FileCache().limit == DEFAULT_LIMIT
    monkeypatch.setenv("IQKIT_CACHE", os.fspath(tmp_path / "mine"))
    monkeypatch.setenv("IQKIT_CACHE_SIZE", "2GiB")
    cache = FileCache()
    assert (cache.folder, cache.limit) == (tmp_path / "mine", 2 * 2**30)
    monkeypatch.setenv("IQKIT_CACHE_SIZE", "lots")
    lazy = FileCache()  # writers make one and may never read through it: not parsed yet
    with pytest.raises(ValueError, match=r"^IQKIT_CACHE_SIZE must be a size such as 10GiB"):
        lazy.limit  # noqa: B018
    with pytest.raises(ValueError, match=r"^IQKIT_CACHE_SIZE must be a size such as 10GiB"):
        reader_cache()  # a reader's is checked when it starts


SIZES = [("1000", 1000), ("10GiB", 10 * 2**30), ("1.5 MB", 1_500_000), ("512mib", 512 * 2**20)]


@pytest.mark.parametrize(("text", "n"), [*SIZES, (7, 7)])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "-1", "10 parsecs", "1e9", -5])
def test_bad_sizes_are_one_line(text):
    with pytest.raises(ValueError, match="IQKIT_CACHE_SIZE must be"):
        parse_size(text)
