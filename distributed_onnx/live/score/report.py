"""``report.html`` of ``distributed-onnx score``: live scoring read on the backtest report's own page and tables.

Nothing here draws a table of its own where the backtest's report has one: each group of checkpoints scored together
(:mod:`distributed_onnx.live.score.join`) gets the backtest report's comparison sections
(:mod:`distributed_onnx.evaluation.report.compare`: leaderboard with bootstrap intervals, pairwise tests, pairs left
out, skill by lead, calibration) and each checkpoint its headline table
(:mod:`distributed_onnx.evaluation.report.tables`), in the same page shell
(:func:`distributed_onnx.evaluation.report.page.write_page`), so a live number and a backtest number look alike and mean
the same. What is live only is the header (the log's span of request times, windows logged, scored, pending and not
placeable per model, forecasts the log dropped, each model's requests and failure rate by kind and the failures'
reasons: :mod:`.report_failures`) and, with ``--backtest``, the comparison with the backtest
(:mod:`distributed_onnx.live.score.versus_backtest`): each model's score over all leads against the backtest's bootstrap
interval, flagged when outside, and skill by lead, live against backtest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib import colormaps, rc_context

from distributed_onnx.evaluation.report import compare as report_compare
from distributed_onnx.evaluation.report import tables as report_tables
from distributed_onnx.evaluation.report.compare_values import comparison_values
from distributed_onnx.evaluation.report.page import lead_label, write_page
from distributed_onnx.evaluation.report.page_values import model_curves
from distributed_onnx.evaluation.report.plots import _RC, NAIVE_COLOR, _figure, _svg
from distributed_onnx.evaluation.report.tables import Scores, escape, number
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.live.score.report_failures import reasons_table, requests_table
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import central_intervals

if TYPE_CHECKING:
    from distributed_onnx.live.score.versus_backtest import VersusBacktest

_US_PER_MINUTE = 60_000_000
_NOT_PLACEABLE = ("no_start", "before_actuals", "off_grid", "actuals_not_at_resolution")
_PENDING = ("pending_actuals_not_arrived", "pending_series_not_in_actuals")


def write_live_report(
    output: Location,
    summary: dict[str, Any],
    metrics: pa.Table,
    leaderboard: pa.Table,
    versus: VersusBacktest | None = None,
    merged: Mapping[tuple[tuple[str, ...], int, tuple[float, ...], int], PairScores] | None = None,
    failures: pa.Table | None = None,
) -> Location:
    """Write ``output/report.html`` and return its location.

    ``merged``: each group's scores (by its key: checkpoints, horizon, quantiles, resolution), for the intervals'
    resampling, the verdict and the score by origin (:mod:`distributed_onnx.evaluation.scoring.uncertainty`); without
    them the leaderboards' own. ``failures``: the log's failures grouped by reason (``failures.parquet``,
    :mod:`.report_failures`)."""
    by_label = {
        (",".join(key[0]), int(key[1]), ",".join(format(q, "g") for q in key[2]), int(key[3])): scores
        for key, scores in (merged or {}).items()
    }
    sections = [
        f"<h1>Live scoring of {escape(summary.get('forecasts', '?'))}</h1>",
        f"<p class='lede'>{escape(_lede(summary))}</p>",
        *_notes(summary, versus),
        "<h2>Forecasts logged, per model</h2>",
        windows_table(summary),
        "<h2>Requests and failures, per model</h2>",
        requests_table(summary),
        "<h3>Why requests failed</h3>",
        reasons_table(failures),
    ]
    if versus is not None:
        sections += ["<h2>Live against the backtest</h2>", versus_section(versus)]
    unscored = []
    for group, group_metrics, group_board in _groups(metrics, leaderboard):
        if not group_board.num_rows:  # every window of the group was not placeable or is pending: nothing to show
            unscored.append(f"{group['scored_with'].replace(',', ', ')} (horizon {group['horizon']})")
            continue
        label = (str(group["scored_with"]), int(group["horizon"]), str(group["quantile_levels"]),
                 int(group["resolution_minutes"]))  # fmt: skip
        sections += _group_sections(group, group_metrics, group_board, summary, by_label.get(label))
    if unscored:  # said once for every such group: one line per group repeated the same sentence
        sections.append(
            f"<p class='hint'>No window scored yet for {escape('; '.join(unscored))}: not placeable or pending "
            "(the table of forecasts logged above).</p>"
        )
    if not metrics.num_rows:
        sections.append("<p>(no window has been scored yet: rerun when the actuals have arrived)</p>")
    sections.append(
        "<details><summary>summary.json</summary><pre>"
        + escape(json.dumps(summary, indent=2, default=str))
        + "</pre></details>"
    )
    return write_page(output, f"Live scoring of {summary.get('forecasts', '?')}", sections)


def _lede(summary: dict[str, Any]) -> str:
    span = summary.get("request_time") or {}
    when = f"requested from {span['first']} to {span['last']}" if span else "no forecast logged yet"
    return (
        f"Forecasts that `distributed-onnx serve` logged ({when}), joined with the actuals in "
        f"{summary.get('actuals', '?')} and scored by the backtest's own code: the same pairs rule, baselines, "
        "metrics and conventions, so these numbers read as a backtest's do, on the windows that were served."
    )


def _notes(summary: dict[str, Any], versus: VersusBacktest | None) -> list[str]:
    notes = [] if versus is None else list(versus.warnings)
    if versus is not None:
        for model, metrics in versus.flagged.items():
            notes.insert(
                0,
                f"FLAGGED: {model}'s live {', '.join(m.upper() for m in metrics)} lies outside its backtest's 95% "
                "bootstrap interval (below).",
            )
    if not notes:
        return []
    return ["<ul class='notes'>" + "".join(f"<li>{escape(note)}</li>" for note in notes) + "</ul>"]


def windows_table(summary: dict[str, Any]) -> str:
    """Per model: windows logged (one series of one request), scored, pending, not placeable by reason, dropped."""
    windows: dict[str, dict[str, int]] = summary.get("windows") or {}
    dropped: dict[str, dict[str, int]] = summary.get("dropped_by_the_log") or {}
    failed: dict[str, dict[str, int]] = summary.get("failed_by_the_shadows") or {}
    models = sorted(set(windows) | set(dropped) | set(failed))
    if not models:
        return "<p>(the log holds no forecast yet)</p>"
    # Two header rows (a group over its short columns): with each column's group repeated in its name, 13
    # columns scrolled sideways at 1280 px.
    top = "".join(f"<th rowspan='2'>{name}</th>" for name in ("model", "logged", "scored"))
    top += "<th colspan='2'>pending</th><th colspan='4'>not placeable</th><th rowspan='2'>dropped by the log</th>"
    top += "<th colspan='2'>shadow</th>"
    under = ["actuals not arrived", "series not in actuals", *(r.replace("_", " ") for r in _NOT_PLACEABLE)]
    under += ["failed", "NaN/inf"]
    body = ""
    totals = np.zeros(11, dtype=np.int64)
    for model in models:
        counts = windows.get(model, {})
        cells = [
            sum(counts.values()),
            counts.get("scored", 0),
            *(counts.get(key, 0) for key in _PENDING),
            *(counts.get(reason, 0) for reason in _NOT_PLACEABLE),
            sum((dropped.get(model) or {}).values()),
            (failed.get(model) or {}).get("failed", 0),
            (failed.get(model) or {}).get("nonfinite", 0),
        ]
        totals += np.asarray(cells, dtype=np.int64)
        body += f"<tr><th>{escape(model)}</th>" + "".join(f"<td>{value}</td>" for value in cells) + "</tr>"
    if len(models) > 1:
        body += "<tr><th>all models</th>" + "".join(f"<td>{value}</td>" for value in totals.tolist()) + "</tr>"
    return (
        f"<table class='fit'><tr>{top}</tr><tr>"
        + "".join(f"<th>{escape(name)}</th>" for name in under)
        + f"</tr>{body}</table><p class='hint'>A window is one series of one request, for one model. Pending "
        "windows are looked at again on the next run; not placeable ones are never scored: no <code>start</code> "
        "in the request (no timestamps), an origin before the series' first actual, or off its grid. Dropped: "
        "forecasts the service could not write to the log (its own record, by reason, in summary.json). Shadow "
        "failed: windows a shadow model did not forecast; shadow NaN/inf: windows it forecast NaN or inf for "
        "(logged, left out of its pairs).</p>"
    )


def versus_section(versus: VersusBacktest) -> str:
    """Each compared model over all leads against the backtest's interval (flag), then skill by lead."""
    if not versus.table.num_rows:
        return "<p>(no served model could be compared with the backtest yet: see the notes above)</p>"
    overall = versus.table.filter(pc.field("lead").is_null()).to_pylist()
    head = (
        "<tr><th>model</th><th>metric</th><th>live</th><th>backtest <span class='hint'>[95%]</span></th>"
        "<th>live skill</th><th>backtest skill</th><th>live pairs</th><th>backtest pairs</th><th>flag</th></tr>"
    )
    body = ""
    for row in overall:
        flag = f"OUTSIDE ({row['direction']})" if row["outside"] else ("inside" if row["outside"] is False else "-")
        interval = (
            f"{number(row['backtest'])} <span class='hint'>[{number(row['backtest_ci_low'], 3)}, "
            f"{number(row['backtest_ci_high'], 3)}]</span>"
        )
        body += (
            f"<tr><th>{escape(row['model'])}</th><td>{escape(row['metric'].upper())}</td>"
            f"<td>{number(row['live'])}</td><td>{interval}</td><td>{number(row['live_skill'], 3)}</td>"
            f"<td>{number(row['backtest_skill'], 3)}</td><td>{row['live_n'] or '-'}</td>"
            f"<td>{row['backtest_n'] or '-'}</td><td>{flag}</td></tr>"
        )
    hint = (
        f"<p class='hint'>Backtest: {escape(versus.backtest)}. Pooled convention, over all leads; skill = 1 - "
        "model / seasonal naive on the same pairs. Flag: the live score outside the backtest's 95% bootstrap "
        "interval (leaderboard.parquet), overall rather than by lead (why: "
        "distributed_onnx/live/score/versus_backtest.py). By lead: live_vs_backtest.parquet."
        f"{_series_caveat(versus.backtest_series, versus.backtest_resampling)}</p>"
    )
    return f"<table>{head}{body}</table>{hint}" + skill_by_lead_versus(versus.table)


def _series_caveat(series: int | None, resampling: str | None = None) -> str:
    """What the backtest's interval rests on: its leaderboard's resampling (series, blocks of window origins, or
    none); a leaderboard that does not record it resampled series, so one series gave it no width."""
    if resampling == "origin_blocks":
        return (
            f" The backtest's intervals resample blocks of its window origins ({series or 'few'} series: too few "
            "to resample)."
        )
    if resampling == "none":
        return (
            " The backtest has no interval (too few series and too few window origins to resample): nothing can "
            "be flagged; a backtest with more windows (distributed-onnx backtest --n-windows) would give one."
        )
    if series is None:
        return ""
    if series == 1:
        return (
            " The backtest scored one series: its interval has no width, so a live score on other windows lies "
            "outside it whenever it differs at all."
        )
    return f" The backtest's intervals resample its {series} series."


def skill_by_lead_versus(table: pa.Table) -> str:
    """Skill against seasonal naive by lead, live (solid) and backtest (dashed), one colour per model."""
    by_lead = table.filter(pc.field("lead").is_valid())
    metrics = list(dict.fromkeys(by_lead["metric"].to_pylist()))
    if not metrics:
        return ""
    rows = by_lead.to_pylist()
    models = list(dict.fromkeys(row["model"] for row in rows))
    palette = colormaps["tab10"]
    with rc_context(_RC):
        figure, axes = _figure(10.5, 4.0, columns=len(metrics), bottom_in=1.1)
        for axis, metric in zip(axes, metrics, strict=True):
            for index, model in enumerate(models):
                chosen = [row for row in rows if row["model"] == model and row["metric"] == metric]
                leads = [row["lead"] for row in chosen]
                for key, style, label in (("live_skill", "-", "live"), ("backtest_skill", "--", "backtest")):
                    values = [np.nan if row[key] is None else row[key] for row in chosen]
                    axis.plot(leads, values, style, color=palette(index % 10), lw=1.4, label=f"{model} {label}")
            axis.axhline(0, color=NAIVE_COLOR, lw=1, label="seasonal naive (skill 0)")
            axis.set_ylim(top=1)
            axis.set_xlabel("lead (steps ahead)")
            axis.set_ylabel(f"1 - {metric.upper()} / naive {metric.upper()}")
            axis.set_title(f"{metric.upper()} skill by lead: live (solid), backtest (dashed)", loc="left")
            axis.legend(
                fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncols=2, frameon=False
            )  # off the curves
    return _svg(figure)


def _groups(metrics: pa.Table, leaderboard: pa.Table) -> list[tuple[dict[str, Any], pa.Table, pa.Table]]:
    """Each group of checkpoints scored together: its key columns, its metrics rows and its leaderboard rows."""
    if not metrics.num_rows:
        return []
    names = ["scored_with", "horizon", "quantile_levels", "resolution_minutes"]
    keys = metrics.select(names).group_by(names).aggregate([]).sort_by([(name, "ascending") for name in names])
    found = []
    for group in keys.to_pylist():
        mask = None
        for name in names:
            condition = pc.field(name) == group[name]
            mask = condition if mask is None else mask & condition
        found.append((group, metrics.filter(mask), leaderboard.filter(mask)))
    return found


def _group_sections(
    group: dict[str, Any], metrics: pa.Table, board: pa.Table, summary: dict[str, Any], pair_scores: PairScores | None
) -> list[str]:
    checkpoints = str(group["scored_with"]).split(",")
    models = [*checkpoints, *BASELINES]
    scores = Scores(metrics)
    step_us = int(group["resolution_minutes"]) * _US_PER_MINUTE
    quantiles = [float(q) for q in str(group["quantile_levels"]).split(",") if q]
    pairs: dict[str, Any] = next(
        (
            entry["left_out"]
            for entry in summary.get("pairs") or []
            if entry["scored_with"] == group["scored_with"] and entry["horizon"] == group["horizon"]
        ),
        {},
    )
    title = (
        f"Scored together: {', '.join(checkpoints)} (horizon {group['horizon']} steps of "
        f"{group['resolution_minutes']} min, quantiles {group['quantile_levels']})"
    )
    curves = model_curves(scores, models, central_intervals(quantiles))
    compared = comparison_values(board, models, metrics, curves, pairs, pair_scores=pair_scores, step_us=step_us)
    sections = [
        f"<h2>{escape(title)}</h2>",
        report_compare.verdict_line(compared),
        *report_compare.comparison_sections(compared, lead_label(step_us), heading="h3"),
    ]
    for model in checkpoints:
        sections += [
            f"<h3>{escape(model)}: scores against seasonal naive (pooled)</h3>",
            report_tables.headline(scores, model),
        ]
    return sections
