"""The other thing a Ray user would write: the same backtest as Ray Data's own batch-inference path.

Side by side on the same windows, each side a whole process measured from outside:

- **runner**: ``distributed-onnx backtest`` at its defaults (``--actors`` as given), which also scores every
  window, writes metrics, the leaderboard and the report.
- **ray_data**: what a Ray user writes without this package's driver: cut the windows with numpy (the runner's
  definition: the last window's horizon ends at each series' last timestamp, the others step back by
  ``--stride``; the context is the ``context_length`` steps before the origin on the checkpoint's grid, NaN
  where missing), write them to a Parquet file, then ``ray.data.read_parquet`` -> ``map_batches`` with an
  actor pool (``concurrency=actors``, one CPU each) of a class holding an ONNX Runtime session ->
  ``write_parquet``. The class holds the package's ``InferenceWorker`` (an ORT session plus the model family's
  tensor layout), so both sides send the graph the same tensors: the comparison is of the dispatch, not of the
  packing. It scores nothing.

Before timing, the forecasts of both are checked equal (the medians and every quantile, within 1e-6 of the
largest forecast; ORT's sums may differ in the last bits between batch sizes). Rounds alternate (runner,
ray_data, runner, ...); the JSON records each round's seconds and the load average before and after it, and
the medians with their spread. Measure on a quiet machine (nothing else running).

Reproduce::

    .venv/bin/pip install 'ray[data]~=2.60.0'      # the bench extra, if missing
    .venv/bin/python benchmarks/ray_data_baseline.py --n-windows 2000 --stride 1 --rounds 5

Results go to ``--output`` (default benchmarks/results/ray_data_baseline.json).
"""

from __future__ import annotations

import argparse
import glob
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET  # noqa: E402

KEYS = ["series_id", "cutoff", "lead"]


def cut_windows(data: str, checkpoint: str, n_windows: int, stride: int, path: Path) -> int:
    """The runner's windows of ``data`` as a Parquet file (series_id, cutoff, context); their count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distributed_onnx.model.checkpoint import LocalCheckpoint

    metadata = LocalCheckpoint(path=Path(checkpoint)).resolve().metadata
    step = np.int64(metadata.resolution_minutes * 60_000_000)
    length, horizon = metadata.context_length, metadata.horizon_length
    table = pq.read_table(data, columns=["series_id", "timestamp", "y"])
    ids = np.asarray(table["series_id"].to_pylist(), dtype=object)
    stamps = table["timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
    values = table["y"].to_numpy(zero_copy_only=False).astype(np.float64)
    out_ids, out_cutoffs, contexts = [], [], []
    for series in dict.fromkeys(ids):
        rows = ids == series
        times, ys = stamps[rows], values[rows]
        index = (times - times.min()) // step
        grid = np.full(int(index.max()) + 1, np.nan)
        grid[index] = ys
        last_origin = len(grid) - horizon
        for k in range(n_windows):
            origin = last_origin - k * stride
            if origin < 1:
                break
            context = np.full(length, np.nan, dtype=np.float32)
            piece = grid[max(0, origin - length) : origin]
            context[length - len(piece) :] = piece
            out_ids.append(series)
            out_cutoffs.append(int(times.min() + (origin - 1) * step))
            contexts.append(context)
    windows = pa.table(
        {
            "series_id": pa.array(out_ids, pa.string()),
            "cutoff": pa.array(out_cutoffs, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "context": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(contexts)), length),
        }
    )
    pq.write_table(windows, path)
    return windows.num_rows


def ray_data_child(args: argparse.Namespace) -> None:
    """The Ray Data side, in its own process: windows, read_parquet -> map_batches(actor pool) -> write_parquet."""
    import pyarrow as pa
    import ray
    import ray.data

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    windows_path = work / "windows.parquet"
    cut_windows(args.data, args.checkpoint, args.n_windows, args.stride, windows_path)
    # One CPU beyond the pool's: Ray Data's read and write tasks need one, and with every CPU held by the actor
    # pool they wait forever (the actors' ORT sessions run one thread each, as the runner's 2 actors of 1 CPU).
    ray.init(num_cpus=args.actors + 1, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    checkpoint = args.checkpoint

    class Forecaster:
        """A class holding an ORT session (the package's worker: the session and the family's tensor layout)."""

        def __init__(self) -> None:
            from distributed_onnx.model.backend.providers import SessionOptionsConfig
            from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

            options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
            self.worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint, session_options=options))
            self.metadata = self.worker.metadata

        def __call__(self, batch: pa.Table) -> pa.Table:
            metadata = self.metadata
            context = batch["context"].combine_chunks()
            rows = np.asarray(context.values.to_numpy(zero_copy_only=False), dtype=np.float32)
            contexts = rows.reshape(len(batch), metadata.context_length)
            levels = list(metadata.native_quantiles)
            forecast = self.worker.forecast(contexts, metadata.horizon_length, levels)  # [W, H, Q]
            horizon = forecast.shape[1]
            columns: dict[str, Any] = {
                "series_id": pa.array(np.repeat(np.asarray(batch["series_id"].to_pylist(), dtype=object), horizon)),
                "cutoff": pa.array(np.repeat(batch["cutoff"].to_numpy(), horizon)),
                "lead": pa.array(np.tile(np.arange(1, horizon + 1, dtype=np.int32), len(batch))),
            }
            for index, level in enumerate(levels):
                columns[f"q{level:g}"] = pa.array(forecast[:, :, index].reshape(-1))
            return pa.table(columns)

    (
        ray.data.read_parquet(str(windows_path))
        .map_batches(
            Forecaster,
            batch_size=args.rows_per_batch,
            batch_format="pyarrow",
            concurrency=args.actors,
            num_cpus=1,
        )
        .write_parquet(str(work / "forecasts"))
    )
    ray.shutdown()


def _timed(command: list[str]) -> dict[str, Any]:
    before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[:4])}... exited {done.returncode}: {done.stderr[-2000:]}")
    return {"seconds": round(seconds, 3), "load_before": before, "load_after": os.getloadavg()}


def run_runner(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", args.checkpoint]
    command += ["--data", args.data, "--output", str(output), "--n-windows", str(args.n_windows)]
    command += ["--stride", str(args.stride), "--actors", str(args.actors), "--no-progress"]
    result = _timed(command)
    summary = json.loads((output / "summary.json").read_text())
    result["windows"] = summary["windows"]["planned"]
    result["rows_per_batch"] = summary["resolved"]["rows_per_batch"]
    return result


def run_ray_data(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--work", str(work), "--checkpoint", args.checkpoint]
    command += ["--data", args.data, "--n-windows", str(args.n_windows), "--stride", str(args.stride)]
    command += ["--actors", str(args.actors), "--rows-per-batch", str(args.rows_per_batch)]
    return _timed(command)


def max_difference(runner_dir: Path, ray_dir: Path) -> tuple[float, int]:
    """The largest quantile difference between the two sides' forecasts, relative to the largest forecast,
    and the rows compared; refuses forecasts that are not of the same windows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    runner = pa.concat_tables(
        [pq.read_table(path) for path in sorted(glob.glob(str(runner_dir / "forecasts" / "*" / "*.parquet")))]
    )
    ours = pq.read_table(str(ray_dir / "forecasts"))
    levels = [name for name in ours.column_names if name.startswith("q")]

    def frame(table: pa.Table) -> Any:
        keyed = table.select([*KEYS, *levels])
        cutoff = keyed["cutoff"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        keyed = keyed.set_column(1, "cutoff", cutoff).set_column(2, "lead", keyed["lead"].cast(pa.int64()))
        return keyed.to_pandas().sort_values(KEYS).reset_index(drop=True)

    left, right = frame(runner), frame(ours)
    if len(left) != len(right) or not (left[KEYS].to_numpy() == right[KEYS].to_numpy()).all():
        raise SystemExit(f"error: the sides forecast different windows ({len(left)} vs {len(right)} rows)")
    a, b = left[levels].to_numpy(np.float64), right[levels].to_numpy(np.float64)
    return float(np.nanmax(np.abs(a - b)) / max(np.nanmax(np.abs(a)), 1e-12)), len(left)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(REFERENCE_CHECKPOINT))
    parser.add_argument("--data", default=str(REFERENCE_DATASET))
    parser.add_argument("--n-windows", type=int, default=200)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--rows-per-batch", type=int, default=None, help="Ray Data's batch (default: the runner's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--check-n-windows", type=int, help="windows per series of the untimed equality check (default: --n-windows)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "ray_data_baseline.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        ray_data_child(args)
        return
    with tempfile.TemporaryDirectory(prefix="ray_data_baseline_") as tmp_name:
        tmp = Path(tmp_name)
        check = argparse.Namespace(**{**vars(args), "n_windows": args.check_n_windows or args.n_windows})
        first = run_runner(check, tmp / "check_runner")  # the equality check, untimed, sets Ray Data's batch
        args.rows_per_batch = check.rows_per_batch = args.rows_per_batch or first["rows_per_batch"]
        run_ray_data(check, tmp / "check_ray")
        difference, rows = max_difference(tmp / "check_runner", tmp / "check_ray")
        if not difference <= 1e-6:
            raise SystemExit(f"error: forecasts differ by {difference:.3g} of the largest forecast (over 1e-6)")
        rounds = []
        for number in range(args.rounds):
            runner = run_runner(args, tmp / f"runner_{number}")
            ray_data = run_ray_data(args, tmp / f"ray_{number}")
            rounds.append({"runner": runner, "ray_data": ray_data})
    runner_s = [r["runner"]["seconds"] for r in rounds]
    ray_s = [r["ray_data"]["seconds"] for r in rounds]
    report = {
        "what": "whole process, distributed-onnx backtest (defaults) vs Ray Data read_parquet->map_batches->write",
        "checkpoint": args.checkpoint,
        "data": args.data,
        "windows": rounds[0]["runner"].get("windows", first["windows"]) if rounds else first["windows"],
        "check_windows": first["windows"],
        "actors": args.actors,
        "rows_per_batch": args.rows_per_batch,
        "forecast_rows_compared": rows,
        "max_relative_difference": difference,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "rounds": rounds,
        "runner_s": _spread(runner_s) if rounds else None,
        "ray_data_s": _spread(ray_s) if rounds else None,
        "ray_data_over_runner": statistics.median(ray_s) / statistics.median(runner_s) if rounds else None,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in ("windows", "max_relative_difference", "runner_s", "ray_data_s")}))


if __name__ == "__main__":
    main()
