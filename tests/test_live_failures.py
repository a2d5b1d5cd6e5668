"""Failed requests in the forecast log, end to end: a real replica fails requests of every kind, the log's
failures table and records hold each one (kind, reason, model, status, protocol, time; never the body), and
``score`` (its summary, failures.parquet, its printed output and report.html) gives each model's failure rate.

Integration tier: the application on a real local Ray Serve (the shared test Ray on 127.0.0.1, Serve's proxy,
one replica holding two tiny Chronos-2 checkpoints), real HTTP and gRPC on 127.0.0.1, real ONNX Runtime:

- validation: malformed JSON and an unknown model (no model known), a horizon beyond ``tiny``'s, a tensor of the
  wrong shape for ``failing`` (HTTP) and of the wrong datatype for ``tiny`` (gRPC);
- model error: ``failing`` is a graph ONNX Runtime itself fails to run when a context value exceeds
  :data:`failing_graph.POISON` (tests/failing_graph.py), sent such a value;
- admission: 24 bodies of ~0.9 MB at once against 80 MB of request memory (as tests/test_serve_limits.py): the
  replica refuses most with 503 before reading them; those it admits fail validation (they are not tensors).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from backtest_data import dense_series, write_dataset
from conftest import free_port, start_test_ray
from failing_graph import POISON, write_failing_chronos2
from graphs import write_tiny_chronos2

from distributed_onnx.cli import main
from distributed_onnx.live.log.failures import ADMISSION, MODEL_ERROR, VALIDATION, read_failures
from distributed_onnx.live.log.layout import read_states
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.location import Location

pytestmark = pytest.mark.integration

FAILING, TINY = "failing", "tiny"
UNKNOWN = None
MAX_BODY_BYTES = 1_000_000
MEMORY_BYTES = 80_000_000  # two bodies of ~1 MB at 40x each
HISTORY = 24


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = write_dataset(root / "load.parquet", covariate=False)
        self.failing = write_failing_chronos2(root / "models", name=FAILING).weights_path
        self.tiny = write_tiny_chronos2(root / "models", name=TINY).weights_path
        self.log = root / "log"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("failures"))


class Server:
    """The application on a real local Serve (the shared test Ray), HTTP and gRPC on free loopback ports."""

    def __init__(self, url: str, grpc_port: int) -> None:
        self.url = url
        self.grpc_port = grpc_port


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[Server]:
    pytest.importorskip("ray.serve")
    pytest.importorskip("onnxruntime")
    from ray import serve
    from ray.serve.config import gRPCOptions

    from distributed_onnx.serve.app import build_app
    from distributed_onnx.serve.settings import ServeSettings
    from distributed_onnx.serve.wire.grpc_messages import SERVICER_FUNCTION

    start_test_ray()
    port, grpc_port = free_port(), free_port()
    grpc_options = gRPCOptions(port=grpc_port, grpc_servicer_functions=[SERVICER_FUNCTION])
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 60}, grpc_options=grpc_options)
    settings = ServeSettings(
        checkpoint=[setup.failing, setup.tiny],
        port=port,
        forecast_log=setup.log,
        forecast_log_flush_s=0.2,
        cpus_per_replica=1,
        warm_up_rows=0,
        max_consecutive_model_failures=100,  # the failing model stays in service: its failures are the test
        max_body_bytes=MAX_BODY_BYTES,
        max_request_memory_bytes=MEMORY_BYTES,
    )
    serve.run(build_app(settings), name="failures", route_prefix="/", blocking=False)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the application did not become ready"
        time.sleep(0.1)
    try:
        yield Server(url, grpc_port)
    finally:
        serve.shutdown()


def _history(series_id: str) -> tuple[list[float], str]:
    data = dense_series()[series_id]
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(data["start_us"]) / 1e6))
    return [float(value) for value in np.nan_to_num(data["y"][:HISTORY])], start


def _forecast(model: str | None, y: list[float], start: str | None = None, horizon: int = 4) -> dict[str, Any]:
    series: dict[str, Any] = {"series_id": "a", "y": y}
    if start is not None:
        series["start"] = start
    body: dict[str, Any] = {"series": [series], "horizon": horizon, "quantiles": [0.1, 0.5, 0.9]}
    if model is not None:
        body["model"] = model
    return body


async def _concurrent(url: str, path: str, bodies: list[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        headers = {"content-type": "application/json"}
        return await asyncio.gather(*(client.post(path, content=body, headers=headers) for body in bodies))


def _grpc_infer(server: Server, model: str, context: np.ndarray, wrong_datatype: bool = False) -> Any:
    """A ``ModelInfer`` call's status (``wrong_datatype``: ``group_ids`` sent as FP32, which the model refuses)."""
    grpc = pytest.importorskip("grpc")
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest, ModelInferResponse

    request = ModelInferRequest(model_name=model, id="grpc-1")
    rows, width = context.shape
    tensors = {
        "context": context.astype(np.float32),
        "attention_mask": np.ones((rows, width), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.float32 if wrong_datatype else np.int64),
        "future_covariates": np.zeros((rows, 8), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, 8), dtype=np.float32),
    }
    for name, value in tensors.items():
        request.inputs.add(name=name, datatype="FP32" if value.dtype == np.float32 else "INT64", shape=value.shape)
        request.raw_input_contents.append(value.tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=ModelInferRequest.SerializeToString,
            response_deserializer=ModelInferResponse.FromString,
        )
        try:
            infer(request, timeout=60)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()


def _records(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for state in states for record in [*state.get("models", {}).values(), state.get("unattributed", {})]]


def _wait_for_the_log(root: Path, requests: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The writers' records once they count ``requests`` requests (answered and failed) and every failure row
    is settled (written or dropped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _records(states := read_states(Location(root)))
        total = sum(r.get("requests_answered", 0) + sum(r.get("requests_failed", {}).values()) for r in records)
        settled = all(
            r.get("failures_logged", 0) + r.get("failures_dropped", 0) == sum(r.get("requests_failed", {}).values())
            for r in records
        )
        if (total == requests and settled) or time.monotonic() > deadline:
            assert total == requests and settled, json.dumps(states, indent=1)
            return states
        time.sleep(0.2)


class Sent:
    """What the test sent: failures expected per (model, kind), answered requests per model, how many requests."""

    def __init__(self) -> None:
        self.expected: dict[tuple[str | None, str], int] = {}
        self.answered = {FAILING: 0, TINY: 0}
        self.requests = 0
        self.refused = 0

    def expect(self, model: str | None, kind: str, count: int = 1) -> None:
        self.expected[(model, kind)] = self.expected.get((model, kind), 0) + count


def _send(server: Server) -> Sent:
    """Answered requests, then failures of each kind, over HTTP and gRPC (module docstring)."""
    sent = Sent()
    y, start = _history("a")
    with httpx.Client(base_url=server.url, timeout=60) as client:

        def post(path: str, status: int, **kwargs: Any) -> httpx.Response:
            response = client.post(path, **kwargs)
            sent.requests += 1
            assert response.status_code == status, response.text
            return response

        for model in (FAILING, TINY):  # answered, placeable: the accuracy the failure rate stands beside
            for _ in range(2):
                post("/v1/forecast", 200, json=_forecast(model, y, start))
                sent.answered[model] += 1
        # validation (4xx)
        post("/v1/forecast", 400, content=b'{"series": [', headers={"content-type": "application/json"})
        sent.expect(UNKNOWN, VALIDATION)
        post("/v2/models/nope/infer", 404, json={"inputs": []})
        sent.expect(UNKNOWN, VALIDATION)
        post("/v1/forecast", 422, json=_forecast(TINY, y, horizon=9))  # tiny emits at most 8 steps
        sent.expect(TINY, VALIDATION)
        wrong_shape = {"inputs": [{"name": "context", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}
        post(f"/v2/models/{FAILING}/infer", 422, json=wrong_shape)
        sent.expect(FAILING, VALIDATION)
        # a model error: ONNX Runtime fails inside the session for a poison value
        post("/v1/forecast", 500, json=_forecast(FAILING, [1.0, 2 * POISON]))
        sent.expect(FAILING, MODEL_ERROR)
        post("/v1/forecast", 200, json=_forecast(FAILING, y, start))  # the session still works
        sent.answered[FAILING] += 1

    # gRPC: one answered, one with a tensor of the wrong datatype
    grpc = pytest.importorskip("grpc")
    assert _grpc_infer(server, TINY, np.asarray([y[-16:]], dtype=np.float32)) == grpc.StatusCode.OK
    sent.answered[TINY] += 1
    context = np.asarray([y[-16:]], dtype=np.float32)
    assert _grpc_infer(server, TINY, context, wrong_datatype=True) == grpc.StatusCode.INVALID_ARGUMENT
    sent.expect(TINY, VALIDATION)
    sent.requests += 2

    # admission: bodies beyond the replica's request memory, refused (503) before they are read
    body = b'{"inputs": [' + b"0," * 450_000 + b"0]}"
    responses = asyncio.run(_concurrent(server.url, f"/v2/models/{TINY}/infer", [body] * 24))
    codes = [response.status_code for response in responses]
    assert set(codes) <= {422, 503} and 503 in codes, codes
    sent.refused = codes.count(503)
    sent.expect(TINY, ADMISSION, codes.count(503))
    sent.expect(TINY, VALIDATION, codes.count(422))
    sent.requests += len(responses)
    return sent


def _check_the_log(setup: Setup, sent: Sent, started_us: int) -> None:
    """The failures table holds each failure (kind, reason, model, status, protocol, time; no body)."""
    states = _wait_for_the_log(setup.log, sent.requests)
    table, unreadable = read_failures(Location(setup.log))
    assert unreadable == {}
    rows = table.to_pylist()
    found: dict[tuple[str | None, str], int] = {}
    for row in rows:
        found[(row["model"], row["kind"])] = found.get((row["model"], row["kind"]), 0) + 1
    assert found == sent.expected
    y, _ = _history("a")
    for row in rows:
        assert started_us <= row["request_time"].timestamp() * 1e6 <= time.time_ns() / 1000
        assert row["message"] and "\n" not in row["message"] and "0,0,0" not in row["message"]
        assert str(2 * POISON) not in row["message"] and str(y[0]) not in row["message"]  # no body
    by_reason = {(row["model"], row["reason"], row["status"], row["protocol"]) for row in rows}
    assert (UNKNOWN, "malformed_request", 400, "http") in by_reason
    assert (UNKNOWN, "unknown_model", 404, "http") in by_reason
    assert (FAILING, "model_failed", 500, "http") in by_reason
    assert (TINY, "overloaded", 503, "http") in by_reason
    grpc_rows = [row for row in rows if row["protocol"] == "grpc"]
    assert [(row["model"], row["grpc_status"], row["endpoint"]) for row in grpc_rows] == [
        (TINY, "INVALID_ARGUMENT", "grpc_infer")
    ]
    (state,) = states
    assert state["format"] == 2
    assert {model: state["models"][model]["requests_answered"] for model in sent.answered} == sent.answered


def test_failed_requests_of_every_kind_are_in_the_log_and_in_scores_failure_rates(
    setup: Setup, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    started_us = time.time_ns() // 1000
    sent = _send(server)
    _check_the_log(setup, sent, started_us)

    output = setup.root / "score"
    result = score_log(ScoreSettings(forecasts=setup.log, actuals=setup.data, output=output))
    requests = result.summary["requests"]
    assert requests["recorded"] is True
    for model in (FAILING, TINY):
        counts = requests["models"][model]
        failed_here = {kind: n for (name, kind), n in sent.expected.items() if name == model}
        assert {kind: n for kind, n in counts["failed_by_kind"].items() if n} == failed_here
        assert counts["answered"] == sent.answered[model]
        total = sent.answered[model] + sum(failed_here.values())
        assert counts["requests"] == total
        assert counts["failure_rate"] == pytest.approx(sum(failed_here.values()) / total)
    assert requests["unattributed"]["failed_by_kind"][VALIDATION] == 2
    assert result.summary["windows"][FAILING]["scored"] == 3  # the accuracy beside the failures
    reasons = {(row["model"], row["reason"]): row["count"] for row in _reasons(output)}
    assert reasons[(TINY, "overloaded")] == sent.refused
    report = (output / "report.html").read_text()
    assert "Requests and failures, per model" in report
    rate = requests["models"][TINY]["failure_rate"]
    assert f"{100 * rate:.2f}%" in report and "overloaded" in report and "model_failed" in report

    capsys.readouterr()
    assert main(["score", "--forecasts", str(setup.log), "--actuals", str(setup.data), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    shown = json.loads(printed[: printed.rindex("}") + 1])
    assert shown["failure_rates"][FAILING]["failed"] == {VALIDATION: 1, MODEL_ERROR: 1}
    assert shown["failure_rates"][TINY]["failure_rate"] == pytest.approx(rate, abs=1e-4)
    assert "failures.parquet" in printed


def _reasons(output: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(output / "failures.parquet").to_pylist()
