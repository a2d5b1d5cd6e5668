"""Serving under a hostile load: 200 concurrent 8 MB bodies against one replica, and a 100 MB gRPC message.

Starts ``distributed-onnx serve`` (the bundled reference checkpoint, one replica, direct ingress, default
limits: ``max_body_bytes`` 8 MiB, ``max_request_memory_bytes`` 1 GiB) on free loopback ports and samples the
replica's RSS (``/proc/<pid>/status``, every 20 ms, in a thread) while:

1. 200 clients each POST an 8 MiB ``/v1/forecast`` body of ``0,`` values (the worst case of parsing per body
   byte) at once; each connection sends its headers, then its body, while it reads the answer. (``post`` can
   also send ``Expect: 100-continue``; that variant is not part of the committed results, see serve_hostile.md.)
2. ``/v2/health/ready`` and one ordinary forecast afterwards.
3. one 100 MiB ``ModelInferRequest`` over gRPC (raw little-endian bytes of a float32 context).

The stated bound: the replica's RSS stays under its idle RSS plus ``max_request_memory_bytes``. Bounded: one
burst, one gRPC call, every wait with a timeout; everything on 127.0.0.1.

Reproduce (about 2 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/serve_hostile.py

Results go to benchmarks/results/serve_hostile.{json,md}.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import (
    RESULTS,
    free_port,
    remove_server_logs,
    replica_pid,
    rss_bytes,
    serve_command,
    start_server,
    stop_server,
)

CLIENTS = 200
BODY_BYTES = 8 * 1024 * 1024
GRPC_BYTES = 100 * 1024 * 1024
MEMORY_BOUND = 1024 * 1024 * 1024  # ServeSettings.max_request_memory_bytes default


class RssSampler:
    """The peak RSS of one process, sampled in a thread until stopped."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid, self.period_s = pid, period_s
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssSampler:
        self.peak = rss_bytes(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def post(port: int, body: bytes, timeout_s: float, expect: bool) -> tuple[int | str, float, str]:
    """POST ``body``; status (or what went wrong), seconds, and the error message of a refusal.

    With ``expect`` the request carries ``Expect: 100-continue`` (what curl sends for bodies above 1 MB) and the
    body goes out only after the server's ``100 Continue``; without it, the body follows the headers at once
    while the answer is read.
    """
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect: {type(exc).__name__}", time.perf_counter() - started, ""
    expect_line = "Expect: 100-continue\r\n" if expect else ""
    head = (
        f"POST /v1/forecast HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{expect_line}\r\n"
    ).encode()

    async def send_body() -> None:
        try:
            view = memoryview(body)
            for offset in range(0, len(body), 256 * 1024):
                writer.write(view[offset : offset + 256 * 1024])
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # refused early: the server closed while the body was still going out

    sender: asyncio.Task[None] | None = None
    status: int | str
    try:
        writer.write(head)
        if expect:
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
            if interim.split(b" ", 2)[1] == b"100":
                sender = asyncio.create_task(send_body())
                response = await asyncio.wait_for(reader.read(), timeout_s)
            else:
                response = interim + await asyncio.wait_for(reader.read(), timeout_s)
        else:
            sender = asyncio.create_task(send_body())
            response = await asyncio.wait_for(reader.read(), timeout_s)
    except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
        response = b""
        status = f"read: {type(exc).__name__}"
    else:
        first = response.split(b"\r\n", 1)[0].split()
        status = int(first[1]) if len(first) > 1 else "no status line"
    if sender is not None:
        sender.cancel()
    writer.close()
    message = ""
    if isinstance(status, int) and status != 200:
        text = response.split(b"\r\n\r\n", 1)[-1]
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError):
            message = text[:200].decode(errors="replace")
    return status, time.perf_counter() - started, message


async def burst(port: int, body: bytes, expect: bool) -> list[tuple[int | str, float, str]]:
    return await asyncio.gather(*(post(port, body, 300.0, expect) for _ in range(CLIENTS)))


def grpc_call(port: int) -> dict[str, Any]:
    import grpc

    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest, ModelInferResponse

    rows = GRPC_BYTES // (512 * 4)
    request = ModelInferRequest(model_name="taylor_chronos2_patchtst")
    request.inputs.add(name="context", datatype="FP32", shape=[rows, 512])
    request.raw_input_contents.append(np.zeros((rows, 512), dtype="<f4").tobytes())
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=ModelInferRequest.SerializeToString,
            response_deserializer=ModelInferResponse.FromString,
        )
        started = time.perf_counter()
        try:
            call(request, timeout=120)
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        return {
            "message_bytes": request.ByteSize(),
            "code": code,
            "details": details,
            "answer_s": round(time.perf_counter() - started, 3),
        }


def start() -> tuple[subprocess.Popen[str], int, int]:
    """``distributed-onnx serve`` with default limits on free loopback ports, once ready."""
    port, grpc_port = free_port(), free_port()
    server = start_server(serve_command("--port", str(port), "--grpc-port", str(grpc_port)), port, settle_s=0.0)
    return server, port, grpc_port


def hostile_http(pid: int, port: int, expect: bool) -> dict[str, Any]:
    """The burst of 8 MiB bodies, the replica's RSS through it, and whether it is ready afterwards."""
    import httpx

    idle = rss_bytes(pid)
    values = (BODY_BYTES - 64) // 2
    body = b'{"series": [{"series_id": "a", "y": [' + b"0," * (values - 1) + b"0]}]}"
    body += b" " * (BODY_BYTES - len(body))  # exactly max_body_bytes: admitted by size, charged 40x
    started = time.perf_counter()
    with RssSampler(pid) as sampler:
        answers = asyncio.run(burst(port, body, expect))
    burst_s = time.perf_counter() - started
    codes: dict[str, int] = {}
    for status, _, _ in answers:
        codes[str(status)] = codes.get(str(status), 0) + 1
    refusal_s = [seconds for status, seconds, _ in answers if status == 503]
    served_s = [seconds for status, seconds, _ in answers if status == 200]
    ready = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30).status_code
    ordinary = httpx.post(
        f"http://127.0.0.1:{port}/v1/forecast",
        json={"series": [{"series_id": "a", "y": [float(v % 48) for v in range(600)]}]},
        timeout=60,
    ).status_code
    return {
        "clients": CLIENTS,
        "expect_100_continue": expect,
        "body_bytes": len(body),
        "codes": codes,
        "burst_s": round(burst_s, 2),
        "refusal_p50_s": round(float(np.median(refusal_s)), 3) if refusal_s else None,
        "served_p50_s": round(float(np.median(served_s)), 3) if served_s else None,
        "refusal_messages": sorted({message.split(";")[0] for status, _, message in answers if status == 503}),
        "replica_rss_idle_mib": round(idle / 2**20, 1),
        "replica_rss_peak_mib": round(sampler.peak / 2**20, 1),
        "bound_mib": round((idle + MEMORY_BOUND) / 2**20, 1),
        "under_bound": sampler.peak <= idle + MEMORY_BOUND,
        "ready_after": ready,
        "ordinary_forecast_after": ordinary,
    }


def hostile_grpc(pid: int, port: int, grpc_port: int) -> dict[str, Any]:
    import httpx

    before = rss_bytes(pid)
    with RssSampler(pid) as sampler:
        result = grpc_call(grpc_port)
    result["replica_rss_before_mib"] = round(before / 2**20, 1)
    result["replica_rss_peak_mib"] = round(sampler.peak / 2**20, 1)
    result["ready_after"] = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30).status_code
    return result


def main() -> int:
    load_before = os.getloadavg()
    server, port, grpc_port = start()
    results: dict[str, Any] = {}
    try:
        pid = replica_pid(server.pid)
        time.sleep(2.0)
        results["http"] = hostile_http(pid, port, expect=False)
        results["grpc"] = hostile_grpc(pid, port, grpc_port)
    finally:
        stop_server(server)
        remove_server_logs()
    results["conditions"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "max_body_bytes": BODY_BYTES,
        "max_request_memory_bytes": MEMORY_BOUND,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serve_hostile.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
