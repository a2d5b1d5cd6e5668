"""The input table: long format (``series_id``, ``timestamp``, ``y``, declared covariates) -> dense series.

Reads Parquet or CSV with pyarrow, checks the contract of docs/design.md (required columns, UTC timestamps on a
regular grid, no duplicates) and lays each series out on its own dense grid, where gaps become NaN (masked
downstream; the layout itself is :mod:`.layout`, the streamed reading of a large sorted input :mod:`.rows`).
The file may be local or a URL (``s3://...``, see :mod:`distributed_onnx.storage`). Every error names the file
and, where rows are at fault, the rows (0-based data rows).

The dense grid is sized by each series' time span, not by its rows, so its memory is bounded here: a series
may hold at most :data:`GRID_POINTS_PER_ROW` grid points per row of data (plus :data:`GRID_SLACK_POINTS`).
One stray timestamp decades away (an epoch-zero parse, a typo in the year) would otherwise allocate the whole
span (50 years at 5 minutes is 5.3 M points, 42 MB per column, per series), and a forecast across that hole
would be meaningless anyway; so it is refused, naming the rows on both sides of the largest gap, rather
than silently trimmed (which row is the stray one is the user's call, and dropping data silently would not be).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from distributed_onnx import storage
from distributed_onnx.bounds import FLOAT32_MAX, MAX_SERIES_ID_BYTES
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.categories import category_codes, is_categorical
from distributed_onnx.evaluation.data.columns import OWN_NAMES, ColumnNames, check_columns
from distributed_onnx.evaluation.data.layout import Series, SeriesArrays, SeriesTable, dense_layout
from distributed_onnx.location import Location
from distributed_onnx.redact import quoted

__all__ = [
    "Series",
    "SeriesArrays",
    "SeriesTable",
    "Validated",
    "covariate_column",
    "load_series",
    "numpy_view",
    "float_column",
    "read_schema",
    "read_table",
    "series_from_table",
    "timestamps_us",
    "validate_table",
]

logger = logging.getLogger(__name__)

#: A series' dense grid may hold this many points per row of data: at most 90% of it missing.
GRID_POINTS_PER_ROW = 10
#: ... plus this many, so that short series with a few gaps are never refused.
GRID_SLACK_POINTS = 1_000
#: Every dense series together may hold this many grid points beyond :data:`GRID_POINTS_PER_ROW` per row: the
#: per-series bound alone lets a million two-row series each span 1,010 steps (8 GB of float64, per column).
TOTAL_GRID_SLACK_POINTS = 10_000_000
#: Timestamps must lie in years 1-9999 (0001-01-01T00:00:00 .. 9999-12-31T23:59:59.999999, UTC microseconds).
MIN_TIMESTAMP_US = -62_135_596_800_000_000
MAX_TIMESTAMP_US = 253_402_300_799_999_999
_US_PER_MINUTE = 60_000_000
_MAX_ROWS_IN_MESSAGE = 5
#: Microseconds per unit of an Arrow timestamp type (``ns`` is handled apart: it may not divide evenly).
_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}


def read_table(path: Location, names: ColumnNames = OWN_NAMES) -> pa.Table:
    """Read a Parquet or CSV file into Arrow, with a clear error for a missing or unreadable file; the columns
    ``names`` gives (``--id-col``...) come back under the project's names (the one place they are mapped)."""
    try:
        if not storage.is_file(path, "data file"):
            raise DataError(f"Data file not found: {path}", path=str(path))
        if path.suffix in {".csv", ".txt"}:
            # Ids as written: type-guessing would read ``007`` and ``7`` as one integer series (leading zeros lost).
            ids_as_text = pa_csv.ConvertOptions(column_types={names.series_id: pa.string()})
            table = pa_csv.read_csv(storage.open_input_stream(path), convert_options=ids_as_text)
        else:
            table = storage.read_parquet(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise storage.read_error(exc, path, "data file") or DataError(
            f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path)
        ) from exc
    return names.rename(table, str(path))


def read_schema(path: Location, names: ColumnNames = OWN_NAMES) -> pa.Schema:
    """The columns and types of a Parquet or CSV file (a Parquet file's footer only), under the project's names."""
    if path.suffix in {".csv", ".txt"}:
        return read_table(path, names).schema
    import pyarrow.parquet as pq

    try:
        return names.rename_schema(pq.read_schema(storage.open_input_file(path)), str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise storage.read_error(exc, path, "data file") or DataError(
            f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path)
        ) from exc


def load_series(
    path: Location,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    also_read: Sequence[str] = (),
    names: ColumnNames = OWN_NAMES,
) -> SeriesTable:
    """Read ``path`` and lay it out as dense series on a ``resolution_minutes`` grid (``also_read``: columns
    the run reads elsewhere, such as ``--group-by``'s, not warned about as ignored; ``names``: the user's
    names of the required columns)."""
    table = read_table(path, names)
    check_columns(table.column_names, covariates, str(path), also_read)
    return validate_table(table, resolution_minutes, covariates, source=str(path)).table


def series_from_table(
    table: pa.Table,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    *,
    source: str = "<table>",
) -> SeriesTable:
    """Validate an Arrow table against the input contract and build dense series from it."""
    check_columns(table.column_names, covariates, source)
    return validate_table(table, resolution_minutes, covariates, source=source).table


@dataclass(frozen=True)
class Validated:
    """A checked table laid out as dense series, and how its rows were arranged (for the streamed reader)."""

    table: SeriesTable
    presorted: bool  # the rows were already in (series_id, timestamp) order
    rows_per_series: np.ndarray  # int64 [S]: rows of each series, in series order


def validate_table(
    table: pa.Table,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    *,
    source: str = "<table>",
) -> Validated:
    """:func:`series_from_table` of a table whose columns were checked (:func:`~.columns.check_columns`), also
    saying whether the rows were presorted and how many each series has."""
    if table.num_rows == 0:
        raise DataError(f"{source}: the data has no rows.", path=source)

    distinct_ids, codes = _series_ids(table["series_id"], source)
    timestamps = timestamps_us(table["timestamp"], source)
    values = float_column(table, "y", source)
    covariate_values = [covariate_column(table, name, source) for name in covariates]

    # Sorted by integer codes that follow the ids' order: sorting the id strings themselves cost seconds.
    order, presorted = _sort_order(codes, timestamps)

    def in_order(column: np.ndarray) -> np.ndarray:
        return column if presorted else column[order]

    sorted_codes, sorted_ts = in_order(codes), in_order(timestamps)
    same_series = sorted_codes[1:] == sorted_codes[:-1]
    duplicate = same_series & (sorted_ts[1:] == sorted_ts[:-1])
    if duplicate.any():
        rows = np.sort(np.unique(np.concatenate([order[1:][duplicate], order[:-1][duplicate]])))
        example = f"series {distinct_ids[sorted_codes[1:][duplicate][0]]!r} at {_iso(int(sorted_ts[1:][duplicate][0]))}"
        raise rows_error(source, "duplicate (series_id, timestamp) at rows", rows, f" (e.g. {example}).")
    step_us = resolution_minutes * _US_PER_MINUTE
    boundaries = np.flatnonzero(~same_series) + 1
    starts = np.concatenate([[0], boundaries]).astype(np.int64)
    ends = np.concatenate([boundaries, [len(order)]]).astype(np.int64)
    rows_per_series = ends - starts
    first_ts = np.repeat(sorted_ts[starts], rows_per_series)
    positions, off_step = np.divmod(sorted_ts - first_ts, step_us)
    off_grid = off_step != 0
    if off_grid.any():
        rows = np.sort(order[off_grid])
        example = f"{_iso(int(sorted_ts[off_grid][0]))} in series {distinct_ids[sorted_codes[off_grid][0]]!r}"
        grid = f"timestamps off the {resolution_minutes}-minute grid of their series at rows"
        raise rows_error(source, grid, rows, f" (e.g. {example}).")
    run_ids = distinct_ids[sorted_codes[starts]]  # the id of each run of rows: each series, in order
    _check_grid_sizes(run_ids, sorted_ts, order, starts, ends, step_us=step_us, source=source)
    _check_total_grid_size(run_ids, sorted_ts, starts, ends, step_us, 1 + len(covariate_values), source)
    gaps = np.diff(sorted_ts)[same_series] // step_us
    common = int(np.gcd.reduce(gaps)) if gaps.size else 1
    if common > 1:
        raise DataError(
            f"{source}: the data is on a {common * resolution_minutes}-minute grid, but the checkpoint expects "
            f"{resolution_minutes}-minute resolution. Resample the data or use a matching checkpoint.",
            path=source,
        )
    arrays, _ = dense_layout(
        [str(series_id) for series_id in run_ids.tolist()],
        sorted_ts[starts],
        rows_per_series,
        positions,
        [in_order(column) for column in (values, *covariate_values)],
        step_us,
    )
    return Validated(SeriesTable(arrays, list(covariates), resolution_minutes, source), presorted, rows_per_series)


def _sort_order(codes: np.ndarray, timestamps: np.ndarray) -> tuple[np.ndarray, bool]:
    """Row order by (series, timestamp), and whether it is the identity.

    A linear check first: files are usually written sorted already, and then no row needs to move.
    """
    same = codes[1:] == codes[:-1]
    if bool(np.all(codes[1:] >= codes[:-1])) and bool(np.all(~same | (timestamps[1:] > timestamps[:-1]))):
        return np.arange(codes.size, dtype=np.int64), True
    return np.lexsort((timestamps, codes)), False


def _series_ids(column: pa.ChunkedArray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """``series_id`` as (distinct ids in sorted order, an int64 code per row), each id exactly as written; empty,
    null and oversized ids name their rows.

    Strings are kept as they are (``007`` and ``7`` are two series). An integer column (Parquet, Arrow) is read as
    its decimal text, the only way an integer is written; floats are refused, since ``7.0`` and ``7`` print alike.
    Codes rank the ids in the order of the strings, so sorting rows by code sorts them by id: sorting a string per
    row (as numpy objects) cost seconds at 10 M rows, the codes a fraction of one (measured).
    """
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)):
        raise DataError(
            f"{source}: column 'series_id' must hold strings (or integers), found {column.type}.", path=source
        )
    ids = pc.cast(column, pa.string())
    empty = pc.or_kleene(ids.is_null(), pc.equal(pc.utf8_length(ids), 0)).fill_null(True)
    if pc.any(empty).as_py():
        rows = np.flatnonzero(empty.to_numpy(zero_copy_only=False))
        raise rows_error(source, "empty series_id at rows", rows, "; every row must name its series.")
    long = pc.greater(pc.binary_length(ids), MAX_SERIES_ID_BYTES)
    if pc.any(long).as_py():
        rows = np.flatnonzero(long.to_numpy(zero_copy_only=False))
        longest = pc.max(pc.binary_length(ids)).as_py()
        raise rows_error(
            source,
            f"series_id longer than {MAX_SERIES_ID_BYTES:,} bytes at rows",
            rows,
            f" (the longest: {longest:,} bytes). Ids are copied into every output row and fixed-width id arrays; "
            "use a shorter key.",
        )
    # Through a dictionary: Arrow's own string -> numpy conversion imports pandas (0.3 s of the driver's CPU,
    # measured), and the distinct ids become one Python string each instead of one per row.
    encoded = ids.combine_chunks().dictionary_encode()
    distinct = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    ranked = np.argsort(distinct, kind="stable")
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[ranked] = np.arange(len(distinct), dtype=np.int64)
    # No nulls (refused above): the codes convert zero-copy (the copying conversion imports pandas, measured).
    return distinct[ranked], rank[numpy_view(encoded.indices)]


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


def _check_grid_sizes(
    run_ids: np.ndarray,
    sorted_ts: np.ndarray,
    order: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    *,
    step_us: int,
    source: str,
) -> None:
    """Refuse a series whose dense grid would dwarf its rows (see the module docstring), before allocating it."""
    n_rows = ends - starts
    n_points = (sorted_ts[ends - 1] - sorted_ts[starts]) // step_us + 1
    too_sparse = np.flatnonzero(n_points > GRID_POINTS_PER_ROW * n_rows + GRID_SLACK_POINTS)
    if not too_sparse.size:
        return
    first = int(too_sparse[0])
    start, end = int(starts[first]), int(ends[first])
    widest = start + int(np.argmax(np.diff(sorted_ts[start:end])))
    before, after = int(order[widest]), int(order[widest + 1])
    gap_us = int(sorted_ts[widest + 1] - sorted_ts[widest])
    others = f" ({too_sparse.size - 1} more series like it)" if too_sparse.size > 1 else ""
    raise DataError(
        f"{source}: series {str(run_ids[first])!r} spans {int(n_points[first]):,} grid steps for "
        f"{int(n_rows[first]):,} rows{others}: its largest gap, {gap_us // step_us:,} steps ({_duration(gap_us)}), "
        f"lies between rows {before} ({_iso(int(sorted_ts[widest]))}) and {after} "
        f"({_iso(int(sorted_ts[widest + 1]))}). A timestamp that far away is usually a wrong one: fix or drop "
        f"those rows (a series may be at most {1 - 1 / GRID_POINTS_PER_ROW:.0%} missing).",
        path=source,
        rows=[before, after],
    )


def _check_total_grid_size(
    run_ids: np.ndarray,
    sorted_ts: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    step_us: int,
    n_columns: int,
    source: str,
) -> None:
    """Refuse data whose dense grids together would dwarf its rows, before allocating any of them."""
    n_rows = int(ends[-1])
    n_points = (sorted_ts[ends - 1] - sorted_ts[starts]) // step_us + 1
    total = int(n_points.sum())
    allowed = GRID_POINTS_PER_ROW * n_rows + TOTAL_GRID_SLACK_POINTS
    if total <= allowed:
        return
    widest = int(np.argmax(n_points - (ends - starts)))
    raise DataError(
        f"{source}: the {len(starts):,} series span {total:,} grid steps for {n_rows:,} rows (dense, "
        f"{total * n_columns * 8 / 1e9:,.1f} GB of float64); at most {allowed:,} are allowed "
        f"({GRID_POINTS_PER_ROW} per row + {TOTAL_GRID_SLACK_POINTS:,}). The sparsest series, "
        f"{str(run_ids[widest])!r}, spans {int(n_points[widest]):,} steps for "
        f"{int(ends[widest] - starts[widest]):,} rows: drop sparse series or resample the data.",
        path=source,
    )


def _duration(span_us: int) -> str:
    days = span_us / (86_400 * 1_000_000)
    return f"{days / 365.25:,.1f} years" if days >= 365.25 else f"{days:,.1f} days"


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


def rows_error(source: str, before: str, rows: np.ndarray, after: str = "") -> DataError:
    """``{source}: {before} [r1, r2, ...]{after}``, the first rows also in the error's ``rows`` field."""
    message = f"{source}: {before} {rows_text(rows)}{after}"
    return DataError(message, path=source, rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist())


def rows_text(rows: np.ndarray) -> str:
    """``[r1, r2, ...] and N more``: the first rows a message names."""
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_ROWS_IN_MESSAGE])
    more = f" and {len(rows) - _MAX_ROWS_IN_MESSAGE} more" if len(rows) > _MAX_ROWS_IN_MESSAGE else ""
    return f"[{shown}]{more}"


def _iso(timestamp_us: int) -> str:
    return str(np.datetime64(timestamp_us, "us")) + "Z"
