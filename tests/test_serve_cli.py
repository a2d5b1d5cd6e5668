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
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, free_ports

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0
COMMAND = [sys.executable, "-m", "distributed_onnx", "serve"]


def environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def run_to_exit(arguments: list[str], timeout_s: float = EXIT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *arguments], check=False, env=environment(), capture_output=True, text=True, timeout=timeout_s
    )


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


#: The port each port-taken run takes after the preflight (``TAKEN_PORT``), one case each.
TAKEN = ["port", "grpc_port"]


@dataclass(frozen=True)
class Ended:
    """A serve of the module that ends by itself (a start-up error), started by :func:`ended`: its outcome, and
    what it was given that its test checks the error against (ports, a CPU count, a file)."""

    outcome: Future[subprocess.CompletedProcess[str]]
    given: tuple[Any, ...] = ()

    def result(self) -> subprocess.CompletedProcess[str]:
        return self.outcome.result()


def torn_shadow(folder: Path) -> tuple[Path, Path]:
    """A primary checkpoint and a shadow whose graph is torn but whose metadata agrees (its digest recomputed)."""
    import hashlib
    import json

    from graphs import write_tiny_chronos2, write_tiny_context_quantiles

    primary = write_tiny_chronos2(folder).weights_path
    shadow = write_tiny_context_quantiles(folder).weights_path
    shadow.write_bytes(shadow.read_bytes()[:100])
    metadata = shadow.with_suffix(".metadata.json")
    document = json.loads(metadata.read_text())
    document["sha256"] = hashlib.sha256(shadow.read_bytes()).hexdigest()
    metadata.write_text(json.dumps(document))
    return primary, shadow


@pytest.fixture(scope="module")
def ended(tiny_checkpoint: ResolvedCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Ended]]:
    """The module's serves that end by themselves, by test (case), started together when the first test asks: most
    of a start is waiting (the imports, Ray's processes coming up), and four of them start an embedded Ray of their
    own. Each test asserts on its own run's outcome, as it did when it ran the command itself."""
    folder = tmp_path_factory.mktemp("ended")
    checkpoint = str(tiny_checkpoint.weights_path)
    missing, no_node, no_node_grpc, torn, torn_grpc, *taken_ports = free_ports(5 + 2 * len(TAKEN))
    cpus = (os.cpu_count() or 1) + 1
    primary, shadow = torn_shadow(folder)
    no_room = ["--checkpoint", checkpoint, "--port", str(no_node), "--grpc-port", str(no_node_grpc)]
    no_room += ["--cpus-per-replica", str(cpus)]
    torn_flags = ["--checkpoint", str(primary), "--checkpoint", str(shadow), "--shadow", shadow.stem]
    torn_flags += ["--port", str(torn), "--grpc-port", str(torn_grpc), "--warm-up-rows", "0", "--cpus-per-replica", "1"]
    # Three at a time: on two cores more Rays starting at once only queue for the CPUs (a run's timeout counts
    # from its own start, not from its wait for a thread).
    with socket.socket() as held, ThreadPoolExecutor(max_workers=3) as runs:
        held.bind(("127.0.0.1", 0))  # listening until every run has ended
        held.listen()
        in_use = held.getsockname()[1]
        started = {
            "missing checkpoint": Ended(
                runs.submit(run_to_exit, ["--checkpoint", str(folder / "nope.onnx"), "--port", str(missing)])
            ),
            "port in use": Ended(
                runs.submit(run_to_exit, ["--checkpoint", checkpoint, "--port", str(in_use)]), (in_use,)
            ),
            "no node can host": Ended(runs.submit(run_to_exit, no_room), (cpus,)),
            "torn shadow": Ended(runs.submit(run_to_exit, torn_flags, 180), (shadow,)),
        }
        for index, taken in enumerate(TAKEN):
            port, grpc_port = taken_ports[2 * index : 2 * index + 2]
            arguments = ["serve", "--checkpoint", checkpoint, "--port", str(port), "--grpc-port", str(grpc_port)]
            arguments += ["--ready-timeout-s", "60"]
            started[f"{taken} taken after the preflight"] = Ended(
                runs.submit(
                    subprocess.run,
                    [sys.executable, "-c", PORT_TAKEN_AFTER_PREFLIGHT, *arguments],
                    check=False,
                    env=environment() | {"TAKEN_PORT": taken},
                    capture_output=True,
                    text=True,
                    timeout=180,
                ),
                (port, grpc_port),
            )
        yield started


def test_a_missing_checkpoint_is_one_line_and_exit_2_before_ray_starts(ended: dict[str, Ended]) -> None:
    result = ended["missing checkpoint"].result()
    assert result.returncode == 2, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "nope.onnx" in lines[0]


def test_a_port_in_use_is_one_line_and_exit_2(ended: dict[str, Ended]) -> None:
    result, (port,) = ended["port in use"].result(), ended["port in use"].given
    assert result.returncode == 2, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [f"error: 127.0.0.1:{port} is already in use; stop what listens there or choose another --port."]


@pytest.mark.parametrize("taken", TAKEN)
def test_a_port_taken_after_the_preflight_is_one_line_naming_the_ports(ended: dict[str, Ended], taken: str) -> None:
    """Attack E: Serve's own words (``NoAvailablePortError: No available ports on node ... for
    RequestProtocol.HTTP``) named neither the port nor the flag. With the gRPC port taken, the replicas' gRPC core
    also printed two raw lines (``add_port.cc:83] Failed to add port ... Address already in use``) before the
    error: the user sees the one line only."""
    run = ended[f"{taken} taken after the preflight"]
    result, (port, grpc_port) = run.result(), run.given
    shown = [line for line in result.stderr.splitlines() if line.strip() and not OWN_LOG_LINE.match(line)]
    assert result.returncode == 2, result.stderr[-3000:]
    assert shown == [
        f"error: the deployment could not bind its ports (127.0.0.1:{port} HTTP, 127.0.0.1:{grpc_port} gRPC): "
        "another process took one after they were found free (Ray's own processes take ports while Ray starts); "
        "choose free ports with --port and --grpc-port."
    ], result.stderr[-3000:]


def test_replicas_no_node_can_host_are_one_line_and_exit_2_not_a_wait_without_end(ended: dict[str, Ended]) -> None:
    """``serve.run`` waited for the application without a deadline: a replica asking more CPUs than any node
    has hung the command with no error. Now it is refused as soon as Ray is up (and any start is bounded by
    ``--ready-timeout-s``)."""
    result, (cpus,) = ended["no node can host"].result(), ended["no node can host"].given
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: No node can host one of the Serve replicas ({cpus} CPU, 0 GPU each); the nodes "), (
        last
    )
    assert last.endswith("Lower --cpus-per-replica/--gpus-per-replica or add nodes."), last


def test_a_checkpoint_onnx_runtime_cannot_load_is_one_line_naming_it_and_exit_2(ended: dict[str, Ended]) -> None:
    """Issue 29, defect 7: a shadow whose metadata resolves but whose graph cannot be loaded exited 4 ("internal
    error, please report"), and the traceback file never named the file."""
    result, (shadow,) = ended["torn shadow"].result(), ended["torn shadow"].given
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
