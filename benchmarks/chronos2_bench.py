"""Chronos-2 backtest vs the plain script a user would write with the upstream pipeline, side by side.

Both sides forecast the same windows (every series at each of ``--n-windows`` cutoffs, ``horizon`` apart) with
the same random-weight model on the same CPU cores:

- **upstream**: a Python script (written to the work directory, run as its own process) that loads
  ``Chronos2Pipeline.from_pretrained(DIR)`` and calls ``predict_df`` once per cutoff on the series truncated
  there (torch, ``torch.set_num_threads(cores)``, ``batch_size=256``): what a user writes to backtest.
- **ours**: ``distributed-onnx backtest`` on the checkpoint ``distributed-onnx export chronos2`` wrote from the
  same folder, as its own process, for each ``--ours ACTORSxTHREADS`` layout.

Measured per round, the rounds alternating (upstream, ours..., upstream, ours...): the whole process' wall
time, and windows/s of the forecasting itself (upstream: around its ``predict_df`` calls; ours: the run's own
``summary.json`` dispatch rate). The model has Chronos-2's published architecture (``amazon/chronos-2``:
d_model 768, d_kv 64, d_ff 3072, 12 layers, 12 heads, 21 quantiles, patches of 16, REG token, arcsinh) with
random weights and a shorter context and horizon (the config's editable fields; ``--size small`` for a quick
look).

Reproduce::

    .venv/bin/python benchmarks/chronos2_bench.py                 # writes benchmarks/results/chronos2.json
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
BIN = Path(sys.executable).parent
QUANTILES_21 = [0.01, 0.05, *[round(0.05 * i, 2) for i in range(2, 19)], 0.95, 0.99]
SIZES = {
    # amazon/chronos-2's published architecture (its config.json), random weights.
    "published": {"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
    "small": {"d_model": 256, "d_kv": 64, "d_ff": 1024, "num_layers": 4, "num_heads": 4},
}

UPSTREAM_SCRIPT = """
import sys, time, json
started = time.perf_counter()
import pandas as pd, torch
from chronos.chronos2.pipeline import Chronos2Pipeline
torch.set_num_threads({threads})
pipeline = Chronos2Pipeline.from_pretrained({pretrained!r})
df = pd.read_parquet({data!r})
df["timestamp"] = df["timestamp"].dt.tz_convert(None)
ends = df.groupby("series_id")["timestamp"].max()
cutoffs = sorted(ends.min() - pd.Timedelta(hours={horizon} * k) for k in range(1, {n_windows} + 1))
compute = 0.0
windows = 0
for cutoff in cutoffs:
    past = df[df["timestamp"] <= cutoff]
    mark = time.perf_counter()
    out = pipeline.predict_df(past, id_column="series_id", target="y", prediction_length={horizon},
                              quantile_levels=[0.1, 0.5, 0.9], batch_size=256, context_length={context})
    compute += time.perf_counter() - mark
    windows += past["series_id"].nunique()
print(json.dumps({{"windows": windows, "compute_s": compute, "inside_s": time.perf_counter() - started}}))
"""


def build(workdir: Path, size: str, context: int, patches: int) -> Path:
    """The random-weight model's pretrained folder, exported with ``distributed-onnx export chronos2``."""
    import torch
    from chronos.chronos2 import Chronos2Model
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.pipeline import Chronos2Pipeline

    torch.manual_seed(0)
    config = Chronos2CoreConfig(
        **SIZES[size],
        chronos_config={
            "context_length": context,
            "input_patch_size": 16,
            "input_patch_stride": 16,
            "output_patch_size": 16,
            "max_output_patches": patches,
            "quantiles": QUANTILES_21,
            "use_reg_token": True,
            "use_arcsinh": True,
            "time_encoding_scale": context,
        },
    )
    model = Chronos2Model(config).eval()
    parameters = sum(p.numel() for p in model.parameters())
    Chronos2Pipeline(model).save_pretrained(workdir / "pretrained")
    output = workdir / "model" / "chronos2.onnx"
    subprocess.run(
        [
            str(BIN / "distributed-onnx"),
            "export",
            "chronos2",
            "--from-pretrained",
            str(workdir / "pretrained"),
            "--output",
            str(output),
            "--parity-windows",
            "8",
            "--resolution-minutes",  # the hourly data below; export never assumes one
            "60",
        ],
        check=True,
        capture_output=True,
    )
    (workdir / "parameters.txt").write_text(str(parameters))
    return output


def make_data(path: Path, n_series: int, length: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    steps = np.arange(length)
    start = np.datetime64("2024-01-01T00:00", "us")
    tables = []
    for index in range(n_series):
        y = 100 + 20 * np.sin(2 * np.pi * steps / 24) + np.cumsum(rng.normal(0, 2, length)) + 10 * index
        tables.append(
            pa.table(
                {
                    "series_id": pa.array([f"s{index:03d}"] * length),
                    "timestamp": pa.array(start + steps * np.timedelta64(3600, "s")).cast(pa.timestamp("us", tz="UTC")),
                    "y": pa.array(y),
                }
            )
        )
    pq.write_table(pa.concat_tables(tables), path)


def run_upstream(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    script = workdir / "upstream_predict.py"
    script.write_text(
        UPSTREAM_SCRIPT.format(
            threads=args.cores,
            pretrained=str(workdir / "pretrained"),
            data=str(workdir / "data.parquet"),
            horizon=args.horizon,
            n_windows=args.n_windows,
            context=args.context,
        )
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall_s": wall,
        "windows": inside["windows"],
        "windows_per_s": inside["windows"] / inside["compute_s"],
        "compute_s": inside["compute_s"],
    }


def run_ours(workdir: Path, checkpoint: Path, layout: str, round_: int, args: argparse.Namespace) -> dict[str, Any]:
    actors, threads = (int(part) for part in layout.split("x"))
    output = workdir / f"run-{layout}-{round_}"
    argv = [
        str(BIN / "distributed-onnx"),
        "backtest",
        "--checkpoint",
        str(checkpoint),
        "--data",
        str(workdir / "data.parquet"),
        "--output",
        str(output),
        "--n-windows",
        str(args.n_windows),
        "--stride",
        str(args.horizon),
        "--horizon",
        str(args.horizon),
        "--context-length",
        str(args.context),
        "--quantiles",
        "0.1,0.5,0.9",
        "--actors",
        str(actors),
        "--cpus-per-actor",
        str(threads),
        "--rows-per-batch",
        str(args.rows_per_batch),
        "--no-progress",
    ]
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - started
    summary = json.loads((output / "summary.json").read_text())
    return {
        "wall_s": wall,
        "windows": summary["windows"]["planned"],
        "windows_per_s": summary["timing"]["windows_per_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="published")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--series", type=int, default=24)
    parser.add_argument("--n-windows", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rows-per-batch", type=int, default=32)
    parser.add_argument("--ours", default="2x1,1x2", help="comma list of ACTORSxTHREADS layouts")
    parser.add_argument("--out", type=Path, default=RESULTS / "chronos2.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="chronos2-bench-"))
    checkpoint = build(workdir, args.size, args.context, args.horizon // 16)
    make_data(workdir / "data.parquet", args.series, args.context + args.horizon * (args.n_windows + 1))
    layouts = args.ours.split(",")
    rounds: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        entry = {"round": round_, "upstream": run_upstream(workdir, args)}
        for layout in layouts:
            entry[f"ours_{layout}"] = run_ours(workdir, checkpoint, layout, round_, args)
        rounds.append(entry)
        print(json.dumps(entry), flush=True)
    parameters = int((workdir / "parameters.txt").read_text())
    medians = {
        side: {key: statistics.median(r[side][key] for r in rounds) for key in ("wall_s", "windows_per_s")}
        for side in rounds[0]
        if side != "round"
    }
    ratios = {
        side: {
            "windows_per_s": medians[side]["windows_per_s"] / medians["upstream"]["windows_per_s"],
            "whole_process": medians["upstream"]["wall_s"] / medians[side]["wall_s"],
        }
        for side in medians
        if side != "upstream"
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "settings": {**vars(args), "out": _shown(args.out), "parameters": parameters},
        "parity": json.loads(checkpoint.with_suffix(".parity.json").read_text()),
        "rounds": rounds,
        "medians": medians,
        "ratios_vs_upstream": ratios,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"medians": medians, "ratios": ratios}, indent=2))


def _shown(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    main()
