"""fev's scoring of a merged run's forecasts: each pair's summary by fev's own ``Task.evaluation_summary``, or why
there is none.

Apart from the runner because it is the one boundary around fev's scoring (:func:`scored_pair`): what goes
wrong with one task there stays that task's, and what fev refuses is recorded (:mod:`.pair_records`) so that a
rerun does not forecast the task again. It reads the run's forecasts from its directory; it starts nothing.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation.fev_tasks.fev_import import raised_by_fev
from distributed_onnx.evaluation.fev_tasks.pair_records import REJECTED, SUMMARY, pair_key, plain, read_pair, write_pair
from distributed_onnx.evaluation.fev_tasks.predictions import MissingForecastsError, RunTask, task_predictions
from distributed_onnx.evaluation.fev_tasks.reasons import pair_reason
from distributed_onnx.evaluation.fev_tasks.run_plan import Run
from distributed_onnx.evaluation.fev_tasks.tasks import merged_origin, task_id_prefix
from distributed_onnx.evaluation.fev_tasks.verdicts import REJECTED as REJECTED_STATUS
from distributed_onnx.evaluation.fev_tasks.verdicts import verdict
from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MODEL_KEY
from distributed_onnx.location import Location
from distributed_onnx.redact import redacted


def score_run(
    run: Run, output: Location, run_dir: Location, inference_s: float, batch_error: BatchError | None
) -> dict[int, dict[str, dict[str, Any]]]:
    """The outcome of each pair of the run not resumed, from the run's forecasts (:func:`scored_pair`), recorded."""
    key, shown = run.key, str(run_dir)
    covariates = bool(key.known or key.past)
    origin = merged_origin(key.step_minutes, key.context_length)
    origin_us = int(origin.timestamp()) * 1_000_000
    pair_keys = {
        (number, each.name): pair_key(task, each) for number, task, _, _ in run.tasks for each in run.checkpoints
    }
    slugs = {number: slug for number, _, slug, _ in run.tasks}
    scored_tasks = {number: RunTask(task, number) for number, task, _, _ in run.tasks}  # shared by the checkpoints
    earlier = {pair: read_pair(output, slugs[pair[0]], pair[1], key) for pair, key in pair_keys.items()}
    outcomes: dict[int, dict[str, dict[str, Any]]] = {}
    for each in run.checkpoints:
        forecasts = _model_forecasts(run_dir, each.name, origin_us)
        ids = forecasts.column("series_id")
        for number, _, slug, _ in run.tasks:
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
            scored = scored_pair(scored_tasks[number], each.name, forecasts, inference_s * share, extra, batch_error)
            if SUMMARY in scored or REJECTED in scored:
                write_pair(output, slug, each.name, pair_keys[(number, each.name)], scored)
            outcome[each.name] = {**scored, "run_dir": shown}
    return outcomes


def scored_pair(
    run_task: RunTask,
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
        predictions = task_predictions(run_task, forecasts)
        summary = run_task.task.evaluation_summary(
            predictions, model_name=model, inference_time_s=inference_s, extra_info=extra
        )
    except Exception as exc:
        if not isinstance(exc, MissingForecastsError) and not raised_by_fev(exc):
            raise
        if verdict(exc) == REJECTED_STATUS:
            return {REJECTED: f"fev rejects the task: {pair_reason(exc)}"}
        reason = pair_reason(exc) if not isinstance(exc, MissingForecastsError) else str(exc)
        return {"reason": f"{reason}; {batch_error}" if batch_error is not None else reason}
    return {SUMMARY: redacted(plain(summary))}  # fev's summary echoes the task's dataset path and name


def _model_forecasts(run_dir: Location, model: str, origin_us: int) -> pa.Table:
    """One model's forecasts at the merged run's origin (the only one it plans)."""
    fs, inner = storage.filesystem(storage.join(run_dir, FORECASTS_DIR, f"{MODEL_KEY}={model}"))
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    origin = pads.field("origin").cast(pa.int64())
    return dataset.to_table(filter=origin == origin_us)
