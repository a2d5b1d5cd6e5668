"""Shared fixtures. Ray is started once per test session (it costs seconds), bound to 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from graphs import write_tiny_chronos2

from distributed_onnx.checkpoint import ResolvedCheckpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    return write_tiny_chronos2(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session: 2 CPUs, 2 fake GPUs (for pinning tests), loopback only."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield
        return
    ray.init(
        num_cpus=2,
        num_gpus=2,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
