"""Toto at its published shapes: the runner at its defaults against upstream's own ``TotoForecaster.forecast``.

The model is ``Datadog/Toto-Open-Base-1.0``'s architecture (its ``config.json``: 12 layers of 768, 12 heads,
MLP 3072, patches of 64, 24 Student-t components; 151.3 M parameters) with seeded random weights
(``distributed_onnx.export.random_weights.TOTO["published"]``), exported once by ``distributed-onnx export toto``
into ``--workdir`` (reused when present). Context 4096 steps (the export's), one call of 64 steps.

Both sides forecast the same windows (``published_defaults.write_data``: every series at each of K cutoffs 64
steps apart, the last ending at the series' end; 32 windows = 8 series x 4 cutoffs) as separate processes, in
alternating rounds:

- ``upstream_samples``: the script a user writes with toto-ts: ``TotoForecaster.forecast`` once per cutoff on
  all series, ``num_samples`` paths (default 128, the docstring's "at least 128 for reliable forecasts"; the
  README uses 256), quantiles 0.1/0.5/0.9 from the samples; torch on ``--threads`` threads (2).
- ``upstream_mean``: the same with ``num_samples=None`` (the mean only, one pass: upstream's cheapest path, a
  floor; it gives no quantiles).
- ``ours``: ``distributed-onnx backtest --checkpoint C --data D`` with no tuning flag
  (``published_defaults.run_ours``: windows, stride and horizon 64, quantiles 0.1/0.5/0.9).

The load average is recorded before and after each process: a figure taken while the machine was busy is not a
result (docs/benchmarks.md).

Reproduce (2 quiet cores; the first run builds and exports the model, minutes, then ``--workdir`` keeps it)::

    .venv/bin/python benchmarks/published_toto.py --workdir /work/bench/toto --windows 32 --rounds 2

Checked end to end (not timed) with ``--windows 2 --rounds 1 --num-samples 8``. ``--no-samples`` leaves the
sampling side out: on 2 cores its 128 paths per window did not end within 700 s at 32 windows; the mean pass is
then the upstream side to beat (the cheaper one).

Results go to ``benchmarks/results/published_toto.json`` (``--out``).
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

from published_defaults import HORIZON, RESULTS, WINDOW_SHAPES, run_ours, time_upstream_script, write_data

from distributed_onnx.export.random_weights import TOTO, write_toto
from distributed_onnx.export.toto import CONTEXT_PATCHES

CONTEXT = CONTEXT_PATCHES * TOTO["published"]["patch_size"]
EXPORT_ARGS = ["--resolution-minutes", "60", "--parity-windows", "4"]
#: ``published_defaults``' window sets, and 2 = 2 series x 1 cutoff for checking that the script runs end to end.
SHAPES = {2: (2, 1), **WINDOW_SHAPES}

UPSTREAM_SCRIPT = """
import json, time
import numpy as np, pyarrow.parquet as pq, torch
from toto.data.util.dataset import MaskedTimeseries
from toto.inference.forecaster import TotoForecaster
from toto.model.toto import Toto
torch.set_num_threads({threads})
forecaster = TotoForecaster(Toto.load_from_checkpoint({pretrained!r}).eval().model)
table = pq.read_table({data!r}).to_pydict()
series = {{}}
for name, y in zip(table["series_id"], table["y"]):
    series.setdefault(name, []).append(y)
values = np.array([series[name] for name in sorted(series)], dtype=np.float32)  # [series, length], no gaps
rows, length = values.shape
compute, windows = 0.0, 0
for k in range({cutoffs}, 0, -1):
    context = torch.from_numpy(values[:, length - {horizon} * k - {context} : length - {horizon} * k])[:, None, :]
    inputs = MaskedTimeseries(
        series=context, padding_mask=torch.ones_like(context, dtype=torch.bool),
        id_mask=torch.zeros_like(context, dtype=torch.int),
        timestamp_seconds=(torch.arange({context}, dtype=torch.int) * 3600).expand(rows, 1, {context}),
        time_interval_seconds=torch.full((rows, 1), 3600, dtype=torch.int))
    mark = time.perf_counter()
    forecast = forecaster.forecast(inputs, prediction_length={horizon}, num_samples={num_samples},
                                   samples_per_batch={num_samples} or 1, use_kv_cache=True)
    if forecast.samples is not None:
        quantiles = [forecast.quantile(q) for q in (0.1, 0.5, 0.9)]
    compute += time.perf_counter() - mark
    windows += rows
print(json.dumps({{"windows": windows, "compute_s": compute}}))
"""


def build(workdir: Path) -> tuple[Path, dict[str, Any]]:
    """The published-shape random-weight folder and its export (reused when ``build.json`` says it was made)."""
    output = workdir / "model" / "toto.onnx"
    info_path = workdir / "build.json"
    if output.exists() and info_path.exists():
        return output, json.loads(info_path.read_text())
    from toto.model.toto import Toto

    write_toto(workdir / "pretrained", "published")
    parameters = sum(p.numel() for p in Toto.load_from_checkpoint(str(workdir / "pretrained")).parameters())
    started = time.perf_counter()
    argv = [
        sys.executable,
        "-m",
        "distributed_onnx",
        "export",
        "toto",
        "--from-pretrained",
        str(workdir / "pretrained"),
    ]
    subprocess.run([*argv, "--output", str(output), *EXPORT_ARGS], check=True, capture_output=True)
    info = {"parameters": parameters, "export_s": time.perf_counter() - started, "export_args": EXPORT_ARGS}
    info_path.write_text(json.dumps(info))
    return output, info


def run_upstream(workdir: Path, data: Path, cutoffs: int, threads: int, num_samples: int | None) -> dict[str, Any]:
    script = workdir / f"upstream_{num_samples or 'mean'}.py"
    script.write_text(
        UPSTREAM_SCRIPT.format(
            threads=threads,
            pretrained=str(workdir / "pretrained"),
            data=str(data),
            horizon=HORIZON,
            context=CONTEXT,
            cutoffs=cutoffs,
            num_samples=num_samples,
        )
    )
    return time_upstream_script(script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", choices=sorted(SHAPES), default=[32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the upstream side")
    parser.add_argument("--num-samples", type=int, default=128, help="upstream's sampled paths per window")
    parser.add_argument(
        "--no-samples",
        action="store_true",
        help="leave out the sampling side (at 128 paths it did not end within 700 s at 32 windows on 2 cores)",
    )
    parser.add_argument("--workdir", type=Path, help="keep the built model here (reused when present)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build and export the model, then stop")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="toto-published-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint, built = build(workdir)
    if args.build_only:
        print(json.dumps(built))
        return
    sets: dict[str, Any] = {}
    for windows in args.windows:
        n_series, cutoffs = SHAPES[windows]
        data = workdir / f"data-{windows}.parquet"
        write_data(data, CONTEXT, n_series, cutoffs)
        rounds = []
        for round_ in range(args.rounds):
            entry: dict[str, Any] = {"round": round_}
            if not args.no_samples:
                entry["upstream_samples"] = run_upstream(workdir, data, cutoffs, args.threads, args.num_samples)
            entry["upstream_mean"] = run_upstream(workdir, data, cutoffs, args.threads, None)
            entry["ours"] = run_ours(checkpoint, data, workdir / f"run-{windows}-{round_}", cutoffs)
            rounds.append(entry)
            print(json.dumps({"windows": windows, **entry}), flush=True)
        sides = [side for side in rounds[0] if side != "round"]
        medians = {
            side: {key: statistics.median(r[side][key] for r in rounds) for key in ("wall_s", "windows_per_s")}
            for side in sides
        }
        sets[str(windows)] = {"series": n_series, "cutoffs": cutoffs, "rounds": rounds, "medians": medians}
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "family": "toto",
        "context": CONTEXT,
        "horizon": HORIZON,
        "num_samples": None if args.no_samples else args.num_samples,
        "threads": args.threads,
        "built": built,
        "parity": json.loads(checkpoint.with_suffix(".parity.json").read_text()),
        "sets": sets,
    }
    out = args.out or RESULTS / "published_toto.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["medians"] for k, v in sets.items()}, indent=2))


if __name__ == "__main__":
    main()
