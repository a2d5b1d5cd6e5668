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
released before the next set's starts (:class:`_SetPools`). Which pairs are skipped or resumed and which runs
the others make is planned apart (:mod:`.run_plan`), as are fev's scoring of a run's forecasts
(:mod:`.pair_scoring`) and the files written at the end (:mod:`.summary_files`): this module runs them.

What goes wrong with one task stays that task's. A pair ends ``failed`` where a rerun may get past it (fev could
not load the task's data: a missing file, no network; parts of its run failed) and ``rejected`` where no rerun
can, the reason saying who refused what: the task's data that cannot be laid out as a backtest's (a target of
letters), the backtest refusing the task's data (a merged run the backtest refuses is rerun task by task, so the
task at fault is rejected alone), or fev refusing the task's windows or data where it scores them
(:func:`~.pair_scoring.scored_pair`, the one boundary around fev's scoring; fev's verdict is recorded, so a rerun
does not forecast the task again).

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

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import BatchError, ConfigError, DistributedOnnxError
from distributed_onnx.evaluation.fev_tasks.checks import check_tasks
from distributed_onnx.evaluation.fev_tasks.pair_records import REJECTED, SUMMARY
from distributed_onnx.evaluation.fev_tasks.pair_scoring import score_run
from distributed_onnx.evaluation.fev_tasks.reasons import unfinished_line
from distributed_onnx.evaluation.fev_tasks.run_plan import Run, RunKey, plan_task, set_by_set
from distributed_onnx.evaluation.fev_tasks.summary_files import write_outputs
from distributed_onnx.evaluation.fev_tasks.tasks import merged_settings, task_name
from distributed_onnx.evaluation.fev_tasks.verdicts import REJECTED as REJECTED_STATUS
from distributed_onnx.evaluation.fev_tasks.verdicts import verdict
from distributed_onnx.evaluation.output_checks import check_output_folder, check_output_reachable
from distributed_onnx.evaluation.settings import BacktestSettings, gpu_chain_problem
from distributed_onnx.evaluation.up_front import check_checkpoint_names
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.redact import redact_text

logger = logging.getLogger(__name__)


@dataclass
class FevResult:
    """What a fev run wrote: fev's summaries and the state of every task x checkpoint."""

    #: fev's ``evaluation_summary`` of each task x checkpoint done (now or by an earlier run), in task order.
    summaries: list[dict[str, Any]]
    #: One record per task x checkpoint: ``task, model, status`` (:data:`~.summary_files.STATUSES`), ``reason``.
    pairs: list[dict[str, Any]]
    output: Location
    #: The pairs that failed (fev could not load the task, parts failed): a rerun retries them.
    failed: list[dict[str, Any]] = field(default_factory=list)
    #: The pairs no rerun can get past (the task's data or windows, refused by this package or by fev; the reason
    #: says which): fix or drop the task.
    rejected: list[dict[str, Any]] = field(default_factory=list)


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
    runs: dict[RunKey, Run] = {}
    for index, task in enumerate(tasks):
        plan_task(
            index, task, checkpoints, output, records, summaries, runs, clamp=bool(settings.get("clamp_quantiles"))
        )
    pools = _SetPools()
    try:
        for number, run in enumerate(set_by_set(runs.values())):
            if number == 0:
                _warm_report_process()
                connect()
            _record(run, _execute(run, output, settings, pools), records, summaries)
    finally:
        pools.release()
    order = [(index, each.name) for index in range(len(tasks)) for each in checkpoints]
    done = [summaries[pair] for pair in order if pair in summaries]
    pairs = [records[pair] for pair in order if pair in records]
    failed = [pair for pair in pairs if pair["status"] == "failed"]
    rejected = [pair for pair in pairs if pair["status"] == "rejected"]
    write_outputs(output, done, pairs, [each.name for each in checkpoints])
    result = FevResult(done, pairs, output, failed, rejected)
    if failed or rejected:
        raise BatchError(unfinished_line(failed, rejected, output))
    return result


def _warm_report_process() -> None:
    """Start the report process the runs draw their reports with, once the plan shows a run to make, and leave it
    warm for the first run (:func:`~distributed_onnx.evaluation.driver.report_process.warm_report_process`).

    Its imports (scipy, matplotlib) then run while Ray starts and the first pool's actors load their models, where
    the driver waits, rather than beside the first run's last parts, where they took a core from the actors. A
    child that cannot start is the first run's to start again or do without, as for a backtest."""
    from distributed_onnx.evaluation.driver.report_process import warm_report_process

    try:
        warm_report_process().release()
    except OSError as exc:
        logger.warning("Could not start the report process early (%s)", exc)


class _SetPools:
    """The actor pool of one set of checkpoints at a time, kept across that set's runs.

    Two sets' pools at once could not share the cluster: by default a pool fills it, and the second set's pool
    waited for room the first one kept (three checkpoints, one of them too short for a task, split the runs in
    two sets: on 2 CPUs the second pool hung). The runs go set by set (:func:`~.run_plan.set_by_set`), so the pool of a
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
    run: Run,
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


def _execute(
    run: Run, output: Location, settings: dict[str, Any], pools: _SetPools
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
            outcomes |= _run_merged(Run(run.key, run.checkpoints, [each]), output, settings, pools)
        return outcomes


def _run_merged(
    run: Run,
    output: Location,
    settings: dict[str, Any],
    pools: _SetPools,
    refused_fails: bool = True,
) -> dict[int, dict[str, dict[str, Any]]]:
    """One backtest for the run's tasks and checkpoints, then fev's summary of each pair computed now."""
    run_dir = storage.join(output, "runs", run.name)
    early = _ScoredWhileDrawn(run, output, run_dir)
    try:
        inference_s, batch_error = _backtest(run, output, run_dir, settings, pools, early)
    except DistributedOnnxError as exc:  # exit 2: the run's data or settings refused
        if verdict(exc) != REJECTED_STATUS or not refused_fails:
            raise
        rejection = {REJECTED: f"the backtest refuses the task: {type(exc).__name__}: {exc}"}
        outcome = {**rejection, "run_dir": str(run_dir)}
        return {number: {each.name: outcome for each in run.checkpoints} for number, *_ in run.tasks}
    if early.error is not None:
        raise early.error
    if early.outcomes is not None and batch_error is None:
        return early.outcomes
    return score_run(run, output, run_dir, inference_s, batch_error)


class _ScoredWhileDrawn:
    """fev's scoring of a run, done while the backtest's report process draws the run's report.

    Scoring is the driver's work and the report the child's: one after the other they left a core idle at the
    end of every run, on the user's clock. The backtest calls :meth:`score` once the run's parts are done (before
    summary.json); a run whose parts failed is scored again after (:func:`score_run` then names the failure in
    the pairs it fails). What scoring raises is raised once the backtest has written everything, as before.
    """

    def __init__(self, run: Run, output: Location, run_dir: Location) -> None:
        self._run, self._output, self._run_dir = run, output, run_dir
        self.outcomes: dict[int, dict[str, dict[str, Any]]] | None = None
        self.error: Exception | None = None

    def score(self, inference_s: float) -> None:
        """Score the run's pairs (``inference_s``: the run's dispatch seconds, which its pairs share)."""
        try:
            self.outcomes = score_run(self._run, self._output, self._run_dir, inference_s, None)
        except Exception as exc:  # a bug of ours (exit 4): raised after the backtest, not in its report stage
            self.error = exc


def _backtest(
    run: Run,
    output: Location,
    run_dir: Location,
    settings: dict[str, Any],
    pools: _SetPools,
    early: _ScoredWhileDrawn,
) -> tuple[float, BatchError | None]:
    """Write the run's input table (once) and run its backtest (``early`` scores it while its report is drawn):
    the dispatch seconds, and the error if parts failed (the tasks whose forecasts are all there are still
    scored). The run's data or settings refused by the backtest raise (exit 2); the environment (storage, Ray)
    stops the benchmark, as it stops a backtest."""
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
        result = run_backtest(
            run_settings,
            early=pool,
            meanwhile=lambda dispatch_s: early.score(dispatch_s or time.perf_counter() - started),
        )
    except DistributedOnnxError as exc:
        if exc.exit_code != BatchError.exit_code:
            raise
        return time.perf_counter() - started, exc if isinstance(exc, BatchError) else BatchError(str(exc))
    timing = result.summary.get("timing") or {}
    return float(timing.get("dispatch_s") or time.perf_counter() - started), None


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
    check_output_reachable(Location.parse(output))
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
