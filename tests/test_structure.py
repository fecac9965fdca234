"""The tree's shape: no import circle between any two modules of chatcli (function-level imports and a
package's own `__init__` included, which import-linter's sibling contract does not see), and no
module over 400 lines. The layers themselves are import-linter's contracts (pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

import grimp

import chatcli

ROOT = Path(chatcli.__file__).parent
MAX_LINES = 400


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_one():
    graph = grimp.ImportGraph()
    for name in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(name)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a")  # a module and its package's __init__
    graph.add_import(importer="a", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert circles(graph) == [["a", "a.b", "a.c"]]


def test_no_import_circle_anywhere_in_chatcli():
    graph = grimp.build_graph("chatcli", cache_dir=None)
    assert "chatcli.engine.load.build" in graph.modules and graph.find_modules_directly_imported_by("chatcli.cli")
    assert circles(graph) == []


def test_no_module_over_400_lines():
    sizes = {
        str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")
    }
    assert len(sizes) > 50
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}
