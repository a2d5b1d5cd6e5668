"""Live evaluation: the forecast log joined with the actuals that have arrived, scored by the backtest's code.

``distributed-onnx score --forecasts LOG --actuals DATA --output DIR``. Each window of the log (one series of
one request, for one model: :mod:`distributed_onnx.forecast_log.layout`) is placed on its series in the
actuals and then either

- **scored**: its whole horizon lies within the actuals; actual, seasonal scale and seasonal-naive baseline
  come from the actuals exactly as a backtest's part takes them from its data (the scale sees only what lies
  before the origin), and :class:`~.scoring.metrics.MetricsAccumulator` scores model and baseline;
- **pending**: its series is not in the actuals yet, or its horizon runs past them: looked at again next run;
- **not placeable** (counted per reason, never scored): ``no_start`` (the request gave no ``start``, so its
  forecasts have no timestamps), ``before_actuals`` (its origin precedes the series' first actual, so the
  history it was cut from is unknown here), ``off_grid`` (its origin is not on the series' grid).

Scoring is incremental, like a resumed backtest: each run writes one ``scored/batch-NNNNNN.npz`` (atomic) with
the metric sums of what it scored, the (model, window) keys it settled, and the log files all of whose windows
are settled (skipped unread next time). The metrics are the sums of every batch, merged in batch order.

The metrics are grouped by (model, horizon, quantile levels), since sums only add within one: each group gives
the backtest's long table for the model and for ``seasonal_naive`` on that model's windows, plus the columns
``scored_model``, ``horizon`` and ``quantile_levels``. This module is a thin layer over the scoring code
(:func:`score_windows` is the one place it is called), so that the multi-model scoring of the comparison work
(one set of pairs for every model, conventions, leaderboard) can be put in its place.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.packing import gather_blocks
from distributed_onnx.evaluation.data.table import SeriesTable, read_table, series_from_table
from distributed_onnx.evaluation.merge import NAIVE_MODEL
from distributed_onnx.evaluation.score_settings import ScoreSettings
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, broadcast_quantiles, seasonal_naive_batch
from distributed_onnx.forecast_log.layout import log_files, read_states
from distributed_onnx.storage import Location

logger = logging.getLogger(__name__)

SCORED_DIR = "scored"
METRICS = "metrics.parquet"
SUMMARY = "summary.json"
BATCH_FORMAT = 1
SCORED = "scored"
NOT_PLACEABLE = ("no_start", "before_actuals", "off_grid")
PENDING = ("series_not_in_actuals", "actuals_not_arrived")
_QUANTILE_COLUMN = re.compile(r"^q(\d*\.?\d+(?:e-?\d+)?)$")
_US_PER_MINUTE = 60_000_000

GroupKey = tuple[str, int, tuple[float, ...]]  # model, horizon, quantile levels


@dataclass
class LogWindows:
    """Windows of one log file that share a model, a horizon and quantile levels (arrays over windows)."""

    model: str
    horizon: int
    quantiles: tuple[float, ...]
    series_ids: npt.NDArray[np.str_]
    window_ids: npt.NDArray[np.str_]
    origin_us: npt.NDArray[np.int64]
    has_origin: npt.NDArray[np.bool_]
    resolution_minutes: npt.NDArray[np.int64]
    forecasts: npt.NDArray[np.float32]  # [W, H, Q]

    @property
    def key(self) -> GroupKey:
        return self.model, self.horizon, self.quantiles


def read_log_windows(path: Location) -> list[LogWindows]:
    """One log file as windows, grouped by (model, horizon, levels); rows of a window are its leads 1..H."""
    table = storage.read_parquet(path)
    if table.num_rows == 0:
        return []
    levels = sorted(
        (float(match.group(1)), name) for name in table.column_names if (match := _QUANTILE_COLUMN.match(name))
    )
    lead = table.column("lead").to_numpy()
    starts = np.flatnonzero(lead == 1)
    ends = np.append(starts[1:], lead.size)
    if starts.size == 0 or starts[0] != 0 or not np.array_equal(lead, _expected_leads(starts, ends)):
        raise DataError(f"{path}: rows are not whole windows of leads 1..H in order; is it a forecast log file?")
    horizons = ends - starts
    models = table.column("model").to_numpy(zero_copy_only=False)
    origin = table.column("origin")
    has_origin = ~np.asarray(origin.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    origin_us = origin.cast(pa.int64()).fill_null(0).to_numpy()
    resolution = table.column("resolution_minutes").to_numpy().astype(np.int64)
    series_ids = table.column("series_id").to_numpy(zero_copy_only=False).astype(np.str_)
    window_ids = table.column("window_id").to_numpy(zero_copy_only=False).astype(np.str_)
    values = np.stack([table.column(name).to_numpy().astype(np.float32) for _, name in levels], axis=-1)
    found: list[LogWindows] = []
    for model in np.unique(models[starts]):
        for horizon in np.unique(horizons):
            first = starts[(horizons == horizon) & (models[starts] == model)]
            if first.size == 0:
                continue
            rows = first[:, None] + np.arange(horizon)
            found.append(
                LogWindows(
                    model=str(model),
                    horizon=int(horizon),
                    quantiles=tuple(level for level, _ in levels),
                    series_ids=series_ids[first],
                    window_ids=window_ids[first],
                    origin_us=origin_us[first],
                    has_origin=has_origin[first],
                    resolution_minutes=resolution[first],
                    forecasts=values[rows],
                )
            )
    return found


def _expected_leads(starts: npt.NDArray[np.intp], ends: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    return np.concatenate([np.arange(1, end - start + 1) for start, end in zip(starts, ends, strict=True)])


class Actuals:
    """The actuals laid out as the backtest lays out its data, per resolution (read once)."""

    def __init__(self, location: Location, seasonality: int | None) -> None:
        self._location = location
        self._seasonality = seasonality
        self._raw: pa.Table | None = None
        self._tables: dict[int, tuple[SeriesTable, dict[str, int]]] = {}
        self._scalers: dict[tuple[int, int], SeasonalScaler] = {}

    def season(self, resolution_minutes: int) -> int:
        return self._seasonality or max(1, 1440 // resolution_minutes)

    def table(self, resolution_minutes: int) -> tuple[SeriesTable, dict[str, int]]:
        if resolution_minutes not in self._tables:
            if self._raw is None:
                self._raw = read_table(self._location)
                keep = [name for name in ("series_id", "timestamp", "y") if name in self._raw.column_names]
                self._raw = self._raw.select(keep) if len(keep) == 3 else self._raw
            series = series_from_table(self._raw, resolution_minutes, source=str(self._location))
            self._tables[resolution_minutes] = (series, series.index_of())
        return self._tables[resolution_minutes]

    def scaler(self, resolution_minutes: int, series_index: int) -> SeasonalScaler:
        key = (resolution_minutes, series_index)
        if key not in self._scalers:
            series = self.table(resolution_minutes)[0].series[series_index]
            self._scalers[key] = SeasonalScaler(series.values, self.season(resolution_minutes))
        return self._scalers[key]


@dataclass
class Placement:
    """Where each window of a :class:`LogWindows` lands: an outcome each, and for the scored ones their series."""

    outcome: npt.NDArray[np.str_]
    series_index: npt.NDArray[np.int64]
    position: npt.NDArray[np.int64]  # the origin's index on its series' grid


def place(windows: LogWindows, actuals: Actuals) -> Placement:
    n = windows.series_ids.size
    outcome = np.full(n, SCORED, dtype="<U32")
    series_index = np.full(n, -1, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    for w in range(n):
        if not windows.has_origin[w]:
            outcome[w] = "no_start"
            continue
        resolution = int(windows.resolution_minutes[w])
        table, index = actuals.table(resolution)
        found = index.get(str(windows.series_ids[w]))
        if found is None:
            outcome[w] = "series_not_in_actuals"
            continue
        series = table.series[found]
        offset = int(windows.origin_us[w]) - series.start_us
        if offset % series.step_us:
            outcome[w] = "off_grid"
        elif offset < 0:
            outcome[w] = "before_actuals"
        elif offset // series.step_us + windows.horizon > series.n_points:
            outcome[w] = "actuals_not_arrived"
        series_index[w] = found
        position[w] = offset // series.step_us
    return Placement(outcome, series_index, position)


def score_windows(
    windows: LogWindows,
    placement: Placement,
    actuals: Actuals,
    model: MetricsAccumulator,
    naive: MetricsAccumulator,
) -> None:
    """Add the scored windows to the model's and the baseline's sums, as a backtest part scores a batch."""
    chosen = np.flatnonzero(placement.outcome == SCORED)
    if chosen.size == 0:
        return
    horizon = windows.horizon
    actual = np.empty((chosen.size, horizon))
    scale = np.empty(chosen.size)
    naive_point = np.empty((chosen.size, horizon))
    for row, w in enumerate(chosen):
        resolution = int(windows.resolution_minutes[w])
        series = actuals.table(resolution)[0].series[int(placement.series_index[w])]
        origin = int(placement.position[w])
        actual[row] = series.values[origin : origin + horizon]
        scale[row] = actuals.scaler(resolution, int(placement.series_index[w])).scales([origin])[0]
        season = gather_blocks(series.values, np.asarray([origin]), actuals.season(resolution), 0)
        naive_point[row] = seasonal_naive_batch(season, horizon)[0]
    series_ids = windows.series_ids[chosen]
    model.update(series_ids, actual, windows.forecasts[chosen].astype(np.float64), scale)
    naive.update(series_ids, actual, broadcast_quantiles(naive_point, len(windows.quantiles)), scale)


@dataclass
class ScoreBatch:
    """What one run of ``score`` settled: sums per group, the windows' keys and outcomes, the files done."""

    index: int
    files_done: list[str] = field(default_factory=list)
    sums: dict[GroupKey, tuple[MetricsAccumulator, MetricsAccumulator]] = field(default_factory=dict)
    keys: list[tuple[str, str, str]] = field(default_factory=list)  # model, window_id, outcome

    def to_bytes(self) -> bytes:
        groups = sorted(self.sums)
        arrays: dict[str, np.ndarray] = {}
        for number, key in enumerate(groups):
            model, naive = self.sums[key]
            arrays.update(model.state(f"g{number}.model."))
            arrays.update(naive.state(f"g{number}.naive."))
        header = {
            "format": BATCH_FORMAT,
            "index": self.index,
            "files_done": self.files_done,
            "groups": [{"model": m, "horizon": h, "quantiles": list(q)} for m, h, q in groups],
        }
        arrays["header"] = np.asarray(json.dumps(header))
        columns = list(zip(*self.keys, strict=True)) if self.keys else [(), (), ()]
        for name, values in zip(("keys.model", "keys.window_id", "keys.outcome"), columns, strict=True):
            arrays[name] = np.asarray(values, dtype=np.str_)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> ScoreBatch:
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
                header = json.loads(str(arrays["header"]))
                if header.get("format") != BATCH_FORMAT:
                    raise DataError(f"score batch of another format: {header.get('format')!r}")
                batch = cls(int(header["index"]), list(header["files_done"]))
                for number, group in enumerate(header["groups"]):
                    key = (str(group["model"]), int(group["horizon"]), tuple(float(q) for q in group["quantiles"]))
                    batch.sums[key] = (
                        MetricsAccumulator.from_state(arrays, f"g{number}.model."),
                        MetricsAccumulator.from_state(arrays, f"g{number}.naive."),
                    )
                batch.keys = list(
                    zip(
                        arrays["keys.model"].tolist(),
                        arrays["keys.window_id"].tolist(),
                        arrays["keys.outcome"].tolist(),
                        strict=True,
                    )
                )
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"unreadable score batch: {exc}") from exc
        return batch


def batch_path(output: Location, index: int) -> Location:
    return storage.join(output, SCORED_DIR, f"batch-{index:06d}.npz")


def read_batches(output: Location) -> list[ScoreBatch]:
    """The batches of earlier runs, in order; a torn or foreign one is an error naming it (never skipped)."""
    batches = []
    for path in storage.list_files(storage.join(output, SCORED_DIR), "batch-", ".npz"):
        try:
            batches.append(ScoreBatch.from_bytes(storage.read_bytes(path)))
        except DataError as exc:
            raise DataError(f"{path}: {exc}; delete it (and rerun) to score its windows again", path=str(path)) from exc
    return batches


@dataclass
class ScoreResult:
    metrics: pa.Table
    summary: dict[str, Any]
    new_batch: int | None


def score_log(settings: ScoreSettings) -> ScoreResult:
    """Score what is new in the log since the last run into ``output`` (see the module docstring)."""
    output = settings.output
    previous = read_batches(output)
    done_files = {name for batch in previous for name in batch.files_done}
    settled = {(model, window) for batch in previous for model, window, _ in batch.keys}
    actuals = Actuals(settings.actuals, settings.seasonality)
    batch = ScoreBatch(index=max((b.index for b in previous), default=-1) + 1)
    root = storage.normalize(settings.forecasts)
    pending_now: dict[str, dict[str, int]] = {}
    for path in log_files(root):
        name = _relative(root, path)
        if name in done_files:
            continue
        file_pending = False
        for found in read_log_windows(path):
            fresh = np.asarray([(found.model, str(w)) not in settled for w in found.window_ids.tolist()], dtype=bool)
            if not fresh.any():
                continue
            windows = _subset(found, fresh)
            placement = place(windows, actuals)
            if windows.key not in batch.sums:
                batch.sums[windows.key] = (
                    MetricsAccumulator(windows.quantiles, windows.horizon),
                    MetricsAccumulator(windows.quantiles, windows.horizon),
                )
            score_windows(windows, placement, actuals, *batch.sums[windows.key])
            for window, outcome in zip(windows.window_ids.tolist(), placement.outcome.tolist(), strict=True):
                if outcome in PENDING:
                    file_pending = True
                    counts = pending_now.setdefault(windows.model, {})
                    counts[outcome] = counts.get(outcome, 0) + 1
                else:
                    batch.keys.append((windows.model, str(window), str(outcome)))
                    settled.add((windows.model, str(window)))
        if not file_pending:
            batch.files_done.append(name)
    batches = previous
    new_batch = None
    if batch.keys or batch.files_done:
        storage.make_dirs(storage.join(output, SCORED_DIR))
        storage.write_bytes(batch_path(output, batch.index), batch.to_bytes())
        batches = [*previous, batch]
        new_batch = batch.index
    metrics = metrics_table(batches)
    storage.write_parquet(storage.join(output, METRICS), metrics)
    summary = _summary(settings, batches, pending_now, new_batch)
    storage.write_bytes(storage.join(output, SUMMARY), json.dumps(summary, indent=2, sort_keys=True).encode())
    return ScoreResult(metrics, summary, new_batch)


def merged_sums(batches: Sequence[ScoreBatch]) -> dict[GroupKey, tuple[MetricsAccumulator, MetricsAccumulator]]:
    """Every group's sums over all batches, added in batch order (so a rerun reproduces the same numbers)."""
    merged: dict[GroupKey, tuple[MetricsAccumulator, MetricsAccumulator]] = {}
    for batch in sorted(batches, key=lambda b: b.index):
        for key, (model, naive) in batch.sums.items():
            if key not in merged:
                merged[key] = (MetricsAccumulator(key[2], key[1]), MetricsAccumulator(key[2], key[1]))
            merged[key][0].merge(model)
            merged[key][1].merge(naive)
    return merged


def metrics_table(batches: Sequence[ScoreBatch]) -> pa.Table:
    """The backtest's long metrics table per group, with the group's ``scored_model``, ``horizon``, levels."""
    tables = []
    for key, (model, naive) in sorted(merged_sums(batches).items()):
        name, horizon, levels = key
        for table in (model.to_table(name), naive.to_table(NAIVE_MODEL)):
            rows = table.num_rows
            tables.append(
                table.append_column("scored_model", pa.array([name] * rows, pa.string()))
                .append_column("horizon", pa.array([horizon] * rows, pa.int32()))
                .append_column(
                    "quantile_levels", pa.array([",".join(format(q, "g") for q in levels)] * rows, pa.string())
                )
            )
    if not tables:
        empty = MetricsAccumulator([0.5], 1).to_table("none").schema
        schema = empty.append(pa.field("scored_model", pa.string())).append(pa.field("horizon", pa.int32()))
        return schema.append(pa.field("quantile_levels", pa.string())).empty_table()
    return pa.concat_tables(tables)


def _summary(
    settings: ScoreSettings, batches: Sequence[ScoreBatch], pending: dict[str, dict[str, int]], new_batch: int | None
) -> dict[str, Any]:
    windows: dict[str, dict[str, int]] = {}
    for batch in batches:
        for model, _, outcome in batch.keys:
            counts = windows.setdefault(model, {})
            counts[outcome] = counts.get(outcome, 0) + 1
    for model, counts in pending.items():
        target = windows.setdefault(model, {})
        for reason, value in counts.items():
            target[f"pending_{reason}"] = value
    dropped: dict[str, dict[str, int]] = {}
    for state in read_states(settings.forecasts):
        for model, record in dict(state.get("models") or {}).items():
            for reason, value in dict(record.get("dropped") or {}).items():
                target = dropped.setdefault(model, {})
                target[reason] = target.get(reason, 0) + int(value)
    return {
        "forecasts": str(settings.forecasts),
        "actuals": str(settings.actuals),
        "batches": len(batches),
        "new_batch": new_batch,
        "windows": windows,
        "dropped_by_the_log": dropped,
        "files_done": sum(len(batch.files_done) for batch in batches),
    }


def _relative(root: Location, path: Location) -> str:
    return str(path)[len(str(root)) :].lstrip("/")


def _subset(windows: LogWindows, keep: npt.NDArray[np.bool_]) -> LogWindows:
    return LogWindows(
        windows.model,
        windows.horizon,
        windows.quantiles,
        windows.series_ids[keep],
        windows.window_ids[keep],
        windows.origin_us[keep],
        windows.has_origin[keep],
        windows.resolution_minutes[keep],
        windows.forecasts[keep],
    )
