"""The input table: long format (``series_id``, ``timestamp``, ``y``, declared covariates) -> dense series.

Reads Parquet or CSV with pyarrow, checks the contract of docs/design.md (required columns, UTC timestamps on a
regular grid, no duplicates) and lays each series out on its own dense grid, where gaps become NaN (masked
downstream). The file may be local or a URL (``s3://...``, see :mod:`distributed_onnx.storage`). Every error
names the file and, where rows are at fault, the rows (0-based data rows).

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
from distributed_onnx.errors import DataError

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("series_id", "timestamp", "y")
#: A series' dense grid may hold this many points per row of data: at most 90% of it missing.
GRID_POINTS_PER_ROW = 10
#: ... plus this many, so that short series with a few gaps are never refused.
GRID_SLACK_POINTS = 1_000
#: The longest series id accepted, in UTF-8 bytes: ids are repeated in every forecast row, and a fixed-width
#: numpy string array of ids takes (longest id x rows) bytes, so one 1 MB id would cost gigabytes.
MAX_SERIES_ID_BYTES = 1_024
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


@dataclass
class Series:
    """One series on its dense grid: ``values[i]`` is the value at ``start_us + i * step_us`` (NaN = missing)."""

    series_id: str
    start_us: int
    step_us: int
    values: np.ndarray
    covariates: np.ndarray  # [n_covariates, n_points], NaN = missing

    @property
    def n_points(self) -> int:
        return int(self.values.shape[0])

    def timestamp_us(self, index: int | np.ndarray) -> int | np.ndarray:
        return self.start_us + np.asarray(index, dtype=np.int64) * self.step_us


@dataclass
class SeriesTable:
    """All series of a dataset, in ``series_id`` order, plus what was read."""

    series: list[Series]
    covariate_names: list[str]
    resolution_minutes: int
    source: str

    @property
    def n_points(self) -> int:
        return sum(series.n_points for series in self.series)

    def index_of(self) -> dict[str, int]:
        return {series.series_id: i for i, series in enumerate(self.series)}


def read_table(path: storage.Location) -> pa.Table:
    """Read a Parquet or CSV file into Arrow, with a clear error for a missing or unreadable file."""
    try:
        if not storage.is_file(path):
            raise DataError(f"Data file not found: {path}", path=str(path))
        if storage.suffix(path) in {".csv", ".txt"}:
            # Ids as written: type-guessing would read ``007`` and ``7`` as one integer series (leading zeros lost).
            ids_as_text = pa_csv.ConvertOptions(column_types={"series_id": pa.string()})
            return pa_csv.read_csv(storage.open_input_file(path), convert_options=ids_as_text)
        return storage.read_parquet(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"Cannot read data file {path}: {exc}", path=str(path)) from exc


def load_series(
    path: storage.Location,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
) -> SeriesTable:
    """Read ``path`` and lay it out as dense series on a ``resolution_minutes`` grid."""
    return series_from_table(read_table(path), resolution_minutes, covariates, source=str(path))


def series_from_table(
    table: pa.Table,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    *,
    source: str = "<table>",
) -> SeriesTable:
    """Validate an Arrow table against the input contract and build dense series from it."""
    missing = [name for name in (*REQUIRED_COLUMNS, *covariates) if name not in table.column_names]
    if missing:
        declared = [name for name in missing if name in covariates]
        hint = f" (declared covariates {declared} are not columns of the data)" if declared else ""
        raise DataError(f"{source}: missing column(s) {missing}{hint}; the file has {table.column_names}.", path=source)
    extra = [name for name in table.column_names if name not in (*REQUIRED_COLUMNS, *covariates)]
    if extra:
        logger.warning("%s: ignoring column(s) %s that are not declared covariates", source, extra)
    if table.num_rows == 0:
        raise DataError(f"{source}: the data has no rows.", path=source)

    series_ids = _series_ids(table["series_id"], source)
    timestamps = _timestamps_us(table["timestamp"], source)
    values = _floats(table, "y", source)
    covariate_values = [_floats(table, name, source) for name in covariates]

    order = np.lexsort((timestamps, series_ids))
    sorted_ids, sorted_ts = series_ids[order], timestamps[order]
    same_series = sorted_ids[1:] == sorted_ids[:-1]
    duplicate = same_series & (sorted_ts[1:] == sorted_ts[:-1])
    if duplicate.any():
        rows = np.sort(np.unique(np.concatenate([order[1:][duplicate], order[:-1][duplicate]])))
        raise DataError(
            f"{source}: duplicate (series_id, timestamp) at rows {_rows(rows)} "
            f"(e.g. series {sorted_ids[1:][duplicate][0]!r} at {_iso(int(sorted_ts[1:][duplicate][0]))}).",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    step_us = resolution_minutes * _US_PER_MINUTE
    boundaries = np.flatnonzero(~same_series) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(order)]])
    first_ts = np.repeat(sorted_ts[starts], ends - starts)
    offsets = sorted_ts - first_ts
    off_grid = offsets % step_us != 0
    if off_grid.any():
        rows = np.sort(order[off_grid])
        raise DataError(
            f"{source}: timestamps off the {resolution_minutes}-minute grid of their series at rows {_rows(rows)} "
            f"(e.g. {_iso(int(sorted_ts[off_grid][0]))} in series {sorted_ids[off_grid][0]!r}).",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    _check_grid_sizes(sorted_ids, sorted_ts, order, starts, ends, step_us=step_us, source=source)
    _check_total_grid_size(sorted_ids, sorted_ts, starts, ends, step_us, 1 + len(covariate_values), source)
    gaps = np.diff(sorted_ts)[same_series] // step_us
    common = int(np.gcd.reduce(gaps)) if gaps.size else 1
    if common > 1:
        raise DataError(
            f"{source}: the data is on a {common * resolution_minutes}-minute grid, but the checkpoint expects "
            f"{resolution_minutes}-minute resolution. Resample the data or use a matching checkpoint.",
            path=source,
        )

    result: list[Series] = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = order[start:end]
        positions = offsets[start:end] // step_us
        n_points = int(positions[-1]) + 1
        dense = np.full(n_points, np.nan)
        dense[positions] = values[rows]
        covariate_block = np.full((len(covariate_values), n_points), np.nan)
        for k, column in enumerate(covariate_values):
            covariate_block[k, positions] = column[rows]
        result.append(
            Series(
                series_id=str(sorted_ids[start]),
                start_us=int(sorted_ts[start]),
                step_us=step_us,
                values=dense,
                covariates=covariate_block,
            )
        )
    return SeriesTable(result, list(covariates), resolution_minutes, source)


def _series_ids(column: pa.ChunkedArray, source: str) -> np.ndarray:
    """``series_id`` as a numpy array of str, exactly as written; empty, null and oversized ids name their rows.

    Strings are kept as they are (``007`` and ``7`` are two series). An integer column (Parquet, Arrow) is read as
    its decimal text, the only way an integer is written; floats are refused, since ``7.0`` and ``7`` print alike.
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
        raise DataError(
            f"{source}: empty series_id at rows {_rows(rows)}; every row must name its series.",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    long = pc.greater(pc.binary_length(ids), MAX_SERIES_ID_BYTES)
    if pc.any(long).as_py():
        rows = np.flatnonzero(long.to_numpy(zero_copy_only=False))
        longest = pc.max(pc.binary_length(ids)).as_py()
        raise DataError(
            f"{source}: series_id longer than {MAX_SERIES_ID_BYTES:,} bytes at rows {_rows(rows)} (the longest: "
            f"{longest:,} bytes). Ids are copied into every output row and fixed-width id arrays; use a shorter key.",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    # Through a dictionary: Arrow's own string -> numpy conversion imports pandas (0.3 s of the driver's CPU,
    # measured), and the few distinct ids become one Python string each instead of one per row.
    encoded = ids.combine_chunks().dictionary_encode()
    distinct = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    return distinct[encoded.indices.to_numpy(zero_copy_only=False)]


def _timestamps_us(column: pa.ChunkedArray, source: str) -> np.ndarray:
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
        raise DataError(f"{source}: empty timestamps at rows {_rows(rows)}.", path=source)
    # The integer behind an Arrow timestamp is the UTC instant in the type's unit, whatever its time zone.
    raw = pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)
    if kind.unit == "ns":
        fractional = raw % 1_000 != 0
        if fractional.any():
            rows = np.flatnonzero(fractional)
            example = str(np.datetime64(int(raw[rows[0]]), "ns")) + "Z"
            raise DataError(
                f"{source}: timestamps with sub-microsecond parts at rows {_rows(rows)} (e.g. {example}): they lie "
                "on no minute grid. Round them to the data's resolution.",
                path=source,
                rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
            )
        return _within_calendar(raw // 1_000, source)
    factor = _US_PER_UNIT[kind.unit]
    out_of_range = np.abs(raw) > np.iinfo(np.int64).max // factor
    if out_of_range.any():
        rows = np.flatnonzero(out_of_range)
        raise DataError(
            f"{source}: timestamps out of range at rows {_rows(rows)} (more than 292,000 years from 1970).",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    return _within_calendar(raw * factor, source)


def _within_calendar(timestamps_us: np.ndarray, source: str) -> np.ndarray:
    """Refuse instants outside years 1-9999: differences of int64 microseconds near its limits overflow (a grid of
    "negative dimensions"), and no calendar, Python's ``datetime`` included, can print such a forecast."""
    outside = (timestamps_us < MIN_TIMESTAMP_US) | (timestamps_us > MAX_TIMESTAMP_US)
    if outside.any():
        rows = np.flatnonzero(outside)
        raise DataError(
            f"{source}: timestamps outside years 1-9999 at rows {_rows(rows)} (e.g. {int(timestamps_us[rows[0]]):,} "
            "microseconds from 1970). Fix or drop those rows.",
            path=source,
            rows=rows[:_MAX_ROWS_IN_MESSAGE].tolist(),
        )
    return timestamps_us


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
    sorted_ids: np.ndarray,
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
        f"{source}: series {str(sorted_ids[start])!r} spans {int(n_points[first]):,} grid steps for "
        f"{int(n_rows[first]):,} rows{others}: its largest gap, {gap_us // step_us:,} steps ({_duration(gap_us)}), "
        f"lies between rows {before} ({_iso(int(sorted_ts[widest]))}) and {after} "
        f"({_iso(int(sorted_ts[widest + 1]))}). A timestamp that far away is usually a wrong one: fix or drop "
        f"those rows (a series may be at most {1 - 1 / GRID_POINTS_PER_ROW:.0%} missing).",
        path=source,
        rows=[before, after],
    )


def _check_total_grid_size(
    sorted_ids: np.ndarray,
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
        f"{str(sorted_ids[starts[widest]])!r}, spans {int(n_points[widest]):,} steps for "
        f"{int(ends[widest] - starts[widest]):,} rows: drop sparse series or resample the data.",
        path=source,
    )


def _duration(span_us: int) -> str:
    days = span_us / (86_400 * 1_000_000)
    return f"{days / 365.25:,.1f} years" if days >= 365.25 else f"{days:,.1f} days"


def _floats(table: pa.Table, name: str, source: str) -> np.ndarray:
    try:
        column = pc.cast(table[name], pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(f"{source}: column {name!r} must be numeric, found {table[name].type}.", path=source) from exc
    array = column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if np.isinf(array).any():
        rows = np.flatnonzero(np.isinf(array))
        raise DataError(f"{source}: column {name!r} has infinite values at rows {_rows(rows)}.", path=source)
    return array


def _rows(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_ROWS_IN_MESSAGE])
    more = f" and {len(rows) - _MAX_ROWS_IN_MESSAGE} more" if len(rows) > _MAX_ROWS_IN_MESSAGE else ""
    return f"[{shown}]{more}"


def _iso(timestamp_us: int) -> str:
    return str(np.datetime64(timestamp_us, "us")) + "Z"
