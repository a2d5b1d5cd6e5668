"""A large sorted Parquet input, read in streamed chunks: the driver keeps a small summary per series.

Reading the whole input and holding every series dense made the driver's memory grow with the data (several
GB at 100,000 series, ``benchmarks/results/time_to_results.md``). When the input is a Parquet file of more
than one chunk (:data:`STREAM_CHUNK_ROWS`), sorted by ``series_id`` then ``timestamp`` (how files are usually
written), :func:`scan_sorted_parquet` reads it chunk by chunk over the needed columns, checks each chunk with
the same code as the whole-table reader (:func:`~..data.validation.validate_table`), counts each series' windows,
and keeps per series only its id, first instant, grid length and rows in the file
(:class:`~..data.rows.SeriesRows`). The actors then read the rows of the series of their part themselves
(:mod:`..data.rows`), a few row groups at a time.

Whatever the scan cannot vouch for (unsorted or ungrouped rows, CSV, any data error, a series on a coarser grid
than the others) makes it give up (``None``), and the caller reads the whole table as before: every error then
comes from the same checks and names the same file and rows, and unsorted inputs keep working (in memory). A
store that does not answer is raised at once, the whole read's error (it would only ask the store again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data import column_values
from distributed_onnx.evaluation.data.columns import REQUIRED_COLUMNS, check_columns, check_unique
from distributed_onnx.evaluation.data.layout import SeriesArrays, SeriesTable
from distributed_onnx.evaluation.data.log_filters import once_per_message
from distributed_onnx.evaluation.data.rows import SeriesRows
from distributed_onnx.evaluation.data.validation import GRID_POINTS_PER_ROW, TOTAL_GRID_SLACK_POINTS, validate_table
from distributed_onnx.evaluation.data.windows import WindowPlan, WindowSpec, plan_windows
from distributed_onnx.location import Location

#: Rows checked at once by the driver's streamed scan (bounds its memory; inputs up to this size are read whole).
STREAM_CHUNK_ROWS = 1 << 19
_US_PER_MINUTE = 60_000_000


@dataclass(frozen=True)
class Scanned:
    """What the streamed scan keeps: the table's index of series, each series' window count and the file's columns."""

    table: SeriesTable
    windows: WindowPlan
    schema: pa.Schema


@dataclass
class _Summaries:
    """Per-series summaries gathered chunk by chunk."""

    ids: list[tuple[str, ...]] = field(default_factory=list)
    start_us: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    skipped: int = 0
    capped: int = 0
    capped_series: list[str] = field(default_factory=list)

    def add(self, arrays: SeriesArrays, rows_per_series: np.ndarray, plan: WindowPlan) -> None:
        self.ids.append(arrays.series_ids)
        self.start_us.append(arrays.start_us)
        self.lengths.append(arrays.lengths)
        self.rows.append(rows_per_series)
        self.counts.append(plan.counts)
        self.skipped += plan.skipped
        self.capped += plan.capped
        self.capped_series += list(plan.capped_series)[: 3 - len(self.capped_series)]


def scan_sorted_parquet(
    location: Location,
    resolution_minutes: int,
    covariates: Sequence[str],
    spec: WindowSpec,
    chunk_rows: int | None = None,
) -> Scanned | None:
    """Check a sorted Parquet input chunk by chunk and plan its windows, keeping per-series summaries only.

    ``None`` when the input is not a Parquet file of more than one chunk, sorted by (series_id, timestamp), that
    passes every check chunk by chunk: the caller then reads it whole (see the module docstring). A store that
    does not answer (:func:`~distributed_onnx.storage_unanswered.unanswered`) is the one error raised here: the
    whole read would ask it again and the user would wait out the store client's retries twice before hearing it.
    """
    name = str(location)
    chunk_rows = chunk_rows or STREAM_CHUNK_ROWS
    if location.suffix in {".csv", ".txt"}:
        return None
    try:
        if not storage.is_file(location):
            return None
        source = storage.open_input_file(location)
        parquet = pq.ParquetFile(source)
    except (pa.ArrowInvalid, OSError) as exc:
        unanswered = storage.read_error(exc, location, "data file")
        if unanswered is not None:
            raise unanswered from exc
        return None
    try:
        metadata = parquet.metadata
        if metadata.num_rows <= chunk_rows:
            return None
        schema = parquet.schema_arrow
        names = schema.names
        check_unique(names, name)  # a repeated name is refused here, before a chunk is read
        if any(column not in names for column in (*REQUIRED_COLUMNS, *covariates)):
            return None  # the whole-table reader names what is missing
        check_columns(names, covariates, name)
        group_rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        with once_per_message(logging.getLogger(column_values.__name__)):
            summaries = _scan(parquet, name, resolution_minutes, covariates, spec, chunk_rows)
    finally:
        if hasattr(source, "close"):
            source.close()
    if summaries is None:
        return None
    return _scanned(location, summaries, group_rows, resolution_minutes, covariates, schema)


def _scan(
    parquet: pq.ParquetFile,
    name: str,
    resolution_minutes: int,
    covariates: Sequence[str],
    spec: WindowSpec,
    chunk_rows: int,
) -> _Summaries | None:
    summaries = _Summaries()
    columns = [*REQUIRED_COLUMNS, *covariates]
    pending: list[pa.Table] = []  # rows read and not checked yet: at most a chunk, plus one series' rows
    pending_rows = 0
    half = max(chunk_rows // 2, 1)  # checked once half a chunk is pending: chunks of half to one chunk of rows
    for batch in _batches(parquet, columns, half):
        pending.append(pa.Table.from_batches([batch]))
        pending_rows += batch.num_rows
        if pending_rows < half:
            continue
        rows = pa.concat_tables(pending)
        cut = _last_series_start(rows)
        if cut is None:
            return None
        pending, pending_rows = [rows.slice(cut)], rows.num_rows - cut
        if cut and not _add_chunk(rows.slice(0, cut), summaries, name, resolution_minutes, covariates, spec):
            return None
    if pending_rows:
        rows = pa.concat_tables(pending)
        if not _add_chunk(rows, summaries, name, resolution_minutes, covariates, spec):
            return None
    if not summaries.ids:
        return None
    n_rows = int(sum(int(rows.sum()) for rows in summaries.rows))
    total_points = int(sum(int(lengths.sum()) for lengths in summaries.lengths))
    if total_points > GRID_POINTS_PER_ROW * n_rows + TOTAL_GRID_SLACK_POINTS:
        return None  # the whole-table reader refuses it, naming the sparsest series
    return summaries


def _batches(parquet: pq.ParquetFile, columns: list[str], chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches, one row group at a time.

    One read over every row group kept what it had pre-buffered of the file until its end: the driver's memory
    grew by the file's size over the scan; per row group, the
    buffers of one row group at a time.
    """
    for group in range(parquet.num_row_groups):
        yield from parquet.iter_batches(batch_size=chunk_rows, row_groups=[group], columns=columns)


def _last_series_start(rows: pa.Table) -> int | None:
    """The first row of the trailing run of the last row's series id (rows after it may continue in the next
    batch); ``None`` for ids the whole-table reader must judge (null, of a type it refuses)."""
    try:
        ids = pc.cast(rows["series_id"], pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    last = ids[-1]
    if not last.is_valid:
        return None
    # Arrow's own conversions to numpy import pandas where it is installed (column_values.numpy_view): stay in Arrow.
    other = pc.indices_nonzero(pc.not_equal(ids, last).fill_null(True).combine_chunks())
    return int(other[-1].as_py()) + 1 if len(other) else 0


def _add_chunk(
    rows: pa.Table,
    summaries: _Summaries,
    name: str,
    resolution_minutes: int,
    covariates: Sequence[str],
    spec: WindowSpec,
) -> bool:
    """Check a chunk of whole series and add their summaries; False where the whole-table reader must decide."""
    kind = rows.schema.field("series_id").type
    if pa.types.is_floating(kind):
        return False
    try:
        checked = validate_table(rows, resolution_minutes, covariates, source=name)
    except DataError:
        return False
    if not checked.presorted:
        return False
    arrays = checked.table.arrays()
    if summaries.ids and not summaries.ids[-1][-1] < arrays.series_ids[0]:
        return False  # a series seen in an earlier chunk again: the file is not sorted by series
    windows = plan_windows(arrays, spec)
    summaries.add(arrays, checked.rows_per_series, windows)
    return True


def _scanned(
    location: Location,
    summaries: _Summaries,
    group_rows: list[int],
    resolution_minutes: int,
    covariates: Sequence[str],
    schema: pa.Schema,
) -> Scanned:
    lengths = np.concatenate(summaries.lengths)
    counts = np.concatenate(summaries.counts).astype(np.int64)
    rows = SeriesRows(
        location=location,
        series_ids=tuple(series_id for chunk in summaries.ids for series_id in chunk),
        start_us=np.concatenate(summaries.start_us).astype(np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        row_offsets=np.concatenate([[0], np.cumsum(np.concatenate(summaries.rows))]).astype(np.int64),
        group_offsets=np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64),
        step_us=resolution_minutes * _US_PER_MINUTE,
        covariate_names=tuple(covariates),
    )
    windows = WindowPlan(
        counts,
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        summaries.skipped,
        summaries.capped,
        tuple(summaries.capped_series),
    )
    return Scanned(SeriesTable(rows, list(covariates), resolution_minutes, str(location)), windows, schema)
