"""Typing the text of a ``%iq`` command: keys by the store's key serde, times, bounds.

The same rules serve the magic and the panel (whose fields are text too):

* ``:name`` is the notebook variable ``name``, used as is (any type the serde takes).
* keys are parsed by the key serde's ``parse_text``: ``42`` is an int in an ``int32``
  store, ``0x0a`` bytes in a ``bytes`` store, ``[1, "a"]`` the tuple ``(1, 'a')`` in an
  ``ordered`` store. A ``json`` store takes JSON literals, and a bare word that is not
  JSON as a string (what a user typing ``alice`` means), the ``ordered`` rule.
* times are epoch milliseconds, ISO-8601 (``2024-05-01T12:00``, naive = UTC), ``now``, or
  ``now-15m`` (units ``ms s m h d``).
* bounds are ``topic:partition=offset,...`` or ``:name`` holding a ``Position``, a
  ``PositionBound``, a result (its position: read-your-writes across cells), or a map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from IPython.core.error import UsageError

from ..query.position import Position, PositionBound
from ..store.encoding.ordered import short_repr
from ..store.encoding.serdes import TextTooDeepError, get_serde
from ..store.manifest import StoreManifest
from .parse import parse_bound

__all__ = ["bound_value", "key_value", "time_value", "variable"]

_MISSING = object()


def variable(text: str, namespace: Mapping[str, Any], what: str) -> Any:
    """The notebook variable named by ``:name``."""
    name = text[1:]
    value = namespace.get(name, _MISSING)
    if value is _MISSING:
        raise UsageError(f"%iq: {what} {text}: no variable {name!r} in the notebook")
    return value


def key_value(text: str, manifest: StoreManifest, namespace: Mapping[str, Any]) -> Any:
    """A key (or prefix) typed by the store's key serde."""
    if text.startswith(":") and text[1:].isidentifier():
        return variable(text, namespace, "key")
    serde = get_serde(manifest.key_serde)
    try:
        return serde.parse_text(text)
    except ValueError as exc:
        if manifest.key_serde == "json" and not isinstance(exc, TextTooDeepError):
            return text  # a bare word in a JSON-keyed store: the string the user typed
        raise UsageError(
            f"%iq: key {short_repr(text)} does not fit store {manifest.name!r} "
            f"(key serde {manifest.key_serde}): {exc}"
        ) from None


_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(\d+)\s*(ms|s|m|h|d))?$")
_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_value(text: str, namespace: Mapping[str, Any], *, now: datetime | None = None) -> Any:
    """Epoch ms (int) or an aware ``datetime`` from a time text."""
    text = text.strip()
    if text.startswith(":") and text[1:].isidentifier():
        return variable(text, namespace, "time")
    m = _RELATIVE.match(text)
    try:
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if m:
            moment = now or datetime.now(UTC)
            if m.group(1):
                delta = timedelta(milliseconds=int(m.group(2)) * _UNITS[m.group(3)])
                moment = moment + delta if m.group(1) == "+" else moment - delta
            return moment
    except (ValueError, OverflowError):  # int() of 4301+ digits; beyond datetime's years
        raise UsageError(f"%iq: time {short_repr(text)} is out of range") from None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"%iq: time {text!r} is not epoch milliseconds, ISO-8601 (2024-05-01T12:00) or now-15m"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def bound_value(texts: tuple[str, ...], namespace: Mapping[str, Any]) -> PositionBound:
    """Merge every ``--bound`` into one bound."""
    position = Position.empty()
    for text in texts:
        position = position.merge(_one_bound(text, namespace))
    return PositionBound.at(position)


def _one_bound(text: str, namespace: Mapping[str, Any]) -> Position:
    if not text.startswith(":"):
        return parse_bound(text)
    value = variable(text, namespace, "--bound")
    if isinstance(value, PositionBound):
        return value.position
    if isinstance(value, Position):
        return value
    position = getattr(value, "position", None)  # a result: IQResult or StateQueryResult
    if isinstance(position, Position):
        return position
    if isinstance(value, Mapping):
        try:
            return Position.from_map(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%iq: --bound {text}: not a position map: {exc}") from None
    raise UsageError(
        f"%iq: --bound {text}: expected a Position, PositionBound, result or "
        f"{{topic: {{partition: offset}}}} map, got {type(value).__name__}"
    )
