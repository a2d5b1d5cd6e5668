"""Which backtest starts Ray and its actor pool before its plan exists, and with which pool; the one place the
backtest's pool is started from.

A fresh run's first forecast waits for both its plan and a warm pool; :class:`~.runtime.early_start.EarlyStart`
starts the pool on a thread meanwhile. This module decides, from the settings alone, whether a run needs it,
and imports nothing heavy (no Ray, no planning): the command calls :func:`start_early` before it imports the
rest of the backtest, so Ray's processes start while the driver still imports (docs/design.md, "Time to
results"; measured against starting them after the imports: benchmarks/results/mechanisms.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.checkpoint import LocalCheckpoint
from distributed_onnx.model.worker import WorkerConfig
from distributed_onnx.runtime.early_start import EarlyStart, ray_connected
from distributed_onnx.runtime.pool_request import PoolRequest

if TYPE_CHECKING:
    from distributed_onnx.evaluation.output_checks import FoundAtOutput


class StartHere:
    """The default of ``run_backtest(early=...)``: the run decides and starts Ray and the pool itself."""

    def __repr__(self) -> str:
        return "START_HERE"


START_HERE = StartHere()

#: Rows of each backtest actor's warm-up forecast: one. The run's first batch pays for ONNX Runtime's lazy
#: initialisation anyway; the warm-up is kept so that a graph that cannot run fails at start, before any part is
#: handed out, and one row is its cheapest form (the worker's default of 8 rows was 8 windows of model time in
#: each actor's start-up: benchmarks/results/published_defaults.md, "Start-up").
BACKTEST_WARM_UP_ROWS = 1


def start_early(
    settings: BacktestSettings, found: FoundAtOutput, *, quiet_ray: bool | None = None
) -> EarlyStart | None:
    """Ray and the pool on a thread while the plan is made, for a run that has work to do; else None.

    Only a fresh output directory is known to need Ray before its plan exists; a rerun may find every part
    done, and then starts nothing: ``found`` is what the up-front checks found in the output folder, looked at
    once (:func:`~.up_front.check_backtest`). A Ray this process already holds (the Python API, tests) costs
    nothing to reach. A checkpoint that does not resolve is left to the plan to name. ``quiet_ray``: see
    :class:`~.runtime.early_start.EarlyStart`.
    """
    if found.has_scored_parts or ray_connected():
        return None
    try:
        checkpoints = [LocalCheckpoint(path=path).resolve() for path in settings.checkpoint]
    except DistributedOnnxError:
        return None
    return start_ray_and_pool(settings, [each.weights_path for each in checkpoints], quiet_ray=quiet_ray)


def kept_pool(settings: BacktestSettings) -> EarlyStart:
    """Ray and a pool for the settings' checkpoints, kept across the runs it is passed to
    (``run_backtest(early=...)``): each run hands the actors its own job and leaves them up; the caller ends
    them with :meth:`~.runtime.early_start.EarlyStart.release`. For runs with the same checkpoints, providers,
    actors and resources (a fev benchmark's runs)."""
    checkpoints = [LocalCheckpoint(path=path).resolve() for path in settings.checkpoint]
    request = pool_request(settings, [each.weights_path for each in checkpoints])  # the sessions' options too
    return EarlyStart(settings.address, request, kept=True)


def start_ray_and_pool(
    settings: BacktestSettings, checkpoints: list[Path], *, quiet_ray: bool | None = None
) -> EarlyStart:
    """Ray (joined, or the embedded one started) and the run's pool, on the thread that later stops them.

    The one way a backtest starts its pool and stops Ray: early, while the plan is made (:func:`start_early`),
    or once the plan shows parts to run (a resumed run, a process already holding Ray).
    """
    request = pool_request(settings, checkpoints)
    return EarlyStart(settings.address, request, quiet_ray=quiet_ray)


def pool_request(settings: BacktestSettings, checkpoints: list[Path]) -> PoolRequest:
    """The run's pool for ``checkpoints`` (their weights' paths): its actors, each loading every model of the run
    (:func:`worker_configs`), their shape and the deadlines of their start, from the settings."""
    return PoolRequest(
        worker_configs(settings, checkpoints),
        settings.actors,
        settings.cpus_per_actor,
        settings.gpus_per_actor,
        placement_timeout_s=settings.placement_timeout_s,
        ready_timeout_s=settings.ready_timeout_s,
    )


def worker_configs(settings: BacktestSettings, checkpoints: list[Path]) -> list[WorkerConfig]:
    """One config per checkpoint (each actor loads every model of the run), with the settings' session options."""
    options = settings.session_options()
    return [
        WorkerConfig(
            checkpoint=path,
            providers=settings.providers,
            session_options=options,
            warm_up_rows=BACKTEST_WARM_UP_ROWS,
        )
        for path in checkpoints
    ]
