"""The few cluster operations the backtest's driver needs, so that the evaluation layer never imports Ray.

The driver puts one object (the run's job) into the object store, asks how large the nodes' object stores
are (to choose how the series travel), runs the report's drawing on its own node while Ray is up, and
kills its actors at the end. Each is a thin call here; the policy around it stays in the evaluation layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

T = TypeVar("T")


def is_connected() -> bool:
    """Whether this process is connected to a Ray (embedded or a cluster's)."""
    return bool(ray.is_initialized())


def put(value: Any) -> Any:
    """Put ``value`` into the object store once; the reference travels, the value is mapped per node."""
    return ray.put(value)


def smallest_object_store_bytes() -> int | None:
    """The object store capacity of the smallest live node (None when Ray does not report one)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    capacities = [node["Resources"].get("object_store_memory") for node in nodes]
    return min((int(c) for c in capacities if c), default=None)


def run_on_this_node(function: Callable[..., T], *arguments: Any) -> T:
    """Run ``function(*arguments)`` in a Ray worker on the driver's node (no CPU reserved) and wait for it.

    Work that needs heavy imports the driver would otherwise pay for (matplotlib for the report) runs where
    Ray's workers live; one retry covers a worker lost meanwhile.
    """
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    task = ray.remote(num_cpus=0, max_retries=1)(function).options(scheduling_strategy=here)
    return ray.get(task.remote(*arguments))


def kill(actors: Iterable[Any]) -> None:
    """Kill every actor (the pool and its replacements): nothing of a run outlives it."""
    for actor in actors:
        ray.kill(actor)


def shutdown() -> None:
    """Disconnect from Ray (and stop it, when this process started the embedded one)."""
    ray.shutdown()
