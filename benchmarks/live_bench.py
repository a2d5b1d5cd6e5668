"""Live evaluation's cost on serving, side by side in one run: the forecast log on with a shadow model, against
the log off and no shadow, one series per request at 1 and 32 clients.

Servers run one at a time, each a fresh ``distributed-onnx serve`` process (one replica, direct ingress, one ORT
thread per model), in the order off, log only, log + shadow, off again, so the two "off" runs show the machine's
drift and "log only" separates the log's cost from the shadow's. "Log + shadow" serves
the reference checkpoint and a copy of it under another name as its shadow (the same model: the shadow does
the primary's work again after every answer), with the log in a local folder. The load client is
``benchmarks/serve_bench.py``'s (asyncio HTTP/1.1 keep-alive, in this process). After each "on" run the
replica's /metrics says how many forecasts were served, shadowed, logged and dropped.

Reproduce (about 5 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/live_bench.py

Results go to benchmarks/results/live.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_bench import RESULTS, free_port, history, load, start_server, stop_server

OFF = "log off, no shadow"
LOG = "log on, no shadow"
ON = "log on + 1 shadow model"
CONCURRENCY = [1, 32]


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("distributed_onnx_forecast") and not sample.name.endswith("_created"):
                key = f"{sample.name}{{model={sample.labels.get('model')},reason={sample.labels.get('reason', '')}}}"
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per cell")
    parser.add_argument("--cap-s", type=float, default=20.0, help="time cap per cell")
    parser.add_argument("--context", type=int, default=168, help="history length of the one series")
    parser.add_argument("--horizon", type=int, default=48)
    args = parser.parse_args()

    import ray

    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    work = Path(tempfile.mkdtemp(prefix="live-bench-"))
    shadow = work / "challenger.onnx"
    shutil.copy(REFERENCE_CHECKPOINT, shadow)
    shutil.copy(REFERENCE_CHECKPOINT.with_suffix(".metadata.json"), work / "challenger.metadata.json")
    rng = np.random.default_rng(0)
    start = "2000-08-01T00:00:00Z"
    body = json.dumps(
        {"series": [{"series_id": "a", "y": history(rng, args.context), "start": start}], "horizon": args.horizon}
    ).encode()
    serve = [sys.executable, "-m", "distributed_onnx", "serve", "--checkpoint", str(REFERENCE_CHECKPOINT)]
    runs = [
        (OFF, serve),
        (LOG, [*serve, "--forecast-log", str(work / "log-only")]),
        (ON, [*serve, "--checkpoint", str(shadow), "--shadow", "challenger", "--forecast-log", str(work / "log")]),
        (OFF, serve),
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "conditions": {
            "checkpoint": REFERENCE_CHECKPOINT.name,
            "cpus": os.cpu_count(),
            "load_before": os.getloadavg(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "requests_per_cell": args.requests,
            "cap_s": args.cap_s,
            "context": args.context,
            "horizon": args.horizon,
        },
        "runs": [],
    }
    for label, command in runs:
        port = free_port()
        print(f"{label}: starting ...", flush=True)
        process = start_server([*command, "--port", str(port), "--grpc-port", str(free_port())], port)
        entry: dict[str, Any] = {"server": label, "cells": []}
        try:
            for concurrency in CONCURRENCY:
                print(f"{label}: {concurrency} clients ...", flush=True)
                entry["cells"].append(
                    load(port, "/v1/forecast", body, requests=args.requests, concurrency=concurrency, cap_s=args.cap_s)
                )
            if label != OFF:
                time.sleep(3.0)  # the shadow work and the log's last batch
                entry["counters"] = scrape(port)
        finally:
            stop_server(process)
        results["runs"].append(entry)
    results["conditions"]["load_after"] = os.getloadavg()
    shutil.rmtree(work, ignore_errors=True)
    (RESULTS / "live.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "live.md").write_text(markdown(results))
    for log in RESULTS.glob(".server-*.log"):
        log.unlink()
    print((RESULTS / "live.md").read_text())
    return 0


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    lines = [
        "# Live evaluation benchmark: the forecast log and a shadow model, on against off",
        "",
        "Reproduce: `.venv/bin/python benchmarks/live_bench.py`; writes this file and `live.json`.",
        "",
        f"Conditions: {c['cpus']} cores, no GPU, checkpoint `{c['checkpoint']}` (the shadow: a copy of it), Ray "
        f"{c['ray']}, Python {c['python']}; one series of {c['context']} steps per request (with `start`, so every "
        f"forecast is placeable), horizon {c['horizon']}; {c['requests_per_cell']} requests per cell (cap "
        f"{c['cap_s']} s); servers one at a time, in the order of the table; load average before "
        f"{[round(x, 2) for x in c['load_before']]}, after {[round(x, 2) for x in c['load_after']]}. Other "
        "processes (other sessions' tests) shared this machine during the run: read the two 'off' rows as the "
        "noise.",
        "",
        "| server | p50 ms, 1 client | req/s, 32 clients | p50 ms, 32 clients | p99 ms, 32 clients | codes (32) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for entry in results["runs"]:
        one, many = entry["cells"]
        cells = [entry["server"], one["p50_ms"], many["requests_per_s"], many["p50_ms"], many["p99_ms"], many["codes"]]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    off = [entry["cells"][1] for entry in results["runs"] if entry["server"] == OFF]
    off_rps = float(np.mean([cell["requests_per_s"] for cell in off]))
    off_p50 = float(np.mean([cell["p50_ms"] for cell in off]))
    lines += [
        "",
        "## Target (issue 19): within 10% of the log off, at 32 clients (against the mean of the two 'off' runs)",
        "",
        "| server | req/s / off (>= 0.9) | p50 / off (<= 1.1) | met |",
        "|---|---:|---:|---|",
    ]
    for label in (LOG, ON):
        entry = next(entry for entry in results["runs"] if entry["server"] == label)
        rps, p50 = entry["cells"][1]["requests_per_s"] / off_rps, entry["cells"][1]["p50_ms"] / off_p50
        lines.append(f"| {label} | {rps:.2f} | {p50:.2f} | {'yes' if rps >= 0.9 and p50 <= 1.1 else '**no**'} |")
    for label in (LOG, ON):
        entry = next(entry for entry in results["runs"] if entry["server"] == label)
        lines += ["", f"## What the '{label}' replica counted (/metrics, after the run)", "", "| counter | value |"]
        lines.append("|---|---:|")
        for key, value in sorted(entry.get("counters", {}).items()):
            lines.append(f"| `{key}` | {value:g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
