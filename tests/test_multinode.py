"""A multi-node ``ray.cluster_utils.Cluster`` on 127.0.0.1 whose worker nodes advertise fake GPUs.

Actors must spread over the nodes, each pinned to a distinct (node, GPU); losing a node mid-run must still
complete every batch exactly once (its batches re-run on a replacement actor). The tiny graph keeps it fast.

The shared ``ray_session`` Ray is shut down first (one driver connection per process); the Cluster writes no
``/tmp/ray/ray_current_cluster`` (patched out), so no other Ray on the machine can connect to it by accident,
and the driver connects to it on 127.0.0.1 (Ray would rewrite that to the machine's address: patched out).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from distributed_onnx.actors import start_worker_actor  # noqa: E402
from distributed_onnx.backtest.run import run_backtest  # noqa: E402
from distributed_onnx.backtest.settings import BacktestSettings  # noqa: E402
from distributed_onnx.checkpoint import ResolvedCheckpoint  # noqa: E402
from distributed_onnx.dispatch import dispatch  # noqa: E402
from distributed_onnx.worker import WorkerConfig, WorkerInfo  # noqa: E402

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
GPUS_PER_NODE = 2


@pytest.fixture
def gpu_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any]]]:
    """A CPU-only head and two worker nodes with 2 fake GPUs each; the driver is connected to the head."""
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray._common.utils, "reset_ray_address", lambda *args, **kwargs: None)
    # Loopback stays loopback because conftest.py turned Ray's multi-node switch off (local_ray.py says why).
    common = {"node_ip_address": LOOPBACK, "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**common, "num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
    )
    try:
        workers = [cluster.add_node(**common, num_cpus=1, num_gpus=GPUS_PER_NODE) for _ in range(2)]
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False, configure_logging=False)
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


def _pins(infos: list[WorkerInfo]) -> list[tuple[str | None, tuple[str, ...]]]:
    return [(info.node_id, tuple(info.gpu_ids)) for info in infos]


@pytest.mark.timeout(240)
def test_actors_pin_distinct_gpus_and_survive_losing_a_node(
    gpu_cluster: tuple[Any, list[Any]], tiny_checkpoint: ResolvedCheckpoint
) -> None:
    cluster, workers = gpu_cluster
    config = WorkerConfig(checkpoint=tiny_checkpoint.weights_path)

    def start() -> tuple[Any, WorkerInfo]:
        actor = start_worker_actor(config, 0.25, 1)
        return actor, ray.get(actor.ready.remote(), timeout=120)

    started = [start() for _ in range(2 * GPUS_PER_NODE - 1)]  # leave one GPU free for the replacement
    actors = [actor for actor, _ in started]
    infos = [info for _, info in started]
    pins = _pins(infos)
    assert len(set(pins)) == len(pins), pins
    assert all(len(gpus) == 1 for _, gpus in pins)
    assert len({node for node, _ in pins}) == 2, "actors did not spread over both GPU nodes"

    node_by_id = {node.node_id: node for node in workers}
    victim_id = infos[0].node_id
    assert victim_id in node_by_id
    completed: Counter[int] = Counter()
    failed: list[int] = []
    replacements: list[WorkerInfo] = []

    def submit(actor: Any, item: int) -> Any:
        return actor.ready.remote()  # stands in for a batch: answers where the actor runs

    def on_result(item: int, info: WorkerInfo) -> None:
        completed[item] += 1
        if info.node_id == victim_id and victim_id in node_by_id:
            cluster.remove_node(node_by_id.pop(victim_id))

    def replace() -> Any | None:
        if ray.available_resources().get("GPU", 0) < 1:
            return None  # no free GPU left: the pool shrinks (as run.py's replacement does on failure)
        actor, info = start()
        replacements.append(info)
        return actor

    stats = dispatch(
        iter(range(60)),
        actors,
        submit,
        on_result,
        lambda item, error: failed.append(item),
        key=lambda item: item,
        max_in_flight_per_actor=2,
        replace_actor=replace,
    )

    assert victim_id not in node_by_id, "the node was never removed"
    assert not failed
    assert sorted(completed) == list(range(60)) and set(completed.values()) == {1}
    assert stats.actors_lost >= 1 and replacements
    assert all(info.node_id != victim_id for info in replacements)
    live = [info for info in infos if info.node_id != victim_id] + replacements
    assert len(set(_pins(live))) == len(live)


@pytest.mark.timeout(240)
def test_backtest_over_the_cluster_uses_one_gpu_per_actor(
    gpu_cluster: tuple[Any, list[Any]], tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    from test_cluster_job import write_series

    settings = BacktestSettings(
        checkpoint=tiny_checkpoint.weights_path,
        data=write_series(tmp_path / "series.parquet"),
        output=tmp_path / "run",
        n_windows=12,
        stride=3,
        rows_per_batch=4,
        cpus_per_actor=0.25,
        gpus_per_actor=1,
        progress=False,
    )
    result = run_backtest(settings)

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    actors = summary["actors"]
    assert len(actors) == 2 * GPUS_PER_NODE  # sized from the cluster's GPUs
    pins = [(actor["node_id"], tuple(actor["gpu_ids"])) for actor in actors]
    assert len(set(pins)) == len(pins)
    assert len({node for node, _ in pins}) == 2
    assert result.summary["windows"]["run_now"] == 36
    assert ray.is_initialized(), "run_backtest must not shut down a Ray it joined"
