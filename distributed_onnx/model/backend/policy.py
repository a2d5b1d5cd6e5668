"""Choosing an execution-provider chain: a pure function of the checkpoint and frozen host facts.

:func:`~distributed_onnx.model.backend.onnx.detect_host` is the one impure call (it asks ONNX Runtime, so it lives
in the one module that imports it); :class:`DefaultProviderPolicy` only reads the facts it is given, so every rule
is tested with fake hosts, no GPU needed, and this module loads without ONNX Runtime.

Two contracts meet here (see :func:`check_realized`): a chain the caller passed explicitly is *strict* (an
accelerator ONNX Runtime did not realize raises), a chain the policy chose is *graceful* (a warning only when
everything fell back to CPU). Independently of both, a process that was not assigned a GPU never builds a
CUDA/TensorRT chain: since Ray 2.60 an actor without ``num_gpus`` sees every GPU of its node, and would
silently share one with the actors that were given it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from distributed_onnx.errors import ProviderNotAllowedError, ProviderUnavailableError
from distributed_onnx.model.backend.providers import (
    CPU_PROVIDER_NAME,
    CoreMLProvider,
    CpuProvider,
    CudaProvider,
    ExecutionProvider,
)
from distributed_onnx.model.checkpoint import CheckpointMetadata

logger = logging.getLogger(__name__)


class HostCapabilities(BaseModel):
    """What the current process may run on, captured once as data (:func:`.onnx.detect_host` reads this host's)."""

    model_config = ConfigDict(frozen=True)

    platform: str = Field(description="Lower-case OS name: 'linux', 'darwin', 'windows'.")
    available_providers: frozenset[str] = Field(description="Providers ONNX Runtime reports as available.")
    gpu_assigned: bool = Field(
        default=True,
        description="Whether this process was given a GPU. Outside Ray every visible GPU is ours; a Ray "
        "actor without num_gpus must set this False so no GPU provider is built.",
    )


class ProviderPolicy(Protocol):
    """Maps a checkpoint and a host to an ordered provider chain, preferred first, CPU last."""

    def select(self, metadata: CheckpointMetadata, host: HostCapabilities) -> list[ExecutionProvider]: ...


class DefaultProviderPolicy(BaseModel):
    """CUDA when a GPU is ours, CoreML for static-shape float graphs on macOS, else CPU.

    TensorRT stays opt-in: its engine build costs minutes per new shape, so it is chosen explicitly with an
    engine cache, never by default.
    """

    model_config = ConfigDict(frozen=True)

    def select(self, metadata: CheckpointMetadata, host: HostCapabilities) -> list[ExecutionProvider]:
        cuda_ok = host.gpu_assigned and "CUDAExecutionProvider" in host.available_providers
        if cuda_ok:
            return [CudaProvider(), CpuProvider()]
        coreml_ok = (
            host.platform == "darwin"
            and "CoreMLExecutionProvider" in host.available_providers
            and metadata.static_shapes
            and metadata.precision != "int8"  # CoreML cannot accelerate QDQ int8 ops.
        )
        if coreml_ok:
            return [CoreMLProvider(compute_units="CPUAndGPU"), CpuProvider()]
        return [CpuProvider()]


def check_allowed(chain: Sequence[ExecutionProvider], host: HostCapabilities) -> None:
    """Refuse a GPU provider in a process that holds no GPU, before any session is built."""
    gpu_kinds = [provider.kind for provider in chain if provider.needs_gpu]
    if gpu_kinds and not host.gpu_assigned:
        raise ProviderNotAllowedError(
            f"Execution providers {gpu_kinds} need a GPU, but none was assigned to this process. Give the "
            "actor or replica a GPU (num_gpus > 0, fractions allowed) or use the CPU provider.",
            requested=gpu_kinds,
        )


def check_realized(chain: Sequence[ExecutionProvider], realized: Sequence[str], *, strict: bool) -> None:
    """Compare the requested chain with what ONNX Runtime realized (strict raises, graceful warns)."""
    accelerators = [name for name, _ in (provider.to_ort() for provider in chain) if name != CPU_PROVIDER_NAME]
    if not accelerators:
        return
    missing = [name for name in accelerators if name not in realized]
    if strict and missing:
        raise ProviderUnavailableError(
            f"Requested execution provider(s) {missing} were not realized; ONNX Runtime fell back to "
            f"{list(realized)}. Install onnxruntime-gpu (pip install 'distributed-onnx[gpu]') and check the "
            "CUDA/cuDNN libraries (ONNX Runtime says why with SessionOptionsConfig(log_severity_level=2)), or "
            "request the CPU provider.",
            missing=missing,
            realized=list(realized),
        )
    if not strict and len(missing) == len(accelerators):
        logger.warning(
            "No requested accelerator (%s) was realized; ONNX Runtime fell back to %s. Inference runs on CPU.",
            accelerators,
            list(realized),
        )
