"""The report's tables and page furniture: scores indexed from the metrics table, headline, per-series ranking,
throughput, provenance and settings, the CSS and the sorting script (see :mod:`.page`)."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx.evaluation.merge import NAIVE_MODEL

#: Series beyond this many are shown as the best and worst halves of it (all of them are in metrics.parquet).
MAX_TABLE_SERIES = 200
_HEADLINE_METRICS = ("mase", "wql", "mae", "rmse", "sql")


class Scores:
    """The long metrics table indexed by scope: ``value(model, metric, quantile=None, series=None)``, by lead."""

    def __init__(self, metrics: pa.Table) -> None:
        self.cells: dict[tuple[str, str, str | None, float | None], float] = {}
        self.counts: dict[tuple[str, str | None], int] = {}
        leads: dict[tuple[str, str, float | None], list[tuple[int, float]]] = defaultdict(list)
        self.series_ids: list[str] = []
        for row in metrics.to_pylist():
            if row.get("convention", "pooled") != "pooled":  # fev and count rows: the comparison section's
                continue
            quantile = None if row["quantile"] is None else round(float(row["quantile"]), 9)
            if row["scope"] == "lead":
                leads[(row["model"], row["metric"], quantile)].append((int(row["lead"]), float(row["value"])))
                continue
            series = row["series_id"] if row["scope"] == "series" else None
            self.cells[(row["model"], row["metric"], series, quantile)] = float(row["value"])
            if row["metric"] == "mae":
                self.counts[(row["model"], series)] = int(row["n"])
            if series is not None and row["metric"] == "mae" and series not in self.series_ids:
                self.series_ids.append(series)
        self.leads = {key: sorted(points) for key, points in leads.items()}
        self.max_lead = max((lead for points in leads.values() for lead, _ in points), default=0)

    def value(self, model: str, metric: str, quantile: float | None = None, series: str | None = None) -> float | None:
        key = (model, metric, series, None if quantile is None else round(quantile, 9))
        return self.cells.get(key)

    def by_lead(self, model: str, metric: str, quantile: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Values on the common grid of leads 1..max (NaN where this model has no value: no scored pair)."""
        points = self.leads.get((model, metric, None if quantile is None else round(quantile, 9)))
        if not points:
            return None
        values = np.full(self.max_lead, np.nan)
        for lead, value in points:
            values[lead - 1] = value
        return np.arange(1, self.max_lead + 1, dtype=float), values


def escape(value: Any) -> str:
    return html.escape(str(value))


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.{digits}g}"


def skill_value(model: float | None, naive: float | None) -> float | None:
    return None if model is None or not naive else 1.0 - model / naive


def notes(summary: dict[str, Any]) -> list[str]:
    notes = [str(note) for note in summary.get("notes") or []]
    for item in summary.get("quantile_clamping") or []:
        notes.append(
            f"Quantile {item['requested']:g} lies outside the checkpoint's native range: "
            f"it is forecast as {item['served_by']:g} (intervals using it are marked clamped)."
        )
    if not notes:
        return []
    return ["<ul class='notes'>" + "".join(f"<li>{escape(note)}</li>" for note in notes) + "</ul>"]


def headline(scores: Scores, model: str) -> str:
    rows = []
    for metric in _HEADLINE_METRICS:
        ours, naive = scores.value(model, metric), scores.value(NAIVE_MODEL, metric)
        if ours is None:
            continue
        skill = skill_value(ours, naive)
        rows.append(
            f"<tr><th>{metric.upper()}</th><td>{number(ours)}</td><td>{number(naive)}</td>"
            f"<td>{number(skill, 3)}</td></tr>"
        )
    return (
        "<table><tr><th>metric</th><th>model</th><th>seasonal naive</th><th>skill (1 - model/naive)</th></tr>"
        + "".join(rows)
        + "</table><p class='hint'>Lower is better for every metric; skill above 0 beats the baseline. "
        "Definitions: the docstrings of distributed_onnx/evaluation/scoring/metrics.py.</p>"
    )


def series_table(scores: Scores, model: str) -> str:
    rows = []
    for series in scores.series_ids:
        mase, naive_mase = scores.value(model, "mase", series=series), scores.value(NAIVE_MODEL, "mase", series=series)
        wql, naive_wql = scores.value(model, "wql", series=series), scores.value(NAIVE_MODEL, "wql", series=series)
        rows.append(
            (
                series,
                mase,
                naive_mase,
                skill_value(mase, naive_mase),
                wql,
                naive_wql,
                skill_value(wql, naive_wql),
                scores.value(model, "mae", series=series),
                scores.counts.get((model, series)),
            )
        )
    rows.sort(key=lambda row: (row[1] is None, row[1] if row[1] is not None else 0.0))
    note = ""
    if len(rows) > MAX_TABLE_SERIES:
        half = MAX_TABLE_SERIES // 2
        note = (
            f"<p class='hint'>{len(rows)} series: the {half} best and {half} worst by MASE (all: metrics.parquet).</p>"
        )
        rows = rows[:half] + rows[-half:]
    header = [
        "rank",
        "series",
        "MASE",
        "MASE naive",
        "MASE skill",
        "WQL",
        "WQL naive",
        "WQL skill",
        "MAE",
        "scored pairs",
    ]
    body = "".join(
        f"<tr><td>{rank}</td><th>{escape(row[0])}</th>"
        + "".join(f"<td>{number(v)}</td>" for v in row[1:8])
        + f"<td>{row[8] if row[8] is not None else '-'}</td></tr>"
        for rank, row in enumerate(rows, start=1)
    )
    head = "".join(f"<th>{name}</th>" for name in header)
    return f"{note}<table class='sortable'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>" + (
        "<p class='hint'>Click a column to sort. Skill = 1 - model/naive.</p>"
    )


def _kv_table(items: dict[str, Any]) -> str:
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in items.items() if v is not None)
    return f"<table class='kv'>{cells}</table>"


def _providers(actors: Sequence[dict[str, Any]]) -> str:
    chains = sorted({", ".join(actor.get("providers", [])) for actor in actors})
    return "; ".join(chains) if chains else "-"


def throughput(summary: dict[str, Any]) -> str:
    timing, windows, parts = summary.get("timing", {}), summary.get("windows", {}), summary.get("parts", {})
    actors = summary.get("actors") or []
    items: dict[str, Any] = {
        "windows per second (dispatch)": number(timing.get("windows_per_s")),
        "windows planned / run now / done before / skipped / failed": " / ".join(
            str(windows.get(key, "-"))
            for key in ("planned", "run_now", "done_before", "skipped_context_coverage", "failed")
        ),
        "parts planned / done before / retried / failed, actors lost": " / ".join(
            str(parts.get(key, "-")) for key in ("planned", "done_before", "retried", "failed")
        )
        + f", {parts.get('actors_lost', '-')}",
        "actors (providers)": f"{len(actors)} ({_providers(actors)})",
        "dispatch / total / first forecast (s)": " / ".join(
            number(timing.get(key), 3) for key in ("dispatch_s", "total_s", "first_forecast_s")
        ),
        "driver CPU: until the report / dispatch (s)": " / ".join(
            number(timing.get(key), 3) for key in ("driver_cpu_s", "driver_cpu_dispatch_s")
        ),
    }
    resume = summary.get("resume") or {}
    if resume.get("resumed"):
        items["resumed"] = f"{resume.get('parts_done_before', '?')} parts were done before this run"
    for number_, record in enumerate(summary.get("computed_by") or [], start=1):
        items[f"computed by run {number_}"] = (
            f"{record.get('windows', '?')} windows on {record.get('actors', '?')} actors "
            f"({'; '.join(record.get('providers') or []) or '-'}) at {number(record.get('windows_per_s'))} "
            f"windows/s, finished {record.get('finished_at', '?')}"
        )
    return _kv_table(items)


def provenance(summary: dict[str, Any]) -> str:
    versions = summary.get("versions") or {}
    items: dict[str, Any] = {
        "model": summary.get("model"),
        "checkpoint": summary.get("checkpoint"),
        "checkpoint sha256": summary.get("checkpoint_sha256") or "(not recorded in the metadata)",
        "data": summary.get("data"),
        "run fingerprint": summary.get("run_fingerprint"),
        "providers": _providers(summary.get("actors") or []),
        **{f"{name} version": version for name, version in versions.items()},
    }
    return _kv_table(items) + "<h3>Settings</h3>" + _settings(summary)


def _settings(summary: dict[str, Any]) -> str:
    """Every setting as given; an unset one shows the value the run resolved for it, when there is one."""
    resolved = summary.get("resolved") or {}
    cells = []
    for key, value in (summary.get("settings") or {}).items():
        if value is None:
            shown = f"default: {json.dumps(resolved[key])}" if key in resolved else "default"
        else:
            shown = json.dumps(value)
        cells.append(f"<div class='key'>{escape(key)}</div><div class='value'>{escape(shown)}</div>")
    return f"<div class='settings'>{''.join(cells)}</div>"


CSS = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1140px;padding:0 1em;"
    "color:#222}h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}"
    ".lede{color:#555}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 9px;"
    "text-align:right}th{background:#f6f6f6;font-weight:600}.kv th{text-align:left}.kv td{text-align:left;"
    "font-family:ui-monospace,monospace;font-size:90%;word-break:break-all}.hint{color:#666;font-size:90%}"
    ".fans{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:10px}figure{margin:0}"
    "svg{max-width:100%;height:auto}.side{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}"
    ".sortable th{cursor:pointer}.notes{background:#fff8e5;border:1px solid #f0d98c;padding:.6em 2em}"
    "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:85%}"
    ".settings{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:3px 14px;font-size:90%}"
    ".settings .key{font-weight:600}.settings .value{font-family:ui-monospace,monospace;word-break:break-all}"
    ".settings{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:2px 12px;font-size:90%}"
    ".settings .key{font-weight:600}.settings .value{font-family:ui-monospace,monospace;word-break:break-all}"
)
# Sorts a table.sortable by the clicked column (numbers numerically, '-' last); no library, works offline.
SORT_SCRIPT = (
    "document.querySelectorAll('table.sortable th').forEach(function(th,col){th.addEventListener('click',"
    "function(){var body=th.closest('table').tBodies[0],rows=Array.from(body.rows),up=th.dataset.up!=='1';"
    "th.dataset.up=up?'1':'0';function key(r){var t=r.cells[col].textContent,n=parseFloat(t);"
    "return isNaN(n)?(t==='-'?Infinity:t):n}rows.sort(function(a,b){var x=key(a),y=key(b);"
    "return (x<y?-1:x>y?1:0)*(up?1:-1)});rows.forEach(function(r){body.appendChild(r)})})});"
)
