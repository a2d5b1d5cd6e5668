"""What report.html shows, computed once before the page is drawn (:func:`report_values`).

The page (:mod:`.page`) renders its sections and figures from this one record: the metrics indexed
(:class:`~.tables.Scores`), the tables (headline, per-series, notes, throughput, provenance), the values each
figure draws (skill by lead, calibration), the comparison of the run's models (:mod:`.compare_values`) and what the
leaderboard says beyond its rows (:mod:`..scoring.findings`). Which metrics each shows is the registry's answer
(:mod:`..scoring.registry`), asked here once for the whole page rather than by each section as it is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.report import furniture, tables
from distributed_onnx.evaluation.report.compare_values import Comparison, ModelCurves, SkillByLead, comparison_values
from distributed_onnx.evaluation.report.tables import Scores, SeriesValues
from distributed_onnx.evaluation.scoring.findings import LeaderboardFindings
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, PairScores
from distributed_onnx.evaluation.scoring.registry import Metric, per_checkpoint, skill
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE, central_intervals

#: The calibration figure draws the points of at most this many series (a sample, evenly spaced).
MAX_CALIBRATION_SERIES = 500


@dataclass(frozen=True)
class SkillCurves:
    """A checkpoint's metrics by lead and seasonal naive's (``scored``, the primary, first), and each skill metric's
    skill by lead against the naive (None where either has no value)."""

    leads: np.ndarray
    model: dict[str, np.ndarray]
    naive: dict[str, np.ndarray]
    scored: str
    skills: list[tuple[str, np.ndarray | None]]


@dataclass(frozen=True)
class Calibration:
    """A checkpoint's coverage of each central interval: nominal, empirical, run-wide and per series, by lead."""

    intervals: list[tuple[float, float]]
    nominal: np.ndarray
    empirical: np.ndarray
    #: Whether an interval uses a clamped level (its band is marked).
    marks: np.ndarray
    #: The series' points drawn (at most :data:`MAX_CALIBRATION_SERIES`, evenly spaced), of ``n_series``.
    per_series: list[tuple[float, float]]
    drawn: int
    n_series: int
    by_lead: tuple[np.ndarray, list[np.ndarray]] | None
    #: The table beside the figure (nominal, empirical, their difference per interval) and the sampling's hint.
    table: str
    sampled: str


@dataclass(frozen=True)
class CheckpointValues:
    """One checkpoint's sections: its headline and per-series tables (HTML), its skill and calibration values."""

    headline: str
    series: str
    skill: SkillCurves | None
    calibration: Calibration | None


@dataclass(frozen=True)
class PageValues:
    """Everything the page shows that is computed from the metrics and the summary (see the module docstring)."""

    scores: Scores
    #: The metric that ranks the series tables (:attr:`~.tables.Scores.primary`).
    primary: str
    #: The requested levels that were clamped, each to the native level that served it.
    clamped: dict[float, float]
    #: Each central interval of the run's levels, widest first, and whether it uses a clamped level.
    clamped_bands: dict[tuple[float, float], bool]
    notes: list[str]
    #: The run's model's sections (its series table with the filter box that filters every checkpoint's).
    first: CheckpointValues
    #: Every other checkpoint's, in the page's order.
    others: list[tuple[str, CheckpointValues]]
    #: Every model's coverage of each central interval and skill by lead: the comparison's (:func:`model_curves`).
    curves: ModelCurves
    throughput: str
    provenance: str


@dataclass(frozen=True)
class ReportValues:
    """Everything report.html shows, computed (see the module docstring); :func:`.page.draw_report` draws it."""

    #: The summary the page shows (as it stood when the report was drawn).
    summary: dict[str, Any]
    #: The run's model (its sections are the page's own), and the page's title (every checkpoint's name).
    model: str
    title: str
    #: The grid step (None: unknown), for the lede and the leads' label.
    step_us: int | None
    fans: tuple[FanWindow, ...]
    page: PageValues
    #: The comparison of the run's models (None without a leaderboard).
    comparison: Comparison | None
    leaderboard: pa.Table | None
    findings: LeaderboardFindings | None


def report_values(  # noqa: PLR0913 - the run's products the page draws, each of its own kind
    summary: dict[str, Any],
    metrics: pa.Table,
    quantiles: Sequence[float],
    fans: Sequence[FanWindow] = (),
    leaderboard: pa.Table | None = None,
    series: SeriesValues | None = None,
    *,
    pair_scores: PairScores | None = None,
    step_us: int | None = None,
    findings: LeaderboardFindings | None = None,
) -> ReportValues:
    """The record report.html is drawn from.

    ``pair_scores`` (the run's merged scores) and ``step_us`` give the intervals' resampling, the verdict and the score
    by forecast origin (:mod:`..scoring.uncertainty`); without them the page shows the leaderboard's intervals as
    they are.

    ``metrics``: the long metrics table, or only its run-wide rows when ``series`` gives the per-series values
    (a backtest's driver: :class:`~distributed_onnx.evaluation.scoring.series_scores.SeriesScores`).

    ``findings``: what the leaderboard says beyond its rows (:mod:`..scoring.findings`, read once where it was
    built): the variants' verdicts and the realized covariates' gaps; without them neither section is drawn.
    """
    model = str(summary["model"])
    step_us = step_us or (fans[0].step_us if fans else None)
    models = [str(name) for name in pc.unique(metrics.column("model")).to_pylist()]  # first-seen order, in Arrow
    checkpoints = [name for name in models if name in (summary.get("models") or {model: None})]
    title = ", ".join(checkpoints) if len(checkpoints) > 1 else model
    others = checkpoints[1:] if model in checkpoints else []
    shown = page_values(summary, metrics, series, quantiles, model, others, models)
    compared = (
        comparison_values(
            leaderboard,
            models,
            metrics,
            shown.curves,
            summary.get("pairs") or {},
            pair_scores=pair_scores,
            step_us=step_us,
        )
        if leaderboard is not None
        else None
    )
    return ReportValues(summary, model, title, step_us, tuple(fans), shown, compared, leaderboard, findings)


def page_values(
    summary: dict[str, Any],
    metrics: pa.Table,
    series: SeriesValues | None,
    quantiles: Sequence[float],
    model: str,
    others: Sequence[str],
    models: Sequence[str],
) -> PageValues:
    """The record the page renders from, for the run's ``model`` and the ``others`` checkpoints among its
    ``models`` (every model of the metrics, baselines included, in the page's order)."""
    # What the summary alone gives first (the furniture, the central intervals); then every value of the metrics.
    notes, throughput, provenance = (
        furniture.notes(summary),
        furniture.throughput(summary),
        furniture.provenance(summary),
    )
    clamped = {float(item["requested"]): float(item["served_by"]) for item in summary.get("quantile_clamping") or []}
    # Each central interval of the run's levels (widest first), and whether it uses a clamped level.
    bands = {
        (low, high): any(abs(level - requested) <= LEVEL_TOLERANCE for level in (low, high) for requested in clamped)
        for low, high in central_intervals(quantiles)
    }
    scores = Scores(metrics, series)
    shown = per_checkpoint(scores.has_median)
    curves = model_curves(scores, models, list(bands))
    values = [
        CheckpointValues(
            tables.headline(scores, name),
            tables.series_table(scores, name, search=index == 0),
            _skill(scores, name, shown),
            _calibration(scores, name, bands, curves.coverage.get(name)),
        )
        for index, name in enumerate([model, *others])
    ]
    return PageValues(
        scores,
        scores.primary,
        clamped,
        bands,
        notes,
        values[0],
        list(zip(others, values[1:], strict=True)),
        curves,
        throughput,
        provenance,
    )


def _skill(scores: Scores, model: str, shown: Sequence[Metric]) -> SkillCurves | None:
    """The checkpoint's metrics by lead against seasonal naive (None without any), for the skill of each skill
    metric among :func:`~..scoring.registry.per_checkpoint`'s."""
    curves: dict[str, dict[str, np.ndarray]] = {model: {}, SEASONAL_NAIVE: {}}
    leads = None
    for name, curve in curves.items():
        for metric in shown:
            found = scores.by_lead(name, metric.name)
            if found is not None:
                leads, curve[metric.name] = found
    if leads is None:
        return None
    ours, naive = curves[model], curves[SEASONAL_NAIVE]
    skills = [
        (
            metric.name,
            skill(ours[metric.name], naive[metric.name]) if metric.name in ours and metric.name in naive else None,
        )
        for metric in shown
        if metric.skill
    ]
    return SkillCurves(leads, ours, naive, shown[0].name, skills)


def model_curves(scores: Scores, models: Sequence[str], intervals: Sequence[tuple[float, float]]) -> ModelCurves:
    """What the comparison of ``models`` reads off the metrics, once (both report pages: a backtest's, and live
    scoring's per group): every model's coverage of each of ``intervals`` (the run's central intervals, widest first:
    :func:`~distributed_onnx.model.quantiles.central_intervals`), and the primary metric's skill against seasonal
    naive by lead of every model but the naive (None without metrics by lead), each model keeping its index among
    them: its colour on the figure."""
    coverage = {
        model: [scores.value(model, "coverage", low) for low, _ in intervals]
        for model in models
        if model != SEASONAL_NAIVE  # a point forecast: every quantile is its one value, so no interval to check
    }
    rank_metric = scores.primary
    reference = scores.by_lead(SEASONAL_NAIVE, rank_metric)
    skill_by_lead = None
    if reference is not None:
        leads, naive = reference
        skills: dict[str, tuple[int, np.ndarray]] = {}
        for index, model in enumerate(m for m in models if m != SEASONAL_NAIVE):
            found = scores.by_lead(model, rank_metric)
            if found is not None:
                skills[model] = (index, skill(found[1], naive))
        skill_by_lead = SkillByLead(leads, rank_metric, skills)
    return ModelCurves(rank_metric, list(intervals), coverage, skill_by_lead)


def _calibration(
    scores: Scores, model: str, bands: dict[tuple[float, float], bool], coverage: Sequence[float | None] | None
) -> Calibration | None:
    """The checkpoint's coverage of each central interval (``bands``) it was scored on (None without any):
    ``coverage``, the model's of each band (:func:`model_curves`), or read here for a model the metrics lack."""
    scored = coverage if coverage is not None else [scores.value(model, "coverage", low) for low, _ in bands]
    by_interval = dict(zip(bands, scored, strict=True))
    intervals = [interval for interval in bands if by_interval[interval] is not None]
    if not intervals:
        return None
    nominal = np.array([1 - 2 * low for low, _ in intervals])
    empirical = np.array([by_interval[interval] or 0.0 for interval in intervals])
    marks = np.array([bands[interval] for interval in intervals])
    # At most MAX_CALIBRATION_SERIES series' points (evenly spaced in the metrics' order): the figure's size
    # must not grow with the run (an SVG of 40,000 series' points weighed megabytes).
    n_series = len(scores.series_ids)
    drawn = np.unique(np.linspace(0, n_series - 1, min(n_series, MAX_CALIBRATION_SERIES)).astype(np.int64))
    per_series = [
        (1 - 2 * low, float(value))
        for low, _ in intervals
        for value in scores.series_values(model, "coverage", low)[drawn]
        if np.isfinite(value)
    ]
    curves = [scores.by_lead(model, "coverage", low) for low, _ in intervals]
    found = [curve for curve in curves if curve is not None]
    by_lead = (found[0][0], [values for _, values in found]) if len(found) == len(curves) else None
    rows = "".join(
        f"<tr><th>{n:.0%} (q{low:g}-q{high:g}){' clamped' if mark else ''}</th><td>{e:.3f}</td>"
        f"<td>{e - n:+.3f}</td></tr>"
        for (low, high), n, e, mark in zip(intervals, nominal, empirical, marks, strict=True)
    )
    table = f"<table><tr><th>interval</th><th>coverage</th><th>coverage - nominal</th></tr>{rows}</table>"
    sampled = (
        f"<p class='hint'>Series points: {drawn.size} of {n_series} series, evenly spaced (all: metrics.parquet).</p>"
        if drawn.size < n_series
        else ""
    )
    return Calibration(
        intervals, nominal, empirical, marks, per_series, int(drawn.size), n_series, by_lead, table, sampled
    )
