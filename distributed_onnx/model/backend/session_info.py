"""Facts read from a built ONNX Runtime session (duck-typed: no onnxruntime import), checked once at load."""

from __future__ import annotations

from typing import Any

from distributed_onnx.errors import CheckpointGraphMismatchError
from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint

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
    else:
        output = next(node for node in session.get_outputs() if node.name == metadata.output_name)
        problems.extend(_layout_problems(metadata, list(output.shape)))
    if problems:
        raise CheckpointGraphMismatchError(
            f"Checkpoint {checkpoint.weights_path} disagrees with its metadata: {'; '.join(problems)}",
            path=str(checkpoint.weights_path),
        )


def _layout_problems(metadata: CheckpointMetadata, shape: list[Any]) -> list[str]:
    """The output's fixed axes against the metadata's layout, quantiles and steps per call (symbolic axes are
    checked after each call instead: ``adapters.base.quantile_block``)."""
    n_levels, steps = len(metadata.native_quantiles), metadata.horizon_length
    if metadata.output_distribution is not None:  # [rows, steps, components, 4]: the adapter computes quantiles
        if len(shape) == 4 and all(
            not isinstance(dim, int) or dim == want for dim, want in ((shape[1], steps), (shape[3], 4))
        ):
            return []
        return [
            f"output {metadata.output_name!r} has shape {shape}, but output_distribution "
            f"{metadata.output_distribution!r} with horizon_length {steps} means [rows, {steps}, components, 4]"
        ]
    layout = metadata.output_layout
    declared = "output_layout" in metadata.model_fields_set
    if len(shape) != 3:
        # Graphs of other shapes predate the field (tests' generic graphs): refused only when the layout is declared.
        return [f"output {metadata.output_name!r} has rank {len(shape)}, output_layout {layout!r} means 3"] * declared
    wanted = (n_levels, steps) if layout == "quantile_step" else (steps, n_levels)
    given = shape[1:]
    if all(not isinstance(dim, int) or dim == want for dim, want in zip(given, wanted, strict=True)):
        return []
    return [
        f"output {metadata.output_name!r} has shape {shape}, but output_layout {layout!r} with {n_levels} "
        f"native_quantiles and horizon_length {steps} means [rows, {wanted[0]}, {wanted[1]}]"
    ]


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
