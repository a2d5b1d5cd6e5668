"""The run stage: a :class:`RunPlan` -> its parts run through Ray, their sums merged -> :class:`RunScores`.

The driver schedules, retries and merges; nothing per window passes through it. Each actor gets the run's
:class:`~distributed_onnx.evaluation.part_messages.PartJob` once (the series zero-copy from the object store, or
the path to read them from) and then three integers per part; it packs, forecasts, writes the part and its
sums, and answers with a receipt. The driver verifies each part and merges the sums in part order; the report
stage (:mod:`.report`) writes ``metrics.parquet`` and the rest from the :class:`RunScores` handed on, whose values
are computed here once: the forecast fans picked, the per-series values, what the run folder holds of earlier work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import pyarrow as pa

from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation import output_cleanup, run_manifest
from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.driver._identities import check_identities, identity_records
from distributed_onnx.evaluation.driver._outcome import Dispatched, PartFailure, RunOutcome
from distributed_onnx.evaluation.driver._part_ledger import PartLedger
from distributed_onnx.evaluation.driver._progress import Progress
from distributed_onnx.evaluation.driver.clock import PhaseClock
from distributed_onnx.evaluation.driver.early import start_ray_and_pool
from distributed_onnx.evaluation.driver.merge import PendingMetrics, RunSums, fan_windows
from distributed_onnx.evaluation.driver.report_process import REPORT_LEAD_S, ReportProcess, warm_report_process
from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.outputs import EarlierFiles, RunFolder
from distributed_onnx.evaluation.part_messages import PartReceipt
from distributed_onnx.evaluation.planning import RunPlan
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.evaluation.sums import PartSums, read_done_part, unverified_models
from distributed_onnx.runtime.dispatch_state import DispatchStats
from distributed_onnx.runtime.early_start import EarlyStart

__all__ = ["RunEnding", "RunScores", "run"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RunScores:
    """What the run stage hands the report: every model's merged sums over the parts done, and what the run did.

    The sums are the parts' own, verified and added in part order (:mod:`.merge`), so a resumed run's are
    bit-identical to an uninterrupted one's; ``metrics.parquet`` is still to be written (``metrics``: the report
    stage writes it while the report process draws), ``run_wide`` is its rows other than the series scope.
    """

    plan: RunPlan
    #: The run's parts, and those whose files verify (done before, or written now): their sums are merged.
    parts: tuple[PartSpec, ...]
    done: tuple[int, ...]
    #: Every model's and baseline's sums over the done parts' windows (the in-sample ones apart).
    scores: PairScores
    in_sample: PairScores | None
    in_sample_windows: int
    #: Per-series values of ``scores``, read from the sums (the long table is never held): the page's series tables.
    series: SeriesScores
    #: The windows the report draws as forecast fans, picked from the parts' candidates (:func:`.merge.fan_windows`).
    fans: tuple[FanWindow, ...]
    run_wide: pa.Table
    metrics: PendingMetrics
    outcome: RunOutcome
    #: What the run folder holds of earlier work: an earlier invocation's summary (its record of who computed the
    #: parts), the parts' vintage counts, a stale ``failed_windows.json``.
    earlier: EarlierFiles
    ending: RunEnding


@dataclass(frozen=True)
class RunEnding:
    """What still runs while the report is written: the run's clock, Ray stopping on the thread that started it
    (``runtime/early_start.py``), the report process (:mod:`.report_process`)."""

    clock: PhaseClock
    early: EarlyStart | None
    report_process: ReportProcess | None

    def close(self) -> None:
        """Give the report process back (drawn, or not needed after an error: kept warm for the process's next
        run, :mod:`.report_process`) and wait for Ray to stop."""
        if self.report_process is not None:
            self.report_process.release()
        if self.early is not None:
            self.early.join()


def run(plan: RunPlan, clock: PhaseClock, early: EarlyStart | None = None, quiet_ray: bool | None = None) -> RunScores:
    """Run (or resume) ``plan``'s parts and merge their sums; ``early``: Ray and the pool already starting for it
    (else they start once the plan shows parts to run, ``quiet_ray`` as :class:`~.runtime.early_start.EarlyStart`
    says). ``clock`` marks the run's phases for summary.json."""
    return _BacktestRun(plan, clock, early, quiet_ray).run()


class _BacktestRun:
    """One execution of a plan: it runs the parts left and merges the sums of every part done."""

    def __init__(
        self, plan: RunPlan, clock: PhaseClock, early: EarlyStart | None = None, quiet_ray: bool | None = None
    ) -> None:
        self.plan = plan
        self.clock = clock
        self.early = early
        self.quiet_ray = quiet_ray
        self.parts = plan.parts()
        self.sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)
        self.done: list[int] = []  # the parts whose files verify (done before, or written by this run's actors)
        self.ledger = PartLedger()
        self.progress: Progress | None = None
        self.report_process: ReportProcess | None = None  # started near the dispatch's end (:meth:`_on_result`)
        self._report_started = False
        self._dispatch_started_s = 0.0
        self._windows_to_compute = 0
        self._windows_computed = 0  # by this run's dispatch so far

    def run(self) -> RunScores:
        plan, output, clock = self.plan, self.plan.settings.output, self.clock
        clock.mark("start_and_plan")  # Python, imports, reading and checking the data, planning
        settings_record = {"settings": plan.settings.model_dump(mode="json")}
        # The part and batch sizes are recorded so that a rerun (on any cluster) plans the same parts.
        manifest = {
            **settings_record,
            **plan.part_sizes(),
            **identity_records(plan.identities),
            run_manifest.FINGERPRINTED_KEY: plan.fingerprinted,  # a rerun of other settings is refused naming each
        }
        # Identities first: a changed checkpoint is refused naming its fields, even where it changed the fingerprint.
        check_identities(output, plan.identities, plan.run_fingerprint)  # never a mix of two meanings of one
        run_manifest.prepare_output(output, plan.run_fingerprint, manifest)
        output_cleanup.clean_partials(output, plan.model_names)
        output_cleanup.set_aside_removed_models(output, plan.model_names)  # forecasts/ holds this run's models only
        output_cleanup.set_aside_foreign_forecasts(output, plan.model_names, len(self.parts))  # and their parts only
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
            run_wide = self.sums.run_wide(scores)  # metrics.parquet is written with the report (PendingMetrics)
            series = SeriesScores(scores)  # per-series values from the sums: the long table is never held
            fans = fan_windows(self.sums.fans(), plan, series)
            vintaged = self.done if plan.vintaged is not None else []
            earlier = RunFolder(output).earlier_files(plan.run_fingerprint, vintaged)
            clock.mark("merge")
        except BaseException:
            self._ending().close()
            if self.early is not None and self.early.lost is not None:  # the interruption was the watch's
                raise self.early.lost from None
            raise
        return RunScores(
            plan=plan,
            parts=tuple(self.parts),
            done=tuple(self.done),
            scores=scores,
            in_sample=self.sums.in_sample,
            in_sample_windows=self.sums.in_sample_windows,
            series=series,
            fans=tuple(fans),
            run_wide=run_wide,
            metrics=PendingMetrics(self.sums, output, scores),
            outcome=self._outcome(todo, done_windows, dispatched),
            earlier=earlier,
            ending=self._ending(),
        )

    def _ending(self) -> RunEnding:
        return RunEnding(self.clock, self.early, self.report_process)

    def _after_dispatch(self) -> None:
        """Ray stops on its own thread while the driver merges and draws the report; the report process starts
        now if the dispatch did not start it (its imports beside the merge)."""
        if self.early is not None:
            self.early.stop()
        self._start_report_process()

    def _ray_ready(self) -> None:
        """Ray and the pool up for the dispatch: started while the data was read and planned, else now."""
        if self.early is None:  # a resumed run, or a process that holds Ray already: the pool is needed now
            checkpoints = [each.weights_path for each in self.plan.checkpoints]  # each actor loads every model
            self.early = start_ray_and_pool(self.plan.settings, checkpoints, quiet_ray=self.quiet_ray)
        self.early.wait()

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
                output_cleanup.discard_part(output, part.index, discarded)
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
        """The parts through Ray (:mod:`._dispatching`, imported here: a run with nothing to compute never loads
        Ray, and a fresh run's driver plans while the thread that starts Ray imports it)."""
        from distributed_onnx.evaluation.driver._dispatching import PartCallbacks, dispatch_parts

        assert self.early is not None, "the pool starts before the dispatch (_ray_ready)"
        callbacks = PartCallbacks(self._on_result, self._on_failure, self._on_job_handed)
        return dispatch_parts(self.plan, self.early, todo, self.ledger, progress, self.clock, callbacks)

    def _on_job_handed(self) -> None:
        self._dispatch_started_s = self.clock.elapsed_s()

    def _start_report_process(self) -> None:
        """Start the report process (once), or take the one an earlier run of this process left warm: its imports
        and warm-up then run beside the rest of the run."""
        if self._report_started:
            return
        self._report_started = True
        try:
            self.report_process = warm_report_process()
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
