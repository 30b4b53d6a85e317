"""Store roots: a local folder or an object-storage URL, told apart in one place.

Why one place: a URL handed to code that expects a path becomes a local folder
(``Path("s3://b/x")`` is ``s3:/b/x``), and a store "written to S3" silently lands in the
current directory. Every API that takes a root turns it into a ``StoreRoot`` here first;
a URL is never treated as a local path.

Object storage goes through fsspec (s3fs, gcsfs, adlfs: the extras ``s3``, ``gcs``,
``azure``; docs/DECISIONS.md "Object storage" says why). Credentials and endpoints are
the filesystem library's own business: for S3, botocore reads ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL`` and ``AWS_PROFILE`` / the shared config files; gcsfs reads
``GOOGLE_APPLICATION_CREDENTIALS``; adlfs reads ``AZURE_STORAGE_*``; fsspec adds its
``FSSPEC_<PROTOCOL>_<OPTION>`` variables and config files. Explicit ``storage_options``
(the library's keyword arguments, as in pandas) win over all of them. Nothing here
imports fsspec: ``import iqkit`` stays light, and parsing a root needs no package.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import RootError

__all__ = ["S3_MAX_ATTEMPTS", "SCHEMES", "StoreRoot", "parse_root"]

#: Tries per request to S3 (README "Object storage"): botocore's standard retry mode,
#: unless AWS_MAX_ATTEMPTS / AWS_RETRY_MODE or storage_options say otherwise.
S3_MAX_ATTEMPTS = 3
#: Seconds to wait for a connection to S3, and for a read once connected (s3fs's own
#: defaults, stated here so the README's bound holds whatever s3fs ships).
S3_CONNECT_TIMEOUT = 5
S3_READ_TIMEOUT = 15
_RETRY_VARIABLES = ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")


@dataclass(frozen=True)
class _Scheme:
    protocol: str  # fsspec's protocol name
    package: str  # the module that implements it
    extra: str  # iqkit's extra that installs it


#: URL schemes a root may use, aliases included (``s3a`` is what Hadoop and Spark users
#: write for S3; ``abfss`` is the TLS spelling of ``abfs``; ``az`` is adlfs' own).
SCHEMES: dict[str, _Scheme] = {
    "s3": _Scheme("s3", "s3fs", "s3"),
    "s3a": _Scheme("s3", "s3fs", "s3"),
    "gs": _Scheme("gs", "gcsfs", "gcs"),
    "gcs": _Scheme("gs", "gcsfs", "gcs"),
    "abfs": _Scheme("abfs", "adlfs", "azure"),
    "abfss": _Scheme("abfs", "adlfs", "azure"),
    "az": _Scheme("abfs", "adlfs", "azure"),
}

# A scheme has two or more characters, so a Windows drive letter (``C:\x``) stays a path.
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(.*)$", re.DOTALL)
_KNOWN = "a local folder, file://, s3://, gs:// or abfs://"


@dataclass(frozen=True)
class StoreRoot:
    """Where stores live: a local folder (``scheme == "file"``) or a bucket and prefix.

    ``text`` is the root as the user gave it (for messages); ``url`` is canonical
    (``s3://bucket/prefix``; a local root's absolute ``file://`` URI), the same for every
    spelling of one place, so it can key a cache.
    """

    text: str
    scheme: str  # "file", or fsspec's protocol: "s3", "gs", "abfs"
    bucket: str = ""  # bucket / container; "" for a local root
    prefix: str = ""  # key prefix inside the bucket, no leading or trailing "/"
    local: Path | None = None  # the folder, for a local root (as given, not resolved)
    options: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def url(self) -> str:
        if self.local is not None:
            return Path(os.path.abspath(self.local)).as_uri()
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def base(self) -> str:
        """The root as the filesystem library addresses it (``bucket/prefix``, or the
        local folder's absolute path)."""
        if self.local is not None:
            return os.path.abspath(self.local)
        return f"{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def extra(self) -> str | None:
        """The iqkit extra that installs this root's filesystem package."""
        return None if self.is_local else SCHEMES[self.scheme].extra

    def filesystem(self) -> Any:
        """A new fsspec filesystem for this remote root (never fsspec's shared instance,
        so credentials are read from the environment as it is now).

        A missing package raises ``RootError`` naming the extra to install.
        """
        if self.is_local:
            raise RootError(f"root {self.text!r} is a local folder, not object storage")
        scheme = SCHEMES[self.scheme]
        for package in ("fsspec", scheme.package):
            if importlib.util.find_spec(package) is None:
                raise RootError(
                    f"root {self.text!r} needs the {scheme.package} package: "
                    f"pip install 'iqkit[{scheme.extra}]'"
                )
        import fsspec

        options = dict(self.options)
        if self.scheme == "abfs" and "@" in self.bucket:
            # abfs://container@account.dfs.core.windows.net/...: adlfs takes the account
            # as an option, and the container alone as the first path part.
            options.setdefault("account_name", self.bucket.split("@", 1)[1].split(".", 1)[0])
        if scheme.protocol != "s3":
            return fsspec.filesystem(scheme.protocol, skip_instance_cache=True, **options)
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **_bounded_s3(options))
        fs.retries = 1  # s3fs's own loop around botocore's: one pass (``_bounded_s3``)
        return fs


def _bounded_s3(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with iqkit's bound on retries and timeouts where the user set none.

    Two retry loops are stacked by default (quirk): s3fs retries a request up to 5
    times around botocore, which itself tries up to 5 times (legacy mode) with backoff,
    so an endpoint that went away mid-query cost a fetch minutes. iqkit keeps one loop,
    botocore's standard mode with ``S3_MAX_ATTEMPTS`` tries (s3fs ``retries=1`` is one
    pass of its loop; an attribute, not an option), and the stated timeouts.
    AWS_MAX_ATTEMPTS / AWS_RETRY_MODE and explicit ``storage_options`` win."""
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", S3_CONNECT_TIMEOUT)
    config.setdefault("read_timeout", S3_READ_TIMEOUT)
    if "retries" not in config and not any(os.environ.get(v) for v in _RETRY_VARIABLES):
        config["retries"] = {"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"}
    return {**options, "config_kwargs": config}


def parse_root(
    root: str | os.PathLike[str] | StoreRoot,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> StoreRoot:
    """``root`` as a ``StoreRoot``; bad input raises ``RootError`` in one line.

    A text starting ``<scheme>://`` is a URL: a known scheme (``SCHEMES``) names object
    storage, ``file://`` a local folder, anything else is refused. ``s3:/b/x`` (one slash:
    what ``pathlib.Path("s3://b/x")`` makes of a URL) is refused rather than taken for a
    folder named ``s3:``. Everything else is a local path.
    """
    if isinstance(root, StoreRoot):
        if storage_options:
            return StoreRoot(
                root.text,
                root.scheme,
                root.bucket,
                root.prefix,
                root.local,
                {**root.options, **storage_options},
            )
        return root
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"a store root is a path or a URL string, got {type(root).__name__}")
    text = os.fspath(root)
    if not isinstance(text, str):
        raise TypeError("a store root is a path or a URL string, got bytes")
    if not text or "\x00" in text:
        raise RootError(f"root {text!r} is not a usable path (empty, or contains NUL)")
    options = dict(storage_options or {})
    match = _SCHEME_RE.match(text)
    if match is None:
        return StoreRoot(text, "file", local=Path(text), options=options)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return StoreRoot(text, "file", local=_file_url_path(text, rest), options=options)
    if scheme not in SCHEMES:
        if rest.startswith("//"):
            raise RootError(f"root {text!r}: unknown scheme {scheme!r}; a root is {_KNOWN}")
        # "name:thing" with no "//" is a legal POSIX folder name, not a URL.
        return StoreRoot(text, "file", local=Path(text), options=options)
    if not rest.startswith("//"):
        raise RootError(
            f"root {text!r} has one slash after {scheme + ':'!r} (pathlib.Path collapses "
            f"'//'): pass the URL as a string, e.g. {scheme + '://bucket/prefix'!r}"
        )
    parts = urlsplit(text)
    if parts.query or parts.fragment:
        raise RootError(f"root {text!r}: a root URL takes no '?' query or '#' fragment")
    if not parts.netloc:
        raise RootError(f"root {text!r} names no bucket ({scheme}://bucket/prefix)")
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise RootError(f"root {text!r}: '.' and '..' are not allowed in an object-store root")
    return StoreRoot(
        text,
        SCHEMES[scheme].protocol,
        bucket=parts.netloc,
        prefix="/".join(segments),
        options=options,
    )


def _file_url_path(text: str, rest: str) -> Path:
    """The local folder a ``file:`` URL names (``file:///x``, ``file://localhost/x``,
    ``file:/x``, or Spark's relative ``file:x``)."""
    if rest.startswith("//"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise RootError(f"root {text!r}: a file:// URL names this machine, not a host")
        return Path(parts.path or "/")
    return Path(rest)
