"""A ``fev.Task`` as part of a backtest: its windows as series of the backtest's long input table, at one origin.

fev cuts each series by *position*: an integer cutoff ``c`` puts ``y[:c]`` in the past (negative: counted
from each series' end), a timestamp cutoff puts every observation at or before it there. So each series is
first laid on a synthetic grid of positions, chosen so that every fev window starts at one position shared by
all the task's series (:func:`task_data`):

- timestamp cutoffs: a timestamp's position is its rank among all the task's timestamps (the series share one
  frequency, so a series' observations hold consecutive ranks), and a cutoff's origin is the rank of the first
  timestamp after it;
- non-negative integer cutoffs: series start at position 0, the origin is ``c``;
- negative integer cutoffs: series end together at the longest one's length ``n_max``, the origin is
  ``n_max + c``.

The backtest plans windows on a time grid (one step = the checkpoint's resolution, every ``--stride`` steps
from ``--start`` to ``--end``), for every series with data there: it has no list of origins. So each fev
window is then cut out as its own series (its context and its horizon, :meth:`TaskData.window_table`), shifted
so that its origin is the run's one origin (:func:`merged_origin`): one backtest plans exactly the windows of
any number of tasks, whatever their cutoffs and spacings. A model sees positions only through its context and
horizon (no family reads timestamps), so the forecasts are those of fev's windows whatever the task's
frequency (monthly and yearly included). The grid starts at :data:`GRID_EPOCH_US`, after any checkpoint's
training data, so no window counts as in-sample. Pure: no Ray.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.worker import check_run_fits_model
from distributed_onnx.redact import MASK, redact_text

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
    horizon: int  # fev's horizon: the rows of a window are its context and these steps

    def window_table(self, task_number: int, context_length: int, step_minutes: int, covariates: bool) -> pa.Table:
        """Every fev window of the task as its own series of a merged run's input table.

        A window's series (:func:`merged_series_id`) holds the rows of its context (``context_length`` steps
        before the window's origin) and of its horizon, shifted so that the origin sits at
        :func:`merged_origin`: every window of every task of a run then starts at one origin, so one backtest
        plans exactly fev's windows, whatever each task's cutoffs, spacing and number of windows. Rows past the
        task's horizon are left out, so a longer horizon asked of the run (another task's) sees no known
        covariate beyond this task's horizon, as fev gives none.
        """
        step_us = step_minutes * 60_000_000
        tables = []
        for window, origin in enumerate(self.origins):
            rows = np.flatnonzero(
                (self.positions >= origin - context_length) & (self.positions < origin + self.horizon)
            )
            taken = pa.array(rows, pa.int64())
            prefix = pa.scalar(merged_series_id(task_number, window, ""), pa.string())
            ids = pc.binary_join_element_wise(prefix, pc.take(self.series_ids, taken), "")
            stamps = GRID_EPOCH_US + (self.positions[rows] - origin + context_length) * step_us
            columns: dict[str, Any] = {
                "series_id": ids,
                "timestamp": pa.array(stamps, type=pa.timestamp("us", tz="UTC")),
                "y": pc.take(self.target, taken),
            }
            if covariates:
                columns |= {name: pc.take(values, taken) for name, values in self.covariates.items()}
            tables.append(pa.table(columns))
        return pa.concat_tables(tables)


def merged_series_id(task_number: int, window: int, series_id: str) -> str:
    """A window's series in a merged run, ``TASK:WINDOW:ID``: the two numbers hold no colon, so whatever the
    data's id holds (colons included) the name cannot collide with another task's or window's."""
    return f"{task_id_prefix(task_number)}{window}:{series_id}"


def task_id_prefix(task_number: int) -> str:
    """What every merged series id of the ``task_number``-th task starts with (and no other task's)."""
    return f"{task_number}:"


def merged_origin(step_minutes: int, context_length: int) -> datetime:
    """The one origin of a merged run: ``context_length`` steps after :data:`GRID_EPOCH_US`, so that every
    context lies after the epoch."""
    return _GRID_EPOCH + timedelta(minutes=step_minutes * context_length)


def task_name(task: Any) -> str:
    """The task's name as it may be shown or written: fev names a task after its dataset's path by default
    (``KEY:SECRET@bucket/dir`` of ``s3://KEY:SECRET@bucket/dir/data.parquet``), so its credentials are masked."""
    return redact_text(str(task.task_name or "task"))


def task_slug(index: int, task: Any) -> str:
    """A directory name for the ``index``-th task: its position (tasks may share a name) and its name (masked,
    :func:`task_name`: a folder's name is shown by every listing)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", task_name(task).replace(MASK, "")).strip("._-") or "task"
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
    """Load ``task``'s dataset with fev's loader (:func:`~.sources.load_dataset`: a local file, an object read
    through the store with its URL's options, or the hub) and lay it out."""
    from distributed_onnx.evaluation.fev_tasks.sources import load_dataset

    dataset = load_dataset(task)
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
        cutoff_us = [_cutoff_us(cutoff, flat_stamps.type, task.initial_cutoff) for cutoff in cutoffs]
        origins = tuple(int(np.searchsorted(grid, cut, side="right")) for cut in cutoff_us)
    else:
        index = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        if cutoffs[0] >= 0:
            positions, origins = index, tuple(int(cut) for cut in cutoffs)
        else:
            longest = int(lengths.max(initial=0))
            positions = index - np.repeat(lengths, lengths) + longest
            origins = tuple(longest + int(cut) for cut in cutoffs)
    target = _numbers(pc.list_flatten(table.column(task.target).combine_chunks()), task.target)
    covariates = {
        name: pc.list_flatten(table.column(name).combine_chunks())
        for name in [*task.known_dynamic_columns, *task.past_dynamic_columns]
    }
    return TaskData(series_ids, positions, target, covariates, origins, int(task.horizon))


def _numbers(values: pa.Array, column: str) -> pa.Array:
    """The target as float64: numbers, or numbers written as text (fev's own metrics decide about those); a value
    that is no number (letters) is a :class:`DataError` naming the column and the value, a fact of the data that
    no rerun changes."""
    try:
        return pc.cast(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"the target column {column!r} holds values that are not numbers ({values.type}: "
            f"{' '.join(str(exc).split())[:200]}); the families forecast numbers: fix the task's data or its target",
            column=column,
        ) from None


def merged_settings(tasks: Sequence[Any], step_minutes: int, context_length: int) -> dict[str, Any]:
    """The backtest settings of a merged run of ``tasks`` (checkpoints, data, output, covariates: the caller's).

    The horizon is the longest task's (a graph emits its fixed horizon and a shorter one is that output cut,
    so each task's forecasts are those of a run of its own); the quantile levels are the union of the tasks'
    and 0.5 (fev's point forecast). The seasonality (the run's own report and baselines only: fev scores each
    task with its own) is the first task's.
    """
    origin = merged_origin(step_minutes, context_length)
    levels = sorted({0.5, *(float(q) for task in tasks for q in task.quantile_levels)})
    return {
        "horizon": max(int(task.horizon) for task in tasks),
        "context_length": context_length,
        "start": origin,
        "end": origin,
        "quantiles": levels,
        "seasonality": tasks[0].seasonality,
    }


def _cutoff_us(cutoff: str, stamps: pa.DataType, initial_cutoff: str) -> int:
    """A timestamp cutoff as microseconds on the data's own timestamps; a cutoff that cannot be read as one (no
    zone offset where the timestamps carry a zone, or one where they carry none: fev cannot compare them either)
    is a :class:`ConfigError` naming ``initial_cutoff``, the task's definition, which no rerun changes.

    The reason is this package's own sentence, whole: the task's ``initial_cutoff``, the data's zone and what to
    write (pyarrow's words, cut to fit a pair's reason, once ended mid-sentence before the advice)."""
    try:
        return int(_micros(pc.cast(pa.array([cutoff]), stamps))[0])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigError(_cutoff_problem(initial_cutoff, stamps, exc), key="initial_cutoff") from None


def _cutoff_problem(initial_cutoff: str, stamps: pa.DataType, exc: Exception) -> str:
    """Why ``initial_cutoff`` cannot be compared with timestamps of type ``stamps``, and what to write instead."""
    import pandas as pd

    head = f"initial_cutoff {initial_cutoff!r} cannot be compared with the task's timestamps ({stamps})"
    zone = getattr(stamps, "tz", None)
    try:
        written = pd.Timestamp(initial_cutoff)
    except (ValueError, TypeError):
        return f"{head}: it is not a timestamp ({' '.join(str(exc).split())[:120]}); write it as ISO 8601"
    if zone and written.tzinfo is None:
        try:
            example = f": {written.tz_localize(zone).isoformat()!r}"
        except (ValueError, TypeError, KeyError):  # a zone pandas does not know: the advice without the example
            example = ""
        return (
            f"{head}: it has no zone offset, while they carry the zone {zone}; write it with the offset of the "
            f"data's zone {zone}{example}"
        )
    if not zone and written.tzinfo is not None:
        return f"{head}: it has a zone offset, while they carry no zone; write it without one, as the data's are"
    return f"{head}: {' '.join(str(exc).split())[:120]}; write it as the data's timestamps are written"


def _micros(values: pa.Array) -> np.ndarray:
    """Timestamps as int64 microseconds since the epoch, whatever their unit and zone."""
    kind = values.type
    unit_type = pa.timestamp("us", tz=kind.tz) if pa.types.is_timestamp(kind) else pa.timestamp("us")
    return np.asarray(pc.cast(values, unit_type).cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def load_tasks(benchmark: Any) -> list[Any]:
    """The tasks of a ``fev.Benchmark``, a list of ``fev.Task``, or a benchmark YAML file's path or URL; at least one
    (a benchmark without tasks is refused, from a file as from Python, rather than run into empty summaries)."""
    from distributed_onnx.evaluation.fev_tasks.sources import named

    tasks = [named(task) for task in _tasks_of(benchmark)]  # never named after a URL's query (sources.py)
    if not tasks:
        where = "" if isinstance(benchmark, list | tuple) else f" {benchmark}"
        raise ConfigError(
            f"the benchmark{where} holds no task (its 'tasks' list is empty): give at least one fev task",
            key="benchmark",
        )
    return tasks


def _tasks_of(benchmark: Any) -> list[Any]:
    from distributed_onnx.evaluation.fev_tasks.fev_import import load_fev

    fev = load_fev()
    if isinstance(benchmark, fev.Benchmark):
        return list(benchmark.tasks)
    if isinstance(benchmark, fev.Task):
        return [benchmark]
    if isinstance(benchmark, list | tuple) and all(isinstance(task, fev.Task) for task in benchmark):
        return list(benchmark)
    if isinstance(benchmark, str | Location) or hasattr(benchmark, "__fspath__"):
        place = Location.parse(benchmark if isinstance(benchmark, str | Location) else Path(benchmark))
        try:  # fev reads the file (a web URL with its own client): the whole URL goes to it, as to pyarrow
            return list(fev.Benchmark.from_yaml(place.local_path or place.reveal()).tasks)
        except Exception as exc:  # fev says only "Failed to load the file", or a Task's own validation error
            detail = exc.__cause__ or exc.__context__ or exc  # the file's own error, where fev hid it
            text = place.scrub(" ".join(str(detail).split()))[:400]  # a client quotes the URL's query too
            raise ConfigError(
                f"{place} is not a benchmark fev can read (a YAML 'tasks' list of fev.Task fields): "
                f"{type(detail).__name__}: {text}",
                key="benchmark",
            ) from exc
    raise ConfigError(
        f"benchmark must be a fev.Benchmark, a list of fev.Task or a YAML path; got {type(benchmark).__qualname__}",
        key="benchmark",
    )
