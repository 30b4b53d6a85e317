"""iqkit's own SST reader (store/partitions/sst_reader.py) verifies checksums exactly as
RocksDB does: the footer's, and every block's trailer before the block is used, for each
checksum type RocksDB writes. On sound files (written through rocksdict, as iqkit writes
them) every block verifies and every key reads as RocksDB reads it; on damaged copies
(single-bit flips, truncations, zeroed 4 KiB pages) every answer is the undamaged one or
a refusal (``StoreCorruptedError`` for a checksum mismatch, ``UnsupportedSst`` for a file
too mangled to find its blocks in), never a wrong one. Without the checks the
fault-injection test fails: a flipped bit in a data block then reads as a wrong value or
a present key read as absent."""

from __future__ import annotations

import os
import random
import shutil
import struct
import time

import pytest
import xxhash
from rocksdict import BlockBasedOptions, ChecksumType, Options

from iqkit.errors import StoreCorruptedError
from iqkit.store.partitions import rocks
from iqkit.store.partitions.sst_reader import MISSING, SstFile, UnsupportedSst

_FOOTER = 53


def _rows(seed: int, n: int) -> list[tuple[bytes, bytes | None]]:
    """``n`` rows of binary keys, values of varied sizes (empty to 3 KB, random bytes and
    runs that Snappy compresses: both kinds of block), one in ten a tombstone."""
    rng = random.Random(seed)
    keys = sorted({b"k" + rng.randbytes(rng.randint(1, 12)) for _ in range(n)})
    rows: list[tuple[bytes, bytes | None]] = []
    for key in keys:
        if rng.random() < 0.1:
            rows.append((key, None))
            continue
        size = rng.choice((0, 1, 9, 40, 120, 400, 1500, 3000))
        if rng.random() < 0.5:
            rows.append((key, rng.randbytes(size)))
        else:
            rows.append((key, bytes([rng.randrange(4)]) * size))
    return rows


def _absent(rows: list[tuple[bytes, bytes | None]], rng: random.Random, n: int) -> list[bytes]:
    """Keys not in ``rows``: before, between and after them."""
    held = {k for k, _ in rows}
    out = [b"", b"\x00", b"zzzz"]
    while len(out) < n:
        key = rng.choice(rows)[0] + rng.randbytes(rng.randint(0, 2))
        if key not in held:
            out.append(key)
    return out


def _answer(value: object) -> object:
    return "missing" if value is MISSING else value


def _blocks(path) -> list[tuple[int, int, str]]:
    """(offset, size, what) of every block of the file: those the metaindex names and
    every data block the index names (read through the reader, so verified)."""
    data = path.read_bytes()
    footer_offset = len(data) - _FOOTER
    meta_size = struct.unpack_from("<I", data, footer_offset + 13)[0]
    meta_offset = footer_offset - 5 - meta_size
    out = [(meta_offset, meta_size, "metaindex")]
    from iqkit.store.partitions.sst_reader import _Block, _varint

    for name, value in _Block(data[meta_offset : meta_offset + meta_size]).entries():
        offset, pos = _varint(value, 0)
        size, _ = _varint(value, pos)
        out.append((offset, size, name.decode()))
    with SstFile(open(path, "rb")) as f:
        out += [(o, s, "data") for o, s in f._all_blocks()]
    return out


def _xxh3_trailer(data: bytes, offset: int, size: int) -> tuple[int, int]:
    """(stored, computed) checksum of the block at ``offset``, by RocksDB's kXXH3 rule
    written out here independently of the reader (table/format.cc)."""
    base = struct.unpack_from("<I", data, len(data) - _FOOTER + 9)[0]
    kind = data[offset + size]
    computed = (xxhash.xxh3_64_intdigest(data[offset : offset + size]) & 0xFFFFFFFF) ^ (
        (kind * 0x6B9083D9) & 0xFFFFFFFF
    )
    context = base ^ (((offset & 0xFFFFFFFF) + (offset >> 32)) & 0xFFFFFFFF)
    stored = struct.unpack_from("<I", data, offset + size + 1)[0]
    return stored, (computed + context) & 0xFFFFFFFF


def _rocksdb_answers(tmp_path, path, keys: list[bytes]) -> tuple[dict, list]:
    """RocksDB's own reading of ``path`` (a copy ingested into a new database): each key's
    value or None, and every live row."""
    copy = tmp_path / "ingest.sst"
    shutil.copyfile(path, copy)
    db = rocks.open_for_build(tmp_path / "db")
    try:
        rocks.ingest(db, [str(copy)])
        return {k: db.get(k) for k in keys}, list(rocks.scan(db, b"", None))
    finally:
        rocks.close_quietly(db)


@pytest.fixture
def checksum_type(request, monkeypatch):
    """Every SST written in the test carries ``request.param``'s checksum (iqkit's
    options otherwise: XXH3 is what iqkit writes, RocksDB's default)."""
    original = rocks._options

    def with_checksum(*, create: bool) -> Options:
        opts = original(create=create)
        table = BlockBasedOptions()
        table.set_checksum_type(getattr(ChecksumType, request.param)())
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        return opts

    if request.param != "iqkit":
        monkeypatch.setattr(rocks, "_options", with_checksum)
    return request.param


_FOOTER_TYPE = {"iqkit": 4, "xxh3": 4, "xxhash64": 3, "xxhash": 2, "crc32c": 1}


def _crc32c_installed() -> bool:
    from iqkit.store.partitions.sst_reader import _crc32c_library

    return _crc32c_library() is not None


@pytest.mark.parametrize("checksum_type", ["iqkit", "xxhash", "xxhash64", "crc32c"], indirect=True)
@pytest.mark.parametrize("n", [1, 40, 3000])
def test_on_sound_files_every_block_verifies_and_every_key_reads_as_rocksdb_reads_it(
    tmp_path, checksum_type, n
):
    rows = _rows(n, n)
    path = tmp_path / "f.sst"
    rocks.write_changes_sst(path, rows)
    data = path.read_bytes()
    assert data[-_FOOTER] == _FOOTER_TYPE[checksum_type]
    rng = random.Random(n)
    present = [k for k, _ in rng.sample(rows, min(200, len(rows)))]
    absent = _absent(rows, rng, 50)
    if checksum_type == "crc32c" and not _crc32c_installed():
        with pytest.raises(UnsupportedSst, match="CRC32c"):
            SstFile(open(path, "rb"))  # noqa: SIM115 (SstFile closes it)
        return
    # every block: the footer, metaindex, properties and index at opening, each data
    # block as items() reads it
    with SstFile(open(path, "rb"), name="f.sst") as f:
        assert list(f.items()) == rows
        got = {k: f.get(k) for k in present + absent}
    blocks = _blocks(path)
    kinds = {data[o + s] for o, s, what in blocks}
    if n >= 3000:  # uncompressed (metaindex, properties...) and zstd blocks both verified
        assert kinds == {0, 7} and 7 in {data[o + s] for o, s, what in blocks if what == "data"}
    if checksum_type == "iqkit":  # the rule, written out independently, on every block
        for offset, size, _what in blocks:
            stored, computed = _xxh3_trailer(data, offset, size)
            assert stored == computed
    expected, live = _rocksdb_answers(tmp_path, path, present + absent)
    assert live == [(k, v) for k, v in rows if v is not None]
    for key in present + absent:
        # RocksDB answers None for a tombstone and for a key the file lacks alike
        mine = got[key]
        assert (None if mine is MISSING else mine) == expected[key], key


@pytest.mark.parametrize("checksum_type", ["iqkit"], indirect=True)
def test_the_reader_verifies_iqkits_store_files(tmp_path, checksum_type):
    """The chain SSTs a StoreWriter publishes (<root>/<store>/sst/<partition>/...)."""
    import iqkit

    root = tmp_path / "root"
    iqkit.create_store(root, "s", partitions=2, value_serde="int64")
    for n in range(3):
        with iqkit.StoreWriter(root, "s") as w:
            for i in range(2000 if n == 0 else 100):
                w.put(f"k-{i:05d}-{n}", i * n)
            if n:
                w.delete("k-00001-0")
    files = sorted(root.glob("s/sst/*/*.sst"))
    assert len(files) == 6
    for path in files:
        data = path.read_bytes()
        assert data[-_FOOTER] == 4  # kXXH3
        for offset, size, _what in _blocks(path):
            stored, computed = _xxh3_trailer(data, offset, size)
            assert stored == computed
        with SstFile(open(path, "rb")) as f:
            rows = list(f.items())
            assert rows and all(f.get(k) == v for k, v in rows)


@pytest.fixture(scope="module")
def big_sst(tmp_path_factory):
    """A real multi-block SST of 5,000 keys as iqkit writes it, and its rows."""
    rows = _rows(2026, 5000)
    path = tmp_path_factory.mktemp("big") / "big.sst"
    rocks.write_changes_sst(path, rows)
    return path, rows


def test_a_flipped_bit_in_a_block_names_the_file_the_block_and_both_checksums(big_sst, tmp_path):
    path = big_sst[0]
    data = bytearray(path.read_bytes())
    offset, size, _what = next(b for b in _blocks(path) if b[2] == "data" and b[0] > 0)
    data[offset + size // 2] ^= 0x04
    stored, computed = _xxh3_trailer(bytes(data), offset, size)
    assert stored != computed
    damaged = tmp_path / "damaged.sst"
    damaged.write_bytes(bytes(data))
    message = (
        f"sst/0/x.sst: block at offset {offset} (size {size}): checksum mismatch "
        f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
    )
    with (
        pytest.raises(StoreCorruptedError) as err,
        SstFile(open(damaged, "rb"), name="sst/0/x.sst") as f,
    ):
        list(f.items())
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("at", "what"),
    [
        (-53, "checksum type"),  # 4 (XXH3) becomes 5: unknown, left to RocksDB
        (-48, "footer checksum"),
        (-44, "base context checksum"),
        (-40, "metaindex size"),
        (-20, "reserved bytes"),
    ],
)
def test_footer_damage_is_caught_by_the_footer_checksum(big_sst, tmp_path, at, what):
    path = big_sst[0]
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    damaged = tmp_path / "damaged.sst"
    damaged.write_bytes(bytes(data))
    if what == "checksum type":
        with pytest.raises(UnsupportedSst, match="checksum type 5"):
            SstFile(open(damaged, "rb"))  # noqa: SIM115
        data[at] = 3  # xxHash64: a type the reader knows, so the footer must fail it
        damaged.write_bytes(bytes(data))
    with pytest.raises(
        StoreCorruptedError,
        match=rf"^f\.sst: footer at offset {len(data) - _FOOTER}: checksum mismatch \(stored",
    ):
        SstFile(open(damaged, "rb"), name="f.sst")  # noqa: SIM115


def _damages(size: int, rng: random.Random):
    """(how, offset, bit) of 300 damages: single-bit flips anywhere (150) and in the
    file's last 16 KiB (60: footer, metaindex, properties, index), truncations (45, half
    of them in the last 16 KiB) and zeroed 4 KiB pages (45, one in five the last page)."""
    tail = size - 16 * 1024
    for i in range(210):
        yield (
            "flip",
            rng.randrange(size) if i < 150 else rng.randrange(tail, size),
            rng.randrange(8),
        )
    for i in range(45):
        yield "truncate", rng.randrange(size) if i % 2 else rng.randrange(tail, size), 0
    for i in range(45):
        last = (size - 1) // 4096 * 4096
        yield "zero", last if i % 5 == 0 else rng.randrange(0, size, 4096), 0


def test_damage_gives_the_undamaged_answer_or_a_refusal_never_a_wrong_one(big_sst, tmp_path):
    path, rows = big_sst
    sound = path.read_bytes()
    size = len(sound)
    expected = dict(rows)
    rng = random.Random(34)
    present = [k for k, _ in rng.sample(rows, 40)]
    absent = _absent(rows, rng, 20)
    work = tmp_path / "work.sst"
    shutil.copyfile(path, work)
    counts = {
        how: {"copies": 0, "refused": 0, "all right": 0, "wrong": 0}
        for how in ("flip", "truncate", "zero")
    }
    answers = {"right": 0, "corrupted": 0, "unsupported": 0, "wrong": 0}
    wrong: list[tuple[str, int, object]] = []
    started = time.perf_counter()
    fd = os.open(work, os.O_RDWR)
    try:
        for how, at, bit in _damages(size, rng):
            # damage the working copy in place (and undo it after): no 1.5 MB copy each
            if how == "flip":
                os.pwrite(fd, bytes([sound[at] ^ (1 << bit)]), at)
            elif how == "truncate":
                os.ftruncate(fd, at)
            else:
                os.pwrite(fd, bytes(len(sound[at : at + 4096])), at)
            outcome: list[str] = []
            try:
                f = SstFile(open(work, "rb"), name="work.sst")  # noqa: SIM115
            except StoreCorruptedError:
                outcome.append("corrupted")
            except UnsupportedSst:
                outcome.append("unsupported")
            else:
                with f:
                    for key in present + absent:
                        try:
                            got = _answer(f.get(key))
                        except StoreCorruptedError:
                            outcome.append("corrupted")
                            continue
                        except UnsupportedSst:
                            outcome.append("unsupported")
                            continue
                        if got == _answer(expected.get(key, MISSING)):
                            outcome.append("right")
                        else:
                            outcome.append("wrong")
                            wrong.append((how, at, key))
                    try:
                        every = list(f.items())
                    except StoreCorruptedError:
                        outcome.append("corrupted")
                    except UnsupportedSst:
                        outcome.append("unsupported")
                    else:
                        outcome.append("right" if every == rows else "wrong")
                        if every != rows:
                            wrong.append((how, at, "items"))
            for answer in outcome:
                answers[answer] += 1
            tally = counts[how]
            tally["copies"] += 1
            if "wrong" in outcome:
                tally["wrong"] += 1
            elif "right" in outcome and len(set(outcome)) == 1:
                tally["all right"] += 1
            else:
                tally["refused"] += 1
            # undo
            if how == "truncate":
                os.pwrite(fd, sound[at:], at)
            else:
                os.pwrite(fd, sound[at : at + 4096], at)
    finally:
        os.close(fd)
    assert work.read_bytes() == sound
    print(
        f"\n{size} bytes, {len(rows)} rows, {len(present)} present + {len(absent)} absent "
        f"keys and items() per damaged copy, {time.perf_counter() - started:.1f} s"
    )
    for how, tally in counts.items():
        print(f"  {how:8s} {tally}")
    print(f"  answers  {answers}")
    assert not wrong, wrong[:5]
    assert sum(t["copies"] for t in counts.values()) == 300
    # the checks do refuse: most damage lands in blocks the reads use
    assert answers["corrupted"] > answers["unsupported"]
    assert sum(t["refused"] for t in counts.values()) > 200
