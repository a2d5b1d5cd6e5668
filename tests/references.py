"""Reference versions of what the package computes in vector passes, written plainly, for the tests to compare with.

They lived in the package, used by nothing but the tests: the seasonal scale of one window and of many origins of
one series, the seasonal-naive and seasonal-quantile baselines from history blocks, the rows of one unit of the
metrics table, and the candidate origins of one series.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.data.layout import Series
from distributed_onnx.evaluation.data.windows import WindowSpec, _candidate_origins
from distributed_onnx.evaluation.scoring.naive import (
    SeasonalScaler,
    SeasonCells,
    _as_series,
    _check_season,
    cell_naive,
    cell_quantiles,
    season_cells,
)

F64 = npt.NDArray[np.float64]


def seasonal_scale(history: npt.ArrayLike, m: int) -> float:
    """Mean ``|y_t - y_(t-m)|`` over every pair in ``history`` with both values observed; NaN if none.

    ``history`` holds the series' values strictly before the window's origin. This is the in-sample MAE of
    the seasonal-naive forecast (the fev / GluonTS scale), so MASE 1.0 means "as good as repeating the last
    season". NaN, not 0, when no pair exists, so the caller cannot divide by it by accident.
    """
    _check_season(m)
    y = _as_series(history, "history")
    if y.size <= m:
        return float("nan")
    diff = np.abs(y[m:] - y[:-m])
    observed = np.isfinite(diff)
    if not observed.any():
        return float("nan")
    return float(diff[observed].mean())


def seasonal_scales(values: npt.ArrayLike, origins: npt.ArrayLike, m: int) -> npt.NDArray[np.float64]:
    """``seasonal_scale(values[:origin], m)`` for many origin positions of one series at once.

    ``origins`` are integer positions into ``values`` (the index of each window's first forecast step).
    """
    return SeasonalScaler(values, m).scales(origins)


def seasonal_naive_batch(last_season: npt.ArrayLike, horizon: int) -> npt.NDArray[np.float64]:
    """Seasonal-naive forecasts for many windows: ``[W, m]`` last-season blocks -> ``[W, horizon]``.

    Row ``w`` of ``last_season`` holds ``y(origin - m) .. y(origin - 1)``; lead ``h`` (0-based) repeats
    ``y(origin - m + (h mod m))``. NaN stays NaN, so the baseline is missing exactly where it has no value.
    """
    block = np.asarray(last_season, dtype=np.float64)
    if block.ndim != 2 or block.shape[1] < 1:
        raise ConfigError(
            f"last_season must have shape [windows, m] with m >= 1; got {block.shape}.", key="last_season"
        )
    if horizon < 1:
        raise ConfigError(f"horizon must be at least 1 step; got {horizon}.", key="horizon")
    return np.take(block, np.arange(horizon) % block.shape[1], axis=1)


def seasonal_naive_forecast(history: npt.ArrayLike, m: int, horizon: int) -> npt.NDArray[np.float64]:
    """Seasonal-naive forecast of one window: ``history[-m:]`` repeated over ``horizon`` steps.

    ``history`` ends at ``origin - 1``. A history shorter than one season is padded with NaN on the left:
    the values before the series starts are missing, not zero.
    """
    _check_season(m)
    y = _as_series(history, "history")
    season = np.full(m, np.nan)
    tail = y[-m:]
    season[m - tail.size :] = tail
    forecast: npt.NDArray[np.float64] = seasonal_naive_batch(season[None, :], horizon)[0]
    return forecast


def seasonal_quantiles_batch(
    seasons: npt.ArrayLike,
    m: int,
    horizon: int,
    quantiles: Sequence[float],
    positions: npt.ArrayLike | None = None,
    out: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """The seasonal-quantile baseline: ``[W, K * m]`` history blocks -> ``[W, horizon, Q]`` forecasts.

    Row ``w`` holds ``y(origin - K m) .. y(origin - 1)``; the forecast of lead ``h`` (0-based) at level ``q`` is
    the empirical ``q``-quantile (numpy's default linear interpolation, Hyndman & Fan type 7) of the observed
    values at the same position of the ``K`` earlier seasons, ``y(origin - k m + (h mod m))``, k = 1..K. It is
    the probabilistic twin of :func:`seasonal_naive_batch` (whose point is the k = 1 value), so probabilistic
    skill has a probabilistic reference. Undefined (NaN) where every one of the K values is missing, which is
    never where the seasonal naive is defined.

    ``positions[W]`` (optional) place the windows on one axis of time (see :func:`season_cells`): each distinct
    cell's quantiles are then computed once. The values are the same either way (each cell's arithmetic is its
    own).

    The result is a ``[W, H, Q]`` view of a ``[Q, W, H]`` array: the layout the scoring reads fastest; that
    array can be ``out`` (C-ordered ``[Q, W, H]``, reused by the caller batch after batch).
    """
    return seasonal_baselines(season_cells(seasons, m, horizon, positions), quantiles, out)[1]


def seasonal_baselines(
    cells: SeasonCells, quantiles: Sequence[float], out: npt.NDArray[np.float64] | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Both seasonal baselines of a batch's cells as arrays: the seasonal naive ``[W, H]``
    (:func:`cell_naive`) and the seasonal quantiles ``[W, H, Q]`` (a view of ``[Q, W, H]``, in ``out`` when given;
    see :func:`seasonal_quantiles_batch`).
    """
    quantile_forecast = cell_quantiles(cells, quantiles)
    if not cells.of_pair.size:
        empty = np.empty((len(quantiles), *cells.of_pair.shape))
        return cell_naive(cells), empty.transpose(1, 2, 0)
    gathered = np.take(quantile_forecast.by_cell, cells.of_pair, axis=1, out=out, mode="clip")  # [Q, W, H]
    return cell_naive(cells), gathered.transpose(1, 2, 0)


class UnitSums(NamedTuple):
    """The sums of one reporting unit (everything, one series, or one lead); see :mod:`.metrics` for each."""

    pairs: float
    abs_err: float
    sq_err: float
    abs_y: float
    rho: F64
    hits: F64
    scaled: float
    mase: float
    sql: float
    scaled_pairs: float


def unit_rows(
    sums: UnitSums, quantiles: Sequence[float], intervals: Sequence[tuple[float, float]], has_median: bool
) -> list[tuple[str, float | None, float, int]]:
    """The (metric, quantile, value, n) rows of one unit; rows with n == 0 are left out."""
    rows: list[tuple[str, float | None, float, int]] = []
    pairs = sums.pairs
    if pairs > 0 and has_median:
        rows.append(("mae", None, sums.abs_err / pairs, int(pairs)))
        rows.append(("rmse", None, float(np.sqrt(sums.sq_err / pairs)), int(pairs)))
    if sums.scaled > 0:
        if has_median:
            rows.append(("mase", None, sums.mase / sums.scaled, int(sums.scaled_pairs)))
        rows.append(("sql", None, sums.sql / sums.scaled, int(sums.scaled_pairs)))
    if pairs <= 0:
        return rows
    # Undefined (NaN) rather than infinite when every actual in scope is exactly zero.
    wql = float(np.mean(2.0 * sums.rho / sums.abs_y)) if sums.abs_y > 0 else float("nan")
    rows.append(("wql", None, wql, int(pairs)))
    for q, loss in zip(quantiles, sums.rho, strict=True):
        rows.append(("pinball", q, float(loss) / pairs, int(pairs)))
    for (lo, _), hit in zip(intervals, sums.hits, strict=True):
        rows.append(("coverage", lo, float(hit) / pairs, int(pairs)))
    return rows


def series_origins(series: Series, spec: WindowSpec) -> np.ndarray:
    """Origin indices of one series (ascending), before the context-coverage filter."""
    return _candidate_origins(series, spec)[0]
