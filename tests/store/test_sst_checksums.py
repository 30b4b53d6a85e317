"""iqkit's own SST reader (store/partitions/sst_reader.py) checks every block's trailer
checksum as RocksDB does: on sound files every key reads as RocksDB reads it, and on
damaged ones (flipped bits, cut files, zeroed pages) it gives the undamaged answer or
refuses, never a wrong one."""

from __future__ import annotations

import random

import pytest

from iqkit.errors import StoreCorruptedError
from iqkit.store.partitions import rocks
from iqkit.store.partitions.sst_reader import MISSING, SstFile, UnsupportedSst

KEYS = 3000


def rows() -> list[tuple[bytes, bytes | None]]:
    rng = random.Random(7)
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(KEYS):
        key = b"\x01k%06d" % (i * 2)  # odd numbers are never written: absent keys
        value = None if i % 41 == 0 else rng.randbytes(rng.randrange(1, 120))
        out.append((key, value))
    return out


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("sst") / "f.sst"
    rocks.write_changes_sst(path, rows())
    return path.read_bytes()


def reader(data: bytes) -> SstFile:
    """The reader over ``data`` (a real file descriptor: the reader uses pread)."""
    import tempfile

    fh = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the reader)
    fh.write(data)
    fh.flush()
    return SstFile(fh, name="f.sst")


def test_a_sound_file_reads_every_key_as_written(sst):
    expected = dict(rows())
    with reader(sst) as f:
        assert dict(f.items()) == expected
        for i in range(0, 2 * KEYS, 7):
            key = b"\x01k%06d" % i
            got = f.get(key)
            assert (got if got is not MISSING else "missing") == expected.get(key, "missing")


def damaged_copies(data: bytes, n: int, rng: random.Random):
    for i in range(n):
        copy = bytearray(data)
        how = ("flip", "truncate", "zero")[i % 3]
        if how == "flip":
            at = rng.randrange(len(copy))
            copy[at] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            del copy[rng.randrange(len(copy)) :]
        else:
            page = rng.randrange(0, len(copy), 4096) if len(copy) > 4096 else 0
            copy[page : page + 4096] = bytes(len(copy[page : page + 4096]))
        if bytes(copy) != data:
            yield how, bytes(copy)


def test_damage_gives_the_undamaged_answer_or_a_refusal_never_a_wrong_one(sst):
    expected = dict(rows())
    rng = random.Random(2026)
    probes = [b"\x01k%06d" % rng.randrange(2 * KEYS) for _ in range(40)]
    counts = {"right": 0, "refused": 0, "wrong": 0}
    wrong = []
    for how, data in damaged_copies(sst, 300, rng):
        try:
            with reader(data) as f:
                for key in probes:
                    got = f.get(key)
                    if (got if got is not MISSING else "missing") != expected.get(key, "missing"):
                        counts["wrong"] += 1
                        wrong.append((how, key))
                        break
                else:
                    if dict(f.items()) != expected:
                        counts["wrong"] += 1
                        wrong.append((how, "items"))
                    else:
                        counts["right"] += 1
        except (StoreCorruptedError, UnsupportedSst):
            counts["refused"] += 1
    print(counts)
    assert counts["wrong"] == 0, wrong[:5]
    assert counts["refused"] > 200  # the checks refuse; most damage is to blocks


def test_a_flipped_block_bit_names_the_file_and_the_block(sst):
    copy = bytearray(sst)
    copy[100] ^= 0x10  # inside the first data block
    with (
        pytest.raises(StoreCorruptedError, match=r"f\.sst is damaged: its block at offset 0"),
        reader(bytes(copy)) as f,
    ):
        list(f.items())


def test_an_unknown_checksum_type_is_left_to_rocksdb(sst):
    copy = bytearray(sst)
    copy[-53] = 1  # the footer's checksum type: CRC32c, which iqkit does not write
    with pytest.raises(UnsupportedSst, match="checksum type 1"):
        reader(bytes(copy))


