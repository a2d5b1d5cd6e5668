"""The vintage table (``--covariate-data``) read and indexed for the run's series, once, by the load stage.

What the actors join from it, as of each window's cutoff, is :mod:`distributed_onnx.evaluation.data.vintages`
(the index, :class:`~distributed_onnx.evaluation.data.vintages.CovariateVintages`, and the join itself); this
module builds that index from the user's file and refuses, naming the file and the rows, what it cannot hold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.bounds import MAX_LATENCY_MINUTES
from distributed_onnx.errors import DataError, Suggestion
from distributed_onnx.evaluation.data.column_values import float_column, timestamps_us
from distributed_onnx.evaluation.data.layout import SeriesTable
from distributed_onnx.evaluation.data.row_errors import rows_error, rows_text
from distributed_onnx.evaluation.data.table import read_table
from distributed_onnx.evaluation.data.vintages import (
    AVAILABLE_AT,
    SERIES_ID,
    TIMESTAMP,
    CovariateVintages,
    VintageColumn,
    VintagedCovariates,
)
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location

logger = logging.getLogger(__name__)


def read_vintaged(settings: BacktestSettings, names: Sequence[str], table: SeriesTable) -> VintagedCovariates | None:
    """``--covariate-data`` read and indexed for the run's series (``table``), its covariates of ``names``; None
    without it. The run's covariate rows keep the settings' order; the others come from the input table."""
    if settings.covariate_data is None:
        return None
    step_us, latency_us = table.resolution_minutes * 60_000_000, settings.covariate_latency * 60_000_000
    vintages = read_vintages(
        settings.covariate_data, names, step_us, table.series_ids, latency_us, series_start_us=table.start_us
    )
    return VintagedCovariates(tuple(settings.covariate_columns), vintages)


def read_vintages(
    path: Location,
    names: Sequence[str],
    step_us: int,
    series_ids: Sequence[str],
    latency_us: int = 0,
    series_start_us: np.ndarray | None = None,
) -> CovariateVintages:
    """Read and index the vintage table: the covariates of ``names`` it holds (others stay the input table's).

    Errors name the file and the rows: a missing ``timestamp`` or ``available_at`` column, no rows, empty or
    off-grid timestamps, non-numeric, infinite or beyond-float32 values, two values for one (series, timestamp,
    available_at), series ids none of which is a series of the run.
    """
    starts = series_start_us
    return index_vintages(read_table(path), names, step_us, series_ids, latency_us, str(path), series_start_us=starts)


def index_vintages(
    table: pa.Table,
    names: Sequence[str],
    step_us: int,
    series_ids: Sequence[str],
    latency_us: int = 0,
    source: str = "covariate data",
    *,
    series_start_us: np.ndarray | None = None,
) -> CovariateVintages:
    """:func:`read_vintages` on a table in memory (the Python API passes one).

    ``series_start_us`` (each run series' first instant, in ``series_ids`` order) puts the timestamps on the
    data's grid: a vintage 15 minutes off it would otherwise be read for the step it floors to. Without it the
    timestamps need only share one grid among themselves.
    """
    check_latency_us(latency_us, source)
    for required in (TIMESTAMP, AVAILABLE_AT):
        if required not in table.column_names:
            raise DataError(
                f"{source}: the covariate data needs columns {TIMESTAMP!r} and {AVAILABLE_AT!r}; "
                f"{required!r} is missing (columns: {table.column_names})",
                path=source,
            )
    held = [name for name in names if name in table.column_names]
    if not held:
        raise DataError(
            f"{source}: none of the declared covariates {list(names)} is a column of the covariate data "
            f"(columns: {table.column_names})",
            path=source,
        )
    if table.num_rows == 0:
        raise DataError(
            f"{source}: the covariate data has no rows; give at least one vintage.",
            path=source,
            suggestions=(Suggestion("Or drop {}.", (("covariate_data", None),)),),
        )
    # The columns as numbers first, each checked by the input table's own converters; then the index.
    stamps = timestamps_us(table[TIMESTAMP], source)
    issued = timestamps_us(table[AVAILABLE_AT], source)
    values_of = {name: float_column(table, name, source) for name in held}
    per_series = SERIES_ID in table.column_names
    codes: dict[str, int] = {}
    if per_series:
        keys = _series_keys(table[SERIES_ID], series_ids, source)
        codes = {series_id: index for index, series_id in enumerate(series_ids)}
        n_keys = max(len(series_ids), 1)
    else:
        keys = np.zeros(stamps.size, dtype=np.int64)
        n_keys = 1
    _check_grid(stamps, keys, per_series, step_us, series_ids, series_start_us, source)
    first_us = int(stamps.min())
    steps = (stamps - first_us) // step_us
    n_steps = int(steps.max()) + 1
    ranks = np.unique(issued)
    if n_keys * n_steps * ranks.size >= 2**62:
        raise DataError(f"{source}: too many series x timestamps x issue times to index", path=source)
    group = keys * n_steps + steps
    search = group * ranks.size + np.searchsorted(ranks, issued)
    known = keys >= 0  # rows of series not in the run are left out
    columns = {}
    for name, values in values_of.items():
        keep = known & ~np.isnan(values)  # a null vintage is no vintage: an earlier one stays in force
        order = np.argsort(search[keep], kind="stable")
        sorted_keys = search[keep][order]
        duplicate = np.flatnonzero(np.diff(sorted_keys) == 0)
        if duplicate.size:
            rows = np.flatnonzero(keep)[order][duplicate]
            twice = f"covariate {name!r} has two values for one (series, timestamp, available_at) at rows"
            raise rows_error(source, twice, rows)
        columns[name] = VintageColumn(
            np.ascontiguousarray(sorted_keys),
            np.ascontiguousarray(values[keep][order]),
            np.ascontiguousarray(issued[keep][order]),
        )
    return CovariateVintages(
        source=source,
        names=tuple(held),
        step_us=step_us,
        first_us=first_us,
        n_steps=n_steps,
        ranks=ranks,
        columns=columns,
        per_series=per_series,
        series_codes=codes,
        latency_us=latency_us,
    )


def check_latency_us(latency_us: int, source: str = "covariate data") -> None:
    """Refuse a latency the as-of arithmetic cannot hold (the settings bound it first, in minutes)."""
    if not 0 <= latency_us <= MAX_LATENCY_MINUTES * 60_000_000:
        raise DataError(
            f"{source}: covariate latency {latency_us} us is outside 0..{MAX_LATENCY_MINUTES} minutes (100 years).",
            path=source,
            suggestions=(Suggestion("Give a smaller {}.", (("covariate_latency", None),)),),
        )


def _series_keys(column: pa.ChunkedArray, series_ids: Sequence[str], source: str) -> np.ndarray:
    """Each row's series key (-1: a series not in the run). None matching is an error naming ids of both
    sides; some run series without a vintage is a warning."""
    ids = pc.cast(column, pa.string())
    if ids.null_count:
        rows = np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))
        raise DataError(f"{source}: empty series ids at rows {rows_text(rows)}", path=source)
    codes = {series_id: index for index, series_id in enumerate(series_ids)}
    encoded = pc.dictionary_encode(ids).combine_chunks()
    distinct = encoded.dictionary.to_pylist()
    lookup = np.asarray([codes.get(one, -1) for one in distinct], dtype=np.int64)
    keys = lookup[encoded.indices.to_numpy(zero_copy_only=False)]
    if series_ids and not (lookup >= 0).any():
        raise DataError(
            f"{source}: none of its series_id values ({_some(distinct)}, column type {column.type}) is a series "
            f"of the data ({_some(series_ids)}, read as text): every vintaged covariate would be missing. Write "
            "the ids exactly as the data does (integers and text of other digits never match), or drop series_id "
            "so the vintages hold for every series",
            path=source,
        )
    without = sorted(set(series_ids) - set(distinct))
    if without:
        logger.warning(
            "%s: %d of %d series have no vintages (%s): their vintaged covariates are missing at every step",
            source,
            len(without),
            len(series_ids),
            _some(without),
        )
    return keys


def _some(ids: Sequence[str], shown: int = 3) -> str:
    """``'a', 'b', 'c' and 7 more``: a few ids for a message."""
    listed = ", ".join(repr(one) for one in list(ids)[:shown])
    return listed + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _check_grid(
    stamps: np.ndarray,
    keys: np.ndarray,
    per_series: bool,
    step_us: int,
    series_ids: Sequence[str],
    series_start_us: np.ndarray | None,
    source: str,
) -> None:
    """Every timestamp on the grid of the series it is read for (see :func:`index_vintages`)."""
    minutes = step_us // 60_000_000
    if series_start_us is None or not len(series_ids):
        off_grid = (stamps - stamps.min()) % step_us != 0
        if off_grid.any():
            rows = np.flatnonzero(off_grid)
            raise rows_error(source, f"timestamps off the checkpoint's {minutes}-minute grid at rows", rows)
        return
    starts = np.asarray(series_start_us, dtype=np.int64)
    if per_series:
        known = keys >= 0
        anchor = np.where(known, starts[np.where(known, keys, 0)], stamps)  # rows of other series are not read
        off_grid = (stamps - anchor) % step_us != 0
        if off_grid.any():
            rows = np.flatnonzero(off_grid)
            example = f"{_iso(int(stamps[rows[0]]))} for series {series_ids[int(keys[rows[0]])]!r}"
            grid = f"its series starting {_iso(int(starts[int(keys[rows[0]])]))}"
            after = f" (e.g. {example}, whose grid runs from {grid}): align them with the data's timestamps."
            raise rows_error(source, f"timestamps off the data's {minutes}-minute grid at rows", rows, after)
        return
    phases = starts % step_us
    if (phases != phases[0]).any():
        other = int(np.flatnonzero(phases != phases[0])[0])
        raise DataError(
            f"{source}: the covariate data has no series_id, so its values hold for every series, but the data's "
            f"series lie on different {minutes}-minute grids ({series_ids[0]!r} starts {_iso(int(starts[0]))}, "
            f"{series_ids[other]!r} {_iso(int(starts[other]))}): add a series_id column",
            path=source,
        )
    off_grid = (stamps - starts[0]) % step_us != 0
    if off_grid.any():
        rows = np.flatnonzero(off_grid)
        after = (
            f" (e.g. {_iso(int(stamps[rows[0]]))}; the data's grid runs from {_iso(int(starts[0]))}): align them "
            "with the data's timestamps."
        )
        raise rows_error(source, f"timestamps off the data's {minutes}-minute grid at rows", rows, after)


def _iso(timestamp_us: int) -> str:
    return str(np.datetime64(timestamp_us, "us")) + "Z"
