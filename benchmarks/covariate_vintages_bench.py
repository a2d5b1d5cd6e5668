"""What reading covariates as of each cutoff costs: a whole CLI run with 10 vintages per timestamp against the
same run with the covariate taken as known (an input-table column), alternating rounds.

Both runs forecast the same windows with the same covariate row (the bundled reference checkpoint, 2 actors x
1 CPU): the baseline reads ``temp`` from the input table, the vintaged run from ``--covariate-data``, a
per-series table with 10 vintages of every timestamp (issued 1..10 steps before it, errors growing with how
early). The difference is the vintage table's read and index in the driver, its trip to the actors, and the
as-of join per batch. Each round runs both, in alternating order (A B, then B A, ...), each a fresh process on
a fresh output directory; the figure is the median over rounds of the paired wall-time ratio.

Reproduce::

    .venv/bin/python benchmarks/covariate_vintages_bench.py --rounds 4

Results go to benchmarks/results/covariate_vintages.{json,md}.
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
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VINTAGES = 10


def make_inputs(directory: Path, n_series: int) -> dict[str, Path]:
    """The panel with ``temp`` (known exactly), the panel without it, and the vintage table of ``temp``."""
    from distributed_onnx.resources import REFERENCE_DATASET

    base = pq.read_table(REFERENCE_DATASET)
    y = base.column("y").to_numpy()
    stamps = base.column("timestamp").cast(pa.int64()).to_numpy()
    step = int(stamps[1] - stamps[0])
    rng = np.random.default_rng(0)
    panels, vintages = [], []
    for index in range(n_series):
        series_id = f"s{index:04d}"
        temp = 15 + 5 * np.sin(np.arange(y.size) * 2 * np.pi / 48) + rng.normal(0, 1, y.size)
        panels.append(
            pa.table(
                {
                    "series_id": pa.array([series_id] * y.size),
                    "timestamp": base.column("timestamp"),
                    "y": pa.array(y * rng.uniform(0.5, 1.5) + rng.normal(0, 200, y.size)),
                    "temp": pa.array(temp),
                }
            )
        )
        ahead = np.repeat(np.arange(1, VINTAGES + 1), y.size)
        vintages.append(
            pa.table(
                {
                    "series_id": pa.array([series_id] * ahead.size),
                    "timestamp": pa.array(np.tile(stamps, VINTAGES), pa.timestamp("us", tz="UTC")),
                    "available_at": pa.array(np.tile(stamps, VINTAGES) - ahead * step, pa.timestamp("us", tz="UTC")),
                    "temp": pa.array(np.tile(temp, VINTAGES) + rng.normal(0, 0.3, ahead.size) * ahead),
                }
            )
        )
    panel = pa.concat_tables(panels)
    paths = {"known": directory / "known.parquet", "bare": directory / "bare.parquet"}
    pq.write_table(panel, paths["known"])
    pq.write_table(panel.drop(["temp"]), paths["bare"])
    paths["vintages"] = directory / "vintages.parquet"
    pq.write_table(pa.concat_tables(vintages), paths["vintages"])
    return paths


#: Ray's raylet must register within 30 s (hard-coded in Ray); on a loaded machine a start can miss it. Such a
#: run is retried (counted), never timed.
RAY_START_TIMEOUT = "timed out during startup"


def one_run(mode: str, paths: dict[str, Path], n_windows: int, output: Path, how: str) -> dict[str, Any]:
    """One fresh process: the CLI (``how="cli"``: Ray, 2 actors) or the same plan and parts run by one
    in-process part runner (``how="in_process"``: no Ray, what the actors and the driver's plan do)."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    data = paths["known"] if mode == "known" else paths["bare"]
    flags = ["--checkpoint", str(REFERENCE_CHECKPOINT), "--data", str(data), "--n-windows", str(n_windows)]
    flags += ["--actors", "2", "--cpus-per-actor", "1", "--covariates", "temp"]
    if mode == "vintaged":
        flags += ["--covariate-data", str(paths["vintages"])]
    retries = 0
    while True:
        if how == "cli":
            command = [sys.executable, "-m", "distributed_onnx", "backtest", "--output", str(output), "--no-progress"]
        else:
            command = [sys.executable, __file__, "--child", "--output", str(output), "--"]
        load = os.getloadavg()[0]
        started = time.perf_counter()
        completed = subprocess.run(
            [*command, *flags], capture_output=True, text=True, cwd=ROOT, timeout=1800, check=False
        )
        wall_s = time.perf_counter() - started
        if completed.returncode == 0:
            break
        if RAY_START_TIMEOUT in completed.stderr and retries < 5:
            retries += 1
            output = output.with_name(output.name + "-retry")
            continue
        return {"mode": mode, "error": completed.stderr[-2000:]}
    record: dict[str, Any] = {"mode": mode, "how": how, "wall_s": round(wall_s, 3), "load_1min_before": round(load, 2)}
    record["ray_start_retries"] = retries
    if how == "cli":
        summary = json.loads((output / "summary.json").read_text())
        record["windows"] = summary["windows"]["planned"]
        record["source"] = summary["covariates"]["columns"]["temp"]["source"]
    return record


def child(output: str, flags: list[str]) -> None:
    """The in-process run: plan, every part by one :class:`PartRunner`, the merge of the sums."""
    sys.path[:0] = [str(ROOT)]
    from distributed_onnx.evaluation.settings import BacktestSettings
    from tests.backtest_data import run_parts_in_process

    values = {flags[i].removeprefix("--").replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}
    settings = BacktestSettings.model_validate({**values, "output": output, "progress": False})

    run_parts_in_process(settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--series", type=int, default=20)
    parser.add_argument("--n-windows", type=int, default=100, help="windows per series")
    parser.add_argument("--how", choices=["cli", "in_process"], default="cli")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        child(args.output, [flag for flag in rest if flag != "--"])
        return
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_inputs(Path(tmp), args.series)
        vintage_rows = pq.read_metadata(paths["vintages"]).num_rows
        for round_index in range(args.rounds):
            order = ["known", "vintaged"] if round_index % 2 == 0 else ["vintaged", "known"]
            pair = {}
            for mode in order:
                result = one_run(mode, paths, args.n_windows, Path(tmp) / f"run-{round_index}-{mode}", args.how)
                if "error" in result:
                    raise SystemExit(f"{mode} failed: {result['error']}")
                pair[mode] = result
                print(json.dumps({"round": round_index, **result}), flush=True)
            runs.append({"round": round_index, "order": order, **pair})
    ratios = [run["vintaged"]["wall_s"] / run["known"]["wall_s"] for run in runs]
    report = {
        "what": f"whole process ({args.how}), 10 vintages per timestamp (vintaged) vs the covariate as an input "
        "column (known)",
        "series": args.series,
        "windows_per_series": args.n_windows,
        "vintage_rows": vintage_rows,
        "rounds": runs,
        "paired_ratio_median": round(statistics.median(ratios), 4),
        "paired_ratios": [round(r, 4) for r in ratios],
        "known_wall_s_median": round(statistics.median(r["known"]["wall_s"] for r in runs), 3),
        "vintaged_wall_s_median": round(statistics.median(r["vintaged"]["wall_s"] for r in runs), 3),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"covariate_vintages_{args.how}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("paired_ratio_median", "paired_ratios")}))


if __name__ == "__main__":
    main()
