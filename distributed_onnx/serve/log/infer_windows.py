"""KServe v2 infer requests in the forecast log: which windows a request of raw tensors holds, and when they are.

A ``/v1/forecast`` request names its series and where they start; a v2 infer request is the model's own tensors.
Its windows are what the model family says they are (:meth:`ModelAdapter.target_windows`: one per row of the
plain family, one per group of Chronos-2, its target the group's first row), and two optional request
``parameters`` place them:

- :data:`START` (``start``): ISO 8601 timestamp (UTC if naive) of the context tensor's *first column*, the same
  for every window of the request. A window's origin is ``start`` plus the context's width in steps, as a /v1
  series' origin is its ``start`` plus its history's length. Without it the rows are logged unplaceable (null
  ``origin``/``timestamp``), like a /v1 series without ``start``, and ``score`` counts them as such.
- :data:`SERIES_IDS` (``series_ids``): one id per window, comma-separated (over HTTP a JSON list of strings is
  taken too), each id once (all the windows share ``start``, so one id twice is one window logged twice); default:
  the window's position in the request (``"0"``, ``"1"``, ...).

A malformed parameter is the request's fault (422 naming it), checked before the model runs. The logged
forecasts are the model's native quantile levels over its whole horizon (what the output tensor holds), decoded
by the family's adapter as a backtest decodes its batches: for tensors built as the backtest builds them they
are the backtest's forecasts. Shadow models get the windows as a /v1 request would give them (each window's
history, missing values as missing, the primary's horizon) and forecast them at their own native levels;
covariate rows of a Chronos-2 group are not passed on (a /v1 request carries none either).

Only the checks run on the request path; turning the tensors into the log's request happens after the answer
(:mod:`distributed_onnx.serve.log.traffic`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from distributed_onnx.bounds import MAX_SERIES_ID_BYTES, id_bytes
from distributed_onnx.errors import InputValidationError
from distributed_onnx.model.adapters import ModelAdapter, adapter_for
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.horizons import call_metadata, short_horizon_of
from distributed_onnx.serve.wire.schemas import ForecastRequest, SeriesHistory

#: Request parameter: timestamp of the context tensor's first column.
START = "start"
#: Request parameter: the windows' series ids, comma-separated.
SERIES_IDS = "series_ids"


@dataclass(frozen=True)
class InferWindows:
    """A v2 request's windows, checked: their histories, target rows, series ids and start."""

    context: np.ndarray  # float32 [W, C], NaN = missing
    target_rows: np.ndarray  # int64 [W]: the output rows of the windows
    series_ids: tuple[str, ...]
    start: datetime | None

    @property
    def count(self) -> int:
        return int(self.target_rows.shape[0])


def infer_windows(
    adapter: ModelAdapter,
    metadata: CheckpointMetadata,
    inputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, Any] | None,
) -> InferWindows:
    """The windows of a v2 request's (validated) tensors and where its parameters place them (422 if malformed)."""
    context, target_rows = adapter.target_windows(inputs)
    parameters = parameters or {}
    start = _start(parameters.get(START), context.shape[1], metadata)
    ids = _series_ids(parameters.get(SERIES_IDS), int(target_rows.shape[0]))
    return InferWindows(context, target_rows, ids, start)


def served_request(
    windows: InferWindows,
    metadata: CheckpointMetadata,
    outputs: Mapping[str, np.ndarray],
    adapter_of: Callable[[CheckpointMetadata], ModelAdapter] = adapter_for,
) -> tuple[ForecastRequest, np.ndarray, tuple[float, ...]] | None:
    """The log's view of an answered v2 request: the windows as a /v1 request, the forecasts ``[W, H, Q]`` at the
    native levels over the steps the call computed, and the levels; ``None`` when the forecasts are not finite
    (nothing to log or to compare). ``adapter_of`` gives the adapter decoding a call (a replica passes its
    worker's, built once per patch count)."""
    call = computed_call(metadata, outputs)
    native = adapter_of(call).decode(outputs, windows.target_rows)  # [W, Q, H]
    if not np.isfinite(native).all():
        return None
    forecasts = np.ascontiguousarray(native.transpose(0, 2, 1))
    as_lists = [[None if math.isnan(value) else value for value in row] for row in windows.context.tolist()]
    series = [
        SeriesHistory.model_construct(series_id=series_id, y=values, start=windows.start)
        for series_id, values in zip(windows.series_ids, as_lists, strict=True)
    ]
    request = ForecastRequest.model_construct(series=series, horizon=forecasts.shape[1], quantiles=None, model=None)
    return request, forecasts, tuple(call.native_quantiles)


def computed_call(metadata: CheckpointMetadata, outputs: Mapping[str, np.ndarray]) -> CheckpointMetadata:
    """The checkpoint as the answered call saw it: a graph computing the output patches it is asked
    (``short_horizon: output_patches``: TimesFM's ``num_output_patches`` input, Chronos-2's future width) answers a
    call of fewer patches with fewer steps, which are that call's forecast (:mod:`distributed_onnx.model.horizons`);
    any other output is decoded against the whole graph (and a shape it does not declare is refused there)."""
    values = outputs.get(metadata.output_name)
    if short_horizon_of(metadata) != "output_patches" or values is None or values.ndim != 3:
        return metadata
    steps = values.shape[2 if metadata.output_layout == "quantile_step" else 1]
    if 0 < steps < metadata.horizon_length and steps % metadata.output_patch_size == 0:
        return call_metadata(metadata, steps)
    return metadata


def _start(value: Any, width: int, metadata: CheckpointMetadata) -> datetime | None:
    if value is None:
        return None
    try:
        start = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        start = None
    if start is None:
        raise InputValidationError(
            f"parameters.{START}: expected an ISO 8601 timestamp of the context's first step "
            f"(e.g. '2026-12-01T00:00:00Z'), got {value!r}.",
            field=f"parameters.{START}",
        )
    start = start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)
    steps = width + metadata.horizon_length - 1
    try:
        start + steps * timedelta(minutes=metadata.resolution_minutes)
    except OverflowError:
        raise InputValidationError(
            f"parameters.{START}: {start.isoformat()} plus {width} context and {metadata.horizon_length} forecast "
            f"steps of {metadata.resolution_minutes} minutes runs outside the representable timestamps.",
            field=f"parameters.{START}",
        ) from None
    return start


def _series_ids(value: Any, count: int) -> tuple[str, ...]:
    if value is None:
        return tuple(str(position) for position in range(count))
    ids: Sequence[Any] = value.split(",") if isinstance(value, str) else value
    if not isinstance(ids, list | tuple) or not all(isinstance(item, str) and item for item in ids):
        raise InputValidationError(
            f"parameters.{SERIES_IDS}: expected non-empty series ids, comma-separated, got {value!r}.",
            field=f"parameters.{SERIES_IDS}",
        )
    longest = max((id_bytes(item) for item in ids), default=0)
    if longest > MAX_SERIES_ID_BYTES:
        raise InputValidationError(
            f"parameters.{SERIES_IDS}: an id of {longest:,} bytes in UTF-8; ids are at most {MAX_SERIES_ID_BYTES:,} "
            "bytes (as /v1/forecast's series_id and a backtest's table).",
            field=f"parameters.{SERIES_IDS}",
        )
    repeated = _repeated(ids)
    if repeated is not None:  # as /v1's series_id: two windows of one series at one origin are one window logged twice
        raise InputValidationError(
            f"parameters.{SERIES_IDS}: the id {repeated!r} is given twice; each window of a request is its own series.",
            field=f"parameters.{SERIES_IDS}",
        )
    if len(ids) != count:
        raise InputValidationError(
            f"parameters.{SERIES_IDS}: {len(ids)} ids for the request's {count} windows "
            "(one per row of the plain family, one per group_ids group of Chronos-2).",
            field=f"parameters.{SERIES_IDS}",
        )
    return tuple(ids)


def _repeated(ids: Sequence[str]) -> str | None:
    """The first id given a second time, or None."""
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            return item
        seen.add(item)
    return None
