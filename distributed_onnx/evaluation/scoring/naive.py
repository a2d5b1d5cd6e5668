"""The seasonal-naive baseline and the seasonal scale that MASE and SQL divide by.

Both come from the same idea, "repeat the last season", and both must only see the series strictly before
a window's origin, so they live together (see docs/design.md, Metrics). Missing values are NaN throughout:
a missing value never becomes a zero, it drops the pair (scale) or makes the forecast missing (naive),
and the metrics then leave that step out and count it.

Pure numpy; the batch variants are vectorised over windows so a backtest never loops per window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.scoring.losses import CellForecast

__all__ = [
    "SeasonCells",
    "SeasonalScaler",
    "broadcast_quantiles",
    "cell_naive",
    "cell_quantiles",
    "default_season",
    "season_cells",
    "season_count",
    "series_season_cells",
]


def _check_season(m: int) -> None:
    if m < 1:
        raise ConfigError(f"seasonality m must be a positive number of steps; got {m}.", key="seasonality")


def _as_series(values: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ConfigError(f"{name} must be one-dimensional; got shape {array.shape}.", key=name)
    return array


class SeasonalScaler:
    """The seasonal scale ``s_w`` of a window for any origin of one series, in O(1) per window.

    ``s_w`` is the mean ``|y_t - y_(t-m)|`` over every pair strictly before the window's origin with both values
    observed: the in-sample MAE of the seasonal-naive forecast (the fev / GluonTS scale), so MASE 1.0 means "as
    good as repeating the last season". NaN, not 0, when no pair exists, so no caller divides by it by accident.

    Prefix sums of ``|y_t - y_(t-m)|`` and of the pair counts are built once per series (an actor scoring many
    parts of one long series builds them once, not once per batch); recomputing the scale per window would be
    quadratic in the series length.
    """

    def __init__(self, values: npt.ArrayLike, m: int) -> None:
        _check_season(m)
        y = _as_series(values, "values")
        self.n_points = int(y.size)
        self.m = m
        diff = np.abs(y[m:] - y[:-m]) if y.size > m else np.zeros(0)
        observed = np.isfinite(diff)
        self._sums = np.concatenate(([0.0], np.cumsum(np.where(observed, diff, 0.0))))
        self._counts = np.concatenate(([0], np.cumsum(observed)))
        self._pairs = diff.size

    def scales(self, origins: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The scale of the windows whose first forecast step is at each of ``origins`` (NaN: no pair)."""
        positions = np.asarray(origins, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() > self.n_points):
            raise ConfigError(
                f"origins must be positions within 0..{self.n_points}; got {positions.min()}..{positions.max()}.",
                key="origins",
            )
        # Pair j compares y[j + m] with y[j]; it lies before the origin when j + m < origin.
        upto = np.minimum(np.maximum(positions - self.m, 0), self._pairs)
        n = np.take(self._counts, upto)
        with np.errstate(invalid="ignore"):  # no pair: 0 / 0, set to the one NaN below
            scale: npt.NDArray[np.float64] = np.take(self._sums, upto) / n
        scale[n == 0] = np.nan
        return scale


def broadcast_quantiles(point: npt.NDArray[Any], n_quantiles: int, copy: bool = True) -> npt.NDArray[np.float64]:
    """Give a point forecast ``[..., H]`` a quantile axis ``[..., H, Q]`` where every level equals the point.

    The baseline is scored by the same accumulator as the model (docs/design.md: all its quantiles equal the
    point), so pinball, WQL and SQL of the baseline are defined and comparable. ``copy=False`` gives a read-only
    view whose quantile axis has stride 0: the accumulator recognises it and scores the point once, not Q times.
    """
    values = np.asarray(point, dtype=np.float64)
    if not copy:
        return np.broadcast_to(values[..., None], (*values.shape, n_quantiles))
    return np.repeat(values[..., None], n_quantiles, axis=-1)


#: Minutes in the default season: a day, the strongest cycle of most operational series (load, traffic, sales).
MINUTES_PER_DAY = 1440


def default_season(resolution_minutes: int) -> int:
    """The season, in steps, when none is given: one day at ``resolution_minutes`` (at least one step), for the
    backtest's plan and for ``score`` alike.

    >>> default_season(30), default_season(60), default_season(1440 * 7)
    (48, 24, 1)
    """
    return max(1, MINUTES_PER_DAY // resolution_minutes)


def season_count(context_length: int, m: int) -> int:
    """Seasons the probabilistic baseline looks back over: those inside the models' context (at least one).

    The baseline then sees exactly the history the checkpoints see, no more.
    """
    _check_season(m)
    return max(1, context_length // m)


class SeasonCells(NamedTuple):
    """The seasonal cells a batch's baselines read: each distinct cell's ``K`` values, and every pair's cell.

    Cell ``j`` of a window (``0 <= j < m``) holds the ``K`` values at position ``j`` of the ``K`` seasons before its
    origin, ``y(origin - k m + j)``, k = K..1; lead ``h`` reads cell ``h mod m``. Consecutive windows of one series
    share all but one of their ``m`` cells, so a batch of 256 such windows holds ``256 + m - 1`` distinct cells, not
    ``256 m``: the baselines' quantiles are computed once per distinct cell.
    """

    values: npt.NDArray[np.float64]  # [U, K]: oldest season first, NaN = missing
    of_pair: npt.NDArray[np.intp]  # [W, H]: the cell (row of ``values``) each (window, lead) reads


def season_cells(seasons: npt.ArrayLike, m: int, horizon: int, positions: npt.ArrayLike | None = None) -> SeasonCells:
    """The cells of ``[W, K * m]`` history blocks (``[W, K * m]``: ``y(origin - K m) .. y(origin - 1)``).

    ``positions[W]`` (optional) place the windows on one axis of time: cell ``j`` of window ``w`` holds the same
    K values as cell ``j'`` of window ``v`` when ``positions[w] + j == positions[v] + j'`` (the caller vouches: the
    same series, origins counted in steps), and such cells are kept once. Without them every window keeps its own.
    """
    block = np.asarray(seasons, dtype=np.float64)
    _check_season(m)
    if block.ndim != 2 or block.shape[1] < m or block.shape[1] % m:
        raise ConfigError(f"seasons must have shape [windows, K * {m}]; got {block.shape}.", key="seasons")
    n_windows = block.shape[0]
    stacked = block.reshape(n_windows, -1, m)  # [W, K, m], oldest season first
    if positions is None:
        positions = np.arange(n_windows, dtype=np.int64) * m  # every window's cells distinct
    keys = (np.asarray(positions, dtype=np.int64)[:, None] + np.arange(m, dtype=np.int64)).ravel()  # [W m]
    if keys.size == 0:
        return SeasonCells(np.empty((0, stacked.shape[1])), np.empty((0, horizon), dtype=np.intp))
    first, inverse = _distinct_cells(keys)
    return SeasonCells(stacked[first // m, :, first % m], _cells_of_pairs(inverse, n_windows, m, horizon))


def series_season_cells(
    values: npt.NDArray[np.float64], origins: npt.NDArray[np.int64], m: int, seasons: int, horizon: int
) -> SeasonCells:
    """:func:`season_cells` of windows of one series, read from its values: no ``[W, K m]`` history is gathered.

    Equal to ``season_cells(gather_blocks(values, origins, seasons * m, 0), m, horizon, origins)`` value for value
    (the same steps, NaN before the series starts; the cells in the same order); only the distinct cells' ``K``
    values are read. A cell is named by its step, ``origin + j``: the steps the windows cover are marked on their
    span (each window covers ``m`` consecutive steps), so no ``[W, m]`` keys are sorted or scattered.
    """
    _check_season(m)
    origins = np.asarray(origins, dtype=np.int64)
    n_windows = origins.shape[0]
    if n_windows == 0:
        return SeasonCells(np.empty((0, seasons)), np.empty((0, horizon), dtype=np.intp))
    low = int(origins.min())
    span = int(origins.max()) - low + m  # steps low .. max + m - 1
    if span > 4 * n_windows * m:  # windows far apart: their keys sorted instead
        keys = (origins[:, None] + np.arange(m, dtype=np.int64)).ravel()
        first, inverse = _distinct_cells(keys)
        steps, of_pair = keys[first], _cells_of_pairs(inverse, n_windows, m, horizon)
    else:
        start = origins - low
        edges = np.bincount(start, minlength=span + 1) - np.bincount(start + m, minlength=span + 1)
        covered = np.cumsum(edges[:span]) > 0  # step low + i is a cell of some window
        lead_cell = np.arange(horizon, dtype=np.intp) % m
        if covered.all():  # windows a step or a few apart (the usual batch): every step of the span is a cell
            steps = np.arange(low, low + span, dtype=np.int64)
            of_pair = start.astype(np.intp)[:, None] + lead_cell
        else:
            number = np.cumsum(covered) - 1  # its row among the distinct cells (in step order, as _distinct_cells)
            steps = low + np.flatnonzero(covered)
            of_pair = np.take(number, start[:, None] + lead_cell).astype(np.intp, copy=False)
    seasons_back = steps[:, None] - m * np.arange(seasons, 0, -1, dtype=np.int64)  # [U, K]: y(step - k m)
    inside = seasons_back >= 0  # and < origin <= len(values)
    if not values.size:
        return SeasonCells(np.full(seasons_back.shape, np.nan), of_pair)
    return SeasonCells(np.where(inside, values[np.where(inside, seasons_back, 0)], np.nan), of_pair)


def _cells_of_pairs(inverse: npt.NDArray[np.intp], n_windows: int, m: int, horizon: int) -> npt.NDArray[np.intp]:
    """``[W, H]``: the distinct cell of each (window, lead), from each (window, cell j)'s distinct number."""
    lead_cell = np.arange(horizon) % m
    return np.take(inverse.reshape(n_windows, m), lead_cell, axis=1)  # np.take: fancy indexing is far slower here


def cell_naive(cells: SeasonCells) -> npt.NDArray[np.float64]:
    """The seasonal naive ``[W, H]`` of a batch's cells: each cell's latest value, ``y(origin - m + (h mod m))``.
    NaN stays NaN, so the baseline is missing exactly where it has no value."""
    return np.take(cells.values[:, -1], cells.of_pair)


def cell_quantiles(cells: SeasonCells, quantiles: Sequence[float]) -> CellForecast:
    """The seasonal-quantile baseline of a batch's cells as a table of each distinct cell's levels and every pair's
    cell (:class:`~.losses.CellForecast`: the losses gather it chunk by chunk).

    The forecast of lead ``h`` (0-based) at level ``q`` is the empirical ``q``-quantile (numpy's default linear
    interpolation, Hyndman & Fan type 7) of the observed values at the same position of the ``K`` earlier seasons,
    ``y(origin - k m + (h mod m))``, k = 1..K: the probabilistic twin of the seasonal naive (whose point is the
    k = 1 value), so probabilistic skill has a probabilistic reference. Undefined (NaN) where every one of the K
    values is missing, which is never where the seasonal naive is defined."""
    levels = np.asarray(quantiles, dtype=np.float64)
    by_cell = np.ascontiguousarray(_nan_quantiles(cells.values[:, :, None], levels)[:, 0, :].T)  # [Q, U]
    return CellForecast(by_cell, cells.of_pair)


def _distinct_cells(keys: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``(first, inverse)``: the first index of each distinct key (in key order) and each key's distinct number."""
    low, high = int(keys.min()), int(keys.max())
    span = high - low + 1
    if span > 4 * keys.size:  # sparse keys (windows far apart): sort them
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first.astype(np.intp), inverse.ravel().astype(np.intp)
    offset = keys - low
    first_at = np.empty(span, dtype=np.intp)
    first_at[offset[::-1]] = np.arange(keys.size - 1, -1, -1, dtype=np.intp)  # the smallest index wins
    present = np.zeros(span, dtype=bool)
    present[offset] = True
    number = np.cumsum(present) - 1
    return first_at[present], number[offset].astype(np.intp)


def _nan_quantiles(values: npt.NDArray[np.float64], levels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``np.nanquantile(values, levels, axis=1)`` (linear, type 7) as ``[W, m, Q]``, vectorised.

    numpy's nanquantile loops in Python over every 1-d slice that holds a NaN (measured: 4 s per batch of 256
    windows, three times the model's time); here one sort puts the NaNs last and each level interpolates
    between the order statistics ``floor(h)`` and ``floor(h) + 1``, ``h = (n - 1) q`` over the n observed.
    """
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = np.isfinite(ordered).sum(axis=1)  # [W, m]
    position = (np.maximum(count, 1) - 1)[..., None] * levels  # [W, m, Q]
    low = np.floor(position).astype(np.intp)
    high = np.minimum(low + 1, np.maximum(count, 1)[..., None] - 1)
    weight = position - low
    below = np.take_along_axis(ordered[:, :, :, None], low[:, None], axis=1)[:, 0]  # [W, m, Q]
    above = np.take_along_axis(ordered[:, :, :, None], high[:, None], axis=1)[:, 0]
    difference = above - below
    # numpy's _lerp: from the nearer end, so a level of 1 gives the maximum exactly.
    result = np.where(weight >= 0.5, above - difference * (1 - weight), below + difference * weight)
    result[count == 0] = np.nan
    return result


#: Cells of the padded ``[series, prefix]`` matrix :func:`flat_seasonal_scales` builds at most; a batch of a few
#: long series is better served by cached per-series prefix sums (:class:`SeasonalScaler`).
FLAT_SCALE_CELLS = 4_000_000


def flat_seasonal_scales(
    values: npt.NDArray[np.float64],
    offsets: npt.NDArray[np.int64],
    series_index: npt.NDArray[np.int64],
    origins: npt.NDArray[np.int64],
    m: int,
) -> npt.NDArray[np.float64] | None:
    """:meth:`SeasonalScaler.scales` for windows of many series of a flat layout at once, bit for bit.

    Series ``s`` is ``values[offsets[s]:offsets[s + 1]]``. The prefix sums each window needs are built for the
    batch's series side by side in one padded ``[series, prefix]`` matrix (``np.cumsum`` along a row adds in the
    same order as over the one series, so the sums are identical), with no Python per series. ``None`` when that
    matrix would exceed :data:`FLAT_SCALE_CELLS` (a few long series: the caller keeps per-series scalers).
    """
    _check_season(m)
    series_index = np.asarray(series_index, dtype=np.int64)
    positions = np.asarray(origins, dtype=np.int64)
    if positions.size == 0:
        return np.empty(0)
    distinct, row = np.unique(series_index, return_inverse=True)
    row = row.ravel()
    lengths = offsets[distinct + 1] - offsets[distinct]
    if positions.min() < 0 or (positions > lengths[row]).any():
        bad = int(np.flatnonzero((positions < 0) | (positions > lengths[row]))[0])
        raise ConfigError(
            f"origins must be positions within 0..{int(lengths[row[bad]])}; got {int(positions[bad])}.",
            key="origins",
        )
    pairs = np.maximum(lengths - m, 0)  # pairs of each series
    upto = np.clip(positions - m, 0, pairs[row])  # pairs before each window's origin
    needed = np.zeros(distinct.size, dtype=np.int64)
    np.maximum.at(needed, row, upto)
    width = int(needed.max())
    if distinct.size * (width + 1) > FLAT_SCALE_CELLS:
        return None
    j = np.arange(width, dtype=np.int64)
    inside = j < needed[:, None]  # [S, P]
    start = offsets[distinct][:, None] + j
    later = np.where(inside, start + m, 0)
    earlier = np.where(inside, start, 0)
    diff = np.abs(values[later] - values[earlier]) if values.size else np.zeros(inside.shape)
    observed = inside & np.isfinite(diff)
    sums = np.zeros((distinct.size, width + 1))
    counts = np.zeros((distinct.size, width + 1), dtype=np.int64)
    np.cumsum(np.where(observed, diff, 0.0), axis=1, out=sums[:, 1:])
    np.cumsum(observed, axis=1, out=counts[:, 1:])
    n = counts[row, upto]
    scale = np.full(positions.shape, np.nan)
    has_pair = n > 0
    scale[has_pair] = sums[row, upto][has_pair] / n[has_pair]
    return scale
