"""Jupyter: the ``%iq`` magics, notebook result objects, rendering and the widget panel.

``%load_ext iqkit`` (or ``%load_ext iqkit.jupyter``) registers the magics. Modules:
``command`` (the normalised command), ``parse`` (line → command), ``values`` (text →
typed keys, times, bounds), ``session`` (executing commands), ``magic`` (the thin
IPython layer), ``result``/``render`` (what a query returns and how it looks),
``history`` (version results' rows, a key's history plotted), ``watch`` (``%iq watch``),
``complete`` (tab completion), ``builder`` (the widget query builder), ``panel``
(``iqkit.panel()``), ``testing`` (a shell for tests). docs/ARCHITECTURE.md gives the
order in which they may import each other (no cycles).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext iqkit`` and ``%reload_ext iqkit``."""
    from .magic import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .magic import unload

    unload(ipython)
