"""The driver's share end to end: a near-free model, so that what the driver and Ray cost per part shows.

The model is the season-copy graph of the tests (``tests/graphs.py``: every quantile repeats the last 8 context
steps; a Slice and a Mul), so the actors' time is packing, writing and scoring, and the driver's is its own.
Two runs, each a whole ``run_backtest`` in its own subprocess:

1. ``embedded_2_actors``: the command's own embedded Ray, 2 actors of 1 CPU;
2. ``cluster_8_actors``: a ``ray.cluster_utils.Cluster`` on 127.0.0.1 (a head and three worker nodes, 2 CPUs
   each), 8 actors of 1 CPU (on a 2-core machine: the CPUs are Ray's bookkeeping, the cores are shared).

And Ray's client cost per part alone (``ray_calls_2_actors``, ``ray_calls_16_actors``): the real dispatcher
over 5,000 parts on actors that answer a receipt at once (no model, no file), the driver's CPU per part.

Reported from each run's ``summary.json``: the driver's CPU per window (whole run and dispatch phase), per
part in the dispatch phase (the Ray client's cost per part that ``fleet_sim.py`` adds on its fake clock),
parts, windows/s.

Reproduce::

    .venv/bin/python benchmarks/driver_share.py [--windows 200000]

Results go to benchmarks/results/driver_share.{json,md} (with the fleet's, ``fleet.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LOOPBACK = "127.0.0.1"
MODES = ("ray_calls_2_actors", "ray_calls_16_actors", "embedded_2_actors", "cluster_8_actors")


def write_series(path: Path, n_series: int, length: int) -> None:
    rng = np.random.default_rng(0)
    start = np.datetime64("2024-01-01T00:00", "us")
    step = np.timedelta64(30, "m").astype("timedelta64[us]")
    stamps = start + step * np.arange(length)
    tables = [
        pa.table(
            {
                "series_id": pa.array([f"s{index:04d}"] * length),
                "timestamp": pa.array(stamps),
                "y": pa.array(100 + 10 * np.sin(np.arange(length) / 8) + rng.normal(0, 1, length)),
            }
        )
        for index in range(n_series)
    ]
    pq.write_table(pa.concat_tables(tables), path)


def ray_calls(parts: int, actors: int) -> dict[str, Any]:
    """The real dispatcher on real Ray actors that do nothing: the driver's CPU per part is Ray's client cost
    (submit, wait, get a receipt) plus the dispatcher's, with no model and no file in the way."""
    import resource

    import ray

    from distributed_onnx.evaluation.data.windows import PartSpec
    from distributed_onnx.evaluation.driver._part_ledger import PartLedger
    from distributed_onnx.evaluation.part_messages import PartReceipt
    from distributed_onnx.runtime.dispatch import DispatchCallbacks, DispatchConfig, Dispatcher

    ray.init(_node_ip_address=LOOPBACK, num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0.01)
    class Idle:
        def ready(self) -> bool:
            return True

        def run(self, part: PartSpec) -> PartReceipt:
            seconds = {"read": 0.0, "pack": 0.0, "model": 0.0, "table": 0.0, "score": 0.0, "write": 0.0}
            return PartReceipt(
                part=part.index,
                windows=part.n_windows,
                rows=0,
                part_bytes=0,
                sums_bytes=0,
                write_attempts=1,
                seconds=seconds,
                models_computed=["m"],
                node_id="n",
            )

    pool = [Idle.remote() for _ in range(actors)]  # type: ignore[attr-defined]
    ray.get([actor.ready.remote() for actor in pool])
    ledger = PartLedger()
    callbacks = DispatchCallbacks[PartSpec](
        submit=lambda actor, part: actor.run.remote(part),
        on_result=lambda part, receipt: ledger.add_receipt(receipt, 0.0),
        on_failure=lambda part, error: None,
        key=lambda part: part.index,
        attempt_timeout_s=lambda part: ledger.deadline_s(part, None),
        size=lambda part: part.n_windows,
    )
    items = [PartSpec(index, index * 256, (index + 1) * 256) for index in range(parts)]

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    import time

    started_cpu, started = cpu(), time.perf_counter()
    stats = Dispatcher(pool, callbacks, DispatchConfig()).run(items)
    spent, wall = cpu() - started_cpu, time.perf_counter() - started
    ray.shutdown()
    return {
        "mode": f"ray_calls_{actors}_actors",
        "parts": stats.completed,
        "actors": actors,
        "wall_s": round(wall, 2),
        "driver_cpu_s": round(spent, 3),
        "driver_cpu_us_per_part": round(1e6 * spent / stats.completed, 1),
        "parts_per_s": round(stats.completed / wall, 1),
    }


def child(mode: str, work: Path, windows: int) -> dict[str, Any]:
    if mode.startswith("ray_calls"):
        return ray_calls(parts=5000, actors=int(mode.split("_")[2]))
    sys.path.insert(0, str(ROOT / "tests"))
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from graphs import write_season_copy

    from distributed_onnx.evaluation.backtest import run_backtest
    from distributed_onnx.evaluation.settings import BacktestSettings

    checkpoint = write_season_copy(work)
    n_series = 50
    per_series = -(-windows // n_series)
    data = work / "series.parquet"
    write_series(data, n_series, per_series + 64)
    common: dict[str, Any] = {
        "checkpoint": checkpoint.weights_path,
        "data": data,
        "output": work / mode,
        "n_windows": per_series,
        "cpus_per_actor": 1,
        "progress": False,
    }
    cluster = None
    if mode == "cluster_8_actors":
        import ray
        from ray.cluster_utils import Cluster

        from distributed_onnx.runtime import ray_private

        for private in (ray_private.WRITE_RAY_ADDRESS, ray_private.RESET_RAY_ADDRESS):
            setattr(private.owner(), private.attribute, lambda *args, **kwargs: None)
        node = {"node_ip_address": LOOPBACK, "object_store_memory": 100 * 1024 * 1024}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 2, "include_dashboard": False})
        for _ in range(3):
            cluster.add_node(**node, num_cpus=2)
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False)
        settings = BacktestSettings(**common, actors=8, address=cluster.address)
    else:
        settings = BacktestSettings(**common, actors=2)
    try:
        result = run_backtest(settings)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
    summary = result.summary
    timing, parts = summary["timing"], summary["parts"]
    computed = summary["windows"]["run_now"]
    return {
        "mode": mode,
        "windows": computed,
        "parts": parts["planned"],
        "actors": len(summary["actors"]),
        "windows_per_s": timing["windows_per_s"],
        "dispatch_s": timing["dispatch_s"],
        "driver_cpu_s": timing["driver_cpu_s"],
        "driver_cpu_us_per_window": timing.get("driver_cpu_us_per_window"),
        "driver_cpu_dispatch_s": timing["driver_cpu_dispatch_s"],
        "driver_cpu_dispatch_us_per_window": timing["driver_cpu_dispatch_us_per_window"],
        "driver_cpu_dispatch_us_per_part": timing.get("driver_cpu_dispatch_us_per_part"),
        "driver_cpu_phases_s": timing["driver_cpu_phases_s"],
        "report_drawn_by": timing.get("report_drawn_by"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=200_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="*", default=[*MODES])
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, Path(args.work), args.windows)), flush=True)
        return
    runs = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, __file__, "--child", mode, "--work", tmp, "--windows", str(args.windows)]
            completed = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
            lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
            result = json.loads(lines[-1].removeprefix("RESULT ")) if lines else {"error": completed.stderr[-3000:]}
            result.setdefault("mode", mode)
            result["load_average_after"] = os.getloadavg()
            print(json.dumps(result), flush=True)
            runs.append(result)
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "windows": args.windows,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "driver_share.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
