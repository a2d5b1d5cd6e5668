"""Unit tier: InferenceWorker over a recording fake backend (grids, horizon, quantiles, covariates)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.evaluation.data.packing import pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesStore
from distributed_onnx.evaluation.data.table import Series, SeriesTable
from distributed_onnx.evaluation.data.windows import PlannedBatch
from distributed_onnx.model.backend.protocol import InferenceBackend
from distributed_onnx.model.backend.validation import TensorSpec
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.worker import InferenceWorker, check_run_fits_model

CHRONOS2_INPUTS = ["context", "attention_mask", "group_ids", "future_covariates", "future_covariates_mask"]
NATIVE = [0.1, 0.5, 0.9]
MODEL_CONTEXT, PATCH, PATCHES = 8, 2, 3
MODEL_HORIZON = PATCH * PATCHES


def _metadata(family: str = "context_quantiles", **overrides: object) -> CheckpointMetadata:
    # The fake's steps do not depend on how many are asked: a shorter horizon is its first steps (the chronos2
    # family's default refuses one; the tests of that rule say so).
    fields = {"short_horizon": "first_steps"} if family == "chronos2" else {}
    return CheckpointMetadata.model_validate(
        {
            "model_family": family,
            "input_names": CHRONOS2_INPUTS if family == "chronos2" else ["context"],
            "output_name": "quantile_preds",
            "native_quantiles": NATIVE,
            "context_length": MODEL_CONTEXT,
            "output_patch_size": PATCH,
            "horizon_patches": PATCHES,
            "resolution_minutes": 15,
            **fields,
            **overrides,
        }
    )


class RecordingBackend:
    """Records every input it is given; ``quantile_preds[r, q, h] = 1000 r + 10 q + h`` (row, level, lead), as many
    steps as ``future_covariates`` is wide when it is sent (a graph computing the output patches it is sent)."""

    def __init__(self, metadata: CheckpointMetadata) -> None:
        self._metadata = metadata
        self.calls: list[dict[str, np.ndarray]] = []
        self.closed = False

    @property
    def metadata(self) -> CheckpointMetadata:
        return self._metadata

    @property
    def input_specs(self) -> Sequence[TensorSpec]:
        return ()  # declares no shapes: any batch size goes

    @property
    def output_specs(self) -> Sequence[TensorSpec]:
        return ()

    @property
    def providers(self) -> Sequence[str]:
        return ("RecordingBackend",)

    @property
    def uses_io_binding(self) -> bool:
        return False

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        self.calls.append({name: np.array(value, copy=True) for name, value in inputs.items()})
        rows = inputs["context"].shape[0]
        steps = inputs["future_covariates"].shape[1] if "future_covariates" in inputs else MODEL_HORIZON
        r, q, h = np.meshgrid(np.arange(rows), np.arange(len(NATIVE)), np.arange(steps), indexing="ij")
        return {"quantile_preds": (1000.0 * r + 10.0 * q + h).astype(np.float32)}

    def close(self) -> None:
        self.closed = True


def _worker(family: str = "context_quantiles", **overrides: object) -> tuple[InferenceWorker, RecordingBackend]:
    backend = RecordingBackend(_metadata(family, **overrides))
    assert isinstance(backend, InferenceBackend)
    return InferenceWorker(backend, model_name="fake"), backend


def test_short_context_is_left_padded_with_missing_values() -> None:
    worker, backend = _worker("chronos2")
    context = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    worker.forecast(context, MODEL_HORIZON, NATIVE)
    sent = backend.calls[0]
    np.testing.assert_array_equal(sent["context"][0], [0, 0, 0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(sent["attention_mask"][0], [0, 0, 0, 0, 0, 1, 1, 1])


def test_long_context_keeps_its_last_context_length_steps() -> None:
    worker, backend = _worker()
    context = np.arange(12, dtype=np.float32)[None, :]
    worker.forecast(context, MODEL_HORIZON, NATIVE)
    np.testing.assert_array_equal(backend.calls[0]["context"][0], np.arange(4, 12))


def test_output_shape_and_native_values() -> None:
    worker, _ = _worker()
    out = worker.forecast(np.ones((2, MODEL_CONTEXT), dtype=np.float32), MODEL_HORIZON, NATIVE)
    assert out.shape == (2, MODEL_HORIZON, 3)
    assert out.dtype == np.float32
    # out[w, h, q] = 1000 w + 10 q + h
    np.testing.assert_array_equal(out[1, 4], [1004.0, 1014.0, 1024.0])


def test_shorter_horizon_is_sliced() -> None:
    worker, _ = _worker()
    out = worker.forecast(np.ones((1, MODEL_CONTEXT), dtype=np.float32), 2, NATIVE)
    assert out.shape == (1, 2, 3)
    np.testing.assert_array_equal(out[0, :, 0], [0.0, 1.0])


def test_longer_horizon_is_refused() -> None:
    worker, backend = _worker()
    with pytest.raises(InputValidationError, match=f"horizon {MODEL_HORIZON + 1}.*{MODEL_HORIZON}"):
        worker.forecast(np.ones((1, MODEL_CONTEXT), dtype=np.float32), MODEL_HORIZON + 1, NATIVE)
    assert backend.calls == []


def test_context_must_be_two_dimensional() -> None:
    worker, _ = _worker()
    with pytest.raises(InputValidationError, match="context must be"):
        worker.forecast(np.ones(MODEL_CONTEXT, dtype=np.float32), 2, NATIVE)


def test_requested_quantiles_are_interpolated_from_native_ones() -> None:
    worker, _ = _worker()
    out = worker.forecast(np.ones((1, MODEL_CONTEXT), dtype=np.float32), 3, [0.05, 0.3, 0.5, 0.7, 0.95])
    # native levels 0.1, 0.5, 0.9 sit at 0, 10, 20 (+ lead); 0.3 and 0.7 halfway; outside: clamped
    np.testing.assert_allclose(out[0, 2], [2.0, 7.0, 12.0, 17.0, 22.0])


def test_covariates_are_placed_on_the_model_grid() -> None:
    worker, backend = _worker("chronos2")
    horizon = 2
    context = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    covariates = np.array([[[11.0, 12.0, 13.0, 14.0, 15.0]]], dtype=np.float32)  # [W=1, K=1, 3 + 2]
    worker.forecast(context, horizon, NATIVE, covariates)
    sent = backend.calls[0]
    np.testing.assert_array_equal(sent["group_ids"], [0, 0])
    # history right-aligned before the origin
    np.testing.assert_array_equal(sent["context"][1], [0, 0, 0, 0, 0, 11, 12, 13])
    np.testing.assert_array_equal(sent["attention_mask"][1], [0, 0, 0, 0, 0, 1, 1, 1])
    # future from the origin, the rest of the model's horizon masked
    np.testing.assert_array_equal(sent["future_covariates"][1], [14, 15, 0, 0, 0, 0])
    np.testing.assert_array_equal(sent["future_covariates_mask"][1], [1, 1, 0, 0, 0, 0])
    # the target row's future is never shown
    np.testing.assert_array_equal(sent["future_covariates_mask"][0], np.zeros(MODEL_HORIZON))


def test_a_graph_computing_the_patches_it_is_sent_gets_the_patches_the_horizon_spans() -> None:
    """``short_horizon: output_patches`` (Chronos-2 as exported here): a call for H steps sends ceil(H / patch)
    patches of future, as Chronos2Pipeline runs the model for prediction_length H, and cuts within the last."""
    worker, backend = _worker("chronos2", short_horizon="output_patches")
    context = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    covariates = np.array([[[11.0, 12.0, 13.0, 14.0, 15.0, 16.0]]], dtype=np.float32)  # [W=1, K=1, 3 + 3]
    out = worker.forecast(context, 3, NATIVE, covariates)
    sent = backend.calls[0]
    np.testing.assert_array_equal(sent["future_covariates"][1], [14, 15, 16, 0])  # 2 patches of 2, not 3
    np.testing.assert_array_equal(sent["future_covariates_mask"][1], [1, 1, 1, 0])
    np.testing.assert_array_equal(out[0, :, 1], [10.0, 11.0, 12.0])  # the median's first 3 steps of that call
    worker.forecast(context, 1, NATIVE)
    assert backend.calls[1]["future_covariates"].shape == (1, PATCH)  # one patch
    worker.forecast(context, MODEL_HORIZON, NATIVE)
    assert backend.calls[2]["future_covariates"].shape == (1, MODEL_HORIZON)  # the whole graph


def test_a_graph_of_fixed_patches_refuses_a_horizon_of_fewer_naming_the_export() -> None:
    """A Chronos-2 graph that does not say otherwise always computes its patches, which attend to each other: a
    horizon of fewer patches is refused (never its first steps, which are not the model's forecast for it)."""
    metadata = _metadata("chronos2", short_horizon=None)
    worker, backend = _worker("chronos2", short_horizon=None)
    context = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    expected = r"horizon 4 spans 2 output patch.*always computes 3.*distributed-onnx export chronos2 --horizon 4"
    with pytest.raises(InputValidationError, match=expected):
        worker.forecast(context, 4, NATIVE)
    with pytest.raises(ConfigError, match=expected):
        check_run_fits_model(metadata, 3, 4)
    assert backend.calls == []
    check_run_fits_model(metadata, 3, 5)  # 3 patches: the graph's own
    assert worker.forecast(context, 5, NATIVE).shape == (1, 5, 3)


def test_covariates_with_longer_history_keep_the_last_steps() -> None:
    worker, backend = _worker("chronos2")
    given, horizon = 10, 1
    context = np.arange(given, dtype=np.float32)[None, :]
    covariates = (100.0 + np.arange(given + horizon, dtype=np.float32))[None, None, :]
    out = worker.forecast(context, horizon, NATIVE, covariates)
    sent = backend.calls[0]
    np.testing.assert_array_equal(sent["context"][1], 100.0 + np.arange(2, 10))
    np.testing.assert_array_equal(sent["future_covariates"][1], [110, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(out[0, 0], [0.0, 10.0, 20.0])  # decoded from the target row (row 0)


def test_forecasts_come_from_each_windows_target_row() -> None:
    worker, _ = _worker("chronos2")
    covariates = np.zeros((2, 2, MODEL_CONTEXT + 1), dtype=np.float32)
    out = worker.forecast(np.ones((2, MODEL_CONTEXT), dtype=np.float32), 1, [0.5], covariates)
    np.testing.assert_array_equal(out[:, 0, 0], [10.0, 3010.0])  # rows 0 and 3 of the backend's output


def test_covariates_with_the_wrong_width_are_refused() -> None:
    worker, _ = _worker("chronos2")
    covariates = np.zeros((1, 1, 4), dtype=np.float32)
    with pytest.raises(InputValidationError, match=r"3 \+ 2"):
        worker.forecast(np.ones((1, 3), dtype=np.float32), 2, NATIVE, covariates)


def test_covariates_to_a_family_that_takes_none_are_refused() -> None:
    worker, backend = _worker("context_quantiles")
    covariates = np.zeros((1, 1, MODEL_CONTEXT + 2), dtype=np.float32)
    with pytest.raises(InputValidationError, match="takes no covariates"):
        worker.forecast(np.ones((1, MODEL_CONTEXT), dtype=np.float32), 2, NATIVE, covariates)
    assert backend.calls == []


def test_forecast_batch_decodes_an_arrow_batch() -> None:
    worker, backend = _worker()
    step_us = 15 * 60_000_000
    values = np.arange(20, dtype=np.float64)
    table = SeriesTable([Series("a", 0, step_us, values, np.empty((0, 20)))], [], 15, "<test>")
    planned = PlannedBatch(0, np.zeros(2, dtype=np.int64), np.array([5, 12], dtype=np.int64))
    batch = pack_batch(SeriesStore.from_table(table), planned, 4, 2, "fp")
    out = worker.forecast_batch(batch, 4, 2, [0.5])
    assert out.shape == (2, 2, 1)
    np.testing.assert_array_equal(backend.calls[0]["context"][1], [0, 0, 0, 0, 8, 9, 10, 11])


def test_warm_up_runs_one_all_missing_batch_then_close() -> None:
    worker, backend = _worker("chronos2")
    worker.warm_up(rows=3)  # returns seconds; not asserted (tests never assert on wall time)
    (call,) = backend.calls  # exactly one model call, over the model's whole grid
    assert call["context"].shape == (3, MODEL_CONTEXT)
    assert call["future_covariates"].shape == (3, MODEL_HORIZON)
    np.testing.assert_array_equal(call["attention_mask"], np.tile([0.0] * (MODEL_CONTEXT - 1) + [1.0], (3, 1)))
    np.testing.assert_array_equal(call["context"], 0.0)  # all missing but one observed 0 per row
    info = worker.info()
    assert (info.model_name, info.providers) == ("fake", ["RecordingBackend"])  # the backend's, via its Protocol
    worker.close()
    assert backend.closed


# --- check_run_fits_model ---------------------------------------------------------------------------------


def test_run_that_fits_passes() -> None:
    check_run_fits_model(_metadata(), MODEL_CONTEXT, MODEL_HORIZON)
    check_run_fits_model(_metadata(), 1, 1)


def test_run_with_too_long_horizon_is_refused() -> None:
    with pytest.raises(ConfigError, match=rf"horizon 7 .*\({MODEL_HORIZON} = {PATCH} x {PATCHES}\)") as caught:
        check_run_fits_model(_metadata(), MODEL_CONTEXT, MODEL_HORIZON + 1)
    assert caught.value.key == "horizon"  # type: ignore[attr-defined]


def test_run_with_too_long_context_is_refused() -> None:
    with pytest.raises(ConfigError, match=rf"context_length 9 .*\({MODEL_CONTEXT}\)") as caught:
        check_run_fits_model(_metadata(), MODEL_CONTEXT + 1, MODEL_HORIZON)
    assert caught.value.key == "context_length"  # type: ignore[attr-defined]
