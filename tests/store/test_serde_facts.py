"""Each serde owns the facts the rest of iqkit needs about its values (issue 12, item 2):
its Arrow type and whole-column decoder (tables, SQL), its Spark type (the Spark reader
and writers) and an example literal (the panel). A new serde means editing
``iqkit/store/encoding/serdes.py`` only, so no other module keeps a table keyed by serde names."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_serdes_bulk import VALUES

import iqkit
from iqkit.jupyter.values import key_value
from iqkit.store.encoding.serdes import SERDE_NAMES, all_serdes, get_serde
from iqkit.store.manifest import StoreManifest
from iqkit.store.rows import parse_ddl_type

PACKAGE = Path(iqkit.__file__).parent
#: The modules that used to keep their own tables of serde facts.
CONSUMERS = ["tables.py", "store/rows.py", "store/columnar", "sqlsession", "spark", "jupyter"]

relaxed = settings(deadline=None)  # first calls pay numpy/pyarrow warm-up; shared machine


def test_all_serdes_are_the_named_ones_in_order():
    assert tuple(s.name for s in all_serdes()) == SERDE_NAMES


@pytest.mark.parametrize("name", SERDE_NAMES)
@pytest.mark.parametrize("prefix", [b"", b"\x01", b"\x02\x00"])
def test_decode_arrow_is_pa_array_of_each_decoded_value(name, prefix):
    serde = get_serde(name)
    arrow_type = serde.arrow_type()

    @relaxed
    @given(st.lists(VALUES[name], min_size=1, max_size=30))
    def check(values):
        datas = [prefix + serde.serialize(v) for v in values]
        got = serde.decode_arrow(datas, len(prefix))
        if arrow_type is None:  # no type of its own: nothing to decode in bulk
            assert got is None
            return
        expected = pa.array([serde.deserialize(d[len(prefix) :]) for d in datas], arrow_type)
        assert got.type == arrow_type
        assert got.equals(expected)

    check()


@pytest.mark.parametrize(
    ("name", "datas", "offset"),
    [
        ("string", [b"ok", b"\xff"], 0),  # invalid UTF-8
        ("string", [b"\x01a", b""], 1),  # shorter than the prefix
        ("bytes", [b"\x01a", b""], 1),
        ("int32", [bytes(4), bytes(3)], 0),  # another width
        ("int64", [bytes(9)], 1 + 1),
        ("double", [bytes(8), bytes(9)], 0),
    ],
)
def test_decode_arrow_leaves_what_would_not_decode_to_the_row_path(name, datas, offset):
    assert get_serde(name).decode_arrow(datas, offset) is None


@pytest.mark.parametrize("name", SERDE_NAMES)
def test_every_serde_has_a_spark_type_and_an_example_the_magic_reads(name):
    serde = get_serde(name)
    assert serde.spark_ddl in {"STRING", "INT", "BIGINT", "DOUBLE", "BINARY"}
    assert serde.json_text == (serde.arrow_type() is None)  # no Arrow type: JSON text
    assert set(serde.spark_default_for) <= set(serde.spark_accepts)
    manifest = StoreManifest("s", "kv", 1, name, "string", "murmur2")
    for literal in serde.example.split(" or "):
        assert key_value(literal, manifest, {}) is not None


def test_each_spark_type_has_at_most_one_default_serde():
    defaults = [t for s in all_serdes() for t in s.spark_default_for]
    assert len(defaults) == len(set(defaults))


def _is_spark_type_name(text: str) -> bool:
    try:
        parse_ddl_type(text)
    except ValueError:
        return False
    return True


def _serde_tables(path: Path, base: Path = PACKAGE) -> list[str]:
    """Literal dicts, tuples, lists and sets naming two or more serdes: a table of serde
    facts kept away from the serdes. A table of Spark type names is not one: "string" and
    "double" are Spark type names too, and a value schema's DDL types (store/rows.py) map
    Spark types, not serdes. Such a table is told apart by naming only Spark types, one
    or more of which no serde is called ("boolean", "float"); a table naming only serdes
    is still flagged, whatever those names also mean to Spark."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict):
            items = node.keys
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        else:
            continue
        texts = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        names = [t for t in texts if t in SERDE_NAMES]
        spark_types = all(_is_spark_type_name(t) for t in texts)
        if len(names) >= 2 and not (spark_types and len(names) < len(texts)):
            found.append(f"{path.relative_to(base)}:{node.lineno} {names}")
    return found


def test_a_table_of_serde_names_is_found_and_a_table_of_spark_types_is_not(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        'A = {"string": 1, "int64": 2}\n'  # serde names only
        'B = ("string", "double")\n'  # serde names that are Spark types too: still serdes
        'C = {"string": 1, "double": 2, "boolean": 3}\n'  # Spark types
        'D = ["string", "double", "weird"]\n',  # serde names and an unknown name
        encoding="utf-8",
    )
    lines = [t.split(" ")[0].rsplit(":", 1)[1] for t in _serde_tables(source, tmp_path)]
    assert lines == ["1", "2", "4"]


def test_no_other_module_keeps_a_table_of_serde_facts():
    files = []
    for name in CONSUMERS:
        path = PACKAGE / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    assert len(files) > len(CONSUMERS)  # the package was read
    assert [t for f in files for t in _serde_tables(f)] == []
