"""Streaming, mergeable accumulation of the backtest metrics (docs/design.md, Metrics).

A backtest scores millions of (window, lead) pairs spread over many actors, so metrics are accumulated as
*sums* and only divided at the end:

- memory grows with the number of series, leads and quantiles, never with the number of windows;
- two accumulators over disjoint batches ``merge`` into exactly the accumulator over both batches, so each
  actor can score its own batches and the driver adds them up (order does not matter, up to float rounding).

Per series we keep sums over all its (window, lead) pairs plus window-level sums for MASE/SQL; per lead we
keep the same sums across all series. The global scope is the sum of the per-series sums.

A (window, lead) pair counts when its actual is observed *and* every requested quantile of the forecast is
finite, and, when the caller passes ``valid``, when that mask says so: the backtest passes the run's one set
of pairs (:mod:`.pairs`: every model's forecast finite there), so every model is scored on the same pairs.
One validity mask shared by all metrics keeps ``n`` comparable between them and keeps the WQL denominator the
same for every level; ``n`` always counts (window, lead) pairs, MASE and SQL included (the pairs of windows
with a usable scale). Missing pairs and windows without a usable scale are left out and counted
(``n_missing_pairs``, ``n_unscaled_windows``). The seasonal scale ``s_w`` and the seasonal-naive
baseline (scored by a second accumulator) come from :mod:`distributed_onnx.evaluation.scoring.naive`.

What a batch's models share (its pairs, series codes, scales) is built once in :mod:`.batch_pairs`; the losses of
a batch are computed and reduced in :mod:`.losses`; the table of metrics is built from the sums in
:mod:`.metrics_table`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.evaluation.scoring.batch_pairs import BatchPairs, SeriesCodes, _group_sum, finite_pairs
from distributed_onnx.evaluation.scoring.losses import CellForecast, Levels, batch_losses
from distributed_onnx.evaluation.scoring.metrics_table import (
    METRICS_SCHEMA,
    POOLED,
    SERIES_PER_TABLE,
    RowLayout,
    SortedSeries,
    metrics_table,
    metrics_tables,
    sorted_series,
    unit_column,
)
from distributed_onnx.evaluation.scoring.registry import SUMS, median_index
from distributed_onnx.model.quantiles import central_intervals, validate_quantiles

__all__ = ["METRICS_SCHEMA", "POOLED", "SERIES_PER_TABLE", "MetricsAccumulator"]

F64 = npt.NDArray[np.float64]

#: Sums kept per unit (a series, or a lead), each described in :mod:`.registry`; ``rho`` has one column per
#: quantile level, ``hits`` one per central interval, the others one.
_FIELDS = SUMS


@dataclass(frozen=True)
class _Shape:
    """What an accumulator's quantile levels fix: the intervals scored, the loss layout, and where each field's
    columns lie in the packed sums (:data:`_FIELDS` side by side, ``rho`` one column per level, ``hits`` one per
    central interval)."""

    quantiles: tuple[float, ...]
    intervals: tuple[tuple[float, float], ...]
    levels: Levels
    columns: dict[str, int | slice]  # shared by every accumulator of these levels: read, never written
    width: int


@functools.lru_cache(maxsize=64)
def _shape_of(quantiles: tuple[float, ...]) -> _Shape:
    """The shape of the accumulators of ``quantiles``, built once per set of levels: the driver rebuilds three
    accumulators per model from every part's sums file, and building the layout each time was a large share of its
    merge (benchmarks/results/driver_cost.md, set 5)."""
    quantiles = validate_quantiles(quantiles)
    intervals = tuple(central_intervals(quantiles))
    median = median_index(quantiles)
    lower = np.asarray([quantiles.index(lo) for lo, _ in intervals], dtype=np.intp)
    upper = np.asarray([quantiles.index(hi) for _, hi in intervals], dtype=np.intp)
    widths = {"rho": len(quantiles), "hits": len(intervals)}
    columns: dict[str, int | slice] = {}
    start = 0
    for name in _FIELDS:
        width = widths.get(name, 1)
        columns[name] = slice(start, start + width) if name in widths else start
        start += width
    levels = Levels(np.asarray(quantiles), lower, upper, median)
    for array in (levels.levels, lower, upper):  # shared by every accumulator of these levels: never written
        array.flags.writeable = False
    return _Shape(quantiles, intervals, levels, columns, start)


class MetricsAccumulator:
    """Accumulates forecast metrics batch by batch; ``merge`` adds another accumulator's sums.

    ``quantiles`` are the requested levels, ascending, in the order of the forecast's last axis. Point
    metrics (mae, rmse, mase) need the median, so they are only reported when 0.5 is requested. Counts are
    kept as float64 sums (exact up to 2**53 pairs) so every state array is added the same way.
    """

    def __init__(self, quantiles: Sequence[float], horizon: int) -> None:
        shape = _shape_of(tuple(float(q) for q in quantiles))
        if horizon < 1:
            raise ConfigError(f"horizon must be at least 1 step; got {horizon}.", key="horizon")
        self.horizon = int(horizon)
        self.quantiles, self.intervals = shape.quantiles, list(shape.intervals)
        self._median, self._layout = shape.levels.median, shape.levels
        self._series_index: dict[str, int] = {}
        # Every field of a scope side by side in one matrix: a batch adds to each scope with one addition, the
        # leaderboard multiplies the series' matrix as it is, and it is the state a part's sums file holds.
        self._columns, self._width = shape.columns, shape.width
        self._buffer = np.zeros((0, self._width))  # the per-series sums' rows and room to grow (see _grow)
        self._series_sums = self._buffer[:0]
        self._lead_sums = np.zeros((self.horizon, self._width))
        self.n_windows = 0
        self.n_missing_pairs = 0
        self.n_unscaled_windows = 0

    @property
    def _series(self) -> dict[str, F64]:
        """Each field's per-series sums: views of the packed matrix."""
        return self._fields(self._series_sums)

    @property
    def _leads(self) -> dict[str, F64]:
        """Each field's per-lead sums: views of the packed matrix."""
        return self._fields(self._lead_sums)

    def _fields(self, matrix: F64) -> dict[str, F64]:
        return {name: matrix[:, self._columns[name]] for name in _FIELDS}

    def _rows_of(self, series_ids: Sequence[str]) -> npt.NDArray[np.intp]:
        """Map distinct series ids to rows of the per-series state, growing it for series seen first."""
        new = [sid for sid in series_ids if sid not in self._series_index]
        if new:
            for sid in new:
                self._series_index[sid] = len(self._series_index)
            self._grow(len(self._series_index))
        return np.asarray([self._series_index[sid] for sid in series_ids], dtype=np.intp)

    def _grow(self, rows: int) -> None:
        """Per-series sums of ``rows`` rows, the new ones zero: the first rows of one ``[capacity, columns]`` buffer
        whose capacity doubles when full.

        The driver merges part after part, each adding its series: grown by a copy of every sum per part, the
        merged sums cost it more than their size (freed copies it could not give back). Rows past ``rows`` are
        zeros no view reaches (``np.zeros``: pages untouched until written).
        """
        if self._buffer.shape[0] < rows:
            bigger = np.zeros((max(rows, 2 * self._buffer.shape[0]), self._width))
            bigger[: self._series_sums.shape[0]] = self._series_sums
            self._buffer = bigger
        self._series_sums = self._buffer[:rows]

    def update(
        self,
        series_ids: Sequence[str] | npt.NDArray[Any] | SeriesCodes,
        actual: npt.ArrayLike,
        forecast: npt.ArrayLike,
        scale: npt.ArrayLike,
        valid: npt.NDArray[np.bool_] | None = None,
    ) -> dict[str, F64]:
        """Add one batch: ``actual[W, H]`` (NaN = missing), ``forecast[W, H, Q]``, ``scale[W]`` (s_w).

        ``valid[W, H]``, when given, are the pairs scored (the run's common pairs: observed, forecast finite; the
        caller guarantees it). Windows whose
        scale is NaN or not positive still count for every metric except mase and sql. Returns the batch's
        per-window sums over leads (``pairs``, ``abs_err``, ``sq_err``, ``abs_y``, ``rho[W, Q]``...), which the
        fev convention (:mod:`.conventions`) adds per origin without recomputing a loss.
        """
        ids = series_ids if isinstance(series_ids, SeriesCodes) else SeriesCodes.of(series_ids)
        y = np.ascontiguousarray(actual, dtype=np.float64)
        f = _as_float(forecast)
        s = np.asarray(scale, dtype=np.float64)
        self._check_shapes(ids.size, y, f, s)
        if ids.size == 0:
            return {}
        return self.add(BatchPairs.of(ids, y, s, valid, None if valid is not None else finite_pairs(f)), f)

    def _check_shapes(self, n_win: int, y: F64, f: npt.NDArray[Any] | CellForecast, s: F64) -> None:
        horizon, n_q = self.horizon, len(self.quantiles)
        expected = {"actual": (n_win, horizon), "forecast": (n_win, horizon, n_q), "scale": (n_win,)}
        for name, array in (("actual", y), ("forecast", f), ("scale", s)):
            if array.shape != expected[name]:
                raise DataError(
                    f"{name} must have shape {expected[name]} (windows={n_win}, horizon={horizon}, "
                    f"quantiles={n_q}); got {array.shape}.",
                    array=name,
                )

    def add(self, pairs: BatchPairs, forecast: npt.NDArray[Any] | CellForecast) -> dict[str, F64]:
        """:meth:`update` with the batch's pairs built once for every model (``forecast`` float32 or float64)."""
        n_win = pairs.codes.size
        self._check_shapes(n_win, pairs.actual, forecast, pairs.scale)
        if n_win == 0:
            return {}
        losses = batch_losses(pairs.actual, forecast, pairs.valid, pairs.all_valid, self._layout, pairs.scratch)
        point = losses.point
        squared = np.square(point)
        step_sql = losses.rho_by_pair  # [W, H], made 2 * (rho / Q): each pair's mean over q of 2 * rho_q
        np.divide(step_sql, len(self.quantiles), out=step_sql)
        np.multiply(step_sql, 2.0, out=step_sql)
        s_safe, use_window, column = pairs.scale, pairs.use_window, self._columns
        # Every window's sums (the columns of _FIELDS), written in place into one matrix.
        by_window = np.empty((n_win, self._width))
        by_window[:, column["pairs"]] = pairs.n_valid  # counts: exact as floats
        abs_err = np.sum(point, axis=1, out=by_window[:, column["abs_err"]])
        np.sum(squared, axis=1, out=by_window[:, column["sq_err"]])
        by_window[:, column["abs_y"]] = pairs.abs_y_by_window
        by_window[:, column["rho"]] = losses.rho_by_window
        by_window[:, column["hits"]] = losses.hits_by_window
        by_window[:, column["scaled"]] = use_window
        by_window[:, column["mase"]] = np.where(use_window, abs_err / pairs.denominator, 0.0)
        by_window[:, column["sql"]] = np.where(use_window, step_sql.sum(axis=1) / pairs.denominator, 0.0)
        by_window[:, column["scaled_pairs"]] = np.where(use_window, pairs.n_valid, 0)
        # Every lead's sums, likewise. The scaled losses of a pair not scored are 0 / s = 0 already, so only the
        # windows without a usable scale need masking (none, in the usual batch).
        by_lead = np.empty((self.horizon, self._width))
        by_lead[:, column["pairs"]] = pairs.by_lead["pairs"]
        np.sum(point, axis=0, out=by_lead[:, column["abs_err"]])
        np.sum(squared, axis=0, out=by_lead[:, column["sq_err"]])
        by_lead[:, column["abs_y"]] = pairs.by_lead["abs_y"]
        by_lead[:, column["rho"]] = losses.rho_by_lead
        by_lead[:, column["hits"]] = losses.hits_by_lead
        by_lead[:, column["scaled"]] = pairs.by_lead["scaled"]
        for name, losses_of_pairs in (("mase", point), ("sql", step_sql)):
            scaled = np.divide(losses_of_pairs, s_safe[:, None], out=squared)  # squared's last use was above
            if not pairs.all_scaled:
                np.copyto(scaled, 0.0, where=~pairs.lead_scaled)
            np.sum(scaled, axis=0, out=by_lead[:, column[name]])
        by_lead[:, column["scaled_pairs"]] = pairs.by_lead["scaled"]
        # The batch's distinct series (found once per batch, not once per model); every column of every window
        # grouped by one bincount (per group, window after window).
        rows = self._rows_of(pairs.codes.distinct)
        grouped = _group_sum(pairs.codes.local, by_window, rows.size)
        if rows.size == 1:
            self._series_sums[int(rows[0])] += grouped[0]
        else:
            self._series_sums[rows] += grouped
        self._lead_sums += by_lead

        self.n_windows += n_win
        self.n_missing_pairs += int(pairs.valid.size - pairs.n_valid.sum())
        self.n_unscaled_windows += int((~pairs.scaled).sum())
        return {name: by_window[:, column[name]] for name in ("pairs", "abs_err", "sq_err", "abs_y", "rho", "hits")}

    def merge(self, other: MetricsAccumulator) -> Self:
        """Add ``other``'s sums to this accumulator (in place) and return it, for ``functools.reduce``."""
        if other.quantiles != self.quantiles or other.horizon != self.horizon:
            raise ConfigError(
                f"cannot merge metrics of different runs: quantiles {list(self.quantiles)} vs "
                f"{list(other.quantiles)}, horizon {self.horizon} vs {other.horizon}.",
                key="quantiles",
            )
        other_ids = list(other._series_index)  # insertion order == row order
        rows = self._rows_of(other_ids)
        self._series_sums[rows] += other._series_sums
        self._lead_sums += other._lead_sums
        self.n_windows += other.n_windows
        self.n_missing_pairs += other.n_missing_pairs
        self.n_unscaled_windows += other.n_unscaled_windows
        return self

    def state(self, prefix: str = "") -> dict[str, npt.NDArray[Any]]:
        """Every sum as five plain arrays (no objects, no pickle) for a part's sums file; see :meth:`from_state`.

        The fields of each scope are packed side by side into one ``[rows, columns]`` matrix: a driver merging
        thousands of parts reads a handful of arrays per part, not one per field (each array read is a cost per
        part).
        """
        return {
            f"{prefix}series_ids": np.asarray(self.series_ids, dtype=np.str_),
            f"{prefix}quantiles": np.asarray(self.quantiles, dtype=np.float64),
            f"{prefix}counters": np.asarray(
                [self.horizon, self.n_windows, self.n_missing_pairs, self.n_unscaled_windows], dtype=np.int64
            ),
            f"{prefix}series": self._series_sums.copy(),
            f"{prefix}leads": self._lead_sums.copy(),
        }

    @classmethod
    def from_state(cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str = "") -> MetricsAccumulator:
        """Rebuild an accumulator from :meth:`state`; a missing or misshapen array raises ``DataError``."""
        try:
            horizon, n_windows, n_missing, n_unscaled = (int(v) for v in arrays[prefix + "counters"])
            restored = cls([float(q) for q in arrays[prefix + "quantiles"]], horizon)
            restored._rows_of([str(sid) for sid in arrays[prefix + "series_ids"]])
            restored._buffer = restored._unpacked(arrays[prefix + "series"], len(restored._series_index), "series")
            restored._series_sums = restored._buffer[:]
            restored._lead_sums = restored._unpacked(arrays[prefix + "leads"], horizon, "leads")
        except (KeyError, ValueError) as exc:
            raise DataError(f"metric sums are incomplete or misshapen: {exc}") from exc
        restored.n_windows, restored.n_missing_pairs, restored.n_unscaled_windows = n_windows, n_missing, n_unscaled
        return restored

    def _unpacked(self, packed: npt.NDArray[Any], rows: int, scope: str) -> F64:
        expected = (rows, self._width)
        matrix = np.array(packed, dtype=np.float64)  # a copy: the state may be a read-only file's
        if matrix.shape != expected:
            raise ValueError(f"{scope} sums have shape {matrix.shape}, expected {expected}")
        return matrix

    def series_sums(self) -> dict[str, F64]:
        """Every per-series sum (a copy, rows in :attr:`series_ids` order)."""
        return {name: values.copy() for name, values in self._series.items()}

    def series_matrix(self) -> F64:
        """Every per-series sum side by side, ``[series, columns]`` in :data:`_FIELDS` order (rows in
        :attr:`series_ids` order): read only, a view of the sums themselves."""
        matrix = self._series_sums.view()
        matrix.flags.writeable = False
        return matrix

    def series_views(self) -> dict[str, F64]:
        """Every per-series sum itself (read-only views, rows in :attr:`series_ids` order): the leaderboard
        resamples series from them without a copy of every sum."""
        views = {name: values.view() for name, values in self._series.items()}
        for view in views.values():
            view.flags.writeable = False
        return views

    def reserve(self, series_ids: Sequence[str]) -> None:
        """Give these series their rows now, in this order (each not yet seen), so merging parts that add them
        later grows no array: one allocation instead of one copy of every sum per part (the driver, at 100,000
        series). The sums merged afterwards are the same, added in the same order."""
        self._rows_of(list(series_ids))

    def series_rows(self) -> Mapping[str, int]:
        """Each series' row of the sums (read only)."""
        return self._series_index

    def pairs_scored(self) -> int:
        """Pairs scored over every series (no copy of the sums: the driver calls it at 100,000 series)."""
        return int(self._series["pairs"].sum())

    @property
    def series_ids(self) -> list[str]:
        """The series seen so far, in first-seen order."""
        return list(self._series_index)

    def to_table(self, model: str) -> pa.Table:
        """The long ``metrics`` table: global rows, then one block per series (sorted), then per lead
        (:func:`.metrics_table.metrics_table`)."""
        return metrics_table(
            model,
            self.quantiles,
            self.intervals,
            self._median is not None,
            self._series_index,
            self._series,
            self._leads,
        )

    def tables(
        self, model: str, series_per_table: int = SERIES_PER_TABLE, *, with_series: bool = True
    ) -> Iterator[pa.Table]:
        """:meth:`to_table`'s rows a table at a time: global, the series ``series_per_table`` at a time (unless
        not ``with_series``), leads."""
        layout = self._row_layout()
        series = (self._series_index, self._series, self._leads)
        return metrics_tables(model, layout, *series, series_per_table, with_series=with_series)

    def sorted_series(self) -> SortedSeries:
        """The series sorted by id (the order of the table's series block), with their rows of the sums."""
        return sorted_series(self._series_index)

    def series_column(
        self, metric: str, quantile: float | None, rows: npt.NDArray[np.intp]
    ) -> tuple[F64, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """One per-series metric of the series at ``rows``: (value, n, kept) as the table's series rows have them."""
        sums = {name: values[rows] for name, values in self._series.items()}
        return unit_column(sums, self._row_layout(), metric, quantile)

    def _row_layout(self) -> RowLayout:
        return RowLayout(self.quantiles, self.intervals, self._median is not None)


def _as_float(values: npt.ArrayLike) -> npt.NDArray[np.floating[Any]]:
    """float32 and float64 arrays as they are (no copy: the losses cast them exactly); anything else as float64."""
    array = np.asarray(values)
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)
