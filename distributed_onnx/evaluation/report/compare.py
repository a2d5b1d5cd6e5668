"""The report's comparison of the run's models: leaderboard, pairs left out, skill by lead and calibration of each.

Every model of a run (checkpoints and the two baselines) is scored on the same pairs, so these numbers
compare like with like. Every number names its convention: ``pooled`` (sums over every pair, the metrics'
default), ``fev`` (per window, then the mean over windows, as fev 0.10.0) or ``fev skill`` (1 - geometric mean
over series of per-series ratios against seasonal naive, as ``fev.analysis.leaderboard``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib import colormaps, rc_context

from distributed_onnx.evaluation.report.plots import _RC, NAIVE_COLOR, _figure, _svg
from distributed_onnx.evaluation.report.tables import Scores, escape, number
from distributed_onnx.evaluation.scoring.leaderboard import N_RESAMPLES, SEED
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE, SEASONAL_QUANTILES
from distributed_onnx.evaluation.scoring.registry import reported
from distributed_onnx.model.quantiles import central_intervals

_METRICS = reported()


def _rows(board: pa.Table, kind: str) -> list[dict[str, Any]]:
    return [row for row in board.to_pylist() if row["kind"] == kind]


def _interval(row: dict[str, Any] | None, digits: int = 4) -> str:
    if row is None:
        return "-"
    value = number(row["value"], digits)
    if row["ci_low"] is None or not np.isfinite(row["ci_low"]):
        return value
    return f"{value} <span class='hint'>[{number(row['ci_low'], 3)}, {number(row['ci_high'], 3)}]</span>"


def leaderboard_section(board: pa.Table, models: Sequence[str], metrics: pa.Table) -> str:
    """Per model: skill against seasonal naive and each global metric with its 95% interval; then pairs."""
    metric_rows = {(row["model"], row["metric"]): row for row in _rows(board, "metric")}
    skill_rows = {
        (row["model"], row["metric"]): row for row in _rows(board, "skill") if row["versus"] == SEASONAL_NAIVE
    }
    probabilistic = {
        row["model"]: row
        for row in _rows(board, "skill")
        if row["versus"] == SEASONAL_QUANTILES and row["metric"] == "sql"
    }
    # Filtered in Arrow first: the table holds a few rows per series (millions at 100,000 series), and converting
    # every row to Python took most of the report's time there (benchmarks/results/time_to_results.md).
    global_fev = (pc.field("convention") == "fev") & (pc.field("scope") == "global")
    fev = {
        (row["model"], row["metric"]): row["value"]
        for row in metrics.filter(global_fev).select(["model", "metric", "value"]).to_pylist()
    }
    shown = [metric for metric in _METRICS if any(key[1] == metric for key in metric_rows)]
    rank_metric = "mase" if "mase" in shown else "sql"
    ranked = sorted(models, key=lambda m: -(skill_rows.get((m, rank_metric)) or {"value": -np.inf})["value"])
    head = "".join(f"<th>{m.upper()} skill<br><span class='hint'>fev skill</span></th>" for m in ("mase", "sql"))
    head += "<th>SQL skill vs seasonal quantiles<br><span class='hint'>fev skill</span></th>"
    head += "".join(f"<th>{m.upper()}<br><span class='hint'>pooled [95%]</span></th>" for m in shown)
    head += "".join(f"<th>{m.upper()}<br><span class='hint'>fev</span></th>" for m in shown)
    body = ""
    for model in ranked:
        cells = "".join(f"<td>{_interval(skill_rows.get((model, m)), 3)}</td>" for m in ("mase", "sql"))
        cells += f"<td>{_interval(probabilistic.get(model), 3)}</td>"
        cells += "".join(f"<td>{_interval(metric_rows.get((model, m)))}</td>" for m in shown)
        cells += "".join(f"<td>{number(fev.get((model, m)))}</td>" for m in shown)
        body += f"<tr><th>{escape(model)}</th>{cells}</tr>"
    table = f"<table><tr><th>model</th>{head}</tr>{body}</table>"
    hint = (
        "<p class='hint'>Every model on the same (window, lead) pairs. Skill: 1 - geometric mean over series of "
        "model/seasonal-naive per-series ratios (clipped to [0.01, 100]), as fev computes skill; above 0 beats "
        f"the naive. Intervals: 95% percentile bootstrap over series, {N_RESAMPLES} resamples, seed {SEED}. "
        "Pooled: sums over every pair; fev: each window origin scored, then the mean over windows.</p>"
    )
    return table + hint + _pairwise(board, ranked, rank_metric)


def _pairwise(board: pa.Table, models: Sequence[str], metric: str) -> str:
    wins = {(row["model"], row["versus"]): row for row in _rows(board, "win_rate") if row["metric"] == metric}
    tests = {(row["model"], row["versus"]): row for row in _rows(board, "dm") if row["metric"] == metric}
    if not wins:
        return ""
    head = "".join(f"<th>vs {escape(model)}</th>" for model in models)
    body = ""
    for a in models:
        cells = ""
        for b in models:
            if a == b:
                cells += "<td>-</td>"
                continue
            win, test = wins.get((a, b)), tests.get((a, b))
            p_value = None if test is None else test["p_value"]
            star = " *" if p_value is not None and np.isfinite(p_value) and p_value < 0.05 else ""
            cells += (
                f"<td>{number(None if win is None else win['value'], 3)}"
                f"<span class='hint'> DM {number(None if test is None else test['statistic'], 3)}, "
                f"p {number(p_value, 2)}{star}</span></td>"
            )
        body += f"<tr><th>{escape(a)}</th>{cells}</tr>"
    return (
        f"<h3>Pairwise ({metric.upper()})</h3><table><tr><th>model</th>{head}</tr>{body}</table>"
        "<p class='hint'>Win rate: share of series where the row's model has the lower per-series "
        f"{metric.upper()} (ties count half). DM: Diebold-Mariano statistic on the per-window-origin "
        f"{metric.upper()} differences (row minus column; negative favours the row), long-run variance over the "
        "lags at which multi-step windows overlap (Diebold & Mariano 1995; Bartlett weights if not positive), "
        "Harvey-Leybourne-Newbold 1997 small-sample correction, Student t p-value; * p &lt; 0.05.</p>"
    )


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
    """MASE (or SQL) skill against seasonal naive by lead, one line per model (pooled convention)."""
    metric = "mase" if scores.by_lead(SEASONAL_NAIVE, "mase") is not None else "sql"
    reference = scores.by_lead(SEASONAL_NAIVE, metric)
    if reference is None:
        return "<p>(no metrics by lead)</p>"
    leads, naive = reference
    palette = colormaps["tab10"]
    with rc_context(_RC):
        figure, (axis,) = _figure(10.5, 3.4)
        for index, model in enumerate(m for m in models if m != SEASONAL_NAIVE):
            found = scores.by_lead(model, metric)
            if found is None:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                axis.plot(leads, 1 - found[1] / naive, color=palette(index % 10), lw=1.5, label=model)
        axis.axhline(0, color=NAIVE_COLOR, lw=1, label="seasonal naive (skill 0)")
        axis.set_ylim(top=1)
        axis.set_xlabel(lead_label)
        axis.set_ylabel(f"1 - {metric.upper()} / naive {metric.upper()}")
        axis.set_title(f"{metric.upper()} skill by lead, every model (pooled; higher is better)", loc="left")
        axis.legend(fontsize=8, loc="lower left", ncols=3)
    return _svg(figure)


def calibration_table(scores: Scores, models: Sequence[str], quantiles: Sequence[float]) -> str:
    """Each model's empirical coverage of each central interval, against the nominal (pooled convention)."""
    intervals = central_intervals(quantiles)
    if not intervals:
        return ""
    head = "".join(f"<th>{1 - 2 * low:.0%} (q{low:g}-q{high:g})</th>" for low, high in intervals)
    body = ""
    for model in models:
        cells = ""
        for low, _ in intervals:
            value = scores.value(model, "coverage", low)
            gap = "" if value is None else f" <span class='hint'>({value - (1 - 2 * low):+.3f})</span>"
            cells += f"<td>{number(value, 3)}{gap}</td>"
        body += f"<tr><th>{escape(model)}</th>{cells}</tr>"
    return (
        f"<table><tr><th>model</th>{head}</tr>{body}</table>"
        "<p class='hint'>Share of actuals inside each central interval (pooled), in brackets minus nominal.</p>"
    )
