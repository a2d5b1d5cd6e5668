"""Live scoring: the placed, joined windows of the log scored by the backtest's code, and the outputs written.

``distributed-onnx score --forecasts LOG --actuals DATA --output DIR [--backtest RUN]``. Reading the log and
placing its windows on the actuals is :mod:`.log_windows` and :mod:`.join`; what each run settled is kept by
:mod:`.batches`. Here each group of checkpoints that forecast the same windows (a primary and its shadows) is
scored as a backtest part scores a batch: actual, seasonal scale and both baselines (``seasonal_naive``,
``seasonal_quantiles``) come from the actuals exactly as a part takes them from its data (the scale and the
baselines see only what lies before the origin; the seasonal-quantile baseline the seasons within the context
the log records for the checkpoints, or ``--context-length``), and one :class:`~.scoring.pairs.PairScores` per
group scores the checkpoints and the baselines on their common pairs (the actual observed and every model's
forecast finite).
A window is joined with the forecasts of the same run of ``score``: a shadow forecast logged after its
primary's window was scored is scored in a group of its own.

Outputs, rewritten whole on every run from the sums of every batch:

- ``metrics.parquet``: the backtest's metrics table (:meth:`~.scoring.pairs.PairScores.to_table`: every
  checkpoint and baseline, the ``convention`` column, the left-out counts) of each group, plus the columns
  :data:`GROUP_FIELDS` naming the group (``scored_with``: its checkpoints, comma-separated);
- ``leaderboard.parquet``: the backtest's leaderboard (:mod:`~.scoring.leaderboard`) of each group, with the
  same columns added;
- ``summary.json``: windows per model and outcome (each model's forecasts), the windows not scored per reason
  (``windows_not_scored``: one per series of a request, however many models forecast it), the log's span of request
  times, pairs left out, drops, each model's requests answered and failed by kind with its failure rate
  (``requests``, :mod:`.failure_rates`), and ``quantile_clamping``: per model, the levels its log files record as
  served clamped (``{"requested": 0.05, "served_by": 0.1}``, a backtest's record). Such a level is scored as the
  backtest scores it under ``--clamp-quantiles``: at its requested level, on the native level's values (so a q0.05
  pinball and coverage are the 0.1 forecast's judged as a 0.05 one), and said in a warning as the backtest says it;
- ``failures.parquet``: the log's failed requests grouped by model, kind, reason, status and protocol;
- ``live_vs_backtest.parquet`` with ``--backtest`` (:mod:`.versus_backtest`);
- ``report.html``: the backtest's report sections for live scoring (:mod:`~distributed_onnx.live.score.report`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.packing import gather_blocks
from distributed_onnx.evaluation.outputs import LEADERBOARD, METRICS
from distributed_onnx.evaluation.scoring.metrics import METRICS_SCHEMA
from distributed_onnx.evaluation.scoring.pairs import BASELINES, Forecast, PairScores, baseline_forecasts
from distributed_onnx.live.log.layout import log_files, read_states, relative_name
from distributed_onnx.live.score.batches import ScoreBatch, merged_sums, read_batches, widen, write_batch
from distributed_onnx.live.score.failure_rates import FAILURES_FILE, failure_reasons, request_counts
from distributed_onnx.live.score.join import (
    CONFLICTING,
    NOT_PLACEABLE,
    PENDING,
    SCORED,
    Actuals,
    GroupKey,
    JoinedWindows,
    Placement,
    SetAside,
    join_models,
    place,
)
from distributed_onnx.live.score.log_windows import LogWindows, read_log_windows
from distributed_onnx.live.score.score_directory import check_output, record_settings
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.live.score.versus_backtest import BacktestRun, VersusBacktest, compare
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import ClampedLevel, describe_clamped

__all__ = [
    "GROUP_FIELDS",
    "NOT_PLACEABLE",
    "PENDING",
    "SCORED",
    "SUMMARY",
    "ScoreResult",
    "group_label",
    "leaderboard_table",
    "metrics_table",
    "score_log",
    "score_windows",
]

logger = logging.getLogger(__name__)

SUMMARY = "summary.json"
VERSUS_BACKTEST = "live_vs_backtest.parquet"
_US_PER_MINUTE = 60_000_000


def score_windows(joined: JoinedWindows, placement: Placement, actuals: Actuals, scores: PairScores) -> None:
    """Add the scored windows to the scores of every model and both baselines, as a backtest part scores a batch.

    Actual, seasonal scale and baselines come from the actuals as a part takes them from its data: the scale
    and the baselines see only what lies before the origin, the seasonal-quantile baseline looks back over
    :meth:`Actuals.seasons` seasons (those within the checkpoints' context: windows whose checkpoints the log
    records with other context lengths are scored a set at a time). :meth:`PairScores.update` keeps only the
    pairs every model has, and adds to sums, so scoring the windows in sets is scoring them at once.
    """
    windows = joined.windows
    chosen = np.flatnonzero(placement.outcome == SCORED)
    if chosen.size == 0:
        return
    resolution = int(windows.resolution_minutes[chosen[0]])
    seasons = np.asarray([actuals.seasons(resolution, int(c)) for c in windows.context_length[chosen].tolist()])
    for count in np.unique(seasons).tolist():
        _score_set(joined, placement, actuals, scores, chosen[seasons == count], int(count))


def _score_set(
    joined: JoinedWindows,
    placement: Placement,
    actuals: Actuals,
    scores: PairScores,
    chosen: npt.NDArray[np.intp],
    seasons: int,
) -> None:
    """Score the windows ``chosen`` (scored ones of one resolution), whose quantile baseline looks back ``seasons``."""
    windows = joined.windows
    horizon, quantiles = windows.horizon, windows.quantiles
    resolution = int(windows.resolution_minutes[chosen[0]])
    m = actuals.season(resolution)
    history_steps = seasons * m
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
    forecasts: dict[str, Forecast] = {
        model: values[chosen].astype(np.float64) for model, values in joined.forecasts.items()
    }
    forecasts |= baseline_forecasts(history, m, horizon, quantiles)
    ids = windows.series_ids[chosen], windows.origin_us[chosen], windows.window_ids[chosen]
    scores.update(*ids, actual, forecasts, scale)


@dataclass
class ScoreResult:
    metrics: pa.Table
    summary: dict[str, Any]
    new_batch: int | None
    leaderboard: pa.Table
    versus_backtest: VersusBacktest | None = None


def score_log(settings: ScoreSettings) -> ScoreResult:
    """Score what is new in the log since the last run into ``output`` (see the module docstring)."""
    output = settings.output
    # The backtest is read first: a directory that is not a backtest's output fails before anything is written.
    backtest = BacktestRun.read(settings.backtest) if settings.backtest is not None else None
    previous = read_batches(output)
    check_output(settings, has_batches=bool(previous))  # not a backtest's folder, nor scored otherwise before
    batch = ScoreBatch(index=max((b.index for b in previous), default=-1) + 1)
    fresh = _read_fresh(settings.forecasts, previous)
    actuals = Actuals(settings.actuals, settings.seasonality, settings.context_length, settings.column_names)
    pending = _score_fresh(fresh, actuals, batch)
    actuals.check_some_usable()  # before anything is written
    batch.files_done = [name for name in fresh.files_read if name not in pending.files]
    settled_models = {model for model, _, _ in batch.keys}
    batch.clamping = {model: pairs for model, pairs in fresh.clamping.items() if model in settled_models}
    batches = previous
    new_batch = None
    if batch.keys or batch.files_done:
        write_batch(output, batch)
        record_settings(settings)
        batches = [*previous, batch]
        new_batch = batch.index
    merged = merged_sums(batches)
    metrics = metrics_table(merged)
    storage.write_parquet(storage.join(output, METRICS), metrics)
    leaderboard = leaderboard_table(merged)
    storage.write_parquet(storage.join(output, LEADERBOARD), leaderboard)
    summary = _summary(settings, batches, merged, pending, new_batch)
    summary["files_unreadable"] = fresh.unreadable  # left out of this run, named (read again on the next)
    # Beside the accuracy, each model's failure rate (the writers' counts) and the failures' reasons (the table).
    summary["requests"] = request_counts(read_states(settings.forecasts)).record()
    reasons, summary["failure_files_unreadable"] = failure_reasons(settings.forecasts)
    storage.write_parquet(storage.join(output, FAILURES_FILE), reasons)
    versus = None
    if backtest is not None:
        versus = compare(merged, backtest, logged_models=list(summary["windows"]))
        storage.write_parquet(storage.join(output, VERSUS_BACKTEST), versus.table)
        summary["versus_backtest"] = versus.record()
        for warning in versus.warnings:
            logger.warning("%s", warning)
    storage.write_bytes(storage.join(output, SUMMARY), json.dumps(summary, indent=2, sort_keys=True).encode())
    from distributed_onnx.live.score.report import write_live_report  # matplotlib: only when writing

    write_live_report(output, summary, metrics, leaderboard, versus, merged, failures=reasons)
    return ScoreResult(metrics, summary, new_batch, leaderboard, versus)


@dataclass
class _Fresh:
    """The windows of the log not settled by an earlier run, and where each was read from."""

    windows: list[LogWindows] = field(default_factory=list)
    file_of: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, window id) -> its log file
    files_read: list[str] = field(default_factory=list)
    #: Files that are not readable log files (named, with why): left out of this run, looked at again next run.
    unreadable: dict[str, str] = field(default_factory=dict)
    #: Per model: (requested, served by) of the levels its fresh windows' files record as served clamped.
    clamping: dict[str, set[tuple[float, float]]] = field(default_factory=dict)


def _read_fresh(root: Location, previous: list[ScoreBatch]) -> _Fresh:
    """Every log file not marked done, and of it the (model, window) pairs no earlier batch settled."""
    done_files = {name for batch in previous for name in batch.files_done}
    settled = {(model, window) for batch in previous for model, window, _ in batch.keys}
    fresh = _Fresh()
    for path in log_files(root):
        name = relative_name(root, path)
        if name in done_files:
            continue
        try:
            windows = read_log_windows(path)
        except DataError as exc:  # one bad file must not block the log's other files
            logger.warning("Left out of this run: %s", exc)
            fresh.unreadable[name] = str(exc)
            continue
        fresh.files_read.append(name)
        for found in windows:
            keep = np.asarray([(found.model, str(w)) not in settled for w in found.window_ids.tolist()], dtype=bool)
            if keep.any():
                fresh.windows.append(found.subset(keep))
                if found.clamped:
                    pairs = fresh.clamping.setdefault(found.model, set())
                    pairs.update((level.requested, level.served_by) for level in found.clamped)
                fresh.file_of.update(((found.model, str(w)), name) for w in found.window_ids[keep].tolist())
    return fresh


@dataclass
class _Pending:
    """What this run left pending: counts per model and reason, the files holding it, its request times."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per reason, the window ids pending (one per window, however many models forecast it).
    windows: dict[str, set[str]] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    span_us: tuple[int, int] | None = None


def _score_fresh(fresh: _Fresh, actuals: Actuals, batch: ScoreBatch) -> _Pending:
    """Join, place and score the fresh windows into ``batch``; the settled ones are its keys."""
    pending = _Pending()
    aside = SetAside([])
    for joined in join_models(fresh.windows, aside):
        placement = place(joined.windows, actuals)
        if joined.key not in batch.sums:
            models, horizon, quantiles, _ = joined.key
            batch.sums[joined.key] = PairScores([*models, *BASELINES], quantiles, horizon)
        score_windows(joined, placement, actuals, batch.sums[joined.key])
        is_pending = np.isin(placement.outcome, PENDING)
        times = joined.windows.request_time_us
        batch.request_time_span_us = widen(batch.request_time_span_us, times[~is_pending].tolist())
        pending.span_us = widen(pending.span_us, times[is_pending].tolist())
        for window, outcome in zip(joined.windows.window_ids.tolist(), placement.outcome.tolist(), strict=True):
            for model in joined.models:
                if outcome in PENDING:
                    pending.files.add(fresh.file_of[(model, str(window))])
                    pending.windows.setdefault(str(outcome), set()).add(str(window))
                    counts = pending.counts.setdefault(model, {})
                    counts[outcome] = counts.get(outcome, 0) + 1
                else:
                    batch.keys.append((model, str(window), str(outcome)))
    settled = {(model, window) for model, window, _ in batch.keys}
    for model, window, outcome in aside.keys:
        # A copy is counted once its first is settled (a pending first is read again, its copy with it).
        if outcome == CONFLICTING or (model, window) in settled:
            batch.keys.append((model, window, outcome))
    return pending


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
    batches: list[ScoreBatch],
    merged: dict[GroupKey, PairScores],
    pending: _Pending,
    new_batch: int | None,
) -> dict[str, Any]:
    windows: dict[str, dict[str, int]] = {}
    not_scored = {f"pending_{reason}": set(ids) for reason, ids in pending.windows.items()}
    span = pending.span_us
    for batch in batches:
        for model, window, outcome in batch.keys:
            counts = windows.setdefault(model, {})
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome != SCORED:
                not_scored.setdefault(outcome, set()).add(window)
        if batch.request_time_span_us is not None:
            span = widen(span, list(batch.request_time_span_us))
    for model, counts in pending.counts.items():
        target = windows.setdefault(model, {})
        for reason, value in counts.items():
            target[f"pending_{reason}"] = value
    dropped: dict[str, dict[str, int]] = {}
    shadow_failures: dict[str, dict[str, int]] = {}
    for state in read_states(settings.forecasts):
        for model, record in dict(state.get("models") or {}).items():
            for reason, value in dict(record.get("dropped") or {}).items():
                target = dropped.setdefault(model, {})
                target[reason] = target.get(reason, 0) + int(value)
            for key, reason in (("shadow_failed", "failed"), ("shadow_nonfinite", "nonfinite")):
                if record.get(key):
                    target = shadow_failures.setdefault(model, {"failed": 0, "nonfinite": 0})
                    target[reason] += int(record[key])
    clamping: dict[str, set[tuple[float, float]]] = {}
    for batch in batches:
        for model, pairs in batch.clamping.items():
            clamping.setdefault(model, set()).update(pairs)
    for model, pairs in sorted(clamping.items()):  # said as the backtest says it (its plan's note)
        logger.warning("%s: %s", model, describe_clamped([ClampedLevel(*pair) for pair in sorted(pairs)]))
    for model, counts in sorted(shadow_failures.items()):
        # As a backtest reports its failed windows: said, not only recorded (the service's own record).
        logger.warning(
            "Shadow model %s: %d window(s) failed to forecast and %d were forecast NaN or inf (left out of its "
            "pairs), by the service's record",
            model,
            counts["failed"],
            counts["nonfinite"],
        )
    return {
        "forecasts": str(settings.forecasts),
        "actuals": str(settings.actuals),
        "backtest": None if settings.backtest is None else str(settings.backtest),
        "batches": len(batches),
        "new_batch": new_batch,
        "windows": windows,
        # Windows (one series of one request, however many models forecast it) not scored, per reason.
        "windows_not_scored": {reason: len(ids) for reason, ids in sorted(not_scored.items())},
        # The first and last request time of every window read (settled in any batch, or pending now).
        "request_time": None if span is None else {"first": _iso(span[0]), "last": _iso(span[1])},
        # Per group of checkpoints scored together: each model's pairs scored and left out (as the backtest's).
        "pairs": [
            {"scored_with": group_label(key), "horizon": key[1], "left_out": scores.left_out()}
            for key, scores in sorted(merged.items())
        ],
        "dropped_by_the_log": dropped,
        # Per shadow model, from the log's records: windows its call failed on, windows it forecast NaN or inf.
        "failed_by_the_shadows": shadow_failures,
        "files_done": sum(len(batch.files_done) for batch in batches),
        # Per model, the levels served clamped (the log files' record), each as a backtest's summary records it.
        "quantile_clamping": {
            model: [ClampedLevel(*pair).as_record() for pair in sorted(pairs)]
            for model, pairs in sorted(clamping.items())
        },
    }


def _iso(time_us: int) -> str:
    return datetime.fromtimestamp(time_us / 1e6, UTC).isoformat(timespec="seconds")
