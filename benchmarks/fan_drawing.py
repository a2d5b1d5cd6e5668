"""The report's 16 forecast fans drawn by this tree against another checkout's, side by side in one run.

The fans are the report's largest drawing cost after the last part (4 series x 4 windows). Each side runs in
its own process (its own matplotlib import and first figure, paid before timing), draws the same 16 fans
(horizon 96, 512 steps of history, 4 central intervals, one other model's median) ``--repeats`` times, and
reports the best time. This tree draws them as the report does (``report/plots.py`` ``FanCanvas``: one
figure, titles and legends in HTML); the baseline with its own ``plots.fan`` per fan. Reproduce::

    git worktree add --detach /tmp/base c9945a5   # a figure per fan, title and legend in the SVG
    .venv/bin/python benchmarks/fan_drawing.py --baseline-tree /tmp/base

Results go to benchmarks/results/fan_drawing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HORIZON = 96
HOUR_US = 3_600_000_000


def _fans() -> list:  # type: ignore[type-arg]
    import numpy as np

    from distributed_onnx.evaluation.report import plots

    rng = np.random.default_rng(0)
    fans = []
    for index in range(16):
        middle = 30_000 + 5_000 * rng.normal(size=HORIZON)
        bands = [
            (q, 1 - q, middle - (0.5 - q) * 8_000, middle + (0.5 - q) * 8_000, False) for q in (0.1, 0.2, 0.3, 0.4)
        ]
        fans.append(
            plots.Fan(
                f"series {index // 4} · window {index % 4}",
                1_700_000_000_000_000 + index * 86_400_000_000,
                HOUR_US // 2,
                30_000 + 5_000 * rng.normal(size=512),
                middle + 1_000 * rng.normal(size=HORIZON),
                bands,
                middle,
                [("seasonal_naive", middle + 500)],
            )
        )
    return fans


def measure(repeats: int) -> dict[str, float | int | str]:
    """Draw the 16 fans ``repeats`` times in this process; the best seconds and the SVG bytes."""
    from distributed_onnx.evaluation.report import plots

    fans = _fans()
    plots.warm_up()
    canvas_class = getattr(plots, "FanCanvas", None)
    best = float("inf")
    svg_bytes = 0
    for _ in range(repeats):
        started = time.perf_counter()
        if canvas_class is not None:
            canvas = canvas_class()
            svgs = [canvas.draw(fan) for fan in fans]
        else:
            svgs = [plots.fan(fan) for fan in fans]
        best = min(best, time.perf_counter() - started)
        svg_bytes = sum(len(svg) for svg in svgs)
    return {"best_s": best, "svg_bytes": svg_bytes, "drawn_by": "FanCanvas" if canvas_class else "plots.fan"}


def _side(tree: Path, repeats: int) -> dict[str, float | int | str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, __file__, "--child", "--repeats", str(repeats)]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree, check=True)
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", help="another checkout, drawn side by side")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="pairs of processes, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeats)))
        return
    trees = {"this tree": ROOT} | ({"baseline": Path(args.baseline_tree).resolve()} if args.baseline_tree else {})
    rounds = []
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        rounds.append({name: _side(trees[name], args.repeats) for name in order})
    report: dict[str, object] = {"machine_cpus": os.cpu_count(), "load_average": os.getloadavg(), "rounds": rounds}
    if args.baseline_tree:
        ratios = sorted(float(r["this tree"]["best_s"]) / float(r["baseline"]["best_s"]) for r in rounds)
        report["this_over_baseline_median"] = ratios[(len(ratios) - 1) // 2]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fan_drawing.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
