"""Where the driver's CPU goes during the dispatch phase of one CLI run: by thread, and by function.

Runs ``distributed-onnx backtest`` in this process (the same flags as ``driver_cost.py``: 2 actors x 1 CPU, the
reference checkpoint, 50 series x 3,000 windows) with the run's phase clock wrapped: when the phase
``series_and_pool`` ends (the dispatch begins) and when ``dispatch`` ends, it reads every thread's CPU from
``/proc/self/task/*/stat`` (Ray's C++ threads, the Python threads by name), and between the two marks the main
thread runs under ``cProfile`` with a CPU-time clock (``time.thread_time``): the dispatch loop's own work by
function. The profile's overhead is charged to the main thread; compare functions, not the total.

Reproduce::

    .venv-cli/bin/python -P benchmarks/dispatch_profile.py --tree . --output /tmp/dispatch-profile

Writes ``profile.json`` (threads, phases, the top functions) and ``dispatch.pstats`` in ``--output``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, keyed ``tid:name`` (Python threads by their own name)."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    result = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        name = names.get(int(tid), comm)
        result[f"{tid}:{name}"] = (int(fields[11]) + int(fields[12])) * TICK_S
    return result


def _marking(original: Any, record: dict[str, Any], out: Path, *, cprofile: bool) -> Any:
    """``PhaseClock.mark`` that also reads the threads' CPU (and profiles the main thread) over the dispatch."""
    profile = cProfile.Profile(time.thread_time)
    marks: dict[str, tuple[float, float, dict[str, float]]] = {}

    def mark(self: Any, phase: str) -> None:
        original(self, phase)
        if phase == "series_and_pool":
            marks["start"] = (time.perf_counter(), time.thread_time(), thread_cpu())
            if cprofile:
                profile.enable()
        elif phase == "dispatch":
            profile.disable()
            end = (time.perf_counter(), time.thread_time(), thread_cpu())
            start = marks["start"]
            record["dispatch_wall_s"] = end[0] - start[0]
            record["main_thread_cpu_s"] = end[1] - start[1]
            spent = {name: cpu - start[2].get(name, 0.0) for name, cpu in end[2].items()}
            record["threads_cpu_s"] = {
                name: round(cpu, 3) for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1]) if cpu > 0
            }
            record["phases_cpu_s"] = dict(self.cpu_s)
            if cprofile:
                profile.dump_stats(out / "dispatch.pstats")
                for order in ("tottime", "cumulative"):
                    text = io.StringIO()
                    pstats.Stats(profile, stream=text).sort_stats(order).print_stats(40)
                    record[f"top_{order}"] = text.getvalue().splitlines()
            (out / "profile.json").write_text(json.dumps(record, indent=2))

    return mark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="the tree whose package runs (first on sys.path)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--windows", type=int, default=150_000)
    parser.add_argument("--no-cprofile", action="store_true", help="threads only (no profiler's overhead)")
    args = parser.parse_args()
    tree = Path(args.tree).resolve()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(tree))
    os.environ["PYTHONPATH"] = str(tree)  # Ray's workers import the same tree
    sys.path.insert(1, str(Path(__file__).resolve().parent))
    from backtest_bench import make_dataset, two_actor_arguments

    from distributed_onnx.evaluation.driver import clock
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    data = out / "data.parquet"
    _, per_series = make_dataset(data, args.windows, 50)
    record: dict[str, Any] = {"tree": str(tree), "load_average_before": os.getloadavg()}
    clock.PhaseClock.mark = _marking(clock.PhaseClock.mark, record, out, cprofile=not args.no_cprofile)  # type: ignore[method-assign]
    arguments = two_actor_arguments(str(REFERENCE_CHECKPOINT), str(data), per_series, 256)
    sys.argv = ["distributed-onnx", "backtest", "--output", str(out / "run"), "--no-progress", *arguments]
    from distributed_onnx.cli import main as cli_main

    code = cli_main()
    summary = json.loads((out / "run" / "summary.json").read_text())
    record["summary_timing"] = summary["timing"]
    record["parts"] = summary["parts"]
    record["load_average_after"] = os.getloadavg()
    (out / "profile.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if not k.startswith("top_")}, indent=2))
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
