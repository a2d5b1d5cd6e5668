"""Every blocking wait on Ray in the package has a deadline: a new ``ray.get``/``ray.wait`` without ``timeout=``, or
a ``serve.run`` (it waits for the application without one), fails here.

Unit tier: the package's source is read, not run. A wait that is bounded another way is allowed below, with why.
Unbounded waits hung commands with no error: a pool waiting for actors the cluster had no room for (``fev`` with
two sets of checkpoints on 2 CPUs), ``serve`` waiting for replicas no node could host.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "distributed_onnx"

#: (module, function) -> why its wait without ``timeout=`` cannot block.
ALLOWED = {
    ("runtime/dispatch_runtime.py", "get"): "reads a ref that wait() returned ready (fetched): nothing to wait for",
}


class _Waits(ast.NodeVisitor):
    """The blocking waits on Ray of one module: (function, line, call) of each without a deadline."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.found: list[tuple[str, int, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
            call = f"{function.value.id}.{function.attr}"
            has_deadline = any(keyword.arg == "timeout" for keyword in node.keywords)
            if (call in {"ray.get", "ray.wait"} and not has_deadline) or call == "serve.run":
                self.found.append((self.functions[-1] if self.functions else "<module>", node.lineno, call))
        self.generic_visit(node)


def unbounded_waits(root: Path) -> list[str]:
    """``module:line function call`` of every wait under ``root`` without a deadline and not allowed."""
    unbounded = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        waits = _Waits()
        waits.visit(ast.parse(path.read_text(encoding="utf-8")))
        for function, line, call in waits.found:
            if (module, function) not in ALLOWED:
                unbounded.append(f"{module}:{line} {function}() calls {call} without a deadline")
    return unbounded


def test_every_wait_on_ray_in_the_package_has_a_deadline() -> None:
    assert unbounded_waits(PACKAGE) == [], "give it timeout= (a setting or a derived deadline), or allow it here"


def test_the_scan_finds_an_unbounded_wait(tmp_path: Path) -> None:
    """The scan itself: a wait without ``timeout=`` is named; one with it, and an allowed one, are not."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "dispatch_runtime.py").write_text("def get(ref):\n    return ray.get(ref)\n")
    (tmp_path / "pool.py").write_text(
        "def start(refs):\n    ray.get(refs, timeout=5)\n    ray.wait(refs)\n\nserve.run(app)\n", encoding="utf-8"
    )
    assert unbounded_waits(tmp_path) == [
        "pool.py:3 start() calls ray.wait without a deadline",
        "pool.py:5 <module>() calls serve.run without a deadline",
    ]
