"""Unit tier: a replica's admission (count and memory) and the parse factor it charges (no Ray, no ORT)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from graphs import tiny_chronos2_metadata

from distributed_onnx.model.backend.validation import TensorSpec
from distributed_onnx.serve.operations.admission import PARSE_BYTES_PER_BODY_BYTE, RESPONSE_BYTES_PER_VALUE, Admission
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.forecasting import plan_job
from distributed_onnx.serve.wire.grpc_api import infer_inputs
from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest
from distributed_onnx.serve.wire.http import HttpError, parse_body, parse_infer_request
from distributed_onnx.serve.wire.protocol import decode_inputs
from distributed_onnx.serve.wire.schemas import ForecastRequest


def test_admission_counts_requests_and_gives_places_back() -> None:
    admission = Admission(max_requests=2, max_bytes=10**9, retry_after_s=1.5)
    first, second = admission.enter(), admission.enter()
    with pytest.raises(HttpError) as caught:
        admission.enter()
    assert caught.value.status_code == 503 and caught.value.headers == {"Retry-After": "2"}
    assert "holds 2 requests" in caught.value.message
    first.close()
    first.close()  # closing twice gives the place back once
    with admission.enter():
        assert admission.requests == 2
    second.close()
    assert admission.requests == 0 and admission.refused == {"count": 1, "bytes": 0}


def test_admission_charges_bodies_before_they_are_held_and_refuses_beyond_its_memory() -> None:
    body = 1_000_000
    admission = Admission(max_requests=100, max_bytes=2 * body * PARSE_BYTES_PER_BODY_BYTE, retry_after_s=1)
    held = [admission.enter(), admission.enter()]
    for ticket in held:
        ticket.charge_body(body)
    late = admission.enter()  # a place is free: the count alone would admit it
    with pytest.raises(HttpError) as caught:
        late.charge_body(body)
    assert caught.value.status_code == 503 and "max_request_memory_bytes" in caught.value.message
    late.close()
    assert admission.requests == 2 and admission.charged_bytes == 2 * body * PARSE_BYTES_PER_BODY_BYTE
    held[0].close()
    with admission.enter() as ticket:
        ticket.charge_body(body // 2)  # a streaming body is charged as it grows, only the growth
        ticket.charge_body(body)
        assert admission.charged_bytes == 2 * body * PARSE_BYTES_PER_BODY_BYTE
    held[1].close()
    assert admission.charged_bytes == 0 and admission.refused["bytes"] == 1


def test_a_request_that_could_never_fit_is_413_not_503() -> None:
    admission = Admission(max_requests=10, max_bytes=10 * 2**20, retry_after_s=1)
    with admission.enter() as ticket:
        ticket.charge_body(1000)
        with pytest.raises(HttpError) as caught:
            ticket.charge_response(10 * 2**20 // RESPONSE_BYTES_PER_VALUE)
        assert caught.value.status_code == 413 and "send it in smaller requests" in caught.value.message
    assert admission.charged_bytes == 0


def test_settings_refuse_a_memory_bound_below_one_parsed_body() -> None:
    with pytest.raises(Exception, match="max_request_memory_bytes is 1000000, below what one body"):
        ServeSettings(max_body_bytes=1_000_000, max_request_memory_bytes=1_000_000)
    assert ServeSettings().max_request_memory_bytes >= ServeSettings().max_body_bytes * PARSE_BYTES_PER_BODY_BYTE


def _peak_bytes(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


N = 100_000
SPECS = [TensorSpec("context", np.dtype(np.float32), ("rows", "steps"))]
METADATA = tiny_chronos2_metadata(context_length=N + 1)


def _grpc_zeros() -> bytes:
    request = ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="context", datatype="FP32", shape=[1, N])
    tensor.contents.fp32_contents.extend([0.0] * N)
    return bytes(request.SerializeToString())


HOSTILE: dict[str, tuple[bytes, Callable[[bytes], object]]] = {
    "one long series of 0,": (
        b'{"series": [{"series_id": "a", "y": [' + b"0," * N + b"0]}]}",
        lambda body: plan_job(parse_body(body, ForecastRequest), METADATA),
    ),
    "many one-value series": (
        b'{"series": [' + b",".join(b'{"series_id":"%d","y":[0]}' % i for i in range(N // 10)) + b"]}",
        lambda body: plan_job(parse_body(body, ForecastRequest), METADATA),
    ),
    "v2 nested data of 0": (
        b'{"inputs": [{"name": "context", "shape": [%d, 1], "datatype": "FP32", "data": [' % (N + 1)
        + b"[0]," * N
        + b"[0]]}]}",
        lambda body: decode_inputs(parse_infer_request(body, None)[0].inputs, SPECS),
    ),
    "v2 flat data of 0": (
        b'{"inputs": [{"name": "context", "shape": [1, %d], "datatype": "FP32", "data": [' % (N + 1)
        + b"0," * N
        + b"0]}]}",
        lambda body: decode_inputs(parse_infer_request(body, None)[0].inputs, SPECS),
    ),
    "gRPC typed fp32 contents": (
        _grpc_zeros(),
        lambda body: decode_inputs(infer_inputs(ModelInferRequest.FromString(body))[0], SPECS),
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_charge_per_body_byte_covers_parsing_and_planning_a_hostile_body(case: str) -> None:
    body, parse_and_plan = HOSTILE[case]
    peak = _peak_bytes(lambda: parse_and_plan(body))
    assert peak > 0
    # the body itself and its chunks while joined count too: 2 bytes per body byte
    assert peak + 2 * len(body) <= PARSE_BYTES_PER_BODY_BYTE * len(body), f"{case}: {peak / len(body):.1f}x"
