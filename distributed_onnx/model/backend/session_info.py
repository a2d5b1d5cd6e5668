"""Facts read from a built ONNX Runtime session (duck-typed: no onnxruntime import), checked once at load."""

from __future__ import annotations

from typing import Any

from distributed_onnx.errors import CheckpointGraphMismatchError
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

GPU_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})


def check_graph(checkpoint: ResolvedCheckpoint, session: Any) -> None:
    """Refuse a session whose graph inputs/outputs disagree with the checkpoint's metadata."""
    metadata = checkpoint.metadata
    graph_inputs = [node.name for node in session.get_inputs()]
    graph_outputs = [node.name for node in session.get_outputs()]
    problems = []
    if sorted(graph_inputs) != sorted(metadata.input_names):
        problems.append(f"graph inputs {graph_inputs} != metadata input_names {metadata.input_names}")
    if metadata.output_name not in graph_outputs:
        problems.append(f"metadata output_name {metadata.output_name!r} is not a graph output {graph_outputs}")
    if problems:
        raise CheckpointGraphMismatchError(
            f"Checkpoint {checkpoint.weights_path} disagrees with its metadata: {'; '.join(problems)}",
            path=str(checkpoint.weights_path),
        )


def device_id(session: Any) -> int:
    """The local CUDA device index the session's GPU provider runs on (0 without one)."""
    for name, options in zip(session.get_providers(), session.get_provider_options().values(), strict=False):
        if name in GPU_PROVIDERS:
            return int(options.get("device_id", 0))
    return 0


def captures(session: Any) -> bool:
    """Whether ``session`` runs on CUDA with ORT's graph capture enabled."""
    if session.get_providers()[:1] != ["CUDAExecutionProvider"]:
        return False
    options = session.get_provider_options().get("CUDAExecutionProvider", {})
    return str(options.get("enable_cuda_graph", "0")) == "1"
