"""Integrity (store/integrity.py): every published file carries a checksum, readers check
what they read, a damaged file fails its partition in every query shape naming the file,
and ``iqkit.verify`` / ``python -m iqkit verify`` find every damaged file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import iqkit
from iqkit import KeyQuery, MultiKeyQuery, PrefixScanQuery, RangeQuery, StateQueryRequest
from iqkit.store.integrity import checksum_file, seal_json, unseal_json

ROWS = {f"k{i:03d}": {"price": i * 0.37 + 0.01, "qty": i, "tag": "t" * (i % 5)} for i in range(120)}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Each test's readers build in their own cache (and start with no damage known:
    tests/conftest.py)."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path_factory.mktemp("iqkit-cache")))


def make_store(root: Path) -> None:
    iqkit.create_store(root, "t", partitions=2, key_serde="string", value_serde="json")
    with iqkit.StoreWriter(root, "t") as w:
        for k, v in ROWS.items():
            w.put(k, v)
    with iqkit.StoreWriter(root, "t") as w:  # a delta: updates and a delete
        w.put("k001", {"price": 9.5, "qty": 1, "tag": "new"})
        w.delete("k002")


def expected() -> dict[str, dict]:
    rows = dict(ROWS)
    rows["k001"] = {"price": 9.5, "qty": 1, "tag": "new"}
    del rows["k002"]
    return rows


def owner(engine: iqkit.StateEngine, key: str) -> int:
    r = engine.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key)))
    return next(iter(r.partition_results))


def files_of(root: Path, partition: int, suffix: str) -> list[Path]:
    return sorted((root / "t" / "sst" / str(partition)).glob(f"*{suffix}"))


def scramble(path: Path) -> None:
    """Every byte replaced, the size kept (a stat cannot see it)."""
    data = path.read_bytes()
    path.write_bytes(bytes((b + 101) % 256 for b in data))


def shapes(engine: iqkit.StateEngine, key: str) -> dict[str, object]:
    """Each query shape's answer for the partition owning ``key``: its rows, or its
    failure (reason, message)."""
    out: dict[str, object] = {}
    queries = {  # scans first: they read the twins (and check them whole)
        "range": RangeQuery.with_no_bounds(),
        "prefix": PrefixScanQuery.with_prefix("k0"),
        "key": KeyQuery.with_key(key),
        "multi": MultiKeyQuery.with_keys([key]),
    }
    p = owner(engine, key)
    for name, query in queries.items():
        r = engine.query(StateQueryRequest.in_store("t").with_query(query))
        pr = r.partition_results[p]
        if pr.is_failure:
            out[name] = (pr.failure_reason.name, pr.failure_message)
        elif name in ("key", "multi"):
            out[name] = pr.result
        else:
            with pr.result as rows:
                out[name] = [(kv.key, kv.value) for kv in rows]
    return out


def test_records_and_manifests_are_sealed_with_their_checksum(tmp_path):
    make_store(tmp_path)
    record = (tmp_path / "t" / "chain" / "000000000002.json").read_bytes()
    manifest = (tmp_path / "t" / "manifest.json").read_bytes()
    assert record.startswith(b'{\n "checksum": "xxh3_128:')
    assert manifest.startswith(b'{\n  "checksum": "xxh3_128:')
    data = json.loads(record)
    for chain in data["partitions"].values():
        for f in chain["files"]:
            path = tmp_path / f["name"]
            assert f["checksum"] == checksum_file(path)
            twin = path.with_suffix(".parquet")
            assert f["twin_checksum"] == checksum_file(twin)
            assert f["twin"] == twin.stat().st_size


def test_unsealing_refuses_any_change_and_accepts_an_unsealed_legacy_text():
    text = json.dumps({"created_at": 1.5, "version": 3}, indent=1, sort_keys=True)
    sealed = seal_json(text).encode()
    assert unseal_json(sealed, where="r") == text.encode()
    unchanged = 0
    for i in range(len(sealed)):
        for bit in range(8):
            damaged = bytearray(sealed)
            damaged[i] ^= 1 << bit
            try:
                body = unseal_json(bytes(damaged), where="r")
                data = json.loads(body)
            except iqkit.StoreCorruptedError as exc:
                assert str(exc).startswith("r is damaged: ")
            except ValueError:
                pass  # not JSON any more: the record's parse refuses it
            else:  # only a flip in the checksum's name: every other byte as written
                data.pop(next(iter(data)))
                assert data == json.loads(text)
                unchanged += 1
    assert 0 < unchanged <= 8 * len('"checksum"')
    legacy = text.encode()
    assert unseal_json(legacy, where="r") == legacy


def test_a_scrambled_sst_is_never_hidden_by_its_twin(tmp_path):
    make_store(tmp_path)
    with iqkit.open(tmp_path) as engine:
        p = owner(engine, "k005")
    sst = files_of(tmp_path, p, ".sst")[0]
    scramble(sst)
    with iqkit.open(tmp_path) as engine:
        answers = shapes(engine, "k005")
    for name in ("range", "prefix", "key", "multi"):
        reason, message = answers[name]
        assert reason == "STORE_EXCEPTION", name
        assert sst.name in message and "\n" not in message, (name, message)


@pytest.mark.parametrize("first", ["scan", "key"])
def test_a_scrambled_twin_fails_every_shape_once_found(tmp_path, first):
    make_store(tmp_path)
    with iqkit.open(tmp_path) as engine:
        p = owner(engine, "k005")
    twin = files_of(tmp_path, p, ".parquet")[0]
    scramble(twin)
    with iqkit.open(tmp_path) as engine:
        if first == "key":
            # A key lookup reads the SST (sound): the right answer, the twin unread.
            r = engine.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k005")))
            assert r.partition_results[p].result == expected()["k005"]
        answers = shapes(engine, "k005")
    for name in ("range", "prefix", "key", "multi"):
        reason, message = answers[name]
        assert reason == "STORE_EXCEPTION", name
        assert twin.name in message and "\n" not in message, (name, message)
    with pytest.raises(iqkit.SQLError, match=twin.name):
        iqkit.sql("SELECT sum(price) FROM t", root=tmp_path)


def test_a_truncated_file_fails_by_its_size(tmp_path):
    make_store(tmp_path)
    with iqkit.open(tmp_path) as engine:
        p = owner(engine, "k005")
    sst = files_of(tmp_path, p, ".sst")[-1]
    with open(sst, "r+b") as fh:
        fh.truncate(sst.stat().st_size - 1)
    with iqkit.open(tmp_path) as engine:
        answers = shapes(engine, "k005")
    for name in ("key", "range"):
        reason, message = answers[name]
        assert reason == "STORE_EXCEPTION" and "bytes, and its version record says" in message


def test_restoring_the_file_clears_the_verdict(tmp_path):
    make_store(tmp_path)
    with iqkit.open(tmp_path) as engine:
        p = owner(engine, "k005")
    twin = files_of(tmp_path, p, ".parquet")[0]
    good = twin.read_bytes()
    scramble(twin)
    with iqkit.open(tmp_path) as engine:
        assert shapes(engine, "k005")["key"][0] == "STORE_EXCEPTION"
        tmp = twin.with_suffix(".tmp")
        tmp.write_bytes(good)
        os.replace(tmp, twin)  # a restore from a backup: another file there
        answers = shapes(engine, "k005")
    assert answers["key"] == expected()["k005"]
    assert answers["multi"] == {"k005": expected()["k005"]}
    assert answers["range"] and all(expected()[k] == v for k, v in answers["range"])
    assert answers["prefix"] == [(k, v) for k, v in answers["range"] if k.startswith("k0")]


def test_a_damaged_record_fails_every_partition(tmp_path):
    make_store(tmp_path)
    record = tmp_path / "t" / "chain" / "000000000002.json"
    text = record.read_bytes()
    at = text.index(b'"qty"') if b'"qty"' in text else text.index(b'"puts": ') + 8
    record.write_bytes(text[:at] + bytes([text[at] ^ 1]) + text[at + 1 :])
    with iqkit.open(tmp_path) as engine:
        r = engine.query(StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()))
    assert len(r.partition_results) == 2
    for pr in r.partition_results.values():
        assert pr.failure_reason.name == "STORE_EXCEPTION"
        assert "000000000002.json is damaged" in pr.failure_message


def test_verify_finds_each_damaged_file_and_repairs_a_twin(tmp_path, capsys):
    from iqkit.__main__ import main

    make_store(tmp_path)
    report = iqkit.verify(tmp_path)
    on_root = [p for p in (tmp_path / "t").rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert report.ok and report.damaged == [] and report.unchecked == 0
    assert report.versions == 2 and report.files == len(on_root)  # manifest, records, files
    assert report.bytes == sum(p.stat().st_size for p in on_root if p.suffix != ".json")
    assert main(["verify", str(tmp_path)]) == 0
    assert "no damage found" in capsys.readouterr().out

    twin = files_of(tmp_path, 0, ".parquet")[0]
    good_twin = twin.read_bytes()
    sst = files_of(tmp_path, 1, ".sst")[-1]
    damaged_twin = bytearray(good_twin)
    damaged_twin[len(good_twin) // 2] ^= 4
    twin.write_bytes(bytes(damaged_twin))
    with open(sst, "r+b") as fh:
        fh.truncate(100)
    report = iqkit.verify(tmp_path, ["t"])
    assert not report.ok
    found = {Path(d.file).name: d for d in report.damaged}
    assert set(found) == {twin.name, sst.name}
    assert found[twin.name].partition == 0 and found[twin.name].versions == (1, 2)
    assert "checksum does not match" in found[twin.name].what
    assert "100 bytes" in found[sst.name].what
    assert main(["verify", str(tmp_path), "t"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[-1].endswith("2 damaged")

    # --repair rebuilds the twin from its sound SST, byte for byte; the cut SST stays.
    assert main(["verify", str(tmp_path), "--repair"]) == 1
    assert twin.read_bytes() == good_twin
    assert "repaired: " in capsys.readouterr().out
    report = iqkit.verify(tmp_path)
    assert [Path(d.file).name for d in report.damaged] == [sst.name]


def test_verify_names_a_damaged_manifest_and_record(tmp_path):
    make_store(tmp_path)
    manifest = tmp_path / "t" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"partitions": 2', b'"partitions": 3'))
    record = tmp_path / "t" / "chain" / "000000000001.json"
    record.write_bytes(record.read_bytes()[:-20])
    report = iqkit.verify(tmp_path)
    names = sorted(Path(d.file).name for d in report.damaged)
    assert names == ["000000000001.json", "manifest.json"]
    with (
        pytest.raises(iqkit.StoreCorruptedError, match="manifest"),
        iqkit.open(tmp_path) as engine,
    ):
        engine.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k001")))


def test_stores_written_before_checksums_still_read(tmp_path):
    """A record and manifest with no checksum line (an earlier iqkit's) are read; their
    twins are not handed to a Parquet reader (scans read RocksDB), and verify counts
    their files as checked by size only."""
    make_store(tmp_path)
    for path in [tmp_path / "t" / "manifest.json", *(tmp_path / "t" / "chain").glob("*.json")]:
        data = json.loads(path.read_bytes())
        data.pop("checksum")
        for chain in data["partitions"].values() if "files" in str(data) else []:
            for f in chain["files"]:
                f.pop("checksum"), f.pop("twin_checksum")
        indent = 2 if path.name == "manifest.json" else 1
        path.write_text(json.dumps(data, indent=indent, sort_keys=True))
    with iqkit.open(tmp_path) as engine:
        r = engine.query(
            StateQueryRequest.in_store("t")
            .with_query(RangeQuery.with_no_bounds())
            .enable_execution_info()
        )
        got = {}
        for pr in r.partition_results.values():
            with pr.result as rows:
                got.update((kv.key, kv.value) for kv in rows)
            assert not any("ColumnarScan" in line for line in pr.execution_info)
    assert got == expected()
    report = iqkit.verify(tmp_path)
    files = [p for p in (tmp_path / "t" / "sst").rglob("*") if p.is_file()]
    assert report.ok and report.unchecked == len(files)
    assert f"{len(files)} files have no checksum" in report.summary()


def test_verify_of_an_unknown_store_is_one_line(tmp_path):
    make_store(tmp_path)
    with pytest.raises(iqkit.UnknownStoreError, match="'nope'"):
        iqkit.verify(tmp_path, ["nope"])


def test_the_cli_runs_as_a_module(tmp_path):
    make_store(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "t", copy / "t")
    out = subprocess.run(
        [sys.executable, "-m", "iqkit", "verify", str(copy)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("no damage found")


def test_a_copy_fetched_from_object_storage_is_checked_before_it_is_used(s3_root, tmp_path):
    """A file damaged on the object store (same size): its fetched copy fails the
    check, its partition fails naming the root's file, and no copy of it stays in the
    cache; verify finds it there too (fetching privately, never into the cache)."""
    import fsspec

    make_store(s3_root)
    fs = fsspec.filesystem("s3")
    bucket_root = s3_root.removeprefix("s3://")
    # The newest twin: the delta's commit fetched the older one into the cache, checked,
    # to find the rows it supersedes (store/columnar/deletes.py).
    twin = sorted(p for p in fs.find(f"{bucket_root}/t/sst/0") if p.endswith(".parquet"))[-1]
    good = fs.cat_file(twin)
    fs.pipe_file(twin, bytes((b + 1) % 256 for b in good))
    with iqkit.open(s3_root) as engine:
        r = engine.query(StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()))
    failed = r.partition_results[0]
    assert failed.failure_reason.name == "STORE_EXCEPTION"
    assert twin.rsplit("/", 1)[1] in failed.failure_message
    assert "bytes fetched do not match" in failed.failure_message
    assert r.partition_results[1].is_success
    cached = list(Path(os.environ["IQKIT_CACHE"]).rglob(twin.rsplit("/", 1)[1]))
    assert cached == []
    report = iqkit.verify(s3_root)
    assert [Path(d.file).name for d in report.damaged] == [twin.rsplit("/", 1)[1]]
    assert not list(Path(os.environ["IQKIT_CACHE"]).rglob("*.sst"))  # verify cached nothing


def test_a_damaged_block_found_in_a_built_database_names_the_roots_file(tmp_path):
    """A block a first lookup did not read, found damaged once the partition's database
    is built (in the cache or a build's scratch folder), is named by the root's file, not
    by the database's own name for it (fault injection found these)."""
    iqkit.create_store(tmp_path, "b", partitions=1, key_serde="string", value_serde="json")
    with iqkit.StoreWriter(tmp_path, "b") as w:  # several 4 KiB blocks of data
        for i in range(400):
            w.put(f"k{i:04d}", {"s": f"{i:04d}-" + "x" * (40 + i % 50)})
    with iqkit.StoreWriter(tmp_path, "b") as w:  # a delta: the chain has two files
        w.put("k0399", {"s": "new"})
    base = sorted((tmp_path / "b" / "sst" / "0").glob("*.sst"))[0]
    data = bytearray(base.read_bytes())
    data[len(data) * 2 // 5] ^= 0x10  # a middle data block: not the first or last keys
    base.write_bytes(bytes(data))
    with iqkit.open(tmp_path) as engine:
        first = engine.query(StateQueryRequest.in_store("b").with_query(KeyQuery.with_key("k0399")))
        assert first.partition_results[0].is_success  # read in place, from the delta
        every = MultiKeyQuery.with_keys([f"k{i:04d}" for i in range(400)])
        r = engine.query(StateQueryRequest.in_store("b").with_query(every))
        failed = r.partition_results[0]
        assert failed.failure_reason == iqkit.FailureReason.STORE_EXCEPTION
        assert base.name in failed.failure_message, failed.failure_message
        assert "iqkit-build" not in failed.failure_message
        assert "\n" not in failed.failure_message


def test_verify_names_a_record_whose_checksum_line_lost_its_name(tmp_path):
    """A flipped bit in the word ``checksum`` leaves a record readers read right (every
    other byte is as written), yet it is damage ``verify`` must report: its files carry
    checksums, so the iqkit that wrote it sealed it (the long fault run found two)."""
    make_store(tmp_path)
    record = sorted((tmp_path / "t" / "chain").glob("*.json"))[-1]
    raw = record.read_bytes()
    assert raw.startswith(b'{\n "checksum"')
    record.write_bytes(raw.replace(b'"checksum"', b'"chEcksum"', 1))
    report = iqkit.verify(tmp_path)
    assert [d.file.endswith(f"t/chain/{record.name}") for d in report.damaged] == [True]
    assert "checksum line" in report.damaged[0].what
    with iqkit.open(tmp_path) as engine:
        r = engine.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k001")))
        assert r.only_partition_result().result == {"price": 9.5, "qty": 1, "tag": "new"}
