"""A local, broker-less stand-in for a Kafka topic that Spark can read like ``format("kafka")``.

There is no Kafka broker in a notebook or a CI job, but iqkit's pipelines are written
against Kafka-shaped input (``topic``, ``partition``, ``offset`` columns; positions and
lag in Kafka's offset convention). :class:`LocalKafkaTopic` keeps a topic as immutable
Parquet files in one folder, so a Spark *file source* can stream it with real,
checkpointed progress, and the DataFrame it yields has exactly the columns of Spark's
Kafka source. See ``docs/KAFKA_LOCAL.md`` for what it mirrors, what it does not, and how
to swap in a real broker.

On disk (``<folder>/<topic>/``)::

    _topic.json                                    topic name, partition count, format
    _produce.lock                                  flock held while a produce appends
    p00000-00000000000000000000-00000000000000000009.parquet   partition 0, offsets 0..9
    p00000-00000000000000000010-00000000000000000010.parquet   partition 0, offset 10
    p00001-00000000000000000000-00000000000000000004.parquet   partition 1, offsets 0..4

Every ``produce`` call appends one new file per partition it touches. The file name
encodes the partition and the inclusive offset range, so the log-end offsets are a
directory listing away (no data is read) and are right across processes and instances:
nothing is remembered in memory. Files are written under a dot-name, fsynced, and
renamed into place (readers never see half a file); names starting with ``_`` or ``.``
are ignored by Spark's file sources, and reads also filter on ``p*.parquet``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..query.position import Position
from ..query.window import to_epoch_millis
from ..store.encoding.partitioners import murmur2_partition
from ..store.locking import lock_file, unlock_file
from ..store.topic_files import DATA_GLOB, data_file_name, parse_data_file_name

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "CREATE_TIME",
    "KAFKA_SCHEMA",
    "KAFKA_SCHEMA_WITH_HEADERS",
    "LOG_APPEND_TIME",
    "LocalKafkaTopic",
    "RecordMetadata",
    "kafka_schema",
]

#: ``timestampType`` values, as in Kafka's ``TimestampType`` enum (``NO_TIMESTAMP_TYPE``
#: is -1). Every record produced here is ``CREATE_TIME``: Kafka producers stamp records
#: with their own clock when no timestamp is given, and a topic's default
#: ``message.timestamp.type`` is ``CreateTime``.
CREATE_TIME = 0
LOG_APPEND_TIME = 1

FORMAT_VERSION = 1
META_FILE = "_topic.json"
LOCK_FILE = "_produce.lock"
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")  # Kafka's legal topic characters
_MAX_TOPIC_LENGTH = 249  # Kafka's limit
# Spark's file source forgets files older than ``maxFileAge`` (default 7 days) relative
# to the newest file it has seen, and with ``maxFilesPerTrigger`` that can skip a
# backlog. A Kafka consumer never skips records, so the stand-in effectively disables it.
_MAX_FILE_AGE = "36500d"


def kafka_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's Kafka source (``KafkaRecordToRowConverter``), all nullable.

    ``include_headers=True`` adds ``headers: array<struct<key: string, value: binary>>``,
    as ``option("includeHeaders", "true")`` does for ``format("kafka")``.
    """
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


KAFKA_SCHEMA = kafka_schema()
KAFKA_SCHEMA_WITH_HEADERS = kafka_schema(include_headers=True)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record landed, like the Java producer's ``RecordMetadata``.

    ``timestamp`` is epoch milliseconds (the record's own, or the producer's clock).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int


# A record after validation: key bytes, value bytes, timestamp ms, headers.
_Record = tuple[bytes | None, bytes | None, int, list[dict[str, Any]] | None]


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            # Kafka timestamps are epoch milliseconds; Spark reads Parquet
            # TIMESTAMP(MILLIS, UTC) as TimestampType.
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(header)),
        ]
    )


def _to_bytes(data: object, what: str) -> bytes | None:
    """str → UTF-8 (Kafka's ``StringSerializer``), bytes-likes as is, ``None`` stays null."""
    if data is None or type(data) is bytes:
        return data  # type: ignore[return-value]
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(
        f"record {what} must be str, bytes or None, got {type(data).__name__}; "
        f"serialize it first (e.g. json.dumps(...))"
    )


def _headers(headers: object) -> list[dict[str, Any]] | None:
    """Headers as ``[(key: str, value: str|bytes|None), ...]`` or a mapping; empty → null
    (Spark's Kafka source gives ``null`` for a record without headers)."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"record headers must be a list of (key, value) pairs or a mapping, "
            f"got {type(headers).__name__}"
        )
    out = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"a header must be a (key, value) pair, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header keys must be str, got {type(hkey).__name__}")
        out.append({"key": hkey, "value": _to_bytes(hvalue, "header value")})
    return out or None


def _normalize(record: object, now_ms: int) -> _Record:
    if isinstance(record, (str, bytes)) or not isinstance(record, Sequence):
        raise TypeError(
            f"a record is a (key, value), (key, value, timestamp) or "
            f"(key, value, timestamp, headers) tuple, got {record!r}"
        )
    if not 2 <= len(record) <= 4:
        raise TypeError(
            f"a record has 2 to 4 fields (key, value[, timestamp[, headers]]), "
            f"got {len(record)}: {record!r}"
        )
    key = _to_bytes(record[0], "key")
    value = _to_bytes(record[1], "value")
    ts = record[2] if len(record) > 2 else None
    if ts is None:
        ts_ms = now_ms
    else:
        ts_ms = to_epoch_millis(ts, "record timestamp")
        if ts_ms < 0:  # the Java producer rejects negative timestamps too
            raise ValueError(f"record timestamp must be >= 0 (epoch ms), got {ts_ms}")
    headers = _headers(record[3]) if len(record) > 3 else None
    return key, value, ts_ms, headers


def _check_topic(topic: object) -> str:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")
    if (
        not topic
        or topic in (".", "..")
        or len(topic) > _MAX_TOPIC_LENGTH
        or not _TOPIC_NAME.match(topic)
    ):
        raise ValueError(
            f"illegal topic name {topic!r}: Kafka allows 1-{_MAX_TOPIC_LENGTH} characters "
            f"from [a-zA-Z0-9._-], and not '.' or '..'"
        )
    return topic


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class _ProduceLock:
    """``flock`` on ``_produce.lock``: one appender at a time per topic, across processes
    (the kernel releases it if the holder dies)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._path = path
        self._timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> _ProduceLock:
        self._fd = lock_file(
            self._path,
            timeout=self._timeout,
            on_timeout=lambda _fd: TimeoutError(
                f"another producer held {self._path} for more than {self._timeout:g}s"
            ),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            unlock_file(self._fd)
            self._fd = None


class LocalKafkaTopic:
    """A Kafka-like topic kept as Parquet files under ``<folder>/<topic>/``.

    ``partitions`` creates the topic (or checks it against an existing one); ``None``
    opens an existing topic. Any number of instances, in any number of processes, may
    produce to and read the same topic: offsets come from the files on disk.

        topic = LocalKafkaTopic("data/kafka", "orders", partitions=4)
        topic.produce([("alice", '{"amount": 3}'), ("bob", '{"amount": 5}')])
        df = topic.read_stream(spark)          # same columns as format("kafka")
        topic.end_offsets()                    # {0: ..., 1: ..., 2: ..., 3: ...}
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        topic: str,
        partitions: int | None = None,
        *,
        lock_timeout: float = 30.0,
    ) -> None:
        self._topic = _check_topic(topic)
        if partitions is not None and (
            isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
        ):
            raise ValueError(f"partitions must be a positive int, got {partitions!r}")
        self._folder = Path(folder).absolute()
        self._path = self._folder / self._topic
        self._lock_timeout = lock_timeout
        self._round_robin = itertools.count()
        self._partitions = self._open_or_create(partitions)

    # -- metadata ----------------------------------------------------------------------

    def _open_or_create(self, partitions: int | None) -> int:
        meta = self._path / META_FILE
        if partitions is None:
            if not meta.exists():
                raise FileNotFoundError(
                    f"no topic {self._topic!r} in {self._folder}; pass partitions=N to create it"
                )
            return self._read_meta(meta)
        self._path.mkdir(parents=True, exist_ok=True)
        with _ProduceLock(self._path / LOCK_FILE, self._lock_timeout):
            if meta.exists():
                existing = self._read_meta(meta)
                if existing != partitions:
                    raise ValueError(
                        f"topic {self._topic!r} in {self._folder} has {existing} partitions, "
                        f"not {partitions} (changing the count would move keys between "
                        f"partitions; use another folder or topic)"
                    )
                return existing
            text = json.dumps(
                {"format": FORMAT_VERSION, "topic": self._topic, "partitions": partitions}
            )
            tmp = self._path / f".{META_FILE}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, meta)
            _fsync_dir(self._path)
            return partitions

    def _read_meta(self, meta: Path) -> int:
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
            fmt, topic, partitions = data["format"], data["topic"], data["partitions"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable topic metadata {meta}: {exc}") from exc
        if fmt != FORMAT_VERSION or topic != self._topic or not isinstance(partitions, int):
            raise ValueError(
                f"topic metadata {meta} does not describe topic {self._topic!r}: {data!r}"
            )
        return partitions

    # -- properties --------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def folder(self) -> Path:
        return self._folder

    @property
    def path(self) -> Path:
        """The directory Spark reads: ``<folder>/<topic>``."""
        return self._path

    # -- offsets -----------------------------------------------------------------------

    def _scan(self) -> tuple[dict[int, int], dict[int, str]]:
        """Log-end offset and newest file name per partition, from file names only."""
        ends = dict.fromkeys(range(self._partitions), 0)
        newest: dict[int, str] = {}
        with os.scandir(self._path) as entries:
            for entry in entries:
                parsed = parse_data_file_name(entry.name)
                if parsed is None:
                    continue
                p, _, last = parsed
                if p in ends and last + 1 > ends[p]:
                    ends[p] = last + 1
                    newest[p] = entry.name
        return ends, newest

    def end_offsets(self) -> dict[int, int]:
        """Log-end offset per partition (Kafka's convention: the offset the next record
        will get; ``0`` for an empty partition), like ``KafkaConsumer.endOffsets`` or
        ``AdminClient.listOffsets(OffsetSpec.latest())``. Reads file names, not data."""
        return self._scan()[0]

    def end_position(self) -> Position:
        """``{topic: {partition: log-end offset}}`` — the ``end`` that
        ``StateEngine.lags(end)`` and the streaming sink's recorded source end expect."""
        return Position.from_map({self._topic: self.end_offsets()})

    # -- producing ---------------------------------------------------------------------

    def _partition_for(self, key: bytes | None) -> int:
        if key is None:
            # Kafka's pre-2.4 DefaultPartitioner: round robin over the partitions.
            return next(self._round_robin) % self._partitions
        return murmur2_partition(key, self._partitions)

    def produce(
        self,
        records: Iterable[Sequence[Any]],
        *,
        partition: int | None = None,
    ) -> list[RecordMetadata]:
        """Append ``records`` and return where each landed, in input order.

        A record is ``(key, value)``, ``(key, value, timestamp)`` or ``(key, value,
        timestamp, headers)``: key and value are ``str`` (UTF-8), ``bytes`` or ``None``;
        the timestamp is epoch ms or a ``datetime`` (naive = UTC), ``None`` = now;
        headers are ``(str, str|bytes|None)`` pairs. ``partition`` sends every record to
        that partition; otherwise a keyed record goes where Kafka's default partitioner
        puts it (murmur2 of the key bytes) and a null key round-robins.

        Every record is validated before anything is written. Each touched partition gets
        one new file; offsets continue from what is on disk.
        """
        if partition is not None and (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition < self._partitions
        ):
            raise ValueError(
                f"partition must be in [0, {self._partitions}) for topic {self._topic!r}, "
                f"got {partition!r}"
            )
        now_ms = time.time_ns() // 1_000_000
        normalized = [_normalize(r, now_ms) for r in records]
        if not normalized:
            return []
        targets = [
            partition if partition is not None else self._partition_for(r[0]) for r in normalized
        ]
        by_partition: dict[int, list[int]] = {}
        for i, p in enumerate(targets):
            by_partition.setdefault(p, []).append(i)

        offsets = [0] * len(normalized)
        with _ProduceLock(self._path / LOCK_FILE, self._lock_timeout):
            ends, newest = self._scan()
            mtime_ns = self._next_mtime_ns(newest.values())
            staged: list[tuple[Path, Path]] = []
            try:
                for p in sorted(by_partition):
                    indexes = by_partition[p]
                    first = ends[p]
                    for n, i in enumerate(indexes):
                        offsets[i] = first + n
                    rows = [normalized[i] for i in indexes]
                    last = first + len(rows) - 1
                    final = self._path / data_file_name(p, first, last)
                    tmp = self._path / f".tmp-{p:05d}-{uuid.uuid4().hex}.parquet"
                    staged.append((tmp, final))
                    self._write_file(tmp, p, first, rows, mtime_ns)
                for tmp, final in staged:
                    if final.exists():  # cannot happen under the lock; never overwrite
                        raise FileExistsError(f"{final} already exists")
                    os.rename(tmp, final)
                _fsync_dir(self._path)
            finally:
                for tmp, _ in staged:
                    tmp.unlink(missing_ok=True)
        return [
            RecordMetadata(self._topic, targets[i], offsets[i], r[2])
            for i, r in enumerate(normalized)
        ]

    def _next_mtime_ns(self, newest_names: Iterable[str]) -> int:
        """A modification time later (by >= 1 ms, Hadoop's resolution) than every
        partition's newest file: Spark's file source takes files oldest first, so with
        ``maxFilesPerTrigger`` a partition's files are read in offset order."""
        now_ms = time.time_ns() // 1_000_000
        latest_ms = -1
        for name in newest_names:
            with contextlib.suppress(FileNotFoundError):  # files are never deleted
                latest_ms = max(latest_ms, (self._path / name).stat().st_mtime_ns // 1_000_000)
        return max(now_ms, latest_ms + 1) * 1_000_000

    def _write_file(
        self, tmp: Path, partition: int, first: int, rows: list[_Record], mtime_ns: int
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        n = len(rows)
        schema = _arrow_schema()
        table = pa.Table.from_arrays(
            [
                pa.array([r[0] for r in rows], pa.binary()),
                pa.array([r[1] for r in rows], pa.binary()),
                pa.array([self._topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(range(first, first + n), pa.int64()),
                pa.array([r[2] for r in rows], pa.timestamp("ms", tz="UTC")),
                pa.array([CREATE_TIME] * n, pa.int32()),
                pa.array([r[3] for r in rows], schema.field("headers").type),
            ],
            schema=schema,
        )
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.utime(tmp, ns=(mtime_ns, mtime_ns))

    # -- reading -----------------------------------------------------------------------

    def read_stream(
        self,
        spark: SparkSession,
        *,
        max_files_per_trigger: int | None = None,
        include_headers: bool = False,
    ) -> DataFrame:
        """A streaming DataFrame with the columns of ``spark.readStream.format("kafka")``.

        Progress is Spark's file-source progress, kept in the query's checkpoint: a
        restarted query reads only files it has not committed. Like ``startingOffsets
        = "earliest"``, a new query starts from offset 0. ``max_files_per_trigger``
        bounds a micro-batch in files (= produce calls per partition), the analogue of
        ``maxOffsetsPerTrigger``.
        """
        reader = (
            spark.readStream.schema(kafka_schema(include_headers))
            .option("pathGlobFilter", DATA_GLOB)
            .option("maxFileAge", _MAX_FILE_AGE)
        )
        if max_files_per_trigger is not None:
            if (
                isinstance(max_files_per_trigger, bool)
                or not isinstance(max_files_per_trigger, int)
                or max_files_per_trigger < 1
            ):
                raise ValueError(
                    f"max_files_per_trigger must be a positive int, got {max_files_per_trigger!r}"
                )
            reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
        return reader.parquet(str(self._path))

    def read_batch(self, spark: SparkSession, *, include_headers: bool = False) -> DataFrame:
        """Everything produced so far, like ``spark.read.format("kafka")`` with the default
        ``startingOffsets="earliest"``, ``endingOffsets="latest"``. Row order is not
        defined; sort by ``partition, offset`` when it matters."""
        return (
            spark.read.schema(kafka_schema(include_headers))
            .option("pathGlobFilter", DATA_GLOB)
            .parquet(str(self._path))
        )

    def __repr__(self) -> str:
        return (
            f"LocalKafkaTopic({os.fspath(self._folder)!r}, {self._topic!r}, "
            f"partitions={self._partitions})"
        )
