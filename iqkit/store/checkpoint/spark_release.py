"""Which Spark release line ran a checkpoint: named in every refusal of something iqkit
does not know yet (a newer operator, a newer file format).

Why: Spark records no version of its own in a checkpoint, yet "not supported yet" is only
useful when it says which Spark wrote the thing. The offsets log's metadata line does
tell: it carries the query's stream-relevant SQL settings (``conf``), every one of them,
written by the Spark that ran the batch (a restarted query's next entry has the settings
of the Spark it restarted on), and each release line added some. So the newest entry's
setting names identify the line that ran the newest batch. Checked against checkpoints
of 3.5.9, 4.0.5, 4.1.4, 4.2.1 and 4.3.0: 4.0 and 4.1 record the same names, so they are
told apart no further than "4.0 or 4.1".

Read only on the way to a refusal: it costs nothing when all is well.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator

from ...errors import IqkitError
from ..objects import ObjectStore
from .codecs import UnknownFormatError
from .shape import UnsupportedStateError

__all__ = ["NEWEST_KNOWN", "attributed", "release_of", "written_by"]

#: The newest release line whose checkpoints iqkit has been checked against.
NEWEST_KNOWN = "4.3"

#: Each line's own additions to the settings the offsets log records, newest first.
_ADDED_BY = (
    (
        "4.3",
        {
            "spark.sql.dropDuplicates.deterministicKeyOrder.enabled",
            "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled",
        },
    ),
    (
        "4.2",
        {
            "spark.sql.function.protobufExtensions.enabled",
            "spark.sql.streaming.queryEvolution.enableSourceEvolution",
            "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion",
            "spark.sql.streaming.stateStore.rowChecksum.enabled",
        },
    ),
    ("4.0 or 4.1", {"spark.sql.streaming.stateStore.encodingFormat"}),
)

#: What 3.5 records (and 4.3 still does): anything outside these and the additions above
#: is a newer line's.
_BASE = {
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan",
    "spark.sql.shuffle.partitions",
    "spark.sql.streaming.aggregation.stateFormatVersion",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion",
    "spark.sql.streaming.join.stateFormatVersion",
    "spark.sql.streaming.multipleWatermarkPolicy",
    "spark.sql.streaming.stateStore.compression.codec",
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion",
    "spark.sql.streaming.statefulOperator.useStrictDistribution",
}
_KNOWN = _BASE.union(*(names for _, names in _ADDED_BY))
_BATCH = re.compile(r"[0-9]+")
_NAMED = "; the checkpoint was written by "


def release_of(settings: Iterable[str]) -> str:
    """The release line that records exactly these setting names in its offsets log:
    "Spark 4.3", "Spark 4.0 or 4.1", "Spark 3.5 or earlier", or a newer Spark's."""
    names = set(settings)
    if names - _KNOWN:
        return (
            f"a Spark newer than {NEWEST_KNOWN} (its offsets log records settings "
            f"{NEWEST_KNOWN} does not)"
        )
    for line, added in _ADDED_BY:
        if names & added:
            return f"Spark {line}"
    return "Spark 3.5 or earlier"


def written_by(objects: ObjectStore) -> str | None:
    """Which Spark ran the checkpoint's newest batch, as its newest offsets log entry
    tells (``release_of``); ``None`` when no entry can be read (nothing to say)."""
    try:
        batches = [
            int(name)
            for key in objects.list("offsets")
            if _BATCH.fullmatch(name := key.rsplit("/", 1)[-1])
        ]
        if not batches:
            return None
        lines = objects.read_bytes(f"offsets/{max(batches)}").decode("utf-8", "replace")
    except (IqkitError, OSError):
        return None
    header, _, rest = lines.partition("\n")
    if re.fullmatch(r"v[0-9]{1,9}", header.strip()) and header.strip() != "v1":
        return f"a Spark newer than {NEWEST_KNOWN} (its offsets log is format {header.strip()})"
    try:
        conf = json.loads(rest.split("\n", 1)[0]).get("conf")
    except (ValueError, AttributeError):
        return None
    return release_of(conf) if isinstance(conf, dict) and conf else None


@contextlib.contextmanager
def attributed(objects: ObjectStore) -> Iterator[None]:
    """Re-raise a refusal of something unknown (``UnsupportedStateError``,
    ``UnknownFormatError``) with the Spark that wrote the checkpoint named at its end:
    the same class, one line."""
    try:
        yield
    except (UnsupportedStateError, UnknownFormatError) as exc:
        text = str(exc)
        if _NAMED in text:  # named already, by an outer call's inner one
            raise
        who = written_by(objects)
        if who is None:
            raise
        raise type(exc)(f"{text}{_NAMED}{who}") from None
