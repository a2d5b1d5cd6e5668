"""Unit tier: report.html says what a forecaster needs, and holds everything itself.

FanWindows are built by hand; the metrics table is a real one, accumulated by MetricsAccumulator from a small
synthetic backtest of two series (one forecast well, one badly) against a seasonal-naive baseline.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from distributed_onnx.evaluation.report import tables as report_tables
from distributed_onnx.evaluation.report.page import FanWindow, write_report
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE as NAIVE_MODEL
from distributed_onnx.location import Location

MODEL = "tiny_model"
QUANTILES = [0.05, 0.1, 0.5, 0.9, 0.95]  # 0.05/0.95 lie outside the (pretend) native range [0.1, 0.9]
HORIZON, CONTEXT, SEASON = 6, 12, 3
STEP_US = 30 * 60 * 1_000_000
ORIGIN_US = 1_700_000_000 * 1_000_000
SERIES = {"north-substation": 0.5, "south-feeder": 4.0}  # forecast noise: north is the good one


def _metrics(series: dict[str, float] = SERIES, naive_lacks_last_lead: bool = False) -> pa.Table:
    rng = np.random.default_rng(7)
    model, naive = MetricsAccumulator(QUANTILES, HORIZON), MetricsAccumulator(QUANTILES, HORIZON)
    for series_id, noise in series.items():
        windows = 8
        actual = 10 + rng.normal(0, 1, (windows, HORIZON))
        median = actual + rng.normal(0, noise, (windows, HORIZON))
        spread = np.array([-2.0, -1.3, 0.0, 1.3, 2.0])
        forecast = median[..., None] + spread
        naive_point = actual + rng.normal(0, 2.0, (windows, HORIZON))
        if naive_lacks_last_lead:  # no scored pair there: the metrics table has no row for that lead
            naive_point[:, -1] = np.nan
        scale = np.full(windows, 1.5)
        ids = [series_id] * windows
        model.update(ids, actual, forecast, scale)
        naive.update(ids, actual, np.repeat(naive_point[..., None], len(QUANTILES), axis=-1), scale)
    return pa.concat_tables([model.to_table(MODEL), naive.to_table(NAIVE_MODEL)])


def _fans() -> list[FanWindow]:
    fans = []
    for offset, (series_id, label) in enumerate([("north-substation", "best MASE"), ("south-feeder", "worst MASE")]):
        history = 10 + np.sin(np.arange(CONTEXT))
        history[3] = np.nan  # a missing value in the history
        actual = 10 + np.sin(np.arange(CONTEXT, CONTEXT + HORIZON))
        actual[-1] = np.nan  # not known yet
        median = actual + 0.2
        fans.append(
            FanWindow(
                series_id=series_id,
                label=label,
                origin_us=ORIGIN_US + offset * 48 * STEP_US,
                step_us=STEP_US,
                history=history,
                actual=actual,
                quantiles={0.05: median - 2, 0.1: median - 1.3, 0.5: median, 0.9: median + 1.3, 0.95: median + 2},
                mase=0.4 + offset,
                scored_by="mase",
            )
        )
    return fans


def _summary(**extra: Any) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "model": MODEL,
        "checkpoint": "/models/tiny_model.onnx",
        "checkpoint_sha256": "ab" * 32,
        "data": "/data/load.parquet",
        "run_fingerprint": "0123456789abcdef",
        "settings": {"output": "runs/x", "horizon": None, "stride": 2, "quantiles": QUANTILES},
        "resolved": {
            "context_length": CONTEXT,
            "horizon": HORIZON,
            "quantiles": QUANTILES,
            "seasonality": SEASON,
            "series": 2,
        },
        "windows": {"planned": 16, "skipped_context_coverage": 0, "done_before": 0, "run_now": 16, "failed": 0},
        "batches": {"planned": 4, "done_before": 0, "retried": 1, "failed": 0, "actors_lost": 0},
        "actors": [{"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}] * 2,
        "timing": {"total_s": 12.5, "dispatch_s": 2.0, "first_forecast_s": 9.1, "windows_per_s": 8.0},
    }
    summary.update(extra)
    return summary


class _Text(HTMLParser):
    """The page's visible text (SVG text included), and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self.loads: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.loads += [f"{tag} {name}={value}" for name, value in attrs if name in {"src", "href"}]
        if tag == "link":
            self.loads.append(f"link {attrs}")

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)


def _page(tmp_path: Path, summary: dict[str, Any] | None = None, fans: list[FanWindow] | None = None) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_report(
        Location(tmp_path), summary or _summary(), _metrics(), QUANTILES, _fans() if fans is None else fans
    )
    assert path == tmp_path / "report.html"
    return Path(path).read_text()


def _text(page: str) -> tuple[str, list[str]]:
    parser = _Text()
    parser.feed(page)
    return " ".join(" ".join(parser.chunks).split()), parser.loads


def test_report_shows_series_metrics_and_labelled_axes(tmp_path: Path) -> None:
    text, _ = _text(_page(tmp_path))
    for series_id in SERIES:
        assert f"{series_id} · " in text  # a fan titled with the series
    assert "best MASE" in text and "worst MASE" in text
    for metric in ("MASE", "WQL", "MAE", "RMSE", "SQL", "skill (1 - model/naive)"):
        assert metric in text
    for axis_label in (
        "time (UTC)",
        "y (units of the data)",
        "lead (steps ahead, 30 min each)",
        "MASE (lower is better)",
        "skill = 1 - model / naive",
        "nominal coverage of the central interval",
        "empirical coverage (share of actuals inside)",
    ):
        assert axis_label in text, axis_label
    for legend in ("median forecast", "actual", "forecast origin", "80% interval (q0.1-q0.9)", "seasonal naive"):
        assert legend in text, legend


def test_series_are_ranked_by_mase(tmp_path: Path) -> None:
    page = _page(tmp_path)
    table = page[page.index("<table class='sortable'>") :]
    rows = re.findall(r"<tr><td>(\d+)</td><th>([^<]+)</th><td>([^<]+)</td>", table)
    assert [(rank, name) for rank, name, _ in rows] == [("1", "north-substation"), ("2", "south-feeder")]
    assert float(rows[0][2]) < float(rows[1][2])


def test_clamped_levels_are_marked(tmp_path: Path) -> None:
    clamping = [{"requested": 0.05, "served_by": 0.1}, {"requested": 0.95, "served_by": 0.9}]
    text, _ = _text(_page(tmp_path, _summary(quantile_clamping=clamping)))
    assert "Quantile 0.05 lies outside the checkpoint's native range: it is forecast as 0.1" in text
    assert "90% (q0.05-q0.95) clamped" in text  # the calibration table
    assert "clamped to the native range" in text  # the calibration plot's legend
    assert "90% interval (q0.05-q0.95), clamped" in text  # the fans' legend
    assert "80% (q0.1-q0.9) clamped" not in text


def test_provenance_versions_resume_and_notes_when_present(tmp_path: Path) -> None:
    versions = {"onnxruntime": "1.32.0", "ray": "2.60.0", "distributed_onnx": "0.1.0", "python": "3.11.7"}
    resume = {"resumed": True, "parts_done_before": 7, "windows_done_before": 700}
    computed_by = [
        {"windows": 900, "actors": 4, "providers": ["CUDAExecutionProvider"], "windows_per_s": 5e4, "finished_at": "t1"}
    ]
    summary = _summary(
        versions=versions, resume=resume, computed_by=computed_by, notes=["n_windows 100000 capped at 3936 per series"]
    )
    text, _ = _text(_page(tmp_path, summary))
    assert "ab" * 32 in text
    assert "onnxruntime version 1.32.0" in text and "ray version 2.60.0" in text
    assert "CUDAExecutionProvider, CPUExecutionProvider" in text
    assert "resumed 7 parts were done before this run" in text
    assert "computed by run 1 900 windows on 4 actors (CUDAExecutionProvider) at 5e+04 windows/s" in text
    assert "n_windows 100000 capped at 3936 per series" in text
    assert "horizon default: 6" in text  # an unset setting shows what the run resolved
    assert "windows per second (dispatch) 8" in text


def test_the_page_loads_nothing_from_elsewhere(tmp_path: Path) -> None:
    page = _page(tmp_path)
    _, loads = _text(page)
    assert loads == []
    assert "<svg" in page and "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # CSS/SVG url() only to ids inside the page


def test_the_same_inputs_write_the_same_bytes(tmp_path: Path) -> None:
    first = _page(tmp_path / "a")
    assert _page(tmp_path / "b") == first


def test_without_fans_the_rest_still_renders(tmp_path: Path) -> None:
    text, _ = _text(_page(tmp_path, fans=[]))
    assert "no forecast windows were handed to the report" in text
    assert "nominal coverage of the central interval" in text


def test_many_series_show_the_best_and_worst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_tables, "MAX_TABLE_SERIES", 2)
    noise = {"a": 0.1, "b": 1.0, "c": 2.0, "d": 8.0}
    page = Path(write_report(Location(tmp_path), _summary(), _metrics(noise), QUANTILES, [])).read_text()
    table = page[page.index("<table class='sortable'>") :]
    assert re.findall(r"<tr><td>\d+</td><th>([^<]+)</th>", table) == ["a", "d"]
    assert "4 series: the 1 best and 1 worst by MASE (all: metrics.parquet)" in _text(page)[0]


def test_a_lead_without_scores_for_one_model_leaves_a_gap(tmp_path: Path) -> None:
    metrics = _metrics(naive_lacks_last_lead=True)
    naive_leads = {row["lead"] for row in metrics.to_pylist() if row["model"] == NAIVE_MODEL and row["scope"] == "lead"}
    assert naive_leads == set(range(1, HORIZON))  # the case: the naive has one lead fewer than the model
    page = Path(write_report(Location(tmp_path), _summary(), metrics, QUANTILES, _fans())).read_text()
    assert "MASE by lead" in _text(page)[0]
