"""Start-up: what ``import iqkit`` and a process's first commit load.

Every short script, the CLI and each of Spark's Python workers pays for what importing
iqkit loads. ``import iqkit`` loads the query model and the errors only (the engine,
the writer and the SQL session load when first named); a first commit loads the writer,
rocksdict, and pyarrow for the columnar twin, but neither pandas (which pyarrow's
``pa.array`` imports: ``serde_arrow`` builds a commit's arrays from buffers), nor the
checkpoint reader, nor the SQL, Spark or notebook layers. Each case runs in a fresh
process, as a user's script does; what it loads is asserted, never how long it takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_python_script

import iqkit

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
root, key_serde, value_serde, key, value = sys.argv[1:]
key, value = eval(key), eval(value)
iqkit.create_store(root, "s", partitions=2, key_serde=key_serde, value_serde=value_serde)
with iqkit.StoreWriter(root, "s") as w:
    w.put(key, value)
    w.delete(key * 2)
assert iqkit.StoreManifest is not None
"""


@pytest.mark.parametrize(
    ("key_serde", "value_serde", "key", "value"),
    [("string", "json", "'alice'", "{'total': 42}"), ("int64", "double", "7", "1.5")],
)
def test_a_first_commit_loads_neither_pandas_nor_the_reader(
    root, key_serde, value_serde, key, value
):
    loaded = loaded_after(COMMIT, str(root), key_serde, value_serde, key, value)
    assert "rocksdict" in tops(loaded) and "iqkit.store.writer" in loaded  # it did commit
    assert not tops(loaded) & NOT_ON_COMMIT, sorted(tops(loaded) & NOT_ON_COMMIT)
    assert not [m for m in loaded if m.startswith(NOT_ON_COMMIT_IQKIT)]
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
