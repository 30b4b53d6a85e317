"""Helpers of the object-storage tests (fixtures in tests/conftest.py): the AWS
variables pointing at the test server, fresh buckets, and a proxy that dies mid-upload."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Callable

import pytest

#: Variables a test process must not take from the machine (profiles, shared files).
_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3")


def aws_variables(endpoint: str) -> dict[str, str]:
    """The standard AWS variables pointing botocore at ``endpoint`` with test keys; no
    profile, no shared files, and never the cloud's instance-metadata address."""
    return {
        "AWS_ACCESS_KEY_ID": "iqkit-test",
        "AWS_SECRET_ACCESS_KEY": "iqkit-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent/iqkit-aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/iqkit-aws-credentials",
    }


def reader_only_env(endpoint: str, home: str) -> dict[str, str]:
    """The whole environment of a process that only reads: a PATH, a home of its own, the
    AWS variables of ``endpoint`` and a cache under ``home`` (no Spark, no shared
    folder)."""
    import os

    return {
        "PATH": os.environ["PATH"],
        "HOME": home,
        **aws_variables(endpoint),
        "IQKIT_CACHE": os.path.join(home, "iqkit-cache"),
    }


def aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """``aws_variables`` set for one test (through the standard variables only)."""
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_variables(endpoint).items():
        monkeypatch.setenv(name, value)


def spark_worker_env(endpoint: str, cache: str) -> dict[str, str]:
    """What a Spark session's Python workers need to reach the test server: its AWS
    variables and a cache folder of their own (``IQKIT_CACHE``). Set in the driver's
    environment before the session starts, because Python workers inherit the JVM's
    environment, fixed when it starts (a test's ``monkeypatch`` never reaches them)."""
    return {**aws_variables(endpoint), "IQKIT_CACHE": cache}


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"iqkit-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that can die mid-request.

    After ``cut_after`` bytes from the client, or at the first chunk of a request for
    which ``cut_when(chunk)`` is true, it closes every connection and stops listening,
    as a server that went away in the middle of an upload: later requests find nothing
    on the port. With ``keep_refusing`` it goes on accepting after the cut and closes
    each new connection at once, counting them (``attempts``: each is a request try of
    the client's), as an endpoint that drops everything. Real sockets, so the client's
    own retries and errors run.
    """

    def __init__(
        self,
        target: str,
        cut_after: int | None = None,
        *,
        cut_when: Callable[[bytes], bool] | None = None,
        keep_refusing: bool = False,
    ) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.cut_when = cut_when
        self.keep_refusing = keep_refusing
        self.sent = 0
        #: Connections the client opened after the cut (``keep_refusing``).
        self.attempts = 0
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                with self._lock:
                    self.attempts += 1
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counts: bool) -> None:
        try:
            while data := src.recv(65536):
                if counts:
                    with self._lock:
                        self.sent += len(data)
                        over = self.cut_after is not None and self.sent > self.cut_after
                    if over or (self.cut_when is not None and self.cut_when(data)):
                        self.drop() if self.keep_refusing else self.stop()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                cut = self.cut.is_set()
            if not cut:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        """Drop every connection; the listener stays (``keep_refusing``)."""
        self.cut.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def stop(self) -> None:
        """Stop listening and drop every connection (the server "went away")."""
        self._listener.close()
        self.drop()
