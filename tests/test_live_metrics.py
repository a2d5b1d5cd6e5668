"""Unit tier: the replica's /metrics page (its own registry), scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from distributed_onnx.live.log.layout import LoggedForecast
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.serve.operations.metrics import LiveMetrics


def _item(model: str, series: int) -> LoggedForecast:
    return LoggedForecast(
        model=model,
        checkpoint_sha256="0" * 64,
        role="served",
        request_id="r",
        request_time_us=1_796_083_200_000_000,
        resolution_minutes=30,
        series_ids=[str(i) for i in range(series)],
        origins_us=[None] * series,
        quantiles=(0.5,),
        forecasts=np.zeros((series, 2, 1), dtype=np.float32),
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "replica"))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.integration  # a real HTTP server on 127.0.0.1
def test_metrics_scraped_over_http_count_served_logged_dropped_and_latency(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the log's folder should be")
    log = ForecastLog(blocked, flush_interval_s=60.0)
    metrics = LiveMetrics(log, replica="r1")
    metrics.served("a", 3)
    metrics.shadow("b", 3)
    metrics.request("forecast", "a", 0.004)
    metrics.request("forecast", "a", 0.3)
    log.submit(_item("a", 3))
    log.submit(_item("b", 3))
    assert log.flush()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        log.close()
    samples = _samples(text)
    assert samples[("distributed_onnx_forecasts_served_total", (("model", "a"),))] == 3
    assert samples[("distributed_onnx_forecasts_shadow_total", (("model", "b"),))] == 3
    assert samples[("distributed_onnx_forecasts_logged_total", (("model", "a"),))] == 0
    assert samples[("distributed_onnx_forecasts_dropped_total", (("model", "a"), ("reason", "write_failed")))] == 3
    assert samples[("distributed_onnx_forecasts_dropped_total", (("model", "b"), ("reason", "write_failed")))] == 3
    assert samples[("distributed_onnx_forecast_log_pending", (("model", "a"),))] == 0
    histogram = (("endpoint", "forecast"), ("model", "a"))
    assert samples[("distributed_onnx_request_duration_seconds_count", histogram)] == 2
    bucket = tuple(sorted((*histogram, ("le", "0.005"))))
    assert samples[("distributed_onnx_request_duration_seconds_bucket", bucket)] == 1
    assert 'replica="r1"' in text


def test_the_page_keeps_out_of_the_global_registry() -> None:
    metrics = LiveMetrics(replica="x")
    metrics.served("a", 1)
    body, content_type = metrics.render()
    assert b"distributed_onnx_forecasts_served_total" in body and content_type.startswith("text/plain")
    assert REGISTRY.get_sample_value("distributed_onnx_forecasts_served_total", {"model": "a", "replica": "x"}) is None
