"""Spark writes iqkit stores: batch (``write_store``), Structured Streaming
(``store_sink``), and the ``iqkit`` Spark data source. Needs PySpark 4 and Java 17+."""

from .batch import write_store
from .streaming import SourceEndOffsetsListener, last_committed_batch, store_sink

__all__ = ["SourceEndOffsetsListener", "last_committed_batch", "store_sink", "write_store"]
