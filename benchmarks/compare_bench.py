"""Several checkpoints in one run against one run per checkpoint: windows x models per second.

The bundled reference checkpoint is copied K times under different names (K = 1, 2, 4). ``one run`` backtests
all K copies in one run (each actor loads the K sessions and feeds each packed batch to each of them, the
baselines and the scale are computed once); ``separate runs`` backtests each copy in its own run directory,
one after the other. Both use the same data, windows, actors (2 x 1 CPU), batch size and the same local Ray
(started once before the runs, so neither side pays for Ray's start-up; each run starts its own actors).

Reported per mode: windows x models per second over the whole ``run_backtest`` call (actor start, dispatch,
merge, leaderboard, report), and over the dispatch phase alone (summary.json's ``dispatch_s``); the ratio
one-run / separate-runs; and the actors' stage seconds (receipts): the share of the scoring stage in the
model stage (the issue's budget: scoring at most 3% of model time on the reference checkpoint).

Reproduce (a few minutes on a 2-core machine)::

    .venv/bin/python benchmarks/compare_bench.py          # writes benchmarks/results/compare.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def copies(directory: Path, k: int) -> list[Path]:
    """``k`` copies of the reference checkpoint (weights and metadata), named ref1..refk."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    paths = []
    for index in range(1, k + 1):
        target = directory / f"ref{index}.onnx"
        if not target.exists():
            shutil.copy(REFERENCE_CHECKPOINT, target)
            shutil.copy(REFERENCE_CHECKPOINT.with_suffix(".metadata.json"), target.with_suffix(".metadata.json"))
        paths.append(target)
    return paths


def one(checkpoints: list[Path], output: Path, n_windows: int) -> dict[str, Any]:
    from distributed_onnx.evaluation.backtest import run_backtest
    from distributed_onnx.evaluation.settings import BacktestSettings

    settings = BacktestSettings(
        checkpoint=checkpoints,
        output=output,
        n_windows=n_windows,
        actors=2,
        cpus_per_actor=1.0,
        rows_per_batch=256,
        progress=False,
    )
    started = time.perf_counter()
    result = run_backtest(settings)
    wall = time.perf_counter() - started
    timing = result.summary["timing"]
    return {"wall_s": wall, "dispatch_s": timing["dispatch_s"], "stages": timing["actor_stage_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-windows", type=int, default=2000, help="windows (origins) of the bundled series")
    parser.add_argument("--ks", default="1,2,4")
    args = parser.parse_args()
    import ray

    from distributed_onnx.runtime.local_ray import connect

    connect(None)  # one local Ray for every run (127.0.0.1), so no run pays for Ray's start-up
    ks = [int(k) for k in args.ks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as scratch:
        base = Path(scratch)
        models = copies(base, max(ks))
        for k in ks:
            together = one(models[:k], base / f"one-{k}", args.n_windows)
            alone = [one([model], base / f"alone-{k}-{model.stem}", args.n_windows) for model in models[:k]]
            work = args.n_windows * k
            stages = together["stages"]
            rows.append(
                {
                    "k": k,
                    "windows": args.n_windows,
                    "one_run_wxm_per_s": work / together["wall_s"],
                    "separate_runs_wxm_per_s": work / sum(run["wall_s"] for run in alone),
                    "one_run_dispatch_wxm_per_s": work / together["dispatch_s"],
                    "separate_dispatch_wxm_per_s": work / sum(run["dispatch_s"] for run in alone),
                    "one_run_stage_s": stages,
                    "score_share_of_model": stages.get("score", 0.0) / stages["model"] if stages.get("model") else None,
                    "separate_score_share_of_model": sum(r["stages"].get("score", 0.0) for r in alone)
                    / sum(r["stages"]["model"] for r in alone),
                }
            )
            row = rows[-1]
            row["ratio_wall"] = row["one_run_wxm_per_s"] / row["separate_runs_wxm_per_s"]
            row["ratio_dispatch"] = row["one_run_dispatch_wxm_per_s"] / row["separate_dispatch_wxm_per_s"]
            print(json.dumps(row), flush=True)
    ray.shutdown()
    document = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "2 actors x 1 CPU, rows per batch 256, reference checkpoint copied K times; other processes "
        "(other sessions' tests) shared this machine while it ran, so absolute rates are noisy, ratios less so.",
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compare.json").write_text(json.dumps(document, indent=2))
    lines = [
        "# Several checkpoints in one run vs one run per checkpoint",
        "",
        "Reproduce: `.venv/bin/python benchmarks/compare_bench.py` (script docstring: what each mode does). "
        f"Machine: {os.cpu_count()} CPUs, {platform.platform()}; 2 actors x 1 CPU; rows per batch 256; the "
        f"reference checkpoint copied K times; {args.n_windows} windows. {document['note']}",
        "",
        "| K | one run wxm/s | K runs wxm/s | ratio | one run wxm/s (dispatch) | K runs wxm/s (dispatch) | ratio "
        "| score / model time (one run) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['one_run_wxm_per_s']:,.0f} | {row['separate_runs_wxm_per_s']:,.0f} "
            f"| {row['ratio_wall']:.2f}x | {row['one_run_dispatch_wxm_per_s']:,.0f} "
            f"| {row['separate_dispatch_wxm_per_s']:,.0f} | {row['ratio_dispatch']:.2f}x "
            f"| {100 * (row['score_share_of_model'] or 0):.1f}% |"
        )
    lines += [
        "",
        "wxm/s: windows x models per second. Whole run: the `run_backtest` call (actor start and warm-up, dispatch, "
        "merge, leaderboard, report); dispatch: first part sent to last receipt. The score share is the actors' "
        "`score` stage over their `model` stage (receipt seconds, summed over parts).",
    ]
    (RESULTS / "compare.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
