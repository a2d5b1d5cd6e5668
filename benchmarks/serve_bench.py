"""Online serving, side by side in one run: a plain uvicorn + Starlette + ORT process (the anchor) against
``distributed-onnx serve`` through each ingress, one series per request at 1, 8 and 32 clients.

Servers run one at a time, each a fresh process (``benchmarks/plain_server.py`` for the anchor, the real
command line for ours), so each gets the machine to itself. Load comes from a hand-written asyncio HTTP/1.1
keep-alive client (pre-encoded requests, ~50 us of CPU per request) in this process, bounded by a request count
and a time cap per cell. Every server runs one ORT thread on the same checkpoint.

Reproduce (about 4 minutes on a 2-core machine)::

    make bench-serve        # or: .venv/bin/python benchmarks/serve_bench.py

Results go to benchmarks/results/serve.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import RESULTS, ROOT, free_port, remove_server_logs, serve_command, start_server, stop_server

CONCURRENCY = [1, 8, 32]
ANCHOR = "plain uvicorn + Starlette + ORT (anchor)"
DEFAULT = "1 replica, direct ingress, batching on (default)"
UNBATCHED = "1 replica, direct ingress, batching off"
PROXY = "1 replica, Serve's proxy, batching on"
TWO = "2 replicas, HAProxy, batching on"


# ------------------------------------------------------------------------------------------ load client


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.closing = False

    async def request(self, payload: bytes) -> tuple[int, bytes]:
        self.writer.write(payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.closing = headers.get("connection", "").lower() == "close"
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"]))
        chunks = []  # chunked transfer encoding
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(chunks)
            chunks.append(chunk[:-2])


def http_post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _load(port: int, payloads: list[bytes], requests: int, concurrency: int, cap_s: float) -> dict[str, Any]:
    """``requests`` requests from ``concurrency`` keep-alive connections, the payloads in turn (request k sends
    ``payloads[k % len(payloads)]``), until done or ``cap_s``."""
    latencies: list[float] = []
    codes: dict[str, int] = {}
    remaining = requests
    deadline = time.perf_counter() + cap_s

    async def client() -> None:
        nonlocal remaining
        connection = _Connection(*await asyncio.open_connection("127.0.0.1", port))
        try:
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                payload = payloads[remaining % len(payloads)]
                started = time.perf_counter()
                try:
                    status, _ = await connection.request(payload)
                except (asyncio.IncompleteReadError, ConnectionError):
                    status = 0  # the server closed the connection: counted as code "0", then reconnect
                    connection.closing = True
                else:
                    latencies.append(time.perf_counter() - started)
                codes[str(status)] = codes.get(str(status), 0) + 1
                if connection.closing:
                    connection.writer.close()
                    connection = _Connection(*await asyncio.open_connection("127.0.0.1", port))
        finally:
            connection.writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return _summary(latencies, wall) | {"codes": codes, "concurrency": concurrency}


def load(
    port: int, path: str, body: bytes | list[bytes], *, requests: int, concurrency: int, cap_s: float, warm: bool = True
) -> dict[str, Any]:
    """POST ``body`` (or several bodies, in turn) to ``path``: a warm-up round, then the measured one."""
    payloads = [http_post(port, path, one) for one in (body if isinstance(body, list) else [body])]
    return load_payloads(port, payloads, requests=requests, concurrency=concurrency, cap_s=cap_s, warm=warm)


def load_payloads(
    port: int, payloads: list[bytes], *, requests: int, concurrency: int, cap_s: float, warm: bool = True
) -> dict[str, Any]:
    """Send whole HTTP requests (:func:`http_post`), in turn; with ``warm``, a short unmeasured round first."""
    if warm:
        asyncio.run(_load(port, payloads, min(requests, 4 * concurrency), concurrency, cap_s))
    return asyncio.run(_load(port, payloads, requests, concurrency, cap_s))


def _summary(latencies: list[float], wall_s: float) -> dict[str, Any]:
    ms = np.array(latencies) * 1000.0
    return {
        "requests": len(latencies),
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(latencies) / wall_s, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
    }


# ------------------------------------------------------------------------------------------ servers


def history(rng: np.random.Generator, length: int) -> list[float]:
    return [float(v) for v in 30000 + 3000 * np.sin(np.arange(length) / 7.6) + 300 * rng.standard_normal(length)]


def in_process(checkpoint: Path, single: list[float], horizon: int, requests: int) -> dict[str, Any]:
    """The model call alone: ``InferenceWorker.forecast`` on one series, one ORT thread."""
    from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    options = SessionOptionsConfig(intra_op_num_threads=1, allow_spinning=False)
    worker = InferenceWorker.from_config(
        WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()], session_options=options)
    )
    worker.warm_up()
    one = np.array([single], dtype=np.float32)
    latencies = []
    started = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        worker.forecast(one, horizon, worker.metadata.native_quantiles)
        latencies.append(time.perf_counter() - t0)
    return _summary(latencies, time.perf_counter() - started)


# ------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per cell")
    parser.add_argument("--cap-s", type=float, default=20.0, help="time cap per cell")
    parser.add_argument("--context", type=int, default=168, help="history length of the one series")
    parser.add_argument("--horizon", type=int, default=48)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--only", help="comma-separated servers to run, by position (0 = anchor); default all")
    args = parser.parse_args()

    import ray

    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    checkpoint = args.checkpoint or REFERENCE_CHECKPOINT
    rng = np.random.default_rng(0)
    single = history(rng, args.context)
    many = [history(rng, args.context) for _ in range(64)]
    one_body = json.dumps({"series": [{"series_id": "a", "y": single}], "horizon": args.horizon}).encode()
    many_body = json.dumps(
        {"series": [{"series_id": f"s{i}", "y": y} for i, y in enumerate(many)], "horizon": args.horizon}
    ).encode()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "conditions": {
            "checkpoint": checkpoint.name,
            "cpus": os.cpu_count(),
            "load_before": os.getloadavg(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "requests_per_cell": args.requests,
            "cap_s": args.cap_s,
            "context": args.context,
            "horizon": args.horizon,
        },
        "model_call": in_process(checkpoint, single, args.horizon, args.requests),
        "servers": [],
    }
    serve = serve_command("--checkpoint", str(checkpoint))
    servers = [
        (ANCHOR, [sys.executable, str(ROOT / "benchmarks" / "plain_server.py"), "--checkpoint", str(checkpoint)]),
        (DEFAULT, serve),
        (UNBATCHED, [*serve, "--max-batch-size", "1"]),
        (PROXY, [*serve, "--ingress", "proxy"]),
        (TWO, [*serve, "--replicas", "2"]),
    ]
    if args.only:
        servers = [servers[int(index)] for index in args.only.split(",")]
    for label, command in servers:
        port = free_port()
        extra = ["--port", str(port)] + ([] if label == ANCHOR else ["--grpc-port", str(free_port())])
        print(f"{label}: starting ...", flush=True)
        started = time.perf_counter()
        process = start_server([*command, *extra], port)
        entry: dict[str, Any] = {"server": label, "start_s": round(time.perf_counter() - started, 1), "cells": []}
        try:
            for concurrency in CONCURRENCY:
                print(f"{label}: 1 series, {concurrency} clients ...", flush=True)
                row = load(
                    port, "/v1/forecast", one_body, requests=args.requests, concurrency=concurrency, cap_s=args.cap_s
                )
                entry["cells"].append({"series_per_request": 1} | row)
            print(f"{label}: 64 series, 8 clients ...", flush=True)
            row = load(
                port, "/v1/forecast", many_body, requests=max(40, args.requests // 5), concurrency=8, cap_s=args.cap_s
            )
            entry["cells"].append(
                {"series_per_request": 64, "windows_per_s": round(row["requests_per_s"] * 64, 1)} | row
            )
        finally:
            entry["stop_s"] = stop_server(process)
        results["servers"].append(entry)
    results["conditions"]["load_after"] = os.getloadavg()
    results["targets"] = targets(results) if len(servers) == 5 else []
    (RESULTS / "serve.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "serve.md").write_text(markdown(results))
    remove_server_logs()
    print((RESULTS / "serve.md").read_text())
    return 0


def cell(results: dict[str, Any], server: str, concurrency: int, series: int = 1) -> dict[str, Any]:
    entry = next(entry for entry in results["servers"] if entry["server"] == server)
    return next(c for c in entry["cells"] if c["concurrency"] == concurrency and c["series_per_request"] == series)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    anchor_rps = cell(results, ANCHOR, 32)["requests_per_s"]
    anchor_p50 = cell(results, ANCHOR, 1)["p50_ms"]
    rps = cell(results, DEFAULT, 32)["requests_per_s"] / anchor_rps
    p50 = cell(results, DEFAULT, 1)["p50_ms"] / anchor_p50
    scale = cell(results, TWO, 32)["requests_per_s"] / cell(results, DEFAULT, 32)["requests_per_s"]
    windows = cell(results, TWO, 8, 64)["windows_per_s"] / cell(results, DEFAULT, 8, 64)["windows_per_s"]
    return [
        {"check": "1 replica: req/s at 32 clients vs the anchor >= 0.6x", "value": round(rps, 2), "met": rps >= 0.6},
        {"check": "1 replica: p50 at 1 client vs the anchor <= 2.5x", "value": round(p50, 2), "met": p50 <= 2.5},
        {"check": "2 replicas vs 1 replica: req/s at 32 clients > 1x", "value": round(scale, 2), "met": scale > 1.0},
        {
            "check": "(not a target) 2 replicas vs 1 replica: windows/s at 64 series per request, 8 clients",
            "value": round(windows, 2),
            "met": windows > 1.0,
        },
    ]


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    call = results["model_call"]
    lines = [
        "# Online serving benchmark",
        "",
        "Reproduce: `make bench-serve` (or `.venv/bin/python benchmarks/serve_bench.py`); writes this file and "
        "`serve.json`.",
        "",
        f"Conditions: {c['cpus']} cores, no GPU, checkpoint `{c['checkpoint']}`, Ray {c['ray']}, Python "
        f"{c['python']}; one series of {c['context']} steps per request, horizon {c['horizon']}; "
        f"{c['requests_per_cell']} requests per cell (cap {c['cap_s']} s); servers one at a time, each a fresh "
        f"process with one ORT thread; load average before {[round(x, 2) for x in c['load_before']]}, after "
        f"{[round(x, 2) for x in c['load_after']]}. Client: asyncio HTTP/1.1 keep-alive on 127.0.0.1, on the same "
        "2 cores as the servers. Earlier runs on a machine shared with other jobs moved these ratios by tens of "
        "percent; the load averages above say how quiet this run was.",
        "",
        f"The model call alone (`InferenceWorker.forecast`, 1 series, in process): p50 {call['p50_ms']} ms, "
        f"{call['requests_per_s']} calls/s.",
        "",
        "## Side by side: p50 at 1 client, req/s at 32 clients",
        "",
        "| server | p50 ms, 1 client | req/s, 32 clients | vs anchor (p50 / req/s) | start s | stop s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    first = results["servers"][0]["server"]  # the anchor, unless --only left it out
    anchor_p50, anchor_rps = cell(results, first, 1)["p50_ms"], cell(results, first, 32)["requests_per_s"]
    for entry in results["servers"]:
        one, many = cell(results, entry["server"], 1), cell(results, entry["server"], 32)
        ratio = f"{one['p50_ms'] / anchor_p50:.2f}x / {many['requests_per_s'] / anchor_rps:.2f}x"
        cells = [entry["server"], one["p50_ms"], many["requests_per_s"], ratio, entry["start_s"], entry["stop_s"]]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    lines += [
        "",
        "## Every cell",
        "",
        "| server | series/request | clients | req/s | windows/s | p50 ms | p99 ms | codes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for entry in results["servers"]:
        for row in entry["cells"]:
            windows = row.get("windows_per_s", round(row["requests_per_s"] * row["series_per_request"], 1))
            cells = [entry["server"], row["series_per_request"], row["concurrency"], row["requests_per_s"], windows]
            cells += [row["p50_ms"], row["p99_ms"], row["codes"]]
            lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    lines += [
        "",
        "## Batching on (max_batch_size 16, the default) vs off (1), 1 replica, direct ingress",
        "",
        "| series/request | clients | req/s on | req/s off | on / off | p50 ms on | p50 ms off |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for series, concurrency in [(1, 1), (1, 8), (1, 32), (64, 8)]:
        on, off = cell(results, DEFAULT, concurrency, series), cell(results, UNBATCHED, concurrency, series)
        ratio = on["requests_per_s"] / off["requests_per_s"]
        cells = [series, concurrency, on["requests_per_s"], off["requests_per_s"], f"{ratio:.2f}x"]
        lines.append("| " + " | ".join(str(x) for x in [*cells, on["p50_ms"], off["p50_ms"]]) + " |")
    lines += [
        "",
        "At one client both run the same code (a request that finds the replica idle skips the batch queue), so "
        "that row measures only the run-to-run noise of this machine. The default (on) is chosen for the many "
        "small concurrent requests of online use, where merging them into one model call pays; requests that "
        "already carry many series gain nothing from merging (the 64-series row), and --max-batch-size 1 turns "
        "it off for them.",
    ]
    lines += ["", "## Targets (issue 12)", "", "| check | value | met |", "|---|---:|---|"]
    for check in results["targets"]:
        lines.append(f"| {check['check']} | {check['value']} | {'yes' if check['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
