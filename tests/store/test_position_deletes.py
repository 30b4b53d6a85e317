"""Position deletes (store/columnar/deletes.py): a delta's twin says which rows of its
chain's older twins a newer file supersedes, and exactly those; chains written without
them (an earlier iqkit) are still merged on keys, and a chain mixing both is merged by
position once its newest twin has them."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iqkit
from iqkit.store.columnar import twins
from iqkit.store.columnar.deletes import SUPERSEDED, footer_schema, read_superseded, writing
from iqkit.store.encoding import key_order
from iqkit.store.partitions.layers import twin_scans
from iqkit.tables import store_batches


def chains(root, store="s"):
    """Each partition's twins of the served version: (name, path, rows), oldest first."""
    with iqkit.open(root) as engine:
        files = engine.twin_files(store)
        try:
            return {
                p: [(f.name, f.path, pq.read_metadata(f.path).num_rows) for f in chain]
                for p, chain in files.partitions.items()
            }
        finally:
            files.release()


def footer(path):
    """A twin's schema metadata as iqkit's readers see it (``deletes.footer_schema``)."""
    return footer_schema(pq.read_metadata(path)).metadata


def keys_of(path):
    """A twin's keys: its ``__key`` where it has one (a tombstone's ``key`` is null
    there), else its key column."""
    column = "__key" if "__key" in pq.read_schema(path).names else "key"
    return pq.read_table(path, columns=[column]).column(column).to_pylist()


def history(root, commits, *, positions=True):
    iqkit.create_store(root, "s", partitions=2, value_serde="json")
    with iqkit.StoreWriter(root, "s") as w:
        for i in range(40):
            w.put(f"k{i:02d}", {"n": i})
    for c in range(1, commits):
        with writing(positions), iqkit.StoreWriter(root, "s") as w:
            for i in range(c, 40, 3):
                w.put(f"k{i:02d}", {"n": 100 * c + i})
            w.delete(f"k{(7 * c) % 40:02d}")


def pairs(table):
    return sorted(zip(table.column("key").to_pylist(), table.column("n").to_pylist(), strict=True))


def rows(root):
    """The store's rows as RocksDB has them."""
    with iqkit.open(root) as engine, twin_scans(False):
        return pairs(store_batches(engine, "s").read_all())


def test_a_deltas_twin_marks_exactly_the_older_rows_a_newer_file_has(tmp_path):
    history(tmp_path, 4)
    check_marks(tmp_path)


def test_a_big_commits_streamed_twin_marks_them_too(tmp_path, monkeypatch):
    """Commits whose rows went through the writer's Arrow buffer (``TwinWriter``: the
    marks go in the footer when the file is finished), read the same as RocksDB."""
    import iqkit.store.sorted_rows as sorted_rows
    import iqkit.store.writer as writer
    from iqkit.store.columnar import twins

    monkeypatch.setattr(writer, "FLUSH_ROWS", 4)
    monkeypatch.setattr(sorted_rows, "_CHUNK_ROWS", 3)
    monkeypatch.setattr(twins, "TWIN_CHUNK_ROWS", 5)
    history(tmp_path, 4)
    check_marks(tmp_path)
    with iqkit.open(tmp_path) as engine:
        assert pairs(store_batches(engine, "s").read_all()) == rows(tmp_path)


def check_marks(root, files=4):
    for chain in chains(root).values():
        assert len(chain) == files
        newest = footer(chain[-1][1])
        deletes = read_superseded(newest, [(n, r) for n, _, r in chain[:-1]])
        assert deletes is not None
        for i, (_, path, _) in enumerate(chain[:-1]):
            newer = {k for _, p, _ in chain[i + 1 :] for k in keys_of(p)}
            mask = deletes.mask(i)
            live = [True] * len(keys_of(path)) if mask is None else mask.tolist()
            assert live == [k not in newer for k in keys_of(path)]


def test_deletes_for_another_chain_are_not_used(tmp_path):
    history(tmp_path, 3)
    chain = next(iter(chains(tmp_path).values()))
    newest = footer(chain[-1][1])
    older = [(n, r) for n, _, r in chain[:-1]]
    assert read_superseded(newest, older) is not None
    assert read_superseded(newest, older[1:]) is None  # another number of files
    assert read_superseded(newest, [(older[0][0], older[0][1] + 1), *older[1:]]) is None
    assert read_superseded(newest, [("other.sst", older[0][1]), *older[1:]]) is None
    assert read_superseded({SUPERSEDED: b"not json"}, older) is None


def test_an_earlier_iqkits_chain_has_none_and_reads_the_same(tmp_path):
    history(tmp_path / "old", 4, positions=False)
    history(tmp_path / "new", 4)
    for chain in chains(tmp_path / "old").values():
        assert SUPERSEDED not in (footer(chain[-1][1]) or {})
    with iqkit.open(tmp_path / "old") as old, iqkit.open(tmp_path / "new") as new:
        a, b = (store_batches(e, "s").read_all() for e in (old, new))
    assert a.equals(b)
    assert pairs(a) == rows(tmp_path / "old")


def test_a_commit_on_an_earlier_iqkits_chain_covers_all_its_files(tmp_path):
    history(tmp_path, 3, positions=False)
    with iqkit.StoreWriter(tmp_path, "s") as w:  # touches both partitions
        for i in range(1, 40, 5):
            w.put(f"k{i:02d}", {"n": -1})
        w.delete("k02")
    for chain in chains(tmp_path).values():
        newest = footer(chain[-1][1])
        assert read_superseded(newest, [(n, r) for n, _, r in chain[:-1]]) is not None
    with iqkit.open(tmp_path) as engine:
        table = store_batches(engine, "s").read_all()
    got = pairs(table)
    assert got == rows(tmp_path)
    assert ("k01", -1) in got and not any(k == "k02" for k, _ in got)


def test_compaction_drops_them(tmp_path):
    history(tmp_path, 11)  # over 9 commits: chains are compacted
    for chain in chains(tmp_path).values():
        assert len(chain) < 4
        assert SUPERSEDED not in (footer(chain[0][1]) or {})


def test_the_lookup_finds_exactly_the_rows_holding_a_key():
    """The binary search behind the marks (``key_order.rows_holding``), against a set:
    keys of every length up to 20 bytes (over one and two 8-byte words) or all of one
    length, zero bytes inside and at the end, shared prefixes, keys with and without the
    user rows' prefix, keys that are not in the file, and duplicates."""
    rng = random.Random(36)
    letters = [b"\x00", b"\x01", b"a", b"b", b"\xff"]

    def key(longest, fixed=False):
        size = longest if fixed else rng.randint(0, longest)
        return b"".join(rng.choice(letters) for _ in range(size))

    for _ in range(3000):
        fixed = rng.random() < 0.4  # keys of one length: numpy's search of ``S<n>`` values
        longest = rng.choice([1, 2, 9, 20])
        hay = sorted({key(longest, fixed) for _ in range(rng.randint(0, 50))})
        wanted = [
            rng.choice(hay) if hay and rng.random() < 0.5
            else key(longest, fixed) if rng.random() < 0.8 else key(18)
            for _ in range(rng.randint(0, 25))
        ]  # fmt: skip
        prefixed = rng.random() < 0.5
        given = wanted if prefixed else [b"\x01" + k for k in wanted] + [b"\x02a", b""]
        needles = key_order.needles(pa.array(given, pa.binary()), b"" if prefixed else b"\x01")
        got = key_order.rows_holding(pa.array(hay, pa.binary()), needles)
        assert got.tolist() == [k in set(wanted) for k in hay], (hay, wanted, prefixed)


LETTERS = [b"\x00", b"\x01", b"a", b"b", b"\xff"]
#: Keys of mixed lengths (zero bytes inside and at the end, shared prefixes).
MIXED_KEYS = st.lists(st.sampled_from(LETTERS), max_size=10).map(b"".join)


@settings(max_examples=300)
@given(data=st.data())
def test_a_column_in_chunks_is_searched_as_the_whole_column(data):
    """``rows_holding`` over a column in chunks (as Parquet reads one: its row groups,
    cut into pieces of ``_PIECE_ROWS``; empty chunks among them; chunked or streamed)
    marks what a search of the same keys in one array marks, and that is the rows
    holding a key: keys of mixed lengths or all of one length (then needles of other
    lengths too), needles inside, between and outside the column's keys, duplicated, in
    any order, or none."""
    size = data.draw(st.integers(0, 10))  # 0: keys of mixed lengths
    one_length = st.lists(st.sampled_from(LETTERS), min_size=size, max_size=size).map(b"".join)
    keys = one_length if size else MIXED_KEYS
    hay = sorted(data.draw(st.sets(keys, max_size=60)))
    anything = keys | MIXED_KEYS
    wanted = data.draw(st.lists(st.sampled_from(hay) | anything if hay else anything, max_size=30))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(hay)), max_size=6)))
    kind = data.draw(st.sampled_from([pa.binary(), pa.large_binary()]))
    bounds = [0, *cuts, len(hay)]
    chunks = [pa.array(hay[a:b], kind) for a, b in itertools.pairwise(bounds)]
    given_keys = [b"\x01" + k for k in wanted] + [b"\x02a", b""]  # with the user rows' prefix
    needles = key_order.needles(pa.array(given_keys, pa.binary()), b"\x01")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(key_order, "_PIECE_ROWS", data.draw(st.sampled_from([1, 2, 3, 1 << 16])))
        got = key_order.rows_holding(pa.chunked_array(chunks, kind), needles)
        streamed = key_order.rows_holding(iter(chunks), needles)  # as a twin is decoded
    whole = key_order.rows_holding(pa.array(hay, kind), needles)
    assert got.tolist() == streamed.tolist() == whole.tolist() == [k in set(wanted) for k in hay]


KEYS = {
    # shared prefixes, zero bytes at the end, one and two words long
    "bytes": [b"", b"\x00", b"\x00\x00", b"a", b"a\x00", b"a\x00\x01", b"ab" * 4,
              b"ab" * 4 + b"\x00", b"ab" * 4 + b"\x00\x00", b"ab" * 9, b"\xff" * 17],
    "int64": [-(2**63), -5, -1, 0, 1, 7, 2**40, 2**63 - 1],  # negatives after positives
    "json": [0, 1, 10, 2, -3, 100],  # keys in ``__key``
}  # fmt: skip


@pytest.mark.parametrize("key_serde", sorted(KEYS))
def test_marks_for_keys_of_every_form(tmp_path, monkeypatch, key_serde):
    """Deltas updating and deleting the first and the last row of the base, and keys on
    row group boundaries (groups of 3 rows); a third delta whose marks are its
    predecessor's plus its own (the incremental path) and a commit after one written
    without marks (every newer file's keys looked up)."""
    monkeypatch.setattr(twins, "ROW_GROUP_ROWS", 3)
    keys = KEYS[key_serde]
    iqkit.create_store(tmp_path, "s", partitions=1, key_serde=key_serde, value_serde="json")
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for i, k in enumerate(keys):
            w.put(k, {"n": i})
    steps = [
        (keys[:1] + keys[-1:], []),  # the first and last rows written again
        (keys[3:4], keys[:1]),  # the first row deleted: the delta's own row
        (keys[2:6], keys[-1:]),  # a row group's last and next's first
        (keys[1:2], []),
    ]
    for c, (puts, gone) in enumerate(steps, start=1):
        with writing(c != 3), iqkit.StoreWriter(tmp_path, "s") as w:
            for k in puts:
                w.put(k, {"n": 100 * c})
            for k in gone:
                w.delete(k)
        if c != 3:
            check_marks(tmp_path, files=c + 1)
    with iqkit.open(tmp_path) as engine:
        got = store_batches(engine, "s").read_all()
    with iqkit.open(tmp_path) as engine, twin_scans(False):
        want = store_batches(engine, "s").read_all()
    assert got.equals(want)
