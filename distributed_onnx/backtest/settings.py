"""Backtest settings: one typed model fed by defaults < a YAML file < command-line flags.

YAML keys are the flag names with underscores (``n_windows: 45``, ``quantiles: [0.1, 0.5]``); the same file
drives ``jobs/backtest.py`` on a cluster. Unknown keys and invalid values are errors naming the file and key.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from distributed_onnx import storage
from distributed_onnx.backend.providers import ProviderChain
from distributed_onnx.errors import ConfigError, describe_validation
from distributed_onnx.quantiles import QuantileLevels
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET
from distributed_onnx.series_source import SeriesTransport


class BacktestSettings(BaseModel):
    """Everything one backtest run depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint: Path = Field(default=REFERENCE_CHECKPOINT, description="The .onnx checkpoint.")
    data: Path | str = Field(
        default=REFERENCE_DATASET, description="Input table (.parquet or .csv), long format: a path or a URL."
    )
    output: Path | str = Field(
        description="Run directory (a path or a URL such as s3://...): forecasts/, metrics.parquet, summary.json."
    )
    horizon: int | None = Field(default=None, gt=0, description="Forecast steps; default: the checkpoint's.")
    context_length: int | None = Field(default=None, gt=0, description="Context steps; default: the checkpoint's.")
    n_windows: int | None = Field(default=None, gt=0, description="Windows per series counted back from its end.")
    stride: int = Field(default=1, gt=0, description="Steps between consecutive origins.")
    start: datetime | None = Field(default=None, description="First origin (with end); naive means UTC.")
    end: datetime | None = Field(default=None, description="Last origin (with start).")
    quantiles: QuantileLevels = Field(default=None, description="Default: the checkpoint's native ones.")
    covariates: list[str] = Field(default_factory=list, description="Known-future covariate columns.")
    seasonality: int | None = Field(default=None, gt=0, description="Steps; default one day.")
    min_context_coverage: float = Field(default=0.0, ge=0.0, le=1.0, description="Minimum observed share.")
    actors: int | None = Field(default=None, gt=0, description="Worker actors; default fills the cluster.")
    cpus_per_actor: float = Field(default=1.0, gt=0, description="CPUs per actor; sets ORT's threads.")
    gpus_per_actor: float = Field(default=0.0, ge=0, description="GPUs per actor; fractions share a GPU.")
    providers: ProviderChain = Field(
        default=None, description="Explicit provider chain (strict); default: the policy's (graceful)."
    )
    rows_per_batch: int = Field(default=256, gt=0, description="Windows per model call (the ORT batch size).")
    windows_per_part: int | None = Field(
        default=None,
        gt=0,
        description="Windows per unit of work (one Parquet part); default: about 64 parts, 1-64 batches each.",
    )
    max_in_flight_per_actor: int = Field(default=2, gt=0, description="Parts queued on each actor.")
    part_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline of one attempt at a part (a hung actor is killed and the part retried); "
        "default: 10x the slowest part so far, at least 120 s (30 min before any part finished).",
    )
    series_transport: SeriesTransport = Field(
        default=SeriesTransport.AUTO,
        description="How actors get the series: object_store (once per run), input_file (each actor reads "
        "its series' row groups), or auto (object store while the series fit a quarter of it).",
    )
    address: str | None = Field(default=None, description="Ray address; default: an embedded local Ray.")
    progress: bool | None = Field(default=None, description="Progress bar; default: when stderr is a terminal.")

    @field_validator("data", "output", mode="before")
    @classmethod
    def _path_or_url(cls, value: Any) -> Any:
        """URLs (``s3://``, ``file://``) stay strings; everything else is a local Path."""
        if isinstance(value, str) and not storage.is_url(value):
            return Path(value)
        return value

    @field_validator("quantiles", "covariates", mode="before")
    @classmethod
    def _comma_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @classmethod
    def from_sources(cls, flags: dict[str, Any], config_file: Path | None = None) -> BacktestSettings:
        """Defaults < ``config_file`` < ``flags`` (flags that are None were not given)."""
        values: dict[str, Any] = {}
        source = "command line"
        if config_file is not None:
            values.update(read_yaml(config_file))
            source = str(config_file)
        values.update({key: value for key, value in flags.items() if value is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = describe_validation(exc.errors())
            raise ConfigError(f"Invalid backtest settings ({source} and flags): {problems}") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping, with errors that name the file."""
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}", path=str(path))
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}", path=str(path)) from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of settings, found {type(document).__name__}")
    return {str(key).replace("-", "_"): value for key, value in document.items()}
