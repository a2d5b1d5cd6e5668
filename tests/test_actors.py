"""Worker actors and the dispatcher on a real local Ray (2 CPUs, 2 fake GPUs) with real ORT sessions.

Integration tier: the actors load the tiny Chronos-2 graph of tests/graphs.py. The fake GPUs exist only as Ray
resources, so GPU pinning is observed through what Ray assigns (``gpu_ids``, ``CUDA_VISIBLE_DEVICES``) while
ONNX Runtime (the CPU build) realizes the CPU provider. Every actor a test starts is killed by the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from ray_actors import kill_and_wait  # noqa: E402

from distributed_onnx.errors import ProviderNotAllowedError, WorkerStartError  # noqa: E402
from distributed_onnx.model.backend.providers import CpuProvider, CudaProvider, SessionOptionsConfig  # noqa: E402
from distributed_onnx.model.checkpoint import ResolvedCheckpoint  # noqa: E402
from distributed_onnx.model.worker import WorkerConfig, WorkerInfo  # noqa: E402
from distributed_onnx.runtime.actors import start_pool, start_worker_actor  # noqa: E402
from distributed_onnx.runtime.pool_request import PoolRequest  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]


class ActorRegistry:
    """Starts worker actors for one test and kills every one of them at its end."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.started: list[Any] = []

    def start(self, num_cpus: float = 0.5, num_gpus: float = 0.0, **config: Any) -> Any:
        actor = start_worker_actor(WorkerConfig(checkpoint=self.checkpoint, **config), num_cpus, num_gpus)
        self.started.append(actor)
        return actor

    def ready(self, actor: Any) -> WorkerInfo:
        info: WorkerInfo = ray.get(actor.ready.remote(), timeout=120)
        return info

    def kill_all(self) -> None:
        for actor in self.started:
            ray.kill(actor, no_restart=True)


@pytest.fixture
def actors(tiny_checkpoint: ResolvedCheckpoint) -> Iterator[ActorRegistry]:
    registry = ActorRegistry(tiny_checkpoint.weights_path)
    yield registry
    registry.kill_all()


# --- pinning -----------------------------------------------------------------------------------------------


def test_one_gpu_each_gives_distinct_gpus_and_visible_devices(actors: ActorRegistry) -> None:
    infos = [actors.ready(actors.start(num_cpus=0.5, num_gpus=1)) for _ in range(2)]
    assert [len(info.gpu_ids) for info in infos] == [1, 1]
    assert {info.gpu_ids[0] for info in infos} == {"0", "1"}
    for info in infos:
        assert info.cuda_visible_devices == info.gpu_ids[0]
        # The CPU build of ORT cannot realize CUDA: the policy chain falls back gracefully to CPU.
        assert info.providers == ["CPUExecutionProvider"]
        assert info.intra_op_num_threads == 1  # max(1, int(0.5 CPU))
    assert len({info.pid for info in infos}) == 2


def test_half_a_gpu_each_may_share_one(actors: ActorRegistry) -> None:
    infos = [actors.ready(actors.start(num_cpus=0.5, num_gpus=0.5)) for _ in range(2)]
    for info in infos:
        assert len(info.gpu_ids) == 1
        assert info.gpu_ids[0] in {"0", "1"}
        assert info.cuda_visible_devices == info.gpu_ids[0]


def test_explicit_cuda_chain_without_a_gpu_is_refused_at_construction(actors: ActorRegistry) -> None:
    actor = actors.start(num_cpus=0.5, num_gpus=0, providers=[CudaProvider(), CpuProvider()])
    # The actor keeps its start-up error and raises it, typed, from ready().
    with pytest.raises(ProviderNotAllowedError, match="need a GPU, but none was assigned"):
        ray.get(actor.ready.remote(), timeout=120)


def test_cpu_only_actor_realizes_cpu_and_sizes_threads_from_its_cpus(actors: ActorRegistry) -> None:
    one = actors.ready(actors.start(num_cpus=1))
    assert one.providers == ["CPUExecutionProvider"]
    assert one.gpu_ids == []
    assert one.intra_op_num_threads == 1
    assert one.warm_up_s is not None
    ray.kill(actors.started.pop(), no_restart=True)  # free its CPU for the next actor
    two = actors.ready(actors.start(num_cpus=2))
    assert two.intra_op_num_threads == 2


def test_explicit_thread_count_wins_over_the_cpu_share(actors: ActorRegistry) -> None:
    info = actors.ready(actors.start(num_cpus=0.5, session_options=SessionOptionsConfig(intra_op_num_threads=3)))
    assert info.intra_op_num_threads == 3


# --- pool start-up ------------------------------------------------------------------------------------------


def _pool(config: WorkerConfig, count: int) -> PoolRequest:
    """``count`` 1-CPU actors of ``config``, with deadlines no start here comes near."""
    return PoolRequest(config, count, 1, 0, placement_timeout_s=120, ready_timeout_s=120)


def test_a_pool_larger_than_the_cluster_is_refused_at_once_and_one_without_room_within_its_deadline(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command, on the tests' 2-CPU Ray: three 1-CPU actors can never be placed, refused before any
    starts (exit 2). Two, while another actor holds a CPU, cannot be placed now: the run fails within its
    placement deadline (exit 3), naming what it asked and what the cluster had free, where it waited 600 s (and
    a pool kept by another set of fev runs, without end)."""
    import re
    import time

    from backtest_data import write_dataset

    from distributed_onnx import cli

    data = write_dataset(tmp_path / "load.parquet")
    command = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), "--no-progress"]
    assert cli.main([*command, "--output", str(tmp_path / "three"), "--actors", "3"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: 3 worker actors \(1 CPU, 0 GPU each\) can never be placed: the cluster's nodes \(2 CPU, 2 GPU, "
        r"[\d.]+ GiB memory\) hold at most 2\. Lower --actors, --cpus-per-actor, --gpus-per-actor, or add nodes\.",
        line,
    ), line
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _Holder is defined here
    holder = ray.remote(num_cpus=1)(_Holder).remote()
    ray.get(holder.ping.remote(), timeout=60)
    started = time.monotonic()
    try:
        code = cli.main([*command, "--output", str(tmp_path / "two"), "--actors", "2", "--placement-timeout-s", "3"])
    finally:
        kill_and_wait(holder)
    assert code == 3
    assert time.monotonic() - started < 60  # the plan, three seconds of waiting, the pool stopped
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        "error: 1 of 2 worker actors (1 CPU, 0 GPU each) were placed within 3 s; the cluster has 0 CPU, 2 GPU, "
    ), line
    assert re.search(r"free of 2 CPU, 2 GPU, [\d.]+ GiB memory: other work holds the rest\.", line), line
    # Every actor of the failed pool was stopped: the CPUs are free again.
    config = WorkerConfig(checkpoint=tiny_checkpoint.weights_path)
    actors, infos = start_pool(_pool(config, 2))
    assert len(infos) == 2
    for actor in actors:
        kill_and_wait(actor)


class _Holder:
    """An actor that holds its CPU and answers pings (``kill_and_wait`` calls ``ready``)."""

    def ping(self) -> None:
        return None

    def ready(self) -> None:
        return None


def _die_while_starting(worker: Any, job_input: Any, info: WorkerInfo) -> Any:
    """A job factory whose actor process dies in ``__init__`` (as a crash or the OOM killer would end it)."""
    os._exit(1)


def test_an_actor_that_dies_while_the_pool_starts_is_one_typed_error(tiny_checkpoint: ResolvedCheckpoint) -> None:
    """Before, the ActorDiedError reached the command as a traceback."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the factory runs in the actor
    config = WorkerConfig(checkpoint=tiny_checkpoint.weights_path)
    expected = r"A worker actor died while the pool of 1 started: ActorDiedError: The actor died"
    with pytest.raises(WorkerStartError, match=expected):
        start_pool(_pool(config, 1), job_factory=_die_while_starting)


def test_a_default_pool_of_a_tiny_share_is_refused_naming_it_not_started() -> None:
    """Attack E: ``--cpus-per-actor 0.0001`` without ``--actors`` filled the 2-CPU test Ray with 20,000 actor
    processes; Ray's GCS went down and the command died 60 s later with Ray's own line. Refused now, before any
    actor starts; a share that gives a few actors per CPU is still filled as before."""
    import ray

    from distributed_onnx.errors import ConfigError
    from distributed_onnx.runtime.actors import MAX_DEFAULT_ACTORS_PER_CPU, default_actor_count

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(ConfigError, match=r"actors of 0\.0001 CPU each would fill this cluster .* 20,000 actors"):
        default_actor_count(num_cpus=0.0001, num_gpus=0)
    assert default_actor_count(num_cpus=1 / MAX_DEFAULT_ACTORS_PER_CPU, num_gpus=0) == int(cpus) * 4
