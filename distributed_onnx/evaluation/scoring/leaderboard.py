"""The leaderboard: which model of a run to ship, and whether the difference is larger than noise.

Built from the merged sums of a run (:class:`~.pairs.PairScores`), so every model is compared on the same
pairs. One long table, ``leaderboard.parquet``, with a ``kind`` per row:

- ``metric``: each model's global metric (``pooled`` convention) with a 95% bootstrap interval over series.
- ``skill``: ``1 - gmean_s(metric_model(s) / metric_ref(s))`` against seasonal naive (and, for SQL and WQL,
  against the probabilistic seasonal-quantile baseline; ``versus`` names the reference), as fev 0.10.0's
  ``fev.analysis.leaderboard`` computes skill over tasks, here over series: per-series ratios clipped to
  [0.01, 100], series where either is undefined dropped, geometric mean (``exp(mean(log))``, as
  ``scipy.stats.gmean`` computes it).
- ``win_rate``: per pair of models, the share of series where ``model`` beats ``versus`` (ties count half).
- ``dm``: a Diebold-Mariano test per pair of models on their per-window losses (below).

Intervals: percentile bootstrap over series, :data:`N_RESAMPLES` resamples drawn as fev draws them
(``numpy.random.default_rng(SEED).integers``), the same resamples for every model and metric; a resample
recomputes each pooled metric from the resampled series' sums (exact, no forecast is read). Below
:data:`~.resampling.MIN_SERIES` series a bootstrap over series says little (one series: no width at all), so the
metrics' intervals come from a circular block bootstrap over window origins instead (:mod:`.resampling`), and with
one series the skills' too (1 - the clipped ratio of the resampled metrics); with too few origins for two blocks
there is no interval (NaN). The ``resampling`` column names which one each row's interval comes from.

Diebold-Mariano: the loss of a window is the model's fev-convention score of that window origin (MASE when
the median is forecast, else SQL); ``d_t`` is the difference of two models' losses over the origins in time
order. Multi-step forecasts from nearby origins overlap, so ``d_t`` is autocorrelated up to lag
``L = ceil(H / spacing) - 1`` (H the horizon, spacing the median step between origins). The long-run
variance is ``gamma_0 + 2 sum_{k=1..L} gamma_k`` (the rectangular window of Diebold & Mariano 1995, JBES
13(3)), with Bartlett weights ``1 - k / (L + 1)`` (Newey & West 1987) when that sum is not positive; the
statistic gets the small-sample correction of Harvey, Leybourne & Newbold 1997 (IJF 13(2)) with ``h = L + 1``
and its p-value (two-sided) comes from Student's t with ``n - 1`` degrees of freedom (``scipy.special.stdtr``,
the distribution function behind ``scipy.stats.t``: importing ``scipy.stats`` at the end of every run costs
the driver several times what ``scipy.special`` does).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from scipy import special

from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES, PairScores
from distributed_onnx.evaluation.scoring.registry import (
    POOLED,
    Metric,
    PooledSums,
    leaderboard_order,
    of_convention,
    primary,
    skill_metrics,
)
from distributed_onnx.evaluation.scoring.resampling import (
    N_RESAMPLES,
    SEED,
    OriginBlocks,
    origin_blocks,
    overlap_lag,
    percentile_interval,
)

__all__ = [
    "LEADERBOARD_SCHEMA",
    "N_RESAMPLES",
    "SEED",
    "clipped_skill_interval",
    "diebold_mariano",
    "leaderboard",
    "overlap_lag",
    "percentile_interval",
    "series_resamples",
]

#: Bootstrap resamples drawn and applied at once (bounds the leaderboard's memory, see :class:`_Bootstrap`).
RESAMPLE_CHUNK = 32
#: Each scores' series resamples of every model's global metrics, kept by :func:`leaderboard` for
#: :func:`series_resamples`: the report's verdict reads its margin from the leaderboard's own draws, and drawing
#: and applying them again cost as much as the leaderboard's whole bootstrap (at 40,000 series, measured).
_RESAMPLED: weakref.WeakKeyDictionary[PairScores, _Resampled] = weakref.WeakKeyDictionary()
#: Resamples whose picks are drawn at once (``8 x DRAW_CHUNK x S`` bytes; only the weights are a whole chunk).
DRAW_CHUNK = 8
RATIO_BOUNDS = (1e-2, 100.0)  # fev's min_relative_error / max_relative_error
F64 = npt.NDArray[np.float64]

LEADERBOARD_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("versus", pa.string()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("convention", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("ci_low", pa.float64()),
        pa.field("ci_high", pa.float64()),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("statistic", pa.float64()),
        pa.field("p_value", pa.float64()),
        # Which resampling gives ci_low / ci_high (:mod:`.resampling`): series, origin_blocks or none (no interval
        # can be formed: NaN); null on the rows without an interval (win_rate, dm).
        pa.field("resampling", pa.string()),
    ]
)


@dataclass(frozen=True)
class _SeriesSums:
    """One model's per-series sums side by side, ``matrix[S, K]`` (each sum a slice of its columns).

    A resample's weighted sums of all of them are then one matrix product that reads the resample weights once;
    a product per sum read them once per sum and took most of the leaderboard's time at 40,000 series
    (benchmarks/results/time_to_results.md).
    """

    matrix: F64
    columns: dict[str, slice]
    vectors: frozenset[str]  # the sums with one value per series (the others have one per quantile)

    @classmethod
    def of(
        cls, sums: dict[str, F64], rows: npt.NDArray[np.intp] | None = None, matrix: F64 | None = None
    ) -> _SeriesSums:
        """``sums`` side by side, their rows at ``rows`` (all, in order, if None); ``matrix``: that matrix
        already (the accumulator's own, :meth:`.MetricsAccumulator.series_matrix`), used as it is."""
        widths = [int(np.prod(values.shape[1:], dtype=np.int64)) for values in sums.values()]
        edges = np.cumsum([0, *widths])
        columns = {name: slice(int(a), int(b)) for name, a, b in zip(sums, edges[:-1], edges[1:], strict=True)}
        vectors = frozenset(name for name, values in sums.items() if values.ndim == 1)
        if matrix is not None and rows is None and matrix.shape[1] == edges[-1]:
            return cls(matrix, columns, vectors)
        n_rows = next(iter(sums.values())).shape[0] if rows is None else rows.size
        filled = np.empty((n_rows, int(edges[-1])))
        for (name, values), width in zip(sums.items(), widths, strict=True):
            picked = values if rows is None else values[rows]
            filled[:, columns[name]] = picked.reshape(n_rows, width)
        return cls(filled, columns, vectors)

    def __getitem__(self, name: str) -> F64:
        block = self.matrix[:, self.columns[name]]
        return block[:, 0] if name in self.vectors else block

    def weighted(self, weights: F64) -> dict[str, F64]:
        """Each sum weighted by ``weights[B, S]``: ``[B, k]`` per sum."""
        product = weights @ self.matrix
        return {name: product[:, columns] for name, columns in self.columns.items()}


def _series_matrix(scores: PairScores, model: str, series: Sequence[str]) -> _SeriesSums:
    """The model's per-series sums, rows in ``series`` order: the merged sums' own side-by-side matrix when their
    rows are in that order already (the usual run: parts follow the plan, sorted by id), else a matrix filled a
    sum at a time. A reordered copy of every sum, then their side-by-side copy, cost twice the matrix
    (benchmarks/results/time_to_results.md)."""
    accumulator = scores.pooled[model]
    rows = accumulator.series_rows()
    order = np.asarray([rows[sid] for sid in series], dtype=np.intp)
    if np.array_equal(order, np.arange(len(rows))):
        return _SeriesSums.of(accumulator.series_views(), matrix=accumulator.series_matrix())
    return _SeriesSums.of(accumulator.series_views(), order)


def _global(sums: _SeriesSums, weights: F64, has_median: bool) -> dict[str, F64]:
    """Each pooled global metric from per-series sums weighted by ``weights[B, S]`` (one row per resample)."""
    weighted = sums.weighted(weights)
    totals = {name: block[:, 0] if name in sums.vectors else block for name, block in weighted.items()}
    return _metrics_of(PooledSums(totals), leaderboard_order(of_convention(POOLED, has_median)))


def _per_series(sums: _SeriesSums, has_median: bool) -> dict[str, F64]:
    """The metrics that are scored as skill, per series."""
    return _metrics_of(PooledSums(_AsMapping(sums)), skill_metrics(has_median))


def _metrics_of(sums: PooledSums, metrics: Sequence[Metric]) -> dict[str, F64]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return {metric.name: metric.value(sums) for metric in metrics if metric.per == "unit"}


class _AsMapping(Mapping[str, F64]):
    """A :class:`_SeriesSums` read as a mapping of its sums (no copy)."""

    def __init__(self, sums: _SeriesSums) -> None:
        self._sums = sums

    def __getitem__(self, name: str) -> F64:
        return self._sums[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sums.columns)

    def __len__(self) -> int:
        return len(self._sums.columns)


def _skill_logs(ratios: F64) -> tuple[F64, npt.NDArray[np.bool_]]:
    """The logs of the defined, clipped ratios (0 where undefined) and which are defined."""
    defined = np.isfinite(ratios) & (ratios > 0)
    clipped = np.clip(np.where(defined, ratios, 1.0), *RATIO_BOUNDS)
    return np.where(defined, np.log(clipped), 0.0), defined


def _gmean_point(ratios: F64) -> tuple[float, int]:
    """Skill = 1 - gmean of the defined, clipped ratios, and how many are defined (NaN, 0 when none is)."""
    logs, defined = _skill_logs(ratios)
    if not defined.any():
        return math.nan, 0
    return 1.0 - float(np.exp(np.mean(logs[defined]))), int(defined.sum())


def _with_interval(point: tuple[float, int], resampled: F64) -> tuple[float, float, float, int]:
    skill, n = point
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    low, high = percentile_interval(resampled)
    return skill, low, high, n


@dataclass(frozen=True)
class _SkillMatrix:
    """What the bootstrap resamples of every skill, as one matrix ``[S, keys + distinct]``.

    A resample's skill is 1 - exp(sum of the drawn series' logs / how many drawn are defined): both sums are the
    resample's weights times a column, so the logs of every key's defined, clipped ratios and one indicator per
    distinct set of defined series (keys whose defined series are the same share theirs) are one matrix, and
    every skill of a chunk one product. Filled a column at a time from the ratios, which are not kept: with their
    logs and a stacked copy they were three times the matrix (~40 MB at 100,000 series, 3 models).
    """

    keys: list[tuple[str, str, str]]
    matrix: F64
    distinct_of: list[int]  # each key's indicator column, after the keys' columns

    @classmethod
    def of(
        cls, n_series: int, keys: Sequence[tuple[str, str, str]], ratio_of: Callable[[tuple[str, str, str]], F64]
    ) -> _SkillMatrix:
        distinct: dict[bytes, int] = {}
        distinct_of: list[int] = []
        indicators: list[npt.NDArray[np.bool_]] = []
        for key in keys:
            _, defined = _skill_logs(ratio_of(key))
            column = distinct.setdefault(np.packbits(defined).tobytes(), len(distinct))
            if column == len(indicators):
                indicators.append(defined)
            distinct_of.append(column)
        matrix = np.empty((n_series, len(keys) + len(indicators)))
        for index, key in enumerate(keys):
            matrix[:, index] = _skill_logs(ratio_of(key))[0]
        for index, defined in enumerate(indicators):
            matrix[:, len(keys) + index] = defined
        return cls(list(keys), matrix, distinct_of)


@dataclass
class _Bootstrap:
    """Every resampled figure of the leaderboard, the resamples drawn and applied a chunk at a time.

    The draws are fev's (``default_rng(SEED).integers(0, S, size=(B, S))``): drawn :data:`DRAW_CHUNK` rows at a
    time they are the same numbers (the generator's stream does not depend on how it is cut), and a row's
    figures depend on that row only. Drawn at once, the [B, S] picks, their weights and each gather took
    ``8 B S`` bytes apiece: 0.8 GB per array at 100,000 series, the driver's peak; the weights of
    :data:`RESAMPLE_CHUNK` resamples at a time are one matrix for the products (benchmarks/results/
    time_to_results.md).
    """

    n_series: int
    n_resamples: int
    globals_: dict[str, dict[str, list[F64]]] = field(default_factory=dict)
    skills: dict[tuple[str, str, str], list[F64]] = field(default_factory=dict)

    def run(self, sums: dict[str, _SeriesSums], has_median: bool, skill: _SkillMatrix) -> None:
        """Every resampled global metric of every model and every resampled skill, one draw of the resamples.

        Each chunk's weights are applied to every model's sums at once: drawing the resamples again per model
        (to hold one model's sums at a time) saved little memory and cost a pass's resampling again per model.
        """
        rng = np.random.default_rng(SEED)
        for start in range(0, self.n_resamples, RESAMPLE_CHUNK):
            rows = min(RESAMPLE_CHUNK, self.n_resamples - start)
            # How often each series is drawn in each resample, the picks drawn DRAW_CHUNK resamples at a time.
            weights = np.empty((rows, self.n_series))
            for first in range(0, rows, DRAW_CHUNK):
                picks = rng.integers(0, max(self.n_series, 1), size=(min(DRAW_CHUNK, rows - first), self.n_series))
                for row, drawn in enumerate(picks, start=first):
                    weights[row] = np.bincount(drawn, minlength=self.n_series)
            for model, model_sums in sums.items():
                for metric, values in _global(model_sums, weights, has_median).items():
                    self.globals_.setdefault(model, {}).setdefault(metric, []).append(values)
            totals = weights @ skill.matrix
            with np.errstate(invalid="ignore", divide="ignore"):
                for index, key in enumerate(skill.keys):
                    counts = totals[:, len(skill.keys) + skill.distinct_of[index]]
                    self.skills.setdefault(key, []).append(1.0 - np.exp(totals[:, index] / counts))

    def global_(self, model: str, metric: str) -> F64:
        return np.concatenate(self.globals_[model][metric])

    def skill(self, key: tuple[str, str, str]) -> F64:
        return np.concatenate(self.skills[key])


@dataclass(frozen=True)
class _Resampled:
    """What :func:`leaderboard` resampled, and of which sums (a scores object merged into since is resampled again)."""

    series: list[str]
    n_resamples: int
    pairs: tuple[float, ...]  # every model's pairs, summed over series
    globals_: dict[str, dict[str, F64]]

    def holds(self, scores: PairScores, series: list[str], models: Sequence[str], n_resamples: int) -> bool:
        return (
            self.n_resamples == n_resamples
            and self.pairs == _pairs_of(scores)
            and all(model in self.globals_ for model in models)
            and self.series == series
        )


def _pairs_of(scores: PairScores) -> tuple[float, ...]:
    return tuple(float(scores.pooled[model].series_views()["pairs"].sum()) for model in scores.models)


def series_resamples(
    scores: PairScores, models: Sequence[str], n_resamples: int = N_RESAMPLES
) -> dict[str, dict[str, F64]]:
    """model -> metric -> ``[B]``: every pooled global metric of ``models`` in each of the leaderboard's series
    resamples (its draws: the verdict's margin over series is read from the same resamples as its intervals).

    Those :func:`leaderboard` drew for these scores when it has (:data:`_RESAMPLED`), else drawn now: a model's
    resampled metrics depend on its own sums and the draws only, so they are the same either way."""
    series = sorted(scores.pooled[models[0]].series_ids)
    kept = _RESAMPLED.get(scores)
    if kept is not None and kept.holds(scores, series, models, n_resamples):
        return {model: kept.globals_[model] for model in models}
    bootstrap = _Bootstrap(len(series), n_resamples)
    sums = {model: _series_matrix(scores, model, series) for model in models}
    bootstrap.run(sums, scores.has_median, _SkillMatrix.of(len(series), [], lambda key: np.empty(0)))
    return {
        model: {metric: bootstrap.global_(model, metric) for metric in bootstrap.globals_[model]} for model in models
    }


def clipped_skill_interval(model: F64, reference: F64) -> tuple[float, float]:
    """The interval of one series' skill, ``1 - clip(model / reference)``, from resampled metrics of both."""
    return percentile_interval(clipped_skill_resamples(model, reference))


def clipped_skill_resamples(model: F64, reference: F64) -> F64:
    """One series' skill, ``1 - clip(model / reference)``, of each resample of both metrics (NaN where undefined):
    what :func:`clipped_skill_interval` takes the interval of."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = model / reference
    logs, defined = _skill_logs(ratio)
    return np.where(defined, 1.0 - np.exp(logs), np.nan)


def _interval_of(
    blocks: OriginBlocks, series_interval: tuple[float, float], model: str, metric: str, versus: str | None = None
) -> tuple[float, float, str]:
    """``(low, high, resampling)`` of a metric (``versus`` None) or a skill row, as :mod:`.resampling` decides:
    the series bootstrap's interval, the origin blocks' (metrics; skills of one series), or none (NaN)."""
    if blocks.resampling == "none":
        return math.nan, math.nan, "none"
    if blocks.resampling == "origin_blocks":
        if versus is None:
            return (*blocks.interval(model, metric), "origin_blocks")
        if blocks.n_series == 1:
            resampled = blocks.resampled
            if metric in resampled.get(model, {}) and metric in resampled.get(versus, {}):
                interval = clipped_skill_interval(resampled[model][metric], resampled[versus][metric])
                return (*interval, "origin_blocks")
            return math.nan, math.nan, "none"
    return (*series_interval, "series")


def diebold_mariano(loss_a: F64, loss_b: F64, lag: int) -> tuple[float, float, int]:
    """``(HLN-corrected DM statistic, two-sided p-value, n)`` for the loss differential ``a - b`` (module doc)."""
    d = np.asarray(loss_a, dtype=np.float64) - np.asarray(loss_b, dtype=np.float64)
    d = d[np.isfinite(d)]
    n = d.size
    if n < 3:
        return math.nan, math.nan, n
    lag = max(0, min(lag, n - 2))
    centred = d - d.mean()
    gamma = np.array([centred[k:] @ centred[: n - k] / n for k in range(lag + 1)])
    long_run = gamma[0] + 2.0 * gamma[1:].sum()
    if long_run <= 0:
        weights = 1.0 - np.arange(1, lag + 1) / (lag + 1)
        long_run = gamma[0] + 2.0 * (weights * gamma[1:]).sum()
    if long_run <= 0:  # every differential equal: the models do not differ on these windows
        return math.nan, math.nan, n
    h = lag + 1
    correction = (n + 1 - 2 * h + h * (h - 1) / n) / n
    if correction <= 0:
        return math.nan, math.nan, n
    statistic = float(d.mean() / math.sqrt(long_run / n) * math.sqrt(correction))
    return statistic, float(2.0 * special.stdtr(n - 1, -abs(statistic))), n


def leaderboard(
    scores: PairScores, step_us: int, reference: str = SEASONAL_NAIVE, n_resamples: int = N_RESAMPLES
) -> pa.Table:
    """The leaderboard table of a run's merged scores (module doc for every definition)."""
    models = list(scores.models)
    series = sorted(scores.pooled[models[0]].series_ids)
    has_median = scores.has_median
    sums = {model: _series_matrix(scores, model, series) for model in models}
    per_series = {model: _per_series(sums[model], has_median) for model in models}
    # Every model against seasonal naive; the probabilistic metrics against seasonal quantiles too.
    probabilistic = tuple(metric.name for metric in skill_metrics(has_median, probabilistic_only=True))
    versus_metrics = {
        model: [
            (versus, metric)
            for versus, metrics in ((reference, tuple(per_series[model])), (SEASONAL_QUANTILES, probabilistic))
            if versus in per_series
            for metric in metrics
        ]
        for model in models
    }
    keys = [(model, versus, metric) for model in models for versus, metric in versus_metrics[model]]

    def ratio_of(key: tuple[str, str, str]) -> F64:
        model, versus, metric = key
        return per_series[model][metric] / per_series[versus][metric]

    points = {key: _gmean_point(ratio_of(key)) for key in keys}
    blocks = origin_blocks(scores, step_us, n_resamples=n_resamples)
    bootstrap = _Bootstrap(len(series), n_resamples)
    bootstrap.run(sums, has_median, _SkillMatrix.of(len(series), keys if series else [], ratio_of))
    global_resamples = {
        model: {name: bootstrap.global_(model, name) for name in bootstrap.globals_.get(model, {})} for model in models
    }
    _RESAMPLED[scores] = _Resampled(series, n_resamples, _pairs_of(scores), global_resamples)
    records: list[dict[str, Any]] = []

    def add(kind: str, model: str, metric: str, value: float, low: float, high: float, n: int, **extra: Any) -> None:
        convention = extra.pop("convention", POOLED)
        records.append(
            {
                "kind": kind,
                "model": model,
                "metric": metric,
                "convention": convention,
                "value": value,
                "ci_low": low,
                "ci_high": high,
                "n": n,
                **extra,
            }
        )

    for model in models:
        point = _global(sums[model], np.ones((1, len(series))), has_median)
        n_pairs = int(sums[model]["pairs"].sum())
        for metric, value in point.items():
            low, high, how = _interval_of(blocks, percentile_interval(global_resamples[model][metric]), model, metric)
            add("metric", model, metric, float(value[0]), low, high, n_pairs, resampling=how)
        for versus, metric in versus_metrics[model]:
            key = (model, versus, metric)
            resampled = bootstrap.skill(key) if series else np.empty(0)
            skill, low, high, n = _with_interval(points[key], resampled)
            if n:
                low, high, how = _interval_of(blocks, (low, high), model, metric, versus)
            else:
                how = "none"
            add("skill", model, metric, skill, low, high, n, versus=versus, convention="fev_skill", resampling=how)
    metric = primary(has_median)
    losses = {model: scores.windows[model].per_window()[metric] for model in models}
    origins = scores.windows[models[0]].origins
    lag = overlap_lag(origins, scores.horizon, step_us)
    for a in models:
        for b in models:
            if a == b:
                continue
            ea, eb = per_series[a][metric], per_series[b][metric]
            both = np.isfinite(ea) & np.isfinite(eb)
            wins = ((ea < eb) + 0.5 * (ea == eb))[both]
            rate = float(wins.mean()) if wins.size else math.nan
            add("win_rate", a, metric, rate, math.nan, math.nan, int(both.sum()), versus=b)
            statistic, p_value, n = diebold_mariano(losses[a], losses[b], lag)
            add(
                "dm",
                a,
                metric,
                statistic,
                math.nan,
                math.nan,
                n,
                versus=b,
                statistic=statistic,
                p_value=p_value,
                convention="fev",
            )
    return pa.Table.from_pylist(records, schema=LEADERBOARD_SCHEMA)
