"""Small long-format datasets and in-process reference forecasts for the backtest integration tests.

The datasets are written with pyarrow on the tiny checkpoint's 30-minute grid: three series with missing
values, a gap of absent rows and one series shorter than the tiny graph's 16-step context.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from distributed_onnx import storage
from distributed_onnx.evaluation import outputs, run_manifest
from distributed_onnx.evaluation.actor.part import PartRunner
from distributed_onnx.evaluation.data.packing import pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesStore
from distributed_onnx.evaluation.data.windows import PlannedBatch, batches, plan_series, window_ids
from distributed_onnx.evaluation.driver.merge import RunSums
from distributed_onnx.evaluation.planning import RunPlan, prepare
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.sums import read_done_part
from distributed_onnx.location import Location
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

STEP_US = 30 * 60 * 1_000_000
START_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
QUANTILES = [0.1, 0.5, 0.9]
SERIES_LENGTHS = {"a": 60, "b": 50, "c": 14}  # "c" is shorter than the tiny graph's context (16)
COVARIATE = "temp"


def dense_series(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Per series: its dense ``y`` and covariate values (NaN = missing) and which grid steps have a row."""
    rng = np.random.default_rng(seed)
    result = {}
    for offset, (series_id, length) in enumerate(SERIES_LENGTHS.items()):
        steps = np.arange(length)
        y = 100.0 * (offset + 1) + 10.0 * np.sin(steps * 2 * np.pi / 12) + rng.normal(0, 1, length)
        y[rng.choice(length, size=length // 10, replace=False)] = np.nan
        temp = 5.0 + 3.0 * (offset + 1) + rng.normal(0, 2, length)
        temp[rng.choice(length, size=2, replace=False)] = np.nan
        present = np.ones(length, dtype=bool)
        if series_id == "a":
            present[20:23] = False  # a gap of absent rows, not just NaN values
        present[[0, -1]] = True
        result[series_id] = {"y": y, COVARIATE: temp, "present": present, "start_us": START_US + offset * STEP_US}
    return result


def long_table(series: dict[str, dict[str, np.ndarray]], covariate: bool = True) -> pa.Table:
    """The long-format table of :func:`dense_series` (absent rows dropped), rows shuffled deterministically."""
    ids, stamps, ys, temps = [], [], [], []
    for series_id, data in series.items():
        steps = np.flatnonzero(data["present"])
        ids.extend([series_id] * steps.size)
        stamps.append(int(data["start_us"]) + steps * STEP_US)
        ys.append(data["y"][steps])
        temps.append(data[COVARIATE][steps])
    order = np.random.default_rng(1).permutation(len(ids))
    y = np.concatenate(ys)[order]
    columns = {
        "series_id": pa.array(np.asarray(ids, dtype=object)[order], pa.string()),
        "timestamp": pa.array(np.concatenate(stamps)[order], pa.timestamp("us", tz="UTC")),
        "y": pa.array(y, mask=np.isnan(y)),
    }
    if covariate:
        columns[COVARIATE] = pa.array(np.concatenate(temps)[order])
    return pa.table(columns)


def write_dataset(path: Path, covariate: bool = True, seed: int = 0) -> Path:
    pq.write_table(long_table(dense_series(seed), covariate), path)
    return path


def settings_for(checkpoint: Path, data: Path, output: Path, **overrides: object) -> BacktestSettings:
    """Small, fast settings: 2 actors of 1 CPU, 5 windows per series every 3 steps, 4 windows per batch."""
    values: dict[str, object] = {
        "checkpoint": checkpoint,
        "data": data,
        "output": output,
        "n_windows": 5,
        "stride": 3,
        "quantiles": QUANTILES,
        "actors": 2,
        "cpus_per_actor": 1.0,
        "rows_per_batch": 4,
        "progress": False,
    }
    values.update(overrides)
    return BacktestSettings.model_validate(values)


def in_process_forecasts(settings: BacktestSettings) -> pa.Table:
    """The same windows as the distributed run, forecast by one in-process worker from its own packing.

    Independent of the part machinery: every planned window, packed one batch per series, forecast, tabled.
    """
    plan = prepare(settings)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=plan.checkpoint.weights_path))
    store = SeriesStore.from_table(plan.table)
    tables = []
    for series_index, series in enumerate(plan.table.series):
        origins = plan_series(series, plan.spec).origins
        if not origins.size:
            continue
        planned = PlannedBatch(series_index, np.full(origins.size, series_index, dtype=np.int64), origins)
        batch = pack_batch(store, planned, plan.spec.context_length, plan.spec.horizon, plan.window_fingerprint)
        forecasts = worker.forecast_batch(batch, plan.spec.context_length, plan.spec.horizon, plan.quantiles)
        tables.append(outputs.forecast_table(batch, forecasts, plan.quantiles, plan.step_us))
    worker.close()
    return sort_forecasts(pa.concat_tables(tables))


def first_batch(plan: RunPlan) -> tuple[PlannedBatch, pa.RecordBatch]:
    """The first model batch of the first part, planned and packed exactly as the part's actor does it."""
    part = plan.parts()[0]
    segments = [
        (series, plan_series(plan.table.series[series], plan.spec).origins[lo:hi])
        for series, lo, hi in plan.windows.segments(part.start, part.stop)
    ]
    planned = next(batches(segments, plan.rows_per_batch))
    store = SeriesStore.from_table(plan.table)
    spec = plan.spec
    return planned, pack_batch(store, planned, spec.context_length, spec.horizon, plan.window_fingerprint)


def run_parts_in_process(settings: BacktestSettings, overlap_packing: bool | None = None) -> RunPlan:
    """Every part of the plan run by one in-process :class:`PartRunner` (what each actor does), no Ray."""
    plan = prepare(settings)
    run_manifest.prepare_output(settings.output, plan.run_fingerprint, {})
    workers = {
        each.name: InferenceWorker.from_config(WorkerConfig(checkpoint=each.weights_path)) for each in plan.checkpoints
    }
    runner = PartRunner(workers, plan.job(SeriesStore.from_table(plan.table), overlap_packing))
    for part in plan.parts():
        runner.run(part)
    for worker in workers.values():
        worker.close()
    return plan


def part_files(output: Path | str, model: str) -> list[Location]:
    """One model's forecast part files on disk, in part order (done or not)."""
    return storage.list_files(outputs.model_dir(Location.parse(output), model), "part-", ".parquet")


def read_forecasts(output: Path | str, model: str = "*") -> pa.Table:
    """One model's (default: every model's, of a local run) forecast parts of a run directory, local or on an object
    store, in (window_id, lead) order: the one place the tests read forecasts back."""
    if model == "*":
        found = sorted((Path(output) / outputs.FORECASTS_DIR).glob(f"{outputs.MODEL_KEY}=*"))
        models = [path.name.split("=", 1)[1] for path in found]
    else:
        models = [model]
    parts = [part for name in models for part in part_files(output, name)]
    tables = [storage.read_parquet(part).replace_schema_metadata(None) for part in parts]
    return sort_forecasts(pa.concat_tables(tables))


def sort_forecasts(table: pa.Table) -> pa.Table:
    return table.sort_by([("window_id", "ascending"), ("lead", "ascending")])


def planned_window_ids(settings: BacktestSettings) -> list[str]:
    """Every planned window's id, in plan order (series after series, origins ascending)."""
    plan = prepare(settings)
    ids: list[str] = []
    for series in plan.table.series:
        origins = plan_series(series, plan.spec).origins
        ids += window_ids([series.series_id] * origins.size, series.timestamp_us(origins), plan.window_fingerprint)
    return ids


def merged_sums(plan: RunPlan) -> RunSums:
    """The run's sums merged from its parts' files as the driver merges them (every part must verify)."""
    sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)
    for part in plan.parts():
        found = read_done_part(
            plan.settings.output,
            part.index,
            plan.run_fingerprint,
            part.n_windows,
            plan.spec.horizon,
            plan.model_fingerprints,
        )
        assert found is not None, f"part {part.index} does not verify"
        sums.add(part.index, found)
    return sums
