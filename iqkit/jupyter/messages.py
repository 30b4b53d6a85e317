"""Small display objects for notebook output that is text, not a table.

Each has both ``_repr_html_`` (Jupyter) and ``__repr__`` (terminals, tests, logs): the
pattern JupySQL's display objects use, so a returned message shows well everywhere
and a test can compare it as a string.
"""

from __future__ import annotations

import html

__all__ = ["Message"]


class Message:
    """A line or block of text: ``%iq open``'s confirmation, ``%iq help``'s usage."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre class='iqkit-message'>{html.escape(self.text)}</pre>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)
