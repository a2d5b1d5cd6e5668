"""The Arrow layout of a model batch of windows, and its zero-copy decoding into numpy blocks.

A batch carries each window's ``window_id``, ``series_id``, ``origin``, its context and target as fixed-size
list columns and, when the run declares covariates, one flat covariate block per window (with ``--group-by``,
each window's ``group`` too). Missing values are
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
    groups: np.ndarray | None = None  # int64 [W]: windows forecast jointly share one (``--group-by``), else None

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
        origins_us=numpy_view(batch.column("origin")).view(np.int64),
        context=flat_values(batch.column("context")).reshape(n_windows, context_length),
        target=flat_values(batch.column("target")).reshape(n_windows, horizon),
        covariates=covariates,
        groups=numpy_view(batch.column("group")) if "group" in batch.schema.names else None,
    )


def targets_and_origins(batch: pa.RecordBatch, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ``target`` ``[W, horizon]`` (float64, NaN = unknown) and ``origin`` ``[W]`` (int64 microseconds):
    what scoring reads, as views; the context and covariates are left undecoded.

    Read straight from the two data buffers: cold (after a model call) the general decoding took twice as long.
    """
    target, origin = batch.column("target"), batch.column("origin")
    values = target.values  # the whole child array: the batch's rows start at target.offset * horizon
    if values.type != pa.float64() or values.null_count or target.null_count or origin.null_count:
        return flat_values(target).reshape(batch.num_rows, horizon), numpy_view(origin).view(np.int64)
    count = len(target) * horizon
    start = (values.offset + target.offset * horizon) * 8
    flat = np.frombuffer(values.buffers()[1], dtype=np.float64, count=count, offset=start)
    origins = np.frombuffer(origin.buffers()[1], dtype=np.int64, count=len(origin), offset=origin.offset * 8)
    return flat.reshape(len(target), horizon), origins


def fixed_lists(block: np.ndarray, width: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(arrow_array(block.reshape(-1)), width)


def flat_values(column: pa.Array) -> np.ndarray:
    # flatten() honours a slice's offset; NaN (not null) marks missing values, so the view is zero-copy.
    return numpy_view(column.flatten())


# pyarrow's numpy conversions (``pa.array(ndarray)``, ``to_numpy``) import pandas wherever it is installed, even
# when they copy nothing, a cost paid in the first packed batch of every actor. A batch's numeric columns are
# plain buffers, so they are wrapped and read directly.


def arrow_array(values: np.ndarray, type_: pa.DataType | None = None) -> pa.Array:
    """A null-free numeric numpy array as an Arrow array over a copy-free buffer (C-ordered first, if needed)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype == np.bool_:  # Arrow packs booleans into bits
        return pa.Array.from_buffers(pa.bool_(), flat.size, [None, pa.py_buffer(np.packbits(flat, bitorder="little"))])
    arrow_type = type_ if type_ is not None else pa.from_numpy_dtype(flat.dtype)
    return pa.Array.from_buffers(arrow_type, flat.size, [None, pa.py_buffer(flat)])


def strings_of(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A string column as a numpy object array (``to_numpy`` would import pandas)."""
    return np.asarray(array.to_pylist(), dtype=object)


def arrow_strings(values: list[str]) -> pa.StringArray:
    """Python strings as an Arrow string array, built from its two buffers (``pa.array(list)`` imports pandas)."""
    encoded = [value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(item) for item in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


def masked_floats(values: np.ndarray) -> pa.Array:
    """A float array with NaN as null (an actual that is unknown), from its buffers."""
    flat = np.ascontiguousarray(values).reshape(-1)
    missing = np.isnan(flat)
    if not missing.any():
        return arrow_array(flat)
    validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    arrow_type = pa.from_numpy_dtype(flat.dtype)
    return pa.Array.from_buffers(arrow_type, flat.size, [validity, pa.py_buffer(flat)], null_count=int(missing.sum()))


def numpy_view(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free fixed-width Arrow array (one chunk) as a read-only numpy view of its data buffer."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else pa.concat_arrays(array.chunks)
    if array.null_count:
        raise ValueError(f"expected a null-free {array.type} array, got {array.null_count} nulls")
    width = array.type.bit_width // 8
    dtype = np.dtype(f"<i{width}") if pa.types.is_timestamp(array.type) else np.dtype(array.type.to_pandas_dtype())
    data = array.buffers()[1]
    if data is None:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
