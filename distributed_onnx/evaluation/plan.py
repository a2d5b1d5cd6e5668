"""The driver's plan of a backtest: settings -> checked checkpoint, data, windows and parts (no Ray).

Everything that can be wrong with the inputs (checkpoint, data, settings) is found here, before any actor
starts, with an error naming the key, the file or the rows. The plan counts windows per series (never holds
them) and cuts the run's window sequence into parts; its fingerprint covers everything that decides a part's
content, so a rerun on the same directory plans the same parts and can trust those already written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, describe_validation
from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.table import SeriesTable, load_series
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan, WindowSpec, plan_windows
from distributed_onnx.evaluation.fans import fan_series
from distributed_onnx.evaluation.part import PartJob
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.quantiles import ClampedLevel, clamped_levels, describe_clamped
from distributed_onnx.model.worker import check_run_fits_model

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Bumped when the layout of parts or window ids changes, so an old run directory is never resumed into.
PART_FORMAT = 2
#: The default part size aims at this many parts: enough to balance a few dozen actors and to resume at a
#: fine grain, few enough that Ray's per-call cost (~2-3 ms) and per-file overhead stay negligible.
TARGET_PARTS = 64
MAX_BATCHES_PER_PART = 64


@dataclass(frozen=True)
class RunPlan:
    """A validated run: the checkpoint, the data, the resolved window settings and the parts."""

    settings: BacktestSettings
    checkpoint: ResolvedCheckpoint
    table: SeriesTable
    spec: WindowSpec
    quantiles: list[float]
    seasonality: int
    window_fingerprint: str
    run_fingerprint: str
    windows: WindowPlan
    windows_per_part: int
    notes: list[str] = field(default_factory=list)
    clamped: list[ClampedLevel] = field(default_factory=list)

    @property
    def step_us(self) -> int:
        return self.checkpoint.metadata.resolution_minutes * 60_000_000

    def parts(self) -> list[PartSpec]:
        """The run's parts: ``windows_per_part`` each after a ramp up from one model batch."""
        return self.windows.parts(self.windows_per_part, first_part=self.settings.rows_per_batch)

    def job(self, source: SeriesSource, overlap_packing: bool | None = None) -> PartJob:
        """What every actor of this run needs, built once and sent once per actor."""
        return PartJob(
            source=source,
            plan=self.windows,
            spec=self.spec,
            quantiles=tuple(self.quantiles),
            run_fingerprint=self.run_fingerprint,
            window_fingerprint=self.window_fingerprint,
            output=self.settings.output,
            seasonality=self.seasonality,
            step_us=self.step_us,
            rows_per_batch=self.settings.rows_per_batch,
            fan_series=fan_series(len(self.table.series)),
            overlap_packing=overlap_packing,
        )


def prepare(settings: BacktestSettings) -> RunPlan:
    """Check the checkpoint, the settings and the data, resolve defaults and plan the parts."""
    checkpoint = LocalCheckpoint(path=settings.checkpoint).resolve()
    metadata = checkpoint.metadata
    horizon = settings.horizon or metadata.horizon_length
    context_length = settings.context_length or metadata.context_length
    check_run_fits_model(metadata, context_length, horizon)
    adapter = adapter_for(metadata)
    if settings.covariates and not adapter.supports_covariates:
        raise ConfigError(f"model_family {metadata.model_family!r} takes no covariates", key="covariates")
    if metadata.max_covariates is not None and len(settings.covariates) > metadata.max_covariates:
        raise ConfigError(
            f"{len(settings.covariates)} covariates declared, the checkpoint takes at most {metadata.max_covariates}",
            key="covariates",
        )
    gpu_providers = [provider.kind for provider in settings.providers or [] if provider.needs_gpu]
    if gpu_providers and settings.gpus_per_actor == 0:
        # An actor without a GPU must not build a GPU chain (docs/design.md, Ray specifics): refuse here, not in
        # every actor.
        raise ConfigError(
            f"providers {gpu_providers} need a GPU, but gpus_per_actor is 0: set gpus_per_actor > 0 "
            "(fractions share a GPU) or use the cpu provider",
            key="providers",
        )
    quantiles = settings.quantiles or list(metadata.native_quantiles)
    seasonality = settings.seasonality or max(1, 1440 // metadata.resolution_minutes)
    table = load_series(settings.data, metadata.resolution_minutes, settings.covariates)
    n_windows = settings.n_windows
    if n_windows is None and settings.start is None and settings.end is None:
        n_windows = 1
    try:
        spec = WindowSpec(
            context_length=context_length,
            horizon=horizon,
            n_windows=n_windows,
            stride=settings.stride,
            start_us=_micros(settings.start),
            end_us=_micros(settings.end),
            min_context_coverage=settings.min_context_coverage,
        )
    except ValidationError as exc:
        raise ConfigError(f"Invalid window settings: {describe_validation(exc.errors())}") from exc
    windows = plan_windows(table.series, spec)
    notes = _plan_notes(windows, spec)
    clamped = clamped_levels(quantiles, metadata.native_quantiles)
    if clamped:
        notes.append(describe_clamped(clamped, metadata.native_quantiles))
    for note in notes:
        logger.warning("%s", note)
    windows_per_part = settings.windows_per_part or default_windows_per_part(windows.planned, settings.rows_per_batch)
    weights_sha = metadata.sha256 or storage.sha256(checkpoint.weights_path)
    window_config = {
        "checkpoint_sha256": weights_sha,
        "context_length": context_length,
        "horizon": horizon,
        "quantiles": quantiles,
        "covariates": settings.covariates,
    }
    window_fingerprint = _digest(window_config)
    run_fingerprint = _digest(
        {
            **window_config,
            "data_sha256": storage.sha256(settings.data),
            "spec": spec.model_dump(),
            "rows_per_batch": settings.rows_per_batch,
            "windows_per_part": windows_per_part,
            "seasonality": seasonality,
            "part_format": PART_FORMAT,
        }
    )
    return RunPlan(
        settings,
        checkpoint,
        table,
        spec,
        quantiles,
        seasonality,
        window_fingerprint,
        run_fingerprint,
        windows,
        windows_per_part,
        notes,
        clamped,
    )


def default_windows_per_part(planned: int, rows_per_batch: int) -> int:
    """About :data:`TARGET_PARTS` parts, each a whole number (1..64) of model batches.

    A pure function of the plan and the settings (not of the cluster's size), so a rerun on another cluster
    still plans the same parts.
    """
    wanted = -(-max(planned, 1) // TARGET_PARTS)
    batches_per_part = min(max(-(-wanted // rows_per_batch), 1), MAX_BATCHES_PER_PART)
    return batches_per_part * rows_per_batch


def _plan_notes(windows: WindowPlan, spec: WindowSpec) -> list[str]:
    notes = []
    if windows.capped:
        examples = ", ".join(repr(series_id) for series_id in windows.capped_series)
        notes.append(
            f"n_windows {spec.n_windows} is more than the data allows: {windows.capped} window(s) were left out "
            f"because they would start before their series' history (e.g. series {examples})"
        )
    return notes


def _digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _micros(value: datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)
