"""The backtest job: settings -> checks -> plan -> actor pool -> forecast parts -> metrics, summary, report.

Everything that can be wrong with the inputs (checkpoint, data, settings) is checked before any actor
starts. Parts are written as their batches complete, so an interrupted run keeps its finished windows and a
rerun with the same settings on the same directory only runs the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import ray

from distributed_onnx import storage
from distributed_onnx.actors import start_pool, start_ready_actor, wait_for_room
from distributed_onnx.adapters import adapter_for
from distributed_onnx.backtest import outputs, report, scoring
from distributed_onnx.backtest.settings import BacktestSettings
from distributed_onnx.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.dispatch import dispatch
from distributed_onnx.errors import BatchError, ConfigError
from distributed_onnx.local_ray import connect
from distributed_onnx.progress import Progress
from distributed_onnx.table import SeriesTable, load_series
from distributed_onnx.tensors import pack_batch
from distributed_onnx.windows import PlanCounts, PlannedBatch, WindowSpec, plan_batches
from distributed_onnx.worker import WorkerConfig, WorkerInfo, check_run_fits_model

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: How long a lost actor's replacement may wait for the resources the dead actor released.
REPLACEMENT_WAIT_S = 10.0


@dataclass(frozen=True)
class RunPlan:
    """A validated run: the checkpoint, the data and the resolved window settings."""

    settings: BacktestSettings
    checkpoint: ResolvedCheckpoint
    table: SeriesTable
    spec: WindowSpec
    quantiles: list[float]
    seasonality: int
    window_fingerprint: str
    run_fingerprint: str

    @property
    def step_us(self) -> int:
        return self.checkpoint.metadata.resolution_minutes * 60_000_000

    def batches(self, counts: PlanCounts | None = None) -> Iterator[PlannedBatch]:
        return plan_batches(self.table, self.spec, self.settings.rows_per_batch, counts)

    def pack(self, planned: PlannedBatch) -> pa.RecordBatch:
        return pack_batch(self.table, planned, self.spec.context_length, self.spec.horizon, self.window_fingerprint)


@dataclass
class BacktestResult:
    summary: dict[str, Any]
    metrics: pa.Table
    failed_batches: list[dict[str, Any]] = field(default_factory=list)


def prepare(settings: BacktestSettings) -> RunPlan:
    """Check the checkpoint, the settings and the data, and resolve defaults (no Ray involved)."""
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
        # An actor without a GPU must not build a GPU chain (DESIGN.md): refuse here, not in every actor.
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
    except ValueError as exc:
        raise ConfigError(f"Invalid window settings: {exc}") from exc
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
            "seasonality": seasonality,
        }
    )
    return RunPlan(settings, checkpoint, table, spec, quantiles, seasonality, window_fingerprint, run_fingerprint)


def run_backtest(settings: BacktestSettings) -> BacktestResult:
    """Run (or resume) a backtest; raises :class:`BatchError` after writing everything else if batches failed."""
    started = time.perf_counter()
    return _BacktestRun(prepare(settings), started).run()


class _BacktestRun:
    """One execution of a plan: the callbacks of the dispatcher and the bookkeeping they share."""

    def __init__(self, plan: RunPlan, started: float) -> None:
        self.plan = plan
        self.output = plan.settings.output
        self.counts = PlanCounts()
        self.total_batches = sum(1 for _ in plan.batches(self.counts))
        self.pending: dict[int, pa.RecordBatch] = {}
        self.failures: list[dict[str, Any]] = []
        self.infos: list[WorkerInfo] = []
        self.actors: list[Any] = []  # the pool and its replacements: every one is killed at the end
        self.first_result_s: float | None = None
        self.started = started
        self.dispatch_started = started
        self.dispatch_finished = started
        self.progress = Progress(self.counts.planned, enabled=plan.settings.progress)

    def run(self) -> BacktestResult:
        plan, output = self.plan, self.output
        outputs.prepare_output(output, plan.run_fingerprint, {"settings": plan.settings.model_dump(mode="json")})
        outputs.clean_partials(output)
        done = outputs.done_batches(output) & set(range(self.total_batches))
        done_windows = sum(batch.n_windows for batch in plan.batches() if batch.index in done) if done else 0
        logger.info(
            "Planned %d windows in %d batches (%d skipped for context coverage); %d batches already done",
            self.counts.planned,
            self.total_batches,
            self.counts.skipped,
            len(done),
        )
        self.progress.advance(done_windows)
        stats: dict[str, Any] = {}
        if len(done) < self.total_batches:
            started_ray = connect(plan.settings.address)
            try:
                stats = self._dispatch(done)
            finally:
                if started_ray:
                    ray.shutdown()
        dispatch_s = self.dispatch_finished - self.dispatch_started
        metrics = scoring.score(
            output, plan.table, plan.checkpoint.name, plan.quantiles, plan.spec.horizon, plan.seasonality
        )
        storage.write_parquet(storage.join(output, "metrics.parquet"), metrics)
        summary = self._summary(done, done_windows, stats, dispatch_s)
        summary_json = json.dumps(summary, indent=2, default=str).encode()
        storage.write_bytes(storage.join(output, "summary.json"), summary_json)
        report.write_report(output, summary, metrics, plan.quantiles)
        if self.failures:
            failed_path = storage.join(output, "failed_windows.json")
            storage.write_bytes(failed_path, json.dumps(self.failures, indent=2).encode())
            first = self.failures[0]
            raise BatchError(
                f"{len(self.failures)} batch(es) failed; their window ids are in {failed_path}. "
                f"First: batch {first['batch']} (windows {first['window_ids'][:3]}...): {first['error']}",
                failed_batches=[failure["batch"] for failure in self.failures],
            )
        return BacktestResult(summary, metrics, self.failures)

    def _dispatch(self, done: set[int]) -> dict[str, Any]:
        settings = self.plan.settings
        actors, self.infos = start_pool(
            self._worker_config(), settings.actors, settings.cpus_per_actor, settings.gpus_per_actor
        )
        self.actors = actors
        self.dispatch_started = time.perf_counter()
        try:
            stats = dispatch(
                (batch for batch in self.plan.batches() if batch.index not in done),
                actors,
                self._submit,
                self._on_result,
                self._on_failure,
                key=lambda planned: planned.index,
                max_in_flight_per_actor=self.plan.settings.max_in_flight_per_actor,
                replace_actor=self._replace_actor,
            )
            # Throughput covers dispatching only: stopping actors and Ray (over a second) is not part of it.
            self.dispatch_finished = time.perf_counter()
        finally:
            for actor in self.actors:  # the pool and every replacement
                ray.kill(actor)
        return dict(stats.__dict__)

    def _worker_config(self) -> WorkerConfig:
        return WorkerConfig(checkpoint=self.plan.checkpoint.weights_path, providers=self.plan.settings.providers)

    def _submit(self, actor: Any, planned: PlannedBatch) -> Any:
        batch = self.pending.get(planned.index)
        if batch is None:  # first attempt; a retry re-sends the batch already packed
            batch = self.pending[planned.index] = self.plan.pack(planned)
        spec = self.plan.spec
        return actor.forecast_batch.remote(batch, spec.context_length, spec.horizon, self.plan.quantiles)

    def _on_result(self, planned: PlannedBatch, forecasts: Any) -> None:
        batch = self.pending.pop(planned.index)
        table = outputs.forecast_table(batch, forecasts, self.plan.quantiles, self.plan.step_us)
        outputs.write_part(self.output, planned.index, table)
        if self.first_result_s is None:
            self.first_result_s = time.perf_counter() - self.started
        self.progress.advance(planned.n_windows)

    def _on_failure(self, planned: PlannedBatch, error: BaseException) -> None:
        batch = self.pending.pop(planned.index)
        window_ids = batch.column("window_id").to_pylist()
        logger.error("Batch %d (%d windows) failed: %s", planned.index, len(window_ids), error)
        self.failures.append({"batch": planned.index, "error": str(error), "window_ids": window_ids})

    def _replace_actor(self) -> Any | None:
        """A new actor for a lost one, if the cluster has room for it now; None lets the pool shrink.

        Without the check, a full cluster (the lost node's work already moved elsewhere) would block the run
        for the whole readiness timeout waiting for a placement.
        """
        settings = self.plan.settings
        if not wait_for_room(settings.cpus_per_actor, settings.gpus_per_actor, REPLACEMENT_WAIT_S):
            logger.warning("No room for a replacement actor; continuing with the remaining ones")
            return None
        try:
            actor, info = start_ready_actor(self._worker_config(), settings.cpus_per_actor, settings.gpus_per_actor)
        except Exception:
            logger.warning("Could not start a replacement actor", exc_info=True)
            return None
        self.infos.append(info)
        self.actors.append(actor)
        return actor

    def _summary(self, done: set[int], done_windows: int, stats: dict[str, Any], dispatch_s: float) -> dict[str, Any]:
        plan = self.plan
        failed_windows = sum(len(failure["window_ids"]) for failure in self.failures)
        windows_run = self.counts.planned - done_windows - failed_windows
        return {
            "model": plan.checkpoint.name,
            "checkpoint": str(plan.checkpoint.weights_path),
            "checkpoint_sha256": plan.checkpoint.metadata.sha256,
            "data": str(plan.settings.data),
            "run_fingerprint": plan.run_fingerprint,
            "settings": plan.settings.model_dump(mode="json"),
            "resolved": {
                "context_length": plan.spec.context_length,
                "horizon": plan.spec.horizon,
                "quantiles": plan.quantiles,
                "seasonality": plan.seasonality,
                "series": len(plan.table.series),
            },
            "windows": {
                "planned": self.counts.planned,
                "skipped_context_coverage": self.counts.skipped,
                "done_before": done_windows,
                "run_now": windows_run,
                "failed": failed_windows,
            },
            "batches": {"planned": self.total_batches, "done_before": len(done), **stats},
            "actors": [info.model_dump() for info in self.infos],
            "timing": {
                "total_s": time.perf_counter() - self.started,
                "dispatch_s": dispatch_s,
                "first_forecast_s": self.first_result_s,  # from the start of the job, Ray start-up included
                "windows_per_s": windows_run / dispatch_s if windows_run and dispatch_s > 0 else None,
            },
            "failed_batches": [
                {"batch": failure["batch"], "error": failure["error"], "windows": len(failure["window_ids"])}
                for failure in self.failures
            ],
        }


def _digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _micros(value: datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)
