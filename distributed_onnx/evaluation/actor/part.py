"""The worker side of the backtest: run one part, from series to written, scored Parquet parts (no Ray).

An actor receives a :class:`PartJob` once (through the object store: the series arrive zero-copy) and then
only :class:`~..data.windows.PartSpec` descriptors. For each part :class:`PartRunner` recomputes the
part's windows from the series, packs them batch by batch into Arrow *once*, runs each checkpoint of the run
on the batch, builds each model's forecast table, scores every model and both baselines on the batch's
common pairs (:mod:`..scoring.pairs`) into mergeable sums, writes the parts and the sums (atomic, durable,
retried on storage errors) and returns a small :class:`PartReceipt`. A model whose part is already written
and verifies (its footer names this run, this part and the model's fingerprint) is not run again: its
forecasts are read back and rescored with the others, which is how a checkpoint is added to a finished run
(:mod:`.part_written`). Each window's seasonal scale and history come from :mod:`.part_history`. The same class
runs in-process for the benchmark's plain loop and the tests' reference.

On a GPU the next batch is packed on a CPU thread while the device runs the current one (ORT releases the
GIL); on CPU the packing thread would only compete with ONNX Runtime's own threads for the actor's cores, so
it is off unless asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_onnx.errors import CheckpointGraphMismatchError, DataError, StorageError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.actor.part_history import SeriesHistory
from distributed_onnx.evaluation.actor.part_written import WrittenForecasts, read_written
from distributed_onnx.evaluation.data.layout import FlatSeries, SeriesArrays
from distributed_onnx.evaluation.data.packing import VintageJoin, pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX, VintageStats
from distributed_onnx.evaluation.data.windows import (
    PartSpec,
    PlannedBatch,
    batches,
    batches_of,
    plan_origins,
)
from distributed_onnx.evaluation.fans import FanCollector
from distributed_onnx.evaluation.grouping import grouped_batches
from distributed_onnx.evaluation.part_messages import MODEL_STAGE_PREFIX, PartJob, PartReceipt
from distributed_onnx.evaluation.scoring.batch_pairs import SeriesCodes
from distributed_onnx.evaluation.scoring.losses import CellForecast, Scratch
from distributed_onnx.evaluation.scoring.pairs import BASELINES, Forecast, PairScores, cell_baselines
from distributed_onnx.evaluation.sums import PartSums, write_sums
from distributed_onnx.model.window_batch import strings_of, targets_and_origins
from distributed_onnx.model.worker import InferenceWorker, WorkerInfo

logger = logging.getLogger(__name__)


_STAGES = ("read", "pack", "model", "table", "score", "write")


@dataclass
class _Clock:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_STAGES, 0.0))

    def add(self, stage: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - started
        return now


def _refuse_fixed_batches(workers: dict[str, InferenceWorker], rows_per_batch: int) -> None:
    """Refuse, at load, a graph whose fixed batch axis cannot take the run's batches (docs/tirex.md).

    A backtest calls each model with 1 to ``rows_per_batch`` windows (a part's last batch is short); a graph
    traced on one row (TiRex exported on a one-series ``--data``) takes only that many, and every part then
    failed with ONNX Runtime's ``Input 'context' has size 20 on axis 0 ... expected 1``, not naming the model.
    """
    for name, worker in workers.items():
        fixed = worker.fixed_windows()
        if fixed is not None and not (fixed == 1 and rows_per_batch == 1):
            raise CheckpointGraphMismatchError(
                f"Model {name!r}: its graph's batch axis is fixed at {fixed} window(s), and a backtest calls it with "
                f"1 to {rows_per_batch} windows per call; export it again with a dynamic batch axis "
                "(distributed-onnx export does).",
                model=name,
            )


class PartRunner:
    """Runs the parts of one backtest with one worker per checkpoint (in an actor, or in-process)."""

    def __init__(
        self, workers: InferenceWorker | dict[str, InferenceWorker], job: PartJob, node_id: str | None = None
    ) -> None:
        if isinstance(workers, InferenceWorker):
            workers = {workers.model_name: workers}
        self.job = job
        names = [name for name, _ in job.models] or list(workers)
        missing = [name for name in names if name.removesuffix(REALIZED_SUFFIX) not in workers]
        if missing:
            raise DataError(f"the run's models {names} need a worker each; none for {missing}")
        # A ``NAME@realized`` twin is the same session run on the realized covariates (:mod:`..data.vintages`).
        self.workers = {name: workers[name.removesuffix(REALIZED_SUFFIX)] for name in names}
        _refuse_fixed_batches(self.workers, job.rows_per_batch)
        self.fingerprints = dict(job.models) or dict.fromkeys(names, job.run_fingerprint)
        self.node_id = node_id
        uses_gpu = any(worker.backend.uses_io_binding for worker in self.workers.values())
        self._overlap = uses_gpu if job.overlap_packing is None else job.overlap_packing
        self.history = SeriesHistory(job.source, job.plan, job.spec, job.seasonality)
        self._scratch = Scratch()  # the scoring's work buffers, reused part after part
        self._source: SeriesSource = job.source  # the current part's series (see _part_source)
        self._stats: VintageStats | None = None  # the current part's vintage counts
        self._realized = any(name.endswith(REALIZED_SUFFIX) for name in self.workers)
        self._in_sample_windows = 0  # the current part's windows at or before the training data's end

    @property
    def worker(self) -> InferenceWorker:
        """The first checkpoint's worker."""
        return next(iter(self.workers.values()))

    def run(self, part: PartSpec) -> PartReceipt:
        job = self.job
        clock = _Clock()
        started = time.perf_counter()
        self._source = self._part_source(part)
        self.history.source = self._source
        if job.vintaged is not None:
            self._stats = VintageStats(job.spec.horizon, job.step_us)
        planned_batches, windows = self._planned_batches(part)
        if windows != part.n_windows:
            raise DataError(f"part {part.index} should hold {part.n_windows} windows, the series give {windows}")
        record = {"run_fingerprint": job.run_fingerprint, "part": part.index, "windows": windows}
        # The models that may be written already (all of them unless the driver knows): read back if they verify.
        maybe = [name for name in self.workers if part.written is None or name in part.written]
        expected = {name: {**record, "model_fingerprint": self.fingerprints[name]} for name in maybe}
        written = WrittenForecasts()
        if expected:
            written = read_written(job.output, part.index, expected, windows, job.spec.horizon, job.quantiles)
        clock.add("read", started)
        to_run = [name for name in self.workers if name not in written.values]
        scores = PairScores([*self.workers, *BASELINES], job.quantiles, job.spec.horizon, self._scratch)
        in_sample = None
        self._in_sample_windows = 0
        if job.in_sample_end_us is not None:
            in_sample = PairScores([*self.workers, *BASELINES], job.quantiles, job.spec.horizon, self._scratch)
        fans = FanCollector(frozenset(job.fan_series), job.quantiles, job.spec.horizon)
        tables: dict[str, list[pa.Table]] = {name: [] for name in to_run}
        done = 0
        for planned, batch, forecasts in self._forecast(planned_batches, to_run, clock):
            mark = time.perf_counter()
            rows = slice(done, done + planned.n_windows)
            done += planned.n_windows
            if written.values:
                packed_ids = strings_of(batch.column("window_id"))
                forecasts.update(written.batch(part.index, rows, packed_ids))
            for name in to_run:
                tables[name].append(outputs.forecast_table(batch, forecasts[name], job.quantiles, job.step_us))
            mark = clock.add("table", mark)
            self._score_split(planned, batch, forecasts, scores, in_sample, fans)
            clock.add("score", mark)
        mark = time.perf_counter()
        part_bytes = written.sizes(job.output, part.index)
        attempts = 0
        for name in to_run:
            table = pa.concat_tables(tables[name])
            model_record = {
                **record,
                "model": name,
                "model_fingerprint": self.fingerprints[name],
                "node_id": self.node_id,
            }
            part_bytes[name], tries = self._retry(
                lambda t=table, n=name, r=model_record: outputs.write_part(job.output, n, part.index, t, r), part
            )
            attempts += tries
        header = {**record, "node_id": self.node_id, "models": self.fingerprints, "part_bytes": part_bytes}
        header |= {"in_sample_windows": self._in_sample_windows} if in_sample is not None else {}
        sums = PartSums(header, scores, fans.candidates(), in_sample)
        self._write_vintage_stats(part)  # before the sums: a part whose sums verify has its counts
        sums_bytes, sums_attempts = self._retry(lambda: write_sums(job.output, part.index, sums), part)
        clock.add("write", mark)
        return PartReceipt(
            part=part.index,
            windows=windows,
            rows=windows * job.spec.horizon,
            part_bytes=sum(part_bytes[name] for name in to_run),
            sums_bytes=sums_bytes,
            write_attempts=attempts + sums_attempts,
            models_computed=to_run,
            nonfinite_windows=scores.n_nonfinite_windows,
            seconds={stage: round(value, 6) for stage, value in clock.seconds.items()},
            node_id=self.node_id,
        )

    def _write_vintage_stats(self, part: PartSpec) -> None:
        stats = self._stats
        if stats is not None:
            self._retry(lambda: outputs.write_vintage_stats(self.job.output, part.index, stats.to_json()), part)

    def _planned_batches(self, part: PartSpec) -> tuple[Iterator[PlannedBatch], int]:
        """The part's model batches and its window count, recomputed from the series (see :mod:`..data.windows`)."""
        job = self.job
        if job.grouping is not None:  # whole groups, one model batch each
            series_index, origin_index, group = job.grouping.windows(part.start, part.stop)
            return grouped_batches(series_index, origin_index, group), len(origin_index)
        if isinstance(self._source, SeriesArrays):  # the flat layout: every series of the part in vector passes
            series_index, origin_index = self._part_windows(self._source, part)
            return batches_of(series_index, origin_index, job.rows_per_batch), len(origin_index)
        segments = [
            (series, self._origins(series)[lo:hi]) for series, lo, hi in job.plan.segments(part.start, part.stop)
        ]
        return batches(segments, job.rows_per_batch), sum(len(origins) for _, origins in segments)

    def _part_source(self, part: PartSpec) -> SeriesSource:
        """The series a part reads: the flat layout of its series (read from the input file's rows when the
        driver streamed it, :mod:`..data.rows`), or the job's source as it is."""
        source, plan = self.job.source, self.job.plan
        if self.job.grouping is not None and isinstance(source, FlatSeries):  # a group's series are anywhere
            return source.arrays(0, len(source))
        if not isinstance(source, FlatSeries) or part.n_windows <= 0:
            return source
        first = int(np.searchsorted(plan.offsets, part.start, side="right")) - 1
        last = int(np.searchsorted(plan.offsets, part.stop - 1, side="right")) - 1
        return source.arrays(first, last + 1)

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
        return self.history.origins(series_index)

    def _pack(self, planned: PlannedBatch) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
        """The batch, and with ``--compare-realized`` the same windows with the realized covariates."""
        spec, job = self.job.spec, self.job
        args = (self._source, planned, spec.context_length, spec.horizon, job.window_fingerprint, job.roles)
        if job.vintaged is None:
            return pack_batch(*args), None
        batch = pack_batch(*args, VintageJoin(job.vintaged, stats=self._stats))
        realized = pack_batch(*args, VintageJoin(job.vintaged, realized=True)) if self._realized else None
        return batch, realized

    def _run_models(
        self, packed: tuple[pa.RecordBatch, pa.RecordBatch | None], names: list[str], clock: _Clock
    ) -> dict[str, np.ndarray]:
        """Each model on the same packed batch (packed once, run K times); a realized twin on the realized one."""
        spec, quantiles = self.job.spec, self.job.quantiles
        batch, realized = packed
        mark = time.perf_counter()
        out = {}
        for name in names:
            given = realized if realized is not None and name.endswith(REALIZED_SUFFIX) else batch
            started = time.perf_counter()
            out[name] = self.workers[name].forecast_batch(given, spec.context_length, spec.horizon, quantiles)
            if len(names) > 1:  # each model's own time, for the variant comparison's speed ratio
                stage = f"{MODEL_STAGE_PREFIX}{name}"
                clock.seconds[stage] = clock.seconds.get(stage, 0.0) + time.perf_counter() - started
        clock.add("model", mark)
        return out

    def _forecast(
        self, planned_batches: Iterator[PlannedBatch], names: list[str], clock: _Clock
    ) -> Iterator[tuple[PlannedBatch, pa.RecordBatch, dict[str, np.ndarray]]]:
        """Pack and forecast each batch; with overlap, batch k+1 is packed while the models run batch k."""
        if not self._overlap:
            for planned in planned_batches:
                mark = time.perf_counter()
                packed = self._pack(planned)
                clock.add("pack", mark)
                yield planned, packed[0], self._run_models(packed, names, clock)
            return

        def timed_pack(
            planned: PlannedBatch,
        ) -> tuple[PlannedBatch, tuple[pa.RecordBatch, pa.RecordBatch | None], float]:
            mark = time.perf_counter()
            return planned, self._pack(planned), time.perf_counter() - mark

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pack") as packer:
            pending = [packer.submit(timed_pack, planned) for planned in _first(planned_batches)]
            while pending:
                planned, packed, pack_s = pending.pop().result()
                clock.seconds["pack"] += pack_s
                following = next(planned_batches, None)
                if following is not None:
                    pending.append(packer.submit(timed_pack, following))
                yield planned, packed[0], self._run_models(packed, names, clock)

    def _score_split(
        self,
        planned: PlannedBatch,
        batch: pa.RecordBatch,
        forecasts: dict[str, np.ndarray],
        scores: PairScores,
        in_sample: PairScores | None,
        fans: FanCollector,
    ) -> None:
        """Score a batch; with a ``training_data_end``, its in-sample windows into ``in_sample`` (and into
        ``scores`` only with ``--include-in-sample``)."""
        end = self.job.in_sample_end_us
        if in_sample is None or end is None:
            self._score(planned, batch, forecasts, scores=scores, fans=fans)
            return
        _, origins_us = targets_and_origins(batch, self.job.spec.horizon)
        inside = np.asarray(origins_us, dtype=np.int64) <= end
        self._in_sample_windows += int(inside.sum())
        if self.job.include_in_sample or not inside.any():
            self._score(planned, batch, forecasts, scores=scores, fans=fans)
        elif not inside.all():
            rows = np.flatnonzero(~inside)
            self._score(*_subset(planned, batch, forecasts, rows), scores=scores, fans=fans)
        if inside.any():
            quiet = FanCollector(frozenset(), self.job.quantiles, self.job.spec.horizon)
            self._score(*_subset(planned, batch, forecasts, np.flatnonzero(inside)), scores=in_sample, fans=quiet)

    def _score(
        self,
        planned: PlannedBatch,
        batch: pa.RecordBatch,
        forecasts: dict[str, np.ndarray],
        *,
        scores: PairScores,
        fans: FanCollector,
    ) -> None:
        """Add one batch to every model's and baseline's sums (scale and baselines see only the history)."""
        job = self.job
        horizon = job.spec.horizon
        target, origins_us = targets_and_origins(batch, horizon)
        actual = np.asarray(target, dtype=np.float64)
        scale, cells = self.history.scales_and_cells(planned)
        scored: dict[str, Forecast] = {**forecasts, **cell_baselines(cells, job.quantiles)}
        # The series ids of the windows from the planned batch (each distinct id once), not decoded per window;
        # the window ids are read only for a non-finite forecast's windows.
        codes = SeriesCodes.of_indices(planned.series_index, self._source.series_ids)
        valid = scores.update(codes, origins_us, batch.column("window_id"), actual, scored, scale)
        if fans.touches(planned.series_index):
            # The first checkpoint's fan, and every other model's median on the same windows beside it.
            names: list[str] = [*self.workers, *BASELINES]
            first, rest = names[0], names[1:]
            middle = min(range(len(job.quantiles)), key=lambda i: abs(job.quantiles[i] - 0.5))

            def others(rows: np.ndarray) -> np.ndarray:  # [k, M, H]: only the few windows kept
                return np.stack([_level(scored[name], rows, middle) for name in rest], axis=1)

            observed = np.where(valid, actual, np.nan)
            fans.observe(planned.series_index, origins_us, observed, forecasts[first], scale, others)

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


def _subset(
    planned: PlannedBatch, batch: pa.RecordBatch, forecasts: dict[str, np.ndarray], rows: np.ndarray
) -> tuple[PlannedBatch, pa.RecordBatch, dict[str, np.ndarray]]:
    """Windows ``rows`` of a batch: its plan, its Arrow rows and every model's forecasts."""
    group = None if planned.group is None else planned.group[rows]
    subset = PlannedBatch(planned.index, planned.series_index[rows], planned.origin_index[rows], group)
    return subset, batch.take(pa.array(rows)), {name: np.asarray(f)[rows] for name, f in forecasts.items()}


def _level(forecast: Forecast, rows: np.ndarray, index: int) -> np.ndarray:
    """Level ``index`` of a forecast's windows ``rows``: ``[k, H]``."""
    if isinstance(forecast, CellForecast):
        return forecast.level(rows, index)
    return np.asarray(forecast[rows, :, index])


def _first(iterator: Iterator[PlannedBatch]) -> list[PlannedBatch]:
    first = next(iterator, None)
    return [] if first is None else [first]


def build_part_runner(workers: Sequence[InferenceWorker], job: PartJob, info: WorkerInfo) -> PartRunner:
    """The actors' job factory (module level, so Ray pickles it by reference): one worker per checkpoint."""
    return PartRunner({worker.model_name: worker for worker in workers}, job, node_id=info.node_id)
