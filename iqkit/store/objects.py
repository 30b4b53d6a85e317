"""Objects on a store root: the few calls the immutable store format needs, for local
folders and for object storage alike.

Why so few: the format only ever creates files under unique names (``put_immutable``),
publishes a version by one create that cannot succeed twice (``create_exclusive``), reads
(``read_bytes``, ``download``, ``list``, ``size``) and deletes what retention drops. No
rename, no overwrite, no lock: object stores have none of them, so the format does not
need them on a local disk either.

Keys are relative to the root, ``/``-separated (``totals/sst/0/000123-ab12.sst``). Every
failure leaves through one classifier (``_classified``) as an iqkit error:
``ObjectExistsError`` (lost a create race), ``ObjectMissingError`` (not there), else
``StoreIOError`` with one line saying what failed and, for missing credentials or an
unreachable endpoint, what to do.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import IqkitError, ObjectExistsError, ObjectMissingError, StoreIOError
from .roots import StoreRoot, parse_root

__all__ = ["LocalObjects", "ObjectStore", "RemoteObjects", "open_objects"]

#: Temporary files iqkit writes beside their final names start with this; ``list`` skips
#: them (a crashed writer's leftovers are never objects).
TMP_PREFIX = ".iqkit-tmp-"


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
        """Whether ``path`` is there: one stat locally; remotely fsspec's ``info`` (a HEAD,
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

    def remove_stale_temporaries(self, prefix: str, older_than: float) -> list[str]:
        """Remove the temporary files (``TMP_PREFIX``) under ``prefix`` last written
        before ``older_than`` (a time): what a process killed mid-create or mid-upload
        left; returns their paths. A live writer's temporary file is written to as it
        goes, so only a dead one's grows old. Object stores leave none (an upload is one
        request): nothing to do there."""
        del prefix, older_than
        return []

    @contextlib.contextmanager
    def failing_fast(self) -> Iterator[None]:
        """A block (one query's fan-out) in which, once a request found the endpoint
        unreachable (after its own bounded retries), every later request fails at once
        with the same reason instead of waiting for its own retries and timeouts: 16
        partitions' fetches took 100 s to fail one by one. The next block tries again."""
        self._fast_blocks += 1
        try:
            yield
        finally:
            self._fast_blocks -= 1
            if not self._fast_blocks:
                self._unreachable = None

    @contextlib.contextmanager
    def _classified(self, action: str, path: str = "") -> Iterator[None]:
        """The one place errors of either backend become iqkit's."""
        where = self.where(path)
        if self._unreachable is not None:
            raise StoreIOError(
                f"cannot {action} {where}: {self._unreachable}; not sent, "
                "an earlier request of this query failed so"
            )
        try:
            yield
        except IqkitError:
            raise
        except FileExistsError:
            raise ObjectExistsError(f"{where} already exists") from None
        except FileNotFoundError:
            raise ObjectMissingError(f"{where}: no such object") from None
        except Exception as exc:
            reason = _explain(exc, self.root)
            if self._fast_blocks and _unreachable(exc):
                self._unreachable = reason
            raise StoreIOError(f"cannot {action} {where}: {reason}") from exc


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


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _place(src: Path, target: Path, *, durable: bool) -> int:
    """Copy ``src`` to ``target`` (whole or not at all; see ``_settle``).

    Always a copy, never a hard link: a link would share the inode, so the cache touching
    a file's mtime (its recency) would write to the root, and the root's files would
    change with a writer's working files."""
    tmp = _tmp_beside(target)
    try:
        shutil.copyfile(src, tmp)
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
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
    """

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        assert root.local is not None
        self.folder = Path(os.path.abspath(root.local))
        self._base = os.fspath(self.folder)

    def _path(self, path: str) -> Path:
        return self.folder / check_key(path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        target = self._path(path)
        with self._classified("create", path):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = _tmp_beside(target)
            try:
                _write_durably(tmp, data)
                os.link(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            _fsync_dir(target.parent)

    def put_immutable(self, path: str, file: str | os.PathLike[str]) -> None:
        target = self._path(path)
        with self._classified("upload", path):
            target.parent.mkdir(parents=True, exist_ok=True)
            _place(Path(file), target, durable=True)

    def read_bytes(self, path: str) -> bytes:
        with self._classified("read", path):
            return self._path(path).read_bytes()

    def download(self, path: str, local_file: str | os.PathLike[str]) -> int:
        source, target = self._path(path), Path(local_file)
        with self._classified("download", path):
            return _place(source, target, durable=False)

    def list(self, prefix: str = "") -> list[str]:
        top = self._path(prefix) if prefix else self.folder
        out = []
        with self._classified("list", prefix):
            for dirpath, _, files in os.walk(top):
                rel = Path(dirpath).relative_to(self.folder).as_posix()
                out.extend(
                    f"{rel}/{name}" if rel != "." else name
                    for name in files
                    if not name.startswith(TMP_PREFIX)
                )
        return sorted(out)

    def delete(self, path: str) -> None:
        with self._classified("delete", path), contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(path))

    def size(self, path: str) -> int:
        with self._classified("stat", path):
            return self._path(path).stat().st_size

    def local_file(self, path: str) -> Path | None:
        return self._path(path)

    def remove_stale_temporaries(self, prefix: str, older_than: float) -> list[str]:
        removed = []
        with self._classified("clean up", prefix):
            for dirpath, _, files in os.walk(self._path(prefix)):
                for name in files:
                    if not name.startswith(TMP_PREFIX):
                        continue
                    path = os.path.join(dirpath, name)
                    with contextlib.suppress(FileNotFoundError):
                        if os.stat(path).st_mtime < older_than:
                            os.unlink(path)
                            removed.append(Path(path).relative_to(self.folder).as_posix())
        return sorted(removed)

    def exists(self, path: str) -> bool:
        # One stat, on the query path of every read (chain_snapshot): no Path objects.
        return os.path.isfile(f"{self._base}/{check_key(path)}")


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
