"""The report's covariates section: each covariate vintaged or known, what the vintages left missing, the age
of what the model saw per lead, and (``--compare-realized``) the leak: the gap to the realized covariates and
its Diebold-Mariano p-value. Drawn from ``summary.json``'s ``covariates`` and the leaderboard's findings only
(:mod:`..scoring.findings`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from distributed_onnx.evaluation.report.tables import escape, number
from distributed_onnx.evaluation.scoring.findings import LeaderboardFindings


def covariates_section(
    summary: dict[str, Any], leaderboard: pa.Table | None, findings: LeaderboardFindings | None
) -> list[str]:
    """Nothing for a run without covariates; else a heading, the per-covariate table and the leak."""
    record = summary.get("covariates") or {}
    columns = record.get("columns") or {}
    if not columns:
        return []
    rows = []
    for name, entry in columns.items():
        missing = entry.get("missing_by_lead")
        found = entry.get("found_by_lead")
        ages = entry.get("age_median_hours_by_lead")
        shown_missing = "-" if missing is None else f"{sum(missing)} of {sum(missing) + sum(found or [])}"
        shown_ages = "-" if not ages else ", ".join(number(age, 3) for age in ages)
        source = (
            "vintaged (as known at each cutoff)" if entry["source"] == "vintaged" else "known exactly (input table)"
        )
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{escape(source)}</td><td>{escape(entry['role'])}</td>"
            f"<td>{escape(shown_missing)}</td><td>{escape(shown_ages)}</td></tr>"
        )
    latency = record.get("latency_minutes")
    lede = (
        "A covariate taken as known exactly is fed as its realized future: a perfect-foresight backtest for it."
        if latency is None
        else f"Vintages read as of each cutoff minus {latency} minutes; the others are fed as known exactly."
    )
    parts = [
        "<h2>Covariates</h2>",
        f"<p>{escape(lede)}</p>",
        "<table><thead><tr><th>covariate</th><th>source</th><th>role</th><th>horizon steps missing</th>"
        "<th>median age (h) per lead</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>",
    ]
    shown = leaderboard is not None and leaderboard.num_rows and findings is not None
    gaps = (findings.realized_comparison or []) if shown and findings is not None else []
    if gaps:
        lines = "".join(
            f"<tr><td>{escape(gap['model'])}</td><td>{escape(gap['metric'])}</td><td>{number(gap['as_of'])}</td>"
            f"<td>{number(gap['realized_value'])}</td><td>{number(gap['gap'])}</td>"
            f"<td>{number(None if gap['gap_share'] is None else 100 * gap['gap_share'], 3)}%</td>"
            f"<td>{number(gap['dm_p_value'], 3)}</td></tr>"
            for gap in gaps
        )
        parts += [
            "<h3>The leak: as known at the cutoff vs realized covariates</h3>",
            "<table class='leak'><thead><tr><th>model</th><th>metric</th><th>as of cutoff</th><th>realized</th>"
            "<th>gap</th><th>overstated by</th><th>DM p-value</th></tr></thead><tbody>" + lines + "</tbody></table>",
        ]
    return parts
