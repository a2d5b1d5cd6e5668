"""A window's covariate rows as Chronos-2's pipeline would build them from the window's own data.

Two things happen per window at packing time, both from the window alone (its context and the covariates'
values), so a forecast never depends on data after its cutoff or on which windows share a batch:

- **Past-only covariates** (``--past-covariates``) lose their future: it is set to NaN, "unknown", so the
  model sees the values up to the cutoff only (upstream: columns of ``df`` absent from ``future_df``).
- **Categorical covariates** (text, bool or dictionary columns, as codes from :mod:`.categories`) are
  target-encoded as upstream's ``preprocess._target_encode`` does with one target: per category, the smoothed
  mean ``(item_mean + sum) / (1 + count)`` of the target over the rows of that category, NaN targets left out,
  the null value its own category, a category unseen in the context the item mean. Upstream computes it per
  item over the ``df`` it is given; in a backtest the given ``df`` of a window is its context, so here the
  statistics come from the window's context steps only (no look-ahead) and the window's future values of a
  known-future categorical column are mapped through the same table. A step with no row (NaN code: before the
  series starts, or a timestamp absent from the data) has no category and stays missing. The arithmetic is
  upstream's (``np.bincount`` in float64 over float32 targets, cast to float32), so the values are equal.

The model's rows follow upstream's order: past-only covariates first, then known-future ones (the settings
list them in that order, :class:`CovariateRoles`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CovariateRoles:
    """What each covariate row of a run is: the first ``past_only`` are past-only; ``categorical`` per row."""

    past_only: int = 0
    categorical: tuple[bool, ...] = ()

    @property
    def changes_values(self) -> bool:
        return self.past_only > 0 or any(self.categorical)


def prepare_covariates(
    context: np.ndarray, covariates: np.ndarray, context_length: int, roles: CovariateRoles
) -> np.ndarray:
    """``covariates`` ``[W, K, C + H]`` (float64, codes for categorical rows) -> the model's values (float64).

    ``context`` ``[W, C]`` is each window's target history (NaN = missing), the same steps as the covariates'
    first ``C`` columns.
    """
    out = np.array(covariates, dtype=np.float64, copy=True)
    target = np.asarray(context, dtype=np.float32)
    for row, categorical in enumerate(roles.categorical):
        if categorical:
            out[:, row] = target_encode(target, covariates[:, row], context_length)
    out[:, : roles.past_only, context_length:] = np.nan
    return out


def target_encode(target: np.ndarray, codes: np.ndarray, context_length: int) -> np.ndarray:
    """One categorical row of every window, target-encoded from that window's context: ``[W, C + H]``.

    ``target`` ``[W, C]`` float32; ``codes`` ``[W, C + H]`` (NaN = no row). Upstream's formula with
    ``smooth = 1`` over each window's context steps that have a row.
    """
    n_windows = codes.shape[0]
    has_row = ~np.isnan(codes)
    window_of = np.broadcast_to(np.arange(n_windows)[:, None], codes.shape)
    # Dense (window, category) slots over every step with a row, past and future (a future-only category gets a
    # slot with no target: its value is the item mean, as upstream's unseen sentinel).
    pairs = np.stack([window_of[has_row], codes[has_row]], axis=1)
    _, slot = np.unique(pairs, axis=0, return_inverse=True)
    slot = slot.ravel()
    slots = np.full(codes.shape, -1, dtype=np.int64)
    slots[has_row] = slot
    n_slots = int(slot.max()) + 1 if slot.size else 0
    slot_window = np.zeros(n_slots, dtype=np.int64)
    slot_window[slot] = window_of[has_row]

    past_rows = has_row[:, :context_length]
    mask = np.isfinite(target) & past_rows
    target_masked = np.where(mask, target, np.float32(0.0))
    weights = (target_masked * mask)[past_rows]  # float32, window-major, steps ascending: upstream's row order
    counts_of = mask.astype(float)[past_rows]
    window_rows = window_of[:, :context_length][past_rows]
    item_sums = np.bincount(window_rows, weights=weights, minlength=n_windows)
    item_counts = np.bincount(window_rows, weights=counts_of, minlength=n_windows)
    item_means = np.divide(item_sums, item_counts, out=np.zeros(n_windows), where=item_counts > 0)
    past_slots = slots[:, :context_length][past_rows]
    sums = np.bincount(past_slots, weights=weights, minlength=n_slots)
    counts = np.bincount(past_slots, weights=counts_of, minlength=n_slots)
    lookup = ((1.0 * item_means[slot_window] + sums) / (1.0 + counts)).astype(np.float32)
    encoded = np.full(codes.shape, np.nan)
    encoded[has_row] = lookup[slots[has_row]]
    return encoded
