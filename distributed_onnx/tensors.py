"""Arrow codecs for dispatched batches: planned windows -> RecordBatch -> numpy blocks (no copies).

A batch carries each window's context and target as fixed-size-list columns, so a batch is a handful of
contiguous buffers. Every batch is built from fresh numpy arrays: a *slice* of a large RecordBatch would
pickle with its whole parent buffer (DESIGN.md measured 40 MB for 32 rows) and travel through Ray with it.
Missing values travel as NaN, not as Arrow nulls, so the receiving side can view the buffers zero-copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from distributed_onnx.table import SeriesTable
from distributed_onnx.windows import PlannedBatch, window_ids

TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class WindowBlock:
    """A batch of windows as numpy blocks (views on the Arrow buffers where possible)."""

    window_ids: list[str]
    series_ids: list[str]
    origins_us: np.ndarray  # int64 [W]
    context: np.ndarray  # float32 [W, C], NaN = missing
    target: np.ndarray  # float64 [W, H], NaN = unknown
    covariates: np.ndarray | None  # float32 [W, K, C + H], NaN = missing

    @property
    def n_windows(self) -> int:
        return len(self.window_ids)


def gather_blocks(values: np.ndarray, origins: np.ndarray, before: int, after: int) -> np.ndarray:
    """``values[o - before : o + after]`` for every origin ``o``, NaN outside the series, as one copy."""
    padded = np.concatenate([np.full(before, np.nan), values, np.full(after, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, before + after)
    return windows[origins]  # fancy indexing copies: the result owns fresh memory


def pack_batch(
    table: SeriesTable, planned: PlannedBatch, context_length: int, horizon: int, run_fingerprint: str
) -> pa.RecordBatch:
    """Build the Arrow batch for ``planned``: ids, origins, context, target and covariate blocks."""
    contexts, targets, covariates, series_ids, origins_us = [], [], [], [], []
    n_covariates = len(table.covariate_names)
    for series_index in np.unique(planned.series_index):
        rows = planned.series_index == series_index
        series = table.series[int(series_index)]
        origins = planned.origin_index[rows]
        block = gather_blocks(series.values, origins, context_length, horizon)
        contexts.append(block[:, :context_length])
        targets.append(block[:, context_length:])
        if n_covariates:
            covariates.append(
                np.stack([gather_blocks(row, origins, context_length, horizon) for row in series.covariates], 1)
            )
        series_ids.extend([series.series_id] * int(rows.sum()))
        origins_us.append(np.asarray(series.timestamp_us(origins), dtype=np.int64))
    origin_array = np.concatenate(origins_us)
    ids = np.asarray(series_ids, dtype=object)
    columns = {
        "window_id": pa.array(window_ids(ids, origin_array, run_fingerprint), pa.string()),
        "series_id": pa.array(series_ids, pa.string()),
        "origin": pa.array(origin_array, TIMESTAMP),
        "context": _fixed_lists(np.concatenate(contexts).astype(np.float32), context_length),
        "target": _fixed_lists(np.concatenate(targets), horizon),
    }
    if n_covariates:
        columns["covariates"] = _fixed_lists(
            np.concatenate(covariates).astype(np.float32), n_covariates * (context_length + horizon)
        )
    return pa.RecordBatch.from_pydict(columns)


def unpack_batch(batch: pa.RecordBatch, context_length: int, horizon: int) -> WindowBlock:
    """Decode a batch made by :func:`pack_batch`; numeric blocks are views on the Arrow buffers."""
    n_windows = batch.num_rows
    covariates = None
    if "covariates" in batch.schema.names:
        flat = _values(batch.column("covariates"))
        covariates = flat.reshape(n_windows, -1, context_length + horizon)
    return WindowBlock(
        window_ids=batch.column("window_id").to_pylist(),
        series_ids=batch.column("series_id").to_pylist(),
        origins_us=batch.column("origin").cast(pa.int64()).to_numpy(),
        context=_values(batch.column("context")).reshape(n_windows, context_length),
        target=_values(batch.column("target")).reshape(n_windows, horizon),
        covariates=covariates,
    )


def _fixed_lists(block: np.ndarray, width: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(block).reshape(-1)), width)


def _values(column: pa.Array) -> np.ndarray:
    # flatten() honours a slice's offset; NaN (not null) marks missing values, so the view is zero-copy.
    return column.flatten().to_numpy(zero_copy_only=True)
