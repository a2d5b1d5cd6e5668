"""The backtest's driver: plan -> series into the object store once -> parts to the actors -> merge the sums.

The driver plans, schedules, retries and merges; nothing per window passes through it. Each actor gets the
run's :class:`~distributed_onnx.evaluation.actor.part.PartJob` once (the series zero-copy from the object store, or
the path to read them from) and then three integers per part; it packs, forecasts, writes the part and its
sums, and answers with a receipt. The driver builds ``metrics.parquet``, ``summary.json`` and ``report.html``
from the merged sums. Parts are written as they complete, so an interrupted run keeps its finished parts and
a rerun with the same settings on the same directory runs only the rest.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX
from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.driver.clock import PhaseClock, driver_cpu_s
from distributed_onnx.evaluation.driver.early import (
    START_HERE,
    StartHere,
    start_early,
    start_ray_and_pool,
    worker_configs,
)
from distributed_onnx.evaluation.driver.failures import (
    FAILED_WINDOWS,
    clear_failed_windows,
    failure_error,
    nonfinite_error,
)
from distributed_onnx.evaluation.driver.identities import check_identities, identity_records
from distributed_onnx.evaluation.driver.merge import RunSums, fan_windows
from distributed_onnx.evaluation.driver.outcome import Dispatched, PartFailure, RunOutcome
from distributed_onnx.evaluation.driver.part_count import MANIFEST_KEY, RAMP_KEY, ROWS_KEY
from distributed_onnx.evaluation.driver.part_ledger import PartLedger
from distributed_onnx.evaluation.driver.plan import RunPlan, prepare
from distributed_onnx.evaluation.driver.progress import Progress
from distributed_onnx.evaluation.driver.report_process import REPORT_LEAD_S, ReportProcess
from distributed_onnx.evaluation.driver.summary import (
    build_summary,
    driver_timing,
    model_records,
    previous_summary,
    write_summary,
)
from distributed_onnx.evaluation.driver.up_front import check_backtest
from distributed_onnx.evaluation.driver.vintage_summary import (
    covariates_record,
    merged_stats,
    write_covariate_ages,
)
from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.part_messages import PartReceipt
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.realized_gap import realized_gaps
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.evaluation.scoring.variants import variant_verdicts
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.sums import IN_SAMPLE, PartSums, read_done_part, unverified_models
from distributed_onnx.location import Location
from distributed_onnx.model.worker import WorkerConfig
from distributed_onnx.runtime.dispatch_state import DispatchStats
from distributed_onnx.runtime.early_start import EarlyStart

__all__ = ["BacktestResult", "RunPlan", "prepare", "run_backtest"]

logger = logging.getLogger(__name__)


@dataclass
class BacktestResult:
    """What a run returns. The whole metrics table is in ``metrics.parquet`` (:meth:`read_metrics`); the result
    holds only its run-wide rows, so a run over 100,000 series does not keep millions of rows in the driver."""

    summary: dict[str, Any]
    #: The rows of ``metrics.parquet`` that are not per series: scopes ``global`` (every convention) and ``lead``.
    run_wide_metrics: pa.Table
    #: Where the whole table is: ``metrics.parquet`` in the run directory.
    metrics_path: Location
    failed_parts: list[dict[str, Any]] = field(default_factory=list)

    def read_metrics(self) -> pa.Table:
        """The whole long metrics table (every scope), read from :attr:`metrics_path` now."""
        return storage.read_parquet(self.metrics_path)


def run_backtest(
    settings: BacktestSettings,
    started_wall_s: float | None = None,
    *,
    wait_for_ray_stop: bool = True,
    early: EarlyStart | StartHere | None = START_HERE,
    quiet_ray: bool | None = None,
    tuned: Mapping[str, Any] | None = None,
) -> BacktestResult:
    """Run (or resume) a backtest; raises :class:`BatchError` after writing everything else if parts failed.

    ``started_wall_s`` (a ``time.perf_counter()`` value) is when the run started as its user sees it: the command
    passes its process's start (:func:`~.clock.process_started_perf_s`), so ``total_s`` and the first forecast
    count Python's start and the imports (phase ``python_start``); by default, this call.

    Bad data raises once the plan fails, but a Ray started early for the run is still starting then: by default
    this call waits for it to stop; with ``wait_for_ray_stop=False`` (a process that exits after the error: the
    command) it raises at once and Ray stops with the process (``runtime/early_start.py``).

    ``early`` is Ray and the pool already starting for these settings (the command starts them before it
    imports this module: :func:`~.early.start_early`), or None for none; by default this call starts them.
    ``quiet_ray``: Ray's console logging for a Ray this call starts (:class:`~.runtime.early_start.EarlyStart`).

    ``tuned``: what ``backtest --tuned`` did with the file's choice between a checkpoint and its variants
    (``distributed_onnx/tune_variants.py``): kept as ``summary["tuned"]``, its ``said`` a note of the summary
    and the report, so that a variant run in place of its parent is never silent.
    """
    clock = PhaseClock(started_wall_s)
    if started_wall_s is not None:
        clock.mark("python_start")
    if isinstance(early, StartHere):
        check_backtest(settings)  # before Ray starts (the command and fev check before they start it themselves)
        early = start_early(settings, quiet_ray=quiet_ray)
    try:
        plan = prepare(settings)
    except BaseException:
        if early is not None:  # bad input: the pool is not needed
            early.abandon(wait=wait_for_ray_stop)
        raise
    return _BacktestRun(plan, clock, early, quiet_ray, tuned).run()


def render_report(  # noqa: PLR0913 - what write_report draws, passed through
    output: Location,
    summary: dict[str, Any],
    metrics: pa.Table,
    quantiles: list[float],
    fans: list[FanWindow],
    leaderboard: pa.Table | None = None,
    series: SeriesScores | None = None,
    *,
    pair_scores: PairScores | None = None,
    step_us: int | None = None,
) -> float:
    """Write report.html and return the CPU seconds it took (matplotlib's import included).

    ``metrics``: the run-wide rows; ``series``: the per-series values (else the series rows of ``metrics``)."""
    started = time.process_time()
    from distributed_onnx.evaluation.report import page as report  # matplotlib: loaded only where the report is drawn

    report.write_report(
        output, summary, metrics, quantiles, fans, leaderboard, series, pair_scores=pair_scores, step_us=step_us
    )
    return time.process_time() - started


class _BacktestRun:
    """One execution of a plan: it runs the parts left, then writes what its :class:`RunOutcome` says."""

    def __init__(
        self,
        plan: RunPlan,
        clock: PhaseClock,
        early: EarlyStart | None = None,
        quiet_ray: bool | None = None,
        tuned: Mapping[str, Any] | None = None,
    ) -> None:
        self.plan = plan
        self.tuned = tuned
        self.clock = clock
        self.early = early
        self.quiet_ray = quiet_ray
        self.parts = plan.parts()
        self.sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)
        self.done: list[int] = []  # the parts whose files verify (done before, or written by this run's actors)
        self.leaderboard: pa.Table | None = None
        self.ledger = PartLedger()
        self.progress: Progress | None = None
        self.report_process: ReportProcess | None = None  # started near the dispatch's end (:meth:`_on_result`)
        self._report_started = False
        self._dispatch_started_s = 0.0
        self._windows_to_compute = 0
        self._windows_computed = 0  # by this run's dispatch so far

    def run(self) -> BacktestResult:
        plan, output, clock = self.plan, self.plan.settings.output, self.clock
        clock.mark("start_and_plan")  # Python, imports, reading and checking the data, planning
        settings_record = {"settings": plan.settings.model_dump(mode="json")}
        # The part and batch sizes are recorded so that a rerun (on any cluster) plans the same parts
        # (:mod:`.part_count`).
        manifest = {
            **settings_record,
            **{MANIFEST_KEY: plan.windows_per_part, RAMP_KEY: plan.ramp_width, ROWS_KEY: plan.rows_per_batch},
            **identity_records(plan.identities),
        }
        outputs.prepare_output(output, plan.run_fingerprint, manifest)
        check_identities(output, plan.identities)  # never a resume that mixes two meanings of a checkpoint
        outputs.clean_partials(output, plan.model_names)
        outputs.set_aside_removed_models(output, plan.model_names)  # forecasts/ holds this run's models only
        earlier = previous_summary(output, plan.run_fingerprint)
        todo = self._todo()
        done_windows = plan.windows.planned - self._windows_to_compute
        logger.info(
            "Planned %d windows in %d parts of up to %d, batches of %d (%d skipped for context coverage); "
            "%d parts already done",
            plan.windows.planned,
            len(self.parts),
            plan.windows_per_part,
            plan.rows_per_batch,
            plan.windows.skipped,
            len(self.parts) - len(todo),
        )
        self.progress = Progress(plan.windows.planned, done_before=done_windows, enabled=plan.settings.progress)
        dispatched = Dispatched((), {}, DispatchStats())
        try:
            if todo:
                self._ray_ready()
                clock.mark("ray_start")
                dispatched = self._dispatch(todo, self.progress)
            self._after_dispatch()
            failed = {failure.part for failure in self.ledger.failures}
            self.done += [part.index for part in todo if part.index not in failed]
            scores = self._merged()
            run_wide = self.sums.write_metrics(output, scores)  # the leaderboard is written with the report
            clock.mark("merge")
            outcome = self._outcome(todo, done_windows, dispatched)
            summary = build_summary(plan, outcome, clock, earlier)
            self._covariates(summary)
            self._in_sample(summary)
            nonfinite = self._compared(summary, scores, outcome)
            self._report(summary, run_wide, scores)
            self._from_leaderboard(summary)
        finally:
            if self.report_process is not None:
                self.report_process.close()  # drawn, or not needed after an error
            if self.early is not None:  # Ray stops on the thread that started it (runtime/early_start.py)
                self.early.join()
        clock.mark("ray_stop")
        summary["timing"].update(driver_timing(clock, outcome.windows_computed))
        if not outcome.failures and clear_failed_windows(output):
            summary["notes"].append(f"{FAILED_WINDOWS} of an earlier invocation was removed: every window is done")
        # The user's wait: from the start (the process's, for the command) to summary.json, the last file
        # written; what follows is the interpreter's exit (benchmarks/results/ measures it from outside).
        summary["timing"]["total_s"] = clock.elapsed_s()
        write_summary(output, summary)
        failures = [failure.as_record() for failure in outcome.failures]
        if failures:
            raise failure_error(plan, self.parts, failures)
        if nonfinite is not None:
            raise nonfinite
        return BacktestResult(summary, run_wide, storage.join(output, outputs.METRICS), failures)

    def _after_dispatch(self) -> None:
        """Ray stops on its own thread while the driver merges and draws the report; the report process starts
        now if the dispatch did not start it (its imports beside the merge)."""
        if self.early is not None:
            self.early.stop()
        self._start_report_process()

    def _ray_ready(self) -> None:
        """Ray and the pool up for the dispatch: started while the data was read and planned, else now."""
        if self.early is None:  # a resumed run, or a process that holds Ray already: the pool is needed now
            self.early = start_ray_and_pool(self.plan.settings, self.worker_config(), quiet_ray=self.quiet_ray)
        self.early.wait()

    def _in_sample(self, summary: dict[str, Any]) -> None:
        """``summary["in_sample"]``: the windows at or before a checkpoint's ``training_data_end``, counted."""
        plan = self.plan
        if plan.in_sample_end_us is None:
            return
        windows = self.sums.in_sample_windows
        summary["in_sample"] = {
            "training_data_end": str(np.datetime64(plan.in_sample_end_us, "us")) + "Z",
            "windows": windows,
            "in_leaderboard": plan.settings.include_in_sample,
            "scope": IN_SAMPLE,
        }
        if windows and not plan.settings.include_in_sample:
            summary["notes"].append(
                f"{windows} in-sample window(s) (origin at or before the training data's end "
                f"{summary['in_sample']['training_data_end']}) are scored apart (scope {IN_SAMPLE}) and left out of "
                "the leaderboard; the setting include_in_sample keeps them in"
            )

    def _covariates(self, summary: dict[str, Any]) -> None:
        """``summary["covariates"]``: each covariate vintaged or known; the vintages' counts and ages, also
        written as ``covariate_ages.parquet`` (:mod:`.vintage_summary`)."""
        plan = self.plan
        stats = None
        if plan.vintaged is not None:
            stats = merged_stats(plan.settings.output, self.done, plan.spec.horizon, plan.step_us)
            write_covariate_ages(plan.settings.output, stats)
        summary["covariates"] = covariates_record(plan, stats)

    def _compared(self, summary: dict[str, Any], scores: PairScores, outcome: RunOutcome) -> BatchError | None:
        """The models' part of summary.json (fingerprints, identities, pairs scored and left out, parts computed per
        model, and ``tuned``: a tuned file's choice of checkpoint); returns the error of non-finite forecasts
        (written to ``nonfinite_windows.json``), raised at the end."""
        plan = self.plan
        summary["models"] = model_records(plan)
        if self.tuned is not None:  # the tuned file's choice of checkpoint: said, never silent
            summary["tuned"] = dict(self.tuned)
            summary["notes"].append(str(self.tuned["said"]))
        for twin in plan.realized_models:  # --compare-realized: the same checkpoint on the realized covariates
            summary["models"][twin] = {
                "realized_of": twin.removesuffix(REALIZED_SUFFIX),
                "fingerprint": plan.model_fingerprints[twin],
            }
        summary["pairs"] = scores.left_out()
        summary["parts"]["computed_by_model"] = dict(
            Counter(name for receipt in outcome.receipts for name in receipt.models_computed)
        )
        nonfinite = nonfinite_error(plan, scores.nonfinite)
        if nonfinite is not None:
            summary["notes"].append(str(nonfinite))
        return nonfinite

    def _outcome(self, todo: list[PartSpec], done_windows: int, dispatched: Dispatched) -> RunOutcome:
        return RunOutcome(
            parts_planned=len(self.parts),
            parts_done_before=len(self.parts) - len(todo),
            windows_done_before=done_windows,
            receipts=tuple(self.ledger.receipts),
            failures=tuple(self.ledger.failures),
            workers=dispatched.workers,
            transport=dispatched.transport,
            dispatch_stats=dispatched.stats,
            first_result_s=self.ledger.first_result_s,
        )

    def _from_leaderboard(self, summary: dict[str, Any]) -> None:
        """What summary.json reads off the leaderboard: the realized twins' gaps, the variants' verdicts."""
        board = self.leaderboard
        if board is None:
            return
        if self.plan.realized_models:
            summary["covariates"]["realized_comparison"] = realized_gaps(board)
        verdicts = variant_verdicts(summary.get("models") or {}, board, summary["timing"].get("actor_stage_s"))
        if verdicts:
            summary["variants"] = verdicts

    def _report(self, summary: dict[str, Any], run_wide: pa.Table, scores: PairScores) -> None:
        """Write leaderboard.parquet and draw report.html: by the report process started with the dispatch
        (:mod:`.report_process`), else here, in the driver, while Ray stops on its own thread.

        Drawn by a Ray worker, it cost a cold process importing the package and matplotlib after the last
        part: seconds of wall time at the end of every run (measured), for a second of the driver's CPU.
        A report that cannot be drawn is a note in summary.json, never a lost run: the parts, the metrics and
        the summary are the results.
        """
        plan = self.plan
        series = SeriesScores(scores)  # per-series values from the sums: the long table is never held
        fans = fan_windows(self.sums, plan, series)
        summary["timing"]["driver_cpu_s"] = round(driver_cpu_s(), 3)  # until now; summary.json gets the final
        if self.report_process is not None:
            shown = (plan.settings.output, summary, run_wide, plan.quantiles, fans, series, scores, plan.step_us)
            request = (*shown, registry.added())
            drawn = self.report_process.draw(request)
            if drawn is not None:
                self.leaderboard, child_cpu_s = drawn
                summary["timing"]["report_cpu_s"] = round(child_cpu_s, 4)  # the child's, its imports included
                summary["timing"]["report_drawn_by"] = "report process"
                self.clock.mark("report")
                return
        self.leaderboard = self.sums.write_leaderboard(plan.settings.output, scores, plan.step_us)
        arguments = (plan.settings.output, summary, run_wide, plan.quantiles, fans, self.leaderboard, series)
        try:
            cpu_s = render_report(*arguments, pair_scores=scores, step_us=plan.step_us)
            summary["timing"]["report_cpu_s"] = round(cpu_s, 4)
            summary["timing"]["report_drawn_by"] = "driver"
        except Exception as exc:  # matplotlib, storage: whatever failed, the run's results stand
            logger.error("Could not write report.html: %s", exc)
            summary["notes"].append(f"report.html could not be written: {type(exc).__name__}: {exc}")
        self.clock.mark("report")

    def worker_config(self) -> list[WorkerConfig]:
        """One config per checkpoint: each actor loads every model of the run."""
        return worker_configs(self.plan.settings, [each.weights_path for each in self.plan.checkpoints])

    def _todo(self) -> list[PartSpec]:
        """The parts still to run (:meth:`_verified_todo`); none: the report process starts now, its imports
        beside the merge (no Ray, no actors)."""
        todo = self._verified_todo()
        self._windows_to_compute = sum(part.n_windows for part in todo)
        if not todo:
            self._start_report_process()
        return todo

    def _verified_todo(self) -> list[PartSpec]:
        """The parts still to run; the verified ones are noted (merged at the end), the unverifiable discarded."""
        plan, output, todo = self.plan, self.plan.settings.output, []
        models = plan.model_fingerprints
        for part in self.parts:
            args = (output, part.index, plan.run_fingerprint, part.n_windows, plan.spec.horizon, models)
            sums = read_done_part(*args)
            if sums is None:
                # Forecasts that verify for their model stay: the part's actor reads them back and rescores. It
                # is told which may be there, so on a fresh run it opens no footer at all.
                discarded = unverified_models(*args)
                outputs.discard_part(output, part.index, discarded)
                may_be_written = tuple(name for name in models if name not in discarded)
                todo.append(replace(part, written=may_be_written))
            else:
                self.done.append(part.index)  # its sums are read again, one part at a time, when merged
        return todo

    def _merged(self) -> PairScores:
        """Every done part's sums, read (and verified) again one at a time in part order and merged as they come.

        A part that does not verify now (an actor reported it written, or a file changed since this run verified
        it) is a failed part: sums that do not verify are never merged.
        """
        plan = self.plan
        by_index = {part.index: part for part in self.parts}

        def read(index: int) -> PartSums | None:
            part = by_index[index]
            args = (plan.settings.output, index, plan.run_fingerprint, part.n_windows, plan.spec.horizon)
            return read_done_part(*args, plan.model_fingerprints)

        scores, unverified = self.sums.merge_parts(self.done, read)
        for index in unverified:
            self._on_failure(by_index[index], BatchError(f"part {index} was reported written but does not verify"))
        return scores

    def _dispatch(self, todo: list[PartSpec], progress: Progress) -> Dispatched:
        """The parts through Ray (:mod:`.dispatching`, imported here: a run with nothing to compute never loads
        Ray, and a fresh run's driver plans while the thread that starts Ray imports it)."""
        from distributed_onnx.evaluation.driver.dispatching import PartCallbacks, dispatch_parts

        assert self.early is not None, "the pool starts before the dispatch (_ray_ready)"
        callbacks = PartCallbacks(self._on_result, self._on_failure, self._on_job_handed)
        return dispatch_parts(self.plan, self.early, todo, self.ledger, progress, self.clock, callbacks)

    def _on_job_handed(self) -> None:
        self._dispatch_started_s = self.clock.elapsed_s()

    def _start_report_process(self) -> None:
        """Start the report process (once): its imports and warm-up then run beside the rest of the run."""
        if self._report_started:
            return
        self._report_started = True
        try:
            self.report_process = ReportProcess()
        except OSError as exc:  # no child process here: the driver imports and draws at the end (no gain measured
            # from importing on a thread meanwhile: benchmarks/results/mechanisms.md)
            logger.warning("Could not start the report process (%s); the driver draws the report", exc)

    def _on_result(self, part: PartSpec, receipt: PartReceipt) -> None:
        now_s = self.clock.elapsed_s()
        self.ledger.add_receipt(receipt, now_s)
        self._windows_computed += receipt.windows
        if self.progress is not None:
            self.progress.advance(receipt.windows)
        if not self._report_started and self._dispatch_left_s(now_s) <= REPORT_LEAD_S:
            self._start_report_process()

    def _dispatch_left_s(self, now_s: float) -> float:
        """The dispatch's seconds still to go, at its pace so far: the report process starts when they are about
        as many as its imports take, so that on a small machine its imports neither take a core from the actors
        for the whole run nor wait until the last part has come back (:data:`.report_process.REPORT_LEAD_S`)."""
        done = self._windows_computed
        left = self._windows_to_compute - done
        elapsed_s = now_s - self._dispatch_started_s
        return left * elapsed_s / done if done > 0 else float("inf")

    def _on_failure(self, part: PartSpec, error: BaseException) -> None:
        logger.error("Part %d (%d windows) failed: %s", part.index, part.n_windows, error)
        self.ledger.failures.append(PartFailure.of(part.index, part.n_windows, error))
