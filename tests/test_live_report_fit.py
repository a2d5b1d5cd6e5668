"""The live report at 1280 px with three models whose windows are all pending (issue 46): its tables of forecasts
logged, requests and failures fit the window, and "no window scored yet" is said once, not once per model.

Pure page logic (the page from a summary, a failures table and metrics of three groups with nothing scored: what
``score`` hands :func:`write_live_report` when every window is pending), read as text and in headless Chromium.
Before: the three tables scrolled sideways (1382, 1175 and 1340 px wide) and the sentence came three times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from browser import measured_dom, needs_chromium

from distributed_onnx.live.score.report import write_live_report
from distributed_onnx.location import Location

MODELS = ["chronos2_small_2024_finetuned", "tirex_base", "taylor_chronos2_patchtst"]
COUNTS = {"requests": 10, "answered": 7, "failed_by_kind": {"validation": 2, "model_error": 1}, "failure_rate": 0.3}
MEASURE = r"""
var b = document.body, root = document.documentElement;
b.setAttribute('data-scroll', root.scrollWidth + ' ' + root.clientWidth);
var wide = [], tables = document.querySelectorAll('table');
for (var i = 0; i < tables.length; i++) {
  if (tables[i].scrollWidth > tables[i].clientWidth + 1)
    wide.push(tables[i].rows[0].textContent.slice(0, 40) + ':' + tables[i].scrollWidth);
}
b.setAttribute('data-tables', tables.length + ' ' + wide.join(' | '));
b.setAttribute('data-unscored', String(b.innerText.toLowerCase().split('no window scored yet').length - 1));
"""


@pytest.fixture
def page(tmp_path: Path) -> Path:
    when = datetime(2026, 12, 5, 9, tzinfo=UTC)
    summary = {
        "forecasts": "/data/log",
        "actuals": "/data/actuals.parquet",
        "request_time": {"first": "2026-12-05T08:00:00Z", "last": "2026-12-05T09:00:00Z"},
        "windows": {m: {"pending_actuals_not_arrived": 3, "pending_series_not_in_actuals": 2} for m in MODELS},
        "requests": {
            "recorded": True,
            "models": {m: dict(COUNTS) for m in MODELS},
            "unattributed": {"requests": 2, "failed_by_kind": {"validation": 2}},
        },
    }
    failures = pa.Table.from_pylist(
        [
            {"model": m, "kind": "validation", "reason": "horizon_too_long", "status": 422, "protocol": "http",
             "endpoint": "/v1/forecast", "count": 2, "first": when, "last": when,
             "message": f"horizon 96 exceeds what {m} forecasts (at most 64 steps of 30 min): ask for at most 64 "
             "steps or serve a checkpoint with a longer horizon"}
            for m in MODELS
        ]
    )  # fmt: skip
    metrics = pa.table(
        {"scored_with": MODELS, "horizon": [24] * 3, "quantile_levels": ["0.1,0.5,0.9"] * 3,
         "resolution_minutes": [30] * 3, "model": MODELS, "metric": ["count"] * 3, "value": [0.0] * 3}
    )  # fmt: skip
    board = metrics.select(["scored_with", "horizon", "quantile_levels", "resolution_minutes"]).slice(0, 0)
    write_live_report(Location.parse(str(tmp_path)), summary, metrics, board, failures=failures)
    return tmp_path / "report.html"


def test_nothing_scored_is_said_once_for_every_model(page: Path) -> None:
    text = page.read_text()
    assert text.lower().count("no window scored yet") == 1
    line = text[text.index("No window scored yet") :]
    assert all(f"{model} (horizon 24)" in line[: line.index("</p>")] for model in MODELS)


def test_the_live_tables_fit_1280_px(page: Path) -> None:
    needs_chromium()
    seen = measured_dom(page, MEASURE, 1280)
    scroll_width, client_width = map(int, seen["scroll"].split())
    assert scroll_width <= client_width <= 1280, seen["scroll"]
    assert seen["tables"] == "3 ", seen["tables"]  # the three tables, none wider than the page
    assert seen["unscored"] == "1"
