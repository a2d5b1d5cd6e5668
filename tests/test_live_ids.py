"""Issue 29, defects 1-3: a window's identity in the forecast log cannot be forged or collided by a client.

Unit tier: the replica's after-the-answer work (:class:`LiveTraffic`, real :class:`ForecastLog` on a temporary
folder, fake models), the v2 route's parameter checks and ``score`` on what was logged.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_live_score import REQUEST_TIME_US, STEP_MIN, _item, _ramp_actuals

from distributed_onnx.bounds import MAX_SERIES_ID_BYTES
from distributed_onnx.errors import DataError, InputValidationError
from distributed_onnx.live.log.layout import LoggedForecast, forecast_rows, log_files
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.log_windows import read_log_windows
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.location import Location
from distributed_onnx.serve.log.infer_windows import _series_ids
from distributed_onnx.serve.log.traffic import LiveTraffic
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.wire.schemas import ForecastRequest


@dataclass
class Model:
    """A model as the log sees it; as a shadow it forecasts 1.0 everywhere."""

    name: str
    checkpoint_sha256: str = "f" * 64
    resolution_minutes: int = STEP_MIN
    native_quantiles: tuple[float, ...] = (0.5,)
    context_length: int = 16

    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        return np.ones((len(request.series), request.horizon or 3, 1), dtype=np.float32), (0.5,)


def _request(series_id: str, start: str, steps: int = 60) -> ForecastRequest:
    return ForecastRequest.model_validate(
        {"series": [{"series_id": series_id, "y": [1.0] * steps, "start": start}], "horizon": 3}
    )


def _answer(traffic: LiveTraffic, answers: list[tuple[Model, ForecastRequest, str]]) -> None:
    async def scenario() -> None:
        for model, request, client_id in answers:
            forecasts = np.ones((len(request.series), 3, 1), np.float32)
            traffic.answered(model, request, forecasts, (0.5,), client_id, REQUEST_TIME_US)
            await traffic.drain()

    asyncio.run(scenario())


def _score(tmp_path: Path, actuals: Path) -> dict[str, dict[str, int]]:
    result = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=actuals, output=tmp_path / "score"))
    return dict(result.summary["windows"])


def test_a_client_id_sent_to_the_shadow_then_reused_by_a_primary_request_does_not_break_score(
    tmp_path: Path,
) -> None:
    """Defect 1: the shadow answered request ``X`` for series ``a`` itself, then a primary request reused ``X``
    for series ``b`` (the shadow forecast it too). The ids collided: every later ``score`` exited 2."""
    _ramp_actuals(tmp_path / "actuals.parquet")
    b = pa.table(
        {
            "series_id": ["b"] * 100,
            "timestamp": pa.array(
                [REQUEST_TIME_US + i * STEP_MIN * 60_000_000 for i in range(100)], pa.timestamp("us", tz="UTC")
            ),
            "y": np.arange(100, dtype=np.float64),
        }
    )
    a = pq.read_table(tmp_path / "actuals.parquet")
    pq.write_table(pa.concat_tables([a, b]), tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    primary, shadow = Model("primary"), Model("shadow")
    traffic = LiveTraffic(log, LiveMetrics(log, replica="t"), [shadow])
    start = "2026-12-01T00:00:00Z"  # REQUEST_TIME_US: the actuals' first instant
    _answer(traffic, [(shadow, _request("a", start), "X"), (primary, _request("b", start, steps=61), "X")])
    log.close()
    table = pa.concat_tables([pq.read_table(path) for path in log_files(Location(tmp_path / "log"))])
    assert set(table["request_id"].to_pylist()) == {"X"}  # the client's id is kept, as data
    windows = _score(tmp_path, tmp_path / "actuals.parquet")
    assert windows == {"shadow": {"scored": 2}, "primary": {"scored": 1}}


def test_two_requests_with_the_same_client_id_are_two_windows(tmp_path: Path) -> None:
    """Defect 2: the second request of a reused ``X-Request-ID`` was silently dropped (logged 2, scored 1)."""
    _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    traffic = LiveTraffic(log, LiveMetrics(log, replica="t"))
    primary = Model("primary")
    start = "2026-12-01T00:00:00Z"
    _answer(traffic, [(primary, _request("a", start, 60), "same"), (primary, _request("a", start, 70), "same")])
    log.close()
    assert _score(tmp_path, tmp_path / "actuals.parquet") == {"primary": {"scored": 2}}


def test_a_window_logged_twice_or_for_different_series_is_counted_not_fatal(tmp_path: Path) -> None:
    """Logs written before the server drew the ids: the same id for two series (a collision) is set aside,
    counted per model, and a copy of a window is counted as a duplicate; the rest is scored."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    log.submit(_item("collided", "a", start + 60 * step_us))
    log.submit(_item("collided", "a", start + 70 * step_us, model="shadow"))  # same id, another origin
    log.submit(_item("copied", "a", start + 80 * step_us))
    assert log.flush()
    log.submit(_item("copied", "a", start + 80 * step_us))  # another file: the same window again
    log.submit(_item("fine", "a", start + 50 * step_us))
    log.close()
    windows = _score(tmp_path, tmp_path / "actuals.parquet")
    assert windows == {"m": {"scored": 2, "duplicate": 1, "conflicting_ids": 1}, "shadow": {"conflicting_ids": 1}}


def test_series_ids_are_bounded_on_the_v2_route_as_on_v1() -> None:
    """Defect 3: v2 ``series_ids`` had no length limit (v1 caps them at MAX_SERIES_ID_BYTES, issue 53: in bytes)."""
    assert _series_ids("a," + "b" * MAX_SERIES_ID_BYTES, 2) == ("a", "b" * MAX_SERIES_ID_BYTES)
    with pytest.raises(InputValidationError, match="at most 1,024 bytes"):
        _series_ids("a," + "b" * (MAX_SERIES_ID_BYTES + 1), 2)
    with pytest.raises(InputValidationError, match="at most 1,024 bytes"):
        _series_ids(["x" * 8_000_000], 1)
    with pytest.raises(ValueError, match="1,024"):
        ForecastRequest.model_validate({"series": [{"series_id": "x" * (MAX_SERIES_ID_BYTES + 1), "y": [1.0]}]})


def test_one_series_id_bound_in_bytes_for_the_backtest_both_routes_and_score(tmp_path: Path) -> None:
    """Issue 53: the backtest took ids of up to 1,024 UTF-8 bytes, the routes up to 256 characters, so a series
    the backtest scored could not be served under its own id (and a 256-character id of 4-byte characters was
    served though it is 1,024 bytes). One bound now, in the bytes every reader stores: an id the backtest's table
    takes, /v1 (as its HTTP body is parsed), v2 and the log ``score`` reads take too, and one byte more none does."""
    from distributed_onnx.evaluation.data.table import series_from_table
    from distributed_onnx.serve.wire.http import HttpError, parse_body

    fits = "é" * (MAX_SERIES_ID_BYTES // 2)  # 512 characters, 1,024 bytes: the routes refused it before
    over = fits + "a"  # 1,025 bytes, 513 characters
    table = pa.table({"series_id": [fits, fits], "timestamp": pa.array([0, 60_000_000], pa.timestamp("us", "UTC")),
                      "y": [1.0, 2.0]})  # fmt: skip
    assert [series.series_id for series in series_from_table(table, 1).series] == [fits]
    with pytest.raises(DataError, match="longer than 1,024 bytes"):
        series_from_table(table.set_column(0, "series_id", pa.array([over, over])), 1)
    body = {"series": [{"series_id": fits, "y": [1.0]}]}
    assert parse_body(json.dumps(body).encode(), ForecastRequest).series[0].series_id == fits
    assert _series_ids([fits], 1) == (fits,)
    item = LoggedForecast(
        "m", "0" * 64, "served", "r", REQUEST_TIME_US, STEP_MIN, [fits, over], [None, None], (0.5,),
        np.ones((2, 48, 1), dtype=np.float32),
    )  # fmt: skip
    pq.write_table(forecast_rows(item), tmp_path / "part-x.parquet")
    (windows,) = read_log_windows(Location(tmp_path / "part-x.parquet"))
    assert windows.series_ids[0] == fits and windows.series_ids[1].startswith("<id of 1025 bytes, blake2b ")
    with pytest.raises(HttpError, match="at most 1,024 bytes") as refused:
        parse_body(json.dumps({"series": [{"series_id": over, "y": [1.0]}]}).encode(), ForecastRequest)
    assert refused.value.status_code == 422
    with pytest.raises(InputValidationError, match="an id of 1,025 bytes"):
        _series_ids([over], 1)


def test_score_reads_ids_per_window_and_bounds_an_old_logs_long_ones(tmp_path: Path) -> None:
    """Defect 3, the score side: ids were made fixed-width over every row (rows x longest x 4 bytes)."""
    long_id = "z" * 1_000_000
    item = LoggedForecast(
        "m", "0" * 64, "served", "r", REQUEST_TIME_US, STEP_MIN, ["a", long_id], [None, None], (0.5,),
        np.ones((2, 48, 1), dtype=np.float32),
    )  # fmt: skip
    path = tmp_path / "part-x.parquet"
    pq.write_table(forecast_rows(item), path)
    (windows,) = read_log_windows(Location(path))
    assert windows.series_ids[0] == "a" and windows.series_ids[1].startswith("<id of 1000000 bytes, blake2b ")
    assert windows.series_ids.nbytes < 10_000  # was 96 rows x 1e6 characters x 4 bytes


def test_a_client_id_is_kept_as_data_bounded_and_never_names_the_windows(tmp_path: Path) -> None:
    """The same client id on every route is cut to MAX_REQUEST_ID_CHARS and kept in ``request_id``; the windows'
    ids come from the server's key, so a forged id cannot choose them."""
    from distributed_onnx.live.log.layout import MAX_REQUEST_ID_CHARS, window_id
    from distributed_onnx.serve.log.traffic import request_id

    assert request_id("x" * 10_000) == "x" * MAX_REQUEST_ID_CHARS
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    traffic = LiveTraffic(log, LiveMetrics(log, replica="t"))
    forged = "forged"
    _answer(traffic, [(Model("primary"), _request("a", "2026-12-01T00:00:00Z"), forged)])
    log.close()
    table = pa.concat_tables([pq.read_table(path) for path in log_files(Location(tmp_path / "log"))])
    assert table["request_id"].to_pylist()[0] == forged
    assert table["window_id"].to_pylist()[0] != window_id(forged, 0)
