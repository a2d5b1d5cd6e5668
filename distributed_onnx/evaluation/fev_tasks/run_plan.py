"""The plan of a fev benchmark: which task x checkpoint pairs are skipped, resumed or rejected already, and the
merged backtests (*runs*) the others are forecast in.

Apart from the runner (:mod:`.runner`, which starts the pools and runs the backtests) so that what decides a
run's membership, its directory's name and the order the runs go in is read and tested without Ray or ONNX
Runtime: tasks share a run when their checkpoints share a grid step, a context length and the same covariate
columns (names and types), and the same set of checkpoints can serve them (:class:`RunKey`). Planning reads
only the earlier runs' pair records (:mod:`.pair_records`) and the task's data, with fev.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distributed_onnx.evaluation.fev_tasks.checks import levels_reason
from distributed_onnx.evaluation.fev_tasks.pair_records import REJECTED, SUMMARY, pair_key, read_pair
from distributed_onnx.evaluation.fev_tasks.reasons import pair_reason
from distributed_onnx.evaluation.fev_tasks.sources import dataset_location
from distributed_onnx.evaluation.fev_tasks.tasks import (
    TaskData,
    checkpoint_reason,
    context_length,
    takes_covariates,
    task_data,
    task_name,
    task_reason,
    task_slug,
)
from distributed_onnx.evaluation.fev_tasks.verdicts import REJECTED as REJECTED_STATUS
from distributed_onnx.evaluation.fev_tasks.verdicts import verdict
from distributed_onnx.location import Location
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import ResolvedCheckpoint


@dataclass(frozen=True)
class RunKey:
    """What tasks must share to be one backtest: the grid step, the context, the covariate columns (name and
    type; known-future then past-only) and the checkpoints, which must serve every task of the run."""

    step_minutes: int
    context_length: int
    known: tuple[tuple[str, str], ...]
    past: tuple[tuple[str, str], ...]
    models: tuple[str, ...]


#: A run's key less its checkpoints: grid step, context, known-future and past-only (name, type) columns.
Shape = tuple[int, int, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


@dataclass
class Run:
    """One merged backtest: its key, its tasks (benchmark position, task, slug, data) and checkpoints."""

    key: RunKey
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


def set_by_set(runs: Iterable[Run]) -> list[Run]:
    """The runs grouped by their set of checkpoints, in the order each set first appears (each set's runs in
    their own order): one set's runs end before the next set's begin, so its pool can be released then."""
    by_set: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        by_set.setdefault(run.key.models, []).append(run)
    return [run for group in by_set.values() for run in group]


def plan_task(  # noqa: PLR0913 - the planner's state, passed through
    index: int,
    task: Any,
    checkpoints: Sequence[ResolvedCheckpoint],
    output: Location,
    records: dict[tuple[int, str], dict[str, Any]],
    summaries: dict[tuple[int, str], dict[str, Any]],
    runs: dict[RunKey, Run],
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
        unusable = (judged, f"{said}: {pair_reason(exc, dataset_location(task))}")  # fev's words name its path
    if unusable is not None:
        status, problem = unusable
        for each in serving:
            base = {"task": name, "task_dir": slug, "model": each.name}
            records.setdefault((index, each.name), {**base, "status": status, "reason": problem})
        return
    types = {name: str(values.type) for name, values in data.covariates.items()}
    by_shape: dict[Shape, list[ResolvedCheckpoint]] = {}
    for each in serving:  # resumed ones too: they share the run (its report compares them) and resume there
        by_shape.setdefault(run_shape(task, each, types), []).append(each)
    for shape, members in by_shape.items():
        key = RunKey(*shape, tuple(each.name for each in members))
        runs.setdefault(key, Run(key, tuple(members))).tasks.append((index, task, slug, data))


def run_shape(task: Any, checkpoint: ResolvedCheckpoint, types: dict[str, str]) -> Shape:
    """The part of a run's key a task x checkpoint decides: the grid step, the context, the covariate columns
    the checkpoint takes (with their ``types``) known-future then past-only."""
    metadata = checkpoint.metadata
    uses = takes_covariates(task, adapter_for(metadata).supports_covariates, metadata.max_covariates)
    known = tuple((name, types[name]) for name in task.known_dynamic_columns) if uses else ()
    past = tuple((name, types[name]) for name in task.past_dynamic_columns) if uses else ()
    return (metadata.resolution_minutes, context_length(task, metadata), known, past)
