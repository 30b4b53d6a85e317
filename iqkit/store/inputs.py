"""Which input partitions feed a store partition: the one rule behind position bounds,
lag and ``StoreWriter.record_applied``.

A ``murmur2`` store is keyed by its own hash, so a record of any input partition can land
in any store partition: every store partition reads every input partition, and every
input component binds it. An ``explicit`` store (KIP-759: the data is already
partitioned) is co-partitioned with its input, so store partition ``p`` reads input
partition ``p`` only (Kafka's rule). Everything that asks "does this input component
concern this store partition?" calls :func:`binds`, so the bound check, the lag sums and
the writer can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..query.position import Position
from .encoding.partitioners import Partitioner

__all__ = [
    "binding_components",
    "binds",
    "is_up_to",
    "offset_lag",
    "records_behind",
    "store_partitions_fed_by",
]


def binds(partitioner: Partitioner, input_partition: int, store_partition: int) -> bool:
    """Whether input partition ``input_partition`` feeds store partition ``store_partition``."""
    return partitioner.inputs_feed_every_partition or input_partition == store_partition


def store_partitions_fed_by(
    partitioner: Partitioner, input_partition: int, partitions: int
) -> list[int]:
    """The store partitions (of ``partitions``) that input partition ``input_partition``
    feeds: all of a ``murmur2`` store's, one or none of an ``explicit`` store's."""
    return [p for p in range(partitions) if binds(partitioner, input_partition, p)]


def binding_components(
    position: Position, store_partition: int, partitioner: Partitioner
) -> Iterator[tuple[str, int, int]]:
    """``(topic, input partition, offset)`` of the components of ``position`` (a bound,
    or end offsets) that bind ``store_partition``."""
    for topic in position.topics:
        for in_p, offset in position.partition_positions(topic).items():
            if binds(partitioner, in_p, store_partition):
                yield topic, in_p, offset


def is_up_to(
    current: Position, bound: Position, store_partition: int, partitioner: Partitioner
) -> bool:
    """Whether a partition at ``current`` has reached every binding component of
    ``bound``; a component it has no offset for is not reached (``NOT_UP_TO_BOUND``)."""
    for topic, in_p, offset in binding_components(bound, store_partition, partitioner):
        have = current.offset(topic, in_p)
        if have is None or have < offset:
            return False
    return True


def records_behind(end_offset: int, current_offset: int | None) -> int:
    """Records of one input partition not yet applied: ``max(0, end - current - 1)``,
    ``end`` a log-end offset (the next offset to be written, Kafka's convention) and
    ``current`` the last offset applied (``None``: nothing applied, counted as -1)."""
    return max(0, end_offset - (-1 if current_offset is None else current_offset) - 1)


def offset_lag(
    current: Position, end: Position, store_partition: int, partitioner: Partitioner
) -> int:
    """``LagInfo.offset_lag``: :func:`records_behind` summed over the components of
    ``end`` that bind ``store_partition`` (the components the bound check uses)."""
    return sum(
        records_behind(end_offset, current.offset(topic, in_p))
        for topic, in_p, end_offset in binding_components(end, store_partition, partitioner)
    )
