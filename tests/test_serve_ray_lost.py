"""Ray lost under a running ``serve`` (issue 46): one ``error:`` line, exit 3, and nothing of the embedded Ray left.

Before, killing the embedded Ray's GCS left ``serve`` serving for Ray's 60 s reconnect window, then Ray's C++ core
logged "Failed to connect to GCS ... The program will terminate" and the process ended with exit 1, no ``error:``
line, and the raylet, its agents and the log monitor still running (measured). A killed raylet left ``serve``
running with nothing served behind it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import free_ports, wait_until_ready
from listening import process_tree

from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.runtime.ray_watch import RayWatch, stop_process_tree

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

#: Seconds serve may take from the GCS's death to its exit (it sees it within a second; stopping takes a few).
EXIT_WITHIN_S = 30.0


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


#: The Ray process each case of the test kills, one serve each.
KILLED = ("gcs_server", "raylet")


@dataclass
class _Serve:
    """A ``serve`` of the module, its stderr read into ``stderr`` by a thread as it comes."""

    process: subprocess.Popen[str]
    port: int
    stderr: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None


@pytest.fixture(scope="module")
def serves(tiny_checkpoint: ResolvedCheckpoint) -> Iterator[dict[str, _Serve]]:
    """One ``serve`` (its own embedded Ray) per case, started together: most of a start is waiting on Ray's
    processes, so the second costs little beside the first. Each case kills its own serve's process."""
    ports = free_ports(2 * len(KILLED))  # picked together: each serve's differ from the other's
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    started: dict[str, _Serve] = {}
    try:
        for index, killed in enumerate(KILLED):
            port, grpc_port = ports[2 * index : 2 * index + 2]
            command = [sys.executable, "-m", "distributed_onnx", "serve"]
            command += ["--checkpoint", str(tiny_checkpoint.weights_path), "--host", "127.0.0.1"]
            command += ["--port", str(port), "--grpc-port", str(grpc_port)]
            process = subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            serve = started[killed] = _Serve(process, port)
            serve.reader = threading.Thread(target=lambda s=serve: s.stderr.extend(s.process.stderr or []), daemon=True)
            serve.reader.start()
        for serve in started.values():
            wait_until_ready(f"http://127.0.0.1:{serve.port}", serve.process)
        yield started
    finally:
        for serve in started.values():
            if serve.process.poll() is None:
                serve.process.kill()
                serve.process.wait()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("killed", KILLED)
def test_a_killed_gcs_or_raylet_ends_serve_with_one_error_line_exit_3_and_no_process_left(
    serves: dict[str, _Serve], killed: str
) -> None:
    serve = serves[killed]
    process, stderr = serve.process, serve.stderr
    try:
        assert process.stdout is not None and process.stdout.readline().startswith("ready: ")
        session = process_tree(process.pid) - {process.pid}
        names = {pid: _name(pid) for pid in session}
        victim = [pid for pid, name in names.items() if name == killed]
        assert len(victim) == 1, names
        os.kill(victim[0], signal.SIGKILL)
        killed_at = time.monotonic()
        process.wait(timeout=EXIT_WITHIN_S)
        took = time.monotonic() - killed_at
        assert serve.reader is not None
        serve.reader.join(10)
        text = "".join(stderr)
        assert process.returncode == 3, f"exit {process.returncode} after {took:.1f} s:\n{text}"
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"{killed} (pid {victim[0]}) exited" in errors[0], text
        assert "Ray went away under serve" in errors[0], text
        assert "The program will terminate" not in text and "Traceback" not in text, text
        left = {pid: names[pid] for pid in session if _state(pid) not in (None, "Z", "X")}
        assert not left, f"processes of the serve session still running after exit: {left}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_watch_sees_a_vital_process_exit() -> None:
    """The embedded watch: a raylet (here a stand-in child) that exits is the loss, named with its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = RayWatch(processes={child.pid: "raylet"})
        assert watch.lost() is None
        child.kill()
        child.wait()
        assert watch.lost() == f"the embedded Ray's raylet (pid {child.pid}) exited"
    finally:
        child.kill()
        child.wait()


def test_a_cluster_gcs_is_lost_only_after_its_grace() -> None:
    """A cluster's GCS may restart: a refused probe is the loss only once it lasted the grace, and an answer
    in between starts the count again."""
    answers = [False, False, True, False, False, False]
    now = [0.0]
    watch = RayWatch(gcs_address="10.0.0.1:6379", grace_s=20.0, probe=lambda _: answers.pop(0), clock=lambda: now[0])
    seen = []
    for at in (0.0, 15.0, 17.0, 17.5, 19.0, 30.0, 39.0):  # 17.5: within probe_every_s of the last probe: none
        now[0] = at
        seen.append(watch.lost())
    assert seen[:6] == [None] * 6 and answers == []
    assert seen[6] == "the Ray cluster's GCS at 10.0.0.1:6379 has not answered for 20 s"


def test_stop_process_tree_stops_children_and_grandchildren() -> None:
    """What the lost embedded Ray leaves (raylet, its workers) is stopped; one ignoring SIGTERM by SIGKILL."""
    sleeper = "import time; time.sleep(60)"
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}]); time.sleep(60)"
    )
    root = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {stubborn!r}]); print('up', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", root], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 30
        while len(process_tree(process.pid)) < 3:
            assert time.monotonic() < deadline, "the grandchild did not start"
            time.sleep(0.05)
        descendants = process_tree(process.pid) - {process.pid}
        assert stop_process_tree(process.pid, timeout_s=0.5) == []
        assert all(_state(pid) in (None, "Z", "X") for pid in descendants)
        assert process.poll() is None  # the root itself (serve's own process) is not signalled
    finally:
        process.kill()
        process.wait()
