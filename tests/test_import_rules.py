"""The import rules docs/ARCHITECTURE.md states.

- No import circles anywhere in the package: no module imports, directly or through
  others, a module that imports it back. Every import counts, wherever it is written: at
  the top, inside a function (which hides a circle without removing it) or under ``if
  TYPE_CHECKING:`` (a circle for whoever reads, tests or moves the modules, even if it
  never runs). Two modules that need each other hold one concept in the wrong place.
- Between the package's parts, imports go one way: ``LAYERS`` says what each part may
  import (the query model no I/O, ``store`` nothing above it, Spark nothing of the
  notebook layer, ...).
- One home, ``jupyter/magic.py``, finds the live ``%iq`` magics of a shell."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import iqkit

ROOT = Path(iqkit.__file__).parent
PACKAGE = ROOT / "jupyter"

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


def _module_files(base: Path, packages: Sequence[str]) -> dict[str, Path]:
    """Dotted module name → file, for the packages (or single modules) ``packages`` in
    folder ``base``; a package's ``__init__.py`` is the package's own name."""
    files: dict[str, Path] = {}
    for top in packages:
        folder = base / top
        paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
        for path in paths:
            parts = path.relative_to(base).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def module_graph(base: Path, packages: Sequence[str]) -> dict[str, set[str]]:
    """Module → the modules of ``packages`` it imports, read from the source (nothing is
    imported): every ``import`` and ``from ... import`` anywhere in the file, at the top,
    inside functions and under ``if TYPE_CHECKING:``. Relative imports are resolved; ``from
    pkg import name`` means the submodule ``pkg.name`` when there is one, else ``pkg``."""
    files = _module_files(base, packages)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name.split(".") if path.stem == "__init__" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    start = package[: len(package) - (node.level - 1)]
                    module = ".".join([*start, *(node.module.split(".") if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    found.add(sub if sub in files else module)
        graph[name] = (found & files.keys()) - {name}
    return graph


def _path(graph: dict[str, set[str]], start: str, goal: str, within: set[str]) -> list[str]:
    """The shortest import path from ``start`` to ``goal`` through ``within`` (both
    ends excluded)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for here in frontier:
            for there in sorted(graph[here] & within):
                if there in came or there == start:
                    continue
                came[there] = here
                if there == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return path[::-1][1:-1]
                nxt.append(there)
        frontier = nxt
    raise AssertionError(f"no path from {start} to {goal}")  # pragma: no cover


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph``: each strongly connected set of more than one
    module (Tarjan's algorithm), as a path that visits all of them and returns to its
    first, ``[a, b, ..., a]``, following imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # Iterative depth-first search: (module, its imports still to visit).
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, todo = work[-1]
            child = next(todo, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    circles = []
    for component in components:
        order = sorted(component)
        walk = [order[0]]
        for goal in [*order[1:], order[0]]:
            if goal in walk[1:] and goal != order[0]:
                continue  # visited on the way to an earlier one
            walk += [*_path(graph, walk[-1], goal, component), goal]
        circles.append(walk)
    return sorted(circles)


def _write_package(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_module_graph_reads_every_form_of_import(tmp_path):
    _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\n",
            "pkg/a.py": "import os\nfrom . import b\nfrom .sub import c\n",
            "pkg/b.py": "if TYPE_CHECKING:\n    from .sub.c import C\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "def f():\n    from .. import a\n    import pkg.b\n",
            "pkg/sub/d.py": "from pkg import A\nfrom ..sub import nothing_here\n",
        },
    )
    assert module_graph(tmp_path, ["pkg"]) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a", "pkg.b"},
        "pkg.sub.d": {"pkg", "pkg.sub"},
    }


def test_the_circle_finder_finds_every_circle(tmp_path):
    _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/one.py": "from . import two\n",
            "pkg/two.py": "def f():\n    from .one import x\n",
            "pkg/three.py": "from .one import y\n",
        },
    )
    assert import_circles(module_graph(tmp_path, ["pkg"])) == [["pkg.one", "pkg.two", "pkg.one"]]
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert import_circles(graph) == [["a", "b", "c", "a"], ["d", "e", "d"]]
    # A set of modules that no single cycle visits is named as one walk through them all.
    star = {"hub": {"x", "y"}, "x": {"hub"}, "y": {"hub"}}
    assert import_circles(star) == [["hub", "x", "hub", "y", "hub"]]
    assert import_circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_module_of_the_package_is_in_an_import_circle():
    graph = module_graph(ROOT.parent, ["iqkit", "pyspark_iqkit"])
    assert {"iqkit.jupyter.magic", "iqkit.store.checkpoint.layout", "pyspark_iqkit"} <= graph.keys()
    circles = import_circles(graph)
    assert not circles, "import circles (move the concept both need to where it belongs):\n" + (
        "\n".join(" -> ".join(circle) for circle in circles)
    )


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
