"""The registry of storage formats: one name per implementation, and which one a root
gets (``format_for``), chosen once per root and then only called through
``format.StoreFormat``.

One format is implemented: the SST chain (``chain_format.ChainFormat``), on every root.
The folder format of earlier iqkits is retired: its stores are refused in one line naming
``python -m iqkit migrate`` (``format.is_folder_store``). A new format (a read-only one
reading Spark's streaming checkpoints is next) is one entry here and one class.
"""

from __future__ import annotations

from .chain.format import ChainFormat
from .format import StoreFormat
from .roots import StoreRoot

__all__ = ["DEFAULT_FORMAT", "FORMATS", "format_for"]

#: Every format by its name.
FORMATS: dict[str, type[StoreFormat]] = {ChainFormat.name: ChainFormat}
#: The format a root gets when none is named.
DEFAULT_FORMAT = ChainFormat.name


def format_for(root: StoreRoot, name: str = DEFAULT_FORMAT) -> StoreFormat:
    """The format ``name`` (default: the chain format) on the parsed ``root``; an
    unknown name is one-line ``ValueError`` naming the known ones."""
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown store format {name!r} (known: {', '.join(sorted(FORMATS))})"
        ) from None
    return cls(root)
