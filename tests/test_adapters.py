"""Unit tier: model-family adapters (Chronos-2 layout, plain context->quantiles, the registry)."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_onnx.adapters import (
    Chronos2Adapter,
    ContextQuantilesAdapter,
    ModelAdapter,
    adapter_for,
    base,
    register_adapter,
)
from distributed_onnx.checkpoint import CheckpointMetadata
from distributed_onnx.errors import ConfigError, InputValidationError

CHRONOS2_INPUTS = ["context", "attention_mask", "group_ids", "future_covariates", "future_covariates_mask"]
C, H = 4, 2


def _metadata(family: str = "chronos2", **overrides: object) -> CheckpointMetadata:
    fields: dict[str, object] = {
        "model_family": family,
        "input_names": CHRONOS2_INPUTS if family == "chronos2" else ["context"],
        "output_name": "quantile_preds",
        "native_quantiles": [0.1, 0.5, 0.9],
        "context_length": C,
        "output_patch_size": 1,
        "horizon_patches": H,
        "resolution_minutes": 15,
        **overrides,
    }
    return CheckpointMetadata.model_validate(fields)


# --- Chronos-2 --------------------------------------------------------------------------------------------


def test_chronos2_layout_without_covariates() -> None:
    adapter = Chronos2Adapter(_metadata())
    context = np.array([[1.0, 2.0, np.nan, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=np.float32)
    inputs, target_rows = adapter.build_inputs(context, None)
    assert set(inputs) == set(CHRONOS2_INPUTS)
    np.testing.assert_array_equal(inputs["context"], [[1, 2, 0, 4], [5, 6, 7, 8]])
    np.testing.assert_array_equal(inputs["attention_mask"], [[1, 1, 0, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(inputs["group_ids"], [0, 1])
    np.testing.assert_array_equal(inputs["future_covariates"], np.zeros((2, H)))
    np.testing.assert_array_equal(inputs["future_covariates_mask"], np.zeros((2, H)))
    np.testing.assert_array_equal(target_rows, [0, 1])
    for name in ("context", "attention_mask", "future_covariates", "future_covariates_mask"):
        assert inputs[name].dtype == np.float32
        assert inputs[name].flags.c_contiguous
    assert inputs["group_ids"].dtype == np.int64


def test_chronos2_layout_with_covariates() -> None:
    adapter = Chronos2Adapter(_metadata())
    context = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)
    covariates = np.arange(2 * 2 * (C + H), dtype=np.float32).reshape(2, 2, C + H) + 100.0
    covariates[1, 0, 5] = np.nan  # a missing known-future value
    covariates[0, 1, 0] = np.nan  # a missing covariate history value
    inputs, target_rows = adapter.build_inputs(context, covariates)

    # 2 windows x (target row + 2 covariate rows)
    assert inputs["context"].shape == (6, C)
    np.testing.assert_array_equal(inputs["group_ids"], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(target_rows, [0, 3])
    # the target row comes first in its group: history, then a zeroed, masked future
    np.testing.assert_array_equal(inputs["context"][[0, 3]], context)
    np.testing.assert_array_equal(inputs["future_covariates"][[0, 3]], np.zeros((2, H)))
    np.testing.assert_array_equal(inputs["future_covariates_mask"][[0, 3]], np.zeros((2, H)))
    # covariate rows: history in context, known future in future_covariates
    np.testing.assert_array_equal(inputs["context"][1], covariates[0, 0, :C])
    np.testing.assert_array_equal(inputs["future_covariates"][2], covariates[0, 1, C:])
    np.testing.assert_array_equal(inputs["future_covariates_mask"][1], [1, 1])
    # NaN -> 0 with mask 0
    assert inputs["future_covariates"][4, 1] == 0.0
    assert inputs["future_covariates_mask"][4, 1] == 0.0
    assert inputs["context"][2, 0] == 0.0
    assert inputs["attention_mask"][2, 0] == 0.0
    assert np.isfinite(inputs["context"]).all()


def test_chronos2_pads_groups_to_max_covariates_with_missing_rows() -> None:
    adapter = Chronos2Adapter(_metadata(max_covariates=3))
    context = np.ones((2, C), dtype=np.float32)
    covariates = np.full((2, 1, C + H), 7.0, dtype=np.float32)
    inputs, target_rows = adapter.build_inputs(context, covariates)
    assert inputs["context"].shape == (8, C)  # 2 windows x (1 + 3 rows)
    np.testing.assert_array_equal(inputs["group_ids"], [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(target_rows, [0, 4])
    padding = [2, 3, 6, 7]
    np.testing.assert_array_equal(inputs["context"][padding], 0.0)
    np.testing.assert_array_equal(inputs["attention_mask"][padding], 0.0)
    np.testing.assert_array_equal(inputs["future_covariates_mask"][padding], 0.0)
    np.testing.assert_array_equal(inputs["future_covariates"][[1, 5]], 7.0)


def test_chronos2_pads_to_max_covariates_without_covariates() -> None:
    adapter = Chronos2Adapter(_metadata(max_covariates=2))
    inputs, target_rows = adapter.build_inputs(np.ones((3, C), dtype=np.float32), None)
    assert inputs["context"].shape == (9, C)
    np.testing.assert_array_equal(target_rows, [0, 3, 6])


def test_chronos2_refuses_more_covariates_than_the_frozen_axis() -> None:
    adapter = Chronos2Adapter(_metadata(max_covariates=1))
    covariates = np.zeros((1, 2, C + H), dtype=np.float32)
    with pytest.raises(InputValidationError, match=r"2 covariates.*frozen at 1"):
        adapter.build_inputs(np.ones((1, C), dtype=np.float32), covariates)


def test_chronos2_decode_picks_target_rows() -> None:
    adapter = Chronos2Adapter(_metadata())
    rows = np.arange(6 * 3 * H, dtype=np.float64).reshape(6, 3, H)
    decoded = adapter.decode({"quantile_preds": rows, "other": np.zeros(1)}, np.array([0, 3]))
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, rows[[0, 3]].astype(np.float32))


def test_chronos2_supports_covariates() -> None:
    assert Chronos2Adapter(_metadata()).supports_covariates


# --- context -> quantiles ---------------------------------------------------------------------------------


def test_context_quantiles_zero_fills_under_its_input_name() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles", input_names=["past_values"]))
    context = np.array([[np.nan, 1.0, 2.0, np.nan]], dtype=np.float32)
    inputs, target_rows = adapter.build_inputs(context, None)
    assert list(inputs) == ["past_values"]
    np.testing.assert_array_equal(inputs["past_values"], [[0.0, 1.0, 2.0, 0.0]])
    assert inputs["past_values"].dtype == np.float32
    np.testing.assert_array_equal(target_rows, [0])
    assert not adapter.supports_covariates


def test_context_quantiles_accepts_an_empty_covariate_axis() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles"))
    inputs, _ = adapter.build_inputs(np.ones((2, C), dtype=np.float32), np.zeros((2, 0, C + H), dtype=np.float32))
    assert inputs["context"].shape == (2, C)


def test_context_quantiles_refuses_covariates() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles"))
    with pytest.raises(InputValidationError, match="no covariates"):
        adapter.build_inputs(np.ones((2, C), dtype=np.float32), np.zeros((2, 1, C + H), dtype=np.float32))


def test_context_quantiles_needs_exactly_one_input() -> None:
    with pytest.raises(ConfigError, match="exactly one input"):
        ContextQuantilesAdapter(_metadata("context_quantiles", input_names=["a", "b"]))


def test_context_quantiles_decode() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles"))
    out = np.arange(2 * 3 * H, dtype=np.float32).reshape(2, 3, H)
    np.testing.assert_array_equal(adapter.decode({"quantile_preds": out}, np.array([0, 1])), out)


# --- registry ---------------------------------------------------------------------------------------------


def test_adapter_for_known_families() -> None:
    assert isinstance(adapter_for(_metadata("chronos2")), Chronos2Adapter)
    assert isinstance(adapter_for(_metadata("context_quantiles")), ContextQuantilesAdapter)


def test_adapter_for_unknown_family_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="'timesfm'") as caught:
        adapter_for(_metadata("timesfm"))
    message = str(caught.value)
    assert "chronos2" in message
    assert "context_quantiles" in message
    assert "register_adapter" in message
    assert caught.value.model_family == "timesfm"  # type: ignore[attr-defined]


def test_register_adapter_makes_a_family_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    seen: list[CheckpointMetadata] = []

    def factory(metadata: CheckpointMetadata) -> ModelAdapter:
        seen.append(metadata)
        return ContextQuantilesAdapter(metadata.model_copy(update={"input_names": ["x"]}))

    register_adapter("my_family", factory)
    metadata = _metadata("my_family")
    adapter = adapter_for(metadata)
    assert isinstance(adapter, ContextQuantilesAdapter)
    assert seen == [metadata]
    inputs, _ = adapter.build_inputs(np.ones((1, C), dtype=np.float32), None)
    assert list(inputs) == ["x"]
