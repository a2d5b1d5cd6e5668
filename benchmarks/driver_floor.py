"""The CPU a Ray driver spends per second of wall time when it does (almost) nothing: the floor of the dispatch phase.

The backtest's dispatch phase does nothing per window in the driver (``driver_cost.md``), so its CPU is this
floor times the phase's wall time, plus a few ms per part. Each configuration starts a fresh embedded Ray (2 CPUs,
loopback, no dashboard) and 2 one-CPU actors, waits 3 s, then for ``--seconds`` either sleeps (``idle``) or runs
a dispatch-like loop (``parts``: each actor always has a 1.3 s task, the driver waits with ``ray.wait(timeout=10)``
and submits the next, about what a 150,000-window run does per part). The driver's CPU is read per thread from
``/proc/self/task`` (10 ms ticks), so each figure is milliseconds of CPU per second of wall time.

Reproduce::

    .venv/bin/python benchmarks/driver_floor.py --rounds 2 --seconds 40

Results go to benchmarks/results/driver_floor.json (``driver_cost.md`` reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: (name, environment, log_to_driver): Ray reads ``RAY_<setting>`` in every process it starts.
CONFIGURATIONS = [
    ("ray defaults", {}, True),
    ("no task events", {"RAY_task_events_report_interval_ms": "0"}, True),
    ("no task events, no log streaming", {"RAY_task_events_report_interval_ms": "0"}, False),
]


def threads_cpu_s() -> Counter[str]:
    """This process's CPU seconds by thread name."""
    ticks = os.sysconf("SC_CLK_TCK")
    by_name: Counter[str] = Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        by_name[name] += (int(fields[11]) + int(fields[12])) / ticks
    return by_name


def child(mode: str, seconds: float, log_to_driver: bool) -> None:
    """One driver: Ray up, 2 actors, then ``seconds`` of ``mode``; prints its CPU per second of wall time."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=log_to_driver)

    @ray.remote(num_cpus=1)
    class Sleeper:
        def work(self, seconds: float) -> bytes:
            time.sleep(seconds)
            return b"x" * 1000

    actors = [Sleeper.remote() for _ in range(2)]  # type: ignore[attr-defined]
    ray.get([actor.work.remote(0) for actor in actors])
    time.sleep(3)
    before, started = threads_cpu_s(), time.monotonic()
    if mode == "idle":
        time.sleep(seconds)
    else:
        pending = {actor.work.remote(1.3): actor for actor in actors}
        while time.monotonic() - started < seconds:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=10)
            for ref in ready:
                actor = pending.pop(ref)
                ray.get(ref)
                pending[actor.work.remote(1.3)] = actor
    wall_s = time.monotonic() - started
    after = threads_cpu_s()
    by_thread = {name: round(1000 * (after[name] - before.get(name, 0.0)) / wall_s, 2) for name in after}
    total = round(sum(by_thread.values()), 2)
    print("RESULT " + json.dumps({"ms_per_s": total, "by_thread": {k: v for k, v in by_thread.items() if v > 0}}))
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "LOG_TO_DRIVER"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.seconds, args.child[1] == "1")
        return
    runs = []
    with tempfile.TemporaryDirectory() as neutral:  # no stray module of the working directory shadows Ray's
        for round_ in range(args.rounds):
            for mode in ("idle", "parts"):
                for name, environment, log_to_driver in CONFIGURATIONS:
                    command = [sys.executable, "-P", __file__, "--seconds", str(args.seconds)]
                    command += ["--child", mode, "1" if log_to_driver else "0"]
                    done = subprocess.run(
                        command,
                        check=False,
                        env={**os.environ, **environment},
                        cwd=neutral,
                        capture_output=True,
                        text=True,
                    )
                    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
                    result = json.loads(line[7:]) if line else {"error": done.stderr[-1500:]}
                    runs.append({"round": round_, "mode": mode, "configuration": name, **result})
                    runs[-1]["load_average"] = os.getloadavg()
                    print(json.dumps(runs[-1]), flush=True)
    done = [run for run in runs if "ms_per_s" in run]
    summary = {
        f"{mode}: {name}": statistics.median(
            run["ms_per_s"] for run in done if run["mode"] == mode and run["configuration"] == name
        )
        for mode in ("idle", "parts")
        for name, _, _ in CONFIGURATIONS
    }
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "seconds": args.seconds,
        "summary_ms_per_s_median": summary,
        "runs": runs,
    }
    (RESULTS / "driver_floor.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
