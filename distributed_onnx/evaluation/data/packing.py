"""Packing model batches: planned windows of a part -> the Arrow batch the worker reads (fresh buffers).

The actor that runs a part packs each model batch from the series it holds. A batch carries each window's
context and target as fixed-size-list columns, so a batch is a handful of contiguous buffers built from fresh
numpy arrays: a *slice* of a large RecordBatch would pickle with its whole parent buffer (docs/design.md: 40 MB
measured for 32 rows) if it ever travelled. Missing values are NaN, not Arrow nulls, so the buffers decode
zero-copy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from distributed_onnx.evaluation.data.series_source import SeriesSource
from distributed_onnx.evaluation.data.table import SeriesArrays
from distributed_onnx.evaluation.data.vintages import VintagedCovariates, VintageStats
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles, prepare_covariates
from distributed_onnx.evaluation.data.windows import PlannedBatch, series_key, window_id_array
from distributed_onnx.model.window_batch import TIMESTAMP, arrow_array, arrow_strings, fixed_lists


def gather_blocks(
    values: np.ndarray, origins: np.ndarray, before: int, after: int, out: np.ndarray | None = None
) -> np.ndarray:
    """``values[o - before : o + after]`` for every origin ``o``, NaN outside the series, as one fresh copy
    (into ``out`` when given: C-ordered, ``[len(origins), before + after]``).

    Only the span the origins cover is padded (not the whole series per batch, which dominated packing of long
    series). Origins must lie in ``0..len(values)`` (one step past the data is the latest window there is).
    """
    origins = np.asarray(origins, dtype=np.int64)
    width = before + after
    if origins.size == 0:
        return np.empty((0, width), dtype=values.dtype)
    low, high = int(origins.min()), int(origins.max())
    if low < 0 or high > values.shape[0]:
        raise ValueError(f"origins must lie in 0..{values.shape[0]} (the series' steps), got {low}..{high}")
    first, last = low - before, high + after  # the span to copy, [first, last)
    segment = np.full(last - first, np.nan, dtype=values.dtype)
    inside_lo, inside_hi = max(first, 0), min(last, values.shape[0])
    segment[inside_lo - first : inside_hi - first] = values[inside_lo:inside_hi]
    windows = np.lib.stride_tricks.sliding_window_view(segment, width)
    if out is not None:
        return np.take(windows, origins - low, axis=0, out=out, mode="clip")  # in range: checked above
    return windows[origins - low]  # row i starts at first + i; fancy indexing copies: fresh memory


def pack_batch(
    source: SeriesSource,
    planned: PlannedBatch,
    context_length: int,
    horizon: int,
    run_fingerprint: str,
    roles: CovariateRoles | None = None,
    vintaged: VintageJoin | None = None,
) -> pa.RecordBatch:
    """Build the Arrow batch for ``planned``: ids, origins, context, target and covariate blocks.

    ``roles`` says which covariate rows are past-only or categorical (:mod:`.window_covariates`); with
    ``planned.group`` the batch carries each window's ``group`` (windows of one group are forecast jointly).
    ``vintaged`` joins the covariate rows of a vintage table in, as of each window's cutoff (:mod:`.vintages`).
    """
    if isinstance(source, SeriesArrays):
        batch = _pack_arrays(source, planned, context_length, horizon, run_fingerprint, roles, vintaged)
    else:
        batch = _pack_series(source, planned, context_length, horizon, run_fingerprint, roles, vintaged)
    if planned.group is None:
        return batch
    return batch.append_column("group", arrow_array(np.asarray(planned.group, dtype=np.int64)))


class VintageJoin:
    """How a batch's vintaged covariate rows are joined: the table, realized or as of the cutoff, and the
    statistics to count into (the as-of run's only)."""

    def __init__(
        self, covariates: VintagedCovariates, realized: bool = False, stats: VintageStats | None = None
    ) -> None:
        self.covariates = covariates
        self.realized = realized
        self.stats = stats

    def rows(
        self,
        exact: np.ndarray | None,
        series_ids: list[str],
        window_series: np.ndarray,
        origin_us: np.ndarray,
        context_length: int,
        horizon: int,
    ) -> np.ndarray:
        """``[W, K, C + H]`` from the input table's rows and the join; ``window_series`` indexes ``series_ids``."""
        keys = self.covariates.vintages.keys_of(series_ids)[window_series]
        return self.covariates.assemble(
            exact, keys, origin_us, context_length, horizon, realized=self.realized, stats=self.stats
        )


def _covariate_values(
    context: np.ndarray, covariates: np.ndarray, context_length: int, roles: CovariateRoles | None
) -> np.ndarray:
    if roles is None or not roles.changes_values:
        return covariates
    return prepare_covariates(context, covariates, context_length, roles)


def _pack_series(
    source: SeriesSource,
    planned: PlannedBatch,
    context_length: int,
    horizon: int,
    run_fingerprint: str,
    roles: CovariateRoles | None,
    vintaged: VintageJoin | None,
) -> pa.RecordBatch:
    """:func:`pack_batch` series by series (any :class:`SeriesSource`)."""
    contexts, targets, covariates, origins_us, keys = [], [], [], [], []
    series_rows: list[tuple[str, int]] = []
    n_covariates = 0
    # Windows of a batch are grouped by series (the plan runs series after series): one gather per series.
    cuts = np.flatnonzero(np.diff(planned.series_index)) + 1
    for rows in np.split(np.arange(planned.n_windows), cuts):
        if rows.size == 0:
            continue
        series = source.series(int(planned.series_index[rows[0]]))
        origins = planned.origin_index[rows]
        block = gather_blocks(series.values, origins, context_length, horizon)
        contexts.append(block[:, :context_length])
        targets.append(block[:, context_length:])
        n_covariates = series.covariates.shape[0]
        if n_covariates:
            covariates.append(
                np.stack([gather_blocks(row, origins, context_length, horizon) for row in series.covariates], 1)
            )
        series_rows.append((series.series_id, rows.size))
        origins_us.append(np.asarray(series.timestamp_us(origins), dtype=np.int64))
        keys.append(np.full(rows.size, series_key(series.series_id, run_fingerprint), dtype=np.uint64))
    origin_array = np.concatenate(origins_us) if origins_us else np.empty(0, dtype=np.int64)
    series_ids = pa.DictionaryArray.from_arrays(
        arrow_array(np.repeat(np.arange(len(series_rows), dtype=np.int32), [count for _, count in series_rows])),
        arrow_strings([series_id for series_id, _ in series_rows]),
    )
    columns = {
        "window_id": window_id_array(np.concatenate(keys) if keys else np.empty(0, np.uint64), origin_array),
        "series_id": series_ids.cast(pa.string()),
        "origin": arrow_array(origin_array, TIMESTAMP),
        "context": fixed_lists(_stack(contexts, context_length).astype(np.float32), context_length),
        "target": fixed_lists(_stack(targets, horizon), horizon),
    }
    exact = np.concatenate(covariates) if n_covariates and covariates else None
    if vintaged is not None and series_rows:
        window_series = np.repeat(np.arange(len(series_rows)), [count for _, count in series_rows])
        ids = [series_id for series_id, _ in series_rows]
        exact = vintaged.rows(exact, ids, window_series, origin_array, context_length, horizon)
    if exact is not None:
        k = exact.shape[1]
        values = _covariate_values(np.concatenate(contexts), exact, context_length, roles)
        columns["covariates"] = fixed_lists(values.astype(np.float32), k * (context_length + horizon))
    return pa.RecordBatch.from_pydict(columns)


def _pack_arrays(
    source: SeriesArrays,
    planned: PlannedBatch,
    context_length: int,
    horizon: int,
    run_fingerprint: str,
    roles: CovariateRoles | None,
    vintaged: VintageJoin | None,
) -> pa.RecordBatch:
    """:func:`pack_batch` over the flat layout: one gather for every window of the batch, no loop per series.

    Many short series (tens of thousands of meters, a few windows each) put a hundred series in one batch:
    a gather per series then cost several times the model (measured). The result is the same batch.
    """
    series_index = np.asarray(planned.series_index, dtype=np.int64)
    origins = np.asarray(planned.origin_index, dtype=np.int64)
    lengths = source.offsets[series_index + 1] - source.offsets[series_index]
    outside = (origins < 0) | (origins > lengths)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        raise ValueError(f"origins must lie in 0..{int(lengths[bad])} (the series' steps), got {int(origins[bad])}")
    n_covariates = source.covariates.shape[0] if len(origins) else 0  # as the per-series path: none seen, none
    width = context_length + horizon
    covariates = None
    if origins.size and (series_index == series_index[0]).all():
        # One series (the usual batch of a long series): one sliding-window take over its span, no [W, C + H]
        # index arrays (they cost fifty times the take for 256 windows of 608 steps, measured).
        one = slice(int(source.offsets[series_index[0]]), int(source.offsets[series_index[0] + 1]))
        block = gather_blocks(source.values[one], origins, context_length, horizon)
        if n_covariates:
            rows = [gather_blocks(row[one], origins, context_length, horizon) for row in source.covariates]
            covariates = np.stack(rows, axis=1)
    else:
        steps = origins[:, None] + np.arange(-context_length, horizon, dtype=np.int64)  # [W, C + H]
        inside = (steps >= 0) & (steps < lengths[:, None])
        flat = np.where(inside, source.offsets[series_index][:, None] + steps, 0)
        block = np.where(inside, source.values[flat] if source.values.size else np.nan, np.nan)
        if n_covariates:
            covariates = np.where(inside[:, None, :], source.covariates[:, flat].transpose(1, 0, 2), np.nan)
    distinct, local = np.unique(series_index, return_inverse=True)
    local = local.ravel()
    keys = np.asarray([series_key(source.series_ids[int(i)], run_fingerprint) for i in distinct], dtype=np.uint64)
    origin_us = source.start_us[series_index] + origins * source.step_us
    series_ids = pa.DictionaryArray.from_arrays(
        arrow_array(local.astype(np.int32)), arrow_strings([source.series_ids[int(i)] for i in distinct])
    )
    columns = {
        "window_id": window_id_array(keys[local], origin_us),
        "series_id": series_ids.cast(pa.string()),
        "origin": arrow_array(origin_us.astype(np.int64), TIMESTAMP),
        "context": fixed_lists(block[:, :context_length].astype(np.float32), context_length),
        "target": fixed_lists(np.ascontiguousarray(block[:, context_length:]), horizon),
    }
    if vintaged is not None and origins.size:
        ids = [source.series_ids[int(i)] for i in distinct]
        covariates = vintaged.rows(covariates, ids, local, origin_us, context_length, horizon)
    if covariates is not None:
        n_covariates = covariates.shape[1]
        covariates = _covariate_values(block[:, :context_length], covariates, context_length, roles)
        flat_width = n_covariates * width
        columns["covariates"] = fixed_lists(covariates.astype(np.float32).reshape(len(origins), flat_width), flat_width)
    return pa.RecordBatch.from_pydict(columns)


def _stack(blocks: list[np.ndarray], width: int) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.empty((0, width))
