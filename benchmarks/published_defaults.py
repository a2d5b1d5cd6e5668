"""The runner at its defaults against the upstream pipeline's own ``predict_df``, at a family's published shapes.

What a user compares before adopting the runner: the plain script they would write (the upstream pipeline,
``predict_df`` once per forecast cutoff, torch on the machine's cores) and the one command
``distributed-onnx backtest --checkpoint C --data D --output O --n-windows K --stride H --horizon H``, with no
other flag: no actors, threads, batch or part sizes chosen by hand. Both forecast the same windows (every series
at each of K cutoffs, H steps apart, the last window ending at the series' end) with the same random-weight
model, at the published architecture's shapes, on the same cores. Each side runs as its own process; rounds
alternate (upstream, ours, upstream, ours, ...).

Recorded per round: the whole process' wall time measured from outside; windows/s of the forecasting itself
(upstream: the time inside its ``predict_df`` calls; ours: the run's own ``summary.json`` dispatch rate, which
also packs, scores and writes); and for ours the seconds from the command's start until its first forecast part
is on disk. With ``--before-tree DIR`` the same command also runs from another checkout (its package first on
PYTHONPATH, for the driver and Ray's workers) on the same checkpoint: the start-up before and after. With
``--tuned FILE`` the same command also runs with the settings ``distributed-onnx tune`` wrote (are the defaults
within reach of them?); ``--no-upstream`` leaves the upstream side out and sets the ratios against the defaults.

``--bare-threads``: also two bare ONNX Runtime threads on the same graph, in one process (a session each, one
intra-op thread, spinning off, as each actor's; the same windows in the batches the run used), timed around
their ``session.run`` calls only: the runner's windows/s over theirs is its overhead (packing, scoring, writing,
dispatch, Ray). ``--attach``: the command also runs with ``--address auto``, joining a ``ray start`` head started
once (docs/cluster.md), so its first forecast is measured without Ray's start.

The load average is recorded before and after each process, and the CPU model and its kernel flags (AVX-512, VNNI,
AMX, BF16) in the JSON: a figure taken while the machine was busy, or on another CPU, is not comparable
(docs/benchmarks.md).

Reproduce (2 quiet cores; the published Chronos-2 graph takes minutes to build and export the first time, then
``--workdir`` keeps it)::

    .venv/bin/python benchmarks/published_defaults.py --family chronos_bolt --windows 32 600 --rounds 2
    .venv/bin/python benchmarks/published_defaults.py --family chronos_bolt --workdir W --windows 32 600 \
        --rounds 3 --no-upstream --bare-threads --attach     # the runner's fixed cost and its overhead
    .venv/bin/python benchmarks/published_defaults.py --family chronos2 --windows 32 --rounds 2

Results go to ``benchmarks/results/published_defaults_<family>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]  # machine.py; its head is tests/ray_head.py

from machine import cpu_facts, started_head  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BIN = Path(sys.executable).parent
HORIZON = 64
QUANTILES_21 = [0.01, 0.05, *[round(0.05 * i, 2) for i in range(2, 19)], 0.95, 0.99]
#: The published architectures (their config.json values), built with seeded random weights.
FAMILIES: dict[str, dict[str, Any]] = {
    # amazon/chronos-2: 119.5 M parameters, context 8192, 64 output patches of 16.
    "chronos2": {
        "context": 8192,
        "arch": {"d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
    },
    # amazon/chronos-bolt-small: 47.7 M parameters, context 2048, 64 steps.
    "chronos_bolt": {
        "context": 2048,
        "arch": {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8, "d_kv": 64},
    },
}
#: Windows as (series, cutoffs): 32 = 8 x 4 and 600 = 24 x 25.
WINDOW_SHAPES = {32: (8, 4), 600: (24, 25)}

UPSTREAM_SCRIPT = """
import json, sys, time
import pandas as pd, torch
from {module} import {pipeline_class} as Pipeline
torch.set_num_threads({threads})
pipeline = Pipeline.from_pretrained({pretrained!r}, device_map="cpu", dtype=torch.float32)
df = pd.read_parquet({data!r})
df["timestamp"] = df["timestamp"].dt.tz_convert(None)
ends = df.groupby("series_id")["timestamp"].max()
cutoffs = sorted(ends.min() - pd.Timedelta(hours={horizon} * k) for k in range(1, {cutoffs} + 1))
compute, windows = 0.0, 0
for cutoff in cutoffs:
    past = df[df["timestamp"] <= cutoff]
    mark = time.perf_counter()
    pipeline.predict_df(past, id_column="series_id", target="y", prediction_length={horizon},
                        quantile_levels={levels!r})
    compute += time.perf_counter() - mark
    windows += past["series_id"].nunique()
print(json.dumps({{"windows": windows, "compute_s": compute}}))
"""


def build_chronos2(workdir: Path, context: int, arch: dict[str, int]) -> int:
    import torch
    from chronos.chronos2 import Chronos2Model
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.pipeline import Chronos2Pipeline

    torch.manual_seed(0)
    config = Chronos2CoreConfig(
        **arch,
        chronos_config={
            "context_length": context,
            "input_patch_size": 16,
            "input_patch_stride": 16,
            "output_patch_size": 16,
            "max_output_patches": 64,
            "quantiles": QUANTILES_21,
            "use_reg_token": True,
            "use_arcsinh": True,
            "time_encoding_scale": context,
        },
    )
    model = Chronos2Model(config).eval()
    Chronos2Pipeline(model).save_pretrained(workdir / "pretrained")
    return sum(p.numel() for p in model.parameters())


def build_chronos_bolt(workdir: Path, context: int, arch: dict[str, int]) -> int:
    """bolt-small's published architecture with seeded random weights (``chronos_bolt_bench``'s builder)."""
    from chronos_bolt_bench import BOLT_SMALL, CONTEXT, write_model

    assert (context, arch) == (CONTEXT, BOLT_SMALL), "the Bolt builder is bolt-small's"
    return int(write_model(workdir / "pretrained"))


def build(workdir: Path, family: str, export_args: list[str]) -> tuple[Path, dict[str, Any]]:
    """The random-weight model's pretrained folder and the checkpoint ``distributed-onnx export`` wrote from it."""
    output = workdir / "model" / f"{family}.onnx"
    info_path = workdir / "build.json"
    if output.exists() and info_path.exists():
        return output, json.loads(info_path.read_text())
    spec = FAMILIES[family]
    builder = build_chronos2 if family == "chronos2" else build_chronos_bolt
    parameters = builder(workdir, spec["context"], spec["arch"])
    started = time.perf_counter()
    argv = [str(BIN / "distributed-onnx"), "export", family, "--from-pretrained", str(workdir / "pretrained")]
    argv += ["--resolution-minutes", "60"]  # required without --data; the benchmark's series are hourly
    subprocess.run([*argv, "--output", str(output), *export_args], check=True, capture_output=True)
    info = {"parameters": parameters, "export_s": time.perf_counter() - started, "export_args": export_args}
    info_path.write_text(json.dumps(info))
    return output, info


def write_data(path: Path, context: int, n_series: int, cutoffs: int) -> None:
    """Hourly series just long enough for a full context before the earliest cutoff, without gaps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    length = context + HORIZON * cutoffs
    rng = np.random.default_rng(0)
    steps = np.arange(length)
    start_us = 1_577_836_800_000_000  # 2020-01-01
    ids, stamps, ys = [], [], []
    for index in range(n_series):
        ys.append(100 + 20 * np.sin(2 * np.pi * steps / 24) + np.cumsum(rng.normal(0, 2, length)) + 10 * index)
        ids += [f"s{index:03d}"] * length
        stamps.append(start_us + steps * 3_600_000_000)
    table = pa.table(
        {
            "series_id": pa.array(ids),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(np.concatenate(ys)),
        }
    )
    pq.write_table(table, path)


#: Each family's own pipeline class, as its package names it.
PIPELINES = {
    "chronos2": ("chronos.chronos2.pipeline", "Chronos2Pipeline"),
    "chronos_bolt": ("chronos", "ChronosBoltPipeline"),
}


def run_upstream(
    workdir: Path, family: str, data: Path, cutoffs: int, levels: list[float], threads: int
) -> dict[str, Any]:
    script = workdir / "upstream_predict.py"
    module, pipeline_class = PIPELINES[family]
    script.write_text(
        UPSTREAM_SCRIPT.format(
            module=module,
            pipeline_class=pipeline_class,
            threads=threads,
            pretrained=str(workdir / "pretrained"),
            data=str(data),
            horizon=HORIZON,
            cutoffs=cutoffs,
            levels=levels,
        )
    )
    return time_upstream_script(script)


def time_upstream_script(script: Path) -> dict[str, Any]:
    """Run an upstream script as its own process: its wall time from outside, the windows/s inside its predict
    calls (the script's last line: ``{"windows": N, "compute_s": S}``) and the load average around it."""
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall_s": wall,
        "windows": inside["windows"],
        "windows_per_s": inside["windows"] / inside["compute_s"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def run_ours(
    checkpoint: Path,
    data: Path,
    output: Path,
    cutoffs: int,
    tree: Path | None = None,
    extra: tuple[str, ...] = (),
    environment: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The command at its defaults (plus ``extra``, e.g. ``--tuned FILE``); the first part's arrival is polled
    from outside."""
    argv = [str(BIN / "distributed-onnx"), "backtest", "--checkpoint", str(checkpoint), "--data", str(data)]
    argv += ["--output", str(output), "--n-windows", str(cutoffs), "--stride", str(HORIZON), "--horizon", str(HORIZON)]
    argv += ["--quantiles", "0.1,0.5,0.9", "--no-progress", *extra]
    shutil.rmtree(output, ignore_errors=True)  # a fresh run: an existing directory would resume
    env = dict(environment or os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    log = output.with_name(output.name + ".log").open("wb")
    process = subprocess.Popen(argv, cwd=tree or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    first_forecast_s = None
    while process.poll() is None:
        if first_forecast_s is None and any((output / "forecasts").glob("model=*/part-*.parquet")):
            first_forecast_s = time.perf_counter() - started
        time.sleep(0.05)
    wall = time.perf_counter() - started
    log.close()
    if process.returncode != 0:
        tail = output.with_name(output.name + ".log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"backtest exited {process.returncode}: {tail}")
    summary = json.loads((output / "summary.json").read_text())
    return {
        "wall_s": wall,
        "first_forecast_s": first_forecast_s,
        "windows": summary["windows"]["planned"],
        "windows_per_s": summary["timing"]["windows_per_s"],
        "rows_per_batch": summary["resolved"]["rows_per_batch"],
        "summary_first_forecast_s": summary["timing"].get("first_forecast_s"),
        "wall_phases_s": summary["timing"].get("driver_wall_phases_s"),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


BARE_SCRIPT = """
import json, sys, threading, time
import numpy as np, onnxruntime as ort, pyarrow.parquet as pq
checkpoint, data, cutoffs, rows, threads, horizon = sys.argv[1:7]
cutoffs, rows, threads, horizon = int(cutoffs), int(rows), int(threads), int(horizon)
inputs = json.loads(open(checkpoint.removesuffix(".onnx") + ".metadata.json").read())
context = inputs["context_length"]
table = pq.read_table(data)
ids, y = table["series_id"].to_numpy(zero_copy_only=False), table["y"].to_numpy()
windows = []
for series in np.unique(ids):
    values = y[ids == series]
    windows += [values[len(values) - horizon * k - context : len(values) - horizon * k] for k in range(cutoffs, 0, -1)]
block = np.asarray(windows, np.float32)
batches = [block[start : start + rows] for start in range(0, len(block), rows)]
def session():
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(checkpoint, options, providers=["CPUExecutionProvider"])
sessions = [session() for _ in range(threads)]
name = sessions[0].get_inputs()[0].name
# A graph that computes the output patches it is told (TimesFM's num_output_patches) is told the run's, as the
# worker tells it (distributed_onnx/model/horizons.py).
told = {}
if "num_output_patches" in [each.name for each in sessions[0].get_inputs()]:
    told["num_output_patches"] = np.array(-(-horizon // inputs["output_patch_size"]), dtype=np.int64)
for each in sessions:
    each.run(None, {name: block[:1], **told})  # warm up on one row, as each actor does
left, lock = list(range(len(batches))), threading.Lock()
def work(each):
    while True:
        with lock:
            if not left:
                return
            index = left.pop()
        each.run(None, {name: batches[index], **told})
started = time.perf_counter()
workers = [threading.Thread(target=work, args=(each,)) for each in sessions]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(json.dumps({"windows": len(block), "compute_s": time.perf_counter() - started}))
"""


def run_bare_threads(workdir: Path, checkpoint: Path, data: Path, cutoffs: int, rows: int) -> dict[str, Any]:
    """Two bare ONNX Runtime threads on the checkpoint's graph (module docstring), as their own process."""
    script = workdir / "bare_threads.py"
    script.write_text(BARE_SCRIPT)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    argv = [sys.executable, str(script), str(checkpoint), str(data), str(cutoffs), str(rows), "2", str(HORIZON)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall_s": time.perf_counter() - started,
        "windows": inside["windows"],
        "rows_per_batch": rows,
        "windows_per_s": inside["windows"] / inside["compute_s"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def one_round(
    args: argparse.Namespace, workdir: Path, checkpoint: Path, data: Path, windows: int, cutoffs: int, round_: int
) -> dict[str, Any]:
    """One round of every side, in a fixed order (upstream, ours, bare threads, attached, int8, tuned, before)."""
    entry: dict[str, Any] = {"round": round_}
    if not args.no_upstream:
        entry["upstream"] = run_upstream(workdir, args.family, data, cutoffs, [0.1, 0.5, 0.9], args.threads)
    entry["ours"] = run_ours(checkpoint, data, workdir / f"run-{windows}-{round_}", cutoffs)
    if args.bare_threads:
        rows = entry["ours"]["rows_per_batch"]
        entry["bare_threads"] = run_bare_threads(workdir, checkpoint, data, cutoffs, rows)
    if args.attach_env is not None:
        attached = workdir / f"attached-{windows}-{round_}"
        entry["ours_attached"] = run_ours(
            checkpoint, data, attached, cutoffs, None, ("--address", "auto"), args.attach_env
        )
    if args.int8:
        variant = checkpoint.with_name(checkpoint.stem + "-int8.onnx")
        entry["ours_int8"] = run_ours(variant, data, workdir / f"int8-{windows}-{round_}", cutoffs)
    if args.tuned is not None:
        tuned = ("--tuned", str(args.tuned))
        entry["ours_tuned"] = run_ours(checkpoint, data, workdir / f"tuned-{windows}-{round_}", cutoffs, None, tuned)
    if args.before_tree is not None:
        before = workdir / f"before-{windows}-{round_}"
        entry["ours_before"] = run_ours(checkpoint, data, before, cutoffs, args.before_tree)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), required=True)
    parser.add_argument("--windows", type=int, nargs="+", choices=sorted(WINDOW_SHAPES), default=[32, 600])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="torch threads of the upstream side")
    parser.add_argument("--export-args", default="", help="extra arguments of `export` (space-separated)")
    parser.add_argument("--int8", action="store_true", help="also run the export's int8 variant (--quantize int8)")
    parser.add_argument("--before-tree", type=Path, help="another checkout: its start-up on the same checkpoint")
    parser.add_argument("--tuned", type=Path, help="also run with --tuned FILE (a file `distributed-onnx tune` wrote)")
    parser.add_argument("--no-upstream", action="store_true", help="leave the upstream side out (runner sides only)")
    parser.add_argument("--bare-threads", action="store_true", help="also two bare ORT threads on the same graph")
    parser.add_argument("--attach", action="store_true", help="also the command joining a `ray start` head")
    parser.add_argument("--workdir", type=Path, help="keep the built model here (reused when present)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build and export the model, then stop")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"{args.family}-defaults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint, built = build(workdir, args.family, args.export_args.split())
    if args.build_only:
        print(json.dumps(built))
        return
    with started_head() if args.attach else nullcontext(None) as attach_env:
        args.attach_env = attach_env
        sets = measure(args, workdir, checkpoint)
    result = {
        "machine": cpu_facts(),
        "ratios_against": "upstream" if not args.no_upstream else "ours (defaults)",
        "family": args.family,
        "context": FAMILIES[args.family]["context"],
        "horizon": HORIZON,
        "built": built,
        "parity": json.loads(checkpoint.with_suffix(".parity.json").read_text())
        if checkpoint.with_suffix(".parity.json").exists()
        else None,
        "sets": sets,
    }
    out = args.out or RESULTS / f"published_defaults_{args.family}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: {"medians": v["medians"], "ratios": v["ratios_by_round"]} for k, v in sets.items()}, indent=2))


def measure(args: argparse.Namespace, workdir: Path, checkpoint: Path) -> dict[str, Any]:
    """Every window count's rounds, their medians and the ratios per round."""
    context = FAMILIES[args.family]["context"]
    sets: dict[str, Any] = {}
    for windows in args.windows:
        n_series, cutoffs = WINDOW_SHAPES[windows]
        data = workdir / f"data-{windows}.parquet"
        write_data(data, context, n_series, cutoffs)
        rounds = []
        for round_ in range(args.rounds):
            entry = one_round(args, workdir, checkpoint, data, windows, cutoffs, round_)
            rounds.append(entry)
            print(json.dumps({"windows": windows, **entry}), flush=True)
        sides = [side for side in rounds[0] if side != "round"]
        medians = {
            side: {
                key: statistics.median(r[side][key] for r in rounds)
                for key in ("wall_s", "windows_per_s", "first_forecast_s")
                if all(r[side].get(key) is not None for r in rounds)
            }
            for side in sides
        }
        if args.int8:
            ratios_int8 = [r["ours_int8"]["windows_per_s"] / r["ours"]["windows_per_s"] for r in rounds]
        base = "upstream" if not args.no_upstream else "ours"
        ratios = {
            side: {
                "windows_per_s": [r[side]["windows_per_s"] / r[base]["windows_per_s"] for r in rounds],
                "whole_process": [r[base]["wall_s"] / r[side]["wall_s"] for r in rounds],
            }
            for side in sides
            if side != base
        }
        sets[str(windows)] = {"series": n_series, "cutoffs": cutoffs, "rounds": rounds, "medians": medians}
        sets[str(windows)]["ratios_by_round"] = ratios
        if args.int8:
            sets[str(windows)]["int8_over_fp32_windows_per_s"] = ratios_int8
        if args.bare_threads:  # the runner's windows/s over two bare ORT threads' (target: at least 0.9)
            over_bare = [r["ours"]["windows_per_s"] / r["bare_threads"]["windows_per_s"] for r in rounds]
            sets[str(windows)]["ours_over_bare_threads_windows_per_s"] = over_bare
    return sets


if __name__ == "__main__":
    main()
