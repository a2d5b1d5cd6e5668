"""Session build time of the published-size Chronos-2 graph: optimizing it (no cache) against loading the cached
optimized graph (``distributed_onnx/model/backend/optimized_cache.py``), alternating, one intra-op thread each.

Builds amazon/chronos-2's published architecture with random weights (119.5 M parameters, context 8192; see
``export_parity_published.py``), exports it once with ``--horizon 64`` into ``--workdir`` (reused on a rerun),
then per round builds: a session that optimizes the graph itself (``cache_optimized_graph: false``, the default
``ENABLE_ALL``), the same at ``ENABLE_EXTENDED`` (the cached graph's level), and one that loads the cached graph.
Prints the medians and spreads as JSON. Timings: run it on a quiet machine and record the load average.

    .venv/bin/python benchmarks/session_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from export_parity_published import build


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/session-start"))
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = args.workdir
    os.environ["DISTRIBUTED_ONNX_CACHE"] = str(work / "cache")
    checkpoint = work / "model" / "chronos2.onnx"
    if not checkpoint.is_file():
        build(work / "pretrained", args.context)
        argv = [sys.executable, "-m", "distributed_onnx", "export", "chronos2", "--from-pretrained"]
        argv += [str(work / "pretrained"), "--output", str(checkpoint), "--horizon", "64", "--parity-windows", "1"]
        argv += ["--resolution-minutes", "60"]  # required without --data
        subprocess.run(argv, check=True, capture_output=True)

    from distributed_onnx.model.backend.onnx import OnnxBackend
    from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    resolved = LocalCheckpoint(path=checkpoint).resolve()
    kinds = {
        "optimize_enable_all": {"cache_optimized_graph": False},
        "optimize_enable_extended": {"cache_optimized_graph": False, "graph_optimization_level": "ENABLE_EXTENDED"},
        "load_cached": {},
    }
    OnnxBackend.from_checkpoint(resolved, [CpuProvider()]).close()  # fills the cache (timed apart below)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, options in kinds.items():
            started = time.perf_counter()
            config = SessionOptionsConfig(intra_op_num_threads=1, **options)  # type: ignore[arg-type]
            OnnxBackend.from_checkpoint(resolved, [CpuProvider()], config).close()
            times[kind].append(time.perf_counter() - started)
    summary = {
        kind: {
            "median_s": round(statistics.median(values), 2),
            "min_s": round(min(values), 2),
            "max_s": round(max(values), 2),
        }
        for kind, values in times.items()
    }
    print(json.dumps({"rounds": args.rounds, "load_average": os.getloadavg(), **summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
