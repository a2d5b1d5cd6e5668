"""The worker side of the backtest: run one part, from series to a written, scored Parquet part (no Ray).

An actor receives a :class:`PartJob` once (through the object store: the series arrive zero-copy) and then
only :class:`~.data.windows.PartSpec` descriptors. For each part :class:`PartRunner` recomputes the
part's windows from the series, packs them batch by batch into Arrow, runs the model, builds the forecast
table, scores the model and the seasonal-naive baseline into mergeable sums, writes the part and its sums
(atomic, durable, retried on storage errors) and returns a small :class:`PartReceipt`. The same class runs
in-process for the benchmark's plain loop and the tests' reference, so both do exactly the actors' work.

On a GPU the next batch is packed on a CPU thread while the device runs the current one (ORT releases the
GIL); on CPU the packing thread would only compete with ONNX Runtime's own threads for the actor's cores, so
it is off unless asked for.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from distributed_onnx.errors import DataError, StorageError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.packing import gather_blocks, pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.table import SeriesArrays
from distributed_onnx.evaluation.data.windows import (
    PartSpec,
    PlannedBatch,
    WindowPlan,
    WindowSpec,
    batches,
    batches_of,
    plan_origins,
    plan_series,
)
from distributed_onnx.evaluation.fans import FanCollector
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, broadcast_quantiles, seasonal_naive_batch
from distributed_onnx.evaluation.sums import PartSums, write_sums
from distributed_onnx.model.worker import InferenceWorker
from distributed_onnx.storage import Location

logger = logging.getLogger(__name__)

#: Series whose plan and seasonal scale an actor keeps between parts (a part rarely spans more).
_SERIES_CACHE = 256


@dataclass(frozen=True)
class PartJob:
    """Everything an actor needs to run any part of one backtest; sent to each actor once."""

    source: SeriesSource
    plan: WindowPlan
    spec: WindowSpec
    quantiles: tuple[float, ...]
    run_fingerprint: str
    window_fingerprint: str
    output: Location
    seasonality: int
    step_us: int
    rows_per_batch: int
    fan_series: tuple[int, ...] = ()
    overlap_packing: bool | None = None  # None: when the session runs on a GPU
    write_attempts: int = 3
    write_backoff_s: float = 0.5


class PartReceipt(BaseModel):
    """What an actor reports for a finished part: counts, bytes and where its time went (a few hundred bytes)."""

    part: int
    windows: int
    rows: int
    part_bytes: int
    sums_bytes: int
    write_attempts: int
    seconds: dict[str, float] = Field(description="read, pack, model, table, score, write; pack overlaps model")
    node_id: str | None = None
    pid: int = Field(default_factory=os.getpid)


_STAGES = ("read", "pack", "model", "table", "score", "write")


@dataclass
class _Clock:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_STAGES, 0.0))

    def add(self, stage: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - started
        return now


class PartRunner:
    """Runs the parts of one backtest with one worker (in an actor, or in-process)."""

    def __init__(self, worker: InferenceWorker, job: PartJob, node_id: str | None = None) -> None:
        self.worker = worker
        self.job = job
        self.node_id = node_id
        uses_gpu = worker.backend.uses_io_binding
        self._overlap = uses_gpu if job.overlap_packing is None else job.overlap_packing
        self._plans: OrderedDict[int, tuple[np.ndarray, SeasonalScaler]] = OrderedDict()
        self._scalers: OrderedDict[int, SeasonalScaler] = OrderedDict()

    def run(self, part: PartSpec) -> PartReceipt:
        job = self.job
        clock = _Clock()
        started = time.perf_counter()
        planned_batches, windows = self._planned_batches(part)
        if windows != part.n_windows:
            raise DataError(f"part {part.index} should hold {part.n_windows} windows, the series give {windows}")
        clock.add("read", started)
        model = MetricsAccumulator(job.quantiles, job.spec.horizon)
        naive = MetricsAccumulator(job.quantiles, job.spec.horizon)
        fans = FanCollector(frozenset(job.fan_series), job.quantiles, job.spec.horizon)
        tables = []
        for planned, batch, forecasts in self._forecast(planned_batches, clock):
            mark = time.perf_counter()
            tables.append(outputs.forecast_table(batch, forecasts, job.quantiles, job.step_us))
            mark = clock.add("table", mark)
            self._score(planned, batch, forecasts, model=model, naive=naive, fans=fans)
            clock.add("score", mark)
        table = pa.concat_tables(tables)
        mark = time.perf_counter()
        record = {
            "run_fingerprint": job.run_fingerprint,
            "part": part.index,
            "windows": windows,
            "node_id": self.node_id,
        }
        part_bytes, attempts = self._retry(lambda: outputs.write_part(job.output, part.index, table, record), part)
        sums = PartSums({**record, "part_bytes": part_bytes}, model, naive, fans.candidates())
        sums_bytes, sums_attempts = self._retry(lambda: write_sums(job.output, part.index, sums), part)
        clock.add("write", mark)
        return PartReceipt(
            part=part.index,
            windows=windows,
            rows=table.num_rows,
            part_bytes=part_bytes,
            sums_bytes=sums_bytes,
            write_attempts=attempts + sums_attempts,
            seconds={stage: round(value, 6) for stage, value in clock.seconds.items()},
            node_id=self.node_id,
        )

    def _planned_batches(self, part: PartSpec) -> tuple[Iterator[PlannedBatch], int]:
        """The part's model batches and its window count, recomputed from the series (see :mod:`.data.windows`)."""
        job = self.job
        if isinstance(job.source, SeriesArrays):  # the flat layout: every series of the part in vector passes
            series_index, origin_index = self._part_windows(job.source, part)
            return batches_of(series_index, origin_index, job.rows_per_batch), len(origin_index)
        segments = [
            (series, self._origins(series)[lo:hi]) for series, lo, hi in job.plan.segments(part.start, part.stop)
        ]
        return batches(segments, job.rows_per_batch), sum(len(origins) for _, origins in segments)

    def _part_windows(self, source: SeriesArrays, part: PartSpec) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``[start, stop)`` of the run as (series index, origin index), checked against the driver's plan."""
        plan = self.job.plan
        if part.n_windows <= 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        first = int(np.searchsorted(plan.offsets, part.start, side="right")) - 1
        last = int(np.searchsorted(plan.offsets, part.stop - 1, side="right")) - 1
        series_index, origin_index = plan_origins(source, self.job.spec, first, last + 1)
        counts = np.bincount(series_index - first, minlength=last + 1 - first)
        differ = np.flatnonzero(counts != plan.counts[first : last + 1])
        if differ.size:
            index = first + int(differ[0])
            raise DataError(
                f"series {source.series_ids[index]!r} gives {int(counts[differ[0]])} windows here but "
                f"{int(plan.counts[index])} when the run was planned"
            )
        base = int(plan.offsets[first])
        window_range = slice(part.start - base, part.stop - base)
        return series_index[window_range], origin_index[window_range]

    def _origins(self, series_index: int) -> np.ndarray:
        return self._series_plan(series_index)[0]

    def _scaler(self, series_index: int) -> SeasonalScaler:
        """The seasonal scale of one series (cached: a part's batches share their series)."""
        cached = self._scalers.get(series_index)
        if cached is None:
            values = self.job.source.series(series_index).values
            cached = self._scalers[series_index] = SeasonalScaler(values, self.job.seasonality)
            if len(self._scalers) > _SERIES_CACHE:
                self._scalers.popitem(last=False)
        else:
            self._scalers.move_to_end(series_index)
        return cached

    def _series_plan(self, series_index: int) -> tuple[np.ndarray, SeasonalScaler]:
        cached = self._plans.get(series_index)
        if cached is None:
            series = self.job.source.series(series_index)
            origins = plan_series(series, self.job.spec).origins
            if origins.shape[0] != self.job.plan.counts[series_index]:
                raise DataError(
                    f"series {series.series_id!r} gives {origins.shape[0]} windows here but "
                    f"{self.job.plan.counts[series_index]} when the run was planned"
                )
            cached = self._plans[series_index] = (origins, self._scaler(series_index))
            if len(self._plans) > _SERIES_CACHE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(series_index)
        return cached

    def _pack(self, planned: PlannedBatch) -> pa.RecordBatch:
        spec = self.job.spec
        return pack_batch(self.job.source, planned, spec.context_length, spec.horizon, self.job.window_fingerprint)

    def _forecast(
        self, planned_batches: Iterator[PlannedBatch], clock: _Clock
    ) -> Iterator[tuple[PlannedBatch, pa.RecordBatch, np.ndarray]]:
        """Pack and forecast each batch; with overlap, batch k+1 is packed while the model runs batch k."""
        spec, quantiles = self.job.spec, self.job.quantiles
        if not self._overlap:
            for planned in planned_batches:
                mark = time.perf_counter()
                batch = self._pack(planned)
                mark = clock.add("pack", mark)
                forecasts = self.worker.forecast_batch(batch, spec.context_length, spec.horizon, quantiles)
                clock.add("model", mark)
                yield planned, batch, forecasts
            return

        def timed_pack(planned: PlannedBatch) -> tuple[PlannedBatch, pa.RecordBatch, float]:
            mark = time.perf_counter()
            return planned, self._pack(planned), time.perf_counter() - mark

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pack") as packer:
            pending = [packer.submit(timed_pack, planned) for planned in _first(planned_batches)]
            while pending:
                planned, batch, pack_s = pending.pop().result()
                clock.seconds["pack"] += pack_s
                following = next(planned_batches, None)
                if following is not None:
                    pending.append(packer.submit(timed_pack, following))
                mark = time.perf_counter()
                forecasts = self.worker.forecast_batch(batch, spec.context_length, spec.horizon, quantiles)
                clock.add("model", mark)
                yield planned, batch, forecasts

    def _score(
        self,
        planned: PlannedBatch,
        batch: pa.RecordBatch,
        forecasts: np.ndarray,
        *,
        model: MetricsAccumulator,
        naive: MetricsAccumulator,
        fans: FanCollector,
    ) -> None:
        """Add one batch to the model's and the baseline's sums (scale and baseline see only the history)."""
        job = self.job
        horizon, m = job.spec.horizon, job.seasonality
        actual = batch.column("target").flatten().to_numpy(zero_copy_only=False).reshape(-1, horizon)
        scale = np.empty(planned.n_windows)
        naive_point = np.empty((planned.n_windows, horizon))
        cuts = np.flatnonzero(np.diff(planned.series_index)) + 1
        for rows in np.split(np.arange(planned.n_windows), cuts):
            series_index = int(planned.series_index[rows[0]])
            scaler = self._scaler(series_index)
            origins = planned.origin_index[rows]
            scale[rows] = scaler.scales(origins)
            season = gather_blocks(job.source.series(series_index).values, origins, m, 0)
            naive_point[rows] = seasonal_naive_batch(season, horizon)
        series_ids = batch.column("series_id").to_numpy(zero_copy_only=False)
        model.update(series_ids, actual, forecasts, scale)
        naive.update(series_ids, actual, broadcast_quantiles(naive_point, len(job.quantiles)), scale)
        if job.fan_series:
            origin_us = batch.column("origin").cast(pa.int64()).to_numpy()
            fans.observe(planned.series_index, origin_us, actual, forecasts, scale)

    def _retry(self, write: Any, part: PartSpec) -> tuple[int, int]:
        """Run a write, retrying storage errors with backoff; the last failure becomes a :class:`StorageError`."""
        attempt = 1
        while True:
            try:
                return int(write()), attempt
            except OSError as exc:  # pyarrow's IO errors are OSErrors too
                if attempt >= self.job.write_attempts:
                    raise StorageError(
                        f"part {part.index}: writing to {self.job.output} failed {attempt} times: {exc}",
                        part=part.index,
                    ) from exc
                logger.warning("part %d: write failed (attempt %d): %s; retrying", part.index, attempt, exc)
                time.sleep(self.job.write_backoff_s * attempt)
                attempt += 1


def _first(iterator: Iterator[PlannedBatch]) -> list[PlannedBatch]:
    first = next(iterator, None)
    return [] if first is None else [first]
