"""The widget panel (``iqkit/jupyter/panel.py``), driven the way a notebook or a test
drives it: set widget values, click Run, read ``.command`` / ``.result`` / ``.error``.

Real stores on disk (RocksDB through iqkit's writer), real widgets (ipywidgets'
``DummyComm`` outside a kernel: observers run synchronously), a real shell for
``%iq panel``. Expected rows are computed from the data written, not copied from output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import iqkit
from iqkit.jupyter.command import IQCommand
from iqkit.jupyter.panel import MISSING_IPYWIDGETS, IQPanel, panel, split_keys
from iqkit.jupyter.parse import parse_line
from iqkit.jupyter.session import IQSession
from iqkit.jupyter.testing import IQTestShell, new_shell

TOTALS = {
    "alice": {"total": 10},
    "bob": {"total": 20},
    "bobby": {"total": 25},
    "carol": {"total": 30},
    "dave": {"total": 40},
    "erin": {"total": 50},
}
COUNTS = {7: 70, 42: 420, 100: 1000, -3: 9}
MINUTE = 60_000
#: (key, window start) -> value
CLICKS = {
    ("alice", 0): 1,
    ("alice", MINUTE): 2,
    ("alice", 2 * MINUTE): 3,
    ("bob", MINUTE): 5,
}
OPTIONAL_FIELDS = (
    "key",
    "lower",
    "upper",
    "prefix",
    "desc",
    "skip_cache",
    "limit",
    "asc",
    "from_version",
    "to_version",
    "as_of",
)


def _build_stores(root: Path) -> None:
    iqkit.create_store(root, "totals", partitions=4)
    with iqkit.StoreWriter(root, "totals") as w:
        for offset, (key, value) in enumerate(TOTALS.items()):
            w.put(key, value, source=("orders", 0, offset))
    iqkit.create_store(root, "counts", partitions=2, key_serde="int32")
    with iqkit.StoreWriter(root, "counts") as w:
        for key, value in COUNTS.items():
            w.put(key, value)
    iqkit.create_store(root, "clicks", partitions=2, kind="window", window_size_ms=MINUTE)
    with iqkit.StoreWriter(root, "clicks") as w:
        for (key, start), value in CLICKS.items():
            w.put(key, value, window_start=start)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only stores shared by this module's tests (tests that write make their own)."""
    root = tmp_path_factory.mktemp("panel") / "stores"
    _build_stores(root)
    return root


@pytest.fixture
def session(stores: Path):
    s = IQSession(stores)
    yield s
    s.close()


@pytest.fixture
def p(session: IQSession) -> IQPanel:
    p = IQPanel(session)
    p.store.value = "totals"
    return p


def visible(p: IQPanel) -> set[str]:
    return {name for name in OPTIONAL_FIELDS if getattr(p, name).layout.display != "none"}


def keys_of(p: IQPanel) -> list:
    return sorted(p.result.rows["key"].tolist())


# -- the form ------------------------------------------------------------------------------
def test_stores_are_listed_and_the_first_is_chosen(session: IQSession) -> None:
    p = IQPanel(session)
    assert list(p.store.options) == sorted(session.engine.store_names())
    assert p.store.value == p.store.options[0]
    assert p.error is None and p.result is None and p.command is None


def test_query_types_follow_the_store_kind(p: IQPanel) -> None:
    assert tuple(p.query.options) == ("get", "range", "prefix", "history", "changes", "scan")
    p.query.value = "scan"
    p.store.value = "clicks"
    assert tuple(p.query.options) == ("window", "windows", "scan")
    assert p.query.value == "scan"  # kept: both kinds offer it
    p.query.value = "windows"
    p.store.value = "counts"
    assert tuple(p.query.options) == ("get", "range", "prefix", "history", "changes", "scan")
    assert p.query.value == "get"  # 'windows' means nothing for a key-value store


def test_fields_irrelevant_to_the_query_are_hidden(p: IQPanel) -> None:
    expected = {
        "get": {"key", "skip_cache", "as_of"},
        "range": {"lower", "upper", "desc", "limit"},
        "prefix": {"prefix", "desc", "limit"},
        "history": {"key", "lower", "upper", "asc", "limit"},
        "changes": {"from_version", "to_version", "prefix", "limit"},
        "scan": {"desc", "limit"},
    }
    for query, fields in expected.items():
        p.query.value = query
        assert visible(p) == fields, query
    p.store.value = "clicks"
    for query, fields in {
        "window": {"key", "lower", "upper", "desc", "limit"},
        "windows": {"lower", "upper", "desc", "limit"},
    }.items():
        p.query.value = query
        assert visible(p) == fields, query


def test_placeholders_name_the_key_type_and_what_to_type(p: IQPanel) -> None:
    p.store.value = "counts"
    assert "int32 key, e.g. 42" in p.key.placeholder
    assert "one per line" in p.key.placeholder  # get takes several keys
    assert p.partitions.placeholder.startswith("all 2")
    p.query.value = "range"
    assert "lowest int32 key" in p.lower.placeholder
    assert "highest int32 key" in p.upper.placeholder
    p.store.value = "clicks"
    assert "string key" in p.key.placeholder
    assert "window start" in p.lower.placeholder and "epoch ms" in p.lower.placeholder


def test_hidden_fields_stay_out_of_the_command(p: IQPanel) -> None:
    p.query.value = "range"
    p.lower.value, p.upper.value = "b", "d"
    p.desc.value = True
    p.limit.value = 3
    p.key.value = "alice"
    p.prefix.value = "zz"
    assert p.build_command() == IQCommand(
        "range", store="totals", lower="b", upper="d", desc=True, limit=3
    )
    p.query.value = "get"  # desc and limit are not get options: the line must parse
    command = p.build_command()
    assert command == IQCommand("get", store="totals", keys=("alice",))
    assert parse_line(command.to_line()[len("%iq ") :]) == command


def test_every_option_reaches_the_command_and_its_line_parses_back(p: IQPanel) -> None:
    p.query.value = "prefix"
    p.prefix.value = "bo"
    p.partitions.value = "0, 2-3"
    p.bound.value = "orders:0=3"
    p.active.value = True
    p.trace.value = True
    p.desc.value = True
    p.limit.value = 5
    command = p.build_command()
    assert command.partitions == (0, 2, 3)
    assert command.bounds == ("orders:0=3",)
    assert (command.active, command.trace, command.desc, command.limit) == (True, True, True, 5)
    line = command.to_line()
    assert line.startswith("%iq prefix totals bo --partitions 0,2,3 --bound orders:0=3")
    assert parse_line(line[len("%iq ") :]) == command
    # the "%iq line" tab shows it while the user types
    assert line in p.line_out.value
    assert p.line == line


def test_build_command_is_pure(p: IQPanel) -> None:
    p.key.value = "alice"
    before = p.session.last
    assert p.build_command() == p.build_command()
    assert p.command is None and p.result is None and p.session.last is before


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("alice", ("alice",)),
        ("alice, bob", ("alice", "bob")),
        ("alice\nbob\n\n carol ", ("alice", "bob", "carol")),
        ("a, b\nc", ("a", "b", "c")),
        ('[1, "a"], [2, "b"]', ('[1, "a"]', '[2, "b"]')),
        ('{"a": 1, "b": 2}', ('{"a": 1, "b": 2}',)),
        ('["x]y", 1], z', ('["x]y", 1]', "z")),
        ('"smith, j", jones', ("smith, j", "jones")),
        ("o'brien, x", ("o'brien", "x")),
        (":k, 'quoted'", (":k", "quoted")),
        (" , ,", ()),
    ],
)
def test_split_keys(text: str, keys: tuple[str, ...]) -> None:
    assert split_keys(text) == keys


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({"query": "get"}, "%iq get: enter a key"),
        ({"query": "prefix"}, "%iq prefix: enter a prefix"),
        ({"query": "scan", "partitions": "0,x"}, "--partitions expects partition numbers"),
        ({"query": "scan", "bound": "orders=3"}, "--bound expects topic:partition=offset"),
        ({"query": "scan", "bound": ":not a name"}, "--bound :NAME needs a variable name"),
        ({"query": "scan", "limit": -1}, "limit must be >= 0"),
    ],
)
def test_bad_input_raises_usage_error_from_build_command(
    p: IQPanel, setup: dict, message: str
) -> None:
    for name, value in setup.items():
        getattr(p, name).value = value
    with pytest.raises(UsageError, match=message):
        p.build_command()
    assert p.line is None
    assert message.split(":")[-1].strip()[:10] in p.line_out.value


def test_window_queries_need_times_and_one_key(p: IQPanel) -> None:
    p.store.value = "clicks"
    p.query.value = "window"
    p.key.value = "alice, bob"
    p.lower.value, p.upper.value = "0", "now"
    with pytest.raises(UsageError, match="takes one key"):
        p.build_command()
    p.key.value = "alice"
    p.upper.value = ""
    with pytest.raises(UsageError, match="enter the to time"):
        p.build_command()
    p.query.value = "windows"
    p.upper.value = "2024-05-01T12:00"
    assert p.build_command().to_line() == "%iq windows clicks --from 0 --to 2024-05-01T12:00"


def test_limit_zero_leaves_the_session_default(p: IQPanel) -> None:
    p.query.value = "scan"
    assert p.limit.value == 0
    assert p.build_command().limit is None
    assert "--limit" not in p.line


# -- running -------------------------------------------------------------------------------
def test_repr_is_fixed(p: IQPanel, stores: Path) -> None:
    p.query.value = "range"
    assert repr(p) == f"IQPanel(store='totals', query='range', root={str(stores)!r})"
    bundle = p._repr_mimebundle_()
    assert bundle["text/plain"] == repr(p)
    assert "application/vnd.jupyter.widget-view+json" in bundle  # shows as the widget


def test_missing_ipywidgets_is_one_usage_error(
    session: IQSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    with pytest.raises(UsageError) as err:
        IQPanel(session)
    assert str(err.value) == MISSING_IPYWIDGETS
    # The magic builds panels (through a shell: test_iq_panel_without_ipywidgets); a
    # session asked for one names where it comes from.
    with pytest.raises(UsageError, match=r"shown by the %iq magic.*iqkit\.panel\(\)"):
        session.execute(IQCommand("panel"))


def test_no_stores_folder_is_shown_not_raised(root: Path) -> None:
    session = IQSession(root)  # the folder does not exist yet
    p = IQPanel(session)
    assert p.store.value is None
    assert "no stores folder" in p.error
    assert p.error_box.layout.display != "none" and "no stores folder" in p.error_box.value
    assert p.run() is None
    assert "choose a store" in p.error
    _build_stores(root)
    p.refresh.click()
    assert p.error is None and p.error_box.layout.display == "none"
    assert p.store.value in {"clicks", "counts", "totals"}
    session.close()


# -- running queries -----------------------------------------------------------------------
def test_get_runs_through_the_session(p: IQPanel) -> None:
    p.key.value = "alice"
    p.run.click()
    assert p.error is None
    assert p.command.to_line() == "%iq get totals alice"
    rows = p.result.rows
    assert rows["key"].tolist() == ["alice"]
    assert rows["total"].tolist() == [TOTALS["alice"]["total"]]
    assert p.session.last is p.result  # %iq trace shows the panel's last query
    assert "alice" in p.rows_out.value
    assert p.partitions_out.value and p.trace_out.value
    assert p.error_box.layout.display == "none"


def test_panel_tables_are_styled_like_result_tables(p: IQPanel) -> None:
    """One table stylesheet for results and the panel (only the scope class differs)."""
    p.key.value = "alice"
    p.run.click()
    result_html = p.result._repr_html_()
    style = result_html[result_html.index("<style>") : result_html.index("</style>") + 8]
    assert style.count(".iqkit-result ") >= 8
    assert style.replace(".iqkit-result ", ".iqkit-panel ") in p.rows_out.value


def test_lag_tab_says_no_source_recorded_in_words(p: IQPanel) -> None:
    p.store.value = "counts"  # written without a source: its lag is unknown
    p.key.value = "7"
    p.run.click()
    assert p.error is None and p.result.rows["value"].tolist() == [70]
    assert "No source recorded for counts" in p.lag_out.value
    assert "<table>" not in p.lag_out.value  # no table of nulls (issue 10)


def test_several_keys_make_a_multi_key_get(p: IQPanel) -> None:
    p.key.value = "alice, dave\nnobody"
    result = p.run()  # calling the button runs the query and returns the result
    assert result is p.result and p.error is None
    assert p.command.keys == ("alice", "dave", "nobody")
    assert keys_of(p) == ["alice", "dave"]  # nobody is not there


def test_range_prefix_and_scan(p: IQPanel) -> None:
    p.query.value = "range"
    p.lower.value, p.upper.value = "b", "d"
    p.run.click()
    assert p.error is None
    assert keys_of(p) == sorted(k for k in TOTALS if "b" <= k <= "d")
    p.upper.value = ""  # open upper end
    p.run.click()
    assert p.command.upper is None and "--to" not in p.command.to_line()
    assert keys_of(p) == sorted(k for k in TOTALS if k >= "b")

    p.query.value = "prefix"
    p.prefix.value = "bo"
    p.run.click()
    assert keys_of(p) == sorted(k for k in TOTALS if k.startswith("bo"))

    p.query.value = "scan"
    p.run.click()
    assert keys_of(p) == sorted(TOTALS)
    p.limit.value = 2
    p.desc.value = True
    p.run.click()
    assert p.command.to_line() == "%iq scan totals --desc --limit 2"
    assert len(p.result.rows) == 2


def test_partitions_limit_the_query(p: IQPanel) -> None:
    p.query.value = "scan"
    p.partitions.value = "0,2"
    p.run.click()
    assert p.error is None
    engine = p.session.engine
    expected = sorted(k for k in TOTALS if engine.partition_for_key("totals", k) in (0, 2))
    assert keys_of(p) == expected
    assert set(p.result.rows["partition"]) <= {0, 2}


def test_int_keys_are_typed_by_the_key_serde(p: IQPanel) -> None:
    p.store.value = "counts"
    p.key.value = "42, -3"
    p.run.click()
    assert p.error is None
    assert keys_of(p) == [-3, 42]
    assert sorted(p.result.rows["value"]) == sorted([COUNTS[42], COUNTS[-3]])
    p.query.value = "range"
    p.lower.value, p.upper.value = "0", "50"
    p.run.click()
    assert keys_of(p) == sorted(k for k in COUNTS if 0 <= k <= 50)


def test_a_mistake_is_shown_not_raised(p: IQPanel) -> None:
    p.store.value = "counts"
    p.key.value = "alice"
    p.run.click()  # must not raise
    assert p.result is None
    assert "does not fit store 'counts'" in p.error
    assert p.error_box.layout.display != "none"
    assert "does not fit store" in p.error_box.value
    assert p.rows_out.value == ""
    p.key.value = "7"
    p.run.click()
    assert p.error is None and p.error_box.layout.display == "none"
    assert keys_of(p) == [7]


def test_bad_partitions_text_is_caught_by_run(p: IQPanel) -> None:
    p.query.value = "scan"
    p.partitions.value = "one"
    assert p.run() is None
    assert p.command is None
    assert "--partitions expects partition numbers" in p.error


def test_window_and_windows(p: IQPanel) -> None:
    p.store.value = "clicks"
    p.query.value = "window"
    p.key.value = "alice"
    p.lower.value, p.upper.value = "0", str(MINUTE)
    p.run.click()
    assert p.error is None
    expected = [v for (k, s), v in CLICKS.items() if k == "alice" and 0 <= s <= MINUTE]
    assert sorted(p.result.rows["value"]) == sorted(expected)
    assert set(p.result.rows["key"]) == {"alice"}

    p.query.value = "windows"
    p.lower.value = p.upper.value = str(MINUTE)
    p.run.click()
    assert p.error is None
    expected_keys = sorted(k for (k, s) in CLICKS if s == MINUTE)
    assert keys_of(p) == expected_keys


def test_skip_cache_reaches_the_cache_layer(p: IQPanel) -> None:
    p.key.value = "carol"
    p.skip_cache.value = True
    p.run.click()
    assert p.error is None
    assert p.command.to_line() == "%iq get totals carol --skip-cache"
    cache = p.result.trace[p.result.trace["layer"] == "CachingLayer"]
    assert cache["detail"].str.contains("skip").all() and len(cache) > 0
    assert keys_of(p) == ["carol"]


def test_execution_info_opens_the_trace_tab(p: IQPanel) -> None:
    p.key.value = "bob"
    p.trace.value = True
    p.run.click()
    assert p.error is None
    assert p.command.trace and "--trace" in p.command.to_line()
    assert p.tabs.titles[p.tabs.selected_index] == "Trace"
    assert len(p.result.trace) > 0


def test_bound_variable_and_unmet_bound(session: IQSession) -> None:
    far = iqkit.Position.empty().with_component("orders", 0, 10**9)
    p = IQPanel(session, namespace={"far_ahead": far})
    p.store.value = "totals"
    p.query.value = "scan"
    p.bound.value = ":far_ahead"
    p.run.click()
    assert p.error is None  # partitions fail one by one (KIP-796); the query does not
    assert p.result.rows.empty
    assert "NOT_UP_TO_BOUND" in p.result.partitions.to_string()


# -- through a real shell ------------------------------------------------------------------
@pytest.fixture
def shell(stores: Path):
    sh = new_shell(root=str(stores))
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()  # later tests must not see a notebook namespace


def test_iq_panel_in_a_shell_shares_the_session_and_namespace(shell: IQTestShell) -> None:
    p = shell.run_cell("%iq panel").result
    assert isinstance(p, IQPanel)
    data, _ = shell.display_formatter.format(p)  # what Jupyter shows: the widget
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == repr(p)
    magics = shell.find_magic("iq").__self__
    assert p.session is magics.session
    # defined after the panel was made: variables are looked up when Run is clicked
    shell.run_cell("who = 'carol'")
    p.store.value = "totals"
    p.key.value = ":who"
    p.run.click()
    assert p.error is None
    assert keys_of(p) == ["carol"]
    assert p.command.to_line() == "%iq get totals :who"
    # %iq trace reads the session's last result: the panel's
    trace = shell.run_cell("%iq trace").result
    assert trace.equals(p.result.trace)


def test_panel_function_reuses_the_magic_session(shell: IQTestShell, stores: Path) -> None:
    magics = shell.find_magic("iq").__self__
    shared = panel()
    assert shared.session is magics.session
    own = panel(stores, display_limit=3)
    assert own.session is not magics.session
    assert own.session.root == str(stores) and own.session.display_limit == 3
    own.session.close()


def test_iq_panel_without_ipywidgets(shell: IQTestShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    with pytest.raises(UsageError) as err:
        shell.run_cell("%iq panel")
    assert str(err.value) == MISSING_IPYWIDGETS
    # the rest of %iq still works
    assert shell.run_cell("%iq get totals alice").result.rows["key"].tolist() == ["alice"]


def test_panel_function_outside_a_notebook(stores: Path) -> None:
    p = panel(stores)
    assert p.session.root == str(stores)
    assert p.store.value in p.session.engine.store_names()
    p.session.close()


def test_refresh_lists_new_stores_and_keeps_the_choice(root: Path) -> None:
    _build_stores(root)
    session = IQSession(root)
    p = IQPanel(session)
    p.store.value = "counts"
    p.query.value = "range"
    iqkit.create_store(root, "zeta", partitions=1, key_serde="int64")
    assert "zeta" not in p.store.options
    p.refresh.click()
    assert "zeta" in p.store.options
    assert (p.store.value, p.query.value) == ("counts", "range")
    p.store.value = "zeta"
    assert "int64 key" in p.lower.placeholder
    session.close()
