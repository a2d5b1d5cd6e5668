"""The parts of a run handed to its warm pool, through Ray: the job put once, then three integers per part.

The one module of the driver that reaches Ray (through ``runtime/``), imported by :mod:`.run` only when a run has
parts to compute: a rerun of a finished run directory merges and reports without importing Ray at all, and a
fresh run's driver plans while the thread that starts Ray imports it (``runtime/early_start.py``).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distributed_onnx.evaluation.actor.part import build_part_runner
from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.driver._outcome import Dispatched
from distributed_onnx.evaluation.driver._part_ledger import PartLedger
from distributed_onnx.evaluation.driver._progress import Progress
from distributed_onnx.evaluation.driver._transport import series_source_for
from distributed_onnx.evaluation.driver.clock import PhaseClock
from distributed_onnx.evaluation.driver.early import worker_configs
from distributed_onnx.evaluation.part_messages import PartReceipt
from distributed_onnx.evaluation.planning import RunPlan, dispatch_order
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.worker import WorkerConfig
from distributed_onnx.runtime import cluster
from distributed_onnx.runtime.actors import has_room, start_worker_actor
from distributed_onnx.runtime.dispatch import DispatchCallbacks, DispatchConfig, Dispatcher
from distributed_onnx.runtime.early_start import EarlyStart


@dataclass(frozen=True)
class PartCallbacks:
    """The run's side of the dispatch: a part's receipt and a part's failure, and the moment the pool has the
    job (the parts about to go out)."""

    on_result: Callable[[PartSpec, PartReceipt], None]
    on_failure: Callable[[PartSpec, BaseException], None]
    on_job_handed: Callable[[], None]


def pickled_bytes(value: Any) -> int:
    """The bytes ``value`` pickles to, its array buffers counted out of band rather than copied: the job of an
    object-store run holds the whole input, which an in-band count would copy once more."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(buffer.raw().nbytes for buffer in buffers)


@dataclass(frozen=True)
class _Replacements:
    """New actors for lost ones, started in the background by the dispatcher (see dispatch.Replacements)."""

    settings: BacktestSettings
    config: list[WorkerConfig]  # one per checkpoint
    job_ref: Any

    def has_room(self) -> bool:
        return has_room(self.settings.cpus_per_actor, self.settings.gpus_per_actor)

    def start(self) -> tuple[Any, Any]:
        settings = self.settings
        actor = start_worker_actor(
            self.config, settings.cpus_per_actor, settings.gpus_per_actor, build_part_runner, self.job_ref
        )
        return actor, actor.ready.remote()


def dispatch_parts(
    plan: RunPlan,
    early: EarlyStart,
    todo: list[PartSpec],
    ledger: PartLedger,
    progress: Progress,
    clock: PhaseClock,
    callbacks: PartCallbacks,
) -> Dispatched:
    """Put the run's job once, hand it to the warm pool, then run ``todo`` on it (retries, deadlines and
    replacements are the dispatcher's); every actor started for the run is killed before this returns."""
    settings = plan.settings
    source, transport = series_source_for(plan)
    job = plan.job(source)
    put_started = time.perf_counter()
    job_ref = cluster.put(job)
    transport["put_s"] = round(time.perf_counter() - put_started, 4)
    transport["job_bytes"] = pickled_bytes(job)
    transport["descriptor_bytes"] = pickled_bytes(todo[0])
    config = worker_configs(settings, [each.weights_path for each in plan.checkpoints])
    pool, infos = early.actors, early.infos
    early.hand_job(build_part_runner, job_ref)  # each actor builds its job from the one in the store
    actors = list(pool)  # the pool and its replacements: every one is killed at the end
    clock.mark("series_and_pool")
    callbacks.on_job_handed()
    progress.start()
    try:
        dispatch_callbacks = DispatchCallbacks[PartSpec](
            submit=lambda actor, part: actor.run.remote(part),
            on_result=callbacks.on_result,
            on_failure=callbacks.on_failure,
            key=lambda part: part.index,
            size=lambda part: part.n_windows,
            attempt_timeout_s=lambda part: ledger.deadline_s(part, settings.part_timeout_s),
            on_replacement=actors.append,
        )
        dispatcher = Dispatcher(
            pool,
            dispatch_callbacks,
            DispatchConfig(
                max_in_flight_per_actor=settings.max_in_flight_per_actor,
                ready_timeout_s=settings.placement_timeout_s + settings.ready_timeout_s,
            ),
            replacements=_Replacements(settings, config, job_ref),
        )
        # A small part first on each actor (its speed), then the largest first: the small parts end the run.
        first_wave = plan.ramp_width if plan.ramp_width > 1 else 0
        stats = dispatcher.run(dispatch_order(todo, first_wave))
        # Throughput covers dispatching only: stopping actors and Ray (over a second) is not part of it.
        clock.mark("dispatch")
    finally:
        # The pool and every replacement; a kept pool (runs sharing it) only its replacements.
        cluster.kill(actors[len(pool) :] if early.kept else actors)
    return Dispatched(tuple(infos), transport, stats)
