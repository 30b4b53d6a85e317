"""The data source's task encoder (``write_encode.RowEncoder``) without Spark: its sort by
(store partition, key, input order or Kafka offset) keeps exactly the last row of each
key, as one Arrow sort of the whole buffer would, whether or not it spilled runs
on the way; and the twin columns it carries stay aligned with the rows it keeps."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from iqkit.spark.schema import ColumnPlan
from iqkit.spark.write_encode import RowEncoder


def encoder(kafka: bool, twin: bool, partitions: int, spill_dir: str | None = None) -> RowEncoder:
    plan = ColumnPlan(
        key_columns=("k",),
        key_serde="string",
        value_column=None,
        record_columns=("n",),
        value_serde="json",
        window_column=None,
        partition_column=None,
        value_schema="n bigint",
    )
    job = SimpleNamespace(
        plan=plan, store="s", partitioner="murmur2", partitions=partitions, kafka=kafka
    )
    return RowEncoder(job, ("k", "n") if twin else None, spill_dir=spill_dir)  # type: ignore[arg-type]


rows_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "dd", "é", "", "zz"]), st.integers(0, 50)),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(
    rows_strategy,
    st.booleans(),
    st.integers(1, 4),
    st.integers(1, 7),
    st.integers(0, 4),
    st.randoms(use_true_random=False),
)
def test_partitions_keep_the_last_row_of_each_key_in_key_order(
    tmp_path_factory, rows, kafka, partitions, batch, spill_every, rnd
):
    spills = tmp_path_factory.mktemp("runs")
    enc = encoder(kafka, twin=True, partitions=partitions, spill_dir=str(spills))
    offsets = list(range(len(rows)))
    if kafka:
        rnd.shuffle(offsets)  # input order is not offset order
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        columns = {
            "k": pa.array([k for k, _ in chunk], pa.string()),
            "n": pa.array([n for _, n in chunk], pa.int64()),
        }
        if kafka:
            columns |= {
                "topic": pa.array(["t"] * len(chunk)),
                "partition": pa.array([0] * len(chunk), pa.int32()),
                "offset": pa.array(offsets[start : start + batch], pa.int64()),
            }
        enc.add(pa.RecordBatch.from_pydict(columns))
        if spill_every and (start // batch) % spill_every == spill_every - 1:
            enc.spill()  # a run on disk: later runs must win, runs merge back
    # The model: per key, the row of the highest offset (Kafka) or the last one.
    last: dict[str, tuple[int, int]] = {}
    for (k, n), seq in zip(rows, offsets, strict=True):
        if k not in last or seq >= last[k][1]:
            last[k] = (n, seq)
    got: dict[str, int] = {}
    seen_partitions = []
    for p, rows_of_p in enc.partitions():
        chunks = list(rows_of_p.sequenced_chunks())
        keys = pa.concat_arrays([c[0] for c in chunks])
        values = pa.concat_arrays([c[1] for c in chunks])
        twin = pa.concat_tables([c[3] for c in chunks])
        seen_partitions.append(p)
        assert keys.to_pylist() == sorted(keys.to_pylist())
        assert len(set(keys.to_pylist())) == len(keys)
        assert twin is not None and twin.column("k").to_pylist() == [
            bytes(k[1:]).decode() for k in keys.to_pylist()
        ]  # the RocksDB key is the string behind a one-byte prefix
        for name, value, n in zip(
            twin.column("k").to_pylist(),
            values.to_pylist(),
            twin.column("n").to_pylist(),
            strict=True,
        ):
            assert value == f'{{"n":{n}}}'.encode()
            got[name] = n
    assert seen_partitions == sorted(set(seen_partitions))
    assert got == {k: n for k, (n, _) in last.items()}
    enc.close()
    assert list(spills.iterdir()) == []  # the runs are removed
