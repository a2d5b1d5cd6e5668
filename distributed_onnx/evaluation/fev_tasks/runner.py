"""Run a fev benchmark as backtests: every task's windows on the actors, summaries by fev's own code.

Each task is one backtest (:func:`~distributed_onnx.evaluation.driver.run.run_backtest`: its planner, parts,
actors and sums) over the checkpoints that can serve it, in ``runs/TASK/GROUP/``: checkpoints that share a
resolution, a context length and the use of covariates share a run (their windows are packed once, and that
run's ``report.html`` and ``leaderboard.parquet`` compare them on the same pairs). Its forecasts become fev
predictions (:mod:`.predictions`) and fev's ``Task.evaluation_summary`` scores them, so the numbers are fev's.

Written to ``OUTPUT``: ``summaries.jsonl`` and ``summaries.json`` (fev's summaries, what ``fev.leaderboard`` and
``fev.pivot_table`` read), ``fev_summary.json`` (every task x checkpoint: done, skipped with its reason, or
failed), ``leaderboard.csv`` (``fev.leaderboard`` against the first checkpoint, when there are two or more) and
``pairs/TASK/MODEL.json`` (one summary each, the resume record: a pair whose record matches the task, the
checkpoint's weights and fev's version is not recomputed; a checkpoint added later joins its group's run
directory and computes only its own forecasts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from distributed_onnx import storage
from distributed_onnx.errors import BatchError, ConfigError, DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.fev_import import FEV_VERSION
from distributed_onnx.evaluation.fev_tasks.predictions import MissingForecastsError, task_predictions
from distributed_onnx.evaluation.fev_tasks.tasks import (
    TaskData,
    backtest_settings,
    checkpoint_reason,
    context_length,
    takes_covariates,
    task_data,
    task_reason,
    task_slug,
)
from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MODEL_KEY
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

logger = logging.getLogger(__name__)

#: Where :func:`run_fev` passes its ``connect`` down with the settings (taken out before they are validated).
_CONNECT = "_connect"
SUMMARIES_JSONL = "summaries.jsonl"
SUMMARIES_JSON = "summaries.json"
RUN_SUMMARY = "fev_summary.json"
LEADERBOARD = "leaderboard.csv"


@dataclass
class FevResult:
    """What a fev run wrote: fev's summaries and the state of every task x checkpoint."""

    #: fev's ``evaluation_summary`` of each task x checkpoint done (now or by an earlier run), in task order.
    summaries: list[dict[str, Any]]
    #: One record per task x checkpoint: ``task, model, status`` (done, resumed, skipped, failed), ``reason``.
    pairs: list[dict[str, Any]]
    output: storage.Location
    failed: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Group:
    """Checkpoints of one task that share a run: same grid step, context length and covariates."""

    step_minutes: int
    context_length: int
    covariates: bool
    checkpoints: tuple[ResolvedCheckpoint, ...]

    @property
    def name(self) -> str:
        return f"r{self.step_minutes}-c{self.context_length}-{'cov' if self.covariates else 'nocov'}"


def run_fev(
    tasks: Sequence[Any],
    checkpoints: Sequence[ResolvedCheckpoint],
    output: storage.Location,
    settings: dict[str, Any],
    connect: Callable[[], object] = lambda: None,
) -> FevResult:
    """Run every task against every checkpoint; ``settings`` are further backtest settings (``actors``,
    ``rows_per_batch``...). ``connect`` joins or starts Ray, called before the first backtest only: a rerun
    with every pair done starts no Ray. Raises :class:`BatchError` after writing everything if a pair failed."""
    storage.make_dirs(output)
    settings = {**settings, _CONNECT: connect}
    summaries: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for index, task in enumerate(tasks):
        slug = task_slug(index, task)
        done, records = _run_task(task, slug, checkpoints, output, settings)
        summaries += done
        pairs += records
    failed = [pair for pair in pairs if pair["status"] == "failed"]
    _write_outputs(output, summaries, pairs, [each.name for each in checkpoints])
    result = FevResult(summaries, pairs, output, failed)
    if failed:
        first = failed[0]
        raise BatchError(
            f"{len(failed)} task x checkpoint pair(s) failed (e.g. {first['task']} x {first['model']}: "
            f"{first['reason']}); the others' summaries are in {storage.redact(output)}/{SUMMARIES_JSONL}; "
            "rerun to retry the failed ones"
        )
    return result


def _run_task(
    task: Any,
    slug: str,
    checkpoints: Sequence[ResolvedCheckpoint],
    output: storage.Location,
    settings: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One task against every checkpoint: the summaries done and one record per checkpoint."""
    name = str(task.task_name)
    records: dict[str, dict[str, Any]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    reason = task_reason(task)
    pending: list[ResolvedCheckpoint] = []
    for checkpoint in checkpoints:
        base = {"task": name, "task_dir": slug, "model": checkpoint.name}
        why = reason or checkpoint_reason(task, checkpoint.metadata)
        if why is not None:
            records[checkpoint.name] = {**base, "status": "skipped", "reason": why}
            continue
        earlier = _read_pair(output, slug, checkpoint.name, _pair_key(task, checkpoint))
        if earlier is not None:
            records[checkpoint.name] = {**base, "status": "resumed", "reason": None}
            summaries[checkpoint.name] = earlier
        pending.append(checkpoint)
    if any(each.name not in summaries for each in pending):
        try:
            data = task_data(task)
        except Exception as exc:  # fev's loader: a missing file, no network for a hub dataset, irregular data
            problem = f"fev could not load the task's data: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            for checkpoint in pending:
                records.setdefault(
                    checkpoint.name,
                    {"task": name, "task_dir": slug, "model": checkpoint.name, "status": "failed", "reason": problem},
                )
            pending = []
        for group in _groups(task, pending):
            if all(each.name in summaries for each in group.checkpoints):
                continue
            run_dir = storage.join(output, "runs", slug, group.name)
            for model, outcome in _run_group(task, data, group, run_dir, output, slug, settings).items():
                if model in summaries:  # resumed: its summary is the earlier run's
                    continue
                if "summary" in outcome:
                    summaries[model] = outcome["summary"]
                    status, why = "done", None
                else:
                    status, why = "failed", outcome["reason"]
                records[model] = {"task": name, "task_dir": slug, "model": model, "status": status}
                records[model] |= {"reason": why, "run_dir": storage.redact(run_dir)}
    ordered = [each.name for each in checkpoints]
    return [summaries[n] for n in ordered if n in summaries], [records[n] for n in ordered if n in records]


def _groups(task: Any, checkpoints: Sequence[ResolvedCheckpoint]) -> list[_Group]:
    keys: dict[tuple[int, int, bool], list[ResolvedCheckpoint]] = {}
    for each in checkpoints:
        metadata = each.metadata
        uses = takes_covariates(task, adapter_for(metadata).supports_covariates, metadata.max_covariates)
        key = (metadata.resolution_minutes, context_length(task, metadata), uses)
        keys.setdefault(key, []).append(each)
    return [_Group(*key, tuple(members)) for key, members in keys.items()]


def _run_group(
    task: Any,
    data: TaskData,
    group: _Group,
    run_dir: storage.Location,
    output: storage.Location,
    slug: str,
    settings: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """One backtest for the group's checkpoints, then fev's summary of each one computed now."""
    from distributed_onnx.evaluation.driver.run import run_backtest
    from distributed_onnx.evaluation.settings import BacktestSettings

    digest = hashlib.sha256(
        json.dumps([task.to_dict(), task._dataset_fingerprint, group.name], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    data_path = storage.join(output, "data", f"{slug}-{group.name}-{digest}.parquet")
    if not storage.is_file(data_path):
        storage.make_dirs(storage.join(output, "data"))
        storage.write_parquet(data_path, data.input_table(group.step_minutes, group.covariates))
    given = {
        "progress": False,
        **settings,
        **backtest_settings(task, data, group.step_minutes, group.covariates),
        "context_length": group.context_length,
        "checkpoint": [each.weights_path for each in group.checkpoints],
        "data": data_path,
        "output": run_dir,
    }
    connect = given.pop(_CONNECT)
    run_settings = BacktestSettings.from_sources(given, source=f"fev task {task.task_name}")
    connect()
    started = time.perf_counter()
    try:
        result = run_backtest(run_settings)
        timing = result.summary.get("timing") or {}
        inference_s = float(timing.get("dispatch_s") or time.perf_counter() - started)
    except DistributedOnnxError as exc:
        # Parts that failed (1) or this task's data or settings refused by the backtest (2) fail this task
        # alone; the environment (3: storage, Ray) stops the benchmark, as it stops a backtest.
        if exc.exit_code not in (BatchError.exit_code, ConfigError.exit_code):
            raise
        return {each.name: {"reason": f"{type(exc).__name__}: {exc}"} for each in group.checkpoints}
    origins = [data.origin_us(window, group.step_minutes) for window in range(len(data.origins))]
    keys = {each.name: _pair_key(task, each) for each in group.checkpoints}
    earlier_pairs = {name: _read_pair(output, slug, name, key) for name, key in keys.items()}
    fresh = [name for name, earlier in earlier_pairs.items() if earlier is None]  # computed by this run
    outcomes: dict[str, dict[str, Any]] = {}
    for checkpoint in group.checkpoints:
        key, earlier = keys[checkpoint.name], earlier_pairs[checkpoint.name]
        if earlier is not None:
            outcomes[checkpoint.name] = {"summary": earlier}
            continue
        forecasts = _model_forecasts(run_dir, checkpoint.name, origins)
        try:
            predictions = task_predictions(task, forecasts, origins)
        except MissingForecastsError as exc:
            outcomes[checkpoint.name] = {"reason": str(exc)}
            continue
        shared = [name for name in fresh if name != checkpoint.name]
        extra = {
            "checkpoint": storage.redact(checkpoint.weights_path),
            "checkpoint_sha256": checkpoint.metadata.sha256,
            "run_dir": storage.redact(run_dir),
            # The run's models share its actors' time: the inference time is the run's when several computed.
            "inference_time_shared_with": ",".join(shared) or None,
            "context_length": group.context_length,
            "covariates_used": group.covariates,
        }
        summary = task.evaluation_summary(
            predictions, model_name=checkpoint.name, inference_time_s=inference_s, extra_info=extra
        )
        summary = _plain(summary)
        _write_pair(output, slug, checkpoint.name, key, summary)
        outcomes[checkpoint.name] = {"summary": summary}
    return outcomes


def _model_forecasts(run_dir: storage.Location, model: str, origins_us: Sequence[int]) -> pa.Table:
    """One model's forecasts at the fev windows' origins (the run also holds the origins between them)."""
    fs, inner = storage.filesystem(storage.join(run_dir, FORECASTS_DIR, f"{MODEL_KEY}={model}"))
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    origin = pads.field("origin").cast(pa.int64())
    return dataset.to_table(filter=origin.isin(pa.array(list(origins_us), pa.int64())))


def _pair_key(task: Any, checkpoint: ResolvedCheckpoint) -> str:
    """What a pair's summary depends on: the task's definition, the checkpoint's weights, fev's version. Not the
    data's fingerprint: knowing it takes loading the data, which a resumed pair must not need (a hub dataset
    needs the network); a dataset rewritten in place needs a new output directory."""
    document = [
        task.to_dict(),
        checkpoint.metadata.sha256 or storage.sha256(checkpoint.weights_path),
        FEV_VERSION,
    ]
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _pair_path(output: storage.Location, slug: str, model: str) -> storage.Location:
    return storage.join(output, "pairs", slug, f"{model}.json")


def _read_pair(output: storage.Location, slug: str, model: str, key: str) -> dict[str, Any] | None:
    """The summary an earlier run wrote for this pair, if its key matches."""
    path = _pair_path(output, slug, model)
    if not storage.is_file(path):
        return None
    try:
        document = json.loads(storage.read_bytes(path))
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("key") != key:
        return None
    summary = document.get("summary")
    return summary if isinstance(summary, dict) else None


def _write_pair(output: storage.Location, slug: str, model: str, key: str, summary: dict[str, Any]) -> None:
    storage.make_dirs(storage.join(output, "pairs", slug))
    storage.write_bytes(_pair_path(output, slug, model), json.dumps({"key": key, "summary": summary}).encode())


def _plain(value: Any) -> Any:
    """A summary as plain JSON: NaN and infinities as null (fev's readers take null as missing)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalars
        return _plain(value.item())
    return value


def _write_outputs(
    output: storage.Location, summaries: list[dict[str, Any]], pairs: list[dict[str, Any]], models: list[str]
) -> None:
    lines = "".join(json.dumps(summary) + "\n" for summary in summaries)
    storage.write_bytes(storage.join(output, SUMMARIES_JSONL), lines.encode())
    storage.write_bytes(storage.join(output, SUMMARIES_JSON), json.dumps(summaries).encode())
    counts = {status: sum(p["status"] == status for p in pairs) for status in ("done", "resumed", "skipped", "failed")}
    document: dict[str, Any] = {"fev_version": FEV_VERSION, "models": models, "pairs": pairs, "counts": counts}
    names = {summary["model_name"] for summary in summaries}
    if len(names) >= 2 and summaries:
        try:
            served = [summary["model_name"] for summary in summaries]
            baseline = max(models, key=served.count)  # fev needs the baseline on every task; the first of the most
            board = _leaderboard(summaries, baseline=baseline)
        except (DistributedOnnxError, ValueError, KeyError) as exc:
            document["leaderboard_error"] = f"{type(exc).__name__}: {exc}"
        else:
            storage.write_bytes(storage.join(output, LEADERBOARD), board.encode())
    storage.write_bytes(storage.join(output, RUN_SUMMARY), json.dumps(document, indent=2).encode())


def _leaderboard(summaries: list[dict[str, Any]], baseline: str) -> str:
    """``fev.leaderboard`` of the summaries against ``baseline``, as CSV (tasks a model lacks are dropped)."""
    from distributed_onnx.evaluation.fev_tasks.fev_import import load_fev

    fev = load_fev()
    board = fev.leaderboard(summaries, baseline_model=baseline, missing_strategy="drop")
    return str(board.to_csv())


#: Backtest settings a fev task decides; given by the user they would change what fev scores.
TASK_SETTINGS = frozenset(
    {"checkpoint", "data", "output", "horizon", "context_length", "n_windows", "stride", "start", "end"}
    | {"quantiles", "seasonality", "covariates", "past_covariates", "group_by", "covariate_data"}
)


def run_benchmark(
    benchmark: Any,
    checkpoints: Sequence[Any],
    output: storage.Location,
    settings: dict[str, Any],
    connect: Callable[[], object] | None = None,
) -> FevResult:
    """:func:`run_fev` from what a user gives: a benchmark (see :func:`~.tasks.load_tasks`) and checkpoint paths.

    ``connect`` (default: join ``settings['address']`` or start the embedded Ray) runs before the first
    backtest; Ray stays up across the tasks' runs."""
    from distributed_onnx.evaluation.fev_tasks.tasks import load_tasks
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    fixed = sorted(TASK_SETTINGS & set(settings))
    if fixed:
        raise ConfigError(f"settings {fixed} are decided by each fev task: drop them", key=fixed[0])
    tasks = load_tasks(benchmark)
    resolved = [LocalCheckpoint(path=path).resolve() for path in (list(checkpoints) or [REFERENCE_CHECKPOINT])]
    names = [each.name for each in resolved]
    if len(set(names)) != len(names):
        raise ConfigError(f"checkpoints must have distinct file stems; got {names}", key="checkpoint")
    address = settings.get("address")
    return run_fev(tasks, resolved, output, settings, connect=connect or (lambda: _join_ray(address)))


def _join_ray(address: str | None) -> None:
    from distributed_onnx.runtime.local_ray import connect  # imports Ray: only once a backtest is to run

    connect(address)
