"""Issue 42: every metric formula lives in ``evaluation/scoring/`` (the registry's classes and the sums they read).

The package's source is read as Python (its syntax tree, not its text, so docstrings and comments that state a
formula do not count) for the shapes a forecast metric is written in: the absolute value of a difference (MAE,
MASE and the seasonal scale), a square root of squares (RMSE), and the pinball loss's ``min(u, 0)`` or
``max(q u, (q - 1) u)``. Outside ``evaluation/scoring/`` none may occur, but in the few places listed below
with what they compute instead; a new one fails this test with its file, line and function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import distributed_onnx

PACKAGE = Path(distributed_onnx.__file__).parent
SCORING = PACKAGE / "evaluation" / "scoring"

#: (file, function) -> why the shape found there is no forecast metric.
NOT_METRICS = {
    ("export/parity.py", "parity_statistics"): "the gap between two runtimes' outputs (export and variant parity)",
    ("evaluation/fans.py", "pick"): "the window whose score is closest to its series' score",
    ("export/tirex.py", "get_loc_scale"): "TiRex's own input scaling (the context's standard deviation), in the graph",
    ("export/chronos_bolt.py", "forward"): "Chronos-Bolt's own input scaling (likewise), in the graph",
    ("reference/model.py", "masked_loc_scale"): "the reference model's input scaling (mean absolute deviation)",
    ("reference/model.py", "pinball_loss"): "the reference model's training objective (a differentiable torch loss)",
}


def _name(node: ast.expr) -> str:
    """``np.abs`` -> ``abs``, ``x.sqrt`` -> ``sqrt``, ``abs`` -> ``abs``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, 0.0)


def _squares(node: ast.AST) -> bool:
    """Whether ``node`` squares something: ``x ** 2``, ``np.square(x)``, ``x.square()``, ``x * x``."""
    for inner in ast.walk(node):
        power = isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Pow)
        if power and isinstance(inner.right, ast.Constant) and inner.right.value == 2:  # type: ignore[attr-defined]
            return True
        if isinstance(inner, ast.Call) and _name(inner.func) == "square":
            return True
    return False


def _formula(node: ast.AST, tolerances: set[ast.AST] = frozenset()) -> str | None:  # type: ignore[assignment]
    """The metric shape ``node`` is, if any. ``tolerances``: the calls compared with something (``abs(a - b) <=
    tol``: two levels or numbers the same within a tolerance, no error of a forecast)."""
    if not isinstance(node, ast.Call) or node in tolerances:
        return None
    name, args = _name(node.func), node.args
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    operand = args[0] if args else receiver  # np.abs(a - b) or (a - b).abs()
    if name == "abs" and isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Sub):
        if any(isinstance(side, ast.Constant) for side in (operand.left, operand.right)):
            return None  # the distance of a level from a constant (0.5: the median's), no error of a forecast
        return "absolute value of a difference"
    if name == "sqrt" and operand is not None and _squares(operand):
        return "square root of squares"
    if name in ("minimum", "min") and len(args) == 2 and _is_zero(args[1]):
        return "min(u, 0) (pinball loss)"
    if name in ("maximum", "max") and len(args) == 2 and all(isinstance(a, ast.BinOp) for a in args):
        return "max(q u, (q - 1) u) (pinball loss)"
    return None


def _found(path: Path) -> list[tuple[str, int, str, str]]:
    """``(file, line, innermost function, shape)`` of every metric shape in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    compares = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)]
    tolerances: set[ast.AST] = {side for node in compares for side in (node.left, *node.comparators)}
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            function = getattr(node, "name", function)
        shape = _formula(node, tolerances)
        if shape is not None:
            found.append((path.relative_to(PACKAGE).as_posix(), getattr(node, "lineno", 0), function, shape))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_no_metric_formula_outside_scoring() -> None:
    found = {hit for path in sorted(PACKAGE.rglob("*.py")) if SCORING not in path.parents for hit in _found(path)}
    unexplained = sorted(hit for hit in found if (hit[0], hit[2]) not in NOT_METRICS)
    assert not unexplained, (
        "metric formulas outside evaluation/scoring/ (compute them from the registry):\n"
        + "\n".join(f"  {file}:{line} in {function}(): {shape}" for file, line, function, shape in unexplained)
    )
    # Each exception still holds its shape (a stale entry would hide a new formula in that function later).
    assert {(hit[0], hit[2]) for hit in found} >= set(NOT_METRICS)


def test_the_scan_finds_the_shapes_it_looks_for() -> None:
    """The scan on formulas written the ways this package writes them (and misses a plain difference)."""
    source = """
def f(y, q, e, u):
    a = np.abs(y - q)
    b = np.sqrt(np.mean((y - q) ** 2))
    c = (2.0 * (q * e - np.minimum(e, 0.0))).mean()
    d = max(q * u, (q - 1.0) * u)
    e = (y - q).abs()
    return abs(y) - q
"""
    shapes = [_formula(node) for node in ast.walk(ast.parse(source))]
    assert sorted(shape for shape in shapes if shape) == sorted(
        [
            "absolute value of a difference",
            "square root of squares",
            "min(u, 0) (pinball loss)",
            "max(q u, (q - 1) u) (pinball loss)",
            "absolute value of a difference",
        ]
    )
