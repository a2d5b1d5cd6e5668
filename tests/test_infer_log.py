"""What a KServe v2 infer request gives the forecast log: its windows (per model family), its parameters, and
forecasts equal to the worker's for the same histories (the backtest's path)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from graphs import tiny_chronos2_metadata, write_tiny_context_quantiles

from distributed_onnx.errors import InputValidationError
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint
from distributed_onnx.serve.log.infer_windows import infer_windows, served_request
from distributed_onnx.serve.log.traffic import origins_us

C = 16
CHRONOS2 = tiny_chronos2_metadata(context_length=C)


def _histories() -> np.ndarray:
    context = np.arange(3 * C, dtype=np.float32).reshape(3, C)
    context[0, :5] = np.nan  # a short history
    context[1, 7] = np.nan  # a gap
    return context


UPSTREAM = tiny_chronos2_metadata(
    context_length=C, input_names=["context", "group_ids", "attention_mask", "future_covariates"]
)


@pytest.mark.parametrize("metadata", [CHRONOS2, UPSTREAM], ids=["openstef", "upstream"])
def test_chronos2_windows_are_the_groups_target_rows_with_their_gaps_missing(metadata: CheckpointMetadata) -> None:
    adapter = adapter_for(metadata)
    context = _histories()
    covariates = np.ones((3, 2, C + 8), dtype=np.float32)  # two covariate rows per group: not windows
    inputs, target_rows = adapter.build_inputs(context, covariates)
    found, rows = adapter.target_windows(inputs)
    np.testing.assert_array_equal(rows, target_rows)
    np.testing.assert_array_equal(found, context)  # NaN where missing, in the same places


def test_chronos2_group_ids_of_another_length_than_the_context_are_refused() -> None:
    adapter = adapter_for(CHRONOS2)
    inputs, _ = adapter.build_inputs(_histories(), None)
    inputs["group_ids"] = inputs["group_ids"][:2]
    with pytest.raises(InputValidationError, match="group_ids has 2 entries for 3 context rows"):
        adapter.target_windows(inputs)


def test_parameters_place_the_windows_and_a_malformed_one_names_itself() -> None:
    inputs, _ = adapter_for(CHRONOS2).build_inputs(_histories(), None)
    adapter = adapter_for(CHRONOS2)
    bare = infer_windows(adapter, CHRONOS2, inputs, None)
    assert bare.series_ids == ("0", "1", "2") and bare.start is None and bare.count == 3
    placed = infer_windows(adapter, CHRONOS2, inputs, {"start": "2026-12-01T00:00:00", "series_ids": "a,b,c"})
    assert placed.series_ids == ("a", "b", "c") and placed.start == datetime(2026, 12, 1, tzinfo=UTC)
    assert infer_windows(adapter, CHRONOS2, inputs, {"series_ids": ["x", "y", "z"]}).series_ids == ("x", "y", "z")
    for parameters, message in [
        ({"start": "monday"}, r"parameters.start: expected an ISO 8601 timestamp .* got 'monday'"),
        ({"start": 17}, r"parameters.start: .* got 17"),
        ({"start": "9999-12-31T23:00:00"}, r"parameters.start: .* outside the representable timestamps"),
        ({"series_ids": "a,b"}, r"parameters.series_ids: 2 ids for the request's 3 windows"),
        ({"series_ids": "a,,c"}, r"parameters.series_ids: expected non-empty series ids"),
    ]:
        with pytest.raises(InputValidationError, match=message):
            infer_windows(adapter, CHRONOS2, inputs, parameters)


def test_origins_are_start_plus_the_contexts_width() -> None:
    adapter = adapter_for(CHRONOS2)
    inputs, _ = adapter.build_inputs(_histories(), None)
    windows = infer_windows(adapter, CHRONOS2, inputs, {"start": "2026-12-01T00:00:00Z"})
    outputs = {CHRONOS2.output_name: np.zeros((3, 9, 8), dtype=np.float32)}
    found = served_request(windows, CHRONOS2, outputs)
    assert found is not None
    request, forecasts, levels = found
    origin = int(datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1e6)  # 16 steps of 30 minutes later
    assert origins_us(request, 30) == [origin] * 3
    assert forecasts.shape == (3, 8, 9) and levels == tuple(CHRONOS2.native_quantiles)
    outputs[CHRONOS2.output_name][1, 0, 0] = np.inf
    assert served_request(windows, CHRONOS2, outputs) is None  # nothing finite to log


@pytest.mark.integration
@pytest.mark.parametrize("family", ["chronos2", "context_quantiles"])
def test_logged_forecasts_equal_the_workers_for_the_same_histories(
    family: str, tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
    from distributed_onnx.serve.wire.forecasting import history_block, plan_job

    pytest.importorskip("onnxruntime")
    checkpoint = tiny_checkpoint if family == "chronos2" else write_tiny_context_quantiles(tmp_path)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint.weights_path))
    metadata: CheckpointMetadata = worker.metadata
    context = _histories()
    if family == "context_quantiles":
        context = np.nan_to_num(context)  # the plain family has no mask: a client sends what the model sees
    inputs, _ = worker.adapter.build_inputs(context, None)
    windows = infer_windows(worker.adapter, metadata, inputs, None)
    found = served_request(windows, metadata, worker.backend.run(inputs), worker.adapter_of)
    assert found is not None
    request, forecasts, levels = found
    expected = worker.forecast(context, metadata.horizon_length, metadata.native_quantiles)
    np.testing.assert_array_equal(forecasts, expected)
    # the shadow's view of the request: the same histories, hence the same forecasts from the same model
    np.testing.assert_array_equal(history_block(request.series, C), context)
    shadow = asyncio.run(asyncio.to_thread(worker.forecast, plan_job(request, metadata).context, 8, levels))
    np.testing.assert_array_equal(shadow, expected)
