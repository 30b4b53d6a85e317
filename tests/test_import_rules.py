"""The import rules docs/ARCHITECTURE.md states (issue 12, items 7 and 10).

- Inside each subpackage, no module imports, directly or through others, a module that
  imports it back -- counting imports inside functions, which hide a cycle without
  removing it (only ``if TYPE_CHECKING:`` imports, never run, are left out).
- Between the package's parts, imports go one way: ``LAYERS`` says what each part may
  import (the query model no I/O, ``store`` nothing above it, Spark nothing of the
  notebook layer, ...).
- One home, ``jupyter/magic.py``, finds the live ``%iq`` magics of a shell."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iqkit

ROOT = Path(iqkit.__file__).parent
PACKAGE = ROOT / "jupyter"
SUBPACKAGES = ("query", "store", "spark", "jupyter", "sqlsession")

#: What each part of ``iqkit`` may import (its own modules aside). ``__init__`` (the
#: public API), ``__main__`` (the CLI) and ``demo`` sit on top and may import any part.
LAYERS: dict[str, set[str]] = {
    "errors": set(),
    "query": {"errors"},
    "store": {"errors", "query"},
    "engine": {"errors", "query", "store"},
    "tables": {"errors", "query", "store"},
    "sqlsession": {"errors", "query", "store", "engine", "tables"},
    "spark": {"errors", "query", "store"},
    "jupyter": {"errors", "query", "store", "engine", "tables", "sqlsession"},
}
TOP = {"__init__", "__main__", "demo"}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported_modules(tree: ast.AST, here: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The ``iqkit`` modules ``tree`` imports, as paths below ``iqkit`` (``("store",
    "rocks")``); ``here`` is the importing module's package path. A ``from . import x``
    yields the package path plus ``x`` (a module or a name: callers match either)."""
    found: set[tuple[str, ...]] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            module = tuple(node.module.split(".")) if node.module else ()
            if module:
                found.add(base + module)
            else:
                found.update((*base, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = tuple(node.module.split("."))
            if parts[0] == "iqkit":
                found.add(parts[1:])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = tuple(alias.name.split("."))
                if parts[0] == "iqkit":
                    found.add(parts[1:])
        stack.extend(ast.iter_child_nodes(node))
    return found


def _imports(tree: ast.AST, package: str = "jupyter") -> set[str]:
    """The sibling modules of ``package`` that ``tree`` (one of its modules) imports."""
    return {
        path[1]
        for path in _imported_modules(tree, (package,))
        if len(path) > 1 and path[0] == package
    }


def import_graph(package: str = "jupyter") -> dict[str, set[str]]:
    """Module → the sibling modules it imports (the package's ``__init__`` left out: it
    is imported before any of them by definition)."""
    folder = ROOT / package
    modules = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), package) & modules.keys()
        for name, path in modules.items()
    }


def part_imports() -> dict[str, set[str]]:
    """Each part of ``iqkit`` (a top-level module or subpackage) → the other parts its
    modules import."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        part = rel[0]
        here = rel[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {target[0] for target in _imported_modules(tree, here) if target}
        graph.setdefault(part, set()).update(targets - {part})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt, [*path, nxt])
                if cycle:
                    return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name, [name])
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_jupyter_modules_import_each_other_without_cycles():
    graph = import_graph()
    assert {"magic", "session", "complete"} <= graph.keys()  # the package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in iqkit/jupyter: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_no_subpackage_has_an_import_cycle(package):
    graph = import_graph(package)
    assert len(graph) >= 3  # the package was read
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in iqkit/{package}: " + " -> ".join(cycle or [])


def test_the_part_reader_sees_imports_of_every_form():
    tree = ast.parse(
        "from ..store import rocks\nfrom . import keyspace\nimport iqkit.query.base\n"
        "from iqkit.errors import IqkitError\n"
        "if TYPE_CHECKING:\n    from ..engine import StateEngine\n"
        "def f():\n    from ..tables import x\n"
    )
    found = _imported_modules(tree, ("spark",))
    assert found == {("store",), ("spark", "keyspace"), ("query", "base"),
                     ("errors",), ("tables",)}  # fmt: skip


def test_parts_import_only_the_layers_below_them():
    graph = part_imports()
    assert set(LAYERS) | TOP <= graph.keys() | {"errors"}  # every part was read
    unknown = graph.keys() - LAYERS.keys() - TOP
    assert not unknown, f"a new part of iqkit needs its place in LAYERS: {sorted(unknown)}"
    wrong = {
        part: sorted(imported - LAYERS[part])
        for part, imported in graph.items()
        if part in LAYERS and imported - LAYERS[part]
    }
    assert not wrong, f"imports against docs/ARCHITECTURE.md's layers: {wrong}"


def test_only_magic_looks_for_the_live_magics():
    searching = sorted(
        p.name for p in PACKAGE.glob("*.py") if "configurables" in p.read_text(encoding="utf-8")
    )
    assert searching == ["magic.py"]


def _documented_modules(text: str) -> set[str]:
    """The ``iqkit`` modules named in docs/ARCHITECTURE.md's tree, as
    ``store/partitions/rocks.py``: a folder line (``  store/``) sets the folder of the file
    lines indented below it, nested folders included."""
    tree = text.split("## The tree", 1)[1].split("```")[1]
    found: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder) of the open folder lines
    ours = False
    for line in tree.splitlines():
        name = line.strip().split(" ", 1)[0]
        indent = len(line) - len(line.lstrip())
        if not name.endswith(("/", ".py")):
            continue  # a description's continuation line
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if indent == 0:
            # iqkit/'s subfolders are indented; another top folder (notebooks/) is not ours.
            ours = name == "iqkit/"
            continue
        if not ours:
            continue
        if name.endswith("/"):
            folders.append((indent, name))
        elif name != "__init__.py":
            found.add("".join(f for _, f in folders) + name)
    return found


def test_every_module_has_its_line_in_the_architecture_doc():
    doc = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    modules = {
        path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py") if path.stem != "__init__"
    }
    documented = _documented_modules(doc)
    assert {"store/partitions/rocks.py", "engine.py"} <= documented  # the tree was read
    missing, gone = sorted(modules - documented), sorted(documented - modules)
    assert not missing, f"modules docs/ARCHITECTURE.md does not describe: {missing}"
    assert not gone, f"docs/ARCHITECTURE.md describes modules that do not exist: {gone}"
