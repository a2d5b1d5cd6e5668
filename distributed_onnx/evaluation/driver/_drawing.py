"""``leaderboard.parquet`` and ``report.html``, drawn from the run's merged scores at the end of the report stage.

Drawn by the report process the run started (:mod:`.report_process`) while the driver writes ``metrics.parquet``
(and does a caller's work: :func:`driver_work`), else here, in the driver (after that work), while Ray stops on
its own thread. Drawn by a Ray worker, it cost a cold process importing the package and matplotlib after the last
part: seconds of wall time at the end of every run (measured), for a second of the driver's CPU. A report that
cannot be drawn is a note in summary.json, never a lost run: the parts, the metrics and the summary are the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from distributed_onnx.evaluation.driver.clock import driver_cpu_s
from distributed_onnx.evaluation.driver.merge import fan_windows
from distributed_onnx.evaluation.outputs import RunFolder
from distributed_onnx.evaluation.scoring import registry
from distributed_onnx.evaluation.scoring.pairs import PairScores
from distributed_onnx.evaluation.scoring.series_scores import SeriesScores
from distributed_onnx.location import Location

if TYPE_CHECKING:
    from distributed_onnx.evaluation.driver.run import RunScores

__all__ = ["draw", "write_leaderboard"]

logger = logging.getLogger(__name__)


def driver_work(
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


def draw(summary: dict[str, Any], scores: RunScores, folder: RunFolder, work: Callable[[], None]) -> pa.Table | None:
    """Write leaderboard.parquet and draw report.html (see the module docstring) while the driver does ``work``
    (:func:`driver_work`); returns the leaderboard."""
    plan, merged, ending = scores.plan, scores.scores, scores.ending
    series = SeriesScores(merged)  # per-series values from the sums: the long table is never held
    fans = fan_windows(scores.fans, plan, series)
    summary["timing"]["driver_cpu_s"] = round(driver_cpu_s(), 3)  # until now; summary.json gets the final
    if ending.report_process is not None:
        shown = (folder.location, summary, scores.run_wide, plan.quantiles, fans, series, merged, plan.step_us)
        request = (*shown, registry.added())
        drawn = ending.report_process.draw(request, meanwhile=work)
        if drawn is not None:
            leaderboard, child_cpu_s = drawn
            # the child's for this report (its imports too, when it was started for this run)
            summary["timing"]["report_cpu_s"] = round(child_cpu_s, 4)
            summary["timing"]["report_drawn_by"] = "report process"
            ending.clock.mark("report")
            return leaderboard
    work()  # done already if the report process was asked and failed
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard as board_of  # scipy: only where built

    leaderboard = board_of(merged, plan.step_us)
    folder.write_leaderboard(leaderboard)
    started = time.process_time()
    try:
        from distributed_onnx.evaluation.report import page  # matplotlib: loaded only where the report is drawn

        page.write_report(
            folder.location,
            summary,
            scores.run_wide,
            plan.quantiles,
            fans,
            leaderboard,
            series,
            pair_scores=merged,
            step_us=plan.step_us,
        )
        summary["timing"]["report_cpu_s"] = round(time.process_time() - started, 4)  # matplotlib's import included
        summary["timing"]["report_drawn_by"] = "driver"
    except Exception as exc:  # matplotlib, storage: whatever failed, the run's results stand
        logger.error("Could not write report.html: %s", exc)
        summary["notes"].append(f"report.html could not be written: {type(exc).__name__}: {exc}")
    ending.clock.mark("report")
    return leaderboard


def write_leaderboard(output: Location, scores: PairScores, step_us: int) -> pa.Table:
    """Write ``leaderboard.parquet`` (:mod:`..scoring.leaderboard`: a few rows per model and pair) and return it:
    what :func:`draw` and the report process (:mod:`.report_process`) do, for a caller with only the scores."""
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard  # scipy: only where it is built

    table = leaderboard(scores, step_us)
    RunFolder(output).write_leaderboard(table)
    return table
