"""``/v1/forecast`` codec: JSON histories -> the context block the backtest feeds, forecasts -> JSON.

Pure numpy. A history is laid out exactly as a backtest window's context: its last ``context_length`` values,
oldest first, NaN where missing, NaN-padded on the left when shorter, cast to float32 from float64 as
:func:`distributed_onnx.evaluation.data.packing.pack_batch` casts it. The block then goes through
:meth:`InferenceWorker.forecast`, the method a backtest part reaches through ``InferenceWorker.forecast_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np
import pydantic_core

from distributed_onnx.bounds import FLOAT32_MAX
from distributed_onnx.errors import InferenceError, InputValidationError
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.horizons import short_horizon_problem
from distributed_onnx.model.quantiles import ClampedLevel
from distributed_onnx.serve.wire.schemas import ForecastRequest, SeriesHistory


@dataclass(frozen=True)
class ForecastJob:
    """A validated /v1/forecast request, ready to be batched with others."""

    context: np.ndarray  # float32 [S, <= context_length], NaN = missing
    horizon: int
    quantiles: tuple[float, ...]
    enqueued_s: float = field(default=0.0, compare=False)

    @property
    def key(self) -> tuple[int, tuple[float, ...]]:
        """Jobs with the same key share one model call."""
        return self.horizon, self.quantiles


def plan_job(request: ForecastRequest, metadata: CheckpointMetadata, enqueued_s: float = 0.0) -> ForecastJob:
    """Check a request against the checkpoint and build its context block (4xx errors name the field)."""
    horizon = request.horizon or metadata.horizon_length
    if horizon > metadata.horizon_length:
        raise InputValidationError(
            f"horizon: {horizon} steps asked, the model emits at most {metadata.horizon_length} "
            f"({metadata.output_patch_size} x {metadata.horizon_patches}): {metadata.horizon_hint}.",
            field="horizon",
        )
    problem = short_horizon_problem(metadata, horizon)
    if problem is not None:  # the same words as a backtest's refusal, before the request joins a batch
        raise InputValidationError(f"horizon: {problem}.", field="horizon")
    for index, series in enumerate(request.series):
        if series.start is not None:
            check_timestamps_fit(series.start, len(series.y), horizon, metadata.resolution_minutes, index)
    check_one_window_per_origin(request.series, metadata.resolution_minutes)
    quantiles = tuple(request.quantiles or metadata.native_quantiles)
    return ForecastJob(history_block(request.series, metadata.context_length), horizon, quantiles, enqueued_s)


def window_origin(series: SeriesHistory, resolution_minutes: int) -> datetime | None:
    """A window's origin, the forecast log's key with its series id: its first forecast timestamp (``start`` plus
    the history's length in steps, UTC), None without ``start``."""
    if series.start is None:
        return None
    return _as_utc(series.start) + len(series.y) * timedelta(minutes=resolution_minutes)


def check_one_window_per_origin(series: Sequence[SeriesHistory], resolution_minutes: int) -> None:
    """Refuse (422 naming the id and the origin) two histories of one series that end at one origin, whatever
    their starts and lengths: the log would hold two windows of one key, their forecasts indistinguishable to
    ``score``. The request's schema refuses the same start and length twice; only here, with the model's
    resolution, is ``start`` 00:00 with 4 values the same origin as 00:30 with 3 on a 30-minute model. One series
    at two origins is two windows."""
    seen: dict[tuple[str, datetime], int] = {}
    for index, item in enumerate(series):
        origin = window_origin(item, resolution_minutes)
        if origin is None:
            continue
        first = seen.setdefault((item.series_id, origin), index)
        if first != index:
            raise InputValidationError(
                f"series[{index}]: series_id {item.series_id!r} has a window at origin {origin.isoformat()} already "
                f"(series[{first}]: its start plus {len(series[first].y)} steps of {resolution_minutes} minutes, as "
                f"this one's plus {len(item.y)}): two windows at one origin, which the forecast log could not tell "
                "apart; send each window once per request",
                field=f"series[{index}]",
            )


def check_timestamps_fit(start: datetime, n_history: int, horizon: int, resolution_minutes: int, index: int) -> None:
    """Refuse a ``start`` whose forecast timestamps would leave the calendar (past year 9999), naming the series.

    Checked before the model runs, so a far-future ``start`` is a 422 rather than an ``OverflowError`` after it.
    """
    try:
        _as_utc(start) + (n_history + horizon - 1) * timedelta(minutes=resolution_minutes)
    except OverflowError:
        raise InputValidationError(
            f"series[{index}].start: {start.isoformat()} plus {n_history} history and {horizon} forecast steps of "
            f"{resolution_minutes} minutes runs outside the representable timestamps (years 1 to 9999).",
            field=f"series[{index}].start",
        ) from None


def history_block(series: Sequence[SeriesHistory], context_length: int) -> np.ndarray:
    """``[S, width]`` float32 with ``width = min(longest history, context_length)``; NaN = missing."""
    width = min(max(len(item.y) for item in series), context_length)
    block = np.full((len(series), width), np.nan, dtype=np.float64)
    for index, item in enumerate(series):
        values = np.array(item.y[-width:], dtype=np.float64)  # None -> NaN
        _check_fits_float32(values, index, item.series_id, len(item.y) - len(values))
        if not np.isfinite(values).any():
            raise InputValidationError(
                f"series[{index}].y (series_id {item.series_id!r}) has no observed value in the last "
                f"{len(values)} steps the model sees; send at least one number.",
                field=f"series[{index}].y",
            )
        block[index, width - len(values) :] = values
    return block.astype(np.float32)


def _check_fits_float32(values: np.ndarray, index: int, series_id: str, skipped: int) -> None:
    """Refuse a value that float32 (the model's dtype) turns into inf, naming it: a 422 for this request alone.

    Caught here, at validation, rather than inside the model call, where it would fail every request batched
    with it. Values the model never sees (before its context) are not checked: they are never cast.
    """
    with np.errstate(invalid="ignore"):
        too_large = np.flatnonzero(np.abs(values) > FLOAT32_MAX)
    if too_large.size:
        position = skipped + int(too_large[0])
        raise InputValidationError(
            f"series[{index}].y[{position}] (series_id {series_id!r}) is {values[too_large[0]]:g}, beyond float32's "
            f"range (+-{FLOAT32_MAX:.4g}) that the model computes in; {too_large.size} value(s) of this series are. "
            "Rescale the series.",
            field=f"series[{index}].y",
        )


def check_finite_forecasts(forecasts: np.ndarray, request: ForecastRequest) -> None:
    """Refuse one request's forecasts that hold NaN or inf (422): its values are outside what the model handles.

    Checked per request after its (possibly merged) model call, so only the request whose values made the model
    overflow fails; the others of its batch get their forecasts, and the replica's readiness is not touched.
    """
    broken = np.flatnonzero(~np.isfinite(forecasts.reshape(len(forecasts), -1)).all(axis=1))
    if broken.size:
        named = ", ".join(f"series[{i}] ({request.series[i].series_id!r})" for i in broken[:5])
        more = f" and {broken.size - 5} more" if broken.size > 5 else ""
        raise InputValidationError(
            f"the model produced NaN or infinite forecasts for {named}{more}: their values are outside the range "
            "the model handles (e.g. too large in magnitude); rescale them.",
            field=f"series[{int(broken[0])}].y",
        )


def quantile_key(level: float) -> str:
    """The response's key of a quantile level: ``0.1``, ``0.25``."""
    return format(level, "g")


def forecast_timestamps(start: datetime, n_history: int, horizon: int, resolution_minutes: int) -> list[str]:
    """ISO timestamps (UTC, ``Z``) of the forecast steps after a history of ``n_history`` steps from ``start``."""
    start = _as_utc(start)
    step = timedelta(minutes=resolution_minutes)
    return [
        (start + (n_history + lead) * step).strftime("%Y-%m-%dT%H:%M:%S.%f").removesuffix(".000000") + "Z"
        for lead in range(horizon)
    ]


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def encode_forecasts(
    model: str,
    request: ForecastRequest,
    forecasts: np.ndarray,
    quantiles: Sequence[float],
    resolution_minutes: int,
    clamped: Sequence[ClampedLevel] = (),
) -> bytes:
    """The JSON body of a /v1/forecast response; ``forecasts`` is ``[S, horizon, len(quantiles)]``.

    ``clamped`` lists the requested levels outside the model's native range, served by the nearest native level
    (:func:`distributed_onnx.model.quantiles.clamped_levels`): the response says so in ``quantile_clamping``, as
    a backtest's ``summary.json`` does, rather than clamping silently.

    Encoded directly (not through a response model) by pydantic's Rust serializer: a 64-series response holds
    ~55,000 floats, which ``json.dumps`` took longer to encode than the model call took (profiled).
    """
    if not np.isfinite(forecasts).all():
        raise InferenceError(f"the model produced NaN or infinite forecasts for {model!r}")
    keys = [quantile_key(level) for level in quantiles]
    per_level = forecasts.transpose(0, 2, 1).tolist()  # [S][Q][H], float32 -> exact Python floats
    items = []
    for index, series in enumerate(request.series):
        item: dict[str, object] = {
            "series_id": series.series_id,
            "quantiles": dict(zip(keys, per_level[index], strict=True)),
        }
        if series.start is not None:
            item["timestamps"] = forecast_timestamps(
                series.start, len(series.y), forecasts.shape[1], resolution_minutes
            )
        items.append(item)
    document: dict[str, object] = {"model": model, "forecasts": items}
    if clamped:
        document["quantile_clamping"] = [level.as_record() for level in clamped]
    return pydantic_core.to_json(document)


class ForecastFn(Protocol):
    """:meth:`InferenceWorker.forecast`'s signature: ``(context [W, C], horizon, quantiles) -> [W, H, Q]``."""

    def __call__(self, context: np.ndarray, horizon: int, quantiles: Sequence[float]) -> np.ndarray: ...


def run_jobs(forecast: ForecastFn, jobs: Sequence[ForecastJob], rows_per_batch: int) -> list[np.ndarray]:
    """One model call per ``rows_per_batch`` windows of each distinct (horizon, quantiles); results per job, in order.

    Jobs with the same key are laid end to end and cut into chunks of at most ``rows_per_batch`` rows, each one
    model call, so merged requests never make one unbounded ORT call (16 requests of 8 MB of short series would
    be hundreds of thousands of windows). A chunk's contexts are NaN-padded on the left to its widest one, which
    is what the worker does to each of them anyway (the model's grid is ``context_length`` wide, missing history
    on the left). A failing call fails the whole batch: the error names how many requests it carried. Non-finite
    forecasts are returned as they are: each request checks its own (:func:`check_finite_forecasts`).
    """
    results: list[np.ndarray] = [np.empty((0,))] * len(jobs)
    groups: dict[tuple[int, tuple[float, ...]], list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(job.key, []).append(index)
    for (horizon, quantiles), members in groups.items():
        for index in members:
            results[index] = np.empty((jobs[index].context.shape[0], horizon, len(quantiles)), dtype=np.float32)
        for chunk in _chunks([jobs[index].context.shape[0] for index in members], rows_per_batch):
            pieces = [(members[position], start, stop) for position, start, stop in chunk]
            width = max(jobs[index].context.shape[1] for index, _, _ in pieces)
            rows = sum(stop - start for _, start, stop in pieces)
            block = np.full((rows, width), np.nan, dtype=np.float32)
            offset = 0
            for index, start, stop in pieces:
                context = jobs[index].context
                block[offset : offset + stop - start, width - context.shape[1] :] = context[start:stop]
                offset += stop - start
            try:
                forecasts = forecast(block, horizon, quantiles)
            except InferenceError as exc:
                raise _batch_failure(exc, jobs) from exc
            if forecasts.shape[0] != rows:
                wrong = InferenceError(f"the model returned {forecasts.shape[0]} forecasts for {rows} series")
                raise _batch_failure(wrong, jobs)
            offset = 0
            for index, start, stop in pieces:
                results[index][start:stop] = forecasts[offset : offset + stop - start]
                offset += stop - start
    return results


def _chunks(sizes: Sequence[int], limit: int) -> list[list[tuple[int, int, int]]]:
    """Cut items of ``sizes`` rows, laid end to end, into chunks of at most ``limit`` rows: (item, start, stop)."""
    chunks: list[list[tuple[int, int, int]]] = [[]]
    room = limit
    for item, size in enumerate(sizes):
        start = 0
        while start < size:
            if room == 0:
                chunks.append([])
                room = limit
            stop = min(size, start + room)
            chunks[-1].append((item, start, stop))
            room -= stop - start
            start = stop
    return [chunk for chunk in chunks if chunk]


def _batch_failure(exc: InferenceError, jobs: Sequence[ForecastJob]) -> InferenceError:
    requests = "1 request" if len(jobs) == 1 else f"a batch of {len(jobs)} requests"
    series = sum(job.context.shape[0] for job in jobs)
    return InferenceError(f"the model failed on {requests} ({series} series): {exc}", batch_requests=len(jobs))
