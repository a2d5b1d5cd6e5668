"""Whether a pool of worker actors fits the cluster, and the words for what a pool asked and what the cluster had.

A pool asks Ray for ``count`` actors of one shape (CPUs and GPUs each). Ray places an actor once a node has its
resources free and otherwise waits, silently and without end: a pool larger than the cluster, or one started
while other work (another pool) held the cluster, waited for actors that could never come, with no error. So a
pool is checked against the whole cluster before anything starts (:func:`check_fits`: what can never fit is the
user's settings, exit 2), and its wait for placement has a deadline whose error names what the pool asked and
what the cluster had free (:func:`room_words`, in ``actors.start_pool``: exit 3, the cluster was busy).

The arithmetic is pure (:func:`actors_fitting`, :func:`resources_words`); only the two functions that read the
cluster call Ray, and import it: ``early_start`` imports this module for its words before its thread imports Ray,
and a rerun with nothing to compute imports no Ray at all.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distributed_onnx.errors import ConfigError, Suggestion

#: Ray keeps resource amounts in fixed point (1e-4): three actors of 1/3 GPU fit a GPU, as Ray places them.
_RESOLUTION = 1e-4


@dataclass(frozen=True)
class ActorShape:
    """What one actor asks Ray for: ``num_cpus`` CPUs and ``num_gpus`` GPUs (either may be fractional).

    >>> shape = ActorShape(1.0, 0.5)
    >>> shape.words()
    '1 CPU, 0.5 GPU'
    >>> shape.fitting({"CPU": 4.0, "GPU": 1.0})  # two halves of the one GPU
    2
    """

    num_cpus: float
    num_gpus: float

    def words(self) -> str:
        return f"{self.num_cpus:g} CPU, {self.num_gpus:g} GPU"

    def fitting(self, resources: Mapping[str, float]) -> int:
        """How many such actors a node with ``resources`` holds."""
        counts = [
            math.floor(resources.get(name, 0.0) / need + _RESOLUTION)
            for name, need in (("CPU", self.num_cpus), ("GPU", self.num_gpus))
            if need > 0
        ]
        return max(0, min(counts)) if counts else sys.maxsize  # asks for nothing Ray counts


def actors_fitting(nodes: Sequence[Mapping[str, float]], shape: ActorShape) -> int:
    """How many actors of ``shape`` the nodes (each one's total resources) hold together: each actor on one node.

    >>> actors_fitting([{"CPU": 2.0, "GPU": 2.0}], ActorShape(1.0, 0.0))
    2
    >>> actors_fitting([{"CPU": 3.0}, {"CPU": 3.0}], ActorShape(2.0, 0.0))  # one per node, not three
    2
    """
    return sum(shape.fitting(node) for node in nodes)


def resources_words(resources: Mapping[str, float]) -> str:
    """CPUs, GPUs and memory of a resource map (Ray's: memory in bytes), as a user reads them.

    >>> resources_words({"CPU": 2.0, "GPU": 0.0, "memory": 3 * 2**30, "node:127.0.0.1": 1.0})
    '2 CPU, 0 GPU, 3.0 GiB memory'
    """
    memory = resources.get("memory", 0.0) / 2**30
    return f"{resources.get('CPU', 0.0):g} CPU, {resources.get('GPU', 0.0):g} GPU, {memory:.1f} GiB memory"


def _alive_nodes() -> list[Mapping[str, float]]:
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [node["Resources"] for node in nodes if node.get("Alive")]


#: What to do when started actors did not load, warm up or build their job in time.
RAISE_READY_TIMEOUT = Suggestion("Raise {} for a large model or input, or slow storage.", (("ready_timeout_s", None),))


@dataclass(frozen=True)
class Asked:
    """What a pool asks Ray for, ``count`` actors of ``shape``, in the words and settings of the command asking:
    the backtest's worker actors (the default) or ``serve``'s replicas."""

    count: int
    shape: ActorShape
    noun: str = "worker actors"
    count_key: str = "actors"
    cpus_key: str = "cpus_per_actor"
    gpus_key: str = "gpus_per_actor"

    def words(self) -> str:
        """``2 worker actors (1 CPU, 0 GPU each)``."""
        return f"{self.count} {self.noun} ({self.shape.words()} each)"

    def lower(self, text: str = "Or lower {}.", keys: tuple[str, ...] = (), separator: str = ", ") -> Suggestion:
        """Lowering the settings that size the pool (``keys``, by default all three), in ``text``'s one ``{}``:
        shown with the flags the running command has (``fev`` has no ``--gpus-per-actor``), in Python as
        keywords."""
        chosen = keys or (self.count_key, self.cpus_key, self.gpus_key)
        return Suggestion(text, tuple((key, None) for key in chosen), partial=True, separator=separator)


def check_fits(asked: Asked) -> None:
    """Refuse a pool the cluster can never hold, whatever else runs on it (a :class:`ConfigError`, exit 2).

    The nodes are the cluster's now: on an autoscaling cluster, nodes it would add are not counted (start them
    first, or leave the count to its default where there is one, which fills the nodes there are). On a running
    local Ray:

    >>> check_fits(Asked(1, ActorShape(1, 0)))  # one actor of 1 CPU: the cluster holds it, nothing to say
    >>> check_fits(Asked(1, ActorShape(1, 1_000)))
    Traceback (most recent call last):
    ...
    distributed_onnx.errors.ConfigError: No node can host one of the worker actors (1 CPU, 1000 GPU each); ...
    """
    nodes = _alive_nodes()
    most = actors_fitting(nodes, asked.shape)
    if asked.count <= most:
        return
    each = "; ".join(resources_words(node) for node in nodes) or "none alive"
    if most == 0:
        raise ConfigError(
            f"No node can host one of the {asked.noun} ({asked.shape.words()} each); the nodes have {each}.",
            key=asked.gpus_key if asked.shape.num_gpus else asked.cpus_key,
            suggestions=(asked.lower("Lower {} or add nodes.", (asked.cpus_key, asked.gpus_key), "/"),),
        )
    raise ConfigError(
        f"{asked.words()} can never be placed: the cluster's nodes ({each}) hold at most {most}.",
        key=asked.count_key,
        suggestions=(asked.lower("Lower {}, or add nodes."),),
    )


def room_words() -> str:
    """What the cluster has free now, and of what total (for an error that says why actors were not placed)."""
    import ray

    free: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
    total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return f"{resources_words(free)} free of {resources_words(total)}"
