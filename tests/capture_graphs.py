"""Small ONNX graphs for the CUDA-graph data path: observable padding, control flow, a dynamic axis.

``group_count``: ``y = 2 * x`` and ``group_size[r]`` = how many rows of the batch share row r's ``group_ids``
label, so a padding row that joined a real group would change a real row's output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint, write_checkpoint

F = TensorProto.FLOAT


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name=name))


def _metadata(input_names: list[str], output_name: str) -> CheckpointMetadata:
    return CheckpointMetadata(
        model_family="context_quantiles",
        input_names=input_names,
        output_name=output_name,
        native_quantiles=[0.5],
        context_length=4,
        output_patch_size=4,
        horizon_patches=1,
        resolution_minutes=30,
    )


def _write(directory: Path, name: str, graph: onnx.GraphProto, metadata: CheckpointMetadata) -> ResolvedCheckpoint:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), metadata)


def group_count_graph(rows: int | str = "rows") -> onnx.GraphProto:
    nodes = [
        _const("two", np.array(2.0, dtype=np.float32)),
        _const("axis0", np.array([0], dtype=np.int64)),
        _const("axis1", np.array([1], dtype=np.int64)),
        helper.make_node("Mul", ["x", "two"], ["y"]),
        helper.make_node("Unsqueeze", ["group_ids", "axis1"], ["column"]),  # [rows, 1]
        helper.make_node("Unsqueeze", ["group_ids", "axis0"], ["row"]),  # [1, rows]
        helper.make_node("Equal", ["column", "row"], ["same_bool"]),
        helper.make_node("Cast", ["same_bool"], ["same"], to=F),
        helper.make_node("ReduceSum", ["same", "axis1"], ["group_size"], keepdims=0),  # [rows]
    ]
    return helper.make_graph(
        nodes,
        "group_count",
        [
            helper.make_tensor_value_info("x", F, [rows, 4]),
            helper.make_tensor_value_info("group_ids", TensorProto.INT64, [rows]),
        ],
        [helper.make_tensor_value_info("y", F, [rows, 4]), helper.make_tensor_value_info("group_size", F, [rows])],
    )


def write_group_count(directory: Path, rows: int | str = "rows") -> ResolvedCheckpoint:
    return _write(directory, f"group_count_{rows}", group_count_graph(rows), _metadata(["x", "group_ids"], "y"))


def write_control_flow(directory: Path) -> ResolvedCheckpoint:
    """``y = x + 1`` if ``sum(x) > 0`` else ``x - 1``: an ``If`` node, which ORT refuses to capture."""
    then_graph = helper.make_graph(
        [_const("one_t", np.array(1.0, dtype=np.float32)), helper.make_node("Add", ["x", "one_t"], ["then_y"])],
        "then",
        [],
        [helper.make_tensor_value_info("then_y", F, ["rows", 4])],
    )
    else_graph = helper.make_graph(
        [_const("one_e", np.array(1.0, dtype=np.float32)), helper.make_node("Sub", ["x", "one_e"], ["else_y"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_y", F, ["rows", 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        _const("zero", np.array(0.0, dtype=np.float32)),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    graph = helper.make_graph(
        nodes,
        "control_flow",
        [helper.make_tensor_value_info("x", F, ["rows", 4])],
        [helper.make_tensor_value_info("y", F, ["rows", 4])],
    )
    return _write(directory, "control_flow", graph, _metadata(["x"], "y"))


def write_dynamic_steps(directory: Path) -> ResolvedCheckpoint:
    """``y = 2 * x`` with ``x`` of shape ``[rows, steps]``: a dynamic axis besides the batch."""
    graph = helper.make_graph(
        [_const("two", np.array(2.0, dtype=np.float32)), helper.make_node("Mul", ["x", "two"], ["y"])],
        "dynamic_steps",
        [helper.make_tensor_value_info("x", F, ["rows", "steps"])],
        [helper.make_tensor_value_info("y", F, ["rows", "steps"])],
    )
    return _write(directory, "dynamic_steps", graph, _metadata(["x"], "y"))


def group_feed(rows: int, groups: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(rows, 4)).astype(np.float32),
        "group_ids": (np.arange(rows) % groups).astype(np.int64),
    }
