"""distributed_onnx: run ONNX forecasting checkpoints at scale on Ray, offline (backtests) and online (Serve).

The public names below are stable; everything else is internal. Each is imported when first asked for
(:func:`__getattr__`), not with the package: every module of the package, the command's first one included
(``distributed_onnx.__main__``), imports this file first, and its imports (numpy, the model families) took long
enough that a Ctrl-C or a SIGTERM in them met no handler yet (a traceback, a bare exit 143); importing the package
loads neither ONNX Runtime nor Ray, and :func:`backtest` imports Ray only when called.
The package's layers are its folders (``model``, ``runtime``, ``evaluation``, ``serve``); docs/design.md
describes them. ``distributed_onnx.backtest`` is the API function; the backtest's code lives in
``distributed_onnx.evaluation``, so no subpackage shares the function's name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from distributed_onnx.model.backend.onnx import OnnxBackend
    from distributed_onnx.model.checkpoint import (
        CheckpointMetadata,
        LocalCheckpoint,
        ResolvedCheckpoint,
        write_checkpoint,
    )
    from distributed_onnx.version import __version__ as __version__

#: Where each public name lives: imported from there when first asked for (:func:`__getattr__`).
_HOMES = {
    **dict.fromkeys(("Backtest", "backtest", "fev_benchmark"), "distributed_onnx.api"),
    "DistributedOnnxError": "distributed_onnx.errors",
    **dict.fromkeys(("AdapterFactory", "ModelAdapter", "register_adapter"), "distributed_onnx.model.adapters"),
    **dict.fromkeys(
        (
            "CoreMLProvider",
            "CpuProvider",
            "CudaProvider",
            "DefaultProviderPolicy",
            "ExecutionProvider",
            "HostCapabilities",
            "InferenceBackend",
            "ProviderPolicy",
            "SessionOptionsConfig",
            "TensorRTProvider",
        ),
        "distributed_onnx.model.backend",
    ),
    "OnnxBackend": "distributed_onnx.model.backend.onnx",
    **dict.fromkeys(
        ("CheckpointMetadata", "LocalCheckpoint", "ResolvedCheckpoint", "write_checkpoint"),
        "distributed_onnx.model.checkpoint",
    ),
    "__version__": "distributed_onnx.version",  # read from the installed metadata: importlib.metadata's imports
}


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
    home = _HOMES.get(name)
    if home is None:  # not a public name: ``from distributed_onnx import cli`` then imports the submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # asked once: the next look finds it here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
