"""Chronos-2 at its published shapes: the exported graph against upstream ``predict_df``, at 1, 4 and 64 patches.

Builds ``amazon/chronos-2``'s published architecture from chronos-forecasting's own classes with random weights
(no download): d_model 768, d_kv 64, d_ff 3072, 12 layers, 12 heads, context 8192, patches of 16, at most 64
output patches, 21 quantiles, REG token, arcsinh, time encoding scale 8192 (its ``config.json``; 119.5 M
parameters). For each horizon it runs ``distributed-onnx export chronos2 --horizon H`` (as its own process) and
compares this package's ONNX Runtime worker with ``Chronos2Pipeline.predict_df(prediction_length=H)`` on the same
windows (seeded, with gaps and a short history). The graph computes the output patches upstream computes for H
(``horizon_patches`` = ceil(H / 16)); the check passes when the largest difference is within ``--tolerance`` of
the largest forecast.

It also records what the graph of all 64 patches, cut to each shorter horizon (what ``export`` wrote before it
took the horizon), gives against ``predict_df``: the output patches attend to each other, so it differs.

Not a timing: run it whenever, e.g. ``.venv/bin/python benchmarks/export_parity_published.py`` (writes
``benchmarks/results/export_parity_published.json``); ``--context 512`` for a quick smoke.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUANTILES_21 = [0.01, 0.05, *[round(0.05 * i, 2) for i in range(2, 19)], 0.95, 0.99]
PUBLISHED = {"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12}
PATCH, MAX_PATCHES = 16, 64


def build(pretrained: Path, context: int) -> int:
    """The published architecture with seeded random weights, saved as a pretrained folder; its parameter count."""
    import torch
    from chronos.chronos2 import Chronos2Model
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.pipeline import Chronos2Pipeline

    torch.manual_seed(0)
    config = Chronos2CoreConfig(
        **PUBLISHED,
        chronos_config={
            "context_length": context,
            "input_patch_size": PATCH,
            "input_patch_stride": PATCH,
            "output_patch_size": PATCH,
            "max_output_patches": MAX_PATCHES,
            "quantiles": QUANTILES_21,
            "use_reg_token": True,
            "use_arcsinh": True,
            "time_encoding_scale": context,
        },
    )
    model = Chronos2Model(config).eval()
    Chronos2Pipeline(model).save_pretrained(pretrained)
    return sum(p.numel() for p in model.parameters())


def sample_windows(count: int, context: int) -> np.ndarray:
    """Seeded windows: daily and weekly cycles at several levels, noise, scattered gaps, one short history."""
    rng = np.random.default_rng(0)
    steps = np.arange(context)
    level = rng.uniform(-50.0, 500.0, size=(count, 1))
    cycles = rng.uniform(1.0, 30.0, size=(count, 1)) * np.sin(2 * np.pi * steps / 24)
    windows = level + cycles + 5.0 * np.sin(2 * np.pi * steps / 168) + rng.normal(0.0, 2.0, (count, context))
    windows[rng.random(windows.shape) < 0.05] = np.nan
    if count > 1:
        windows[1, : context - 100] = np.nan
    return windows.astype(np.float32)


def predict_df(pipeline: Any, windows: np.ndarray, horizon: int) -> np.ndarray:
    """Upstream ``predict_df`` on each window as its own item: ``[W, H, 21]``."""
    import pandas as pd

    context = windows.shape[1]
    stamps = pd.date_range("2024-01-01", periods=context, freq="h")
    frames = []
    for number, values in enumerate(windows):
        first = int(np.argmax(~np.isnan(values)))  # a short history starts at its first observation
        frames.append(
            pd.DataFrame({"item_id": f"w{number:03d}", "timestamp": stamps[first:], "target": values[first:]})
        )
    result = pipeline.predict_df(
        pd.concat(frames, ignore_index=True), prediction_length=horizon, quantile_levels=QUANTILES_21, batch_size=256
    )
    out = []
    for number in range(windows.shape[0]):
        rows = result[result["item_id"] == f"w{number:03d}"].sort_values("timestamp")
        out.append(rows[[str(level) for level in QUANTILES_21]].to_numpy())
    return np.stack(out)


def ours(checkpoint: Path, windows: np.ndarray, horizon: int) -> np.ndarray:
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()]))
    try:
        return worker.forecast(windows, horizon, QUANTILES_21).astype(np.float64)
    finally:
        worker.close()


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    scale = float(np.max(np.abs(want))) or 1.0
    worst = float(np.max(np.abs(got - want)))
    return {"max_abs_diff": worst, "max_rel_diff": worst / scale, "max_abs_upstream": scale}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=8192, help="context length (published: 8192)")
    parser.add_argument("--patches", default="1,4,64", help="horizons to check, in output patches of 16")
    parser.add_argument("--windows", type=int, default=8, help="windows compared per horizon")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest difference / largest forecast")
    parser.add_argument("--output", type=Path, default=RESULTS / "export_parity_published.json")
    args = parser.parse_args()

    import torch
    from chronos.chronos2.pipeline import Chronos2Pipeline

    torch.set_num_threads(2)
    record: dict[str, Any] = {"context": args.context, "windows": args.windows, "tolerance": args.tolerance}
    with tempfile.TemporaryDirectory(prefix="export-parity-") as tmp:
        work = Path(tmp)
        os.environ["DISTRIBUTED_ONNX_CACHE"] = str(work / "cache")  # the optimized graphs go with the folder
        record["parameters"] = build(work / "pretrained", args.context)
        pipeline = Chronos2Pipeline.from_pretrained(str(work / "pretrained"))
        windows = sample_windows(args.windows, args.context)
        checks, graphs = [], {}
        for patches in sorted(int(p) for p in args.patches.split(",")):
            horizon = patches * PATCH
            output = work / f"h{horizon}" / "chronos2.onnx"
            started = time.perf_counter()
            argv = [sys.executable, "-m", "distributed_onnx", "export", "chronos2", "--from-pretrained"]
            argv += [str(work / "pretrained"), "--output", str(output), "--horizon", str(horizon)]
            argv += ["--resolution-minutes", "60"]  # required without --data; the windows are hourly-like
            subprocess.run([*argv, "--parity-windows", "2"], check=True, capture_output=True)
            metadata = json.loads(output.with_suffix(".metadata.json").read_text())
            graphs[patches] = output
            want = predict_df(pipeline, windows, horizon)
            check = {
                "patches": patches,
                "horizon": horizon,
                "horizon_patches": metadata["horizon_patches"],
                "export_s": round(time.perf_counter() - started, 1),
                **compare(ours(output, windows, horizon), want),
            }
            check["ok"] = check["horizon_patches"] == patches and check["max_rel_diff"] <= args.tolerance
            checks.append(check)
            print(json.dumps(check), flush=True)
        record["checks"] = checks
        widest = max(graphs)
        record["cut_from_widest"] = [  # the graph of all patches cut to each shorter horizon: what export wrote before
            {"graph_patches": widest, "horizon": p * PATCH, **compare(ours(graphs[widest], windows, p * PATCH), want)}
            for p in sorted(graphs)
            if p < widest
            for want in [predict_df(pipeline, windows, p * PATCH)]
        ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["cut_from_widest"]))
    return 0 if all(check["ok"] for check in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
