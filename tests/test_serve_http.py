"""The online deployment over real HTTP on 127.0.0.1: answers, the bad-input battery, overload, tritonclient.

Integration tier: a real local Ray (the shared 2-CPU test instance), real Serve, real ORT sessions. Three
applications run side by side: the reference checkpoint (the main one), the tiny graph with a one-slot queue,
to provoke the overload 503 on purpose, and a tiny graph that ONNX Runtime fails to run on a poison value
(``failing_graph``), to provoke real model failures.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

from conftest import free_port, start_test_ray
from failing_graph import POISON, write_failing_chronos2

from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.resources import REFERENCE_CHECKPOINT
from distributed_onnx.serve.operations.metrics import PHASES

pytestmark = pytest.mark.integration

CHECKPOINT = REFERENCE_CHECKPOINT
MODEL = CHECKPOINT.stem
METADATA = LocalCheckpoint(path=CHECKPOINT).resolve().metadata
CONTEXT, HORIZON = METADATA.context_length, METADATA.horizon_length


@functools.cache
def grpc_port() -> int:
    """Picked when Serve starts (in ``base_url``), not at import: a port free at collection may be taken by then."""
    return free_port()


@pytest.fixture(scope="module")
def base_url(tiny_checkpoint: ResolvedCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Serve on a free loopback port: the main app at /, an overload-prone one at /overload, /failing."""
    from ray import serve

    from distributed_onnx.serve.app import build_app
    from distributed_onnx.serve.settings import ServeSettings

    start_test_ray()  # what the shared ray_session fixture does, at module scope
    port = free_port()
    from ray.serve.config import gRPCOptions

    from distributed_onnx.serve.wire.grpc_messages import SERVICER_FUNCTION

    grpc_options = gRPCOptions(port=grpc_port(), grpc_servicer_functions=[SERVICER_FUNCTION])
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 60}, grpc_options=grpc_options)
    main = ServeSettings(checkpoint=CHECKPOINT, port=port, max_batch_size=8, batch_wait_ms=2, health_check_period_s=2)
    overload = ServeSettings(
        checkpoint=tiny_checkpoint.weights_path,
        port=port,
        cpus_per_replica=0.5,
        max_batch_size=1,
        max_ongoing_requests=1,
        max_queued_requests=1,
        retry_after_s=2,
        warm_up_rows=0,
    )
    failing = ServeSettings(
        checkpoint=write_failing_chronos2(tmp_path_factory.mktemp("failing")).weights_path,
        port=port,
        cpus_per_replica=0.5,
        max_batch_size=8,
        batch_wait_ms=50,
        max_consecutive_model_failures=2,
        health_check_period_s=60,  # Serve would replace the not-ready replica at its next check: after the tests
        warm_up_rows=0,
    )
    serve.run(build_app(main), name="main", route_prefix="/", blocking=False)
    serve.run(build_app(overload), name="overload", route_prefix="/overload", blocking=False)
    serve.run(build_app(failing), name="failing", route_prefix="/failing", blocking=False)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def local_worker() -> InferenceWorker:
    """The backtest's worker in this process, one thread like a replica's."""
    config = WorkerConfig(
        checkpoint=CHECKPOINT,
        providers=[CpuProvider()],
        session_options=SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False),
    )
    return InferenceWorker.from_config(config)


# ------------------------------------------------------------------------------------------ health, docs


def test_health_metadata_and_docs(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get(f"/v2/models/{MODEL}/ready").status_code == 200
    metadata = client.get(f"/v2/models/{MODEL}").json()
    assert metadata["name"] == MODEL
    inputs = {tensor["name"]: tensor for tensor in metadata["inputs"]}
    assert inputs["context"]["datatype"] == "FP32" and inputs["context"]["shape"][-1] == CONTEXT
    assert inputs["group_ids"]["datatype"] == "INT64"
    assert metadata["outputs"][0]["name"] == "quantile_preds"
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/forecast"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ForecastRequest"}
    assert "SeriesHistory" in spec["components"]["schemas"]


def test_docs_load_their_assets_from_the_server_itself(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r"""(?:src|href)=["']?([^"' >]+\.(?:js|css))""", page.text)
    assert len(assets) == 2, page.text  # Swagger UI's bundle and its stylesheet
    assert all(asset.startswith("/") for asset in assets), assets  # not a CDN: works offline
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200 and len(response.content) > 10_000, asset
    assert b"SwaggerUIBundle" in client.get(next(a for a in assets if a.endswith(".js"))).content


def test_docs_list_forecast_first_with_a_real_example_body_that_a_replica_answers(client: httpx.Client) -> None:
    """Issue 46: /docs listed /v1/forecast last, with no example body. The example is the README's request (the
    bundled series where its actuals are, checked by test_readme_serve.py) and validates, and a replica answers it."""
    from test_readme_serve import _serve_request

    from distributed_onnx.serve.wire.schemas import ForecastRequest

    spec = client.get("/openapi.json").json()
    assert next(iter(spec["paths"])) == "/v1/forecast", list(spec["paths"])
    media = spec["paths"]["/v1/forecast"]["post"]["requestBody"]["content"]["application/json"]
    example = media["examples"]["taylor_ew"]["value"]
    assert example == _serve_request()
    ForecastRequest.model_validate(example)
    response = client.post("/v1/forecast", json=example)
    assert response.status_code == 200, response.text
    (forecast,) = response.json()["forecasts"]
    assert forecast["series_id"] == "taylor_ew" and set(forecast["quantiles"]) == {"0.1", "0.5", "0.9"}
    assert len(forecast["quantiles"]["0.5"]) == 4 and forecast["timestamps"][0].startswith("2000-08-20T02:00:00")


# ------------------------------------------------------------------------------------------ forecasts


def backtest_windows(tmp_path: Path, n_windows: int) -> tuple[Any, Any, Any, list[Any]]:
    """The backtest's own plan and the first model batch of its first part, packed as its actor packs it."""
    from backtest_data import first_batch

    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings

    plan = prepare(BacktestSettings(checkpoint=CHECKPOINT, output=tmp_path / "run", n_windows=n_windows, stride=48))
    planned, batch = first_batch(plan)
    return plan, planned, batch, [plan.table.series[int(i)] for i in planned.series_index]


def test_forecast_equals_the_backtest_forecast_of_the_same_window(
    client: httpx.Client, local_worker: InferenceWorker, tmp_path: Path
) -> None:
    plan, planned, batch, series = backtest_windows(tmp_path, n_windows=3)
    expected = local_worker.forecast_batch(batch, plan.spec.context_length, plan.spec.horizon, plan.quantiles)
    histories = []
    for index, (item, origin) in enumerate(zip(series, planned.origin_index, strict=True)):
        # the whole history up to the origin (longer than the context: its last CONTEXT values are used)
        y = [None if np.isnan(v) else float(v) for v in item.values[: int(origin)]]
        histories.append({"series_id": f"w{index}", "y": y})
    response = client.post("/v1/forecast", json={"series": histories})
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["model"] == MODEL
    for index, forecast in enumerate(document["forecasts"]):
        assert forecast["series_id"] == f"w{index}"
        assert "timestamps" not in forecast or forecast["timestamps"] is None
        got = np.array([forecast["quantiles"][format(q, "g")] for q in plan.quantiles], dtype=np.float32).T
        np.testing.assert_array_equal(got, expected[index])


def test_forecast_with_horizon_quantiles_timestamps_and_gaps(
    client: httpx.Client, local_worker: InferenceWorker
) -> None:
    rng = np.random.default_rng(0)
    y: list[float | None] = [float(v) for v in 30000 + 1000 * rng.standard_normal(100)]
    y[10] = y[50] = None
    body = {
        "series": [{"series_id": "a", "y": y, "start": "2024-01-01T00:00:00Z"}],
        "horizon": 12,
        "quantiles": [0.05, 0.25, 0.5, 0.9],
    }
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    forecast = response.json()["forecasts"][0]
    assert list(forecast["quantiles"]) == ["0.05", "0.25", "0.5", "0.9"]
    assert all(len(values) == 12 for values in forecast["quantiles"].values())
    assert forecast["timestamps"][0] == "2024-01-03T02:00:00Z"  # 100 half-hours after the start
    context = np.array([[np.nan if v is None else v for v in y]], dtype=np.float32)
    expected = local_worker.forecast(context, 12, [0.05, 0.25, 0.5, 0.9])[0]
    got = np.array(list(forecast["quantiles"].values()), dtype=np.float32).T
    np.testing.assert_array_equal(got, expected)
    stamps = forecast["timestamps"]
    assert len(stamps) == 12
    assert stamps[1] > stamps[0]


# ------------------------------------------------------------------------------------------ Open Inference Protocol


def chronos_inputs(rows: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "context": rng.standard_normal((rows, CONTEXT)).astype(np.float32),
        "attention_mask": np.ones((rows, CONTEXT), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, HORIZON), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, HORIZON), dtype=np.float32),
    }


def v2_body(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    return {
        "inputs": [
            {
                "name": name,
                "shape": list(value.shape),
                "datatype": datatypes[value.dtype],
                "data": value.ravel().tolist(),
            }
            for name, value in inputs.items()
        ]
    }


def test_v2_infer_matches_the_backend(client: httpx.Client, local_worker: InferenceWorker) -> None:
    inputs = chronos_inputs()
    response = client.post(f"/v2/models/{MODEL}/infer", json=v2_body(inputs) | {"id": "r1"})
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["model_name"] == MODEL and document["id"] == "r1"
    (output,) = document["outputs"]
    assert output["name"] == "quantile_preds" and output["datatype"] == "FP32" and output["shape"] == [2, 9, HORIZON]
    expected = local_worker.backend.run(inputs)["quantile_preds"]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32).reshape(2, 9, HORIZON), expected)


def _metric_sums(client: httpx.Client) -> dict[tuple[str, ...], float]:
    """``/metrics`` of the main replica: (sample, model[, endpoint, code]) -> value, replicas summed."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            labels = sample.labels
            key = (sample.name, labels.get("model", ""), labels.get("endpoint", ""), labels.get("code", ""))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def test_metrics_split_each_requests_time_into_serialization_batch_wait_queue_and_compute(
    base_url: str, client: httpx.Client
) -> None:
    """Eight concurrent forecasts (some batched) and one v2 infer, then /metrics over HTTP: each part of a request
    observed once per request for its model (no batch wait for the unbatched v2 call), and the parts of the
    requests' time add up to no more than the requests' own time."""
    before = _metric_sums(client)
    bodies = [{"series": [{"series_id": f"m{k}", "y": [float(k + step) for step in range(64)]}]} for k in range(8)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as concurrent:
            return await asyncio.gather(*(concurrent.post("/v1/forecast", json=body) for body in bodies))

    assert [response.status_code for response in asyncio.run(burst())] == [200] * 8
    assert client.post(f"/v2/models/{MODEL}/infer", json=v2_body(chronos_inputs())).status_code == 200
    after = _metric_sums(client)

    def grew(name: str, endpoint: str = "", code: str = "") -> float:
        key = (name, MODEL, endpoint, code)
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("distributed_onnx_requests_total", "forecast", "200") == 8
    assert grew("distributed_onnx_requests_total", "infer", "200") == 1
    for phase, requests in {"serialization": 9, "batch_wait": 8, "queue": 9, "compute": 9}.items():
        assert grew(f"distributed_onnx_{phase}_duration_seconds_count") == requests, phase
    parts = sum(grew(f"distributed_onnx_{phase}_duration_seconds_sum") for phase in PHASES)
    whole = sum(grew("distributed_onnx_request_duration_seconds_sum", endpoint) for endpoint in ("forecast", "infer"))
    # Every request was measured in each phase (the counts above) and took some time; how long is a benchmark's.
    assert grew("distributed_onnx_compute_duration_seconds_sum") > 0 and parts > 0 and whole > 0
    assert grew("distributed_onnx_batch_requests_count") >= 1 and grew("distributed_onnx_batch_windows_sum") == 8 + 2


def test_tritonclient_http_round_trip(base_url: str, local_worker: InferenceWorker) -> None:
    http = pytest.importorskip("tritonclient.http")
    client = http.InferenceServerClient(url=base_url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    metadata = client.get_model_metadata(MODEL)
    assert [tensor["name"] for tensor in metadata["outputs"]] == ["quantile_preds"]
    inputs = chronos_inputs(3)
    infer_inputs = []
    for name, value in inputs.items():
        tensor = http.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(value, binary_data=False)
        infer_inputs.append(tensor)
    result = client.infer(MODEL, infer_inputs, outputs=[http.InferRequestedOutput("quantile_preds", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("quantile_preds"), local_worker.backend.run(inputs)["quantile_preds"])
    with pytest.raises(Exception, match="Unknown model"):
        client.infer("nope", infer_inputs)
    client.close()


# ------------------------------------------------------------------------------------------ binary tensor data

HEADER_LENGTH = "Inference-Header-Content-Length"


def triton_inputs(http: Any, inputs: dict[str, np.ndarray], json_names: tuple[str, ...] = ()) -> list[Any]:
    """tritonclient inputs with its default binary data, except ``json_names`` (sent as JSON ``data``)."""
    tensors = []
    for name, value in inputs.items():
        tensor = http.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        if name in json_names:
            tensor.set_data_from_numpy(value, binary_data=False)
        else:
            tensor.set_data_from_numpy(value)  # the default: binary_data=True
        tensors.append(tensor)
    return tensors


def test_tritonclient_http_default_binary_round_trip(
    client: httpx.Client, base_url: str, local_worker: InferenceWorker
) -> None:
    http = pytest.importorskip("tritonclient.http")
    triton = http.InferenceServerClient(url=base_url.removeprefix("http://"))
    assert "binary_tensor_data" in triton.get_server_metadata()["extensions"]
    inputs = chronos_inputs(3)
    expected = local_worker.backend.run(inputs)["quantile_preds"]
    as_json = client.post(f"/v2/models/{MODEL}/infer", json=v2_body(inputs)).json()["outputs"][0]
    np.testing.assert_array_equal(np.array(as_json["data"], dtype=np.float32).reshape(as_json["shape"]), expected)
    # no outputs named: tritonclient asks for all of them as binary (binary_data_output)
    for outputs in (None, [http.InferRequestedOutput("quantile_preds")]):
        result = triton.infer(MODEL, triton_inputs(http, inputs), outputs=outputs, request_id="b1")
        assert result.get_response()["id"] == "b1"
        assert result.get_output("quantile_preds")["parameters"] == {"binary_data_size": expected.nbytes}
        got = result.as_numpy("quantile_preds")
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    triton.close()


def test_tritonclient_http_mixed_binary_and_json_inputs(base_url: str, local_worker: InferenceWorker) -> None:
    http = pytest.importorskip("tritonclient.http")
    triton = http.InferenceServerClient(url=base_url.removeprefix("http://"))
    inputs = chronos_inputs(2)
    expected = local_worker.backend.run(inputs)["quantile_preds"]
    for json_names in (("group_ids", "attention_mask"), ("context",)):
        tensors = triton_inputs(http, inputs, json_names)
        result = triton.infer(MODEL, tensors, outputs=[http.InferRequestedOutput("quantile_preds", binary_data=False)])
        assert not result.get_output("quantile_preds").get("parameters")  # JSON data, as asked
        np.testing.assert_array_equal(result.as_numpy("quantile_preds"), expected)
    triton.close()


def binary_request(inputs: dict[str, np.ndarray], **fields: Any) -> tuple[dict[str, Any], bytes]:
    """A v2 JSON header sending every input as binary data (in input order), and the bytes that follow it."""
    header = v2_body(inputs) | fields
    for tensor, value in zip(header["inputs"], inputs.values(), strict=True):
        del tensor["data"]
        tensor["parameters"] = {"binary_data_size": value.nbytes}
    return header, b"".join(value.astype(value.dtype.newbyteorder("<")).tobytes() for value in inputs.values())


def post_binary(
    client: httpx.Client, header: dict[str, Any], payload: bytes, header_length: int | None = None
) -> httpx.Response:
    head = json.dumps(header).encode()
    length = len(head) if header_length is None else header_length
    return client.post(
        f"/v2/models/{MODEL}/infer",
        content=head + payload,
        headers={HEADER_LENGTH: str(length), "content-type": "application/octet-stream"},
    )


def test_binary_data_output_returns_raw_outputs_after_the_json_header(
    client: httpx.Client, local_worker: InferenceWorker
) -> None:
    inputs = chronos_inputs(2)
    expected = local_worker.backend.run(inputs)["quantile_preds"]
    header, payload = binary_request(inputs, parameters={"binary_data_output": True})
    response = post_binary(client, header, payload)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers[HEADER_LENGTH])
    (output,) = json.loads(response.content[:length])["outputs"]
    assert output == {
        "name": "quantile_preds",
        "shape": list(expected.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": expected.nbytes},
    }
    assert len(response.content) == length + expected.nbytes
    np.testing.assert_array_equal(
        np.frombuffer(response.content[length:], dtype="<f4").reshape(expected.shape), expected
    )
    # binary inputs without binary outputs: a plain JSON response, no header
    header, payload = binary_request(inputs)
    response = post_binary(client, header, payload)
    assert response.status_code == 200 and HEADER_LENGTH.lower() not in response.headers
    assert response.headers["content-type"] == "application/json"
    np.testing.assert_array_equal(np.array(response.json()["outputs"][0]["data"], dtype=np.float32), expected.ravel())


def _malformed(case: str) -> tuple[dict[str, Any], bytes, int | None]:
    inputs = chronos_inputs(1)
    header, payload = binary_request(inputs)
    if case == "header-beyond-body":
        return header, payload, len(json.dumps(header)) + len(payload) + 1
    if case == "size-vs-shape":
        header["inputs"][0]["parameters"]["binary_data_size"] -= 4
        return header, payload[4:], None
    if case == "past-the-end":
        return header, payload[:-4], None
    if case == "leftover-bytes":
        return header, payload + b"\0" * 4, None
    if case == "bytes-datatype":
        header["inputs"][0]["datatype"] = "BYTES"
        return header, payload, None
    raise AssertionError(case)


MALFORMED_BINARY = [
    # (case, status, texts the error must contain)
    ("header-beyond-body", 422, [HEADER_LENGTH]),
    ("size-vs-shape", 422, ["'context'", "binary_data_size"]),
    ("past-the-end", 422, ["'future_covariates_mask'", "runs past the end"]),
    ("leftover-bytes", 422, ["'future_covariates_mask'", "4 bytes after"]),
    ("bytes-datatype", 422, ["'context'", "BYTES"]),
]


@pytest.mark.parametrize(("case", "status", "needles"), MALFORMED_BINARY, ids=[case[0] for case in MALFORMED_BINARY])
def test_malformed_binary_data_is_a_4xx_naming_the_tensor(
    client: httpx.Client, case: str, status: int, needles: list[str]
) -> None:
    header, payload, length = _malformed(case)
    response = post_binary(client, header, payload, length)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert all(needle in error for needle in needles), error


def test_binary_sizes_without_the_header_length_header_are_a_4xx(client: httpx.Client) -> None:
    header, payload = binary_request(chronos_inputs(1))
    response = client.post(f"/v2/models/{MODEL}/infer", content=json.dumps(header).encode() + payload)
    assert response.status_code in {400, 422}, response.text
    assert "error" in response.json()
    response = client.post(f"/v2/models/{MODEL}/infer", json=header)  # the JSON alone: sizes but no bytes
    assert response.status_code == 422 and "'context'" in response.json()["error"]
    assert HEADER_LENGTH in response.json()["error"]


def test_binary_body_above_the_limit_is_413(client: httpx.Client) -> None:
    header, _ = binary_request(chronos_inputs(1))
    response = post_binary(client, header, b"\0" * (9 * 1024 * 1024))
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]


# ------------------------------------------------------------------------------------------ bad input

GOOD_SERIES = {"series_id": "a", "y": [1.0, 2.0, 3.0]}


def _v2_with(**changes: Any) -> dict[str, Any]:
    body = v2_body(chronos_inputs(1))
    body["inputs"][0] = body["inputs"][0] | changes
    return body


BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    # (id, path, body (bytes = raw), status, text the error must contain)
    ("malformed-json", "/v1/forecast", b'{"series": [', 400, "not valid JSON"),
    ("empty-body", "/v1/forecast", b"", 400, "empty"),
    ("not-an-object", "/v1/forecast", b"[1, 2]", 422, "JSON object"),
    ("missing-series", "/v1/forecast", {"horizon": 4}, 422, "series"),
    ("extra-field", "/v1/forecast", {"series": [GOOD_SERIES], "colour": "red"}, 422, "colour"),
    ("extra-series-field", "/v1/forecast", {"series": [GOOD_SERIES | {"x": 1}]}, 422, "series.0.x"),
    ("y-wrong-type", "/v1/forecast", {"series": [{"series_id": "a", "y": "abc"}]}, 422, "series.0.y"),
    ("y-string-value", "/v1/forecast", {"series": [{"series_id": "a", "y": [1.0, "x"]}]}, 422, "series.0.y.1"),
    ("y-nan", "/v1/forecast", b'{"series": [{"series_id": "a", "y": [1.0, NaN]}]}', 422, "series.0.y.1"),
    ("y-inf", "/v1/forecast", b'{"series": [{"series_id": "a", "y": [Infinity]}]}', 422, "series.0.y.0"),
    ("y-empty", "/v1/forecast", {"series": [{"series_id": "a", "y": []}]}, 422, "series.0.y"),
    (
        "y-all-null",
        "/v1/forecast",
        {"series": [GOOD_SERIES, {"series_id": "b", "y": [None, None]}]},
        422,
        "series[1].y",
    ),
    ("no-series", "/v1/forecast", {"series": []}, 422, "series"),
    # Values of another JSON type are refused, not converted (strict: they were taken as numbers, 200).
    ("y-numeric-strings", "/v1/forecast", {"series": [{"series_id": "a", "y": ["1", "2"]}]}, 422, "series.0.y.0"),
    ("y-booleans", "/v1/forecast", {"series": [{"series_id": "a", "y": [True, 1.0]}]}, 422, "series.0.y.0"),
    ("horizon-string", "/v1/forecast", {"series": [GOOD_SERIES], "horizon": "4"}, 422, "horizon"),
    ("quantile-string", "/v1/forecast", {"series": [GOOD_SERIES], "quantiles": ["0.5"]}, 422, "quantiles.0"),
    ("start-number", "/v1/forecast", {"series": [GOOD_SERIES | {"start": 5}]}, 422, "series.0.start"),
    ("series-id-number", "/v1/forecast", {"series": [{"series_id": 7, "y": [1.0]}]}, 422, "series.0.series_id"),
    ("series-twice", "/v1/forecast", {"series": [GOOD_SERIES, GOOD_SERIES]}, 422, f"{GOOD_SERIES['series_id']!r}"),
    # Outside test: 4 values from 00:00 and 3 from 00:30 on a 30-minute model are one origin (02:00), logged as two
    # windows of one key, 200. The route, which knows the model's resolution, refuses them naming the id and origin.
    (
        "series-one-origin-twice",
        "/v1/forecast",
        {
            "series": [
                GOOD_SERIES | {"y": [1.0, 2.0, 3.0, 4.0], "start": "2024-01-01T00:00:00Z"},
                GOOD_SERIES | {"start": "2024-01-01T00:30:00Z"},
            ]
        },
        422,
        "series[1]: series_id 'a' has a window at origin 2024-01-01T02:00:00+00:00 already (series[0]",
    ),
    # An error body quotes what the client sent: its control characters come back escaped, never as they are.
    ("control-characters", "/v1/forecast", {"series": [GOOD_SERIES], "\x1b[2J\x00": 1}, 422, "\\x1b[2J\\x00"),
    ("horizon-too-long", "/v1/forecast", {"series": [GOOD_SERIES], "horizon": HORIZON + 1}, 422, "horizon"),
    ("horizon-zero", "/v1/forecast", {"series": [GOOD_SERIES], "horizon": 0}, 422, "horizon"),
    ("horizon-float", "/v1/forecast", {"series": [GOOD_SERIES], "horizon": 2.5}, 422, "horizon"),
    ("quantile-one", "/v1/forecast", {"series": [GOOD_SERIES], "quantiles": [0.5, 1.0]}, 422, "quantiles"),
    ("quantile-zero", "/v1/forecast", {"series": [GOOD_SERIES], "quantiles": [0.0]}, 422, "quantiles"),
    ("quantile-unsorted", "/v1/forecast", {"series": [GOOD_SERIES], "quantiles": [0.9, 0.1]}, 422, "quantiles"),
    ("bad-start", "/v1/forecast", {"series": [GOOD_SERIES | {"start": "yesterday"}]}, 422, "series.0.start"),
    (
        "far-future-start",
        "/v1/forecast",
        {"series": [GOOD_SERIES, GOOD_SERIES | {"series_id": "b", "start": "9999-12-31T23:30:00Z"}]},
        422,
        "series[1].start",
    ),
    ("unknown-model", "/v2/models/nope/infer", v2_body(chronos_inputs(1)), 404, "nope"),
    ("v2-malformed", f"/v2/models/{MODEL}/infer", b"{", 400, "not valid JSON"),
    ("v2-no-inputs", f"/v2/models/{MODEL}/infer", {"inputs": []}, 422, "inputs"),
    ("v2-extra-field", f"/v2/models/{MODEL}/infer", v2_body(chronos_inputs(1)) | {"x": 1}, 422, "x"),
    ("v2-bad-datatype", f"/v2/models/{MODEL}/infer", _v2_with(datatype="FP99"), 422, "inputs.0.datatype"),
    ("v2-wrong-datatype", f"/v2/models/{MODEL}/infer", _v2_with(datatype="FP64"), 422, "'context'"),
    ("v2-shape-mismatch", f"/v2/models/{MODEL}/infer", _v2_with(shape=[1, CONTEXT - 1]), 422, "'context'"),
    ("v2-wrong-dim", f"/v2/models/{MODEL}/infer", _v2_with(shape=[2, CONTEXT // 2]), 422, "'context'"),
    ("v2-strings", f"/v2/models/{MODEL}/infer", _v2_with(data=["a"] * CONTEXT), 422, "'context'"),
    ("v2-unknown-input", f"/v2/models/{MODEL}/infer", _v2_with(name="ctx"), 422, "ctx"),
    (
        "v2-nan",
        f"/v2/models/{MODEL}/infer",
        json.dumps(_v2_with(data=[float("nan")] * CONTEXT)).encode(),
        422,
        "'context'",
    ),
    (
        "v2-series-ids-twice",
        f"/v2/models/{MODEL}/infer",
        v2_body(chronos_inputs(2)) | {"parameters": {"series_ids": "a,a"}},
        422,
        "'a' is given twice",
    ),
    (
        "v2-unknown-output",
        f"/v2/models/{MODEL}/infer",
        v2_body(chronos_inputs(1)) | {"outputs": [{"name": "nope"}]},
        422,
        "nope",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"), [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS]
)
def test_bad_input_is_a_4xx_naming_the_field(
    client: httpx.Client, path: str, body: Any, status: int, needle: str
) -> None:
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]


def test_one_series_at_two_origins_is_two_windows(client: httpx.Client) -> None:
    """The refusal of one origin twice (above) leaves one series at two origins alone: two windows, as a
    backtest's."""
    series = [GOOD_SERIES | {"start": "2024-01-01T00:00:00Z"}, GOOD_SERIES | {"start": "2024-01-01T00:30:00Z"}]
    response = client.post("/v1/forecast", json={"series": series})
    assert response.status_code == 200, response.text
    assert len(response.json()["forecasts"]) == 2


def test_unknown_model_and_route_are_404_with_an_error_body(client: httpx.Client) -> None:
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v3/anything"):
        response = client.get(path)
        assert response.status_code == 404
        assert "error" in response.json()


def test_body_above_the_limit_is_413(client: httpx.Client) -> None:
    big = b'{"series": [{"series_id": "a", "y": [' + b"1.0," * (9 * 1024 * 1024 // 4) + b"1.0]}]}"
    response = client.post("/v1/forecast", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while the body streams
        yield b'{"series": [{"series_id": "a", "y": ['
        for _ in range(9):
            yield b"1.0," * (1024 * 1024 // 4)
        yield b"1.0]}]}"

    response = client.post("/v1/forecast", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


# ------------------------------------------------------------------------------------------ load


async def _burst(base_url: str, path: str, bodies: list[Any], concurrency: int) -> list[httpx.Response]:
    """POST every body (at most ``concurrency`` at once); the responses in the order of ``bodies``."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(body: Any) -> httpx.Response:
            async with gate:
                return await client.post(path, json=body)

        return await asyncio.gather(*(one(body) for body in bodies))


def distinct_bodies(count: int, series: int, length: int) -> list[dict[str, Any]]:
    """Requests that each forecast differently (their own level) and name their own series."""
    rng = np.random.default_rng(2)
    return [
        {
            "series": [
                {"series_id": f"r{k}-s{i}", "y": (1000.0 * (k + 1) + rng.standard_normal(length)).tolist()}
                for i in range(series)
            ]
        }
        for k in range(count)
    ]


def expected_forecast(worker: InferenceWorker, body: dict[str, Any]) -> np.ndarray:
    context = np.array([item["y"][-CONTEXT:] for item in body["series"]], dtype=np.float32)
    return worker.forecast(context, HORIZON, METADATA.native_quantiles)


def test_concurrent_burst_mixes_good_and_bad_requests_and_each_gets_its_own_answer(
    client: httpx.Client, base_url: str, local_worker: InferenceWorker
) -> None:
    goods = distinct_bodies(96, series=4, length=600)
    bad = {"series": [GOOD_SERIES], "horizon": 1000}

    async def both() -> tuple[list[httpx.Response], list[httpx.Response]]:
        return await asyncio.gather(
            _burst(base_url, "/v1/forecast", goods, 32), _burst(base_url, "/v1/forecast", [bad] * 40, 8)
        )

    answers, refusals = asyncio.run(both())
    # 40 concurrent requests, below the replica's ongoing limit: nothing is rejected, nothing is lost
    assert [r.status_code for r in answers] == [200] * len(goods), {r.status_code for r in answers}
    assert {r.status_code for r in refusals} == {422}  # a bad request fails alone, never its batch
    for body, response in zip(goods, answers, strict=True):
        forecasts = response.json()["forecasts"]
        assert [f["series_id"] for f in forecasts] == [item["series_id"] for item in body["series"]]
        got = np.array([[f["quantiles"][format(q, "g")] for q in METADATA.native_quantiles] for f in forecasts])
        # batches of other sizes may round differently in the last bits; a misrouted answer is ~1000 off
        np.testing.assert_allclose(got.transpose(0, 2, 1), expected_forecast(local_worker, body), rtol=1e-4)
    assert client.get("/v2/health/ready").status_code == 200


def test_a_model_failure_fails_its_whole_batch_with_json_5xx_and_the_next_batch_succeeds(
    base_url: str,
) -> None:
    bodies = [{"series": [{"series_id": f"r{k}", "y": [float(k + 1)] * 16}]} for k in range(8)]
    bodies[5]["series"][0]["y"][-1] = 2 * POISON
    responses = asyncio.run(_burst(base_url, "/failing/v1/forecast", bodies, 8))
    failed = [(k, r) for k, r in enumerate(responses) if r.status_code != 200]
    assert {r.status_code for _, r in failed} == {500}
    errors = {r.json()["error"] for _, r in failed}  # JSON, one message for the whole failed batch
    assert len(errors) == 1, errors
    (error,) = errors
    match = re.search(r"the model failed on (?:1 request|a batch of (\d+) requests)", error)
    assert match is not None and "Gather" in error, error
    assert 5 in {k for k, _ in failed}  # the poisoned request is among them ...
    assert len(failed) == int(match.group(1) or 1)  # ... with exactly the other members of its batch
    for k, response in enumerate(responses):
        if response.status_code == 200:  # every other request got its own forecast
            (forecast,) = response.json()["forecasts"]
            assert forecast["series_id"] == f"r{k}" and forecast["quantiles"]["0.5"][0] == pytest.approx(k + 1)
    after = asyncio.run(_burst(base_url, "/failing/v1/forecast", bodies[:5], 5))
    assert [r.status_code for r in after] == [200] * 5


def test_ready_answers_503_once_the_model_keeps_failing_and_200_after_a_success(base_url: str) -> None:
    poison = {"series": [{"series_id": "p", "y": [1.0, 2 * POISON]}]}
    with httpx.Client(base_url=f"{base_url}/failing", timeout=30) as client:
        assert client.get("/v2/health/ready").status_code == 200
        for _ in range(2):  # max_consecutive_model_failures=2
            response = client.post("/v1/forecast", json=poison)
            assert response.status_code == 500 and "Gather" in response.json()["error"]
        not_ready = client.get("/v2/health/ready")
        assert not_ready.status_code == 503
        assert "failed on the last 2 calls" in not_ready.json()["error"]
        assert client.get("/v2/models/failing/ready").status_code == 503
        assert client.post("/v1/forecast", json={"series": [{"series_id": "a", "y": [1.0]}]}).status_code == 200
        assert client.get("/v2/health/ready").json() == {"ready": True}


def test_overload_answers_503_with_retry_after_and_the_replica_stays_healthy(base_url: str) -> None:
    body = {"series": [{"series_id": f"s{i}", "y": [float(i)] * 16} for i in range(256)]}
    responses = asyncio.run(_burst(base_url, "/overload/v1/forecast", [body] * 60, 30))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503}, codes
    assert 200 in codes and 503 in codes, codes
    rejected = [r for r in responses if r.status_code == 503]
    assert all("Overloaded" in r.json()["error"] for r in rejected)  # the replica's own JSON answer
    assert {r.headers["retry-after"] for r in rejected} == {"2"}
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert client.get("/overload/v2/health/ready").status_code == 200
        from ray import serve

        status = serve.status().applications["overload"]
        assert status.status == "RUNNING"
        assert status.deployments["OnnxForecastServer"].status == "HEALTHY"


# ------------------------------------------------------------------------------------------ KServe v2 over gRPC


def grpc_client(application: str) -> tuple[Any, dict[str, str]]:
    grpc = pytest.importorskip("tritonclient.grpc")
    # Serve's gRPC proxy routes by the "application" metadata when several applications run
    return grpc.InferenceServerClient(f"127.0.0.1:{grpc_port()}"), {"application": application}


def grpc_inputs(inputs: dict[str, np.ndarray]) -> list[Any]:
    grpc = pytest.importorskip("tritonclient.grpc")
    tensors = []
    for name, value in inputs.items():
        tensor = grpc.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def test_tritonclient_grpc_through_serves_proxy_equals_http(client: httpx.Client) -> None:
    triton, headers = grpc_client("main")
    assert triton.is_server_live(headers=headers) and triton.is_server_ready(headers=headers)
    assert triton.is_model_ready(MODEL, headers=headers)
    metadata = triton.get_model_metadata(MODEL, headers=headers)
    assert [tensor.name for tensor in metadata.outputs] == ["quantile_preds"]
    inputs = chronos_inputs(3)
    result = triton.infer(MODEL, grpc_inputs(inputs), request_id="g1", headers=headers)
    assert result.get_response().id == "g1"
    over_http = client.post(f"/v2/models/{MODEL}/infer", json=v2_body(inputs)).json()["outputs"][0]
    np.testing.assert_array_equal(
        result.as_numpy("quantile_preds"), np.array(over_http["data"], dtype=np.float32).reshape(over_http["shape"])
    )
    triton.close()


def test_grpc_errors_carry_the_http_paths_messages_as_status_codes() -> None:
    from tritonclient.utils import InferenceServerException

    triton, headers = grpc_client("main")
    inputs = chronos_inputs(1)
    with pytest.raises(InferenceServerException, match=r"NOT_FOUND.*Unknown model 'nope'"):
        triton.infer("nope", grpc_inputs(inputs), headers=headers)
    inputs["context"] = inputs["context"][:, 1:]
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*'context'"):
        triton.infer(MODEL, grpc_inputs(inputs), headers=headers)
    triton.close()


def test_grpc_overload_answers_unavailable_and_the_replica_stays_healthy(base_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    rows = 256
    inputs = {
        "context": np.ones((rows, 16), dtype=np.float32),
        "attention_mask": np.ones((rows, 16), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, 8), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, 8), dtype=np.float32),
    }
    model = "tiny"

    def one(_: int) -> str:
        triton, headers = grpc_client("overload")
        try:
            triton.infer(model, grpc_inputs(inputs), headers=headers)
            return "OK"
        except InferenceServerException as exc:
            return str(exc)
        finally:
            triton.close()

    with ThreadPoolExecutor(max_workers=30) as pool:
        outcomes = list(pool.map(one, range(60)))
    assert "OK" in outcomes, outcomes
    refused = [outcome for outcome in outcomes if outcome != "OK"]
    assert refused, "no request was refused: the burst did not overload the one-slot replica"
    assert all("UNAVAILABLE" in outcome and "Overloaded" in outcome for outcome in refused), set(refused)
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert client.get("/overload/v2/health/ready").status_code == 200
