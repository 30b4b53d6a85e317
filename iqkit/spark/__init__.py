"""Spark writes iqkit stores: batch (``write_store``), Structured Streaming
(``store_sink``), a local Kafka-shaped source (``LocalKafkaTopic``) and the ``iqkit``
Spark data source. Needs PySpark 4 and Java 17+."""

import os
import sys

# Spark starts Python workers with $PYSPARK_PYTHON, else whatever `python3` is on PATH,
# which in a notebook kernel or venv is usually not this interpreter and lacks iqkit
# ("No module named 'iqkit'" in every task). Default to the interpreter that imported us.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from .batch import write_store
from .datasource import IqkitDataSource, register
from .kafka_local import KAFKA_SCHEMA, LocalKafkaTopic, RecordMetadata, kafka_schema
from .streaming import SourceEndOffsetsListener, last_committed_batch, store_sink
from .worker_python import WorkerPythonError, warn_if_active_session_lacks_iqkit

__all__ = [
    "KAFKA_SCHEMA",
    "IqkitDataSource",
    "LocalKafkaTopic",
    "RecordMetadata",
    "SourceEndOffsetsListener",
    "WorkerPythonError",
    "kafka_schema",
    "register",
    "last_committed_batch",
    "store_sink",
    "write_store",
]

# A session started before this import keeps workers that may lack iqkit: say so now.
warn_if_active_session_lacks_iqkit()
