"""report.html and leaderboard.parquet drawn by a helper process, so the driver's CPU stays on its parts.

The end of a run imports scipy (the leaderboard) and matplotlib (the report) and draws the fans: about 1.8 s
of CPU, more than everything else the driver does in a 150,000-window run once its dispatch costs per part
(``benchmarks/results/driver_cost.md``). A driver that feeds a large cluster should not spend it, and the
user should not wait for it either. So the run starts a plain Python child (:class:`ReportProcess`) as the
dispatch nears its end (:data:`REPORT_LEAD_S`), or at once for a rerun with nothing left to compute: it imports
the report's modules and warms matplotlib up while the last parts run (or while the driver merges), then
waits. At the end the driver sends it what the page
shows (the summary, the run-wide metrics, the fans, the per-series sums), and the child writes the leaderboard
and the report and answers with the leaderboard and its CPU seconds.

Not a Ray worker (a cold worker importing the package after the last part cost seconds of wall time,
measured), and not ``multiprocessing`` (the command runs as ``python -m distributed_onnx``, whose main module
a spawned child would run again). Best effort: whatever goes wrong with the child, the driver draws both
itself, as before (:meth:`ReportProcess.draw` returns None).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ReportProcess", "ReportRequest"]

#: The longest the driver waits for the child's report before drawing it itself.
DRAW_TIMEOUT_S = 600.0
#: The run starts the child when its dispatch has about this many seconds left at its pace so far (or at once,
#: when there is nothing to compute): about what the child's imports and warm-up take on a small machine
#: (``benchmarks/results/time_to_results.md``). Started with the dispatch, they took a core from the actors for
#: the whole of a long run; started after it, the user waited for them.
REPORT_LEAD_S = 2.0

ReportRequest = tuple[Any, ...]
"""``(output, summary, run_wide, quantiles, fans, series, scores, step_us, metrics)``: what the child draws from;
``metrics`` are those the driver registered (:func:`~..scoring.registry.added`), registered in the child too, so
its leaderboard and report hold every metric the driver's would."""


class ReportProcess:
    """A child process that has imported the report's modules and draws the report when asked (once)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "distributed_onnx.evaluation.driver.report_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def draw(self, request: ReportRequest, timeout_s: float = DRAW_TIMEOUT_S) -> tuple[Any, float] | None:
        """Send the request; ``(leaderboard, the child's CPU seconds)`` once both files are written, else None
        (the child failed, died or took too long: it is stopped, and the caller draws them)."""
        answer: list[tuple[bool, Any]] = []

        def exchange() -> None:
            try:
                assert self._process.stdin is not None and self._process.stdout is not None
                pickle.dump(request, self._process.stdin, protocol=5)
                self._process.stdin.close()
                answer.append(pickle.load(self._process.stdout))
            except Exception as exc:  # a dead child: the driver draws the report itself
                answer.append((False, f"{type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=exchange, name="report-process", daemon=True)
        thread.start()
        thread.join(timeout_s)
        ok, value = answer[0] if answer else (False, f"no answer within {timeout_s:.0f} s")
        value = value if ok else str(value)
        self.close()
        if not ok:
            logger.warning("The report process could not draw the report (%s); the driver draws it", value)
            return None
        leaderboard, cpu_s = tuple(value)
        return leaderboard, float(cpu_s)

    def close(self) -> None:
        """Stop the child (it exits by itself once it has answered; a stuck one is killed)."""
        if self._process.poll() is None:
            try:
                if self._process.stdin is not None and not self._process.stdin.closed:
                    self._process.stdin.close()  # a child still waiting for its request reads the end and exits
                self._process.wait(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                self._process.kill()
                self._process.wait()


def _serve() -> None:
    """The child: import and warm up, then draw one request read from stdin; the answer goes to stdout."""
    answer_to = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but the answer on the pipe
    try:
        from distributed_onnx.evaluation.report import page, plots
        from distributed_onnx.evaluation.scoring.leaderboard import leaderboard

        plots.warm_up()
        request = pickle.load(sys.stdin.buffer)
        output, summary, run_wide, quantiles, fans, series, scores, step_us, metrics = request
        from distributed_onnx import storage
        from distributed_onnx.evaluation.outputs import LEADERBOARD
        from distributed_onnx.evaluation.scoring.registry import register

        for metric in metrics:
            register(metric)

        table = leaderboard(scores, step_us)
        storage.write_parquet(storage.join(output, LEADERBOARD), table)
        summary["timing"]["report_drawn_by"] = "report process"
        page.write_report(
            output, summary, run_wide, quantiles, fans, table, series, pair_scores=scores, step_us=step_us
        )
        answer: tuple[bool, Any] = (True, (table, time.process_time()))
    except BaseException as exc:  # reported to the driver, which draws the report itself
        answer = (False, f"{type(exc).__name__}: {exc}")
    pickle.dump(answer, answer_to, protocol=5)
    answer_to.flush()


if __name__ == "__main__":
    _serve()
