"""Live evaluation's cost on serving, interleaved so a noisy machine can still give a verdict: the forecast log on
with a shadow model (on every request, and on a tenth of them), the log on alone, and the log off, one series per
request at 32 clients (and 1).

Four ``distributed-onnx serve`` processes (one replica each, direct ingress, one ORT thread per model) are
started once and stay up; the load then visits them in turn, round after round (A B C D, B C D A, ...: the
order rotates so no configuration always follows the same one), each cell a short burst from the same client.
Each configuration so meets the machine's drift (other processes come and go) at the same moments, and every
round gives a *paired* ratio (on / off, the two measured seconds apart). The verdict uses the median over
rounds of those paired ratios; the spread of the ratios says how far to trust it. The idle servers cost
every cell the same (their embedded Rays' background work). After every cell the load pauses
(``--pause-s``) so the shadow's and the log's last work does not land in the next cell.

"Log + shadow" serves the reference checkpoint and a copy of it under another name as its shadow (the same
model: the shadow does the primary's work again after every answer), with the log in a local folder. The load
client is ``benchmarks/serve_bench.py``'s (asyncio HTTP/1.1 keep-alive, in this process). After the run each
"on" replica's /metrics says how many forecasts were served, shadowed (or skipped), logged and dropped. The
1-minute load average is read before and after every cell.

Reproduce (about 4 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/live_bench.py            # --rounds 8 --requests 600

Results go to benchmarks/results/live.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_bench import history, load
from servers import RESULTS, free_port, remove_server_logs, serve_command, start_server, stop_server

OFF = "log off, no shadow"
LOG = "log on, no shadow"
ON = "log on + 1 shadow model"
SAMPLED = "log on + 1 shadow model on 10% of requests"
SHADOW_FRACTION = 0.1
CONFIGURATIONS = [OFF, LOG, ON, SAMPLED]
COMPARED = (LOG, ON, SAMPLED)
MANY, ONE = 32, 1


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


def log_cpu_per_request(requests: int, context: int, horizon: int) -> float:
    """Microseconds of CPU (every thread of this process: the event loop's share and the log's writer thread)
    per answered request handed to the forecast log, in process: the log's own cost, without a server."""
    import asyncio

    from distributed_onnx.live.log.writer import ForecastLog
    from distributed_onnx.serve.log.traffic import LiveTraffic
    from distributed_onnx.serve.operations.metrics import LiveMetrics
    from distributed_onnx.serve.wire.schemas import ForecastRequest

    class Model:
        name, checkpoint_sha256, resolution_minutes = "m", "0" * 64, 60

    request = ForecastRequest.model_validate(
        {"series": [{"series_id": "a", "y": [1.0] * context, "start": "2000-08-01T00:00:00Z"}], "horizon": horizon}
    )
    forecasts = np.ones((1, horizon, 9), np.float32)
    folder = Path(tempfile.mkdtemp(prefix="live-bench-log-"))
    log = ForecastLog(folder, flush_interval_s=1.0)
    traffic = LiveTraffic(log, LiveMetrics(log, replica="bench"))

    async def answer_all(count: int) -> None:
        for index in range(count):
            traffic.answered(Model(), request, forecasts, (0.5,) * 9, f"r{index}", time.time_ns() // 1000)
            if index % 32 == 31:
                await traffic.drain()
        await traffic.drain()

    asyncio.run(answer_all(1000))  # warm: the first Parquet write loads what it needs once
    log.flush()
    started = time.process_time()
    asyncio.run(answer_all(requests))
    log.close()
    cpu_s = time.process_time() - started
    shutil.rmtree(folder, ignore_errors=True)
    return round(cpu_s / requests * 1e6, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=600, help="requests per 32-client cell")
    parser.add_argument("--requests-one", type=int, default=200, help="requests per 1-client cell")
    parser.add_argument("--cap-s", type=float, default=15.0, help="time cap per cell")
    parser.add_argument("--pause-s", type=float, default=2.0, help="pause after each cell")
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
    serve = serve_command("--checkpoint", str(REFERENCE_CHECKPOINT))
    commands = {
        OFF: serve,
        LOG: [*serve, "--forecast-log", str(work / "log-only")],
        ON: [*serve, "--checkpoint", str(shadow), "--shadow", "challenger", "--forecast-log", str(work / "log")],
        SAMPLED: [
            *serve,
            *("--checkpoint", str(shadow), "--shadow", "challenger", "--shadow-fraction", str(SHADOW_FRACTION)),
            *("--forecast-log", str(work / "log-sampled")),
        ],
    }
    results: dict[str, Any] = {
        "conditions": {
            "checkpoint": REFERENCE_CHECKPOINT.name,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "rounds": args.rounds,
            "requests_per_cell": {str(MANY): args.requests, str(ONE): args.requests_one},
            "cap_s": args.cap_s,
            "pause_s": args.pause_s,
            "context": args.context,
            "horizon": args.horizon,
        },
        "cells": [],
        "log_cpu_us_per_request": log_cpu_per_request(20_000, args.context, args.horizon),
    }
    ports: dict[str, int] = {}
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        for label, command in commands.items():
            print(f"{label}: starting ...", flush=True)
            ports[label] = free_port()
            processes[label] = start_server(
                [*command, "--port", str(ports[label]), "--grpc-port", str(free_port())], ports[label]
            )
        for label in CONFIGURATIONS:  # warm every server's connections and first requests once
            load(ports[label], "/v1/forecast", body, requests=4 * MANY, concurrency=MANY, cap_s=args.cap_s)
        results["conditions"]["load_before"] = os.getloadavg()
        for round_index in range(args.rounds):
            shift = round_index % len(CONFIGURATIONS)
            for label in CONFIGURATIONS[shift:] + CONFIGURATIONS[:shift]:
                for concurrency, requests in ((MANY, args.requests), (ONE, args.requests_one)):
                    load_before = os.getloadavg()[0]
                    cell = load(
                        ports[label],
                        "/v1/forecast",
                        body,
                        requests=requests,
                        concurrency=concurrency,
                        cap_s=args.cap_s,
                        warm=False,
                    )
                    cell |= {"server": label, "round": round_index, "load_1min": [load_before, os.getloadavg()[0]]}
                    results["cells"].append(cell)
                    print(f"round {round_index} {label} {concurrency}: {cell['requests_per_s']} req/s", flush=True)
                    time.sleep(args.pause_s)
        results["conditions"]["load_after"] = os.getloadavg()
        time.sleep(3.0)  # the shadow work and the log's last batch
        results["counters"] = {label: scrape(ports[label]) for label in COMPARED}
    finally:
        for process in processes.values():
            stop_server(process)
        shutil.rmtree(work, ignore_errors=True)
    results["summary"] = summary(results)
    (RESULTS / "live.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "live.md").write_text(markdown(results))
    remove_server_logs()
    print((RESULTS / "live.md").read_text())
    return 0


def _cells(results: dict[str, Any], label: str, concurrency: int) -> list[dict[str, Any]]:
    found = [c for c in results["cells"] if c["server"] == label and c["concurrency"] == concurrency]
    return sorted(found, key=lambda cell: cell["round"])


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per configuration: medians over rounds; per "on" configuration: the paired ratios against "off"."""
    out: dict[str, Any] = {"medians": {}, "paired": {}}
    for label in CONFIGURATIONS:
        many, one = _cells(results, label, MANY), _cells(results, label, ONE)
        out["medians"][label] = {
            "requests_per_s_32": float(np.median([c["requests_per_s"] for c in many])),
            "p50_ms_32": float(np.median([c["p50_ms"] for c in many])),
            "p99_ms_32": float(np.median([c["p99_ms"] for c in many])),
            "p50_ms_1": float(np.median([c["p50_ms"] for c in one])),
        }
    off = _cells(results, OFF, MANY)
    for label in COMPARED:
        mine = _cells(results, label, MANY)
        rps = [m["requests_per_s"] / o["requests_per_s"] for m, o in zip(mine, off, strict=True)]
        p50 = [m["p50_ms"] / o["p50_ms"] for m, o in zip(mine, off, strict=True)]
        out["paired"][label] = {
            "requests_per_s_ratios": [round(x, 3) for x in rps],
            "p50_ratios": [round(x, 3) for x in p50],
            "requests_per_s_median": round(float(np.median(rps)), 3),
            "p50_median": round(float(np.median(p50)), 3),
            "met": bool(np.median(rps) >= 0.9 and np.median(p50) <= 1.1),
        }
    off_rps = [c["requests_per_s"] for c in off]
    out["off_spread"] = round(max(off_rps) / min(off_rps), 3)  # how much "off" alone moved between rounds
    loads = [x for c in results["cells"] for x in c["load_1min"]]
    out["load_1min"] = {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)}
    return out


def markdown(results: dict[str, Any]) -> str:
    c, s = results["conditions"], results["summary"]
    load_range = s["load_1min"]
    lines = [
        "# Live evaluation benchmark: the forecast log and a shadow model, on against off (interleaved)",
        "",
        "Reproduce: `.venv/bin/python benchmarks/live_bench.py`; writes this file and `live.json`.",
        "",
        f"Conditions: {c['cpus']} cores, no GPU, checkpoint `{c['checkpoint']}` (the shadow: a copy of it), Ray "
        f"{c['ray']}, Python {c['python']}; one series of {c['context']} steps per request (with `start`, so every "
        f"forecast is placeable), horizon {c['horizon']}. The four servers run side by side (each one replica, "
        f"direct ingress, one ORT thread per model); {c['rounds']} rounds, each visiting every server (order "
        f"rotated per round) with {c['requests_per_cell'][str(MANY)]} requests at 32 clients then "
        f"{c['requests_per_cell'][str(ONE)]} at 1 client (cap {c['cap_s']} s per cell, {c['pause_s']} s pause "
        f"after each). 1-minute load average during the cells: min {load_range['min']:.2f}, median "
        f"{load_range['median']:.2f}, max {load_range['max']:.2f} (2 cores: above 2 means other processes, other "
        "sessions' tests, shared the machine).",
        "",
        "## Verdict (issue 19): within 10% of the log off at 32 clients, by the median of the paired ratios",
        "",
        "| server | req/s / off, median (>= 0.9) | p50 / off, median (<= 1.1) | met | req/s ratios by round |",
        "|---|---:|---:|---|---|",
    ]
    for label in COMPARED:
        paired = s["paired"][label]
        ratios = ", ".join(f"{x:.2f}" for x in paired["requests_per_s_ratios"])
        met = "yes" if paired["met"] else "**no**"
        lines.append(
            f"| {label} | {paired['requests_per_s_median']:.2f} | {paired['p50_median']:.2f} | {met} | {ratios} |"
        )
    lines += [
        "",
        f"'Off' alone moved by {s['off_spread']:.2f}x between its best and worst round (the machine's noise).",
        "",
        "Reading: at 32 clients the replica's CPUs are saturated, so whatever runs after the answer takes its CPU "
        "time from the next requests. The shadow here is a copy of the primary: it repeats every model call, the "
        "worst case for this target (a cheaper challenger, or a replica with cores to spare, was not measured); "
        f"`--shadow-fraction {SHADOW_FRACTION}` has it forecast a tenth of the requests (drawn by request id). "
        f"The log's own CPU, measured in this process without a server (20,000 answers handed to a log in a local "
        f"folder after 1,000 to warm it, the event loop's share and the writer thread's together): "
        f"{results.get('log_cpu_us_per_request', '-')} us per request.",
        "",
        "## Medians over rounds",
        "",
        "| server | req/s, 32 clients | p50 ms, 32 | p99 ms, 32 | p50 ms, 1 client |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in CONFIGURATIONS:
        m = s["medians"][label]
        lines.append(
            f"| {label} | {m['requests_per_s_32']:.1f} | {m['p50_ms_32']:.2f} | {m['p99_ms_32']:.2f} | "
            f"{m['p50_ms_1']:.2f} |"
        )
    lines += [
        "",
        "## Every cell at 32 clients",
        "",
        "| round | server | req/s | p50 ms | p99 ms | codes | load 1 min (before, after) |",
        "|---:|---|---:|---:|---:|---|---|",
    ]
    for cell in results["cells"]:
        if cell["concurrency"] == MANY:
            loads = ", ".join(f"{x:.2f}" for x in cell["load_1min"])
            lines.append(
                f"| {cell['round']} | {cell['server']} | {cell['requests_per_s']} | {cell['p50_ms']} | "
                f"{cell['p99_ms']} | {cell['codes']} | {loads} |"
            )
    for label in COMPARED:
        lines += ["", f"## What the '{label}' replica counted (/metrics, after the run)", "", "| counter | value |"]
        lines.append("|---|---:|")
        for key, value in sorted(results["counters"].get(label, {}).items()):
            lines.append(f"| `{key}` | {value:g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
