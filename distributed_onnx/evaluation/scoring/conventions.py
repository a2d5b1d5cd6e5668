"""The ``fev`` convention: score each evaluation window, then take the plain mean over windows.

Two conventions answer "how good is the model over this run", and both are legitimate:

- ``pooled`` (:mod:`.metrics`): sums over every (window, lead) pair of a scope, divided once. A window with
  more observed pairs weighs more.
- ``fev`` (this module): fev 0.10.0's ``Task.evaluation_summary``. An evaluation window there is one cutoff
  across every series; each metric is computed on that window's pairs (pooling its series and leads, exactly
  as ``fev.metrics`` does; each metric's definition is its class in :mod:`.registry`) and the window scores are
  averaged with equal weight. Here a window of fev is the set of this run's windows that share an
  origin, so the accumulator keeps sums *per origin* (its memory grows with distinct origins, not windows).

Per-series MASE and SQL agree between the two; WQL and RMSE do not (RMSE's square root and WQL's ratio do
not commute with the mean over windows). Only the ``global`` scope is reported in the ``fev`` convention.
A window without a pair for a metric (no observed pair, or no usable scale) is left out of that metric's mean.

The per-origin losses double as the loss series of the Diebold-Mariano test (:mod:`.leaderboard`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.batch_pairs import SeriesCodes
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.scoring.registry import FEV, median_index, of_convention, primary

__all__ = ["FEV", "WindowSums", "named_columns", "window_scores"]

F64 = npt.NDArray[np.float64]
#: Column layout of the per-origin matrix (``rho`` takes one column per quantile level, at the end; in a window, the
#: scaled metrics' units are its pairs, so ``scaled`` is ``scaled_pairs``).
_SCALARS = ("pairs", "abs_err", "sq_err", "abs_y", "scaled_pairs", "mase", "sql")


#: Rows added since the last fold that make a fold due (besides outnumbering the rows kept): see :class:`WindowSums`.
FOLD_AFTER_ROWS = 1 << 16


class WindowSums:
    """Sums of one model per window origin (microseconds since the epoch); mergeable like every other sum.

    Rows added (:meth:`update`, :meth:`merge`) wait in a list and are folded into the sums per origin when read,
    or once they outnumber the rows kept (and :data:`FOLD_AFTER_ROWS`): a fold costs the rows kept plus those
    added, so folding at every add made the driver's merge cost every origin merged so far *per part* (a run
    of distinct origins: quadratic in the parts); folding when the added rows have doubled costs each row a
    constant. The sums are bit for bit those of a fold at every add: each origin's rows are added in the same
    order, onto 0.0.
    """

    def __init__(self, quantiles: Sequence[float], median: int | None) -> None:
        self.quantiles = tuple(float(q) for q in quantiles)
        self.median = median
        self._width = len(_SCALARS) + len(self.quantiles)
        self._origins = np.zeros(0, dtype=np.int64)
        self._sums = np.zeros((0, self._width))
        self._pending: list[tuple[npt.NDArray[np.int64], F64]] = []
        self._pending_rows = 0

    @property
    def origins(self) -> npt.NDArray[np.int64]:
        """The distinct origins, ascending."""
        self._fold()
        return self._origins

    @origins.setter
    def origins(self, value: npt.NDArray[np.int64]) -> None:
        self._fold()
        self._origins = value

    @property
    def sums(self) -> F64:
        """``[origins, columns]``: each origin's sums (the columns of ``_SCALARS``, then ``rho`` per quantile)."""
        self._fold()
        return self._sums

    @sums.setter
    def sums(self, value: F64) -> None:
        self._fold()
        self._sums = value

    def update(self, origin_us: npt.NDArray[np.int64], per_window: Mapping[str, F64], scale: F64) -> None:
        """Add windows ``[W]`` from their sums over leads (what :meth:`.MetricsAccumulator.update` returns).

        A window's scale is constant over its leads, so its scaled sums are its plain sums divided by it: no
        loss is recomputed here.
        """
        if not per_window:
            return
        scaled = np.isfinite(scale) & (scale > 0.0)
        s_safe = np.where(scaled, scale, 1.0)
        rho = per_window["rho"]  # [W, Q]: sums of rho_q over the window's scored pairs
        block = np.empty((rho.shape[0], self._width))  # the columns of _SCALARS, then rho, filled in place
        for column, name in enumerate(("pairs", "abs_err", "sq_err", "abs_y")):
            block[:, column] = per_window[name]
        block[:, 4] = np.where(scaled, per_window["pairs"], 0.0)
        block[:, 5] = np.where(scaled, per_window["abs_err"] / s_safe, 0.0)
        block[:, 6] = np.where(scaled, 2.0 * rho.mean(axis=1) / s_safe, 0.0)
        block[:, len(_SCALARS) :] = rho
        self._add(np.asarray(origin_us, dtype=np.int64), block)

    def _add(self, origins: npt.NDArray[np.int64], block: F64) -> None:
        """Add ``block`` row by row to the sums of its origins, after every row added before (folded later)."""
        if not origins.size:
            return
        self._pending.append((origins, block))
        self._pending_rows += origins.size
        if self._pending_rows > max(self._origins.size, FOLD_AFTER_ROWS):
            self._fold()

    def _fold(self) -> None:
        """Fold the rows waiting into the sums per origin (each origin's rows in order, after the sums kept)."""
        if not self._pending:
            return
        origins = np.concatenate([pending for pending, _ in self._pending])
        block = np.concatenate([rows for _, rows in self._pending]) if len(self._pending) > 1 else self._pending[0][1]
        self._pending, self._pending_rows = [], 0
        if _after(self._origins, origins):
            # The usual case (one series, origins ascending after those kept): appended in order, each sum 0 + its
            # row (``+ 0.0`` is that addition: it turns a -0.0 into 0.0, as the general path does). A binary search
            # for batches of distinct origins kept already gained nothing beyond noise (benchmarks/results/scoring.md).
            self._origins = np.concatenate([self._origins, origins])
            self._sums = np.concatenate([self._sums, block + 0.0])
            return
        keys, inverse = np.unique(np.concatenate([self._origins, origins]), return_inverse=True)
        rows, inverse = np.concatenate([self._sums, block]), inverse.ravel()
        merged = np.empty((keys.size, self._width))
        # Each column's rows onto 0.0 in row order, the additions ``np.add.at`` makes (bit for bit), in a fraction
        # of its time (benchmarks/results/driver_cost.md, set 5).
        for column in range(self._width):
            merged[:, column] = np.bincount(inverse, weights=rows[:, column], minlength=keys.size)
        self._origins, self._sums = keys, merged

    def merge(self, other: WindowSums) -> WindowSums:
        other._fold()
        self._add(other._origins, other._sums)
        return self

    def state(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        return {f"{prefix}origins": self.origins, f"{prefix}sums": self.sums}

    @classmethod
    def from_state(
        cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str, quantiles: Sequence[float], median: int | None
    ) -> WindowSums:
        restored = cls(quantiles, median)
        origins = np.asarray(arrays[prefix + "origins"], dtype=np.int64)
        sums = np.asarray(arrays[prefix + "sums"], dtype=np.float64)
        if sums.shape != (origins.size, restored.sums.shape[1]):
            raise ValueError(
                f"window sums have shape {sums.shape}, expected ({origins.size}, {restored.sums.shape[1]})"
            )
        restored.origins, restored.sums = origins, sums
        return restored

    def column(self, name: str) -> F64:
        return self.sums[:, _SCALARS.index(name)]

    def per_window(self) -> dict[str, F64]:
        """Each metric per origin (NaN where a window has no pair for it), in origin order."""
        view = _OriginSums(self)
        with np.errstate(divide="ignore", invalid="ignore"):
            return {metric.name: metric.value(view) for metric in of_convention(FEV, self.median is not None)}

    def by_origin(self) -> list[tuple[str, F64, npt.NDArray[np.int64]]]:
        """``(metric, value [origins], n [origins])`` of each fev metric at every origin (in :attr:`origins` order;
        NaN where an origin has no pair for it): the scope ``origin``, what a per-cutoff evaluation reports."""
        per_window = self.per_window()
        return [
            (metric.name, per_window[metric.name], self.column(metric.count).astype(np.int64))
            for metric in of_convention(FEV, self.median is not None)
        ]

    def rows(self) -> list[tuple[str, float, int]]:
        """``(metric, value, n)`` of the global scope in the fev convention; ``n`` counts the pairs scored."""
        rows = []
        per_window = self.per_window()
        for metric in of_convention(FEV, self.median is not None):
            values = per_window[metric.name]
            defined = np.isfinite(values)
            if defined.any():
                rows.append((metric.name, float(values[defined].mean()), int(self.column(metric.count).sum())))
        return rows


class _OriginSums:
    """The fev convention's view of the sums of each origin: a mean is the sum times the count's reciprocal (NaN
    where the count is zero)."""

    def __init__(self, sums: WindowSums) -> None:
        self._sums = sums

    def __getitem__(self, name: str) -> F64:
        return named_columns(self._sums.sums)[name]

    def mean(self, name: str, count: str) -> F64:
        by = self[count]
        per = np.where(by > 0, 1.0 / np.maximum(by, 1), np.nan)
        total = self[name]
        return total * per[:, None] if total.ndim == 2 else total * per


def window_scores(
    actual: npt.ArrayLike, forecast: npt.ArrayLike, scale: npt.ArrayLike, quantiles: Sequence[float]
) -> F64:
    """Each window's own score in the primary metric (:func:`.registry.primary`; NaN where undefined): a window
    scored as an origin of its own, from the accumulator's per-window sums. The report's fans pick windows by it.

    >>> window_scores([[2.0, 3.0]], [[[0.0, 1.0, 2.0], [2.0, 3.0, 4.0]]], [2.0], (0.1, 0.5, 0.9))
    array([0.25])
    """
    y = np.asarray(actual, dtype=np.float64)
    n_windows, horizon = y.shape
    accumulator = MetricsAccumulator(quantiles, horizon)
    codes = SeriesCodes([""], np.zeros(n_windows, dtype=np.intp), n_windows)
    windows = WindowSums(accumulator.quantiles, median_index(accumulator.quantiles))
    windows.update(
        np.arange(n_windows, dtype=np.int64),
        accumulator.update(codes, y, forecast, scale),
        np.asarray(scale, dtype=np.float64),
    )
    scores = windows.per_window()[primary(windows.median is not None)]
    return scores if n_windows else np.zeros(0)


def named_columns(matrix: F64) -> dict[str, F64]:
    """Each sum of ``matrix`` by name: :attr:`WindowSums.sums`' layout, or any weighted sum of its rows (the origin
    bootstrap's, :mod:`.resampling`); in a window, the scaled metrics' units are its pairs (``scaled``)."""
    named = {name: matrix[:, column] for column, name in enumerate(_SCALARS)}
    named["scaled"] = named["scaled_pairs"]
    named["rho"] = matrix[:, len(_SCALARS) :]
    return named


def _after(kept: npt.NDArray[np.int64], origins: npt.NDArray[np.int64]) -> bool:
    """Whether ``origins`` ascend strictly, all after the last of ``kept`` (sorted)."""
    if kept.size and origins[0] <= kept[-1]:
        return False
    return bool((origins[1:] > origins[:-1]).all())
