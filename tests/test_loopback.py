"""The embedded local Ray stays on 127.0.0.1: every socket its process tree listens on is loopback.

Runs the embedded start-up (``local_ray.connect``) in a fresh interpreter, without the test suite's
environment switch, exactly as ``distributed-onnx backtest`` does; then ``distributed-onnx serve`` the same way,
with an unauthenticated client probing every socket it listens on (measurements below), and stopped by SIGTERM
or Ctrl-C (the same run checks that it stops cleanly).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from conftest import free_ports, wait_until_ready

from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.runtime.listening import is_loopback, listening_addresses, process_tree
from distributed_onnx.runtime.ray_private import CLUSTER_SWITCH

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    import ray
    from distributed_onnx.runtime.local_ray import connect
    connect(None, num_cpus=1, stand_in_agents=sys.argv[2] == "stand-ins")

    @ray.remote
    def where():
        print("hello from a task")  # reaches this console through the log monitor
        return ray.util.get_node_ip_address()

    print(json.dumps({"node": ray.get(where.remote()), "pid": os.getpid()}), flush=True)
    sys.stdin.readline()  # hold Ray up until the test has looked at the sockets
    ray.shutdown()
    """
)


@pytest.mark.parametrize("agents", ["ray's", "stand-ins"])
def test_embedded_ray_listens_on_loopback_only_and_runs_a_single_node_head(agents: str) -> None:
    """Loopback only; and the head is lean (``ray_private.single_node_head``): no dashboard API server, no
    autoscaler monitor and a minimal dashboard agent among its processes, while GCS, the raylet, its agents and
    the log monitor run, and a task's output still reaches the console. A Ray started for one backtest
    (``stand_in_agents``) runs ``runtime/agent_stand_in.py`` in place of both agents, and tasks run on it."""
    env = {key: value for key, value in os.environ.items() if key != CLUSTER_SWITCH}
    tests_dir = os.path.dirname(__file__)
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, tests_dir, agents],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=os.path.dirname(tests_dir),
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        console = [process.stdout.readline()]  # a task's output lands on stdout too, before or after the result
        while not console[-1].startswith("{"):
            console.append(process.stdout.readline())
        started = json.loads(console[-1])
        assert started["node"] == "127.0.0.1"
        addresses = listening_addresses(process.pid)
        assert addresses, "found no listening sockets: the /proc reading is broken"
        exposed = [address for address in addresses if not is_loopback(address)]
        assert not exposed, f"embedded Ray listens beyond loopback: {exposed} (all: {addresses})"
        command_lines = [_command_line(pid) for pid in process_tree(process.pid)]
        commands = " ".join(command_lines)
        agent_processes = ("dashboard/agent.py", "runtime_env/agent/main.py")
        for running in ("gcs_server", "raylet", "log_monitor.py", *(agent_processes if agents == "ray's" else ())):
            assert running in commands, f"{running} is not running: {commands}"
        assert "dashboard/dashboard.py" not in commands  # the API server
        assert "autoscaler/_private/monitor.py" not in commands
        if agents == "ray's":
            assert re.search(r"dashboard/agent\.py .*--minimal", commands), commands  # no node metrics to export
        else:
            programs = [" ".join(line.split()[:3]) for line in command_lines]  # the raylet's flags name it too
            assert sum("agent_stand_in.py" in program for program in programs) == 2, commands
            assert not any(agent in commands for agent in agent_processes), commands
        process.stdin.write("\n")
        process.stdin.flush()
        console.append(process.communicate(timeout=60)[0])
    finally:
        if process.poll() is None:
            process.kill()
    assert "hello from a task" in "".join(console)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # gone meanwhile
        return ""


# ------------------------------------------------------------------------------------------ distributed-onnx serve
#
# Measured with Ray 2.60 (report printed by the test below, run with -s):
# - Without serve.operations.loopback, each Serve replica's inter-deployment gRPC server listened on [::]:0
#   (all interfaces), the one socket of `serve` beyond loopback.
# - An unauthenticated client on that port, with token authentication on (Ray's default): every call refused with
#   UNAUTHENTICATED "Invalid or missing authentication token", the request never read.
# - The same with RAY_AUTH_MODE=disabled: the replica unpickled the request's pickled_request_metadata, i.e. ran
#   the client's code (a probe whose __reduce__ printed a line did print it in the replica's log).
# The test pins both facts that matter now: every socket is on loopback, and a pickle probe sent without a token
# to every one of them runs nowhere.

PICKLE_PROBE_PATH = "/ray.serve.ASGIService/HandleRequest"


class _Marker:
    """Unpickling this creates a file: proof that a server executed what an unauthenticated client sent."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def _probe(port: int, marker: str) -> str:
    import pickle

    import grpc
    from ray.serve.generated import serve_pb2

    request = serve_pb2.ASGIRequest(pickled_request_metadata=pickle.dumps(_Marker(marker)), request_args=b"")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(PICKLE_PROBE_PATH, request_serializer=lambda m: m.SerializeToString())
        try:
            call(request, timeout=10)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {(exc.details() or '')[:80]}"
    return "OK (answered!)"


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_serve_runs_in_the_foreground_on_loopback_only_refuses_unauthenticated_clients_and_stops_cleanly(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """One ``serve`` run, as a user starts it (no test switch in its environment): it answers a forecast and says
    what it serves; every socket of its process tree is on loopback and refuses a pickle probe sent without a
    token; SIGTERM or Ctrl-C then stops it cleanly: exit 0 within seconds, nothing that reads like a failure on
    the way out, and no process of the embedded Ray left behind."""
    port, grpc_port = free_ports(2)  # both: another serve on this machine may hold the default gRPC port
    env = {k: v for k, v in os.environ.items() if k not in {CLUSTER_SWITCH, "RAY_ADDRESS"}}
    checkpoint = str(tiny_checkpoint.weights_path)
    command = [sys.executable, "-m", "distributed_onnx", "serve", "--checkpoint", checkpoint, "--port", str(port)]
    command += ["--grpc-port", str(grpc_port), "--max-batch-size", "4"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, process, timeout_s=180)
        response = httpx.post(f"{url}/v1/forecast", json={"series": [{"series_id": "a", "y": [1.0, 3.0]}]}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == tiny_checkpoint.weights_path.stem
        # /docs says what is served (its OpenAPI description): the models, the shadows and the log.
        described = httpx.get(f"{url}/openapi.json", timeout=30).json()["info"]["description"]
        assert f"`{tiny_checkpoint.weights_path.stem}`" in described and "**Forecast log**: off" in described

        addresses = listening_addresses(process.pid)
        exposed = [address for address in addresses if not is_loopback(address)]
        assert not exposed, f"serve listens beyond loopback: {exposed} (all: {addresses})"
        marker = tmp_path / "executed"
        report = {address: _probe(int(address.rsplit(":", 1)[1]), str(marker)) for address in addresses}
        print("\nunauthenticated pickle probe per listening socket:")
        for address, outcome in report.items():
            print(f"  {address:>22}  {outcome}")
        assert not marker.exists(), f"a server unpickled an unauthenticated request: {report}"
        assert not any(outcome.startswith("OK") for outcome in report.values()), report
        assert any(outcome.startswith("UNAUTHENTICATED") for outcome in report.values()), report

        ray_processes = process_tree(process.pid) - {process.pid}
        assert ray_processes, "found no child processes: the /proc reading is broken"
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        assert "ready: http://127.0.0.1" in output
        assert f"models: {tiny_checkpoint.weights_path.stem} (default); forecast log: off" in output
        assert "failed" not in output.lower() and "Traceback" not in output, output
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/v2/health/live", timeout=2)
        left = {pid for pid in ray_processes if Path(f"/proc/{pid}").exists() and not _is_zombie(pid)}
        assert not left, f"processes of the embedded Ray still running after exit: {sorted(left)}"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
