"""Tiny ONNX graphs built with ``onnx.helper`` for fast tests, written as real checkpoints.

``tiny_chronos2`` honours the Chronos-2 tensor contract with arithmetic a test can predict: every quantile
of a row is the masked mean of its context plus a fixed offset per quantile level, plus the masked mean of the
future covariates of its group's other rows (so group handling is observable).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint, write_checkpoint

NATIVE_QUANTILES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
QUANTILE_OFFSETS = np.array([(q - 0.5) * 10.0 for q in NATIVE_QUANTILES], dtype=np.float32)


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name=name))


def tiny_chronos2_model(
    context_length: int = 16, output_patch_size: int = 4, horizon_patches: int = 2, rows: int | str = "rows"
) -> onnx.ModelProto:
    horizon = output_patch_size * horizon_patches
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("context", f, [rows, context_length]),
        helper.make_tensor_value_info("attention_mask", f, [rows, context_length]),
        helper.make_tensor_value_info("group_ids", TensorProto.INT64, [rows]),
        helper.make_tensor_value_info("future_covariates", f, [rows, horizon]),
        helper.make_tensor_value_info("future_covariates_mask", f, [rows, horizon]),
    ]
    output = helper.make_tensor_value_info("quantile_preds", f, [rows, len(NATIVE_QUANTILES), horizon])
    nodes = [
        _const("one", np.array(1.0, dtype=np.float32)),
        _const("axis1", np.array([1], dtype=np.int64)),
        # level[r] = sum(context*mask) / max(sum(mask), 1)
        helper.make_node("Mul", ["context", "attention_mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["total"], keepdims=1),
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "one"], ["safe_count"]),
        helper.make_node("Div", ["total", "safe_count"], ["level"]),  # [rows, 1]
        # covariate signal: mean of observed future covariates of *other* rows in the same group.
        helper.make_node("Mul", ["future_covariates", "future_covariates_mask"], ["fc_masked"]),
        helper.make_node("ReduceSum", ["fc_masked", "axis1"], ["fc_sum"], keepdims=1),  # [rows,1]
        helper.make_node("ReduceSum", ["future_covariates_mask", "axis1"], ["fc_cnt"], keepdims=1),
        helper.make_node("Unsqueeze", ["group_ids", "axis1"], ["g_col"]),  # [rows,1]
        _const("axis0", np.array([0], dtype=np.int64)),
        helper.make_node("Unsqueeze", ["group_ids", "axis0"], ["g_row"]),  # [1,rows]
        helper.make_node("Equal", ["g_col", "g_row"], ["same_bool"]),
        helper.make_node("Cast", ["same_bool"], ["same"], to=TensorProto.FLOAT),  # [rows, rows]
        helper.make_node("MatMul", ["same", "fc_sum"], ["grp_sum"]),
        helper.make_node("MatMul", ["same", "fc_cnt"], ["grp_cnt"]),
        helper.make_node("Sub", ["grp_sum", "fc_sum"], ["other_sum"]),
        helper.make_node("Sub", ["grp_cnt", "fc_cnt"], ["other_cnt"]),
        helper.make_node("Max", ["other_cnt", "one"], ["other_safe"]),
        helper.make_node("Div", ["other_sum", "other_safe"], ["cov_signal"]),
        helper.make_node("Add", ["level", "cov_signal"], ["center"]),  # [rows,1]
        _const("axis2", np.array([2], dtype=np.int64)),
        helper.make_node("Unsqueeze", ["center", "axis2"], ["center3"]),  # [rows,1,1]
        _const("offsets", QUANTILE_OFFSETS.reshape(1, -1, 1)),
        helper.make_node("Add", ["center3", "offsets"], ["per_q"]),  # [rows,9,1]
        _const("ones_h", np.ones((1, 1, horizon), dtype=np.float32)),
        helper.make_node("Mul", ["per_q", "ones_h"], ["quantile_preds"]),
    ]
    graph = helper.make_graph(nodes, "tiny_chronos2", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_chronos2_metadata(
    context_length: int = 16, output_patch_size: int = 4, horizon_patches: int = 2, **overrides: object
) -> CheckpointMetadata:
    fields: dict[str, object] = {
        "model_family": "chronos2",
        "input_names": [
            "context",
            "attention_mask",
            "group_ids",
            "future_covariates",
            "future_covariates_mask",
        ],
        "output_name": "quantile_preds",
        "native_quantiles": NATIVE_QUANTILES,
        "context_length": context_length,
        "output_patch_size": output_patch_size,
        "horizon_patches": horizon_patches,
        "resolution_minutes": 30,
        # A toy graph whose steps do not depend on how many are asked: a shorter horizon is its first steps (the
        # chronos2 family's default refuses one, as a real Chronos-2 graph's patches attend to each other).
        "short_horizon": "first_steps",
    }
    fields.update(overrides)
    return CheckpointMetadata.model_validate(fields)


def write_tiny_chronos2(directory: Path, name: str = "tiny", **sizes: int) -> ResolvedCheckpoint:
    model = tiny_chronos2_model(**sizes)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), tiny_chronos2_metadata(**sizes))


def write_tiny_chronos2_external(directory: Path, name: str = "tiny", shift: float = 0.0) -> ResolvedCheckpoint:
    """The tiny Chronos-2 graph with its float constants as initializers kept in ``NAME.onnx.data`` beside it (ONNX
    external data, as every family export writes them), each quantile offset moved by ``shift``.

    Two shifts write byte-identical ``.onnx`` files (the same tensors at the same offsets of the data file) and
    different weights files: an edited weights file beside an unchanged graph. The metadata records the
    graph's sha256, as an export's does."""
    import hashlib

    model = tiny_chronos2_model()
    graph = model.graph
    # The float constants (the axes stay Constant nodes: ONNX Runtime's shape inference reads them at load).
    constants = [node for node in graph.node if node.op_type == "Constant" and node.attribute[0].t.data_type == 1]
    for node in constants:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        if node.output[0] == "offsets":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) + np.float32(shift), "offsets"))
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.onnx"
    for stale in (path, directory / f"{name}.onnx.data"):
        stale.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.onnx.data",
        size_threshold=0,
    )  # fmt: skip
    metadata = tiny_chronos2_metadata().model_copy(update={"sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    document = metadata.model_dump(mode="json", exclude_none=True)
    (directory / f"{name}.metadata.json").write_text(json.dumps(document, indent=2))
    return ResolvedCheckpoint(weights_path=path, metadata=metadata)


def tiny_context_quantiles_model(context_length: int = 16, horizon: int = 8) -> onnx.ModelProto:
    """The plain family: ``context`` [rows, C] (NaN-free, zero-filled) -> ``quantiles`` [rows, 3, H].

    Every quantile is the last context value plus -1, 0, +1.
    """
    f = TensorProto.FLOAT
    nodes = [
        _const("starts", np.array([context_length - 1], dtype=np.int64)),
        _const("ends", np.array([context_length], dtype=np.int64)),
        _const("axes", np.array([1], dtype=np.int64)),
        helper.make_node("Slice", ["context", "starts", "ends", "axes"], ["last"]),  # [rows,1]
        helper.make_node("Unsqueeze", ["last", "axes"], ["last3"]),  # [rows,1,1]
        _const("offsets", np.array([-1.0, 0.0, 1.0], dtype=np.float32).reshape(1, 3, 1)),
        helper.make_node("Add", ["last3", "offsets"], ["per_q"]),
        _const("ones_h", np.ones((1, 1, horizon), dtype=np.float32)),
        helper.make_node("Mul", ["per_q", "ones_h"], ["quantiles"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_context_quantiles",
        [helper.make_tensor_value_info("context", f, ["rows", context_length])],
        [helper.make_tensor_value_info("quantiles", f, ["rows", 3, horizon])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_tiny_context_quantiles(directory: Path, context_length: int = 16, horizon: int = 8) -> ResolvedCheckpoint:
    metadata = CheckpointMetadata(
        model_family="context_quantiles",
        input_names=["context"],
        output_name="quantiles",
        native_quantiles=[0.1, 0.5, 0.9],
        context_length=context_length,
        output_patch_size=horizon,
        horizon_patches=1,
        resolution_minutes=30,
    )
    model = tiny_context_quantiles_model(context_length, horizon)
    return write_checkpoint(directory / "tiny_plain.onnx", model.SerializeToString(), metadata)


# --- the upstream Chronos-2 export's signature -------------------------------------------------------------

#: The 21 levels Chronos-2 emits (amazon/chronos-2 ``chronos_config.quantiles``).
UPSTREAM_QUANTILES = [0.01, 0.05, *(round(0.1 + 0.05 * i, 2) for i in range(17)), 0.95, 0.99]
UPSTREAM_OFFSETS = np.array([(q - 0.5) * 10.0 for q in UPSTREAM_QUANTILES], dtype=np.float32)
UPSTREAM_INPUTS = ["context", "group_ids", "attention_mask", "future_covariates"]


def tiny_upstream_chronos2_model(
    context_length: int = 16, output_patch_size: int = 4, horizon_patches: int = 2, num_output_patches: bool = False
) -> onnx.ModelProto:
    """Exactly the signature of amazon-science/chronos-forecasting ``scripts/onnx/export_chronos2_to_onnx.py``.

    Inputs ``context`` f32[batch_size, C], ``group_ids`` i64[batch_size], ``attention_mask`` f32[batch_size, C],
    ``future_covariates`` f32[batch_size, H] (NaN = unknown); output ``quantile_preds`` f32[batch_size, 21, H];
    only the batch axis is dynamic, as the exporter traces it. The arithmetic follows the upstream model where
    it matters to an adapter: the row level comes from the non-NaN context values (upstream ``InstanceNorm``
    ignores the mask), weighted by ``attention_mask``; a future value is known where it is not NaN. Every
    quantile of a row is ``sum(context * mask over non-NaN) / count(non-NaN)`` plus the mean of the known
    future values of its whole group (itself included), plus a fixed offset per level. A zero where NaN
    belongs (in the context or in any future row of the group) changes the result. With
    ``num_output_patches``, the graph also takes that int64 scalar (as some legacy exports do) and adds 1000
    times its value, so a test sees what was fed.
    """
    horizon = output_patch_size * horizon_patches
    f = TensorProto.FLOAT
    batch = "batch_size"
    inputs = [
        helper.make_tensor_value_info("context", f, [batch, context_length]),
        helper.make_tensor_value_info("group_ids", TensorProto.INT64, [batch]),
        helper.make_tensor_value_info("attention_mask", f, [batch, context_length]),
        helper.make_tensor_value_info("future_covariates", f, [batch, horizon]),
    ]
    output = helper.make_tensor_value_info("quantile_preds", f, [batch, len(UPSTREAM_QUANTILES), horizon])
    nodes = [
        _const("zero", np.array(0.0, dtype=np.float32)),
        _const("one", np.array(1.0, dtype=np.float32)),
        _const("axis0", np.array([0], dtype=np.int64)),
        _const("axis1", np.array([1], dtype=np.int64)),
        _const("axis2", np.array([2], dtype=np.int64)),
        # level = sum(where(nan, 0, context) * mask) / max(count(not nan), 1)
        helper.make_node("IsNaN", ["context"], ["ctx_nan"]),
        helper.make_node("Where", ["ctx_nan", "zero", "context"], ["ctx_clean"]),
        helper.make_node("Not", ["ctx_nan"], ["ctx_known"]),
        helper.make_node("Cast", ["ctx_known"], ["ctx_known_f"], to=f),
        helper.make_node("Mul", ["ctx_clean", "attention_mask"], ["ctx_masked"]),
        helper.make_node("ReduceSum", ["ctx_masked", "axis1"], ["ctx_total"], keepdims=1),
        helper.make_node("ReduceSum", ["ctx_known_f", "axis1"], ["ctx_count"], keepdims=1),
        helper.make_node("Max", ["ctx_count", "one"], ["ctx_safe"]),
        helper.make_node("Div", ["ctx_total", "ctx_safe"], ["level"]),  # [B, 1]
        # group signal: mean of the known (non-NaN) future values of every row of the group
        helper.make_node("IsNaN", ["future_covariates"], ["fc_nan"]),
        helper.make_node("Where", ["fc_nan", "zero", "future_covariates"], ["fc_clean"]),
        helper.make_node("Not", ["fc_nan"], ["fc_known"]),
        helper.make_node("Cast", ["fc_known"], ["fc_known_f"], to=f),
        helper.make_node("ReduceSum", ["fc_clean", "axis1"], ["fc_sum"], keepdims=1),
        helper.make_node("ReduceSum", ["fc_known_f", "axis1"], ["fc_cnt"], keepdims=1),
        helper.make_node("Unsqueeze", ["group_ids", "axis1"], ["g_col"]),
        helper.make_node("Unsqueeze", ["group_ids", "axis0"], ["g_row"]),
        helper.make_node("Equal", ["g_col", "g_row"], ["same_bool"]),
        helper.make_node("Cast", ["same_bool"], ["same"], to=f),  # [B, B]
        helper.make_node("MatMul", ["same", "fc_sum"], ["grp_sum"]),
        helper.make_node("MatMul", ["same", "fc_cnt"], ["grp_cnt"]),
        helper.make_node("Max", ["grp_cnt", "one"], ["grp_safe"]),
        helper.make_node("Div", ["grp_sum", "grp_safe"], ["cov_signal"]),
        helper.make_node("Add", ["level", "cov_signal"], ["center"]),
        helper.make_node("Unsqueeze", ["center", "axis2"], ["center3"]),  # [B, 1, 1]
        _const("offsets", UPSTREAM_OFFSETS.reshape(1, -1, 1)),
        helper.make_node("Add", ["center3", "offsets"], ["per_q"]),  # [B, 21, 1]
        _const("ones_h", np.ones((1, 1, horizon), dtype=np.float32)),
        helper.make_node("Mul", ["per_q", "ones_h"], ["scaled_preds" if num_output_patches else "quantile_preds"]),
    ]
    if num_output_patches:
        inputs.append(helper.make_tensor_value_info("num_output_patches", TensorProto.INT64, []))
        nodes += [
            helper.make_node("Cast", ["num_output_patches"], ["patches_f"], to=f),
            _const("thousand", np.array(1000.0, dtype=np.float32)),
            helper.make_node("Mul", ["patches_f", "thousand"], ["patches_signal"]),
            helper.make_node("Add", ["scaled_preds", "patches_signal"], ["quantile_preds"]),
        ]
    graph = helper.make_graph(nodes, "tiny_upstream_chronos2", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_upstream_chronos2_metadata(
    context_length: int = 16, output_patch_size: int = 4, horizon_patches: int = 2, **overrides: object
) -> CheckpointMetadata:
    """The metadata a user writes beside an upstream export: the four input names and the 21 levels, and no
    ``short_horizon`` (the family's default: a horizon of fewer output patches than the graph's is refused)."""
    upstream = {"input_names": UPSTREAM_INPUTS, "native_quantiles": UPSTREAM_QUANTILES, "short_horizon": None}
    return tiny_chronos2_metadata(context_length, output_patch_size, horizon_patches, **(upstream | overrides))


def write_tiny_upstream_chronos2(
    directory: Path, name: str = "upstream", num_output_patches: bool = False, **sizes: int
) -> ResolvedCheckpoint:
    model = tiny_upstream_chronos2_model(**sizes, num_output_patches=num_output_patches)
    names = [*UPSTREAM_INPUTS, "num_output_patches"] if num_output_patches else UPSTREAM_INPUTS
    metadata = tiny_upstream_chronos2_metadata(**sizes, input_names=names)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), metadata)


def upstream_expected(context: np.ndarray, group_futures: list[np.ndarray] | None = None) -> np.ndarray:
    """What the tiny upstream graph answers for one target row, in numpy: ``[21]`` levels (NaN = missing).

    ``context`` is the target row on the model grid; ``group_futures`` the future rows of its group's
    covariates (the target's own future is unknown, so it adds nothing).
    """
    known = ~np.isnan(context)
    level = float(context[known].sum() / max(int(known.sum()), 1))
    futures = np.concatenate(group_futures) if group_futures else np.zeros(0)
    observed = futures[~np.isnan(futures)]
    signal = float(observed.sum() / max(observed.size, 1))
    return level + signal + UPSTREAM_OFFSETS.astype(np.float64)


# --- generic graphs: dtypes and values the backend must not refuse ------------------------------------------


def _write_generic(
    directory: Path, name: str, model: onnx.ModelProto, inputs: list[str], output: str
) -> ResolvedCheckpoint:
    model.ir_version = 8
    onnx.checker.check_model(model)
    metadata = CheckpointMetadata(
        model_family="generic",
        input_names=inputs,
        output_name=output,
        native_quantiles=[0.5],
        context_length=4,
        output_patch_size=1,
        horizon_patches=1,
        resolution_minutes=30,
    )
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), metadata)


def write_unsigned_inputs(directory: Path) -> ResolvedCheckpoint:
    """``a`` u16[rows], ``b`` u32[rows], ``c`` u64[rows] -> ``total`` f64[rows] = a + b + c."""
    inputs = [
        helper.make_tensor_value_info(name, kind, ["rows"])
        for name, kind in (("a", TensorProto.UINT16), ("b", TensorProto.UINT32), ("c", TensorProto.UINT64))
    ]
    nodes = [helper.make_node("Cast", [name], [f"{name}_f"], to=TensorProto.DOUBLE) for name in "abc"]
    nodes += [helper.make_node("Add", ["a_f", "b_f"], ["ab"]), helper.make_node("Add", ["ab", "c_f"], ["total"])]
    output = helper.make_tensor_value_info("total", TensorProto.DOUBLE, ["rows"])
    graph = helper.make_graph(nodes, "unsigned_inputs", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return _write_generic(directory, "unsigned", model, ["a", "b", "c"], "total")


def write_additive_mask(directory: Path, width: int = 4) -> ResolvedCheckpoint:
    """``scores`` + an additive ``attention_mask`` (0 or -inf, as transformer exports take it) -> softmax."""
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("scores", f, ["rows", width]),
        helper.make_tensor_value_info("attention_mask", f, ["rows", width]),
    ]
    nodes = [
        helper.make_node("Add", ["scores", "attention_mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
    ]
    output = helper.make_tensor_value_info("weights", f, ["rows", width])
    graph = helper.make_graph(nodes, "additive_mask", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return _write_generic(directory, "additive_mask", model, ["scores", "attention_mask"], "weights")


def tiny_chronos2_nan_model(threshold: float, **sizes: int) -> onnx.ModelProto:
    """The tiny Chronos-2 graph, except that a row whose context level is above ``threshold`` comes out NaN.

    ``sqrt(threshold - level) * 0`` is 0 where the level is at most the threshold and NaN above it; adding it
    to every output keeps the graph's arithmetic elsewhere (a checkpoint that fails on some windows only).
    """
    model = tiny_chronos2_model(**sizes)
    graph = model.graph
    final = graph.node[-1]
    final.output[0] = "clean_preds"
    graph.node.extend(
        [
            _const("threshold", np.array(threshold, dtype=np.float32)),
            _const("zero", np.array(0.0, dtype=np.float32)),
            helper.make_node("Sub", ["threshold", "level"], ["headroom"]),
            helper.make_node("Sqrt", ["headroom"], ["root"]),  # NaN where level > threshold
            helper.make_node("Mul", ["root", "zero"], ["poison"]),  # [rows, 1]: 0 or NaN
            _const("axis2b", np.array([2], dtype=np.int64)),
            helper.make_node("Unsqueeze", ["poison", "axis2b"], ["poison3"]),
            helper.make_node("Add", ["clean_preds", "poison3"], ["quantile_preds"]),
        ]
    )
    onnx.checker.check_model(model)
    return model


def write_tiny_chronos2_nan(directory: Path, threshold: float, name: str = "nan", **sizes: int) -> ResolvedCheckpoint:
    model = tiny_chronos2_nan_model(threshold, **sizes)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), tiny_chronos2_metadata(**sizes))


def season_copy_model(context_length: int = 16, horizon: int = 8, lag: int | None = None) -> onnx.ModelProto:
    """A Chronos-2-contract graph whose every quantile repeats the last ``horizon`` context steps (or, with
    ``lag``, the ``horizon`` steps that start ``lag`` steps before the origin).

    With the run's seasonality equal to ``horizon`` it is the seasonal naive forecast wherever the naive is
    defined (an unknown context value is 0 in this contract, but the naive is undefined there).
    """
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("context", f, ["rows", context_length]),
        helper.make_tensor_value_info("attention_mask", f, ["rows", context_length]),
        helper.make_tensor_value_info("group_ids", TensorProto.INT64, ["rows"]),
        helper.make_tensor_value_info("future_covariates", f, ["rows", horizon]),
        helper.make_tensor_value_info("future_covariates_mask", f, ["rows", horizon]),
    ]
    output = helper.make_tensor_value_info("quantile_preds", f, ["rows", len(NATIVE_QUANTILES), horizon])
    nodes = [
        _const("starts", np.array([context_length - (lag or horizon)], dtype=np.int64)),
        _const("ends", np.array([context_length - (lag or horizon) + horizon], dtype=np.int64)),
        _const("axes", np.array([1], dtype=np.int64)),
        helper.make_node("Slice", ["context", "starts", "ends", "axes"], ["season"]),  # [rows, H]
        helper.make_node("Unsqueeze", ["season", "axes"], ["season3"]),  # [rows, 1, H]
        _const("ones_q", np.ones((1, len(NATIVE_QUANTILES), 1), dtype=np.float32)),
        helper.make_node("Mul", ["season3", "ones_q"], ["quantile_preds"]),
    ]
    graph = helper.make_graph(nodes, "season_copy", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_season_copy(directory: Path, name: str = "season_copy") -> ResolvedCheckpoint:
    return write_checkpoint(
        directory / f"{name}.onnx", season_copy_model().SerializeToString(), tiny_chronos2_metadata()
    )


# --- several real models for the report's many-model checks (tests/test_report_many.py, scripts/report_screenshots.py)


def scaled_model(model: onnx.ModelProto, factor: float) -> onnx.ModelProto:
    """``model`` with its one output multiplied by ``factor``: a real graph whose forecasts are far off."""
    graph = model.graph
    output = graph.output[0].name
    graph.node[-1].output[0] = "unscaled"
    for node in graph.node:  # the output may be read by no other node; rename defensively all the same
        node.input[:] = ["unscaled" if name == output else name for name in node.input]
    factor_node = _const("factor", np.array(factor, dtype=np.float32))
    graph.node.extend([factor_node, helper.make_node("Mul", ["unscaled", "factor"], [output])])
    onnx.checker.check_model(model)
    return model


def write_report_models(directory: Path, count: int, horizon: int = 48, context: int = 512) -> list[Path]:
    """``count`` (2 to 8) checkpoints of the bundled half-hourly data's resolution and of the bundled reference
    checkpoint's context, forecasting ``horizon`` steps: the reference checkpoint, then small real graphs (copies
    of the day, two days or a week before, the mean of the context), and from 4 models on one deliberately far
    off (the mean scaled by 100)."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    metadata = tiny_chronos2_metadata(context_length=context, output_patch_size=horizon, horizon_patches=1)
    mean = tiny_chronos2_model(context_length=context, output_patch_size=horizon, horizon_patches=1)
    graphs: list[tuple[str, onnx.ModelProto]] = [
        ("week_before", season_copy_model(context, horizon, lag=7 * horizon)),
        ("far_off", scaled_model(tiny_chronos2_model(context, horizon, 1), 100.0)),
        ("day_before_plus_5pct", scaled_model(season_copy_model(context, horizon, lag=horizon), 1.05)),
        ("context_mean", mean),
        ("two_days_before", season_copy_model(context, horizon, lag=2 * horizon)),
        ("day_before", season_copy_model(context, horizon, lag=horizon)),
        ("three_days_before", season_copy_model(context, horizon, lag=3 * horizon)),
    ]
    if count < 4:
        graphs = [graph for graph in graphs if graph[0] != "far_off"]
    paths = [REFERENCE_CHECKPOINT]
    for name, model in graphs[: count - 1]:
        paths.append(write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), metadata).weights_path)
    return paths
