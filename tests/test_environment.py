"""The pinned dependency set works together (README "Pinned versions" says why).

PySpark 4.3 requires pandas >= 2.2 and warns that it "does not yet fully support pandas
>= 3.0.0" (it recommends pandas < 3), so iqkit pins pandas < 3. These tests fail if an
install drifts from that decision.
"""

from __future__ import annotations

import shutil
from importlib.metadata import version

import pandas as pd
import pyarrow as pa
import pytest
import rocksdict


def _major(version: str) -> int:
    return int(version.split(".")[0])


def test_pandas_is_2x_and_satisfies_pyspark():
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    assert _major(pd.__version__) == 2, f"pandas {pd.__version__}: iqkit pins pandas<3"
    require_minimum_pandas_version()  # raises if PySpark would refuse this pandas


def test_pyarrow_satisfies_pyspark():
    from pyspark.sql.pandas.utils import require_minimum_pyarrow_version

    require_minimum_pyarrow_version()
    assert _major(pa.__version__) >= 17


def test_rocksdict_is_the_pinned_release():
    # store/partitions/rocks.py works around quirks of this release (config rewrite on open, reverse
    # iteration ignoring the lower bound); a new release must be re-checked.
    assert version("rocksdict") == "0.3.29"
    assert rocksdict.Options(raw_mode=True) is not None


@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java 17+ (make test checks it)")
def test_spark_round_trips_a_pandas_frame_through_arrow():
    from pyspark.sql import SparkSession

    # Quirk: getOrCreate returns a session another test of this process started (the
    # shared ``spark`` fixture, under pytest-xdist), and stopping it would stop theirs.
    shared = SparkSession.getActiveSession()
    spark = shared or (
        SparkSession.builder.master("local[1]")
        .appName("iqkit-env-check")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    try:
        frame = pd.DataFrame({"customer": ["alice", "bob"], "total": [42, 7]})
        back = spark.createDataFrame(frame).toPandas()
        assert back.to_dict("records") == frame.to_dict("records")
    finally:
        if shared is None:
            spark.stop()


def test_matplotlib_is_installed_and_draws_without_a_display():
    # a dependency: the notebooks draw lag per partition and window series with it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.bar([0, 1], [3, 1])
    assert len(ax.patches) == 2
    plt.close(fig)
