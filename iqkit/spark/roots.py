"""A store root as Spark jobs pass it to their tasks: absolute, resolved on the driver.

Why: Spark's Python workers run in the JVM's working folder, not the driver's current
one (a notebook that ``os.chdir``-ed, a test in a temporary folder), so a relative root
would name a different folder in the tasks than on the driver — staged partitions would
land where the commit does not look for them.
"""

from __future__ import annotations

import os

__all__ = ["driver_root"]


def driver_root(root: str | os.PathLike[str]) -> str:
    """``root`` as an absolute local path (``file:`` URIs accepted); other URLs are refused
    with one line, never treated as a local folder."""
    text = os.fspath(root)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif text.startswith("file:"):
        text = text[len("file:") :]
    elif "://" in text:
        raise ValueError(
            f"iqkit: root {text!r} is not a file-system path; every executor must see the "
            "root as a local or shared POSIX path"
        )
    return os.path.abspath(os.path.expanduser(text))
