"""The few cluster operations the backtest's driver needs, so that the evaluation layer never imports Ray.

The driver puts one object (the run's job) into the object store, asks how large the nodes' object stores
are (to choose how the series travel), asks whether this process already holds a Ray, and kills its actors
at the end. Each is a thin call here; the policy around it stays in the evaluation layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ray


def put(value: Any) -> Any:
    """Put ``value`` into the object store once; the reference travels, the value is mapped per node."""
    return ray.put(value)


def smallest_object_store_bytes() -> int | None:
    """The object store capacity of the smallest live node (None when Ray does not report one)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    capacities = [node["Resources"].get("object_store_memory") for node in nodes]
    return min((int(c) for c in capacities if c), default=None)


def kill(actors: Iterable[Any]) -> None:
    """Kill every actor (the pool and its replacements): nothing of a run outlives it."""
    for actor in actors:
        ray.kill(actor)
