"""``distributed-onnx serve`` in a subprocess: start-up errors are one line and an exit code.

That Ctrl-C and SIGTERM stop a running ``serve`` cleanly is checked by the run in ``tests/test_loopback.py`` that
also probes its sockets (one start of ``serve`` for both).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0
COMMAND = [sys.executable, "-m", "distributed_onnx", "serve"]


def environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def run_to_exit(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *arguments], check=False, env=environment(), capture_output=True, text=True, timeout=EXIT_TIMEOUT_S
    )


def test_a_missing_checkpoint_is_one_line_and_exit_2_before_ray_starts(tmp_path: Path) -> None:
    result = run_to_exit(["--checkpoint", str(tmp_path / "nope.onnx"), "--port", str(free_port())])
    assert result.returncode == 2, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "nope.onnx" in lines[0]


def test_a_port_in_use_is_one_line_and_exit_2(tiny_checkpoint: ResolvedCheckpoint) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_to_exit(["--checkpoint", str(tiny_checkpoint.weights_path), "--port", str(port)])
    assert result.returncode == 2, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [f"error: 127.0.0.1:{port} is already in use; stop what listens there or choose another --port."]


#: Runs serve with one of its ports taken (``TAKEN_PORT``: ``port`` or ``grpc_port``; a listener that never
#: answers) after the preflight found it free, as one of Ray's own processes or another program may take it while
#: Ray starts.
PORT_TAKEN_AFTER_PREFLIGHT = """
import os, socket, sys
from distributed_onnx.serve import runner
deploy = runner.deploy
held = []
def taken_then_deployed(settings, plan):
    taker = socket.socket()
    taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taker.bind((settings.host, getattr(settings, os.environ["TAKEN_PORT"])))
    taker.listen()
    held.append(taker)
    return deploy(settings, plan)
runner.deploy = taken_then_deployed
from distributed_onnx.cli import run
run()
"""
#: serve's own log lines on stderr (its INFO lines: the ingress chosen, Ray started); anything else is not ours.
OWN_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) distributed_onnx[.\w]*: ")


@pytest.mark.parametrize("taken", ["port", "grpc_port"])
def test_a_port_taken_after_the_preflight_is_one_line_naming_the_ports(
    tiny_checkpoint: ResolvedCheckpoint, taken: str
) -> None:
    """Attack E: Serve's own words (``NoAvailablePortError: No available ports on node ... for
    RequestProtocol.HTTP``) named neither the port nor the flag. With the gRPC port taken, the replicas' gRPC core
    also printed two raw lines (``add_port.cc:83] Failed to add port ... Address already in use``) before the
    error: the user sees the one line only."""
    port, grpc_port = free_port(), free_port()
    arguments = ["serve", "--checkpoint", str(tiny_checkpoint.weights_path), "--port", str(port)]
    arguments += ["--grpc-port", str(grpc_port), "--ready-timeout-s", "60"]
    result = subprocess.run(
        [sys.executable, "-c", PORT_TAKEN_AFTER_PREFLIGHT, *arguments],
        check=False,
        env=environment() | {"TAKEN_PORT": taken},
        capture_output=True,
        text=True,
        timeout=180,
    )
    shown = [line for line in result.stderr.splitlines() if line.strip() and not OWN_LOG_LINE.match(line)]
    assert result.returncode == 2, result.stderr[-3000:]
    assert shown == [
        f"error: the deployment could not bind its ports (127.0.0.1:{port} HTTP, 127.0.0.1:{grpc_port} gRPC): "
        "another process took one after they were found free (Ray's own processes take ports while Ray starts); "
        "choose free ports with --port and --grpc-port."
    ], result.stderr[-3000:]


def test_replicas_no_node_can_host_are_one_line_and_exit_2_not_a_wait_without_end(
    tiny_checkpoint: ResolvedCheckpoint,
) -> None:
    """``serve.run`` waited for the application without a deadline: a replica asking more CPUs than any node
    has hung the command with no error. Now it is refused as soon as Ray is up (and any start is bounded by
    ``--ready-timeout-s``)."""
    cpus = (os.cpu_count() or 1) + 1
    arguments = ["--checkpoint", str(tiny_checkpoint.weights_path), "--port", str(free_port())]
    result = run_to_exit([*arguments, "--grpc-port", str(free_port()), "--cpus-per-replica", str(cpus)])
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: No node can host one of the Serve replicas ({cpus} CPU, 0 GPU each); the nodes "), (
        last
    )
    assert last.endswith("Lower --cpus-per-replica/--gpus-per-replica or add nodes."), last


def test_a_checkpoint_onnx_runtime_cannot_load_is_one_line_naming_it_and_exit_2(tmp_path: Path) -> None:
    """Issue 29, defect 7: a shadow whose metadata resolves but whose graph cannot be loaded exited 4 ("internal
    error, please report"), and the traceback file never named the file."""
    import hashlib
    import json

    from graphs import write_tiny_chronos2, write_tiny_context_quantiles

    primary = write_tiny_chronos2(tmp_path).weights_path
    shadow = write_tiny_context_quantiles(tmp_path).weights_path
    shadow.write_bytes(shadow.read_bytes()[:100])  # torn, with metadata that agrees (its digest recomputed)
    metadata = shadow.with_suffix(".metadata.json")
    document = json.loads(metadata.read_text())
    document["sha256"] = hashlib.sha256(shadow.read_bytes()).hexdigest()
    metadata.write_text(json.dumps(document))
    arguments = ["--checkpoint", str(primary), "--checkpoint", str(shadow), "--shadow", shadow.stem]
    arguments += ["--port", str(free_port()), "--grpc-port", str(free_port()), "--warm-up-rows", "0"]
    arguments += ["--cpus-per-replica", "1"]
    result = subprocess.run(
        [*COMMAND, *arguments], check=False, env=environment(), capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(shadow) in last and "internal error" not in last


@pytest.mark.usefixtures("ray_session")
def test_replicas_without_room_stop_serve_within_its_deadline_naming_what_they_asked(
    tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that fits the cluster but finds no room (another actor holds the CPUs) kept ``serve`` waiting
    without end; now it stops within ``--ready-timeout-s``, naming the replicas, what was free and Serve's word.
    On the tests' shared Ray, in this process (``serve`` joins a Ray it finds; only its application is deleted)."""
    import time

    import ray

    from distributed_onnx import cli

    @ray.remote(num_cpus=2)
    class Holder:
        def ping(self) -> int:
            return 1

    holder = Holder.remote()  # type: ignore[attr-defined]
    ray.get(holder.ping.remote(), timeout=60)
    from distributed_onnx.serve import runner

    stop = runner.stop

    def stop_with_the_room_back(started_ray: bool, deployed: bool = True) -> None:
        # The error line is made (what was free included) before serve stops. Deleting the application asks each
        # replica to shut down, and a replica Ray has no room for cannot answer: Serve waits its graceful-shutdown
        # timeout (20 s) before it kills it. The room given back first, the replica starts and answers.
        ray.kill(holder)
        stop(started_ray, deployed)

    monkeypatch.setattr(runner, "stop", stop_with_the_room_back)
    arguments = ["serve", "--checkpoint", str(tiny_checkpoint.weights_path), "--port", str(free_port())]
    arguments += ["--grpc-port", str(free_port()), "--ready-timeout-s", "2"]
    started = time.monotonic()
    try:
        code = cli.main(arguments)
    finally:
        ray.kill(holder)
        # On a Ray it joined, serve deletes only its application: the Serve instance it started (controller,
        # proxy on this test's port) would stay, and a later module's serve.start on other ports would be
        # ignored by it (every request of that module refused).
        from ray import serve

        serve.shutdown()
    assert code == 3
    assert time.monotonic() - started < 90
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        "error: the deployment of 1 Serve replicas (1 CPU, 0 GPU each) was not ready within 2 s (http://127.0.0.1:"
    ), last
    assert "; the cluster has 0 CPU, 2 GPU" in last and "free of 2 CPU, 2 GPU" in last, last
    assert "raise --ready-timeout-s for a large model." in last, last
