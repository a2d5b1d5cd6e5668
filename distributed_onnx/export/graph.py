"""Tracing a family's module into an ONNX graph and writing it, its weights as external data beside it.

The exporter (torch's dynamo exporter), its optimizer and the file writing, each a phase of the export's progress;
shared by every family: those whose graph takes ``context`` through :func:`export_context_graph`, Chronos-2 (its
own inputs) through :func:`save_program`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.export.progress import phase
from distributed_onnx.export.torch_extra import require_torch
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The loggers ``names`` at WARNING for the block (the exporter's log every rewrite at INFO), then as they were."""
    with contextlib.ExitStack() as restore:
        for each in map(logging.getLogger, names):
            restore.callback(each.setLevel, each.level)
            each.setLevel(logging.WARNING)
        yield


def context_module(model: Any, call: Callable[[Any, Any], Any]) -> Any:
    """The module the exporter traces: ``context -> call(model, context)``, ``model`` its submodule (weights)."""
    torch = require_torch()

    class OneCall(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, context: Any) -> Any:
            return call(self.model, context)

    # In eval mode, as ``model`` is: a new module is in training mode, which the exporter warned about
    # ("Exporting a model while it is in training mode") although every weight-bearing submodule was in eval.
    return OneCall().eval()


def export_context_graph(
    module: Any, sample: np.ndarray, output: Path, output_name: str, output_patches: int | None = None
) -> None:
    """Export ``module(context) -> output_name`` with a dynamic batch axis; weights as external data. With
    ``output_patches``, ``module(context, num_output_patches)``: the graph also takes that 0-d int64 (the output
    patches a call asks, ``model/horizons.py``), traced at ``output_patches`` (its most).

    The dynamo exporter (``torch.export``) is used: the TorchScript one traces Chronos-Bolt's register token
    to a float index (an invalid ``Gather``) and TiRex's batch size into its reshapes.
    """
    torch = require_torch()
    output.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1)
    inputs: tuple[Any, ...] = (torch.from_numpy(sample),)
    dynamic: dict[str, Any] = {"context": {0: batch}}
    if output_patches is not None:
        inputs = (*inputs, torch.tensor(output_patches, dtype=torch.int64))
        dynamic[NUM_OUTPUT_PATCHES] = None
    # The exporter's optimizer logs every rewrite at INFO (hundreds of lines); its warnings stay.
    with quiet_loggers("onnx_ir", "onnxscript"), torch.no_grad():
        phase("tracing and exporting the graph")
        program = torch.onnx.export(
            module,
            inputs,
            input_names=list(dynamic),
            output_names=[output_name],
            dynamic_shapes=dynamic,
            dynamo=True,
            verbose=False,
            optimize=False,  # done below, as its own phase (what export(optimize=True) does)
        )
        save_program(program, output)


def save_program(program: Any, output: Path) -> None:
    """Optimize the exported program (constant folding, redundancies removed) and write it: each a phase."""
    with quiet_loggers("onnx_ir", "onnxscript"):
        phase("optimizing the graph")
        program.optimize()
        phase(f"writing {output} and its weights")
        for stale in (output, output.with_name(output.name + ".data")):
            stale.unlink(missing_ok=True)
        # Every initializer in MODEL.onnx.data beside the graph: a published model's weights stay out of the
        # protobuf (2 GiB limit) and the graph file stays small enough to hash and copy.
        program.save(str(output), external_data=True)
