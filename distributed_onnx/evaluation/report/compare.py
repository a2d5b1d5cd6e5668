"""The report's comparison of the run's models: leaderboard, pairs left out, skill by lead and calibration of each.

Every model of a run (checkpoints and the two baselines) is scored on the same pairs, so these numbers
compare like with like. Every number names its convention: ``pooled`` (sums over every pair, the metrics'
default), ``fev`` (per window, then the mean over windows, as fev 0.10.0) or ``fev skill`` (1 - geometric mean
over series of per-series ratios against seasonal naive, as ``fev.analysis.leaderboard``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib import colormaps, rc_context

from distributed_onnx.evaluation.report import plots as report_plots
from distributed_onnx.evaluation.report.plots import _RC, NAIVE_COLOR, _figure, _svg
from distributed_onnx.evaluation.report.tables import Scores, escape, levels_of, number
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.leaderboard import N_RESAMPLES, SEED
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES
from distributed_onnx.evaluation.scoring.registry import has_median, primary, ranking, reported
from distributed_onnx.evaluation.scoring.uncertainty import Uncertainty
from distributed_onnx.model.quantiles import central_intervals


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


def verdict_line(uncertainty: Uncertainty | None, board: pa.Table) -> str:
    """The page's first finding: the best model, its margin over the next with an interval and the DM p-value."""
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


def leaderboard_section(
    board: pa.Table, models: Sequence[str], metrics: pa.Table, uncertainty: Uncertainty | None = None
) -> str:
    """Per model: skill against seasonal naive and each global metric with its 95% interval; then pairs."""
    metric_rows = {(row["model"], row["metric"]): row for row in _rows(board, "metric")}
    skill_rows = {
        (row["model"], row["metric"]): row for row in _rows(board, "skill") if row["versus"] == SEASONAL_NAIVE
    }
    # Against seasonal quantiles: the skill of the metric that ranks probabilistic forecasts (the primary without
    # the median: SQL), the leaderboard's other skills being against seasonal naive.
    probabilistic_metric = primary(has_median=False)
    probabilistic = {
        row["model"]: row
        for row in _rows(board, "skill")
        if row["versus"] == SEASONAL_QUANTILES and row["metric"] == probabilistic_metric
    }
    # Filtered in Arrow first: the table holds a few rows per series (millions at 100,000 series), and converting
    # every row to Python took most of the report's time there (benchmarks/results/time_to_results.md).
    global_fev = (pc.field("convention") == "fev") & (pc.field("scope") == "global")
    fev = {
        (row["model"], row["metric"]): row["value"]
        for row in metrics.filter(global_fev).select(["model", "metric", "value"]).to_pylist()
    }
    shown = [metric for metric in reported() if any(key[1] == metric for key in metric_rows)]
    rank_metric = primary(has_median(levels_of(metrics)))
    skills = [metric.name for metric in ranking()]  # each metric that can rank: the run's primary among them
    ranked = sorted(models, key=lambda m: -(skill_rows.get((m, rank_metric)) or {"value": -np.inf})["value"])
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
    return table + hint + _pairwise(board, ranked, rank_metric, uncertainty)


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


def _pairwise(board: pa.Table, models: Sequence[str], metric: str, uncertainty: Uncertainty | None = None) -> str:
    """A matrix, row model against column model: the win rate over the p-value, columns numbered as the rows.

    Numbered columns, one short line per value and the DM statistic in the cell's tooltip: the table fits a
    1280 px window at any number of models (with the models' names as column heads and the test spelled out in
    each cell, four models scrolled sideways and wrapped each cell over five lines).
    """
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
            if uncertainty is not None and uncertainty.same_forecasts(a, b):
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


def by_origin(uncertainty: Uncertainty | None, models: Sequence[str]) -> str:
    """Each model's score per forecast origin (the fev convention's per-window score of the primary metric)."""
    if uncertainty is None or not uncertainty.per_origin or uncertainty.n_origins < 2:
        return "<p>(fewer than two forecast origins: nothing to draw by origin)</p>"
    curves = {model: uncertainty.per_origin[model] for model in models}
    scale = report_plots.robust_scale([np.zeros(1)], {model: [values] for model, values in curves.items()})
    metric = uncertainty.metric.upper()
    return report_plots.score_by_origin(uncertainty.origins_us, curves, metric) + off_scale_hint(scale)


def pairs_section(summary: dict[str, Any]) -> str:
    """What every model was scored on and what was left out, per reason (the same for every model)."""
    pairs = summary.get("pairs") or {}
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


def skill_by_lead(scores: Scores, models: Sequence[str], lead_label: str) -> str:
    """The primary metric's skill against seasonal naive by lead, one line per model (pooled convention)."""
    metric = scores.primary
    reference = scores.by_lead(SEASONAL_NAIVE, metric)
    if reference is None:
        return "<p>(no metrics by lead)</p>"
    leads, naive = reference
    palette = colormaps["tab10"]
    skills: dict[str, tuple[int, np.ndarray]] = {}
    for index, model in enumerate(m for m in models if m != SEASONAL_NAIVE):
        found = scores.by_lead(model, metric)
        if found is not None:
            skills[model] = (index, registry.skill(found[1], naive))
    # A model far off (skill -370) would flatten every other curve: it is left off the scale and named.
    scale = report_plots.robust_scale([np.array([0.0, 1.0])], {model: [skill] for model, (_, skill) in skills.items()})
    with rc_context(_RC):
        height_in, bottom_in, anchor = report_plots.legend_below(len(skills) + 1, 2.58)
        figure, (axis,) = _figure(10.5, height_in, bottom_in=bottom_in)
        for model, (index, skill) in skills.items():
            label = model + (" (off the scale)" if model in scale.off else "")
            axis.plot(leads, skill, color=palette(index % 10), lw=1.5, label=label)
        axis.axhline(0, color=NAIVE_COLOR, lw=1, label="seasonal naive (skill 0)")
        axis.set_ylim(scale.low, 1)
        report_plots.mark_off_scale(axis, scale)
        axis.set_xlabel(lead_label)
        axis.set_ylabel(f"1 - {metric.upper()} / naive {metric.upper()}")
        axis.set_title(f"{metric.upper()} skill by lead, every model (pooled; higher is better)", loc="left")
        # Below the axes, never on a curve: the legend's place does not depend on the data.
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, anchor), ncols=4, frameon=False)
    return _svg(figure) + off_scale_hint(scale)


def off_scale_hint(scale: report_plots.Scale) -> str:
    """Beside a figure, the models it left off its scale (also named inside it)."""
    return f"<p class='hint off-scale'>{escape(scale.note().capitalize())}.</p>" if scale.off else ""


def calibration_table(scores: Scores, models: Sequence[str], quantiles: Sequence[float]) -> str:
    """Each model's empirical coverage of each central interval, against the nominal (pooled convention)."""
    intervals = central_intervals(quantiles)
    if not intervals:
        return ""
    head = "".join(f"<th>{1 - 2 * low:.0%} (q{low:g}-q{high:g})</th>" for low, high in intervals)
    body = ""
    for model in models:
        if model == SEASONAL_NAIVE:  # a point forecast: every quantile is its one value, so no interval to check
            continue
        cells = ""
        for low, _ in intervals:
            value = scores.value(model, "coverage", low)
            gap = "" if value is None else f" <span class='hint'>({value - (1 - 2 * low):+.3f})</span>"
            cells += f"<td>{number(value, 3)}{gap}</td>"
        body += f"<tr><th>{escape(model)}</th>{cells}</tr>"
    return (
        f"<table><tr><th>model</th>{head}</tr>{body}</table>"
        "<p class='hint'>Share of actuals inside each central interval (pooled), in brackets minus nominal. "
        "Seasonal naive is a point forecast (no interval), so it has no row.</p>"
    )
