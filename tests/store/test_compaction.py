"""Compaction off the commit path (store/chain/compaction.py): a version of its own that
replaces a chain's files by one base, with the same rows, positions and change feed; a
commit that raced it is rebased on it, not lost; what it uploaded and did not publish is
removed."""

from __future__ import annotations

import pytest
from helpers import kv_rows

import iqkit
from iqkit import ChangesQuery, StateQueryRequest
from iqkit.store.chain import compaction, write
from iqkit.store.chain.records import latest_version, list_versions, read_version
from iqkit.store.chain.write import COMPACT_AFTER_DELTAS
from iqkit.store.objects import open_objects


def commit(root, i: int, **kw) -> iqkit.StoreWriter:
    with iqkit.StoreWriter(root, "s", **kw) as w:
        for k in range(i, i + 5):
            w.put(f"k{k}", {"v": i}, source=("t", 0, i))
        w.record_applied({"t": {0: i}})  # every partition is written (its position)
    return w


def chains(root) -> dict[int, int]:
    record = latest_version(open_objects(root), "s")
    return {p: len(c.files) for p, c in record.partitions.items()}


def changes(root, version: int) -> list:
    """The changes ``version`` made (after the version before it)."""
    query = ChangesQuery.between(version - 1, version)
    with iqkit.open(root) as engine:
        r = engine.query(StateQueryRequest.in_store("s").with_query(query))
        out = []
        for _, qr in sorted(r.partition_results.items()):
            assert qr.is_success, qr.failure_message
            out.extend(qr.result)
        return out


@pytest.fixture
def root(tmp_path):
    iqkit.create_store(tmp_path, "s", partitions=2)
    return tmp_path


def test_a_background_compaction_publishes_the_same_rows_as_its_own_version(root):
    for i in range(COMPACT_AFTER_DELTAS + 1):
        w = commit(root, i, compaction="background")
        assert w.compacting is None
    before = kv_rows(iqkit.open(root), "s")
    w = commit(root, 100, compaction="background")  # a 9th delta: too long
    lengths = chains(root)
    assert max(lengths.values()) == COMPACT_AFTER_DELTAS + 2  # published as it was
    assert w.compacting is not None
    w.compacting.join()
    record = latest_version(open_objects(root), "s")
    assert record.version == w.version + 1
    long = sorted(p for p, n in lengths.items() if n > 1 + COMPACT_AFTER_DELTAS)
    assert record.metadata["compacted"] == long
    assert chains(root) == {p: 1 if p in long else n for p, n in lengths.items()}
    engine = iqkit.open(root)
    assert kv_rows(engine, "s") == kv_rows(iqkit.open(root, as_of=w.version), "s")
    assert len(kv_rows(engine, "s")) == len(before) + 5
    assert changes(root, record.version) == []  # nothing changed
    assert {c.key for c in changes(root, w.version)} == {f"k{k}" for k in range(100, 105)}
    positions = {p: c.commit_record()["position"] for p, c in record.partitions.items()}
    previous = latest_version(open_objects(root), "s").partitions
    assert positions == {p: c.commit_record()["position"] for p, c in previous.items()}


def test_inline_is_the_default_and_compacts_inside_the_commit(root):
    for i in range(COMPACT_AFTER_DELTAS + 2):
        w = commit(root, i)
        assert w.compacting is None
    assert set(chains(root).values()) == {1}
    assert list_versions(open_objects(root), "s") == list(range(1, COMPACT_AFTER_DELTAS + 3))


def test_a_commit_that_lands_during_a_compaction_is_rebased_on_it(root, monkeypatch):
    for i in range(4):
        commit(root, i)
    real = write.compact_files
    raced = []

    def build_then_race(*args, **kwargs):
        real(*args, **kwargs)
        if not raced:  # a real commit lands between the build and the publish
            raced.append(commit(root, 500).version)

    monkeypatch.setattr(compaction, "compact_files", build_then_race)
    version = iqkit.compact(root, "s")
    assert version == raced[0] + 1
    lengths = chains(root)
    assert set(lengths.values()) == {2}  # the base, and the raced delta on top
    rows = {k: v for _, k, v in kv_rows(iqkit.open(root), "s")}
    assert all(rows[f"k{k}"] == {"v": 500} for k in range(500, 505))
    assert kv_rows(iqkit.open(root), "s") == kv_rows(iqkit.open(root, as_of=raced[0]), "s")


def test_a_chain_replaced_meanwhile_is_left_and_the_unpublished_base_removed(root, monkeypatch):
    for i in range(3):
        commit(root, i)
    real = write.compact_files

    def build_then_compact_inline(*args, **kwargs):
        real(*args, **kwargs)
        for i in range(COMPACT_AFTER_DELTAS):  # the last of them compacts every chain inline
            commit(root, 100 + i)

    monkeypatch.setattr(compaction, "compact_files", build_then_compact_inline)
    assert iqkit.compact(root, "s") is None
    objects = open_objects(root)
    listed = {
        f.name
        for v in list_versions(objects, "s")
        for c in read_version(objects, "s", v).partitions.values()
        for f in c.files
    }
    on_disk = {p.relative_to(root).as_posix() for p in (root / "s" / "sst").rglob("*.sst")}
    assert on_disk == listed  # the bases it built and could not publish are gone


def test_compact_compacts_every_chain_with_deltas_once(root):
    for i in range(3):
        commit(root, i)
    assert max(chains(root).values()) > 1
    before = kv_rows(iqkit.open(root), "s")
    version = iqkit.compact(root, "s")
    assert version == 4 and set(chains(root).values()) == {1}
    assert kv_rows(iqkit.open(root), "s") == before
    assert iqkit.compact(root, "s") is None


def test_bad_compaction_mode_and_read_only_roots_are_refused(root):
    with pytest.raises(ValueError, match="compaction must be one of"):
        iqkit.StoreWriter(root, "s", compaction="sometimes")
