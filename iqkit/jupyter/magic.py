"""The ``%iq`` / ``%%iq`` magics: a thin layer over parse → session → result.

``IQMagics`` parses the line (``parse.py``), hands the :class:`IQCommand` to its
:class:`IQSession` and returns what comes back; IPython displays it. The two commands
that are views built on the session, ``%iq panel`` (``builder.py``) and ``%iq watch``
(``watch.py``), are built here, so the session never imports what is built on it.
Settings are traitlets, so ``%config IQMagics.displaylimit = 20`` works and ``%config
IQMagics`` lists them. The same method is registered as ``%iq`` and ``%iqkit`` (the long
alias, for notebooks where ``iq`` is taken).
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import (
    Magics,
    line_cell_magic,
    magics_class,
    needs_local_scope,
    no_var_expand,
)
from traitlets import Bool, Enum, Int, List, TraitError, Unicode, observe, validate
from traitlets.config import Configurable

from ..sqlsession import SQL_ACCESS
from .builder import IQPanel
from .command import IQCommand
from .complete import register_completer
from .parse import check_result_name, overview, parse_line
from .session import VIEWS, IQSession, usage_errors
from .watch import WatchRun, watch

__all__ = ["IQMagics", "live_magics", "live_session"]


@magics_class
class IQMagics(Magics, Configurable):
    """Interactive queries over iqkit stores (see ``%iq help``)."""

    displaylimit = Int(
        10, help="Rows a result shows (0 = all); the result object always holds them all."
    ).tag(config=True)
    autolimit = Int(
        100_000,
        help="Rows a query reads when no --limit is given (0 = no limit): keeps an "
        "accidental scan of a huge store from filling the kernel's memory.",
    ).tag(config=True)
    root = Unicode(
        None,
        allow_none=True,
        help="The stores' root folder (default: $IQKIT_ROOT, else ./stores).",
    ).tag(config=True)
    progress = Bool(True, help="Show a progress bar when reading takes over 0.5 s.").tag(
        config=True
    )
    sql_access = Enum(
        list(SQL_ACCESS),
        "files",
        help="What %iq sql may touch besides stores, named results and DataFrames: "
        "'files' (local files through read_csv, COPY ... TO; never a download) or 'none' "
        "(nothing else; sql_directories excepted, and no SET).",
    ).tag(config=True)
    sql_directories = List(
        Unicode(),
        help="With sql_access = 'none': folders %iq sql may still read and write.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        # The session exists before traitlets loads the config, because loading it fires
        # the observers below (on %reload_ext the shell's config already holds values).
        self.session = IQSession()
        Configurable.__init__(self, config=shell.config if shell is not None else None)
        Magics.__init__(self, shell=shell, **kwargs)
        self.session.display_limit = self.displaylimit
        self.session.autolimit = self.autolimit
        self.session.progress = self.progress
        self.session.set_sql_access(self.sql_access, self.sql_directories)
        # Magics.__init__ already appends self to shell.configurables (%config sees it).

    @validate("displaylimit", "autolimit")
    def _non_negative(self, proposal: Any) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must be >= 0 (0 = no limit)")
        return proposal["value"]

    @observe("displaylimit", "autolimit", "progress")
    def _sync_setting(self, change: Any) -> None:
        name = "display_limit" if change["name"] == "displaylimit" else change["name"]
        setattr(self.session, name, change["new"])

    @observe("sql_access", "sql_directories")
    def _sync_sql_access(self, change: Any) -> None:
        self.session.set_sql_access(self.sql_access, self.sql_directories)

    @observe("root")
    def _sync_root(self, change: Any) -> None:
        # Set the root without opening: a configured root that does not exist yet must not
        # break %load_ext; the first query reports it.
        self.session.set_root(change["new"])

    @no_var_expand
    @needs_local_scope
    @line_cell_magic("iq")
    @line_cell_magic("iqkit")
    def iq(self, line: str, cell: str | None = None, local_ns: dict[str, Any] | None = None) -> Any:
        command = parse_line(line, cell)
        name = command.result_name
        if name and self.shell is not None:
            check_result_name(name, self.shell.user_ns_hidden)
        namespace = dict(self.shell.user_ns) if self.shell is not None else {}
        namespace.update(local_ns or {})
        result = self.run(command, namespace)
        if name and self.shell is not None:
            # A watch names the last result it showed (what the display ended on).
            self.shell.user_ns[name] = result.result if isinstance(result, WatchRun) else result
        # IPython's display hook looks for ';' in the transformed cell, where it sits
        # inside the magic's line string, so it never silences a magic: we do it here.
        if cell is None and line.rstrip().endswith(";"):
            return None
        return result

    iq.__doc__ = overview()

    def run(self, command: IQCommand, namespace: dict[str, Any]) -> Any:
        """What ``command`` shows: the panel and a watch are views built here on the
        session (they run their queries through it), every other command the session
        runs itself."""
        action = command.action
        if action not in VIEWS:
            return self.session.execute(command, namespace)
        with usage_errors(action):
            if action == "panel":
                return IQPanel(self.session, namespace=namespace)
            return watch(self.session, command, namespace)

    def close(self) -> None:
        self.session.close()


def load(shell: Any) -> IQMagics:
    """Register a fresh ``IQMagics`` (replacing one already loaded: ``%reload_ext``)."""
    unload(shell)
    magics = IQMagics(shell)
    shell.register_magics(magics)
    register_completer(shell, lambda: live_session(shell))
    return magics


def unload(shell: Any) -> None:
    for old in live_magics(shell):
        old.close()
        shell.configurables.remove(old)


def live_magics(shell: Any) -> list[IQMagics]:
    """The ``IQMagics`` loaded in ``shell``, oldest first (``[]`` without a shell).

    The one place that looks for them: ``%reload_ext`` replaces the instance, so the
    completer and ``iqkit.panel()`` ask here each time rather than keep one."""
    if shell is None:
        return []
    return [c for c in shell.configurables if isinstance(c, IQMagics)]


def live_session(shell: Any) -> IQSession | None:
    """The session of the ``%iq`` magics loaded in ``shell`` (``None``: not loaded)."""
    live = live_magics(shell)
    return live[-1].session if live else None
