"""The long ``metrics`` table from an accumulator's sums: every unit (global, each series, each lead) at once.

The sums are divided only here (:mod:`.metrics` keeps them mergeable), each metric as its class in :mod:`.registry`
defines it, for every unit of a scope at once (a Python loop per unit costs the driver's CPU per series).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx.evaluation.scoring.registry import POOLED, PooledSums, of_convention
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE

__all__ = [
    "METRICS_SCHEMA",
    "POOLED",
    "SERIES_PER_TABLE",
    "RowLayout",
    "SortedSeries",
    "metrics_table",
    "metrics_tables",
    "sorted_series",
    "unit_column",
]

F64 = npt.NDArray[np.float64]

#: The long ``metrics`` table (docs/design.md, Outputs).
METRICS_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("series_id", pa.string()),
        pa.field("lead", pa.int32()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("quantile", pa.float64()),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("convention", pa.string(), nullable=False),
    ]
)
#: Series per table when the metrics are written a table at a time (:func:`metrics_tables`): with 9 quantiles
#: ~150,000 rows (18 per series), a few MB.
SERIES_PER_TABLE = 8192


def metrics_table(
    model: str,
    quantiles: Sequence[float],
    intervals: Sequence[tuple[float, float]],
    has_median: bool,
    series_index: Mapping[str, int],
    series: Mapping[str, F64],
    leads: Mapping[str, F64],
) -> pa.Table:
    """The long table: global rows, then one block per series (sorted by id), then one per lead.

    ``series`` and ``leads`` hold each sum of :mod:`.metrics` per unit (``[units, ...]``); ``series_index`` maps a
    series id to its row of ``series``. The same rows as :func:`metrics_tables`, in one table.
    """
    layout = RowLayout(quantiles, intervals, has_median)
    tables = metrics_tables(model, layout, series_index, series, leads, max(len(series_index), 1))
    return pa.concat_tables(list(tables))


def metrics_tables(
    model: str,
    layout: RowLayout,
    series_index: Mapping[str, int],
    series: Mapping[str, F64],
    leads: Mapping[str, F64],
    series_per_table: int = SERIES_PER_TABLE,
    *,
    with_series: bool = True,
) -> Iterator[pa.Table]:
    """:func:`metrics_table`'s rows as a sequence of tables: the global rows, the series block in tables of
    ``series_per_table`` series (sorted by id), then the lead rows; without the series block when not
    ``with_series`` (the run-wide rows, built without a row per series).

    A writer that takes them one at a time holds one table of a few hundred thousand rows, not the whole table
    (5.4 M rows at 100,000 series: benchmarks/results/time_to_results.md). Each row's arithmetic is the whole
    table's (per unit, on the same sums), so the rows are the same whatever ``series_per_table``.
    """
    if series_per_table < 1:
        raise ValueError(f"series_per_table must be at least 1; got {series_per_table}")
    global_sums = {name: values.sum(axis=0)[None, ...] for name, values in series.items()}
    yield _scope_table(model, "global", global_sums, layout)
    order = sorted_series(series_index if with_series else {})
    for start in range(0, len(order.ids), series_per_table):
        rows = order.rows[start : start + series_per_table]
        sums = {name: values[rows] for name, values in series.items()}
        ids = order.ids[start : start + series_per_table]
        yield _scope_table(model, "series", sums, layout, ids)
    yield _scope_table(model, "lead", dict(leads), layout)


class RowLayout(NamedTuple):
    """What decides a unit's rows besides its sums: the quantiles, their central intervals, a median or not."""

    quantiles: Sequence[float]
    intervals: Sequence[tuple[float, float]]
    has_median: bool


class SortedSeries(NamedTuple):
    """The series of an accumulator sorted by id (the order of the table's series block) and their rows."""

    ids: list[str]
    rows: npt.NDArray[np.intp]


def sorted_series(series_index: Mapping[str, int]) -> SortedSeries:
    ids = sorted(series_index)
    return SortedSeries(ids, np.asarray([series_index[sid] for sid in ids], dtype=np.intp))


def unit_column(
    sums: Mapping[str, F64],
    layout: RowLayout,
    metric: str,
    quantile: float | None = None,
) -> tuple[F64, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """One metric of every unit of ``sums`` (``[U, ...]``): (value, n, kept), each ``[U]``, as the table's rows
    of that metric have them (a unit without the row: ``kept`` False). Unknown metric or level: nothing kept."""
    metric_names, levels, values, counts, kept = _unit_rows(sums, *layout)
    for column, (name, level) in enumerate(zip(metric_names, levels.tolist(), strict=True)):
        same_level = math.isnan(level) if quantile is None else abs(level - quantile) <= LEVEL_TOLERANCE
        if name == metric and same_level:
            return values[:, column], counts[:, column], kept[:, column]
    units = sums["pairs"].shape[0]
    return np.full(units, np.nan), np.zeros(units, dtype=np.int64), np.zeros(units, dtype=bool)


def _scope_table(
    model: str,
    scope: str,
    sums: Mapping[str, F64],
    layout: RowLayout,
    series_ids: Sequence[str] = (),
) -> pa.Table:
    """The rows of one scope's units (``series_ids`` name the units of the series scope)."""
    metric_names, levels, values, counts, valid = _unit_rows(sums, *layout)
    unit, column = np.nonzero(valid)  # row-major: unit after unit, each in unit_rows' order
    n = unit.size
    columns: dict[str, pa.Array] = {"model": _repeated(model, n), "scope": _repeated(scope, n)}
    if scope == "series":
        columns["series_id"] = _decoded(unit, list(series_ids))
    else:
        columns["series_id"] = pa.nulls(n, pa.string())
    columns["lead"] = pa.array((unit + 1).astype(np.int32)) if scope == "lead" else pa.nulls(n, pa.int32())
    columns["metric"] = _decoded(column, metric_names)
    level = levels[column]
    columns["quantile"] = pa.array(level, pa.float64(), mask=np.isnan(level))
    columns["value"] = pa.array(values[unit, column], pa.float64())
    columns["n"] = pa.array(counts[unit, column], pa.int64())
    columns["convention"] = _repeated(POOLED, n)
    arrays = [columns[name].cast(field.type) for name, field in zip(METRICS_SCHEMA.names, METRICS_SCHEMA, strict=True)]
    return pa.Table.from_arrays(arrays, schema=METRICS_SCHEMA)


def _decoded(indices: npt.NDArray[np.integer[Any]], texts: Sequence[str]) -> pa.Array:
    """``texts[indices]`` as one string array, decoded by Arrow from a dictionary: the table's text columns hold
    a few distinct values over millions of rows, where one Python string object per row cost the driver seconds
    at 40,000 series (benchmarks/results/time_to_results.md)."""
    dictionary = pa.array(list(texts), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32, copy=False)), dictionary).cast(pa.string())


def _repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times as a string array (:func:`_decoded` of one value)."""
    return _decoded(np.zeros(n, dtype=np.int32), [text])


def _unit_rows(
    sums: Mapping[str, F64],
    quantiles: Sequence[float],
    intervals: Sequence[tuple[float, float]],
    has_median: bool,
) -> tuple[list[str], F64, F64, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Every pooled metric of every unit at once: (metric per column, quantile per column, value, n, kept).

    ``sums`` holds each field for ``U`` units (``[U, ...]``); the columns are every row a unit can have, in the
    registry's order (:data:`.registry.METRICS`), and ``kept[U, R]`` says which it does have: its metric's
    ``defined_by`` sum is positive, and the median is forecast where the metric needs it.
    """
    units = sums["pairs"].shape[0]
    view = PooledSums(sums)
    metric_names: list[str] = []
    levels: list[float] = []
    values, counts, kept = [], [], []
    with np.errstate(divide="ignore", invalid="ignore"):
        for metric in of_convention(POOLED):
            of_level = metric.levels(quantiles, intervals)
            width = 1 if of_level is None else len(of_level)
            value = metric.value(view).reshape(units, width)
            metric_names += [metric.name] * width
            levels += of_level if of_level is not None else [np.nan]
            values.append(value)
            counts += [sums[metric.count].astype(np.int64)] * width
            kept += [(sums[metric.defined_by] > 0) & (has_median or not metric.needs_median)] * width
    return (
        metric_names,
        np.asarray(levels, dtype=np.float64),
        np.concatenate(values, axis=1),
        np.column_stack(counts).reshape(units, len(metric_names)),
        np.column_stack(kept).reshape(units, len(metric_names)),
    )
