"""Backtest throughput and driver cost, side by side in one run: the CLI on 2 actors vs plain loops vs Ray Data.

Every mode does the same work on the same windows: pack each model batch into Arrow, forecast with the same
model, threads and batch size, build the forecast table, write one Parquet part per unit, score the model and
the seasonal-naive baseline. The plain loops run the actors' own part runner in one process, with no Ray
(1 and 2 ORT threads); the CLI mode is ``distributed-onnx backtest`` itself, a subprocess measured from the
outside (whole process) and from its own ``summary.json`` (dispatch phase, driver CPU by ``getrusage``, driver
peak RSS); Ray Data's ``map_batches`` packs and forecasts in an actor pool of 2 and writes from the driver.
Each mode runs in its own subprocess, so its peak RSS is its own.

Reproduce (about 10 minutes on a 2-core machine)::

    make bench-backtest          # = .venv/bin/python benchmarks/backtest_bench.py

Results go to benchmarks/results/backtest.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The CLI mode runs the command as `make backtest` installs it: `.[cpu]` only, in a venv of its own. (With
#: pandas installed, as in the dev venv, pyarrow imports it at the first Arrow -> numpy conversion: 0.3 s more
#: of the driver's CPU, measured; the other modes do not measure the driver's CPU.)
CLI_VENV = ROOT / ".venv-cli"
CLI = str(CLI_VENV / "bin" / "distributed-onnx")
ROWS_PER_BATCH = 256


def make_dataset(path: Path, n_windows: int, n_series: int) -> tuple[int, int]:
    """``n_series`` copies of the bundled Taylor series (scaled, with noise); returns (series, windows per series)."""
    from distributed_onnx.resources import REFERENCE_DATASET

    base = pq.read_table(REFERENCE_DATASET)
    y = base.column("y").to_numpy()
    rng = np.random.default_rng(0)
    tables = []
    for index in range(n_series):
        noisy = y * rng.uniform(0.5, 1.5) + rng.normal(0, 200, size=y.shape)
        tables.append(
            pa.table(
                {
                    "series_id": pa.array([f"s{index:04d}"] * len(y)),
                    "timestamp": base.column("timestamp"),
                    "y": pa.array(noisy),
                }
            )
        )
    pq.write_table(pa.concat_tables(tables), path)
    return n_series, -(-n_windows // n_series)


def settings_for(args: argparse.Namespace, output: Path) -> Any:
    from distributed_onnx.evaluation.settings import BacktestSettings

    return BacktestSettings(
        checkpoint=Path(args.checkpoint),
        data=Path(args.data),
        output=output,
        n_windows=args.n_windows_per_series,
        rows_per_batch=ROWS_PER_BATCH,
        actors=2,
        cpus_per_actor=1,
        progress=False,
    )


def run_loop(args: argparse.Namespace, output: Path, threads: int) -> dict[str, Any]:
    """The plain single-process loop: the actors' own part runner over every part, no Ray."""
    from distributed_onnx.evaluation import run_manifest
    from distributed_onnx.evaluation.actor.part import PartRunner
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.model.backend.providers import SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    started = time.perf_counter()
    plan = prepare(settings_for(args, output))
    options = SessionOptionsConfig(intra_op_num_threads=threads, allow_spinning=False)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=plan.checkpoint.weights_path, session_options=options))
    worker.warm_up()
    run_manifest.prepare_output(output, plan.run_fingerprint, {})
    runner = PartRunner(worker, plan.job(SeriesStore.from_table(plan.table)))
    loop_started = time.perf_counter()
    first = None
    windows = 0
    stage_s: dict[str, float] = {}
    for part in plan.parts():
        receipt = runner.run(part)
        windows += receipt.windows
        for stage, seconds in receipt.seconds.items():
            stage_s[stage] = stage_s.get(stage, 0.0) + seconds
        first = first or time.perf_counter() - started
    elapsed = time.perf_counter() - loop_started
    return {
        "windows": windows,
        "seconds": elapsed,
        "stage_s": {stage: round(seconds, 3) for stage, seconds in stage_s.items()},
        "windows_per_s": windows / elapsed,
        "first_forecast_s": first,
        "process_s": time.perf_counter() - started,
    }


def two_actor_arguments(checkpoint: str, data: str, n_windows: int, rows_per_batch: int) -> list[str]:
    """The backtest flags every whole-process comparison gives the command: 2 actors of 1 CPU each."""
    return [
        "--checkpoint",
        checkpoint,
        "--data",
        data,
        "--n-windows",
        str(n_windows),
        "--rows-per-batch",
        str(rows_per_batch),
        "--actors",
        "2",
        "--cpus-per-actor",
        "1",
    ]


def run_cli(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """``distributed-onnx backtest`` as a user runs it: a whole process, an embedded Ray, 2 actors."""
    command = [
        CLI,
        "backtest",
        "--output",
        str(output),
        *two_actor_arguments(args.checkpoint, args.data, args.n_windows_per_series, ROWS_PER_BATCH),
        "--no-progress",
    ]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False)
    process_s = time.perf_counter() - started
    if completed.returncode != 0:
        return {"error": completed.stderr[-2000:]}
    summary = json.loads((output / "summary.json").read_text())
    timing, windows = summary["timing"], summary["windows"]["run_now"]
    return {
        "windows": windows,
        "seconds": timing["dispatch_s"],
        "windows_per_s": timing["windows_per_s"],
        "process_s": process_s,
        "process_windows_per_s": windows / process_s,
        "first_forecast_s": timing["first_forecast_s"],
        "driver_cpu_s": timing["driver_cpu_s"],
        "driver_cpu_us_per_window": 1e6 * timing["driver_cpu_s"] / windows,
        "driver_cpu_dispatch_s": timing["driver_cpu_dispatch_s"],
        "driver_cpu_dispatch_us_per_window": timing["driver_cpu_dispatch_us_per_window"],
        "peak_rss_mb": timing["driver_peak_rss_mb"],
        "parts": summary["parts"]["planned"],
        "descriptor_bytes": summary["transport"]["descriptor_bytes"],
        "receipt_bytes": summary["transport"]["receipt_bytes"],
        "series_bytes": summary["transport"]["series_bytes"],
        "actor_stage_s": timing["actor_stage_s"],
    }


def run_ray_data(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """Ray Data ``map_batches`` with an actor pool of 2 (1 CPU, 1 ORT thread each), same batch size."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    from distributed_onnx.evaluation import outputs, run_manifest
    from distributed_onnx.evaluation.data.packing import pack_batch
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.evaluation.data.windows import PlannedBatch, batches, plan_series
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.runtime.local_ray import connect

    started = time.perf_counter()
    plan = prepare(settings_for(args, output))
    connect(None)
    run_manifest.prepare_output(output, plan.run_fingerprint, {})
    checkpoint = str(plan.checkpoint.weights_path)
    spec, quantiles, step_us, fingerprint = plan.spec, plan.quantiles, plan.step_us, plan.window_fingerprint
    store_ref = ray.put(SeriesStore.from_table(plan.table))

    class Forecaster:
        def __init__(self) -> None:
            from distributed_onnx.model.backend.providers import SessionOptionsConfig
            from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

            options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
            self.worker = InferenceWorker.from_config(
                WorkerConfig(checkpoint=Path(checkpoint), session_options=options)
            )

        def __call__(self, batch: pa.Table) -> pa.Table:
            record = batch.combine_chunks().to_batches()[0]
            forecasts = self.worker.forecast_batch(record, spec.context_length, spec.horizon, quantiles)
            return outputs.forecast_table(record, forecasts, quantiles, step_us)

    def pack(rows: dict[str, np.ndarray]) -> pa.Table:
        # Each row describes one model batch (its windows' series and origins); packing happens in the pool.
        store = ray.get(store_ref)
        planned = PlannedBatch(int(rows["index"][0]), rows["series"][0], rows["origins"][0])
        return pa.Table.from_batches([pack_batch(store, planned, spec.context_length, spec.horizon, fingerprint)])

    segments = [(i, plan_series(series, spec).origins) for i, series in enumerate(plan.table.series)]
    described = [
        {"index": number, "series": batch.series_index, "origins": batch.origin_index}
        for number, batch in enumerate(batches(segments, ROWS_PER_BATCH))
    ]
    dataset = (
        # from_items: the descriptions live in the object store, so no read task competes with the actor pool
        # for the two CPUs (with ray.data.range, its read task waited forever for a CPU the pool held).
        ray.data.from_items(described, override_num_blocks=len(described))
        .map_batches(pack, batch_size=1, batch_format="numpy")
        .map_batches(
            Forecaster,
            batch_size=ROWS_PER_BATCH,
            batch_format="pyarrow",
            compute=ActorPoolStrategy(size=2),
            num_cpus=1,
        )
    )
    loop_started = time.perf_counter()
    first = None
    first_at = loop_started
    first_windows = 0
    windows = 0
    for index, table in enumerate(dataset.iter_batches(batch_size=None, batch_format="pyarrow")):
        outputs.write_part(output, "ray_data", index, table, {"part": index})
        windows += table.num_rows // spec.horizon
        if first is None:
            first, first_at, first_windows = time.perf_counter() - started, time.perf_counter(), windows
    finished = time.perf_counter()
    ray.shutdown()
    after_first = finished - first_at
    streamed = first_windows < windows / 2 and after_first > 0
    return {
        "windows": windows,
        "seconds": finished - loop_started,
        "windows_per_s": windows / (finished - loop_started),
        "windows_per_s_after_first_result": (windows - first_windows) / after_first if streamed else None,
        "first_forecast_s": first,
        "process_s": finished - started,
    }


MODES = {
    "loop_1_thread": lambda a, o: run_loop(a, o, 1),
    "loop_2_threads": lambda a, o: run_loop(a, o, 2),
    "cli_2_actors": run_cli,
    "ray_data_map_batches": run_ray_data,
}
#: (model, approximate windows, modes): the throughput comparison, then the driver's memory at 10x the windows.
#: (model, windows, series, modes): the throughput comparison; then the driver's memory for 10x the windows
#: over the same series (334 Taylor copies: 300 and then 3,000 windows each), so only the windows grow.
SCENARIOS = [
    ("reference", 150_000, 50, ["loop_1_thread", "loop_2_threads", "cli_2_actors", "ray_data_map_batches"]),
    ("tiny", 150_000, 50, ["loop_1_thread", "cli_2_actors", "ray_data_map_batches"]),
    ("tiny", 100_000, 334, ["cli_2_actors"]),
    ("tiny", 1_000_000, 334, ["cli_2_actors"]),
]


def ensure_cli_venv() -> None:
    """Create ``.venv-cli`` with the main job's install (``pip install -e '.[cpu]'``) unless it is there."""
    if Path(CLI).exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(CLI_VENV)], check=True)
    subprocess.run([str(CLI_VENV / "bin" / "pip"), "install", "-q", "-e", f"{ROOT}[cpu]"], check=True)


def child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = MODES[args.mode](args, Path(tmp) / "run")
    result.setdefault("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("RESULT " + json.dumps(result))


def run_mode(mode: str, data: Path, checkpoint: str, n_windows_per_series: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--mode", mode, "--data", str(data), "--checkpoint", checkpoint]
    command += ["--n-windows-per-series", str(n_windows_per_series)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=ROOT, check=False)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line.removeprefix("RESULT ")))
    return {"error": completed.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's windows (quick runs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--n-windows-per-series", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "rows_per_batch": ROWS_PER_BATCH,
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(ROOT / "tests"))
        from graphs import write_tiny_chronos2

        models = {
            "reference": str(REFERENCE_CHECKPOINT),
            "tiny": str(write_tiny_chronos2(Path(tmp), context_length=16, output_patch_size=4).weights_path),
        }
        ensure_cli_venv()
        for model, planned_size, series, modes in SCENARIOS:
            size = int(planned_size * args.scale)
            data = Path(tmp) / f"data_{size}_{series}.parquet"
            n_series, per_series = make_dataset(data, size, series)
            runs = {}
            for mode in modes:
                runs[mode] = run_mode(mode, data, models[model], per_series)
                print(f"{model} {size} {mode}: {runs[mode]}", flush=True)
            report["runs"].append({"model": model, "windows": per_series * n_series, "series": n_series, "modes": runs})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "backtest.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "backtest.md").write_text(render(report))


def _fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render(report: dict[str, Any]) -> str:
    lines = [
        "# Backtest throughput and driver cost",
        "",
        "Reproduce: `make bench-backtest` (`.venv/bin/python benchmarks/backtest_bench.py`). "
        f"Machine: {report['machine']['cpus']} CPUs, {report['machine']['platform']}; "
        f"rows per batch {report['rows_per_batch']}; the CLI runs 2 actors x 1 CPU x 1 ORT thread.",
        "",
        "| model | windows | mode | windows/s | vs loop 1t | whole process windows/s | vs loop 1t "
        "| first forecast s | driver CPU us/window (dispatch) | driver peak RSS MB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in report["runs"]:
        modes = entry["modes"]
        base = modes.get("loop_1_thread", {}).get("windows_per_s")
        for mode, result in modes.items():
            if "error" in result:
                lines.append(f"| {entry['model']} | {entry['windows']} | {mode} | error | | | | | | |")
                continue
            rate = result["windows_per_s"]
            whole = result.get("process_windows_per_s")
            cpu = result.get("driver_cpu_us_per_window")
            dispatch_cpu = result.get("driver_cpu_dispatch_us_per_window")
            lines.append(
                f"| {entry['model']} | {entry['windows']:,} | {mode} | {rate:,.0f} | "
                f"{_fmt(rate / base if base else None, '.2f', 'x')} | {_fmt(whole)} | "
                f"{_fmt(whole / base if whole and base else None, '.2f', 'x')} | {result['first_forecast_s']:.1f} | "
                f"{_fmt(cpu, '.1f')} ({_fmt(dispatch_cpu, '.2f')}) | {result['peak_rss_mb']:.0f} |"
            )
    tiny = {
        entry["windows"]: entry["modes"].get("cli_2_actors", {}) for entry in report["runs"] if entry["model"] == "tiny"
    }
    sizes = sorted(size for size, result in tiny.items() if "peak_rss_mb" in result)
    if len(sizes) >= 2:
        low, high = tiny[sizes[0]], tiny[sizes[-1]]
        lines += [
            "",
            f"Driver peak RSS from {sizes[0]:,} to {sizes[-1]:,} windows (tiny model, CLI): "
            f"{low['peak_rss_mb']:.0f} -> {high['peak_rss_mb']:.0f} MB "
            f"({high['peak_rss_mb'] / low['peak_rss_mb']:.2f}x).",
        ]
    cli = [
        entry["modes"]["cli_2_actors"]
        for entry in report["runs"]
        if "descriptor_bytes" in entry["modes"].get("cli_2_actors", {})
    ]
    if cli:
        lines.append(
            f"Per unit of work the driver sends {max(c['descriptor_bytes'] for c in cli)} bytes (a part descriptor) "
            f"and receives a receipt of at most {max(c['receipt_bytes'] for c in cli)} bytes; the series go to the "
            "object store once per run."
        )
    lines += [
        "",
        "- Same work in every mode: pack, forecast, forecast table, one Parquet part per unit of work; the loops and",
        "  the CLI's actors also score every part into mergeable sums (Ray Data's pipeline does not score).",
        "- *windows/s* counts the work phase: the loops from their first part to the last; the CLI its dispatch phase",
        "  (first part sent to last receipt, its summary.json's windows_per_s); Ray Data from its first request to",
        "  the last part written, its lazy actor start included. *whole process* is the wall time of the process,",
        "  Python start, Ray start-up, actor warm-up, metrics and report included.",
        "- *driver CPU* is `getrusage(RUSAGE_SELF)` of the CLI's driver process (user + system, all its threads):",
        "  over the whole run, and in brackets during the dispatch phase alone; per window computed. The CLI runs",
        "  as `make backtest` installs it (`.[cpu]` in `.venv-cli`); its report is drawn by a Ray worker (its CPU",
        "  is summary.json's `timing.report_cpu_s`, not the driver's). With pandas installed, pyarrow imports it at",
        "  the first Arrow -> numpy conversion: 0.3 s more driver CPU (measured).",
        "- *first forecast* is from the start of the mode's process, Ray start-up and actor warm-up included.",
        "- *peak RSS* is the driver process's (ru_maxrss); the actors' memory is not included. The 100k and 1M runs",
        "  use the same 334 series (300 and 3,000 windows each), so only the number of windows grows.",
        "- `tiny` is a 16-step-context graph (tests/graphs.py): inference costs nothing, so it measures each mode's",
        "  overhead. The machine has 2 cores shared by the driver, the actors and Ray's own processes.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
