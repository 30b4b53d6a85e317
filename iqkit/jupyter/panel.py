"""``iqkit.panel()``: the widget query builder (``builder.py``) in a notebook cell, over
the ``%iq`` magic's session when one is loaded.

Its own module because it sits above both the session and the magic, while the session
builds the builder's panels itself (``%iq panel``): one module holding both would import
the session back. The builder's names are re-exported for ``iqkit.jupyter.panel`` users.
"""

from __future__ import annotations

from typing import Any

from IPython import get_ipython

from .builder import MISSING_IPYWIDGETS, IQPanel, split_keys
from .magic import live_session
from .session import IQSession

__all__ = ["MISSING_IPYWIDGETS", "IQPanel", "panel", "split_keys"]


def panel(root: Any = None, **session_options: Any) -> IQPanel:
    """``iqkit.panel()``: the query builder in a notebook cell.

    With no arguments in a notebook where ``%load_ext iqkit`` ran, the panel shares the
    magic's session (its root, ``%iq trace``, named results); otherwise it opens its own
    ``IQSession(root, **session_options)`` (root: ``$IQKIT_ROOT`` or ``./stores``).
    """
    session = live_session(get_ipython()) if root is None and not session_options else None
    if session is None:
        session = IQSession(root, **session_options)
    return IQPanel(session)
