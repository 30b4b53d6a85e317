"""iqkit: Kafka Streams-style interactive queries (IQv2) over partitioned RocksDB state
stores written by Spark, from Python and Jupyter.

    import iqkit
    iqkit.create_store("stores", "totals", partitions=4)
    with iqkit.StoreWriter("stores", "totals") as w:
        w.put("alice", {"total": 42}, source=("orders", 0, 17))
    with iqkit.open("stores") as engine:
        r = engine.query(iqkit.StateQueryRequest.in_store("totals")
                         .with_query(iqkit.KeyQuery.with_key("alice")))
        r.only_partition_result().result   # {'total': 42}
"""

from typing import TYPE_CHECKING, Any

from . import query
from .errors import (
    EngineClosedError,
    IqkitError,
    StoreCorruptedError,
    StoreExistsError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownStoreError,
)

# The query model's public names, whose one list is iqkit.query.__all__ (added to this
# __all__ below). ruff cannot tell which names a star import brings (F403): it is this one.
from .query import *  # noqa: F403

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these load on first use
    from .engine import StateEngine, open
    from .sqlsession import SQLError, SQLSession, sql
    from .store.encoding.partitioners import murmur2
    from .store.encoding.serdes import get_serde
    from .store.manifest import StoreManifest
    from .store.writer import StoreWriter, compact, create_store

#: The public names whose modules load on first use (PEP 562), so that ``import iqkit``
#: costs only the query model and the errors: the engine, the writer, the SQL session
#: and what they import (rocksdict, pyarrow, numpy, duckdb) load when a script first
#: names them. Name -> the module (below ``iqkit``) that defines it.
_LAZY = {
    "StateEngine": "engine",
    "open": "engine",
    "SQLError": "sqlsession",
    "SQLSession": "sqlsession",
    "sql": "sqlsession",
    "murmur2": "store.encoding.partitioners",
    "get_serde": "store.encoding.serdes",
    "StoreManifest": "store.manifest",
    "StoreWriter": "store.writer",
    "create_store": "store.writer",
    "compact": "store.writer",
}
#: The subpackages a bare ``import iqkit`` makes attributes (``iqkit.engine`` works with
#: no ``import iqkit.engine`` first), loaded on first use too.
_LAZY_MODULES = {"engine", "sqlsession", "store"}


def __getattr__(name: str) -> Any:
    """PEP 562: a lazily loaded public name (or subpackage), bound here once loaded."""
    from importlib import import_module

    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _LAZY_MODULES:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _LAZY_MODULES)


__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext iqkit``: register the ``%iq`` magics (see ``iqkit.jupyter``)."""
    from .jupyter import load_ipython_extension as load

    load(ipython)


def panel(root: object = None, **session_options: object) -> object:
    """The widget query builder (``iqkit.jupyter.panel.panel``); needs ipywidgets."""
    from .jupyter.panel import panel as build_panel

    return build_panel(root, **session_options)


def verify(
    root: object, stores: list[str] | str | None = None, *, repair: bool = False
) -> object:
    """Check every file of every retained version of ``stores`` (default: every store
    under ``root``) against the checksums their records keep: a ``VerifyReport`` with
    one entry per damaged file (``.ok``, ``.lines()``, ``.to_pandas()``). ``repair``
    rebuilds a damaged columnar twin from its SST when the result is the file its record
    describes (``python -m iqkit verify``; store/chain/verify.py)."""
    from .store.formats import format_for
    from .store.roots import parse_root

    names = [stores] if isinstance(stores, str) else stores
    storage = format_for(parse_root(root))  # type: ignore[arg-type]
    storage.check_root()  # a missing root folder is one line, as opening one is
    return storage.verify(names, repair=repair)


def unload_ipython_extension(ipython: object) -> None:
    from .jupyter import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "EngineClosedError",
    "IqkitError",
    "SQLError",
    "SQLSession",
    "StateEngine",
    "StoreCorruptedError",
    "StoreExistsError",
    "StoreIOError",
    "StoreLockedError",
    "StoreManifest",
    "StoreNotFoundError",
    "StoreWriter",
    "UnknownStoreError",
    "__version__",
    "compact",
    "create_store",
    "get_serde",
    "load_ipython_extension",
    "murmur2",
    "open",
    "panel",
    "sql",
    "unload_ipython_extension",
    "verify",
]
__all__ += query.__all__  # the query model's public names (listed there once)
