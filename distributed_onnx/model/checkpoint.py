"""Checkpoints: an ``.onnx`` weights file plus a ``<stem>.metadata.json`` document beside it.

The metadata is a superset of OpenSTEF's ``CheckpointMetadata`` (schema version 2): every OpenSTEF field
keeps its name, type, default and constraint, so a file OpenSTEF writes loads here unchanged, and since
OpenSTEF ignores unknown keys, ours loads there. Our additions are optional (``sha256``, ``description``).

This module only touches the file system; whether the graph agrees with the metadata is checked by the
backend, which is the one place that opens the graph.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from distributed_onnx import storage
from distributed_onnx.errors import (
    CheckpointIntegrityError,
    CheckpointMetadataError,
    CheckpointNotFoundError,
    describe_validation,
)

#: The OpenSTEF metadata layout this package reads and writes.
METADATA_SCHEMA_VERSION = 2


class CheckpointMetadata(BaseModel):
    """Model-family specifics that travel next to the weights (OpenSTEF schema version 2, plus ours)."""

    # OpenSTEF's BaseConfig ignores unknown keys; so do we, so either side can add optional fields.
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), frozen=True)

    schema_version: int = Field(
        default=METADATA_SCHEMA_VERSION,
        description="Version of the metadata layout; this package reads version 2.",
    )
    model_family: str = Field(description="Model family identifier, e.g. 'chronos2'; selects the adapter.")
    input_names: list[str] = Field(min_length=1, description="Ordered names of the model's input tensors.")
    output_name: str = Field(description="Name of the model's quantile-prediction output tensor.")
    native_quantiles: list[float] = Field(
        min_length=1, description="Quantile levels the model natively emits: strictly inside (0, 1), ascending."
    )
    context_length: int = Field(gt=0, description="Historical timesteps the model consumes as context.")
    output_patch_size: int = Field(gt=0, description="Timesteps produced per output patch.")
    horizon_patches: int = Field(gt=0, description="Number of output patches the model emits.")
    resolution_minutes: int = Field(gt=0, description="Sampling interval the model expects, in minutes.")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        default="fp32", description="Numeric precision of the weights; drives provider selection."
    )
    static_shapes: bool = Field(
        default=False,
        description="Whether every graph axis is frozen; when False, context/horizon lengths are maxima.",
    )
    max_covariates: int | None = Field(
        default=None, gt=0, description="Frozen number of covariate rows per group, or None if dynamic."
    )
    # --- distributed_onnx additions (optional, ignored by OpenSTEF) ---
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex sha256 of the weights file, verified on resolve when present.",
    )
    description: str | None = Field(default=None, description="Free text: what the model is, provenance.")

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value != METADATA_SCHEMA_VERSION:
            msg = f"schema_version {value} is not supported; this package reads version {METADATA_SCHEMA_VERSION}"
            raise ValueError(msg)
        return value

    @field_validator("native_quantiles")
    @classmethod
    def _usable_levels(cls, value: list[float]) -> list[float]:
        # Checked here, once, rather than by every forecast that maps native levels onto requested ones.
        outside = [q for q in value if not 0.0 < q < 1.0]
        if outside:
            msg = (
                f"native_quantiles must lie strictly between 0 and 1, got {outside} in {value}: levels 0 and 1 are "
                "the unbounded ends of a distribution, which no model predicts; fix the checkpoint's metadata"
            )
            raise ValueError(msg)
        if any(b <= a for a, b in itertools.pairwise(value)):
            msg = f"native_quantiles must be strictly ascending, got {value}"
            raise ValueError(msg)
        return value

    @property
    def horizon_length(self) -> int:
        """Forecast timesteps the model emits: ``output_patch_size * horizon_patches``."""
        return self.output_patch_size * self.horizon_patches


class ResolvedCheckpoint(BaseModel):
    """A checkpoint whose weights and metadata are on local disk and have been checked."""

    model_config = ConfigDict(frozen=True)

    weights_path: Path = Field(description="Local path of the weights file.")
    metadata: CheckpointMetadata = Field(description="The parsed metadata.")

    @property
    def name(self) -> str:
        """The model's name: the weights file's stem (used in reports and the serving URL)."""
        return self.weights_path.stem


def default_metadata_path(weights_path: Path) -> Path:
    """``model.onnx`` -> ``model.metadata.json`` (OpenSTEF's convention)."""
    return weights_path.with_suffix(".metadata.json")


class LocalCheckpoint(BaseModel):
    """A checkpoint on the local file system (or a shared mount all nodes see)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["local"] = Field(default="local", description="Discriminator tag.")
    path: Path = Field(description="Path of the .onnx weights file.")
    metadata_path: Path | None = Field(
        default=None, description="Path of the metadata JSON; defaults to '<stem>.metadata.json' beside it."
    )

    def resolve(self) -> ResolvedCheckpoint:
        """Read and validate the metadata, and verify the weights' sha256 when the metadata has one.

        Raises:
            CheckpointNotFoundError: the weights or metadata file is missing.
            CheckpointMetadataError: the metadata is not JSON or violates the schema.
            CheckpointIntegrityError: the weights' sha256 differs from the metadata's.
        """
        if not self.path.is_file():
            raise CheckpointNotFoundError(f"Checkpoint weights not found: {self.path}", path=str(self.path))
        metadata_path = self.metadata_path or default_metadata_path(self.path)
        if not metadata_path.is_file():
            raise CheckpointNotFoundError(
                f"Checkpoint metadata not found: {metadata_path} (expected beside the weights {self.path})",
                path=str(metadata_path),
            )
        metadata = read_metadata(metadata_path)
        if metadata.sha256 is not None:
            actual = storage.sha256(self.path)
            if actual != metadata.sha256:
                raise CheckpointIntegrityError(
                    f"Checkpoint weights {self.path} have sha256 {actual}, but {metadata_path} records "
                    f"{metadata.sha256}: the file is corrupt or belongs to another checkpoint.",
                    path=str(self.path),
                )
        return ResolvedCheckpoint(weights_path=self.path, metadata=metadata)


def read_metadata(path: Path) -> CheckpointMetadata:
    """Parse one metadata file, naming the file and the offending keys on failure."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointMetadataError(
            f"Checkpoint metadata {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 JSON.",
            path=str(path),
        ) from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointMetadataError(
            f"Checkpoint metadata {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            path=str(path),
        ) from exc
    try:
        return CheckpointMetadata.model_validate(document)
    except ValidationError as exc:
        raise CheckpointMetadataError(
            f"Checkpoint metadata {path} violates the schema: {describe_validation(exc.errors())}", path=str(path)
        ) from exc


def write_checkpoint(path: Path, model: bytes, metadata: CheckpointMetadata) -> ResolvedCheckpoint:
    """Write ``model`` (a serialized ONNX graph) and its metadata atomically, recording the sha256.

    Each file is written to a temporary name in the same directory and renamed into place, so a reader
    never sees a half-written checkpoint; the weights land first, so metadata never points at missing weights.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    stamped = metadata.model_copy(update={"sha256": hashlib.sha256(model).hexdigest()})
    storage.write_bytes(path, model)
    document = stamped.model_dump(mode="json", exclude_none=True)
    storage.write_bytes(default_metadata_path(path), (json.dumps(document, indent=2) + "\n").encode("utf-8"))
    return ResolvedCheckpoint(weights_path=path, metadata=stamped)
