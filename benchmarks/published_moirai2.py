"""Moirai 2 at its published shapes: the runner at its defaults against ``Moirai2Forecast.predict``.

The same comparison as ``benchmarks/published_defaults.py`` (whose data, runner command and load-average
recording this script imports), for Moirai 2: the plain script a user would write (uni2ts's own
``Moirai2Forecast.predict`` once per forecast cutoff on every series' last ``context`` steps, torch on 2
threads) against ``distributed-onnx backtest --checkpoint C --data D --output O --n-windows K --stride 64
--horizon 64`` with no tuning flag. Both forecast the same windows (every series at each of K cutoffs, 64 steps
apart) with the same random-weight model; each side is its own process, in alternating rounds (upstream, ours,
upstream, ours, ...).

The model: ``Salesforce/moirai-2.0-R-small``'s ``config.json`` (d_model 384, d_ff 1024, 6 layers, patches of 16,
max_seq_len 512, 4 patches per model call, 9 quantiles; 11.4 M parameters), seeded random weights
(``distributed_onnx.export.random_weights.MOIRAI2["published"]``), context 1680 (uni2ts's README example, the
exporter's default). A horizon of 64 steps is one model call (4 patches of 16).

Reproduce (2 quiet cores; the build and export run once, ``--workdir`` keeps them)::

    .venv/bin/python benchmarks/published_moirai2.py --workdir /work/bench/moirai2 --windows 32 600 --rounds 2

Results go to ``benchmarks/results/published_moirai2.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from published_defaults import BIN, HORIZON, RESULTS, WINDOW_SHAPES, run_ours, time_upstream_script, write_data

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 1680
LEVELS = [0.1, 0.5, 0.9]

UPSTREAM_SCRIPT = """
import json, time
import numpy as np, pandas as pd, torch
from uni2ts.model.moirai2 import Moirai2Forecast, Moirai2Module
torch.set_num_threads({threads})
module = Moirai2Module.from_pretrained({pretrained!r}).eval()
model = Moirai2Forecast(prediction_length={horizon}, target_dim=1, feat_dynamic_real_dim=0,
                        past_feat_dynamic_real_dim=0, context_length={context}, module=module).eval()
df = pd.read_parquet({data!r})
df["timestamp"] = df["timestamp"].dt.tz_convert(None)
ends = df.groupby("series_id")["timestamp"].max()
cutoffs = sorted(ends.min() - pd.Timedelta(hours={horizon} * k) for k in range(1, {cutoffs} + 1))
compute, windows = 0.0, 0
for cutoff in cutoffs:
    past = df[df["timestamp"] <= cutoff]
    contexts = [group["y"].to_numpy(np.float32)[-{context}:] for _, group in past.groupby("series_id", sort=True)]
    mark = time.perf_counter()
    model.predict(contexts)
    compute += time.perf_counter() - mark
    windows += len(contexts)
print(json.dumps({{"windows": windows, "compute_s": compute}}))
"""


def build(workdir: Path) -> tuple[Path, dict[str, Any]]:
    """The published-shape model's pretrained folder and the checkpoint ``distributed-onnx export`` wrote."""
    output = workdir / "model" / "moirai2.onnx"
    info_path = workdir / "build.json"
    if output.exists() and info_path.exists():
        return output, json.loads(info_path.read_text())
    from distributed_onnx.export.random_weights import write_moirai2

    pretrained = write_moirai2(workdir / "pretrained", "published")
    from uni2ts.model.moirai2 import Moirai2Module

    parameters = sum(p.numel() for p in Moirai2Module.from_pretrained(str(pretrained)).parameters())
    started = time.perf_counter()
    argv = [str(BIN / "distributed-onnx"), "export", "moirai2", "--from-pretrained", str(pretrained)]
    argv += ["--output", str(output), "--resolution-minutes", "60", "--horizon", str(HORIZON)]
    subprocess.run(argv, check=True, capture_output=True)
    info = {"parameters": parameters, "export_s": time.perf_counter() - started, "horizon": HORIZON}
    info_path.write_text(json.dumps(info))
    return output, info


def run_upstream(workdir: Path, data: Path, cutoffs: int, threads: int) -> dict[str, Any]:
    script = workdir / "upstream_predict.py"
    script.write_text(
        UPSTREAM_SCRIPT.format(
            threads=threads,
            pretrained=str(workdir / "pretrained"),
            data=str(data),
            horizon=HORIZON,
            context=CONTEXT,
            cutoffs=cutoffs,
        )
    )
    return time_upstream_script(script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", choices=sorted(WINDOW_SHAPES), default=[32, 600])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the upstream side")
    parser.add_argument("--workdir", type=Path, help="keep the built model here (reused when present)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build and export the model, then stop")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="moirai2-defaults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint, built = build(workdir)
    if args.build_only:
        print(json.dumps(built))
        return
    sets: dict[str, Any] = {}
    for windows in args.windows:
        n_series, cutoffs = WINDOW_SHAPES[windows]
        data = workdir / f"data-{windows}.parquet"
        write_data(data, CONTEXT, n_series, cutoffs)
        rounds = []
        for round_ in range(args.rounds):
            entry: dict[str, Any] = {"round": round_}
            entry["upstream"] = run_upstream(workdir, data, cutoffs, args.threads)
            entry["ours"] = run_ours(checkpoint, data, workdir / f"run-{windows}-{round_}", cutoffs)
            rounds.append(entry)
            print(json.dumps({"windows": windows, **entry}), flush=True)
        medians = {
            side: {key: statistics.median(r[side][key] for r in rounds) for key in ("wall_s", "windows_per_s")}
            for side in ("upstream", "ours")
        }
        ratios = {
            "windows_per_s": [r["ours"]["windows_per_s"] / r["upstream"]["windows_per_s"] for r in rounds],
            "whole_process": [r["upstream"]["wall_s"] / r["ours"]["wall_s"] for r in rounds],
        }
        sets[str(windows)] = {"series": n_series, "cutoffs": cutoffs, "rounds": rounds, "medians": medians}
        sets[str(windows)]["ours_over_upstream_by_round"] = ratios
    parity_path = checkpoint.with_suffix(".parity.json")
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "family": "moirai2",
        "context": CONTEXT,
        "horizon": HORIZON,
        "built": built,
        "parity": json.loads(parity_path.read_text()) if parity_path.exists() else None,
        "sets": sets,
    }
    out = args.out or RESULTS / "published_moirai2.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: {"medians": v["medians"], "ratios": v["ours_over_upstream_by_round"]} for k, v in sets.items()})
    )


if __name__ == "__main__":
    main()
