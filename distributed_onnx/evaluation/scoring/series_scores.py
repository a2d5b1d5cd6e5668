"""Each model's per-series metrics straight from a run's merged sums, one metric at a time, no long table.

The report needs a few per-series metrics (those :func:`.registry.per_checkpoint` names and coverage, of one
checkpoint and of seasonal naive) and the fan picker a score for a handful of series. Built from the long
``metrics`` table, their index held the table (a few rows per series, model, metric and quantile) plus its encoded
columns: most of the driver's peak at 100,000 series (benchmarks/results/time_to_results.md). Here each metric is
computed from the sums with the table's own arithmetic (:func:`.metrics_table.unit_column`), a bounded block of
series at a time, so the values are those of ``metrics.parquet`` and nothing larger than one array per metric is
held.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.metrics import SERIES_PER_TABLE, MetricsAccumulator
from distributed_onnx.evaluation.scoring.metrics_table import SortedSeries
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.registry import series_listing

__all__ = ["SeriesScores"]

F64 = npt.NDArray[np.float64]


class SeriesScores:
    """Per-series values of every model of a :class:`~.pairs.PairScores`, aligned with :attr:`series_ids`.

    :attr:`series_ids` lists the series that have a row of :func:`.registry.series_listing` (a scored pair) in the
    order they first appear among the table's rows of it: model after model, each model's series sorted by id.
    """

    def __init__(self, scores: PairScores) -> None:
        self._scores = scores
        self._sorted: dict[str, SortedSeries] = {}
        self._listing = series_listing().name
        listed: list[str] = []
        seen: set[str] = set()
        for model in scores.models:
            ids = self._order(model).ids
            _, _, kept = self._column(model, self._listing, None)
            for position in np.flatnonzero(kept).tolist():
                series_id = ids[position]
                if series_id not in seen:
                    seen.add(series_id)
                    listed.append(series_id)
        self.series_ids: list[str] = listed
        self._aligned: dict[str, npt.NDArray[np.intp]] = {}

    def values(self, model: str, metric: str, quantile: float | None = None) -> F64:
        """Every listed series' value (NaN where it has no row of that metric)."""
        if model not in self._scores.pooled:
            return np.full(len(self.series_ids), np.nan)
        value, _, kept = self._column(model, metric, quantile)
        return self._align(model, np.where(kept, value, np.nan), np.nan)

    def counts(self, model: str) -> npt.NDArray[np.int64]:
        """Every listed series' scored pairs (the ``n`` of its :func:`.registry.series_listing` row; -1 where it has
        none)."""
        if model not in self._scores.pooled:
            return np.full(len(self.series_ids), -1, dtype=np.int64)
        _, count, kept = self._column(model, self._listing, None)
        return self._align(model, np.where(kept, count, -1), -1).astype(np.int64)

    def values_of(self, model: str, metric: str, series_ids: Sequence[str]) -> dict[str, float]:
        """The values of a few series (those that have a row of that metric): the fan picker's scores."""
        accumulator = self._scores.pooled.get(model)
        if accumulator is None:
            return {}
        rows_of = accumulator.series_rows()
        wanted = [sid for sid in series_ids if sid in rows_of]
        rows = np.asarray([rows_of[sid] for sid in wanted], dtype=np.intp)
        value, _, kept = accumulator.series_column(metric, None, rows)
        return {sid: float(v) for sid, v, k in zip(wanted, value.tolist(), kept.tolist(), strict=True) if k}

    def _order(self, model: str) -> SortedSeries:
        if model not in self._sorted:
            self._sorted[model] = self._accumulator(model).sorted_series()
        return self._sorted[model]

    def _accumulator(self, model: str) -> MetricsAccumulator:
        return self._scores.pooled[model]

    def _column(
        self, model: str, metric: str, quantile: float | None
    ) -> tuple[F64, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The metric over the model's series in id order, computed :data:`SERIES_PER_TABLE` series at a time."""
        rows, accumulator = self._order(model).rows, self._accumulator(model)
        blocks = [
            accumulator.series_column(metric, quantile, rows[start : start + SERIES_PER_TABLE])
            for start in range(0, rows.size, SERIES_PER_TABLE)
        ]
        if not blocks:
            return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=bool)
        value, count, kept = (np.concatenate(parts) for parts in zip(*blocks, strict=True))
        return value, count, kept

    def _align(self, model: str, by_id: npt.NDArray[np.generic], missing: float) -> F64:
        """Values over the model's series in id order -> over :attr:`series_ids` (``missing`` where absent)."""
        ids = self._order(model).ids
        if ids == self.series_ids:  # the usual case: every model scored the same series
            return np.asarray(by_id, dtype=np.float64)
        if model not in self._aligned:
            position = {sid: i for i, sid in enumerate(ids)}
            self._aligned[model] = np.asarray([position.get(sid, -1) for sid in self.series_ids], dtype=np.intp)
        where = self._aligned[model]
        out = np.full(len(self.series_ids), missing, dtype=np.float64)
        out[where >= 0] = by_id[where[where >= 0]]
        return out
