"""The backtest's driver: plan -> series into the object store once -> parts to the actors -> merge the sums.

The driver plans, schedules, retries and merges; nothing per window passes through it. Each actor gets the
run's :class:`~distributed_onnx.evaluation.part.PartJob` once (the series zero-copy from the object store, or
the path to read them from) and then three integers per part; it packs, forecasts, writes the part and its
sums, and answers with a receipt. The driver builds ``metrics.parquet``, ``summary.json`` and ``report.html``
from the merged sums. Parts are written as they complete, so an interrupted run keeps its finished parts and
a rerun with the same settings on the same directory runs only the rest.
"""

from __future__ import annotations

import logging
import pickle
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.series_source import (
    ParquetSeriesReader,
    SeriesSource,
    SeriesStore,
    SeriesTransport,
)
from distributed_onnx.evaluation.data.series_source import choose_transport as choose_series_transport
from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.failures import failure_error, nonfinite_error
from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.merge import RunSums, fan_windows
from distributed_onnx.evaluation.part import PartJob, PartReceipt, PartRunner
from distributed_onnx.evaluation.plan import RunPlan, prepare
from distributed_onnx.evaluation.progress import Progress
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.summary import build_summary, previous_summary, write_summary
from distributed_onnx.evaluation.sums import read_done_part, unverified_models
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig, WorkerInfo
from distributed_onnx.runtime import cluster
from distributed_onnx.runtime.actors import has_room, start_pool, start_worker_actor
from distributed_onnx.runtime.dispatch import dispatch
from distributed_onnx.runtime.dispatch_state import DispatchStats
from distributed_onnx.runtime.local_ray import connect

__all__ = ["BacktestResult", "RunPlan", "prepare", "run_backtest"]

logger = logging.getLogger(__name__)

#: A part's deadline once parts have finished: this many times the slowest so far (a hung actor is killed).
DEADLINE_FACTOR = 10.0
MIN_PART_TIMEOUT_S = 120.0
FIRST_PART_TIMEOUT_S = 1800.0


@dataclass
class BacktestResult:
    summary: dict[str, Any]
    metrics: pa.Table
    failed_parts: list[dict[str, Any]] = field(default_factory=list)


def run_backtest(settings: BacktestSettings) -> BacktestResult:
    """Run (or resume) a backtest; raises :class:`BatchError` after writing everything else if parts failed."""
    started = time.perf_counter()
    return _BacktestRun(prepare(settings), started).run()


def build_part_runner(workers: Sequence[InferenceWorker], job: PartJob, info: WorkerInfo) -> PartRunner:
    """The actors' job factory (module level, so Ray pickles it by reference): one worker per checkpoint."""
    return PartRunner({worker.model_name: worker for worker in workers}, job, node_id=info.node_id)


def render_report(
    output: storage.Location,
    summary: dict[str, Any],
    metrics: pa.Table,
    quantiles: list[float],
    fans: list[FanWindow],
    leaderboard: pa.Table | None = None,
) -> float:
    """Write report.html and return the CPU seconds it took (matplotlib's import included)."""
    started = time.process_time()
    from distributed_onnx.evaluation.report import page as report  # matplotlib: loaded only where the report is drawn

    report.write_report(output, summary, metrics, quantiles, fans, leaderboard)
    return time.process_time() - started


def driver_cpu_s() -> float:
    """CPU seconds this process (the driver, all its threads) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Replacements:
    """New actors for lost ones, started in the background by the dispatcher (see dispatch.Replacements)."""

    def __init__(self, run: _BacktestRun, job_ref: Any) -> None:
        self._run, self._job_ref = run, job_ref

    def has_room(self) -> bool:
        settings = self._run.plan.settings
        return has_room(settings.cpus_per_actor, settings.gpus_per_actor)

    def start(self) -> tuple[Any, Any]:
        settings = self._run.plan.settings
        actor = start_worker_actor(
            self._run.worker_config(),
            settings.cpus_per_actor,
            settings.gpus_per_actor,
            build_part_runner,
            self._job_ref,
        )
        return actor, actor.ready.remote()


class _BacktestRun:
    """One execution of a plan: the callbacks of the dispatcher and the bookkeeping they share."""

    def __init__(self, plan: RunPlan, started: float) -> None:
        self.plan = plan
        self.output = plan.settings.output
        self.started = started
        self.parts = plan.parts()
        self.sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)
        self.receipts: list[PartReceipt] = []
        self.failures: list[dict[str, Any]] = []
        self.infos: list[WorkerInfo] = []
        self.actors: list[Any] = []  # the pool and its replacements: every one is killed at the end
        self.transport: dict[str, Any] = {}
        self.first_result_s: float | None = None
        self.dispatch_s = 0.0
        self.dispatch_cpu_s = 0.0
        self.slowest_part_s = 0.0
        self.stats = DispatchStats()
        self.cpu_phases: dict[str, float] = {}
        self.leaderboard: pa.Table | None = None
        self._cpu_mark = 0.0

    def _phase(self, name: str) -> None:
        """Charge the driver CPU since the last mark to ``name`` (summary.json: ``driver_cpu_phases_s``)."""
        now = driver_cpu_s()
        self.cpu_phases[name] = round(self.cpu_phases.get(name, 0.0) + now - self._cpu_mark, 4)
        self._cpu_mark = now

    def run(self) -> BacktestResult:
        plan, output = self.plan, self.output
        self._phase("start_and_plan")  # Python, imports, reading and checking the data, planning
        outputs.prepare_output(output, plan.run_fingerprint, {"settings": plan.settings.model_dump(mode="json")})
        outputs.clean_partials(output, plan.model_names)
        earlier = previous_summary(output, plan.run_fingerprint)
        todo = self._verified_todo()
        done_windows = plan.windows.planned - sum(part.n_windows for part in todo)
        logger.info(
            "Planned %d windows in %d parts of up to %d (%d skipped for context coverage); %d parts already done",
            plan.windows.planned,
            len(self.parts),
            plan.windows_per_part,
            plan.windows.skipped,
            len(self.parts) - len(todo),
        )
        progress = Progress(plan.windows.planned, done_before=done_windows, enabled=plan.settings.progress)
        started_ray = False
        try:
            if todo:
                started_ray = connect(plan.settings.address)
                self._phase("ray_start")
                self._dispatch(todo, progress)
            failed = {failure["part"] for failure in self.failures}
            for part in todo:
                if part.index not in failed:
                    self._merge_written(part)
            scores = self.sums.merged()
            metrics = self.sums.write_metrics(output, scores)
            self.leaderboard = self.sums.write_leaderboard(output, scores, plan.step_us)
            self._phase("merge")
            summary = build_summary(self, len(self.parts) - len(todo), done_windows, earlier)
            summary["models"] = {
                checkpoint.name: {
                    "checkpoint": str(checkpoint.weights_path),
                    "sha256": checkpoint.metadata.sha256,
                    "fingerprint": plan.model_fingerprints[checkpoint.name],
                }
                for checkpoint in plan.checkpoints
            }
            summary["pairs"] = scores.left_out()
            summary["parts"]["computed_by_model"] = dict(
                Counter(name for receipt in self.receipts for name in receipt.models_computed)
            )
            nonfinite = nonfinite_error(plan, scores.nonfinite)
            if nonfinite is not None:
                summary["notes"].append(str(nonfinite))
            self._report(summary, metrics)
        finally:
            if started_ray:
                cluster.shutdown()
        self._phase("ray_stop")
        summary["timing"]["driver_cpu_s"] = driver_cpu_s()
        summary["timing"]["driver_cpu_phases_s"] = self.cpu_phases
        summary["timing"]["driver_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        write_summary(output, summary)
        if self.failures:
            raise failure_error(self.plan, self.parts, self.failures)
        if nonfinite is not None:
            raise nonfinite
        return BacktestResult(summary, metrics, self.failures)

    def _report(self, summary: dict[str, Any], metrics: pa.Table) -> None:
        """Draw report.html: in a Ray worker while Ray is up (the driver only coordinates), else here.

        A report that cannot be drawn is a note in summary.json, never a lost run: the parts, the metrics and
        the summary are the results.
        """
        plan = self.plan
        fans = fan_windows(self.sums, plan, metrics)
        summary["timing"]["driver_cpu_s"] = round(driver_cpu_s(), 3)  # until now; summary.json gets the final
        arguments = (self.output, summary, metrics, plan.quantiles, fans, self.leaderboard)
        try:
            connected = cluster.is_connected()
            cpu_s = cluster.run_on_this_node(render_report, *arguments) if connected else render_report(*arguments)
            summary["timing"]["report_cpu_s"] = round(cpu_s, 4)
            summary["timing"]["report_drawn_by"] = "ray worker" if connected else "driver"
        except Exception as exc:  # matplotlib, storage: whatever failed, the run's results stand
            logger.error("Could not write report.html: %s", exc)
            summary["notes"].append(f"report.html could not be written: {type(exc).__name__}: {exc}")
        self._phase("report")

    def worker_config(self) -> list[WorkerConfig]:
        """One config per checkpoint: each actor loads every model of the run."""
        providers = self.plan.settings.providers
        return [WorkerConfig(checkpoint=each.weights_path, providers=providers) for each in self.plan.checkpoints]

    def _verified_todo(self) -> list[PartSpec]:
        """The parts still to run; verified parts' sums are merged now, anything unverifiable is discarded."""
        plan, todo = self.plan, []
        models = plan.model_fingerprints
        for part in self.parts:
            args = (self.output, part.index, plan.run_fingerprint, part.n_windows, plan.spec.horizon, models)
            sums = read_done_part(*args)
            if sums is None:
                # Forecasts that verify for their model stay: the part's actor reads them back and rescores.
                outputs.discard_part(self.output, part.index, unverified_models(*args))
                todo.append(part)
            else:
                self.sums.add(part.index, sums)
        return todo

    def _merge_written(self, part: PartSpec) -> None:
        plan = self.plan
        sums = read_done_part(
            self.output, part.index, plan.run_fingerprint, part.n_windows, plan.spec.horizon, plan.model_fingerprints
        )
        if sums is None:  # an actor reported success but the files do not verify: never merge unverified sums
            self._on_failure(part, BatchError(f"part {part.index} was reported written but does not verify"))
        else:
            self.sums.add(part.index, sums)

    def _series_source(self) -> tuple[SeriesSource, dict[str, Any]]:
        plan = self.plan
        store = SeriesStore.from_table(plan.table)
        smallest = cluster.smallest_object_store_bytes()
        transport, reason = choose_series_transport(
            plan.settings.series_transport, store.nbytes, smallest, plan.settings.data
        )
        logger.info("Series transport: %s (%s)", transport.value, reason)
        info: dict[str, Any] = {"series_transport": transport.value, "reason": reason, "series_bytes": store.nbytes}
        if transport is SeriesTransport.OBJECT_STORE:
            return store, info
        reader = ParquetSeriesReader(
            plan.settings.data,
            store.series_ids,
            tuple(int(n) for n in store.offsets[1:] - store.offsets[:-1]),
            plan.checkpoint.metadata.resolution_minutes,
            tuple(plan.table.covariate_names),
        )
        return reader, info

    def _dispatch(self, todo: list[PartSpec], progress: Progress) -> None:
        settings = self.plan.settings
        source, self.transport = self._series_source()
        job = self.plan.job(source)
        put_started = time.perf_counter()
        job_ref = cluster.put(job)
        self.transport["put_s"] = round(time.perf_counter() - put_started, 4)
        self.transport["job_bytes"] = len(pickle.dumps(job, protocol=5))
        self.transport["descriptor_bytes"] = len(pickle.dumps(todo[0], protocol=5))
        actors, self.infos = start_pool(
            self.worker_config(),
            settings.actors,
            settings.cpus_per_actor,
            settings.gpus_per_actor,
            job_factory=build_part_runner,
            job_input=job_ref,
        )
        self.actors = list(actors)
        self._progress = progress
        self._phase("series_and_pool")
        cpu_before, clock_before = driver_cpu_s(), time.perf_counter()
        progress.start()
        try:
            self.stats = dispatch(
                iter(todo),
                actors,
                lambda actor, part: actor.run.remote(part),
                self._on_result,
                self._on_failure,
                key=lambda part: part.index,
                max_in_flight_per_actor=settings.max_in_flight_per_actor,
                attempt_timeout_s=self._deadline_s,
                replacements=_Replacements(self, job_ref),
                on_replacement=self.actors.append,
            )
            # Throughput covers dispatching only: stopping actors and Ray (over a second) is not part of it.
            self.dispatch_s = time.perf_counter() - clock_before
            self.dispatch_cpu_s = driver_cpu_s() - cpu_before
            self._phase("dispatch")
        finally:
            cluster.kill(self.actors)  # the pool and every replacement

    def _deadline_s(self) -> float:
        if self.plan.settings.part_timeout_s is not None:
            return self.plan.settings.part_timeout_s
        if not self.receipts:
            return FIRST_PART_TIMEOUT_S
        return max(MIN_PART_TIMEOUT_S, DEADLINE_FACTOR * self.slowest_part_s)

    def _on_result(self, part: PartSpec, receipt: PartReceipt) -> None:
        self.receipts.append(receipt)
        self.slowest_part_s = max(self.slowest_part_s, sum(receipt.seconds.values()))
        if self.first_result_s is None:
            self.first_result_s = time.perf_counter() - self.started
        self._progress.advance(receipt.windows)

    def _on_failure(self, part: PartSpec, error: BaseException) -> None:
        logger.error("Part %d (%d windows) failed: %s", part.index, part.n_windows, error)
        self.failures.append(
            {"part": part.index, "windows": part.n_windows, "error": f"{type(error).__name__}: {error}"}
        )
