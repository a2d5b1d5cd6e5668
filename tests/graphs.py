"""Tiny ONNX graphs built with ``onnx.helper`` for fast tests, written as real checkpoints.

``tiny_chronos2`` honours the Chronos-2 tensor contract with arithmetic a test can predict: every quantile
of a row is the masked mean of its context plus a fixed offset per quantile level, plus the masked mean of the
future covariates of its group's other rows (so group handling is observable).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from distributed_onnx.checkpoint import CheckpointMetadata, ResolvedCheckpoint, write_checkpoint

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
    }
    fields.update(overrides)
    return CheckpointMetadata.model_validate(fields)


def write_tiny_chronos2(directory: Path, name: str = "tiny", **sizes: int) -> ResolvedCheckpoint:
    model = tiny_chronos2_model(**sizes)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), tiny_chronos2_metadata(**sizes))


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
