"""Objects on a store root: the few calls the immutable store format needs, for local
folders and for object storage alike.

Why so few: the format only ever creates files under unique names (``put_immutable``),
publishes a version by one create that cannot succeed twice (``create_exclusive``), reads
(``read_bytes``, ``download``, ``list``, ``size``) and deletes what retention drops. No
rename, no overwrite, no lock: object stores have none of them, so the format does not
need them on a local disk either.

Keys are relative to the root, ``/``-separated (``totals/sst/0/000123-ab12.sst``). On a
local root nothing below the root folder is ever followed through a symbolic link, and
only plain files are objects (``LocalObjects``): whoever can write a store's folder (its
writer) must not be able to make iqkit read, list, write or delete anything outside it.
Every failure leaves through one classifier (``_classified``) as an iqkit error:
``ObjectExistsError`` (lost a create race), ``ObjectMissingError`` (not there), else
``StoreIOError`` with one line saying what failed and, for missing credentials or an
unreachable endpoint, what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import IqkitError, ObjectExistsError, ObjectMissingError, StoreIOError
from .roots import StoreRoot, parse_root

__all__ = [
    "LocalObjects",
    "NotPlainFileError",
    "ObjectStore",
    "RemoteObjects",
    "link_plain_file",
    "open_objects",
    "refused",
]

#: Temporary files iqkit writes beside their final names start with this; ``list`` skips
#: them (a crashed writer's leftovers are never objects).
TMP_PREFIX = ".iqkit-tmp-"

#: A folder below a local root, opened one name at a time: ``O_NOFOLLOW`` refuses a
#: symbolic link (with ``O_DIRECTORY``, Linux says ENOTDIR for one, as for a file).
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file below a local root, for reading: no link followed; ``O_NONBLOCK`` so a FIFO
#: planted under a file's name cannot hang the open (``fstat`` then refuses it).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: A new temporary file beside its final name (``O_EXCL``: never an existing name).
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY_CHUNK = 1 << 20


class NotPlainFileError(OSError):
    """Something below a local root iqkit will not use: a symbolic link (never followed:
    it could point at another store or anywhere on the machine), or a folder, FIFO or
    device where a file must be. ``strerror`` is the one line saying which and what."""


def refused(name: str, mode: int) -> NotPlainFileError:
    """The ``NotPlainFileError`` for ``name`` (as messages show it), found to be of
    ``mode`` (an ``lstat``/``fstat`` mode) where a plain file or folder was expected."""
    if stat.S_ISLNK(mode):
        text = f"{name} is a symbolic link, which iqkit never follows"
    elif stat.S_ISDIR(mode):
        text = f"{name} is a folder, not a plain file"
    else:
        text = f"{name} is not a plain file"
    return NotPlainFileError(errno.EPERM, text)


def _plain(fd: int, name: str) -> BinaryIO:
    """The open descriptor ``fd`` as a file to read, if it is a plain file; else it is
    closed and ``NotPlainFileError`` raised (checked before ``open``, which would say
    only "Is a directory" for a folder)."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise refused(name, mode)
    return open(fd, "rb")  # the caller's with block closes it


def link_plain_file(src: str | os.PathLike[str], dst: str | os.PathLike[str], name: str) -> None:
    """Give the new name ``dst`` the bytes of the plain file ``src``: a hard link (no
    copy), else, across file systems, a copy. ``NotPlainFileError`` (naming ``name``)
    when ``src`` is a symbolic link or not a plain file, even one swapped in after it was
    checked: a link's target is never read. The one way a version's files are taken into
    a database (partitions.builds.build_database)."""
    try:
        # Without AT_SYMLINK_FOLLOW a link is linked as itself: checked just below.
        os.link(src, dst, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError:
        # Another file system (or a folder, which cannot be linked): copy, reading
        # through a descriptor that refuses a link and is checked to be a plain file.
        try:
            fd = os.open(src, _FILE_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise refused(name, stat.S_IFLNK) from None
            raise
        with _plain(fd, name) as fh, open(dst, "xb") as out:
            shutil.copyfileobj(fh, out, _COPY_CHUNK)
        return
    mode = os.lstat(dst).st_mode
    if not stat.S_ISREG(mode):
        os.unlink(dst)
        raise refused(name, mode)


def open_objects(
    root: str | os.PathLike[str] | StoreRoot, *, storage_options: Mapping[str, Any] | None = None
) -> ObjectStore:
    """The object store of ``root``: a local folder, or fsspec's filesystem for a URL."""
    parsed = parse_root(root, storage_options=storage_options)
    if parsed.local is not None:
        return LocalObjects(parsed)
    return RemoteObjects(parsed)


def check_key(path: str) -> str:
    """``path`` if it is a usable object key, else ``ValueError`` (keys are made by iqkit,
    so a bad one is a bug, never something to write somewhere unexpected)."""
    parts = path.split("/") if isinstance(path, str) else []
    if (
        not parts
        or not path
        or "\x00" in path
        or "\\" in path
        or any(p in ("", ".", "..") for p in parts)
        or parts[-1].startswith(TMP_PREFIX)
    ):
        raise ValueError(f"not an object key: {path!r}")
    return path


class _FailingFast:
    """``ObjectStore.failing_fast``'s block."""

    __slots__ = ("_objects",)

    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects

    def __enter__(self) -> None:
        self._objects._fast_blocks += 1

    def __exit__(self, *exc_info: object) -> None:
        objects = self._objects
        objects._fast_blocks -= 1
        if not objects._fast_blocks:
            objects._unreachable = None


class ObjectStore(ABC):
    """The calls the store format makes on a root; see the module docstring."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        #: Inside ``failing_fast``: how many blocks, and the first unreachable-endpoint
        #: reason met in them (later requests fail with it, unsent).
        self._fast_blocks = 0
        self._unreachable: str | None = None

    def where(self, path: str = "") -> str:
        """``path`` as a user would write it (for messages)."""
        return f"{self.root.url}/{path}" if path else self.root.url

    @abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data``, atomically; ``ObjectExistsError`` if it exists.
        Of two racers exactly one succeeds, and readers see all of ``data`` or nothing."""

    @abstractmethod
    def put_immutable(self, path: str, file: str | os.PathLike[str]) -> None:
        """Store a copy of the local ``file`` as ``path`` (a unique name: writing it twice,
        as a retry does, stores the same bytes)."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes: ...

    @abstractmethod
    def download(self, path: str, local_file: str | os.PathLike[str]) -> int:
        """Copy ``path`` to ``local_file`` (through a temporary file beside it, so
        ``local_file`` is whole or absent; an existing ``local_file`` is kept, as the
        same immutable object); returns the size in bytes."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under the folder ``prefix`` (every depth), sorted."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove ``path``; an object already gone is not an error."""

    @abstractmethod
    def size(self, path: str) -> int: ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` is there: locally a stat (reached through no link; a link or
        folder there is ``StoreIOError``); remotely fsspec's ``info`` (a HEAD,
        and for a missing key a LIST too: it looks for a "folder" of that name)."""
        try:
            self.size(path)
        except ObjectMissingError:
            return False
        return True

    def local_file(self, path: str) -> Path | None:
        """The file behind ``path`` when the root is a local folder (readers can use it
        where it is, with no copy), else None."""
        del path
        return None

    def open_local_file(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """The file behind ``path`` open for reading, for the block, when ``local_file``
        gives one: reached through no link, and a plain file (a link swapped in after
        ``local_file`` checked it is refused here too). Only local roots have one."""
        raise NotImplementedError(f"{type(self).__name__} has no local files")

    def remove_stale_temporaries(self, prefix: str, older_than: float) -> list[str]:
        """Remove the temporary files (``TMP_PREFIX``) under ``prefix`` last written
        before ``older_than`` (a time): what a process killed mid-create or mid-upload
        left; returns their paths. A live writer's temporary file is written to as it
        goes, so only a dead one's grows old. Object stores leave none (an upload is one
        request): nothing to do there."""
        del prefix, older_than
        return []

    def _why_missing(self) -> str:
        """What ``ObjectMissingError`` says once something was not found."""
        return "no such object"

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        """``list(prefix)`` with each key's last modification time (seconds since the
        epoch) by the storage's own clock: the local file system's, or the object
        service's ``LastModified``. Retention judges ages by these, never by a writer's
        clock (store/chain/retention.py). One listing request on object storage."""
        raise NotImplementedError

    def failing_fast(self) -> _FailingFast:
        """A block (one query's fan-out) in which, once a request found the endpoint
        unreachable (after its own bounded retries), every later request fails at once
        with the same reason instead of waiting for its own retries and timeouts: 16
        partitions' fetches took 100 s to fail one by one. The next block tries again.
        A plain class, not a generator: it wraps every query, key lookups included."""
        return _FailingFast(self)

    @contextlib.contextmanager
    def _classified(self, action: str, path: str = "") -> Iterator[None]:
        """The one place errors of either backend become iqkit's. (Where ``path`` is, in
        words, is worked out only for a message: on a local root it is a path made
        absolute, which every read would otherwise pay.)"""
        if self._unreachable is not None:
            raise StoreIOError(
                f"cannot {action} {self.where(path)}: {self._unreachable}; not sent, "
                "an earlier request of this query failed so"
            )
        try:
            yield
        except IqkitError:
            raise
        except FileExistsError:
            raise ObjectExistsError(f"{self.where(path)} already exists") from None
        except FileNotFoundError:
            raise ObjectMissingError(f"{self.where(path)}: {self._why_missing()}") from None
        except Exception as exc:
            reason = _explain(exc, self.root)
            if self._fast_blocks and _unreachable(exc):
                self._unreachable = reason
            raise StoreIOError(f"cannot {action} {self.where(path)}: {reason}") from exc


def _explain(exc: BaseException, root: StoreRoot) -> str:
    """One line for ``exc``, naming the fix where there is one (matched by class name, so
    this module imports no SDK)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return (
            "no credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE), or pass storage_options"
        )
    if names & {"DefaultCredentialsError", "ClientAuthenticationError"}:
        return f"no usable credentials ({type(exc).__name__}); see the {root.extra} extra's docs"
    if isinstance(exc, PermissionError) or "AccessDenied" in str(exc):
        return "access denied"
    if _unreachable(exc):
        # The SDK's text repeats the whole object URL; the endpoint is what to check.
        said = _URL_PATH.sub(r"\1", _first_line(exc))
        return f"the endpoint cannot be reached or dropped the connection ({said})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return _first_line(exc) or type(exc).__name__


#: Exceptions (by class name: no SDK is imported here) that say the endpoint cannot be
#: reached or dropped the connection.
_UNREACHABLE = {"EndpointConnectionError", "ConnectionClosedError", "ClientConnectorError",
                "ClientOSError", "ServerDisconnectedError", "ConnectionError",
                "ConnectTimeoutError"}  # fmt: skip


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the endpoint cannot be reached or dropped the connection."""
    return bool({cls.__name__ for cls in type(exc).__mro__} & _UNREACHABLE)


#: A URL with a path, maybe quoted: group 1 is its scheme, host and port.
_URL_PATH = re.compile(r'"?(https?://[^/\s"]+)/[^\s"]*"?')


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _tmp_beside(target: Path) -> Path:
    return target.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{target.name}")


def _settle(tmp: Path, target: Path) -> int:
    """Give the finished temporary file ``tmp`` its final name, unless ``target`` exists;
    returns the size. Never replaces: a name holds one file from the moment it appears
    until it is deleted, so a reader that pinned the file at a cache path reads that same
    file through the path (a second process fetching the same immutable object keeps the
    first copy). The size is read before: once named, the file may be evicted by another
    process at any moment."""
    try:
        size = tmp.stat().st_size
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _place(src: BinaryIO, target: Path) -> int:
    """Copy the open file ``src`` to ``target`` (whole or not at all; see ``_settle``).

    Always a copy, never a hard link: a link would share the inode, so the cache touching
    a file's mtime (its recency) would write to the root."""
    tmp = _tmp_beside(target)
    try:
        with open(tmp, "xb") as out:
            shutil.copyfileobj(src, out, _COPY_CHUNK)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return _settle(tmp, target)


class LocalObjects(ObjectStore):
    """A root on a local (or mounted POSIX) folder.

    The exclusive create writes a temporary file and hard-links it to the final name:
    ``link`` fails with ``EEXIST`` if the name exists, so of two racers exactly one wins,
    and the name appears only with all the bytes behind it (``O_EXCL`` alone would show a
    half-written file to a reader).

    No symbolic link below the root folder is followed, and only plain files are objects
    (whoever writes a store's folder could plant a link to another store's files, or to
    any file the reader or a root-run writer may read, truncate or delete). Every call
    walks from the root folder one name at a time through folder descriptors opened
    with ``O_NOFOLLOW`` and acts on the last name relative to its folder's descriptor,
    so a link swapped in between a check and the use is refused too. Such a thing is
    ``NotPlainFileError`` (a ``StoreIOError`` once classified), naming it; ``list``
    skips it (it is no object). The root folder itself is opened as the user named it:
    it may be a link, the user chose it.
    """

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        assert root.local is not None
        self.folder = Path(os.path.abspath(root.local))
        self._base = os.fspath(self.folder)

    def _path(self, path: str) -> Path:
        return self.folder / check_key(path)

    def _io(
        self, action: str, path: str, *, folder: bool = False
    ) -> contextlib.AbstractContextManager[None]:
        """``_classified``, once ``path`` was checked to be a key (a bad one is a bug:
        ``ValueError`` before any I/O); ``folder``: "" (the root) is one too."""
        if path or not folder:
            check_key(path)
        return self._classified(action, path)

    def _open_folder(self, parts: list[str], *, create: bool = False) -> int:
        """A descriptor of the folder ``parts`` (names below the root), entered one name
        at a time, never through a link; ``create``: make the missing ones. A plain file
        where a folder should be is ``NotADirectoryError``, a link ``NotPlainFileError``."""
        if create:
            os.makedirs(self._base, exist_ok=True)
        fd = os.open(self._base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, name in enumerate(parts):
                try:
                    child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                    child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
                except NotADirectoryError:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    if stat.S_ISLNK(mode):
                        raise refused("/".join(parts[: i + 1]), mode) from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _in_folder(self, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """The descriptor of ``path``'s folder (``_open_folder``) and ``path``'s last name,
        for the block."""
        *parents, name = check_key(path).split("/")
        fd = self._open_folder(parents, create=create)
        try:
            yield fd, name
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open_file(self, path: str) -> Iterator[BinaryIO]:
        """The plain file ``path`` open for reading, for the block (class docstring)."""
        with self._in_folder(path) as (folder, name):
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise refused(path, stat.S_IFLNK) from None
                raise
        with _plain(fd, path) as fh:
            yield fh

    def _write_new(self, folder: int, name: str, fill: BinaryIO | bytes) -> str:
        """A new temporary file beside ``name`` in ``folder``, holding ``fill`` (bytes,
        or an open file's rest), synced to disk; returns its name."""
        tmp = f"{TMP_PREFIX}{uuid.uuid4().hex}-{name}"
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=folder)
        try:
            with open(fd, "wb") as out:
                if isinstance(fill, bytes):
                    out.write(fill)
                else:
                    shutil.copyfileobj(fill, out, _COPY_CHUNK)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
            raise
        return tmp

    def _settle_new(self, folder: int, tmp: str, name: str, *, replace_race: bool) -> None:
        """Link the finished ``tmp`` to ``name`` (both in ``folder``), then drop ``tmp``.
        ``replace_race``: an existing ``name`` is the same immutable object (kept),
        else ``FileExistsError``."""
        try:
            os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        except FileExistsError:
            if not replace_race:
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)

    def create_exclusive(self, path: str, data: bytes) -> None:
        with self._io("create", path), self._in_folder(path, create=True) as (fd, name):
            tmp = self._write_new(fd, name, data)
            self._settle_new(fd, tmp, name, replace_race=False)
            os.fsync(fd)

    def put_immutable(self, path: str, file: str | os.PathLike[str]) -> None:
        with self._io("upload", path), open(file, "rb") as src:  # noqa: SIM117
            with self._in_folder(path, create=True) as (fd, name):
                tmp = self._write_new(fd, name, src)
                self._settle_new(fd, tmp, name, replace_race=True)

    def read_bytes(self, path: str) -> bytes:
        with self._io("read", path), self._open_file(path) as fh:
            return fh.read()

    def download(self, path: str, local_file: str | os.PathLike[str]) -> int:
        with self._io("download", path), self._open_file(path) as fh:
            return _place(fh, Path(local_file))

    def _walk(self, fd: int, rel: str) -> Iterator[tuple[int, str, list[str]]]:
        """(descriptor, key, plain files) of the folder ``fd`` (key ``rel``) and of every
        folder below it, entered without following a link; links, FIFOs and the like are
        skipped (no object is one)."""
        with os.scandir(fd) as found:
            entries = list(found)
        yield fd, rel, [e.name for e in entries if e.is_file(follow_symlinks=False)]
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                child = os.open(entry.name, _FOLDER_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed, or swapped for a link, since the scan
            try:
                yield from self._walk(child, f"{rel}/{entry.name}" if rel else entry.name)
            finally:
                os.close(child)

    @contextlib.contextmanager
    def _walking(self, prefix: str) -> Iterator[Iterator[tuple[int, str, list[str]]]]:
        """``_walk`` from the folder ``prefix`` (the root for ""); nothing when there is
        no such folder (or a plain file has its name)."""
        parts = check_key(prefix).split("/") if prefix else []
        try:
            top = self._open_folder(parts)
        except (FileNotFoundError, NotADirectoryError):
            yield iter(())
            return
        try:
            yield self._walk(top, prefix)
        finally:
            os.close(top)

    def list(self, prefix: str = "") -> list[str]:
        out = []
        with self._io("list", prefix, folder=True), self._walking(prefix) as walk:
            for _, rel, files in walk:
                out.extend(
                    f"{rel}/{name}" if rel else name
                    for name in files
                    if not name.startswith(TMP_PREFIX)
                )
        return sorted(out)

    def delete(self, path: str) -> None:
        # A planted link named like an object is removed as itself (unlink never follows).
        with self._io("delete", path), contextlib.suppress(FileNotFoundError):  # noqa: SIM117
            with self._in_folder(path) as (fd, name):
                os.unlink(name, dir_fd=fd)

    def size(self, path: str) -> int:
        with self._io("stat", path), self._in_folder(path) as (fd, name):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise refused(path, st.st_mode)
            return st.st_size

    def open_local_file(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self._open_file(path)

    def local_file(self, path: str) -> Path | None:
        """The file's path, once checked to be a plain file reached through no link (a
        missing one is left to whoever opens it, which names it missing). Between this
        check and the caller's open a link could be swapped in: the callers open with
        ``link_plain_file``, which refuses one then too."""
        with self._io("read", path), contextlib.suppress(FileNotFoundError):  # noqa: SIM117
            with self._open_file(path):
                pass
        return self._path(path)

    def remove_stale_temporaries(self, prefix: str, older_than: float) -> list[str]:
        removed = []
        with self._io("clean up", prefix, folder=True), self._walking(prefix) as walk:
            for fd, rel, files in walk:
                for name in files:
                    if not name.startswith(TMP_PREFIX):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime < older_than:
                            os.unlink(name, dir_fd=fd)
                            removed.append(f"{rel}/{name}" if rel else name)
        return sorted(removed)

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        out = {}
        with self._io("list", prefix, folder=True), self._walking(prefix) as walk:
            for fd, rel, files in walk:
                for name in files:
                    if name.startswith(TMP_PREFIX):
                        continue
                    # the entry's own time (never a link's target: _walk lists plain files)
                    with contextlib.suppress(FileNotFoundError):  # removed since listed
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        out[f"{rel}/{name}" if rel else name] = st.st_mtime
        return out


class RemoteObjects(ObjectStore):
    """A root on object storage through fsspec (s3fs, gcsfs, adlfs).

    The exclusive create is fsspec's ``mode="create"``: S3's ``If-None-Match: *``, GCS's
    ``ifGenerationMatch=0``, Azure's ``overwrite=False`` — the service decides, so two
    writers on two machines cannot both win. Listings and sizes are read fresh (the
    filesystems cache listings, which would hide another writer's objects).
    """

    #: S3 answers 409 ConditionalRequestConflict when conditional writes to one key
    #: overlap; the loser learns the outcome by trying again (it then gets the 412).
    CONFLICT_RETRIES = 5

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        self.fs = root.filesystem()

    def _path(self, path: str) -> str:
        return f"{self.root.base}/{check_key(path)}"

    def _why_missing(self) -> str:
        """A missing bucket says so: object stores answer "not found" alike for a key and
        for the bucket holding it. One extra request, made only here, after a call
        already failed (never on the way of a read that succeeds); if that check fails
        too, the plain answer stands."""
        noun = "container" if self.root.scheme == "abfs" else "bucket"
        try:
            self.fs.invalidate_cache(self.root.bucket)
            if not self.fs.exists(self.root.bucket):
                return f"{noun} {self.root.bucket!r} does not exist"
        except Exception:  # only the message depends on it
            pass
        return super()._why_missing()

    def create_exclusive(self, path: str, data: bytes) -> None:
        target = self._path(path)
        with self._classified("create", path):
            for attempt in range(self.CONFLICT_RETRIES + 1):
                try:
                    self.fs.pipe_file(target, data, mode="create")
                    return
                except OSError as exc:
                    if "ConditionalRequestConflict" not in str(exc):
                        raise
                    if attempt == self.CONFLICT_RETRIES:
                        raise
                    time.sleep(0.05 * 2**attempt)

    def put_immutable(self, path: str, file: str | os.PathLike[str]) -> None:
        with self._classified("upload", path):
            self.fs.put_file(os.fspath(file), self._path(path))

    def read_bytes(self, path: str) -> bytes:
        with self._classified("read", path):
            return self.fs.cat_file(self._path(path))

    def download(self, path: str, local_file: str | os.PathLike[str]) -> int:
        source, target = self._path(path), Path(local_file)
        with self._classified("download", path):
            tmp = _tmp_beside(target)
            try:
                self.fs.get_file(source, os.fspath(tmp))
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            if not tmp.exists():
                # fsspec's get_file returns quietly when the key names a "folder"
                raise FileNotFoundError(source)
            return _settle(tmp, target)

    def list(self, prefix: str = "") -> list[str]:
        top = self._path(prefix) if prefix else self.root.base
        base = self.root.base + "/"
        with self._classified("list", prefix):
            self.fs.invalidate_cache()
            found = self.fs.find(top)
        return sorted(
            p[len(base) :]
            for p in found
            if p.startswith(base) and not p.rsplit("/", 1)[-1].startswith(TMP_PREFIX)
        )

    def delete(self, path: str) -> None:
        with self._classified("delete", path), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(path))

    def size(self, path: str) -> int:
        target = self._path(path)
        with self._classified("stat", path):
            self.fs.invalidate_cache(target)
            return int(self.fs.size(target))

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        top = self._path(prefix) if prefix else self.root.base
        base = self.root.base + "/"
        with self._classified("list", prefix):
            self.fs.invalidate_cache()
            found = self.fs.find(top, detail=True)
            return {
                p[len(base) :]: _modified_time(info, p)
                for p, info in found.items()
                if p.startswith(base) and not p.rsplit("/", 1)[-1].startswith(TMP_PREFIX)
            }


#: Where each fsspec backend's listing puts an object's modification time: s3fs
#: ``LastModified``, adlfs ``last_modified``, gcsfs ``updated`` (others ``mtime``).
_MODIFIED_FIELDS = ("LastModified", "last_modified", "updated", "mtime", "modified")


def _modified_time(info: Mapping[str, Any], path: str) -> float:
    """Seconds since the epoch of one listing entry's modification time."""
    import datetime

    for name in _MODIFIED_FIELDS:
        value = info.get(name)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:  # the services answer in UTC
                value = value.replace(tzinfo=datetime.UTC)
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str) and value:
            stamp = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=datetime.UTC)
            return stamp.timestamp()
    raise ValueError(f"{path}: the listing gives no modification time ({sorted(info)})")
