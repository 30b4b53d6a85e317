"""``python -m iqkit``: the small command line (the demo: tests/test_demo.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import iqkit
from iqkit.__main__ import main


@pytest.fixture(autouse=True)
def _own_reader_cache(tmp_path_factory, monkeypatch) -> None:
    """This process's readers of chain stores build their databases in a cache of the
    test's own (``IQKIT_CACHE``), never the user's home."""
    monkeypatch.setenv("IQKIT_CACHE", str(tmp_path_factory.mktemp("iqkit-cache")))


def write_small_stores(root) -> None:
    """'totals' (kv, 4 partitions, JSON values, input topic 'orders' fully applied, end
    offsets recorded) and 'clicks' (a window store written without a source). These were
    the old ``python -m iqkit demo``'s stores; the demo now runs Spark (tests/test_demo.py)."""
    iqkit.create_store(root, "totals", partitions=4, value_serde="json")
    iqkit.create_store(
        root, "clicks", partitions=2, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    with iqkit.StoreWriter(root, "totals") as w:
        for offset, (customer, amount) in enumerate(
            [("alice", 30), ("bob", 12), ("carol", 7), ("alice", 12), ("dave", 99), ("bob", 1)]
        ):
            w.put(
                customer,
                {"customer": customer, "last": amount},
                source=("orders", offset % 2, offset),
            )
        w.record_applied({"orders": {0: 4, 1: 5}})
        w.record_source_end({"orders": {0: 5, 1: 6}})
    with iqkit.StoreWriter(root, "clicks") as w:
        for minute in range(5):
            w.put("alice", minute * 3, window_start=minute * 60_000)


def test_stores_lists_each_store(tmp_path, capsys):
    write_small_stores(tmp_path)
    assert main(["stores", str(tmp_path)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listing] == ["clicks", "totals"]


def test_get_parses_the_key_with_the_store_serde(tmp_path, capsys):
    write_small_stores(tmp_path)
    assert main(["get", str(tmp_path), "totals", "dave"]) == 0
    assert capsys.readouterr().out.strip() == "{'customer': 'dave', 'last': 99}"
    assert main(["scan", str(tmp_path), "totals", "--prefix", "ca"]) == 0
    assert "'carol'" in capsys.readouterr().out


def test_errors_are_one_line_with_a_hint(tmp_path, capsys):
    write_small_stores(tmp_path)
    assert main(["get", str(tmp_path), "totalz", "x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown store 'totalz'; did you mean 'totals'?"
    assert main(["stores", str(tmp_path / "missing")]) == 2
    assert "no iqkit root" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_scan_limit_counts_rows_in_all_partitions(tmp_path, capsys):
    write_small_stores(tmp_path)

    def rows() -> list[str]:
        return capsys.readouterr().out.splitlines()

    assert main(["scan", str(tmp_path), "totals", "--limit", "1000"]) == 0
    everything = rows()
    assert len(everything) > 2 and len({line.split("\t")[0] for line in everything}) > 1
    assert main(["scan", str(tmp_path), "totals", "--limit", "2"]) == 0
    assert rows() == everything[:2]


def test_lag_reads_zero_where_everything_was_applied(tmp_path, capsys):
    write_small_stores(tmp_path)
    assert main(["lag", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "clicks\tno source recorded"  # one line in words, no "unknown" rows
    totals = [line.split("\t") for line in lines[1:]]
    assert [(t[0], t[1], t[3]) for t in totals] == [("totals", str(p), "0") for p in range(4)]


def test_scan_of_never_written_partitions_prints_no_failures(tmp_path, capsys):
    iqkit.create_store(tmp_path, "sparse", partitions=4, partitioner="explicit")
    with iqkit.StoreWriter(tmp_path, "sparse") as w:
        w.put("a", 1, partition=2)
    assert main(["scan", str(tmp_path), "sparse"]) == 0
    assert capsys.readouterr().out.splitlines() == ["2\t'a'\t1"]
    iqkit.create_store(tmp_path, "empty", partitions=2)
    assert main(["scan", str(tmp_path), "empty"]) == 0
    assert main(["get", str(tmp_path), "empty", "a"]) == 0
    assert capsys.readouterr().out == "(not found)\n"


def test_stores_says_when_a_store_has_no_version(tmp_path, capsys):
    iqkit.create_store(tmp_path, "empty", partitions=2)
    assert main(["stores", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("\tnot written yet")


def test_a_closed_pipe_is_not_a_traceback(tmp_path):
    iqkit.create_store(tmp_path, "big", partitions=2)
    with iqkit.StoreWriter(tmp_path, "big") as w:  # far more than a pipe buffer holds
        for i in range(20_000):
            w.put(f"key-{i:06d}", f"value-{i}")
    # A reader that takes one line and leaves, as `| head -1` does.
    cli = subprocess.Popen(
        [sys.executable, "-m", "iqkit", "scan", str(tmp_path), "big", "--limit", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # IQKIT_CACHE: _own_reader_cache
    )
    assert cli.stdout is not None and cli.stderr is not None
    assert cli.stdout.readline()
    cli.stdout.close()
    err = cli.stderr.read().decode()
    cli.wait(timeout=60)
    assert "Traceback" not in err


def test_the_cli_reads_an_s3_root_from_a_process_whose_only_access_is_the_endpoint(
    s3_root, tmp_path
):
    """Written here, read by a separate process with its own empty cache and current
    folder: the AWS variables (endpoint, keys) are all it shares with the writer."""
    write_small_stores(s3_root)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IQKIT_")}
    env["IQKIT_CACHE"] = os.fspath(tmp_path / "reader-cache")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "iqkit", *args],
            capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
        )  # fmt: skip

    stores = cli("stores", s3_root)
    assert stores.returncode == 0, stores.stderr
    assert [line.split("\t")[0] for line in stores.stdout.splitlines()] == ["clicks", "totals"]
    assert "version 1" in stores.stdout
    got = cli("get", s3_root, "totals", "dave")
    assert got.stdout.strip() == "{'customer': 'dave', 'last': 99}"
    scan = cli("scan", s3_root, "totals", "--prefix", "ca")
    assert "'carol'" in scan.stdout and "'alice'" not in scan.stdout
    lag = cli("lag", s3_root)
    assert lag.returncode == 0 and "totals\t" in lag.stdout
    assert sorted(p.name for p in cwd.iterdir()) == []
    assert (tmp_path / "reader-cache").is_dir()

    env.pop("AWS_ACCESS_KEY_ID")
    env.pop("AWS_SECRET_ACCESS_KEY")
    refused = cli("stores", s3_root)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "no credentials" in refused.stderr
