"""The report stage: a run's :class:`~.run.RunScores` -> leaderboard, report.html, summary.json -> the result.

Everything here is written from the merged sums the run stage handed on, never from the forecasts:
``metrics.parquet`` (by the driver, while the report process draws), the leaderboard and report.html (by the
report process the run started, else by the driver), the covariates' ages,
``failed_windows.json`` and ``nonfinite_windows.json``, and last ``summary.json``, the run's record. Ray stops on
its own thread meanwhile; this stage waits for it (:meth:`~.run.RunEnding.close`) before summary.json is written.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX
from distributed_onnx.evaluation.driver._failures import (
    FAILED_WINDOWS,
    clear_failed_windows,
    failure_error,
    nonfinite_error,
)
from distributed_onnx.evaluation.driver._summary import build_summary, driver_timing, write_summary
from distributed_onnx.evaluation.driver._vintage_summary import covariates_record, merged_stats, write_covariate_ages
from distributed_onnx.evaluation.driver.clock import driver_cpu_s
from distributed_onnx.evaluation.driver.merge import fan_windows
from distributed_onnx.evaluation.driver.run import RunScores
from distributed_onnx.evaluation.fans import FanWindow
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.realized_gap import realized_gaps
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.evaluation.scoring.variants import variant_verdicts
from distributed_onnx.evaluation.sums import IN_SAMPLE
from distributed_onnx.location import Location

__all__ = ["BacktestResult", "render_report", "report", "write_leaderboard"]

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


def report(
    scores: RunScores, tuned: Mapping[str, Any] | None = None, meanwhile: Callable[[float], None] | None = None
) -> BacktestResult:
    """Write what the run's merged sums say (see the module docstring); raises
    :class:`~distributed_onnx.errors.BatchError` after writing everything if parts failed or forecasts were not
    finite. ``tuned``: what ``backtest --tuned`` did with a tuned file's choice between a checkpoint and its
    variants (``distributed_onnx/tune_variants.py``): kept as ``summary["tuned"]``, its ``said`` a note of the
    summary and the report, so that a variant run in place of its parent is never silent.

    ``meanwhile``: a caller's work on the run's forecasts (a fev benchmark scores them), given the dispatch's
    seconds and run while the report process draws, so that the two take a core each instead of one after the
    other; what it raises ends the run before summary.json is written, as any error of the report stage."""
    plan, outcome, ending = scores.plan, scores.outcome, scores.ending
    output, clock = plan.settings.output, ending.clock
    try:
        summary = build_summary(plan, outcome, clock, scores.earlier)
        _covariates(summary, scores)
        _in_sample(summary, scores)
        nonfinite = _compared(summary, scores, tuned)
        leaderboard = _draw(summary, scores, _driver_work(summary, scores, meanwhile))
        scores.metrics.write()  # written by _draw already, meanwhile: here only should _draw have returned early
        _from_leaderboard(summary, scores, leaderboard)
    finally:
        ending.close()  # the report process ended, and Ray stopped on the thread that started it
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
        raise failure_error(plan, list(scores.parts), failures)
    if nonfinite is not None:
        raise nonfinite
    return BacktestResult(summary, scores.run_wide, storage.join(output, outputs.METRICS), failures)


def write_leaderboard(output: Location, scores: PairScores, step_us: int) -> pa.Table:
    """Write ``leaderboard.parquet`` (:mod:`..scoring.leaderboard`: a few rows per model and pair)."""
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard  # scipy: only where it is built

    table = leaderboard(scores, step_us)
    storage.write_parquet(storage.join(output, outputs.LEADERBOARD), table)
    return table


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


def _in_sample(summary: dict[str, Any], scores: RunScores) -> None:
    """``summary["in_sample"]``: the windows at or before a checkpoint's ``training_data_end``, counted."""
    plan = scores.plan
    if plan.in_sample_end_us is None:
        return
    windows = scores.in_sample_windows
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


def _covariates(summary: dict[str, Any], scores: RunScores) -> None:
    """``summary["covariates"]``: each covariate vintaged or known; the vintages' counts and ages, also
    written as ``covariate_ages.parquet`` (:mod:`._vintage_summary`)."""
    plan = scores.plan
    stats = None
    if plan.vintaged is not None:
        stats = merged_stats(plan.settings.output, scores.done, plan.spec.horizon, plan.step_us)
        write_covariate_ages(plan.settings.output, stats)
    summary["covariates"] = covariates_record(plan, stats)


def _compared(summary: dict[str, Any], scores: RunScores, tuned: Mapping[str, Any] | None) -> BatchError | None:
    """The models' part of summary.json (fingerprints, identities, pairs scored and left out, parts computed per
    model, and ``tuned``: a tuned file's choice of checkpoint); returns the error of non-finite forecasts (written
    to ``nonfinite_windows.json``), raised at the end."""
    plan = scores.plan
    summary["models"] = plan.model_records()
    if tuned is not None:  # the tuned file's choice of checkpoint: said, never silent
        summary["tuned"] = dict(tuned)
        summary["notes"].append(str(tuned["said"]))
    for twin in plan.realized_models:  # --compare-realized: the same checkpoint on the realized covariates
        summary["models"][twin] = {
            "realized_of": twin.removesuffix(REALIZED_SUFFIX),
            "fingerprint": plan.model_fingerprints[twin],
        }
    summary["pairs"] = scores.scores.left_out()
    summary["parts"]["computed_by_model"] = dict(
        Counter(name for receipt in scores.outcome.receipts for name in receipt.models_computed)
    )
    nonfinite = nonfinite_error(plan, scores.scores.nonfinite)
    if nonfinite is not None:
        summary["notes"].append(str(nonfinite))
    return nonfinite


def _from_leaderboard(summary: dict[str, Any], scores: RunScores, board: pa.Table | None) -> None:
    """What summary.json reads off the leaderboard: the realized twins' gaps, the variants' verdicts."""
    if board is None:
        return
    if scores.plan.realized_models:
        summary["covariates"]["realized_comparison"] = realized_gaps(board)
    verdicts = variant_verdicts(summary.get("models") or {}, board, summary["timing"].get("actor_stage_s"))
    if verdicts:
        summary["variants"] = verdicts


def _driver_work(
    summary: dict[str, Any], scores: RunScores, meanwhile: Callable[[float], None] | None
) -> Callable[[], None]:
    """What the driver does while the report is drawn, once: metrics.parquet, then the caller's ``meanwhile``."""
    done = False

    def work() -> None:
        nonlocal done
        if done:
            return
        done = True
        scores.metrics.write()
        if meanwhile is not None:
            meanwhile(float(summary["timing"].get("dispatch_s") or 0.0))

    return work


def _draw(summary: dict[str, Any], scores: RunScores, driver_work: Callable[[], None]) -> pa.Table | None:
    """Write leaderboard.parquet and draw report.html (returns the leaderboard): by the report process the run
    started (:mod:`.report_process`) while the driver does ``driver_work`` (metrics.parquet, a caller's work),
    else here, in the driver (after that work), while Ray stops on its own thread.

    Drawn by a Ray worker, it cost a cold process importing the package and matplotlib after the last
    part: seconds of wall time at the end of every run (measured), for a second of the driver's CPU.
    A report that cannot be drawn is a note in summary.json, never a lost run: the parts, the metrics and
    the summary are the results.
    """
    plan, merged, ending = scores.plan, scores.scores, scores.ending
    series = SeriesScores(merged)  # per-series values from the sums: the long table is never held
    fans = fan_windows(scores.fans, plan, series)
    summary["timing"]["driver_cpu_s"] = round(driver_cpu_s(), 3)  # until now; summary.json gets the final
    if ending.report_process is not None:
        shown = (plan.settings.output, summary, scores.run_wide, plan.quantiles, fans, series, merged, plan.step_us)
        request = (*shown, registry.added())
        drawn = ending.report_process.draw(request, meanwhile=driver_work)
        if drawn is not None:
            leaderboard, child_cpu_s = drawn
            # the child's for this report (its imports too, when it was started for this run)
            summary["timing"]["report_cpu_s"] = round(child_cpu_s, 4)
            summary["timing"]["report_drawn_by"] = "report process"
            ending.clock.mark("report")
            return leaderboard
    driver_work()  # done already if the report process was asked and failed
    leaderboard = write_leaderboard(plan.settings.output, merged, plan.step_us)
    arguments = (plan.settings.output, summary, scores.run_wide, plan.quantiles, fans, leaderboard, series)
    try:
        cpu_s = render_report(*arguments, pair_scores=merged, step_us=plan.step_us)
        summary["timing"]["report_cpu_s"] = round(cpu_s, 4)
        summary["timing"]["report_drawn_by"] = "driver"
    except Exception as exc:  # matplotlib, storage: whatever failed, the run's results stand
        logger.error("Could not write report.html: %s", exc)
        summary["notes"].append(f"report.html could not be written: {type(exc).__name__}: {exc}")
    ending.clock.mark("report")
    return leaderboard
