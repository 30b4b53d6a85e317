"""Values out of every range a store can hold, on real stores: window times beyond 64-bit
epoch milliseconds, manifests declaring absurd partition counts, version records naming
partitions the manifest does not have (issue 20, items 8 and 9); and a root whose bucket
does not exist (item 15)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import request

import iqkit
from iqkit.__main__ import main
from iqkit.errors import StoreCorruptedError
from iqkit.jupyter.testing import IQTestShell, new_shell
from iqkit.store.encoding import keyspace
from iqkit.store.manifest import MAX_PARTITIONS

LATEST_MS = 2**63 - 1
EARLIEST_MS = -(2**63)
OUT_OF_RANGE = (2**63, 2**64 + 5, EARLIEST_MS - 1, -(2**64))


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path / "iqkit-cache"))


def window_store(root: Path, name: str = "w", size: int = 1000) -> None:
    iqkit.create_store(
        root, name, partitions=2, kind="window", window_size_ms=size, value_serde="int64"
    )


def one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text.strip()


# -- item 8: window times ----------------------------------------------------------------------
@pytest.mark.parametrize("start", OUT_OF_RANGE)
def test_window_starts_outside_64_bit_milliseconds_are_refused_and_nothing_is_written(
    tmp_path, start
):
    window_store(tmp_path)
    with pytest.raises(ValueError) as info, iqkit.StoreWriter(tmp_path, "w") as w:
        w.put("a", 1, window_start=0)
        w.put("a", 2, window_start=start)
    message = one_line(str(info.value))
    assert "store 'w'" in message and str(start) in message
    with iqkit.open(tmp_path) as engine:
        assert engine.version("w") is None


def test_a_window_must_end_within_64_bit_milliseconds(tmp_path):
    window_store(tmp_path, size=1000)
    with pytest.raises(ValueError) as info, iqkit.StoreWriter(tmp_path, "w") as w:
        w.put("a", 1, window_start=LATEST_MS - 999)
    assert "1000 ms" in one_line(str(info.value))
    with iqkit.StoreWriter(tmp_path, "w") as w:  # the last window that fits, and the first
        w.put("a", 1, window_start=LATEST_MS - 1000)
        w.put("a", 2, window_start=EARLIEST_MS)
    with iqkit.open(tmp_path) as engine:
        q = iqkit.WindowKeyQuery.with_key_and_window_start_range("a", EARLIEST_MS, LATEST_MS)
        r = engine.query(request("w", q))
        got = [
            (kv.key.start, kv.key.end, kv.value)
            for qr in r.partition_results.values()
            for kv in qr.result
        ]
    assert got == [
        (EARLIEST_MS, EARLIEST_MS + 1000, 2),
        (LATEST_MS - 1000, LATEST_MS, 1),
    ]


@pytest.mark.parametrize("start", OUT_OF_RANGE)
def test_the_keyspace_never_wraps_a_time(start):
    with pytest.raises(ValueError, match=str(start)):
        keyspace.encode_time(start)
    assert keyspace.decode_time(keyspace.encode_time(LATEST_MS)) == LATEST_MS
    assert keyspace.decode_time(keyspace.encode_time(EARLIEST_MS)) == EARLIEST_MS


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
def test_window_queries_with_times_outside_64_bit_milliseconds_are_a_value_error(bad):
    for make, what in (
        (lambda: iqkit.WindowKeyQuery.with_key_and_window_start_range("a", 0, bad), "time_to"),
        (lambda: iqkit.WindowKeyQuery.with_key_and_window_start_range("a", bad, 0), "time_from"),
        (lambda: iqkit.WindowRangeQuery.with_window_start_range(bad, 0), "time_from"),
        (lambda: iqkit.WindowRangeQuery.with_window_start_range(0, bad), "time_to"),
    ):
        with pytest.raises(ValueError) as info:
            make()
        message = one_line(str(info.value))
        assert what in message and str(bad) in message
    # the extremes themselves are every window a store can hold
    q = iqkit.WindowRangeQuery.with_window_start_range(EARLIEST_MS, LATEST_MS)
    assert (q.time_from, q.time_to) == (EARLIEST_MS, LATEST_MS)


@pytest.fixture
def shell(tmp_path):
    root = tmp_path / "stores"
    root.mkdir()
    window_store(root, "clicks", size=60_000)
    with iqkit.StoreWriter(root, "clicks") as w:
        w.put("alice", 1, window_start=0)
    sh: IQTestShell = new_shell(root=str(root), progress=False)
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()


@pytest.mark.parametrize(
    "line",
    [
        "%iq window clicks alice --from 0 --to 99999999999999999999",
        "%iq window clicks alice --from 9223372036854775808 --to 9223372036854775809",
        "%iq windows clicks --from -9223372036854775809 --to 5",
    ],
)
def test_iq_window_lines_with_huge_times_are_one_line(shell, line):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as info:
        shell.run_cell(line)
    message = one_line(str(info.value))
    assert message.startswith("%iq window") and "64-bit epoch milliseconds" in message


# -- item 9: partition counts --------------------------------------------------------------------
def test_creating_a_store_with_more_partitions_than_the_bound_is_refused(tmp_path):
    with pytest.raises(ValueError) as info:
        iqkit.create_store(tmp_path, "big", partitions=MAX_PARTITIONS + 1)
    assert str(MAX_PARTITIONS) in one_line(str(info.value))
    assert not (tmp_path / "big").exists()
    iqkit.create_store(tmp_path, "ok", partitions=MAX_PARTITIONS)  # the bound itself is fine


def _declare_partitions(root: Path, store: str, partitions: int) -> None:
    """Rewrite ``store``'s manifest by hand, as a hostile or broken tool would."""
    path = root / store / "manifest.json"
    data = json.loads(path.read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    data["partitions"] = partitions
    path.write_text(json.dumps(data))


#: Runs every entry point that used to loop over the declared partitions, in a process
#: whose address space is capped: a list or dict per declared partition (10**9 of them)
#: runs out of memory long before it could finish; reading nothing per partition fits.
_ENTRY_POINTS = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import iqkit
    from iqkit.__main__ import main
    from iqkit.jupyter.stores_table import stores_frame

    root, store = sys.argv[1], sys.argv[2]
    out = {}
    with iqkit.open(root) as engine:
        try:
            r = engine.query(
                iqkit.StateQueryRequest.in_store(store).with_query(iqkit.RangeQuery.with_no_bounds())
            )
            out["range"] = [qr.failure_message for qr in r.partition_results.values()]
        except iqkit.IqkitError as exc:
            out["range"] = str(exc)
        try:
            out["lags"] = repr(engine.lags())
        except iqkit.IqkitError as exc:
            out["lags"] = str(exc)
        frame = stores_frame(engine)
        out["stores"] = frame.to_dict(orient="records")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        out["cli_lag"] = [main(["lag", root]), err.getvalue()]
    print("RESULT" + json.dumps(out, default=str))
    """
)

#: The address space the entry points get: far more than iqkit, pyarrow and RocksDB
#: need here, far less than anything per declared partition.
_ADDRESS_SPACE = 4 * 2**30


def _run_capped(root: Path, store: str) -> dict:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))

    done = subprocess.run(
        [sys.executable, "-c", _ENTRY_POINTS, os.fspath(root), store],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"the entry points failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT") :])


def test_a_manifest_declaring_a_billion_partitions_is_one_line_everywhere(tmp_path):
    iqkit.create_store(tmp_path, "big", partitions=2)
    with iqkit.StoreWriter(tmp_path, "big") as w:
        w.put("a", "1")
    iqkit.create_store(tmp_path, "fine", partitions=2)
    _declare_partitions(tmp_path, "big", 10**9)

    out = _run_capped(tmp_path, "big")
    for entry in ("range", "lags"):
        assert isinstance(out[entry], str), out[entry]
        assert "partitions" in one_line(out[entry]) and str(MAX_PARTITIONS) in out[entry]
    rows = {row["name"]: row for row in out["stores"]}
    assert rows["fine"]["error"] is None  # one broken store never hides the others
    assert str(MAX_PARTITIONS) in one_line(rows["big"]["error"])
    code, err = out["cli_lag"]
    assert code == 2 and one_line(err).startswith("error: ") and str(MAX_PARTITIONS) in err


def test_reading_a_manifest_above_the_bound_is_a_corrupted_store(tmp_path):
    iqkit.create_store(tmp_path, "big", partitions=2)
    _declare_partitions(tmp_path, "big", MAX_PARTITIONS + 1)
    with iqkit.open(tmp_path) as engine, pytest.raises(StoreCorruptedError) as info:
        engine.manifest("big")
    assert "unreadable manifest" in one_line(str(info.value))
    assert main(["stores", os.fspath(tmp_path)]) == 2


def _add_record_partition(root: Path, store: str, partition: str) -> None:
    """Make the latest chain record list ``partition`` too (a copy of partition 0's)."""
    records = sorted((root / store / "chain").iterdir())
    data = json.loads(records[-1].read_text())
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    data["partitions"][partition] = next(iter(data["partitions"].values()))
    records[-1].write_text(json.dumps(data))


@pytest.mark.parametrize("partition", ["2", "1000000000", "-1"])
def test_a_chain_record_naming_partitions_the_manifest_lacks_is_damage(tmp_path, partition):
    iqkit.create_store(tmp_path, "s", partitions=2)
    with iqkit.StoreWriter(tmp_path, "s") as w:
        for k in "abcdef":
            w.put(k, k)
    _add_record_partition(tmp_path, "s", partition)
    with iqkit.open(tmp_path) as engine:
        r = engine.query(request("s", iqkit.RangeQuery.with_no_bounds()))
        assert sorted(r.partition_results) == [0, 1]
        for qr in r.partition_results.values():
            assert qr.is_failure and qr.failure_reason is iqkit.FailureReason.STORE_EXCEPTION
            message = one_line(qr.failure_message)
            assert "StoreCorruptedError" in message and f"partition {partition}" in message
        with pytest.raises(StoreCorruptedError):
            engine.approximate_rows("s")
        with pytest.raises(StoreCorruptedError):
            engine.lags()


@pytest.mark.parametrize("partition", [2, 10**9])
def test_writers_never_build_on_a_record_naming_partitions_the_manifest_lacks(
    tmp_path, partition
):
    """A forged partition whose files sit in its own folder (so every name is well
    formed) is still damage to a writer: nothing is published on top of it."""
    iqkit.create_store(tmp_path, "s", partitions=2)
    with iqkit.StoreWriter(tmp_path, "s") as w:
        w.put("a", "a")
    (record_file,) = sorted((tmp_path / "s" / "chain").iterdir())
    data = json.loads(record_file.read_text())
    chain = next(iter(data["partitions"].values()))
    moved = []
    for f in chain["files"]:
        name = f"s/sst/{partition}/{f['name'].rsplit('/', 1)[1]}"
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / f["name"], tmp_path / name)
        moved.append({**f, "name": name})
    data["partitions"][str(partition)] = {**chain, "files": moved}
    data.pop("checksum")  # written by hand: no checksum (store/integrity.py)
    os.chmod(record_file, 0o644)
    record_file.write_text(json.dumps(data))
    writer = iqkit.StoreWriter(tmp_path, "s")
    writer.put("g", "g")
    with pytest.raises(StoreCorruptedError, match=f"lists partition {partition}"):
        writer.commit()
    assert sorted(p.name for p in (tmp_path / "s" / "chain").iterdir()) == [record_file.name]


# -- item 15: a missing bucket ---------------------------------------------------------------------
def test_a_missing_bucket_is_named_as_such_not_as_a_missing_object(
    s3_endpoint, monkeypatch, tmp_path
):
    from s3server import aws_env, new_bucket

    from iqkit.errors import ObjectMissingError
    from iqkit.store.objects import open_objects

    aws_env(monkeypatch, s3_endpoint)
    missing = f"{new_bucket(s3_endpoint)}-gone"  # a name no test creates
    root = f"s3://{missing}/stores"
    objects = open_objects(root)
    said = f"bucket {missing!r} does not exist"
    for call in (
        lambda: objects.read_bytes("t/manifest.json"),
        lambda: objects.size("t/manifest.json"),
        lambda: objects.download("t/manifest.json", tmp_path / "got"),
        lambda: objects.list("t"),
        lambda: objects.create_exclusive("t/chain/1.json", b"{}"),
    ):
        with pytest.raises(ObjectMissingError) as info:
            call()
        assert one_line(str(info.value)).endswith(said), info.value
    for call in (
        lambda: iqkit.open(root),
        lambda: iqkit.create_store(root, "t", partitions=2),
    ):
        with pytest.raises(iqkit.IqkitError) as info:
            call()
        assert said in one_line(str(info.value))
    # a key missing from a bucket that exists is still just a missing object
    there = open_objects(f"s3://{new_bucket(s3_endpoint)}/stores")
    with pytest.raises(ObjectMissingError, match=r"t/manifest\.json: no such object$"):
        there.read_bytes("t/manifest.json")
