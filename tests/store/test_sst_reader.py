"""The Python reader of iqkit's SST files against RocksDB's own writer: every row of
random files (binary keys, empty and long values, tombstones) read back whole and key by
key, missing keys answered as missing; files it does not know are refused, and the
version queries then read them through RocksDB with the same answers."""

from __future__ import annotations

import random

import pytest
from rocksdict import BlockBasedOptions, DBCompressionType

import iqkit
from iqkit import MultiVersionedKeyQuery, RangeQuery, StateQueryRequest
from iqkit.store.partitions import rocks
from iqkit.store.partitions.sst_reader import MISSING, SstFile, UnsupportedSst


def _random_rows(rng: random.Random, n: int) -> list[tuple[bytes, bytes | None]]:
    keys = sorted({rng.randbytes(rng.randint(1, 24)) for _ in range(n)})
    return [
        (k, None if rng.random() < 0.2 else rng.randbytes(rng.choice((0, 3, 40, 700))))
        for k in keys
    ]


@pytest.mark.parametrize("seed", range(6))
def test_every_row_and_every_lookup_equal_what_rocksdb_wrote(tmp_path, seed):
    rng = random.Random(seed)
    for n in (1, 17, 900, 20_000):
        rows = _random_rows(rng, n)
        path = tmp_path / f"{n}.sst"
        rocks.write_changes_sst(path, rows)
        with SstFile(open(path, "rb")) as sst:
            assert list(sst.items()) == rows
            stored = dict(rows)
            for key, value in rng.sample(rows, min(300, len(rows))):
                assert sst.get(key) == value
            for _ in range(300):
                probe = rng.randbytes(rng.randint(0, 24))
                expected = stored.get(probe, MISSING)
                got = sst.get(probe)
                assert got is expected if expected is MISSING else got == expected
            # a key just before, between and after the stored ones
            assert sst.get(b"") is MISSING
            assert sst.get(rows[-1][0] + b"\x00") is MISSING


def test_what_it_does_not_know_is_refused(tmp_path):
    text = tmp_path / "not.sst"
    text.write_bytes(b"not an sst file at all" * 10)
    with pytest.raises(UnsupportedSst):
        SstFile(open(text, "rb"))  # noqa: SIM115 (SstFile closes it)
    rows = [(b"k%04d" % i, b"v" * 50) for i in range(500)]
    good = tmp_path / "good.sst"
    rocks.write_changes_sst(good, rows)
    cut = tmp_path / "cut.sst"
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(UnsupportedSst):
        SstFile(open(cut, "rb"))  # noqa: SIM115


@pytest.fixture
def lz4_writers(monkeypatch):
    """Every SST written in the block is LZ4-compressed (files of another writer's
    options, which the reader does not know)."""
    original = rocks._options

    def lz4(*, create: bool):
        opts = original(create=create)
        opts.set_compression_type(DBCompressionType.lz4())
        return opts

    monkeypatch.setattr(rocks, "_options", lz4)


def test_files_the_reader_refuses_are_read_through_rocksdb(tmp_path, lz4_writers):
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for n in range(5):
        with iqkit.StoreWriter(root, "s") as w:
            w.put("a", n // 2)
            for i in range(300):  # enough alike rows that RocksDB compresses the blocks
                w.put(f"filler-{i:05d}", 7)
    sst = next((root / "s" / "sst" / "0").glob("*.sst"))
    with pytest.raises(UnsupportedSst, match="compression"):
        SstFile(open(sst, "rb")).get(b"\x01a")  # noqa: SIM115
    request = (
        StateQueryRequest.in_store("s")
        .with_query(MultiVersionedKeyQuery.with_key("a").with_ascending_timestamps())
        .enable_execution_info()
    )
    with iqkit.open(root) as engine:
        (qr,) = engine.query(request).partition_results.values()
    assert [(r.value, r.version) for r in qr.result] == [(0, 1), (1, 3), (2, 5)]
    assert "layered database" in " ".join(qr.execution_info)


@pytest.fixture
def snappy_writers(monkeypatch):
    """Every SST written in the block has the options iqkit wrote before zstd: Snappy
    blocks of 4 KiB (RocksDB's defaults). ``monkeypatch.undo()`` ends the block."""
    original = rocks._options

    def snappy(*, create: bool):
        opts = original(create=create)
        opts.set_compression_type(DBCompressionType.snappy())
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        return opts

    monkeypatch.setattr(rocks, "_options", snappy)


def _json_rows(n: int) -> list[tuple[bytes, bytes | None]]:
    """Rows like issue 36's: a JSON record of a random float, an int and a string."""
    rng = random.Random(36)
    names = ["".join(rng.choices("abcdefghijklmnop", k=rng.randint(4, 14))) for _ in range(50)]
    return [
        (
            b"\x01user%09d" % i,
            None
            if i % 97 == 0
            else b'{"total":%r,"n":%d,"region":"%s"}'
            % (rng.random() * 1000, rng.randrange(1000), rng.choice(names).encode()),
        )
        for i in range(n)
    ]


def test_iqkit_writes_zstd_blocks_the_reader_reads(tmp_path, snappy_writers, monkeypatch):
    rows = _json_rows(20_000)
    old = tmp_path / "snappy.sst"
    rocks.write_changes_sst(old, rows)
    monkeypatch.undo()  # iqkit's own options from here
    new = tmp_path / "zstd.sst"
    rocks.write_changes_sst(new, rows)
    assert new.stat().st_size < 0.7 * old.stat().st_size
    for path in (old, new):
        with SstFile(open(path, "rb")) as sst:
            assert list(sst.items()) == rows
            assert all(sst.get(k) == v for k, v in rows[::191])
            assert sst.get(b"\x01user") is MISSING


def test_a_store_written_with_snappy_reads_and_compacts_after_zstd(
    tmp_path, snappy_writers, monkeypatch
):
    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=1, value_serde="int64")
    for n in range(4):  # written before zstd: Snappy SSTs
        with iqkit.StoreWriter(root, "s") as w:
            w.put("a", n)
            for i in range(300):
                w.put(f"filler-{i:05d}", n)
    monkeypatch.undo()
    for n in range(4, 7):  # zstd SSTs above them in the same chain
        with iqkit.StoreWriter(root, "s") as w:
            w.put("a", n)
            w.put(f"filler-{n:05d}", -n)
    history = (
        StateQueryRequest.in_store("s")
        .with_query(MultiVersionedKeyQuery.with_key("a").with_ascending_timestamps())
        .enable_execution_info()
    )
    expected = {f"filler-{i:05d}": 3 for i in range(300)} | {"a": 6}
    expected |= {f"filler-{n:05d}": -n for n in range(4, 7)}
    with iqkit.open(root) as engine:
        (qr,) = engine.query(history).partition_results.values()
        assert [r.value for r in qr.result] == list(range(7))
        # read in place from every file, Snappy and zstd alike (no database built)
        assert "layered database" not in " ".join(qr.execution_info)
    assert _all_rows(root) == expected
    iqkit.compact(root, "s")
    assert _all_rows(root) == expected


def _all_rows(root) -> dict:
    with iqkit.open(root) as engine:
        request = StateQueryRequest.in_store("s").with_query(RangeQuery.with_no_bounds())
        result = engine.query(request)
        (qr,) = result.partition_results.values()
        with qr.result as it:
            return {kv.key: kv.value for kv in it}


def test_zstd_with_a_dictionary_is_refused(tmp_path, monkeypatch):
    original = rocks._options

    def with_dictionary(*, create: bool):
        opts = original(create=create)
        opts.set_compression_options(-14, 1, 0, 16_384)  # a 16 KiB dictionary
        return opts

    monkeypatch.setattr(rocks, "_options", with_dictionary)
    rows = _json_rows(5_000)
    path = tmp_path / "dict.sst"
    rocks.write_changes_sst(path, rows)
    with pytest.raises(UnsupportedSst, match="dictionary"):
        SstFile(open(path, "rb"))  # noqa: SIM115 (SstFile closes it)
