"""int8 variants of an ONNX graph by ONNX Runtime's own quantizer (``onnxruntime.quantization``).

Besides :mod:`distributed_onnx.model.backend.onnx`, the one module allowed to import ONNX Runtime (the
import-linter contract "onnxruntime" and ruff's banned-api exempt it): quantization is ORT's tool, used only by
``distributed-onnx export --quantize``, never by a backtest or a server.

- **dynamic** (``quantize_dynamic``): the weights become int8; each call quantizes the activations from their
  observed range (uint8). No data needed; the speed-up on CPUs with int8 dot products (VNNI, AMX) is the point.
  Subgraphs too (``EnableSubgraph``): Chronos-2's group attention sits in an ``If`` branch, whose ``MatMul`` nodes the
  quantizer leaves in fp32 otherwise.
- **static** (``quantize_static``, QDQ format): the activations' ranges are calibrated once (MinMax) on sample
  inputs fed by a ``CalibrationDataReader``; only ``MatMul`` is quantized, whose inputs are finite (a graph's
  NaN-masking happens before them, and NaN would poison a MinMax range).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.errors import MissingExtraError
from distributed_onnx.model.checkpoint import QuantizeMode

__all__ = ["STATIC_OP_TYPES", "QuantizeMode", "quantize_graph"]
#: The operators static quantization rewrites (see the module docstring).
STATIC_OP_TYPES = ["MatMul"]


def quantize_graph(
    source: Path,
    output: Path,
    mode: QuantizeMode,
    calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Write ``source`` quantized to int8 as ``output`` (weights as external data ``output.data`` when large).

    Returns what :class:`~distributed_onnx.model.checkpoint.Quantization` records about it (mode, types, ops).
    ``calibration``: the graph's input feeds, one dict per batch (static only).
    """
    try:
        import onnxruntime
        from onnxruntime import quantization as q
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingExtraError.for_package("onnxruntime", "cpu") from exc

    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in (output, output.with_name(output.name + ".data")):
        stale.unlink(missing_ok=True)
    tool = f"onnxruntime {onnxruntime.__version__}"
    if mode == "dynamic":
        q.quantize_dynamic(
            source,
            output,
            weight_type=q.QuantType.QInt8,
            use_external_data_format=True,
            extra_options={"EnableSubgraph": True},
        )
        return {"mode": "dynamic", "weight_type": "int8", "tool": tool}
    feeds = [dict(feed) for feed in calibration or []]
    if not feeds:
        raise ValueError("static quantization needs calibration inputs")

    class Reader(q.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._left = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._left, None)

    q.quantize_static(
        source,
        output,
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        op_types_to_quantize=STATIC_OP_TYPES,
        activation_type=q.QuantType.QInt8,
        weight_type=q.QuantType.QInt8,
        calibrate_method=q.CalibrationMethod.MinMax,
        use_external_data_format=True,
        calibration_providers=["CPUExecutionProvider"],
    )
    return {
        "mode": "static",
        "weight_type": "int8",
        "activation_type": "int8",
        "op_types": list(STATIC_OP_TYPES),
        "tool": tool,
    }
