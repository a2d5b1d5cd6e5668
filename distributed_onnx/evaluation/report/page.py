"""``report.html``: the one self-contained page a forecasting team reads after a backtest (works offline).

From top to bottom: the leaderboard of every model of the run (:mod:`.compare`: skill, intervals, pairwise tests,
pairs left out, skill by lead and calibration of each model), then for the first checkpoint its headline scores
against the seasonal-naive baseline, forecast fans of the windows the run picked (history, actuals, median, central
intervals), skill by lead, calibration of the intervals, a per-series table ranked by the primary metric (MASE, or
SQL without a median: the metric registry's choice, as every metric shown), each other checkpoint's
own scores, skill, calibration and series (folded), throughput, and provenance (every checkpoint's sha256 and path,
providers, versions, settings). Figures come from :mod:`distributed_onnx.evaluation.report.plots` (matplotlib,
inline SVG); the page has no external resource. The report reads no forecast part itself: the run hands it the few
:class:`FanWindow` it chose, so its cost does not grow with the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.report import compare as report_compare
from distributed_onnx.evaluation.report import furniture as report_furniture
from distributed_onnx.evaluation.report import plots as report_plots
from distributed_onnx.evaluation.report.covariates import covariates_section
from distributed_onnx.evaluation.report.page_values import PageValues, ReportValues, report_values
from distributed_onnx.evaluation.report.tables import SeriesValues, escape
from distributed_onnx.evaluation.report.variants import variants_section
from distributed_onnx.evaluation.scoring.findings import LeaderboardFindings
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.location import Location

REPORT = "report.html"


def write_report(  # noqa: PLR0913 - the run's products the page draws, each of its own kind
    output: Location,
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
) -> Location:
    """Write ``output/report.html`` and return its location: its values computed (:func:`.page_values.report_values`,
    whose docstring says what each argument gives), then drawn (:func:`draw_report`)."""
    values = report_values(
        summary,
        metrics,
        quantiles,
        fans,
        leaderboard,
        series,
        pair_scores=pair_scores,
        step_us=step_us,
        findings=findings,
    )
    return draw_report(output, values)


def draw_report(output: Location, values: ReportValues) -> Location:
    """Draw ``output/report.html`` from ``values`` (computed before, :func:`.page_values.report_values`): the page
    renders its sections and figures and computes nothing; returns its location."""
    summary, model, title = values.summary, values.model, values.title
    shown, compared = values.page, values.comparison
    label = lead_label(values.step_us)
    fans_drawn, figures, others_drawn = _checkpoint_sections(values.fans, shown, model, label)
    verdict = report_compare.verdict_line(compared) if compared is not None else ""
    comparison = []
    if compared is not None and compared.board.num_rows:
        comparison = report_compare.comparison_sections(compared, label)
    sections = [
        f"<h1>Backtest of {escape(title)}</h1>",
        f"<p class='lede'>{escape(_lede(summary, values.step_us))}</p>",
        verdict,
        *variants_section(values.findings, values.leaderboard),
        *shown.notes,
        *comparison,
        *covariates_section(summary, values.leaderboard, values.findings),
        f"<h2>{escape(model)}: scores against seasonal naive (pooled)</h2>",
        shown.first.headline,
        "<h2>Forecasts</h2>",
        fans_drawn,
        "<h2>Skill by lead</h2>",
        figures[0],
        "<h2>Calibration of the central intervals</h2>",
        figures[1],
        f"<h2>Series, ranked by {shown.primary.upper()}</h2>",
        shown.first.series,
        *others_drawn,
        "<h2>Throughput</h2>",
        shown.throughput,
        "<h2>Provenance</h2>",
        shown.provenance,
        "<details><summary>summary.json</summary><pre>"
        + escape(json.dumps(summary, indent=2, default=str))
        + "</pre></details>",
    ]
    return write_page(output, f"Backtest of {title}", sections)


def _checkpoint_sections(
    fans: Sequence[FanWindow], shown: PageValues, model: str, lead_label: str
) -> tuple[str, tuple[str, str], list[str]]:
    """The checkpoints' own sections, drawn from the record: the run's model's forecast fans, and each
    checkpoint's skill by lead (its primary metric against seasonal naive, and the skill of each skill metric
    among :func:`~..scoring.registry.per_checkpoint`'s) and calibration of the central intervals (figure and
    table). Returns the fans, the run's model's two figures (its sections are the page's own), and the folded
    details of every checkpoint after the first (headline, skill by lead, calibration, series): the leaderboard
    compares them all."""
    fans_drawn = _fans(fans, shown, model)
    drawn = []
    for name, values in [(model, shown.first), *shown.others]:
        curves, found = values.skill, values.calibration
        skill = (
            "<p>(no metrics by lead)</p>"
            if curves is None
            else report_plots.skill_by_lead(
                curves.leads,
                curves.model,
                curves.naive,
                name,
                lead_label,
                scored=curves.scored,
                skills=curves.skills,
            )
        )
        if found is None:
            calibration = "<p>(no central intervals: request quantiles q and 1 - q to score coverage)</p>"
        else:
            figure = report_plots.calibration(
                found.nominal,
                found.empirical,
                found.marks,
                [f"{n:.0%}" for n in found.nominal],
                per_series=found.per_series if found.n_series > 1 else (),
                by_lead=found.by_lead,
                lead_label=lead_label,
            )
            calibration = f"<div class='side'>{figure}{found.table}</div>{found.sampled}"
        drawn.append((skill, calibration))
    others = ["<h2>Every other checkpoint</h2>"] if shown.others else []
    for (name, values), (skill, calibration) in zip(shown.others, drawn[1:], strict=True):
        others.append(
            f"<details class='checkpoint'><summary>{escape(name)}: scores, skill by lead, calibration, series"
            "</summary>"
            + values.headline
            + "<h3>Skill by lead</h3>"
            + skill
            + "<h3>Calibration of the central intervals</h3>"
            + calibration
            + f"<h3>Series, ranked by {shown.primary.upper()}</h3>"
            + values.series
            + "</details>"
        )
    return fans_drawn, drawn[0], others


def write_page(output: Location, title: str, sections: Sequence[str]) -> Location:
    """``output/report.html``: ``sections`` (HTML) in the report's one page shell (styles, sorting script, no
    external resource). Shared by the backtest's report and live scoring's, so both read the same."""
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{report_furniture.CSS}</style></head><body>"
        + "\n".join(sections)
        + f"<script>{report_furniture.SORT_SCRIPT}</script></body></html>"
    )
    path = storage.join(output, REPORT)
    storage.write_bytes(path, page.encode())
    return path


def _lede(summary: dict[str, Any], step_us: int | None) -> str:
    resolved, windows = summary.get("resolved", {}), summary.get("windows", {})
    step = f" of {step_us // 60_000_000} min" if step_us else ""
    return (
        f"{windows.get('planned', '?')} windows over {resolved.get('series', '?')} series, horizon "
        f"{resolved.get('horizon', '?')} steps{step}, context {resolved.get('context_length', '?')} steps, "
        f"seasonality {resolved.get('seasonality', '?')} steps; data {summary.get('data', '?')}."
    )


def _fans(fans: Sequence[FanWindow], shown: PageValues, model: str) -> str:
    if not fans:
        return "<p>(no forecast windows were handed to the report)</p>"
    canvas = report_plots.FanCanvas()  # one figure for every fan: see its docstring
    figures = []
    for window in sorted(fans, key=lambda fan: fan.series_id):  # stable: the run's order within a series
        by_level = {round(float(level), 9): np.asarray(values, float) for level, values in window.quantiles.items()}
        bands = [
            (
                low,
                high,
                by_level[round(low, 9)],
                by_level[round(high, 9)],
                shown.clamped_bands[(low, high)],
            )
            for low, high in shown.clamped_bands  # the run's central intervals, widest first
            if round(low, 9) in by_level and round(high, 9) in by_level
        ]
        origin = datetime.fromtimestamp(window.origin_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M UTC")
        score = "" if window.mase is None else f", {window.scored_by.upper()} {window.mase:.3g}"
        fan = report_plots.Fan(
            f"{window.series_id} · {window.label} · origin {origin}{score}",
            window.origin_us,
            window.step_us,
            np.asarray(window.history, float),
            np.asarray(window.actual, float),
            bands,
            by_level.get(0.5),
            sorted(window.others.items()),
            model,
        )
        figures.append(
            f"<figure class='fan'><figcaption>{escape(fan.title)}</figcaption>{canvas.draw(fan)}"
            f"{_legend(report_plots.fan_legend(fan))}</figure>"
        )
    return "<div class='fans'>" + "".join(figures) + "</div>"


def _legend(entries: Sequence[report_plots.LegendEntry]) -> str:
    """A fan's legend as an HTML list: a swatch (a band's fill, or a solid or dashed line) and its label."""
    items = []
    for entry in entries:
        if entry.kind == "band":
            style = f"background:{entry.color};opacity:{entry.alpha:.2f}"
        else:
            line = {"dotted": "3px dotted", "dashed": "2px dashed"}.get(entry.kind, "2px solid")
            style = f"border-top:{line} {entry.color}"
        items.append(f"<li><i class='{entry.kind}' style='{style}'></i>{escape(entry.label)}</li>")
    return "<ul class='legend'>" + "".join(items) + "</ul>"


def lead_label(step_us: int | None) -> str:
    return "lead (steps ahead" + (f", {step_us // 60_000_000} min each)" if step_us else ")")
