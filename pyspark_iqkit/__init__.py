"""Makes ``format("iqkit")`` work in every Spark session without ``register(spark)``.

Spark 4, when a session starts, imports every installed top-level package whose name
starts with ``pyspark_`` and registers its ``DefaultSource`` under the source's
``name()`` — as ``format("delta")`` works once Delta is installed. Spark's Python
workers must run an interpreter that has iqkit installed (see
:func:`iqkit.spark.register`, which says how to fix a session whose workers do not).
"""

from iqkit.spark.datasource import IqkitDataSource as DefaultSource

__all__ = ["DefaultSource"]
