"""Integrity: the checksums a store's files carry, and the one place they are checked.

A store is read by code that trusts its bytes: RocksDB checks a checksum on every block
it reads, but the columnar twins go to pyarrow's and DuckDB's Parquet readers, which read
a damaged file as wrong values (or, on some damaged metadata, abort the whole process),
and a flipped bit in a JSON record or manifest parses as another number. So every file a
commit publishes carries a checksum, kept where readers find it:

* an SST and its twin: ``xxh3_128`` of the whole file, in the version record beside the
  file's size (``ChainFile.checksum``, ``ChainFile.twin_checksum``);
* a version record or a manifest: ``xxh3_128`` of its own JSON text, on the first line
  of the text (``seal_json`` / ``unseal_json``), so a record checks itself and a reader
  of one partition's chain still checks the whole record before trusting any of it.

``xxh3_128`` (the ``xxhash`` package, already iqkit's for Spark's lz4 streams) hashes at
memory speed, so a whole file is hashed where a C++ reader will read it whole.

When files are checked (``check_file``):

* every open of a partition version stats its files against the sizes the record gives
  (a truncated, extended or replaced file);
* a twin is hashed whole before any Parquet reader sees it, and so is the SST beside it,
  so a twin never serves a partition whose SST is damaged; except for ``iqkit.sql``,
  whose DuckDB reads the twins alone (a damaged SST cannot change its answer, and
  hashing the SSTs was three quarters of its first statement's checks);
* an SST read by RocksDB or by iqkit's own SST reader is checked block by block as it is
  read (their block checksums), never hashed whole on a key lookup's path;
* a file fetched from object storage is hashed before its cached copy is used.

A file found whole is remembered for the process by its identity (device, inode, size,
modification time), so the next query pays a ``stat`` at most. A file found damaged is
remembered too (``KNOWN_DAMAGE``): every query of a partition version holding it then
fails with the same one line, whichever copy (SST, twin) that query would have read,
until the file on disk changes (restored: it is checked again).

Stores written before files carried checksums have none in their records: their files
are still checked for size, their SSTs block by block, and their twins are not handed to
a Parquet reader (scans read RocksDB instead, docs/DECISIONS.md "Integrity").
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import NoReturn

import xxhash

from ..errors import StoreCorruptedError

__all__ = [
    "ALGORITHM",
    "KNOWN_DAMAGE",
    "FileRef",
    "KnownDamage",
    "check_file",
    "checksum_bytes",
    "checksum_fd",
    "checksum_file",
    "damaged",
    "forget_verified",
    "is_checksum",
    "remembering",
    "seal_json",
    "unseal_json",
]

#: The checksum every file carries, named in what is recorded ("xxh3_128:<32 hex>").
ALGORITHM = "xxh3_128"
_PREFIX = ALGORITHM + ":"
_HEX = 32
#: Bytes read at a time when a file is hashed.
_CHUNK = 4 << 20


def checksum_bytes(data: bytes | memoryview) -> str:
    """``data``'s checksum as recorded (``xxh3_128:<hex>``)."""
    return _PREFIX + xxhash.xxh3_128_hexdigest(data)


def checksum_file(path: str | os.PathLike[str]) -> str:
    """The checksum of the file at ``path`` (read in chunks: any size; a link at
    ``path`` is refused, never followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return checksum_fd(fd)
    finally:
        os.close(fd)


def checksum_fd(fd: int) -> str:
    """The checksum of the whole file open as ``fd`` (read from its start with
    ``pread``: the descriptor's own position is left as it was)."""
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    offset = 0
    while n := os.preadv(fd, [buf], offset):
        h.update(view[:n])
        offset += n
    return _PREFIX + h.hexdigest()


def is_checksum(value: object) -> bool:
    """Whether ``value`` is a checksum as this module records one."""
    return (
        isinstance(value, str)
        and len(value) == len(_PREFIX) + _HEX
        and value.startswith(_PREFIX)
        and all(c in "0123456789abcdef" for c in value[len(_PREFIX) :])
    )


# -- sealed JSON: records and manifests ------------------------------------------------------
def seal_json(text: str) -> str:
    """``text`` (a JSON object dumped with ``indent`` and sorted keys, so it starts with
    ``{`` and a newline) with its checksum as a first member, ``"checksum"`` (which sorts
    first), hashed over ``text`` itself: ``unseal_json`` takes the line out again and
    hashes what is left."""
    if not text.startswith("{\n"):
        raise ValueError("seal_json takes an indented JSON object")
    indent = text[2 : len(text) - len(text[2:].lstrip(" "))]
    return f'{{\n{indent}"checksum": "{checksum_bytes(text.encode())}",\n{text[2:]}'


def is_sealed(raw: bytes) -> bool:
    """Whether ``raw`` carries a checksum line (``seal_json``); an unsealed text is an
    earlier iqkit's, one written by hand, or a sealed one whose member name was damaged."""
    return _SEALED.match(raw) is not None


def unseal_json(raw: bytes, *, where: str) -> bytes:
    """The JSON text ``seal_json`` sealed, checked: ``StoreCorruptedError`` naming
    ``where`` when its checksum line is damaged or does not match the rest.

    A text whose first member is not ``"checksum"`` is an unsealed one (written before
    texts carried a checksum, or by hand) and is returned as it is: its parse and the
    checks after it are all it gets. A flipped bit in the member's name makes a sealed
    text such a one, with every other byte as written, so it still reads as written."""
    if _SEALED.match(raw) is None:
        return raw
    head = raw.find(b"\n", 2)
    line = raw[2:head] if head > 0 else b""
    stripped = line.lstrip(b" ")
    expected_line = b'"checksum": "' + _PREFIX.encode()
    if (
        not raw.startswith(b"{\n")
        or not stripped.startswith(expected_line)
        or not stripped.endswith(b'",')
        or len(stripped) != len(expected_line) + _HEX + 2
    ):
        raise StoreCorruptedError(f"{where} is damaged: its checksum line is not readable")
    recorded = stripped[len(b'"checksum": "') : -2].decode("ascii", "replace")
    body = b"{\n" + raw[head + 1 :]
    if checksum_bytes(body) != recorded:
        raise StoreCorruptedError(
            f"{where} is damaged: its bytes do not match its checksum ({recorded[:24]}…)"
        )
    return body


#: A sealed text: an object whose first member is "checksum".
_SEALED = re.compile(rb'\{\s*"checksum"\s*:')


# -- files -----------------------------------------------------------------------------------
class KnownDamage:
    """The files this process found damaged (module docstring), by their place on the
    root, with their identity then: a file restored since (another identity) is
    forgotten and checked again. ``any`` says whether there is any, so a fast path that
    skips the checks can tell when it must not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, tuple[tuple[int, ...] | None, str]] = {}
        #: Whether any damage is known: a plain attribute, so a hot path's check is one
        #: attribute load (no call).
        self.any = False

    def mark(self, place: str, path: FileRef | None, message: str) -> None:
        identity = _identity(path) if path is not None else None
        with self._lock:
            self._found[place] = (identity, message)
            self.any = True

    def check(self, place: str, path: FileRef | None) -> None:
        """Raise the damage found in ``place`` earlier, unless the file changed since."""
        found = self._found.get(place)
        if found is None:
            return
        identity, message = found
        if path is not None and _identity(path) != identity:
            with self._lock:
                self._found.pop(place, None)
                self.any = bool(self._found)
            return
        raise StoreCorruptedError(message)

    def clear(self) -> None:
        with self._lock:
            self._found.clear()
            self.any = False


#: The process's record of damaged files (module docstring).
KNOWN_DAMAGE = KnownDamage()


@contextlib.contextmanager
def remembering(place: str, path: FileRef | None) -> Iterator[None]:
    """Damage a reader finds inside the block (a block's checksum, RocksDB's report) is
    remembered as ``place``'s (``KNOWN_DAMAGE``), then raised on: the one way a read
    that finds damage makes it the partition's verdict."""
    try:
        yield
    except StoreCorruptedError as exc:
        KNOWN_DAMAGE.mark(place, path, str(exc).splitlines()[0])
        raise

#: Files found whole, by identity and checksum (module docstring).
_VERIFIED: set[tuple[object, ...]] = set()
_VERIFIED_LOCK = threading.Lock()
#: Identities kept at most (a set of small tuples; cleared whole past it).
_VERIFIED_KEPT = 200_000


#: A file as these checks take it: its path, or a descriptor open on it (a reader that
#: has it open already checks it without opening it again).
FileRef = str | os.PathLike[str] | int


def _stat(file: FileRef) -> os.stat_result:
    return os.fstat(file) if isinstance(file, int) else os.stat(file, follow_symlinks=False)


def _identity(path: FileRef) -> tuple[int, ...] | None:
    try:
        st = _stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def damaged(place: str, path: FileRef | None, what: str) -> NoReturn:
    """Record ``place`` (a file's place on the root) as damaged and raise its one line."""
    message = f"{place} is damaged: {what}"
    KNOWN_DAMAGE.mark(place, path, message)
    raise StoreCorruptedError(message)


def check_file(
    path: FileRef,
    place: str,
    *,
    size: int,
    checksum: str | None,
    whole: bool,
) -> None:
    """Check the file at ``path`` (``place`` on its root, for messages) against what its
    record says: its ``size`` always; with ``whole``, its ``checksum`` too (hashed once
    per process and file identity). A missing file, another size or another checksum is
    damage: ``StoreCorruptedError`` (``damaged``)."""
    KNOWN_DAMAGE.check(place, path)
    try:
        st = _stat(path)
    except FileNotFoundError:
        damaged(place, None, "the file is missing")
    if st.st_size != size:
        damaged(place, path, f"it has {st.st_size} bytes, and its version record says {size}")
    if not whole or checksum is None:
        return
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, checksum)
    if key in _VERIFIED:
        return
    actual = checksum_fd(path) if isinstance(path, int) else checksum_file(path)
    if actual != checksum:
        damaged(
            place,
            path,
            f"its checksum does not match its version record "
            f"({checksum[len(_PREFIX) :][:12]}… recorded, {actual[len(_PREFIX) :][:12]}… read)",
        )
    with _VERIFIED_LOCK:
        if len(_VERIFIED) >= _VERIFIED_KEPT:
            _VERIFIED.clear()
        _VERIFIED.add(key)


def forget_verified() -> None:
    """Forget which files were found whole (benchmarks measure a first check)."""
    with _VERIFIED_LOCK:
        _VERIFIED.clear()
