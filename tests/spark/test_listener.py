"""SourceEndOffsetsListener reads Kafka's offset JSON from Spark's progress reports."""

from __future__ import annotations

from iqkit import Position
from iqkit.spark.streaming import _parse_kafka_offsets


def test_kafka_latest_offsets_become_a_position():
    # the form Spark's Kafka source reports in progress.sources[].latestOffset
    text = '{"orders":{"0":120,"1":98},"payments":{"0":7}}'
    assert _parse_kafka_offsets(text) == Position.from_map(
        {"orders": {0: 120, 1: 98}, "payments": {0: 7}}
    )


def test_non_kafka_offsets_are_ignored():
    assert _parse_kafka_offsets('{"logOffset":3}') is None  # a file source
    assert _parse_kafka_offsets(None) is None
    assert _parse_kafka_offsets("not json") is None
