"""Backtest settings: the one model behind ``distributed-onnx backtest``, ``jobs/backtest.py`` and the Python API.

Its fields are the flags (``--n-windows``), the YAML keys (``n_windows: 45``) and the environment variables
(``DISTRIBUTED_ONNX_N_WINDOWS``); precedence and error messages are those of
:mod:`distributed_onnx.settings_sources`. The same file drives ``jobs/backtest.py`` on a cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from distributed_onnx.bounds import (
    MAX_COUNT,
    MAX_CPUS,
    MAX_GPUS,
    MAX_IN_FLIGHT,
    MAX_LATENCY_MINUTES,
    MAX_ROWS_PER_BATCH,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_WORKERS,
    MIN_RESOURCE_SHARE,
    resource_share,
)
from distributed_onnx.evaluation.data.columns import ColumnSettings
from distributed_onnx.evaluation.data.series_source import SeriesTransport
from distributed_onnx.location import Location
from distributed_onnx.model.backend.providers import ExecutionProvider, ProviderChain, SessionOptionsConfig
from distributed_onnx.model.checkpoint import checkpoint_paths, local_checkpoints
from distributed_onnx.model.quantiles import QuantileLevels
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET
from distributed_onnx.runtime.addresses import check_address_or_none
from distributed_onnx.settings_sources import comma_list, read_yaml

__all__ = ["BacktestSettings", "gpu_chain_problem", "read_yaml"]


def gpu_chain_problem(providers: list[ExecutionProvider] | None, gpus_per_actor: float | None) -> str | None:
    """Why actors of ``gpus_per_actor`` GPUs cannot build ``providers`` (a GPU provider for actors without a GPU),
    or None. An actor without a GPU must not build a GPU chain (docs/design.md, Ray specifics): a backtest's plan
    refuses it, a fev benchmark before anything is loaded (its command's settings, and the API's)."""
    needs = [provider.kind for provider in providers or [] if provider.needs_gpu]
    if needs and gpus_per_actor == 0:
        return (
            f"providers {needs} need a GPU, but gpus_per_actor is 0: set gpus_per_actor > 0 (fractions share a GPU) "
            "or use the cpu provider"
        )
    return None


class BacktestSettings(ColumnSettings):
    """Everything one backtest run depends on."""

    label: ClassVar[str] = "backtest settings"

    checkpoint: list[Path] = Field(
        default_factory=lambda: [REFERENCE_CHECKPOINT],
        description="The .onnx checkpoint; repeat the flag (or give a YAML list) to compare several in one run: "
        "each is named by its file stem (default: the bundled reference one). A folder is every .onnx in it with "
        "its .metadata.json; a .metadata.json is its checkpoint.",
    )
    data: Location = Field(
        default=Location(REFERENCE_DATASET),
        description="Input table (.parquet or .csv, long format), a path or a URL (default: the bundled Taylor data).",
    )
    output: Location = Field(
        description="Run directory, a path or a URL such as s3://...: forecasts/, metrics.parquet, summary.json, "
        "report.html. Rerun it to resume."
    )
    horizon: int | None = Field(
        default=None, gt=0, le=MAX_STEPS, description="Forecast steps (default: the checkpoint's)."
    )
    context_length: int | None = Field(
        default=None, gt=0, le=MAX_STEPS, description="Context steps (default: the checkpoint's)."
    )
    n_windows: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="Windows per series, Nixtla style: the last one's horizon ends at the series' last timestamp, "
        "the others step back by --stride (default 1 when no --start/--end).",
    )
    stride: int = Field(default=1, gt=0, le=MAX_STEPS, description="Steps between consecutive origins.")
    start: datetime | None = Field(
        default=None,
        examples=["2000-08-01T00:00"],
        description="First origin (ISO timestamp, UTC if naive); with --end: every origin in [start, end].",
    )
    end: datetime | None = Field(
        default=None,
        validate_default=True,  # so that a start without an end is caught (below)
        examples=["2000-08-21T23:30"],
        description="Last origin (ISO timestamp, UTC if naive); with --start.",
    )
    quantiles: QuantileLevels = Field(
        default=None, examples=["0.1,0.5,0.9"], description="Quantile levels (default: the checkpoint's native ones)."
    )
    clamp_quantiles: bool = Field(
        default=False,
        description="Accept quantile levels outside a checkpoint's native range, each forecast as the nearest "
        "native level (its interval is narrower than its name says; noted in summary.json and the report). "
        "Without it such levels are refused.",
    )
    covariates: list[str] = Field(
        default_factory=list,
        examples=["temp,price"],
        description="Known-future covariate columns of the data (text or bool columns are categorical).",
    )
    past_covariates: list[str] = Field(
        default_factory=list,
        examples=["load_lag,daytype"],
        description="Past-only covariate columns: values known only up to each cutoff, their future unknown "
        "(text or bool columns are categorical). Chronos-2 checkpoints.",
    )
    covariate_data: Location | None = Field(
        default=None,
        description="A table of covariate vintages (.parquet or .csv): timestamp, available_at, covariate columns, "
        "optionally series_id. The declared covariates it holds are read from it as known at each cutoff "
        "(docs/covariate-vintages.md); the others stay the input table's, taken as known exactly.",
    )
    covariate_latency: int = Field(
        default=0,
        ge=0,
        le=MAX_LATENCY_MINUTES,  # 100 years: cutoff - latency never leaves int64 microseconds
        description="Minutes between a cutoff and the latest vintage a window may read (available_at <= cutoff "
        "- latency); at most 100 years.",
    )
    compare_realized: bool = Field(
        default=False,
        description="With --covariate-data: run each model again on the realized covariates (the latest vintage "
        "of each timestamp) as NAME@realized, to measure what perfect foresight overstates.",
    )
    include_in_sample: bool = Field(
        default=False,
        description="Keep windows at or before a checkpoint's training_data_end in the global scores and the "
        "leaderboard (they are always scored apart too, scope in_sample).",
    )
    group_by: str | None = Field(
        default=None,
        min_length=1,
        examples=["region"],
        description="A per-series column: series sharing its value are forecast jointly at each origin "
        "(cross-learning, one group per value and origin). Chronos-2 checkpoints.",
    )
    max_group_size: int = Field(
        default=100,
        gt=0,
        le=MAX_COUNT,
        description="With --group-by: at most this many series per group; a larger group is split, in series "
        "order, into groups of at most this size.",
    )
    seasonality: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="Seasonal period in steps, for the baseline and MASE (default: one day).",
    )
    min_context_coverage: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Skip (and count) windows whose context has a smaller observed share."
    )
    actors: int | None = Field(
        default=None, gt=0, le=MAX_WORKERS, description="Worker actors (default: as many as the cluster fits)."
    )
    cpus_per_actor: float = Field(
        default=1.0, ge=MIN_RESOURCE_SHARE, le=MAX_CPUS, description="CPUs per actor; sets ONNX Runtime's threads."
    )
    gpus_per_actor: float = Field(default=0.0, ge=0, le=MAX_GPUS, description="GPUs per actor; fractions share a GPU.")
    # Twice Ray's own deadline for a new worker process to register (worker_register_timeout_seconds, 60 s): an
    # actor that has room on a node runs by then, so one that does not is waiting for room.
    placement_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long the actor pool waits for Ray to place its actors (room in the cluster) before it fails, "
        "naming what it asked and what the cluster had free. A pool larger than the whole cluster is refused at "
        "once.",
    )
    # A published model read from remote storage onto a cold node takes minutes; a hung start must still end.
    ready_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long placed actors may take to load their checkpoints, warm up and read the run's input "
        "before the run fails (a replacement actor gets the placement and this deadline together).",
    )
    providers: ProviderChain = Field(
        default=None,
        examples=["cuda,cpu"],
        description="Explicit provider chain, strict (default: the provider policy's, graceful).",
    )
    graph_optimization: Literal["basic", "extended", "all"] = Field(
        default="all",
        description="ONNX Runtime's graph optimization level for the actors' sessions (distributed-onnx tune "
        "measures which is fastest here).",
    )
    rows_per_batch: int | None = Field(
        default=None,
        gt=0,
        le=MAX_ROWS_PER_BATCH,
        description="Windows per model call, the ORT batch size (default: a part's share of the windows, at least 4 "
        "where each actor still gets two parts, at most 256 or 16 by the graph's size and context; a rerun keeps "
        "the run's).",
    )
    windows_per_part: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="Windows per unit of work and Parquet part (default: 8 parts per actor, 16 to 8,192 parts of 1-64 "
        "batches each, as few windows as the run and its batch allow; a rerun keeps the run's).",
    )
    part_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="Deadline of one attempt at a part: a hung actor is killed and the part retried (default: the "
        "part's windows x 10x the slowest seconds per window so far, at least 120 s; 30 min until a part has "
        "finished).",
    )
    series_transport: SeriesTransport = Field(
        default=SeriesTransport.AUTO,
        description="How actors get the series: object_store (once per run), input_file (each actor reads its "
        "series' rows of the Parquet input), or auto (the object store while the series fit a quarter of it).",
    )
    max_in_flight_per_actor: int = Field(default=2, gt=0, le=MAX_IN_FLIGHT, description="Parts queued on each actor.")
    address: str | None = Field(
        default=None, min_length=1, description="Ray address (default: an embedded local Ray on 127.0.0.1)."
    )
    progress: bool | None = Field(default=None, description="Progress bar (default: when stderr is a terminal).")

    _gpu_share = field_validator("gpus_per_actor")(resource_share)  # none, or one of Ray's units at least
    _ray_address = field_validator("address")(check_address_or_none)  # the one parse (runtime/addresses.py)

    @field_validator("compare_realized")
    @classmethod
    def _realized_needs_vintages(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("covariate_data") is None:
            raise ValueError("compare_realized needs covariate_data (a table of covariate vintages)")
        return value

    #: Local files only: a URL is refused in one line (model/checkpoint.py), never folded into a path.
    _local = field_validator("checkpoint", mode="before")(local_checkpoints)

    @field_validator("checkpoint")
    @classmethod
    def _some(cls, value: list[Path]) -> list[Path]:
        value = checkpoint_paths(value)  # folders and metadata files as the checkpoints they mean
        if not value:
            raise ValueError("give at least one checkpoint")
        return value

    _comma_lists = field_validator("quantiles", "covariates", "past_covariates", mode="before")(comma_list)

    @field_validator("past_covariates")
    @classmethod
    def _past_or_future(cls, value: list[str], info: ValidationInfo) -> list[str]:
        both = sorted(set(value) & set(info.data.get("covariates") or []))
        if both:
            raise ValueError(f"{both} given as both known-future and past-only covariates: give each column once")
        return value

    def session_options(self) -> SessionOptionsConfig:
        """The actors' ONNX Runtime session options these settings ask for (threads follow the actor's CPUs)."""
        level = {"basic": "ENABLE_BASIC", "extended": "ENABLE_EXTENDED", "all": "ENABLE_ALL"}[self.graph_optimization]
        return SessionOptionsConfig(graph_optimization_level=level)

    @property
    def covariate_columns(self) -> list[str]:
        """Every covariate column in the model's row order: past-only first, then known-future (as upstream)."""
        return [*self.past_covariates, *self.covariates]

    def mapped_covariates(self) -> list[str]:
        """The covariates, for the one-to-one check of the columns' roles (:func:`~.data.columns.check_roles`)."""
        return self.covariate_columns

    @field_validator("start")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _as_utc(value)

    @field_validator("end")
    @classmethod
    def _range(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        """``start`` and ``end`` go together and exclude ``n_windows``; naive means UTC."""
        end = _as_utc(value)
        if "start" not in info.data:  # start itself was invalid: that error is reported already
            return end
        start = info.data["start"]
        if (start is None) != (end is None):
            given, missing = ("start", "end") if end is None else ("end", "start")
            msg = f"{given} is given without {missing}: give both (every origin in [start, end]) or neither"
            raise ValueError(msg)
        if start is not None and end is not None:
            if end < start:
                raise ValueError(f"end {end.isoformat()} is before start {start.isoformat()}")
            if info.data.get("n_windows") is not None:
                raise ValueError("give either n_windows or start and end, not both")
        return end


def _as_utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
