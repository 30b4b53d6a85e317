"""``%iq`` line parsing and value typing: pure functions, no shell, no store."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError

from iqkit import Position, PositionBound, StoreManifest
from iqkit.jupyter.command import ACTIONS, IQCommand
from iqkit.jupyter.parse import parse_bound, parse_line, parse_partitions, split_words
from iqkit.jupyter.values import bound_value, key_value, time_value


def manifest(key_serde: str) -> StoreManifest:
    return StoreManifest(
        name="s",
        kind="kv",
        partitions=2,
        key_serde=key_serde,
        value_serde="json",
        partitioner="murmur2",
    )


def test_get_with_every_query_option():
    cmd = parse_line(
        "get totals alice bob --partitions 0,2-3 --bound orders:0=5,1=3 --bound :b "
        "--active --trace --limit 5 --as x --as-of 2 --skip-cache"
    )
    assert cmd == IQCommand(
        "get",
        store="totals",
        keys=("alice", "bob"),
        partitions=(0, 2, 3),
        bounds=("orders:0=5,1=3", ":b"),
        active=True,
        trace=True,
        limit=5,
        as_name="x",
        as_of=2,
        skip_cache=True,
    )


def test_range_prefix_window_windows_scan():
    assert parse_line("range t --from a --to c --desc") == IQCommand(
        "range", store="t", lower="a", upper="c", desc=True
    )
    assert parse_line("range t") == IQCommand("range", store="t")
    assert parse_line("prefix t al") == IQCommand("prefix", store="t", prefix="al")
    assert parse_line("window c alice --from 0 --to now") == IQCommand(
        "window", store="c", keys=("alice",), lower="0", upper="now"
    )
    assert parse_line("windows c --from 0 --to 10") == IQCommand(
        "windows", store="c", lower="0", upper="10"
    )
    assert parse_line("scan t --limit 0") == IQCommand("scan", store="t", limit=0)


def test_quotes_keep_json_and_spaces_together():
    assert split_words('a "b c" [1,"x"] \'[2, "y"]\'') == ["a", "b c", '[1,"x"]', '[2, "y"]']
    assert parse_line('get t "alice smith" -5').keys == ("alice smith", "-5")


def test_sql_is_taken_verbatim_with_cell_body():
    cmd = parse_line("sql --as j SELECT 'a -- b' AS x, $k -- note")
    assert cmd == IQCommand("sql", as_name="j", sql="SELECT 'a -- b' AS x, $k -- note")
    cell = parse_line("sql", "SELECT *\nFROM t")
    assert cell.sql == "SELECT *\nFROM t"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gte t a", "unknown command 'gte'; did you mean 'get'?"),
        ("get t a --lmit 3", "unknown option '--lmit'; did you mean '--limit'?"),
        ("get", "the following arguments are required: STORE, KEY"),
        ("get t a --partitions x", "--partitions expects partition numbers"),
        ("get t a --partitions 3-1", "--partitions expects partition numbers"),
        ("get t a --bound orders", "--bound expects topic:partition=offset"),
        ("get t a --bound orders:0=x", "--bound expects topic:partition=offset"),
        ("get t a --bound :1x", "--bound :NAME needs a variable name"),
        ("scan t --limit -1", "invalid number value: '-1'"),
        ("window c alice --from 0", "the following arguments are required: --to"),
        ("scan t extra", "unexpected argument 'extra'"),
        ("sql", "no query given"),
        ("sql --as 1x SELECT 1", "--as needs a Python identifier"),
        ("help gett", "unknown command 'gett'; did you mean 'get'?"),
        ('get t "open', "No closing quotation"),
    ],
)
def test_mistakes_are_one_line_usage_errors(line, message):
    with pytest.raises(UsageError) as err:
        parse_line(line)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_only_sql_takes_a_cell_body():
    with pytest.raises(UsageError, match="takes no cell body"):
        parse_line("get t a", "more")


@pytest.mark.parametrize(
    "cmd",
    [
        IQCommand("get", store="totals", keys=("alice", "bob smith", '[1, "a"]')),
        IQCommand("range", store="t", lower="a", upper="c", desc=True, limit=3),
        IQCommand("prefix", store="t", prefix="al", partitions=(0, 2), active=True),
        IQCommand("window", store="c", keys=("alice",), lower="0", upper="now-5m"),
        IQCommand("scan", store="t-1", bounds=("o:0=1,1=2", ":b"), trace=True, as_name="x"),
        IQCommand("windows", store="c", lower="0", upper="9", as_of=3, skip_cache=True),
        IQCommand("lag", store="totals"),
        IQCommand("open", path="/tmp/some dir"),
        IQCommand("stores"),
    ],
)
def test_to_line_parses_back_to_the_same_command(cmd):
    assert parse_line(cmd.to_line().removeprefix("%iq ")) == cmd


@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1).filter(
            lambda s: s.strip() == s and not s.startswith("-") and "'" not in s and '"' not in s
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_plain_keys_survive_to_line_and_back(keys):
    cmd = IQCommand("get", store="s", keys=tuple(keys))
    assert parse_line(cmd.to_line().removeprefix("%iq ")) == cmd


def test_partitions_and_bounds():
    assert parse_partitions("3, 0,1-2") == (0, 1, 2, 3)
    assert parse_bound("orders:0=5,1=3;pay:2=-1") == Position.from_map(
        {"orders": {0: 5, 1: 3}, "pay": {2: -1}}
    )
    p = Position.from_map({"o": {0: 9}})
    ns = {"p": p, "b": PositionBound.at(Position.from_map({"o": {1: 4}})), "m": {"x": {0: 1}}}
    merged = bound_value(("o:0=3,2=2", ":p", ":b", ":m"), ns)
    assert merged == PositionBound.at(Position.from_map({"o": {0: 9, 1: 4, 2: 2}, "x": {0: 1}}))
    with pytest.raises(UsageError, match="no variable 'nope'"):
        bound_value((":nope",), ns)
    with pytest.raises(UsageError, match="expected a Position"):
        bound_value((":x",), {"x": 3})


def test_keys_are_typed_by_the_key_serde():
    assert key_value("42", manifest("int32"), {}) == 42
    assert key_value("42", manifest("string"), {}) == "42"
    assert key_value("2.5", manifest("double"), {}) == 2.5
    assert key_value("0x0aff", manifest("bytes"), {}) == b"\x0a\xff"
    assert key_value('[1, "a"]', manifest("ordered"), {}) == (1, "a")
    assert key_value("abc", manifest("ordered"), {}) == "abc"
    assert key_value('{"a": 1}', manifest("json"), {}) == {"a": 1}
    assert key_value("alice", manifest("json"), {}) == "alice"
    assert key_value(":k", manifest("int32"), {"k": 7}) == 7
    with pytest.raises(UsageError, match=r"key 'x' does not fit store 's' \(key serde int32\)"):
        key_value("x", manifest("int32"), {})


def test_times():
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert time_value("1714564800000", {}) == 1714564800000
    assert time_value("2024-05-01T12:00", {}) == now
    assert time_value("2024-05-01T12:00:00Z", {}) == now
    assert time_value("now", {}, now=now) == now
    assert time_value("now-15m", {}, now=now) == datetime(2024, 5, 1, 11, 45, tzinfo=UTC)
    assert time_value("now+1d", {}, now=now) == datetime(2024, 5, 2, 12, 0, tzinfo=UTC)
    assert time_value(":t", {"t": 5}) == 5
    with pytest.raises(UsageError, match="is not epoch milliseconds, ISO-8601"):
        time_value("yesterday", {})


def test_every_action_has_help():
    for action in ACTIONS:
        if action != "help":
            assert parse_line(f"help {action}") == IQCommand("help", path=action)


# -- input that must not exhaust the kernel (issue 14) ----------------------------------------
def _shlex_words(line: str) -> list[str]:
    """What split_words did before: shlex with posix=False (quadratic in a word's size)."""
    lexer = shlex.shlex(line, posix=False)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return [w[1:-1] if len(w) >= 2 and w[0] == w[-1] and w[0] in "'\"" else w for w in lexer]


@given(st.text(alphabet=st.sampled_from(list("ab '\"],\t\n-")), max_size=30))
def test_split_words_splits_exactly_as_shlex_did(line):
    # Without an opening bracket: a bracket group is the one rule shlex does not have.
    try:
        expected = _shlex_words(line)
    except ValueError:  # "No closing quotation"
        with pytest.raises(UsageError, match="No closing quotation"):
            split_words(line)
        return
    assert split_words(line) == expected


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="ab ]}[{'\"\\,", max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.lists(_JSON.filter(lambda v: isinstance(v, list | dict)), min_size=1, max_size=3))
def test_a_bracketed_json_value_is_one_word_spaces_and_quotes_inside(values):
    # json.dumps writes ", " and ": ": what people paste as a composite key.
    texts = [json.dumps(v) for v in values]
    words = split_words(" x ".join(texts) + " --limit 2")
    assert words == [*[w for t in texts for w in (t, "x")][:-1], "--limit", "2"]
    assert [json.loads(w) for w in words[::2][: len(texts)]] == values


def test_a_composite_key_typed_with_spaces_is_one_key():
    cmd = parse_line('get orders ["us", "bob"] [2, {"a": "b c"}]x --limit 1')
    assert cmd.keys == ('["us", "bob"]', '[2, {"a": "b c"}]x') and cmd.limit == 1
    assert parse_line(cmd.to_line().removeprefix("%iq ")) == cmd
    o = manifest("ordered")
    assert key_value(cmd.keys[0], o, {}) == ("us", "bob")
    # An unclosed bracket is an ordinary word, split at whitespace as before.
    assert split_words("[1, 2") == ["[1,", "2"]
    assert split_words("['a]', 'b'] c") == ["['a]', 'b']", "c"]


@pytest.mark.parametrize("quote", ["", "'", '"'])
def test_a_megabyte_key_parses_whole_and_round_trips(quote):
    # shlex grew each word one character at a time: 13 s for this key.
    key = "k" * 500_000 + " " * bool(quote) + "[1]" * 150_000
    cmd = parse_line(f"get totals {quote}{key}{quote} --limit 1")
    assert cmd.keys == (key,) and cmd.limit == 1
    assert parse_line(cmd.to_line().removeprefix("%iq ")) == cmd


@pytest.mark.parametrize("serde", ["json", "ordered"])
def test_keys_nested_deeper_than_a_person_types_are_one_usage_error(serde):
    for depth in (101, 1_500, 20_000):  # RecursionError from about 800 levels on
        with pytest.raises(UsageError, match="nested more than 100 levels deep") as err:
            key_value("[" * depth + "1" + "]" * depth, manifest(serde), {})
        assert "\n" not in str(err.value) and len(str(err.value)) < 300
    nested = key_value("[" * 100 + "1" + "]" * 100, manifest(serde), {})  # the limit: fine
    for _ in range(100):
        (nested,) = nested
    assert nested == 1
    # brackets inside JSON strings are text, not nesting
    assert key_value('["' + "[" * 500 + '"]', manifest(serde), {}) in (["[" * 500], ("[" * 500,))


def test_partition_lists_are_checked_before_they_are_expanded():
    assert parse_partitions("0-9999") == tuple(range(10_000))
    for text in ("0-10000", "0-5000,5000-9999,1"):
        with pytest.raises(UsageError, match="at most 10,000"):
            parse_partitions(text)
    for text in ("0-99999999999", "2147483648", "9" * 5_000):
        with pytest.raises(UsageError, match="at most 2,147,483,647"):
            parse_partitions(text)
    with pytest.raises(UsageError, match="expects partition numbers"):
        parse_partitions("\u0663")  # a non-ASCII digit: int() takes it, we do not


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("__builtins__", "one of Python's special names"),
        ("print", "would shadow a Python builtin"),
        ("In", "one of IPython's own names"),
        ("_", "one of IPython's own names"),
        ("_i3", "one of IPython's own names"),
        ("_42", "one of IPython's own names"),
        ("lambda", "a Python keyword"),
        ("a b", "needs a Python identifier"),
    ],
)
def test_as_names_that_would_shadow_the_kernels_own_are_refused(text, why):
    for line in (f"scan t --as '{text}'", f"sql --as {text} SELECT 1"):
        if " " in text and line.startswith("sql"):
            continue  # the SQL form takes --as up to the first space
        with pytest.raises(UsageError, match=why):
            parse_line(line)
    assert parse_line("scan t --as _private").as_name == "_private"


def test_times_out_of_range_are_usage_errors():
    for text in ("9" * 5_000, "now-99999999999999d", "now+9999999d"):
        with pytest.raises(UsageError, match="is out of range"):
            time_value(text, {})


def test_an_unclosed_quote_in_a_huge_line_is_a_short_error():
    # Found by the %iq input probe: the error echoed the whole line (a 5,000-digit token).
    with pytest.raises(UsageError, match="No closing quotation") as err:
        parse_line("get t 'open --partitions " + "9" * 5000)
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)
