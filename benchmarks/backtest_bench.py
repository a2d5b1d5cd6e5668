"""Backtest throughput, side by side in one run: our dispatcher vs a single-process ORT loop vs Ray Data.

Every mode does the same work on the same windows: plan -> pack Arrow batches -> forecast with the same
model, threads and batch size -> build the forecast table -> write one Parquet part per batch. Each mode runs
in its own subprocess, so its peak RSS (the driver's, for the Ray modes) is its own.

Reproduce (about 10 minutes on a 2-core machine)::

    make bench-backtest          # = .venv/bin/python benchmarks/backtest_bench.py --sizes 20000 100000

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
WINDOWS_PER_SERIES = 3000


def make_dataset(path: Path, n_windows: int) -> int:
    """Copies of the bundled Taylor series (scaled, with noise) so the plan has ``n_windows`` windows."""
    from distributed_onnx.resources import REFERENCE_DATASET

    base = pq.read_table(REFERENCE_DATASET)
    y = base.column("y").to_numpy()
    rng = np.random.default_rng(0)
    n_series = -(-n_windows // WINDOWS_PER_SERIES)
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
    return n_series


def settings_for(args: argparse.Namespace, output: Path) -> Any:
    from distributed_onnx.backtest.settings import BacktestSettings

    return BacktestSettings(
        checkpoint=Path(args.checkpoint),
        data=Path(args.data),
        output=output,
        n_windows=args.n_windows_per_series,
        rows_per_batch=args.rows_per_batch,
        actors=2,
        cpus_per_actor=1,
        progress=False,
    )


def run_loop(args: argparse.Namespace, output: Path, threads: int) -> dict[str, Any]:
    """The plain single-process loop: the same packing, model call, table and writes, no Ray."""
    from distributed_onnx.backend.providers import SessionOptionsConfig
    from distributed_onnx.backtest import outputs
    from distributed_onnx.backtest.run import prepare
    from distributed_onnx.worker import InferenceWorker, WorkerConfig

    started = time.perf_counter()
    plan = prepare(settings_for(args, output))
    options = SessionOptionsConfig(intra_op_num_threads=threads, allow_spinning=False)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=plan.checkpoint.weights_path, session_options=options))
    worker.warm_up()
    (output / outputs.FORECASTS_DIR).mkdir(parents=True, exist_ok=True)
    loop_started = time.perf_counter()
    first = None
    windows = 0
    for planned in plan.batches():
        batch = plan.pack(planned)
        forecasts = worker.forecast_batch(batch, plan.spec.context_length, plan.spec.horizon, plan.quantiles)
        outputs.write_part(
            output, planned.index, outputs.forecast_table(batch, forecasts, plan.quantiles, plan.step_us)
        )
        windows += planned.n_windows
        first = first or time.perf_counter() - started
    elapsed = time.perf_counter() - loop_started
    return {"windows": windows, "seconds": elapsed, "windows_per_s": windows / elapsed, "first_forecast_s": first}


def run_dispatcher(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    from distributed_onnx.backtest.run import run_backtest

    result = run_backtest(settings_for(args, output))
    timing = result.summary["timing"]
    windows = result.summary["windows"]["run_now"]
    return {
        "windows": windows,
        "seconds": timing["dispatch_s"],
        "windows_per_s": timing["windows_per_s"],
        "first_forecast_s": timing["first_forecast_s"],
        "outside_dispatch_s": timing["total_s"] - timing["dispatch_s"],  # Ray + actors start/stop, scoring, report
    }


def run_ray_data(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """Ray Data ``map_batches`` with an actor pool of 2 (1 CPU, 1 ORT thread each), same batch size."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    from distributed_onnx.backtest import outputs
    from distributed_onnx.backtest.run import prepare
    from distributed_onnx.local_ray import connect

    started = time.perf_counter()
    plan = prepare(settings_for(args, output))
    connect(None)
    (output / outputs.FORECASTS_DIR).mkdir(parents=True, exist_ok=True)
    checkpoint = str(plan.checkpoint.weights_path)
    spec, quantiles, step_us = plan.spec, plan.quantiles, plan.step_us

    class Forecaster:
        def __init__(self) -> None:
            from distributed_onnx.backend.providers import SessionOptionsConfig
            from distributed_onnx.worker import InferenceWorker, WorkerConfig

            options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
            self.worker = InferenceWorker.from_config(
                WorkerConfig(checkpoint=Path(checkpoint), session_options=options)
            )

        def __call__(self, batch: pa.Table) -> pa.Table:
            record = batch.combine_chunks().to_batches()[0]
            forecasts = self.worker.forecast_batch(record, spec.context_length, spec.horizon, quantiles)
            return outputs.forecast_table(record, forecasts, quantiles, step_us)

    def pack(rows: dict[str, np.ndarray]) -> pa.Table:
        # Each row describes one planned batch (its windows' series and origins); packing happens in the pool.
        from distributed_onnx.windows import PlannedBatch

        planned = PlannedBatch(int(rows["index"][0]), rows["series"][0], rows["origins"][0])
        return pa.Table.from_batches([plan.pack(planned)])

    described = [
        {"index": batch.index, "series": batch.series_index, "origins": batch.origin_index} for batch in plan.batches()
    ]
    dataset = (
        # from_items: the descriptions live in the object store, so no read task competes with the actor pool
        # for the two CPUs (with ray.data.range, its read task waited forever for a CPU the pool held).
        ray.data.from_items(described, override_num_blocks=len(described))
        .map_batches(pack, batch_size=1, batch_format="numpy")
        .map_batches(
            Forecaster,
            batch_size=args.rows_per_batch,
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
        outputs.write_part(output, index, table)
        windows += table.num_rows // spec.horizon
        if first is None:
            first, first_at, first_windows = time.perf_counter() - started, time.perf_counter(), windows
    finished = time.perf_counter()
    ray.shutdown()
    # Ray Data starts its actor pool lazily, inside the first iteration, so its windows/s includes that start
    # (the dispatcher's excludes its own). Its rate after its first result is reported beside it, when its
    # results streamed (at 20k windows it delivered nearly everything in one burst: no rate to read).
    after_first = finished - first_at
    streamed = first_windows < windows / 2 and after_first > 0
    return {
        "windows": windows,
        "seconds": finished - loop_started,
        "windows_per_s": windows / (finished - loop_started),
        "windows_per_s_after_first_result": (windows - first_windows) / after_first if streamed else None,
        "first_forecast_s": first,
    }


MODES = {
    "loop_1_thread": lambda a, o: run_loop(a, o, 1),
    "loop_2_threads": lambda a, o: run_loop(a, o, 2),
    "dispatcher_2_actors": run_dispatcher,
    "ray_data_map_batches": run_ray_data,
}


def child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = MODES[args.mode](args, Path(tmp) / "run")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def run_mode(mode: str, data: Path, checkpoint: str, n_windows_per_series: int, rows_per_batch: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--child",
        "--mode",
        mode,
        "--data",
        str(data),
        "--checkpoint",
        checkpoint,
        "--n-windows-per-series",
        str(n_windows_per_series),
        "--rows-per-batch",
        str(rows_per_batch),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line.removeprefix("RESULT ")))
    return {"error": completed.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--rows-per-batch", type=int, default=256)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=True, help="also the tiny model")
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--n-windows-per-series", type=int, default=WINDOWS_PER_SERIES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    models = {"reference": args.checkpoint or str(REFERENCE_CHECKPOINT)}
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "rows_per_batch": args.rows_per_batch,
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            sys.path.insert(0, str(ROOT / "tests"))
            from graphs import write_tiny_chronos2

            models["tiny"] = str(write_tiny_chronos2(Path(tmp), context_length=16, output_patch_size=4).weights_path)
        for size in args.sizes:
            data = Path(tmp) / f"data_{size}.parquet"
            n_series = make_dataset(data, size)
            per_series = -(-size // n_series)
            for model, checkpoint in models.items():
                if model == "tiny" and size != args.sizes[0]:
                    continue
                runs = {}
                for mode in args.modes:
                    runs[mode] = run_mode(mode, data, checkpoint, per_series, args.rows_per_batch)
                    print(f"{model} {size} {mode}: {runs[mode]}", flush=True)
                entry = {"model": model, "windows": per_series * n_series, "series": n_series, "modes": runs}
                report["runs"].append(entry)
                print(json.dumps(entry, indent=2), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "backtest.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "backtest.md").write_text(render(report))


def render(report: dict[str, Any]) -> str:
    lines = [
        "# Backtest throughput",
        "",
        "Reproduce: `make bench-backtest` (`.venv/bin/python benchmarks/backtest_bench.py`). "
        f"Machine: {report['machine']['cpus']} CPUs, {report['machine']['platform']}; "
        f"rows per batch {report['rows_per_batch']}; 2 actors x 1 CPU x 1 ORT thread for the Ray modes.",
        "",
        "| model | windows | mode | windows/s | vs loop 1t | vs loop 2t | vs Ray Data | first forecast s "
        "| peak RSS MB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in report["runs"]:
        modes = entry["modes"]
        base1 = modes.get("loop_1_thread", {}).get("windows_per_s")
        base2 = modes.get("loop_2_threads", {}).get("windows_per_s")
        data = modes.get("ray_data_map_batches", {}).get("windows_per_s")
        for mode, result in modes.items():
            if "error" in result:
                lines.append(f"| {entry['model']} | {entry['windows']} | {mode} | error | | | | | |")
                continue
            rate = result["windows_per_s"]

            def ratio(base: float | None, rate: float = rate) -> str:
                return f"{rate / base:.2f}x" if base else "-"

            lines.append(
                f"| {entry['model']} | {entry['windows']} | {mode} | {rate:,.0f} | {ratio(base1)} | {ratio(base2)} | "
                f"{ratio(data)} | {result['first_forecast_s']:.1f} | {result['peak_rss_mb']:.0f} |"
            )
    lines += [
        "",
        "- Every mode does the same work per batch: pack the windows into an Arrow batch, forecast (same model, ORT",
        "  threads and batch size), build the forecast table, write one Parquet part. The loops run it in one",
        "  process; the dispatcher and Ray Data run the forecasts in 2 actors (1 CPU, 1 ORT thread each) and write",
        "  from the driver. Scoring and the report (dispatcher only) are not timed.",
        "- windows/s counts from the moment the workers are ready to the last part written. Ray Data starts its",
        "  actors lazily inside the run, so its figure includes that start; its rate after its first result is",
        "  listed below where its results streamed.",
        "  *first forecast* is from the start of the mode, Ray start-up and actor warm-up included.",
        "- *peak RSS* is the driver process's (ru_maxrss); the actors' memory is not included.",
        *[
            f"- Ray Data after its first result, {entry['model']} {entry['windows']} windows: "
            f"{rate:,.0f} windows/s (dispatcher: {entry['modes']['dispatcher_2_actors']['windows_per_s'] / rate:.2f}x)"
            for entry in report["runs"]
            if (rate := entry["modes"].get("ray_data_map_batches", {}).get("windows_per_s_after_first_result"))
            and "windows_per_s" in entry["modes"].get("dispatcher_2_actors", {})
        ],
        "- `tiny` is a 16-step-context graph (tests/graphs.py): inference costs nothing, so it measures the per-batch",
        "  overhead of each mode (Ray ~2-5 ms per call on this machine).",
        "- The machine has 2 cores shared by the driver, the actors and Ray's own processes; repeated runs varied",
        "  by about 10%.",
    ]
    return "\n".join(lines) + "\n"


def rerender() -> None:
    """Rewrite the Markdown from the committed JSON (after editing the notes, without re-measuring)."""
    (RESULTS / "backtest.md").write_text(render(json.loads((RESULTS / "backtest.json").read_text())))


if __name__ == "__main__":
    main()
