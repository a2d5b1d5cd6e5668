"""The backtest's forecasts of one model as the predictions fev's ``Task.evaluation_summary`` takes.

fev wants, per window, one row per series it keeps at that cutoff (in its order: ids sorted), with the point
forecast (``predictions``: the median, as fev's own zero-shot models give it) and one column per quantile level
(named ``str(q)``), each a list of ``horizon`` floats. Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.evaluation.fev_tasks.tasks import merged_series_id, task_id_prefix
from distributed_onnx.model.quantiles import quantile_column_name

#: fev's name of the point forecast column (``fev.constants.PREDICTIONS``).
POINT = "predictions"


class MissingForecastsError(ValueError):
    """The run holds no forecast for some series fev keeps in a window (e.g. too little observed context)."""


def window_predictions(
    forecasts: pa.Table, series_ids: Sequence[str], horizon: int, levels: Sequence[float]
) -> pa.Table:
    """One fev prediction row per id of ``series_ids`` (in that order): the rows of ``forecasts`` (one model's,
    ``series_id, origin, lead, q...``, at one origin) of those ids, cut to ``horizon`` steps and to ``levels``.
    """
    keep = pc.and_(
        pc.is_in(forecasts.column("series_id"), value_set=pa.array(list(series_ids), pa.string())),
        pc.less_equal(forecasts.column("lead"), horizon),
    )
    window = forecasts.filter(keep).sort_by([("series_id", "ascending"), ("lead", "ascending")])
    if window.num_rows % horizon:
        raise MissingForecastsError(
            f"{window.num_rows} forecast rows at one origin are not whole {horizon}-step windows"
        )
    held = window.column("series_id").to_pylist()[::horizon]
    row_of = {series_id: row for row, series_id in enumerate(held)}
    missing = [series_id for series_id in series_ids if series_id not in row_of]
    if missing:
        raise MissingForecastsError(
            f"no forecast for {len(missing)} of the {len(series_ids)} series fev keeps in this window "
            f"(e.g. {missing[:3]}): their context may hold no observed value"
        )
    order = np.asarray([row_of[series_id] for series_id in series_ids], dtype=np.int64)
    offsets = pa.array(np.arange(0, horizon * len(order) + 1, horizon, dtype=np.int32))
    columns: dict[str, Any] = {}
    for name, level in [(POINT, 0.5), *((str(level), level) for level in levels)]:
        values = np.asarray(window.column(quantile_column_name(level)).to_numpy(), dtype=np.float64)
        columns[name] = pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1, horizon)[order].reshape(-1)))
    return pa.table(columns)


class RunTask:
    """A task of a merged run as its pairs are scored: the task, its position in the benchmark, and the ids of
    the series fev keeps in each of its windows (:meth:`kept_ids`), asked of fev once per run and shared by the
    run's checkpoints. fev finds them by cutting each window's data (the split it cuts again to score), a cost
    per window that each further checkpoint would pay again for the same answer.

    What fev raises while cutting is raised to every pair that asks (nothing is kept): each pair is still scored,
    or refused, on its own, as if it had asked fev itself."""

    def __init__(self, task: Any, number: int) -> None:
        self.task = task
        self.number = number
        self._ids: list[list[str]] | None = None

    def kept_ids(self) -> list[list[str]]:
        """Per window of the task, the ids fev keeps there (its ground truth's, in that order)."""
        if self._ids is None:
            column = self.task.id_column
            self._ids = [
                pc.cast(window.get_ground_truth().data.table.column(column), pa.string()).to_pylist()
                for window in self.task.iter_windows()
            ]
        return self._ids


def task_predictions(run_task: RunTask, forecasts: pa.Table) -> list[Any]:
    """The predictions of every window of the task as ``datasets.Dataset`` objects, for ``evaluation_summary``;
    ``forecasts`` is one model's of the merged run.

    Each Dataset is given a fingerprint of its own (a random one, as ``datasets`` gives a table it cannot hash):
    without one, ``datasets`` hashes the whole table to make it, and fev reads the predictions' table only, never
    their fingerprint (the summary's ``dataset_fingerprint`` is the task's data's)."""
    import datasets
    from datasets.fingerprint import generate_random_fingerprint

    task, task_number = run_task.task, run_task.number
    mine = forecasts.filter(pc.starts_with(forecasts.column("series_id"), task_id_prefix(task_number)))
    windows = []
    for number, ids in enumerate(run_task.kept_ids()):
        merged = [merged_series_id(task_number, number, series_id) for series_id in ids]
        table = window_predictions(mine, merged, task.horizon, task.quantile_levels)
        windows.append(datasets.Dataset(table, fingerprint=generate_random_fingerprint()))
    return windows
