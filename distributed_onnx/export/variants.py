"""``export --quantize int8``: the exported checkpoint's int8 variant, written as a checkpoint of its own.

``NAME.onnx`` -> ``NAME-int8.onnx`` (+ ``.data``) with its metadata: the parent's, with ``precision: int8``,
``parent: {name, sha256, identity}`` (the fp32 checkpoint it came from and its identity:
:mod:`distributed_onnx.model.identity`) and ``quantization: {mode, weight_type, ...}``, so a backtest can put the
two side by side and a report can say which is whose variant (or that a checkpoint of the parent's name is not
it). Static quantization calibrates on the parity windows (from ``--data``: the user's own series). The variant's
report (``NAME-int8.parity.json``) compares it with its parent on those windows. A variant whose forecasts moved
beyond :data:`VARIANT_TOLERANCE` is broken, not less accurate: it is removed (the parent stays), the report kept,
and the export ends with exit 2. Within it, whether its accuracy is good enough is for a backtest on the user's
data to say (the verdict, docs/comparisons.md), and ``tune`` to act on, not this file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import ParityError
from distributed_onnx.export.metadata import write_metadata
from distributed_onnx.export.parity import parity_statistics
from distributed_onnx.export.parity_check import parity_windows
from distributed_onnx.export.request import ExportRequest
from distributed_onnx.location import Location
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.backend.providers import CpuProvider
from distributed_onnx.model.checkpoint import LocalCheckpoint, ParentCheckpoint, Quantization
from distributed_onnx.model.identity import identity_of
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

#: Windows per calibration batch (the reader feeds the graph one batch at a time).
CALIBRATION_BATCH = 16
#: The largest ``max_rel_diff`` (the variant's largest difference from its parent over the parent's largest
#: forecast, :func:`~.parity.parity_statistics`) an int8 variant is kept with. int8 moves forecasts by design, so
#: this is no parity to float rounding (:data:`.parity_check.PARITY_TOLERANCE`): it only catches a quantization that
#: broke the graph. Every family's tiny export stays well inside it in both modes
#: (``benchmarks/results/int8_families.md``).
VARIANT_TOLERANCE = 0.1


def variant_path(parent: Path, kind: Literal["int8"]) -> Path:
    """``NAME.onnx`` -> ``NAME-int8.onnx`` beside it."""
    return parent.with_name(f"{parent.stem}-{kind}{parent.suffix}")


def write_int8_variant(request: ExportRequest) -> tuple[Path, dict[str, Any]]:
    """Quantize the checkpoint ``request.output`` (already exported) and write it as its own checkpoint.

    Returns the variant's path and its comparison with the parent (also written as ``NAME-int8.parity.json``).
    """
    from distributed_onnx.model.backend.quantize import quantize_graph

    parent = LocalCheckpoint(path=request.output).resolve()
    metadata = parent.metadata
    windows, source = parity_windows(request, metadata.context_length, metadata.resolution_minutes)
    output = variant_path(request.output, "int8")
    calibration = None
    if request.quantize_mode == "static":
        adapter = adapter_for(metadata)
        calibration = [
            adapter.build_inputs(windows[start : start + CALIBRATION_BATCH], None)[0]
            for start in range(0, windows.shape[0], CALIBRATION_BATCH)
        ]
    details = quantize_graph(request.output, output, request.quantize_mode, calibration)
    if request.quantize_mode == "static":
        details |= {"calibration_windows": int(windows.shape[0]), "calibration_source": source}
    assert metadata.sha256 is not None  # write_metadata records it
    variant = metadata.model_copy(
        update={
            "precision": "int8",
            "sha256": None,
            "parent": ParentCheckpoint(name=parent.name, sha256=metadata.sha256, identity=identity_of(parent).record()),
            "quantization": Quantization.model_validate(details),
            "description": f"int8 ({request.quantize_mode}) variant of {parent.name}. {metadata.description or ''}",
        }
    )
    metadata_path = write_metadata(output, variant)
    comparison = compare_to_parent(request.output, output, windows, metadata.horizon_length) | {"source": source}
    passed = bool(np.isfinite(comparison["max_abs_diff"]) and comparison["max_rel_diff"] <= VARIANT_TOLERANCE)
    comparison |= {"tolerance": VARIANT_TOLERANCE, "passed": passed}
    report = output.with_suffix(".parity.json")
    document = {  # strict JSON: a non-finite difference is null
        key: None if isinstance(value, float) and not np.isfinite(value) else value for key, value in comparison.items()
    }
    storage.write_bytes(Location(report), (json.dumps(document, indent=2) + "\n").encode("utf-8"))
    if not passed:
        for written in (output, output.with_name(output.name + ".data"), metadata_path):
            written.unlink(missing_ok=True)
        raise ParityError(
            f"the int8 ({request.quantize_mode}) variant of {parent.name} moved its forecasts by max_rel_diff "
            f"{comparison['max_rel_diff']} (max_abs_diff {comparison['max_abs_diff']}) against its parent, beyond "
            f"the tolerance {VARIANT_TOLERANCE}: the quantization broke the graph. The variant was removed (the "
            f"parent {request.output.name} is kept), the report is {report}. Try the other --quantize-mode, or "
            "export without --quantize",
            key="quantize",
        )
    return output, comparison


def compare_to_parent(parent: Path, variant: Path, windows: np.ndarray, horizon: int) -> dict[str, Any]:
    """Both checkpoints' native-quantile forecasts on the same windows: how far the variant moved."""
    forecasts = []
    for checkpoint in (parent, variant):
        worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()]))
        try:
            levels = worker.metadata.native_quantiles
            forecasts.append(worker.forecast(windows, horizon, levels).astype(np.float64))
        finally:
            worker.close()
    theirs, ours = forecasts
    return {
        "parent": parent.stem,
        "variant": variant.stem,
        "windows": int(windows.shape[0]),
        "horizon": horizon,
        **parity_statistics(ours, theirs, "parent"),
    }
