"""What the serving benchmarks share: start a server process and wait until it is ready, stop it, and read the
memory of its Serve replicas.

Each benchmark starts every server as a fresh process (the real ``distributed-onnx serve`` command line, or a
benchmark's own server script) on free loopback ports, one at a time, so each gets the machine to itself. The
server's output goes to ``benchmarks/results/.server-<port>.log`` (removed by :func:`remove_server_logs` once
a benchmark has written its results; left behind when a server failed to start, for reading).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from distributed_onnx.runtime.listening import process_tree

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
READY_PATH = "/v2/health/ready"


def serve_command(*arguments: str) -> list[str]:
    """``distributed-onnx serve ARGUMENTS`` with this interpreter (ports are added by :func:`start_server`)."""
    return [sys.executable, "-m", "distributed_onnx", "serve", *arguments]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(port: int, path: str = READY_PATH) -> bool:
    """Whether ``GET path`` on 127.0.0.1:port answers 200 now."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def start_server(
    command: list[str],
    port: int,
    *,
    timeout_s: float = 300.0,
    settle_s: float = 5.0,
    ready_path: str = READY_PATH,
) -> subprocess.Popen[str]:
    """Start ``command`` (it must listen on ``port``), wait until ``ready_path`` answers 200, then ``settle_s``
    more (HAProxy reloads its configuration as replicas register). Runs with this checkout on ``PYTHONPATH``."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = open(RESULTS / f".server-{port}.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while not ready(port, ready_path):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError(f"server did not start: {command} (see {log.name})")
        time.sleep(0.5)
    time.sleep(settle_s)
    return process


def stop_server(process: subprocess.Popen[str], timeout_s: float = 120.0) -> float:
    """SIGINT (the server's clean stop), SIGKILL after ``timeout_s``; returns the seconds it took."""
    started = time.perf_counter()
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return round(time.perf_counter() - started, 2)


def remove_server_logs() -> None:
    for log in RESULTS.glob(".server-*.log"):
        log.unlink()


# ------------------------------------------------------------------------------------------ replica memory


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (read from /proc, as the package's loopback check reads it)."""
    return sorted(process_tree(root))


def replica_pids(root: int, deployment: str = "") -> list[int]:
    """The Serve replica processes under ``root`` (Ray names them ``ServeReplica:<app>:<deployment>``)."""
    found = []
    for pid in descendants(root):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ServeReplica" in command and deployment in command:
            found.append(pid)
    return found


def replica_pid(root: int, deployment: str = "OnnxForecastServer") -> int:
    pids = replica_pids(root, deployment)
    if not pids:
        raise RuntimeError(f"no ServeReplica process of {deployment} under the server")
    return pids[0]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
