"""What every model scored on one batch shares: the batch's pairs, its series codes, the finite forecasts.

Built once a batch and handed to each model's :class:`~.metrics.MetricsAccumulator` (``add``): the pairs, the
actuals there and the windows' scales are the same for every model of the run (:mod:`.pairs`), so they are not
recomputed per model. ``_group_sum`` is the one reduction by series the accumulator uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.losses import CellForecast, Scratch

__all__ = ["BatchPairs", "SeriesCodes", "finite_pairs"]

F64 = npt.NDArray[np.float64]


def _group_sum(codes: npt.NDArray[np.intp], values: npt.NDArray[Any], n_groups: int) -> F64:
    """Sum ``values[W, F]`` by ``codes[W]`` into ``[n_groups, F]``, per group window after window from 0: one
    ``bincount``, no loop (a batch of one series too: its one reduction gained nothing beyond noise, measured in
    benchmarks/results/scoring.md)."""
    width = values.shape[1]
    index = (codes[:, None] * width + np.arange(width)).ravel()
    sums = np.bincount(index, weights=values.ravel().astype(np.float64), minlength=n_groups * width)
    return np.asarray(sums, dtype=np.float64).reshape(n_groups, width)


def finite_pairs(forecast: npt.NDArray[Any] | CellForecast) -> npt.NDArray[np.bool_]:
    """``[W, H]``: every quantile of the pair's forecast finite (a point for every level: the point finite)."""
    if isinstance(forecast, CellForecast):
        return forecast.finite()
    if forecast.ndim == 3 and forecast.shape[2] > 1 and forecast.strides[2] == 0:  # one point for every level
        return np.asarray(np.isfinite(forecast[..., 0]))
    finite = np.isfinite(forecast)
    if finite.all():
        return np.ones(forecast.shape[:2], dtype=bool)
    return np.asarray(finite.all(axis=2))


class SeriesCodes(NamedTuple):
    """A batch's series ids as its distinct ids and each window's position among them (computed once a batch)."""

    distinct: list[str]
    local: npt.NDArray[np.intp]
    size: int

    @classmethod
    def of(cls, series_ids: Sequence[str] | npt.NDArray[Any]) -> SeriesCodes:
        ids = np.asarray(series_ids, dtype=object).ravel().astype(np.str_)
        distinct, local = np.unique(ids, return_inverse=True)
        return cls([str(sid) for sid in distinct], local.ravel().astype(np.intp), int(ids.size))

    @classmethod
    def of_indices(cls, series_index: npt.NDArray[np.integer[Any]], series_ids: Sequence[str]) -> SeriesCodes:
        """:meth:`of` the ids ``series_ids[series_index]``: each distinct series' id looked up once, none decoded per
        window (a batch's windows are a few series). The same codes: distinct ids in sorted order."""
        index = np.asarray(series_index).ravel()
        numbers, local = np.unique(index, return_inverse=True)
        ids = [str(series_ids[int(number)]) for number in numbers]
        order = sorted(range(len(ids)), key=ids.__getitem__)
        rank = np.empty(len(ids), dtype=np.intp)
        rank[order] = np.arange(len(ids), dtype=np.intp)
        return cls([ids[i] for i in order], rank[local.ravel()], int(index.size))


@dataclass(frozen=True)
class BatchPairs:
    """What every model scored on one batch shares: the pairs, the actuals there, the windows' scales.

    Built once a batch (:meth:`of`), not once per model: with three or more models a batch these sums were a
    good part of the scoring (benchmarks/results/scoring.md).
    """

    codes: SeriesCodes
    actual: F64  # [W, H]: zero on the pairs not scored, so they add nothing to any sum
    valid: npt.NDArray[np.bool_]  # [W, H]
    all_valid: bool
    n_valid: npt.NDArray[np.int64]  # [W]
    scaled: npt.NDArray[np.bool_]  # [W]: a usable scale (finite, positive)
    all_scaled: bool
    scale: F64  # [W]: the scale where usable, else 1
    use_window: npt.NDArray[np.bool_]  # [W]: a usable scale and at least one pair (the windows of mase, sql)
    denominator: F64  # [W]: pairs x scale of those windows, 1 elsewhere
    lead_scaled: npt.NDArray[np.bool_]  # [W, H]: pairs of windows with a usable scale
    abs_y: F64  # [W, H]
    abs_y_by_window: F64  # [W]
    by_lead: dict[str, F64]  # [H]: pairs, abs_y, and scaled pairs (the ``scaled`` and ``scaled_pairs`` of a lead)
    scratch: Scratch  # the losses' work buffers, shared by the batch's models

    @classmethod
    def of(
        cls,
        codes: SeriesCodes,
        actual: F64,
        scale: F64,
        valid: npt.NDArray[np.bool_] | None,
        finite: Any = None,
        scratch: Scratch | None = None,
    ) -> BatchPairs:
        """``valid`` given: the pairs scored (the caller guarantees them); None: observed and ``finite`` there.

        ``scratch``: work buffers to reuse (a part's batches share them: fresh megabytes every batch cost page
        faults and cold caches, measured); new ones by default.
        """
        n_win, horizon = actual.shape
        if valid is None:
            valid = np.isfinite(actual) & (np.ones_like(actual, dtype=bool) if finite is None else finite)
        else:  # the caller's pairs (pairs.common_pairs): observed, every forecast finite; not checked again
            valid = np.asarray(valid, dtype=bool).reshape(n_win, horizon)
        all_valid = bool(valid.all())
        y0 = actual if all_valid else np.where(valid, actual, 0.0)  # invalid pairs: 0 - 0 adds nothing
        scaled = np.isfinite(scale) & (scale > 0.0)
        s_safe = np.where(scaled, scale, 1.0)
        n_valid = valid.sum(axis=1)
        use_window = scaled & (n_valid > 0)
        lead_scaled = valid & scaled[:, None]
        abs_y = np.abs(y0)
        return cls(
            codes=codes,
            actual=y0,
            valid=valid,
            all_valid=all_valid,
            n_valid=n_valid,
            scaled=scaled,
            all_scaled=bool(scaled.all()),
            scale=s_safe,
            use_window=use_window,
            denominator=np.where(use_window, n_valid, 1) * s_safe,
            lead_scaled=lead_scaled,
            abs_y=abs_y,
            abs_y_by_window=abs_y.sum(axis=1),
            by_lead={"pairs": valid.sum(axis=0), "abs_y": abs_y.sum(axis=0), "scaled": lead_scaled.sum(axis=0)},
            scratch=scratch if scratch is not None else Scratch(),
        )
