"""Which windows the report draws as forecast fans, chosen without the driver reading forecasts back.

The report shows a few series (:func:`fan_series`: spread over the series list, fixed before the run) and, for
each, informative origins: the best and the worst window by window MASE, a typical one, and the latest. The
actor that runs a part keeps, for those series only, its best, worst and latest window and one typical window
per model batch (:class:`FanCollector`), with their forecasts: a few kilobytes per part, written into the
part's sums. The driver merges them (:class:`FanPicker`): best, worst and latest are exact over the run; the
typical window is the candidate whose MASE is closest to the series' MASE. Windows are ranked by MASE when the
median is requested, else by their scaled quantile loss (SQL); the label says which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.conventions import window_scores

#: How many series the report draws fans for.
FAN_SERIES = 4
LABELS = ("best", "typical", "worst", "latest")
#: Typical-window candidates kept per series between parts (thinned evenly over their score ranks).
MAX_TYPICAL = 64


@dataclass(frozen=True)
class FanWindow:
    """One window drawn as a forecast fan in the report."""

    series_id: str
    label: str  # why it was picked: "best MASE", "typical", "worst MASE", "latest"
    origin_us: int  # first forecast timestamp, UTC microseconds
    step_us: int  # grid step
    history: np.ndarray  # float64 [C]: the C steps before the origin, oldest first, NaN = missing
    actual: np.ndarray  # float64 [H]: NaN = unknown
    quantiles: dict[float, np.ndarray]  # requested level -> float [H]
    mase: float | None  # the window's score (MASE, or SQL without a median: ``scored_by``)
    #: The metric that scored the windows when they were picked: the registry's primary of the run's levels.
    scored_by: str
    #: The other models of the run on the same window: name -> median (or middle quantile) [H].
    others: dict[str, np.ndarray] = field(default_factory=dict)


def fan_series(n_series: int, count: int = FAN_SERIES) -> tuple[int, ...]:
    """Series indices spread evenly over the series list (first and last included)."""
    if n_series <= 0:
        return ()
    return tuple(sorted({round(float(i)) for i in np.linspace(0, n_series - 1, min(count, n_series))}))


@dataclass
class FanCandidates:
    """Candidate windows as parallel arrays (``label`` is one of :data:`LABELS`)."""

    series_index: npt.NDArray[np.int64]
    label: npt.NDArray[np.str_]
    origin_us: npt.NDArray[np.int64]
    score: npt.NDArray[np.float64]
    actual: npt.NDArray[np.float64]  # [K, H]
    forecast: npt.NDArray[np.float32]  # [K, H, Q]
    others: npt.NDArray[np.float32]  # [K, M, H]: the run's other models' medians on the same windows

    @classmethod
    def empty(cls, horizon: int, n_quantiles: int, n_others: int = 0) -> FanCandidates:
        return cls(
            np.empty(0, np.int64),
            np.empty(0, np.str_),
            np.empty(0, np.int64),
            np.empty(0),
            np.empty((0, horizon)),
            np.empty((0, horizon, n_quantiles), np.float32),
            np.empty((0, n_others, horizon), np.float32),
        )

    def __len__(self) -> int:
        return int(self.series_index.shape[0])

    def state(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        return {f"{prefix}{name}": getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str) -> FanCandidates:
        return cls(**{name: np.asarray(arrays[f"{prefix}{name}"]) for name in cls.__dataclass_fields__})

    def take(self, rows: Sequence[int], label: str | None = None) -> FanCandidates:
        index = np.asarray(rows, dtype=np.intp)
        labels = self.label[index] if label is None else np.full(index.size, label)
        return FanCandidates(
            self.series_index[index],
            labels.astype(np.str_),
            self.origin_us[index],
            self.score[index],
            self.actual[index],
            self.forecast[index],
            self.others[index],
        )

    @staticmethod
    def concat(parts: Sequence[FanCandidates], horizon: int, n_quantiles: int) -> FanCandidates:
        parts = [part for part in parts if len(part)]
        if not parts:
            return FanCandidates.empty(horizon, n_quantiles)
        return FanCandidates(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in FanCandidates.__dataclass_fields__)
        )


@dataclass
class FanCollector:
    """The actor's side: candidates of the fan series over one part's batches."""

    fan_series: frozenset[int]
    quantiles: tuple[float, ...]
    horizon: int
    _kept: list[FanCandidates] = field(default_factory=list)

    def observe(
        self,
        series_index: np.ndarray,
        origin_us: np.ndarray,
        actual: np.ndarray,
        forecast: np.ndarray,
        scale: np.ndarray,
        others: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        """One model batch: keep best, worst, latest and the median window of each fan series in it.

        ``others`` are the other models' medians ``[W, M, H]``, or a function giving them for some rows: only the
        few windows kept are copied (the batch's forecasts were copied whole before, for four windows a series).
        """
        if not self.touches(series_index):
            return
        rows = np.flatnonzero(np.isin(series_index, list(self.fan_series)))
        if rows.size == series_index.shape[0]:  # every window (one fan series in the batch): no copies
            scores = window_scores(actual, forecast, scale, self.quantiles)
        else:
            scores = window_scores(actual[rows], forecast[rows], scale[rows], self.quantiles)
        picked: list[int] = []
        labels: list[str] = []
        mine_series = series_index[rows]
        for series in _distinct(mine_series):
            mine = np.flatnonzero(mine_series == series)
            for position, label in _extremes(origin_us[rows], scores, mine):
                picked.append(position)
                labels.append(label)
        keep = rows[np.asarray(picked, dtype=np.intp)]
        if others is None:
            kept_others = np.empty((keep.size, 0, self.horizon))
        else:
            kept_others = others(keep) if callable(others) else others[keep]
        self._kept.append(
            FanCandidates(
                series_index[keep].astype(np.int64),
                np.asarray(labels, dtype="<U8"),
                origin_us[keep].astype(np.int64),
                scores[np.asarray(picked, dtype=np.intp)],
                actual[keep].astype(np.float64),
                forecast[keep].astype(np.float32),
                np.asarray(kept_others).astype(np.float32),
            )
        )

    def touches(self, series_index: np.ndarray) -> bool:
        """Whether a batch holds a window of a fan series (most batches hold none: checked before any work)."""
        if series_index.size == 0 or not self.fan_series:
            return False
        return bool(np.isin(series_index, list(self.fan_series)).any())

    def candidates(self) -> FanCandidates:
        """The part's candidates: per fan series, the best/worst/latest over the part and one typical per batch."""
        pooled = FanCandidates.concat(self._kept, self.horizon, len(self.quantiles))
        return reduce_candidates(pooled, keep_typical=True)


def _extremes(origin_us: np.ndarray, score: np.ndarray, rows: np.ndarray) -> list[tuple[int, str]]:
    """Positions among ``rows`` of the latest window, then (when any is scored) the best, worst and typical."""
    picked = [(int(rows[np.argmax(origin_us[rows])]), "latest")]
    scored = rows[np.isfinite(score[rows])]
    if scored.size:
        order = scored[np.argsort(score[scored], kind="stable")]
        picked += [(int(order[0]), "best"), (int(order[-1]), "worst"), (int(order[(order.size - 1) // 2]), "typical")]
    return picked


def reduce_candidates(pooled: FanCandidates, keep_typical: bool) -> FanCandidates:
    """Per series: the best, the worst and the latest of ``pooled``; every typical one if ``keep_typical``."""
    kept: list[FanCandidates] = []
    for series in _distinct(pooled.series_index):
        mine = pooled.series_index == series
        for label, pick in (("best", np.argmin), ("worst", np.argmax), ("latest", None)):
            rows = np.flatnonzero(mine & (pooled.label == label))
            if rows.size:
                values = pooled.origin_us[rows] if pick is None else pooled.score[rows]
                chosen = rows[np.argmax(values)] if pick is None else rows[pick(values)]
                kept.append(pooled.take([int(chosen)]))
        if keep_typical:
            typical = np.flatnonzero(mine & (pooled.label == "typical"))
            if typical.size > MAX_TYPICAL:  # thin evenly over the score ranks: memory stays bounded per series
                ranked = typical[np.argsort(pooled.score[typical], kind="stable")]
                typical = ranked[np.linspace(0, ranked.size - 1, MAX_TYPICAL).round().astype(np.intp)]
            kept.append(pooled.take(typical.tolist()))
    horizon, n_quantiles = pooled.forecast.shape[1:]
    return FanCandidates.concat(kept, horizon, n_quantiles)


class FanPicker:
    """The driver's side: merges the candidates of every part and picks the windows to draw."""

    def __init__(self, horizon: int, quantiles: Sequence[float]) -> None:
        self._horizon = horizon
        self._quantiles = tuple(quantiles)
        self._pool = FanCandidates.empty(horizon, len(self._quantiles))

    def add(self, candidates: FanCandidates) -> None:
        pooled = FanCandidates.concat([self._pool, candidates], self._horizon, len(self._quantiles))
        self._pool = reduce_candidates(pooled, keep_typical=True)

    def series_indices(self) -> np.ndarray:
        """The series (plan indices) of every candidate: the only ones :meth:`pick` asks a score of."""
        return _distinct(self._pool.series_index)

    def pick(self, series_scores: Mapping[int, float]) -> FanCandidates:
        """Best, typical (closest to the series' score), worst and latest of every fan series, deduplicated."""
        chosen: list[FanCandidates] = []
        final = reduce_candidates(self._pool, keep_typical=False)
        for series in _distinct(self._pool.series_index):
            mine = final.series_index == series
            typical = np.flatnonzero((self._pool.series_index == series) & (self._pool.label == "typical"))
            target = series_scores.get(int(series))
            if typical.size and target is not None and np.isfinite(target):
                closest = typical[np.argmin(np.abs(self._pool.score[typical] - target))]
                chosen.append(self._pool.take([int(closest)]))
            for label in ("best", "worst", "latest"):
                rows = np.flatnonzero(mine & (final.label == label))
                chosen.append(final.take(rows.tolist()))
        merged = FanCandidates.concat(chosen, self._horizon, len(self._quantiles))
        order = sorted(range(len(merged)), key=lambda i: (merged.series_index[i], LABELS.index(str(merged.label[i]))))
        seen: set[tuple[int, int]] = set()
        unique = []
        for i in order:
            window = (int(merged.series_index[i]), int(merged.origin_us[i]))
            if window not in seen:
                seen.add(window)
                unique.append(i)
        return merged.take(unique)


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: asked for indices, numpy skips its masked-array check, whose first use imports
    ``numpy.ma`` (paid in an actor's first part)."""
    return np.unique(values, return_index=True)[0]
