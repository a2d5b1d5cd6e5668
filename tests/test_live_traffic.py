"""Unit tier: what a replica does after answering (log rows' inputs, shadows, counts), with small fakes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from distributed_onnx.live.log.layout import forecast_rows, log_files
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.location import Location
from distributed_onnx.serve.log.traffic import (
    LiveTraffic,
    RequestStamp,
    in_shadow_sample,
    logged_forecast,
    origins_us,
    request_id,
)
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.wire.forecasting import forecast_timestamps
from distributed_onnx.serve.wire.schemas import ForecastRequest

REQUEST = ForecastRequest.model_validate(
    {
        "series": [
            {"series_id": "a", "y": [1.0, 2.0, None, 4.0], "start": "2026-12-01T00:00:00Z"},
            {"series_id": "b", "y": [5.0, 6.0], "start": "2026-12-01T10:30:00"},  # naive: UTC
            {"series_id": "c", "y": [7.0]},
        ],
        "horizon": 3,
    }
)


@dataclass
class FakeModel:
    name: str
    checkpoint_sha256: str = "f" * 64
    resolution_minutes: int = 30
    native_quantiles: tuple[float, ...] = (0.5,)
    context_length: int = 16
    fails: bool = False
    calls: int = 0

    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        self.calls += 1
        if self.fails:
            raise RuntimeError("horizon 3 is beyond this model")
        return np.full((len(request.series), 3, 1), 2.0, dtype=np.float32), (0.5,)


def test_logged_timestamps_are_the_ones_the_response_carries() -> None:
    item = logged_forecast(
        FakeModel("m"),
        "served",
        REQUEST,
        np.zeros((3, 3, 1), np.float32),
        (0.5,),
        RequestStamp("r", 1_796_083_200_000_000),
    )
    rows = forecast_rows(item)
    stamps = rows.column("timestamp").to_pylist()
    for index, series in enumerate(REQUEST.series[:2]):
        assert series.start is not None
        served = forecast_timestamps(series.start, len(series.y), 3, 30)
        logged = [moment.strftime("%Y-%m-%dT%H:%M:%S") + "Z" for moment in stamps[index * 3 : index * 3 + 3]]
        assert logged == served
    assert stamps[6:] == [None, None, None]  # series "c" gave no start
    assert origins_us(REQUEST, 30)[0] == int(datetime(2026, 12, 1, 2, tzinfo=UTC).timestamp() * 1e6)


def test_request_id_is_the_clients_or_a_fresh_one() -> None:
    assert request_id("abc") == "abc"
    assert len(request_id(None)) == 32 and request_id(None) != request_id(None)


def test_answered_returns_at_once_then_logs_served_and_shadow_forecasts(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path, flush_interval_s=60.0)
    metrics = LiveMetrics(log, replica="t")
    broken, shadow = FakeModel("broken", fails=True), FakeModel("shadow")
    traffic = LiveTraffic(log, metrics, [broken, shadow])
    primary = FakeModel("primary")

    async def scenario() -> int:
        traffic.answered(primary, REQUEST, np.ones((3, 3, 1), np.float32), (0.5,), "req-1", 1_796_083_200_000_000)
        before = shadow.calls  # nothing ran yet: the handler's response goes first
        await traffic.drain()
        return before

    assert asyncio.run(scenario()) == 0
    assert log.flush()
    log.close()
    assert broken.calls == shadow.calls == 1 and traffic.shadow_failures == 1
    table = pa.concat_tables([pq.read_table(path) for path in log_files(Location(tmp_path))])
    by_model = {model: table.filter(pa.compute.equal(table["model"], model)) for model in ("primary", "shadow")}
    assert set(table["model"].to_pylist()) == {"primary", "shadow"}
    assert by_model["primary"]["role"].to_pylist() == ["served"] * 9
    assert by_model["shadow"]["role"].to_pylist() == ["shadow"] * 9
    assert by_model["primary"]["window_id"].equals(by_model["shadow"]["window_id"])
    body, _ = metrics.render()
    assert b'distributed_onnx_forecasts_served_total{model="primary",replica="t"} 3.0' in body
    assert b'distributed_onnx_forecasts_shadow_total{model="shadow",replica="t"} 3.0' in body


def test_a_shadow_fraction_samples_requests_by_id_and_the_primary_still_logs_every_answer(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path, flush_interval_s=60.0)
    metrics = LiveMetrics(log, replica="t")
    shadow = FakeModel("shadow")
    traffic = LiveTraffic(log, metrics, [shadow], shadow_fraction=0.25)
    ids = [f"req-{index}" for index in range(400)]
    sampled = [request for request in ids if in_shadow_sample(request, 0.25)]

    async def scenario() -> None:
        for request in ids:
            traffic.answered(FakeModel("primary"), REQUEST, np.ones((3, 3, 1), np.float32), (0.5,), request, 0)
            await traffic.drain()

    asyncio.run(scenario())
    assert log.flush()
    log.close()

    assert 70 <= len(sampled) <= 130  # a quarter of 400, give or take the hash (these ids are fixed: no flake)
    assert shadow.calls == len(sampled)
    assert all(in_shadow_sample(request, 1.0) for request in ids)
    assert [in_shadow_sample(request, 0.25) for request in ids] == [request in sampled for request in ids]
    assert set(sampled) <= {request for request in ids if in_shadow_sample(request, 0.5)}  # nested shares
    table = pa.concat_tables([pq.read_table(path) for path in log_files(Location(tmp_path))])
    shadow_rows = table.filter(pa.compute.equal(table["model"], "shadow"))
    primary_rows = table.filter(pa.compute.equal(table["model"], "primary"))
    assert set(shadow_rows["request_id"].to_pylist()) == set(sampled)
    assert set(primary_rows["request_id"].to_pylist()) == set(ids)
