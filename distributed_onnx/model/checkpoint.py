"""Checkpoints: an ``.onnx`` weights file plus a ``<stem>.metadata.json`` document beside it.

The metadata is a superset of OpenSTEF's ``CheckpointMetadata`` (schema version 2): every OpenSTEF field
keeps its name, type, default and constraint, so a file OpenSTEF writes loads here unchanged, and since
OpenSTEF ignores unknown keys, ours loads there. Our additions are optional (``sha256``, ``description``).

This module only touches the file system; whether the graph agrees with the metadata is checked by the
backend, which is the one place that opens the graph.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from distributed_onnx import storage
from distributed_onnx.bounds import MAX_COUNT, MAX_NATIVE_QUANTILES, MAX_RESOLUTION_MINUTES, MAX_STEPS
from distributed_onnx.errors import (
    CheckpointIntegrityError,
    CheckpointMetadataError,
    CheckpointNotFoundError,
    ConfigError,
    describe_validation,
)
from distributed_onnx.local_paths import not_a_file
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE, strictly_ascending
from distributed_onnx.redact import is_url_without_slashes
from distributed_onnx.settings_flags import flag_of
from distributed_onnx.settings_sources import comma_list

logger = logging.getLogger(__name__)

#: The suffix of a checkpoint's metadata file beside its weights (``model.onnx`` -> ``model.metadata.json``).
METADATA_SUFFIX = ".metadata.json"

#: The OpenSTEF metadata layout this package reads and writes.
METADATA_SCHEMA_VERSION = 2

#: How a graph takes a missing context value: NaN in the tensor (the graph derives its own mask, as Chronos-Bolt,
#: TiRex and upstream Chronos-2 do) or 0.0 (with a mask input where the family has one).
MissingValue = Literal["nan", "zero"]
#: The axes of the quantile output after the row axis: ``[rows, quantiles, steps]`` or ``[rows, steps, quantiles]``.
OutputLayout = Literal["quantile_step", "step_quantile"]
#: How a horizon longer than one call is reached (``distributed_onnx/model/unroll.py``).
LongHorizon = Literal["refuse", "append_missing", "quantile_paths"]
#: How a horizon shorter than one call is reached (``distributed_onnx/model/horizons.py``).
ShortHorizon = Literal["first_steps", "output_patches", "refuse"]
#: ONNX Runtime's int8 quantizations (``export --quantize int8 --quantize-mode``): weights only, activations per call
#: ('dynamic'), or activations calibrated on sample windows ('static').
QuantizeMode = Literal["dynamic", "static"]
#: A graph whose output is a distribution's parameters rather than quantiles (the adapter computes the quantiles).
OutputDistribution = Literal["student_t_mixture"]
#: Marks a metadata field that changes no output: left out of the checkpoint's identity
#: (:mod:`distributed_onnx.model.identity`, which says why each marked field is). Every other field counts.
DESCRIPTIVE: dict[str, Any] = {"descriptive": True}


class ParentCheckpoint(BaseModel):
    """The checkpoint a variant (e.g. an int8 quantization) was derived from: its name and graph sha256."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(description="The parent's name (its weights file's stem).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the parent's weights (graph) file.")
    identity: dict[str, Any] | None = Field(
        default=None,
        description="The parent's identity record (its graph's sha256 and every metadata field that changes an "
        "output: distributed_onnx/model/identity.py); None in variants written before it was recorded.",
    )


class Quantization(BaseModel):
    """How a variant's weights were quantized (``distributed-onnx export --quantize``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    mode: QuantizeMode = Field(
        description="'dynamic': weights int8, activations quantized per call; 'static': activations' ranges "
        "calibrated on sample windows."
    )
    weight_type: Literal["int8"] = Field(default="int8", description="The weights' integer type.")
    activation_type: Literal["int8", "uint8"] | None = Field(
        default=None, description="Static: the activations' integer type (dynamic picks uint8 per call)."
    )
    op_types: list[str] | None = Field(default=None, description="Operator types quantized (None: the tool's set).")
    calibration_windows: int | None = Field(default=None, ge=1, description="Static: windows calibrated on.")
    calibration_source: str | None = Field(default=None, description="Static: where those windows came from.")
    tool: str | None = Field(default=None, description="The quantizer and its version, e.g. 'onnxruntime 1.32.0'.")


class CheckpointMetadata(BaseModel):
    """Model-family specifics that travel next to the weights (OpenSTEF schema version 2, plus ours)."""

    # OpenSTEF's BaseConfig ignores unknown keys; so do we, so either side can add optional fields.
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), frozen=True)

    schema_version: int = Field(
        default=METADATA_SCHEMA_VERSION,
        description="Version of the metadata layout; this package reads version 2.",
        json_schema_extra=DESCRIPTIVE,
    )
    model_family: str = Field(description="Model family identifier, e.g. 'chronos2'; selects the adapter.")
    input_names: list[str] = Field(min_length=1, description="Ordered names of the model's input tensors.")
    output_name: str = Field(description="Name of the model's quantile-prediction output tensor.")
    native_quantiles: list[float] = Field(
        min_length=1,
        max_length=MAX_NATIVE_QUANTILES,
        description="Quantile levels the model natively emits: strictly inside (0, 1), ascending.",
    )
    context_length: int = Field(gt=0, le=MAX_STEPS, description="Historical timesteps the model consumes as context.")
    output_patch_size: int = Field(gt=0, le=MAX_STEPS, description="Timesteps produced per output patch.")
    horizon_patches: int = Field(gt=0, le=MAX_STEPS, description="Number of output patches the model emits.")
    resolution_minutes: int = Field(
        gt=0, le=MAX_RESOLUTION_MINUTES, description="Sampling interval the model expects, in minutes."
    )
    precision: Literal["fp32", "fp16", "int8"] = Field(
        default="fp32", description="Numeric precision of the weights; drives provider selection."
    )
    static_shapes: bool = Field(
        default=False,
        description="Whether every graph axis is frozen; when False, context/horizon lengths are maxima.",
    )
    max_covariates: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="Frozen number of covariate rows per group, or None if dynamic."
    )
    # --- distributed_onnx additions (optional, ignored by OpenSTEF) ---
    # The graph's tensor contract, where families differ; the defaults are what files written before these
    # fields existed meant, so they load unchanged. Steps per call are ``horizon_length`` (above).
    missing_value: MissingValue | None = Field(
        default=None,
        description="How the graph takes a missing context value: 'nan' (NaN in the tensor; the graph derives its "
        "own mask) or 'zero' (0.0, plus a mask input where the family has one). None: the family's default "
        "(its rules in the family registry, distributed_onnx/model/families.py).",
    )
    output_layout: OutputLayout = Field(
        default="quantile_step",
        description="Axes of the quantile output after the row axis: 'quantile_step' is [rows, quantiles, steps] "
        "(Chronos-2, Chronos-Bolt), 'step_quantile' is [rows, steps, quantiles] (TiRex's ONNX graph).",
    )
    long_horizon: LongHorizon = Field(
        default="refuse",
        description="How a horizon longer than one call (horizon_length steps) is reached: 'refuse'; "
        "'append_missing' (append the steps just forecast as missing values and call again: TiRex); "
        "'quantile_paths' (append each native quantile as its own context path, call again and reduce the "
        "quantiles x quantiles paths to the native levels by empirical quantiles: Chronos-Bolt's pipeline).",
    )
    short_horizon: ShortHorizon | None = Field(
        default=None,
        description="How a horizon shorter than one call is reached: 'first_steps' (the call's first steps: each "
        "step is the same whatever horizon is asked, as in TiRex, Chronos-Bolt, Moirai 2, Toto, and TimesFM graphs "
        "exported before num_output_patches); 'output_patches' (the graph computes the output patches it is asked, "
        "ceil(horizon / output_patch_size) of them: as many as the future it is sent is long, Chronos-2 as exported "
        "here, or as its num_output_patches input says, TimesFM as exported here); 'refuse' (the graph always computes "
        "horizon_patches patches, which attend to each other, so its first ones are not the forecast for fewer: a "
        "horizon of fewer patches is refused). None: the family's default (its rules in the family registry, "
        "distributed_onnx/model/families.py).",
    )
    output_distribution: OutputDistribution | None = Field(
        default=None,
        description="None: the output holds the native quantiles (output_layout). 'student_t_mixture': it holds a "
        "mixture of Student-t distributions per step, [rows, steps, components, 4] as (weight, df, loc, scale), "
        "and the family's adapter computes the native quantiles of that mixture (Toto).",
    )
    max_horizon_length: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="The longest horizon a run may ask when long_horizon unrolls (None: no limit); at least "
        "horizon_length. Ignored (must be unset) when long_horizon is 'refuse'.",
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex sha256 of the weights file, verified on resolve when present.",
        json_schema_extra=DESCRIPTIVE,
    )
    description: str | None = Field(
        default=None, description="Free text: what the model is, provenance.", json_schema_extra=DESCRIPTIVE
    )
    parent: ParentCheckpoint | None = Field(
        default=None,
        description="The checkpoint this one was derived from (a quantized variant's fp32 parent).",
        json_schema_extra=DESCRIPTIVE,
    )
    quantization: Quantization | None = Field(
        default=None, description="How this variant was quantized.", json_schema_extra=DESCRIPTIVE
    )
    training_data_end: datetime | None = Field(
        default=None,
        description="The last timestamp of the data the model was trained on (UTC if naive): a backtest window "
        "whose horizon starts at or before it is in-sample, scored apart (docs/covariate-vintages.md).",
    )

    @field_validator("training_data_end")
    @classmethod
    def _utc_training_end(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

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
        if not strictly_ascending(value):
            msg = f"native_quantiles must be strictly ascending (no two within {LEVEL_TOLERANCE:g}), got {value}"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _consistent_contract(self) -> CheckpointMetadata:
        if self.horizon_length > MAX_STEPS:  # each factor within its bound, their product not
            msg = (
                f"one call's steps, output_patch_size x horizon_patches = {self.output_patch_size} x "
                f"{self.horizon_patches} = {self.horizon_length}, exceed {MAX_STEPS}; fix the checkpoint's metadata"
            )
            raise ValueError(msg)
        if self.long_horizon == "append_missing" and self.missing_value != "nan":
            msg = (
                "long_horizon 'append_missing' appends the forecast steps as missing values, which only a graph "
                f"taking NaN can tell from observed ones; set missing_value 'nan' (got {self.missing_value!r})"
            )
            raise ValueError(msg)
        if self.max_horizon_length is not None:
            if self.long_horizon == "refuse":
                msg = "max_horizon_length is set, but long_horizon is 'refuse': set long_horizon or drop it"
                raise ValueError(msg)
            if self.max_horizon_length < self.horizon_length:
                msg = (
                    f"max_horizon_length {self.max_horizon_length} is shorter than one call's "
                    f"{self.horizon_length} steps (output_patch_size x horizon_patches)"
                )
                raise ValueError(msg)
        return self

    @property
    def horizon_length(self) -> int:
        """Forecast timesteps the model emits in one call: ``output_patch_size * horizon_patches``."""
        return self.output_patch_size * self.horizon_patches

    @property
    def horizon_hint(self) -> str:
        """What to do about a horizon longer than the graph: for a graph that refuses, export it again."""
        if self.long_horizon != "refuse":
            return "ask a shorter horizon"
        if self.output_distribution is not None:
            return (
                f"ask at most {self.horizon_length} steps: beyond one call, {self.model_family}'s pipeline forecasts "
                "by sampling paths (each sampled step fed back), whose quantiles are random and no graph reproduces"
            )
        return (
            f"ask at most {self.horizon_length} steps, or export the checkpoint again for the longer horizon "
            f"(distributed-onnx export {self.model_family} --horizon STEPS)"
        )

    @property
    def longest_horizon(self) -> int | None:
        """The longest horizon a run may ask: one call's unless the graph unrolls (then the cap, None = any)."""
        return self.horizon_length if self.long_horizon == "refuse" else self.max_horizon_length


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
    return weights_path.with_suffix(METADATA_SUFFIX)


def weights_path_of(path: Path) -> Path:
    """The weights a checkpoint path means: ``x.metadata.json`` is the checkpoint ``x.onnx`` (people pick either
    file of the pair; the metadata's own name would otherwise be read as weights, looking for
    ``x.metadata.metadata.json``); any other path is itself."""
    if path.name.endswith(METADATA_SUFFIX) and len(path.name) > len(METADATA_SUFFIX):
        return path.with_name(path.name[: -len(METADATA_SUFFIX)] + ".onnx")
    return path


#: What to do with a checkpoint given as a URL: checkpoints are read from local files. Reading them from a store
#: would mean a download (and its cache, its credentials on every node) in every command; ``serve`` has one, for
#: a store of many checkpoints (``--model-repository``).
CHECKPOINT_URL_HINT = (
    "copy the .onnx file and its .metadata.json beside it to a local folder (on a cluster, one every node mounts) "
    "and give that path; distributed-onnx serve reads checkpoints from a store with --model-repository"
)


def local_checkpoint(value: LocationLike, what: str = "checkpoint") -> Path:
    """The local path of a checkpoint the user gave (text, a path, a Location): a URL is refused with one line
    naming it redacted (:meth:`Location.require_local`), never folded into a path (``https:/user:pw@...``); so is a
    URL written without its ``//`` (``s3:/KEY:SECRET@bucket/x?token=T#F``), which was read as a local path whose
    name (``x?token=T#F``) the names rule then quoted raw, a secret too short to be remembered for masking
    (:data:`~distributed_onnx.redact.SHORTEST_REMEMBERED`) with it. Refused here, the checkpoint is shown whole and
    redacted, every field of it masked whatever its length. A local file of such a name is given as ``./s3:/...``."""
    location = Location.parse(value)
    if location.local_path is not None and is_url_without_slashes(location.reveal()):
        raise ConfigError(
            f"{what} {location} looks like a URL without its // (SCHEME://BUCKET/PATH), and a checkpoint is read "
            f"from a local file: {CHECKPOINT_URL_HINT}. For a local file of that name, write ./ before it.",
            key=what.lstrip("-").replace("-", "_"),
        )
    return location.require_local(what, CHECKPOINT_URL_HINT, use="read")


def local_checkpoints(value: object) -> object:
    """A settings field's checkpoints (one, several comma-separated, a list) as local paths (:func:`local_checkpoint`);
    anything else is left to the field's own validation. The field is a command's ``checkpoint``: a refusal names
    its flag (every command with such a field has ``--checkpoint``). Several are read by the one parser of comma
    lists (:func:`~distributed_onnx.settings_sources.comma_list`): an empty entry or a checkpoint given twice is
    refused."""
    value = comma_list(value)
    if isinstance(value, Path | Location):
        value = [value]
    if isinstance(value, list | tuple):
        return [
            local_checkpoint(each, flag_of("checkpoint")) if isinstance(each, str | Path | Location) else each
            for each in value
        ]
    return value


def checkpoint_paths(paths: Sequence[Path]) -> list[Path]:
    """The checkpoints ``--checkpoint`` names: a folder is every ``*.onnx`` in it that has its metadata beside
    it (in name order, each logged: one line per checkpoint taken), a metadata file its weights, a file itself.

    Raises ValueError (a settings error, exit 2) for a folder that holds no checkpoint.
    """
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            found.append(weights_path_of(path))
            continue
        taken = sorted(onnx for onnx in path.glob("*.onnx") if default_metadata_path(onnx).is_file())
        if not taken:
            raise ValueError(
                f"the folder {path} holds no checkpoint (a MODEL.onnx with its MODEL{METADATA_SUFFIX} beside it)"
            )
        for weights in taken:
            logger.info("checkpoint folder %s: took %s", path, weights.name)
        found += taken
    return found


class LocalCheckpoint(BaseModel):
    """A checkpoint on the local file system (or a shared mount all nodes see)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["local"] = Field(default="local", description="Discriminator tag.")
    path: Path = Field(description="Path of the .onnx weights file.")
    metadata_path: Path | None = Field(
        default=None, description="Path of the metadata JSON; defaults to '<stem>.metadata.json' beside it."
    )

    @field_validator("path", mode="before")
    @classmethod
    def _weights(cls, value: object) -> object:
        return weights_path_of(local_checkpoint(value)) if isinstance(value, str | Path | Location) else value

    def resolve(self) -> ResolvedCheckpoint:
        """Read and validate the metadata, and verify the weights' sha256 when the metadata has one.

        Raises:
            CheckpointNotFoundError: the weights or metadata file is missing.
            CheckpointMetadataError: the metadata is not JSON or violates the schema.
            CheckpointIntegrityError: the weights' sha256 differs from the metadata's.
        """
        if not self.path.is_file():
            there = not_a_file(self.path)  # a folder, a link in a loop or to nothing: said, not "not found"
            raise CheckpointNotFoundError(
                f"Checkpoint weights not found: {self.path}"
                if there is None
                else f"Checkpoint weights {self.path} {there}; give the checkpoint's .onnx file, or its folder",
                path=str(self.path),
            )
        metadata_path = self.metadata_path or default_metadata_path(self.path)
        if not metadata_path.is_file() and self.path.suffix != ".onnx":  # a data table, a report given in its place
            raise CheckpointNotFoundError(
                f"{self.path} is not an .onnx checkpoint (a checkpoint is NAME.onnx with NAME.metadata.json beside "
                "it, as distributed-onnx export writes): give the checkpoint's .onnx file, or a folder holding it",
                path=str(self.path),
            )
        if not metadata_path.is_file():
            raise CheckpointNotFoundError(
                f"Checkpoint metadata not found: {metadata_path} (expected beside the weights {self.path})",
                path=str(metadata_path),
            )
        metadata = read_metadata(metadata_path)
        if metadata.sha256 is not None:
            actual = storage.sha256(Location(self.path))
            if actual != metadata.sha256:
                raise CheckpointIntegrityError(
                    f"Checkpoint weights {self.path} have sha256 {actual}, but {metadata_path} records "
                    f"{metadata.sha256}: the file is corrupt or belongs to another checkpoint.",
                    path=str(self.path),
                )
        return ResolvedCheckpoint(weights_path=self.path, metadata=metadata)


def peek_metadata(weights: Path) -> CheckpointMetadata | None:
    """A checkpoint's metadata, read without resolving it (no digest of the weights, no graph); None when its
    files are not there (resolving it later names what is missing). What the commands' up-front checks read."""
    metadata_path = default_metadata_path(weights)
    if not (weights.is_file() and metadata_path.is_file()):
        return None
    return read_metadata(metadata_path)


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
    storage.write_bytes(Location(path), model)
    document = stamped.model_dump(mode="json", exclude_none=True)
    storage.write_bytes(Location(default_metadata_path(path)), (json.dumps(document, indent=2) + "\n").encode("utf-8"))
    return ResolvedCheckpoint(weights_path=path, metadata=stamped)
