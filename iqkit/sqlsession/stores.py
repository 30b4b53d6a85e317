"""A store as a DuckDB table: a re-scannable Arrow stream of ``store_batches`` that DuckDB
pulls as it scans (a store is never materialised in pandas first), reporting progress,
stopping on cancel, and handing a complete scan to the snapshot cache."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from .snapshots import SnapshotCache, SnapshotKey

if TYPE_CHECKING:
    from ..engine import StateEngine


class StoreStream:
    """A store as a re-scannable Arrow stream (the Arrow PyCapsule protocol).

    DuckDB calls ``__arrow_c_stream__`` when the name is registered and then twice per
    scan (once to bind, for the schema only, once to read), so a store can appear twice
    in one statement (a self-join), which a registered ``RecordBatchReader`` (read once)
    could not. The first call opens a ``store_batches`` reader for the schema; every
    stream handed out after that opens nothing until DuckDB pulls its first batch, and
    the first stream pulled reads that first reader, so a statement that scans a store
    once reads it once, from the version the binder saw. Later streams (a self-join) are
    given that schema, so they cannot disagree with what DuckDB bound.

    ``check_cancel`` raises when the query was interrupted; ``failed(store, exc)`` is told
    of every exception raised here, because DuckDB reports one only as a failed stream
    read (with a Python traceback in its message); ``progress(store, rows)`` is called
    after each batch.
    """

    def __init__(
        self,
        engine: StateEngine,
        store: str,
        key: SnapshotKey | None,
        *,
        cache: SnapshotCache,
        check_cancel: Callable[[], None],
        failed: Callable[[str, BaseException], None],
        progress: Callable[[str, int], None] | None = None,
    ) -> None:
        self._engine = engine
        self.store = store
        self._key = key  # None: nothing published, or the version could not be read
        self._cache = cache
        self._check_cancel = check_cancel
        self._failed = failed
        self._progress = progress
        self._schema: pa.Schema | None = None
        self._spare: pa.RecordBatchReader | None = None
        self._lock = threading.Lock()

    def _open(self, schema: pa.Schema | None = None) -> pa.RecordBatchReader:
        from ..tables import store_batches

        return store_batches(self._engine, self.store, schema=schema)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        if self._schema is None:
            try:
                self._check_cancel()
                self._spare = self._open()
            except BaseException as e:
                # DuckDB reports this as "reading the schema ... failed: <repr>"; keep the
                # real exception for the session's message (SIGINT lands here too).
                self._failed(self.store, e)
                raise
            self._schema = self._spare.schema
        stream = pa.RecordBatchReader.from_batches(self._schema, self._batches())
        return stream.__arrow_c_stream__(requested_schema)

    def _batches(self) -> Iterator[pa.RecordBatch]:
        reader = None
        try:
            with self._lock:
                reader, self._spare = self._spare, None
            if reader is None:
                reader = self._open(self._schema)
            cache, progress = self._cache, self._progress
            kept: list[pa.RecordBatch] | None = [] if self._key and cache.budget else None
            size = 0
            for batch in reader:
                self._check_cancel()  # a Ctrl-C between DuckDB's checks
                if progress is not None:
                    progress(self.store, batch.num_rows)
                if kept is not None:
                    size += batch.nbytes
                    kept = kept if size <= cache.budget else None
                    if kept is not None:
                        kept.append(batch)
                yield batch
            if kept is not None and self._key is not None:  # a complete scan
                cache.keep(self._key, pa.Table.from_batches(kept, reader.schema))
        except GeneratorExit:  # DuckDB stopped reading early (LIMIT): not an error
            raise
        except BaseException as e:
            # DuckDB reports an exception raised here as a failed stream read, with a
            # Python traceback in its message; keep the real one for the session.
            self._failed(self.store, e)
            raise
        finally:
            if reader is not None:
                reader.close()

    def close(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
