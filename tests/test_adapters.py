"""Unit tier: model-family adapters (Chronos-2 layout, plain context->quantiles, the registry)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from distributed_onnx.errors import ConfigError, InputValidationError
from distributed_onnx.model import families
from distributed_onnx.model.adapters import (
    Chronos2Adapter,
    Chronos2Variant,
    ContextQuantilesAdapter,
    ModelAdapter,
    adapter_for,
    base,
    detect_variant,
    register_adapter,
)
from distributed_onnx.model.checkpoint import CheckpointMetadata

CHRONOS2_INPUTS = ["context", "attention_mask", "group_ids", "future_covariates", "future_covariates_mask"]
UPSTREAM_INPUTS = ["context", "group_ids", "attention_mask", "future_covariates"]
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


@pytest.mark.parametrize(
    ("input_names", "supported"),
    [(CHRONOS2_INPUTS, True), (UPSTREAM_INPUTS, True), (UPSTREAM_INPUTS[:3], False)],
    ids=["openstef", "upstream", "upstream-no-covariates"],
)
def test_chronos2_supports_covariates_exactly_when_it_feeds_them_to_the_model(
    input_names: list[str], supported: bool
) -> None:
    """What the planner and the worker ask before sending covariates must match what build_inputs does."""
    adapter = Chronos2Adapter(_metadata(input_names=input_names))
    assert adapter.supports_covariates is supported
    context = np.ones((1, C), dtype=np.float32)
    covariates = np.arange(C + H, dtype=np.float32).reshape(1, 1, C + H) + 10
    if not supported:
        with pytest.raises(InputValidationError, match="covariates"):
            adapter.build_inputs(context, covariates)
        return
    inputs, target_rows = adapter.build_inputs(context, covariates)
    covariate_row = target_rows[0] + 1  # the window's group: its target row, then its covariate rows
    np.testing.assert_array_equal(inputs["context"][covariate_row], covariates[0, 0, :C])
    np.testing.assert_array_equal(inputs["future_covariates"][covariate_row], covariates[0, 0, C:])
    np.testing.assert_array_equal(inputs["group_ids"][[target_rows[0], covariate_row]], [0, 0])


# --- Chronos-2, the upstream exporter's variant -----------------------------------------------------------


def _upstream(**overrides: object) -> Chronos2Adapter:
    return Chronos2Adapter(_metadata(input_names=UPSTREAM_INPUTS, **overrides))


def test_variants_are_read_from_input_names() -> None:
    assert detect_variant(CHRONOS2_INPUTS) is Chronos2Variant.OPENSTEF
    assert detect_variant(reversed(UPSTREAM_INPUTS)) is Chronos2Variant.UPSTREAM
    assert detect_variant(UPSTREAM_INPUTS[:3]) is Chronos2Variant.UPSTREAM_NO_COVARIATES
    assert detect_variant([*UPSTREAM_INPUTS, "num_output_patches"]) is Chronos2Variant.UPSTREAM
    assert _upstream().variant is Chronos2Variant.UPSTREAM


@pytest.mark.parametrize(
    "names",
    [["context", "mask"], [*CHRONOS2_INPUTS, "num_output_patches"], [*UPSTREAM_INPUTS, "future_covariates_mask2"]],
)
def test_unknown_chronos2_signatures_are_refused_naming_the_variants(names: list[str]) -> None:
    with pytest.raises(ConfigError, match="match no known Chronos-2 variant") as caught:
        Chronos2Adapter(_metadata(input_names=names))
    assert "future_covariates_mask" in str(caught.value) and "--no_future_covariates" in str(caught.value)


def test_upstream_marks_unknowns_with_nan_and_masks_the_context() -> None:
    context = np.array([[np.nan, 2.0, np.nan, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=np.float32)
    inputs, target_rows = _upstream().build_inputs(context, None)
    assert set(inputs) == set(UPSTREAM_INPUTS)  # no future_covariates_mask
    np.testing.assert_array_equal(inputs["context"], context)  # NaN kept: upstream normalizes over non-NaN
    np.testing.assert_array_equal(inputs["attention_mask"], [[0, 1, 0, 1], [1, 1, 1, 1]])
    assert np.isnan(inputs["future_covariates"]).all()  # the target's future is unknown, not 0
    np.testing.assert_array_equal(inputs["group_ids"], [0, 1])
    np.testing.assert_array_equal(target_rows, [0, 1])
    for name in ("context", "attention_mask", "future_covariates"):
        assert inputs[name].dtype == np.float32 and inputs[name].flags.c_contiguous
    assert inputs["future_covariates"].shape == (2, H)


def test_upstream_covariate_rows_keep_nan_where_unknown() -> None:
    context = np.array([[1, 2, 3, 4]], dtype=np.float32)
    covariates = np.arange(2 * (C + H), dtype=np.float32).reshape(1, 2, C + H) + 100.0
    covariates[0, 0, C + 1] = np.nan  # a missing known-future value
    covariates[0, 1, 0] = np.nan  # a missing covariate history value
    inputs, target_rows = _upstream().build_inputs(context, covariates)
    np.testing.assert_array_equal(target_rows, [0])
    np.testing.assert_array_equal(inputs["group_ids"], [0, 0, 0])
    assert np.isnan(inputs["future_covariates"][0]).all()
    np.testing.assert_array_equal(inputs["future_covariates"][1], [covariates[0, 0, C], np.nan])
    np.testing.assert_array_equal(inputs["future_covariates"][2], covariates[0, 1, C:])
    np.testing.assert_array_equal(inputs["context"][2], covariates[0, 1, :C])
    np.testing.assert_array_equal(inputs["attention_mask"][2], [0, 1, 1, 1])


def test_upstream_padding_rows_are_all_unknown() -> None:
    inputs, target_rows = _upstream(max_covariates=2).build_inputs(np.ones((1, C), dtype=np.float32), None)
    np.testing.assert_array_equal(target_rows, [0])
    assert np.isnan(inputs["context"][1:]).all() and np.isnan(inputs["future_covariates"]).all()
    np.testing.assert_array_equal(inputs["attention_mask"][1:], 0.0)


def test_upstream_without_future_covariates_refuses_covariates() -> None:
    adapter = Chronos2Adapter(_metadata(input_names=UPSTREAM_INPUTS[:3]))
    assert not adapter.supports_covariates
    inputs, _ = adapter.build_inputs(np.ones((2, C), dtype=np.float32), None)
    assert set(inputs) == set(UPSTREAM_INPUTS[:3])
    with pytest.raises(InputValidationError, match="no future_covariates input"):
        adapter.build_inputs(np.ones((1, C), dtype=np.float32), np.zeros((1, 1, C + H), dtype=np.float32))


def test_legacy_num_output_patches_scalar_is_fed_the_traced_value() -> None:
    adapter = Chronos2Adapter(_metadata(input_names=[*UPSTREAM_INPUTS, "num_output_patches"], horizon_patches=3))
    inputs, _ = adapter.build_inputs(np.ones((2, C), dtype=np.float32), None)
    scalar = inputs["num_output_patches"]
    assert scalar.shape == () and scalar.dtype == np.int64 and int(scalar) == 3


# --- the NaN/inf rule, owned by the family ---------------------------------------------------------------


@pytest.mark.parametrize(
    "adapter",
    [Chronos2Adapter(_metadata()), _upstream(), ContextQuantilesAdapter(_metadata("context_quantiles"))],
    ids=["openstef", "upstream", "context_quantiles"],
)
def test_infinite_window_values_are_refused_naming_window_and_step(adapter: ModelAdapter) -> None:
    context = np.ones((3, C), dtype=np.float32)
    context[2, 1] = -np.inf
    with pytest.raises(InputValidationError, match=r"'context' holds 1 infinite value\(s\), first at window 2, step 1"):
        adapter.build_inputs(context, None)


def test_infinite_covariate_values_are_refused() -> None:
    covariates = np.zeros((1, 2, C + H), dtype=np.float32)
    covariates[0, 1, C] = np.inf
    for adapter in (Chronos2Adapter(_metadata()), _upstream()):
        with pytest.raises(InputValidationError, match=r"'covariates'.*window 0, covariate 1, step 4"):
            adapter.build_inputs(np.ones((1, C), dtype=np.float32), covariates)


def _tensors(adapter: Chronos2Adapter) -> dict[str, np.ndarray]:
    inputs, _ = adapter.build_inputs(np.ones((2, C), dtype=np.float32), None)
    return {name: value.copy() for name, value in inputs.items()}


def test_openstef_tensors_must_be_finite() -> None:
    adapter = Chronos2Adapter(_metadata())
    tensors = _tensors(adapter)
    adapter.check_tensors(tensors)
    tensors["future_covariates"][1, 0] = np.nan
    with pytest.raises(
        InputValidationError, match=r"'future_covariates' holds 1 NaN/inf value\(s\), first at index \(1, 0\)"
    ):
        adapter.check_tensors(tensors)


def test_upstream_tensors_may_mark_unknowns_with_nan_only_where_the_contract_says() -> None:
    adapter = _upstream()
    tensors = _tensors(adapter)
    tensors["context"][0, 0] = np.nan
    adapter.check_tensors(tensors)  # NaN context and all-NaN future: the upstream contract
    for name, value in (("context", np.inf), ("future_covariates", -np.inf), ("attention_mask", np.nan)):
        broken = {key: array.copy() for key, array in tensors.items()}
        broken[name][1, 1] = value
        with pytest.raises(InputValidationError, match=f"'{name}'"):
            adapter.check_tensors(broken)


def test_context_quantiles_tensors_must_be_finite() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles"))
    adapter.check_tensors({"context": np.zeros((1, C), dtype=np.float32)})
    with pytest.raises(InputValidationError, match="NaN/inf"):
        adapter.check_tensors({"context": np.full((1, C), np.nan, dtype=np.float32)})


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


def test_context_quantiles_sends_the_calls_output_patches_where_the_graph_asks_them() -> None:
    """A graph computing the output patches it is told (TimesFM as exported): the call's count goes as
    ``num_output_patches``; a graph said to compute them without that input is refused, naming it."""
    from distributed_onnx.model.horizons import call_metadata

    metadata = _metadata(
        "timesfm",
        input_names=["context", "num_output_patches"],
        output_patch_size=2,
        horizon_patches=3,
        short_horizon="output_patches",
        missing_value="nan",
        output_layout="step_quantile",
    )
    for horizon, patches in ((6, 3), (3, 2), (1, 1)):
        inputs, _ = ContextQuantilesAdapter(call_metadata(metadata, horizon)).build_inputs(
            np.ones((2, C), dtype=np.float32), None
        )
        assert inputs["num_output_patches"].dtype == np.int64 and int(inputs["num_output_patches"]) == patches
    with pytest.raises(ConfigError, match="num_output_patches"):
        ContextQuantilesAdapter(metadata.model_copy(update={"input_names": ["context"]}))


def test_context_quantiles_decode() -> None:
    adapter = ContextQuantilesAdapter(_metadata("context_quantiles"))
    out = np.arange(2 * 3 * H, dtype=np.float32).reshape(2, 3, H)
    np.testing.assert_array_equal(adapter.decode({"quantile_preds": out}, np.array([0, 1])), out)


# --- registry ---------------------------------------------------------------------------------------------


def test_adapter_for_known_families() -> None:
    assert isinstance(adapter_for(_metadata("chronos2")), Chronos2Adapter)
    assert isinstance(adapter_for(_metadata("context_quantiles")), ContextQuantilesAdapter)


def test_adapter_for_unknown_family_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="'no_such_family'") as caught:
        adapter_for(_metadata("no_such_family"))
    message = str(caught.value)
    assert "chronos2" in message
    assert "context_quantiles" in message
    assert "register_adapter" in message
    assert caught.value.model_family == "no_such_family"  # type: ignore[attr-defined]


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


def test_the_families_are_one_module_of_records_that_the_adapters_and_exporters_read() -> None:
    """Issue 42: the families were listed in four places and TiRex's NaN rule written in three; now each family is
    one record of ``model/families.py`` and its rules are declared there once."""
    assert [record.name for record in families.BUILT_IN] == [
        "chronos2",
        "chronos_bolt",
        "context_quantiles",
        "tirex",
        "timesfm",
        "moirai2",
        "toto",
    ]
    for record in families.BUILT_IN:
        distribution = {"output_distribution": "student_t_mixture"} if record.name == "toto" else {}
        adapter = adapter_for(_metadata(record.name, **distribution))
        assert isinstance(adapter, families.adapter_factory(record)), record.name
        assert record.exporter is None or importlib.util.find_spec(record.exporter) is not None, record.exporter
    tirex = families.rules_of("tirex")
    assert tirex.metadata_fields() == {
        "missing_value": "nan",
        "output_layout": "step_quantile",
        "long_horizon": "append_missing",
        "short_horizon": "first_steps",
    }
    assert adapter_for(_metadata("tirex")).missing_value == "nan"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"'tirex' takes missing values as \['nan'\].*missing_value 'zero'"):
        adapter_for(_metadata("tirex", missing_value="zero"))
