"""The Ray adapter: an :class:`InferenceWorker` per actor, pinned to what Ray assigned it.

Inside the actor (after Ray has set ``CUDA_VISIBLE_DEVICES``) it reads which GPUs it holds, refuses GPU
providers when it holds none (since Ray 2.60 such an actor sees every GPU of its node), addresses its GPU by
the *local* index 0, sizes ONNX Runtime's thread pool from its CPU share with spinning off, warms up and
reports what it realized. The worker class itself stays Ray-free; it is made remote only here.

A caller above this layer (the backtest) hands the actor a *job*: a Ray-free factory that builds, next to the
worker, the object that does one unit of work (``job.run(item)``), plus the job's input, sent once per actor
through the object store. The actor layer never learns what a backtest is.

A pool starts in two waits, each with its own deadline (:func:`start_pool`): *placement* (Ray found room for
the actor and its process runs: :meth:`WorkerActor.placed`, answered before anything is loaded) and
*readiness* (the checkpoints loaded and warm: :meth:`WorkerActor.ready`). Ray does not tell an actor waiting
for room from one still loading a large model; an actor whose constructor is light does, so a pool the cluster
has no room for fails within the placement deadline, naming what it asked and what was free
(:mod:`.pool_room`), rather than at the end of the long one a slow model needs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from distributed_onnx.errors import ConfigError, DistributedOnnxError, Suggestion, WorkerStartError
from distributed_onnx.model.backend.providers import CudaProvider, ExecutionProvider, TensorRTProvider
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig, WorkerInfo
from distributed_onnx.runtime.pool_request import PoolRequest
from distributed_onnx.runtime.pool_room import RAISE_READY_TIMEOUT, ActorShape, Asked, check_fits, room_words

logger = logging.getLogger(__name__)


class PinnedWorker:
    """The body of a worker actor (and of a Serve replica): builds and owns one pinned worker.

    Built where it runs, after Ray placed it: a process Ray gave no GPU gets no GPU provider, and ONNX Runtime
    one thread per CPU of its share (here, in the process that runs the example, on a running local Ray):

    >>> from distributed_onnx.model.worker import WorkerConfig
    >>> from distributed_onnx.resources import REFERENCE_CHECKPOINT
    >>> pinned = PinnedWorker(WorkerConfig(checkpoint=REFERENCE_CHECKPOINT, warm_up_rows=2), num_cpus=1)
    >>> info = pinned.ready()
    >>> info.providers, info.intra_op_num_threads, info.gpu_ids
    (['CPUExecutionProvider'], 1, [])
    >>> pinned.worker.close()
    """

    def __init__(self, config: WorkerConfig, num_cpus: float) -> None:
        gpu_ids = [str(gpu) for gpu in ray.get_gpu_ids()]
        threads = config.session_options.intra_op_num_threads or max(1, int(num_cpus))
        spinning = config.session_options.allow_spinning
        options = config.session_options.model_copy(
            update={
                "intra_op_num_threads": threads,
                "allow_spinning": False if spinning is None else spinning,
            }
        )
        providers = None if config.providers is None else local_device_chain(config.providers)
        pinned = config.model_copy(update={"session_options": options, "providers": providers})
        # ONNX Runtime loads here, in the actor that builds a session, not in the driver that imports this module.
        from distributed_onnx.model.backend.onnx import detect_host

        self.worker = InferenceWorker.from_config(pinned, detect_host(gpu_assigned=bool(gpu_ids)))
        warm_up_s = self.worker.warm_up(config.warm_up_rows) if config.warm_up_rows else None
        self._info = self.worker.info(
            intra_op_num_threads=threads,
            gpu_ids=gpu_ids,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            node_id=ray.get_runtime_context().get_node_id(),
            warm_up_s=warm_up_s,
        )

    def ready(self) -> WorkerInfo:
        """Returns once the session is built and warm; the dispatcher waits on it with a timeout."""
        return self._info


class Job(Protocol):
    """One unit of work at a time, next to the worker: ``run(item)`` returns a small receipt."""

    def run(self, item: Any) -> Any: ...


#: Builds an actor's job from its workers (one per model config, in order), the job's input (resolved from the
#: object store) and its placement.
JobFactory = Callable[[Sequence[InferenceWorker], Any, WorkerInfo], Job]


class WorkerActor:
    """The backtest's actor: a :class:`PinnedWorker` per checkpoint (plus an optional job), built by the first
    :meth:`ready` call, whose start-up errors surface from :meth:`ready`.

    The constructor only keeps what to build: Ray runs it as soon as the actor is placed, so :meth:`placed`
    answers then, and the pool can tell "no room in the cluster" from "loading a large model" (module
    docstring). An exception while building is kept and raised from ``ready()`` (and every later call), handing
    the driver the original, typed error (a corrupt checkpoint, a refused GPU chain) instead of the text inside
    an ``ActorDiedError``.

    Its methods, on an actor of a pool started before its job was known (:func:`start_pool`; a running local Ray),
    and a job that returns the shape of one forecast of ``item`` steps:

    >>> import numpy as np
    >>> import ray
    >>> from distributed_onnx.model.worker import WorkerConfig
    >>> from distributed_onnx.resources import REFERENCE_CHECKPOINT
    >>> from distributed_onnx.runtime.pool_request import PoolRequest
    >>> class ForecastShape:
    ...     def __init__(self, workers, job_input, info):
    ...         self.worker, self.levels = workers[0], job_input
    ...     def run(self, item):
    ...         window = np.ones((1, self.worker.metadata.context_length), np.float32)
    ...         return self.worker.forecast(window, item, self.levels).shape
    >>> config = WorkerConfig(checkpoint=REFERENCE_CHECKPOINT, warm_up_rows=2)
    >>> actors, infos = start_pool(PoolRequest(config, 1, 0.5, 0, placement_timeout_s=60, ready_timeout_s=120))
    >>> (actor,) = actors
    >>> ray.get(actor.placed.remote(), timeout=60) == infos[0].node_id  # where Ray placed it
    True
    >>> ray.get(actor.ready.remote(), timeout=60).providers
    ['CPUExecutionProvider']
    >>> ray.get(actor.take_job.remote(ForecastShape, [0.1, 0.5, 0.9]), timeout=60)
    >>> ray.get(actor.run.remote(24), timeout=60)
    (1, 24, 3)
    >>> ray.kill(actor)
    """

    def __init__(
        self,
        config: WorkerConfig | Sequence[WorkerConfig],
        num_cpus: float,
        job_factory: JobFactory | None = None,
        job_input: Any = None,
    ) -> None:
        self._configs = [config] if isinstance(config, WorkerConfig) else list(config)
        self._num_cpus = num_cpus
        self._job_factory = job_factory
        self._job_input = job_input
        self._pinned: PinnedWorker | None = None
        self._workers: list[InferenceWorker] = []  # one per checkpoint of the run
        self._job: Job | None = None
        self._error: DistributedOnnxError | None = None

    def placed(self) -> str:
        """Answers once Ray placed the actor and its process runs (nothing loaded yet): its node's id."""
        return str(ray.get_runtime_context().get_node_id())

    def ready(self) -> WorkerInfo:
        """What the worker realized, once it is warm; raises its start-up error, typed (example: the class's)."""
        return self._started().ready()

    def take_job(self, job_factory: JobFactory, job_input: Any) -> None:
        """Build the job of an actor started without one (a pool started while the driver was still planning;
        example: the class's)."""
        pinned = self._started()
        self._job = job_factory(self._workers, job_input, pinned.ready())

    def run(self, item: Any) -> Any:
        """One unit of the job (a backtest part); errors travel back typed (example: the class's)."""
        self._started()
        if self._job is None:
            raise DistributedOnnxError("this worker actor was started without a job")
        return self._job.run(item)

    def _started(self) -> PinnedWorker:
        if self._pinned is None and self._error is None:
            self._build()
        if self._pinned is None or self._error is not None:
            raise self._error or DistributedOnnxError("worker failed to start")
        return self._pinned

    def _build(self) -> None:
        try:
            # Several models in one actor (a backtest comparing checkpoints): one session each, run in turn on
            # the same packed batches, each with the actor's whole thread share (they never run at once).
            pinned = [PinnedWorker(each, self._num_cpus) for each in self._configs]
            self._workers = [each.worker for each in pinned]
            if self._job_factory is not None:
                self._job = self._job_factory(self._workers, self._job_input, pinned[0].ready())
            self._pinned = pinned[0]
        except DistributedOnnxError as exc:
            self._error = exc
        finally:
            self._job_input = None  # built from once: the actor holds no second copy of a large input


def local_device_chain(chain: Sequence[ExecutionProvider]) -> list[ExecutionProvider]:
    """GPU providers address device 0: after Ray sets CUDA_VISIBLE_DEVICES, the actor's GPU is local index 0.

    >>> from distributed_onnx.model.backend.providers import CpuProvider, CudaProvider
    >>> chain = local_device_chain([CudaProvider(device_id=3), CpuProvider()])
    >>> [getattr(provider, "device_id", None) for provider in chain]
    [0, None]
    """
    return [
        provider.model_copy(update={"device_id": 0})
        if isinstance(provider, CudaProvider | TensorRTProvider)
        else provider
        for provider in chain
    ]


def worker_actor_options(num_cpus: float, num_gpus: float, max_restarts: int = 0) -> dict[str, Any]:
    """``ray.remote`` options of a worker actor; ``num_gpus`` may be fractional (several actors per GPU).

    >>> worker_actor_options(num_cpus=2, num_gpus=0.5)
    {'num_cpus': 2, 'num_gpus': 0.5, 'max_restarts': 0, 'max_concurrency': 1}
    >>> worker_actor_options(num_cpus=0, num_gpus=0)
    Traceback (most recent call last):
    ...
    distributed_onnx.errors.ConfigError: cpus_per_actor must be > 0, got 0
    """
    if num_cpus <= 0:
        raise ConfigError(f"cpus_per_actor must be > 0, got {num_cpus}", key="cpus_per_actor")
    if num_gpus < 0:
        raise ConfigError(f"gpus_per_actor must be >= 0, got {num_gpus}", key="gpus_per_actor")
    return {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts, "max_concurrency": 1}


def start_worker_actor(
    config: WorkerConfig | Sequence[WorkerConfig],
    num_cpus: float,
    num_gpus: float,
    job_factory: JobFactory | None = None,
    job_input: Any = None,
) -> Any:
    """Start one worker actor (not yet ready: wait on ``handle.ready.remote()``).

    ``job_input`` may be an ObjectRef: Ray resolves it in the actor (numpy buffers map zero-copy). Example:
    :class:`WorkerActor`'s (through :func:`start_pool`, which starts each actor here).
    """
    actor_class = ray.remote(**worker_actor_options(num_cpus, num_gpus))(WorkerActor)
    return actor_class.remote(config, num_cpus, job_factory, job_input)


def start_pool(
    request: PoolRequest, *, job_factory: JobFactory | None = None, job_input: Any = None
) -> tuple[list[Any], list[WorkerInfo]]:
    """Start the pool ``request`` asks for (``count`` None: fill the cluster) and wait until each actor is placed,
    then warm.

    A pool the cluster can never hold is refused before anything starts (:func:`~.pool_room.check_fits`:
    a :class:`ConfigError`). Actors not placed within ``placement_timeout_s`` (other work holds the room) and
    actors placed but not warm within ``ready_timeout_s`` more are each a :class:`WorkerStartError` naming how
    many were, what each asked and what the cluster had free. A start-up error (a corrupt checkpoint, a refused
    GPU chain) is raised as the original, typed error. Whatever fails, every actor of the pool is stopped.

    A pool in use: :class:`WorkerActor`'s example. One whose checkpoint is missing (on a running local Ray):

    >>> from distributed_onnx.model.worker import WorkerConfig
    >>> from distributed_onnx.runtime.pool_request import PoolRequest
    >>> missing = WorkerConfig(checkpoint="no/such/model.onnx")
    >>> start_pool(PoolRequest(missing, 1, 0.5, 0, placement_timeout_s=60, ready_timeout_s=120))
    Traceback (most recent call last):
    ...
    distributed_onnx.errors.CheckpointNotFoundError: ...no/such/model.onnx...
    """
    config, num_cpus, num_gpus = request.config, request.num_cpus, request.num_gpus
    placement_timeout_s, ready_timeout_s = request.placement_timeout_s, request.ready_timeout_s
    count = request.count or default_actor_count(num_cpus, num_gpus)
    pool = Asked(count, ActorShape(num_cpus, num_gpus))
    check_fits(pool)
    actors = [start_worker_actor(config, num_cpus, num_gpus, job_factory, job_input) for _ in range(count)]
    asked = pool.words()
    try:
        placed, _ = ray.wait(
            [actor.placed.remote() for actor in actors], num_returns=count, timeout=placement_timeout_s
        )
        if len(placed) < count:
            room = room_words()  # read while the placed ones still hold theirs: what the others had to share
            raise WorkerStartError(
                f"{len(placed)} of {asked} were placed within {placement_timeout_s:g} s; the cluster has {room}: "
                "other work holds the rest. Rerun when the cluster is free.",
                ready=0,
                requested=count,
                suggestions=(pool.lower(), Suggestion("Or raise {}.", (("placement_timeout_s", None),))),
            )
        readiness = [actor.ready.remote() for actor in actors]
        try:
            infos = ray.get(readiness, timeout=ready_timeout_s)
        except GetTimeoutError:
            warm, _ = ray.wait(readiness, num_returns=count, timeout=0)
            raise WorkerStartError(
                f"{len(warm)} of {asked}, all placed, had loaded their checkpoints and warmed up after "
                f"{ready_timeout_s:g} s.",
                ready=len(warm),
                requested=count,
                suggestions=(RAISE_READY_TIMEOUT,),
            ) from None
    except BaseException as exc:
        for actor in actors:
            ray.kill(actor)
        error = _start_error(exc, count)
        if error is exc:
            raise
        raise error from (None if isinstance(exc, RayTaskError) else exc)
    for info in infos:
        logger.info(
            "Worker ready: providers=%s gpus=%s threads=%s", info.providers, info.gpu_ids, info.intra_op_num_threads
        )
    return actors, list(infos)


def _start_error(exc: BaseException, count: int) -> BaseException:
    """What a pool's failed start raises: our typed error, the actor's own, or Ray's made one line."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, DistributedOnnxError):
        return exc.cause
    # An actor died while starting (its process crashed, its node went away): not a bug of ours.
    if isinstance(exc, RayError) and not isinstance(exc, RayTaskError):
        detail = " ".join(str(exc).split())
        return WorkerStartError(
            f"A worker actor died while the pool of {count} started: {type(exc).__name__}: {detail:.300}... "
            "Check the node's memory and the checkpoint, then rerun.",
            ready=0,
            requested=count,
        )
    return exc


def has_room(num_cpus: float, num_gpus: float) -> bool:
    """Whether the cluster has the free CPUs/GPUs for one more actor right now (never blocks).

    >>> has_room(num_cpus=0, num_gpus=0), has_room(num_cpus=1_000_000, num_gpus=0)
    (True, False)
    """
    free: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
    return free.get("CPU", 0.0) >= num_cpus and free.get("GPU", 0.0) >= num_gpus


#: The most actors per cluster CPU a pool starts when no count is given: a tiny share (``--cpus-per-actor 0.0001``)
#: "fills" a 2-CPU machine with 20,000 actor processes, and Ray's GCS went down under them (the command then died
#: 60 s later with Ray's own "Failed to connect to GCS" line).
MAX_DEFAULT_ACTORS_PER_CPU = 4


def default_actor_count(num_cpus: float, num_gpus: float) -> int:
    """Fill the cluster: one actor per GPU share when actors take GPUs, else one per CPU share; more than
    :data:`MAX_DEFAULT_ACTORS_PER_CPU` per CPU is refused (a ConfigError asking for ``--actors``).

    >>> import ray
    >>> resources = ray.cluster_resources()
    >>> default_actor_count(num_cpus=0.5, num_gpus=0) == int(resources["CPU"] / 0.5)
    True
    >>> default_actor_count(num_cpus=1, num_gpus=0.5) == max(1, int(resources.get("GPU", 0) / 0.5))
    True
    """
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    if num_gpus > 0:
        count = max(1, int(resources.get("GPU", 0) / num_gpus))
    else:
        count = max(1, int(resources.get("CPU", 1) / num_cpus))
    cpus = resources.get("CPU", 1)
    if count > MAX_DEFAULT_ACTORS_PER_CPU * max(cpus, 1):
        share, key = (
            (f"{num_gpus:g} GPU", "gpus_per_actor") if num_gpus > 0 else (f"{num_cpus:g} CPU", "cpus_per_actor")
        )
        raise ConfigError(
            f"actors of {share} each would fill this cluster ({cpus:g} CPUs) with {count:,} actors, each a process "
            f"holding the models; at most {MAX_DEFAULT_ACTORS_PER_CPU} per CPU are started when no count is given.",
            key=key,
            suggestions=(Suggestion("Give {} or raise {}.", (("actors", None), (key, None))),),
        )
    return count
