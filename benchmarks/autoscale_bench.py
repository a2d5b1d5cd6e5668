"""A load ramp against an autoscaled ``distributed-onnx serve``: 1 -> N replicas under load, back to 1 after it.

The server is the real command (embedded Ray on 127.0.0.1, HAProxy in front of the replicas, the tiny test graph
so the replicas' start-up is short) with short autoscaling delays. The ramp, :func:`run_ramp`, also used by
``tests/test_serve_autoscale.py``:

1. ``warm``: one client, a few seconds (one replica);
2. ``peak``: ``peak_clients`` clients back to back until a second replica has run for ``hold_s`` (it must take
   traffic: its ``replica`` label is seen on ``/metrics``), at most ``peak_max_s``;
3. ``down``: one client every ``trickle_s`` until only one replica is left, then ``settle_s`` more: requests keep
   arriving while a replica stops.

Every request's start, phase, latency and status (or connection error) is kept, and the replica count is sampled
every 0.25 s from the server's process tree (Ray names a replica's process ``ServeReplica:<app>:<deployment>``;
one that is starting or stopping counts). Several rounds, each on a fresh server, one after another; the machine's
load average is recorded with them. Results: ``benchmarks/results/autoscale.{md,json}``.

Run: ``.venv/bin/python benchmarks/autoscale_bench.py [--rounds 3]`` (about a minute per round on 2 cores).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import RESULTS, free_port, remove_server_logs, replica_pids, serve_command, start_server, stop_server

#: The autoscaling of the benchmark and of the test: short delays so a ramp takes seconds, not Serve's minutes.
AUTOSCALING = {
    "--min-replicas": "1",
    "--max-replicas": "2",
    "--target-ongoing-requests": "2",
    "--upscale-delay-s": "1",
    "--downscale-delay-s": "3",
    "--metrics-interval-s": "0.5",
    "--look-back-period-s": "2",
}
#: A request: 16 series of the tiny graph's context (16 steps).
BODY = json.dumps(
    {"series": [{"series_id": f"s{k}", "y": [float(k + step) for step in range(16)]} for k in range(16)]}
).encode()


@dataclass
class Request:
    start_s: float  # since the ramp began
    phase: str
    latency_s: float
    status: int  # 0: a connection error (``error`` says which)
    error: str = ""


@dataclass
class Ramp:
    requests: list[Request] = field(default_factory=list)
    replicas: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, replica processes)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> (start, end) seconds
    answering: list[str] = field(default_factory=list)  # replica labels seen serving on /metrics during the peak

    @property
    def most_replicas(self) -> int:
        return max(count for _, count in self.replicas)

    @property
    def last_replicas(self) -> int:
        return self.replicas[-1][1]

    def failures(self) -> list[Request]:
        return [request for request in self.requests if request.status != 200]


class _Client(threading.Thread):
    """A client sending requests back to back on one keep-alive connection (a fresh one after an error)."""

    def __init__(self, ramp: _Driver, index: int) -> None:
        super().__init__(daemon=True)
        self.ramp = ramp
        self.index = index

    def run(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while not self.ramp.stopped.is_set():
            phase, clients, pause_s = self.ramp.level()
            if self.index >= clients:
                time.sleep(0.05)
                continue
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.ramp.port, timeout=30)
            started = time.perf_counter()
            try:
                connection.request("POST", "/v1/forecast", BODY, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status, error = response.status, ""
            except (OSError, http.client.HTTPException) as exc:
                status, error = 0, f"{type(exc).__name__}: {exc}"
                connection.close()
                connection = None
            self.ramp.record(Request(started - self.ramp.t0, phase, time.perf_counter() - started, status, error))
            if pause_s:
                time.sleep(pause_s)
        if connection is not None:
            connection.close()


class _Driver:
    def __init__(self, port: int, peak_clients: int) -> None:
        self.port = port
        self.t0 = time.perf_counter()
        self.stopped = threading.Event()
        self.result = Ramp()
        self._lock = threading.Lock()
        self._level: tuple[str, int, float] = ("warm", 1, 0.0)
        self.clients = [_Client(self, index) for index in range(peak_clients)]

    def level(self) -> tuple[str, int, float]:
        return self._level

    def set_level(self, phase: str, clients: int, pause_s: float) -> None:
        now = self.now()
        if self.result.phases:
            last = next(reversed(self.result.phases))
            self.result.phases[last] = (self.result.phases[last][0], now)
        self.result.phases[phase] = (now, now)
        self._level = (phase, clients, pause_s)

    def record(self, request: Request) -> None:
        with self._lock:
            self.result.requests.append(request)

    def now(self) -> float:
        return time.perf_counter() - self.t0


def replica_labels(port: int) -> set[str]:
    """The ``replica`` labels with forecasts served on the ``/metrics`` page one scrape reaches."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        if line.startswith("distributed_onnx_forecasts_served_total{") and 'replica="' in line:
            found.add(line.split('replica="', 1)[1].split('"', 1)[0])
    return found


def run_ramp(  # noqa: PLR0913 - the ramp's shape, each with a default
    port: int,
    server_pid: int,
    *,
    peak_clients: int = 8,
    warm_s: float = 3.0,
    hold_s: float = 4.0,
    peak_max_s: float = 60.0,
    trickle_s: float = 0.1,
    down_max_s: float = 60.0,
    settle_s: float = 2.0,
) -> Ramp:
    """Drive the ramp of the module docstring against the server on ``port`` (process ``server_pid``)."""
    driver = _Driver(port, peak_clients)
    ramp = driver.result
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            ramp.replicas.append((driver.now(), len(replica_pids(server_pid, "OnnxForecastServer"))))
            stop_sampling.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    driver.set_level("warm", 1, 0.0)
    for client in driver.clients:
        client.start()
    try:
        time.sleep(warm_s)
        driver.set_level("peak", peak_clients, 0.0)
        deadline = time.monotonic() + peak_max_s
        several_since: float | None = None
        seen: set[str] = set()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            count = ramp.replicas[-1][1] if ramp.replicas else 0
            if count >= 2:
                several_since = several_since or time.monotonic()
                seen |= replica_labels(port)
                if time.monotonic() - several_since >= hold_s and len(seen) >= 2:
                    break
            else:
                several_since = None
        ramp.answering = sorted(seen)
        driver.set_level("down", 1, trickle_s)
        deadline = time.monotonic() + down_max_s
        while time.monotonic() < deadline and not (ramp.replicas and ramp.replicas[-1][1] == 1):
            time.sleep(0.25)
        time.sleep(settle_s)
        driver.set_level("end", 0, 0.0)
    finally:
        driver.stopped.set()
        for client in driver.clients:
            client.join(timeout=40)
        stop_sampling.set()
        sampler.join(timeout=5)
    ramp.phases.pop("end", None)
    return ramp


def autoscaled_server(checkpoint: Path, port: int, grpc_port: int) -> Any:
    """Start ``distributed-onnx serve`` autoscaled on ``checkpoint`` (benchmarks/servers.py: logs, readiness)."""
    arguments = ["--checkpoint", str(checkpoint), "--cpus-per-replica", "0.5", "--max-batch-size", "16"]
    arguments += [word for pair in AUTOSCALING.items() for word in pair]
    arguments += ["--port", str(port), "--grpc-port", str(grpc_port)]
    return start_server(serve_command(*arguments), port, settle_s=2.0)


def summary(ramp: Ramp) -> dict[str, Any]:
    def percentiles(requests: list[Request]) -> dict[str, Any]:
        latencies = np.array([request.latency_s for request in requests]) * 1000.0
        if not latencies.size:
            return {"requests": 0}
        return {
            "requests": int(latencies.size),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2),
            "p99_ms": round(float(np.percentile(latencies, 99)), 2),
            "max_ms": round(float(latencies.max()), 2),
        }

    by_phase = {phase: percentiles([r for r in ramp.requests if r.phase == phase]) for phase in ramp.phases}
    # The replica count at each change (and at the start and end), not every 0.25 s sample.
    changes = [ramp.replicas[0]] + [
        sample for before, sample in zip(ramp.replicas, ramp.replicas[1:], strict=False) if sample[1] != before[1]
    ]
    changes.append(ramp.replicas[-1])
    return {
        "all": percentiles(ramp.requests),
        "phases": {
            phase: {"start_s": round(a, 2), "end_s": round(b, 2)} | by_phase[phase]
            for phase, (a, b) in ramp.phases.items()
        },
        "replica_changes": [(round(t, 2), count) for t, count in changes],
        "most_replicas": ramp.most_replicas,
        "last_replicas": ramp.last_replicas,
        "answering_replicas_at_peak": len(ramp.answering),
        "failures": [asdict(request) for request in ramp.failures()],
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Autoscaling under a load ramp",
        "",
        "`distributed-onnx serve` (embedded Ray, HAProxy ingress), the tiny test graph, 16 series per request, "
        f"`{' '.join(f'{k} {v}' for k, v in AUTOSCALING.items())}`, 0.5 CPU per replica. Ramp: 1 client "
        f"(warm), {results['peak_clients']} clients back to back (peak) until a second replica has served for "
        "4 s, then 1 client every 0.1 s (down) until one replica is left, 2 s more. Each round on a fresh server. "
        f"Reproduce: `.venv/bin/python benchmarks/autoscale_bench.py --rounds {len(results['rounds'])}`.",
        "",
        f"Machine: {results['machine']}; load average before / after: {results['load_before']} / "
        f"{results['load_after']} (shared with other work: absolute latencies are this machine's, not a target).",
        "",
        "| round | phase | seconds | requests | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, round_ in enumerate(results["rounds"], 1):
        for phase, row in round_["phases"].items():
            lines.append(
                f"| {number} | {phase} | {row['start_s']}-{row['end_s']} | {row['requests']} "
                f"| {row.get('p50_ms', '-')} | {row.get('p99_ms', '-')} | {row.get('max_ms', '-')} |"
            )
        everything = round_["all"]
        lines.append(
            f"| {number} | **whole ramp** | | {everything['requests']} | {everything['p50_ms']} | "
            f"{everything['p99_ms']} | {everything['max_ms']} |"
        )
    lines += ["", "Replica processes over time (seconds since the ramp began: count, at each change):", ""]
    for number, round_ in enumerate(results["rounds"], 1):
        changes = ", ".join(f"{t} s: {count}" for t, count in round_["replica_changes"])
        lines.append(
            f"- round {number}: {changes}; replicas seen answering on /metrics at the peak: "
            f"{round_['answering_replicas_at_peak']}; requests not 200 or failed to connect: {len(round_['failures'])}"
        )
    p99 = [round_["all"]["p99_ms"] for round_ in results["rounds"]]
    p50 = [round_["all"]["p50_ms"] for round_ in results["rounds"]]
    lines += [
        "",
        f"Median over rounds, whole ramp: p50 {float(np.median(p50)):.2f} ms, p99 {float(np.median(p99)):.2f} ms.",
        "",
        "A replica process counts from its start (the constructor loads the checkpoint and runs the warm-up "
        "forecast; Serve routes to it only after that and its first health check) until it exits (draining).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-clients", type=int, default=8)
    options = parser.parse_args()
    # As in the test: on a loaded machine Serve's 5 s wait for its HAProxy proxy actor ran out (the start failed).
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    from graphs import write_tiny_chronos2

    checkpoint = write_tiny_chronos2(Path(tempfile.mkdtemp(prefix="autoscale-"))).weights_path
    results: dict[str, Any] = {
        "peak_clients": options.peak_clients,
        "autoscaling": AUTOSCALING,
        "machine": f"{os.cpu_count()} cores",
        "load_before": [round(value, 2) for value in os.getloadavg()],
        "rounds": [],
    }
    for _ in range(options.rounds):
        process = None
        for _attempt in range(4):  # on a shared machine Ray's 30 s node start-up wait can run out: start again
            port, grpc_port = free_port(), free_port()
            try:
                process = autoscaled_server(checkpoint, port, grpc_port)
                break
            except RuntimeError as exc:
                print(f"server did not start ({exc}); trying again", flush=True)
        if process is None:
            raise RuntimeError("the server did not start in 4 attempts")
        try:
            ramp = run_ramp(port, process.pid, peak_clients=options.peak_clients)
        finally:
            stop_server(process)
        results["rounds"].append(summary(ramp) | {"replicas_sampled": [(round(t, 2), c) for t, c in ramp.replicas]})
        print(json.dumps({k: v for k, v in results["rounds"][-1].items() if k != "replicas_sampled"}), flush=True)
    results["load_after"] = [round(value, 2) for value in os.getloadavg()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "autoscale.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "autoscale.md").write_text(markdown(results))
    remove_server_logs()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
