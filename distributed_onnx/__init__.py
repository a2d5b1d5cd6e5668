"""distributed_onnx: run ONNX forecasting checkpoints at scale on Ray, offline (backtests) and online (Serve).

The public names below are stable; everything else is internal. :class:`OnnxBackend` is imported lazily so
that importing the package does not load ONNX Runtime, and :func:`backtest` imports Ray only when called.
The package's layers are its folders (``model``, ``runtime``, ``evaluation``, ``serve``); docs/design.md
describes them. ``distributed_onnx.backtest`` is the API function; the backtest's code lives in
``distributed_onnx.evaluation``, so no subpackage shares the function's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distributed_onnx.api import Backtest, backtest, fev_benchmark
from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.model.adapters import AdapterFactory, ModelAdapter, register_adapter
from distributed_onnx.model.backend import (
    CoreMLProvider,
    CpuProvider,
    CudaProvider,
    DefaultProviderPolicy,
    ExecutionProvider,
    HostCapabilities,
    InferenceBackend,
    ProviderPolicy,
    SessionOptionsConfig,
    TensorRTProvider,
)
from distributed_onnx.model.checkpoint import (
    CheckpointMetadata,
    LocalCheckpoint,
    ResolvedCheckpoint,
    write_checkpoint,
)
from distributed_onnx.version import __version__ as __version__

if TYPE_CHECKING:
    from distributed_onnx.model.backend.onnx import OnnxBackend


__all__ = [
    "AdapterFactory",
    "Backtest",
    "CheckpointMetadata",
    "CoreMLProvider",
    "CpuProvider",
    "CudaProvider",
    "DefaultProviderPolicy",
    "DistributedOnnxError",
    "ExecutionProvider",
    "HostCapabilities",
    "InferenceBackend",
    "LocalCheckpoint",
    "ModelAdapter",
    "OnnxBackend",
    "ProviderPolicy",
    "ResolvedCheckpoint",
    "SessionOptionsConfig",
    "TensorRTProvider",
    "backtest",
    "fev_benchmark",
    "register_adapter",
    "write_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name == "OnnxBackend":
        from distributed_onnx.model.backend.onnx import OnnxBackend

        return OnnxBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
