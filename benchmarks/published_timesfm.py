"""The runner at its defaults against TimesFM 2.5's own ``forecast``, at the published shapes (random weights).

``published_defaults.py``'s comparison for TimesFM: the plain script a user writes (upstream's
``TimesFM_2p5_200M_torch`` with the README's ``ForecastConfig``, ``forecast`` once per cutoff on every series'
last ``max_context`` values, torch on 2 threads) against the one command ``distributed-onnx backtest
--checkpoint C --data D --output O --n-windows K --stride H --horizon H`` with no tuning flag, on the same windows
and the same random-weight model, each side its own process, rounds alternating. The data, our side's command
and its measurements are ``published_defaults``'s own (``write_data``, ``run_ours``: wall time, the run's
windows/s, the first part's arrival, the load average before and after each process).

The model: ``TimesFM_2p5_200M_Definition``'s sizes, which are the published ``google/timesfm-2.5-200m-pytorch``
weights' (20 layers of 1280, 16 heads, patches of 32 in and 128 out, a quantile head of 1024 steps; the class
has no config file: ``export --random-weights --size published`` builds the same), seeded random weights,
exported once at context 1024 (the README's ``max_context``) and one output patch (128 steps, the runner asks
64). ``--workdir`` keeps the folder and the export; the build prints the parameter count and the export time.

Reproduce (2 quiet cores; the build and export take minutes the first time, then ``--workdir`` keeps them)::

    .venv/bin/python benchmarks/published_timesfm.py --workdir /work/bench/timesfm --windows 32 600 --rounds 2

Results go to ``benchmarks/results/published_timesfm.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from published_defaults import HORIZON, RESULTS, ROOT, WINDOW_SHAPES, run_ours, time_upstream_script, write_data

BIN = Path(sys.executable).parent
CONTEXT = 1024
#: The README's ForecastConfig flags (the export's default, distributed_onnx/export/timesfm.py).
FLAGS = {
    "normalize_inputs": True,
    "use_continuous_quantile_head": True,
    "force_flip_invariance": True,
    "infer_is_positive": True,
    "fix_quantile_crossing": True,
}

UPSTREAM_SCRIPT = """
import json, time
import numpy as np, pandas as pd, torch
import timesfm
torch.set_num_threads({threads})
model = timesfm.TimesFM_2p5_200M_torch(torch_compile={torch_compile})
model.load_checkpoint({weights!r}, torch_compile={torch_compile})
df = pd.read_parquet({data!r})
df["timestamp"] = df["timestamp"].dt.tz_convert(None)
ends = df.groupby("series_id")["timestamp"].max()
cutoffs = sorted(ends.min() - pd.Timedelta(hours={horizon} * k) for k in range(1, {cutoffs} + 1))
model.compile(timesfm.ForecastConfig(max_context={context}, max_horizon={horizon},
                                     per_core_batch_size=df["series_id"].nunique(), **{flags!r}))
compute, windows = 0.0, 0
for cutoff in cutoffs:
    past = df[df["timestamp"] <= cutoff]
    inputs = [group["y"].to_numpy()[-{context}:] for _, group in past.groupby("series_id")]
    mark = time.perf_counter()
    model.forecast(horizon={horizon}, inputs=inputs)
    compute += time.perf_counter() - mark
    windows += len(inputs)
print(json.dumps({{"windows": windows, "compute_s": compute}}))
"""


def build(workdir: Path) -> tuple[Path, dict[str, Any]]:
    """The published-shape folder (``write_timesfm``) and ``distributed-onnx export timesfm`` of it, kept."""
    output = workdir / "model" / "timesfm.onnx"
    info_path = workdir / "build.json"
    if output.exists() and info_path.exists():
        return output, json.loads(info_path.read_text())
    from safetensors import safe_open

    from distributed_onnx.export.random_weights import write_timesfm

    pretrained = write_timesfm(workdir / "pretrained", "published")
    with safe_open(str(pretrained / "model.safetensors"), framework="pt") as weights:
        parameters = sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())  # noqa: SIM118
    argv = [str(BIN / "distributed-onnx"), "export", "timesfm", "--from-pretrained", str(pretrained)]
    argv += ["--output", str(output), "--resolution-minutes", "60", "--parity-windows", "8"]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    info = {"parameters": parameters, "export_s": time.perf_counter() - started, "export_args": argv[2:]}
    info_path.write_text(json.dumps(info))
    return output, info


def run_upstream(workdir: Path, data: Path, cutoffs: int, threads: int, torch_compile: bool) -> dict[str, Any]:
    script = workdir / "upstream_forecast.py"
    script.write_text(
        UPSTREAM_SCRIPT.format(
            threads=threads,
            torch_compile=torch_compile,
            weights=str(workdir / "pretrained" / "model.safetensors"),
            data=str(data),
            horizon=HORIZON,
            cutoffs=cutoffs,
            context=CONTEXT,
            flags=FLAGS,
        )
    )
    return time_upstream_script(script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", choices=sorted(WINDOW_SHAPES), default=[32, 600])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the upstream side")
    parser.add_argument(
        "--upstream-compile", action="store_true", help="upstream's torch.compile of the forward (default: eager)"
    )
    parser.add_argument("--workdir", type=Path, help="keep the built model here (reused when present)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build and export the model, then stop")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="timesfm-defaults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint, built = build(workdir)
    print(json.dumps(built), flush=True)
    if args.build_only:
        return
    sets: dict[str, Any] = {}
    for windows in args.windows:
        n_series, cutoffs = WINDOW_SHAPES[windows]
        data = workdir / f"data-{windows}.parquet"
        write_data(data, CONTEXT, n_series, cutoffs)
        rounds = []
        for round_ in range(args.rounds):
            entry: dict[str, Any] = {"round": round_}
            entry["upstream"] = run_upstream(workdir, data, cutoffs, args.threads, args.upstream_compile)
            entry["ours"] = run_ours(checkpoint, data, workdir / f"run-{windows}-{round_}", cutoffs)
            rounds.append(entry)
            print(json.dumps({"windows": windows, **entry}), flush=True)
        medians = {
            side: {
                key: statistics.median(r[side][key] for r in rounds)
                for key in ("wall_s", "windows_per_s", "first_forecast_s")
                if all(r[side].get(key) is not None for r in rounds)
            }
            for side in ("upstream", "ours")
        }
        ratios = {
            "windows_per_s": [r["ours"]["windows_per_s"] / r["upstream"]["windows_per_s"] for r in rounds],
            "whole_process": [r["upstream"]["wall_s"] / r["ours"]["wall_s"] for r in rounds],
        }
        sets[str(windows)] = {"series": n_series, "cutoffs": cutoffs, "rounds": rounds, "medians": medians}
        sets[str(windows)]["ratios_by_round"] = ratios
    parity = checkpoint.with_suffix(".parity.json")
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "family": "timesfm",
        "context": CONTEXT,
        "horizon": HORIZON,
        "upstream_threads": args.threads,
        "upstream_torch_compile": args.upstream_compile,
        "built": built,
        "parity": json.loads(parity.read_text()) if parity.exists() else None,
        "sets": sets,
    }
    out = args.out or RESULTS / "published_timesfm.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: {"medians": v["medians"], "ratios": v["ratios_by_round"]} for k, v in sets.items()}, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
