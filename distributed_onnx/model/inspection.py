"""``distributed-onnx inspect``: what a checkpoint is (metadata, graph, family) and what this machine can run it with.

The checkpoint argument is resolved as ``backtest --checkpoint`` resolves it (:func:`~.checkpoint.checkpoint_paths`:
a ``.onnx`` file, its ``.metadata.json``, or a folder meaning every checkpoint in it), so that a folder one command
takes the other takes too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint, checkpoint_paths, local_checkpoint
from distributed_onnx.settings_sources import CommandSettings

__all__ = ["InspectRequest", "inspect_checkpoints"]


class InspectRequest(CommandSettings):
    """Print a checkpoint's metadata, its graph's inputs and outputs, and the ONNX Runtime execution providers
    available on this machine, as JSON: one object for a checkpoint file, a list of them for a folder."""

    label: ClassVar[str] = "inspect settings"

    checkpoint: CliPositionalArg[Path] = Field(
        examples=["CHECKPOINT.onnx"],
        description="The .onnx file (its metadata STEM.metadata.json beside it), that metadata file, or a folder: "
        "every checkpoint in it, as backtest --checkpoint takes them.",
    )

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _local(cls, value: Any) -> Any:
        """A local path, as every command's checkpoint (a URL refused in one line); an empty one refused too."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty; give the checkpoint's path")
        return local_checkpoint(value) if isinstance(value, str | Path | Location) else value

    _paths: list[Path] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _resolve_the_argument(self) -> InspectRequest:
        self._paths = checkpoint_paths([self.checkpoint])  # a folder holding none is refused, as backtest does
        return self

    @property
    def checkpoints(self) -> list[Path]:
        """The checkpoints the argument names (one for a file, every one in a folder)."""
        return list(self._paths)


def inspect_checkpoints(request: InspectRequest) -> dict[str, Any] | list[dict[str, Any]]:
    """The document of each checkpoint the argument names: the one object for a file, a list for a folder."""
    documents = [describe(LocalCheckpoint(path=path).resolve()) for path in request.checkpoints]
    return documents if request.checkpoint.is_dir() else documents[0]


def describe(resolved: ResolvedCheckpoint) -> dict[str, Any]:
    """One checkpoint's metadata, its graph's tensors (an ONNX Runtime session on CPU), its family and the
    providers this machine has."""
    from distributed_onnx.model import families
    from distributed_onnx.model.backend.onnx import OnnxBackend, available_providers, runtime_version
    from distributed_onnx.model.backend.providers import CpuProvider

    metadata = resolved.metadata
    with OnnxBackend.from_checkpoint(resolved, [CpuProvider()]) as backend:
        return {
            "checkpoint": str(resolved.weights_path),
            "metadata": metadata.model_dump(mode="json") | {"horizon_length": metadata.horizon_length},
            "inputs": [spec.describe() for spec in backend.input_specs],
            "outputs": [spec.describe() for spec in backend.output_specs],
            "family": families.describe(metadata.model_family),
            "onnxruntime": runtime_version(),
            "available_providers": available_providers(),
        }
