"""Shared fixtures and helpers. Ray is started once per test session (it costs seconds), bound to 127.0.0.1.

Two tiers: tests marked ``integration`` (or ``gpu``) may start Ray, ONNX Runtime sessions and servers; the rest
(``make test-unit``) are pure logic, and :func:`_unit_tests_stay_pure` fails one that starts any of them.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Every Ray the tests start (ray.init, Cluster nodes, `ray start` subprocesses) stays on 127.0.0.1: without
# this Ray 2.60 rewrites 127.0.0.1 to the machine's network address (see distributed_onnx/runtime/local_ray.py).
# Set before any test module imports Ray, and inherited by every process the tests start.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# CPU sessions cache their optimized graph (model/backend/optimized_cache.py): in a folder of this test run, not
# the user's cache; inherited by the Ray workers the tests start.
if "DISTRIBUTED_ONNX_CACHE" not in os.environ:
    os.environ["DISTRIBUTED_ONNX_CACHE"] = tempfile.mkdtemp(prefix="distributed-onnx-cache-")
    atexit.register(shutil.rmtree, os.environ["DISTRIBUTED_ONNX_CACHE"], True)

sys.path.insert(0, str(Path(__file__).parent))

# torch gives its loggers (torch.onnx, torch._dynamo, ...) handlers bound to sys.stderr as it is when torch is first
# imported. Imported inside a test that captures output (capsys, capfd), they keep that test's stream, closed when
# it ends, and every later torch warning printed "--- Logging error ---" and a traceback into another test's stderr
# (a test that asserts one clean error line then failed, depending on which tests ran first). Imported here, they
# get the session's own capture, which lives as long as the session.
if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401

from families import (  # noqa: F401 (the family tests' session fixtures: registered here, one instance for all)
    bolt_export,
    chronos2_random_export,
    family_root,
    gappy_data,
    moirai2_random_export,
    timesfm_export,
    timesfm_pretrained,
    tiny_bolt_pretrained,
    tiny_tirex_pretrained,
    tirex_export,
    toto_export,
    toto_pretrained,
)
from graphs import write_tiny_chronos2

from distributed_onnx.model.checkpoint import ResolvedCheckpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    return write_tiny_chronos2(tmp_path_factory.mktemp("tiny"))


RAY_TEST_RESOURCES = {"num_cpus": 2, "num_gpus": 2}


@pytest.fixture
def ray_session() -> Iterator[None]:
    """The shared local Ray (2 CPUs, 2 fake GPUs for pinning tests, loopback only), started on first use.

    Starting Ray costs seconds, so it stays up across tests; a test that needs another topology (a
    ``ray.cluster_utils.Cluster``) shuts it down first and this fixture starts it again when next needed.
    """
    start_test_ray()
    yield


def start_test_ray() -> None:
    """Start the shared local Ray unless it is up (:func:`ray_session`; module-scoped fixtures call it directly)."""
    ray = pytest.importorskip("ray")
    _leave_a_ray_an_earlier_test_abandoned()
    if not ray.is_initialized():
        from distributed_onnx.runtime import local_ray, ray_private

        with ray_private.single_node_head():  # the embedded Ray's lean head, as the commands start it
            ray.init(
                **RAY_TEST_RESOURCES,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _system_config=local_ray.EMBEDDED_SYSTEM_CONFIG,
            )


#: The longest :func:`_leave_a_ray_an_earlier_test_abandoned` waits for earlier tests' Ray threads, all together.
ABANDONED_RAY_WAIT_S = 5.0


def _leave_a_ray_an_earlier_test_abandoned() -> None:
    """Disconnect from a Ray that an earlier test's in-process ``cli.main`` started early and abandoned.

    On bad input the command leaves the Ray it started early to the process's exit
    (``EarlyStart.abandon(wait=False)``): its thread (``ray-owner``) returns, and Ray's processes, which die with
    the thread that started them, go; this process stays connected to a Ray without a GCS. A test that took it
    as the shared Ray (``ray.is_initialized()`` is true) was ended, with the whole pytest process, by Ray's core
    worker 60 s later (exit 1, no summary: ``test_object_store``, ``test_data_errors_cli``, ``test_secrets``
    run in that order, every time). So: give such a thread a moment to end, then shut down a connected Ray whose
    GCS does not answer, and start the shared one afresh.
    """
    import ray

    from distributed_onnx.runtime.ray_watch import gcs_answers

    # A thread that has just returned takes its Ray's processes with it: give one that is ending a moment (a few
    # seconds in all; one that waits for its run's stop, a kept pool, does not end here and is not waited for).
    deadline = time.monotonic() + ABANDONED_RAY_WAIT_S
    for thread in threading.enumerate():
        if thread.name == "ray-owner" and thread.is_alive():
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
    if ray.is_initialized() and not gcs_answers(ray.get_runtime_context().gcs_address):
        ray.shutdown()


@pytest.fixture(autouse=True)
def _each_test_starts_with_no_remembered_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secrets a location remembers for masking (``redact.remember``) are the process's, on purpose: one test's
    URL option (``endpoint_override=127.0.0.1:1``) then masked the host another test expects to read, and which
    test passed depended on the order they ran in. Each test starts with none remembered."""
    from distributed_onnx import redact

    monkeypatch.setattr(redact, "_remembered", set())
    monkeypatch.setattr(redact, "_remembered_longest_first", [])


@pytest.fixture(autouse=True)
def _unit_tests_stay_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``integration``/``gpu`` that starts Ray, an ONNX Runtime session or a server fails,
    naming the marker it lacks: so that ``make test-unit`` stays pure logic and fast."""
    if request.node.get_closest_marker("integration") or request.node.get_closest_marker("gpu"):
        return

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            pytest.fail(f"{request.node.nodeid} {what}: mark it @pytest.mark.integration", pytrace=False)

        return refused

    if "onnxruntime" in sys.modules:
        monkeypatch.setattr(sys.modules["onnxruntime"], "InferenceSession", refuse("builds an ORT session"))
    if "ray" in sys.modules:
        monkeypatch.setattr(sys.modules["ray"], "init", refuse("starts Ray"))
    monkeypatch.setattr(socket.socket, "listen", refuse("listens on a socket (a server)"))


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as found:
            return int(found.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Where tests pick their servers' ports: above Ray's worker ports (10002-19999, which Ray's workers take later)
#: and the product's HAProxy ranges (which start
#: at 20000), below the kernel's ephemeral range. Ray's own processes bind port 0 while Ray starts, which takes
#: ports from the ephemeral range: a port a test picked there (as ``bind(("127.0.0.1", 0))`` would) was once
#: taken by one of them between the pick and serve's bind, and serve's probe met HTTP/2 frames.
TEST_PORTS = range(26000, _ephemeral_low())


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, from :data:`TEST_PORTS` (outside Ray's worker ports and the
    kernel's ephemeral range). Pick them when the server starts, not at import."""
    chooser = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = chooser.choice(TEST_PORTS)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def free_port() -> int:
    """One port free on 127.0.0.1 now (see :func:`free_ports`)."""
    return free_ports(1)[0]


def wait_until_ready(url: str, process: subprocess.Popen[str], timeout_s: float = 180.0) -> None:
    """Poll ``{url}/v2/health/ready`` until it answers 200; fail with the server's output if it exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not become ready within {timeout_s:.0f} s"
        time.sleep(0.1)  # a refused connection costs nothing: the test goes on as soon as the server is ready


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
