"""``%iq`` through a real IPython ``InteractiveShell`` over real stores on disk."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import NOTEBOOK_TOTALS, damage_latest, request
from IPython.core.error import UsageError

import iqkit
from iqkit.jupyter.magic import IQMagics
from iqkit.jupyter.messages import Message
from iqkit.jupyter.testing import IQTestShell, new_shell


def run(shell, line: str):
    return shell.run_cell(line).result


def magics(shell) -> list[IQMagics]:
    return [c for c in shell.configurables if isinstance(c, IQMagics)]


# -- loading and configuration ---------------------------------------------------------------
def test_load_registers_iq_and_the_long_alias_and_reload_is_idempotent(shell, nb_root):
    assert shell.find_line_magic("iq") is not None
    assert shell.find_cell_magic("iq") is not None
    assert shell.find_line_magic("iqkit") is not None
    shell.run_cell("%config IQMagics.displaylimit = 3")
    shell.run_line_magic("reload_ext", "iqkit")
    shell.run_line_magic("reload_ext", "iqkit")
    assert len(magics(shell)) == 1
    assert magics(shell)[0].displaylimit == 3  # the shell's config survives a reload
    assert run(shell, "%iqkit get totals alice").rows["total"].tolist() == [42]


def test_config_traits_reach_the_session(shell):
    shell.run_cell("%config IQMagics.displaylimit = 2")
    shell.run_cell("%config IQMagics.autolimit = 3")
    session = magics(shell)[0].session
    assert (session.display_limit, session.autolimit) == (2, 3)
    r = run(shell, "%iq scan totals")
    assert len(r.rows) == 3 and r.truncated
    assert run(shell, "%iq scan totals --limit 0").rows.shape[0] == len(NOTEBOOK_TOTALS)
    html = run(shell, "%iq scan totals --limit 0")._repr_html_()
    assert "displaylimit" in html  # the footer says how to see more than 2 rows


def test_negative_limits_are_refused_by_the_trait(shell):
    before = magics(shell)[0].displaylimit
    shell.run_cell("%config IQMagics.displaylimit = -1")  # %config logs the TraitError
    assert magics(shell)[0].displaylimit == before


def test_help_and_question_mark(shell):
    text = repr(run(shell, "%iq help"))
    assert "get STORE KEY" in text and "--bound" in text
    assert "--from LO" in repr(run(shell, "%iq help range"))
    assert isinstance(run(shell, "%iq"), Message)
    assert "prefix STORE PREFIX" in shell.find_line_magic("iq").__doc__


# -- queries -----------------------------------------------------------------------------------
def test_get_matches_the_python_api(shell, nb_root):
    r = run(shell, "%iq get totals alice")
    assert r.rows[["customer", "total", "orders"]].to_dict("records") == [NOTEBOOK_TOTALS["alice"]]
    with iqkit.open(nb_root) as engine:
        api = engine.query(request("totals", iqkit.KeyQuery.with_key("alice")))
        (p,) = [p for p, q in api.partition_results.items() if q.result is not None]
    assert r.rows["partition"].tolist() == [p]
    assert r.rows["key"].tolist() == ["alice"]


def test_multi_get_and_typed_keys(shell):
    r = run(shell, "%iq get totals alice dave nobody")
    assert sorted(r.rows["key"]) == ["alice", "dave"]
    r = run(shell, "%iq get counts -3 7")
    assert dict(zip(r.rows["key"], r.rows["value"], strict=True)) == {-3: 9, 7: 49}
    shell.user_ns["k"] = 4
    assert run(shell, "%iq get counts :k").rows["value"].tolist() == [16]


def test_range_prefix_desc_and_partitions(shell):
    r = run(shell, "%iq range counts --from 3 --to 6")
    assert sorted(r.rows["key"]) == [3, 4, 5, 6]
    r = run(shell, "%iq prefix totals al")
    assert sorted(r.rows["key"]) == ["alfred", "alice"]
    r = run(shell, "%iq scan counts --desc --partitions 1")
    assert set(r.rows["partition"]) == {1}
    keys = r.rows["key"].tolist()
    assert keys == sorted(keys, key=lambda k: k.to_bytes(4, "big", signed=True), reverse=True)
    assert set(r.partitions["partition"]) == {1}


def test_window_and_windows(shell):
    r = run(shell, "%iq window clicks alice --from 0 --to 120000")
    assert r.rows["value"].tolist() == [1, 2, 3]
    assert r.rows["window_start"].tolist() == [
        pd.Timestamp(ms, unit="ms", tz="UTC") for ms in (0, 60_000, 120_000)
    ]
    r = run(shell, "%iq window clicks alice --from 0 --to 1970-01-01T00:02 --desc")
    assert r.rows["value"].tolist() == [3, 2, 1]
    r = run(shell, "%iq windows clicks --from 60000 --to 60000")
    assert sorted(r.rows["value"]) == [2, 20]
    assert len(run(shell, "%iq scan clicks").rows) == 7


def test_scan_of_a_window_store_reads_every_window_start_the_store_can_hold(shell, nb_root):
    """``%iq scan`` of a window store reads all time: every 64-bit window start, as
    ``store_batches``, SQL and the Spark reader do (it used to stop at +-2**62 ms)."""
    starts = (-(2**63), -(2**62) - 1, 2**62 + 1, 2**63 - 1 - 60_000)
    with iqkit.StoreWriter(nb_root, "clicks") as w:
        for i, start in enumerate(starts):
            w.put(f"far{i}", 100 + i, window_start=start)
    rows = run(shell, "%iq scan clicks --limit 0").rows
    far = rows[rows["key"].str.startswith("far")]
    assert sorted(far["value"]) == [100, 101, 102, 103]
    assert len(rows) == 7 + len(starts)


def test_assignment_semicolon_and_as(shell):
    shell.run_cell("x = %iq get totals bob")
    assert shell.user_ns["x"].rows["total"].tolist() == [13]
    # a trailing ';' silences the display only: the command still ran, on the store
    # named without the ';' (else "unknown store 'totals;'"), into the session's last
    session = magics(shell)[0].session
    silenced = shell.run_cell("%iq get totals bob;")
    assert silenced.success and silenced.result is None
    assert session.last.rows["total"].tolist() == [13]
    silenced = shell.run_cell("%iq scan totals;")
    assert silenced.success and silenced.result is None
    assert len(session.last.rows) == len(NOTEBOOK_TOTALS)
    run(shell, "%iq scan totals --as everyone")
    assert len(shell.user_ns["everyone"].rows) == len(NOTEBOOK_TOTALS)


def test_bound_active_and_as_of_failures_are_results(shell, nb_root):
    r = run(shell, "%iq scan totals --bound orders:0=999")
    assert set(r.partitions["status"]) == {"failed"}
    # every partition is behind the bound, an empty one too (its position is empty)
    assert set(r.partitions["failure_reason"]) == {"NOT_UP_TO_BOUND"}
    with iqkit.StoreWriter(nb_root, "totals") as w:
        w.put("zoe", {"customer": "zoe", "total": 1, "orders": 1})
    r = run(shell, "%iq get totals zoe --as-of 1 --active")
    assert "NOT_ACTIVE" in set(r.partitions["failure_reason"])
    assert run(shell, "%iq get totals zoe").rows["total"].tolist() == [1]
    assert run(shell, "%iq get totals zoe --as-of 1").rows.empty


def test_bound_from_a_previous_result_reads_your_writes(shell):
    shell.run_cell("first = %iq get totals alice")
    r = run(shell, "%iq get totals alice --bound :first")
    assert not r.failures and r.rows["total"].tolist() == [42]
    assert r.position == shell.user_ns["first"].position
    # a bound the store has not reached yet fails the partition, as a result
    later = shell.user_ns["first"].position.with_component("orders", 0, 10_000)
    shell.user_ns["later"] = later
    r = run(shell, "%iq get totals alice --bound :later")
    assert [q.failure_reason.name for q in r.failures.values()] == ["NOT_UP_TO_BOUND"]


def test_trace_is_the_last_results(shell):
    with pytest.raises(UsageError, match="no result yet"):
        run(shell, "%iq trace")
    run(shell, "%iq get totals alice --trace")
    trace = run(shell, "%iq trace")
    assert {"RocksDBLayer", "CachingLayer", "TypedKeyValueLayer"} <= set(trace["layer"])
    assert (trace["nanoseconds"] > 0).all()


def test_stores_and_lag(shell, nb_root):
    stores = run(shell, "%iq stores")
    assert sorted(stores["name"]) == ["clicks", "counts", "totals"]
    row = stores.set_index("name").loc["clicks"]
    assert (row["kind"], row["partitions"]) == ("window", 2)
    lag = run(shell, "%iq lag totals")
    with iqkit.open(nb_root) as engine:
        expected = engine.lags()["totals"]
    total = sum(info.offset_lag for info in expected.values())
    assert lag["lag"].sum() == total > 0
    assert set(lag["store"]) == {"totals"}
    everything = run(shell, "%iq lag")
    only_totals = everything[everything["store"] == "totals"].reset_index(drop=True)
    pd.testing.assert_frame_equal(only_totals, lag.reset_index(drop=True))


def test_lag_and_stores_say_no_source_recorded_in_words(shell):
    # 'counts' and 'clicks' were written without a source (as a batch write_store is)
    lag = run(shell, "%iq lag")
    assert set(lag["store"]) == {"totals"}  # no <NA> rows for the others
    assert lag.no_source == ("clicks", "counts")
    assert repr(lag).endswith("clicks, counts: no source recorded (lag unknown)")
    counts = run(shell, "%iq lag counts")
    assert counts.empty and repr(counts) == "counts: no source recorded (lag unknown)"
    stores = run(shell, "%iq stores").set_index("name")
    assert stores.loc["counts", "lag"] == stores.loc["clicks", "lag"] == "no source recorded"
    r = run(shell, "%iq get counts 7")
    (section,) = [s for s in r._repr_html_().split("<details>") if "Lag (" in s]
    assert "Lag (no source recorded)" in section and "<table>" not in section


def test_open_switches_root(shell, tmp_path: Path):
    other = tmp_path / "other"
    iqkit.create_store(other, "solo", partitions=1)
    assert "1 store(s): solo" in repr(run(shell, f"%iq open {other}"))
    assert list(run(shell, "%iq stores")["name"]) == ["solo"]


# -- errors: one line, cell fails --------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%iq get totls alice", "did you mean 'totals'"),
        ("%iq get counts abc", "key 'abc' does not fit store 'counts' (key serde int32)"),
        ("%iq scan totals --bound orders:x", "--bound expects topic:partition=offset"),
        ("%iq scan totals --partitons 1", "did you mean '--partitions'"),
        ("%iq get totals :missing", "no variable 'missing'"),
        ("%iq lag nope", "unknown store 'nope'"),
        ("%iq open /definitely/not/here", "no such folder"),
        ("%iq open s3:/bucket/stores", "pass the URL as a string"),
        ("%iq open ftp://host/stores", "unknown scheme 'ftp'"),
        ("%iq get totals alice --as-of 99", "99"),
        ("%iq window totals alice --from 0 --to 10", "'totals' is a key-value store"),
        ("%iq windows counts --from 0 --to 10", "'counts' is a key-value store"),
        ("%iq get clicks alice", "'clicks' is a window store; use window, windows or scan"),
        ("%iq range clicks --from a", "'clicks' is a window store"),
        ("%iq prefix clicks al", "'clicks' is a window store"),
    ],
)
def test_user_errors_are_usage_errors(shell, line, message):
    with pytest.raises(UsageError) as err:
        shell.run_cell(line)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_root_is_one_line(tmp_path: Path):
    sh = new_shell(root=str(tmp_path / "absent"))
    try:
        with pytest.raises(UsageError, match=r"no stores folder at .*absent.*%iq open PATH"):
            sh.run_cell("%iq stores")
    finally:
        IQTestShell.clear_instance()


def test_iqkit_root_environment_variable(monkeypatch, nb_root):
    monkeypatch.setenv("IQKIT_ROOT", str(nb_root))
    sh = new_shell(progress=False)
    try:
        assert len(sh.run_cell("%iq stores").result) == 3
    finally:
        IQTestShell.clear_instance()


# -- tab completion ------------------------------------------------------------------------------
# shell.complete() is the public (if "pending deprecation") entry the hook is wired into.
pytestmark_complete = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytestmark_complete
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("%iq g", ["get"]),
        ("%iq get ", ["clicks", "counts", "totals"]),
        ("%iq get to", ["totals"]),
        ("%iq scan totals --li", ["--limit"]),
        ("%iq help ra", ["range"]),
        ("%iqkit sca", ["scan"]),
    ],
)
def test_tab_completion(shell, line, expected):
    assert sorted(shell.complete("", line, len(line))[1]) == expected


@pytestmark_complete
def test_completion_survives_reload(shell):
    shell.run_line_magic("reload_ext", "iqkit")
    assert shell.complete("", "%iq get c", 9)[1] == ["clicks", "counts"]


# -- input that must not surprise or break the kernel (issue 14) -------------------------------
@pytest.mark.parametrize("name", ["../x", "''", ".", "a\x00b", "..", "'a/b'"])
def test_lag_of_a_name_that_cannot_be_a_store_is_one_line(shell, name):
    with pytest.raises(UsageError, match=r"^%iq: store name") as err:
        shell.run_cell(f"%iq lag {name}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name", ["__builtins__", "print", "get_ipython", "In", "_", "_i2", "__name__", "class"]
)
def test_as_refuses_names_that_would_break_the_kernel(shell, name):
    for line in (f"%iq scan totals --limit 1 --as {name}", f"%iq sql --as {name} SELECT 1"):
        with pytest.raises(UsageError, match=rf"--as:? '{re.escape(name)}' ") as err:
            shell.run_cell(line)
        assert "\n" not in str(err.value)
    shell.run_cell(
        "import os\nchecked = os.sep + print.__name__ + get_ipython().__class__.__name__"
    )
    assert shell.user_ns["checked"] == "/printIQTestShell"
    assert run(shell, "%iq scan totals --limit 1 --as fine").rows.shape[0] == 1


def test_as_also_refuses_the_shells_own_hidden_names(shell):
    shell.user_ns_hidden["my_tool"] = object()  # what a shell extension may add
    with pytest.raises(UsageError, match="one of IPython's own names"):
        shell.run_cell("%iq scan totals --as my_tool")


def test_partitions_ranges_are_bounded_before_they_are_built(shell):
    with pytest.raises(UsageError, match=r"names 10,001 partitions; at most 10,000") as err:
        shell.run_cell("%iq scan totals --partitions 0-10000")
    assert "leave --partitions out" in str(err.value)
    with pytest.raises(UsageError, match="at most 2,147,483,647"):
        shell.run_cell("%iq scan totals --partitions 0-99999999999")  # was a 10^11-number set
    with pytest.raises(UsageError, match="at most 2,147,483,647"):
        shell.run_cell(f"%iq scan totals --partitions {'9' * 5000}")  # int() refuses 4301+ digits
    r = run(shell, "%iq scan totals --partitions 0-1,7")
    assert r.partitions.set_index("partition").loc[7, "failure_reason"] == "DOES_NOT_EXIST"


def test_a_lone_surrogate_in_sql_is_one_line(shell):
    with pytest.raises(UsageError, match=r"^%iq sql: the SQL holds '\\ud800' at character 9"):
        shell.run_cell("%iq sql SELECT '\ud800'")


def test_one_broken_store_does_not_hide_the_others(shell, nb_root):
    (nb_root / "counts" / "manifest.json").write_text("{not json")
    damaged = damage_latest(nb_root, "clicks")  # LATEST, or a chain store's newest record
    stores = run(shell, "%iq stores").set_index("name")
    assert list(stores.index) == ["clicks", "counts", "totals"]
    assert stores.loc["totals", "kind"] == "kv" and pd.isna(stores.loc["totals", "error"])
    assert "manifest" in stores.loc["counts", "error"] and damaged in stores.loc["clicks", "error"]
    assert stores.loc[["clicks", "counts"], ["kind", "version", "lag"]].isna().all().all()
    lag = run(shell, "%iq lag")
    healthy = lag[lag["error"].isna()]
    assert set(healthy["store"]) == {"totals"} and healthy["lag"].sum() > 0
    broken = lag[lag["error"].notna()].set_index("store")
    assert sorted(broken.index) == ["clicks", "counts"]
    assert "manifest" in broken.loc["counts", "error"]
    assert broken[["partition", "lag"]].isna().all().all()
    # One store asked for by name: its own problem, on its row.
    one = run(shell, "%iq lag clicks")
    assert len(one) == 1 and damaged in one["error"].iloc[0]


def test_reversed_window_times_say_why_nothing_came_back(shell):
    r = run(shell, "%iq window clicks alice --from 240000 --to 0")
    assert len(r) == 0
    (note,) = r.notes
    assert "later than --to" in note and "--desc" in note
    assert run(shell, "%iq window clicks alice --from 0 --to 240000 --desc").notes == []


def test_stable_timings_reach_trace_and_keep_the_progress_bar_away(shell, monkeypatch):
    from iqkit.jupyter import render

    monkeypatch.setenv(render.STABLE_TIMINGS_ENV, "1")
    shell.run_cell("%iq scan totals")
    trace = shell.run_cell("%iq trace").result
    assert trace["nanoseconds"].notna().all()
    assert render.TIME_PLACEHOLDER in repr(trace)
    assert render.TIME_PLACEHOLDER in trace._repr_html_()
    shell.run_cell("%config IQMagics.progress = True")
    session = magics(shell)[0].session
    # the read bar appears only when reading takes half a second: never, when stable
    with session._progress_bar("totals") as advance:
        assert advance is None
    monkeypatch.delenv(render.STABLE_TIMINGS_ENV)
    with session._progress_bar("totals") as advance:
        assert advance is not None


def test_open_with_a_url_root_reads_the_bucket_and_makes_no_folder(
    shell, tmp_path: Path, monkeypatch, s3_root
):
    """A URL is object storage (issue 13; it was refused before the chain format was
    wired in): an empty bucket opens with no stores, and nothing is made locally."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    opened = shell.run_line_magic("iq", f"open {s3_root}")
    assert "0 store(s): none yet" in repr(opened)
    assert list(here.iterdir()) == []  # no folder "s3:" (what Path("s3://b") names)
