"""Damaged store files and failures around a commit: nothing is lost, errors name the file.

* Bytes that are not UTF-8 in ``manifest.json`` or a version record are a
  ``StoreCorruptedError`` naming the file, for readers and writers alike.
* After a version is published the commit has succeeded: problems while cleaning up
  old versions are warnings (``StoreCleanupWarning``), ``writer.version`` is the
  published version, so a caller never retries (and applies) a write twice.
"""

from __future__ import annotations

import functools
import warnings

import pytest
from helpers import kv_rows, request, tree_digest

import iqkit
from iqkit import FailureReason
from iqkit.errors import StoreCleanupWarning
from iqkit.store.chain import retention as chain_retention
from iqkit.store.chain import stores as chain_store
from iqkit.store.chain.records import record_key
from iqkit.store.formats import format_for
from iqkit.store.names import MANIFEST_FILE
from iqkit.store.objects import LocalObjects
from iqkit.store.roots import parse_root


def commit(root, store, **puts) -> int | None:
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


def store_with_versions(root, *, versions=4, retention=10):
    """Store 's' (2 partitions) where commit i wrote key ``k<i>`` = i, i = 1..versions;
    its folder."""
    iqkit.create_store(root, "s", partitions=2, retention=retention)
    for i in range(1, versions + 1):
        commit(root, "s", **{f"k{i}": i})
    return root / "s"


def scan_failures(root) -> dict[int, tuple[FailureReason | None, str]]:
    with iqkit.open(root) as engine:
        results = engine.query(request("s", iqkit.RangeQuery.with_no_bounds())).partition_results
        return {
            p: (r.failure_reason, r.failure_message) if r.is_failure else (None, "")
            for p, r in results.items()
        }


def test_a_store_never_committed_to_still_commits(root):
    """No version record is a new store: every partition is empty, not damaged."""
    iqkit.create_store(root, "s", partitions=2)
    assert sorted(p.name for p in (root / "s").iterdir()) == [MANIFEST_FILE]
    assert all(r is not FailureReason.STORE_EXCEPTION for r, _ in scan_failures(root).values())
    assert commit(root, "s", a=1) == 1


# -- item 7 (store files): bytes that are not UTF-8 ----------------------------------------
@pytest.mark.parametrize(
    "which",
    ["manifest", "record"],
)
def test_non_utf8_bytes_in_a_store_file_are_named(root, which):
    folder = store_with_versions(root, versions=2)
    path = {
        "manifest": folder / MANIFEST_FILE,
        "record": root / record_key("s", 2),
    }[which]
    path.write_bytes(path.read_bytes()[:5] + b"\xff\xfe\x80" + path.read_bytes()[5:])
    before = tree_digest(folder)

    with pytest.raises(iqkit.StoreCorruptedError) as info:
        commit(root, "s", new=1)
    assert str(path) in str(info.value)
    if which == "manifest":
        with iqkit.open(root) as engine, pytest.raises(iqkit.StoreCorruptedError) as info:
            engine.query(request("s", iqkit.KeyQuery.with_key("k1")))
        assert str(path) in str(info.value)
    else:
        for reason, message in scan_failures(root).values():
            assert reason is FailureReason.STORE_EXCEPTION
            assert str(path) in message
    assert tree_digest(folder) == before


# -- after publish, a commit is a success -----------------------------------------------------
def test_a_cleanup_failure_after_publish_is_a_warning_and_the_version_is_reported(
    root, monkeypatch
):
    """Retention (a grace period, then deletes): what it cannot delete after a commit
    published is a ``StoreCleanupWarning``; the version stands, and is reported."""
    store_with_versions(root, versions=2, retention=1)
    no_grace = functools.partial(chain_retention.collect_chain_garbage, grace_seconds=0)
    monkeypatch.setattr(chain_store, "collect_chain_garbage", no_grace)

    def refuse(self, path):
        raise iqkit.StoreIOError(f"cannot delete {path} (injected)")

    monkeypatch.setattr(LocalObjects, "delete", refuse)
    with (
        pytest.warns(StoreCleanupWarning, match=r"version 3 was published") as caught,
        iqkit.StoreWriter(root, "s") as w,
    ):
        w.put("k3", 3)
    assert "injected" in str(caught[0].message)
    assert w.version == 3
    with iqkit.open(root) as engine:
        assert engine.version("s") == 3
        assert sorted((k, v) for _, k, v in kv_rows(engine, "s")) == [
            ("k1", 1),
            ("k2", 2),
            ("k3", 3),
        ]
    monkeypatch.undo()
    monkeypatch.setattr(chain_store, "collect_chain_garbage", no_grace)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreCleanupWarning)  # the next commit cleans up
        assert commit(root, "s", k4=4) == 4
    assert format_for(parse_root(root)).latest_published("s").version == 4
