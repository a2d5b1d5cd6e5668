"""The imports of a run's end, paid on a thread while the actors forecast.

The merge's leaderboard imports scipy, the report imports matplotlib, and matplotlib's first figure loads its
font and date machinery: ~0.7 s of CPU on 2 cores. Where the driver pays them decides what they cost:

- after the last part, all of it is on the user's wait;
- while Ray starts (where the driver paid them before), they take the two cores from Ray's own start, which
  is CPU-bound Python (the raylet registers only once its dashboard agent has imported its modules): the pool
  was ready ~0.8 s later, traced on the 1-minute run's data (``benchmarks/results/time_to_results.md``);
- during the dispatch, with the driver otherwise idle, they take ~0.7 s of CPU from two actors, ~0.35 s of
  their wall time, and a short run's dispatch hides what it can of the rest.

So the driver starts them (:func:`start_end_imports`) on a daemon thread once the actors have their job (not
while the series go out to them: that is on the way to the first forecast too), and joins the thread before it
draws the report: matplotlib's ``rc_context`` changes process-wide settings, so the warm-up figure and the
report must not draw at once. Importing a module the main thread also imports is safe (each module's import
lock). Best effort throughout: an import that fails here fails again, with its error, where the report needs
it.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)


def _import_and_warm_up() -> None:
    try:
        import distributed_onnx.evaluation.report.page
        import distributed_onnx.evaluation.scoring.leaderboard  # noqa: F401
        from distributed_onnx.evaluation.report import plots

        plots.warm_up()
    except Exception as exc:  # the report pays (and reports) it later if it really fails
        logger.debug("The end's imports failed on their thread: %s", exc)


def start_end_imports() -> threading.Thread:
    """Start the end's imports and matplotlib's warm-up figure on a daemon thread; join it before drawing."""
    thread = threading.Thread(target=_import_and_warm_up, name="end-imports", daemon=True)
    thread.start()
    return thread
