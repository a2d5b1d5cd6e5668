"""The driver's plan of a backtest: settings -> checked checkpoint, data, windows and parts (no Ray).

Everything that can be wrong with the inputs (checkpoint, data, settings) is found here, before any actor
starts, with an error naming the key, the file or the rows. The plan counts windows per series (never holds
them) and cuts the run's window sequence into parts; its fingerprint covers everything that decides a part's
content, so a rerun on the same directory plans the same parts and can trust those already written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, Suggestion, describe_validation
from distributed_onnx.evaluation.data.scan import scan_sorted_parquet
from distributed_onnx.evaluation.data.series_source import SeriesSource, SeriesTransport
from distributed_onnx.evaluation.data.table import SeriesTable, load_series, read_schema
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX, VintagedCovariates, read_vintages
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan, WindowSpec, plan_windows
from distributed_onnx.evaluation.driver.part_count import (
    LEGACY_ROWS_PER_BATCH,
    batch_cap,
    default_ramp_width,
    default_rows_per_batch,
    default_windows_per_part,
    plan_parts,
    planning_actors,
    recorded_part_size,
)
from distributed_onnx.evaluation.driver.up_front import CLAMP, check_checkpoint_names, levels_problem
from distributed_onnx.evaluation.fans import fan_series
from distributed_onnx.evaluation.grouping import GroupedWindows, plan_groups, series_groups
from distributed_onnx.evaluation.outputs import MANIFEST
from distributed_onnx.evaluation.part_messages import PartJob
from distributed_onnx.evaluation.scoring.naive import default_season
from distributed_onnx.evaluation.settings import BacktestSettings, gpu_chain_problem
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.adapters.grouping import supports_groups
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.identity import CheckpointIdentity, identity_of
from distributed_onnx.model.quantiles import ClampedLevel, clamped_levels, describe_clamped
from distributed_onnx.model.worker import check_run_fits_model

logger = logging.getLogger(__name__)

#: The settings that declare covariate columns, as a suggestion names them.
DECLARE_COVARIATES = (("covariates", None), ("past_covariates", None))

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Bumped when the layout of parts or window ids changes, so an old run directory is never resumed into.
PART_FORMAT = 3


@dataclass(frozen=True)
class RunPlan:
    """A validated run: the checkpoints, the data, the resolved window settings and the parts.

    ``checkpoint`` is the first of ``checkpoints`` (its fans are drawn); ``model_fingerprints`` maps each
    checkpoint's name to what its forecast parts must carry to count as done (the run's fingerprint, its name
    and its identity's digest), so a checkpoint added to a finished run computes only its own forecasts.
    """

    settings: BacktestSettings
    checkpoint: ResolvedCheckpoint
    table: SeriesTable
    spec: WindowSpec
    quantiles: list[float]
    seasonality: int
    window_fingerprint: str
    run_fingerprint: str
    windows: WindowPlan
    windows_per_part: int
    notes: list[str] = field(default_factory=list)
    clamped: list[ClampedLevel] = field(default_factory=list)
    checkpoints: list[ResolvedCheckpoint] = field(default_factory=list)
    model_fingerprints: dict[str, str] = field(default_factory=dict)
    #: Which covariate rows are past-only or categorical (None: every covariate is numeric and known-future).
    roles: CovariateRoles | None = None
    #: With ``--group-by``: the run's windows in group-major order (:mod:`..grouping`), else None.
    grouping: GroupedWindows | None = None
    #: Parts of each ramp size (:func:`~.part_count.plan_parts`): one per actor by default, 1 with explicit sizes.
    ramp_width: int = 1
    #: With ``--covariate-data``: the covariate rows and the vintage table some of them come from.
    vintaged: VintagedCovariates | None = None
    #: The latest ``training_data_end`` of the checkpoints (UTC microseconds): windows whose origin is at or
    #: before it are in-sample (scored apart, scope ``in_sample``). None: no checkpoint says.
    in_sample_end_us: int | None = None
    #: Windows per model call: as set, else the plan's default (:func:`~.part_count.default_rows_per_batch`).
    rows_per_batch: int = LEGACY_ROWS_PER_BATCH
    #: Each checkpoint's identity (:mod:`distributed_onnx.model.identity`), by name: recorded in ``run.json``
    #: and compared on resume (:mod:`.identities`).
    identities: dict[str, CheckpointIdentity] = field(default_factory=dict)

    @property
    def realized_models(self) -> list[str]:
        """The ``NAME@realized`` twins of ``--compare-realized``."""
        return [name for name in self.model_fingerprints if name.endswith(REALIZED_SUFFIX)]

    @property
    def model_names(self) -> list[str]:
        return list(self.model_fingerprints)

    @property
    def step_us(self) -> int:
        return self.checkpoint.metadata.resolution_minutes * 60_000_000

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
            output=self.settings.output,
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


def prepare(settings: BacktestSettings) -> RunPlan:
    """Check the checkpoint, the settings and the data, resolve defaults and plan the parts."""
    checkpoints = [LocalCheckpoint(path=path).resolve() for path in settings.checkpoint]
    checkpoint = checkpoints[0]
    metadata = checkpoint.metadata
    horizon, context_length, fit_notes = _shared_shape(checkpoints, settings)
    for each in checkpoints:
        check_run_fits_model(each.metadata, context_length, horizon)
    for each in checkpoints:
        _check_covariates(each, settings.covariate_columns)
        _check_grouping(each, settings.group_by)
    gpu_chain = gpu_chain_problem(settings.providers, settings.gpus_per_actor)
    if gpu_chain is not None:  # refused here, not in every actor
        raise ConfigError(gpu_chain, key="providers")
    quantiles = settings.quantiles or list(metadata.native_quantiles)
    _check_clamping(checkpoints, quantiles, settings.clamp_quantiles)
    seasonality = settings.seasonality or default_season(metadata.resolution_minutes)
    n_windows = settings.n_windows
    if n_windows is None and settings.start is None and settings.end is None:
        n_windows = 1
    try:
        spec = WindowSpec(
            context_length=context_length,
            horizon=horizon,
            n_windows=n_windows,
            stride=settings.stride,
            start_us=_micros(settings.start),
            end_us=_micros(settings.end),
            min_context_coverage=settings.min_context_coverage,
        )
    except ValidationError as exc:
        raise ConfigError(f"Invalid window settings: {describe_validation(exc.errors())}") from exc
    # A large sorted Parquet input is checked in streamed chunks and its values stay in the file (the actors
    # read them): the driver keeps a summary per series. Anything else is read whole, as the object store needs.
    vintaged_names = _vintaged_names(settings)
    table, windows, roles, grouping = _load(settings, metadata.resolution_minutes, spec, vintaged_names)
    vintaged = _vintages(settings, vintaged_names, metadata.resolution_minutes, table)
    notes = fit_notes + _plan_notes(windows, spec)
    clamped = clamped_levels(quantiles, metadata.native_quantiles)
    for each in checkpoints:
        each_clamped = clamped_levels(quantiles, each.metadata.native_quantiles)
        if each_clamped:
            notes.append(f"{each.name}: " + describe_clamped(each_clamped, each.metadata.native_quantiles))
    for note in notes:
        logger.warning("%s", note)
    # Window ids and the run's fingerprint do not depend on the checkpoints: every model of a run shares the
    # windows, and a checkpoint added later joins the same run directory.
    window_config = {
        "context_length": context_length,
        "horizon": horizon,
        "quantiles": quantiles,
        "covariates": settings.covariates,
    }
    # Only when given, so that the fingerprints (and window ids) of runs without them stay what they were.
    if settings.past_covariates:
        window_config["past_covariates"] = settings.past_covariates
    if roles is not None and any(roles.categorical):
        window_config["categorical"] = list(roles.categorical)
    if settings.group_by is not None:
        window_config["group_by"] = [settings.group_by, settings.max_group_size]
    window_fingerprint = _digest(window_config)
    # The vintages enter the run's fingerprint, not the window ids: a window is the same window with or without.
    vintage_config = {}
    if settings.covariate_data is not None:
        vintage_config = {
            "covariate_data_sha256": storage.sha256(settings.covariate_data),
            "vintaged": list(vintaged_names),
            "covariate_latency": settings.covariate_latency,
        }
    ends = in_sample_end(checkpoints)
    if ends is not None:
        vintage_config["in_sample"] = [ends, settings.include_in_sample]
    run_config = {
        **window_config,
        **vintage_config,
        "data_sha256": storage.sha256(settings.data),
        "spec": spec.model_dump(),
        "seasonality": seasonality,
        "part_format": PART_FORMAT,
    }
    cap = min(batch_cap(_graph_bytes(each), context_length) for each in checkpoints)
    windows_per_part, ramp_width, rows_per_batch, run_fingerprint = _part_size(
        settings, windows.planned, run_config, cap
    )
    identities = {each.name: identity_of(each) for each in checkpoints}
    model_fingerprints = _model_fingerprints(run_fingerprint, identities, settings.compare_realized)
    return RunPlan(
        settings,
        checkpoint,
        table,
        spec,
        quantiles,
        seasonality,
        window_fingerprint,
        run_fingerprint,
        windows,
        windows_per_part,
        notes,
        clamped,
        checkpoints,
        model_fingerprints,
        roles,
        grouping,
        ramp_width,
        vintaged,
        in_sample_end(checkpoints),
        rows_per_batch,
        identities,
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


def in_sample_end(checkpoints: list[ResolvedCheckpoint]) -> int | None:
    """The latest ``training_data_end`` of the run's checkpoints: a window in-sample for one model is left out of
    the comparison for all (the models share one set of scored pairs)."""
    ends = [_micros(each.metadata.training_data_end) for each in checkpoints]
    known = [end for end in ends if end is not None]
    return max(known) if known else None


def _shared_shape(checkpoints: list[ResolvedCheckpoint], settings: BacktestSettings) -> tuple[int, int, list[str]]:
    """The horizon and context length every checkpoint of the run is scored on, or a one-line refusal.

    Several checkpoints share the windows (packed once, run each), so they must agree on the grid: a different
    resolution or a duplicate name is refused; different context lengths are refused unless ``context_length``
    is given (then each model gets that history, padded as missing up to its own context); different
    horizons are adapted: the run's default horizon is the shortest one, and the longer models are cut to it.
    """
    check_checkpoint_names([each.weights_path for each in checkpoints])  # as before Ray started (up_front.py)
    resolutions = {each.name: each.metadata.resolution_minutes for each in checkpoints}
    if len(set(resolutions.values())) > 1:
        raise ConfigError(
            f"checkpoints must share one resolution to be compared; got minutes {resolutions}", key="checkpoint"
        )
    contexts = {each.name: each.metadata.context_length for each in checkpoints}
    if settings.context_length is None and len(set(contexts.values())) > 1:
        raise ConfigError(
            f"checkpoints take different context lengths {contexts}: every model of a run sees the same history.",
            key="context_length",
            suggestions=(Suggestion(f"Give {{}} (at most {min(contexts.values())}).", (("context_length", None),)),),
        )
    horizons = {each.name: each.metadata.horizon_length for each in checkpoints}
    notes = []
    if settings.horizon is None and len(set(horizons.values())) > 1:
        notes.append(f"checkpoints emit different horizons {horizons}: every model is scored on the shortest")
    horizon = settings.horizon or min(horizons.values())
    return horizon, settings.context_length or min(contexts.values()), notes


def _check_clamping(checkpoints: list[ResolvedCheckpoint], quantiles: list[float], allowed: bool) -> None:
    """Refuse levels outside a checkpoint's native range unless ``--clamp-quantiles``: a clamped level comes back
    under its own name holding the nearest native level's values, a silent wrong number for whoever reads it."""
    if allowed:
        return
    for each in checkpoints:
        problem = levels_problem(each.name, quantiles, each.metadata)
        if problem is not None:
            raise ConfigError(f"{problem}. Request levels inside it.", key="quantiles", suggestions=(CLAMP,))


def _check_covariates(checkpoint: ResolvedCheckpoint, covariates: list[str]) -> None:
    metadata = checkpoint.metadata
    # Resolved here, in the driver, whatever the covariates: a plugin that fails to load (or exits at import) is
    # one line naming it, not "a worker actor died".
    adapter = adapter_for(metadata)
    if covariates and not adapter.supports_covariates:
        raise ConfigError(
            f"{checkpoint.name}: model_family {metadata.model_family!r} takes no covariates", key="covariates"
        )
    if metadata.max_covariates is not None and len(covariates) > metadata.max_covariates:
        raise ConfigError(
            f"{len(covariates)} covariates declared, {checkpoint.name} takes at most {metadata.max_covariates}",
            key="covariates",
        )


def _vintages(
    settings: BacktestSettings, names: tuple[str, ...], resolution_minutes: int, table: SeriesTable
) -> VintagedCovariates | None:
    """``--covariate-data`` read and indexed for the run's series (None without it)."""
    if settings.covariate_data is None:
        return None
    step_us, latency_us = resolution_minutes * 60_000_000, settings.covariate_latency * 60_000_000
    vintages = read_vintages(
        settings.covariate_data, names, step_us, table.series_ids, latency_us, series_start_us=table.start_us
    )
    return VintagedCovariates(tuple(settings.covariate_columns), vintages)


def _vintaged_names(settings: BacktestSettings) -> tuple[str, ...]:
    """The declared covariates that ``--covariate-data`` holds (read from there, as of each cutoff)."""
    if settings.covariate_data is None:
        return ()
    held = set(read_schema(settings.covariate_data).names)
    names = tuple(name for name in settings.covariate_columns if name in held)
    if not names:
        raise ConfigError(
            f"{settings.covariate_data} holds none of the declared covariates {settings.covariate_columns}.",
            key="covariate_data",
            suggestions=(Suggestion("Declare its columns with {} or {}.", DECLARE_COVARIATES),),
        )
    return names


def _load(
    settings: BacktestSettings, resolution_minutes: int, spec: WindowSpec, vintaged: tuple[str, ...] = ()
) -> tuple[SeriesTable, WindowPlan, CovariateRoles | None, GroupedWindows | None]:
    """The data as dense series, its windows per series, the covariates' roles and, with ``--group-by``, the
    grouped order of the windows. The covariates of ``vintaged`` are not the input table's."""
    # A grouped run reads the table whole: its parts take series from anywhere in it (:mod:`..grouping`).
    scanned = None
    columns = [name for name in settings.covariate_columns if name not in vintaged]
    # Renamed columns (--id-col...) are read whole: the streamed scan reads the project's names from the file.
    streamable = settings.group_by is None and settings.column_names.is_default
    if settings.series_transport is not SeriesTransport.OBJECT_STORE and streamable:
        scanned = scan_sorted_parquet(settings.data, resolution_minutes, columns, spec)
    if scanned is not None:
        table, windows = scanned.table, scanned.windows
    else:
        also_read = [settings.group_by] if settings.group_by is not None else []
        table = load_series(settings.data, resolution_minutes, columns, also_read, settings.column_names)
        windows = plan_windows(table.series, spec)
    roles = covariate_roles(settings, vintaged)
    grouping = None
    if settings.group_by is not None:
        labels = series_groups(settings.data, settings.group_by, table.arrays().series_ids, settings.column_names)
        grouping = plan_groups(table.arrays(), spec, labels, settings.max_group_size)
    return table, windows, roles, grouping


def _check_grouping(checkpoint: ResolvedCheckpoint, group_by: str | None) -> None:
    if group_by is not None and not supports_groups(adapter_for(checkpoint.metadata)):
        raise ConfigError(
            f"{checkpoint.name}: model_family {checkpoint.metadata.model_family!r} cannot forecast series jointly; "
            "use a Chronos-2 checkpoint.",
            key="group_by",
            suggestions=(Suggestion("Or drop {}.", (("group_by", None),)),),
        )


def covariate_roles(settings: BacktestSettings, vintaged: tuple[str, ...] = ()) -> CovariateRoles | None:
    """Which covariate rows are past-only, and which columns are categorical (by their type in the data; a
    vintaged covariate is numeric)."""
    columns = settings.covariate_columns
    if not columns:
        return None
    from distributed_onnx.evaluation.data.categories import is_categorical

    schema = read_schema(settings.data, settings.column_names)
    categorical = tuple(False if name in vintaged else is_categorical(schema.field(name).type) for name in columns)
    return CovariateRoles(past_only=len(settings.past_covariates), categorical=categorical)


def _run_fingerprint(run_config: dict[str, Any], windows_per_part: int, ramp_width: int, rows: int) -> str:
    # Only a wide ramp enters the fingerprint: a plan of explicit sizes keeps the fingerprint it had.
    wide = {"ramp_width": ramp_width} if ramp_width > 1 else {}
    return _digest({**run_config, "rows_per_batch": rows, "windows_per_part": windows_per_part, **wide})


def _part_size(
    settings: BacktestSettings, planned: int, run_config: dict[str, Any], cap: int
) -> tuple[int, int, int, str]:
    """``(windows per part, ramp width, rows per batch, run fingerprint)``: as set (a ramp of one); else the plan
    of the run directory's manifest: its recorded sizes, else whichever default gives its fingerprint (today's
    for these actors, or one of before the sizes were recorded: batches of 256, parts for these actors or about
    64 of them); else the default for the run's windows, actors and graph (:mod:`.part_count`). A rerun so
    plans the parts it resumes, whatever its cluster."""
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


def _micros(value: datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)
