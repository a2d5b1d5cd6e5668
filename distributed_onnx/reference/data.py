"""The bundled Taylor series, window slicing and the seasonal-naive MASE yardstick (numpy only, no torch).

Shared by the reference checkpoint's build script and its tests, so both score the model the same way
(docs/design.md, "Metrics": ``s_w = mean |y_t - y_(t-m)|`` over the history before the origin).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from distributed_onnx.evaluation.scoring.conventions import window_scores
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler

#: Points held out at the end of the series for evaluation: the last 21 days of half-hours.
HOLDOUT_POINTS = 21 * 48
#: Seasonality of the MASE scale and the seasonal-naive baseline: one day of half-hours.
SEASONALITY = 48


def taylor_path() -> Path:
    """Path of the bundled ``taylor.parquet`` (see ``distributed_onnx/resources/README.md``)."""
    return Path(__file__).resolve().parents[1] / "resources" / "taylor.parquet"


@dataclass(frozen=True)
class Series:
    """One regular series: values and their UTC timestamps in microseconds since the epoch."""

    y: np.ndarray  # float64 [T]
    timestamps_us: np.ndarray  # int64 [T]


def load_taylor(path: Path | None = None) -> Series:
    """Read the bundled series (one ``series_id``, 30-minute grid, no gaps)."""
    table = pq.read_table(path or taylor_path(), columns=["timestamp", "y"])
    stamps = table.column("timestamp").cast("int64").to_numpy()
    return Series(y=table.column("y").to_numpy().astype(np.float64), timestamps_us=stamps)


def weekend_flag(timestamps_us: np.ndarray) -> np.ndarray:
    """1.0 on Saturdays and Sundays (UTC calendar), else 0.0: a known-future calendar covariate."""
    days = timestamps_us // (86_400 * 1_000_000)
    weekday = (days + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    return (weekday >= 5).astype(np.float32)


def holdout_origins(n_points: int, horizon: int, step: int, holdout: int = HOLDOUT_POINTS) -> np.ndarray:
    """Forecast origins (index of the first forecast step) whose whole horizon lies in the held-out tail."""
    return np.arange(n_points - holdout, n_points - horizon + 1, step, dtype=np.int64)


def context_windows(y: np.ndarray, origins: np.ndarray, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``context`` and ``attention_mask`` [windows, context_length] float32, left-padded with mask 0."""
    context = np.zeros((origins.size, context_length), dtype=np.float32)
    mask = np.zeros_like(context)
    for row, origin in enumerate(origins):
        start = max(0, int(origin) - context_length)
        values = y[start:origin]
        context[row, context_length - values.size :] = values
        mask[row, context_length - values.size :] = 1.0
    return context, mask


def target_windows(y: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """Actuals [windows, horizon] from each origin."""
    return np.stack([y[origin : origin + horizon] for origin in origins])


def seasonal_naive(y: np.ndarray, origins: np.ndarray, horizon: int, m: int = SEASONALITY) -> np.ndarray:
    """``yhat(origin + h) = y(origin - m + (h mod m))``: the last observed season, repeated."""
    steps = np.arange(horizon)
    return np.stack([y[origin - m + (steps % m)] for origin in origins])


def mase(y: np.ndarray, origins: np.ndarray, forecasts: np.ndarray, m: int = SEASONALITY) -> float:
    """Mean over windows of each window's MASE, as the backtest scores it (the scale ``s_w`` from the history before
    the origin: :class:`~distributed_onnx.evaluation.scoring.naive.SeasonalScaler`)."""
    actuals = target_windows(y, origins, forecasts.shape[1])
    scales = SeasonalScaler(y, m).scales(origins)
    return float(np.mean(window_scores(actuals, forecasts[..., None], scales, (0.5,))))


def model_inputs(
    series: Series, origins: np.ndarray, context_length: int, horizon: int, with_covariate: bool
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Named Chronos-2 tensors for one target row per origin, plus (optionally) a weekend-flag covariate row.

    Returns the inputs and the row index of each origin's target row. Group ``i`` holds origin ``i``'s rows.
    """
    context, mask = context_windows(series.y, origins, context_length)
    windows = origins.size
    tensors = {
        "context": context,
        "attention_mask": mask,
        "group_ids": np.arange(windows, dtype=np.int64),
        "future_covariates": np.zeros((windows, horizon), dtype=np.float32),
        "future_covariates_mask": np.zeros((windows, horizon), dtype=np.float32),
    }
    if not with_covariate:
        return tensors, np.arange(windows)
    flag = weekend_flag(series.timestamps_us)
    flag_context, flag_mask = context_windows(flag, origins, context_length)
    covariate = {
        "context": flag_context,
        "attention_mask": flag_mask,
        "group_ids": np.arange(windows, dtype=np.int64),
        "future_covariates": np.stack([flag[origin : origin + horizon] for origin in origins]),
        "future_covariates_mask": np.ones((windows, horizon), dtype=np.float32),
    }
    stacked = {name: np.concatenate([tensors[name], covariate[name]]) for name in tensors}
    return stacked, np.arange(windows)
