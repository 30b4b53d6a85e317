"""``import iqkit`` stays light: Spark's Python workers import it for every iqkit function
they unpickle, and the CLI starts with it. pandas, duckdb, tqdm and IPython are imported
where they are used (see docs/DECISIONS.md, "Spark's Python workers")."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pandas", "duckdb", "tqdm", "IPython", "ipywidgets")


@pytest.mark.parametrize("module", ["iqkit", "iqkit.spark.batch", "iqkit.spark.datasource"])
def test_importing_does_not_load_heavy_libraries(module):
    code = f"import sys, {module}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""


def test_sql_still_works_after_a_light_import():
    """The lazily imported libraries arrive when SQL is actually used."""
    code = (
        "import sys, iqkit\n"
        "import pandas as pd\n"
        "out = iqkit.sql('SELECT sum(x) AS s FROM f', f=pd.DataFrame({'x': [1, 2, 3]}))\n"
        "print(int(out['s'][0]), 'duckdb' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["6", "True"]
