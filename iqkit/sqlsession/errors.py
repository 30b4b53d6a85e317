"""What goes wrong in SQL, said in one short message: :class:`SQLError`, DuckDB's own
errors shortened, and SQL text with no UTF-8 form caught before DuckDB sees it."""

from __future__ import annotations

from ..errors import IqkitError


class SQLError(IqkitError):
    """A SQL statement failed: unknown table, bad parameters, or DuckDB's own error
    (syntax, binder, catalog, conversion), shortened to its first lines."""


def short_message(error: BaseException) -> str:
    """DuckDB's message without the wall: the first line, the short lines right after it
    (hints such as "Candidate bindings"), and the ``LINE n:`` excerpt with its caret;
    tab-indented lists (every overload of a function) are dropped."""
    lines = str(error).splitlines()
    if not lines:
        return type(error).__name__
    out = [lines[0]]
    i = 1
    while i < len(lines) and lines[i].strip() and len(out) < 3:
        if not lines[i].startswith("\t"):
            out.append(lines[i])
        i += 1
    for j, line in enumerate(lines):
        if line.startswith("LINE ") and j + 1 < len(lines):
            out.extend([line, lines[j + 1]])
            break
    return "\n".join(out)


def check_unicode(sql: str) -> None:
    """Quirk: DuckDB's Python binding takes SQL as UTF-8, and a ``str`` holding a lone
    surrogate (``'\\ud800'``, from a bad copy-paste or ``surrogateescape`` decoding) has
    no UTF-8 form: pybind11 then rejects the call with a ``TypeError`` listing every
    overload. Say what is wrong, and where."""
    at = lone_surrogate(sql)
    if at is not None:
        raise SQLError(
            f"the SQL holds {sql[at]!r} at character {at + 1}: a lone surrogate, which is "
            "not valid Unicode (retype that character)"
        )


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a character with no UTF-8 form (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
