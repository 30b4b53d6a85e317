"""How far a store partition is behind its inputs (KIP-535's ``LagInfo``)."""

from __future__ import annotations

from dataclasses import dataclass

from .position import Position

__all__ = ["NO_SOURCE", "LagInfo"]

#: What iqkit's tables and the CLI say for a store whose lag is unknown because its
#: writer recorded no source end offsets (a batch ``write_store`` has no source):
#: words, because an unknown lag must never read as 0 nor as rows of nulls.
NO_SOURCE = "no source recorded"


@dataclass(frozen=True, slots=True)
class LagInfo:
    """The lag of one store partition, as reported by ``StateEngine.lags``.

    ``end_position`` holds the inputs' log-end offsets, or ``None`` when they are not
    known; then ``offset_lag`` is ``None`` too, because an unknown lag must never be
    shown as zero.  ``offset_lag`` counts records not yet applied, summed over the input
    components that feed this partition.
    """

    store: str
    partition: int
    current_position: Position
    end_position: Position | None
    offset_lag: int | None

    @property
    def is_known(self) -> bool:
        """True when the lag could be computed (the end position was known)."""
        return self.offset_lag is not None
