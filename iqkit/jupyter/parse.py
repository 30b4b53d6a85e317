"""``%iq`` line → :class:`IQCommand`: tokenising, sub-command parsers, option checks.

Every mistake becomes one ``UsageError`` line (IPython prints those without a
traceback and still fails the cell), with a did-you-mean hint for a misspelt
sub-command or flag. Parsing needs no store: values stay text until the session types
them with the store's serdes.

Quoting: tokens are split like a shell but quotes are kept inside a token
(``shlex`` with ``posix=False``), then one pair of surrounding quotes is removed. So
``"alice smith"`` is one key and JSON such as ``[1,"a"]`` keeps its inner quotes, which
POSIX shell splitting would strip. A token that opens a bracket (``[`` or ``{``) runs to
its matching close, spaces and quoted strings inside included, so a composite key pasted
as ``json.dumps`` writes it (``["us", "bob"]``) is one token; an unclosed bracket is an
ordinary token, as before.
"""

from __future__ import annotations

import builtins
import difflib
import keyword
import re
from argparse import SUPPRESS, ArgumentParser, ArgumentTypeError
from collections.abc import Collection, Sequence

from IPython.core.error import UsageError

from ..query.position import Position
from ..store.encoding.ordered import short_repr
from .command import ACTIONS, QUERY_ACTIONS, IQCommand

__all__ = [
    "check_result_name",
    "command_help",
    "option_flags",
    "overview",
    "parse_bound",
    "parse_line",
    "parse_partitions",
    "parse_seconds",
    "split_words",
]

_SUMMARIES = {
    "open": "open PATH|:var — query the stores under PATH (default $IQKIT_ROOT or ./stores)",
    "stores": "stores — every store: kind, partitions, serdes, version, rows, position, lag",
    "get": "get STORE KEY [KEY ...] — key lookup (several keys: a multi-key query)",
    "range": "range STORE [--from LO] [--to HI] — keys in [LO, HI], either end open",
    "prefix": "prefix STORE PREFIX — keys starting with PREFIX (KIP-614)",
    "window": "window STORE KEY --from T1 --to T2 — one key's windows starting in [T1, T2]",
    "windows": "windows STORE --from T1 --to T2 — every key's windows starting in [T1, T2]",
    "scan": "scan STORE — every record (use --limit, --desc)",
    "history": "history STORE KEY [--from T] [--to T] [--asc] — every value KEY had, and when",
    "changes": "changes STORE --from V [--to V] [--prefix P] — keys the versions after V changed",
    "watch": "watch QUERY [--for S] [--every S] — re-run a query on each new version, in place",
    "lag": "lag [STORE] — how far each partition is behind its source",
    "trace": "trace — the execution trace of the last result",
    "sql": "sql [--as NAME] QUERY — DuckDB over stores, named results and DataFrames",
    "panel": "panel — the interactive query builder",
    "help": "help [COMMAND] — this overview, or one command's options",
}


class _Parser(ArgumentParser):
    """argparse that raises a one-line ``UsageError`` naming the ``%iq`` command, instead
    of printing usage and calling ``sys.exit`` (which would kill nothing but confuse)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see %iq help {self.prog.split()[-1]})")


def _query_options(
    p: _Parser, *, order: bool = True, skip_cache: bool = True, as_of_time: bool = False
) -> None:
    p.add_argument("--partitions", metavar="LIST", help="only these partitions: 0,2 or 0-3")
    p.add_argument(
        "--bound",
        action="append",
        default=[],
        metavar="BOUND",
        help="position bound: topic:0=5,1=3 (several topics: ';' or repeat) or :var",
    )
    p.add_argument("--active", action="store_true", help="require the latest version")
    p.add_argument("--trace", action="store_true", help="show the execution trace")
    if order:
        p.add_argument("--desc", action="store_true", help="descending key order")
    p.add_argument(
        "--limit", metavar="N", type=_non_negative_int, help="stop after N rows (0 = all)"
    )
    p.add_argument(
        "--as",
        dest="as_name",
        metavar="NAME",
        type=_result_name,
        help="name the result (for %%iq sql)",
    )
    if as_of_time:
        p.add_argument(
            "--as-of",
            dest="as_of",
            metavar="VERSION|TIME",
            type=_version_or_time,
            help="read this version, or the key's record as of TIME (2024-05-01T12:00, "
            "now-1h, :var)",
        )
    else:
        p.add_argument(
            "--as-of",
            dest="as_of",
            metavar="VERSION",
            type=_non_negative_int,
            help="read this version",
        )
    if skip_cache:
        p.add_argument("--skip-cache", action="store_true", help="bypass the cache layer")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {value}")
    return value


_non_negative_int.__name__ = "number"  # argparse shows it: "invalid number value: 'x'"


def _version_or_time(text: str) -> int | str:
    """``--as-of`` of ``get``: a whole number is a version (the engine pinned to it, as
    for every query); any other text is a time, typed by the session (``values.py``)."""
    if re.fullmatch(r"\s*-?\d+\s*", text):
        return _non_negative_int(text)
    return text.strip()


_version_or_time.__name__ = "version or time"


def _version(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise ValueError(f"expected a version number >= 1, got {value}")
    return value


_version.__name__ = "version"

#: ``--for 30``, ``--for 2m``, ``--every 0.5s``: seconds, or a number with a unit.
_SECONDS = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?$")
_SECOND_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
#: The longest ``--for`` / ``--every``: a day (longer is surely a typo, and a float of
#: seconds that large would be no use to ``time.sleep``).
MAX_WATCH_SECONDS = 86_400.0


def parse_seconds(text: str, flag: str) -> float:
    """``--for`` / ``--every`` text → seconds (> 0, at most a day); one ``UsageError``."""
    m = _SECONDS.match(text.strip())
    seconds = float(m.group(1)) * _SECOND_UNITS[m.group(2)] if m else None
    if seconds is None or not 0 < seconds <= MAX_WATCH_SECONDS:
        raise UsageError(
            f"%iq watch: {flag} expects seconds (e.g. 30, 0.5, 2m) above 0 and at most a "
            f"day, got {text!r}"
        )
    return seconds


#: Names IPython keeps in every user namespace (``InteractiveShell.init_user_ns``) or its
#: builtins; ``shell.user_ns_hidden`` adds whatever a given shell has on top.
_IPYTHON_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "display", "_ih", "_oh", "_dh", "_sh"}
)
#: IPython's output and input history: ``_``, ``__``, ``___``, ``_5``, ``_i``, ``_ii``,
#: ``_iii``, ``_i5``.
_IPYTHON_PATTERN = re.compile(r"_{1,3}|_i{1,3}|_i?\d+")
#: Python's own special names (``__builtins__``, ``__name__``).
_DUNDER = re.compile(r"__\w*__")


def check_result_name(name: str, reserved: Collection[str] = ()) -> str:
    """``name`` if ``--as`` may bind it in the notebook, else one ``UsageError`` line.

    ``--as x`` assigns ``x`` in the user's namespace, so a name must be a Python
    identifier that shadows nothing the kernel relies on: not a keyword, not a builtin
    (``--as __builtins__`` used to break ``import``), not IPython's own names (``In``,
    ``_``, ``get_ipython``: the magic's own line calls ``get_ipython()``), nor anything
    in ``reserved`` (the shell's ``user_ns_hidden``)."""
    if not name.isidentifier():
        raise UsageError(f"%iq: --as needs a Python identifier, got {name!r}")
    if keyword.iskeyword(name):
        why = "is a Python keyword"
    elif _DUNDER.fullmatch(name):
        why = "is one of Python's special names"
    elif name in _IPYTHON_NAMES or name in reserved or _IPYTHON_PATTERN.fullmatch(name):
        why = "is one of IPython's own names"
    elif hasattr(builtins, name):
        why = "would shadow a Python builtin"
    else:
        return name
    raise UsageError(f"%iq: --as {name!r} {why}; pick another name, e.g. --as result")


def _result_name(text: str) -> str:
    try:
        return check_result_name(text)
    except UsageError as exc:  # argparse passes this one's message on as it is
        raise ArgumentTypeError(str(exc).removeprefix("%iq: --as ")) from None


def _build_parsers() -> dict[str, _Parser]:
    parsers: dict[str, _Parser] = {}

    def new(name: str) -> _Parser:
        p = _Parser(prog=f"%iq {name}", description=_SUMMARIES[name], add_help=False)
        parsers[name] = p
        return p

    new("open").add_argument("path", metavar="PATH", nargs="?", help="the stores' root folder")
    new("stores")
    p = new("get")
    p.add_argument("store", metavar="STORE")
    p.add_argument("keys", nargs="+", metavar="KEY", help="typed by the store's key serde")
    _query_options(p, order=False, as_of_time=True)
    p = new("range")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--from", dest="lower", metavar="LO", help="lowest key (inclusive)")
    p.add_argument("--to", dest="upper", metavar="HI", help="highest key (inclusive)")
    _query_options(p)
    p = new("prefix")
    p.add_argument("store", metavar="STORE")
    p.add_argument("prefix", metavar="PREFIX")
    _query_options(p)
    p = new("window")
    p.add_argument("store", metavar="STORE")
    p.add_argument("keys", nargs=1, metavar="KEY")
    p.add_argument("--from", dest="lower", metavar="T", required=True, help="earliest window start")
    p.add_argument("--to", dest="upper", metavar="T", required=True, help="latest window start")
    _query_options(p)
    p = new("windows")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--from", dest="lower", metavar="T", required=True, help="earliest window start")
    p.add_argument("--to", dest="upper", metavar="T", required=True, help="latest window start")
    _query_options(p)
    p = new("scan")
    p.add_argument("store", metavar="STORE")
    _query_options(p)
    p = new("history")
    p.add_argument("store", metavar="STORE")
    p.add_argument("keys", nargs=1, metavar="KEY")
    p.add_argument("--from", dest="lower", metavar="T", help="keep values still valid at T")
    p.add_argument("--to", dest="upper", metavar="T", help="keep values written by T")
    p.add_argument("--asc", action="store_true", help="oldest first (default: newest first)")
    _query_options(p, order=False, skip_cache=False)
    p = new("changes")
    p.add_argument("store", metavar="STORE")
    p.add_argument(
        "--from",
        dest="from_version",
        metavar="V",
        type=_version,
        required=True,
        help="the changes made after version V",
    )
    p.add_argument(
        "--to", dest="to_version", metavar="V", type=_version, help="up to version V (the latest)"
    )
    p.add_argument("--prefix", metavar="PREFIX", help="only keys starting with PREFIX")
    _query_options(p, order=False, skip_cache=False)
    new("lag").add_argument("store", metavar="STORE", nargs="?")
    new("trace")
    new("sql").add_argument("--as", dest="as_name", metavar="NAME", help="name the result")
    p = new("watch")
    p.add_argument("query", metavar="QUERY", help="any query line: get, range, ..., changes")
    p.add_argument("--for", metavar="SECONDS", help="stop after this long (default: interrupt)")
    p.add_argument(
        "--every", metavar="SECONDS", help="how often to look for a new version (default 0.5)"
    )
    new("panel")
    new("help").add_argument("path", nargs="?", metavar="COMMAND")
    return parsers


_PARSERS = _build_parsers()


#: ``shlex``'s whitespace: what separates words.
_SPACE = re.compile(r"[ \t\r\n]*")
_WORD = re.compile(r"[^ \t\r\n]+")


def split_words(line: str) -> list[str]:
    """Shell-like split that keeps inner quotes (see the module docstring).

    The rules of ``shlex`` with ``posix=False`` and ``whitespace_split``: a word that
    starts with a quote runs to the next same quote (whitespace included) and ends
    there; any other word runs to the next whitespace, quotes inside it kept as typed.
    One addition: a word that opens a bracket runs at least to its matching close
    (``_bracket_end``). Written out here because ``shlex`` builds each word one character at a time
    (``self.token += c`` on an attribute, which CPython cannot extend in place), so a
    1 MB key took 13 s; this is linear: slices between ``find``/regex matches."""
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        i = _SPACE.match(line, i).end()  # type: ignore[union-attr]
        if i >= n:
            return [_unquote(w) for w in words]
        quote = line[i]
        if quote in "'\"":
            end = line.find(quote, i + 1)
            if end < 0:
                where = short_repr(line[i:].strip())  # the rest of a 1 MB line stays out
                raise UsageError(f"%iq: No closing quotation: {where}")
            words.append(line[i : end + 1])
            i = end + 1
        else:
            start = i
            if line[i] in "[{":
                i = _bracket_end(line, i)
            m = _WORD.match(line, i)
            i = m.end() if m else i  # the rest of the word after a closing bracket
            words.append(line[start:i])


#: What may end a bracket group early: a quote (skipped over whole) or a bracket.
_BRACKET_STOP = re.compile(r"""['"\[\]{}]""")


def _bracket_end(line: str, i: int) -> int:
    """The index just past the bracket that closes the one at ``line[i]``, or ``i``.

    Quoted strings inside (single or double, backslash escapes honoured) are skipped
    whole, so ``["a]", "b"]`` is one group. Without a matching close, ``i``: the caller
    splits at whitespace, as for any other word. Linear: one regex search per stop."""
    depth, j, n = 0, i, len(line)
    while j < n:
        m = _BRACKET_STOP.search(line, j)
        if m is None:
            return i
        c, j = m.group(), m.end()
        if c in "'\"":
            while True:  # to the closing quote, past escaped ones
                k = line.find(c, j)
                if k < 0:
                    return i
                slashes = len(line[j:k]) - len(line[j:k].rstrip("\\"))
                j = k + 1
                if slashes % 2 == 0:
                    break
        elif c in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return j
    return i


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_line(line: str, cell: str | None = None) -> IQCommand:
    """Parse one ``%iq`` line (and a ``%%iq`` cell body, used as SQL)."""
    # IPython leaves a trailing ';' (which only silences the display) in the line.
    stripped = line.strip().removesuffix(";").rstrip()
    if not stripped:
        if cell is not None and cell.strip():
            raise UsageError("%%iq needs a command on its first line, e.g. %%iq sql")
        return IQCommand("help")
    action, _, rest = stripped.partition(" ")
    action = action.lower()
    if action not in ACTIONS:
        raise UsageError(
            f"%iq: unknown command {action!r}{_did_you_mean(action, ACTIONS)} (see %iq help)"
        )
    if action == "sql":
        return _parse_sql(rest, cell)
    if cell is not None and cell.strip():
        raise UsageError(f"%%iq {action} takes no cell body (only %%iq sql does)")
    words = split_words(rest)
    if action == "watch":
        return _parse_watch(words)
    return _parse_words(action, words)


def _parse_words(action: str, words: list[str]) -> IQCommand:
    parser = _PARSERS[action]
    ns, extra = parser.parse_known_args(words)
    if extra:
        _reject_extra(parser, extra)
    values = {k: v for k, v in vars(ns).items() if v is not SUPPRESS}
    if "keys" in values:
        values["keys"] = tuple(values["keys"])
    if "partitions" in values:
        values["partitions"] = (
            None if values["partitions"] is None else parse_partitions(values["partitions"])
        )
    if "bound" in values:
        bounds = tuple(values.pop("bound"))
        for b in bounds:
            _check_bound_syntax(b)
        values["bounds"] = bounds
    if action == "help" and values.get("path") and values["path"] not in ACTIONS:
        topic = values["path"]
        raise UsageError(f"%iq help: unknown command {topic!r}{_did_you_mean(topic, ACTIONS)}")
    if isinstance(values.get("as_of"), str):  # get --as-of TIME
        values["as_of_time"] = values.pop("as_of")
        if len(values["keys"]) > 1:
            raise UsageError(
                "%iq get: --as-of TIME reads one key's record; give one key "
                f"(got {len(values['keys'])})"
            )
    return IQCommand(action, **values)


#: ``watch``'s own options, taken out of the line before the query is parsed.
_WATCH_FLAGS = {"--for": "duration", "--every": "every"}


def _parse_watch(words: list[str]) -> IQCommand:
    """``watch QUERY... [--for S] [--every S]``: the watch options may stand anywhere in
    the line; everything else is the query, parsed as its own ``%iq`` line."""
    options: dict[str, float] = {}
    query: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if flag in _WATCH_FLAGS:
            if not eq:
                if i + 1 >= len(words):
                    raise UsageError(f"%iq watch: {flag} needs a number of seconds, e.g. {flag} 30")
                value = words[i + 1]
                i += 1
            options[_WATCH_FLAGS[flag]] = parse_seconds(value, flag)
        else:
            query.append(word)
        i += 1
    if not query:
        raise UsageError("%iq watch: which query? e.g. %iq watch get totals alice --for 60")
    action = query[0].lower()
    if action not in QUERY_ACTIONS:
        hint = _did_you_mean(action, QUERY_ACTIONS)
        raise UsageError(
            f"%iq watch: watches a query ({', '.join(QUERY_ACTIONS)}), got {action!r}{hint}"
        )
    _check_watch_flags(action, query[1:])
    return IQCommand("watch", watched=_parse_words(action, query[1:]), **options)


def _check_watch_flags(action: str, words: list[str]) -> None:
    """A misspelt ``--for`` / ``--every`` is named as such: the query's parser would
    only suggest its own options."""
    flags = option_flags(action)
    for word in words:
        flag = word.partition("=")[0]
        if not flag.startswith("--") or any(f.startswith(flag) for f in flags):
            continue  # the query's option (argparse takes unique abbreviations too)
        close = difflib.get_close_matches(flag, list(_WATCH_FLAGS), n=1)
        if close:
            raise UsageError(f"%iq watch: unknown option {flag!r}; did you mean {close[0]!r}?")


def _reject_extra(parser: _Parser, extra: list[str]) -> None:
    word = extra[0]
    if word.startswith("-") and not _looks_numeric(word):
        flags = [o for a in parser._actions for o in a.option_strings]
        raise UsageError(
            f"{parser.prog}: unknown option {word!r}{_did_you_mean(word, flags)} "
            f"(see %iq help {parser.prog.split()[-1]})"
        )
    raise UsageError(
        f"{parser.prog}: unexpected argument {word!r} (see %iq help {parser.prog.split()[-1]})"
    )


def _looks_numeric(word: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d*)?", word) is not None


_SQL_AS = re.compile(r"^\s*--as(?:\s+|=)(\S+)\s*")


def _parse_sql(rest: str, cell: str | None) -> IQCommand:
    """``sql [--as NAME] QUERY``: the query is taken verbatim (no shell splitting, so SQL
    quotes, ``--`` comments and ``$params`` arrive untouched)."""
    as_name = None
    m = _SQL_AS.match(rest)
    if m:
        as_name = check_result_name(m.group(1))
        rest = rest[m.end() :]
    elif rest.lstrip().startswith("--as"):
        raise UsageError("%iq sql: --as needs a name: %iq sql --as NAME SELECT ...")
    parts = [rest.strip(), (cell or "").strip()]
    query = "\n".join(p for p in parts if p)
    if not query:
        raise UsageError("%iq sql: no query given: %iq sql SELECT ... or a %%iq sql cell")
    return IQCommand("sql", sql=query, as_name=as_name)


_PARTITION = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")  # ASCII digits only
#: Kafka's partition numbers are Java ints.
_MAX_PARTITION = 2**31 - 1
#: How many partitions one ``--partitions`` may name: far more than any store has, far
#: fewer than would strain the kernel (``0-99999999999`` would build a set of 10^11).
MAX_LISTED_PARTITIONS = 10_000


def _partition_number(digits: str) -> int:
    """The number, or just past the largest partition number for longer digit strings
    (never ``int()`` of thousands of digits, which Python refuses)."""
    return int(digits) if len(digits) <= 10 else _MAX_PARTITION + 1


def parse_partitions(text: str) -> tuple[int, ...]:
    """``"0,2"`` / ``"0-3"`` / ``"0,2-3"`` → sorted partition numbers.

    Ranges are checked before they are expanded: a list naming more than
    ``MAX_LISTED_PARTITIONS`` partitions, or a number above Kafka's largest partition
    number, is one ``UsageError``. Numbers the store does not have stay the engine's to
    answer (``DOES_NOT_EXIST`` for that partition, the IQv2 rule)."""
    spans: list[tuple[int, int]] = []
    for part in text.replace(" ", "").split(","):
        m = _PARTITION.match(part)
        lo = _partition_number(m.group(1)) if m else -1
        hi = _partition_number(m.group(2)) if m and m.group(2) is not None else lo
        if not m or lo > hi:
            raise UsageError(
                f"%iq: --partitions expects partition numbers like 0,2 or 0-3, got {text!r}"
            )
        if hi > _MAX_PARTITION:
            raise UsageError(
                f"%iq: --partitions: a partition number is at most {_MAX_PARTITION:,} "
                "(Kafka's largest)"
            )
        spans.append((lo, hi))
    named = sum(hi - lo + 1 for lo, hi in spans)  # an upper bound (overlaps count twice)
    if named > MAX_LISTED_PARTITIONS:
        raise UsageError(
            f"%iq: --partitions names {named:,} partitions; at most "
            f"{MAX_LISTED_PARTITIONS:,} (leave --partitions out to query every partition)"
        )
    out: set[int] = set()
    for lo, hi in spans:
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


_BOUND_PART = re.compile(r"^\s*(\d+)\s*=\s*(-?\d+)\s*$")


def _check_bound_syntax(text: str) -> None:
    if text.startswith(":"):
        if not text[1:].isidentifier():
            raise UsageError(f"%iq: --bound :NAME needs a variable name, got {text!r}")
        return
    parse_bound(text)


def parse_bound(text: str) -> Position:
    """``"orders:0=5,1=3;payments:0=2"`` → a Position (offsets are the last applied)."""
    position = Position.empty()
    for topic_part in filter(None, (t.strip() for t in text.split(";"))):
        topic, sep, offsets = topic_part.rpartition(":")
        if not sep or not topic or not offsets:
            raise UsageError(_bound_error(text))
        for item in offsets.split(","):
            m = _BOUND_PART.match(item)
            if not m:
                raise UsageError(_bound_error(text))
            try:
                position = position.with_component(topic, int(m.group(1)), int(m.group(2)))
            except ValueError as exc:
                raise UsageError(f"%iq: --bound {text!r}: {exc}") from None
    if position.is_empty:
        raise UsageError(_bound_error(text))
    return position


def _bound_error(text: str) -> str:
    return (
        f"%iq: --bound expects topic:partition=offset,... (e.g. orders:0=5,1=3) "
        f"or :variable, got {text!r}"
    )


def option_flags(action: str) -> list[str]:
    """The long options a sub-command takes (for tab completion)."""
    parser = _PARSERS.get(action)
    if parser is None:
        return []
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def overview() -> str:
    """The text of ``%iq help`` (and of ``%iq?``)."""
    lines = ["%iq COMMAND [ARGS] [OPTIONS]   (x = %iq ... keeps the result)", ""]
    lines += [f"  {_SUMMARIES[a]}" for a in ACTIONS]
    lines += [
        "",
        "Query options (get, range, prefix, window, windows, scan, history, changes):",
        "  --partitions 0,2   --bound topic:0=5,1=3 | :var   --active   --trace",
        "  --desc   --limit N   --as NAME   --as-of VERSION   --skip-cache",
        "get KEY --as-of TIME: the key's value then (TIME: 2024-05-01T12:00, now-1h, :var).",
        "Times: epoch ms, ISO-8601 (naive = UTC), now, now-15m (units ms s m h d).",
        "Keys are typed by the store's key serde (42 is an int in an int32 store);",
        "JSON literals give tuples and records; :name uses a notebook variable.",
        "%iq help COMMAND shows one command's options.",
    ]
    return "\n".join(lines)


def command_help(action: str) -> str:
    return _PARSERS[action].format_help()
