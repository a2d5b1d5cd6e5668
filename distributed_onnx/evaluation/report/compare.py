"""The report's comparison of the run's models: leaderboard, pairs left out, skill by lead and calibration of each.

Every model of a run (checkpoints and the two baselines) is scored on the same pairs, so these numbers
compare like with like. Every number names its convention: ``pooled`` (sums over every pair, the metrics'
default), ``fev`` (per window, then the mean over windows, as fev 0.10.0) or ``fev skill`` (1 - geometric mean
over series of per-series ratios against seasonal naive, as ``fev.analysis.leaderboard``).

Rendering only: every value comes from the :class:`~.compare_values.Comparison` record, computed once before;
the figures are :mod:`.plots`'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx.evaluation.report import plots as report_plots
from distributed_onnx.evaluation.report.compare_values import Comparison
from distributed_onnx.evaluation.report.tables import escape, number
from distributed_onnx.evaluation.scoring.leaderboard import N_RESAMPLES, SEED
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES
from distributed_onnx.evaluation.scoring.uncertainty import Uncertainty


def _rows(board: pa.Table, kind: str) -> list[dict[str, Any]]:
    return [row for row in board.to_pylist() if row["kind"] == kind]


def _interval(row: dict[str, Any] | None, digits: int = 4, interval: tuple[float, float] | None = None) -> str:
    """A value and, on a second line, its 95% interval (``interval`` replaces the row's own when given)."""
    if row is None:
        return "-"
    value = number(row["value"], digits)
    low, high = interval if interval is not None else (row["ci_low"], row["ci_high"])
    if low is None or not np.isfinite(low):
        return value
    return f"{value}<br><span class='hint'>[{_short(low)}, {_short(high)}]</span>"


def _short(value: float) -> str:
    """An interval's end in at most 3 significant digits, without exponents for the thousands (MAE in MW)."""
    return f"{value:,.0f}" if 1_000 <= abs(value) < 1e7 else number(value, 3)


def comparison_sections(values: Comparison, lead_label: str, heading: str = "h2") -> list[str]:
    """The comparison's sections under their headings (the leaderboard's at level ``heading``), the verdict apart:
    leaderboard with pairwise tests, pairs left out, skill by lead, score by origin, calibration."""
    skill, by_origin = _figures(values, lead_label)
    return [
        f"<{heading}>Leaderboard</{heading}>",
        leaderboard_section(values),
        "<h3>Pairs scored and left out</h3>",
        pairs_section(values.pairs),
        "<h3>Skill by lead, every model</h3>",
        skill,
        "<h3>Score by forecast origin, every model</h3>",
        by_origin,
        "<h3>Calibration, every model</h3>",
        calibration_table(values),
    ]


def verdict_line(values: Comparison) -> str:
    """The page's first finding: the best model, its margin over the next with an interval and the DM p-value."""
    uncertainty, board = values.uncertainty, values.board
    if uncertainty is None or uncertainty.verdict is None:
        return ""
    verdict = uncertainty.verdict
    metric = str(verdict["metric"]).upper()
    best = str(verdict["best"])
    text = f"Best by pooled {metric}: <b>{escape(best)}</b> ({number(verdict['best_value'])})"
    tied = [str(model) for model in verdict.get("tied") or []]
    if tied:
        text += f", with identical forecasts from {escape(', '.join(tied))}"
    if "next" in verdict:
        runner = str(verdict["next"])
        low, high = float(verdict["margin_low"]), float(verdict["margin_high"])
        margin = float(verdict["margin"])
        relative = margin / float(verdict["next_value"]) if verdict["next_value"] else math.nan
        text += (
            f"; ahead of {escape(runner)} ({number(verdict['next_value'])}) by {number(margin)} "
            f"({relative:.1%} of its {metric})"
        )
        if np.isfinite(low):
            sure = "the interval excludes 0" if low > 0 or high < 0 else "the interval includes 0: not a clear win"
            text += f", 95% interval [{number(low)}, {number(high)}] ({escape(uncertainty.label_short)}; {sure})"
        else:
            text += f" (no interval: {escape(uncertainty.no_interval or 'too few series or origins')})"
        test = next(
            (
                row
                for row in board.to_pylist()
                if row["kind"] == "dm"
                and row["model"] == best
                and row["versus"] == runner
                and row["metric"] == verdict["metric"]
            ),
            None,
        )
        p_value = None if test is None else test["p_value"]
        text += (
            f"; Diebold-Mariano p = {number(p_value, 3)}"
            if p_value is not None and np.isfinite(p_value)
            else ("; Diebold-Mariano: undefined on these windows")
        )
    return f"<p class='verdict'>{text}.</p>"


def leaderboard_section(values: Comparison) -> str:
    """Per model: skill against seasonal naive and each global metric with its 95% interval; then pairs."""
    board, uncertainty = values.board, values.uncertainty
    metric_rows = {(row["model"], row["metric"]): row for row in _rows(board, "metric")}
    skill_rows = {
        (row["model"], row["metric"]): row for row in _rows(board, "skill") if row["versus"] == SEASONAL_NAIVE
    }
    # Against seasonal quantiles: the skill of the metric that ranks probabilistic forecasts (the primary without
    # the median: SQL), the leaderboard's other skills being against seasonal naive.
    probabilistic_metric = values.probabilistic_metric
    probabilistic = {
        row["model"]: row
        for row in _rows(board, "skill")
        if row["versus"] == SEASONAL_QUANTILES and row["metric"] == probabilistic_metric
    }
    fev = values.fev
    shown = [metric for metric in values.reported if any(key[1] == metric for key in metric_rows)]
    rank_metric = values.rank_metric
    skills = values.skill_metrics  # each metric that can rank: the run's primary among them
    ranked = sorted(values.models, key=lambda m: -(skill_rows.get((m, rank_metric)) or {"value": -np.inf})["value"])
    origin_blocks = uncertainty is not None and uncertainty.resampling == "origin_blocks"
    no_interval = uncertainty is not None and uncertainty.resampling == "none"

    def metric_interval(model: str, metric: str) -> tuple[float, float] | None:
        if no_interval:
            return (math.nan, math.nan)
        return uncertainty.intervals.get((model, metric)) if origin_blocks and uncertainty else None

    def skill_interval(model: str, metric: str) -> tuple[float, float] | None:
        if no_interval or (uncertainty is not None and uncertainty.n_series == 1 and not origin_blocks):
            return (math.nan, math.nan)
        return uncertainty.skill_intervals.get((model, metric)) if origin_blocks and uncertainty else None

    head = "".join(
        f"<th>{m.upper()} skill<br><span class='hint'>fev skill vs seasonal naive</span></th>" for m in skills
    )
    head += (
        f"<th>{probabilistic_metric.upper()} skill<br><span class='hint'>fev skill vs seasonal quantiles</span></th>"
    )
    head += "".join(f"<th>{m.upper()}<br><span class='hint'>pooled [95%]; fev</span></th>" for m in shown)
    body = ""
    for model in ranked:
        cells = "".join(
            f"<td>{_interval(skill_rows.get((model, m)), 3, skill_interval(model, m))}</td>" for m in skills
        )
        cells += f"<td>{_interval(probabilistic.get(model), 3, skill_interval(model, 'probabilistic'))}</td>"
        cells += "".join(
            f"<td>{_interval(metric_rows.get((model, m)), 4, metric_interval(model, m))}"
            f"<br><span class='fev'>fev {number(fev.get((model, m)))}</span></td>"
            for m in shown
        )
        body += f"<tr><th>{escape(model)}</th>{cells}</tr>"
    table = f"<table class='board'><tr><th>model</th>{head}</tr>{body}</table>"
    hint = (
        "<p class='hint'>Every model on the same (window, lead) pairs. Skill: 1 - geometric mean over series of "
        "model/seasonal-naive per-series ratios (clipped to [0.01, 100]), as fev computes skill; above 0 beats "
        "the naive. Pooled: sums over every pair; fev (below each): each window origin scored, then the mean over "
        f"windows. {escape(_interval_text(uncertainty))}</p>"
    )
    return table + hint + _pairwise(values, ranked)


def _interval_text(uncertainty: Uncertainty | None) -> str:
    if uncertainty is None:
        return f"Intervals: 95% percentile bootstrap over series, {N_RESAMPLES} resamples, seed {SEED}."
    if uncertainty.resampling == "none":
        return str(uncertainty.no_interval)
    if uncertainty.resampling == "series":
        return f"Intervals: {uncertainty.label}."
    skills = (
        "the skills' too (one series: skill is 1 - the clipped ratio of the resampled metrics)"
        if uncertainty.n_series == 1
        else f"the skills' are the leaderboard's, over the {uncertainty.n_series} series"
    )
    return (
        f"Intervals of the metrics: {uncertainty.label}; {skills}. leaderboard.parquet holds the same intervals "
        "(its column resampling names which one each row's comes from)."
    )


def _pairwise(values: Comparison, models: Sequence[str]) -> str:
    """A matrix, row model against column model: the win rate over the p-value, columns numbered as the rows.

    Numbered columns, one short line per value and the DM statistic in the cell's tooltip: the table fits a
    1280 px window at any number of models (with the models' names as column heads and the test spelled out in
    each cell, four models scrolled sideways and wrapped each cell over five lines).
    """
    board, metric, uncertainty = values.board, values.rank_metric, values.uncertainty
    wins = {(row["model"], row["versus"]): row for row in _rows(board, "win_rate") if row["metric"] == metric}
    tests = {(row["model"], row["versus"]): row for row in _rows(board, "dm") if row["metric"] == metric}
    if not wins:
        return ""
    head = "".join(f"<th title='{escape(model)}'>{number_}</th>" for number_, model in enumerate(models, start=1))
    body = ""
    for row_number, a in enumerate(models, start=1):
        cells = ""
        for b in models:
            if a == b:
                cells += "<td>-</td>"
                continue
            if (a, b) in values.same:
                cells += "<td class='same' title='identical forecasts'>same</td>"
                continue
            win, test = wins.get((a, b)), tests.get((a, b))
            p_value = None if test is None else test["p_value"]
            significant = p_value is not None and np.isfinite(p_value) and p_value < 0.05
            statistic = None if test is None else test["statistic"]
            cells += (
                f"<td title='{escape(a)} vs {escape(b)}: DM statistic {number(statistic, 3)}'>"
                f"{number(None if win is None else win['value'], 2)}<br>"
                f"<span class='{'dm strong' if significant else 'dm'}'>p {_p(p_value)}{'*' if significant else ''}"
                "</span></td>"
            )
        body += f"<tr><th>{row_number} {escape(a)}</th>{cells}</tr>"
    identical = (
        ""
        if uncertainty is None or not uncertainty.identical
        else " Same: identical forecasts ("
        + "; ".join(", ".join(group) for group in uncertainty.identical)
        + "; equal sums at every origin and quantile: nothing to compare)."
    )
    return (
        f"<h3>Pairwise ({metric.upper()})</h3><table class='pairwise'><tr><th>row model vs column</th>{head}</tr>"
        f"{body}</table>"
        "<p class='hint'>Columns are numbered as the rows. Top: win rate, the share of series where the row's "
        f"model has the lower per-series {metric.upper()} (ties count half). Below: p-value of the Diebold-Mariano "
        f"test on the per-window-origin {metric.upper()} differences (row minus column; the statistic, negative "
        "favouring the row, is in each cell's tooltip and in leaderboard.parquet), long-run variance over the lags "
        "at which multi-step windows overlap (Diebold &amp; Mariano 1995; Bartlett weights if not positive), "
        "Harvey-Leybourne-Newbold 1997 small-sample correction, Student t p-value; * p &lt; 0.05."
        f"{escape(identical)}</p>"
    )


def _p(value: float | None) -> str:
    """A p-value in at most 4 characters: 0.05, 0.6, &lt;1e-3."""
    if value is None or not np.isfinite(value):
        return "-"
    return "&lt;.001" if value < 0.001 else f"{value:.2g}"


def _figures(values: Comparison, lead_label: str) -> tuple[str, str]:
    """The comparison's two figures, each with the models it left off its scale: the primary metric's skill
    against seasonal naive by lead, every model (pooled convention), and each model's score per forecast origin
    (the fev convention's per-window score of the primary metric)."""
    skill, skill_scale = "<p>(no metrics by lead)</p>", None
    if values.skill_by_lead is not None:
        curves = values.skill_by_lead
        skill, skill_scale = report_plots.skill_by_lead_every_model(
            curves.leads, curves.skills, curves.metric, lead_label
        )
    sure = values.uncertainty
    by_origin, origin_scale = "<p>(fewer than two forecast origins: nothing to draw by origin)</p>", None
    if sure is not None and sure.per_origin and sure.n_origins >= 2:
        per_origin = {model: sure.per_origin[model] for model in values.models}
        origin_scale = report_plots.robust_scale([np.zeros(1)], {model: [v] for model, v in per_origin.items()})
        by_origin = report_plots.score_by_origin(sure.origins_us, per_origin, sure.metric.upper())
    return skill + off_scale_hint(skill_scale), by_origin + off_scale_hint(origin_scale)


def pairs_section(pairs: dict[str, Any]) -> str:
    """What every model was scored on and what was left out, per reason (the same for every model)."""
    if not pairs:
        return ""
    keys = ["pairs_scored", "left_out_actual_missing", "left_out_baseline_undefined", "left_out_model_nonfinite"]
    head = "".join(f"<th>{escape(key.replace('_', ' '))}</th>" for key in [*keys, "nonfinite_windows"])
    body = "".join(
        f"<tr><th>{escape(model)}</th>"
        + "".join(f"<td>{record.get(key, '-')}</td>" for key in [*keys, "nonfinite_windows"])
        + "</tr>"
        for model, record in pairs.items()
    )
    return f"<table><tr><th>model</th>{head}</tr>{body}</table>"


def off_scale_hint(scale: report_plots.Scale | None) -> str:
    """Beside a figure, the models it left off its scale (also named inside it)."""
    return f"<p class='hint off-scale'>{escape(scale.note().capitalize())}.</p>" if scale and scale.off else ""


def calibration_table(values: Comparison) -> str:
    """Each model's empirical coverage of each central interval, against the nominal (pooled convention)."""
    intervals = values.intervals
    if not intervals:
        return ""
    head = "".join(f"<th>{1 - 2 * low:.0%} (q{low:g}-q{high:g})</th>" for low, high in intervals)
    body = ""
    for model, coverage in values.coverage.items():
        cells = ""
        for (low, _), value in zip(intervals, coverage, strict=True):
            gap = "" if value is None else f" <span class='hint'>({value - (1 - 2 * low):+.3f})</span>"
            cells += f"<td>{number(value, 3)}{gap}</td>"
        body += f"<tr><th>{escape(model)}</th>{cells}</tr>"
    return (
        f"<table><tr><th>model</th>{head}</tr>{body}</table>"
        "<p class='hint'>Share of actuals inside each central interval (pooled), in brackets minus nominal. "
        "Seasonal naive is a point forecast (no interval), so it has no row.</p>"
    )
