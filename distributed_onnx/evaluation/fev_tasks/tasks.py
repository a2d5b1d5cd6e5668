"""A ``fev.Task`` as a backtest: its series as the backtest's long input table, its windows as origins.

fev cuts each series by *position*: an integer cutoff ``c`` puts ``y[:c]`` in the past (negative: counted
from each series' end), a timestamp cutoff puts every observation at or before it there. The backtest plans
windows on a time grid (one step = the checkpoint's resolution, ``--start/--end/--stride``). So each series is
laid on a synthetic grid whose step is the checkpoint's, at positions chosen so that every fev window starts at
one position shared by all series:

- timestamp cutoffs: a timestamp's position is its rank among all the task's timestamps (the series share one
  frequency, so a series' observations hold consecutive ranks), and a cutoff's origin is the rank of the first
  timestamp after it;
- non-negative integer cutoffs: series start at position 0, the origin is ``c``;
- negative integer cutoffs: series end together at the longest one's length ``n_max``, the origin is
  ``n_max + c``.

A model sees positions only through its context and horizon (no family reads timestamps), so the forecasts
are those of fev's windows whatever the task's frequency (monthly and yearly included). The grid starts at
:data:`GRID_EPOCH_US`, after any checkpoint's training data, so no window counts as in-sample. Pure: no Ray.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.errors import ConfigError
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.worker import check_run_fits_model

_GRID_EPOCH = datetime(2100, 1, 1, tzinfo=UTC)
#: Where the synthetic grid starts (2100-01-01 UTC, in microseconds since the epoch).
GRID_EPOCH_US = int(_GRID_EPOCH.timestamp()) * 1_000_000
#: The backtest's own column names: a task whose covariate is named so cannot be laid out.
RESERVED = frozenset({"series_id", "timestamp", "y"})


@dataclass(frozen=True)
class TaskData:
    """A task's series at their grid positions and its windows' origins (positions on that grid)."""

    series_ids: pa.Array  # string [rows]: each observation's series
    positions: np.ndarray  # int64 [rows]
    target: pa.Array  # float64 [rows]
    covariates: dict[str, pa.Array]  # known-future then past-only columns, [rows] each
    origins: tuple[int, ...]  # one per fev window, ascending

    @property
    def stride(self) -> int:
        """Steps between planned origins: the gcd of the windows' spacings (1 for one window); an origin
        between two of fev's is computed and not used."""
        steps = np.diff(np.asarray(self.origins, dtype=np.int64))
        return int(reduce(math.gcd, (int(step) for step in steps), 0)) or 1

    def input_table(self, step_minutes: int, covariates: bool) -> pa.Table:
        """The backtest's long input table on a grid of ``step_minutes`` (with or without the covariates)."""
        step_us = step_minutes * 60_000_000
        timestamps = pa.array(GRID_EPOCH_US + self.positions * step_us, type=pa.timestamp("us", tz="UTC"))
        columns: dict[str, Any] = {"series_id": self.series_ids, "timestamp": timestamps, "y": self.target}
        if covariates:
            columns |= self.covariates
        return pa.table(columns)

    def origin(self, window: int, step_minutes: int) -> datetime:
        """The first forecast step of fev window ``window`` on a grid of ``step_minutes``."""
        return _GRID_EPOCH + timedelta(microseconds=self.origin_us(window, step_minutes) - GRID_EPOCH_US)

    def origin_us(self, window: int, step_minutes: int) -> int:
        return GRID_EPOCH_US + self.origins[window] * step_minutes * 60_000_000


def task_slug(index: int, task: Any) -> str:
    """A directory name for the ``index``-th task: its position (tasks may share a name) and its name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(task.task_name or "task")).strip("._-") or "task"
    return f"{index:03d}-{name[:60]}"


def task_reason(task: Any) -> str | None:
    """Why no checkpoint can serve ``task`` (a multivariate target, a column the layout needs), or None."""
    if task.is_multivariate:
        return f"multivariate target {task.target_columns}: the runner's families forecast one target per series"
    clash = sorted(RESERVED & set(task.dynamic_columns))
    if clash:
        return f"covariate columns {clash} share the backtest's own column names {sorted(RESERVED)}"
    return None


def context_length(task: Any, metadata: CheckpointMetadata) -> int:
    """The history a checkpoint gets on ``task``: its own context, cut to fev's ``max_context_length``."""
    if task.max_context_length is None:
        return metadata.context_length
    return min(metadata.context_length, task.max_context_length)


def checkpoint_reason(task: Any, metadata: CheckpointMetadata) -> str | None:
    """Why this checkpoint cannot serve ``task`` (its horizon beyond what the graph emits), or None."""
    try:
        check_run_fits_model(metadata, context_length(task, metadata), task.horizon)
    except ConfigError as exc:
        return str(exc)
    return None


def takes_covariates(task: Any, supports: bool, max_covariates: int | None) -> bool:
    """Whether a checkpoint gets the task's dynamic columns: a family that takes none (or fewer) forecasts
    from the target alone, as fev's univariate models ignore the covariates."""
    wanted = len(task.dynamic_columns)
    return bool(wanted) and supports and (max_covariates is None or wanted <= max_covariates)


def task_data(task: Any) -> TaskData:
    """Load ``task``'s dataset with fev (its own loader: local, object store or hub) and lay it out."""
    dataset = task.load_full_dataset()
    table = dataset.data.table
    stamps = table.column(task.timestamp_column).combine_chunks()
    lengths = pc.list_value_length(stamps).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_stamps = pc.list_flatten(stamps)
    ids = pc.cast(table.column(task.id_column).combine_chunks(), pa.string())
    series_ids = pc.take(ids, pa.array(np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)))
    cutoffs = task.cutoffs
    if isinstance(cutoffs[0], str):
        stamp_us = _micros(flat_stamps)
        grid = np.unique(stamp_us)
        positions = np.searchsorted(grid, stamp_us).astype(np.int64)
        cutoff_us = [_micros(pc.cast(pa.array([cutoff]), flat_stamps.type))[0] for cutoff in cutoffs]
        origins = tuple(int(np.searchsorted(grid, cut, side="right")) for cut in cutoff_us)
    else:
        index = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        if cutoffs[0] >= 0:
            positions, origins = index, tuple(int(cut) for cut in cutoffs)
        else:
            longest = int(lengths.max(initial=0))
            positions = index - np.repeat(lengths, lengths) + longest
            origins = tuple(longest + int(cut) for cut in cutoffs)
    target = pc.cast(pc.list_flatten(table.column(task.target).combine_chunks()), pa.float64())
    covariates = {
        name: pc.list_flatten(table.column(name).combine_chunks())
        for name in [*task.known_dynamic_columns, *task.past_dynamic_columns]
    }
    return TaskData(series_ids, positions, target, covariates, origins)


def backtest_settings(task: Any, data: TaskData, step_minutes: int, covariates: bool) -> dict[str, Any]:
    """The backtest settings of ``task`` on a grid of ``step_minutes`` (checkpoints, data, output: the caller's)."""
    levels = sorted({*(float(q) for q in task.quantile_levels), 0.5})  # 0.5: fev's point forecast
    return {
        "horizon": task.horizon,
        "start": data.origin(0, step_minutes),
        "end": data.origin(len(data.origins) - 1, step_minutes),
        "stride": data.stride,
        "quantiles": levels,
        "seasonality": task.seasonality,
        "covariates": list(task.known_dynamic_columns) if covariates else [],
        "past_covariates": list(task.past_dynamic_columns) if covariates else [],
    }


def _micros(values: pa.Array) -> np.ndarray:
    """Timestamps as int64 microseconds since the epoch, whatever their unit and zone."""
    kind = values.type
    unit_type = pa.timestamp("us", tz=kind.tz) if pa.types.is_timestamp(kind) else pa.timestamp("us")
    return np.asarray(pc.cast(values, unit_type).cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def load_tasks(benchmark: Any) -> list[Any]:
    """The tasks of a ``fev.Benchmark``, a list of ``fev.Task``, or a benchmark YAML file's path or URL."""
    from distributed_onnx.evaluation.fev_tasks.fev_import import load_fev

    fev = load_fev()
    if isinstance(benchmark, fev.Benchmark):
        return list(benchmark.tasks)
    if isinstance(benchmark, fev.Task):
        return [benchmark]
    if isinstance(benchmark, list | tuple) and all(isinstance(task, fev.Task) for task in benchmark):
        if not benchmark:
            raise ConfigError("the benchmark holds no task: give at least one fev.Task", key="benchmark")
        return list(benchmark)
    if isinstance(benchmark, str) or hasattr(benchmark, "__fspath__"):
        try:
            return list(fev.Benchmark.from_yaml(benchmark).tasks)
        except Exception as exc:  # fev says only "Failed to load the file", or a Task's own validation error
            detail = exc.__cause__ or exc.__context__ or exc  # the file's own error, where fev hid it
            text = " ".join(str(detail).split())[:400]
            raise ConfigError(
                f"{benchmark} is not a benchmark fev can read (a YAML 'tasks' list of fev.Task fields): "
                f"{type(detail).__name__}: {text}",
                key="benchmark",
            ) from exc
    raise ConfigError(
        f"benchmark must be a fev.Benchmark, a list of fev.Task or a YAML path; got {type(benchmark).__qualname__}",
        key="benchmark",
    )
