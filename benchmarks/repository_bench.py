"""A checkpoint repository of 40 models, a budget of 8 per replica: hit and miss latency, routing by model or not,
and the alternative of every model in every replica.

The server is ``distributed-onnx serve --model-repository DIR --repository-budget 8`` as shipped, over copies of
the bundled reference checkpoint (``m00`` .. ``m39``; 4 MiB each, so a miss pays a real session build). One
client, one series per request, requests in turn (latency, not throughput):

1. *hit / miss* (1 replica, direct ingress): a hit asks a model the replica holds; a miss asks the models in a
   cycle of all 40, so with 8 held every request loads its model (and evicts one). The two cells alternate,
   round after round (order flipped per round); medians over rounds and the median of the per-round ratios.
2. *routing* (2 replicas, Serve's proxy, the ingress ``serve`` picks with a repository and several replicas):
   a working set of 12 models, more than one replica's budget and less than the fleet's, asked in a random
   order, with the ``serve_multiplexed_model_id`` header (Serve's multiplexing routes each model to the replica
   that holds it) and without it (the body's ``model`` only: the proxy's router ignores which replica holds
   what, as a per-replica LRU of our own behind HAProxy or the proxy would). Cells alternate per round; the
   loads per request come from both replicas' ``/metrics`` (scraped until each replica has answered).
3. *every model in every replica* (``--checkpoint`` x 40, 1 replica): time to ready and the replica's RSS,
   beside the repository replica's with 8 held.

Reproduce (about 15 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/repository_bench.py        # --rounds 4 --requests 60

Results go to benchmarks/results/repository.{json,md}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_bench import history
from servers import RESULTS, free_port, remove_server_logs, replica_pids, rss_bytes, serve_command, start_server
from servers import stop_server as stop

MODELS = 40
BUDGET = 8
WORKING_SET = 12
HEADER = "serve_multiplexed_model_id"


def post(connection: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> float:
    """One /v1/forecast request on a keep-alive connection; its milliseconds (the answer must be 200)."""
    started = time.perf_counter()
    connection.request("POST", "/v1/forecast", body, {"Content-Type": "application/json", **headers})
    response = connection.getresponse()
    answer = response.read()
    elapsed = (time.perf_counter() - started) * 1000.0
    if response.status != 200:
        raise RuntimeError(f"answered {response.status}: {answer[:300]!r}")
    return elapsed


def requests_of(names: list[str], series: list[float], header: bool) -> list[tuple[bytes, dict[str, str]]]:
    found = []
    for name in names:
        body = {"series": [{"series_id": "a", "y": series}], "horizon": 24}
        if header:
            found.append((json.dumps(body).encode(), {HEADER: name}))
        else:
            found.append((json.dumps(body | {"model": name}).encode(), {}))
    return found


def timed(port: int, requests: list[tuple[bytes, dict[str, str]]]) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        return [post(connection, body, headers) for body, headers in requests]
    finally:
        connection.close()


def loads_by_replica(port: int, replicas: int) -> dict[str, float]:
    """Each replica's ``distributed_onnx_repository_loads_total`` (a scrape reaches one replica: scrape until
    every one has answered)."""
    found: dict[str, float] = {}
    pattern = re.compile(r'^distributed_onnx_repository_loads_total\{model="[^"]*",replica="([^"]*)"\} (\S+)$', re.M)
    for _ in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        totals: dict[str, float] = {}
        replica = re.search(r'replica="([^"]*)"', text)
        for name, value in pattern.findall(text):
            totals[name] = totals.get(name, 0.0) + float(value)
        if replica is not None:
            found[replica.group(1)] = totals.get(replica.group(1), 0.0)
        if len(found) >= replicas:
            return found
    raise RuntimeError(f"only {len(found)} of {replicas} replicas answered /metrics")


def percentiles(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
        "requests": len(latencies),
    }


def start(arguments: list[str], attempts: int = 3) -> tuple[Any, int, float]:
    """A server and its time to ready; started again when it fails (on a loaded 2-core machine Ray's raylet
    sometimes misses its 30 s start-up deadline)."""
    for attempt in range(attempts):
        port = free_port()
        started = time.perf_counter()
        try:
            process = start_server(
                serve_command(*arguments, "--port", str(port), "--grpc-port", str(free_port())), port, settle_s=2.0
            )
        except RuntimeError:
            if attempt == attempts - 1:
                raise
            continue
        return process, port, round(time.perf_counter() - started, 1)
    raise AssertionError("unreachable")


def hit_and_miss(repository: Path, series: list[float], args: argparse.Namespace) -> dict[str, Any]:
    process, port, ready_s = start(
        ["--model-repository", str(repository), "--repository-budget", str(BUDGET), "--max-batch-size", "1"]
    )
    names = [f"m{k:02d}" for k in range(MODELS)]
    cells: list[dict[str, Any]] = []
    try:
        timed(port, requests_of(names[:1], series, True) * 5)  # warm the connection and m00
        hit = requests_of(names[:1], series, True) * args.requests
        miss = requests_of(names[1:], series, True)  # m01..m39 in a cycle: every one a miss with 8 held
        for round_index in range(args.rounds):
            order = [("hit", hit), ("miss", miss[: args.requests])]
            for kind, requests in order if round_index % 2 == 0 else order[::-1]:
                if kind == "hit":
                    timed(port, requests[:1])  # m00 back in (the miss cell evicted it)
                load = os.getloadavg()[0]
                latencies = timed(port, requests)
                cells.append({"kind": kind, "round": round_index, "load_1min": load, **percentiles(latencies)})
                print(f"round {round_index} {kind}: {cells[-1]}", flush=True)
            miss = miss[args.requests :] + miss[: args.requests]
        rss = [round(rss_bytes(pid) / 2**20, 1) for pid in replica_pids(process.pid)]
    finally:
        stop(process)
    summary = summarize(cells, "hit", "miss")
    return {"ready_s": ready_s, "cells": cells, "replica_rss_mib": rss, "summary": summary}


ROUTED = "routed by model (Serve's proxy, header)"
UNROUTED = "not routed (Serve's proxy, body model only)"
HAPROXY = "not routed (HAProxy, body model only)"


def routing(repository: Path, series: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """Both servers up at once (each its own embedded Ray), their cells alternating round after round."""
    arguments = ["--model-repository", str(repository), "--repository-budget", str(BUDGET), "--replicas", "2"]
    arguments += ["--cpus-per-replica", "0.5", "--max-batch-size", "1"]
    proxy, proxy_port, proxy_ready_s = start(arguments)  # auto: Serve's proxy, with a repository and 2 replicas
    try:
        haproxy, haproxy_port, haproxy_ready_s = start([*arguments, "--ingress", "haproxy"])
    except BaseException:
        stop(proxy)
        raise
    rng = random.Random(0)
    working = [f"m{k:02d}" for k in range(WORKING_SET)]
    cells: list[dict[str, Any]] = []
    ways = [(ROUTED, proxy_port, True), (UNROUTED, proxy_port, False), (HAPROXY, haproxy_port, False)]
    try:
        for _, port, header in ways:  # warm: every model of the working set asked once, each way
            timed(port, requests_of(working, series, header))
        for round_index in range(args.rounds):
            names = [rng.choice(working) for _ in range(args.requests)]
            shift = round_index % len(ways)
            for kind, port, header in ways[shift:] + ways[:shift]:
                before = loads_by_replica(port, 2)
                load = os.getloadavg()[0]
                latencies = timed(port, requests_of(names, series, header))
                loads = sum(loads_by_replica(port, 2).values()) - sum(before.values())
                cells.append(
                    {
                        "kind": kind,
                        "round": round_index,
                        "load_1min": load,
                        "loads": loads,
                        "miss_share": round(loads / len(names), 3),
                        **percentiles(latencies),
                    }
                )
                print(f"round {round_index} {kind}: {cells[-1]}", flush=True)
    finally:
        stop(proxy)
        stop(haproxy)
    summary = summarize(cells, ROUTED, UNROUTED, HAPROXY)
    return {"ready_s": {"proxy": proxy_ready_s, "haproxy": haproxy_ready_s}, "cells": cells, "summary": summary}


def everywhere(repository: Path) -> dict[str, Any]:
    """Every model in every replica: 40 --checkpoint flags, one replica."""
    arguments = [f"--checkpoint={repository / f'm{k:02d}.onnx'}" for k in range(MODELS)]
    process, _, ready_s = start(arguments)
    try:
        rss = [round(rss_bytes(pid) / 2**20, 1) for pid in replica_pids(process.pid)]
    finally:
        stop(process)
    return {"ready_s": ready_s, "replica_rss_mib": rss}


def summarize(cells: list[dict[str, Any]], first: str, *others: str) -> dict[str, Any]:
    """Medians over rounds per kind, and per other kind the medians of its per-round ratios to ``first``."""
    summary: dict[str, Any] = {}
    for kind in (first, *others):
        mine = [cell for cell in cells if cell["kind"] == kind]
        summary[kind] = {
            key: round(float(np.median([cell[key] for cell in mine])), 3)
            for key in ("p50_ms", "p99_ms", "miss_share")
            if key in mine[0]
        }
    base = {cell["round"]: cell for cell in cells if cell["kind"] == first}
    for kind in others:
        for key in ("p50_ms", "p99_ms"):
            ratios = [cell[key] / base[cell["round"]][key] for cell in cells if cell["kind"] == kind]
            summary[kind][f"{key}_ratio"] = {
                "median": round(float(np.median(ratios)), 2),
                "rounds": [round(x, 2) for x in ratios],
            }
    return summary


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    load = c["load_1min"]
    hm, rt = results["hit_and_miss"], results["routing"]
    lines = [
        "# A checkpoint repository: hit and miss latency, routing by model, every model in every replica",
        "",
        "Reproduce: `.venv/bin/python benchmarks/repository_bench.py --rounds 4 --requests 40` (writes "
        "`repository.json`; `--markdown` rewrites this file from it). What each cell does: the script's docstring.",
        "",
        f"Conditions: {c['cpus']} cores, no GPU, Ray {c['ray']}, Python {c['python']}; {c['models']} copies of "
        f"`{c['checkpoint']}` ({c['checkpoint_mib']} MiB each) as `m00`..`m39`, budget {c['budget']} per replica; "
        f"one series of 168 steps per request, horizon 24, one client, {c['requests']} requests per cell, "
        f"{c['rounds']} rounds, cells alternating (order flipped per round). 1-minute load average during the "
        f"cells: min {load['min']:.2f}, median {load['median']:.2f}, max {load['max']:.2f} on 2 cores: other "
        "sessions' processes shared the machine, so absolute figures are noisy; the per-round ratios less so.",
        "",
        "## Hit and miss (1 replica, direct ingress)",
        "",
        "| request | p50 ms | p99 ms | per round (p50 ms) |",
        "|---|---:|---:|---|",
    ]
    for kind in ("hit", "miss"):
        cells = [cell for cell in hm["cells"] if cell["kind"] == kind]
        d = hm["summary"][kind]
        rounds = ", ".join(f"{cell['p50_ms']:.1f}" for cell in cells)
        lines.append(f"| {kind} | {d['p50_ms']:.1f} | {d['p99_ms']:.1f} | {rounds} |")
    ratio = hm["summary"]["miss"]["p50_ms_ratio"]
    lines += [
        "",
        f"A miss (load the checkpoint, build and warm its session, evict the least recently used) costs "
        f"{ratio['median']:.1f}x a hit at the median (per round: {', '.join(map(str, ratio['rounds']))}); p99 "
        f"{hm['summary']['miss']['p99_ms_ratio']['median']:.1f}x.",
        "",
        f"## Routing by model or not (2 replicas x 0.5 CPU, Serve's proxy, a working set of {c['working_set']} "
        "models in a random order; the HAProxy server ran beside it, cells alternating)",
        "",
        "| requests | p50 ms | p99 ms | loads per request | p50 / routed (per round) | p99 / routed (per round) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for kind in (ROUTED, UNROUTED, HAPROXY):
        d = rt["summary"][kind]
        ratios = [
            f"{d[key]['median']:.2f} ({', '.join(map(str, d[key]['rounds']))})" if key in d else "1"
            for key in ("p50_ms_ratio", "p99_ms_ratio")
        ]
        lines.append(
            f"| {kind} | {d['p50_ms']:.1f} | {d['p99_ms']:.1f} | {d['miss_share']:.2f} | {' | '.join(ratios)} |"
        )
    lines.append("")
    if "every_model_in_every_replica" in results:
        everywhere = results["every_model_in_every_replica"]
        lines += [
            "## Every model in every replica (the alternative: `--checkpoint` x 40, 1 replica)",
            "",
            "| design | time to ready s | replica RSS MiB |",
            "|---|---:|---:|",
            f"| repository, budget 8 (after the hit and miss cells: 8 held) | {hm['ready_s']} | "
            f"{', '.join(map(str, hm['replica_rss_mib']))} |",
            f"| every model in every replica (40 sessions) | {everywhere['ready_s']} | "
            f"{', '.join(map(str, everywhere['replica_rss_mib']))} |",
            "",
        ]
    routed, haproxy = rt["summary"][ROUTED], rt["summary"][HAPROXY]
    lines += [
        "## Choice",
        "",
        "Serve's model multiplexing, with the `serve_multiplexed_model_id` header routing each model to the "
        "replicas that hold it (so Serve's proxy as the ingress for several replicas). A miss costs a session "
        f"build ({hm['summary']['miss']['p50_ms_ratio']['median']:.0f}x a hit here), and without routing by model "
        f"{haproxy['miss_share']:.0%} (HAProxy) of the requests of a working set that fits the fleet's budget "
        f"but not one replica's loaded a model, against {routed['miss_share']:.0%} routed: a p99 "
        f"{haproxy['p99_ms_ratio']['median']:.1f}x the routed one's. The price is Serve's proxy: HAProxy's faster "
        f"ingress gave a lower p50 ({haproxy['p50_ms_ratio']['median']:.2f}x) at those misses. Every model in "
        "every replica has no misses, but holds every session in every replica (RSS above, growing with each "
        "checkpoint) and builds them all before the first request.",
        "",
        "Memory: a first run of this benchmark, before evicted models let go of their batcher (a reference "
        "cycle that kept each evicted session until a full garbage collection), measured the repository "
        "replica at 1065 MiB RSS after the same cells (`git log` of `distributed_onnx/serve/core.py`); the "
        "figure above is with that fixed.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=60, help="requests per cell")
    parser.add_argument("--skip-everywhere", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="only rewrite repository.md from repository.json")
    args = parser.parse_args()
    if args.markdown:
        (RESULTS / "repository.md").write_text(markdown(json.loads((RESULTS / "repository.json").read_text())))
        return 0

    import ray

    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    work = Path(tempfile.mkdtemp(prefix="repository-bench-"))
    series = history(np.random.default_rng(0), 168)
    results: dict[str, Any] = {
        "conditions": {
            "checkpoint": REFERENCE_CHECKPOINT.name,
            "checkpoint_mib": round(REFERENCE_CHECKPOINT.stat().st_size / 2**20, 1),
            "models": MODELS,
            "budget": BUDGET,
            "working_set": WORKING_SET,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "rounds": args.rounds,
            "requests": args.requests,
            "load_1min_at_start": os.getloadavg()[0],
        }
    }
    try:
        for k in range(MODELS):
            path = work / f"m{k:02d}.onnx"
            shutil.copy(REFERENCE_CHECKPOINT, path)
            shutil.copy(REFERENCE_CHECKPOINT.with_suffix(".metadata.json"), path.with_suffix(".metadata.json"))
        results["hit_and_miss"] = hit_and_miss(work, series, args)
        results["routing"] = routing(work, series, args)
        if not args.skip_everywhere:
            results["every_model_in_every_replica"] = everywhere(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loads = [cell["load_1min"] for part in ("hit_and_miss", "routing") for cell in results[part]["cells"]]
    results["conditions"]["load_1min"] = {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "repository.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "repository.md").write_text(markdown(results))
    remove_server_logs()
    print(json.dumps({key: results[key] for key in results if key != "conditions"}, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
