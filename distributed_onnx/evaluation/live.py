"""Live evaluation: the forecast log joined with the actuals that have arrived, scored by the backtest's code.

``distributed-onnx score --forecasts LOG --actuals DATA --output DIR``. Each window of the log (one series of
one request, for one model: :mod:`distributed_onnx.forecast_log.layout`) is placed on its series in the
actuals and then either

- **scored**: its whole horizon lies within the actuals; actual, seasonal scale and both baselines
  (``seasonal_naive``, ``seasonal_quantiles``) come from the actuals exactly as a backtest's part takes them
  from its data (the scale and the baselines see only what lies before the origin), and
  :class:`~.scoring.pairs.PairScores` scores the checkpoints and the baselines on their common pairs;
- **pending**: its series is not in the actuals yet, or its horizon runs past them: looked at again next run;
- **not placeable** (counted per reason, never scored): ``no_start`` (the request gave no ``start``, so its
  forecasts have no timestamps), ``before_actuals`` (its origin precedes the series' first actual, so the
  history it was cut from is unknown here), ``off_grid`` (its origin is not on the series' grid).

The checkpoints logged under one window id (a primary and its shadows: :mod:`~distributed_onnx.forecast_log.layout`)
forecast the same window, so they are scored together, like the checkpoints of one backtest run: one
:class:`~.scoring.pairs.PairScores` per *group* (the set of checkpoints, the horizon, the quantile levels and the
resolution), where a pair counts only when the actual is observed and every model's forecast is finite. A
window is joined with the forecasts of the same run of ``score``: a shadow forecast logged after its
primary's window was scored is scored in a group of its own.

Scoring is incremental, like a resumed backtest: each run writes one ``scored/batch-NNNNNN.npz`` (atomic) with
the metric sums of what it scored, the (model, window) keys it settled, and the log files all of whose windows
are settled (skipped unread next time). The metrics are the sums of every batch, merged in batch order.

``metrics.parquet`` is the backtest's metrics table (:meth:`~.scoring.pairs.PairScores.to_table`: every
checkpoint and baseline, the ``convention`` column, the left-out counts) of each group, plus the columns
:data:`GROUP_FIELDS` naming the group (``scored_with``: its checkpoints, comma-separated);
``leaderboard.parquet`` is the backtest's leaderboard (:mod:`~.scoring.leaderboard`) of each group, with the
same columns added.
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
from distributed_onnx.evaluation.merge import LEADERBOARD, METRICS
from distributed_onnx.evaluation.score_settings import ScoreSettings
from distributed_onnx.evaluation.scoring.metrics import METRICS_SCHEMA
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, season_count
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores, baseline_forecasts
from distributed_onnx.forecast_log.layout import log_files, read_states
from distributed_onnx.storage import Location

logger = logging.getLogger(__name__)

SCORED_DIR = "scored"
SUMMARY = "summary.json"
BATCH_FORMAT = 2
SCORED = "scored"
NOT_PLACEABLE = ("no_start", "before_actuals", "off_grid")
PENDING = ("series_not_in_actuals", "actuals_not_arrived")
_QUANTILE_COLUMN = re.compile(r"^q(\d*\.?\d+(?:e-?\d+)?)$")
_US_PER_MINUTE = 60_000_000

GroupKey = tuple[tuple[str, ...], int, tuple[float, ...], int]  # checkpoints, horizon, levels, resolution


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

    def __init__(self, location: Location, seasonality: int | None, context_length: int | None = None) -> None:
        self._location = location
        self._seasonality = seasonality
        self._context_length = context_length
        self._raw: pa.Table | None = None
        self._tables: dict[int, tuple[SeriesTable, dict[str, int]]] = {}
        self._scalers: dict[tuple[int, int], SeasonalScaler] = {}

    def season(self, resolution_minutes: int) -> int:
        return self._seasonality or max(1, 1440 // resolution_minutes)

    def seasons(self, resolution_minutes: int) -> int:
        """Seasons the seasonal-quantile baseline looks back over: those within the checkpoints' context, as in
        the backtest (:func:`~.scoring.naive.season_count`); one when the context length is not given."""
        if self._context_length is None:
            return 1
        return season_count(self._context_length, self.season(resolution_minutes))

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


@dataclass
class JoinedWindows:
    """The windows that the same checkpoints logged (a primary and its shadows): scored together on their pairs.

    ``windows`` holds what the models share (series, origin, resolution; the first model's forecasts), and
    ``forecasts`` every model's ``[W, H, Q]``, rows aligned by window id.
    """

    key: GroupKey
    windows: LogWindows
    forecasts: dict[str, npt.NDArray[np.float32]]

    @property
    def models(self) -> tuple[str, ...]:
        return self.key[0]


def join_models(found: Sequence[LogWindows]) -> list[JoinedWindows]:
    """Group fresh windows by the set of checkpoints that logged each window id (its horizon and levels alike).

    A window id names one series of one request, so the models logged under it forecast the same window; they
    are scored together, like the checkpoints of one backtest. A model logging a window id twice counts once.
    """
    by_shape: dict[tuple[int, tuple[float, ...]], dict[str, dict[str, tuple[LogWindows, int]]]] = {}
    for windows in found:
        rows = by_shape.setdefault((windows.horizon, windows.quantiles), {})
        for row, window in enumerate(windows.window_ids.tolist()):
            rows.setdefault(str(window), {}).setdefault(windows.model, (windows, row))
    joined: list[JoinedWindows] = []
    for (horizon, quantiles), rows in sorted(by_shape.items()):
        by_models: dict[tuple[tuple[str, ...], int], list[dict[str, tuple[LogWindows, int]]]] = {}
        for window, per_model in rows.items():
            first, row = next(iter(per_model.values()))
            for other, other_row in per_model.values():
                same = other.series_ids[other_row] == first.series_ids[row] and bool(
                    other.origin_us[other_row] == first.origin_us[row]
                )
                if not same:
                    raise DataError(f"window {window} is logged for different series or origins by different models")
            resolution = int(first.resolution_minutes[row])
            by_models.setdefault((tuple(sorted(per_model)), resolution), []).append(per_model)
        for (models, resolution), windows_of in sorted(by_models.items()):
            lead = [per_model[models[0]] for per_model in windows_of]

            def pick(name: str, found_rows: list[tuple[LogWindows, int]] = lead) -> npt.NDArray[Any]:
                return np.asarray([getattr(windows, name)[row] for windows, row in found_rows])

            shared = LogWindows(
                model=models[0],
                horizon=horizon,
                quantiles=quantiles,
                series_ids=pick("series_ids").astype(np.str_),
                window_ids=pick("window_ids").astype(np.str_),
                origin_us=pick("origin_us").astype(np.int64),
                has_origin=pick("has_origin").astype(bool),
                resolution_minutes=pick("resolution_minutes").astype(np.int64),
                forecasts=pick("forecasts").astype(np.float32),
            )
            forecasts = {
                model: np.stack([windows.forecasts[row] for windows, row in (pm[model] for pm in windows_of)])
                for model in models
            }
            joined.append(JoinedWindows((models, horizon, quantiles, resolution), shared, forecasts))
    return joined


def score_windows(joined: JoinedWindows, placement: Placement, actuals: Actuals, scores: PairScores) -> None:
    """Add the scored windows to the scores of every model and both baselines, as a backtest part scores a batch.

    Actual, seasonal scale and baselines come from the actuals as a part takes them from its data: the scale
    and the baselines see only what lies before the origin, the seasonal-quantile baseline looks back over
    :attr:`Actuals.seasons` seasons. :meth:`PairScores.update` keeps only the pairs every model has.
    """
    windows = joined.windows
    chosen = np.flatnonzero(placement.outcome == SCORED)
    if chosen.size == 0:
        return
    horizon, quantiles = windows.horizon, windows.quantiles
    resolution = int(windows.resolution_minutes[chosen[0]])
    m = actuals.season(resolution)
    history_steps = actuals.seasons(resolution) * m
    actual = np.empty((chosen.size, horizon))
    scale = np.empty(chosen.size)
    history = np.empty((chosen.size, history_steps))
    series_table = actuals.table(resolution)[0]
    for row, w in enumerate(chosen):
        series_index = int(placement.series_index[w])
        values = series_table.series[series_index].values
        origin = int(placement.position[w])
        actual[row] = values[origin : origin + horizon]
        scale[row] = actuals.scaler(resolution, series_index).scales([origin])[0]
        history[row] = gather_blocks(values, np.asarray([origin]), history_steps, 0)[0]
    forecasts = {model: values[chosen].astype(np.float64) for model, values in joined.forecasts.items()}
    forecasts |= baseline_forecasts(history, m, horizon, quantiles)
    ids = windows.series_ids[chosen], windows.origin_us[chosen], windows.window_ids[chosen]
    scores.update(*ids, actual, forecasts, scale)


@dataclass
class ScoreBatch:
    """What one run of ``score`` settled: scores per group, the windows' keys and outcomes, the files done."""

    index: int
    files_done: list[str] = field(default_factory=list)
    sums: dict[GroupKey, PairScores] = field(default_factory=dict)
    keys: list[tuple[str, str, str]] = field(default_factory=list)  # model, window_id, outcome

    def to_bytes(self) -> bytes:
        groups = sorted(self.sums)
        arrays: dict[str, np.ndarray] = {}
        for number, key in enumerate(groups):
            arrays.update(self.sums[key].state(f"g{number}."))
        header = {
            "format": BATCH_FORMAT,
            "index": self.index,
            "files_done": self.files_done,
            "groups": [
                {"models": list(models), "horizon": h, "quantiles": list(q), "resolution_minutes": r}
                for models, h, q, r in groups
            ],
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
                    key = (
                        tuple(str(model) for model in group["models"]),
                        int(group["horizon"]),
                        tuple(float(q) for q in group["quantiles"]),
                        int(group["resolution_minutes"]),
                    )
                    batch.sums[key] = PairScores.from_state(arrays, f"g{number}.")
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
    leaderboard: pa.Table


def score_log(settings: ScoreSettings) -> ScoreResult:
    """Score what is new in the log since the last run into ``output`` (see the module docstring)."""
    output = settings.output
    previous = read_batches(output)
    done_files = {name for batch in previous for name in batch.files_done}
    settled = {(model, window) for batch in previous for model, window, _ in batch.keys}
    actuals = Actuals(settings.actuals, settings.seasonality, settings.context_length)
    batch = ScoreBatch(index=max((b.index for b in previous), default=-1) + 1)
    root = storage.normalize(settings.forecasts)
    fresh: list[LogWindows] = []
    file_of: dict[tuple[str, str], str] = {}  # (model, window id) -> the log file it was read from
    files_read: list[str] = []
    for path in log_files(root):
        name = _relative(root, path)
        if name in done_files:
            continue
        files_read.append(name)
        for found in read_log_windows(path):
            keep = np.asarray([(found.model, str(w)) not in settled for w in found.window_ids.tolist()], dtype=bool)
            if keep.any():
                fresh.append(_subset(found, keep))
                file_of.update(((found.model, str(w)), name) for w in found.window_ids[keep].tolist())
    pending_now: dict[str, dict[str, int]] = {}
    files_pending: set[str] = set()
    for joined in join_models(fresh):
        placement = place(joined.windows, actuals)
        if joined.key not in batch.sums:
            models, horizon, quantiles, _ = joined.key
            batch.sums[joined.key] = PairScores([*models, *BASELINES], quantiles, horizon)
        score_windows(joined, placement, actuals, batch.sums[joined.key])
        for window, outcome in zip(joined.windows.window_ids.tolist(), placement.outcome.tolist(), strict=True):
            for model in joined.models:
                if outcome in PENDING:
                    files_pending.add(file_of[(model, str(window))])
                    counts = pending_now.setdefault(model, {})
                    counts[outcome] = counts.get(outcome, 0) + 1
                else:
                    batch.keys.append((model, str(window), str(outcome)))
    batch.files_done = [name for name in files_read if name not in files_pending]
    batches = previous
    new_batch = None
    if batch.keys or batch.files_done:
        storage.make_dirs(storage.join(output, SCORED_DIR))
        storage.write_bytes(batch_path(output, batch.index), batch.to_bytes())
        batches = [*previous, batch]
        new_batch = batch.index
    merged = merged_sums(batches)
    metrics = metrics_table(merged)
    storage.write_parquet(storage.join(output, METRICS), metrics)
    leaderboard = leaderboard_table(merged)
    storage.write_parquet(storage.join(output, LEADERBOARD), leaderboard)
    summary = _summary(settings, batches, merged, pending_now, new_batch)
    storage.write_bytes(storage.join(output, SUMMARY), json.dumps(summary, indent=2, sort_keys=True).encode())
    return ScoreResult(metrics, summary, new_batch, leaderboard)


def merged_sums(batches: Sequence[ScoreBatch]) -> dict[GroupKey, PairScores]:
    """Every group's scores over all batches, added in batch order (so a rerun reproduces the same numbers)."""
    merged: dict[GroupKey, PairScores] = {}
    for batch in sorted(batches, key=lambda b: b.index):
        for key, scores in batch.sums.items():
            if key not in merged:
                merged[key] = PairScores(scores.models, scores.quantiles, scores.horizon)
            merged[key].merge(scores)
    return merged


def group_label(key: GroupKey) -> str:
    """The checkpoints of a group, comma-separated: the ``scored_with`` column."""
    return ",".join(key[0])


#: The columns :func:`metrics_table` adds to the backtest's metrics table: which group a row belongs to.
GROUP_FIELDS = [
    pa.field("scored_with", pa.string()),
    pa.field("horizon", pa.int32()),
    pa.field("quantile_levels", pa.string()),
    pa.field("resolution_minutes", pa.int32()),
]


def metrics_table(merged: dict[GroupKey, PairScores]) -> pa.Table:
    """The backtest's metrics table (:meth:`PairScores.to_table`) of each group, plus :data:`GROUP_FIELDS`."""
    tables = [_with_group(scores.to_table(), key) for key, scores in sorted(merged.items())]
    return pa.concat_tables(tables) if tables else pa.schema([*METRICS_SCHEMA, *GROUP_FIELDS]).empty_table()


def leaderboard_table(merged: dict[GroupKey, PairScores]) -> pa.Table:
    """The backtest's leaderboard (:func:`~.scoring.leaderboard.leaderboard`) of each group that has scored
    windows, plus :data:`GROUP_FIELDS`: metrics with bootstrap intervals, skill, win rates and Diebold-Mariano
    tests of the checkpoints scored together, on their common pairs."""
    from distributed_onnx.evaluation.scoring.leaderboard import LEADERBOARD_SCHEMA, leaderboard  # scipy: only here

    tables = [
        _with_group(leaderboard(scores, key[3] * _US_PER_MINUTE), key)
        for key, scores in sorted(merged.items())
        if len(scores.pooled[scores.models[0]].series_ids)
    ]
    return pa.concat_tables(tables) if tables else pa.schema([*LEADERBOARD_SCHEMA, *GROUP_FIELDS]).empty_table()


def _with_group(table: pa.Table, key: GroupKey) -> pa.Table:
    _, horizon, levels, resolution = key
    values = [group_label(key), horizon, ",".join(format(q, "g") for q in levels), resolution]
    for column, value in zip(GROUP_FIELDS, values, strict=True):
        table = table.append_column(column, pa.array([value] * table.num_rows, column.type))
    return table


def _summary(
    settings: ScoreSettings,
    batches: Sequence[ScoreBatch],
    merged: dict[GroupKey, PairScores],
    pending: dict[str, dict[str, int]],
    new_batch: int | None,
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
        # Per group of checkpoints scored together: each model's pairs scored and left out (as the backtest's).
        "pairs": [
            {"scored_with": group_label(key), "horizon": key[1], "left_out": scores.left_out()}
            for key, scores in sorted(merged.items())
        ],
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
