"""The columns of a store's rows: one layout for every reader that shows a store as rows,
Arrow tables (:mod:`iqkit.tables`, behind ``%iq``, the panel and SQL) and Spark
DataFrames (:mod:`iqkit.spark.datasource`).

A row is ``partition``, then the key, then, for window stores, ``window_start`` and
``window_end``, then the value:

* The key is one column ``key``, or, for a composite ``ordered`` key, one column per
  tuple element, named from the manifest's ``properties["key_columns"]`` (a list, or
  ``"a, b"`` written by hand), else ``key_0, key_1, ...``.
* The value is one column ``value``, or one column per field of a JSON record; a field
  named like a partition, key or window column becomes ``value.<field>``.
* Types come from the serdes (:mod:`iqkit.store.encoding.serdes`: ``arrow_type``, ``spark_ddl``):
  ``partition`` is a 32-bit int, window bounds are UTC timestamps in milliseconds.

The two readers differ only where their type systems make them. Arrow infers a column's
type from the values read, so a table splits any tuple key into elements (declared
names win, ``key_i`` otherwise). Spark fixes a DataFrame's schema before reading a row,
so it splits a key only when the manifest also declares the elements' types
(``properties["key_types"]``, DDL types); otherwise the whole key is one ``key``
column, of the serde's Spark type or, for ``json``/``ordered``, its compact JSON text.

A store whose manifest declares a value schema (``properties["value_schema"]``, DDL
columns: the Spark writers record the columns of a JSON record they write) is *typed*:
its key column keeps its written name (``properties["key_columns"]``), and every reader
shows one column per declared member, of its declared type (Spark's own Spark → Arrow
mapping, :func:`ddl_arrow_type`), whatever the rows hold; ``value_arrow_schema`` and
``value_arrow_arrays`` are the one home of those facts for every Arrow reader and writer.
A store without one reads as described above.

Pure Python: pyarrow is imported only inside the functions that build Arrow types.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .encoding.serdes import Serde, get_serde
from .manifest import StoreManifest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "KEY",
    "PARTITION",
    "VALUE",
    "WINDOW_END",
    "WIDE_DECIMALS",
    "WINDOW_START",
    "RowSchema",
    "arrow_timestamp",
    "ddl_arrow_type",
    "ddl_text",
    "ddl_names",
    "parse_ddl_columns",
    "parse_ddl_type",
    "quote_ddl",
    "split_ddl_list",
    "typed_value_arrays",
    "value_decoders",
]

PARTITION = "partition"
KEY = "key"
VALUE = "value"
WINDOW_START = "window_start"
WINDOW_END = "window_end"

#: Spark DDL types of the partition and window columns.
PARTITION_DDL = "INT"
WINDOW_DDL = "TIMESTAMP"


def arrow_timestamp() -> pa.DataType:
    """Arrow's type of ``window_start`` / ``window_end``: epoch milliseconds, UTC."""
    import pyarrow as pa

    return pa.timestamp("ms", tz="UTC")


# -- DDL text --------------------------------------------------------------------------------
def split_ddl_list(text: str) -> list[str]:
    """Split ``"string, decimal(10,2)"`` on top-level commas."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def ddl_names(ddl: str) -> list[str]:
    """Column names of a DDL column list (``"a string, `b c` map<string,int>"``)."""
    names = []
    for part in split_ddl_list(ddl):
        part = part.strip()
        if part.startswith("`"):
            end = part.find("`", 1)
            while end != -1 and part[end + 1 : end + 2] == "`":
                end = part.find("`", end + 2)
            names.append(part[1:end].replace("``", "`") if end != -1 else part)
        else:
            names.append(part.split(None, 1)[0].rstrip(":"))
    return names


def quote_ddl(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _listed(value: Any, split: Any) -> list[str]:
    """A manifest property holding a list of texts: a list, or one comma-separated text
    (written by hand)."""
    if not value:
        return []
    if isinstance(value, str):
        return [part.strip() for part in split(value) if part.strip()]
    return [str(part) for part in value]


# -- the schema ------------------------------------------------------------------------------
class RowSchema:
    """The row layout of one store (of one query: ``raw`` queries' keys and values are
    bytes, and their window keys are not split into windows)."""

    def __init__(self, manifest: StoreManifest, *, raw: bool = False) -> None:
        self.store = manifest.name
        self.windowed = manifest.kind.windowed and not raw
        self.key_serde: Serde = get_serde("bytes" if raw else manifest.key_serde)
        self.value_serde: Serde = get_serde("bytes" if raw else manifest.value_serde)
        self._properties = manifest.properties
        #: The key columns the manifest declares (any serde; see ``tuple_key_columns``).
        self.declared_key_columns = _listed(
            manifest.properties.get("key_columns"), lambda t: t.split(",")
        )
        ordered = self.key_serde.name == "ordered"
        #: A composite key's columns, known before any row is read: the declared ones,
        #: for an ``ordered`` key of two or more (a single one is the bare key).
        self.tuple_key_columns: list[str] = (
            self.declared_key_columns if ordered and len(self.declared_key_columns) >= 2 else []
        )
        #: The value schema the manifest declares (``properties["value_schema"]``, DDL
        #: columns, written by the Spark writers for a record of columns): ``json`` values
        #: only, and never for ``raw`` queries. ``None``: the values have no schema.
        declared_values = manifest.properties.get("value_schema")
        typed = bool(declared_values) and not raw and self.value_serde.name == "json"
        self.value_schema: str | None = str(declared_values) if typed else None
        self._value_columns: list[tuple[str, DdlType]] | None = None
        #: The one key column's name: its written name in a store with a value schema
        #: (a store a Spark writer made), else ``key``.
        single = len(self.declared_key_columns) == 1
        self.key_column = self.declared_key_columns[0] if typed and single else KEY

    # Key columns ----------------------------------------------------------------------
    def key_element_column(self, i: int) -> str:
        """The column of a tuple key's element ``i``: its declared name, else ``key_i``."""
        names = self.declared_key_columns
        return names[i] if i < len(names) else f"key_{i}"

    def typed_key_columns(self) -> list[tuple[str, str]] | None:
        """``(name, DDL type)`` of an ``ordered`` key's declared columns (names and
        types), or ``None``: what a reader that fixes types before reading (Spark) splits
        a key into. Raises ``ValueError`` when the two lists differ in length."""
        if self.key_serde.name != "ordered":
            return None
        names = self.declared_key_columns
        types = _listed(self._properties.get("key_types"), split_ddl_list)
        if not names or not types:
            return None
        if len(names) != len(types):
            raise ValueError(
                f"iqkit: store {self.store!r}: properties key_columns {names!r} and "
                f"key_types {types!r} differ in length"
            )
        return list(zip(names, types, strict=True))

    @staticmethod
    def key_parts(keys: list[Any]) -> list[tuple[Any, ...]]:
        """Every key as the tuple of its elements. The ``ordered`` serde encodes a
        one-element tuple as its element, so a bare key is the 1-tuple ``(k,)``."""
        return [k if isinstance(k, tuple) else (k,) for k in keys]

    def fixed_columns(self, key_columns: Sequence[str]) -> list[str]:
        """The columns before the value: ``partition``, ``key_columns``, the windows."""
        window = [WINDOW_START, WINDOW_END] if self.windowed else []
        return [PARTITION, *key_columns, *window]

    @staticmethod
    def field_column(field: Any, taken: Any) -> str:
        """The column of a JSON record's ``field``: its name, prefixed with ``value.``
        (as often as needed) while ``taken`` (a container of column names) holds it."""
        name = field if isinstance(field, str) else str(field)
        while name in taken:
            name = f"{VALUE}.{name}"
        return name

    # The value schema -------------------------------------------------------------------
    def value_columns(self) -> list[tuple[str, DdlType]]:
        """The declared value schema's members and their types (``[]``: no schema);
        raises ``ValueError`` naming the store when the manifest's DDL is not understood."""
        if self._value_columns is None:
            if self.value_schema is None:
                self._value_columns = []
            else:
                try:
                    self._value_columns = parse_ddl_columns(self.value_schema)
                except ValueError as exc:
                    raise ValueError(
                        f"iqkit: store {self.store!r}: properties value_schema "
                        f"{self.value_schema!r} is not a Spark schema: {exc}"
                    ) from None
        return self._value_columns

    def value_column_names(self) -> dict[str, str]:
        """Each declared member's column (``field_column``: renamed when it is called like a
        partition, key or window column)."""
        taken = set(self.fixed_columns(self.tuple_key_columns or [self.key_column]))
        names: dict[str, str] = {}
        for member, _ in self.value_columns():
            names[member] = self.field_column(member, taken | set(names.values()))
        return names

    def value_arrow_schema(self) -> pa.Schema | None:
        """The Arrow types of the value columns (by member name, in declared order, Spark's
        own Spark → Arrow mapping) when the manifest declares a value schema, else
        ``None``."""
        if not self.value_columns():
            return None
        import pyarrow as pa

        return pa.schema([pa.field(n, ddl_arrow_type(t)) for n, t in self.value_columns()])

    def value_arrow_arrays(self, values: Sequence[Any]) -> list[pa.Array]:
        """``values`` (what the value serde's ``deserialize`` returns) as the arrays of
        ``value_arrow_schema()``, exactly (``typed_value_arrays``); a value that does not
        fit raises ``ValueError`` naming the store and the column."""
        try:
            return typed_value_arrays(self.value_columns(), values)
        except ValueError as exc:
            raise ValueError(f"iqkit: store {self.store!r}: {exc}") from None

    def exact_value_decoder(self) -> Callable[[bytes], Any] | None:
        """A decoder of one stored value that keeps the declared decimal members exact
        (``decimal.Decimal``, at any depth), for a typed store whose value schema has one;
        ``None`` when the json serde's own decode is exact (no decimal member, no value
        schema, or one this reader cannot parse: the readers that need it say so).

        Why: the json serde decodes every JSON number with a fraction as a double, which
        keeps 15 significant digits of a ``decimal(38,18)``. Every other number of the
        value is decoded as the serde decodes it (a double stays a ``float``), so a
        store's values differ from the serde's only in their decimal members."""
        try:
            columns = self.value_columns()
        except ValueError:
            return None
        if not any(_has_decimal(t) for _, t in columns):
            return None
        deserialize = self.value_serde.deserialize
        walk = _record_walker(columns)
        loads = json.JSONDecoder(parse_float=decimal.Decimal).decode

        def decode(data: bytes) -> Any:
            try:
                value = loads(str(data, "utf-8"))
            except (ValueError, TypeError):
                return deserialize(data)  # raises the serde's own message
            return walk(value)

        return decode

    # Types ----------------------------------------------------------------------------
    def arrow_types(self) -> dict[str, pa.DataType | None]:
        """Arrow types of the columns known before any row is read (``None``: inferred
        from the values): the schema of a result without rows."""
        import pyarrow as pa

        keys = self.tuple_key_columns or [self.key_column]
        types: dict[str, pa.DataType | None] = {PARTITION: pa.int32()}
        for name in keys:
            types[name] = None if self.tuple_key_columns else self.key_serde.arrow_type()
        if self.windowed:
            types[WINDOW_START] = types[WINDOW_END] = arrow_timestamp()
        if self.value_columns():
            names = self.value_column_names()
            for member, t in self.value_columns():
                types[names[member]] = ddl_arrow_type(t)
            return types
        types[VALUE] = self.value_serde.arrow_type()
        return types

    def spark_key_columns(self) -> list[tuple[str, str]]:
        """``(name, DDL type)`` of the key's Spark columns (module docstring)."""
        return self.typed_key_columns() or [(self.key_column, self.key_serde.spark_ddl)]

    def spark_value_schema(self, option: str | None) -> str | None:
        """The value schema a Spark read uses: the ``value_schema`` option when given
        (blank: none, the whole value as one ``value`` column), else the manifest's, its
        columns named as ``value_column_names`` says."""
        if option is not None:
            return option if option.strip() else None
        if not self.value_columns():
            return None
        names = self.value_column_names()
        return ", ".join(f"{quote_ddl(names[m])} {ddl_text(t)}" for m, t in self.value_columns())

    def spark_ddl(self, value_schema: str | None = None) -> str:
        """The Spark schema (DDL) of the rows; ``value_schema`` (DDL columns, ``json``
        values only) replaces the ``value`` column by a JSON object's members. Raises
        ``ValueError`` naming what is wrong."""
        fixed = [(PARTITION, PARTITION_DDL), *self.spark_key_columns()]
        if self.windowed:
            fixed += [(WINDOW_START, WINDOW_DDL), (WINDOW_END, WINDOW_DDL)]
        cols = [f"{quote_ddl(n)} {t}" for n, t in fixed]
        if value_schema is None:
            cols.append(f"{quote_ddl(VALUE)} {self.value_serde.spark_ddl}")
            return ", ".join(cols)
        if self.value_serde.name != "json":
            raise ValueError(
                f"iqkit: option 'value_schema' needs a store with json values; store "
                f"{self.store!r} has {self.value_serde.name!r} values"
            )
        taken = [n.lower() for n, _ in fixed]
        names = [n.lower() for n in ddl_names(value_schema)]
        clash = sorted({n for n in names if names.count(n) > 1 or n in taken})
        if clash:
            raise ValueError(
                f"iqkit: option 'value_schema' repeats column(s) {', '.join(clash)}: value "
                f"columns may not repeat each other, the partition, key or window columns"
            )
        cols.append(value_schema)
        return ", ".join(cols)

    # Placing a record in a row ---------------------------------------------------------
    def value_fields(
        self, columns: Sequence[str], key_columns: Sequence[str], *, value_schema: bool = False
    ) -> list[str] | None:
        """The value columns of ``columns`` when they are a JSON object's members (a
        ``value_schema`` was given, or the columns after the fixed ones are anything but
        ``value`` alone), else ``None`` (they take the whole value)."""
        fixed = set(self.fixed_columns(key_columns))
        fields = [n for n in columns if n not in fixed]
        return fields if value_schema or fields not in ([VALUE], []) else None

    def slots(
        self, columns: Sequence[str], key_columns: Sequence[str], *, value_schema: bool = False
    ) -> list[tuple[str, Any]]:
        """Where each of ``columns`` (a schema's names, in order) takes its value from,
        for a row whose key is split into ``key_columns``: ``("partition", None)``,
        ``("key", i)`` (element ``i``), ``("window", 0 | 1)`` (start, end), ``("value",
        None)`` (the whole value) or ``("field", name)`` (a member of a JSON object).

        Without a ``value_schema``, a schema whose only value column is ``value`` takes
        the whole value; any other value columns are fields (a ``value_schema``, or a
        user-given schema)."""
        whole = not self.value_fields(columns, key_columns, value_schema=value_schema)
        # A declared member renamed to stay clear of a fixed column is read from its member.
        members = {column: member for member, column in self.value_column_names().items()}
        out: list[tuple[str, Any]] = []
        for name in columns:
            if name == PARTITION:
                out.append(("partition", None))
            elif name in key_columns:
                out.append(("key", list(key_columns).index(name)))
            elif self.windowed and name in (WINDOW_START, WINDOW_END):
                out.append(("window", 0 if name == WINDOW_START else 1))
            else:
                out.append(("value", None) if whole else ("field", members.get(name, name)))
        return out


def value_decoders(
    manifest: StoreManifest,
) -> tuple[Callable[[bytes], Any], Callable[[Sequence[bytes]], list[Any]]]:
    """How the engine decodes a store's stored values, one and many: the value serde's
    ``deserialize`` / ``deserialize_many``, except for a typed store with decimal members
    (``RowSchema.exact_value_decoder``): those stay exact wherever values are handed out."""
    serde = get_serde(manifest.value_serde)
    exact = RowSchema(manifest).exact_value_decoder() if manifest.properties else None
    if exact is None:
        return serde.deserialize, serde.deserialize_many
    return exact, lambda datas: list(map(exact, datas))


# -- the value schema: DDL types, their Arrow types, decoded values as typed Arrow ----------
#: Spark's scalar type names (DDL and ``simpleString`` spellings) → a canonical name.
_SCALARS = {
    "string": "string",
    "varchar": "string",
    "char": "string",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "smallint": "smallint",
    "short": "smallint",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "double": "double",
    "float": "float",
    "real": "float",
    "boolean": "boolean",
    "bool": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
}
_DECIMALS = ("decimal", "dec", "numeric")
_INT_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}

#: A parsed DDL type: ``(name,)`` for scalars, ``("decimal", p, s)``, ``("array", t)``,
#: ``("map", k, v)``, ``("struct", ((name, t), ...))``.
DdlType = tuple[Any, ...]


def _split_name(text: str) -> tuple[str, str]:
    """``"`a b` int"`` / ``"a:int"`` / ``"a int"`` → (name, type text)."""
    text = text.strip()
    if text.startswith("`"):
        end = text.find("`", 1)
        while end != -1 and text[end + 1 : end + 2] == "`":
            end = text.find("`", end + 2)
        if end == -1:
            raise ValueError(f"unclosed ` in {text!r}")
        name, rest = text[1:end].replace("``", "`"), text[end + 1 :]
    else:
        cut = min((i for i in (text.find(":"), text.find(" ")) if i > 0), default=-1)
        if cut == -1:
            raise ValueError(f"{text!r} is not 'name type'")
        name, rest = text[:cut], text[cut:]
    rest = rest.strip()
    rest = rest[1:] if rest.startswith(":") else rest
    rest = rest.strip()
    # DDL allows NOT NULL and COMMENT '...' after a type; neither changes a value's type.
    upper = rest.upper()
    for tail in (" NOT NULL", " COMMENT "):
        if tail in upper:
            rest, upper = rest[: upper.index(tail)], upper[: upper.index(tail)]
    return name, rest.strip()


def parse_ddl_type(text: str) -> DdlType:
    """One Spark type (``"decimal(10,2)"``, ``"array<struct<a:int>>"``, ``"BIGINT"``) as a
    ``DdlType``; raises ``ValueError`` naming what is not understood."""
    t = text.strip()
    low = t.lower()
    head = low.split("<", 1)[0].split("(", 1)[0].strip()
    if head in _SCALARS and (head not in ("varchar", "char") or low == head or "(" in low):
        return (_SCALARS[head],)
    if head in _DECIMALS:
        args = low[len(head) :].strip()
        if not args:
            return ("decimal", 10, 0)
        if not (args.startswith("(") and args.endswith(")")):
            raise ValueError(f"not a Spark type: {text!r}")
        nums = [int(a) for a in args[1:-1].split(",")]
        p, s = [*nums, 0][:2]
        return ("decimal", p, s)
    if not (low.endswith(">") and "<" in low):
        raise ValueError(f"not a Spark type: {text!r}")
    inner = t[t.index("<") + 1 : -1]
    if head == "array":
        return ("array", parse_ddl_type(inner))
    if head == "map":
        parts = split_ddl_list(inner)
        if len(parts) != 2:
            raise ValueError(f"not a Spark type: {text!r}")
        return ("map", parse_ddl_type(parts[0]), parse_ddl_type(parts[1]))
    if head == "struct":
        members = [_split_name(p) for p in split_ddl_list(inner)]
        return ("struct", tuple((n, parse_ddl_type(ty)) for n, ty in members))
    raise ValueError(f"not a Spark type: {text!r}")


def parse_ddl_columns(ddl: str) -> list[tuple[str, DdlType]]:
    """A DDL column list (``"customer string, total double"``) as (name, type) pairs."""
    return [(n, parse_ddl_type(t)) for n, t in map(_split_name, split_ddl_list(ddl))]


def ddl_arrow_type(t: DdlType) -> pa.DataType:
    """Spark's own Spark → Arrow mapping of one type (timestamps in microseconds, with
    tz UTC unless ``timestamp_ntz``)."""
    import pyarrow as pa

    name = t[0]
    if name in _INT_BITS:
        return getattr(pa, f"int{_INT_BITS[name]}")()
    scalars = {
        "string": pa.string,
        "double": pa.float64,
        "float": pa.float32,
        "boolean": pa.bool_,
        "date": pa.date32,
        "binary": pa.binary,
    }
    if name in scalars:
        return scalars[name]()
    if name == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if name == "timestamp_ntz":
        return pa.timestamp("us")
    if name == "decimal":
        return pa.decimal128(t[1], t[2])
    if name == "array":
        return pa.list_(ddl_arrow_type(t[1]))
    if name == "map":
        return pa.map_(ddl_arrow_type(t[1]), ddl_arrow_type(t[2]))
    return pa.struct([pa.field(n, ddl_arrow_type(m)) for n, m in t[1]])


def ddl_text(t: DdlType) -> str:
    """``t`` spelt as Spark's ``simpleString`` (for messages)."""
    name = t[0]
    if name == "decimal":
        return f"decimal({t[1]},{t[2]})"
    if name == "array":
        return f"array<{ddl_text(t[1])}>"
    if name == "map":
        return f"map<{ddl_text(t[1])},{ddl_text(t[2])}>"
    if name == "struct":
        members = (f"{n if n.isidentifier() else quote_ddl(n)}:{ddl_text(m)}" for n, m in t[1])
        return "struct<" + ",".join(members) + ">"
    return str(name)


def _has_decimal(t: DdlType) -> bool:
    if t[0] == "decimal":
        return True
    if t[0] == "array":
        return _has_decimal(t[1])
    if t[0] == "map":
        return _has_decimal(t[2])
    return t[0] == "struct" and any(_has_decimal(m) for _, m in t[1])


def _floats(v: Any) -> Any:
    """``v`` decoded with ``parse_float=Decimal``, as the json serde decodes it."""
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, list):
        return [_floats(x) for x in v]
    if isinstance(v, dict):
        return {k: _floats(x) for k, x in v.items()}
    return v


def _walker(t: DdlType) -> Any:
    """``v`` (decoded with ``parse_float=Decimal``) → decimals where ``t`` declares one
    (an int there too), the serde's floats everywhere else."""
    name = t[0]
    if name == "decimal":
        # ``type(v) is int``: a JSON true is a bool, which Python counts as an int.
        return lambda v: (
            decimal.Decimal(v)
            if type(v) is int
            else v
            if isinstance(v, decimal.Decimal)
            else _floats(v)
        )
    if name == "array" and _has_decimal(t[1]):
        item = _walker(t[1])
        return lambda v: [item(x) for x in v] if isinstance(v, list) else _floats(v)
    if name == "map" and _has_decimal(t[2]):
        item = _walker(t[2])
        return lambda v: {k: item(x) for k, x in v.items()} if isinstance(v, dict) else _floats(v)
    if name == "struct" and _has_decimal(t):
        return _record_walker(t[1])
    return _floats


def _record_walker(columns: Sequence[tuple[str, DdlType]]) -> Any:
    members = {n: _walker(m) for n, m in columns}

    def walk(v: Any) -> Any:
        if not isinstance(v, dict):
            return _floats(v)
        return {k: members.get(k, _floats)(x) for k, x in v.items()}

    return walk


#: Quirk: Python's default decimal context keeps 28 digits, and quantizing a Spark decimal
#: of up to 38 digits in it fails; this one holds any (rounding half to even, as Spark).
WIDE_DECIMALS = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_EVEN)


class _Misfit(ValueError):
    """A decoded value that does not fit its declared type (``typed_value_arrays`` names
    the column)."""


def _misfit(value: Any, t: DdlType) -> _Misfit:
    return _Misfit(f"{value!r} does not fit {ddl_text(t)}")


def _converter(t: DdlType) -> Any:
    """``decoded value -> the Python value pa.array takes for ddl_arrow_type(t)``, from the
    JSON Spark's ``to_json`` writes (and iqkit's ``store.encoding.json_arrow`` alike): numbers,
    decimals as JSON numbers (``Decimal`` from ``exact_value_decoder``; a decimal's text is
    read too, as Spark's ``from_json`` does), dates as ``yyyy-MM-dd``, timestamps as
    ISO-8601 text of any precision (with
    an offset, naive = UTC), binary as base64, maps as objects, structs as objects without
    their null members. ``None`` stays ``None``; anything else raises ``_Misfit``."""
    import base64
    import binascii
    import datetime as dt

    name = t[0]

    def check(ok: Any) -> Any:
        def convert(v: Any) -> Any:
            if v is None:
                return None
            out = ok(v)
            if out is _NO:
                raise _misfit(v, t)
            return out

        return convert

    if name == "string":
        return check(lambda v: v if isinstance(v, str) else _NO)
    if name == "boolean":
        return check(lambda v: v if isinstance(v, bool) else _NO)
    if name in _INT_BITS:
        bound = 2 ** (_INT_BITS[name] - 1)
        # ``type(v) is int``: a JSON true is a bool, which Python counts as an int.
        return check(lambda v: v if type(v) is int and -bound <= v < bound else _NO)
    if name in ("double", "float"):
        return check(lambda v: float(v) if type(v) in (int, float) else _NO)
    if name == "decimal":
        p, s = t[1], t[2]
        quantum = decimal.Decimal(1).scaleb(-s)

        def as_decimal(v: Any) -> Any:
            if isinstance(v, decimal.Decimal):
                d = v
            elif isinstance(v, str):  # Spark's from_json reads a decimal's text too
                try:
                    d = decimal.Decimal(v)
                except decimal.InvalidOperation:
                    return _NO
            elif type(v) in (int, float):
                # The json serde decodes a number as a double: its shortest text is the
                # decimal Spark wrote whenever that had at most 15 significant digits.
                d = decimal.Decimal(repr(v)) if type(v) is float else decimal.Decimal(v)
            else:
                return _NO
            if not d.is_finite():
                return _NO
            d = d.quantize(quantum, context=WIDE_DECIMALS)
            return d if len(d.as_tuple().digits) <= p else _NO

        return check(as_decimal)
    if name == "date":

        def as_date(v: Any) -> Any:
            if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
                return v
            try:
                return dt.date.fromisoformat(v) if isinstance(v, str) else _NO
            except ValueError:
                return _NO

        return check(as_date)
    if name in ("timestamp", "timestamp_ntz"):
        ntz = name == "timestamp_ntz"

        def as_timestamp(v: Any) -> Any:
            if isinstance(v, str):
                try:
                    v = dt.datetime.fromisoformat(v)
                except ValueError:
                    return _NO
            if not isinstance(v, dt.datetime):
                return _NO
            if ntz:
                return v.replace(tzinfo=None)
            return v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)

        return check(as_timestamp)
    if name == "binary":

        def as_bytes(v: Any) -> Any:
            if isinstance(v, bytes | bytearray):
                return bytes(v)
            try:
                return base64.b64decode(v, validate=True) if isinstance(v, str) else _NO
            except (binascii.Error, ValueError):
                return _NO

        return check(as_bytes)
    if name == "array":
        item = _converter(t[1])
        return check(lambda v: [item(x) for x in v] if isinstance(v, list) else _NO)
    if name == "map":
        key, val = _converter(t[1]), _converter(t[2])
        text_keys = t[1][0] == "string"

        def map_key(k: str) -> Any:
            if text_keys:
                return k
            try:  # a JSON object's keys are text: Spark writes 1 as "1"
                return key(json.loads(k))
            except (ValueError, _Misfit):
                return key(k)

        return check(
            lambda v: [(map_key(k), val(x)) for k, x in v.items()] if isinstance(v, dict) else _NO
        )
    members = [(n, _converter(m)) for n, m in t[1]]
    names = {n for n, _ in members}

    def as_struct(v: Any) -> Any:
        if not isinstance(v, dict) or not names.issuperset(v):
            return _NO
        return {n: conv(v.get(n)) for n, conv in members}

    return check(as_struct)


#: ``_converter``'s "does not fit".
_NO = object()

#: Python types a column of these DDL types takes as they are (``pa.array`` in C).
_PLAIN = {"string": (str,), "boolean": (bool,), "double": (float,), "float": (float,)}
_PLAIN.update({name: (int,) for name in _INT_BITS})


def typed_value_arrays(
    columns: Sequence[tuple[str, DdlType]], values: Sequence[Any]
) -> list[pa.Array]:
    """One typed Arrow array per value column (``columns``: ``RowSchema.value_columns``'
    members and types) of ``values``, the decoded stored values (JSON objects as dicts;
    ``None``, a delete's, is a row of nulls; a missing member is null). Exact: a value that
    does not fit its column's type (a string in a ``bigint``, 2**40 in an ``int``, a member
    the schema does not declare, a value that is no JSON object) raises one ``ValueError``
    naming the column (or the member) and the value."""
    import pyarrow as pa

    for v in values:
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"value {v!r} is not a JSON object, as the value schema needs")
    declared = {n for n, _ in columns}
    for v in values:
        if v is not None and not declared.issuperset(v):
            extra = sorted(set(v) - declared, key=str)[0]
            raise ValueError(f"value member {extra!r} is not in the value schema")
    out = []
    for name, t in columns:
        column = [None if v is None else v.get(name) for v in values]
        arrow_type = ddl_arrow_type(t)
        plain = _PLAIN.get(t[0])
        kinds = set(map(type, column))
        kinds.discard(type(None))
        if plain is not None and kinds.issubset(plain):
            try:  # the common case, in C; what it refuses is named by the converter below
                out.append(pa.array(column, arrow_type))
                continue
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                pass
        try:
            convert = _converter(t)
            out.append(pa.array([convert(v) for v in column], arrow_type))
        except _Misfit as exc:
            raise ValueError(f"value column {name!r}: {exc}") from None
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            raise ValueError(f"value column {name!r}: {exc}") from None
    return out
