"""The report page's furniture: the run's notes, throughput, provenance and settings, the CSS and the sorting
script. What the run did and how the page looks, apart from the scores' tables (:mod:`.tables`), so that a change
to either does not touch the other."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from distributed_onnx.evaluation.report.tables import escape, number


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
    """Every checkpoint of the run (name, sha256, path), then the data, versions and settings the run shared."""
    versions = summary.get("versions") or {}
    checkpoints: dict[str, Any] = summary.get("models") or {
        str(summary.get("model")): {"checkpoint": summary.get("checkpoint"), "sha256": summary.get("checkpoint_sha256")}
    }
    rows = "".join(
        f"<tr><th>{escape(name)}</th><td>{escape(record.get('sha256') or '(not recorded in the metadata)')}</td>"
        f"<td>{escape(record.get('checkpoint') or '-')}</td></tr>"
        for name, record in checkpoints.items()
    )
    table = f"<table class='kv checkpoints'><tr><th>checkpoint</th><th>sha256</th><th>path</th></tr>{rows}</table>"
    items: dict[str, Any] = {
        "data": summary.get("data"),
        "run fingerprint": summary.get("run_fingerprint"),
        "providers": _providers(summary.get("actors") or []),
        **{f"{name} version": version for name, version in versions.items()},
    }
    return table + _kv_table(items) + "<h3>Settings</h3>" + _settings(summary)


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
    ".lede{color:#555}table{border-collapse:collapse;margin:.5em 0;display:block;overflow-x:auto;max-width:100%}"
    "td,th{border:1px solid #ddd;padding:3px 9px;"
    "text-align:right}th{background:#f6f6f6;font-weight:600}.kv th{text-align:left}.kv td{text-align:left;"
    "font-family:ui-monospace,monospace;font-size:90%;word-break:break-all}.hint{color:#666;font-size:90%}"
    ".fans{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:10px}figure{margin:0}"
    "figcaption{font-size:80%;color:#333}.legend{list-style:none;margin:0 0 0 60px;padding:0;font-size:72%;"
    "color:#444;display:flex;flex-wrap:wrap;gap:1px 12px}.legend i{display:inline-block;width:16px;height:8px;"
    "margin-right:4px;vertical-align:middle}.legend i.line,.legend i.dashed,.legend i.dotted{height:0}"
    ".verdict{font-size:110%;background:#eef5ff;border:1px solid #b7d0f0;padding:.6em 1em}"
    "table.board{font-size:90%}table.board td,table.board th{padding:3px 5px}.fev{color:#666;font-size:85%}"
    ".dm{color:#666;font-size:85%}.dm.strong{color:#222;font-weight:600}td.same{color:#8a5a00;font-style:italic}"
    "svg{max-width:100%;height:auto}.side{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}"
    ".sortable th{cursor:pointer}.notes{background:#fff8e5;border:1px solid #f0d98c;padding:.6em 2em}"
    "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:85%}"
    # Tables that must fit 1280 px at any number of models: one short line per value, long names broken.
    ".pairwise td{white-space:nowrap}.pairwise td,.pairwise th{padding:2px 6px}.pairwise tr>th:first-child"
    "{text-align:left}.checkpoints td{text-align:left;font-family:ui-monospace,monospace;font-size:85%;"
    "word-break:break-all}.off-scale{color:#a61b1b}details.checkpoint{margin:.6em 0}details.checkpoint>summary"
    "{font-size:120%;font-weight:600;cursor:pointer}td.wrap{white-space:normal;overflow-wrap:anywhere}"
    # The live report's tables of counts and failures: smaller, long names and messages broken, headers centred.
    "table.fit{font-size:85%}table.fit td,table.fit th{padding:2px 5px}table.fit th{text-align:center}"
    "table.reasons td{text-align:left}table.reasons td:first-child,table.reasons td:last-child"
    "{overflow-wrap:anywhere}"
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
    # Filters the per-series table's rows by a substring of the series id.
    "function filterSeries(text){text=text.toLowerCase();document.querySelectorAll('.series-table tbody tr')"
    ".forEach(function(r){r.style.display=r.cells[1].textContent.toLowerCase().indexOf(text)<0?'none':''})}"
)
