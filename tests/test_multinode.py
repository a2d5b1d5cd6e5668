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

import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from distributed_onnx.evaluation.backtest import run_backtest  # noqa: E402
from distributed_onnx.evaluation.driver import run as run_module  # noqa: E402
from distributed_onnx.evaluation.settings import BacktestSettings  # noqa: E402
from distributed_onnx.model.checkpoint import ResolvedCheckpoint  # noqa: E402
from distributed_onnx.model.worker import WorkerInfo  # noqa: E402
from distributed_onnx.runtime import ray_private  # noqa: E402

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
GPUS_PER_NODE = 2


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[tuple[Any, list[Any]]]:
    """A CPU-only head and two worker nodes with 2 fake GPUs each; the driver is connected to the head.

    One for the module (starting it costs seconds): the test that removes a node runs last."""
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as monkeypatch:
        for private in (ray_private.WRITE_RAY_ADDRESS, ray_private.RESET_RAY_ADDRESS):
            monkeypatch.setattr(private.owner(), private.attribute, lambda *args, **kwargs: None)
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


@pytest.mark.timeout(300)
def test_parts_are_written_where_computed_and_losing_a_node_loses_nothing(
    gpu_cluster: tuple[Any, list[Any]],
    tiny_checkpoint: ResolvedCheckpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three nodes (a CPU head, two with 2 fake GPUs); one GPU node is removed after its first finished part."""
    from test_cluster_job import write_series

    cluster, workers = gpu_cluster
    node_by_id = {node.node_id: node for node in workers}
    removed: list[str] = []
    real_on_result = run_module._BacktestRun._on_result

    def on_result_then_remove_a_node(self: Any, part: Any, receipt: Any) -> None:
        real_on_result(self, part, receipt)
        if not removed and receipt.node_id in node_by_id:
            removed.append(receipt.node_id)
            cluster.remove_node(node_by_id.pop(receipt.node_id))

    monkeypatch.setattr(run_module._BacktestRun, "_on_result", on_result_then_remove_a_node)
    settings = BacktestSettings(
        checkpoint=tiny_checkpoint.weights_path,
        data=write_series(tmp_path / "series.parquet", n_series=4),
        output=tmp_path / "run",
        n_windows=12,
        stride=3,
        rows_per_batch=1,
        windows_per_part=1,
        actors=3,  # one GPU stays free, so a replacement can start on the surviving node
        cpus_per_actor=0.25,
        gpus_per_actor=1,
        progress=False,
    )

    result = run_backtest(settings)

    summary = result.summary
    assert removed, "the node was never removed"
    assert summary["parts"]["actors_lost"] >= 1
    assert summary["windows"]["run_now"] == 48 and summary["windows"]["failed"] == 0
    window_ids: Counter[str] = Counter()
    writers: Counter[str] = Counter()
    head_id = ray.get_runtime_context().get_node_id()
    for path in sorted((tmp_path / "run" / "forecasts").glob("model=*/part-*.parquet")):
        part = pq.read_table(path)
        window_ids.update(set(part["window_id"].to_pylist()))
        record = json.loads(part.schema.metadata[b"distributed_onnx.part"])
        writers[record["node_id"]] += 1
    assert len(window_ids) == 48 and set(window_ids.values()) == {1}  # every window exactly once
    # Each part names the node whose actor computed and wrote it: GPU nodes only, never the driver's head.
    assert head_id not in writers
    assert set(writers) <= {*node_by_id, *removed}
    assert len(writers) == 2
    assert dict(writers) == summary["transport"]["parts_by_node"]  # the receipts say the same
    # What crosses per unit of work, measured and reported.
    assert summary["transport"]["descriptor_bytes"] < 300
    assert summary["transport"]["receipt_bytes"] < 1000
    assert summary["transport"]["series_transport"] == "object_store"
