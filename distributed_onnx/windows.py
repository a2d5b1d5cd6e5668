"""Backtest window planning: pure, deterministic and streaming.

A window's *origin* is its first forecast step; ``cutoff = origin - resolution`` is its last context step
(Nixtla's convention). Its context is the ``context_length`` steps before the origin, its target the
``horizon`` steps from the origin. Windows are addressed by (series index, origin index into that series'
dense grid); :func:`plan_batches` yields them in fixed-size groups without ever holding the whole plan, so
driver memory does not grow with the number of windows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from distributed_onnx.table import Series, SeriesTable


class WindowSpec(BaseModel):
    """Which windows a backtest runs (see the ``backtest`` command for the meaning of each field)."""

    model_config = ConfigDict(frozen=True)

    context_length: int = Field(gt=0, description="Context steps fed to the model.")
    horizon: int = Field(gt=0, description="Forecast steps per window.")
    n_windows: int | None = Field(default=None, gt=0, description="Windows per series, Nixtla style.")
    stride: int = Field(default=1, gt=0, description="Steps between consecutive origins.")
    start_us: int | None = Field(default=None, description="First origin (UTC microseconds), with end_us.")
    end_us: int | None = Field(default=None, description="Last origin (UTC microseconds), with start_us.")
    min_context_coverage: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Skip windows whose context has a smaller observed share."
    )

    @model_validator(mode="after")
    def _one_mode(self) -> WindowSpec:
        by_count = self.n_windows is not None
        by_range = self.start_us is not None or self.end_us is not None
        if by_count == by_range:
            msg = "give either n_windows (counted back from each series' end) or both start and end"
            raise ValueError(msg)
        if by_range and (self.start_us is None or self.end_us is None or self.end_us < self.start_us):
            msg = "start and end must both be given, with start <= end"
            raise ValueError(msg)
        return self


@dataclass(frozen=True)
class PlannedBatch:
    """Windows of one dispatched batch: parallel arrays of series index and origin index."""

    index: int
    series_index: np.ndarray  # int64 [W]
    origin_index: np.ndarray  # int64 [W]

    @property
    def n_windows(self) -> int:
        return int(self.origin_index.shape[0])


@dataclass
class PlanCounts:
    """Running counts of the plan, filled in while it streams."""

    planned: int = 0
    skipped: int = 0


def series_origins(series: Series, spec: WindowSpec) -> np.ndarray:
    """Origin indices of one series (ascending), before the context-coverage filter."""
    n = series.n_points
    if spec.n_windows is not None:
        last = n - spec.horizon
        origins = last - spec.stride * np.arange(spec.n_windows - 1, -1, -1, dtype=np.int64)
    elif spec.start_us is not None and spec.end_us is not None:  # WindowSpec guarantees one of the two modes
        first = -(-(spec.start_us - series.start_us) // series.step_us)  # ceil: first grid step >= start
        last = (spec.end_us - series.start_us) // series.step_us
        origins = np.arange(first, last + 1, spec.stride, dtype=np.int64)
    else:
        origins = np.empty(0, dtype=np.int64)
    # An origin needs at least one step of history and may sit at most one step past the data.
    return origins[(origins >= 1) & (origins <= n)]


def context_coverage(series: Series, origins: np.ndarray, context_length: int) -> np.ndarray:
    """Observed share of each window's context (steps before the series start count as missing)."""
    observed = np.concatenate([[0], np.cumsum(np.isfinite(series.values))])
    lo = np.maximum(origins - context_length, 0)
    return (observed[origins] - observed[lo]) / context_length


def plan_batches(
    table: SeriesTable, spec: WindowSpec, rows_per_batch: int, counts: PlanCounts | None = None
) -> Iterator[PlannedBatch]:
    """Stream the plan as batches of ``rows_per_batch`` windows, series after series, origins ascending.

    Windows with no observed context, or less than ``min_context_coverage``, are skipped and counted.
    The order (and so every batch's content and index) is a pure function of the inputs: a rerun plans the
    same batches, which is what lets a rerun skip the batches already written.
    """
    counts = counts if counts is not None else PlanCounts()
    pending_series: list[np.ndarray] = []
    pending_origins: list[np.ndarray] = []
    pending = 0
    batch_index = 0
    for series_index, series in enumerate(table.series):
        origins = series_origins(series, spec)
        coverage = context_coverage(series, origins, spec.context_length)
        keep = (coverage > 0) & (coverage >= spec.min_context_coverage)
        counts.skipped += int((~keep).sum())
        origins = origins[keep]
        counts.planned += int(origins.shape[0])
        while origins.size:
            take = min(rows_per_batch - pending, origins.size)
            pending_series.append(np.full(take, series_index, dtype=np.int64))
            pending_origins.append(origins[:take])
            origins = origins[take:]
            pending += take
            if pending == rows_per_batch:
                yield PlannedBatch(batch_index, np.concatenate(pending_series), np.concatenate(pending_origins))
                batch_index += 1
                pending_series, pending_origins, pending = [], [], 0
    if pending:
        yield PlannedBatch(batch_index, np.concatenate(pending_series), np.concatenate(pending_origins))


def window_ids(series_ids: np.ndarray, origins_us: np.ndarray, run_fingerprint: str) -> list[str]:
    """Stable window ids: a digest of (series id, origin, run configuration)."""
    return [
        hashlib.blake2b(f"{sid}|{origin}|{run_fingerprint}".encode(), digest_size=8).hexdigest()
        for sid, origin in zip(series_ids.tolist(), origins_us.tolist(), strict=True)
    ]
