"""The actor pool a run asks for, as plain values: read by the thread that starts it (:mod:`.early_start`) and by
:func:`~.actors.start_pool`, which starts it. Ray-free, so importing it starts nothing."""

from __future__ import annotations

from dataclasses import dataclass

from distributed_onnx.model.worker import WorkerConfig

__all__ = ["PoolRequest"]


@dataclass(frozen=True)
class PoolRequest:
    """The actor pool to start: ``count`` actors (None: fill the cluster) of one shape, no job yet, and how long
    its start may take: ``placement_timeout_s`` for room in the cluster, ``ready_timeout_s`` more for loading
    the checkpoints (and, later, each actor's job: :meth:`~.early_start.EarlyStart.hand_job`).

    ``config`` holds one worker config per checkpoint of the run: each actor loads every model.
    """

    config: WorkerConfig | list[WorkerConfig]
    count: int | None
    num_cpus: float
    num_gpus: float
    placement_timeout_s: float
    ready_timeout_s: float
