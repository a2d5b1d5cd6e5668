"""What an export is asked for and what it gives back: the ``export`` command's settings model and its result.

The fields are the command's arguments (generated from them, :mod:`distributed_onnx.settings_sources`): their
names, defaults, bounds and help live here only. Everything an export can be refused for without building a
model is refused here, before torch is imported: the family, a source given twice or not at all, ``--output``'s
name (the names rule every command applies to a checkpoint's file stem, :mod:`distributed_onnx.names`), a
quantization the request cannot give. The dispatch to the family's exporter is :mod:`.dispatch`; this module
imports no exporter, so that every exporter may import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from distributed_onnx import names
from distributed_onnx.bounds import MAX_PARITY_WINDOWS, MAX_RESOLUTION_MINUTES, MAX_STEPS
from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location
from distributed_onnx.model import families
from distributed_onnx.model.checkpoint import QuantizeMode
from distributed_onnx.model.families import Family
from distributed_onnx.own_inputs import Read, Written, check_own_inputs
from distributed_onnx.settings_sources import CommandSettings

__all__ = ["ExportRequest", "ExportResult", "exportable_family"]

#: The files of a variant ``NAME-int8`` that ``--quantize`` writes.
_VARIANT_SUFFIXES = (".onnx", ".onnx.data", ".metadata.json", ".parity.json")
#: The suffix of the file ``--output`` names: what ``backtest --checkpoint FOLDER`` takes from a folder.
WEIGHTS_SUFFIX = ".onnx"
#: The int8 variant's file beside the checkpoint (``NAME-int8.onnx``, :mod:`.variants`).
VARIANT_SUFFIX = "-int8"


class ExportRequest(CommandSettings):
    """Build FAMILY's graph from its upstream package and a local pretrained folder (or random weights,
    --random-weights), write the ONNX checkpoint and its metadata, and compare ONNX Runtime with the upstream
    pipeline on sample windows."""

    label: ClassVar[str] = "export settings"

    family: CliPositionalArg[str] = Field(
        examples=["FAMILY"],
        description="The model family to export: one whose record (model/families.py) has an exporter, or an "
        "installed plugin's.",
    )
    from_pretrained: Path | None = Field(
        default=None,
        examples=["DIR"],
        description="A local folder of the upstream model (its config and weights; nothing is downloaded).",
    )
    random_weights: bool = Field(
        default=False,
        description="No download: the family with seeded random weights (forecasts are meaningless; for trying the "
        "pipeline and benchmarks), at --size; the metadata's description says so.",
    )
    size: Literal["tiny", "published"] | None = Field(
        default=None,
        description="With --random-weights: tiny (the tests' small configs, seconds; the default) or published "
        "(the published architecture).",
    )
    output: Path = Field(
        examples=["MODEL.onnx"],
        description="The .onnx file to write; its metadata (MODEL.metadata.json) and parity report beside it. Its "
        f"stem is the checkpoint's name: {names.RULE}.",
    )
    data: Location | None = Field(
        default=None,
        description="An input table (Parquet/CSV, a path or a URL) whose windows the parity report uses.",
    )

    @field_validator("from_pretrained", mode="before")
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
            use="read",
        )

    @field_validator("output", mode="before")
    @classmethod
    def _local_output(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():  # as a path, ``.``: the working directory
            raise ValueError("is empty; give the .onnx file to write (e.g. MODEL.onnx)")
        if not isinstance(value, str | Path | Location):
            return value
        return Location.parse(value).require_local(
            "--output",
            "export writes the checkpoint and its files to local files; give a local path and copy the files after",
            use="written",
        )

    parity_windows: int = Field(
        default=32, ge=1, le=MAX_PARITY_WINDOWS, examples=["N"], description="How many windows the parity compares."
    )
    horizon: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        examples=["STEPS"],
        description="The longest horizon (steps) the checkpoint will be asked for. Chronos-2: the most output "
        "patches a run may ask; the graph computes the patches each run's horizon spans, as upstream's pipeline "
        "does for that prediction length (default: the model's own maximum). Chronos-Bolt and TiRex: their graph is "
        "the same at every horizon; the horizon "
        "the parity report compares (default: two calls). TimesFM: the graph decodes ceil(horizon / its output "
        "patch) patches (default: one) and refuses a longer horizon.",
    )
    quantize: Literal["int8"] | None = Field(
        default=None,
        description="Also write the int8 variant NAME-int8.onnx (its metadata names this checkpoint as its parent).",
    )
    quantize_mode: QuantizeMode = Field(
        default="dynamic",
        description="dynamic (the default; int8 weights, activations quantized per call, no data) or static "
        "(activations calibrated on --data's windows, --parity-windows of them).",
    )
    resolution_minutes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_RESOLUTION_MINUTES,
        examples=["M"],
        description="The sampling interval of the data the checkpoint will forecast, written to its metadata "
        "(default: the step of --data; required without it).",
    )

    @field_validator("family")
    @classmethod
    def _exportable(cls, value: str) -> str:
        exportable_family(value)
        return value

    @field_validator("output")
    @classmethod
    def _a_checkpoint_name(cls, value: Path) -> Path:
        """The file every other command takes as a checkpoint: a ``.onnx`` file whose stem the names rule takes,
        and not a folder."""
        if value.suffix != WEIGHTS_SUFFIX:
            raise ValueError(f"{value} is not a {WEIGHTS_SUFFIX} file name; give MODEL{WEIGHTS_SUFFIX}")
        if value.is_dir():
            raise ValueError(f"{value} is a folder; give the {WEIGHTS_SUFFIX} file to write (e.g. {value}/model.onnx)")
        problem = names.name_problem(value.stem)
        if problem is not None:
            raise ValueError(f"its stem {names.quoted(value.stem)} (the checkpoint's name) is refused: {problem}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ExportRequest:
        if self.from_pretrained is not None and self.random_weights:
            raise ValueError("give one of --from-pretrained DIR and --random-weights, not both")
        if self.from_pretrained is None and not self.random_weights:
            raise ValueError(
                "give --from-pretrained DIR (a downloaded model) or --random-weights (--size tiny|published: "
                "forecasts are meaningless)"
            )
        if self.size is not None and not self.random_weights:
            raise ValueError("--size goes with --random-weights (a --from-pretrained folder has its own size)")
        if self.quantize is not None:
            variant = f"{self.output.stem}{VARIANT_SUFFIX}"
            problem = names.name_problem(variant)
            if problem is not None:
                raise ValueError(f"--quantize writes {variant}{WEIGHTS_SUFFIX}, whose name is refused: {problem}")
        if self.quantize_mode == "static" and self.quantize is not None and self.data is None:
            raise ValueError(
                "--quantize-mode static calibrates on your data's windows: give --data PATH (or use "
                "--quantize-mode dynamic, which needs none)"
            )
        return self

    @model_validator(mode="after")
    def _replaces_nothing(self) -> ExportRequest:
        """An existing checkpoint at ``--output`` is refused before any work (exit 2): replacing it lost a model
        (of another family even), and left its variants naming a parent that no longer exists. Nor does an export
        write over its own inputs (:mod:`distributed_onnx.own_inputs`): ``--data``, the pretrained folder's files."""
        stem = self.output.stem
        replaced = [self.output, self.output.with_suffix(".metadata.json")]
        if self.quantize is not None:  # the variant too: a checkpoint of its own
            replaced += [
                self.output.with_name(f"{stem}{VARIANT_SUFFIX}{suffix}") for suffix in (".onnx", ".metadata.json")
            ]
        existing = [path for path in replaced if path.exists()]
        if existing:
            raise ConfigError(
                f"--output {self.output}: a checkpoint is already there ({existing[0]}); export never replaces one "
                "(its variants name it as their parent). Remove it (its .onnx, .metadata.json, .onnx.data and "
                "variants) or choose another --output.",
                key="output",
            )
        written = [self.output.with_name(stem + suffix) for suffix in (".onnx.data", ".parity.json")]
        if self.quantize is not None:
            written += [self.output.with_name(f"{stem}{VARIANT_SUFFIX}{suffix}") for suffix in _VARIANT_SUFFIXES]
        inputs = [Read("data", self.data)] if self.data is not None else []
        if self.from_pretrained is not None and self.from_pretrained.is_dir():
            inputs += [Read("from_pretrained", Location(path)) for path in self.from_pretrained.iterdir()]
        check_own_inputs([Written("output", Location(path)) for path in [self.output, *written]], inputs)
        return self

    @model_validator(mode="after")
    def _quantizable(self) -> ExportRequest:
        """A quantization the family's record does not declare (:class:`~.families.Int8`) is refused here, before
        minutes of building and exporting a model whose variant would then be refused."""
        if self.quantize is None:
            return self
        int8 = exportable_family(self.family).int8
        if self.quantize_mode not in int8.modes:
            takes = f"; it takes --quantize-mode {' or '.join(int8.modes)}" if int8.modes else ""
            raise ValueError(
                f"--quantize int8 --quantize-mode {self.quantize_mode} is refused for family {self.family!r}: "
                f"{int8.why_not}{takes}. Export without --quantize"
            )
        return self

    @property
    def random_size(self) -> Literal["tiny", "published"] | None:
        """The random weights' architecture (``--size``, tiny by default), or None for a pretrained folder."""
        return (self.size or "tiny") if self.random_weights else None

    @property
    def folder(self) -> Path:
        """The pretrained folder the family's exporter loads (for ``--random-weights``, the one built for it)."""
        if self.from_pretrained is None:
            raise ConfigError("no --from-pretrained folder to load", key="from_pretrained")
        return self.from_pretrained


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
