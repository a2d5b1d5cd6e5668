"""Every metric of the project, each defined once: the sums it reads, how they combine, where it is reported.

One small class per metric, its formula in the docstring, as fev's ``fev/metrics.py`` writes them. Everything that
reports a metric reads it from here: the long ``metrics`` table (:mod:`.metrics_table`, every pooled scope), the fev
convention (:mod:`.conventions`, one score per window origin, then their mean), the leaderboard's global metrics,
skills and bootstrap (:mod:`.leaderboard`), the intervals and the verdict (:mod:`.resampling`), both reports' tables
and both CLI headlines. Adding a metric is one class here (and its test), or :func:`register` at run time; the sums
it needs must be among the accumulator's (:data:`SUMS`).

>>> primary(has_median=True), primary(has_median=False)
('mase', 'sql')
>>> sorted(headline())
['mae', 'mase', 'wql']
>>> [metric.name for metric in per_checkpoint(has_median=True)], [m.name for m in per_checkpoint(has_median=False)]
(['mase', 'wql', 'mae'], ['sql', 'wql'])
>>> [metric.name for metric in of_convention(FEV, has_median=False)]
['sql', 'wql', 'mql']

A metric's :meth:`Metric.value` combines a unit's sums (``U`` units: every series, every lead, every origin or every
bootstrap resample at once) through a :class:`Sums` view, which says how a sum is divided by a count in each
convention (the pooled scopes divide, the fev convention multiplies by the reciprocal: each keeps its float bits).

The sums (:mod:`.metrics` adds them; ``e = y - q0.5``, ``rho_q(u) = q u - min(u, 0)``, ``s_w`` the window's
seasonal scale):

- ``pairs``: the scored (window, lead) pairs; ``abs_err``, ``sq_err``: sums of ``|e|`` and ``e^2``; ``abs_y``:
  of ``|y|``; ``rho``: of ``rho_q(y - y_q)``, one column per level; ``hits``: actuals inside each central interval;
- ``scaled``: the units of the scaled metrics' mean (windows with a usable scale in a series, pairs with one in a
  lead or an origin); ``mase``: the sum of ``mean_h |e| / s_w`` over those windows (of ``|e| / s_w`` over pairs,
  per lead or origin); ``sql``: likewise of ``mean_q 2 rho_q / s_w``; ``scaled_pairs``: the pairs of those windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal, Protocol

import numpy as np
import numpy.typing as npt

from distributed_onnx.model.quantiles import LEVEL_TOLERANCE

__all__ = [
    "FEV",
    "METRICS",
    "POOLED",
    "SUMS",
    "Metric",
    "PooledSums",
    "Sums",
    "added",
    "by_name",
    "has_median",
    "headline",
    "median_index",
    "needs_median",
    "of_convention",
    "per_checkpoint",
    "primary",
    "ranking",
    "register",
    "reported",
    "series_listing",
    "skill",
    "skill_metrics",
    "unregister",
]

F64 = npt.NDArray[np.float64]
#: Sums over every pair of a scope, divided once (:mod:`.metrics`).
POOLED = "pooled"
#: fev 0.10.0's ``evaluation_summary``: each window origin scored on its own, then the plain mean (:mod:`.conventions`).
FEV = "fev"
#: The sums a metric may read (module docstring).
SUMS = ("pairs", "abs_err", "sq_err", "abs_y", "rho", "hits", "scaled", "mase", "sql", "scaled_pairs")
Scope = Literal["global", "series", "lead"]


class Sums(Protocol):
    """The sums of ``U`` units: ``sums[name]`` is ``[U]`` (``[U, k]`` for ``rho`` and ``hits``)."""

    def __getitem__(self, name: str) -> F64: ...

    def mean(self, name: str, count: str) -> F64:
        """``sums[name] / sums[count]`` (per column of a ``[U, k]`` sum), as the convention divides."""
        ...


class PooledSums:
    """The pooled scopes' view of their sums (a mapping of ``[U]`` and ``[U, k]`` arrays): a plain division."""

    def __init__(self, sums: Mapping[str, F64]) -> None:
        self._sums = sums

    def __getitem__(self, name: str) -> F64:
        return self._sums[name]

    def mean(self, name: str, count: str) -> F64:
        total, by = self._sums[name], self._sums[count]
        return total / by[:, None] if total.ndim == 2 else total / by


class Metric:
    """One metric. Class attributes say where it exists; :meth:`value` says how it is computed.

    ``count``: the sum that is the metric's ``n`` (and that must be positive for it to be defined in a unit, with
    ``defined_by``); ``per``: one value per quantile level or per central interval instead of one per unit.
    """

    name: ClassVar[str]
    needs_median: ClassVar[bool] = False
    count: ClassVar[str] = "pairs"
    defined_by: ClassVar[str] = "pairs"
    per: ClassVar[Literal["unit", "quantile", "interval"]] = "unit"
    conventions: ClassVar[tuple[str, ...]] = (POOLED, FEV)
    scopes: ClassVar[tuple[Scope, ...]] = ("global", "series", "lead")  # of the pooled convention (fev: global)
    #: Skill against the baselines: in the leaderboard (per series, gmean) and in the report's per-checkpoint
    #: sections (per series, by lead).
    skill: ClassVar[bool] = False
    #: Printed by ``distributed-onnx backtest`` and ``score``, and shown for each checkpoint in the report (its
    #: per-series table and skill by lead: :func:`per_checkpoint`).
    headline: ClassVar[bool] = False
    #: Which metric ranks models, picks the verdict and is the Diebold-Mariano loss: the lowest rank of those a run
    #: has (None: never primary). The report's leaderboard shows the skill of each metric that has one.
    primary_rank: ClassVar[int | None] = None
    report_rank: ClassVar[int | None] = None  # its place in the report's tables of global metrics (None: not shown)

    def value(self, sums: Sums) -> F64:
        """``[U]`` (``[U, k]`` when :attr:`per` is not ``unit``); NaN or inf where undefined (callers mask)."""
        raise NotImplementedError

    def levels(self, quantiles: Sequence[float], intervals: Sequence[tuple[float, float]]) -> list[float] | None:
        """The ``quantile`` column of its rows: the levels, the intervals' lower ends, or None (one row a unit)."""
        if self.per == "quantile":
            return [float(q) for q in quantiles]
        if self.per == "interval":
            return [float(lo) for lo, _ in intervals]
        return None


class MAE(Metric):
    """Mean absolute error of the median: ``sum |y - q0.5| / n``."""

    name = "mae"
    needs_median = True
    headline = True
    report_rank = 3

    def value(self, sums: Sums) -> F64:
        return sums.mean("abs_err", "pairs")


class RMSE(Metric):
    """Root mean squared error of the median: ``sqrt(sum (y - q0.5)^2 / n)``."""

    name = "rmse"
    needs_median = True
    report_rank = 4

    def value(self, sums: Sums) -> F64:
        return np.sqrt(sums.mean("sq_err", "pairs"))


class MASE(Metric):
    """Mean absolute scaled error: the mean over windows (with a usable scale) of ``mean_h |y - q0.5| / s_w``.

    Per lead and per origin the mean is over pairs (``|e| / s_w``); ``n`` counts the pairs of those windows."""

    name = "mase"
    needs_median = True
    count = "scaled_pairs"
    defined_by = "scaled"
    skill = True
    headline = True
    report_rank = 0
    primary_rank = 0

    def value(self, sums: Sums) -> F64:
        return sums.mean("mase", "scaled")


class SQL(Metric):
    """Scaled quantile loss: as :class:`MASE`, of ``mean_q 2 rho_q(y - y_q) / s_w``."""

    name = "sql"
    count = "scaled_pairs"
    defined_by = "scaled"
    skill = True
    report_rank = 1
    primary_rank = 1

    def value(self, sums: Sums) -> F64:
        return sums.mean("sql", "scaled")


class WQL(Metric):
    """Weighted quantile loss: ``mean_q (sum 2 rho_q(y - y_q) / sum |y|)``; NaN when every actual is zero."""

    name = "wql"
    skill = True
    headline = True
    report_rank = 2

    def value(self, sums: Sums) -> F64:
        abs_y = sums["abs_y"]
        safe_abs_y = np.where(abs_y > 0, abs_y, 1.0)
        return np.where(abs_y > 0, np.mean(2.0 * sums["rho"] / safe_abs_y[:, None], axis=1), np.nan)


class Pinball(Metric):
    """Pinball loss of each level: ``sum rho_q(y - y_q) / n`` (no factor 2)."""

    name = "pinball"
    per = "quantile"
    conventions = (POOLED,)

    def value(self, sums: Sums) -> F64:
        return sums.mean("rho", "pairs")


class Coverage(Metric):
    """Empirical coverage of each central interval ``[q, 1 - q]``: the share of actuals inside it."""

    name = "coverage"
    per = "interval"
    conventions = (POOLED,)

    def value(self, sums: Sums) -> F64:
        return sums.mean("hits", "pairs")


class MQL(Metric):
    """Mean quantile loss, the approximation of the CRPS from the forecast's quantiles (fev's ``MQL``):
    ``mean_q (sum 2 rho_q(y - y_q) / n)``. In the units of ``y``, so only the fev convention reports it (each
    window origin scored on all its series, then the plain mean over origins)."""

    name = "mql"
    conventions = (FEV,)

    def value(self, sums: Sums) -> F64:
        return np.mean(2.0 * sums.mean("rho", "pairs"), axis=1)


#: Every metric, in the order of their rows in ``metrics.parquet`` (:func:`register` adds one at the end).
METRICS: list[Metric] = [MAE(), RMSE(), MASE(), SQL(), WQL(), Pinball(), Coverage(), MQL()]
_BUILT_IN = frozenset(metric.name for metric in METRICS)


def register(metric: Metric) -> Metric:
    """Add ``metric`` to every output that reads the registry (module docstring); returns it.

    >>> class HalfMAE(Metric):
    ...     name = "half_mae"
    ...     needs_median = True
    ...     def value(self, sums: Sums) -> F64:
    ...         return sums.mean("abs_err", "pairs") / 2
    >>> half = register(HalfMAE())
    >>> half.value(PooledSums({"abs_err": np.array([3.0]), "pairs": np.array([2.0])}))
    array([0.75])
    >>> "half_mae" in [metric.name for metric in of_convention(POOLED)]
    True
    >>> unregister("half_mae")
    """
    if any(known.name == metric.name for known in METRICS):
        raise ValueError(f"a metric named {metric.name!r} is registered already")
    METRICS.append(metric)
    return metric


def unregister(name: str) -> None:
    """Remove a metric added by :func:`register` (the built-in metrics stay)."""
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is a built-in metric; only those added by register() can be removed")
    METRICS.remove(by_name(name))


def added() -> list[Metric]:
    """The metrics added by :func:`register`: what a process drawing this one's report must register too."""
    return [metric for metric in METRICS if metric.name not in _BUILT_IN]


def median_index(quantiles: Sequence[float]) -> int | None:
    """The position of the 0.5 level among ``quantiles`` (within :data:`LEVEL_TOLERANCE`), None without it: whether
    the metrics that need the median exist, and so which metric is :func:`primary`.

    >>> median_index([0.1, 0.5, 0.9]), median_index([0.1, 0.9])
    (1, None)
    """
    return next((i for i, q in enumerate(quantiles) if abs(q - 0.5) <= LEVEL_TOLERANCE), None)


def has_median(quantiles: Sequence[float]) -> bool:
    """Whether a run that forecasts ``quantiles`` has the median: which metrics it has and which is :func:`primary`.

    The one answer to that question: the driver (its levels), the scores (theirs) and the report (the levels of its
    metrics table) all ask it here.

    >>> has_median([0.1, 0.5 + 1e-12, 0.9]), has_median([0.1, 0.9])
    (True, False)
    """
    return median_index(quantiles) is not None


def of_convention(convention: str, has_median: bool = True) -> list[Metric]:
    """The metrics of a convention in table order (those that need the median only when it is forecast)."""
    return [m for m in METRICS if convention in m.conventions and (has_median or not m.needs_median)]


def by_name(name: str) -> Metric:
    """The metric called ``name``.

    >>> by_name("wql").needs_median, by_name("mase").count
    (False, 'scaled_pairs')
    """
    for metric in METRICS:
        if metric.name == name:
            return metric
    raise KeyError(f"no metric named {name!r}; the metrics are {[m.name for m in METRICS]}")


def leaderboard_order(metrics: Sequence[Metric]) -> list[Metric]:
    """The leaderboard's order of its metrics: those without the median first (then each in table order)."""
    return sorted(metrics, key=lambda metric: metric.needs_median)


def skill_metrics(has_median: bool, probabilistic_only: bool = False) -> list[Metric]:
    """The metrics scored as skill against a baseline (only those without the median for a probabilistic one)."""
    chosen = [m for m in of_convention(POOLED, has_median) if m.skill and m.per == "unit"]
    return leaderboard_order([m for m in chosen if not (probabilistic_only and m.needs_median)])


def needs_median() -> frozenset[str]:
    """The metrics that exist only where the median is forecast: a table holding one of them had the median."""
    return frozenset(m.name for m in METRICS if m.needs_median)


def primary(has_median: bool) -> str:
    """The metric that ranks models, picks the verdict and is the loss of the Diebold-Mariano test: of those a run
    has, the lowest :attr:`Metric.primary_rank` (MASE, or SQL without a median)."""
    ranked = [m for m in of_convention(POOLED, has_median) if m.primary_rank is not None and m.per == "unit"]
    return min(ranked, key=lambda metric: metric.primary_rank or 0).name


def ranking() -> list[Metric]:
    """Every metric that can rank models (a :attr:`Metric.primary_rank`), the first to rank first: the leaderboard
    shows each one's skill, whichever a run's :func:`primary` is (MASE, then SQL)."""
    ranked = [m for m in METRICS if m.primary_rank is not None and m.per == "unit" and POOLED in m.conventions]
    return sorted(ranked, key=lambda metric: metric.primary_rank or 0)


def per_checkpoint(has_median: bool) -> list[Metric]:
    """What the report shows of each checkpoint on its own, in order: the :func:`primary` metric, then the
    :func:`headline` metrics in the report's order, those the run has. The per-series table ranks the series by the
    first and has a column of each (with seasonal naive's and the skill for a :attr:`Metric.skill` one); skill by
    lead draws the first, and the skill of each skill metric."""
    first = by_name(primary(has_median))
    rest = sorted(
        (m for m in METRICS if m.headline and m is not first), key=lambda m: (m.report_rank is None, m.report_rank or 0)
    )
    return [m for m in (first, *rest) if m.per == "unit" and (has_median or not m.needs_median)]


def series_listing() -> Metric:
    """The metric whose per-series rows list the series a model scored, with or without the median: defined
    wherever a pair was scored, its ``n`` the scored pairs (WQL). The per-series table lists those series and
    shows that ``n``.

    >>> series_listing().name
    'wql'
    """
    return next(
        m
        for m in METRICS
        if m.per == "unit"
        and not m.needs_median
        and m.count == m.defined_by == "pairs"
        and POOLED in m.conventions
        and "series" in m.scopes
    )


def skill(model: npt.ArrayLike, reference: npt.ArrayLike) -> F64:
    """``1 - model / reference`` of any metric (lower better): above 0 beats the reference, 1 is perfect; NaN where
    the reference is 0. The reports' skill of one value, by lead and per series; the leaderboard's is fev's
    (clipped ratios' geometric mean over series, :mod:`.leaderboard`).

    >>> skill([0.5, 2.0, 1.0], [1.0, 1.0, 0.0])
    array([ 0.5, -1. ,  nan])
    """
    ours, theirs = np.asarray(model, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(theirs != 0, 1.0 - ours / theirs, np.nan)


def headline() -> frozenset[str]:
    """The global metrics the CLI prints after a backtest and after ``score``."""
    return frozenset(m.name for m in METRICS if m.headline)


def reported() -> tuple[str, ...]:
    """The report's global metrics, in its order."""
    ranked = sorted((m for m in METRICS if m.report_rank is not None), key=lambda m: m.report_rank or 0)
    return tuple(m.name for m in ranked)
