"""The losses of one batch of forecasts, reduced straight to the sums the metrics keep (vectorised, in cache).

Scoring a batch touches every (window, lead, quantile) of every model once: a batch of 256 windows x 96 leads x
21 quantiles (Chronos-2's levels) is half a million losses, against one model call for the whole batch.
To cost a small fraction of that call (benchmarks/results/scoring.md), the losses are computed here

- in the model's own layout, ``[windows, quantiles, leads]`` (ONNX Runtime emits ``[W, Q, H]``; the forecast the
  accumulator sees is a ``[W, H, Q]`` view of it), so every reduction runs over long contiguous rows;
- a few windows at a time (:data:`CHUNK_BYTES`), into two buffers that stay in the core's cache, each
  element-wise step writing into them in place (no fresh multi-megabyte arrays per step);
- straight into the sums: per window over leads, per lead over windows, per (window, lead) over quantiles.

Exactness: every loss is the same IEEE operation on the same operands whatever the forecast's dtype or memory
layout (the error is always formed into a float64 buffer of one layout), and every sum has one fixed order: over
leads, numpy's pairwise sum of a contiguous row; over quantiles and over windows, left to right (the window order
carries on from chunk to chunk: the lead sums so far are the first row of the next chunk's reduction). So a
forecast read back from its Parquet part rescores bit for bit, and parts merge exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["CHUNK_BYTES", "BatchLosses", "CellForecast", "Levels", "Scratch", "batch_losses"]

F64 = npt.NDArray[np.float64]
#: Bytes of one chunk's float64 buffer: the windows scored at once fill about this much, so the two buffers stay
#: in a core's L2 cache, where the element-wise passes run faster than over a whole batch (a cache heuristic,
#: not a tuned figure).
CHUNK_BYTES = 1 << 20


class Levels(NamedTuple):
    """The requested quantile levels and where the median and each central interval's ends sit among them."""

    levels: F64  # [Q], ascending
    lower: npt.NDArray[np.intp]  # [C]: the lower level of each central interval
    upper: npt.NDArray[np.intp]  # [C]: its upper level
    median: int | None


@dataclass(frozen=True)
class BatchLosses:
    """One batch's losses, reduced. ``W`` windows, ``H`` leads, ``Q`` quantiles, ``C`` central intervals."""

    point: F64  # [W, H]: |y - q0.5| (zero without a median, or on a pair not scored)
    rho_by_window: F64  # [W, Q]: sum over leads of rho_q(y - y_q)
    rho_by_lead: F64  # [H, Q]: sum over windows
    rho_by_pair: F64  # [W, H]: sum over quantiles
    hits_by_window: npt.NDArray[np.int64]  # [W, C]: actuals inside each central interval, over leads
    hits_by_lead: npt.NDArray[np.int64]  # [H, C]: over windows


class Scratch:
    """Work buffers of :func:`batch_losses` and its callers, kept by name and reused: by every model scored on a
    batch, and batch after batch and part after part when the caller keeps one (an actor's part runner does).

    One flat buffer per name, grown when a larger shape is asked for, so batches of any size (the last of a
    part is often shorter) share it: memory stays that of the largest batch.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], npt.NDArray[Any]] = {}
        self._kernels: dict[tuple[Any, ...], _Chunks] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> npt.NDArray[Any]:
        """A C-ordered array of ``shape`` over the buffer kept under ``name`` (its contents are left over)."""
        size = int(np.prod(shape, dtype=np.int64))
        key = (name, np.dtype(dtype).str)
        if key not in self._buffers or self._buffers[key].size < size:
            self._buffers[key] = np.empty(size, dtype=dtype)
        return self._buffers[key][:size].reshape(shape)

    def kernel(self, levels: Levels, chunk: int, n_quantiles: int, horizon: int) -> _Chunks:
        """The chunk kernel of these levels and shapes over these buffers, set up once and kept (every model of a
        batch and every batch share it: setting it up cost a tenth of a model's losses, measured)."""
        key: tuple[Any, ...] = (levels.levels.tobytes(), levels.lower.tobytes(), levels.upper.tobytes())
        key += (levels.median, chunk, n_quantiles, horizon)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = _Chunks(levels, self, chunk, n_quantiles, horizon)
        return kernel


@dataclass(frozen=True)
class CellForecast:
    """A forecast ``[W, H, Q]`` whose pair ``(w, h)`` is column ``of_pair[w, h]`` of ``by_cell[Q, U]``.

    The seasonal-quantile baseline is one: its windows share seasonal cells, so it is a small table and an index.
    :func:`batch_losses` gathers it a chunk of windows at a time into a buffer that stays in cache, instead of
    reading a ``[Q, W, H]`` copy written to memory first (what that copy cost, in writing it, checking it finite and
    reading it back cold: benchmarks/results/scoring.md). The values are the same.
    """

    by_cell: F64  # [Q, U]
    of_pair: npt.NDArray[np.intp]  # [W, H]

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.of_pair.shape, self.by_cell.shape[0])

    def block(self, rows: slice, out: F64) -> F64:
        """Rows ``rows`` as ``[c, Q, H]`` (a view of ``out``, C-ordered ``[Q, c, H]``)."""
        np.take(self.by_cell, self.of_pair[rows], axis=1, out=out, mode="clip")
        return out.transpose(1, 0, 2)

    def level(self, rows: npt.NDArray[np.intp], index: int) -> F64:
        """Level ``index`` of windows ``rows``: ``[k, H]``."""
        return np.take(self.by_cell[index], self.of_pair[rows])

    def materialized(self) -> F64:
        """The whole forecast ``[W, H, Q]`` (a view of a ``[Q, W, H]`` array)."""
        return np.take(self.by_cell, self.of_pair, axis=1).transpose(1, 2, 0)

    def finite(self) -> npt.NDArray[np.bool_]:
        """``[W, H]``: every level finite (a cell's levels are all finite or all NaN: no observed value)."""
        cell_finite = np.isfinite(self.by_cell).all(axis=0)
        if cell_finite.all():
            return np.ones(self.of_pair.shape, dtype=bool)
        return np.take(cell_finite, self.of_pair)


def batch_losses(
    actual: F64,
    forecast: npt.NDArray[np.floating[Any]] | CellForecast,
    valid: npt.NDArray[np.bool_],
    all_valid: bool,
    levels: Levels,
    scratch: Scratch | None = None,
) -> BatchLosses:
    """Losses of ``forecast[W, H, Q]`` (float32 or float64, any layout) against ``actual[W, H]`` on ``valid`` pairs.

    ``actual`` must already be zero on the pairs not scored; their errors are set to zero too (the ``0 - 0`` of
    masked operands), so they add nothing to any sum.
    ``rho_q(u) = q*u - min(u, 0)``; coverage is read from the signs of the errors (``y - f >= 0`` exactly when
    ``f <= y``), so the forecast is read once. A forecast whose every level is one point (a stride-0 quantile
    axis: the seasonal naive) has one error per pair: it is formed, masked and signed once, not once per level;
    every loss is still the same operation on the same operands, so the sums equal those of a copy bit for bit.
    A :class:`CellForecast` is gathered chunk by chunk, its losses those of its :meth:`~CellForecast.materialized`
    copy.
    """
    n_windows, horizon, n_quantiles = forecast.shape
    most = max(1, CHUNK_BYTES // (8 * n_quantiles * horizon))
    chunk = min(most, n_windows)
    out = _Sums(n_windows, horizon, n_quantiles, levels.lower.size, chunk)
    kernel = (scratch if scratch is not None else Scratch()).kernel(levels, most, n_quantiles, horizon)
    kernel.start()
    cells = forecast if isinstance(forecast, CellForecast) else None
    if not isinstance(forecast, CellForecast):
        one_point = n_quantiles > 1 and forecast.strides[2] == 0
        by_level = forecast.transpose(0, 2, 1)  # [W, Q, H]: a view, contiguous leads for a model's output
    for start in range(0, n_windows, chunk):
        rows = slice(start, min(start + chunk, n_windows))
        mask = None if all_valid else ~valid[rows]
        if cells is not None:
            block = cells.block(rows, kernel.gathered(rows.stop - rows.start))
            error = kernel.losses(actual[rows], block, mask, out, rows)
        elif one_point:
            error = kernel.point_losses(actual[rows], by_level[rows, :1, :], mask, out, rows)
        else:
            error = kernel.losses(actual[rows], by_level[rows], mask, out, rows)
        np.sum(error, axis=2, out=out.rho_by_window[rows])
        np.sum(error, axis=1, out=out.rho_by_pair[rows])
        kernel.carry_lead_sums(error.shape[0])
    return BatchLosses(
        point=out.point,
        rho_by_window=out.rho_by_window,
        rho_by_lead=kernel.lead_sums.T.copy(),  # a copy: the buffer serves the next model
        rho_by_pair=out.rho_by_pair,
        hits_by_window=out.hits_by_window,
        hits_by_lead=np.ascontiguousarray(out.hits_by_lead.T),
    )


class _Sums:
    """The arrays :func:`batch_losses` fills, chunk by chunk."""

    def __init__(self, n_windows: int, horizon: int, n_quantiles: int, n_intervals: int, chunk: int) -> None:
        self.rho_by_window = np.empty((n_windows, n_quantiles))
        self.rho_by_pair = np.empty((n_windows, horizon))
        self.point = np.zeros((n_windows, horizon))
        self.hits_by_window = np.empty((n_windows, n_intervals), dtype=np.int64)
        self.hits_by_lead = np.zeros((n_intervals, horizon), dtype=np.int64)
        self.count_type = np.uint8 if max(horizon, chunk) < 256 else np.int64  # a chunk's counts fit their bytes

    def add_hits(self, hits: npt.NDArray[np.bool_], rows: slice) -> None:
        """Add a chunk's hits ``[c, C, H]`` to the counts per window and per lead (integers: exact in any order);
        ``[c, 1, H]``: the same hits for every interval."""
        as_bytes = hits.view(np.uint8)
        self.hits_by_window[rows] = np.add.reduce(as_bytes, axis=2, dtype=self.count_type)  # [c, 1] broadcasts
        self.hits_by_lead += np.add.reduce(as_bytes, axis=0, dtype=self.count_type)


class _Chunks:
    """The element-wise steps of one chunk of windows, in buffers reused from chunk to chunk."""

    def __init__(self, levels: Levels, scratch: Scratch, chunk: int, n_quantiles: int, horizon: int) -> None:
        self.levels = levels
        self.levels_column = levels.levels[:, None]
        # Each level repeated over the leads: multiplying by it runs over whole [Q, H] rows (one inner loop a window;
        # broadcasting the [Q, 1] column ran one short loop per (window, level): twice the time, measured).
        self.levels_by_lead = np.ascontiguousarray(np.broadcast_to(self.levels_column, (n_quantiles, horizon)))
        self.lower_ends, self.upper_ends = _as_slice(levels.lower), _as_slice(levels.upper)
        # Row 0 of ``work`` carries the lead sums of the windows before the chunk: reducing rows 0..c over windows
        # adds window after window, exactly as one reduction over the whole batch would.
        self.work = scratch.array("work", (chunk + 1, n_quantiles, horizon))
        self.product = scratch.array("product", (chunk, n_quantiles, horizon))
        self._gathered = scratch.array("gathered", (chunk * n_quantiles * horizon,))
        self._level_block = n_quantiles, horizon
        n_intervals = levels.lower.size
        self.single = scratch.array("single", (chunk, 1, horizon))
        self.hits_one = scratch.array("hits_one", (chunk, 1, horizon), bool)
        self.hits = scratch.array("hits", (chunk, n_intervals, horizon), bool)
        self.above = scratch.array("above", (chunk, n_intervals, horizon), bool)

    def gathered(self, count: int) -> F64:
        """A C-ordered ``[Q, count, H]`` buffer for a chunk of a :class:`CellForecast`."""
        n_quantiles, horizon = self._level_block
        return self._gathered[: n_quantiles * count * horizon].reshape(n_quantiles, count, horizon)

    def start(self) -> None:
        """Ready for a batch: no lead sums carried yet."""
        self.work[0] = 0.0

    @property
    def lead_sums(self) -> F64:
        return self.work[0]

    def carry_lead_sums(self, rows: int) -> None:
        self.work[0] = np.sum(self.work[: rows + 1], axis=0)

    def losses(
        self, actual: F64, forecast: npt.NDArray[Any], mask: npt.NDArray[np.bool_] | None, out: _Sums, rows: slice
    ) -> F64:
        """rho ``[c, Q, H]`` of a chunk (in ``work``); its hits and point errors into ``out``."""
        count = actual.shape[0]
        error, product = self.work[1 : count + 1], self.product[:count]
        np.subtract(actual[:, None, :], forecast, out=error)
        if mask is not None:
            np.copyto(error, 0.0, where=mask[:, None, :])
        if self.levels.lower.size:
            hits, above = self.hits[:count], self.above[:count]
            np.greater_equal(_levels_of(error, self.levels.lower, self.lower_ends), 0.0, out=hits)
            np.less_equal(_levels_of(error, self.levels.upper, self.upper_ends), 0.0, out=above)
            hits &= above
            if mask is not None:
                hits &= ~mask[:, None, :]
            out.add_hits(hits, rows)
        if self.levels.median is not None:
            np.abs(error[:, self.levels.median, :], out=out.point[rows])
        # rho = q u - min(u, 0), computed as max(q u, q u - u): for u < 0 both are fl(q u - u) (that is the larger),
        # for u >= 0 both are fl(q u) (q u - u is not larger). The same bits, in three passes over whole arrays
        # (numpy's minimum against a scalar 0 alone cost as much as two of them, measured).
        np.multiply(error, self.levels_by_lead, out=product)
        np.subtract(product, error, out=error)
        np.maximum(error, product, out=error)
        return error

    def point_losses(
        self, actual: F64, point: npt.NDArray[Any], mask: npt.NDArray[np.bool_] | None, out: _Sums, rows: slice
    ) -> F64:
        """:meth:`losses` of a forecast whose every level is ``point[c, 1, H]``: one error per pair."""
        count = actual.shape[0]
        error, single, spent = self.work[1 : count + 1], self.single[:count], self.product[:count, :1, :]
        np.subtract(actual[:, None, :], point, out=single)
        if mask is not None:
            np.copyto(single, 0.0, where=mask[:, None, :])
        if self.levels.lower.size:
            hits = self.hits_one[:count]
            np.equal(single, 0.0, out=hits)  # inside every interval [f, f] exactly when y - f is 0
            if mask is not None:
                hits &= ~mask[:, None, :]
            out.add_hits(hits, rows)  # the same count for every interval
        if self.levels.median is not None:
            np.abs(single[:, 0, :], out=out.point[rows])
        np.minimum(single, 0.0, out=spent)
        np.multiply(single, self.levels_column, out=error)
        np.subtract(error, spent, out=error)
        return error


def _as_slice(index: npt.NDArray[np.intp]) -> slice | None:
    """``index`` as a slice when its entries step by one (up or down): a view instead of a copy."""
    if index.size == 0:
        return None
    if index.size == 1:
        return slice(int(index[0]), int(index[0]) + 1)
    step = int(index[1] - index[0])
    if step not in (1, -1) or not (np.diff(index) == step).all():
        return None
    end = int(index[-1]) + step
    return slice(int(index[0]), None if end < 0 else end, step)


def _levels_of(error: F64, index: npt.NDArray[np.intp], ends: slice | None) -> F64:
    return error[:, ends, :] if ends is not None else np.take(error, index, axis=1)
