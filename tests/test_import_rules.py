"""The import rules of ``iqkit/jupyter`` (issue 12, item 7): no module imports, directly
or through others, a module that imports it back -- counting imports inside functions,
which hide a cycle without removing it (only ``if TYPE_CHECKING:`` imports, never run,
are left out) -- and one home, ``magic.py``, finds the live ``%iq`` magics of a shell."""

from __future__ import annotations

import ast
from pathlib import Path

import iqkit.jupyter

PACKAGE = Path(iqkit.jupyter.__file__).parent


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST) -> set[str]:
    """The sibling modules ``tree`` imports (``from . import x``, ``from .x import y``)."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[:2] == ["iqkit", "jupyter"] and len(parts) > 2:
                found.add(parts[2])
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the sibling modules it imports (the package's ``__init__`` left out: it
    is imported before any of them by definition)."""
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8"))) & modules.keys()
        for name, path in modules.items()
    }


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


def test_only_magic_looks_for_the_live_magics():
    searching = sorted(
        p.name for p in PACKAGE.glob("*.py") if "configurables" in p.read_text(encoding="utf-8")
    )
    assert searching == ["magic.py"]
