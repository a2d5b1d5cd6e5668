"""How far the metrics of this tree are from another tree's (before a change to the scoring's summation order).

Runs the same backtests with each tree's in-process part runner (what each actor does, no Ray), merges the parts'
sums as the driver does and compares the two ``metrics`` tables row by row: keys and counts must be equal, and each
value is either the same float bit for bit or differs by a relative amount this prints (float rounding is ~1e-16).
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
    pq.write_table(merged_sums(plan).merged().to_table(), out)


def compare(before: pa.Table, after: pa.Table) -> dict[str, Any]:
    keys = ["model", "scope", "series_id", "lead", "metric", "quantile", "convention", "n"]
    if not before.select(keys).equals(after.select(keys)):
        return {"error": "the two tables do not hold the same rows (keys or counts differ)"}
    old, new = before.column("value").to_numpy(), after.column("value").to_numpy()
    same = old.view(np.uint64) == new.view(np.uint64)
    with np.errstate(all="ignore"):
        relative = np.abs(old - new) / np.abs(old)
    relative[same] = 0.0
    metric = np.asarray(before.column("metric").to_pylist())
    convention = np.asarray(before.column("convention").to_pylist())
    differing = Counter(f"{m} ({c})" for m, c in zip(metric[~same], convention[~same], strict=True))
    return {
        "rows": int(old.size),
        "bit_identical": int(same.sum()),
        "max_relative_difference": float(np.nanmax(relative)) if relative.size else 0.0,
        "differing_rows_by_metric": dict(differing),
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
                tables.append(pq.read_table(out))
            results[scenario] = compare(*tables)
            print(scenario, json.dumps(results[scenario]), flush=True)
    document = {"baseline_tree": str(args.baseline_tree), "numpy": np.__version__, "scenarios": results}
    (ROOT / "benchmarks" / "results" / "scoring_exactness.json").write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
