"""One column of the input as numpy: timestamps as UTC microseconds, values and covariates as floats (or codes).

Each reader checks what it reads (a timestamp outside years 1-9999, an infinite value, one beyond float32's range)
and names the rows at fault. The whole-table validation (:mod:`.validation`), the streamed reader (:mod:`.rows`)
and the vintages read their columns here, so one value is refused alike by each; and without pyarrow's own
``to_numpy`` (:func:`numpy_view`), which imports pandas where it is installed.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.bounds import FLOAT32_MAX
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.categories import category_codes, is_categorical
from distributed_onnx.evaluation.data.row_errors import rows_error, rows_text

logger = logging.getLogger(__name__)

#: Timestamps must lie in years 1-9999 (0001-01-01T00:00:00 .. 9999-12-31T23:59:59.999999, UTC microseconds).
MIN_TIMESTAMP_US = -62_135_596_800_000_000
MAX_TIMESTAMP_US = 253_402_300_799_999_999
#: Microseconds per unit of an Arrow timestamp type (``ns`` is handled apart: it may not divide evenly).
_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}


def timestamps_us(column: pa.ChunkedArray, source: str) -> np.ndarray:
    """``timestamp`` as int64 UTC microseconds; a value that they cannot hold exactly is an error naming rows."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = _parse_timestamps(column, source)
        kind = column.type
    if not pa.types.is_timestamp(kind):
        raise DataError(f"{source}: column 'timestamp' must hold timestamps, found {kind}.", path=source)
    if kind.tz is None:
        logger.warning("%s: timestamps carry no time zone; reading them as UTC", source)
    if column.null_count:
        rows = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
        raise DataError(f"{source}: empty timestamps at rows {rows_text(rows)}.", path=source)
    # The integer behind an Arrow timestamp is the UTC instant in the type's unit, whatever its time zone.
    raw = _int64s(pc.cast(column, pa.int64()))
    if kind.unit == "ns":
        fractional = raw % 1_000 != 0
        if fractional.any():
            rows = np.flatnonzero(fractional)
            example = str(np.datetime64(int(raw[rows[0]]), "ns")) + "Z"
            after = f" (e.g. {example}): they lie on no minute grid. Round them to the data's resolution."
            raise rows_error(source, "timestamps with sub-microsecond parts at rows", rows, after)
        return _within_calendar(raw // 1_000, source)
    factor = _US_PER_UNIT[kind.unit]
    out_of_range = np.abs(raw) > np.iinfo(np.int64).max // factor
    if out_of_range.any():
        rows = np.flatnonzero(out_of_range)
        raise rows_error(source, "timestamps out of range at rows", rows, " (more than 292,000 years from 1970).")
    return _within_calendar(raw * factor, source)


def _within_calendar(timestamps_us: np.ndarray, source: str) -> np.ndarray:
    """Refuse instants outside years 1-9999: differences of int64 microseconds near its limits overflow (a grid of
    "negative dimensions"), and no calendar, Python's ``datetime`` included, can print such a forecast."""
    outside = (timestamps_us < MIN_TIMESTAMP_US) | (timestamps_us > MAX_TIMESTAMP_US)
    if outside.any():
        rows = np.flatnonzero(outside)
        after = f" (e.g. {int(timestamps_us[rows[0]]):,} microseconds from 1970). Fix or drop those rows."
        raise rows_error(source, "timestamps outside years 1-9999 at rows", rows, after)
    return timestamps_us


def _int64s(column: pa.ChunkedArray) -> np.ndarray:
    """A null-free int64 column as numpy, without the copying conversion (it imports pandas, measured)."""
    chunks = [numpy_view(chunk) for chunk in column.chunks]
    return np.concatenate(chunks) if len(chunks) != 1 else chunks[0]


def numpy_view(array: pa.Array) -> np.ndarray:
    """A null-free numeric Arrow array as a (read-only) numpy view of its data buffer.

    pyarrow's own ``to_numpy`` imports pandas where pandas is installed (a second of the driver's start,
    measured), even for a zero-copy conversion.
    """
    dtype = np.dtype(array.type.to_pandas_dtype())
    data = array.buffers()[1]
    if data is None or array.null_count:
        raise ValueError(f"expected a null-free {array.type} array")
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _parse_timestamps(column: pa.ChunkedArray, source: str) -> pa.ChunkedArray:
    """Strings -> timestamps: microseconds when every value fits them, else nanoseconds (checked by the caller)."""
    try:
        return pc.cast(column, pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid as exc:
        try:  # nine fractional digits do not parse as microseconds; as nanoseconds the rows can be named
            return pc.cast(column, pa.timestamp("ns", tz="UTC"))
        except pa.ArrowInvalid:
            pass
        raise DataError(f"{source}: column 'timestamp' has values that are not timestamps: {exc}", path=source) from exc


def covariate_column(table: pa.Table, name: str, source: str) -> np.ndarray:
    """A covariate's values: numbers as floats, a categorical column (text, bool) as its category codes."""
    if is_categorical(table[name].type):
        return category_codes(table[name])
    return float_column(table, name, source)


def float_column(table: pa.Table, name: str, source: str) -> np.ndarray:
    try:
        column = pc.cast(table[name], pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(f"{source}: column {name!r} must be numeric, found {table[name].type}.", path=source) from exc
    if column.null_count:  # null is missing: NaN, the dense grid's marker
        column = column.fill_null(float("nan"))
    chunks = [numpy_view(chunk) for chunk in column.chunks]
    array = np.concatenate(chunks) if len(chunks) != 1 else chunks[0]
    if np.isinf(array).any():
        rows = np.flatnonzero(np.isinf(array))
        raise DataError(f"{source}: column {name!r} has infinite values at rows {rows_text(rows)}.", path=source)
    beyond = np.abs(array) > FLOAT32_MAX  # NaN compares False: missing stays missing
    if beyond.any():
        rows = np.flatnonzero(beyond)
        after = (
            f" (e.g. {float(array[rows[0]]):.6g}): the model reads float32, which holds at most {FLOAT32_MAX:.6g}. "
            "Rescale the column."
        )
        raise rows_error(source, f"column {name!r} has values beyond float32's range at rows", rows, after)
    return array
