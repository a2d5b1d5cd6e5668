"""Worker actors and the dispatcher on a real local Ray (2 CPUs, 2 fake GPUs) with real ORT sessions.

Integration tier: the actors load the tiny Chronos-2 graph of tests/graphs.py. The fake GPUs exist only as Ray
resources, so GPU pinning is observed through what Ray assigns (``gpu_ids``, ``CUDA_VISIBLE_DEVICES``) while
ONNX Runtime (the CPU build) realizes the CPU provider. Every actor a test starts is killed by the test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import settings_for, write_dataset  # noqa: E402
from ray.exceptions import RayActorError  # noqa: E402

from distributed_onnx.actors import start_worker_actor  # noqa: E402
from distributed_onnx.backend.providers import CpuProvider, CudaProvider, SessionOptionsConfig  # noqa: E402
from distributed_onnx.backtest.run import RunPlan, prepare  # noqa: E402
from distributed_onnx.checkpoint import ResolvedCheckpoint  # noqa: E402
from distributed_onnx.dispatch import dispatch  # noqa: E402
from distributed_onnx.errors import BatchError, ProviderNotAllowedError  # noqa: E402
from distributed_onnx.windows import PlannedBatch  # noqa: E402
from distributed_onnx.worker import InferenceWorker, WorkerConfig, WorkerInfo  # noqa: E402

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


def kill_and_wait(actor: Any) -> None:
    """Kill ``actor`` and return once a call to it fails, so the death is certain, not a matter of timing."""
    ray.kill(actor, no_restart=True)
    for _ in range(1000):
        try:
            ray.get(actor.ready.remote(), timeout=60)
        except RayActorError:
            return
    pytest.fail("the killed actor kept answering")


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


# --- dispatch with a lost actor ----------------------------------------------------------------------------


@pytest.fixture
def plan(tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint) -> RunPlan:
    data = write_dataset(tmp_path / "load.parquet")
    return prepare(settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", rows_per_batch=1))


def expected_forecasts(plan: RunPlan) -> dict[int, np.ndarray]:
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=plan.checkpoint.weights_path))
    spec = plan.spec
    return {
        planned.index: worker.forecast_batch(plan.pack(planned), spec.context_length, spec.horizon, plan.quantiles)
        for planned in plan.batches()
    }


class KillAfterFirstResult:
    """Dispatch callbacks that kill the pool's first actor once the first result is in, and record everything."""

    def __init__(self, plan: RunPlan, victims: list[Any]) -> None:
        self.plan = plan
        self.victims = victims
        self.results: Counter[int] = Counter()
        self.values: dict[int, np.ndarray] = {}
        self.failures: list[tuple[int, BaseException]] = []

    def submit(self, actor: Any, planned: PlannedBatch) -> Any:
        spec = self.plan.spec
        return actor.forecast_batch.remote(
            self.plan.pack(planned), spec.context_length, spec.horizon, self.plan.quantiles
        )

    def on_result(self, planned: PlannedBatch, value: np.ndarray) -> None:
        self.results[planned.index] += 1
        self.values[planned.index] = value
        if sum(self.results.values()) == 1:
            for victim in self.victims:
                kill_and_wait(victim)

    def on_failure(self, planned: PlannedBatch, error: BaseException) -> None:
        self.failures.append((planned.index, error))


def run_dispatch(plan: RunPlan, pool: list[Any], callbacks: KillAfterFirstResult, replace: Any) -> Any:
    return dispatch(
        plan.batches(),
        pool,
        callbacks.submit,
        callbacks.on_result,
        callbacks.on_failure,
        key=lambda planned: planned.index,
        max_in_flight_per_actor=2,
        replace_actor=replace,
        poll_timeout_s=0.5,
    )


def test_killed_actor_is_replaced_and_no_batch_is_lost_or_doubled(actors: ActorRegistry, plan: RunPlan) -> None:
    pool = [actors.start(), actors.start()]
    callbacks = KillAfterFirstResult(plan, victims=[pool[0]])
    replacements: list[Any] = []

    def replace() -> Any:
        replacements.append(actors.start())
        return replacements[-1]

    stats = run_dispatch(plan, pool, callbacks, replace)

    expected = expected_forecasts(plan)
    assert len(expected) == 12  # 12 windows, one per batch: enough left to run after the kill
    assert callbacks.failures == []
    assert dict(callbacks.results) == dict.fromkeys(expected, 1)
    for index, value in expected.items():
        np.testing.assert_allclose(callbacks.values[index], value, rtol=1e-6)
    assert stats.actors_lost == 1
    assert stats.retried >= 1
    assert len(replacements) == 1
    assert stats.completed == len(expected)
    assert stats.submitted == len(expected) + stats.retried
    assert stats.failed == 0


def test_killed_actor_without_replacement_shrinks_the_pool(actors: ActorRegistry, plan: RunPlan) -> None:
    pool = [actors.start(), actors.start()]
    callbacks = KillAfterFirstResult(plan, victims=[pool[0]])

    stats = run_dispatch(plan, pool, callbacks, replace=lambda: None)

    assert callbacks.failures == []
    assert dict(callbacks.results) == {planned.index: 1 for planned in plan.batches()}
    assert stats.actors_lost == 1
    assert stats.retried >= 1
    assert stats.completed == 12


def test_every_actor_lost_without_replacement_raises(actors: ActorRegistry, plan: RunPlan) -> None:
    pool = [actors.start(), actors.start()]
    callbacks = KillAfterFirstResult(plan, victims=pool)

    with pytest.raises(BatchError, match="Every worker actor died"):
        run_dispatch(plan, pool, callbacks, replace=lambda: None)

    assert sum(callbacks.results.values()) >= 1
    assert max(callbacks.results.values()) == 1  # nothing delivered twice, even on the way down
