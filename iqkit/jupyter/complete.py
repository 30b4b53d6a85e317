"""Tab completion for ``%iq``: sub-commands, store names, option flags (``watch``: the
watched query's, then its own).

Registered through IPython's ``complete_command`` hook for ``%iq``/``%%iq``/``%iqkit``;
IPython filters the candidates by what the user has typed. Store names come from the
session's engine and are skipped quietly when no root is open yet (completion must
never raise into the user's typing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .command import ACTIONS, QUERY_ACTIONS
from .parse import option_flags
from .session import IQSession

__all__ = ["candidates", "register_completer"]

_TAKES_STORE = (*QUERY_ACTIONS, "lag")


def candidates(session: IQSession, line: str) -> list[str]:
    """What may come next on ``line`` (everything typed so far)."""
    words = line.split()
    finished = line.endswith((" ", "\t"))
    typed = len(words) - (0 if finished else 1)  # words complete before the cursor
    if typed <= 1:
        return list(ACTIONS)
    action = words[1].lower()
    current = "" if finished else words[-1]
    if action == "watch":  # %iq watch QUERY ...: the query's words, then watch's flags
        if typed == 2:
            return list(QUERY_ACTIONS)
        query = words[2].lower()
        if current.startswith("-"):
            return [*option_flags(query), *option_flags("watch")]
        return _store_names(session) if typed == 3 else option_flags(query)
    if current.startswith("-"):
        return option_flags(action)
    if action in _TAKES_STORE and typed == 2:
        return _store_names(session)
    if action == "help" and typed == 2:
        return list(ACTIONS)
    return option_flags(action)


def _store_names(session: IQSession) -> list[str]:
    try:
        return session.engine.store_names()
    except Exception:  # no root yet, or unreadable: complete nothing rather than fail
        return []


def register_completer(shell: Any, session_of: Callable[[], IQSession | None]) -> None:
    """Register once per shell: IPython's hook dispatcher only adds, never replaces, so a
    ``%reload_ext`` must not stack a second completer (bound to a closed session).
    ``session_of`` returns the live magics' session each time (``%reload_ext`` replaces
    it); the magic passes it, so this module never imports the magic back."""
    if getattr(shell, "_iqkit_completer", False):
        return

    def complete(_self: Any, event: Any) -> list[str]:
        session = session_of()
        return candidates(session, event.line) if session is not None else []

    for key in ("%iq", "%%iq", "%iqkit", "%%iqkit"):
        shell.set_hook("complete_command", complete, str_key=key)
    shell._iqkit_completer = True
