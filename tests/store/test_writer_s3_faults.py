"""``iqkit.StoreWriter`` on an s3:// root when the server goes away mid-commit (the real
S3 server behind tests/s3server.py's ``CuttingProxy``): the commit raises one clear line,
and the last published version stays intact, read through ``iqkit.open`` against the
server once it is back, with the same rows as before."""

from __future__ import annotations

import contextlib
import random
import re
import socket
import threading

import pytest
from helpers import request
from s3server import CuttingProxy

import iqkit
from iqkit.store.chain.records import list_versions
from iqkit.store.objects import open_objects

STORE = "totals"


def all_rows(root: str) -> list[tuple[str, str]]:
    with iqkit.open(root) as engine:
        result = engine.query(request(STORE, iqkit.RangeQuery.with_no_bounds()))
        out = []
        for qr in result.partition_results.values():
            assert qr.is_success, qr.failure_message
            with qr.result as it:
                out.extend((kv.key, kv.value) for kv in it)
    return sorted(out)


@pytest.fixture
def published(s3_root) -> list[tuple[str, str]]:
    """Version 1 of ``totals`` (2 partitions, 50 rows) on the server; its rows."""
    iqkit.create_store(s3_root, STORE, partitions=2, value_serde="string")
    with iqkit.StoreWriter(s3_root, STORE) as w:
        for i in range(50):
            w.put(f"k{i:02d}", f"v{i}")
    assert w.version == 1
    return all_rows(s3_root)


def big_values(n: int = 20000) -> dict[str, str]:
    """About 4 MB of rows that do not compress, so the upload is cut in its middle."""
    rnd = random.Random(7)
    return {f"big{i:05d}": f"{rnd.getrandbits(800):0200x}" for i in range(n)}


def check_last_version_intact(root: str, endpoint: str, monkeypatch, rows) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # the server is back
    assert list_versions(open_objects(root), STORE) == [1]
    assert all_rows(root) == rows
    with iqkit.StoreWriter(root, STORE) as w:  # and the store takes the next commit
        w.put("k00", "after")
    assert w.version == 2
    assert dict(all_rows(root))["k00"] == "after"


def test_server_cut_mid_upload_is_one_line_and_the_last_version_stays(
    s3_root, s3_endpoint, published, monkeypatch
):
    proxy = CuttingProxy(s3_endpoint, cut_after=1 << 20)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own retries: keep it short
    writer = iqkit.StoreWriter(s3_root, STORE)
    with pytest.raises(iqkit.StoreIOError) as info, writer:
        for k, v in big_values().items():
            writer.put(k, v)
    assert proxy.cut.is_set()
    message = str(info.value)
    assert "\n" not in message, message
    assert re.match(rf"cannot upload {re.escape(s3_root)}/{STORE}/sst/\d/\S+\.sst: ", message)
    assert "the endpoint cannot be reached or dropped the connection" in message
    assert message.count(f"{STORE}/sst/") == 1 and message.endswith(f"{proxy.url})")
    assert writer.version is None
    with pytest.raises(RuntimeError, match="is failed"):
        writer.put("k", "v")  # the failed writer says so; a new one retries
    check_last_version_intact(s3_root, s3_endpoint, monkeypatch, published)


class PublishCuttingProxy(CuttingProxy):
    """A ``CuttingProxy`` that lets every request through until the one that creates a
    version record (``PUT .../chain/<n>.json``), and goes away in its middle: the SSTs
    are uploaded, the publish fails."""

    def __init__(self, target: str) -> None:
        #: Record-creating requests that reached the proxy (each one is cut).
        self.publish_requests = 0
        super().__init__(target)

    def _pump(self, src, dst, counts):
        if not counts:
            return super()._pump(src, dst, counts)
        try:
            while data := src.recv(65536):
                if b"PUT " in data and b"/chain/" in data:
                    self.publish_requests += 1
                    self.stop()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if not self.cut.is_set():
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)


def test_server_cut_at_publish_is_one_line_and_the_last_version_stays(
    s3_root, s3_endpoint, published, monkeypatch
):
    proxy = PublishCuttingProxy(s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    uploaded_before = set(open_objects(s3_root).list(f"{STORE}/sst"))
    with pytest.raises(iqkit.StoreIOError) as info, iqkit.StoreWriter(s3_root, STORE) as w:
        w.put("k00", "lost")
        w.put("new", "lost")
    assert proxy.cut.is_set() and proxy.publish_requests >= 1
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"cannot create {s3_root}/{STORE}/chain/000000000002.json: ")
    assert "the endpoint cannot be reached or dropped the connection" in message
    assert message.count("chain/") == 1 and message.endswith(f"{proxy.url})")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    # The commit's SSTs reached the server but no record names them: orphans for retention.
    assert set(open_objects(s3_root).list(f"{STORE}/sst")) > uploaded_before
    check_last_version_intact(s3_root, s3_endpoint, monkeypatch, published)


def test_a_reader_open_while_the_commit_is_cut_keeps_serving_the_last_version(
    s3_root, s3_endpoint, published, monkeypatch
):
    """An engine on the real server (opened before) reads on while a writer's commit
    through the proxy is cut; the next query still serves version 1."""
    with iqkit.open(s3_root) as engine:
        proxy = CuttingProxy(s3_endpoint, cut_after=1 << 20)
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with iqkit.StoreWriter(s3_root, STORE) as w:
                    for k, v in big_values().items():
                        w.put(k, v)
            except BaseException as exc:  # handed to the test's thread
                errors.append(exc)

        # The writer alone goes through the proxy: it reads the variable when it starts.
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        thread = threading.Thread(target=write)
        thread.start()
        thread.join(timeout=300)
        assert not thread.is_alive() and proxy.cut.is_set()
        assert len(errors) == 1 and isinstance(errors[0], iqkit.StoreIOError)
        assert "\n" not in str(errors[0])
        result = engine.query(request(STORE, iqkit.RangeQuery.with_no_bounds()))
        rows = []
        for qr in result.partition_results.values():
            assert qr.is_success, qr.failure_message
            with qr.result as it:
                rows.extend((kv.key, kv.value) for kv in it)
        assert sorted(rows) == published
    check_last_version_intact(s3_root, s3_endpoint, monkeypatch, published)
