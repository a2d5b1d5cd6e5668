"""What a fev benchmark's tasks are refused or skipped for before anything is loaded or Ray is joined.

The rules are the backtest's, applied to each task's own values: the task's settings by the backtest's settings
model (:func:`check_tasks`: a refusal, exit 2, naming the task; and the type of its target column where its data is
a local Parquet file, whose footer says it without loading anything), its quantile levels against each checkpoint's
native range (:func:`levels_reason`: that task x checkpoint skipped, with the reason, unless clamping is asked).
The run-wide checks (names, the output) are the backtest's own (``evaluation/up_front.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.fev_tasks.sources import dataset_location
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.up_front import levels_problem
from distributed_onnx.location import LocationLike
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

__all__ = ["check_target_type", "check_tasks", "levels_reason", "task_levels"]


def check_tasks(tasks: Sequence[Any], output: LocationLike, settings: dict[str, Any]) -> None:
    """Refuse, before anything is loaded or started, a task whose own settings the backtest refuses whatever the
    checkpoint (a seasonality of 0, a horizon beyond the bounds): validated by the backtest's settings model, as
    each of its runs will be, so no pair of it becomes a failure that a rerun repeats. One line naming the task
    and the rule (exit 2)."""
    for index, task in enumerate(tasks):
        own = {"horizon": int(task.horizon), "seasonality": task.seasonality, "quantiles": task_levels(task)}
        source = f"fev task {str(task.task_name)!r}, {index + 1} of {len(tasks)} in the benchmark"
        BacktestSettings.from_sources({**settings, **own, "output": output}, source=source[:200])
        check_target_type(task, source)


def check_target_type(task: Any, source: str) -> None:
    """Refuse (exit 2) a task whose target column, in its local Parquet file's schema, holds no numbers: letters,
    or numbers written as text. Every pair of it was rejected once Ray had started (letters at load; text at
    fev's scoring, which casts no text), and no rerun could get past it. Read from the file's footer only; a file
    that is missing, not local or unreadable is left to the load, which names what it finds (a missing file is
    worth a rerun: it may appear)."""
    location = dataset_location(task)
    path = None if location is None else location.local_path
    if path is None or location is None or location.suffix != ".parquet" or not path.is_file():
        return
    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError):  # torn, not Parquet: the load says so
        return
    targets = [task.target] if isinstance(task.target, str) else list(task.target)
    for column in targets:
        if column not in schema.names:
            continue
        kind = schema.field(column).type
        values = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else kind
        if not (pa.types.is_integer(values) or pa.types.is_floating(values) or pa.types.is_decimal(values)):
            raise ConfigError(
                f"{source}: its target column {column!r} in {location} holds {values} values, not numbers; the "
                "families forecast numbers: fix the task's data or its target, or drop the task.",
                key="target",
            )


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
