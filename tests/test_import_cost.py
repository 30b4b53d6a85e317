"""Start-up stays light: what ``import iqkit`` and a process's first commit load.

Spark's Python workers import iqkit for every iqkit function they unpickle, the CLI and
every short script start with it. ``import iqkit`` loads the query model and the errors
only (the engine, the writer and the SQL session load when first named); pandas, duckdb,
tqdm and IPython are imported where they are used. A first commit loads the writer,
rocksdict and pyarrow (for the columnar twin), but neither pandas (which pyarrow's
``pa.array`` imports: ``serde_arrow`` builds a commit's arrays from buffers), nor
``pyarrow.compute`` unless there are deletes, nor the checkpoint reader, nor the SQL,
Spark or notebook layers. Each case runs in a fresh process, as a user's script does;
what it loads is asserted, never how long it takes (docs/DECISIONS.md, "Start-up")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_python_script

import iqkit

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


#: Where the fresh processes import this iqkit from.
SOURCE = str(Path(iqkit.__file__).parents[1])

#: Third-party packages a bare ``import iqkit`` must not load.
NOT_ON_IMPORT = {
    "numpy", "pyarrow", "pandas", "duckdb", "pyspark", "IPython", "ipywidgets", "rocksdict",
    "fastavro", "zstandard", "cramjam", "fsspec",
}  # fmt: skip
#: Third-party packages a first commit to a local root must not load.
NOT_ON_COMMIT = {
    "pandas", "duckdb", "pyspark", "IPython", "ipywidgets", "fastavro", "zstandard", "cramjam",
    "fsspec",
}  # fmt: skip
#: iqkit's parts a first commit must not load: the checkpoint reader (and its codecs), the
#: engine, the SQL, Spark and notebook layers.
NOT_ON_COMMIT_IQKIT = (
    "iqkit.store.checkpoint.format", "iqkit.store.checkpoint.providers", "iqkit.engine",
    "iqkit.sqlsession", "iqkit.tables", "iqkit.spark", "iqkit.jupyter",
)  # fmt: skip

LOADED = (
    "import json, sys\n"
    "print('RESULT' + json.dumps(sorted(sys.modules)))\n"
)


def loaded_after(script: str, *args: str) -> set[str]:
    """The modules a fresh Python process holds after running ``script``."""
    return set(run_python_script(script + LOADED, *args, cwd=SOURCE, timeout=300))


def tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_import_iqkit_loads_the_query_model_and_the_errors_only():
    loaded = loaded_after("import iqkit\n")
    assert not tops(loaded) & NOT_ON_IMPORT, sorted(tops(loaded) & NOT_ON_IMPORT)
    own = {m for m in loaded if m.split(".")[0] == "iqkit"}
    assert {"iqkit", "iqkit.errors", "iqkit.query", "iqkit.query.request"} <= own
    assert {m for m in own if not m.startswith(("iqkit.query", "iqkit.errors"))} == {"iqkit"}


COMMIT = """
import sys
import iqkit
root, key_serde, value_serde, key, value, delete = sys.argv[1:]
key, value = eval(key), eval(value)
iqkit.create_store(root, "s", partitions=2, key_serde=key_serde, value_serde=value_serde)
with iqkit.StoreWriter(root, "s") as w:
    w.put(key, value)
    if delete == "delete":
        w.delete(key * 2)
"""


@pytest.mark.parametrize(
    ("key_serde", "value_serde", "key", "value", "delete"),
    [
        ("string", "json", "'alice'", "{'total': 42, 'name': 'A'}", ""),
        ("string", "json", "'bob'", "{'total': 42}", "delete"),
        ("int64", "double", "7", "1.5", ""),
    ],
)
def test_a_first_commit_loads_neither_pandas_nor_the_reader(
    root, key_serde, value_serde, key, value, delete
):
    loaded = loaded_after(COMMIT, str(root), key_serde, value_serde, key, value, delete)
    assert "rocksdict" in tops(loaded) and "iqkit.store.writer" in loaded  # it did commit
    assert "pyarrow.parquet" in loaded  # the columnar twin was written
    assert not tops(loaded) & NOT_ON_COMMIT, sorted(tops(loaded) & NOT_ON_COMMIT)
    assert not [m for m in loaded if m.startswith(NOT_ON_COMMIT_IQKIT)]
    # pyarrow.compute only to sort tombstones among the rows of a twin
    assert ("pyarrow.compute" in loaded) == bool(delete)
    with iqkit.open(root) as engine:  # what was committed reads back
        got = engine.query(
            iqkit.StateQueryRequest.in_store("s").with_query(iqkit.KeyQuery.with_key(eval(key)))
        )
        assert got.only_partition_result().result == eval(value)


def test_the_lazily_loaded_names_are_listed_and_are_their_modules_own():
    from iqkit import engine, sqlsession
    from iqkit.store import manifest, writer
    from iqkit.store.encoding import partitioners, serdes

    listed = set(dir(iqkit))
    assert set(iqkit.__all__) <= listed
    assert {"engine", "store", "sqlsession", "query"} <= listed
    assert iqkit.open is engine.open and iqkit.StateEngine is engine.StateEngine
    assert iqkit.StoreWriter is writer.StoreWriter and iqkit.create_store is writer.create_store
    assert iqkit.sql is sqlsession.sql and iqkit.SQLError is sqlsession.SQLError
    assert iqkit.StoreManifest is manifest.StoreManifest
    assert iqkit.murmur2 is partitioners.murmur2 and iqkit.get_serde is serdes.get_serde
    with pytest.raises(AttributeError, match="module 'iqkit' has no attribute 'nope'"):
        iqkit.nope  # noqa: B018
