"""How sure a run's scores are: its intervals' resampling, identical forecasts, and the verdict; the reports
(backtest and live) draw it as it is.

Which resampling gives the intervals, and the circular block bootstrap over window origins used below
:data:`.resampling.MIN_SERIES` series, are defined once in :mod:`.resampling`; ``leaderboard.parquet`` holds the
same intervals (its ``resampling`` column). This module adds what only the pages show: the resampling in words,
the margin of the best model by the primary metric (:func:`.registry.primary`) over the next with its interval
(the verdict), models that made identical forecasts, and the per-origin scores (the fev convention's per-window
scores) plotted by forecast origin.

Two models whose sums agree at every origin, for every quantile, made identical forecasts on the scored pairs:
the report names them so, instead of a win rate of 0.5 and an undefined test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.leaderboard import clipped_skill_resamples, series_resamples
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES, PairScores
from distributed_onnx.evaluation.scoring.registry import primary, ranking
from distributed_onnx.evaluation.scoring.resampling import (
    MIN_SERIES,
    N_RESAMPLES,
    SEED,
    OriginSums,
    Resampling,
    origin_blocks,
    percentile_interval,
)

__all__ = ["Uncertainty", "uncertainty"]

F64 = npt.NDArray[np.float64]


@dataclass
class Uncertainty:
    """What the report shows about how sure it is (see the module docstring)."""

    resampling: Resampling
    n_series: int
    n_origins: int
    block: int
    #: The resampling in words, for the report's hints.
    label: str
    #: Where no interval could be formed, why (None when intervals exist).
    no_interval: str | None = None
    #: (model, metric) -> (low, high) of the pooled metric, from origin blocks (empty under series resampling).
    intervals: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    #: (model, metric) -> (low, high) of skill against seasonal naive, from origin blocks (one series only).
    skill_intervals: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    #: Groups of models (two or more) that made identical forecasts on the scored pairs.
    identical: list[list[str]] = field(default_factory=list)
    #: The metric that ranks the models (:func:`~..scoring.registry.primary`): the verdict's and :attr:`per_origin`'s.
    metric: str = ""
    #: Best model, runner-up, the metric, both values, the margin (runner-up minus best) and its interval.
    verdict: dict[str, Any] | None = None
    #: The window origins (microseconds since the epoch), in order: the x axis of :attr:`per_origin`.
    origins_us: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: model -> the per-origin score (fev convention) of the verdict's metric, in origin order.
    per_origin: dict[str, F64] = field(default_factory=dict)

    @property
    def label_short(self) -> str:
        return {"series": "over series", "origin_blocks": "blocks of window origins", "none": "none"}[self.resampling]

    def same_forecasts(self, a: str, b: str) -> bool:
        return any(a in group and b in group for group in self.identical)


def uncertainty(
    scores: PairScores, step_us: int, min_series: int = MIN_SERIES, n_resamples: int = N_RESAMPLES
) -> Uncertainty:
    """Which resampling the report's intervals use, and everything it computes from it (module docstring)."""
    models = list(scores.models)
    blocks = origin_blocks(scores, step_us, min_series, n_resamples)
    n_series, n_origins, block, origins = blocks.n_series, blocks.n_origins, blocks.block, blocks.origins
    metric = scores.primary
    result = Uncertainty(
        blocks.resampling,
        n_series,
        n_origins,
        block,
        f"95% percentile bootstrap over {n_series} series, {n_resamples} resamples, seed {SEED}",
        metric=metric,
    )
    result.identical = _identical(origins, models)
    result.origins_us = origins.origins_us
    result.per_origin = {model: scores.windows[model].per_window()[metric] for model in models}
    ones = np.ones((1, n_origins))
    points = {model: origins.metrics(model, ones, blocks.has_median) for model in models}
    if blocks.resampling == "origin_blocks":
        result.label = (
            f"95% circular moving-block bootstrap over the {n_origins} window origins ({n_series} series: too few to "
            f"resample), blocks of {block} consecutive origin{'s' if block > 1 else ''}, {n_resamples} resamples, "
            f"seed {SEED}"
        )
    elif blocks.resampling == "none":
        result.no_interval = (
            f"No interval can be formed: {n_series} series (too few to resample) and {n_origins} window "
            f"origin{'s' if n_origins != 1 else ''}, fewer than two blocks of {block} overlapping origins. "
            "More window origins or more series would give one."
        )
        result.label = "no interval"
    verdict = _verdict(models, metric, points, result)
    # The resamples each interval is taken of, drawn first; then every interval, by the one percentile rule.
    resampled = blocks.resampled
    margins = None  # the verdict's margin (runner-up minus best) in each resample; None: no interval
    if verdict is not None and "next" in verdict:
        best, runner = verdict["best"], verdict["next"]
        if blocks.resampling == "origin_blocks":
            margins = resampled[runner][metric] - resampled[best][metric]
        elif blocks.resampling == "series":  # the leaderboard's series resamples (fev's draws)
            by_series = series_resamples(scores, [best, runner], n_resamples)
            margins = by_series[runner][metric] - by_series[best][metric]
    skills: dict[tuple[str, str], F64] = {}
    if resampled and n_series == 1:  # one series: fev's skill is 1 - the clipped ratio of the series' metrics
        # The report's skill columns: each ranking metric against seasonal naive, the probabilistic one against
        # seasonal quantiles (report/compare.py's leaderboard).
        references = [(SEASONAL_NAIVE, metric.name, metric.name) for metric in ranking()]
        references.append((SEASONAL_QUANTILES, primary(has_median=False), "probabilistic"))
        for model in models:
            for reference, name, key in references:
                if name in resampled[model] and reference in resampled:
                    skills[(model, key)] = clipped_skill_resamples(resampled[model][name], resampled[reference][name])
    for model, by_metric in resampled.items():
        for name in by_metric:
            result.intervals[(model, name)] = blocks.interval(model, name)
    result.skill_intervals = {key: percentile_interval(draws) for key, draws in skills.items()}
    if verdict is not None and "next" in verdict:
        low, high = (math.nan, math.nan) if margins is None else percentile_interval(margins)
        verdict |= {"margin_low": low, "margin_high": high}
    result.verdict = verdict
    return result


def _identical(origins: OriginSums, models: Sequence[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for model in models:
        for group in groups:
            if np.array_equal(origins.sums[group[0]], origins.sums[model]):
                group.append(model)
                break
        else:
            groups.append([model])
    return [group for group in groups if len(group) > 1]


def _verdict(
    models: Sequence[str], metric: str, points: Mapping[str, Mapping[str, F64]], result: Uncertainty
) -> dict[str, Any] | None:
    """The best model by the pooled ``metric`` and its margin over the next distinct one (its interval is
    :func:`uncertainty`'s, from the resamples)."""
    values = {model: float(points[model][metric][0]) for model in models if np.isfinite(points[model][metric][0])}
    if len(values) < 2:
        return None
    ranked = sorted(values, key=values.__getitem__)
    best = ranked[0]
    runner = next((model for model in ranked[1:] if not result.same_forecasts(best, model)), None)
    tied = [model for model in ranked[1:] if result.same_forecasts(best, model)]
    verdict: dict[str, Any] = {"metric": metric, "best": best, "best_value": values[best], "tied": tied}
    if runner is None:
        return verdict
    verdict |= {"next": runner, "next_value": values[runner], "margin": values[runner] - values[best]}
    return verdict
