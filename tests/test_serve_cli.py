"""``distributed-onnx serve`` in a subprocess: it becomes ready on loopback and exits 0 on SIGTERM and on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from distributed_onnx.checkpoint import ResolvedCheckpoint

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_serve_command_runs_in_the_foreground_and_stops_cleanly(
    tiny_checkpoint: ResolvedCheckpoint, stop_signal: signal.Signals
) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "distributed_onnx", "serve", "--checkpoint", str(tiny_checkpoint.weights_path)]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--max-batch-size", "4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.5)
        response = httpx.post(f"{url}/v1/forecast", json={"series": [{"series_id": "a", "y": [1.0, 3.0]}]}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == tiny_checkpoint.weights_path.stem
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=EXIT_TIMEOUT_S)
        assert process.returncode == 0, output
        assert "ready: http://127.0.0.1" in output
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/v2/health/live", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
