"""The Arrow layout of a model batch of windows, and its zero-copy decoding into numpy blocks.

A batch carries each window's ``window_id``, ``series_id``, ``origin``, its context and target as fixed-size
list columns and, when the run declares covariates, one flat covariate block per window. Missing values are
NaN, not Arrow nulls, so the buffers decode zero-copy. The layout belongs to the model layer because the
worker reads it (:meth:`~distributed_onnx.model.worker.InferenceWorker.forecast_batch`); the backtest packs it
(:mod:`distributed_onnx.evaluation.data.packing`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class WindowBlock:
    """A batch of windows as numpy blocks (views on the Arrow buffers); ids decode only when asked for."""

    batch: pa.RecordBatch
    origins_us: np.ndarray  # int64 [W]
    context: np.ndarray  # float32 [W, C], NaN = missing
    target: np.ndarray  # float64 [W, H], NaN = unknown
    covariates: np.ndarray | None  # float32 [W, K, C + H], NaN = missing

    @property
    def n_windows(self) -> int:
        return int(self.batch.num_rows)

    @property
    def window_ids(self) -> list[str]:
        return list(self.batch.column("window_id").to_pylist())

    @property
    def series_ids(self) -> list[str]:
        return list(self.batch.column("series_id").to_pylist())


def unpack_batch(batch: pa.RecordBatch, context_length: int, horizon: int) -> WindowBlock:
    """Decode a batch made by :func:`pack_batch`; numeric blocks are views on the Arrow buffers."""
    n_windows = batch.num_rows
    covariates = None
    if "covariates" in batch.schema.names:
        flat = flat_values(batch.column("covariates"))
        covariates = flat.reshape(n_windows, -1, context_length + horizon)
    return WindowBlock(
        batch=batch,
        origins_us=batch.column("origin").cast(pa.int64()).to_numpy(),
        context=flat_values(batch.column("context")).reshape(n_windows, context_length),
        target=flat_values(batch.column("target")).reshape(n_windows, horizon),
        covariates=covariates,
    )


def fixed_lists(block: np.ndarray, width: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(block).reshape(-1)), width)


def flat_values(column: pa.Array) -> np.ndarray:
    # flatten() honours a slice's offset; NaN (not null) marks missing values, so the view is zero-copy.
    return column.flatten().to_numpy(zero_copy_only=True)
