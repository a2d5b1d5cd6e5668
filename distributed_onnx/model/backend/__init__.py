"""Inference backends: the protocol, typed providers, provider policy and the ONNX Runtime backend.

Importing this package does not import onnxruntime; :class:`OnnxBackend` loads it on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distributed_onnx.model.backend.policy import DefaultProviderPolicy, HostCapabilities, ProviderPolicy
from distributed_onnx.model.backend.protocol import InferenceBackend
from distributed_onnx.model.backend.providers import (
    CoreMLProvider,
    CpuProvider,
    CudaProvider,
    ExecutionProvider,
    SessionOptionsConfig,
    TensorRTProvider,
    provider_from_kind,
)
from distributed_onnx.model.backend.validation import TensorSpec

if TYPE_CHECKING:
    from distributed_onnx.model.backend.onnx import OnnxBackend

__all__ = [
    "CoreMLProvider",
    "CpuProvider",
    "CudaProvider",
    "DefaultProviderPolicy",
    "ExecutionProvider",
    "HostCapabilities",
    "InferenceBackend",
    "OnnxBackend",
    "ProviderPolicy",
    "SessionOptionsConfig",
    "TensorRTProvider",
    "TensorSpec",
    "provider_from_kind",
]


def __getattr__(name: str) -> Any:
    if name == "OnnxBackend":
        from distributed_onnx.model.backend.onnx import OnnxBackend

        return OnnxBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
