"""``report.html``: a self-contained page a person reads after a backtest (inline SVG, no plotting library).

Shows the run, the headline metrics of the model next to the seasonal-naive baseline, the metric by lead,
and forecast fans for a few windows. Plots are simple polylines, so the page needs nothing but a browser.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.backtest.fans import FanWindow
from distributed_onnx.backtest.merge import NAIVE_MODEL
from distributed_onnx.quantiles import central_intervals

WIDTH, HEIGHT, PAD = 640, 220, 36
COLORS = {"model": "#1f6fb4", NAIVE_MODEL: "#d1495b"}


def write_report(
    output: storage.Location,
    summary: dict[str, Any],
    metrics: pa.Table,
    quantiles: Sequence[float],
    fans: Sequence[FanWindow] = (),
) -> storage.Location:
    model = summary["model"]
    rows = metrics.to_pylist()
    headline = _headline(rows, model)
    sections = [
        f"<h1>Backtest of {html.escape(model)}</h1>",
        _run_table(summary),
        "<h2>Model vs seasonal naive (global)</h2>",
        headline,
        "<h2>MAE by lead</h2>",
        _by_lead_plot(rows, model, "mae"),
        "<h2>Forecast fans (a few windows)</h2>",
        *_fans(fans, quantiles),
        "<details><summary>summary.json</summary><pre>"
        + html.escape(json.dumps(summary, indent=2, default=str))
        + "</pre></details>",
    ]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Backtest report</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:760px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}"
        "</style></head><body>" + "\n".join(sections) + "</body></html>"
    )
    path = storage.join(output, "report.html")
    storage.write_bytes(path, page.encode())
    return path


def _headline(rows: list[dict[str, Any]], model: str) -> str:
    def value(name: str, metric: str) -> float | None:
        for row in rows:
            if (
                row["model"] == name
                and row["scope"] == "global"
                and row["metric"] == metric
                and row["quantile"] is None
            ):
                return float(row["value"])
        return None

    lines = ["<table><tr><th>metric</th><th>model</th><th>seasonal naive</th><th>ratio</th></tr>"]
    for metric in ("mae", "rmse", "mase", "sql", "wql"):
        ours, naive = value(model, metric), value(NAIVE_MODEL, metric)
        if ours is None:
            continue
        ratio = f"{ours / naive:.3f}" if naive else "-"
        naive_text = f"{naive:.4g}" if naive is not None else "-"
        lines.append(f"<tr><th>{metric}</th><td>{ours:.4g}</td><td>{naive_text}</td><td>{ratio}</td></tr>")
    return "".join(lines) + "</table>"


def _run_table(summary: dict[str, Any]) -> str:
    windows, timing = summary["windows"], summary["timing"]
    providers = sorted({", ".join(actor["providers"]) for actor in summary["actors"]}) or ["(resumed: none started)"]
    items = {
        "checkpoint sha256": summary["checkpoint_sha256"],
        "windows planned / skipped / failed": f"{windows['planned']} / {windows['skipped_context_coverage']} / "
        f"{windows['failed']}",
        "actors": len(summary["actors"]),
        "providers": "; ".join(providers),
        "windows/s": f"{timing['windows_per_s']:.0f}" if timing["windows_per_s"] else "-",
    }
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in items.items())
    return f"<table>{cells}</table>"


def _scale(values: np.ndarray, low: float, high: float, size: float, invert: bool = False) -> np.ndarray:
    span = (high - low) or 1.0
    scaled = (values - low) / span * (size - 2 * PAD) + PAD
    return size - scaled if invert else scaled


def _polyline(xs: np.ndarray, ys: np.ndarray, color: str, width: float = 1.5) -> str:
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True) if np.isfinite(y))
    return f"<polyline fill='none' stroke='{color}' stroke-width='{width}' points='{points}'/>"


def _svg(body: str, caption: str) -> str:
    return (
        f"<figure><svg width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' "
        f"xmlns='http://www.w3.org/2000/svg'><rect width='100%' height='100%' fill='white' stroke='#ddd'/>"
        f"{body}</svg><figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _by_lead_plot(rows: list[dict[str, Any]], model: str, metric: str) -> str:
    series: dict[str, np.ndarray] = {}
    for name in (model, NAIVE_MODEL):
        points = sorted(
            (r["lead"], r["value"])
            for r in rows
            if r["model"] == name and r["scope"] == "lead" and r["metric"] == metric
        )
        if points:
            series[name] = np.array(points, dtype=float)
    if not series:
        return "<p>(no lead metrics)</p>"
    all_points = np.concatenate(list(series.values()))
    body = ""
    for name, block in series.items():
        xs = _scale(block[:, 0], all_points[:, 0].min(), all_points[:, 0].max(), WIDTH)
        ys = _scale(block[:, 1], 0.0, float(np.nanmax(all_points[:, 1])), HEIGHT, invert=True)
        body += _polyline(xs, ys, COLORS["model" if name == model else NAIVE_MODEL], 2)
    return _svg(body, f"{metric} by lead: blue = {model}, red = seasonal naive; y axis from 0")


def _fans(fans: Sequence[FanWindow], quantiles: Sequence[float]) -> list[str]:
    if not fans:
        return ["<p>(no forecasts)</p>"]
    figures = []
    for fan in fans:
        actual = fan.actual
        bands = fan.quantiles
        stacked = np.concatenate([actual[np.isfinite(actual)], *bands.values()])
        low, high = float(stacked.min()), float(stacked.max())
        xs = _scale(np.arange(len(actual), dtype=float), 0, max(len(actual) - 1, 1), WIDTH)
        body = ""
        for lower, upper in central_intervals(quantiles):
            top = _scale(bands[upper], low, high, HEIGHT, invert=True)
            bottom = _scale(bands[lower], low, high, HEIGHT, invert=True)
            points = " ".join(
                f"{x:.1f},{y:.1f}" for x, y in [*zip(xs, top, strict=True), *zip(xs[::-1], bottom[::-1], strict=True)]
            )
            body += f"<polygon points='{points}' fill='{COLORS['model']}' fill-opacity='0.15'/>"
        if 0.5 in bands:
            body += _polyline(xs, _scale(bands[0.5], low, high, HEIGHT, invert=True), COLORS["model"], 2)
        body += _polyline(xs, _scale(actual, low, high, HEIGHT, invert=True), "#222", 1.5)
        origin = np.datetime64(fan.origin_us, "us")
        caption = f"{fan.series_id} from {origin}Z ({fan.label}): actual (black), median and central intervals (blue)"
        figures.append(_svg(body, caption))
    return figures
