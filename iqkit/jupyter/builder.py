"""The widget query builder behind ``%iq panel`` and ``iqkit.panel()`` (``panel.py``).

A form of ipywidgets that builds the same :class:`IQCommand` the ``%iq`` magic parses,
runs it through the same :class:`IQSession`, and shows the result in tabs (rows,
partitions, trace, lag) next to the equivalent ``%iq`` line, so users learn the magic
while clicking.

Why it is shaped this way:

* Everything is drivable from code: the widgets are public attributes, setting
  ``.value`` fires the observers synchronously (ipywidgets' ``DummyComm`` outside a
  kernel) and ``panel.run.click()`` runs the query. State lives on plain attributes
  (``.command``, ``.result``, ``.error``); the widgets are only a view of it.
* :meth:`IQPanel.build_command` is pure (it reads widget values, nothing else), so the
  form's rules are testable on their own; running (``panel.run.click()``, or calling the
  button: ``panel.run()`` returns the result) does the I/O and never raises: a mistake
  becomes ``.error`` and a red box.
* Output goes into ``HTML`` widgets, never ``with out:`` + ``print``: outside a kernel
  ``with out:`` captures nothing, in JupyterLab a ``print`` from a callback shows
  nowhere, and ``Output.append_display_data`` would create a global
  ``InteractiveShell`` as a side effect (it formats through ``InteractiveShell.instance()``).
* ``IQPanel`` is a plain object holding ``.widget`` (a ``VBox``), not a ``VBox``
  subclass, so that ``ipywidgets`` is imported only when a panel is built: without it,
  ``%iq panel`` fails with one line while the rest of ``%iq`` keeps working.
"""

from __future__ import annotations

import html
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError

from ..errors import IqkitError
from ..store.encoding.serdes import get_serde
from ..store.kinds import StoreKind
from . import render
from .command import IQCommand
from .parse import parse_bound, parse_partitions
from .render import table_style
from .result import lag_html
from .session import IQSession

__all__ = ["MISSING_IPYWIDGETS", "IQPanel", "split_keys"]

MISSING_IPYWIDGETS = "the panel needs ipywidgets: pip install ipywidgets"

#: The widgets each query type uses (the rest are hidden and left out of the command).
#: ``partitions``, ``bound``, ``active`` and ``trace`` apply to every query.
_FIELDS = {
    "get": ("key", "skip_cache", "as_of"),
    "range": ("lower", "upper", "desc", "limit"),
    "prefix": ("prefix", "desc", "limit"),
    "history": ("key", "lower", "upper", "asc", "limit"),
    "changes": ("from_version", "to_version", "prefix", "limit"),
    "window": ("key", "lower", "upper", "desc", "limit"),
    "windows": ("lower", "upper", "desc", "limit"),
    "scan": ("desc", "limit"),
}
_OPTIONAL = (
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
#: The commands whose key field takes one key.
_ONE_KEY = ("window", "history")

_TIME_EXAMPLE = "epoch ms, 2024-05-01T12:00 or now-1h"

_TABS = ("Rows", "Partitions", "Trace", "Lag", "%iq line")


def split_keys(text: str) -> tuple[str, ...]:
    """The key texts in the key field: separated by newlines or by commas.

    A comma inside brackets or quotes does not split (``[1, "a"]`` and ``{"a": 1, "b": 2}``
    are one key each, and ``"smith, j"`` quotes a string key with a comma), and one pair
    of surrounding quotes is removed, as the ``%iq`` line does with each word, so a field
    takes what the line takes. A quote inside a word (``o'brien``) is just a character.
    """
    keys: list[str] = []
    for line in text.splitlines():
        keys += [_unquote(piece) for piece in _split_top_level(line)]
    return tuple(k for k in keys if k)


def _split_top_level(line: str) -> list[str]:
    pieces: list[str] = []
    current: list[str] = []
    depth = 0
    quote: str | None = None
    escaped = False
    for ch in line:
        if quote is not None:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch == "," and depth == 0:
            pieces.append("".join(current))
            current = []
            continue
        # Quotes count at the start of a piece or inside brackets (JSON strings), not
        # mid-word, so an apostrophe in a name does not swallow the rest of the line.
        if ch in "'\"" and (depth > 0 or not "".join(current).strip()):
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})" and depth > 0:
            depth -= 1
        current.append(ch)
    pieces.append("".join(current))
    return pieces


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _field_text(widget: Any) -> str | None:
    """A one-value field's text (``None`` when empty), unquoted like a ``%iq`` word."""
    text = widget.value.strip()
    return _unquote(text) if text else None


def _version_field(widget: Any, side: str, *, required: bool) -> int | None:
    """A version number field (``changes``' from / to): ``None`` when empty and allowed."""
    text = _field_text(widget)
    if text is None and not required:
        return None
    if text is None or not text.isdecimal() or int(text) < 1:
        got = "" if text is None else f", got {text!r}"
        raise UsageError(f"%iq changes: enter the {side} version, a number >= 1{got}")
    return int(text)


def _check_bound(text: str) -> None:
    if text.startswith(":"):
        if not text[1:].isidentifier():
            raise UsageError(f"%iq: --bound :NAME needs a variable name, got {text!r}")
        return
    parse_bound(text)  # raises the magic's own message for a malformed bound


class IQPanel:
    """An ipywidgets query builder over an :class:`IQSession` (see the module docstring).

    Drive it from code: ``p.store.value = "totals"; p.query.value = "range";
    p.lower.value = "a"; p.run.click()``, then read ``p.result`` / ``p.error``.
    Variables (``:name`` in any field) are looked up when Run is clicked, in the
    notebook's namespace first (so variables defined after the panel work), then in
    ``namespace``.
    """

    def __init__(self, session: IQSession, *, namespace: Mapping[str, Any] | None = None):
        try:
            import ipywidgets as w
        except ImportError:
            raise UsageError(MISSING_IPYWIDGETS) from None
        from IPython import get_ipython

        self.session = session
        self._namespace: Mapping[str, Any] = dict(namespace or {})
        self._shell = get_ipython()
        #: The command of the last Run (``None`` before the first, or when building failed).
        self.command: IQCommand | None = None
        #: The last successful result (``None`` before the first run and after an error).
        self.result: Any = None
        #: The last error message (``None`` when the last action worked).
        self.error: str | None = None
        #: The exception behind ``.error`` (for a traceback: ``raise panel.exception``).
        self.exception: BaseException | None = None
        self._key_serde: str | None = None
        self._muted = False

        def wide() -> Any:
            # One Layout per widget: fields are hidden through layout.display, and a
            # shared Layout would hide them all together.
            return w.Layout(width="100%")

        style = {"description_width": "5em"}
        self.store = w.Dropdown(description="store", options=[], style=style)
        self.refresh = w.Button(
            icon="refresh", tooltip="list the stores again", layout=w.Layout(width="3em")
        )
        self.query = w.ToggleButtons(
            options=StoreKind.KEY_VALUE.commands, style={"button_width": "6em"}
        )
        self.key = w.Textarea(description="key", rows=2, layout=wide(), style=style)
        self.lower = w.Text(description="from", layout=wide(), style=style)
        self.upper = w.Text(description="to", layout=wide(), style=style)
        self.prefix = w.Text(description="prefix", layout=wide(), style=style)
        self.from_version = w.Text(
            description="from", placeholder="version V: the changes after it", style=style
        )
        self.to_version = w.Text(
            description="to", placeholder="version (empty = the latest)", style=style
        )
        self.as_of = w.Text(
            description="as of",
            placeholder="empty = now; a time (2024-05-01T12:00, now-1h) or a version number",
            layout=wide(),
            style=style,
        )
        self.partitions = w.Text(
            description="partitions", placeholder="all (or 0,2 or 0-3)", style=style
        )
        self.bound = w.Text(
            description="bound", placeholder="topic:0=5,1=3 or :variable", style=style
        )
        self.active = w.Checkbox(description="require active", indent=False)
        self.trace = w.Checkbox(description="execution info", indent=False)
        self.desc = w.Checkbox(description="descending", indent=False)
        self.skip_cache = w.Checkbox(description="skip cache", indent=False)
        self.asc = w.Checkbox(description="oldest first", indent=False)
        self.limit = w.IntText(
            value=0,
            description="limit",
            tooltip="0 = no --limit (the session's autolimit applies)",
            style=style,
            layout=w.Layout(width="12em"),
        )
        self.run = _run_button_class(w)(description="Run", icon="play", button_style="primary")
        self.run._panel_run = self._run
        self.error_box = w.HTML(layout=w.Layout(display="none"))
        self.rows_out = w.HTML()
        self.partitions_out = w.HTML()
        self.trace_out = w.HTML()
        self.lag_out = w.HTML()
        self.line_out = w.HTML()
        outputs = [self.rows_out, self.partitions_out, self.trace_out, self.lag_out]
        self.tabs = w.Tab(children=[*outputs, self.line_out], titles=list(_TABS))
        self.widget = w.VBox(
            [
                w.HBox([self.store, self.refresh, self.query]),
                self.key,
                self.lower,
                self.upper,
                self.prefix,
                w.HBox([self.from_version, self.to_version]),
                self.as_of,
                w.HBox([self.partitions, self.bound]),
                w.HBox([self.active, self.trace, self.desc, self.asc, self.skip_cache, self.limit]),
                self.run,
                self.error_box,
                self.tabs,
            ]
        )

        self.store.observe(self._on_store, names="value")
        self.query.observe(self._on_query, names="value")
        for name in ("key", "lower", "upper", "prefix", "partitions", "bound", "active",
                     "trace", "desc", "skip_cache", "limit", "asc", "from_version",
                     "to_version", "as_of"):  # fmt: skip
            getattr(self, name).observe(self._show_line, names="value")
        self.refresh.on_click(self._on_refresh_clicked)
        self.run.on_click(self._on_run_clicked)
        self.refresh_stores()

    # -- the form ------------------------------------------------------------------------
    def refresh_stores(self) -> None:
        """List the stores under the session's root again (keeping the chosen one)."""
        self._set_error(None)
        failure = None
        try:
            names = list(self.session.engine.store_names())
        except (UsageError, IqkitError, OSError) as exc:
            names, failure = [], exc
        current = self.store.value
        # Setting options resets a Dropdown's value (to the first option, or None when the
        # list was empty): ipywidgets' _Selection._propagate_options. The choice is put
        # back by hand, with the store observer muted so the passing value does not
        # reset the query type.
        self._muted = True
        try:
            self.store.options = names
            self.store.value = current if current in names else (names[0] if names else None)
        finally:
            self._muted = False
        self._adapt_to_store()  # even for the same store: its manifest may have changed
        if failure is not None:
            self._set_error(failure)  # after the store observer, which clears errors

    def _on_store(self, change: dict[str, Any]) -> None:
        if self._muted:
            return
        self._set_error(None)
        self._adapt_to_store()

    def _adapt_to_store(self) -> None:
        """Query types, placeholders and partition hint from the chosen store."""
        manifest = None
        if self.store.value is not None:
            try:
                manifest = self.session.engine.manifest(self.store.value)
            except (UsageError, IqkitError, OSError) as exc:
                self._set_error(exc)
        kind = manifest.kind if manifest is not None else StoreKind.KEY_VALUE
        current = self.query.value
        options = kind.commands  # the query types the store offers, in button order
        if tuple(self.query.options) != options:
            # As above: new options reset the value to the first one; keep a query type
            # both kinds offer (scan).
            self.query.options = options
            self.query.value = current if current in options else options[0]
        serde = manifest.key_serde if manifest is not None else None
        self._key_serde = serde
        if manifest is not None:
            self.partitions.placeholder = f"all {manifest.partitions} (or 0,2 or 0-3)"
        else:
            self.partitions.placeholder = "all (or 0,2 or 0-3)"
        self._update_fields()

    def _on_query(self, change: dict[str, Any]) -> None:
        self._update_fields()

    def _update_fields(self) -> None:
        """Show the fields the query type uses, hide the rest, and say what to type."""
        action = self.query.value
        used = _FIELDS.get(action, ())
        for name in _OPTIONAL:
            getattr(self, name).layout.display = None if name in used else "none"
        serde = self._key_serde
        example = get_serde(serde).example if serde else ""  # "int32 key, e.g. 42"
        kind = f"{serde} key" if serde else "key"
        key_hint = f"{kind}, e.g. {example}" if example else kind
        if action == "get":
            self.key.description = "keys"
            self.key.placeholder = (
                f"{key_hint} — several: comma-separated or one per line; :var for a variable"
            )
        else:
            self.key.description = "key"
            self.key.placeholder = f"{key_hint}; :var for a variable"
        self.prefix.placeholder = f"prefix of the {key_hint}"
        if action == "changes":
            self.prefix.placeholder += " (empty = every key)"
        if action == "range":
            self.lower.placeholder = f"lowest {key_hint} (inclusive; empty = open)"
            self.upper.placeholder = f"highest {key_hint} (inclusive; empty = open)"
        elif action == "history":
            self.lower.placeholder = f"values still valid at: {_TIME_EXAMPLE} (empty = all)"
            self.upper.placeholder = f"values written by: {_TIME_EXAMPLE} (empty = all)"
        else:
            self.lower.placeholder = f"earliest window start: {_TIME_EXAMPLE}"
            self.upper.placeholder = f"latest window start: {_TIME_EXAMPLE}"
        self._show_line()

    def build_command(self) -> IQCommand:
        """The :class:`IQCommand` the form describes (pure: reads widget values only).

        Raises ``UsageError`` (one line, like the magic's) for input that cannot make a
        command: no store, no key, bad partitions or bound, a negative limit.
        """
        action = self.query.value
        store = self.store.value
        if not store:
            raise UsageError(
                f"%iq {action}: choose a store (none under {self.session.root!r}; "
                f"create one, or %iq open PATH and press refresh)"
            )
        used = _FIELDS[action]
        values: dict[str, Any] = {}
        if "key" in used:
            keys = split_keys(self.key.value)
            if not keys:
                more = " (several: comma-separated or one per line)" if action == "get" else ""
                raise UsageError(f"%iq {action}: enter a key{more}")
            if action in _ONE_KEY and len(keys) > 1:
                raise UsageError(f"%iq {action}: takes one key, got {len(keys)}: {keys!r}")
            values["keys"] = keys
        if "lower" in used:
            values["lower"] = _field_text(self.lower)
            values["upper"] = _field_text(self.upper)
            if action in ("window", "windows"):
                for name, side in (("lower", "from"), ("upper", "to")):
                    if values[name] is None:
                        raise UsageError(f"%iq {action}: enter the {side} time ({_TIME_EXAMPLE})")
        if "prefix" in used:
            values["prefix"] = _field_text(self.prefix)
            if values["prefix"] is None and action == "prefix":
                raise UsageError("%iq prefix: enter a prefix (scan lists every key)")
        if "from_version" in used:
            values["from_version"] = _version_field(self.from_version, "from", required=True)
            values["to_version"] = _version_field(self.to_version, "to", required=False)
        if "as_of" in used:
            as_of = _field_text(self.as_of)
            if as_of is not None and as_of.isdecimal():
                values["as_of"] = int(as_of)
            elif as_of is not None:
                if len(values.get("keys", ())) > 1:
                    raise UsageError(
                        "%iq get: as of a time reads one key's record; enter one key "
                        f"(got {len(values['keys'])})"
                    )
                values["as_of_time"] = as_of
        partitions = self.partitions.value.strip()
        if partitions:
            values["partitions"] = parse_partitions(partitions)
        bound = self.bound.value.strip()
        if bound:
            _check_bound(bound)
            values["bounds"] = (bound,)
        if "desc" in used:
            values["desc"] = bool(self.desc.value)
        if "asc" in used:
            values["asc"] = bool(self.asc.value)
        if "skip_cache" in used:
            values["skip_cache"] = bool(self.skip_cache.value)
        if "limit" in used:
            limit = self.limit.value
            if limit < 0:
                raise UsageError(f"%iq {action}: limit must be >= 0 (0 = no limit), got {limit}")
            values["limit"] = limit or None
        return IQCommand(
            action,
            store=store,
            active=bool(self.active.value),
            trace=bool(self.trace.value),
            **values,
        )

    def _show_line(self, change: Any = None) -> None:
        """The ``%iq`` line for what the form says now (or why there is none yet)."""
        try:
            line = self.build_command().to_line()
        except UsageError as exc:
            self.line_out.value = f"<span style='color:#777'>{html.escape(str(exc))}</span>"
            return
        self.line_out.value = f"<pre>{html.escape(line)}</pre>"

    @property
    def line(self) -> str | None:
        """The ``%iq`` line for what the form says now (``None`` while it is incomplete)."""
        try:
            return self.build_command().to_line()
        except UsageError:
            return None

    # -- running -------------------------------------------------------------------------
    def _on_run_clicked(self, button: Any) -> None:
        self._run()

    def _on_refresh_clicked(self, button: Any) -> None:
        self.refresh_stores()

    def _run(self) -> Any:
        """Build and execute the command; return the result, or ``None`` with ``.error``.

        Never raises: a widget callback's exception would only reach the kernel log.
        """
        self.command = None
        self.result = None
        self._set_error(None)
        progress = self.session.progress
        try:
            self.command = self.build_command()
            # The tqdm bar would be displayed from a widget callback, which has no cell
            # output to go to (what a callback displays lands in the log, not the page),
            # so the panel reads without one.
            self.session.progress = False
            try:
                result = self.session.execute(self.command, self._live_namespace())
            finally:
                self.session.progress = progress
            views = self._render(result)
        except Exception as exc:  # a callback must never raise (see the docstring)
            self._clear_outputs()
            self._set_error(exc)
            return None
        self.result = result
        for out, value in zip(self._outputs, views, strict=True):
            out.value = value
        if self.command.trace:
            self.tabs.selected_index = _TABS.index("Trace")
        return result

    def _live_namespace(self) -> Mapping[str, Any]:
        if self._shell is None:
            return self._namespace
        return ChainMap(self._shell.user_ns, self._namespace)

    def _render(self, result: Any) -> tuple[str, str, str, str]:
        """HTML for the Rows, Partitions, Trace and Lag tabs (render.py's tables)."""
        failed = len(result.partitions) - result.ok_partitions
        n = len(result)
        summary = (
            f"{html.escape(result.store)} · {html.escape(result.query_type)} · "
            f"{n:,} row{'' if n == 1 else 's'} · partitions {result.ok_partitions} ok / "
            + (f"<span style='color:#a00'>{failed} failed</span>" if failed else "0 failed")
            + (" · truncated (the fetch limit)" if result.truncated else "")
        )
        limit = result.display_limit
        rows = render.table_html(result.arrow(), limit) if n else _note("No rows.")
        if limit and n > limit:
            rows += _note(
                f"Showing the first {limit:,} of {n:,} rows; all of them are in "
                "<code>panel.result.rows</code> (%config IQMagics.displaylimit shows more)."
            )
        try:
            lag = lag_html(result)
        except Exception as exc:  # lag is extra: the query's own result still shows
            lag = _note(f"Lag unavailable: {html.escape(_message(exc))}")
        return (
            _box(_note(summary) + rows),
            _box(render.frame_html(result.partitions)),
            _box(render.frame_html(result.trace)),
            _box(lag),
        )

    @property
    def _outputs(self) -> tuple[Any, ...]:
        return (self.rows_out, self.partitions_out, self.trace_out, self.lag_out)

    def _clear_outputs(self) -> None:
        for out in self._outputs:
            out.value = ""

    def _set_error(self, exc: BaseException | None) -> None:
        self.exception = exc
        if exc is None:
            self.error = None
            self.error_box.value = ""
            self.error_box.layout.display = "none"
            return
        self.error = _message(exc)
        self.error_box.value = (
            "<div style='color:#a00;background:#fee;border:1px solid #e99;"
            f"padding:4px 8px;white-space:pre-wrap'>{html.escape(self.error)}</div>"
        )
        self.error_box.layout.display = None

    # -- display -------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = repr(self)  # a widget's text is its (recursive) repr
        return bundle

    def __repr__(self) -> str:
        # Fixed: no widget ids or results, so nbval's text/plain comparison is stable.
        return (
            f"IQPanel(store={self.store.value!r}, query={self.query.value!r}, "
            f"root={self.session.root!r})"
        )


_RUN_BUTTONS: dict[type, type] = {}


def _run_button_class(widgets: Any) -> type:
    """A ``Button`` that is also callable: ``panel.run.click()`` clicks it like a user,
    ``panel.run()`` runs the query and returns the result (or ``None``, see ``.error``).
    Made on first use because ipywidgets is imported lazily (see the module docstring)."""
    base = widgets.Button
    if base not in _RUN_BUTTONS:

        class RunButton(base):  # type: ignore[misc, valid-type]
            _panel_run: Any = None

            def __call__(self) -> Any:
                return self._panel_run()

        _RUN_BUTTONS[base] = RunButton
    return _RUN_BUTTONS[base]


def _message(exc: BaseException) -> str:
    """One line for the error box: user mistakes as the magic shows them, the rest with
    their type (an unexpected exception is a bug worth naming)."""
    if isinstance(exc, UsageError):
        return str(exc)
    if isinstance(exc, (IqkitError, ValueError, TypeError)):
        # The magic reports the engine's and serdes' ValueError/TypeError as usage errors.
        return f"%iq: {exc}"
    return f"{type(exc).__name__}: {exc}"


_CSS = table_style("iqkit-panel")


def _box(body: str) -> str:
    return f"<div class='iqkit-panel'>{_CSS}{body}</div>"


def _note(text: str) -> str:
    return f"<div class='iq-note'>{text}</div>"
