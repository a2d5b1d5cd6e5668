"""``tune``'s timed trials: real ONNX Runtime sessions of a checkpoint forecasting real windows of the data, from
as many threads as actors, for a share of the budget; windows per second over them all.

Apart from the command's flow (:mod:`.tune`), which decides what to try in which order, because this is the one
part that builds sessions and keeps time.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location
from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.tune_plan import LEVELS


def data_contexts(data: Location, checkpoint: ResolvedCheckpoint, count: int) -> np.ndarray:
    """``count`` contexts ``[W, context_length]`` of the data's series: each series' latest window first, then
    stepping back one horizon at a time, round robin over the series (NaN where a series is short); repeated
    when the data holds fewer (the speed of a call does not depend on which windows it holds)."""
    from distributed_onnx.evaluation.data.table import load_series

    metadata = checkpoint.metadata
    arrays = load_series(data, metadata.resolution_minutes).arrays()
    length = metadata.context_length
    taken: list[np.ndarray] = []
    step = 0
    while len(taken) < count:
        before = len(taken)
        for series in range(len(arrays.series_ids)):
            values = arrays.values[arrays.offsets[series] : arrays.offsets[series + 1]]
            end = len(values) - step * max(metadata.horizon_length, 1)
            if end <= 0:
                continue
            window = np.full(length, np.nan)
            piece = values[max(0, end - length) : end]
            window[length - len(piece) :] = piece
            taken.append(window)
            if len(taken) == count:
                break
        if len(taken) == before:
            break
        step += 1
    if not taken:
        raise ConfigError(f"{data} has no values to tune on")
    return np.resize(np.asarray(taken, dtype=np.float32), (count, length))


def _worker_config(checkpoint: ResolvedCheckpoint, level: str, threads: int) -> WorkerConfig:
    options = SessionOptionsConfig(
        graph_optimization_level=LEVELS[level], intra_op_num_threads=threads, allow_spinning=False
    )
    return WorkerConfig(checkpoint=checkpoint.weights_path, providers=[CpuProvider()], session_options=options)


def one_window_s(checkpoint: ResolvedCheckpoint, contexts: np.ndarray) -> float:
    """Seconds of a one-window call on one thread (after a first call), at the default level: what sizes the
    batches a trial can afford (:func:`~.tune_plan.affordable_batches`)."""
    worker = InferenceWorker.from_config(_worker_config(checkpoint, "all", 1))
    metadata = checkpoint.metadata
    try:
        one = contexts[:1]
        worker.forecast(one, metadata.horizon_length, list(metadata.native_quantiles))
        started = time.perf_counter()
        worker.forecast(one, metadata.horizon_length, list(metadata.native_quantiles))
        return time.perf_counter() - started
    finally:
        worker.close()


class Measure:
    """One timed trial: ``actors`` sessions of ``threads`` intra-op threads, each forecasting batches of
    ``rows`` windows from its own thread for ``trial_s``; windows per second over them all."""

    def __init__(self, checkpoint: ResolvedCheckpoint, contexts: np.ndarray, trial_s: float) -> None:
        self.checkpoint, self.contexts, self.trial_s = checkpoint, contexts, trial_s
        metadata = checkpoint.metadata
        self.horizon, self.levels = metadata.horizon_length, list(metadata.native_quantiles)

    def of(self, checkpoint: ResolvedCheckpoint) -> Measure:
        """The same trials of another checkpoint (a variant: the same contexts, the same share of the budget)."""
        return Measure(checkpoint, self.contexts, self.trial_s)

    def __call__(self, level: str, rows: int, actors: int, threads: int, stage: str = "level") -> dict[str, Any]:
        config = _worker_config(self.checkpoint, level, threads)
        built = time.perf_counter()
        workers = [InferenceWorker.from_config(config) for _ in range(actors)]
        build_s = (time.perf_counter() - built) / actors
        batch = self.contexts[: max(rows, 1)]
        for worker in workers:  # a warm-up call each: the first call allocates
            worker.forecast(batch, self.horizon, self.levels)
        done = [0] * actors
        deadline = time.perf_counter() + self.trial_s
        started = time.perf_counter()

        def run(index: int, forecast: Callable[..., Any]) -> None:
            while True:
                forecast(batch, self.horizon, self.levels)
                done[index] += len(batch)
                if time.perf_counter() >= deadline:
                    return

        _in_threads([functools.partial(run, index, worker.forecast) for index, worker in enumerate(workers)])
        elapsed = time.perf_counter() - started
        for worker in workers:
            worker.close()
        return {
            "stage": stage,
            "graph_optimization": level,
            "rows_per_batch": len(batch),
            "actors": actors,
            "threads": threads,
            "windows_per_s": round(sum(done) / elapsed, 3),
            "session_build_s": round(build_s, 3),
            "seconds": round(elapsed, 3),
        }


def _in_threads(tasks: Sequence[Callable[[], None]]) -> None:
    """Run ``tasks`` at once, one thread each; the first error of any is raised here."""
    errors: list[BaseException] = []

    def guarded(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # raised again below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
