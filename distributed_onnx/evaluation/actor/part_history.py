"""What the scoring of a part needs from the series before each window: its seasonal scale and its seasons.

MASE and SQL divide by each window's seasonal scale, and both baselines repeat (or take quantiles of) the seasons
before the origin, so the actor that scores a batch gathers, per window, the scale ``s_w`` and the seasonal cells
of the ``K m`` steps before the origin (docs/design.md, Metrics). Both come from the float64 series, not the
float32 context the model saw: the baselines repeat actuals exactly. A batch of one series reads its distinct
cells straight from the series and its scales from per-series prefix sums, cached between the parts an actor runs
(a part rarely spans more than a few series); over the flat layout (:class:`SeriesArrays`) a batch of many short
series is served by vector passes over every series at once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.layout import SeriesArrays
from distributed_onnx.evaluation.data.packing import gather_blocks
from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.windows import PlannedBatch, WindowPlan, WindowSpec, plan_series
from distributed_onnx.evaluation.scoring.naive import (
    SeasonalScaler,
    SeasonCells,
    flat_seasonal_scales,
    season_cells,
    season_count,
    series_season_cells,
)

__all__ = ["SeriesHistory", "cell_positions", "gather_history"]

#: Series whose plan and seasonal scale an actor keeps between parts (a part rarely spans more).
SERIES_CACHE = 256


class SeriesHistory:
    """Per-series origins, scales and history of one backtest's series, with the caches an actor keeps."""

    def __init__(self, source: SeriesSource, plan: WindowPlan, spec: WindowSpec, seasonality: int) -> None:
        self.source = source  # the series of the part being run (the runner sets it part by part)
        self.plan = plan
        self.spec = spec
        self.seasonality = seasonality
        self.history_steps = season_count(spec.context_length, seasonality) * seasonality
        self._plans: OrderedDict[int, np.ndarray] = OrderedDict()
        self._scalers: OrderedDict[int, SeasonalScaler] = OrderedDict()

    def origins(self, series_index: int) -> np.ndarray:
        """The kept origins of one series, checked against the driver's plan (cached)."""
        cached = self._plans.get(series_index)
        if cached is None:
            series = self.source.series(series_index)
            cached = plan_series(series, self.spec).origins
            if cached.shape[0] != self.plan.counts[series_index]:
                raise DataError(
                    f"series {series.series_id!r} gives {cached.shape[0]} windows here but "
                    f"{self.plan.counts[series_index]} when the run was planned"
                )
            self._plans[series_index] = cached
            self._scaler(series_index)
            if len(self._plans) > SERIES_CACHE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(series_index)
        return cached

    def _scaler(self, series_index: int) -> SeasonalScaler:
        """The seasonal scale of one series (cached: a part's batches share their series)."""
        cached = self._scalers.get(series_index)
        if cached is None:
            values = self.source.series(series_index).values
            cached = self._scalers[series_index] = SeasonalScaler(values, self.seasonality)
            if len(self._scalers) > SERIES_CACHE:
                self._scalers.popitem(last=False)
        else:
            self._scalers.move_to_end(series_index)
        return cached

    def scales_and_cells(self, planned: PlannedBatch) -> tuple[np.ndarray, SeasonCells]:
        """Each window's seasonal scale ``[W]`` and the seasonal cells its baselines read (:class:`SeasonCells`).

        A batch of one series (the usual batch of a long series): the scale from its cached prefix sums and the
        distinct cells read straight from its values (a few hundred cells of ``K`` values, not ``W x K m`` steps of
        history). A batch of several series: the ``K m`` steps before each origin, gathered by vector passes over
        every series at once over the flat layout (many short series put a hundred in one batch), else per series;
        its cells are those of :func:`cell_positions`.
        """
        m, n_windows, history_steps = self.seasonality, planned.n_windows, self.history_steps
        source = self.source
        series_index = np.asarray(planned.series_index)
        horizon = self.spec.horizon
        if n_windows and not (series_index != series_index[0]).any():
            one = int(series_index[0])
            values = source.series(one).values
            origins = np.asarray(planned.origin_index, dtype=np.int64)
            cells = series_season_cells(values, origins, m, history_steps // m, horizon)
            return self._scaler(one).scales(origins), cells
        positions = cell_positions(planned, m)
        if isinstance(source, SeriesArrays):
            series_index = np.asarray(planned.series_index, dtype=np.int64)
            origins = np.asarray(planned.origin_index, dtype=np.int64)
            history = gather_history(source, series_index, origins, history_steps)
            flat = flat_seasonal_scales(source.values, source.offsets, series_index, origins, m)
            if flat is not None:
                return flat, season_cells(history, m, horizon, positions)
        else:
            history = np.empty((n_windows, history_steps))
        scale = np.empty(n_windows)
        cuts = np.flatnonzero(np.diff(planned.series_index)) + 1
        for rows in np.split(np.arange(n_windows), cuts):
            series_index_one = int(planned.series_index[rows[0]])
            origins_one = planned.origin_index[rows]
            scale[rows] = self._scaler(series_index_one).scales(origins_one)
            if not isinstance(source, SeriesArrays):
                values = source.series(series_index_one).values
                history[rows] = gather_blocks(values, origins_one, history_steps, 0)
        return scale, season_cells(history, m, horizon, positions)


def cell_positions(planned: PlannedBatch, seasonality: int) -> np.ndarray:
    """Each window's origin on one axis of time per series (for :func:`.naive.season_cells`).

    Two windows share a seasonal cell only within a series; the series are laid side by side, far enough apart
    that no cell of one meets a cell of another.
    """
    origins = np.asarray(planned.origin_index, dtype=np.int64)
    series = np.asarray(planned.series_index, dtype=np.int64)
    if origins.size == 0 or (series == series[0]).all():
        return origins
    _, code = np.unique(series, return_inverse=True)
    width = int(origins.max()) + seasonality + 1
    return code.ravel().astype(np.int64) * width + origins


def gather_history(source: SeriesArrays, series_index: np.ndarray, origins: np.ndarray, steps: int) -> np.ndarray:
    """``values[o - steps : o]`` of each window's series, NaN before the series starts: one gather, no loop."""
    lengths = source.offsets[series_index + 1] - source.offsets[series_index]
    if origins.size and ((origins < 0) | (origins > lengths)).any():
        bad = int(np.flatnonzero((origins < 0) | (origins > lengths))[0])
        raise ValueError(f"origins must lie in 0..{int(lengths[bad])} (the series' steps), got {int(origins[bad])}")
    positions = origins[:, None] + np.arange(-steps, 0, dtype=np.int64)  # [W, steps]
    inside = positions >= 0  # and < origin <= length
    flat = np.where(inside, source.offsets[series_index][:, None] + positions, 0)
    if not source.values.size:
        return np.full(positions.shape, np.nan)
    return np.where(inside, source.values[flat], np.nan)
