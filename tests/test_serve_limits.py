"""Serving under hostile input (issue 17): limits before parsing, and a bad value that harms only its own request.

Integration tier: ``distributed-onnx serve`` in a subprocess (embedded Ray on 127.0.0.1, direct ingress, one
replica of the tiny graph), with a 1 MB body limit and 80 MB of request memory, so that a few bodies of a few
hundred KB fill it. The tiny graph forecasts the mean of the context, so two values of 3e38 overflow float32
inside the model (inf), a real non-finite output on input that passes validation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from test_serve_ingress import Server

pytestmark = pytest.mark.integration

MAX_BODY_BYTES = 1_000_000
MEMORY_BYTES = 80_000_000  # two bodies of ~1 MB at 40x each


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Any) -> Iterator[Server]:
    running = Server(
        "--checkpoint",
        str(tiny_checkpoint.weights_path),
        "--cpus-per-replica",
        "1",
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        "--max-request-memory-bytes",
        str(MEMORY_BYTES),
    )
    try:
        yield running
    finally:
        output = running.stop()
        assert running.process.returncode == 0, output


async def _concurrent(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        headers = {"content-type": "application/json"}
        return await asyncio.gather(*(client.post("/v1/forecast", content=body, headers=headers) for body in bodies))


def test_bodies_beyond_the_replicas_request_memory_get_503_before_they_are_read(server: Server) -> None:
    # ~0.9 MB of "0," each: ~36 MB charged apiece, so at most two are held at once; 24 arrive together
    body = b'{"series": [{"series_id": "a", "y": [' + b"0," * 450_000 + b"0]}]}"
    responses = asyncio.run(_concurrent(server.url, [body] * 24))
    codes = [response.status_code for response in responses]
    assert set(codes) <= {200, 503}, codes
    assert 200 in codes and 503 in codes, codes
    refused = [response for response in responses if response.status_code == 503]
    assert all("max_request_memory_bytes" in response.json()["error"] for response in refused)
    assert all(response.headers["retry-after"] == "1" for response in refused)
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_a_grpc_message_above_the_body_limit_is_refused_by_grpc_before_it_is_parsed(server: Server) -> None:
    grpc_client = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    rows = 2 * MAX_BODY_BYTES // (16 * 4)  # ~2 MB of context alone
    inputs = {
        "context": np.ones((rows, 16), dtype=np.float32),
        "attention_mask": np.ones((rows, 16), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, 8), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, 8), dtype=np.float32),
    }
    tensors = []
    for name, value in inputs.items():
        tensor = grpc_client.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client = grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("tiny", tensors)
        # gRPC's own refusal, naming its limit: the replica's code (which would say "Request is N bytes") never ran
        assert "RESOURCE_EXHAUSTED" in str(caught.value)
        assert f"vs. {MAX_BODY_BYTES}" in str(caught.value), caught.value
        assert client.is_server_ready()
    finally:
        client.close()


def test_values_that_overflow_the_model_fail_alone_with_422_and_leave_it_ready(server: Server) -> None:
    good = [f'{{"series": [{{"series_id": "g{k}", "y": [{k + 1}.0, {k + 1}.0]}}]}}'.encode() for k in range(7)]
    overflowing = b'{"series": [{"series_id": "big", "y": [3e38, 3e38]}]}'
    responses = asyncio.run(_concurrent(server.url, [*good[:3], overflowing, *good[3:]]))
    assert [response.status_code for response in responses] == [200] * 3 + [422] + [200] * 4
    assert "NaN or infinite forecasts for series[0] ('big')" in responses[3].json()["error"]
    for k, response in enumerate(responses[:3] + responses[4:]):
        assert response.json()["forecasts"][0]["quantiles"]["0.5"][0] == pytest.approx(k + 1)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(4):  # more than max_consecutive_model_failures (3): not the model's fault, still ready
            assert client.post("/v1/forecast", content=overflowing).status_code == 422
        assert client.get("/v2/health/ready").status_code == 200
        # beyond float32 altogether: refused at validation, naming the value
        response = client.post("/v1/forecast", json={"series": [{"series_id": "x", "y": [1.0, 1e39]}]})
        assert (
            response.status_code == 422 and "y[1]" in response.json()["error"] and "1e+39" in response.json()["error"]
        )


def test_levels_outside_the_native_range_are_reported_as_clamped(server: Server) -> None:
    from graphs import NATIVE_QUANTILES

    lowest = min(NATIVE_QUANTILES)
    body = {"series": [{"series_id": "a", "y": [1.0, 2.0]}], "quantiles": [lowest / 2, 0.5]}
    response = httpx.post(f"{server.url}/v1/forecast", json=body, timeout=30)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["quantile_clamping"] == [{"requested": lowest / 2, "served_by": lowest}]
    quantiles = document["forecasts"][0]["quantiles"]
    assert set(quantiles) == {format(lowest / 2, "g"), "0.5"}  # served (by the lowest native level), not refused
    native = httpx.post(f"{server.url}/v1/forecast", json={**body, "quantiles": [0.5]}, timeout=30).json()
    assert "quantile_clamping" not in native
