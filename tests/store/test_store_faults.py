"""Damaged store files and failures around a commit: nothing is lost, errors name the file.

* A store whose published version cannot be established (``LATEST`` missing while
  versions exist, ``LATEST`` naming a record that is not there) refuses every commit and
  its readers report corruption (``STORE_EXCEPTION`` naming the file), never emptiness;
  nothing on disk changes until the file is restored, and then every version is back.
* Bytes that are not UTF-8 in ``manifest.json``, ``LATEST`` or a version record are a
  ``StoreCorruptedError`` naming the file, for readers and writers alike.
* After a version is published the commit has succeeded: problems while cleaning up
  old versions are warnings (``StoreCleanupWarning``), ``writer.version`` is the
  published version, so a caller never retries (and applies) a write twice.

The files damaged here (``LATEST``, ``versions/*.json``, ``leases/``, retention of folder
versions) are the folder format's: those tests are marked ``folder_format``. A damaged
manifest and a never-committed store are the same in both formats.
"""

from __future__ import annotations

import functools
import shutil
import warnings

import pytest
from helpers import kv_rows, request, tree_digest

import iqkit
from iqkit import FailureReason
from iqkit.errors import StoreCleanupWarning
from iqkit.store import chain_retention, chain_store
from iqkit.store.jobs import latest_published
from iqkit.store.layout import StoreLayout
from iqkit.store.objects import LocalObjects


def commit(root, store, **puts) -> int | None:
    with iqkit.StoreWriter(root, store) as w:
        for k, v in puts.items():
            w.put(k, v)
    return w.version


def store_with_versions(root, *, versions=4, retention=10) -> StoreLayout:
    """Store 's' (2 partitions) where commit i wrote key ``k<i>`` = i, i = 1..versions."""
    iqkit.create_store(root, "s", partitions=2, retention=retention)
    for i in range(1, versions + 1):
        commit(root, "s", **{f"k{i}": i})
    return StoreLayout.of(root, "s")


def scan_failures(root) -> dict[int, tuple[FailureReason | None, str]]:
    with iqkit.open(root) as engine:
        results = engine.query(request("s", iqkit.RangeQuery.with_no_bounds())).partition_results
        return {
            p: (r.failure_reason, r.failure_message) if r.is_failure else (None, "")
            for p, r in results.items()
        }


def break_latest(layout: StoreLayout, how: str) -> str:
    """Damage what says which version is published; return the path errors must name."""
    if how == "LATEST missing":
        layout.latest.unlink()
        return str(layout.latest)
    if how == "LATEST past the records":
        layout.latest.write_text("9\n")
        return str(layout.version_record(9))
    assert how == "latest record missing"
    layout.version_record(4).unlink()
    return str(layout.version_record(4))


# -- item 1: a published state that cannot be established ----------------------------------
@pytest.mark.folder_format
@pytest.mark.parametrize(
    "how", ["LATEST missing", "LATEST past the records", "latest record missing"]
)
def test_a_store_whose_latest_version_is_unknown_refuses_commits_and_reports_corruption(root, how):
    layout = store_with_versions(root)
    named = break_latest(layout, how)
    before = tree_digest(layout.store_dir)

    with pytest.raises(iqkit.StoreCorruptedError) as info:
        commit(root, "s", new=1)
    assert named in str(info.value)
    assert tree_digest(layout.store_dir) == before  # nothing published, nothing collected

    failures = scan_failures(root)
    assert set(failures) == {0, 1}
    for reason, message in failures.values():
        assert reason is FailureReason.STORE_EXCEPTION
        assert named in message
    with iqkit.open(root) as engine, pytest.raises(iqkit.StoreCorruptedError, match="LATEST"):
        engine.version("s")
    assert tree_digest(layout.store_dir) == before

    if how == "latest record missing":
        return  # the record itself is gone: restoring LATEST cannot bring it back
    # Restored, the store has every version and commits go on from there.
    layout.latest.write_text("4\n")
    assert commit(root, "s", new=1) == 5
    with iqkit.open(root) as engine:
        assert sorted((k, v) for _, k, v in kv_rows(engine, "s")) == [
            ("k1", 1),
            ("k2", 2),
            ("k3", 3),
            ("k4", 4),
            ("new", 1),
        ]


@pytest.mark.folder_format
def test_a_missing_latest_record_is_named_instead_of_a_bare_lookup_error(root):
    layout = store_with_versions(root)
    layout.version_record(4).unlink()
    with pytest.raises(iqkit.StoreCorruptedError, match=r"LATEST names version 4") as info:
        commit(root, "s", new=1)
    assert str(layout.version_record(4)) in str(info.value)


def test_a_store_never_committed_to_still_commits(root):
    """No LATEST and no versions is a new store (stores made before LATEST existed too)."""
    iqkit.create_store(root, "s", partitions=2)
    layout = StoreLayout.of(root, "s")
    assert not layout.latest.exists()
    assert all(r is not FailureReason.STORE_EXCEPTION for r, _ in scan_failures(root).values())
    assert commit(root, "s", a=1) == 1


@pytest.mark.folder_format
def test_a_first_commit_killed_before_latest_leaves_debris_not_corruption(root):
    """The first commit writes ``LATEST`` = 0 before its record: a crash between the record
    and ``LATEST`` is then recognisable debris (a record above LATEST), not a lost LATEST."""
    layout = store_with_versions(root, versions=1)
    # What that crash leaves: LATEST says nothing is published, record 1 and its folders.
    layout.latest.write_text("0\n")
    assert all(r is not FailureReason.STORE_EXCEPTION for r, _ in scan_failures(root).values())
    assert commit(root, "s", b=2) == 1
    with iqkit.open(root) as engine:
        assert [(k, v) for _, k, v in kv_rows(engine, "s")] == [("b", 2)]


# -- item 7 (store files): bytes that are not UTF-8 ----------------------------------------
@pytest.mark.parametrize(
    "which",
    [
        "manifest",
        pytest.param("LATEST", marks=pytest.mark.folder_format),
        pytest.param("record", marks=pytest.mark.folder_format),
    ],
)
def test_non_utf8_bytes_in_a_store_file_are_named(root, which):
    layout = store_with_versions(root, versions=2)
    path = {
        "manifest": layout.manifest,
        "LATEST": layout.latest,
        "record": layout.version_record(2),
    }[which]
    path.write_bytes(path.read_bytes()[:5] + b"\xff\xfe\x80" + path.read_bytes()[5:])
    before = tree_digest(layout.store_dir)

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
    assert tree_digest(layout.store_dir) == before


@pytest.mark.folder_format
def test_a_file_in_place_of_the_leases_folder_breaks_nothing(root):
    """Readers no longer write leases into the store: whatever is at ``leases/`` (a file,
    a stray folder, stale lease files of an older iqkit) is left alone."""
    layout = store_with_versions(root, versions=2, retention=1)
    shutil.rmtree(layout.leases_dir, ignore_errors=True)
    layout.leases_dir.write_text("not a folder")
    with iqkit.open(root) as engine:
        assert sorted(k for _, k, _ in kv_rows(engine, "s")) == ["k1", "k2"]
        assert commit(root, "s", k3=3) == 3
        assert sorted(k for _, k, _ in kv_rows(engine, "s")) == ["k1", "k2", "k3"]
    assert layout.leases_dir.read_text() == "not a folder"


# -- item 3: after publish, a commit is a success --------------------------------------------
@pytest.mark.folder_format
def test_a_stray_folder_in_leases_does_not_fail_a_published_commit(root):
    layout = store_with_versions(root, versions=2, retention=1)
    (layout.leases_dir / "stray").mkdir(parents=True, exist_ok=True)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("k3", 3)
    assert w.version == 3
    with iqkit.open(root) as engine:
        assert engine.version("s") == 3


@pytest.mark.folder_format
def test_a_cleanup_failure_after_publish_is_a_warning_and_the_version_is_reported(root):
    layout = store_with_versions(root, versions=2, retention=2)
    # Version 1 expires at the next commit, but its record cannot be removed: a folder
    # stands at versions/1.json.
    record = layout.version_record(1)
    record.unlink()
    record.mkdir()
    with (
        pytest.warns(StoreCleanupWarning, match=r"version 3 was published") as caught,
        iqkit.StoreWriter(root, "s") as w,
    ):
        w.put("k3", 3)
    assert str(record) in str(caught[0].message)
    assert w.version == 3
    assert layout.latest.read_text().strip() == "3"
    with iqkit.open(root) as engine:
        assert sorted((k, v) for _, k, v in kv_rows(engine, "s")) == [
            ("k1", 1),
            ("k2", 2),
            ("k3", 3),
        ]
    # The problem stays a warning on every later commit; data keeps flowing.
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert commit(root, "s", k4=4) == 4


def test_a_chain_stores_cleanup_failure_after_publish_is_a_warning_too(root, monkeypatch):
    """The chain format's retention (a grace period, then deletes): what it cannot delete
    after a commit published is the same ``StoreCleanupWarning``; the version stands."""
    monkeypatch.setenv("IQKIT_LOCAL_FORMAT", "chain")
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
    assert latest_published(root, "s").version == 4
