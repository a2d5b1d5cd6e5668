"""What a fev benchmark's tasks are refused or skipped for before anything is loaded or Ray is joined.

The rules are the backtest's, applied to each task's own values: the task's settings by the backtest's settings
model (:func:`check_tasks`: a refusal, exit 2, naming the task; and, where its data is a local Parquet file, what
its footer says without loading anything: :func:`check_local_data`), its quantile levels against each checkpoint's
native range (:func:`levels_reason`: that task x checkpoint skipped, with the reason, unless clamping is asked).
The run-wide checks (names, the output) are the backtest's own (``evaluation/up_front.py``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.fev_tasks.sources import dataset_location
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.up_front import levels_problem
from distributed_onnx.location import LocationLike
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

__all__ = ["check_local_data", "check_tasks", "levels_reason", "task_levels"]


def check_tasks(tasks: Sequence[Any], output: LocationLike, settings: dict[str, Any]) -> None:
    """Refuse, before anything is loaded or started, a task whose own settings the backtest refuses whatever the
    checkpoint (a seasonality of 0, a horizon beyond the bounds): validated by the backtest's settings model, as
    each of its runs will be, so no pair of it becomes a failure that a rerun repeats. One line naming the task
    and the rule (exit 2)."""
    for index, task in enumerate(tasks):
        own = {"horizon": int(task.horizon), "seasonality": task.seasonality, "quantiles": task_levels(task)}
        source = f"fev task {str(task.task_name)!r}, {index + 1} of {len(tasks)} in the benchmark"
        BacktestSettings.from_sources({**settings, **own, "output": output}, source=source[:200])
        check_local_data(task, source)


def check_local_data(task: Any, source: str) -> None:
    """Refuse (exit 2) a task whose local Parquet file no run could load or score, read from its footer only
    (nothing loaded), the very file fev will read (a relative ``dataset_path`` is fev's: from the working
    directory). Each of these was found once Ray had started, recorded as worth a rerun or as an internal error,
    and no rerun could get past it:

    - a folder, or a loop of symbolic links (:func:`_refuse_no_file`: the load failed on it, "rerun to retry");
    - a relative path that names no file from here (run from another folder: the task "failed", though a rerun
      from here fails again; a folder's name, without ``.parquet``, was a pair "rejected" for its suffix). An
      absolute path that names no file is left to the load (it may appear);
    - a file that is empty or not Parquet (pyarrow's and the loader's own lines were printed before it failed);
    - two columns of one name (fev's loader stopped on a ``KeyError``, exit 4);
    - a target column that holds no numbers: letters, or numbers written as text (fev's scoring casts no text).

    A hub dataset, a URL (read through its store at load), a glob (fev expands it) and an Arrow file are left to
    the load, which names what it finds."""
    location = dataset_location(task)
    path = None if location is None else location.local_path
    if path is None or location is None or any(mark in str(path) for mark in "*?["):
        return
    _refuse_no_file(path, source)
    if not path.is_absolute() and not os.path.lexists(path):  # whatever its suffix: a folder from elsewhere too
        raise ConfigError(
            f"{source}: its dataset_path {path} is relative, and fev reads it from the working directory, "
            f"where {Path.cwd() / path} does not exist: run from the folder it is relative to, or give the "
            "path in full.",
            key="dataset_path",
        )
    if location.suffix != ".parquet" or not path.is_file():
        return
    try:
        schema = pq.read_schema(path)
    except OSError:  # unreadable here (permissions, a vanished mount): the load says what it finds
        return
    except ValueError as exc:  # pyarrow's ArrowInvalid: empty, torn, or another format
        what = "is empty (0 bytes)" if path.stat().st_size == 0 else "is not a Parquet file (or a torn one)"
        raise ConfigError(
            f"{source}: its dataset_path {path} {what}: {' '.join(str(exc).split())[:200]}; fev loads a task's "
            "data from a Parquet or Arrow file: write the task's data as Parquet there, or drop the task.",
            key="dataset_path",
        ) from exc
    repeated = sorted({name for name in schema.names if schema.names.count(name) > 1})
    if repeated:
        raise ConfigError(
            f"{source}: its dataset_path {path} holds two or more columns named "
            f"{', '.join(repr(name) for name in repeated)}; fev's loader reads each column by its name: "
            "give each column of the file its own name, or drop the task.",
            key="dataset_path",
        )
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


def _refuse_no_file(path: Path, source: str) -> None:
    """Refuse (exit 2) a local ``dataset_path`` that is a folder (whatever its name ends in: ``data.parquet/``), or
    a loop of symbolic links (which a plain existence check calls "does not exist"): fev loads a task's data from
    one file, and its loader failed on either once the run had started, as a failure a rerun would repeat."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{source}: its dataset_path {path} is a loop of symbolic links ({exc.strerror}), which leads to no "
                "file: point the link at the task's Parquet file, or drop the task.",
                key="dataset_path",
            ) from None
        return  # no such file: the checks below (relative) or the load (absolute) say so
    if path.is_dir():
        raise ConfigError(
            f"{source}: its dataset_path {path} is a folder; fev loads a task's data from one Parquet or Arrow "
            "file: give the file's path, or drop the task.",
            key="dataset_path",
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
