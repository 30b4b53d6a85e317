"""A real S3-compatible server for the object-storage tests: moto's server mode on
127.0.0.1 (a free port), reached by the same s3fs/botocore client users run against AWS,
configured only through the standard AWS environment variables."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterator

import pytest
from s3server import aws_env, new_bucket

from iqkit.store.objects import ObjectStore, open_objects


def _serialize_conditional_writes() -> None:
    """Make moto's conditional PUT atomic, as S3's is.

    Quirk: moto 5 checks ``If-None-Match`` and then stores the object as two steps with no
    lock, and its server handles requests on several threads, so two racing creators
    could both pass the check. Real S3 decides the race on the server; one lock around
    moto's object-writing handlers gives the tests the same guarantee (iqkit's code is
    untouched)."""
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_iqkit_serialized", False):
        return
    lock = threading.RLock()
    for name in ("put_object", "_key_response_post"):
        original = getattr(S3Response, name)

        @functools.wraps(original)
        def locked(self, *args, __original=original, **kwargs):
            with lock:
                return __original(self, *args, **kwargs)

        setattr(S3Response, name, locked)
    S3Response._iqkit_serialized = True


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server running for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    _serialize_conditional_writes()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_root(s3_endpoint, monkeypatch) -> str:
    """``s3://<fresh bucket>/stores``, with the AWS variables pointing at the server."""
    aws_env(monkeypatch, s3_endpoint)
    return f"s3://{new_bucket(s3_endpoint)}/stores"


@pytest.fixture(params=["local", "s3"])
def root_url(request, tmp_path) -> str:
    """A fresh root, once as a local folder and once on the S3 server: the object-store
    tests run over both."""
    if request.param == "local":
        return os.fspath(tmp_path / "root")
    return request.getfixturevalue("s3_root")


@pytest.fixture
def objects(root_url) -> ObjectStore:
    return open_objects(root_url)
