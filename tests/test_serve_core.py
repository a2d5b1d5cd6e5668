"""The replica's core without Serve (no Ray): a real ORT session on the tiny graph, a recording batcher."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.serve.core import ModelCore, ReplicaCore
from distributed_onnx.serve.operations.admission import Ticket
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.forecasting import ForecastJob
from distributed_onnx.serve.wire.http import HttpError

pytestmark = pytest.mark.integration


def requests(metrics: LiveMetrics) -> list[tuple[str, int]]:
    """The requests counted on the replica's /metrics page, as (endpoint, code), one per request."""
    return [
        (sample.labels["endpoint"], int(sample.labels["code"]))
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "distributed_onnx_requests_total"
        for _ in range(int(sample.value))
    ]


def replica(checkpoint: Path, **settings: object) -> tuple[ReplicaCore, ModelCore, LiveMetrics]:
    chosen = ServeSettings(checkpoint=checkpoint, warm_up_rows=0, **settings)  # type: ignore[arg-type]
    metrics = LiveMetrics(replica="test")
    core = ReplicaCore(chosen, metrics)
    model = core.add_model(InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint)))
    return core, model, metrics


def forecast_body(*histories: list[float], quantiles: list[float] | None = None) -> bytes:
    series = [{"series_id": f"s{k}", "y": y} for k, y in enumerate(histories)]
    return json.dumps({"series": series, **({"quantiles": quantiles} if quantiles else {})}).encode()


async def answer(core: ReplicaCore, model: ModelCore, body: bytes) -> bytes:
    async def handle(ticket: Ticket) -> bytes:
        ticket.charge_body(len(body))
        return await model.forecast(body, ticket)

    return await core.observe("forecast", handle)


def test_the_core_answers_forecasts_names_unknown_models_and_records_codes(tiny_checkpoint: ResolvedCheckpoint) -> None:
    core, model, metrics = replica(tiny_checkpoint.weights_path)
    document = json.loads(asyncio.run(answer(core, model, forecast_body([1.0, 3.0]))))
    assert document["forecasts"][0]["quantiles"]["0.5"][0] == pytest.approx(2.0)  # the tiny graph: the mean
    assert "quantile_clamping" not in document
    with pytest.raises(HttpError, match=r"Unknown model 'nope'; this server serves 'tiny'"):
        core.model("nope")
    assert requests(metrics) == [("forecast", 200)]
    assert core.admission.requests == 0 and core.admission.charged_bytes == 0


def test_concurrent_forecasts_go_through_the_batcher_and_overflow_fails_alone(
    tiny_checkpoint: ResolvedCheckpoint,
) -> None:
    core, model, metrics = replica(tiny_checkpoint.weights_path, max_consecutive_model_failures=1)
    batches: list[int] = []

    async def batcher(job: ForecastJob) -> np.ndarray:  # a one-job "batch": the deployment's @serve.batch merges
        batches.append(job.context.shape[0])
        (result,) = await model.run_batch([job])
        return result

    model.set_batcher(batcher)
    bodies = [forecast_body([float(k + 1)] * 2) for k in range(4)] + [forecast_body([3e38, 3e38])]

    async def all_at_once() -> list[bytes | BaseException]:
        return await asyncio.gather(*(answer(core, model, body) for body in bodies), return_exceptions=True)

    results = asyncio.run(all_at_once())
    assert batches, "no forecast went through the batcher while others were in flight"
    for k, result in enumerate(results[:4]):
        assert isinstance(result, bytes) and json.loads(result)["forecasts"][0]["quantiles"]["0.5"][0] == k + 1
    overflow = results[4]
    assert isinstance(overflow, Exception) and "NaN or infinite forecasts for series[0] ('s0')" in str(overflow)
    assert model.health.ready and core.ready  # max_consecutive_model_failures=1, yet not the model's fault
    assert sorted(code for _, code in requests(metrics)) == [200, 200, 200, 200, 422]


def test_clamped_levels_are_reported_and_memory_beyond_the_bound_is_503(tiny_checkpoint: ResolvedCheckpoint) -> None:
    core, model, _ = replica(tiny_checkpoint.weights_path)
    document = json.loads(asyncio.run(answer(core, model, forecast_body([1.0], quantiles=[0.001, 0.5]))))
    assert document["quantile_clamping"] == [{"requested": 0.001, "served_by": min(model.metadata.native_quantiles)}]
    ticket = core.admission.enter()
    ticket.charge_body(core.settings.max_request_memory_bytes // 40)  # the whole bound, held by one request
    with pytest.raises(HttpError) as caught:
        asyncio.run(answer(core, model, forecast_body([1.0])))
    assert caught.value.status_code == 503 and "max_request_memory_bytes" in caught.value.message
    ticket.close()
    assert json.loads(asyncio.run(answer(core, model, forecast_body([1.0]))))["forecasts"]


def test_a_v2_infer_whose_values_overflow_the_model_is_422_and_not_a_model_failure(
    tiny_checkpoint: ResolvedCheckpoint,
) -> None:
    from distributed_onnx.errors import InputValidationError

    _, model, _ = replica(tiny_checkpoint.weights_path, max_consecutive_model_failures=1)

    def body(value: float) -> bytes:
        tensors = {
            "context": ("FP32", [1, 16], [value] * 16),
            "attention_mask": ("FP32", [1, 16], [1.0] * 16),
            "group_ids": ("INT64", [1], [0]),
            "future_covariates": ("FP32", [1, 8], [0.0] * 8),
            "future_covariates_mask": ("FP32", [1, 8], [0.0] * 8),
        }
        inputs = [{"name": n, "datatype": d, "shape": s, "data": v} for n, (d, s, v) in tensors.items()]
        return json.dumps({"inputs": inputs}).encode()

    with pytest.raises(InputValidationError, match=r"NaN or infinite values in output\(s\) \['quantile_preds'\]"):
        asyncio.run(model.infer(body(3e38), None))
    assert model.health.ready  # max_consecutive_model_failures=1: it would be not ready had it counted
    encoded = asyncio.run(model.infer(body(2.0), None)).body
    assert 2.0 in json.loads(encoded)["outputs"][0]["data"]  # the median of the tiny graph: the context's mean
