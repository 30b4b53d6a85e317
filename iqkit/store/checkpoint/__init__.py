"""Spark Structured Streaming checkpoints read as iqkit stores (read-only): the state Spark's
stateful operators keep in a checkpoint folder, decoded from its own files without Spark."""
