"""``%iq watch QUERY [--for S] [--every S]``: a query re-run on each new version of its
store, in one display updated in place.

The cell blocks while it watches (docs/DECISIONS.md, "`%iq watch`"): it
polls ``engine.version(store)`` (a cheap check: the engine looks for the next version
record) every ``--every`` seconds, re-runs the query when the version moved, and updates
the one display it made with IPython's display handle. It stops after ``--for`` seconds
or at an interrupt (the Stop button, Ctrl-C), and either way the cell ends cleanly: no
traceback, no thread or timer left, and what it returns says how it stopped.

Each refresh shows the version, the store's position and lag, and marks the rows whose
key changed since the previous refresh. For a key-value store those keys come from the
store itself (a ``ChangesQuery`` between the two versions, bounded like the query), so a
value written again unchanged is no change and a deleted key is named although it has no
row any more. Where that cannot answer (a window store, a version retention removed) the
rows are compared with the previous refresh's instead. ``history`` and ``changes``
results mark their rows written by the new versions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any

from IPython.core.error import UsageError

from ..engine import served_version
from ..query import (
    ChangesQuery,
    KeyQuery,
    MultiVersionedKeyQuery,
    Position,
    PrefixScanQuery,
    RangeQuery,
    StateQueryRequest,
    VersionedKeyQuery,
)
from ..query.lag import NO_SOURCE
from ..store.encoding.ordered import short_repr
from ..store.rows import RowSchema
from .command import IQCommand
from .result import IQResult, compact_position, result_html, result_text
from .session import IQSession

__all__ = ["DEFAULT_EVERY", "WatchRun", "WatchUpdate", "WatchView", "watch"]

#: Seconds between two looks at the store's version when ``--every`` is not given: a
#: new version shows within half a second, and the look costs a file check or two.
DEFAULT_EVERY = 0.5
#: Changed keys a refresh names in its header (the rows mark them all).
NAMED_KEYS = 10


@dataclass(frozen=True)
class WatchUpdate:
    """One refresh: the version shown, the one before, what changed."""

    version: int | None
    previous: int | None
    #: Keys the new versions changed (``None``: rows were compared instead).
    changed: tuple[Any, ...] | None
    #: Those of them the new versions deleted.
    deleted: tuple[Any, ...]
    #: Row numbers of the result marked as changed.
    highlighted: tuple[int, ...]
    result: IQResult


@dataclass
class WatchRun:
    """What ``%iq watch`` returns once it stopped: the displays it showed, the last
    result (``.result``; ``--as NAME`` binds it too), and why it stopped (``"for"``:
    ``--for`` ran out, ``"interrupted"``)."""

    command: IQCommand
    updates: list[WatchUpdate] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0

    @property
    def result(self) -> IQResult | None:
        return self.updates[-1].result if self.updates else None

    @property
    def versions(self) -> list[int | None]:
        """The version each display showed, in order."""
        return [u.version for u in self.updates]

    def df(self) -> Any:
        """The last result's rows as a DataFrame."""
        if self.result is None:
            raise ValueError("the watch showed no result")
        return self.result.df()

    def __repr__(self) -> str:
        versions = self.versions
        shown = "no version" if not versions else f"versions {versions[0]} → {versions[-1]}"
        if versions and versions[0] == versions[-1]:
            shown = f"version {versions[0]}"
        why = "interrupted" if self.stopped == "interrupted" else "--for ran out"
        return (
            f"%iq watch stopped ({why}) after {len(self.updates)} display(s), {shown}: "
            f"{self.command.watched.to_line() if self.command.watched else ''}"
        )

    def _repr_html_(self) -> str:
        return f"<div class='iq-note iqkit-watch-end'>{escape(repr(self))}</div>"


class WatchView:
    """The display ``%iq watch`` keeps updating: a header (version, position, lag, what
    changed, whether it still watches) over the result, its changed rows marked."""

    def __init__(
        self,
        update: WatchUpdate,
        *,
        refresh: int,
        position: str,
        lag: str,
        state: str,
    ) -> None:
        self.update = update
        self.refresh = refresh
        self.position = position
        self.lag = lag
        self.state = state

    def _changes_text(self) -> str:
        u = self.update
        if u.previous is None or u.version == u.previous:
            return ""
        since = f"since version {u.previous}"
        if u.changed is None:
            return f"{len(u.highlighted)} row(s) new or changed {since}"
        named = [short_repr(k) for k in u.changed[:NAMED_KEYS]]
        more = f" and {len(u.changed) - NAMED_KEYS} more" if len(u.changed) > NAMED_KEYS else ""
        text = f"{len(u.changed)} key(s) changed {since}"
        if named:
            text += f": {', '.join(named)}{more}"
        if u.deleted:
            gone = ", ".join(map(short_repr, u.deleted[:NAMED_KEYS]))
            text += f" ({len(u.deleted)} deleted: {gone})"
        return text

    def _head(self) -> list[str]:
        u = self.update
        version = "nothing published" if u.version is None else f"version {u.version}"
        return [
            self.state,
            version,
            f"position {self.position or '(none)'}",
            f"lag {self.lag}",
            f"display {self.refresh}",
        ]

    def _repr_html_(self) -> str:
        u = self.update
        head = self._head()
        version = (
            "nothing published"
            if u.version is None
            else f"version <b class='iq-watch-version'>{u.version}</b>"
        )
        parts = [
            f"<b class='iq-watch-state'>{escape(head[0])}</b>",
            version,
            *(escape(h) for h in head[2:]),
        ]
        changes = self._changes_text()
        html = (
            "<div class='iqkit-watch'>"
            f"<div class='iq-watch-head' style='font-size:12px;margin:2px 0'>{' · '.join(parts)}"
            "</div>"
        )
        if changes:
            html += f"<div class='iq-watch-changes iq-note'>{escape(changes)}</div>"
        return html + result_html(u.result, set(u.highlighted)) + "</div>"

    def __repr__(self) -> str:
        lines = [" · ".join(self._head())]
        changes = self._changes_text()
        if changes:
            lines.append(changes)
        lines.append(result_text(self.update.result, set(self.update.highlighted)))
        return "\n".join(lines)


def watch(session: IQSession, command: IQCommand, namespace: Mapping[str, Any]) -> WatchRun:
    """Run ``command`` (a ``watch``) until ``--for`` runs out or an interrupt; see the
    module docstring."""
    from IPython.display import display

    inner = command.watched
    if inner is None or not inner.is_query:  # parse_line makes neither; a hand-built one may
        raise UsageError("%iq watch: watches a query, e.g. %iq watch get totals alice")
    if inner.as_of is not None:
        raise UsageError(
            f"%iq watch: --as-of {inner.as_of} reads one fixed version, so nothing new "
            "would show; leave --as-of out"
        )
    every = command.every or DEFAULT_EVERY
    started = time.monotonic()
    deadline = None if command.duration is None else started + command.duration
    run = WatchRun(command)
    watcher = _Watcher(session, inner, namespace)
    handle: Any = None
    view: WatchView | None = None
    try:
        view = watcher.refresh(None, "watching")
        run.updates.append(view.update)
        handle = display(view, display_id=True)
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                run.stopped = "for"
                break
            time.sleep(every if deadline is None else min(every, deadline - now))
            if session.engine.version(watcher.store) == watcher.version:
                continue
            view = watcher.refresh(view.update, "watching")
            run.updates.append(view.update)
            handle.update(view)
    except KeyboardInterrupt:
        run.stopped = "interrupted"
    run.seconds = time.monotonic() - started
    if handle is not None and view is not None:
        why = "interrupted" if run.stopped == "interrupted" else "stopped: --for ran out"
        view.state = f"watched ({why})"
        handle.update(view)
    return run


class _Watcher:
    """One watched query: runs it, works out what changed, names the result."""

    def __init__(
        self, session: IQSession, command: IQCommand, namespace: Mapping[str, Any]
    ) -> None:
        self.session = session
        self.command = command
        self.namespace = namespace
        self.store = command.store or ""
        self.manifest = session.manifest(self.store)
        self.version: int | None = None
        self.refreshes = 0

    def refresh(self, previous: WatchUpdate | None, state: str) -> WatchView:
        result = self.session.query(self.command, self.namespace)
        self.session.last = result
        if self.command.as_name:
            self.session.name_result(self.command.as_name, result)
        version = served_version(result.result)
        if version is None:
            version = result.version
        changed: tuple[Any, ...] | None = None
        deleted: tuple[Any, ...] = ()
        highlighted: tuple[int, ...] = ()
        old = previous.version if previous is not None else None
        if previous is not None and version != old:
            changed, deleted, highlighted = self._changes(previous, result, old, version)
        self.version = version
        self.refreshes += 1
        update = WatchUpdate(version, old, changed, deleted, highlighted, result)
        position, lag = self._position_and_lag()
        return WatchView(update, refresh=self.refreshes, position=position, lag=lag, state=state)

    # -- what changed ----------------------------------------------------------------------
    def _changes(
        self, previous: WatchUpdate, result: IQResult, old: int | None, new: int | None
    ) -> tuple[tuple[Any, ...] | None, tuple[Any, ...], tuple[int, ...]]:
        query = result.query
        table = result.arrow()
        records = isinstance(query, ChangesQuery | MultiVersionedKeyQuery | VersionedKeyQuery)
        if records and old is not None and "version" in table.column_names:
            versions = table.column("version").to_pylist()
            marked = tuple(i for i, v in enumerate(versions) if v is not None and v > old)
            return None, (), marked
        keys = None
        if old is not None and new is not None and new > old:
            keys = self._changed_keys(result, old, new)
        if keys is not None:
            changed, deleted = keys
            row_keys = _row_keys(table, self.manifest)
            if row_keys is not None:
                wanted = {_token(k) for k in changed}
                marked = tuple(i for i, k in enumerate(row_keys) if _token(k) in wanted)
                return changed, deleted, marked
        return None, (), _new_rows(previous.result.arrow(), table)

    def _changed_keys(
        self, result: IQResult, old: int, new: int
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """The keys versions ``old+1..new`` changed within the query's keys, and those
        whose last change deleted them; ``None`` when the store cannot say."""
        if ChangesQuery not in self.manifest.kind.query_types:
            return None
        changes = ChangesQuery.between(old, new)
        query = result.query
        if isinstance(query, KeyQuery):
            changes = changes.with_range(query.key, query.key)
        elif isinstance(query, RangeQuery):
            changes = changes.with_range(query.lower_bound, query.upper_bound)
        elif isinstance(query, PrefixScanQuery) and query.prefix_serde is None:
            changes = changes.with_prefix(query.prefix)
        request = StateQueryRequest.in_store(self.store).with_query(changes)
        if self.command.partitions is not None:
            request = request.with_partitions(self.command.partitions)
        try:
            answer = self.session.engine.query(request)
        except (ValueError, TypeError, LookupError):
            return None
        last: dict[Any, tuple[Any, str]] = {}
        for qr in answer.partition_results.values():
            if qr.is_failure:
                return None  # a version retention removed: compare rows instead
            for change in qr.result or ():
                last[_token(change.key)] = (change.key, change.kind)
        changed = tuple(key for key, _ in last.values())
        deleted = tuple(key for key, kind in last.values() if kind == "delete")
        return changed, deleted

    # -- position and lag --------------------------------------------------------------------
    def _position_and_lag(self) -> tuple[str, str]:
        try:
            infos = self.session.engine.lags(stores=[self.store])[self.store]
        except Exception as exc:  # the header is extra: the result still shows
            return "", f"unavailable ({type(exc).__name__})"
        position = Position.empty()
        for info in infos.values():
            position = position.merge(info.current_position)
        known = [info.offset_lag for info in infos.values()]
        if not known or all(info.end_position is None for info in infos.values()):
            lag = NO_SOURCE
        elif any(v is None for v in known):
            lag = "unknown"
        else:
            lag = f"{sum(known):,} records behind"  # type: ignore[arg-type]
        return compact_position(position), lag


def _token(value: Any) -> Any:
    """``value`` as something hashable that compares like it (a JSON key may be a list)."""
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=repr)
    return value


def _row_keys(table: Any, manifest: Any) -> list[Any] | None:
    """Each row's key as the engine gives keys (a composite key as a tuple), read back
    from the result's key columns (store/rows.py's layout); ``None``: no key column."""
    rows = RowSchema(manifest)
    names = table.column_names
    if not rows.tuple_key_columns and rows.key_column in names:
        return table.column(rows.key_column).to_pylist()
    elements = []
    while rows.key_element_column(len(elements)) in names:
        elements.append(table.column(rows.key_element_column(len(elements))).to_pylist())
    if not elements:
        return None
    return [_bare(tuple(parts)) for parts in zip(*elements, strict=True)]


def _bare(parts: tuple[Any, ...]) -> Any:
    """A composite key's elements with the missing (shorter tuples') trailing ones off;
    a single element is the bare key (the ``ordered`` serde's 1-tuple)."""
    while parts and parts[-1] is None:
        parts = parts[:-1]
    return parts[0] if len(parts) == 1 else parts


def _new_rows(before: Any, after: Any) -> tuple[int, ...]:
    """Rows of ``after`` not in ``before`` (compared whole, every column)."""
    seen = {_token(tuple(row.values())) for row in before.to_pylist()}
    rows = after.to_pylist()
    return tuple(i for i, row in enumerate(rows) if _token(tuple(row.values())) not in seen)
