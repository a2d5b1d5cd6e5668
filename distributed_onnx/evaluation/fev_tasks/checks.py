"""What a fev benchmark's tasks are refused or skipped for before anything is loaded or Ray is joined.

The rules are the backtest's, applied to each task's own values: the task's settings by the backtest's settings
model (:func:`check_tasks`: a refusal, exit 2, naming the task), its quantile levels against each checkpoint's
native range (:func:`levels_reason`: that task x checkpoint skipped, with the reason, unless clamping is asked).
The run-wide checks (names, the output) are the backtest's own (``evaluation/up_front.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.up_front import levels_problem
from distributed_onnx.location import LocationLike
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

__all__ = ["check_tasks", "levels_reason", "task_levels"]


def check_tasks(tasks: Sequence[Any], output: LocationLike, settings: dict[str, Any]) -> None:
    """Refuse, before anything is loaded or started, a task whose own settings the backtest refuses whatever the
    checkpoint (a seasonality of 0, a horizon beyond the bounds): validated by the backtest's settings model, as
    each of its runs will be, so no pair of it becomes a failure that a rerun repeats. One line naming the task
    and the rule (exit 2)."""
    for index, task in enumerate(tasks):
        own = {"horizon": int(task.horizon), "seasonality": task.seasonality, "quantiles": task_levels(task)}
        source = f"fev task {str(task.task_name)!r}, {index + 1} of {len(tasks)} in the benchmark"
        BacktestSettings.from_sources({**settings, **own, "output": output}, source=source[:200])


def task_levels(task: Any) -> list[float]:
    """The quantile levels a task's forecasts need: its own and 0.5 (fev's point forecast is the median)."""
    return sorted({0.5, *(float(level) for level in task.quantile_levels)})


def levels_reason(task: Any, checkpoint: ResolvedCheckpoint, *, clamp: bool) -> str | None:
    """Why ``checkpoint`` cannot forecast ``task``'s quantile levels (some outside its native range), unless
    clamping is asked for: the backtest's own rule (``evaluation/up_front.py``)."""
    problem = None if clamp else levels_problem(checkpoint.name, task_levels(task), checkpoint.metadata)
    if problem is None:
        return None
    return f"{problem}; with --clamp-quantiles each is forecast as the nearest native level"
