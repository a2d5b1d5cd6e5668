"""The backtest's front door: four stages, each called once, each handing the next one frozen record.

```
settings -> resolve  -> Checkpoints   the run's checkpoints, checked; the grid and windows they fix (planning)
         -> load     -> Dataset       the user's files read and checked once                      (dataset)
         -> plan     -> RunPlan       fingerprints and parts                                      (planning)
         -> run      -> RunScores     the parts run through Ray, their sums merged                (driver.run)
         -> report   -> BacktestResult  leaderboard, report.html, summary.json                    (driver.report)
```

Nothing per window passes through the driver: each actor gets the run's job once and then three integers per
part. Parts are written as they complete, so an interrupted run keeps its finished parts and a rerun with the
same settings on the same directory runs only the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from distributed_onnx.evaluation.dataset import load
from distributed_onnx.evaluation.driver.clock import PhaseClock
from distributed_onnx.evaluation.driver.early import START_HERE, StartHere, start_early
from distributed_onnx.evaluation.driver.report import BacktestResult, report
from distributed_onnx.evaluation.driver.run import run
from distributed_onnx.evaluation.planning import plan, resolve
from distributed_onnx.evaluation.run_lock import run_lock
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.up_front import check_backtest
from distributed_onnx.runtime.early_start import EarlyStart

__all__ = ["BacktestResult", "run_backtest"]


def run_backtest(
    settings: BacktestSettings,
    started_wall_s: float | None = None,
    *,
    wait_for_ray_stop: bool = True,
    early: EarlyStart | StartHere | None = START_HERE,
    quiet_ray: bool | None = None,
    tuned: Mapping[str, Any] | None = None,
    meanwhile: Callable[[float], None] | None = None,
) -> BacktestResult:
    """Run (or resume) a backtest; raises :class:`~distributed_onnx.errors.BatchError` after writing everything
    else if parts failed.

    ``started_wall_s`` (a ``time.perf_counter()`` value) is when the run started as its user sees it: the command
    passes its process's start (:func:`~.driver.clock.process_started_perf_s`), so ``total_s`` and the first
    forecast count Python's start and the imports (phase ``python_start``); by default, this call.

    Bad data raises once the plan fails, but a Ray started early for the run is still starting then: by default
    this call waits for it to stop; with ``wait_for_ray_stop=False`` (a process that exits after the error: the
    command) it raises at once and Ray stops with the process (``runtime/early_start.py``).

    ``early`` is Ray and the pool already starting for these settings (the command starts them before it
    imports this module: :func:`~.driver.early.start_early`), or None for none; by default this call starts them.
    ``quiet_ray``: Ray's console logging for a Ray this call starts (:class:`~.runtime.early_start.EarlyStart`).
    ``tuned``: what ``backtest --tuned`` did with a tuned file's choice of checkpoint (:func:`~.driver.report.report`).
    ``meanwhile``: the caller's own work on the run's forecasts, done while the report is drawn (once every part
    is done or failed, before summary.json), given the dispatch's seconds (:func:`~.driver.report.report`).
    """
    clock = PhaseClock(started_wall_s)
    if started_wall_s is not None:
        clock.mark("python_start")
    if isinstance(early, StartHere):
        found = check_backtest(settings)  # before Ray starts (the command and fev check before they start it)
        early = start_early(settings, found, quiet_ray=quiet_ray)
    with contextlib.ExitStack() as held:
        try:
            models = resolve(settings)
            data = load(settings, models.spec, models.resolution_minutes)
            planned = plan(settings, models, data)
            # One run at a time in a folder, for the run's life: taken once the input is good (bad input makes no
            # folder), before the folder is read or written.
            held.enter_context(run_lock(settings.output))
        except BaseException:
            if early is not None:  # bad input, or the folder in use: the pool is not needed
                early.abandon(wait=wait_for_ray_stop)
            raise
        scores = run(planned, clock, early, quiet_ray)
        return report(scores, tuned, meanwhile)
