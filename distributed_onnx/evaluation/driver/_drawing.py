"""``leaderboard.parquet`` and ``report.html``, drawn from the run's merged scores at the end of the report stage.

Drawn by the report process the run started (:mod:`.report_process`) while the driver writes ``metrics.parquet``
(and does a caller's work: :func:`draw`'s ``meanwhile``), else here, in the driver (after that work), while Ray stops
on its own thread. Drawn by a Ray worker, it cost a cold process importing the package and matplotlib after the last
part: seconds of wall time at the end of every run (measured), for a second of the driver's CPU. A report that
cannot be drawn is a note in summary.json, never a lost run: the parts, the metrics and the summary are the results.

Where the leaderboard is built, what it says beyond its rows is read once (:mod:`..scoring.findings`): the page
draws it, and the report stage records it in summary.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from distributed_onnx.evaluation.driver.clock import driver_cpu_s
from distributed_onnx.evaluation.outputs import RunFolder
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.findings import LeaderboardFindings, leaderboard_findings
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.location import Location

if TYPE_CHECKING:
    from distributed_onnx.evaluation.driver.run import RunScores

__all__ = ["Drawn", "draw", "write_leaderboard"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drawn:
    """What drawing left the report stage: the leaderboard (written) and what it says beyond its rows."""

    leaderboard: pa.Table
    findings: LeaderboardFindings


def draw(
    summary: dict[str, Any], scores: RunScores, folder: RunFolder, meanwhile: Callable[[float], None] | None
) -> Drawn:
    """Write leaderboard.parquet and draw report.html (see the module docstring) while the driver writes
    ``metrics.parquet`` and then does the caller's ``meanwhile`` (given the dispatch's seconds), once."""
    plan, merged, ending = scores.plan, scores.scores, scores.ending
    work = _driver_work(summary, scores, meanwhile)
    summary["timing"]["driver_cpu_s"] = round(driver_cpu_s(), 3)  # until now; summary.json gets the final
    realized = bool(plan.realized_models)
    if ending.report_process is not None:
        shown = (folder.location, summary, scores.run_wide, plan.quantiles, scores.fans, scores.series, merged)
        request = (*shown, plan.step_us, realized, registry.added())
        answer = ending.report_process.draw(request, meanwhile=work)
        if answer is not None:
            leaderboard, findings, child_cpu_s = answer
            # the child's for this report (its imports too, when it was started for this run)
            summary["timing"]["report_cpu_s"] = round(child_cpu_s, 4)
            summary["timing"]["report_drawn_by"] = "report process"
            ending.clock.mark("report")
            return Drawn(leaderboard, findings)
    work()  # done already if the report process was asked and failed
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard as board_of  # scipy: only where built

    leaderboard = board_of(merged, plan.step_us)
    stage_s = summary["timing"].get("actor_stage_s")
    findings = leaderboard_findings(leaderboard, summary.get("models") or {}, stage_s, realized)
    folder.write_leaderboard(leaderboard)
    started = time.process_time()
    try:
        # matplotlib: loaded only where the report is drawn
        from distributed_onnx.evaluation.report.page import draw_report
        from distributed_onnx.evaluation.report.page_values import report_values

        values = report_values(
            summary,
            scores.run_wide,
            plan.quantiles,
            scores.fans,
            leaderboard,
            scores.series,
            pair_scores=merged,
            step_us=plan.step_us,
            findings=findings,
        )
        draw_report(folder.location, values)  # from the values only: computed first, every one once
        summary["timing"]["report_cpu_s"] = round(time.process_time() - started, 4)  # matplotlib's import included
        summary["timing"]["report_drawn_by"] = "driver"
    except Exception as exc:  # matplotlib, storage: whatever failed, the run's results stand
        logger.error("Could not write report.html: %s", exc)
        summary["notes"].append(f"report.html could not be written: {type(exc).__name__}: {exc}")
    ending.clock.mark("report")
    return Drawn(leaderboard, findings)


def _driver_work(
    summary: dict[str, Any], scores: RunScores, meanwhile: Callable[[float], None] | None
) -> Callable[[], None]:
    """What the driver does while the report is drawn, once: metrics.parquet, then the caller's ``meanwhile``
    (given the dispatch's seconds)."""
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


def write_leaderboard(output: Location, scores: PairScores, step_us: int) -> pa.Table:
    """Write ``leaderboard.parquet`` (:mod:`..scoring.leaderboard`: a few rows per model and pair) and return it:
    what :func:`draw` and the report process (:mod:`.report_process`) do, for a caller with only the scores."""
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard  # scipy: only where it is built

    table = leaderboard(scores, step_us)
    RunFolder(output).write_leaderboard(table)
    return table
