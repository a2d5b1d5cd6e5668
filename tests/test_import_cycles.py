"""Unit tier: no two modules of the package import each other, directly or through others.

A circle of imports means neither module can be read, tested or moved without the other, and which one Python
finishes loading first depends on who imported it first. import-linter's contracts keep the layers apart, but a
circle inside one layer (or one folder) breaks none of them, so this test looks for circles itself: grimp (the
graph import-linter builds on) reads every import of the package, those under ``TYPE_CHECKING`` and inside
functions included, and every strongly connected group of two or more modules is a circle, named with the
import lines that close it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

import pytest

PACKAGE = "distributed_onnx"

#: Circles known and being removed elsewhere: the only ones this test lets pass. None: ``export/``'s (request <->
#: common, variants, random_weights) went when the request type was put apart from the dispatch (issue 53).
ALLOWED_INSIDE: tuple[str, ...] = ()


def circles(imports: Mapping[str, Set[str]]) -> list[list[str]]:
    """Each circle of ``imports`` (module -> the modules it imports): its modules, sorted; the circles sorted.

    A circle is a strongly connected component of two or more modules (Tarjan's algorithm, iterative: the
    package's depth must not meet Python's recursion limit).

    >>> circles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    >>> circles({"a": {"b"}, "b": {"c"}, "c": set()})
    []
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(imports.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, pending = work[-1]
            if pending:
                imported = pending.pop()
                if imported not in index:
                    index[imported] = low[imported] = len(index)
                    stack.append(imported)
                    on_stack.add(imported)
                    work.append((imported, sorted(imports.get(imported, ()))))
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _allowed(circle: Iterable[str]) -> bool:
    return all(any(module.startswith(f"{inside}.") for inside in ALLOWED_INSIDE) for module in circle)


def _described(graph: Any, circle: list[str]) -> str:
    """The circle's modules and each import line between two of them (file line and text)."""
    members = set(circle)
    lines = []
    for importer in circle:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    return f"{' <-> '.join(circle)}\n" + "\n".join(lines)


def test_the_package_has_no_import_circle() -> None:
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter, a dev dependency")
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    found = circles(imports)
    unexpected = [circle for circle in found if not _allowed(circle)]
    assert not unexpected, (
        f"{len(unexpected)} import circle(s) in {PACKAGE}; move what both modules need to where it belongs (a "
        "module below both, or a Protocol the importer owns), not into a function-level import:\n"
        + "\n".join(_described(graph, circle) for circle in unexpected)
    )


def test_a_circle_is_found_and_named() -> None:
    """The check can fail: a circle through three modules, and one inside a package, are each reported once."""
    imports = {
        "p.a": {"p.b"},
        "p.b": {"p.c", "q"},
        "p.c": {"p.a"},
        "q": {"r"},
        "r": {"q"},
        "s": {"p.a"},
    }
    assert circles(imports) == [["p.a", "p.b", "p.c"], ["q", "r"]]
    assert not _allowed(["distributed_onnx.export.common", "distributed_onnx.export.request"])
    assert not _allowed(["distributed_onnx.export.common", "distributed_onnx.live.log.writer"])
