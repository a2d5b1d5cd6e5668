"""Issue 29, defects 9 and 10: a shadow's failures and NaN forecasts are counted where they can be seen, and the
after-the-answer work runs off the replica's event loop.

Unit tier: :class:`LiveTraffic` with a real :class:`ForecastLog` on a temporary folder and fake models, the
``/metrics`` page rendered, ``score`` on the log.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from test_live_ids import _request
from test_live_score import _ramp_actuals

from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.serve.log.traffic import LiveTraffic, Served
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.wire.schemas import ForecastRequest


@dataclass
class Shadow:
    name: str
    behaviour: str  # "ok", "fails", "nan"
    checkpoint_sha256: str = "f" * 64
    resolution_minutes: int = 30
    native_quantiles: tuple[float, ...] = (0.5,)
    context_length: int = 16
    threads: list[str] = field(default_factory=list)

    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        if self.behaviour == "fails":
            raise RuntimeError("this session is broken")
        values = np.ones((len(request.series), 3, 1), dtype=np.float32)
        if self.behaviour == "nan":
            values[:, 1] = np.nan
        return values, (0.5,)


def _samples(metrics: LiveMetrics, name: str) -> dict[tuple[str, str], float]:
    text = metrics.render()[0].decode()
    return {
        (sample.labels["model"], sample.labels.get("reason", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_shadow_failures_and_nonfinite_forecasts_are_counted_per_model_and_scored_as_left_out(
    tmp_path: Path,
) -> None:
    """Defect 9: the failure counter was an attribute only; a challenger's failures and NaN forecasts never
    reached /metrics, the log's record or ``score``."""
    _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    metrics = LiveMetrics(log, replica="t")
    traffic = LiveTraffic(log, metrics, [Shadow("broken", "fails"), Shadow("nan", "nan")])
    primary = Shadow("primary", "ok")
    two_series = ForecastRequest.model_validate(
        {
            "series": [
                {"series_id": "a", "y": [1.0] * 60, "start": "2026-12-01T00:00:00Z"},
                {"series_id": "a", "y": [1.0] * 62, "start": "2026-12-01T00:00:00Z"},
            ],
            "horizon": 3,
        }
    )

    async def scenario() -> None:
        for request in (two_series, _request("a", "2026-12-01T00:00:00Z", 70)):
            traffic.answered(primary, request, np.ones((len(request.series), 3, 1), np.float32), (0.5,), "x", 0)
            await traffic.drain()

    asyncio.run(scenario())
    assert log.flush()
    failed = _samples(metrics, "distributed_onnx_forecasts_shadow_failed_total")
    assert failed == {("broken", "error"): 3.0, ("nan", "nonfinite"): 3.0}
    log.close()
    (state,) = [json.loads(path.read_text()) for path in (tmp_path / "log" / "_log_state").glob("*.json")]
    assert state["models"]["broken"]["shadow_failed"] == 3 and state["models"]["nan"]["shadow_nonfinite"] == 3
    result = score_log(
        ScoreSettings(forecasts=tmp_path / "log", actuals=tmp_path / "actuals.parquet", output=tmp_path / "score")
    )
    assert result.summary["failed_by_the_shadows"] == {
        "broken": {"failed": 3, "nonfinite": 0},
        "nan": {"failed": 0, "nonfinite": 3},
    }
    pairs = {entry["scored_with"]: entry["left_out"] for entry in result.summary["pairs"]}
    assert pairs["nan,primary"]["nan"]["nonfinite_windows"] == 3  # as the backtest leaves them out
    report = (tmp_path / "score" / "report.html").read_text()
    assert "<th colspan='2'>shadow</th>" in report and "<th>failed</th><th>NaN/inf</th>" in report


def test_the_log_and_shadow_work_of_an_answer_runs_off_the_event_loop(tmp_path: Path) -> None:
    """Defect 10: building the log's view of a request (and a shadow's plan) ran on the replica's event loop."""
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    traffic = LiveTraffic(log, LiveMetrics(log, replica="t"), [Shadow("shadow", "ok")])
    request = _request("a", "2026-12-01T00:00:00Z")
    ran_in: list[threading.Thread] = []

    def served() -> Served:
        ran_in.append(threading.current_thread())
        return request, np.ones((1, 3, 1), np.float32), (0.5,)

    async def scenario() -> threading.Thread:
        traffic.answered_later(Shadow("primary", "ok"), 1, served, "x", 0)
        await traffic.drain()
        return threading.current_thread()

    loop_thread = asyncio.run(scenario())
    log.close()
    assert ran_in and ran_in[0] is not loop_thread
    assert {path.parent.name for path in (tmp_path / "log").rglob("part-*.parquet")} == {
        "model=primary",
        "model=shadow",
    }
