"""The losses of one batch of forecasts, reduced straight to the sums the metrics keep (vectorised, in cache).

Scoring a batch touches every (window, lead, quantile) of every model once: for the reference checkpoint a batch
of 256 windows x 96 leads x 21 quantiles is half a million losses, against one model call for the whole batch.
To cost a small fraction of that call (benchmarks/results/scoring.md), the losses are computed here

- in the model's own layout, ``[windows, quantiles, leads]`` (ONNX Runtime emits ``[W, Q, H]``; the forecast the
  accumulator sees is a ``[W, H, Q]`` view of it), so every reduction runs over long contiguous rows;
- a few windows at a time (:data:`CHUNK_WINDOWS`), into two buffers that stay in the core's cache, each
  element-wise step writing into them in place (no fresh multi-megabyte arrays per step);
- straight into the sums: per window over leads, per lead over windows, per (window, lead) over quantiles.

Exactness: every loss is the same IEEE operation on the same operands whatever the forecast's dtype or memory
layout (the error is always formed into the same fresh float64 buffer), and every sum has one fixed order: over
leads, numpy's pairwise sum of a contiguous row; over quantiles and over windows, left to right (the window order
carries on from chunk to chunk: the lead sums so far are the first row of the next chunk's reduction). So a
forecast read back from its Parquet part rescores bit for bit, and parts merge exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["CHUNK_WINDOWS", "BatchLosses", "Levels", "batch_losses"]

F64 = npt.NDArray[np.float64]
#: Windows scored at once: two ``[32, 21, 96]`` float64 buffers (1 MB) stay in a core's L2 cache, where the
#: element-wise passes run at several times the speed they reach over a whole batch (measured).
CHUNK_WINDOWS = 32


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


def batch_losses(
    actual: F64,
    forecast: npt.NDArray[np.floating[Any]],
    valid: npt.NDArray[np.bool_],
    all_valid: bool,
    levels: Levels,
) -> BatchLosses:
    """Losses of ``forecast[W, H, Q]`` (float32 or float64, any layout) against ``actual[W, H]`` on ``valid`` pairs.

    ``actual`` must already be zero on the pairs not scored; their errors are set to zero too (the ``0 - 0`` of
    masked operands), so they add nothing to any sum.
    ``rho_q(u) = q*u - min(u, 0)``; coverage is read from the signs of the errors (``y - f >= 0`` exactly when
    ``f <= y``), so the forecast is read once.
    """
    n_windows, horizon, n_quantiles = forecast.shape
    lower, upper, median = levels.lower, levels.upper, levels.median
    by_level = forecast.transpose(0, 2, 1)  # [W, Q, H]: a view, contiguous leads for a model's output
    chunk = max(1, min(CHUNK_WINDOWS, n_windows))
    # Row 0 of ``work`` carries the lead sums of the windows before the chunk: reducing rows 0..c over windows
    # adds window after window, exactly as one reduction over the whole batch would.
    work = np.zeros((chunk + 1, n_quantiles, horizon))
    negative = np.empty((chunk, n_quantiles, horizon))
    rho_by_window = np.empty((n_windows, n_quantiles))
    rho_by_pair = np.empty((n_windows, horizon))
    point = np.zeros((n_windows, horizon))
    hits_by_window = np.empty((n_windows, lower.size), dtype=np.int64)
    hits_by_lead = np.zeros((lower.size, horizon), dtype=np.int64)
    levels_column = levels.levels[:, None]
    for start in range(0, n_windows, chunk):
        stop = min(start + chunk, n_windows)
        rows = stop - start
        error = work[1 : rows + 1]
        np.subtract(actual[start:stop, None, :], by_level[start:stop], out=error)
        if not all_valid:
            np.copyto(error, 0.0, where=~valid[start:stop, None, :])
        if lower.size:
            hits = np.take(error, lower, axis=1) >= 0.0
            hits &= np.take(error, upper, axis=1) <= 0.0
            if not all_valid:
                hits &= valid[start:stop, None, :]
            hits_by_window[start:stop] = hits.sum(axis=2)
            hits_by_lead += hits.sum(axis=0)
        if median is not None:
            np.abs(error[:, median, :], out=point[start:stop])
        spent = negative[:rows]
        np.minimum(error, 0.0, out=spent)
        np.multiply(error, levels_column, out=error)
        np.subtract(error, spent, out=error)  # rho from here on
        np.sum(error, axis=2, out=rho_by_window[start:stop])
        np.sum(error, axis=1, out=rho_by_pair[start:stop])
        work[0] = np.sum(work[: rows + 1], axis=0)
    return BatchLosses(
        point=point,
        rho_by_window=rho_by_window,
        rho_by_lead=np.ascontiguousarray(work[0].T),
        rho_by_pair=rho_by_pair,
        hits_by_window=hits_by_window,
        hits_by_lead=np.ascontiguousarray(hits_by_lead.T),
    )
