"""Checkpoints of the upstream Chronos-2 exporter run unchanged: in process, through the backtest, over HTTP.

The upstream exporter (amazon-science/chronos-forecasting ``scripts/onnx/export_chronos2_to_onnx.py``) writes
four inputs, ``context``, ``group_ids``, ``attention_mask``, ``future_covariates`` (NaN = unknown, no mask),
and ``quantile_preds`` over 21 levels, with only the batch axis dynamic. The tiny graph of tests/graphs.py has
exactly that signature and arithmetic an independent numpy formula predicts (``upstream_expected``); the
formula changes if a NaN is fed as a zero anywhere, so each test also checks the adapter's NaN rule.

Integration tier: real ORT sessions; the backtest on the shared local Ray, Serve on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("onnxruntime")
ray = pytest.importorskip("ray")

from backtest_data import COVARIATE, STEP_US, dense_series, read_forecasts, settings_for, write_dataset  # noqa: E402
from conftest import free_port, start_test_ray  # noqa: E402
from graphs import UPSTREAM_QUANTILES, upstream_expected, write_tiny_upstream_chronos2  # noqa: E402

from distributed_onnx import cli  # noqa: E402
from distributed_onnx.evaluation.backtest import run_backtest  # noqa: E402
from distributed_onnx.model.adapters import Chronos2Variant  # noqa: E402
from distributed_onnx.model.checkpoint import ResolvedCheckpoint  # noqa: E402
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig  # noqa: E402

pytestmark = pytest.mark.integration

CONTEXT, HORIZON = 16, 8
LEVELS = [0.1, 0.5, 0.9]  # native levels: copied, so expected values need no interpolation


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    return write_tiny_upstream_chronos2(tmp_path_factory.mktemp("upstream"))


def _padded(values: np.ndarray, stop: int, length: int) -> np.ndarray:
    """``values[stop - length : stop]``, NaN where that reaches before the start or past the end."""
    out = np.full(length, np.nan)
    for i, position in enumerate(range(stop - length, stop)):
        if 0 <= position < values.size:
            out[i] = values[position]
    return out


def test_worker_feeds_the_upstream_contract(upstream: ResolvedCheckpoint) -> None:
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=upstream.weights_path))
    assert worker.adapter.variant is Chronos2Variant.UPSTREAM  # type: ignore[attr-defined]
    context = np.full((2, 10), np.nan, dtype=np.float32)  # shorter than the model's 16: left-padded with NaN
    context[0] = np.arange(10)
    context[0, 3] = np.nan
    context[1, 6:] = [4.0, 5.0, 6.0, 9.0]
    covariates = np.full((2, 1, 10 + HORIZON), np.nan, dtype=np.float32)
    covariates[0, 0, 10:] = np.arange(HORIZON) + 100.0
    covariates[0, 0, 12] = np.nan  # one unknown future covariate value

    forecasts = worker.forecast(context, HORIZON, UPSTREAM_QUANTILES, covariates)

    assert forecasts.shape == (2, HORIZON, 21)
    for window in range(2):
        grid = _padded(context[window].astype(np.float64), 10, CONTEXT)
        expected = upstream_expected(grid, [covariates[window, 0, 10:].astype(np.float64)])
        np.testing.assert_allclose(forecasts[window], np.broadcast_to(expected, (HORIZON, 21)), rtol=1e-5)


def test_legacy_export_with_num_output_patches_is_fed_the_traced_value(tmp_path: Path) -> None:
    legacy = write_tiny_upstream_chronos2(tmp_path, num_output_patches=True)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=legacy.weights_path))
    context = np.arange(CONTEXT, dtype=np.float32)[None, :]

    forecasts = worker.forecast(context, HORIZON, UPSTREAM_QUANTILES)

    expected = upstream_expected(context[0].astype(np.float64)) + 1000.0 * 2  # horizon_patches = 2
    np.testing.assert_allclose(forecasts[0], np.broadcast_to(expected, (HORIZON, 21)), rtol=1e-5)


@pytest.mark.usefixtures("ray_session")
def test_backtest_runs_the_upstream_export_unchanged(upstream: ResolvedCheckpoint, tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "load.parquet")
    settings = settings_for(
        upstream.weights_path, data, tmp_path / "run", covariates=[COVARIATE], actors=1, quantiles=LEVELS
    )

    result = run_backtest(settings)

    forecasts = read_forecasts(Path(settings.output))
    assert forecasts.num_rows == 12 * HORIZON  # 5 + 5 + 2 windows (see test_backtest_integration.py)
    assert result.summary["windows"]["failed"] == 0
    series = dense_series()
    rows = forecasts.to_pylist()
    for first in rows[::HORIZON]:  # one row per window: lead 1
        data_of = series[first["series_id"]]
        present = data_of["present"]
        y = np.where(present, data_of["y"], np.nan)
        temp = np.where(present, data_of[COVARIATE], np.nan)
        origin_us = int(first["origin"].timestamp() * 1_000_000)
        origin = (origin_us - int(data_of["start_us"])) // STEP_US
        expected = upstream_expected(_padded(y, origin, CONTEXT), [_padded(temp, origin + HORIZON, HORIZON)])
        window = [row for row in rows if row["window_id"] == first["window_id"]]
        for level in LEVELS:
            got = [row[f"q{level:g}"] for row in window]
            want = expected[UPSTREAM_QUANTILES.index(level)]
            np.testing.assert_allclose(got, [want] * HORIZON, rtol=1e-5, err_msg=f"{first['window_id']} q{level}")


# ------------------------------------------------------------------------------------------------ serving


@pytest.fixture(scope="module")
def base_url(upstream: ResolvedCheckpoint) -> Iterator[str]:
    """The upstream checkpoint served on a free loopback port (as tests/test_serve_http.py starts Serve)."""
    from ray import serve

    from distributed_onnx.serve.app import build_app
    from distributed_onnx.serve.settings import ServeSettings

    start_test_ray()  # what the shared ray_session fixture does, at module scope
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 60})
    settings = ServeSettings(checkpoint=upstream.weights_path, port=port, cpus_per_replica=0.5, max_batch_size=4)
    serve.run(build_app(settings), name="upstream", route_prefix="/", blocking=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


def test_forecast_endpoint_serves_the_upstream_export(client: httpx.Client) -> None:
    histories = {
        "gappy": [float(v) for v in range(20)] + [None, 7.0, None, 30.0],  # longer than the context: last 16 used
        "short": [3.0, None, 5.0],  # left-padded: 13 unknown steps that must not count as zeros
    }
    body = {"series": [{"series_id": sid, "y": y} for sid, y in histories.items()], "horizon": HORIZON}

    response = client.post("/v1/forecast", json=body)

    assert response.status_code == 200, response.text
    forecasts = {item["series_id"]: item["quantiles"] for item in response.json()["forecasts"]}
    assert len(forecasts["short"]) == 21  # the checkpoint's native levels by default
    for series_id, y in histories.items():
        values = np.array([np.nan if v is None else v for v in y], dtype=np.float64)
        expected = upstream_expected(_padded(values, values.size, CONTEXT))
        for index, level in enumerate(UPSTREAM_QUANTILES):
            np.testing.assert_allclose(forecasts[series_id][format(level, "g")], [expected[index]] * HORIZON, rtol=1e-5)


def test_forecast_beyond_the_graph_names_export_horizon(client: httpx.Client) -> None:
    body = {"series": [{"series_id": "a", "y": [1.0] * CONTEXT}], "horizon": HORIZON + 1}

    response = client.post("/v1/forecast", json=body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert f"the model emits at most {HORIZON}" in error, error
    assert "distributed-onnx export chronos2 --horizon STEPS" in error, error


@pytest.mark.usefixtures("ray_session")
def test_a_horizon_of_fewer_patches_is_refused_naming_the_export(
    client: httpx.Client, upstream: ResolvedCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upstream exporter's graph always computes its 2 output patches, which in a real Chronos-2 attend to each
    other: its first patch is not the model's forecast for 4 steps (``predict_df(prediction_length=4)`` runs one
    patch). A 4-step horizon is refused over HTTP (422) and by the backtest (exit 2, one line), naming the export
    that fits it, instead of being cut from the 8-step forecast."""
    body = {"series": [{"series_id": "a", "y": [1.0] * CONTEXT}], "horizon": HORIZON // 2}

    response = client.post("/v1/forecast", json=body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "horizon 4 spans 1 output patch(es) of 4 steps" in error and "always computes 2" in error, error
    assert "distributed-onnx export chronos2 --horizon 4" in error, error
    data = write_dataset(tmp_path / "load.parquet")
    output = tmp_path / "run"  # a folder of its own: tmp_path holds the data, and a folder of other files is refused
    argv = ["backtest", "--checkpoint", str(upstream.weights_path), "--data", str(data), "--output", str(output)]
    assert cli.main([*argv, "--horizon", str(HORIZON // 2), "--n-windows", "2", "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "distributed-onnx export chronos2 --horizon 4" in lines[0], lines
    assert client.post("/v1/forecast", json=body | {"horizon": HORIZON - 1}).status_code == 200  # 2 patches: its own


def test_v2_infer_applies_the_upstream_nan_rule(client: httpx.Client, upstream: ResolvedCheckpoint) -> None:
    context = [float("nan")] * 8 + [1.0] * 8
    tensors = {
        "context": ("FP32", [1, CONTEXT], context),
        "group_ids": ("INT64", [1], [0]),
        "attention_mask": ("FP32", [1, CONTEXT], [0.0] * 8 + [1.0] * 8),
        "future_covariates": ("FP32", [1, HORIZON], [float("nan")] * HORIZON),
    }

    def infer(**changes: list[float]) -> httpx.Response:
        inputs = [
            {"name": name, "datatype": kind, "shape": shape, "data": changes.get(name, data)}
            for name, (kind, shape, data) in tensors.items()
        ]
        payload = json.dumps({"inputs": inputs}).encode()  # json.dumps writes NaN, as numpy-based clients do
        return client.post(f"/v2/models/{upstream.name}/infer", content=payload)

    accepted = infer()
    assert accepted.status_code == 200, accepted.text
    (output,) = accepted.json()["outputs"]
    assert output["shape"] == [1, 21, HORIZON]
    np.testing.assert_allclose(output["data"][0], 1.0 + (UPSTREAM_QUANTILES[0] - 0.5) * 10.0, rtol=1e-5)

    refused = infer(attention_mask=[float("nan")] * CONTEXT)
    assert refused.status_code == 422
    assert "'attention_mask'" in refused.json()["error"]
