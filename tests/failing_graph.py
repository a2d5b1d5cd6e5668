"""A tiny Chronos-2 graph that ONNX Runtime itself fails to run on a chosen input: a real model failure on demand.

It computes exactly what ``graphs.tiny_chronos2_model`` computes, plus a ``Gather`` whose index is 0 for normal
rows and out of bounds when any context value of the call exceeds :data:`POISON` - ORT then raises
"indices element out of data bounds" from inside ``session.run``, as a broken model would. Only the call that
carries a poison value fails; the same session runs the next call normally.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from graphs import tiny_chronos2_metadata, tiny_chronos2_model
from onnx import TensorProto, checker, helper, numpy_helper

from distributed_onnx.model.checkpoint import ResolvedCheckpoint, write_checkpoint

#: A context value above this makes the whole model call fail inside ONNX Runtime.
POISON = 1.0e6


def _const(name: str, value: np.ndarray) -> object:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name=name))


def write_failing_chronos2(directory: Path, name: str = "failing") -> ResolvedCheckpoint:
    model = tiny_chronos2_model()
    graph = model.graph
    output = graph.output[0].name
    producer = next(node for node in graph.node if output in node.output)
    producer.output[0] = "healthy_preds"
    graph.node.extend(
        [
            _const("poison", np.array(POISON, dtype=np.float32)),
            _const("stride", np.array([1000], dtype=np.int64)),
            _const("zeros", np.zeros(1, dtype=np.float32)),
            helper.make_node("ReduceMax", ["context"], ["largest"], keepdims=0),
            helper.make_node("Greater", ["largest", "poison"], ["poisoned"]),
            helper.make_node("Cast", ["poisoned"], ["poisoned_int"], to=TensorProto.INT64),
            helper.make_node("Mul", ["poisoned_int", "stride"], ["index"]),  # [0] or [1000]
            helper.make_node("Gather", ["zeros", "index"], ["nothing"], axis=0),  # fails for index 1000
            helper.make_node("Add", ["healthy_preds", "nothing"], [output]),
        ]
    )
    checker.check_model(model)
    return write_checkpoint(directory / f"{name}.onnx", model.SerializeToString(), tiny_chronos2_metadata())
