"""The normalised ``%iq`` command: what the user asked for, independent of how it was typed.

The magic's parser (``parse.py``) turns a line into an :class:`IQCommand`; the widget panel
builds one from its fields; the session (``session.py``) executes it. ``to_line()`` goes
the other way, so the panel can show the ``%iq`` line that does the same thing and a
result can say how it was made. Values stay as the user's text (keys, bounds, times):
typing them needs the store's serdes, which is the session's job, not the parser's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..store.kinds import QUERY_COMMANDS

__all__ = ["ACTIONS", "QUERY_ACTIONS", "IQCommand"]

#: Sub-commands that run a state query and return an ``IQResult`` (each store kind says
#: which of them read it).
QUERY_ACTIONS = QUERY_COMMANDS
#: Every sub-command, in the order ``%iq help`` lists them.
ACTIONS = (
    "open",
    "stores",
    *QUERY_ACTIONS,
    "watch",
    "lag",
    "trace",
    "sql",
    "panel",
    "help",
)


@dataclass(frozen=True)
class IQCommand:
    """One ``%iq`` invocation. Field names follow the long option names."""

    action: str
    store: str | None = None
    #: ``get``/``window``: key texts (``:name`` binds a notebook variable).
    keys: tuple[str, ...] = ()
    #: ``range --from/--to`` (key texts), ``window(s)``/``history --from/--to`` (times).
    lower: str | None = None
    upper: str | None = None
    #: ``prefix PREFIX``, ``changes --prefix PREFIX``.
    prefix: str | None = None
    #: ``changes --from/--to``: the versions whose changes to list (after ``from``).
    from_version: int | None = None
    to_version: int | None = None
    partitions: tuple[int, ...] | None = None
    #: ``--bound`` texts, each ``topic:p=o,p=o`` or ``:name`` (a Position variable).
    bounds: tuple[str, ...] = ()
    active: bool = False
    trace: bool = False
    desc: bool = False
    #: ``history --asc``: the oldest record first.
    asc: bool = False
    skip_cache: bool = False
    limit: int | None = None
    as_name: str | None = None
    #: ``--as-of VERSION``: the engine pinned to that version.
    as_of: int | None = None
    #: ``get --as-of TIME`` (a time text): the key's record as of that time.
    as_of_time: str | None = None
    #: ``watch``: the query command re-run on each new version, for how long and how
    #: often the version is polled (seconds; ``None``: until interrupted, the default).
    watched: IQCommand | None = None
    duration: float | None = None
    every: float | None = None
    #: ``open PATH``, ``help CMD``.
    path: str | None = None
    sql: str | None = None

    @property
    def is_query(self) -> bool:
        return self.action in QUERY_ACTIONS

    @property
    def result_name(self) -> str | None:
        """The name ``--as`` binds: this command's, or the watched query's."""
        if self.watched is not None:
            return self.watched.as_name
        return self.as_name

    def to_line(self) -> str:
        """The ``%iq`` line that parses back into this command (cell SQL excepted)."""
        if self.watched is not None:
            line = f"%iq watch {self.watched.to_line().removeprefix('%iq ')}"
            for flag, seconds in (("--for", self.duration), ("--every", self.every)):
                if seconds is not None:
                    line += f" {flag} {_seconds_text(seconds)}"
            return line
        words = ["%iq", self.action]
        if self.action in ("open", "help") and self.path:
            words.append(self.path)
        if self.store is not None:
            words.append(self.store)
        words += self.keys
        if self.prefix is not None and self.action != "changes":
            words.append(self.prefix)
        if self.lower is not None:
            words += ["--from", self.lower]
        if self.upper is not None:
            words += ["--to", self.upper]
        if self.from_version is not None:
            words += ["--from", str(self.from_version)]
        if self.to_version is not None:
            words += ["--to", str(self.to_version)]
        if self.prefix is not None and self.action == "changes":
            words += ["--prefix", self.prefix]
        if self.partitions is not None:
            words += ["--partitions", ",".join(str(p) for p in self.partitions)]
        for bound in self.bounds:
            words += ["--bound", bound]
        for flag in ("active", "trace", "desc", "asc"):
            if getattr(self, flag):
                words.append(f"--{flag}")
        if self.skip_cache:
            words.append("--skip-cache")
        if self.limit is not None:
            words += ["--limit", str(self.limit)]
        if self.as_of is not None:
            words += ["--as-of", str(self.as_of)]
        if self.as_of_time is not None:
            words += ["--as-of", self.as_of_time]
        if self.as_name is not None:
            words += ["--as", self.as_name]
        line = " ".join(words[:1] + [_quote(w) for w in words[1:]])
        if self.action == "sql" and self.sql:
            sql = " ".join(self.sql.split())
            line = f"{line} {sql}" if "\n" not in self.sql else f"%{line}\n{self.sql}"
        return line

    def __repr__(self) -> str:
        set_fields = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"IQCommand({', '.join(set_fields)})"


def _seconds_text(seconds: float) -> str:
    """``30`` for 30.0, ``0.5`` for 0.5: what a user would type."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _quote(word: str) -> str:
    """Quote the way ``parse.split_words`` reads: one pair of surrounding quotes, the
    inside kept verbatim (so JSON such as ``[1, "a"]`` survives in single quotes). A
    trailing ';' is quoted too: bare, it would silence the display instead."""
    if word and not word.endswith(";") and not any(c in word for c in " \t\r\n'\""):
        return word
    return f"'{word}'" if "'" not in word else f'"{word}"'
