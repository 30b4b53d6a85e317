"""The registry of storage formats: one name per implementation, and which one a root
gets (``format_for``), chosen once per root and then only called through
``format.StoreFormat``.

Two formats: the SST chain (``chain.format.ChainFormat``), iqkit's own, on every root
iqkit writes; and Spark's Structured Streaming checkpoints
(``checkpoint.format.CheckpointFormat``), read-only, for a root that is a checkpoint
folder. The folder format of earlier iqkits is retired: its stores are refused in one
line naming ``python -m iqkit migrate`` (``format.is_folder_store``). A new format is one
entry here and one class.
"""

from __future__ import annotations

from .chain.format import ChainFormat
from .checkpoint.format import CheckpointFormat
from .format import StoreFormat
from .roots import StoreRoot

__all__ = ["DEFAULT_FORMAT", "FORMATS", "format_for"]

#: Every format by its name.
FORMATS: dict[str, type[StoreFormat]] = {
    ChainFormat.name: ChainFormat,
    CheckpointFormat.name: CheckpointFormat,
}
#: The format a root gets when none is named.
DEFAULT_FORMAT = ChainFormat.name


def format_for(root: StoreRoot, name: str | None = None) -> StoreFormat:
    """The format ``name`` on the parsed ``root``; by default a checkpoint folder's is the
    checkpoint format (so a write there is refused in one line, never mixed into Spark's
    files), any other root's the chain format. An unknown name is one-line
    ``ValueError`` naming the known ones."""
    if name is None:
        name = CheckpointFormat.name if CheckpointFormat.recognises(root) else DEFAULT_FORMAT
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown store format {name!r} (known: {', '.join(sorted(FORMATS))})"
        ) from None
    return cls(root)
