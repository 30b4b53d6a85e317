"""Versions as data through ``%iq``: ``history``, ``changes`` and ``get --as-of TIME`` in a
real IPython shell over real stores, their rows checked against what the commits imply
(``version_model.Commits`` keeps every version's state), their plots, the panel's forms
for them, and the parsing and refusals around them. ``%iq watch`` is in test_watch_magic.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from IPython.core.error import UsageError
from version_model import Commits

import iqkit
from iqkit.jupyter.command import IQCommand
from iqkit.jupyter.complete import candidates
from iqkit.jupyter.magic import live_session
from iqkit.jupyter.panel import IQPanel
from iqkit.jupyter.parse import parse_line
from iqkit.jupyter.testing import IQTestShell, new_shell

matplotlib.use("Agg")  # no display: plots are drawn into memory

#: Each commit of 'levels' (string → json, 3 partitions); None deletes the key.
LEVELS = [
    {
        "alice": {"level": 1, "score": 10.0},
        "bob": {"level": 5, "score": 1.5},
        "carol": {"level": 2, "score": 0.0},
    },
    {"alice": {"level": 2, "score": 12.5}, "carol": None},
    {
        "alice": {"level": 2, "score": 12.5},
        "bob": {"level": 6, "score": 2.0},
        "dave": {"level": 1, "score": 3.0},
    },
    {"alice": {"level": 3, "score": 20.0}, "carol": {"level": 9, "score": 9.5}},
]
#: Each commit of 'temps' (string → double, 2 partitions).
TEMPS = [{"fridge": 4.0, "oven": 180.0}, {"fridge": 5.5}, {"fridge": 3.0, "oven": None}]


def run(shell: IQTestShell, line: str):
    return shell.run_cell(line).result


def ms(millis: int) -> pd.Timestamp:
    return pd.Timestamp(millis, unit="ms", tz="UTC")


def iso(millis: int) -> str:
    """A commit time as ISO-8601 text (what a user copies from a result)."""
    return datetime.fromtimestamp(millis / 1000, tz=UTC).isoformat(timespec="milliseconds")


@pytest.fixture(scope="module")
def versioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Commits]]:
    root = tmp_path_factory.mktemp("versions") / "stores"
    iqkit.create_store(root, "levels", partitions=3, value_serde="json")
    iqkit.create_store(root, "temps", partitions=2, value_serde="double")
    iqkit.create_store(
        root, "clicks", partitions=1, kind="window", window_size_ms=60_000, value_serde="int64"
    )
    with iqkit.StoreWriter(root, "clicks") as w:
        w.put("alice", 1, window_start=0)
    iqkit.create_store(root, "names", partitions=1)
    with iqkit.StoreWriter(root, "names") as w:
        w.put("a", "first")
    commits = {"levels": Commits(root, "levels"), "temps": Commits(root, "temps")}
    for store, plan in (("levels", LEVELS), ("temps", TEMPS)):
        for writes in plan:
            commits[store].commit(writes)
    return root, commits


@pytest.fixture
def shell(versioned):
    root, _ = versioned
    sh = new_shell(root=str(root), progress=False)
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()


def owner(root: Path, store: str, key: str) -> int:
    with iqkit.open(root) as engine:
        partition = engine.partition_for_key(store, key)
    assert partition is not None
    return partition


def history_rows(commits: Commits, key: str, fields: list[str]) -> list[tuple]:
    """(fields..., timestamp, valid_to, version) of each record, newest first."""
    out = []
    for value, start, end, version in reversed(commits.history(key)):
        record = value if isinstance(value, dict) else {"value": value}
        out.append(
            (*[record[f] for f in fields], ms(start), None if end is None else ms(end), version)
        )
    return out


def frame_rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [
        tuple(None if pd.isna(v) else v for v in row)
        for row in frame[columns].itertuples(index=False)
    ]


# -- history ---------------------------------------------------------------------------------
def test_history_rows_are_the_values_the_commits_gave_the_key(shell, versioned):
    root, commits = versioned
    r = run(shell, "%iq history levels alice")
    columns = ["level", "score", "timestamp", "valid_to", "version"]
    assert frame_rows(r.df(), columns) == history_rows(
        commits["levels"], "alice", ["level", "score"]
    )
    # commit 3 wrote alice's value again: no record starts there
    assert 3 not in r.df()["version"].tolist()
    assert set(r.df()["key"]) == {"alice"}
    assert set(r.df()["partition"]) == {owner(root, "levels", "alice")}
    assert r.query_type == "MultiVersionedKeyQuery"
    assert r.ok_partitions == 1  # only the owner partition answers a murmur2 store


def test_history_asc_from_and_to_keep_the_records_of_those_times(shell, versioned):
    _, commits = versioned
    levels = commits["levels"]
    expected = history_rows(levels, "alice", ["level"])
    asc = run(shell, "%iq history levels alice --asc")
    assert frame_rows(asc.df(), ["level", "timestamp", "valid_to", "version"]) == expected[::-1]
    # --to: written at or before; the first commit's time keeps its record only
    early = run(shell, f"%iq history levels alice --to {levels.times[1]}")
    assert early.df()["version"].tolist() == [1]
    # --from: still valid then; from the last commit's time on only its record is
    late = run(shell, f"%iq history levels alice --from {iso(levels.times[4])}")
    assert late.df()["version"].tolist() == [4]
    # both: the records valid at some time between commits 2 and 3
    between = run(
        shell, f"%iq history levels alice --from {levels.times[2]} --to {levels.times[3]}"
    )
    assert between.df()["version"].tolist() == [2]


def test_history_of_a_deleted_and_rewritten_key_and_of_an_unknown_key(shell, versioned):
    _, commits = versioned
    r = run(shell, "%iq history levels carol --asc")
    expected = history_rows(commits["levels"], "carol", ["level"])[::-1]
    assert frame_rows(r.df(), ["level", "timestamp", "valid_to", "version"]) == expected
    assert r.df()["version"].tolist() == [1, 4]  # deleted by 2, written again by 4
    nobody = run(shell, "%iq history levels nobody")
    assert len(nobody) == 0 and "No rows." in nobody._repr_html_()


def test_history_renders_like_other_results_and_keeps_its_trace(shell):
    shell.run_cell("x = %iq history levels alice --trace")
    x = shell.user_ns["x"]
    html = x._repr_html_()
    assert "MultiVersionedKeyQuery" in html and "<details open>" in html
    assert "Equivalent: <code>%iq history levels alice --trace</code>" in html
    assert "version 4" in html  # the summary names the version served
    assert "StateEngine" in set(x.trace["layer"])
    assert run(shell, "%iq trace").equals(x.trace)
    text = str(x)
    assert "timestamp" in text and "valid_to" in text


# -- get --as-of -------------------------------------------------------------------------------
def test_get_as_of_a_time_reads_the_key_s_record_then(shell, versioned):
    _, commits = versioned
    levels = commits["levels"]
    for version in (1, 2, 3, 4):
        r = run(shell, f"%iq get levels alice --as-of {iso(levels.times[version])}")
        assert r.query_type == "VersionedKeyQuery"
        (record,) = [
            rec
            for rec in history_rows(levels, "alice", ["level"])
            if rec[1] <= ms(levels.times[version])
            and (rec[2] is None or ms(levels.times[version]) < rec[2])
        ]
        assert frame_rows(r.df(), ["level", "timestamp", "valid_to", "version"]) == [record]
    before = run(shell, f"%iq get levels alice --as-of {iso(levels.times[1] - 1)}")
    assert len(before) == 0  # a time before the first commit: no version yet
    now = run(shell, "%iq get levels alice --as-of now")
    assert now.df()["level"].tolist() == [LEVELS[-1]["alice"]["level"]]


def test_get_as_of_a_variable_holding_a_datetime(shell, versioned):
    _, commits = versioned
    when = datetime.fromtimestamp(commits["levels"].times[2] / 1000, tz=UTC)
    shell.user_ns["when"] = when
    r = run(shell, "%iq get levels carol --as-of :when")
    assert len(r) == 0  # carol was deleted by commit 2


def test_get_without_as_of_a_time_is_the_key_lookup_it_always_was(shell):
    r = run(shell, "%iq get levels alice")
    assert r.query_type == "KeyQuery"
    assert r.df()["level"].tolist() == [LEVELS[-1]["alice"]["level"]]
    assert "timestamp" not in r.df().columns
    pinned = run(shell, "%iq get levels alice --as-of 1")  # a version number: the engine pinned
    assert pinned.query_type == "KeyQuery"
    assert pinned.df()["level"].tolist() == [LEVELS[0]["alice"]["level"]]
    assert pinned.line == "%iq get levels alice --as-of 1"


# -- changes -------------------------------------------------------------------------------------
def expected_changes(
    root: Path, commits: Commits, after: int, upto: int | None = None, prefix: str = ""
):
    """(partition, version, kind, key, level, old_level) sorted as the result lists them."""
    rows = []
    for c in commits.changes(after, upto):
        if not c.key.startswith(prefix):
            continue
        level = None if c.value is None else c.value["level"]
        old = None if c.old is None else c.old["level"]
        rows.append((owner(root, "levels", c.key), c.version, c.kind, c.key, level, old))
    return sorted(rows, key=lambda r: (r[0], r[1], r[3]))


def test_changes_are_what_each_commit_changed(shell, versioned):
    root, commits = versioned
    columns = ["partition", "version", "kind", "key", "level", "old_level"]
    r = run(shell, "%iq changes levels --from 1")
    assert r.query_type == "ChangesQuery"
    assert frame_rows(r.df(), columns) == expected_changes(root, commits["levels"], 1)
    kinds = set(r.df()["kind"])
    assert kinds == {"insert", "update", "delete"}
    only_3 = run(shell, "%iq changes levels --from 2 --to 3")
    assert frame_rows(only_3.df(), columns) == expected_changes(root, commits["levels"], 2, 3)
    # commit 3 wrote alice's value again: not a change
    assert "alice" not in only_3.df()["key"].tolist()
    prefixed = run(shell, "%iq changes levels --from 1 --prefix ca")
    assert frame_rows(prefixed.df(), columns) == expected_changes(
        root, commits["levels"], 1, prefix="ca"
    )
    assert r.partitions["status"].tolist() == ["success"] * 3


def test_changes_from_a_version_never_published_fail_per_partition(shell):
    r = run(shell, "%iq changes levels --from 9")
    assert set(r.partitions["failure_reason"]) == {"DOES_NOT_EXIST"}
    assert "failed" in r._repr_html_()


def test_limit_cuts_a_version_result_and_says_so(shell):
    r = run(shell, "%iq changes levels --from 1 --limit 2")
    assert len(r) == 2 and r.truncated
    assert int(r.partitions["rows"].sum()) == 2


# -- plots -----------------------------------------------------------------------------------------
def test_history_plot_draws_each_numeric_column_as_steps_over_time(shell, versioned):
    _, commits = versioned
    r = run(shell, "%iq history levels alice")
    ax = r.plot()
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"level", "score"}
    oldest_first = [value for value, *_ in commits["levels"].history("alice")]
    assert list(lines["level"].get_ydata()) == [v["level"] for v in oldest_first]
    one = r.plot(column="score")
    assert [line.get_label() for line in one.get_lines()] == ["score"]
    assert list(one.get_lines()[0].get_ydata()) == [v["score"] for v in oldest_first]
    with pytest.raises(ValueError, match="not a numeric column"):
        r.plot(column="nope")
    assert r.plot("rows").get_title() == "levels: rows per partition"


def test_history_plot_breaks_where_the_key_was_deleted(shell):
    ax = run(shell, "%iq history temps oven").plot()
    (line,) = ax.get_lines()
    ys = list(line.get_ydata())
    assert ys[0] == TEMPS[0]["oven"] and ys[-1] != ys[-1]  # NaN: the delete ends the line
    fridge = run(shell, "%iq history temps fridge").plot()
    assert list(fridge.get_lines()[0].get_ydata()) == [w["fridge"] for w in TEMPS]


def test_history_plot_of_nothing_numeric_is_one_line(shell):
    with pytest.raises(ValueError, match="nothing numeric to plot") as info:
        run(shell, "%iq history names a").plot()
    assert "\n" not in str(info.value)


# -- refusals and parsing ----------------------------------------------------------------------
@pytest.mark.parametrize("line", ["history clicks alice", "changes clicks --from 1"])
def test_window_stores_refuse_version_commands_in_one_line(shell, line):
    with pytest.raises(UsageError) as info:
        run(shell, f"%iq {line}")
    message = str(info.value)
    assert "'clicks' is a window store" in message and "\n" not in message
    assert "history and changes read key-value stores" in message


def _get(**fields) -> IQCommand:
    return IQCommand("get", store="s", keys=("k",), **fields)


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("history s k", IQCommand("history", store="s", keys=("k",))),
        (
            "history s k --from now-1h --to 2024-05-01T12:00 --asc --limit 3",
            IQCommand(
                "history",
                store="s",
                keys=("k",),
                lower="now-1h",
                upper="2024-05-01T12:00",
                asc=True,
                limit=3,
            ),
        ),
        ("changes s --from 3", IQCommand("changes", store="s", from_version=3)),
        (
            "changes s --from 3 --to 5 --prefix eu- --partitions 0",
            IQCommand(
                "changes", store="s", from_version=3, to_version=5, prefix="eu-", partitions=(0,)
            ),
        ),
        ("get s k --as-of now-15m", _get(as_of_time="now-15m")),
        ("get s k --as-of '2024-05-01 12:00'", _get(as_of_time="2024-05-01 12:00")),
        ("get s k --as-of 7", _get(as_of=7)),
        (
            "watch get s k --for 30 --every 0.5",
            IQCommand("watch", watched=_get(), duration=30.0, every=0.5),
        ),
        (
            "watch --every=2s changes s --from 1 --for 1m",
            IQCommand(
                "watch",
                watched=IQCommand("changes", store="s", from_version=1),
                duration=60.0,
                every=2.0,
            ),
        ),
    ],
)
def test_new_commands_parse_and_their_lines_parse_back(line, command):
    assert parse_line(line) == command
    assert parse_line(command.to_line().removeprefix("%iq ")) == command


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("changes s", "the following arguments are required: --from"),
        ("changes s --from 0", "invalid version value: '0'"),
        ("changes s --from 3 --to x", "invalid version value: 'x'"),
        ("history s", "the following arguments are required: KEY"),
        ("history s a b", "unexpected argument 'b'"),
        ("history s a --desc", "unknown option '--desc'"),
        ("get s a b --as-of now", "--as-of TIME reads one key's record; give one key (got 2)"),
        ("range s --as-of now", "invalid number value: 'now'"),
        ("watch lag s", "watches a query"),
        ("watch gett s a", "did you mean 'get'?"),
        ("watch", "which query?"),
        ("watch get s a --for 0", "--for expects seconds"),
        ("watch get s a --every soon", "--every expects seconds"),
        ("watch get s a --for", "--for needs a number of seconds"),
        ("watch get s a --evry 1", "did you mean '--every'?"),
        ("histroy s a", "did you mean 'history'?"),
    ],
)
def test_mistakes_are_one_usage_line(line, message):
    with pytest.raises(UsageError) as info:
        parse_line(line)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_times_the_session_cannot_read_are_one_usage_line(shell):
    with pytest.raises(UsageError, match="is not epoch milliseconds, ISO-8601"):
        run(shell, "%iq history levels alice --from yesterday")
    with pytest.raises(UsageError, match="is not epoch milliseconds, ISO-8601"):
        run(shell, "%iq get levels alice --as-of soon")
    with pytest.raises(UsageError, match="no variable 'nope'"):
        run(shell, "%iq get levels alice --as-of :nope")


def test_help_names_the_new_commands(shell):
    text = repr(run(shell, "%iq help"))
    for words in ("history STORE KEY", "changes STORE --from V", "watch QUERY", "--as-of TIME"):
        assert words in text
    assert "--asc" in repr(run(shell, "%iq help history"))
    assert "--every" in repr(run(shell, "%iq help watch"))


def test_completion_offers_the_new_commands_and_watch_s_query(shell, versioned):
    session = live_session(shell)
    assert {"history", "changes", "watch"} <= set(candidates(session, "%iq "))
    assert "get" in candidates(session, "%iq watch ")
    assert "levels" in candidates(session, "%iq watch history ")
    flags = candidates(session, "%iq watch history levels alice --")
    assert {"--asc", "--for", "--every"} <= set(flags)
    assert "--prefix" in candidates(session, "%iq changes levels --")


# -- the panel --------------------------------------------------------------------------------
@pytest.fixture
def panel(shell) -> IQPanel:
    p = run(shell, "%iq panel")
    p.store.value = "levels"
    return p


def test_the_panel_offers_history_and_changes_for_key_value_stores(panel):
    assert tuple(panel.query.options) == ("get", "range", "prefix", "history", "changes", "scan")
    panel.store.value = "clicks"
    assert "history" not in panel.query.options and "changes" not in panel.query.options


def test_the_panel_builds_history_and_runs_it_like_the_magic(panel, shell):
    panel.query.value = "history"
    panel.key.value = "alice"
    panel.asc.value = True
    assert panel.line == "%iq history levels alice --asc"
    assert panel.line in panel.line_out.value
    result = panel.run()
    assert panel.error is None
    magic = run(shell, "%iq history levels alice --asc")
    assert result.df().equals(magic.df())
    assert "MultiVersionedKeyQuery" in panel.rows_out.value
    panel.key.value = "alice, bob"
    assert panel.run() is None and "takes one key" in panel.error


def test_the_panel_builds_changes_and_get_as_of(panel, shell, versioned):
    _, commits = versioned
    panel.query.value = "changes"
    assert panel.line is None  # no from version yet
    panel.from_version.value = "2"
    panel.to_version.value = "3"
    panel.prefix.value = "d"
    assert panel.line == "%iq changes levels --from 2 --to 3 --prefix d"
    assert panel.run().df()["key"].tolist() == ["dave"]
    panel.from_version.value = "x"
    assert panel.run() is None and "from version" in panel.error
    panel.query.value = "get"
    panel.key.value = "alice"
    when = iso(commits["levels"].times[1])
    panel.as_of.value = when
    assert panel.line == f"%iq get levels alice --as-of {when}"
    assert panel.run().df()["version"].tolist() == [1]
    panel.as_of.value = "2"  # a number: the version, as on the line
    assert panel.build_command() == IQCommand("get", store="levels", keys=("alice",), as_of=2)
    assert parse_line(panel.line.removeprefix("%iq ")) == panel.build_command()


# -- stable outputs ----------------------------------------------------------------------------
def test_commit_times_show_as_a_placeholder_under_stable_timings(shell, versioned, monkeypatch):
    """IQKIT_STABLE_TIMINGS=1 (how the notebooks' outputs stay comparable) shows a version
    result's commit times as ‹time› in its HTML and text, as it does every wall-clock
    figure; the data keeps the times, and without it they show."""
    _, commits = versioned
    levels = commits["levels"]
    # alice's record as of version 3 was written by version 2 and replaced by version 4
    as_of_3 = f"%iq get levels alice --as-of {iso(levels.times[3])}"
    shown = [
        datetime.fromtimestamp(levels.times[v] / 1000, tz=UTC)
        .isoformat(sep=" ", timespec="milliseconds")
        .replace("+00:00", "Z")
        for v in (2, 4)
    ]
    monkeypatch.setenv("IQKIT_STABLE_TIMINGS", "1")
    for line in ("%iq history levels alice", as_of_3):
        r = run(shell, line)
        html, text = r._repr_html_(), str(r)
        assert "<td>‹time›</td>" in html and "‹time›" in text
        assert not any(t in html or t in text for t in shown)
        # the data keeps the commit times
        assert ms(levels.times[2]) in r.df()["timestamp"].tolist()
        assert ms(levels.times[4]) in r.df()["valid_to"].tolist()
    history = run(shell, "%iq history levels alice")
    assert '<td class="null">null</td>' in history._repr_html_()  # still valid: no valid_to
    assert "‹time›" not in str(run(shell, "%iq scan levels"))  # no commit times there
    monkeypatch.delenv("IQKIT_STABLE_TIMINGS")
    r = run(shell, as_of_3)
    html, text = r._repr_html_(), str(r)
    assert all(t in html and t in text for t in shown)
    assert "‹time›" not in html and "‹time›" not in text
