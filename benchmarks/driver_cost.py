"""The driver's own CPU over a whole 150,000-window CLI run, this tree against another, alternating rounds.

Each round runs ``distributed-onnx backtest`` (2 actors x 1 CPU, reference checkpoint, 50 series x 3,000
windows: ``backtest_bench.make_dataset``) once from each tree, in alternating order, on a fresh output
directory. The driver's CPU is read from ``/proc/<pid>/stat`` from outside (``process_cpu.py``, every 0.5 s
and at the end), and each phase's from the driver's own ``summary.json`` (``timing.driver_cpu_phases_s``,
``getrusage``). The trees run from the ``.[cpu]`` venv (``.venv-cli``, no pandas), each first on PYTHONPATH
(``python -P -m distributed_onnx``), so the driver and Ray's workers import that tree's package.

Reproduce::

    .venv/bin/python benchmarks/driver_cost.py --baseline-tree ../wt-base [--this-tree COPY] --rounds 3

Results go to benchmarks/results/driver_cost.{json,md}; say in them whether the machine was shared.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path[:0] = [str(ROOT / "benchmarks")]

from backtest_bench import CLI, ensure_cli_venv, make_dataset, two_actor_arguments  # noqa: E402
from process_cpu import ProcessTreeCpu  # noqa: E402

CLI_PYTHON = str(Path(CLI).parent / "python")
SERIES = 50
#: Ray's node start gives up after a fixed 30 s; on a machine loaded by others a run is started again.
RAY_START_TIMED_OUT = "timed out during startup"
STARTS = 3
ROWS_PER_BATCH = 256


def one_run(tree: Path, data: Path, windows_per_series: int, output: Path, extra: list[str]) -> dict[str, Any]:
    """One CLI run from ``tree``: the driver's CPU from /proc, and summary.json's phases."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    arguments = two_actor_arguments(str(REFERENCE_CHECKPOINT), str(data), windows_per_series, ROWS_PER_BATCH)
    command = [CLI_PYTHON, "-P", "-m", "distributed_onnx", "backtest", "--output", str(output), "--no-progress"]
    command += [*arguments, *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load_before = os.getloadavg()
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree, env=env)
    sampler = ProcessTreeCpu(process.pid, interval_s=0.5)
    _, stderr = process.communicate(timeout=3600)
    wall_s = time.perf_counter() - started
    sampler.stop()
    if process.returncode != 0:
        return {"error": stderr[-2000:]}
    cpu = sampler.result()
    cpu.pop("timeline")
    summary = json.loads((output / "summary.json").read_text())
    timing, windows = summary["timing"], summary["windows"]["run_now"]
    phases = timing["driver_cpu_phases_s"]
    driver_proc_s = cpu["cpu_s_by_role"].get("driver")
    return {
        "windows": windows,
        "parts": summary["parts"]["planned"],
        "process_s": round(wall_s, 2),
        "dispatch_s": round(timing["dispatch_s"], 2),
        "driver_cpu_proc_s": driver_proc_s,
        "driver_cpu_s": round(timing["driver_cpu_s"], 3),
        "driver_us_per_window": round(1e6 * timing["driver_cpu_s"] / windows, 2),
        "driver_proc_us_per_window": round(1e6 * driver_proc_s / windows, 2) if driver_proc_s else None,
        "dispatch_us_per_window": round(1e6 * phases.get("dispatch", 0.0) / windows, 2),
        "driver_cpu_phases_s": phases,
        "tree_cpu_s": cpu["tree_cpu_s"],
        "outside_tree_cpu_s": cpu["outside_tree_cpu_s"],
        "load_average": [load_before, os.getloadavg()],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", required=True, help="the other checkout (main at the branch point)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=150_000)
    parser.add_argument("--this-tree", default=str(ROOT), help="the tree measured against the baseline (a copy)")
    parser.add_argument("--name", default="driver_cost")
    parser.add_argument("--render", action="store_true", help="print the tables of the last results")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads((RESULTS / f"{args.name}.json").read_text())))
        return
    ensure_cli_venv()
    trees = {"baseline": Path(args.baseline_tree).resolve(), "this": Path(args.this_tree).resolve()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.parquet"
        _, per_series = make_dataset(data, args.windows, SERIES)
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                for attempt in range(STARTS):
                    output = Path(tmp) / f"{name}-{round_}-{attempt}"
                    result = one_run(trees[name], data, per_series, output, [])
                    if RAY_START_TIMED_OUT not in result.get("error", ""):
                        break  # a loaded machine can time Ray's 30 s start limit out: the run starts again
                result["starts"] = attempt + 1
                result["round"] = round_
                runs[name].append(result)
                print(name, json.dumps({k: v for k, v in result.items() if k != "driver_cpu_phases_s"}), flush=True)
                write_report(args, trees, runs)  # after every run: an interrupted benchmark keeps its rounds
    print(json.dumps(write_report(args, trees, runs), indent=2))


def write_report(args: argparse.Namespace, trees: dict[str, Path], runs: dict[str, list[dict[str, Any]]]) -> Any:
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        ok = [result for result in results if "error" not in result]
        if not ok:
            continue
        summary[name] = {
            key: spread([float(result[key]) for result in ok if result.get(key) is not None])
            for key in ("driver_proc_us_per_window", "driver_us_per_window", "dispatch_us_per_window", "process_s")
        }
        summary[name]["parts"] = ok[0]["parts"]
        phases = sorted({phase for result in ok for phase in result["driver_cpu_phases_s"]})
        summary[name]["phases_cpu_s"] = {
            phase: spread([result["driver_cpu_phases_s"].get(phase, 0.0) for result in ok]) for phase in phases
        }
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "windows": args.windows,
        "rounds": args.rounds,
        "baseline_tree": str(trees["baseline"]),
        "this_tree": str(trees["this"]),
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    return summary


def render(report: dict[str, Any]) -> str:
    """driver_cost.md's table: each tree's medians and ranges, and the rounds one by one."""
    summary, runs = report["summary"], report["runs"]
    rows = [
        ("driver CPU, whole run, us/window (/proc)", "driver_proc_us_per_window"),
        ("driver CPU, whole run, us/window (getrusage)", "driver_us_per_window"),
        ("driver CPU, dispatch phase, us/window", "dispatch_us_per_window"),
        ("whole process, s", "process_s"),
    ]
    lines = ["| | " + " | ".join(summary) + " |", "|---|" + "---:|" * len(summary)]
    for label, key in rows:
        cells = [f"{s[key]['median']:.2f} ({s[key]['min']:.2f}-{s[key]['max']:.2f})" for s in summary.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| parts | " + " | ".join(str(s["parts"]) for s in summary.values()) + " |")
    phases = sorted({phase for s in summary.values() for phase in s["phases_cpu_s"]})
    for phase in phases:
        cells = [
            f"{s['phases_cpu_s'][phase]['median']:.2f}" if phase in s["phases_cpu_s"] else "-" for s in summary.values()
        ]
        lines.append(f"| driver CPU in phase `{phase}`, s (median) | " + " | ".join(cells) + " |")
    lines += ["", "| round | tree | us/window (/proc) | dispatch us/window | process s | load average (1 min) |"]
    lines.append("|---:|---|---:|---:|---:|---:|")
    ordered = sorted((run["round"], name, run) for name, each in runs.items() for run in each if "error" not in run)
    for round_, name, run in ordered:
        load = run["load_average"][0][0]
        lines.append(
            f"| {round_} | {name} | {run['driver_proc_us_per_window']} | {run['dispatch_us_per_window']} | "
            f"{run['process_s']} | {load:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
