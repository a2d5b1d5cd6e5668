"""The report stage: a run's :class:`~.run.RunScores` -> leaderboard, report.html, summary.json -> the result.

Everything here is written from the merged sums the run stage handed on, never from the forecasts:
``metrics.parquet`` (by the driver, while the report process draws), the leaderboard and report.html (by the
report process the run started, else by the driver), the covariates' ages,
``failed_windows.json`` and ``nonfinite_windows.json``, and last ``summary.json``, the run's record. Ray stops on
its own thread meanwhile; this stage waits for it (:meth:`~.run.RunEnding.close`) before summary.json is written.

Each step is one call, in turn, on what the run stage computed once and handed on (:class:`~.run.RunScores`: the
fans picked, the per-series values, what the run folder holds of earlier work): the covariates found
(:mod:`._vintage_summary`), the summary built (:mod:`._summary`), the leaderboard and report.html drawn
(:mod:`._drawing`, which reads the leaderboard's findings once: :mod:`..scoring.findings`), those findings recorded,
and the run's record written once (:meth:`~..outputs.RunFolder.write_record`): the stage hands the folder on, never
the bare location.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.driver._drawing import draw, write_leaderboard
from distributed_onnx.evaluation.driver._failures import failure_error
from distributed_onnx.evaluation.driver._summary import driver_timing, summarize
from distributed_onnx.evaluation.driver._vintage_summary import covariates_found
from distributed_onnx.evaluation.driver.run import RunScores
from distributed_onnx.evaluation.outputs import FAILED_WINDOWS, NONFINITE_WINDOWS, RunFolder, RunRecord
from distributed_onnx.location import Location

__all__ = ["BacktestResult", "report", "write_leaderboard"]


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
    folder, clock = RunFolder(plan.settings.output), ending.clock
    nonfinite = {model: ids for model, ids in scores.scores.nonfinite.items() if ids}
    earlier = scores.earlier
    try:
        covariates = covariates_found(plan, earlier.vintage_documents)
        summary, nonfinite_error = summarize(
            scores, tuned, covariates.record, nonfinite, folder.path(NONFINITE_WINDOWS)
        )
        drawn = draw(summary, scores, folder, meanwhile)
        scores.metrics.write()  # written by draw already, meanwhile: here only should draw have returned early
        drawn.findings.add_to(summary)
    finally:
        ending.close()  # the report process ended, and Ray stopped on the thread that started it
    clock.mark("ray_stop")
    summary["timing"].update(driver_timing(clock, outcome.windows_computed))
    failures = [failure.as_record() for failure in outcome.failures]
    if not failures and earlier.failed_windows:
        summary["notes"].append(f"{FAILED_WINDOWS} of an earlier invocation was removed: every window is done")
    error = failure_error(plan, list(scores.parts), failures, folder.path(FAILED_WINDOWS)) if failures else None
    # The user's wait: from the start (the process's, for the command) to summary.json, the last file
    # written; what follows is the interpreter's exit (benchmarks/results/ measures it from outside).
    summary["timing"]["total_s"] = clock.elapsed_s()
    folder.write_record(RunRecord(summary, covariates.ages, nonfinite, failures, earlier.failed_windows))
    if error is not None:
        raise error
    if nonfinite_error is not None:
        raise nonfinite_error
    return BacktestResult(summary, scores.run_wide, folder.path(outputs.METRICS), failures)
