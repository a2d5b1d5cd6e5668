"""The plan stage: the checkpoints and the dataset -> one frozen :class:`RunPlan` (no Ray).

The plan counts windows per series (never holds them) and cuts the run's window sequence into parts; its
fingerprint covers everything that decides a part's content, so a rerun on the same directory plans the same
parts and can trust those already written. It reads the data only through the :class:`~..dataset.Dataset`
and the run directory only for the part sizes a rerun must keep (:func:`~._part_count.recorded_part_size`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.data.layout import FlatSeries, SeriesTable
from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX, VintagedCovariates
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan, WindowSpec
from distributed_onnx.evaluation.dataset import Dataset
from distributed_onnx.evaluation.fans import fan_series
from distributed_onnx.evaluation.grouping import GroupedWindows
from distributed_onnx.evaluation.outputs import MANIFEST
from distributed_onnx.evaluation.part_messages import PartJob
from distributed_onnx.evaluation.planning._checkpoints import Checkpoints
from distributed_onnx.evaluation.planning._part_count import (
    LEGACY_ROWS_PER_BATCH,
    MANIFEST_KEY,
    RAMP_KEY,
    ROWS_KEY,
    batch_cap,
    default_ramp_width,
    default_rows_per_batch,
    default_windows_per_part,
    plan_parts,
    planning_actors,
    recorded_part_size,
)
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.identity import CheckpointIdentity
from distributed_onnx.model.quantiles import ClampedLevel

logger = logging.getLogger(__name__)

#: Bumped when the layout of parts or window ids changes, so an old run directory is never resumed into.
PART_FORMAT = 3


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """A validated run: the settings, the checkpoints, the data, the fingerprints and the part sizes.

    ``model_fingerprints`` maps each model's name to what its forecast parts must carry to count as done (the
    run's fingerprint, its name and its identity's digest), so a checkpoint added to a finished run computes
    only its own forecasts. What the checkpoints fix (the windows' shape, the levels, the season) is read
    through :attr:`models`, what the data holds through :attr:`dataset`; the properties below name both.
    """

    settings: BacktestSettings
    models: Checkpoints
    dataset: Dataset
    window_fingerprint: str
    run_fingerprint: str
    model_fingerprints: dict[str, str]
    windows_per_part: int
    #: Parts of each ramp size (:func:`~._part_count.plan_parts`): one per actor by default, 1 with explicit sizes.
    ramp_width: int
    #: Windows per model call: as set, else the plan's default (:func:`~._part_count.default_rows_per_batch`).
    rows_per_batch: int
    #: What the run adapted and left out, logged as it is planned and kept in summary.json.
    notes: list[str]
    #: The settings the run's fingerprint digests (:func:`fingerprinted_settings`), kept in ``run.json`` so that a
    #: rerun of other settings is refused naming each one that differs, with both values.
    fingerprinted: dict[str, Any] = field(default_factory=dict)

    # What the checkpoints fix ------------------------------------------------------------------------------

    @property
    def checkpoints(self) -> list[ResolvedCheckpoint]:
        return self.models.checkpoints

    @property
    def checkpoint(self) -> ResolvedCheckpoint:
        """The first checkpoint: its fans are drawn."""
        return self.models.first

    @property
    def spec(self) -> WindowSpec:
        return self.models.spec

    @property
    def quantiles(self) -> list[float]:
        return self.models.quantiles

    @property
    def clamped(self) -> list[ClampedLevel]:
        return self.models.clamped

    @property
    def seasonality(self) -> int:
        return self.models.seasonality

    @property
    def in_sample_end_us(self) -> int | None:
        return self.models.in_sample_end_us

    @property
    def identities(self) -> dict[str, CheckpointIdentity]:
        return self.models.identities

    @property
    def step_us(self) -> int:
        return self.models.resolution_minutes * 60_000_000

    # What the data holds -----------------------------------------------------------------------------------

    @property
    def table(self) -> SeriesTable:
        return self.dataset.table

    @property
    def windows(self) -> WindowPlan:
        return self.dataset.windows

    @property
    def roles(self) -> CovariateRoles | None:
        return self.dataset.roles

    @property
    def grouping(self) -> GroupedWindows | None:
        return self.dataset.grouping

    @property
    def vintaged(self) -> VintagedCovariates | None:
        return self.dataset.vintaged

    # What the plan decided ---------------------------------------------------------------------------------

    @property
    def realized_models(self) -> list[str]:
        """The ``NAME@realized`` twins of ``--compare-realized``."""
        return [name for name in self.model_fingerprints if name.endswith(REALIZED_SUFFIX)]

    @property
    def model_names(self) -> list[str]:
        return list(self.model_fingerprints)

    def model_records(self) -> dict[str, dict[str, Any]]:
        """``summary.json``'s ``models``: each checkpoint's file, digest, fingerprint and identity, and a variant's
        parent and quantization as its metadata says them: what :func:`~..scoring.variants.variant_verdicts`
        reads, in the report and in ``tune``'s accuracy gate alike."""
        records = {}
        for checkpoint in self.checkpoints:
            metadata = checkpoint.metadata
            record: dict[str, Any] = {
                "checkpoint": str(checkpoint.weights_path),
                "sha256": metadata.sha256,
                "fingerprint": self.model_fingerprints[checkpoint.name],
                "identity": self.identities[checkpoint.name].record(),
            }
            if metadata.parent is not None:
                record["parent"] = metadata.parent.model_dump()
            if metadata.quantization is not None:
                record["quantization"] = metadata.quantization.model_dump(exclude_none=True)
            records[checkpoint.name] = record
        return records

    def part_sizes(self) -> dict[str, int]:
        """What ``run.json`` records of the part and batch sizes, so that a rerun (on any cluster) plans the same
        parts (:func:`~._part_count.recorded_part_size`)."""
        return {MANIFEST_KEY: self.windows_per_part, RAMP_KEY: self.ramp_width, ROWS_KEY: self.rows_per_batch}

    def parts(self) -> list[PartSpec]:
        """The run's parts: ``windows_per_part`` each after a ramp up from one model batch (whole groups each,
        with ``--group-by``)."""
        if self.grouping is not None:
            return self.grouping.parts(self.windows_per_part)
        return plan_parts(self.windows, self.windows_per_part, self.rows_per_batch, self.ramp_width)

    def job(self, source: SeriesSource, overlap_packing: bool | None = None) -> PartJob:
        """What every actor of this run needs, built once and sent once per actor."""
        return PartJob(
            source=source,
            plan=self.windows,
            spec=self.spec,
            quantiles=tuple(self.quantiles),
            run_fingerprint=self.run_fingerprint,
            window_fingerprint=self.window_fingerprint,
            output=self.settings.output.absolute(),  # the actors' working folder is their node's, not ours
            seasonality=self.seasonality,
            step_us=self.step_us,
            rows_per_batch=self.rows_per_batch,
            models=tuple(self.model_fingerprints.items()),
            fan_series=fan_series(len(self.table.series)),
            overlap_packing=overlap_packing,
            roles=self.roles,
            grouping=self.grouping,
            vintaged=self.vintaged,
            in_sample_end_us=self.in_sample_end_us,
            include_in_sample=self.settings.include_in_sample,
        )


def plan(settings: BacktestSettings, models: Checkpoints, dataset: Dataset) -> RunPlan:
    """The run's fingerprints and parts, from its checkpoints and its data (read once, by the load stage)."""
    spec, roles = models.spec, dataset.roles
    if dataset.windows.planned == 0:
        raise _nothing_to_evaluate(dataset.windows, spec, dataset.table, models.resolution_minutes)
    notes = models.notes + _plan_notes(dataset.windows, spec) + models.clamp_notes
    for note in notes:
        logger.warning("%s", note)
    # Window ids and the run's fingerprint do not depend on the checkpoints: every model of a run shares the
    # windows, and a checkpoint added later joins the same run directory.
    window_config = {
        "context_length": spec.context_length,
        "horizon": spec.horizon,
        "quantiles": models.quantiles,
        "covariates": settings.covariates,
    }
    # Only when given, so that the fingerprints (and window ids) of runs without them stay what they were.
    if settings.past_covariates:
        window_config["past_covariates"] = settings.past_covariates
    if roles is not None and any(roles.categorical):
        window_config["categorical"] = list(roles.categorical)
    if settings.group_by is not None:
        window_config["group_by"] = [settings.group_by, settings.max_group_size]
    # The vintages enter the run's fingerprint, not the window ids: a window is the same window with or without.
    vintage_config: dict[str, Any] = {}
    if dataset.vintages_sha256 is not None:
        vintage_config = {
            "covariate_data_sha256": dataset.vintages_sha256,
            "vintaged": list(dataset.vintaged_names),
            "covariate_latency": settings.covariate_latency,
        }
    if models.in_sample_end_us is not None:
        vintage_config["in_sample"] = [models.in_sample_end_us, settings.include_in_sample]
    run_config = {
        **window_config,
        **vintage_config,
        "data_sha256": dataset.sha256,
        "spec": spec.model_dump(),
        "seasonality": models.seasonality,
        "part_format": PART_FORMAT,
    }
    windows_per_part, ramp_width, rows_per_batch, run_fingerprint = _part_size(
        settings, models, dataset.windows.planned, run_config
    )
    return RunPlan(
        settings=settings,
        models=models,
        dataset=dataset,
        window_fingerprint=_digest(window_config),
        run_fingerprint=run_fingerprint,
        model_fingerprints=_model_fingerprints(run_fingerprint, models.identities, settings.compare_realized),
        windows_per_part=windows_per_part,
        ramp_width=ramp_width,
        rows_per_batch=rows_per_batch,
        notes=notes,
        fingerprinted=fingerprinted_settings(run_config, windows_per_part, ramp_width, rows_per_batch),
    )


def _model_fingerprints(
    run_fingerprint: str, identities: dict[str, CheckpointIdentity], compare_realized: bool
) -> dict[str, str]:
    """What each model's parts must carry to count as done: the run's fingerprint, the model's name and its
    identity's digest (the graph and every metadata field that changes an output:
    :mod:`distributed_onnx.model.identity`), never the graph alone; with ``compare_realized``, each model's twin
    on the realized covariates too."""
    fingerprints = {
        name: _digest({"run": run_fingerprint, "model": name, "identity": identity.digest})
        for name, identity in identities.items()
    }
    if compare_realized:
        fingerprints |= {f"{name}{REALIZED_SUFFIX}": _digest({"realized_of": f}) for name, f in fingerprints.items()}
    return fingerprints


def _graph_bytes(checkpoint: ResolvedCheckpoint) -> int:
    """The graph's size on disk (with its external weights, if any): the cost proxy of :func:`batch_cap`."""
    path = Path(checkpoint.weights_path)
    sizes = [each.stat().st_size for each in (path, path.with_name(path.name + ".data")) if each.is_file()]
    return sum(sizes)


def fingerprinted_settings(
    run_config: dict[str, Any], windows_per_part: int, ramp_width: int, rows: int
) -> dict[str, Any]:
    """Everything the run's fingerprint digests: the windows, levels, data and covariates, and the part sizes."""
    # Only a wide ramp enters the fingerprint: a plan of explicit sizes keeps the fingerprint it had.
    wide = {"ramp_width": ramp_width} if ramp_width > 1 else {}
    return {**run_config, "rows_per_batch": rows, "windows_per_part": windows_per_part, **wide}


def _run_fingerprint(run_config: dict[str, Any], windows_per_part: int, ramp_width: int, rows: int) -> str:
    return _digest(fingerprinted_settings(run_config, windows_per_part, ramp_width, rows))


def _part_size(
    settings: BacktestSettings, models: Checkpoints, planned: int, run_config: dict[str, Any]
) -> tuple[int, int, int, str]:
    """``(windows per part, ramp width, rows per batch, run fingerprint)``: as set (a ramp of one); else the plan
    of the run directory's manifest: its recorded sizes, else whichever default gives its fingerprint (today's
    for these actors, or one of before the sizes were recorded: batches of 256, parts for these actors or about
    64 of them); else the default for the run's windows, actors and graph (:mod:`._part_count`). A rerun so
    plans the parts it resumes, whatever its cluster."""
    cap = min(batch_cap(_graph_bytes(each), models.spec.context_length) for each in models.checkpoints)
    actors = planning_actors(settings.actors, settings.address, settings.cpus_per_actor, settings.gpus_per_actor)
    gpu_actors = settings.gpus_per_actor > 0
    set_rows = settings.rows_per_batch

    def default(rows: int) -> tuple[int, int, int]:
        if settings.windows_per_part is not None:
            return settings.windows_per_part, 1, rows
        size = default_windows_per_part(planned, rows, actors, gpu_actors=gpu_actors)
        return size, default_ramp_width(actors) if size > rows else 1, rows  # no ramp: width 1

    rows = set_rows or default_rows_per_batch(planned, actors, cap, gpu_actors=gpu_actors)
    if settings.windows_per_part is not None and set_rows is None:
        rows = min(rows, settings.windows_per_part)
    chosen = default(rows)
    candidates = [chosen]
    recorded = recorded_part_size(settings.output, MANIFEST)
    if recorded is not None:
        legacy = set_rows or LEGACY_ROWS_PER_BATCH
        if recorded.windows_per_part and settings.windows_per_part is None:
            candidates.insert(0, (recorded.windows_per_part, recorded.ramp_width, set_rows or recorded.rows_per_batch))
            candidates.append((recorded.windows_per_part, recorded.ramp_width, legacy))
        if recorded.rows_per_batch and set_rows is None:  # e.g. an explicit part size with the batch recorded
            candidates.append(default(recorded.rows_per_batch))
        candidates.append(default(legacy))
        if settings.windows_per_part is None:
            candidates.append((default_windows_per_part(planned, legacy), 1, legacy))
        for size, width, each_rows in candidates:
            if each_rows and _run_fingerprint(run_config, size, width, each_rows) == recorded.fingerprint:
                return size, width, each_rows, recorded.fingerprint
    size, width, rows = chosen  # a new directory (or another run's: refused, naming it, by its manifest)
    return size, width, rows, _run_fingerprint(run_config, size, width, rows)


def _nothing_to_evaluate(windows: WindowPlan, spec: WindowSpec, table: SeriesTable, step_minutes: int) -> ConfigError:
    """The refusal of a run that plans no window (exit 2, before any part, summary or report is written): what
    the windows asked for against what the series hold. A run of nothing would exit 0 with an empty report."""
    series = table.series
    lengths = series.lengths if isinstance(series, FlatSeries) else np.asarray([one.n_points for one in series])
    starts = table.start_us
    step_us = step_minutes * 60_000_000
    needs = f"a window needs its horizon ({spec.horizon} steps) after its origin and observed context before it"
    needs += f" (up to context_length {spec.context_length}; context + horizon = {spec.context_length + spec.horizon})"
    if len(lengths) == 0:
        return ConfigError(f"no window to evaluate: {table.source} holds no series.", key="data")
    first = _utc(int(starts.min()))
    last = _utc(int((starts + (lengths - 1) * step_us).max()))
    held = f"{len(lengths)} series from {first} to {last}, {int(lengths.min())}..{int(lengths.max())} steps each"
    skipped = (
        f"; {windows.skipped} window(s) left out for too little observed context (min_context_coverage "
        f"{spec.min_context_coverage:g})"
        if windows.skipped
        else ""
    )
    if spec.start_us is not None and spec.end_us is not None:
        return ConfigError(
            f"no window to evaluate: no origin from start {_utc(spec.start_us)} to end {_utc(spec.end_us)} has "
            f"a window in the data ({held}; {needs}){skipped}. Give a start/end inside the data, or a number of "
            "windows.",
            key="start",
        )
    return ConfigError(
        f"no window to evaluate: {needs}, and the data holds {held}{skipped}. Give longer series, or a shorter "
        "horizon.",
        key="n_windows",
    )


def _utc(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plan_notes(windows: WindowPlan, spec: WindowSpec) -> list[str]:
    notes = []
    if windows.capped:
        examples = ", ".join(repr(series_id) for series_id in windows.capped_series)
        notes.append(
            f"n_windows {spec.n_windows} is more than the data allows: {windows.capped} window(s) were left out "
            f"because they would start before their series' history (e.g. series {examples})"
        )
    return notes


def _digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:16]
