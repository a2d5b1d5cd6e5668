"""Whether a checkpoint can run as CUDA graphs, decided once at load, and what happens when it cannot.

Two verdicts meet here, both before the first batch:

- :func:`capture_problems`, pure over the graph's tensor specs: a replayed graph has fixed shapes, so only the
  batch axis (axis 0, bucketed) may vary, and every tensor must have one.
- ONNX Runtime's own, given when the session is built with ``enable_cuda_graph``: it refuses graphs with control
  flow (``If``/``Loop``/``Scan``) and graphs with compute nodes off the CUDA provider that need host copies
  (shape-only CPU nodes are allowed: the reference checkpoint has some and captures). :func:`capture_refusal`
  recognises that refusal among ORT's errors.

:func:`settle` applies the fallback rule the provider chains share (see ``policy.py``): an explicit chain raises
:class:`~distributed_onnx.errors.GraphCaptureError`; a policy-chosen one logs a warning and the session is
rebuilt without graphs. Never a silent slow path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from distributed_onnx.errors import GraphCaptureError
from distributed_onnx.model.backend.providers import CudaProvider, ExecutionProvider
from distributed_onnx.model.backend.validation import TensorSpec

logger = logging.getLogger(__name__)

#: The words ORT (1.2x-1.3x) uses in every graph-capture refusal at session creation, e.g. "This session cannot
#: use the graph capture feature as requested by the user as the model has control flow nodes which can't be
#: supported by CUDAExecutionProvider".
_REFUSAL = "cannot use the graph capture feature"
_FIX = (
    "Run it without CUDA graphs: CudaProvider(cuda_graph=False) (settings: providers: [{kind: cuda, cuda_graph: "
    "false}, cpu]), or leave the provider chain to the policy, which falls back to that with a warning."
)


def graph_chain(chain: list[ExecutionProvider]) -> tuple[list[ExecutionProvider], CudaProvider | None]:
    """The chain and its CUDA-graph provider: the first GPU provider, if it is CUDA with ``cuda_graph`` on.

    Behind TensorRT the CUDA provider only takes TensorRT's leftovers; ORT would refuse graphs there.
    """
    first_gpu = next((provider for provider in chain if provider.needs_gpu), None)
    if isinstance(first_gpu, CudaProvider) and first_gpu.cuda_graph:
        return chain, first_gpu
    return without_graphs(chain), None


def without_graphs(chain: list[ExecutionProvider]) -> list[ExecutionProvider]:
    return [
        provider.model_copy(update={"cuda_graph": False}) if isinstance(provider, CudaProvider) else provider
        for provider in chain
    ]


def capture_problems(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> list[str]:
    """Why these graph tensors cannot replay as per-bucket CUDA graphs; empty when they can."""
    problems = []
    batch_dims = set()
    for kind, specs in (("input", inputs), ("output", outputs)):
        for spec in specs:
            if not spec.shape:
                problems.append(f"{kind} {spec.name!r} is a scalar: it has no batch axis to bucket")
                continue
            if kind == "input":
                batch_dims.add(spec.shape[0])
            for axis, dim in enumerate(spec.shape[1:], start=1):
                if not isinstance(dim, int):
                    problems.append(
                        f"{kind} {spec.name!r} axis {axis} is dynamic ({dim or '?'}): a CUDA graph replays fixed "
                        "shapes and only the batch axis (axis 0) is bucketed"
                    )
    fixed = {dim for dim in batch_dims if isinstance(dim, int)}
    if len(fixed) > 1 or (fixed and len(batch_dims) > 1):
        problems.append(f"the inputs disagree on the batch axis (axis 0): {sorted(map(str, batch_dims))}")
    return problems


def capture_refusal(error: str) -> str | None:
    """ORT's reason for refusing graph capture, from a session-creation error; None for any other error."""
    start = error.find(_REFUSAL)
    if start < 0:
        return None
    sentence = error.rfind("This session", 0, start)
    return error[sentence if sentence >= 0 else start :].strip()


def settle(problems: Sequence[str], *, strict: bool, checkpoint: str) -> bool:
    """Apply the fallback rule to the problems found: True when CUDA graphs stay on.

    Raises:
        GraphCaptureError: ``strict`` (an explicit chain) and there is a problem.
    """
    if not problems:
        return True
    reasons = "; ".join(problems)
    if strict:
        raise GraphCaptureError(
            f"CUDA graphs were requested (CudaProvider.cuda_graph) but {checkpoint} cannot be captured: {reasons}. "
            + _FIX,
            problems=list(problems),
        )
    logger.warning(
        "CUDA graphs are off for %s, which runs on CUDA without graph replay (slower): %s", checkpoint, reasons
    )
    return False


def oversize_error(rows: int, largest: int) -> GraphCaptureError:
    """An explicit chain's answer to a batch larger than every bucket."""
    return GraphCaptureError(
        f"A batch of {rows} rows is larger than the largest CUDA-graph bucket ({largest} rows). Add a bucket "
        "(CudaProvider.batch_buckets) or send smaller batches (rows_per_batch); with a policy-chosen chain such "
        "batches run without a graph, with a warning.",
        rows=rows,
        largest=largest,
    )
