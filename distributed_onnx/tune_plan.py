"""What ``tune`` measures and how its budget is shared among the trials: the graph optimization levels, the batch
sizes, the accuracy gate's share, and the batch sizes a trial can afford.

Pure (no ONNX Runtime session, no timing), apart from the trials themselves (:mod:`.tune_trials`) and the
command's flow (:mod:`.tune`), so that the sizing that keeps ``tune`` within its budget is read and tested alone.
"""

from __future__ import annotations

from typing import Literal

#: The graph optimization levels measured, as the backtest's ``graph_optimization`` names them.
LEVELS: dict[str, Literal["ENABLE_BASIC", "ENABLE_EXTENDED", "ENABLE_ALL"]] = {
    "basic": "ENABLE_BASIC",
    "extended": "ENABLE_EXTENDED",
    "all": "ENABLE_ALL",
}
#: The batch sizes tried (those above the windows held are left out).
BATCHES = (1, 4, 16, 64, 256)
#: The share of the budget the variants' accuracy gate takes when there are variants (:mod:`.tune_gate`).
GATE_SHARE = 1 / 3


def affordable_batches(windows: int, window_s: float, budget_s: float, layouts: int) -> list[int]:
    """The batch sizes of :data:`BATCHES` a trial can time: at most ``windows``, and one call of the size takes at
    most half of a trial's share of the budget (a trial runs a warm-up call and at least one timed call, so a
    longer call overruns the budget: a 256-row call of a Chronos-2-sized graph on one core takes minutes).
    ``window_s`` is one window's call on one thread, the slowest layout; ``layouts`` the trials besides the levels
    and the batches (the layouts, and the variants' timings). 1 when nothing larger fits."""
    trial_s = budget_s / (len(LEVELS) + len(BATCHES) + layouts)
    return [size for size in BATCHES if size <= windows and size * window_s <= trial_s / 2] or [1]
