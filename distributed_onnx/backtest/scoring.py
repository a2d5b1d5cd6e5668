"""Scores a finished backtest from its forecast parts: the model and the seasonal-naive baseline.

Scoring reads the parts back one file at a time (memory stays bounded) and recomputes the baseline and the
seasonal scale from the series, so metrics are a pure function of what is on disk: a resumed run scores
exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.backtest.outputs import part_files
from distributed_onnx.metrics import MetricsAccumulator
from distributed_onnx.naive import broadcast_quantiles, seasonal_naive_batch, seasonal_scales
from distributed_onnx.quantiles import quantile_column_name
from distributed_onnx.table import SeriesTable
from distributed_onnx.tensors import gather_blocks

NAIVE_MODEL = "seasonal_naive"


def score(
    output: storage.Location,
    table: SeriesTable,
    model_name: str,
    quantiles: Sequence[float],
    horizon: int,
    seasonality: int,
) -> pa.Table:
    """The long metrics table of the model and of ``seasonal_naive`` over every forecast part."""
    model = MetricsAccumulator(quantiles, horizon)
    naive = MetricsAccumulator(quantiles, horizon)
    index = table.index_of()
    columns = ["series_id", "origin", "lead", "y", *(quantile_column_name(q) for q in quantiles)]
    for path in part_files(output):
        part = storage.read_parquet(path, columns=columns)
        n_windows = part.num_rows // horizon
        if n_windows * horizon != part.num_rows:
            raise ValueError(f"{path} has {part.num_rows} rows, not a multiple of the horizon {horizon}")
        window_rows = np.arange(n_windows) * horizon
        series_ids = np.asarray(part.column("series_id").take(pa.array(window_rows)).to_pylist(), dtype=object)
        origins_us = part.column("origin").cast(pa.int64()).to_numpy()[window_rows]
        actual = part.column("y").to_numpy(zero_copy_only=False).astype(np.float64).reshape(n_windows, horizon)
        forecast = np.stack(
            [part.column(quantile_column_name(q)).to_numpy().reshape(n_windows, horizon) for q in quantiles],
            axis=-1,
        )
        naive_point = np.empty((n_windows, horizon))
        scale = np.empty(n_windows)
        for series_id in np.unique(series_ids):
            rows = series_ids == series_id
            series = table.series[index[str(series_id)]]
            origins = (origins_us[rows] - series.start_us) // series.step_us
            scale[rows] = seasonal_scales(series.values, origins, seasonality)
            last_season = gather_blocks(series.values, origins, seasonality, 0)
            naive_point[rows] = seasonal_naive_batch(last_season, horizon)
        model.update(series_ids, actual, forecast, scale)
        naive.update(series_ids, actual, broadcast_quantiles(naive_point, len(quantiles)), scale)
    return pa.concat_tables([model.to_table(model_name), naive.to_table(NAIVE_MODEL)])
