"""The run's checkpoints, resolved and checked against each other and the settings, before any data is read.

The checkpoints fix what the data is read for: the grid (their shared resolution) and the windows' shape (the
context every model sees, the horizon every model is scored on), and what the run forecasts (the quantile
levels, the season of the baselines). Everything here reads only the settings and the checkpoints (their
metadata, their family's adapter), so a setting no checkpoint can take is refused before the data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from distributed_onnx.errors import ConfigError, Suggestion, describe_validation
from distributed_onnx.evaluation.data.windows import WindowSpec
from distributed_onnx.evaluation.scoring.naive import default_season
from distributed_onnx.evaluation.settings import BacktestSettings, gpu_chain_problem
from distributed_onnx.evaluation.up_front import CLAMP, check_checkpoint_names, levels_problem
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.adapters.grouping import supports_groups
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.identity import CheckpointIdentity, identity_of
from distributed_onnx.model.quantiles import ClampedLevel, clamped_levels, describe_clamped
from distributed_onnx.model.worker import check_run_fits_model

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class Checkpoints:
    """The run's checkpoints and what they fix for it (the grid, the windows' shape, the levels, the season).

    ``checkpoints[0]`` is the run's first checkpoint: the one whose fans the report draws and whose metadata
    gives the defaults (its native levels, its season).
    """

    checkpoints: list[ResolvedCheckpoint]
    #: The windows every model of the run is scored on (context, horizon, origins, coverage).
    spec: WindowSpec
    #: The levels every model forecasts, and those of them that lie outside the first checkpoint's range.
    quantiles: list[float]
    clamped: list[ClampedLevel]
    seasonality: int
    #: What the run adapted to its checkpoints: longer horizons cut to the shortest (``notes``), and levels
    #: outside a checkpoint's native range clamped, with ``--clamp-quantiles`` (``clamp_notes``, one per checkpoint).
    notes: list[str]
    clamp_notes: list[str]
    #: Each checkpoint's identity (:mod:`distributed_onnx.model.identity`), by name: recorded in ``run.json`` and
    #: compared on resume, so a checkpoint whose graph or output-deciding metadata changed is never resumed into.
    identities: dict[str, CheckpointIdentity]
    #: The latest ``training_data_end`` of the checkpoints (UTC microseconds): windows whose origin is at or
    #: before it are in-sample (scored apart, scope ``in_sample``). None: no checkpoint says.
    in_sample_end_us: int | None

    @property
    def first(self) -> ResolvedCheckpoint:
        return self.checkpoints[0]

    @property
    def resolution_minutes(self) -> int:
        """The grid every checkpoint of the run shares (checked by :func:`resolve`)."""
        return self.first.metadata.resolution_minutes


def resolve(settings: BacktestSettings) -> Checkpoints:
    """Resolve the settings' checkpoints, check them against each other and the settings, and fix the run's
    windows, levels and season (refused in one line naming the setting, before any data is read)."""
    checkpoints = [LocalCheckpoint(path=path).resolve() for path in settings.checkpoint]
    metadata = checkpoints[0].metadata
    horizon, context_length, notes = _shared_shape(checkpoints, settings)
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
    n_windows = settings.n_windows
    if n_windows is None and settings.start is None and settings.end is None:
        n_windows = 1
    try:
        spec = WindowSpec(
            context_length=context_length,
            horizon=horizon,
            n_windows=n_windows,
            stride=settings.stride,
            start_us=micros(settings.start),
            end_us=micros(settings.end),
            min_context_coverage=settings.min_context_coverage,
        )
    except ValidationError as exc:
        raise ConfigError(f"Invalid window settings: {describe_validation(exc.errors())}") from exc
    return Checkpoints(
        checkpoints=checkpoints,
        spec=spec,
        quantiles=quantiles,
        clamped=clamped_levels(quantiles, metadata.native_quantiles),
        seasonality=settings.seasonality or default_season(metadata.resolution_minutes),
        notes=notes,
        clamp_notes=_clamp_notes(checkpoints, quantiles),
        identities={each.name: identity_of(each) for each in checkpoints},
        in_sample_end_us=in_sample_end(checkpoints),
    )


def _clamp_notes(checkpoints: list[ResolvedCheckpoint], quantiles: list[float]) -> list[str]:
    """One note per checkpoint whose native range does not hold every level (allowed: ``--clamp-quantiles``)."""
    notes = []
    for each in checkpoints:
        clamped = clamped_levels(quantiles, each.metadata.native_quantiles)
        if clamped:
            notes.append(f"{each.name}: " + describe_clamped(clamped, each.metadata.native_quantiles))
    return notes


def in_sample_end(checkpoints: list[ResolvedCheckpoint]) -> int | None:
    """The latest ``training_data_end`` of the run's checkpoints: a window in-sample for one model is left out of
    the comparison for all (the models share one set of scored pairs)."""
    ends = [micros(each.metadata.training_data_end) for each in checkpoints]
    known = [end for end in ends if end is not None]
    return max(known) if known else None


def micros(value: datetime | None) -> int | None:
    """``value`` as UTC microseconds since 1970 (None stays None)."""
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)


def _shared_shape(checkpoints: list[ResolvedCheckpoint], settings: BacktestSettings) -> tuple[int, int, list[str]]:
    """The horizon and context length every checkpoint of the run is scored on, or a one-line refusal.

    Several checkpoints share the windows (packed once, run each), so they must agree on the grid: a different
    resolution or a duplicate name is refused; different context lengths are refused unless ``context_length``
    is given (then each model gets that history, padded as missing up to its own context); different
    horizons are adapted: the run's default horizon is the shortest one, and the longer models are cut to it.
    """
    check_checkpoint_names(
        [each.weights_path for each in checkpoints]
    )  # as before Ray started (evaluation/up_front.py)
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


def _check_grouping(checkpoint: ResolvedCheckpoint, group_by: str | None) -> None:
    if group_by is not None and not supports_groups(adapter_for(checkpoint.metadata)):
        raise ConfigError(
            f"{checkpoint.name}: model_family {checkpoint.metadata.model_family!r} cannot forecast series jointly; "
            "use a Chronos-2 checkpoint.",
            key="group_by",
            suggestions=(Suggestion("Or drop {}.", (("group_by", None),)),),
        )
