"""The simulated fleet (``fleet_sim.py``): how far one driver scales, with the part count the default chooses.

Scenarios, each the real dispatcher over a fake cluster on a fake clock (no Ray):

1. ``default``: 2, 64 and 1,000 actors (64 nodes), 10 million windows, log-normal speeds (sigma 0.3) around
   100 windows/s per actor, 2% stragglers at a fifth of their speed, one node lost at half the ideal time
   (a new one joins 10 s later; replacements warm up for 5 s), the default part count.
2. ``parts_per_actor``: 1,000 actors, the same troubles, 1 to 32 parts per actor (the default's is 8).
3. ``scaling``: actors from 64 to 8,000 at the default part count and Ray's client cost per part measured end
   to end (``driver_share.json``), 10 million windows: where one driver stops keeping up.
4. ``hang``: the default scenario at 1,000 actors where 1 call in 2,000 hangs until its deadline.

Reproduce::

    .venv/bin/python benchmarks/fleet_bench.py [--ray-cost-us 250]

Results go to benchmarks/results/fleet.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path[:0] = [str(ROOT / "benchmarks")]

from fleet_sim import Fleet, simulate  # noqa: E402

from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan  # noqa: E402
from distributed_onnx.evaluation.driver.part_count import default_ramp_width, default_windows_per_part  # noqa: E402
from distributed_onnx.evaluation.driver.part_count import plan_parts as plan_ramped_parts  # noqa: E402

WINDOWS = 10_000_000
ROWS_PER_BATCH = 256


def plan_parts(windows: int, windows_per_part: int, ramp_width: int) -> list[PartSpec]:
    """The parts the run's planner cuts ``windows`` into (one series: the layout depends only on the count)."""
    plan = WindowPlan(
        counts=np.array([windows], dtype=np.int64),
        offsets=np.array([0, windows], dtype=np.int64),
        skipped=0,
        capped=0,
        capped_series=(),
    )
    return plan_ramped_parts(plan, windows_per_part, ROWS_PER_BATCH, ramp_width)


def per_actor_size(parts_per_actor: int, actors: int = 1000) -> int:
    """The part size (whole batches) that gives about ``parts_per_actor`` parts per actor."""
    return max(ROWS_PER_BATCH, -(-WINDOWS // (actors * parts_per_actor) // ROWS_PER_BATCH) * ROWS_PER_BATCH)


def run(fleet: Fleet, windows_per_part: int | None = None, windows: int = WINDOWS) -> dict[str, Any]:
    """The fleet over the default plan for its actors (the default's ramp, and its part size unless given)."""
    size = windows_per_part or default_windows_per_part(windows, ROWS_PER_BATCH, fleet.actors)
    width = default_ramp_width(fleet.actors)
    result = simulate(fleet, plan_parts(windows, size, width), windows, first_wave=width)
    result["default_part_count"] = windows_per_part is None
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-part-us", type=float, default=385.0, help="Ray's client cost per part: submit, get")
    parser.add_argument("--ray-wait-us", type=float, default=320.0, help="Ray's client cost per wait")
    parser.add_argument("--name", default="fleet")
    parser.add_argument("--quick", action="store_true", help="fewer scenarios")
    parser.add_argument("--render", action="store_true", help="print the tables of the last results")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads((RESULTS / f"{args.name}.json").read_text())))
        return
    base = Fleet(ray_cost_s_per_part=args.ray_part_us * 1e-6, ray_cost_s_per_wait=args.ray_wait_us * 1e-6)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "windows": WINDOWS,
        "rows_per_batch": ROWS_PER_BATCH,
        "fleet": asdict(base),
    }
    report["default"] = [run(replace(base, actors=actors)) for actors in (2, 64, 1000)]
    report["default_without_ray_cost"] = [
        run(replace(base, actors=1000, ray_cost_s_per_part=0.0, ray_cost_s_per_wait=0.0))
    ]
    if not args.quick:
        report["parts_per_actor"] = [
            run(
                base,
                windows_per_part=max(ROWS_PER_BATCH, -(-WINDOWS // (1000 * per) // ROWS_PER_BATCH) * ROWS_PER_BATCH),
            )
            for per in (1, 2, 4, 8, 16, 32)
        ]
        report["scaling"] = [run(replace(base, actors=actors)) for actors in (64, 250, 1000, 2000, 4000, 8000)]
        report["speed"] = [run(replace(base, windows_per_s=speed)) for speed in (1_000.0, 10_000.0)]
        report["hang"] = [run(replace(base, hang_probability=1 / 2000))]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2))


def render(report: dict[str, Any]) -> str:
    """fleet.md: one table per scenario."""
    columns = [
        ("actors", "actors", "{:,}"),
        ("windows_per_s_per_actor", "windows/s per actor", "{:,.0f}"),
        ("parts", "parts", "{:,}"),
        ("parts_per_actor", "parts per actor", "{:.1f}"),
        ("windows_per_part", "windows per part", "{:,}"),
        ("ideal_s", "ideal s", "{:,.1f}"),
        ("finished_s", "finished s", "{:,.1f}"),
        ("over_ideal", "over ideal", "{:+.1%}"),
        ("idle_actor_share", "idle actor time", "{:.1%}"),
        ("parts_retried", "parts retried", "{}"),
        ("deadlines_missed", "deadlines missed", "{}"),
        ("driver_code_us_per_part", "dispatcher us/part", "{:.0f}"),
        ("driver_us_per_part", "driver us/part (with Ray's)", "{:.0f}"),
        ("driver_cpu_share_of_wall", "driver CPU / wall", "{:.1%}"),
    ]
    titles = {
        "default": "The default part count: 2, 64 and 1,000 actors",
        "default_without_ray_cost": "1,000 actors, the dispatcher's own cost only (no Ray client cost added)",
        "parts_per_actor": "1,000 actors, other part sizes (the default's ramp kept)",
        "scaling": "Where one driver stops keeping up: more actors, the default part count",
        "speed": "1,000 faster actors (shorter runs of the same 10 million windows)",
        "hang": "1,000 actors, 1 call in 2,000 hangs until its deadline",
    }
    lines = []
    for key, title in titles.items():
        if key not in report:
            continue
        lines += [f"### {title}", "", "| " + " | ".join(name for _, name, _ in columns) + " |"]
        lines.append("|" + "---:|" * len(columns))
        for row in report[key]:
            lines.append("| " + " | ".join(form.format(row[field]) for field, _, form in columns) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
