"""report.html and leaderboard.parquet drawn by a helper process, so the driver's CPU stays on its parts.

The end of a run imports scipy (the leaderboard) and matplotlib (the report) and draws the fans: about 1.8 s
of CPU, more than everything else the driver does in a 150,000-window run once its dispatch costs per part
(``benchmarks/results/driver_cost.md``). A driver that feeds a large cluster should not spend it, and the
user should not wait for it either. So the run starts a plain Python child (:class:`ReportProcess`) as the
dispatch nears its end (:data:`REPORT_LEAD_S`), or at once for a rerun with nothing left to compute: it imports
the report's modules and warms matplotlib up while the last parts run (or while the driver merges), then
waits. At the end the driver sends it what the page
shows (the summary, the run-wide metrics, the fans, the per-series sums), and the child writes the leaderboard
and the report and answers with the leaderboard, what it says beyond its rows (:mod:`..scoring.findings`, read
once there: the page draws it, the driver records it) and its CPU seconds.

One child per driver process, not per run: a process that runs several backtests (``distributed-onnx fev``,
a notebook calling :func:`~distributed_onnx.run_backtest` in a loop) keeps the child its first run started,
warm, for the next (:func:`warm_report_process`, :meth:`ReportProcess.release`), so only the first run pays its
imports; it ends when the driver exits (its standard input closes). A child that failed, died or took too long
is stopped, never kept.

Not a Ray worker (a cold worker importing the package after the last part cost seconds of wall time,
measured), and not ``multiprocessing`` (the command runs as ``python -m distributed_onnx``, whose main module
a spawned child would run again). Best effort: whatever goes wrong with the child, the driver draws both
itself, as before (:meth:`ReportProcess.draw` returns None).
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ReportProcess", "ReportRequest", "close_kept_report_process", "warm_report_process"]

#: The longest the driver waits for the child's report before drawing it itself.
DRAW_TIMEOUT_S = 600.0
#: The run starts the child when its dispatch has about this many seconds left at its pace so far (or at once,
#: when there is nothing to compute): about what the child's imports and warm-up take on a small machine
#: (``benchmarks/results/time_to_results.md``). Started with the dispatch, they took a core from the actors for
#: the whole of a long run; started after it, the user waited for them.
REPORT_LEAD_S = 2.0

ReportRequest = tuple[Any, ...]
"""``(output, summary, run_wide, quantiles, fans, series, scores, step_us, realized, metrics)``: what the child draws
from (``realized``: whether the run has realized twins, whose gaps the leaderboard's findings read);
``metrics`` are those the driver registered (:func:`~..scoring.registry.added`), registered in the child too, so
its leaderboard and report hold every metric the driver's would."""


class ReportProcess:
    """A child process that has imported the report's modules and draws reports when asked, one at a time."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        # -P: the driver's own modules (its sys.path above), never a `distributed_onnx` folder in the working
        # directory, which `-m` would put first: such a child failed on the driver's requests, and the driver drew
        # every report itself, unseen (found running one checkout's command from another's folder).
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-m", "distributed_onnx.evaluation.driver.report_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._healthy = True  # False once a request failed or timed out: such a child is stopped, not kept

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    def alive(self) -> bool:
        return self._healthy and self._process.poll() is None

    def draw(
        self, request: ReportRequest, timeout_s: float = DRAW_TIMEOUT_S, meanwhile: Callable[[], None] | None = None
    ) -> tuple[Any, Any, float] | None:
        """Send the request; ``(leaderboard, its findings, the child's CPU seconds for it)`` once both files are
        written, else None
        (the child failed, died or took too long: it is stopped, and the caller draws them). The CPU seconds
        include the child's imports when this is its first request.

        ``meanwhile``: the driver's own work while the child draws (``metrics.parquet``), run on the calling
        thread once the request is on its way; what it raises is raised here, the child stopped (never kept)."""
        answer: list[tuple[bool, Any]] = []

        def exchange() -> None:
            try:
                assert self._process.stdin is not None and self._process.stdout is not None
                pickle.dump(request, self._process.stdin, protocol=5)
                self._process.stdin.flush()
                answer.append(pickle.load(self._process.stdout))
            except Exception as exc:  # a dead child: the driver draws the report itself
                answer.append((False, f"{type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=exchange, name="report-process", daemon=True)
        thread.start()
        started = time.monotonic()
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                self._healthy = False
                self._process.kill()
                self._process.wait()
                raise
        thread.join(max(timeout_s - (time.monotonic() - started), 0.0))
        ok, value = answer[0] if answer else (False, f"no answer within {timeout_s:.0f} s")
        value = value if ok else str(value)
        if not ok:
            self._healthy = False
            self.close()
            logger.warning("The report process could not draw the report (%s); the driver draws it", value)
            return None
        leaderboard, findings, cpu_s = tuple(value)
        return leaderboard, findings, float(cpu_s)

    def release(self) -> None:
        """The run is done with the child: kept warm for the process's next run if it is well, else stopped."""
        global _kept
        if not self.alive():
            self.close()
            return
        with _kept_lock:
            earlier, _kept = _kept, self
        if earlier is not None and earlier is not self:
            earlier.close()

    def close(self) -> None:
        """Stop the child: its standard input closes and it exits; a stuck one is killed."""
        if self._process.poll() is None:
            try:
                if self._process.stdin is not None and not self._process.stdin.closed:
                    self._process.stdin.close()  # the child reads the end and exits
                self._process.wait(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                self._process.kill()
                self._process.wait()


#: The child a finished run left warm for the process's next run (:meth:`ReportProcess.release`).
_kept: ReportProcess | None = None
_kept_lock = threading.Lock()


def warm_report_process() -> ReportProcess:
    """The child an earlier run of this process left warm (its imports done), else a new one."""
    global _kept
    with _kept_lock:
        child, _kept = _kept, None
    if child is not None and child.alive():
        return child
    if child is not None:
        child.close()
    return ReportProcess()


@atexit.register
def close_kept_report_process() -> None:
    """Stop the kept child (at the driver's exit; a test that needs a fresh one calls it too)."""
    global _kept
    with _kept_lock:
        child, _kept = _kept, None
    if child is not None:
        child.close()


def _serve() -> None:
    """The child: import and warm up, then draw each request read from stdin until it closes; each answer goes to
    stdout, with the CPU seconds it took (the imports counted in the first)."""
    answer_to = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but the answers on the pipe
    try:  # while the run's last parts run: the imports and matplotlib's first figure
        from distributed_onnx.evaluation.report import plots

        plots.warm_up()
    except BaseException:  # the first request meets the same failure and reports it
        pass
    started_cpu_s = 0.0  # the first answer counts the imports
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:  # the driver closed our input: it is done with us, or gone
            return
        except BaseException as exc:  # a torn request: answered, then the driver stops us
            answer: tuple[bool, Any] = (False, f"{type(exc).__name__}: {exc}")
        else:
            answer = _draw(request, started_cpu_s)
        started_cpu_s = time.process_time()
        pickle.dump(answer, answer_to, protocol=5)
        answer_to.flush()


def _draw(request: ReportRequest, started_cpu_s: float) -> tuple[bool, Any]:
    """One request's leaderboard, its findings and report, and the CPU seconds since ``started_cpu_s``."""
    try:
        from distributed_onnx.evaluation.outputs import RunFolder
        from distributed_onnx.evaluation.report.page import draw_report
        from distributed_onnx.evaluation.report.page_values import report_values
        from distributed_onnx.evaluation.scoring import registry
        from distributed_onnx.evaluation.scoring.findings import leaderboard_findings
        from distributed_onnx.evaluation.scoring.leaderboard import leaderboard

        output, summary, run_wide, quantiles, fans, series, scores, step_us, realized, metrics = request
        for metric in registry.added():  # a run's metrics are its own: an earlier run's are not drawn again
            registry.unregister(metric.name)
        for metric in metrics:
            registry.register(metric)

        table = leaderboard(scores, step_us)
        stage_s = summary["timing"].get("actor_stage_s")
        findings = leaderboard_findings(table, summary.get("models") or {}, stage_s, realized)
        RunFolder(output).write_leaderboard(table)
        summary["timing"]["report_drawn_by"] = "report process"
        values = report_values(
            summary, run_wide, quantiles, fans, table, series, pair_scores=scores, step_us=step_us, findings=findings
        )
        draw_report(output, values)  # from the values only: computed first, every one once
        return True, (table, findings, time.process_time() - started_cpu_s)
    except BaseException as exc:  # reported to the driver, which draws the report itself
        return False, f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    _serve()
