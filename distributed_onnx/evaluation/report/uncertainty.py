"""How sure the report can be: which resampling gives its intervals, identical forecasts, and the verdict line.

``leaderboard.parquet``'s intervals resample *series* (fev's bootstrap, :mod:`~.scoring.leaderboard`). With one
series, every resample is that series: the interval has no width (the bundled data: ``[0.832, 0.832]``) and
says "certain" where nothing is known. With few series a bootstrap over them is barely better (five series
give few distinct resamples). So, below :data:`MIN_SERIES` series, the report's intervals come from a
**moving-block bootstrap over window origins** (Künsch 1989): the run's window origins in time order, cut into
blocks of ``L`` consecutive origins, ``ceil(T / L)`` blocks drawn with replacement (their starts uniform over
``0 .. T - L``) and their origins' sums added up, every series of an origin moving with it, so the dependence
between series at one time is kept. ``L = ceil(H / spacing)``: the windows of origins closer than the horizon
share target steps (the lag of the Diebold-Mariano test, plus one), so a block holds the origins whose errors
overlap. Fewer than two blocks of origins: no interval can be formed, and the report says so.

At :data:`MIN_SERIES` series or more the intervals are the leaderboard's own (over series), unchanged.

Both come from sums already kept by the scoring: each model's sums per origin
(:class:`~.scoring.conventions.WindowSums`, pooled over the series at that origin) give every pooled metric
of a resample exactly, as the per-series sums do for the series bootstrap. Per-origin scores (the fev
convention's per-window scores) are also what the report plots by forecast origin.

Two models whose sums agree at every origin, for every quantile, made identical forecasts on the scored pairs:
the report names them so, instead of a win rate of 0.5 and an undefined test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from distributed_onnx.evaluation.scoring.conventions import WindowSums
from distributed_onnx.evaluation.scoring.leaderboard import N_RESAMPLES, SEED, overlap_lag, percentile_interval
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES, PairScores

__all__ = ["MIN_SERIES", "OriginSums", "Uncertainty", "block_weights", "uncertainty"]

#: Below this many series the report's intervals resample blocks of window origins (module docstring).
MIN_SERIES = 30
F64 = npt.NDArray[np.float64]
Resampling = Literal["series", "origin_blocks", "none"]
_SCALARS = ("pairs", "abs_err", "sq_err", "abs_y", "scaled_pairs", "mase", "sql")


@dataclass(frozen=True)
class OriginSums:
    """Every model's sums per window origin, ``[T, columns]`` in one origin order (what the resamples weigh)."""

    origins_us: npt.NDArray[np.int64]
    sums: dict[str, F64]
    n_quantiles: int

    @classmethod
    def of(cls, windows: Mapping[str, WindowSums]) -> OriginSums:
        first = next(iter(windows.values()))
        origins = first.origins
        sums = {}
        for model, window in windows.items():
            if not np.array_equal(window.origins, origins):  # every model is scored on the same pairs: same origins
                raise ValueError(f"{model}'s window origins differ from the first model's")
            # Its own layout from the named columns (and the rho columns, last, one per quantile): the scoring's
            # column order is not relied on.
            scalars = [window.column(name) for name in _SCALARS]
            rho = np.asarray(window.sums, dtype=np.float64)[:, window.sums.shape[1] - len(window.quantiles) :]
            sums[model] = (
                np.column_stack([*scalars, rho]) if origins.size else np.zeros((0, len(_SCALARS) + rho.shape[1]))
            )
        return cls(origins, sums, len(first.quantiles))

    def metrics(self, model: str, weights: F64, has_median: bool) -> dict[str, F64]:
        """Each pooled global metric of ``model`` for each row of ``weights[B, T]`` (how often each origin is drawn)."""
        total = weights @ self.sums[model]
        column = {name: total[:, index] for index, name in enumerate(_SCALARS)}
        rho = total[:, len(_SCALARS) :]  # rho per quantile (registry.py: WQL is 2 rho over |y|)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = {
                "sql": column["sql"] / column["scaled_pairs"],
                "wql": (2.0 * rho / column["abs_y"][:, None]).mean(axis=1),
            }
            if has_median:
                out["mae"] = column["abs_err"] / column["pairs"]
                out["rmse"] = np.sqrt(column["sq_err"] / column["pairs"])
                out["mase"] = column["mase"] / column["scaled_pairs"]
        return out


def block_weights(n_origins: int, block: int, n_resamples: int, seed: int = SEED) -> F64:
    """``[B, T]``: how often each origin is drawn by each moving-block resample (``ceil(T / L)`` blocks, the
    last cut so every resample holds ``T`` origins)."""
    rng = np.random.default_rng(seed)
    n_blocks = math.ceil(n_origins / block)
    starts = rng.integers(0, n_origins - block + 1, size=(n_resamples, n_blocks))
    picks = (starts[:, :, None] + np.arange(block)).reshape(n_resamples, -1)[:, :n_origins]
    weights = np.zeros((n_resamples, n_origins))
    np.add.at(weights, (np.repeat(np.arange(n_resamples), n_origins), picks.ravel()), 1.0)
    return weights


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
    n_series = len(scores.pooled[models[0]].series_ids)
    has_median = scores.pooled[models[0]]._median is not None
    metric = "mase" if has_median else "sql"
    origins = OriginSums.of({model: scores.windows[model] for model in models})
    n_origins = int(origins.origins_us.size)
    block = overlap_lag(origins.origins_us, scores.horizon, step_us) + 1
    result = Uncertainty(
        "series",
        n_series,
        n_origins,
        block,
        f"95% percentile bootstrap over {n_series} series, {n_resamples} resamples, seed {SEED}",
    )
    result.identical = _identical(origins, models)
    result.origins_us = origins.origins_us
    result.per_origin = {model: scores.windows[model].per_window()[metric] for model in models}
    ones = np.ones((1, n_origins))
    points = {model: origins.metrics(model, ones, has_median) for model in models}
    if n_series < min_series:
        result.resampling = "origin_blocks"
        result.label = (
            f"95% moving-block bootstrap over the {n_origins} window origins ({n_series} series: too few to "
            f"resample), blocks of {block} consecutive origin{'s' if block > 1 else ''}, {n_resamples} resamples, "
            f"seed {SEED}"
        )
        if n_origins < 2 * block:
            result.resampling = "none"
            result.no_interval = (
                f"No interval can be formed: {n_series} series (too few to resample) and {n_origins} window "
                f"origin{'s' if n_origins != 1 else ''}, fewer than two blocks of {block} overlapping origins. "
                "More origins (--n-windows) or more series would give one."
            )
            result.label = "no interval"
    resampled: dict[str, dict[str, F64]] = {}
    if result.resampling == "origin_blocks":
        weights = block_weights(n_origins, block, n_resamples)
        resampled = {model: origins.metrics(model, weights, has_median) for model in models}
        for model in models:
            for name, values in resampled[model].items():
                result.intervals[(model, name)] = percentile_interval(values)
        if n_series == 1:  # one series: fev's skill is 1 - the clipped ratio of the series' metrics
            references = [(SEASONAL_NAIVE, "mase", "mase"), (SEASONAL_NAIVE, "sql", "sql")]
            references.append((SEASONAL_QUANTILES, "sql", "probabilistic"))
            for model in models:
                for reference, name, key in references:
                    if name in resampled[model] and reference in resampled:
                        result.skill_intervals[(model, key)] = _skill_interval(
                            resampled[model][name], resampled[reference][name]
                        )
    result.verdict = _verdict(scores, models, metric, points, resampled, result, n_resamples)
    return result


def _skill_interval(model: F64, reference: F64) -> tuple[float, float]:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = model / reference
    defined = np.isfinite(ratio) & (ratio > 0)
    return percentile_interval(np.where(defined, 1 - np.clip(np.where(defined, ratio, 1.0), 1e-2, 100.0), np.nan))


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
    scores: PairScores,
    models: Sequence[str],
    metric: str,
    points: Mapping[str, Mapping[str, F64]],
    resampled: Mapping[str, Mapping[str, F64]],
    result: Uncertainty,
    n_resamples: int,
) -> dict[str, Any] | None:
    """The best model by the pooled ``metric`` and its margin over the next distinct one, with an interval."""
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
    low = high = math.nan
    if result.resampling == "origin_blocks":
        low, high = percentile_interval(resampled[runner][metric] - resampled[best][metric])
    elif result.resampling == "series":
        low, high = _series_margin(scores, best, runner, metric, n_resamples)
    verdict |= {"margin_low": low, "margin_high": high}
    return verdict


def _series_margin(scores: PairScores, best: str, runner: str, metric: str, n_resamples: int) -> tuple[float, float]:
    """The margin's interval over series, with the leaderboard's draws (fev's: ``default_rng(SEED).integers``)."""
    sums = {}
    for model in (best, runner):
        views = scores.pooled[model].series_views()
        sums[model] = np.stack([views[metric].reshape(-1), views["scaled"].reshape(-1)], axis=1)
    n_series = next(iter(sums.values())).shape[0]
    rng = np.random.default_rng(SEED)
    margins = []
    for start in range(0, n_resamples, 32):
        rows = min(32, n_resamples - start)
        picks = rng.integers(0, n_series, size=(rows, n_series))
        weights = np.stack([np.bincount(row, minlength=n_series) for row in picks]).astype(np.float64)
        totals = {model: weights @ values for model, values in sums.items()}
        with np.errstate(divide="ignore", invalid="ignore"):
            margins.append(totals[runner][:, 0] / totals[runner][:, 1] - totals[best][:, 0] / totals[best][:, 1])
    return percentile_interval(np.concatenate(margins))
