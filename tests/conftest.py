"""Shared fixtures. Ray is started once per test session (it costs seconds), bound to 127.0.0.1."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every Ray the tests start (ray.init, Cluster nodes, `ray start` subprocesses) stays on 127.0.0.1: without
# this Ray 2.60 rewrites 127.0.0.1 to the machine's network address (see distributed_onnx/runtime/local_ray.py).
# Set before any test module imports Ray, and inherited by every process the tests start.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

sys.path.insert(0, str(Path(__file__).parent))

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
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            **RAY_TEST_RESOURCES,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
