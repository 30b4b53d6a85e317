"""The object-store calls of the immutable format (iqkit/store/objects.py), one suite run
over a local folder and over a real S3 server (moto on 127.0.0.1; tests/store/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from s3server import CuttingProxy, aws_env, new_bucket

from iqkit.errors import ObjectExistsError, ObjectMissingError, StoreIOError
from iqkit.store.objects import TMP_PREFIX, LocalObjects, RemoteObjects, open_objects


def test_open_objects_picks_the_backend(tmp_path, s3_root):
    assert isinstance(open_objects(tmp_path), LocalObjects)
    assert isinstance(open_objects(tmp_path.as_uri()), LocalObjects)
    assert isinstance(open_objects(s3_root), RemoteObjects)


def test_exclusive_create_succeeds_once(objects):
    objects.create_exclusive("totals/versions/1.json", b'{"v": 1}')
    with pytest.raises(ObjectExistsError) as info:
        objects.create_exclusive("totals/versions/1.json", b'{"v": "other"}')
    assert isinstance(info.value, FileExistsError)
    assert str(info.value).endswith("totals/versions/1.json already exists")
    assert objects.read_bytes("totals/versions/1.json") == b'{"v": 1}'


def test_put_download_list_size_delete(objects, tmp_path):
    src = tmp_path / "src.sst"
    src.write_bytes(b"x" * 1000)
    objects.put_immutable("totals/sst/0/a.sst", src)
    objects.put_immutable("totals/sst/0/a.sst", src)  # a retry stores the same bytes
    objects.put_immutable("totals/sst/1/b.sst", src)
    objects.create_exclusive("totals/versions/1.json", b"{}")
    objects.create_exclusive("other/versions/1.json", b"{}")

    assert objects.size("totals/sst/0/a.sst") == 1000
    assert objects.list("totals/sst") == ["totals/sst/0/a.sst", "totals/sst/1/b.sst"]
    assert objects.list("totals") == [
        "totals/sst/0/a.sst",
        "totals/sst/1/b.sst",
        "totals/versions/1.json",
    ]
    assert objects.list("nothing/here") == []
    assert len(objects.list()) == 4

    cache = tmp_path / "cache"
    cache.mkdir()
    assert objects.download("totals/sst/1/b.sst", cache / "b.sst") == 1000
    assert (cache / "b.sst").read_bytes() == b"x" * 1000
    assert [p.name for p in cache.iterdir()] == ["b.sst"]  # no temporary file left

    objects.delete("totals/sst/0/a.sst")
    objects.delete("totals/sst/0/a.sst")  # already gone: fine
    assert objects.list("totals/sst") == ["totals/sst/1/b.sst"]


def test_missing_objects_are_object_missing_errors(objects, tmp_path):
    for call in (
        lambda: objects.read_bytes("no/such.json"),
        lambda: objects.size("no/such.json"),
        lambda: objects.download("no/such.json", tmp_path / "got"),
    ):
        with pytest.raises(ObjectMissingError, match=r"no/such\.json: no such object"):
            call()
    assert not (tmp_path / "got").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)] == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "a/./b", "a\\b", "a\x00b",
                                 f"a/{TMP_PREFIX}x"])  # fmt: skip
def test_bad_keys_are_refused_before_any_io(objects, key):
    with pytest.raises(ValueError, match="not an object key"):
        objects.create_exclusive(key, b"")


def test_racing_threads_never_both_create(objects):
    racers, rounds = 6, 8
    winners: dict[int, list[int]] = {r: [] for r in range(rounds)}
    barrier = threading.Barrier(racers)
    # One client per racer, as separate writers have (fsspec's client is per instance).
    clients = [open_objects(objects.root) for _ in range(racers)]

    def race(i: int) -> None:
        for r in range(rounds):
            barrier.wait()
            try:
                clients[i].create_exclusive(f"race/{r}.json", str(i).encode() * 100)
                winners[r].append(i)
            except ObjectExistsError:
                pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(rounds):
        assert len(winners[r]) == 1, winners
        assert objects.read_bytes(f"race/{r}.json") == str(winners[r][0]).encode() * 100


RACER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from iqkit.errors import ObjectExistsError
    from iqkit.store.objects import open_objects
    root, me, go, keys = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    objects = open_objects(root)
    while not go.exists():
        time.sleep(0.005)
    won = []
    for k in range(keys):
        try:
            objects.create_exclusive(f"race/{k}.json", me.encode() * 50)
            won.append(str(k))
        except ObjectExistsError:
            pass
    print(",".join(won))
    """
)


def test_racing_processes_never_both_create(root_url, tmp_path):
    keys, go = 10, tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, root_url, f"p{i}", str(go), str(keys)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for i in range(3)
    ]
    time.sleep(1.0)  # let them import; the race starts together either way
    go.touch()
    won = {f"p{i}": p.communicate(timeout=120)[0].strip() for i, p in enumerate(procs)}
    assert all(p.returncode == 0 for p in procs)
    per_key = sorted(int(k) for text in won.values() for k in text.split(",") if k)
    assert per_key == list(range(keys))  # every key created exactly once
    objects = open_objects(root_url)
    for who, text in won.items():
        for k in filter(None, text.split(",")):
            assert objects.read_bytes(f"race/{k}.json") == who.encode() * 50


# -- S3 faults --------------------------------------------------------------------------------
def test_server_gone_mid_upload_leaves_no_object_and_the_last_version_readable(
    s3_endpoint, monkeypatch, tmp_path
):
    aws_env(monkeypatch, s3_endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own retries: keep the test short
    bucket = new_bucket(s3_endpoint)
    root = f"s3://{bucket}/stores"
    open_objects(root).create_exclusive("t/versions/1.json", b"version one")

    big = tmp_path / "big.sst"
    big.write_bytes(os.urandom(4 << 20))
    proxy = CuttingProxy(s3_endpoint, cut_after=1 << 20)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    through_proxy = open_objects(root)
    with pytest.raises(StoreIOError) as info:
        through_proxy.put_immutable("t/sst/0/big.sst", big)
    assert proxy.cut.is_set(), info.value
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot upload s3://{bucket}/stores/t/sst/0/big.sst: "), message
    assert "the endpoint cannot be reached or dropped the connection" in message, message
    with pytest.raises(StoreIOError, match="cannot create"):
        through_proxy.create_exclusive("t/versions/2.json", b"version two")

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the server is back
    direct = open_objects(root)
    assert direct.list("t") == ["t/versions/1.json"]  # nothing half-uploaded is visible
    assert direct.read_bytes("t/versions/1.json") == b"version one"
    direct.create_exclusive("t/versions/2.json", b"version two")  # the retry can publish


def test_missing_credentials_are_one_line(s3_endpoint, monkeypatch):
    aws_env(monkeypatch, s3_endpoint)
    bucket = new_bucket(s3_endpoint)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    objects = open_objects(f"s3://{bucket}/stores")
    with pytest.raises(StoreIOError) as info:
        objects.read_bytes("t/versions/1.json")
    assert str(info.value) == (
        f"cannot read s3://{bucket}/stores/t/versions/1.json: no credentials found; set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass storage_options"
    )


def test_credentials_from_a_profile_and_endpoint_from_storage_options(
    s3_endpoint, monkeypatch, tmp_path
):
    """The usual places: a named profile in the shared credentials file, and the
    filesystem library's own options for the endpoint."""
    aws_env(monkeypatch, s3_endpoint)
    bucket = new_bucket(s3_endpoint)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[analyst]\naws_access_key_id = from-profile\naws_secret_access_key = secret\n"
    )
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.fspath(credentials))
    monkeypatch.setenv("AWS_PROFILE", "analyst")
    objects = open_objects(f"s3://{bucket}/x", storage_options={"endpoint_url": s3_endpoint})
    objects.create_exclusive("a.json", b"1")
    assert objects.read_bytes("a.json") == b"1"


def test_a_bucket_that_does_not_exist_is_one_line(s3_root):
    objects = open_objects("s3://iqkit-no-such-bucket/x")
    with pytest.raises((ObjectMissingError, StoreIOError)) as info:
        objects.read_bytes("a.json")
    assert "\n" not in str(info.value)


def test_local_create_leaves_no_temporary_file(tmp_path):
    objects = open_objects(tmp_path)
    objects.create_exclusive("t/v.json", b"1")
    with pytest.raises(ObjectExistsError):
        objects.create_exclusive("t/v.json", b"2")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["v.json"]
    assert Path(tmp_path / "t" / "v.json").read_bytes() == b"1"
