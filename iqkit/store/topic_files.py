"""How a local stand-in Kafka topic names its data files: one home for the rule, which the
topic uses to write them (``spark/kafka_local.py``) and the checkpoint reader uses to
read positions off a file source's progress (``store/checkpoint/positions.py``).

A topic is a folder ``<folder>/<topic>/``; each produce call appends one immutable
Parquet file per partition it touches, named after the partition and the inclusive range
of offsets it holds: ``p00000-00000000000000000000-00000000000000000009.parquet`` is
partition 0, offsets 0 to 9. So a listing of names alone gives every partition's
log-end offset, and a file's name alone says which offsets reading it consumed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["DATA_GLOB", "data_file_name", "log_end_offsets", "parse_data_file_name"]

#: What Spark's file source is told to read (names starting with ``_`` or ``.`` are
#: never data: metadata, locks, files being written).
DATA_GLOB = "p*.parquet"
_DATA_NAME = re.compile(r"^p(\d+)-(\d+)-(\d+)\.parquet$")


def data_file_name(partition: int, first: int, last: int) -> str:
    """The name of partition ``partition``'s file holding offsets ``first``..``last``."""
    return f"p{partition:05d}-{first:020d}-{last:020d}.parquet"


def parse_data_file_name(name: str) -> tuple[int, int, int] | None:
    """``(partition, first offset, last offset)`` of a data file's base name; ``None``
    for any other name."""
    m = _DATA_NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def log_end_offsets(names: Iterable[str]) -> dict[int, int]:
    """Per partition that has a file among ``names``, its log-end offset (Kafka's
    convention: the offset the next record gets, one past the last file's last)."""
    ends: dict[int, int] = {}
    for name in names:
        parsed = parse_data_file_name(name)
        if parsed is not None:
            p, _, last = parsed
            ends[p] = max(ends.get(p, 0), last + 1)
    return ends
