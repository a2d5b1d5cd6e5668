"""Several models in one Serve application, placed three ways: every model in every replica (this package's
design), Ray Serve's model multiplexing (``@serve.multiplexed``), one deployment per model; for 2 and 4 small
checkpoints, side by side in one run.

``benchmarks/multiplex_server.py`` serves every way at once, one application each in one Serve instance, with
the same request handling (Serve's proxy, one ORT thread per model, no batching: only placement and routing
differ); ``distributed-onnx serve`` itself as shipped (direct ingress, batching on) runs beside it for
reference. The checkpoints are copies of the bundled reference checkpoint named ``m0``, ``m1``, ... For each
number of models, with both servers up:

1. *first request to each model* (1 client, in turn), right after start: a model that multiplexing has not
   loaded yet loads on this request;
2. *throughput*: 32 clients, one series per request, the models in turn (request k asks model k mod N), the
   ways visited in turn round after round (order rotated per round), so the machine's drift meets them alike;
   medians over rounds and the per-round ratio to "every model in every replica";
3. *after a switch*: 1 client asking the models in turn (every request a switch), median latency; for
   multiplexing also with an LRU of one model (``max_num_models_per_replica=1``), where every switch loads one;
4. *memory*: each Serve replica's RSS (``VmRSS``) after the load.

Reproduce (about 10 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/multiplex_bench.py        # --models 2,4 --rounds 4 --requests 600

Results go to benchmarks/results/multiplex.{json,md}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_bench import history, http_post, load_payloads
from servers import (
    RESULTS,
    ROOT,
    free_port,
    remove_server_logs,
    replica_pids,
    rss_bytes,
    serve_command,
    start_server,
    stop_server,
)

ALL = "every model in every replica (1 deployment)"
MULTIPLEXED = "multiplexed (1 deployment, LRU holds all)"
PER_MODEL = "1 deployment per model (route by path)"
ROUTER = "1 deployment per model + router deployment"
PRODUCT = "distributed-onnx serve (every model in every replica; direct ingress, batching)"
MULTIPLEXED_SMALL = "multiplexed, LRU of 1 model"
THROUGHPUT = [ALL, MULTIPLEXED, PER_MODEL, ROUTER, PRODUCT]
#: Each way's application in multiplex_server.py (``pm_``: one per model, ``pm_m0``, ...).
APPLICATIONS = {ALL: "all", MULTIPLEXED: "mux", MULTIPLEXED_SMALL: "mux1", PER_MODEL: "pm_", ROUTER: "router"}
CLIENTS = 32

Request = tuple[str, bytes, dict[str, str]]


def requests_for(design: str, names: list[str], body: dict[str, Any]) -> list[Request]:
    """(path, body, headers) of one request to each model, the way ``design`` is addressed."""
    plain, found = json.dumps(body).encode(), []
    for name in names:
        named = json.dumps(body | {"model": name}).encode()
        header = {"serve_multiplexed_model_id": name}
        found.append(
            {
                ALL: ("/all/v1/forecast", named, {}),
                MULTIPLEXED: ("/mux/v1/forecast", plain, header),
                MULTIPLEXED_SMALL: ("/mux1/v1/forecast", plain, header),
                PER_MODEL: (f"/pm/{name}/v1/forecast", plain, {}),
                ROUTER: ("/router/v1/forecast", named, {}),
                PRODUCT: ("/v1/forecast", named, {}),
            }[design]
        )
    return found


def timed(port: int, requests: list[Request]) -> list[float]:
    """Each request in turn on one keep-alive connection; milliseconds each (every answer must be 200)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    latencies = []
    try:
        for path, body, headers in requests:
            started = time.perf_counter()
            connection.request("POST", path, body, {"Content-Type": "application/json", **headers})
            response = connection.getresponse()
            answer = response.read()
            latencies.append(round((time.perf_counter() - started) * 1000.0, 2))
            if response.status != 200:
                raise RuntimeError(f"{path} answered {response.status}: {answer[:300]!r}")
    finally:
        connection.close()
    return latencies


def replica_memory(root: int) -> list[dict[str, Any]]:
    """Every Serve replica under ``root``: its application:deployment and its RSS."""
    found = []
    for pid in replica_pids(root):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        name = command.split("ServeReplica:", 1)[1].split()[0].split(".")[0] if "ServeReplica:" in command else "?"
        found.append({"replica": name, "rss_mib": round(rss_bytes(pid) / 2**20, 1)})
    return sorted(found, key=lambda item: item["replica"])


def run_models(checkpoints: list[Path], args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    names = [path.stem for path in checkpoints]
    bench_port, product_port = free_port(), free_port()
    ports = {design: bench_port for design in (ALL, MULTIPLEXED, MULTIPLEXED_SMALL, PER_MODEL, ROUTER)}
    ports[PRODUCT] = product_port
    processes: dict[str, subprocess.Popen[str]] = {}
    entry: dict[str, Any] = {"models": len(names), "designs": {}, "cells": []}
    try:
        print(f"{len(names)} models: starting ...", flush=True)
        command = [sys.executable, str(ROOT / "benchmarks" / "multiplex_server.py"), "--port", str(bench_port)]
        processes["bench"] = start_server([*command, *map(str, checkpoints)], bench_port, ready_path="/router/ready")
        arguments = [argument for path in checkpoints for argument in ("--checkpoint", str(path))]
        product = serve_command(*arguments, "--port", str(product_port), "--grpc-port", str(free_port()))
        processes["product"] = start_server(product, product_port)
        requests = {design: requests_for(design, names, body) for design in ports}
        for design, port in ports.items():  # first: a multiplexed model loads here
            entry["designs"][design] = {"first_request_ms": timed(port, requests[design])}
        payloads = {
            design: [http_post(ports[design], path, data, headers) for path, data, headers in requests[design]]
            for design in THROUGHPUT
        }
        for design in THROUGHPUT:  # warm the connections and the routes once
            load_payloads(
                ports[design], payloads[design], requests=4 * CLIENTS, concurrency=CLIENTS, cap_s=10, warm=False
            )
        for round_index in range(args.rounds):
            shift = round_index % len(THROUGHPUT)
            for design in THROUGHPUT[shift:] + THROUGHPUT[:shift]:
                before = os.getloadavg()[0]
                cell = load_payloads(
                    ports[design],
                    payloads[design],
                    requests=args.requests,
                    concurrency=CLIENTS,
                    cap_s=args.cap_s,
                    warm=False,
                )
                cell |= {"design": design, "round": round_index, "load_1min": [before, os.getloadavg()[0]]}
                entry["cells"].append(cell)
                print(f"{len(names)} models, round {round_index}, {design}: {cell['requests_per_s']} req/s", flush=True)
                time.sleep(args.pause_s)
        for design, port in ports.items():
            switches = timed(port, requests[design] * args.switches)
            entry["designs"][design]["after_switch_ms"] = {
                "p50": round(float(np.median(switches)), 2),
                "max": max(switches),
                "requests": len(switches),
            }
        replicas = replica_memory(processes["bench"].pid)
        for design, application in APPLICATIONS.items():
            mine = [r for r in replicas if r["replica"].split(":")[0] == application]
            if application.endswith("_"):  # one application per model
                mine = [r for r in replicas if r["replica"].startswith(application)]
            entry["designs"][design]["replicas"] = mine
        entry["designs"][PRODUCT]["replicas"] = replica_memory(processes["product"].pid)
    finally:
        for process in processes.values():
            stop_server(process)
    summarize(entry)
    return entry


def summarize(entry: dict[str, Any]) -> None:
    """Medians over rounds, and the median over rounds of each way's req/s over "every model in every replica"."""
    by_design: dict[str, list[dict[str, Any]]] = {}
    for cell in entry["cells"]:
        by_design.setdefault(cell["design"], []).append(cell)
    base = {cell["round"]: cell["requests_per_s"] for cell in by_design[ALL]}
    for design, cells in by_design.items():
        ratios = [cell["requests_per_s"] / base[cell["round"]] for cell in cells]
        entry["designs"][design]["throughput"] = {
            "requests_per_s": float(np.median([c["requests_per_s"] for c in cells])),
            "p50_ms": float(np.median([c["p50_ms"] for c in cells])),
            "p99_ms": float(np.median([c["p99_ms"] for c in cells])),
            "ratio_to_all": round(float(np.median(ratios)), 3),
            "ratios_to_all": [round(x, 3) for x in ratios],
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="2,4")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=600, help="requests per 32-client cell")
    parser.add_argument("--cap-s", type=float, default=20.0)
    parser.add_argument("--pause-s", type=float, default=1.0)
    parser.add_argument("--switches", type=int, default=6, help="rounds over the models in the switch test")
    parser.add_argument("--context", type=int, default=168)
    parser.add_argument("--horizon", type=int, default=48)
    args = parser.parse_args()

    import ray

    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    work = Path(tempfile.mkdtemp(prefix="multiplex-bench-"))
    rng = np.random.default_rng(0)
    body = {"series": [{"series_id": "a", "y": history(rng, args.context)}], "horizon": args.horizon}
    results: dict[str, Any] = {
        "conditions": {
            "checkpoint": REFERENCE_CHECKPOINT.name,
            "checkpoint_mib": round(REFERENCE_CHECKPOINT.stat().st_size / 2**20, 1),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "rounds": args.rounds,
            "requests": args.requests,
            "cap_s": args.cap_s,
            "context": args.context,
            "horizon": args.horizon,
        },
        "runs": [],
    }
    try:
        for count in [int(n) for n in args.models.split(",")]:
            checkpoints = []
            for index in range(count):
                path = work / f"m{index}.onnx"
                shutil.copy(REFERENCE_CHECKPOINT, path)
                shutil.copy(REFERENCE_CHECKPOINT.with_suffix(".metadata.json"), path.with_suffix(".metadata.json"))
                checkpoints.append(path)
            results["runs"].append(run_models(checkpoints, args, body))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loads = [x for run in results["runs"] for cell in run["cells"] for x in cell["load_1min"]]
    results["conditions"]["load_1min"] = {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "multiplex.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "multiplex.md").write_text(markdown(results))
    remove_server_logs()
    print((RESULTS / "multiplex.md").read_text())
    return 0


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    load = c["load_1min"]
    lines = [
        "# Several models in one application: every model in every replica, multiplexing, a deployment per model",
        "",
        "Reproduce: `.venv/bin/python benchmarks/multiplex_bench.py`; writes this file and `multiplex.json`.",
        "",
        f"Conditions: {c['cpus']} cores, no GPU, Ray {c['ray']}, Python {c['python']}; N copies of "
        f"`{c['checkpoint']}` ({c['checkpoint_mib']} MiB) as models `m0`..; one series of {c['context']} steps per "
        f"request, horizon {c['horizon']}. Throughput: {c['requests']} requests per cell from 32 clients asking "
        f"the models in turn, {c['rounds']} rounds visiting every way in turn (order rotated per round); medians "
        "over rounds, and the median of the per-round ratios to the first row. The first four ways and the LRU-1 "
        "row run the same handler (`benchmarks/multiplex_server.py`, Serve's proxy, one ORT thread per model, no "
        "batching) as applications of one Serve instance; the shipped server (direct ingress, batching) ran beside "
        f"it. 1-minute load average during the cells: min {load['min']:.2f}, median {load['median']:.2f}, max "
        f"{load['max']:.2f} on 2 cores: other sessions' processes shared the machine.",
        "",
        "| models | design | req/s, 32 clients | / first row (per round) | p50 ms | p99 ms | "
        "first request to each model, ms | p50 ms after a switch (max) | replica RSS MiB (sum) |",
        "|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for run in results["runs"]:
        for design in [*THROUGHPUT, MULTIPLEXED_SMALL]:
            d = run["designs"][design]
            t = d.get("throughput")
            cells = (
                [f"{t['requests_per_s']:.1f}", f"{t['ratio_to_all']:.2f}", f"{t['p50_ms']:.1f}", f"{t['p99_ms']:.1f}"]
                if t
                else ["-"] * 4
            )
            memory = ", ".join(f"{r['rss_mib']:.0f}" for r in d["replicas"])
            total = sum(r["rss_mib"] for r in d["replicas"])
            switch = d["after_switch_ms"]
            first = ", ".join(f"{x:.0f}" for x in d["first_request_ms"])
            lines.append(
                f"| {run['models']} | {design} | {' | '.join(cells)} | {first} | {switch['p50']} ({switch['max']}) | "
                f"{memory} ({total:.0f}) |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
