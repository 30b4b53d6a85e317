"""Parameter values for each statement of one query: ``$name`` from a dict (or, with
none given, from the notebook's namespace) and ``?`` from a list. Names come from
DuckDB's own parser (``Statement.named_parameters``); no value is spliced into SQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import SQLError


def bind_parameters(
    statements: Sequence[Any],
    params: Mapping[str, Any] | Sequence[Any] | None,
    ns: Mapping[str, Any] | None,
) -> list[Mapping[str, Any] | Sequence[Any] | None]:
    """The parameter values for each statement (``None``: it takes none)."""
    named = [{p for p in st.named_parameters if not p.isdigit()} for st in statements]
    positional = [any(p.isdigit() for p in st.named_parameters) for st in statements]
    if params is None:
        out: list[Mapping[str, Any] | Sequence[Any] | None] = []
        for names in named:
            if not names or ns is None:
                out.append(None)  # DuckDB reports missing values itself
                continue
            missing = sorted(n for n in names if n not in ns)
            if missing:
                raise SQLError(
                    f"parameter ${missing[0]}: no variable named {missing[0]!r} in the "
                    "notebook (define it, or pass params=)"
                )
            out.append({n: _param(ns[n]) for n in sorted(names)})
        return out
    if isinstance(params, Mapping):
        wanted = set().union(*named)
        unused = sorted(str(k) for k in params if k not in wanted)
        if unused:
            where = f"uses ${', $'.join(sorted(wanted))}" if wanted else "has no $name parameters"
            raise SQLError(f"parameter(s) {', '.join(unused)} not used: the SQL {where}")
        missing = sorted(n for n in wanted if n not in params)
        if missing:
            raise SQLError(f"no value for parameter ${missing[0]} (params has no {missing[0]!r})")
        return [{n: _param(params[n]) for n in sorted(names)} if names else None for names in named]
    if isinstance(params, str | bytes) or not isinstance(params, Sequence):
        raise SQLError(
            "params must be a dict (for $name placeholders) or a list (for ?), "
            f"got {type(params).__name__}"
        )
    takers = [i for i, flag in enumerate(positional) if flag]
    if len(takers) > 1:
        raise SQLError(
            "positional parameters (?) in several statements are ambiguous: "
            "use $name placeholders with a dict"
        )
    target = takers[0] if takers else len(statements) - 1
    values = [_param(v) for v in params]
    return [values if i == target else None for i in range(len(statements))]


def _param(value: Any) -> Any:
    """Quirk: DuckDB cannot bind numpy scalars ("Unable to transform python value of type
    numpy.int64"), which is what ``df["x"].max()`` returns: bind the Python value."""
    return value.item() if isinstance(value, np.generic) else value
