"""The graph contract in the metadata (missing values, output layout, long horizons): parsed, checked, followed.

Unit tier: metadata objects, adapters, the unrolling over a fake model call and the graph check over a fake
session (plain objects with the three methods it reads); no ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from distributed_onnx.errors import CheckpointGraphMismatchError, ConfigError
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.backend.session_info import check_graph
from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint
from distributed_onnx.model.unroll import unroll
from distributed_onnx.model.worker import check_run_fits_model

LEVELS = [0.1, 0.5, 0.9]


def _metadata(**fields: Any) -> CheckpointMetadata:
    values: dict[str, Any] = {
        "model_family": "context_quantiles",
        "input_names": ["context"],
        "output_name": "q",
        "native_quantiles": LEVELS,
        "context_length": 6,
        "output_patch_size": 2,
        "horizon_patches": 1,
        "resolution_minutes": 30,
    }
    return CheckpointMetadata.model_validate(values | fields)


def test_metadata_written_before_the_contract_fields_means_what_it_meant() -> None:
    old = _metadata()
    assert (old.missing_value, old.output_layout, old.long_horizon) == (None, "quantile_step", "refuse")
    assert old.longest_horizon == 2
    context = np.array([[1.0, np.nan, 3.0, 4.0, 5.0, 6.0]], dtype=np.float32)
    inputs, _ = adapter_for(old).build_inputs(context, None)
    assert inputs["context"][0, 1] == 0.0  # context_quantiles' default: zero-filled, as before


def test_context_quantiles_sends_nan_when_its_metadata_says_so() -> None:
    context = np.array([[1.0, np.nan, 3.0, 4.0, 5.0, 6.0]], dtype=np.float32)
    inputs, _ = adapter_for(_metadata(missing_value="nan")).build_inputs(context, None)
    assert np.isnan(inputs["context"][0, 1]) and inputs["context"][0, 0] == 1.0


@pytest.mark.parametrize("family", ["chronos_bolt", "tirex", "timesfm"])
def test_nan_families_refuse_metadata_that_would_feed_them_zeros(family: str) -> None:
    assert adapter_for(_metadata(model_family=family)).missing_value == "nan"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="missing_value 'zero'") as caught:
        adapter_for(_metadata(model_family=family, missing_value="zero"))
    assert caught.value.key == "missing_value"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"long_horizon": "append_missing"}, "set missing_value 'nan'"),
        ({"max_horizon_length": 8}, "long_horizon is 'refuse'"),
        ({"long_horizon": "quantile_paths", "max_horizon_length": 1}, "shorter than one call's 2 steps"),
        ({"output_layout": "steps_first"}, "output_layout"),
    ],
)
def test_inconsistent_contracts_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _metadata(**fields)


def test_unrolled_horizons_fit_up_to_the_declared_cap() -> None:
    capped = _metadata(missing_value="nan", long_horizon="append_missing", max_horizon_length=7)
    check_run_fits_model(capped, 6, 7)
    with pytest.raises(ConfigError, match=r"max_horizon_length 7, unrolled by 'append_missing'"):
        check_run_fits_model(capped, 6, 8)
    check_run_fits_model(_metadata(missing_value="nan", long_horizon="append_missing"), 6, 1_000)


def test_the_decoded_block_follows_the_layout_and_a_wrong_shape_names_both() -> None:
    adapter = adapter_for(_metadata(missing_value="nan", output_layout="step_quantile"))
    steps_first = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)  # [rows, steps, quantiles]
    decoded = adapter.decode({"q": steps_first}, np.arange(2))
    np.testing.assert_array_equal(decoded, steps_first.transpose(0, 2, 1))
    with pytest.raises(CheckpointGraphMismatchError, match=r"shape \(2, 3, 2\).*means \(2, 2, 3\)"):
        adapter.decode({"q": decoded}, np.arange(2))


class _Calls:
    """A fake model call: each row's forecast is its last observed value plus the level, and it records inputs."""

    def __init__(self, steps: int = 2) -> None:
        self.contexts: list[np.ndarray] = []
        self.steps = steps

    def __call__(self, context: np.ndarray) -> np.ndarray:
        self.contexts.append(context.copy())
        last = np.array([row[~np.isnan(row)][-1] if (~np.isnan(row)).any() else 0.0 for row in context])
        block = last[:, None, None] + np.asarray(LEVELS)[None, :, None] + np.zeros((1, 1, self.steps))
        return block.astype(np.float32)


def test_append_missing_slides_the_window_over_nan_as_tirex_does() -> None:
    calls = _Calls()
    context = np.arange(1.0, 7.0, dtype=np.float32)[None, :]
    native = unroll(calls, context, 5, strategy="append_missing", native_quantiles=LEVELS)
    assert native.shape == (1, 3, 5) and len(calls.contexts) == 3
    np.testing.assert_array_equal(calls.contexts[1][0], [3, 4, 5, 6, np.nan, np.nan])
    np.testing.assert_array_equal(calls.contexts[2][0], [5, 6, np.nan, np.nan, np.nan, np.nan])
    np.testing.assert_allclose(native[0, 1], 6.5)  # the model never sees its own forecasts


def test_quantile_paths_feed_each_level_back_and_reduce_as_the_bolt_pipeline_does() -> None:
    calls = _Calls()
    context = np.array([[1, 2, 3, 4, 5, 6], [9, 9, 9, 9, 9, np.nan]], dtype=np.float32)
    native = unroll(calls, context, 4, strategy="quantile_paths", native_quantiles=LEVELS)
    assert native.shape == (2, 3, 4)
    second = calls.contexts[1]
    assert second.shape == (2 * 3, 6)  # one path per window and level
    np.testing.assert_allclose(second[:3, -2:], [[6.1, 6.1], [6.5, 6.5], [6.9, 6.9]], rtol=1e-6)
    # Window 0's nine samples are {6.1, 6.5, 6.9} + {0.1, 0.5, 0.9}; their 0.1, 0.5, 0.9 empirical quantiles:
    samples = (np.array([6.1, 6.5, 6.9])[:, None] + np.array(LEVELS)[None, :]).ravel()
    np.testing.assert_allclose(native[0, :, 2], np.quantile(samples, LEVELS), rtol=1e-6)


def test_refuse_strategy_names_the_one_call_horizon() -> None:
    with pytest.raises(ConfigError, match="long_horizon is 'refuse'"):
        unroll(_Calls(), np.ones((1, 6), np.float32), 3, strategy="refuse", native_quantiles=LEVELS)


@dataclass
class _Node:
    name: str
    shape: list[Any]


class _Session:
    def __init__(self, output_shape: list[Any]) -> None:
        self._output = _Node("q", output_shape)

    def get_inputs(self) -> list[_Node]:
        return [_Node("context", ["batch", 6])]

    def get_outputs(self) -> list[_Node]:
        return [self._output]


@pytest.mark.parametrize(
    ("layout", "shape", "refused"),
    [
        ("quantile_step", ["batch", 3, 2], False),
        ("quantile_step", ["batch", 2, 3], True),
        ("step_quantile", ["batch", 2, 3], False),
        ("step_quantile", ["batch", "steps", 3], False),  # a symbolic axis: checked after each call instead
        ("step_quantile", ["batch", 6], True),
    ],
)
def test_a_graph_is_checked_against_its_declared_layout(layout: str, shape: list[Any], refused: bool) -> None:
    metadata = _metadata(missing_value="nan", output_layout=layout)
    checkpoint = ResolvedCheckpoint.model_construct(weights_path="m.onnx", metadata=metadata)
    if not refused:
        check_graph(checkpoint, _Session(shape))
        return
    with pytest.raises(CheckpointGraphMismatchError, match=f"output_layout '{layout}'"):
        check_graph(checkpoint, _Session(shape))


def test_the_worker_unrolls_a_tirex_contract_and_refuses_covariates() -> None:
    from test_worker import MODEL_CONTEXT, MODEL_HORIZON, NATIVE, RecordingBackend

    from distributed_onnx.errors import InputValidationError
    from distributed_onnx.model.worker import InferenceWorker

    metadata = CheckpointMetadata(
        model_family="tirex",
        input_names=["context"],
        output_name="quantile_preds",
        native_quantiles=NATIVE,
        context_length=MODEL_CONTEXT,
        output_patch_size=MODEL_HORIZON,
        horizon_patches=1,
        resolution_minutes=15,
        missing_value="nan",  # append_missing requires it to be declared, whatever the family's default
        long_horizon="append_missing",
    )
    backend = RecordingBackend(metadata)
    worker = InferenceWorker(backend)
    context = np.arange(1.0, 6.0, dtype=np.float32)[None, :]
    context[0, 2] = np.nan

    forecasts = worker.forecast(context, 2 * MODEL_HORIZON + 1, NATIVE)

    assert forecasts.shape == (1, 2 * MODEL_HORIZON + 1, 3) and len(backend.calls) == 3
    first, second = backend.calls[0]["context"][0], backend.calls[1]["context"][0]
    assert np.isnan(first[:3]).all() and np.isnan(first[5]) and first[4] == 2.0  # NaN sent as NaN
    np.testing.assert_array_equal(np.isnan(second[-MODEL_HORIZON:]), True)  # the steps forecast, as missing
    with pytest.raises(InputValidationError, match="takes no covariates"):
        worker.forecast(context, MODEL_HORIZON + 1, NATIVE, np.zeros((1, 1, 5 + MODEL_HORIZON + 1), np.float32))
