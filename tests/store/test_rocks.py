"""``store/partitions/rocks.py``'s bounded scans against a model: the sorted keys in range."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from iqkit.store.partitions import rocks

KEYS = sorted({bytes([a, b]) for a in range(0, 6) for b in (0, 1, 7, 255)} | {b"\x03", b""})


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    database = Rdict(str(tmp_path_factory.mktemp("rocks") / "db"), Options(raw_mode=True))
    for key in KEYS:
        database[key] = key * 2
    yield database
    database.close()


_BOUND = st.binary(max_size=3)


@settings(max_examples=150, deadline=None)
@given(lower=_BOUND, upper=st.none() | _BOUND, reverse=st.booleans())
def test_a_scan_returns_exactly_the_keys_in_range_in_order(db, lower, upper, reverse):
    expected = [k for k in KEYS if k >= lower and (upper is None or k < upper)]
    if reverse:
        expected.reverse()
    got = list(rocks.scan(db, lower, upper, reverse=reverse))
    assert got == [(k, k * 2) for k in expected]


def test_no_upper_bound_means_to_the_end(db):
    # rocksdict yields nothing for a lower bound without an upper one (a quirk
    # store/partitions/rocks.py works around): this scan once returned [].
    assert [k for k, _ in rocks.scan(db, b"\x05", None)] == [k for k in KEYS if k >= b"\x05"]


def test_a_views_folder_swept_by_another_process_before_it_was_locked_is_made_again(
    monkeypatch,
):
    # Readers starting at once: one makes its views folder, and before it has opened and
    # locked it, another's sweep of dead views finds it unlocked and removes it. Three
    # cache readers starting together failed so ("No such file or directory:
    # .../iqkit-views-..."). The sweep is run at that exact moment here.
    import os
    import shutil
    import tempfile

    real_mkdtemp = tempfile.mkdtemp
    swept: list[str] = []

    def mkdtemp_then_swept(*args, **kwargs):
        folder = real_mkdtemp(*args, **kwargs)
        if not swept:
            rocks._remove_dead_views()  # what the other process's sweep does right now
            swept.append(folder)
        return folder

    saved = rocks._views_home
    monkeypatch.setattr(rocks, "_views_home", None)
    monkeypatch.setattr(rocks.tempfile, "mkdtemp", mkdtemp_then_swept)
    try:
        folder = rocks._views_folder()
        assert swept and not os.path.exists(swept[0])  # the first folder was swept
        assert os.path.isdir(folder) and folder != swept[0]  # and another one made
    finally:
        home = rocks._views_home
        if home is not None and home is not saved:
            os.close(home[2])
            shutil.rmtree(home[1], ignore_errors=True)
        monkeypatch.setattr(rocks, "_views_home", saved)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("upper", [None, b"\xff"])
def test_a_scan_cut_short_by_a_damaged_block_fails_instead_of_ending(tmp_path, upper, reverse):
    """rocksdict's iterator ends quietly at a block that fails its checksum; a scan must
    say so (the store is damaged), never return the rows before it as if they were all."""
    from iqkit.errors import IqkitError
    from iqkit.store.partitions.builds import build_database

    rows = [(f"k{i:07d}".encode(), bytes(200)) for i in range(20_000)]
    sst = tmp_path / "rows.sst"
    rocks.write_sst(sst, iter(rows))
    folder = tmp_path / "db"
    build_database(folder, [sst])
    (table,) = [p for p in folder.iterdir() if p.suffix == ".sst"]
    data = bytearray(table.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    table.unlink()  # a new file: the database's hard link must not change `sst` too
    table.write_bytes(bytes(data))
    db = rocks.open_for_read(folder)
    try:
        read: list[tuple[bytes, bytes]] = []
        with pytest.raises(IqkitError):
            for chunk in rocks.scan_chunks(db, b"", upper, reverse=reverse):
                read.extend(chunk)
        assert len(read) < len(rows)  # the damage was met part way, and said
    finally:
        rocks.close_quietly(db)
