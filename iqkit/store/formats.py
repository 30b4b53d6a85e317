"""The registry of storage formats: one name per implementation, and which one a root
gets (``format_for``), chosen once per root and then only called through
``format.StoreFormat``.

Two formats: the SST chain (``chain.format.ChainFormat``), iqkit's own, on every root
iqkit writes; and Spark's Structured Streaming checkpoints
(``checkpoint.format.CheckpointFormat``), read-only, for a root that is a checkpoint
folder. The folder format of earlier iqkits is retired: its stores are refused in one
line naming ``python -m iqkit migrate`` (``format.is_folder_store``). A new format is one
entry here and one class.

A format's module is imported when a root first gets that format, never for the
registry itself: the checkpoint reader's modules load numpy and pyarrow, which a script
writing an iqkit root never needs (start-up time: ``import iqkit`` and a process's first
commit). Telling a checkpoint folder apart takes only ``checkpoint.layout``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from .checkpoint.layout import is_checkpoint_root
from .format import StoreFormat
from .roots import StoreRoot

__all__ = ["DEFAULT_FORMAT", "FORMATS", "format_for"]



def _chain() -> type[StoreFormat]:
    from .chain.format import ChainFormat

    return ChainFormat


def _checkpoint() -> type[StoreFormat]:
    from .checkpoint.format import CheckpointFormat

    return CheckpointFormat


#: Each format's name -> what imports its class.
_IMPLEMENTATIONS: dict[str, Callable[[], type[StoreFormat]]] = {
    "chain": _chain,
    "spark-checkpoint": _checkpoint,
}
#: The format a root gets when none is named.
DEFAULT_FORMAT = "chain"
#: The format of a root that is a checkpoint folder.
CHECKPOINT_FORMAT = "spark-checkpoint"


class _Formats(Mapping[str, type[StoreFormat]]):
    """Every format's class by its name, its module imported on first lookup."""

    def __getitem__(self, name: str) -> type[StoreFormat]:
        cls = _IMPLEMENTATIONS[name]()
        assert cls.name == name, f"{cls.__name__}.name is {cls.name!r}, registered as {name!r}"
        return cls

    def __iter__(self) -> Iterator[str]:
        return iter(_IMPLEMENTATIONS)

    def __len__(self) -> int:
        return len(_IMPLEMENTATIONS)


#: Every format by its name.
FORMATS: Mapping[str, type[StoreFormat]] = _Formats()


def format_for(root: StoreRoot, name: str | None = None) -> StoreFormat:
    """The format ``name`` on the parsed ``root``; by default a checkpoint folder's is the
    checkpoint format (so a write there is refused in one line, never mixed into Spark's
    files), any other root's the chain format. An unknown name is one-line
    ``ValueError`` naming the known ones."""
    if name is None:
        name = CHECKPOINT_FORMAT if is_checkpoint_root(root) else DEFAULT_FORMAT
    if name not in _IMPLEMENTATIONS:
        raise ValueError(
            f"unknown store format {name!r} (known: {', '.join(sorted(FORMATS))})"
        )
    return FORMATS[name](root)
