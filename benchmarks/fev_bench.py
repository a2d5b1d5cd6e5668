"""A multi-task fev benchmark: fev's own sequential loop against ``distributed-onnx fev``, same ONNX models, same cores.

The benchmark is built offline in fev's dataset format (four tasks: hourly and 15-minute series counted back
from their ends, daily series with a known-future and a past-only covariate and timestamp cutoffs, weekly
series with gaps), or read from ``--benchmark YAML``. Two checkpoints: the bundled reference one and a copy of
it under another name (so both sides run two models of the reference's cost).

- ``fev loop``: what fev's README does, ``for task: for window in task.iter_windows(): predict; then
  task.evaluation_summary``, in this process, one ONNX Runtime session per checkpoint with ``--cores``
  intra-op threads, every series of a window in one call (the Chronos-2 OpenSTEF tensors, as the runner builds
  them). Timed from the first task to the last summary (data loading included, as in the runner).
- ``runner``: :func:`distributed_onnx.fev_benchmark` on an embedded local Ray started before the clock
  (``--cores`` actors of 1 CPU), from the call to its return (its own data loading, backtests, reports and
  summaries included).

Reported: each side's wall seconds per round (``--rounds``, the sides in alternating order), the median of the
paired ratios fev loop / runner, and the largest difference between the two sides' ``test_error`` (the same
numbers, or the comparison is void), in ``benchmarks/results/fev_bench.{json,md}``. Meant for a quiet
machine; ``--smoke`` runs a small version of one round to check that it works.

Reproduce::

    .venv/bin/python benchmarks/fev_bench.py --cores 2      # writes benchmarks/results/fev_bench.{json,md}
    .venv/bin/python benchmarks/fev_bench.py --smoke        # a small run, nothing written
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import cpu_facts

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _dataset(path: Path, series: list[dict[str, Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {key: pa.array([row[key] for row in series]) for key in series[0]}
    columns["timestamp"] = pa.array([row["timestamp"] for row in series], pa.list_(pa.timestamp("ms")))
    pq.write_table(pa.table(columns), path)
    return str(path)


def build_tasks(root: Path, n_series: int, length: int, windows: int) -> list[Any]:
    """Four tasks in fev's dataset format, ``n_series`` series of about ``length`` steps each."""
    import fev
    import pandas as pd

    rng = np.random.default_rng(0)

    def stamps(start: str, n: int, freq: str) -> list[Any]:
        return list(pd.date_range(start, periods=n, freq=freq).to_pydatetime())

    def wave(n: int, period: int) -> np.ndarray:
        return 10 + 3 * np.sin(np.arange(n) * 2 * np.pi / period) + rng.normal(0, 0.5, n)

    sizes = [length - int(rng.integers(0, length // 4)) for _ in range(n_series)]
    hourly = [
        {"id": f"h{i}", "timestamp": stamps("2021-01-01", n, "h"), "target": list(wave(n, 24))}
        for i, n in enumerate(sizes)
    ]
    quarter = [
        {"id": f"q{i}", "timestamp": stamps("2021-01-01", n, "15min"), "target": list(wave(n, 96))}
        for i, n in enumerate(sizes)
    ]
    daily = []
    for i, n in enumerate(sizes):
        price = rng.normal(5, 1, n)
        start = (pd.Timestamp("2015-01-01") + pd.Timedelta(days=int(rng.integers(0, 30)))).isoformat()
        target = 20 + 2 * price + rng.normal(0, 1, n)
        daily.append(
            {
                "id": f"d{i}",
                "timestamp": stamps(start, n, "D"),
                "target": list(target),
                "price": list(price),
                "lag": list(rng.normal(0, 1, n)),
            }
        )
    weekly = []
    for i, n in enumerate(sizes):
        values = 100 + np.cumsum(rng.normal(0, 1, n))
        values[rng.integers(0, n - 40, 5)] = np.nan
        weekly.append({"id": f"w{i}", "timestamp": stamps("2000-01-02", n, "W-SUN"), "target": list(values)})
    common = {"quantile_levels": LEVELS, "num_windows": windows}
    last_daily = pd.Timestamp("2015-01-01") + pd.Timedelta(days=min(sizes) - 1)
    return [
        fev.Task(
            dataset_path=_dataset(root / "hourly/data.parquet", hourly),
            task_name="hourly",
            horizon=24,
            seasonality=24,
            eval_metric="SQL",
            extra_metrics=["MASE", "WQL"],
            **common,
        ),
        fev.Task(
            dataset_path=_dataset(root / "quarter/data.parquet", quarter),
            task_name="15min",
            horizon=96,
            seasonality=96,
            eval_metric="SQL",
            extra_metrics=["MASE"],
            **common,
        ),
        fev.Task(
            dataset_path=_dataset(root / "daily/data.parquet", daily),
            task_name="daily_covariates",
            horizon=14,
            initial_cutoff=(last_daily - pd.Timedelta(days=14 * windows + 7)).isoformat(),
            window_step_size=14,
            seasonality=7,
            known_dynamic_columns=["price"],
            past_dynamic_columns=["lag"],
            eval_metric="SQL",
            extra_metrics=["MASE"],
            **common,
        ),
        fev.Task(
            dataset_path=_dataset(root / "weekly/data.parquet", weekly),
            task_name="weekly_gaps",
            horizon=13,
            seasonality=52,
            eval_metric="SQL",
            extra_metrics=["MASE"],
            **common,
        ),
    ]


def checkpoints(directory: Path) -> list[Path]:
    """The reference checkpoint and a copy of it named ``reference_copy``."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    copy = directory / "reference_copy.onnx"
    shutil.copy(REFERENCE_CHECKPOINT, copy)
    shutil.copy(REFERENCE_CHECKPOINT.with_suffix(".metadata.json"), copy.with_suffix(".metadata.json"))
    return [REFERENCE_CHECKPOINT, copy]


def fev_loop(tasks: list[Any], paths: list[Path], cores: int) -> tuple[float, list[dict[str, Any]]]:
    """fev's sequential loop: every window of every task, one ONNX Runtime call per window and model."""
    import onnxruntime as ort

    from distributed_onnx.model.checkpoint import LocalCheckpoint

    options = ort.SessionOptions()
    options.intra_op_num_threads = cores
    models = []
    for path in paths:
        resolved = LocalCheckpoint(path=path).resolve()
        session = ort.InferenceSession(str(resolved.weights_path), options, providers=["CPUExecutionProvider"])
        models.append((resolved, session))
    started = time.perf_counter()
    summaries = []
    for task in tasks:
        for resolved, session in models:
            task_started = time.perf_counter()
            predictions = [_predict(task, window, resolved.metadata, session) for window in task.iter_windows()]
            inference_s = time.perf_counter() - task_started
            summaries.append(
                task.evaluation_summary(predictions, model_name=resolved.name, inference_time_s=inference_s)
            )
    return time.perf_counter() - started, summaries


def _predict(task: Any, window: Any, metadata: Any, session: Any) -> list[dict[str, Any]]:
    """One window's predictions: Chronos-2 (OpenSTEF) tensors, every series of the window in one call."""
    past, future = window.get_input_data()
    length, graph_horizon = metadata.context_length, metadata.horizon_length
    covariates = [*task.past_dynamic_columns, *task.known_dynamic_columns]
    rows, groups = [], []
    for index in range(len(past)):
        item, ahead = past[index], future[index]

        def history(values: Any) -> np.ndarray:
            values = np.asarray(values, dtype=np.float64)[-length:]
            return np.concatenate([np.full(length - len(values), np.nan), values])

        group = [np.concatenate([history(item[task.target]), np.full(graph_horizon, np.nan)])]
        for name in covariates:
            known = np.full(graph_horizon, np.nan)
            if name in task.known_dynamic_columns:
                known[: task.horizon] = np.asarray(ahead[name], dtype=np.float64)
            group.append(np.concatenate([history(item[name]), known]))
        rows += group
        groups += [index] * len(group)
    grid = np.asarray(rows, dtype=np.float32)
    mask = np.isfinite(grid).astype(np.float32)
    values = np.where(mask > 0, grid, np.float32(0))
    inputs = {
        "context": values[:, :length],
        "attention_mask": mask[:, :length],
        "group_ids": np.asarray(groups, dtype=np.int64),
        "future_covariates": values[:, length:],
        "future_covariates_mask": mask[:, length:],
    }
    (output,) = session.run([metadata.output_name], inputs)
    targets = output[np.arange(len(past)) * (1 + len(covariates))][:, :, : task.horizon].astype(np.float64)
    native = list(metadata.native_quantiles)
    return [
        {"predictions": list(f[native.index(0.5)]), **{str(q): list(f[native.index(q)]) for q in task.quantile_levels}}
        for f in targets
    ]


def runner(tasks: list[Any], paths: list[Path], cores: int, output: Path) -> tuple[float, list[dict[str, Any]]]:
    from distributed_onnx import fev_benchmark
    from distributed_onnx.evaluation.driver import report_process

    # Each round as a fresh `distributed-onnx fev` pays it: the report process an earlier round left warm in this
    # process is stopped (the benchmark's runs share one within a round, as the command's do).
    report_process.close_kept_report_process()
    started = time.perf_counter()
    result = fev_benchmark(tasks, checkpoint=paths, output=output, actors=cores, cpus_per_actor=1.0)
    return time.perf_counter() - started, result.summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2, help="ONNX Runtime threads of the fev loop = actors")
    parser.add_argument("--series", type=int, default=64, help="series per task")
    parser.add_argument("--length", type=int, default=900, help="steps per series (about)")
    parser.add_argument("--windows", type=int, default=5, help="windows per task")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds, the two sides in alternating order")
    parser.add_argument("--benchmark", help="a fev benchmark YAML instead of the built one")
    parser.add_argument("--smoke", action="store_true", help="a small run of one round; nothing written")
    args = parser.parse_args()
    if args.smoke:
        args.series, args.length, args.windows, args.rounds = 4, 700, 2, 1
    import ray

    from distributed_onnx.runtime.local_ray import connect

    rounds: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fev-bench-") as scratch:
        root = Path(scratch)
        if args.benchmark:
            import fev

            tasks = list(fev.Benchmark.from_yaml(args.benchmark).tasks)
        else:
            tasks = build_tasks(root / "datasets", args.series, args.length, args.windows)
        paths = checkpoints(root)
        connect(None, num_cpus=args.cores)  # Ray's start-up is not the runner's cost per benchmark
        for number in range(args.rounds):
            sides = ["fev_loop", "runner"] if number % 2 == 0 else ["runner", "fev_loop"]
            timing: dict[str, float] = {}
            for side in sides:
                if side == "fev_loop":
                    timing[side], loop_summaries = fev_loop(tasks, paths, args.cores)
                else:  # a fresh output each round: a rerun on the same one would resume, computing nothing
                    timing[side], run_summaries = runner(tasks, paths, args.cores, root / f"out{number}")
            ours = {(s["task_name"], s["model_name"]): s["test_error"] for s in run_summaries}
            diff = max(abs(ours[(s["task_name"], s["model_name"])] - s["test_error"]) for s in loop_summaries)
            rounds.append({**timing, "ratio": timing["fev_loop"] / timing["runner"], "order": sides, "max_diff": diff})
        ray.shutdown()
    record = {
        "cores": args.cores,
        "tasks": len(tasks),
        "models": len(paths),
        "series_per_task": args.series,
        "windows_per_task": args.windows,
        "forecasts_per_side": sum(s["num_forecasts"] for s in loop_summaries),
        "rounds": rounds,
        "median_ratio_fev_loop_over_runner": round(statistics.median(r["ratio"] for r in rounds), 3),
        "max_test_error_difference": max(r["max_diff"] for r in rounds),
        "load_average_before_after": [load_before, os.getloadavg()],
        "machine": cpu_facts(),
    }
    print(json.dumps(record, indent=2))
    if not args.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "fev_bench.json").write_text(json.dumps(record, indent=2) + "\n")
        (RESULTS / "fev_bench.md").write_text(_markdown(record))


def _markdown(record: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {n + 1} | {' then '.join(r['order'])} | {r['fev_loop']:.2f} | {r['runner']:.2f} | {r['ratio']:.3f} |"
        for n, r in enumerate(record["rounds"])
    )
    return f"""# fev benchmark: fev's sequential loop against `distributed-onnx fev`

{record["tasks"]} tasks x {record["models"]} checkpoints, {record["series_per_task"]} series and \
{record["windows_per_task"]} windows per task, {record["cores"]} cores on each side (`benchmarks/fev_bench.py`).
Median of the paired ratios fev loop / runner: **{record["median_ratio_fev_loop_over_runner"]}** (above 1: the
runner is faster). Largest difference between the two sides' `test_error`: {record["max_test_error_difference"]}.
Load average before and after: {record["load_average_before_after"]}; machine: {record["machine"]}
(CPU model, kernel flags, cores).

| round | order | fev loop s | runner s | ratio |
|---|---|---|---|---|
{rows}

Reproduce: `.venv/bin/python benchmarks/fev_bench.py --cores {record["cores"]}`.
"""


if __name__ == "__main__":
    main()
