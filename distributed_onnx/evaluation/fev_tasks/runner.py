"""Run a fev benchmark as backtests: every task's windows on the actors, summaries by fev's own code.

Tasks are planned together: one backtest (:func:`~distributed_onnx.evaluation.backtest.run_backtest`: its
planner, parts, actors, sums and one report) per *run*, the tasks whose checkpoints share a grid step, a
context length and the same covariate columns (names and types), and the same set of checkpoints that can serve
them, in ``runs/RUN/``. Every fev window is its own series there (:meth:`~.tasks.TaskData.window_table`), all at
one origin, so a run plans exactly the tasks' windows whatever their cutoffs; its horizon is the longest
task's and its quantile levels the union. Each task's forecasts, cut back to its horizon and levels, become fev
predictions (:mod:`.predictions`) and fev's ``Task.evaluation_summary`` scores them, so the numbers are fev's.
Ray is joined once, before the first run, and each set of checkpoints gets one actor pool, kept for all its
runs (:func:`~distributed_onnx.evaluation.driver.early.kept_pool`); the runs go set by set, and a set's pool is
released before the next set's starts (:class:`_SetPools`).

What goes wrong with one task stays that task's. A pair ends ``failed`` where a rerun may get past it (fev could
not load the task's data: a missing file, no network; parts of its run failed) and ``rejected`` where no rerun
can, the reason saying who refused what: the task's data that cannot be laid out as a backtest's (a target of
letters), the backtest refusing the task's data (a merged run the backtest refuses is rerun task by task, so the
task at fault is rejected alone), or fev refusing the task's windows or data where it scores them (:func:`_scored`,
the one boundary around fev's scoring; fev's verdict is recorded, so a rerun does not forecast the task again).

Written to ``OUTPUT``: ``summaries.jsonl`` and ``summaries.json`` (fev's summaries, what ``fev.leaderboard`` and
``fev.pivot_table`` read), ``fev_summary.json`` (every task x checkpoint: done, resumed, skipped, rejected or
failed, with its reason), ``leaderboard.csv`` (``fev.leaderboard`` against the first checkpoint, when
there are two or more) and ``pairs/TASK/MODEL.json`` (the resume record, :mod:`.pair_records`: a pair whose record
matches the task, the checkpoint's identity and fev's version is not recomputed, nor rejected again by recomputing
it; a checkpoint added later that serves the same tasks joins their run directory and computes only its own
forecasts).

What no run could get past is refused before anything is loaded or Ray is joined (:func:`run_benchmark`): the
checkpoints' names and the output, by the backtest's own checks (``evaluation/up_front.py``), a benchmark
without tasks, a task whose own settings the backtest's model refuses (:mod:`.checks`). A pair whose levels the
checkpoint cannot forecast is skipped like one whose horizon it cannot (docs/fev.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from distributed_onnx import storage
from distributed_onnx.errors import BatchError, ConfigError, DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.checks import check_tasks, levels_reason
from distributed_onnx.evaluation.fev_tasks.fev_import import FEV_VERSION, raised_by_fev
from distributed_onnx.evaluation.fev_tasks.pair_records import REJECTED, SUMMARY, pair_key, plain, read_pair, write_pair
from distributed_onnx.evaluation.fev_tasks.predictions import MissingForecastsError, task_predictions
from distributed_onnx.evaluation.fev_tasks.sources import dataset_location
from distributed_onnx.evaluation.fev_tasks.tasks import (
    TaskData,
    checkpoint_reason,
    context_length,
    merged_origin,
    merged_settings,
    takes_covariates,
    task_data,
    task_id_prefix,
    task_name,
    task_reason,
    task_slug,
)
from distributed_onnx.evaluation.fev_tasks.verdicts import REJECTED as REJECTED_STATUS
from distributed_onnx.evaluation.fev_tasks.verdicts import verdict
from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MODEL_KEY, check_output_folder
from distributed_onnx.evaluation.settings import BacktestSettings, gpu_chain_problem
from distributed_onnx.evaluation.up_front import check_checkpoint_names
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.redact import redact_text, redacted

logger = logging.getLogger(__name__)

#: What happened to a task x checkpoint: computed now, taken from an earlier run's record, skipped (the checkpoint
#: cannot serve the task: its horizon, its levels), ``rejected`` (no rerun gets past it: fix or drop the task) or
#: ``failed`` (a rerun retries it).
STATUSES = ("done", "resumed", "skipped", "rejected", "failed")

SUMMARIES_JSONL = "summaries.jsonl"
SUMMARIES_JSON = "summaries.json"
RUN_SUMMARY = "fev_summary.json"
LEADERBOARD = "leaderboard.csv"


@dataclass
class FevResult:
    """What a fev run wrote: fev's summaries and the state of every task x checkpoint."""

    #: fev's ``evaluation_summary`` of each task x checkpoint done (now or by an earlier run), in task order.
    summaries: list[dict[str, Any]]
    #: One record per task x checkpoint: ``task, model, status`` (:data:`STATUSES`), ``reason``.
    pairs: list[dict[str, Any]]
    output: Location
    #: The pairs that failed (fev could not load the task, parts failed): a rerun retries them.
    failed: list[dict[str, Any]] = field(default_factory=list)
    #: The pairs no rerun can get past (the task's data or windows, refused by this package or by fev; the reason
    #: says which): fix or drop the task.
    rejected: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _RunKey:
    """What tasks must share to be one backtest: the grid step, the context, the covariate columns (name and
    type; known-future then past-only) and the checkpoints, which must serve every task of the run."""

    step_minutes: int
    context_length: int
    known: tuple[tuple[str, str], ...]
    past: tuple[tuple[str, str], ...]
    models: tuple[str, ...]


#: A run's key less its checkpoints: grid step, context, known-future and past-only (name, type) columns.
_Shape = tuple[int, int, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


@dataclass
class _Run:
    """One merged backtest: its key, its tasks (benchmark position, task, slug, data) and checkpoints."""

    key: _RunKey
    checkpoints: tuple[ResolvedCheckpoint, ...]
    tasks: list[tuple[int, Any, str, TaskData]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The run directory's name: the key's grid and context, and a digest of the tasks and covariates
        (not of the checkpoints: one added later that serves the same tasks joins the directory)."""
        covariates = "cov" if self.key.known or self.key.past else "nocov"
        document = [self.key.known, self.key.past, [[slug, task.to_dict()] for _, task, slug, _ in self.tasks]]
        digest = hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return f"r{self.key.step_minutes}-c{self.key.context_length}-{covariates}-{digest}"


def run_fev(
    tasks: Sequence[Any],
    checkpoints: Sequence[ResolvedCheckpoint],
    output: Location,
    settings: dict[str, Any],
    connect: Callable[[], object] = lambda: None,
) -> FevResult:
    """Run every task against every checkpoint; ``settings`` are further backtest settings (``actors``,
    ``rows_per_batch``...). ``connect`` joins or starts Ray, called before the first backtest only: a rerun
    with every pair done starts no Ray. After writing everything, raises :class:`BatchError` if a pair failed (a
    rerun retries it), or a pair was rejected (its line says a rerun rejects it again)."""
    storage.make_dirs(output)
    records: dict[tuple[int, str], dict[str, Any]] = {}
    summaries: dict[tuple[int, str], dict[str, Any]] = {}
    runs: dict[_RunKey, _Run] = {}
    for index, task in enumerate(tasks):
        _plan_task(
            index, task, checkpoints, output, records, summaries, runs, clamp=bool(settings.get("clamp_quantiles"))
        )
    pools = _SetPools()
    try:
        for number, run in enumerate(_set_by_set(runs.values())):
            if number == 0:
                connect()
            _record(run, _execute(run, output, settings, pools), records, summaries)
    finally:
        pools.release()
    order = [(index, each.name) for index in range(len(tasks)) for each in checkpoints]
    done = [summaries[pair] for pair in order if pair in summaries]
    pairs = [records[pair] for pair in order if pair in records]
    failed = [pair for pair in pairs if pair["status"] == "failed"]
    rejected = [pair for pair in pairs if pair["status"] == "rejected"]
    _write_outputs(output, done, pairs, [each.name for each in checkpoints])
    result = FevResult(done, pairs, output, failed, rejected)
    if failed or rejected:
        raise BatchError(_unfinished(failed, rejected, output))
    return result


def _unfinished(failed: list[dict[str, Any]], rejected: list[dict[str, Any]], output: Location) -> str:
    """The one line of a benchmark with failed or rejected pairs: how many, the first of each, what to do (only a
    failed pair is worth a rerun: a rejected one is rejected again)."""
    said, todo = [], []
    for pairs, what, action in (
        (failed, "failed", "rerun to retry the failed ones"),
        (rejected, "rejected", "fix or drop the rejected tasks (a rerun rejects them again)"),
    ):
        if pairs:
            first = pairs[0]
            said.append(
                f"{len(pairs)} task x checkpoint pair(s) {what} (e.g. {first['task']} x {first['model']}: "
                f"{first['reason']})"
            )
            todo.append(action)
    return f"{'; '.join(said)}; the others' summaries are in {output / SUMMARIES_JSONL}; {' and '.join(todo)}"


def _set_by_set(runs: Iterable[_Run]) -> list[_Run]:
    """The runs grouped by their set of checkpoints, in the order each set first appears (each set's runs in
    their own order): one set's runs end before the next set's begin, so its pool can be released then."""
    by_set: dict[tuple[str, ...], list[_Run]] = {}
    for run in runs:
        by_set.setdefault(run.key.models, []).append(run)
    return [run for group in by_set.values() for run in group]


class _SetPools:
    """The actor pool of one set of checkpoints at a time, kept across that set's runs.

    Two sets' pools at once could not share the cluster: by default a pool fills it, and the second set's pool
    waited for room the first one kept (three checkpoints, one of them too short for a task, split the runs in
    two sets: on 2 CPUs the second pool hung). The runs go set by set (:func:`_set_by_set`), so the pool of a
    set no later run uses is released before the next set's pool starts.
    """

    def __init__(self) -> None:
        self._models: tuple[str, ...] | None = None
        self._pool: Any = None

    def for_run(self, models: tuple[str, ...], run_settings: Any) -> Any:
        """The pool of ``models`` (started with this run's settings when the set changes: the last one released)."""
        from distributed_onnx.evaluation.driver.early import kept_pool

        if self._models != models:
            self.release()
            self._pool = kept_pool(run_settings)
            self._models = models
        return self._pool

    def release(self) -> None:
        """Stop the pool held (its actors; Ray too if the pool's thread started it)."""
        pool, self._pool, self._models = self._pool, None, None
        if pool is not None:
            pool.release()


def _record(
    run: _Run,
    outcomes: dict[int, dict[str, dict[str, Any]]],
    records: dict[tuple[int, str], dict[str, Any]],
    summaries: dict[tuple[int, str], dict[str, Any]],
) -> None:
    """The run's outcomes as the pairs' records and summaries (a resumed pair keeps the earlier run's)."""
    for number, task, slug, _ in run.tasks:
        for model, outcome in outcomes.get(number, {}).items():
            if records.get((number, model), {}).get("status") == "resumed":  # the earlier run's summary
                continue
            if SUMMARY in outcome:
                summaries[(number, model)] = outcome[SUMMARY]
                status, why = "done", None
            elif REJECTED in outcome:
                status, why = "rejected", redact_text(outcome[REJECTED])
            else:
                status, why = "failed", redact_text(outcome["reason"])
            base = {"task": task_name(task), "task_dir": slug, "model": model, "status": status}
            records[(number, model)] = base | {"reason": why, "run_dir": outcome["run_dir"]}


def _plan_task(  # noqa: PLR0913 - the planner's state, passed through
    index: int,
    task: Any,
    checkpoints: Sequence[ResolvedCheckpoint],
    output: Location,
    records: dict[tuple[int, str], dict[str, Any]],
    summaries: dict[tuple[int, str], dict[str, Any]],
    runs: dict[_RunKey, _Run],
    *,
    clamp: bool = False,
) -> None:
    """Record what is skipped or resumed of one task; load its data (with fev) and add it to its runs if some
    checkpoint still has to forecast it. ``clamp``: levels outside a checkpoint's range are clamped, not skipped."""
    name, slug = task_name(task), task_slug(index, task)
    reason = task_reason(task)
    serving: list[ResolvedCheckpoint] = []
    for checkpoint in checkpoints:
        base = {"task": name, "task_dir": slug, "model": checkpoint.name}
        why = reason or checkpoint_reason(task, checkpoint.metadata) or levels_reason(task, checkpoint, clamp=clamp)
        if why is not None:
            records[(index, checkpoint.name)] = {**base, "status": "skipped", "reason": why}
            continue
        earlier = read_pair(output, slug, checkpoint.name, pair_key(task, checkpoint))
        if earlier is not None and REJECTED in earlier:  # fev's verdict on this task stands: not recomputed
            records[(index, checkpoint.name)] = {**base, "status": "rejected", "reason": earlier[REJECTED]}
            continue
        serving.append(checkpoint)
        if earlier is not None:
            records[(index, checkpoint.name)] = {**base, "status": "resumed", "reason": None}
            summaries[(index, checkpoint.name)] = earlier[SUMMARY]
    if all((index, each.name) in summaries for each in serving):
        return
    unusable: tuple[str, str] | None = None  # (status, reason)
    try:
        data = task_data(task)
    except Exception as exc:  # rejected (the task's definition or data) or failed (a missing file, no network)
        judged = verdict(exc)
        said = "the task's data cannot be used" if judged == REJECTED_STATUS else "fev could not load the task's data"
        unusable = (judged, f"{said}: {_words(exc, dataset_location(task))}")  # fev's words name its path
    if unusable is not None:
        status, problem = unusable
        for each in serving:
            base = {"task": name, "task_dir": slug, "model": each.name}
            records.setdefault((index, each.name), {**base, "status": status, "reason": problem})
        return
    types = {name: str(values.type) for name, values in data.covariates.items()}
    by_shape: dict[_Shape, list[ResolvedCheckpoint]] = {}
    for each in serving:  # resumed ones too: they share the run (its report compares them) and resume there
        by_shape.setdefault(_shape(task, each, types), []).append(each)
    for shape, members in by_shape.items():
        key = _RunKey(*shape, tuple(each.name for each in members))
        runs.setdefault(key, _Run(key, tuple(members))).tasks.append((index, task, slug, data))


def _shape(task: Any, checkpoint: ResolvedCheckpoint, types: dict[str, str]) -> _Shape:
    """The part of a run's key a task x checkpoint decides: the grid step, the context, the covariate columns
    the checkpoint takes (with their ``types``) known-future then past-only."""
    metadata = checkpoint.metadata
    uses = takes_covariates(task, adapter_for(metadata).supports_covariates, metadata.max_covariates)
    known = tuple((name, types[name]) for name in task.known_dynamic_columns) if uses else ()
    past = tuple((name, types[name]) for name in task.past_dynamic_columns) if uses else ()
    return (metadata.resolution_minutes, context_length(task, metadata), known, past)


def _words(exc: BaseException, location: Location | None = None) -> str:
    """An exception as a pair's reason: its class and its message on one line (a URL's secrets masked, those of
    the task's dataset ``location`` in any form a library quoted them). A library's words are cut at 300
    characters; this package's own (a :class:`DistributedOnnxError`) are sentences written to be read whole, whose
    advice comes last, and are cut only past 600."""
    text = " ".join(str(exc).split())
    cut = 600 if isinstance(exc, DistributedOnnxError) else 300
    return f"{type(exc).__name__}: {(location.scrub(text) if location is not None else redact_text(text))[:cut]}"


def _execute(
    run: _Run, output: Location, settings: dict[str, Any], pools: _SetPools
) -> dict[int, dict[str, dict[str, Any]]]:
    """The run's outcomes, task by task and model by model (``summary``, or the ``reason`` it failed; its
    ``run_dir``). A merged run the backtest refuses (its data or settings, exit 2) is retried as one run per
    task, so that one task's data fails that task alone."""
    if len(run.tasks) == 1:
        return _run_merged(run, output, settings, pools)
    try:
        return _run_merged(run, output, settings, pools, refused_fails=False)
    except DistributedOnnxError as exc:
        if verdict(exc) != REJECTED_STATUS:
            raise
        logger.warning("A merged run of %d fev tasks was refused (%s); running them one by one", len(run.tasks), exc)
        outcomes: dict[int, dict[str, dict[str, Any]]] = {}
        for each in run.tasks:
            outcomes |= _run_merged(_Run(run.key, run.checkpoints, [each]), output, settings, pools)
        return outcomes


def _run_merged(
    run: _Run,
    output: Location,
    settings: dict[str, Any],
    pools: _SetPools,
    refused_fails: bool = True,
) -> dict[int, dict[str, dict[str, Any]]]:
    """One backtest for the run's tasks and checkpoints, then fev's summary of each pair computed now."""
    run_dir = storage.join(output, "runs", run.name)
    try:
        inference_s, batch_error = _backtest(run, output, run_dir, settings, pools)
    except DistributedOnnxError as exc:  # exit 2: the run's data or settings refused
        if verdict(exc) != REJECTED_STATUS or not refused_fails:
            raise
        rejection = {REJECTED: f"the backtest refuses the task: {type(exc).__name__}: {exc}"}
        outcome = {**rejection, "run_dir": str(run_dir)}
        return {number: {each.name: outcome for each in run.checkpoints} for number, *_ in run.tasks}
    return _score(run, output, run_dir, inference_s, batch_error)


def _backtest(
    run: _Run,
    output: Location,
    run_dir: Location,
    settings: dict[str, Any],
    pools: _SetPools,
) -> tuple[float, BatchError | None]:
    """Write the run's input table (once) and run its backtest: the dispatch seconds, and the error if parts
    failed (the tasks whose forecasts are all there are still scored). The run's data or settings refused by
    the backtest raise (exit 2); the environment (storage, Ray) stops the benchmark, as it stops a
    backtest."""
    from distributed_onnx.evaluation.backtest import run_backtest

    key = run.key
    data_path = storage.join(output, "data", f"{run.name}.parquet")
    covariates = bool(key.known or key.past)
    if not storage.is_file(data_path):
        storage.make_dirs(storage.join(output, "data"))
        tables = [
            data.window_table(number, key.context_length, key.step_minutes, covariates)
            for number, *_, data in run.tasks
        ]
        storage.write_parquet(data_path, pa.concat_tables(tables))
    run_tasks = [task for _, task, _, _ in run.tasks]
    given = {
        "progress": False,
        **settings,
        **merged_settings(run_tasks, key.step_minutes, key.context_length),
        "covariates": [name for name, _ in key.known],
        "past_covariates": [name for name, _ in key.past],
        "checkpoint": [each.weights_path for each in run.checkpoints],
        "data": data_path,
        "output": run_dir,
    }
    names = ", ".join(task_name(task) for task in run_tasks)
    run_settings = BacktestSettings.from_sources(given, source=f"fev tasks {names}"[:200])
    pool = pools.for_run(key.models, run_settings)  # started once, its actors kept for every run of these checkpoints
    started = time.perf_counter()
    try:
        result = run_backtest(run_settings, early=pool)
    except DistributedOnnxError as exc:
        if exc.exit_code != BatchError.exit_code:
            raise
        return time.perf_counter() - started, exc if isinstance(exc, BatchError) else BatchError(str(exc))
    timing = result.summary.get("timing") or {}
    return float(timing.get("dispatch_s") or time.perf_counter() - started), None


def _score(
    run: _Run, output: Location, run_dir: Location, inference_s: float, batch_error: BatchError | None
) -> dict[int, dict[str, dict[str, Any]]]:
    """The outcome of each pair of the run not resumed, from the run's forecasts (:func:`_scored`), recorded."""
    key, shown = run.key, str(run_dir)
    covariates = bool(key.known or key.past)
    origin = merged_origin(key.step_minutes, key.context_length)
    origin_us = int(origin.timestamp()) * 1_000_000
    pair_keys = {
        (number, each.name): pair_key(task, each) for number, task, _, _ in run.tasks for each in run.checkpoints
    }
    slugs = {number: slug for number, _, slug, _ in run.tasks}
    earlier = {pair: read_pair(output, slugs[pair[0]], pair[1], key) for pair, key in pair_keys.items()}
    outcomes: dict[int, dict[str, dict[str, Any]]] = {}
    for each in run.checkpoints:
        forecasts = _model_forecasts(run_dir, each.name, origin_us)
        ids = forecasts.column("series_id")
        for number, task, slug, _ in run.tasks:
            outcome = outcomes.setdefault(number, {})
            resumed = earlier[(number, each.name)]
            if resumed is not None:
                outcome[each.name] = {**resumed, "run_dir": shown}
                continue
            # The run's tasks and models share its actors' time: each task gets the run's dispatch time in
            # proportion to its forecast rows; the run's other models computed now share that time too.
            share = pc.sum(pc.starts_with(ids, task_id_prefix(number))).as_py() / max(forecasts.num_rows, 1)
            shared = [o.name for o in run.checkpoints if o.name != each.name and earlier[(number, o.name)] is None]
            extra = {
                "checkpoint": storage.redact(each.weights_path),
                "checkpoint_sha256": each.metadata.sha256,
                "run_dir": shown,
                "inference_time_shared_with": ",".join(shared) or None,
                "run_tasks": len(run.tasks),
                "context_length": key.context_length,
                "covariates_used": covariates,
            }
            scored = _scored(task, number, each.name, forecasts, inference_s * share, extra, batch_error)
            if SUMMARY in scored or REJECTED in scored:
                write_pair(output, slug, each.name, pair_keys[(number, each.name)], scored)
            outcome[each.name] = {**scored, "run_dir": shown}
    return outcomes


def _scored(
    task: Any,
    number: int,
    model: str,
    forecasts: pa.Table,
    inference_s: float,
    extra: dict[str, Any],
    batch_error: BatchError | None,
) -> dict[str, Any]:
    """fev's summary of one task x checkpoint (``{"summary": ...}``), or why there is none: the one boundary
    around fev's scoring, where what goes wrong with one task stays that task's.

    Forecasts missing for some series fev keeps (parts that failed, no observed context) fail the pair
    (``reason``: a rerun runs the parts again). fev refusing the task itself, as it cuts the windows or scores
    them (a cutoff past the data, more windows than the data holds, a target its metrics cannot use), rejects
    the pair (``rejected``: recorded, so a rerun does not forecast the task again to be refused the same way).
    Anything else raised here, with no fev frame on its traceback, is a bug of ours and ends the run (exit 4).
    """
    try:
        predictions = task_predictions(task, number, forecasts)
        summary = task.evaluation_summary(predictions, model_name=model, inference_time_s=inference_s, extra_info=extra)
    except Exception as exc:
        if not isinstance(exc, MissingForecastsError) and not raised_by_fev(exc):
            raise
        if verdict(exc) == REJECTED_STATUS:
            return {REJECTED: f"fev rejects the task: {_words(exc)}"}
        reason = _words(exc) if not isinstance(exc, MissingForecastsError) else str(exc)
        return {"reason": f"{reason}; {batch_error}" if batch_error is not None else reason}
    return {SUMMARY: redacted(plain(summary))}  # fev's summary echoes the task's dataset path and name


def _model_forecasts(run_dir: Location, model: str, origin_us: int) -> pa.Table:
    """One model's forecasts at the merged run's origin (the only one it plans)."""
    fs, inner = storage.filesystem(storage.join(run_dir, FORECASTS_DIR, f"{MODEL_KEY}={model}"))
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    origin = pads.field("origin").cast(pa.int64())
    return dataset.to_table(filter=origin == origin_us)


def _write_outputs(
    output: Location, summaries: list[dict[str, Any]], pairs: list[dict[str, Any]], models: list[str]
) -> None:
    summaries, pairs = redacted(summaries), redacted(pairs)  # summaries an earlier version wrote, too
    lines = "".join(json.dumps(summary) + "\n" for summary in summaries)
    storage.write_bytes(storage.join(output, SUMMARIES_JSONL), lines.encode())
    storage.write_bytes(storage.join(output, SUMMARIES_JSON), json.dumps(summaries).encode())
    counts = {status: sum(p["status"] == status for p in pairs) for status in STATUSES}
    document: dict[str, Any] = {"fev_version": FEV_VERSION, "models": models, "pairs": pairs, "counts": counts}
    names = {summary["model_name"] for summary in summaries}
    if len(names) >= 2 and summaries:
        try:
            served = [summary["model_name"] for summary in summaries]
            baseline = max(models, key=served.count)  # fev needs the baseline on every task; the first of the most
            board = _leaderboard(summaries, baseline=baseline)
        except (DistributedOnnxError, ValueError, KeyError) as exc:
            document["leaderboard_error"] = redact_text(f"{type(exc).__name__}: {exc}")
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
    output: LocationLike,
    settings: dict[str, Any],
    connect: Callable[[], object] | None = None,
) -> FevResult:
    """:func:`run_fev` from what a user gives: a benchmark (see :func:`~.tasks.load_tasks`) and checkpoint paths.

    ``connect`` (default: join ``settings['address']`` or start the embedded Ray) runs before the first
    backtest; Ray stays up across the tasks' runs."""
    from distributed_onnx.evaluation.fev_tasks.tasks import load_tasks
    from distributed_onnx.model.checkpoint import LocalCheckpoint, checkpoint_paths, local_checkpoint
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    fixed = sorted(TASK_SETTINGS & set(settings))
    if fixed:
        raise ConfigError(f"settings {fixed} are decided by each fev task: drop them", key=fixed[0])
    given = [local_checkpoint(path, "--checkpoint") for path in (list(checkpoints) or [REFERENCE_CHECKPOINT])]
    try:
        paths = checkpoint_paths(given)  # as backtest --checkpoint takes them: a folder is every checkpoint in it
    except ValueError as exc:  # a folder that holds no checkpoint
        raise ConfigError(str(exc), key="checkpoint") from exc
    check_checkpoint_names(paths)  # the backtest's own refusals, before anything is loaded or started
    check_output_folder(Location.parse(output))
    shared = BacktestSettings.from_sources({**settings, "output": output}, source="the benchmark's settings")
    gpu_chain = gpu_chain_problem(shared.providers, shared.gpus_per_actor)  # every run's pool would refuse it
    if gpu_chain is not None:
        raise ConfigError(gpu_chain, key="providers")
    tasks = load_tasks(benchmark)
    check_tasks(tasks, output, settings)
    resolved = [LocalCheckpoint(path=path).resolve() for path in paths]
    address = settings.get("address")
    return run_fev(tasks, resolved, Location.parse(output), settings, connect=connect or (lambda: _join_ray(address)))


def _join_ray(address: str | None) -> None:
    """Ray for the benchmark, with SIGTERM left to this process: it exits through the interpreter (its exit
    handlers stop the actors and Ray), as a backtest does, instead of printing Ray's C++ stack dump (a killed
    ``fev`` did). Ray's start keeps its hands off the handler (and the driver's core worker goes without Ray's
    failure-signal handler), and the one set before it is set again after."""
    import signal
    import threading

    from distributed_onnx.runtime import ray_private  # imports Ray: only once a backtest is to run
    from distributed_onnx.runtime.early_start import exit_on_sigterm
    from distributed_onnx.runtime.local_ray import connect

    exit_on_sigterm()
    handler = signal.getsignal(signal.SIGTERM)
    with ray_private.keep_signal_handlers():
        connect(address)
    if threading.current_thread() is threading.main_thread() and callable(handler):
        signal.signal(signal.SIGTERM, handler)
