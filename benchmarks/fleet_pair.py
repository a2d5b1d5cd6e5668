"""The simulated fleet's 1,000-actor default scenario from two trees, alternating rounds: the dispatcher's own cost.

Each round runs ``fleet_bench.run`` (1,000 actors, 10 million windows, the default part count, no Ray client cost
added: ``driver_code_us_per_part`` is the dispatcher's own code) in a fresh subprocess from each tree, in
alternating order, so that a loaded machine inflates both alike; the medians of the rounds are compared.

Reproduce::

    .venv/bin/python benchmarks/fleet_pair.py --baseline-tree /tmp/base --this-tree . --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys
from dataclasses import replace
sys.path[:0] = [sys.argv[1] + "/benchmarks"]
import fleet_bench
from fleet_sim import Fleet
result = fleet_bench.run(replace(Fleet(), actors=1000))
print("RESULT " + json.dumps(result))
"""

KEYS = ("driver_code_us_per_part", "driver_cpu_share_of_wall", "over_ideal", "waits", "whole_cpu_s")


def one(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    completed = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(tree)], env=env, capture_output=True, text=True, check=True
    )
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    return {key: result[key] for key in KEYS} | {"load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", required=True)
    parser.add_argument("--this-tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = {"baseline": Path(args.baseline_tree).resolve(), "this": Path(args.this_tree).resolve()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name in list(trees) if round_ % 2 == 0 else list(reversed(trees)):
            runs[name].append(one(trees[name]))
            print(name, round_, json.dumps(runs[name][-1]), flush=True)
    medians = {name: {key: statistics.median(run[key] for run in each) for key in KEYS} for name, each in runs.items()}
    print(json.dumps({"medians": medians, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
