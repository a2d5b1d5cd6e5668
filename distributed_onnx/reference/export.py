"""Export the reference forecaster to a self-contained ONNX graph: weights embedded, ``rows`` axis dynamic."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from distributed_onnx.reference.model import INPUT_NAMES, OUTPUT_NAME, ReferenceForecaster

OPSET_VERSION = 17


def example_inputs(model: ReferenceForecaster, rows: int = 3) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: one group with a target row and covariate rows, so every branch is exercised."""
    cfg = model.config
    generator = torch.Generator().manual_seed(0)
    context = torch.randn(rows, cfg.context_length, generator=generator)
    covariates = torch.zeros(rows, cfg.horizon)
    covariates[1:] = torch.randn(rows - 1, cfg.horizon, generator=generator)
    covariates_mask = torch.zeros(rows, cfg.horizon)
    covariates_mask[1:] = 1.0
    return (
        context,
        torch.ones(rows, cfg.context_length),
        torch.zeros(rows, dtype=torch.int64),
        covariates,
        covariates_mask,
    )


def export_onnx(model: ReferenceForecaster, opset_version: int = OPSET_VERSION) -> bytes:
    """Serialized ONNX ModelProto with every weight embedded; only axis 0 (``rows``) is dynamic.

    Uses the TorchScript exporter (``dynamo=False``), which still exists in torch 2.13 and writes the
    graph as one file; the dynamo exporter defaults to external data for weights.
    """
    model.eval()
    rows_axis = {0: "rows"}
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        path = Path(scratch) / "model.onnx"
        # The TorchScript exporter is deprecated in favour of dynamo; it still works and is what we use.
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        torch.onnx.export(
            model,
            example_inputs(model),
            path,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes={**{name: rows_axis for name in INPUT_NAMES}, OUTPUT_NAME: rows_axis},
            opset_version=opset_version,
            do_constant_folding=True,
            dynamo=False,
        )
        proto = onnx.load(path, load_external_data=False)
    onnx.checker.check_model(proto, full_check=True)
    if any(initializer.data_location == onnx.TensorProto.EXTERNAL for initializer in proto.graph.initializer):
        raise RuntimeError("the exported graph references external weight data; expected them embedded")
    payload: bytes = proto.SerializeToString()
    return payload
