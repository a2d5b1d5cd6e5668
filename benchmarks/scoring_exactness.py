"""How far the metrics of this tree are from another tree's (before a change to the scoring's code).

Runs the same backtests with each tree's in-process part runner (what each actor does, no Ray), merges the parts'
sums as the driver does and compares the two ``metrics`` tables and the two leaderboards row by row on the rows both
hold (matched by key; counts must be equal): each value is either the same float bit for bit or differs by a
relative amount this prints (float rounding is ~1e-16). Rows that only one tree writes (a metric added) are counted.
Two runs: the reference (913 windows of the bundled series, one series per batch) and six noisy copies of it with
3% of the values missing (stride 5, several series per part, pairs left out).

Reproduce (a minute)::

    git worktree add /tmp/base 3de9a32
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_exactness.py --baseline-tree /tmp/base
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("reference", "gaps")


def child(tree: Path, scenario: str, out: Path) -> None:
    """In a process whose first path is ``tree``: run every part in-process, write the merged metrics table."""
    sys.path[:0] = [str(tree), str(tree / "tests")]
    from backtest_data import merged_sums, run_parts_in_process

    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.resources import REFERENCE_DATASET

    scratch = Path(tempfile.mkdtemp(prefix="exactness-"))
    if scenario == "reference":
        settings = BacktestSettings(output=scratch / "run", n_windows=913, stride=1, progress=False)
    else:
        base = pq.read_table(REFERENCE_DATASET)
        y = base.column("y").to_numpy()
        rng = np.random.default_rng(0)
        tables = []
        for index in range(6):
            noisy = y * rng.uniform(0.5, 1.5) + rng.normal(0, 200, size=y.shape)
            noisy[rng.random(y.shape) < 0.03] = np.nan
            series_id = pa.array([f"s{index}"] * len(y))
            tables.append(pa.table({"series_id": series_id, "timestamp": base.column("timestamp"), "y": noisy}))
        pq.write_table(pa.concat_tables(tables), scratch / "data.parquet")
        settings = BacktestSettings(
            output=scratch / "run",
            data=scratch / "data.parquet",
            n_windows=300,
            stride=5,
            rows_per_batch=128,
            progress=False,
        )
    plan = run_parts_in_process(settings)
    scores = merged_sums(plan).merged()
    pq.write_table(scores.to_table(), out)
    from distributed_onnx.evaluation.scoring.leaderboard import leaderboard

    pq.write_table(leaderboard(scores, plan.step_us), out.with_suffix(".leaderboard.parquet"))


METRICS_KEYS = ("model", "scope", "series_id", "lead", "metric", "quantile", "convention")
LEADERBOARD_KEYS = ("kind", "model", "versus", "metric", "convention")
LEADERBOARD_VALUES = ("value", "ci_low", "ci_high", "statistic", "p_value")


def compare(before: pa.Table, after: pa.Table, keys: tuple[str, ...], values: tuple[str, ...]) -> dict[str, Any]:
    """Rows matched by ``keys``: counts equal, each of ``values`` bit for bit or how far apart."""

    def keyed(table: pa.Table) -> dict[tuple[Any, ...], dict[str, Any]]:
        rows = table.to_pylist()
        by_key = {tuple(row[key] for key in keys): row for row in rows}
        assert len(by_key) == len(rows), "duplicate keys"
        return by_key

    old_rows, new_rows = keyed(before), keyed(after)
    common = [key for key in old_rows if key in new_rows]
    if any(old_rows[key]["n"] != new_rows[key]["n"] for key in common):
        return {"error": "counts differ"}
    old = np.asarray([[old_rows[key][v] for v in values] for key in common], dtype=np.float64).ravel()
    new = np.asarray([[new_rows[key][v] for v in values] for key in common], dtype=np.float64).ravel()
    same = (old.view(np.uint64) == new.view(np.uint64)) | (np.isnan(old) & np.isnan(new))
    with np.errstate(all="ignore"):
        absolute = np.abs(old - new)
    absolute[same] = 0.0
    by_row = same.reshape(len(common), len(values)).all(axis=1) if common else np.ones(0, dtype=bool)
    metric_at = keys.index("metric")
    label = keys.index("convention")
    differing = Counter(f"{key[metric_at]} ({key[label]})" for key, ok in zip(common, by_row, strict=True) if not ok)
    return {
        "rows_compared": len(common),
        "values_compared": int(old.size),
        "bit_identical_values": int(same.sum()),
        "max_abs_difference": float(np.nanmax(absolute)) if absolute.size else 0.0,
        "differing_rows_by_metric": dict(differing),
        "rows_only_before": dict(Counter(f"{key[metric_at]} ({key[-1]})" for key in old_rows.keys() - new_rows.keys())),
        "rows_only_after": dict(Counter(f"{key[metric_at]} ({key[-1]})" for key in new_rows.keys() - old_rows.keys())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), args.child[1], Path(args.child[2]))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in SCENARIOS:
            tables = []
            for name, tree in (("before", args.baseline_tree.resolve()), ("after", ROOT)):
                out = Path(tmp) / f"{scenario}-{name}.parquet"
                command = [sys.executable, __file__, "--baseline-tree", str(tree), "--child", str(tree), scenario]
                subprocess.run([*command, str(out)], check=True, env={"PYTHONPATH": str(tree), "PATH": ""})
                tables.append((pq.read_table(out), pq.read_table(out.with_suffix(".leaderboard.parquet"))))
            (metrics_before, board_before), (metrics_after, board_after) = tables
            results[scenario] = {
                "metrics": compare(metrics_before, metrics_after, METRICS_KEYS, ("value",)),
                "leaderboard": compare(board_before, board_after, LEADERBOARD_KEYS, LEADERBOARD_VALUES),
            }
            print(scenario, json.dumps(results[scenario]), flush=True)
    document = {"baseline_tree": str(args.baseline_tree), "numpy": np.__version__, "scenarios": results}
    (ROOT / "benchmarks" / "results" / "scoring_exactness.json").write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
