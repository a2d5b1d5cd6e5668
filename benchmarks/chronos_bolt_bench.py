"""Chronos-Bolt at bolt-small's shapes: ``distributed-onnx backtest`` vs a plain script calling upstream's predict.

Both sides forecast the same windows with the same random-weight model on the same 2 cores:

- **upstream**: what a user writes with ``chronos-forecasting`` alone: read the Parquet file with pandas, cut
  each series' windows (the backtest's: the last window's horizon ends at the series' end, the others step back
  by ``--stride``), ``ChronosBoltPipeline.predict`` on batches of them (torch, 2 threads), write the forecasts
  to Parquet. Compute is the predict calls; the whole process is measured from outside.
- **backtest**: the command, 2 actors of 1 CPU (one ONNX Runtime thread each), on the graph
  ``distributed-onnx export chronos_bolt`` wrote from the same folder. Windows/s from its ``summary.json``
  (dispatch); the whole process from outside. It also scores every window and writes the report.

Rounds alternate (upstream, backtest, upstream, ...), each side in its own process; medians and ratios are
reported. The model has bolt-small's config values (amazon/chronos-bolt-small: d_model 512, d_ff 2048, 6 + 6
layers, 8 heads of 64, context 2048, 64 steps, patches of 16, register token) and seeded random weights.

Reproduce (about 15 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/chronos_bolt_bench.py      # after `make .venv/bin/.installed` (chronos extra)

Results go to benchmarks/results/chronos_bolt.{json,md}.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLI = str(ROOT / ".venv" / "bin" / "distributed-onnx")
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
CONTEXT, HORIZON, RESOLUTION_MINUTES = 2048, 64, 60
BOLT_SMALL = {
    "d_model": 512,
    "d_ff": 2048,
    "num_layers": 6,
    "num_decoder_layers": 6,
    "num_heads": 8,
    "d_kv": 64,
}


def write_model(directory: Path) -> int:
    """bolt-small's architecture with seeded random weights, as ``save_pretrained`` writes it; its parameters."""
    import torch
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    torch.manual_seed(0)
    config = T5Config(
        **BOLT_SMALL,
        dense_act_fn="relu",
        feed_forward_proj="relu",
        is_gated_act=False,
        dropout_rate=0.1,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        layer_norm_epsilon=1e-6,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        vocab_size=2,
        architectures=["ChronosBoltModelForForecasting"],
        chronos_pipeline_class="ChronosBoltPipeline",
        chronos_config={
            "context_length": CONTEXT,
            "prediction_length": HORIZON,
            "input_patch_size": 16,
            "input_patch_stride": 16,
            "quantiles": LEVELS,
            "use_reg_token": True,
        },
    )
    model = ChronosBoltModelForForecasting(config).eval()
    model.save_pretrained(directory)
    return sum(parameter.numel() for parameter in model.parameters())


def write_data(path: Path, n_series: int, n_windows: int, stride: int) -> None:
    """Hourly series long enough for ``n_windows`` full-context windows each, with a few gaps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    length = CONTEXT + HORIZON + stride * (n_windows - 1)
    rng = np.random.default_rng(0)
    ids, stamps, ys = [], [], []
    start_us = 1_704_067_200_000_000
    for index in range(n_series):
        steps = np.arange(length)
        y = 100.0 * (index + 1) + 20.0 * np.sin(2 * np.pi * steps / 24) + rng.normal(0, 3, length)
        y[rng.random(length) < 0.02] = np.nan
        ids += [f"s{index:03d}"] * length
        stamps.append(start_us + steps * 3_600_000_000)
        ys.append(y)
    y = np.concatenate(ys)
    table = pa.table(
        {
            "series_id": pa.array(ids),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(y, mask=np.isnan(y)),
        }
    )
    pq.write_table(table, path)


def upstream_child(args: argparse.Namespace) -> None:
    """The plain script: pandas, the pipeline's own predict, Parquet out."""
    compute_started = None
    import pandas as pd
    import torch
    from chronos import ChronosBoltPipeline

    torch.set_num_threads(2)
    pipeline = ChronosBoltPipeline.from_pretrained(args.pretrained, local_files_only=True, dtype=torch.float32)
    frame = pd.read_parquet(args.data).sort_values(["series_id", "timestamp"])
    contexts, keys = [], []
    for series_id, group in frame.groupby("series_id", sort=True):
        values = group["y"].to_numpy(dtype="float32")
        for k in range(args.n_windows):
            origin = values.size - HORIZON - (args.n_windows - 1 - k) * args.stride
            contexts.append(torch.from_numpy(values[origin - CONTEXT : origin].copy()))
            keys.append((series_id, origin))
    compute_started = time.perf_counter()
    blocks = []
    with torch.no_grad():
        for start in range(0, len(contexts), args.batch_size):
            batch = torch.stack(contexts[start : start + args.batch_size])
            blocks.append(pipeline.predict(batch, prediction_length=HORIZON).numpy())  # [B, Q, H]
    compute_s = time.perf_counter() - compute_started
    forecasts = np.concatenate(blocks)
    rows = []
    for (series_id, origin), block in zip(keys, forecasts, strict=True):
        for lead in range(HORIZON):
            rows.append(
                {
                    "series_id": series_id,
                    "origin": origin,
                    "lead": lead + 1,
                    **{f"q{level}": float(block[q, lead]) for q, level in enumerate(LEVELS)},
                }
            )
    pd.DataFrame(rows).to_parquet(Path(args.output) / "forecasts.parquet")
    np.save(Path(args.output) / "median.npy", forecasts[:, LEVELS.index(0.5), :])
    print("RESULT " + json.dumps({"windows": len(contexts), "compute_s": compute_s}))


def run_upstream(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    output.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--child", "--pretrained", args.pretrained, "--data", args.data]
    command += ["--output", str(output), "--n-windows", str(args.n_windows), "--stride", str(args.stride)]
    command += ["--batch-size", str(args.batch_size)]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    process_s = time.perf_counter() - started
    line = next((each for each in completed.stdout.splitlines() if each.startswith("RESULT ")), None)
    if line is None:
        return {"error": completed.stderr[-2000:]}
    result = dict(json.loads(line.removeprefix("RESULT ")))
    return result | {"windows_per_s": result["windows"] / result["compute_s"], "process_s": process_s}


def run_backtest(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    command = [CLI, "backtest", "--checkpoint", args.checkpoint, "--data", args.data, "--output", str(output)]
    command += ["--n-windows", str(args.n_windows), "--stride", str(args.stride), "--horizon", str(HORIZON)]
    command += ["--actors", "2", "--cpus-per-actor", "1", "--rows-per-batch", str(args.rows_per_batch)]
    command += ["--quantiles", ",".join(str(level) for level in LEVELS), "--no-progress"]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    process_s = time.perf_counter() - started
    if completed.returncode != 0:
        return {"error": completed.stderr[-2000:]}
    summary = json.loads((output / "summary.json").read_text())
    timing = summary["timing"]
    return {
        "windows": summary["windows"]["run_now"],
        "dispatch_s": timing["dispatch_s"],
        "windows_per_s": timing["windows_per_s"],
        "process_s": process_s,
    }


def median_difference(upstream_dir: Path, backtest_dir: Path) -> float:
    """The largest |median| difference between the two sides' forecasts of the same windows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    theirs = np.load(upstream_dir / "median.npy")
    table = pq.read_table(backtest_dir / "forecasts").sort_by(
        [("series_id", "ascending"), ("origin", "ascending"), ("lead", "ascending")]
    )
    ours = pc.cast(table["q0.5"], "float64").to_numpy().reshape(theirs.shape)
    return float(np.max(np.abs(ours - theirs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--series", type=int, default=4)
    parser.add_argument("--n-windows", type=int, default=48, help="windows per series")
    parser.add_argument("--stride", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32, help="upstream: windows per predict call")
    parser.add_argument("--rows-per-batch", type=int, default=16, help="backtest: windows per ORT call")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pretrained", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        upstream_child(args)
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        parameters = write_model(tmp / "pretrained")
        args.pretrained, args.data, args.checkpoint = (
            str(tmp / "pretrained"),
            str(tmp / "data.parquet"),
            str(tmp / "bolt" / "bolt_small.onnx"),
        )
        write_data(Path(args.data), args.series, args.n_windows, args.stride)
        started = time.perf_counter()
        exported = subprocess.run(
            [
                CLI,
                "export",
                "chronos_bolt",
                "--from-pretrained",
                args.pretrained,
                "--output",
                args.checkpoint,
                "--parity-windows",
                "8",
                "--resolution-minutes",
                str(RESOLUTION_MINUTES),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        export_s = time.perf_counter() - started
        parity = json.loads(Path(args.checkpoint).with_suffix(".parity.json").read_text())
        del exported
        rounds: list[dict[str, Any]] = []
        for index in range(args.rounds):
            upstream = run_upstream(args, tmp / f"upstream{index}")
            backtest = run_backtest(args, tmp / f"backtest{index}")
            difference = median_difference(tmp / f"upstream{index}", tmp / f"backtest{index}")
            rounds.append({"upstream": upstream, "backtest": backtest, "max_median_diff": difference})
            print(json.dumps(rounds[-1]), flush=True)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(),
        },
        "model": {
            "architecture": "bolt-small (random weights)",
            "parameters": parameters,
            **BOLT_SMALL,
            "context_length": CONTEXT,
            "prediction_length": HORIZON,
        },
        "settings": {
            key: getattr(args, key)
            for key in ("rounds", "series", "n_windows", "stride", "batch_size", "rows_per_batch")
        },
        "export_s": export_s,
        "parity": parity,
        "rounds": rounds,
        "medians": summarize(rounds),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chronos_bolt.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["medians"], indent=2))


def summarize(rounds: list[dict[str, Any]]) -> dict[str, float]:
    def median(side: str, key: str) -> float:
        return statistics.median(each[side][key] for each in rounds)

    return {
        "upstream_windows_per_s": median("upstream", "windows_per_s"),
        "backtest_windows_per_s": median("backtest", "windows_per_s"),
        "windows_per_s_ratio": statistics.median(
            each["backtest"]["windows_per_s"] / each["upstream"]["windows_per_s"] for each in rounds
        ),
        "upstream_process_s": median("upstream", "process_s"),
        "backtest_process_s": median("backtest", "process_s"),
        "process_ratio": statistics.median(
            each["upstream"]["process_s"] / each["backtest"]["process_s"] for each in rounds
        ),
        "max_median_diff": max(each["max_median_diff"] for each in rounds),
    }


if __name__ == "__main__":
    main()
