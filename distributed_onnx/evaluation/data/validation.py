"""The input table checked against its contract and laid out as dense series: :func:`validate_table`.

Checks the contract of docs/design.md on a table already read (:mod:`.table`): non-empty ids, UTC timestamps on
a regular grid, no duplicates; then lays each series out on its own dense grid (:mod:`.layout`), where gaps
become NaN. Every error names the source and, where rows are at fault, the rows (:mod:`.row_errors`).

The dense grid is sized by each series' time span, not by its rows, so its memory is bounded here: a series
may hold at most :data:`GRID_POINTS_PER_ROW` grid points per row of data (plus :data:`GRID_SLACK_POINTS`).
One stray timestamp decades away (an epoch-zero parse, a typo in the year) would otherwise allocate the whole
span (50 years at 5 minutes is 5.3 M points, 42 MB per column, per series), and a forecast across that hole
would be meaningless anyway; so it is refused, naming the rows on both sides of the largest gap, rather
than silently trimmed (which row is the stray one is the user's call, and dropping data silently would not be).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.bounds import MAX_SERIES_ID_BYTES
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.column_values import covariate_column, float_column, numpy_view, timestamps_us
from distributed_onnx.evaluation.data.layout import SeriesTable, dense_layout
from distributed_onnx.evaluation.data.row_errors import rows_error

#: A series' dense grid may hold this many points per row of data: at most 90% of it missing.
GRID_POINTS_PER_ROW = 10
#: ... plus this many, so that short series with a few gaps are never refused.
GRID_SLACK_POINTS = 1_000
#: Every dense series together may hold this many grid points beyond :data:`GRID_POINTS_PER_ROW` per row: the
#: per-series bound alone lets a million two-row series each span 1,010 steps (8 GB of float64, per column).
TOTAL_GRID_SLACK_POINTS = 10_000_000
_US_PER_MINUTE = 60_000_000


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
    """:func:`~.table.series_from_table` of a table whose columns were checked (:func:`~.columns.check_columns`), also
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


def _iso(timestamp_us: int) -> str:
    return str(np.datetime64(timestamp_us, "us")) + "Z"
