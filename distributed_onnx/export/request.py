"""What an export is asked for and what it gives back, and the dispatch to the family's exporter module."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from distributed_onnx.bounds import MAX_PARITY_WINDOWS, MAX_RESOLUTION_MINUTES, MAX_STEPS
from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location
from distributed_onnx.model import families
from distributed_onnx.model.families import Family


class ExportRequest(BaseModel):
    """One ``distributed-onnx export`` call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str = Field(description="The model family to export: one whose record (model/families.py) has an exporter.")
    pretrained_dir: Path | None = Field(
        default=None, description="A local folder of the upstream model (its config and weights)."
    )
    random_weights: Literal["tiny", "published"] | None = Field(
        default=None,
        description="Instead of a folder: the family built from its upstream classes with seeded random weights, "
        "'tiny' (the tests' configs) or 'published' (the published architecture); forecasts are meaningless "
        "(for trying the pipeline and benchmarks), and the metadata's description says so.",
    )
    output: Path = Field(description="The .onnx file to write; the metadata JSON is written beside it.")
    data: Location | None = Field(
        default=None, description="An input table (Parquet/CSV, a path or a URL) whose windows the parity report uses."
    )

    @field_validator("data", mode="before")
    @classmethod
    def _none_when_empty(cls, value: Any) -> Any:
        return value or None

    @field_validator("pretrained_dir", mode="before")
    @classmethod
    def _local_folder(cls, value: Any) -> Any:
        # Parsed as a location, so that a URL is refused naming it redacted; as a Path, ``https://user:pw@host``
        # became ``https:/user:pw@host``, a local folder that does not exist, and the error showed the password.
        if not isinstance(value, str | Path | Location):
            return value
        return Location.parse(value).require_local(
            "--from-pretrained",
            "download the published model once (hf download REPOSITORY --local-dir DIR, docs/export.md) and give "
            "that folder",
        )

    @field_validator("output", mode="before")
    @classmethod
    def _local_output(cls, value: Any) -> Any:
        if not isinstance(value, str | Path | Location):
            return value
        return Location.parse(value).require_local(
            "--output", "export writes the checkpoint to a local file; give a local path and copy the files after"
        )

    parity_windows: int = Field(
        default=32, ge=1, le=MAX_PARITY_WINDOWS, description="How many windows the parity report compares."
    )
    horizon: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="The longest horizon (steps) the checkpoint will be asked for. Chronos-2: the graph computes "
        "exactly the output patches upstream's pipeline computes for it (ceil(horizon / output_patch_size); the "
        "output patches attend to each other, so more patches change the forecasts); default: the model's own "
        "default prediction length (max_output_patches patches, as predict_df without prediction_length). "
        "Chronos-Bolt and TiRex: their graph is the same at every horizon (upstream computes one call and cuts "
        "or unrolls it); the horizon the parity report compares (default: two calls). TimesFM: the graph decodes "
        "ceil(horizon / 128) output patches (default: one) and refuses a longer horizon.",
    )
    quantize: Literal["int8"] | None = Field(
        default=None,
        description="Also write the checkpoint's int8 variant, NAME-int8.onnx, whose metadata names its parent.",
    )
    quantize_mode: Literal["dynamic", "static"] = Field(
        default="dynamic",
        description="'dynamic': int8 weights, activations quantized per call (no data needed); 'static': the "
        "activations' ranges calibrated on --data's windows (--parity-windows of them).",
    )
    resolution_minutes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_RESOLUTION_MINUTES,
        description="The sampling interval of the data the checkpoint will forecast, written to its metadata "
        "(the families are trained across resolutions; a backtest lays the data out on this grid). "
        "Default: the step of --data; without --data it is required.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ExportRequest:
        if (self.pretrained_dir is None) == (self.random_weights is None):
            raise ValueError(
                "give exactly one of --from-pretrained DIR (a downloaded model) and --random-weights "
                "(--size tiny|published: forecasts are meaningless)"
            )
        return self

    @property
    def folder(self) -> Path:
        """The pretrained folder the family's exporter loads (for ``--random-weights``, the one built for it)."""
        if self.pretrained_dir is None:
            raise ConfigError("no --from-pretrained folder to load", key="pretrained_dir")
        return self.pretrained_dir


class ExportResult(BaseModel):
    """What an export wrote and how close ONNX Runtime came to the upstream pipeline."""

    model_config = ConfigDict(frozen=True)

    weights_path: Path = Field(description="The .onnx file written.")
    metadata_path: Path = Field(description="The checkpoint metadata JSON written beside it.")
    parity_path: Path = Field(description="The parity report (JSON) written beside it.")
    parity: dict[str, Any] = Field(description="The parity report's content: windows compared, max abs diff, ...")
    variant_path: Path | None = Field(default=None, description="The int8 variant written (--quantize), if any.")
    variant: dict[str, Any] | None = Field(
        default=None, description="The variant against its parent on the parity windows (NAME-int8.parity.json)."
    )


def run_export(request: ExportRequest) -> ExportResult:
    """Export ``request.family`` by ``export(request)`` of its family's exporter module (the family registry,
    :mod:`distributed_onnx.model.families`)."""
    declared = exportable_family(request.family)
    assert declared.exporter is not None  # exportable_family refuses a family without one
    if request.output.is_dir():
        raise ConfigError(
            f"--output {request.output} is a folder; give the .onnx file to write (e.g. {request.output}/model.onnx).",
            key="output",
        )
    if request.pretrained_dir is not None and not request.pretrained_dir.exists():
        folder = request.pretrained_dir
        raise ConfigError(
            f"--from-pretrained {folder} does not exist: it takes a local folder (nothing is downloaded). Fetch the "
            f"published model once with network access: hf download {declared.hub_repository or 'REPOSITORY'} "
            f"--local-dir {folder} (docs/export.md), or try the pipeline offline with --random-weights (meaningless "
            "forecasts).",
            key="pretrained_dir",
        )
    from distributed_onnx.export.common import sigterm_interrupts

    with sigterm_interrupts():  # a killed export removes its temporary folders (common.sigterm_interrupts)
        return _exported(request, declared, declared.exporter)


def _exported(request: ExportRequest, declared: Family, exporter: str) -> ExportResult:
    """The export itself: the family's exporter module's ``export(request)``, on a built model for
    ``--random-weights``, then the int8 variant if asked for."""
    from distributed_onnx.export import variants
    from distributed_onnx.export.common import phase, resolution_of, scratch_folder, start_progress

    variants.check_request(request)
    start_progress()
    module: Any = importlib.import_module(exporter)
    if request.random_weights is None:
        result: ExportResult = module.export(request)
    else:
        from distributed_onnx.export.random_weights import write_random_pretrained

        resolution_of(request)  # refused before minutes of building a published model
        with scratch_folder("random") as scratch:
            phase(f"building {request.family} ({request.random_weights}) with random weights")
            folder = scratch / f"{request.family}-{request.random_weights}-random-weights"
            write_random_pretrained(declared, request.random_weights, folder)
            result = module.export(request.model_copy(update={"pretrained_dir": folder}))
    if request.quantize is None:
        phase("done")
        return result
    phase("writing the int8 variant")
    path, comparison = variants.write_int8_variant(request)
    phase("done")
    return result.model_copy(update={"variant_path": path, "variant": comparison})


def exportable_family(name: str) -> Family:
    """The family ``name`` if it declares an exporter; else a :class:`ConfigError` listing the families that do
    (the built-in ones) and the installed plugins (which may: a plugin is only loaded when asked for)."""
    declared = families.family(name) if name in families.names() else None
    if declared is not None and declared.exporter is not None:
        return declared
    why = "no such family" if declared is None else f"{declared.provider} declares no exporter for it"
    exporters = [family.name for family in families.BUILT_IN if family.exporter is not None]
    plugins = sorted(families.plugin_names())
    raise ConfigError(
        f"Cannot export family {name!r} ({why}); known families: {exporters}"
        + (f", installed plugins: {plugins}." if plugins else "."),
        family=name,
    )
