"""A large sorted Parquet input, read in streamed chunks: the driver keeps a small summary per series.

Reading the whole input and holding every series dense made the driver's memory grow with the data (several
GB at 100,000 series, ``benchmarks/results/time_to_results.md``). When the input is a Parquet file of more
than one chunk (:data:`STREAM_CHUNK_ROWS`), sorted by ``series_id`` then ``timestamp`` (how files are usually
written), :func:`scan_sorted_parquet` reads it chunk by chunk over the needed columns, checks each chunk with
the same code as the whole-table reader (:func:`.table.validate_table`), counts each series' windows, and keeps
per series only its id, first instant, grid length and rows in the file (:class:`SeriesRows`). The actors then
read the rows of the series of their part themselves (:meth:`SeriesRows.arrays`), a few row groups at a time.

Whatever the scan cannot vouch for (unsorted or ungrouped rows, CSV, any data error, a series on a coarser grid
than the others) makes it give up (``None``), and the caller reads the whole table as before: every error then
comes from the same checks and names the same file and rows, and unsorted inputs keep working (in memory).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data import table as table_module
from distributed_onnx.evaluation.data.layout import FlatSeries, Series, SeriesArrays, SeriesTable
from distributed_onnx.evaluation.data.table import (
    GRID_POINTS_PER_ROW,
    REQUIRED_COLUMNS,
    TOTAL_GRID_SLACK_POINTS,
    check_columns,
    float_column,
    timestamps_us,
    validate_table,
)
from distributed_onnx.evaluation.data.windows import WindowPlan, WindowSpec, plan_windows

logger = logging.getLogger(__name__)

#: Rows checked at once by the driver's streamed scan (bounds its memory; inputs up to this size are read whole).
STREAM_CHUNK_ROWS = 1 << 19
#: Decoded row groups an actor keeps: consecutive parts of one actor usually share their row groups.
CACHED_ROW_GROUPS = 2
_US_PER_MINUTE = 60_000_000


@dataclass(frozen=True, eq=False)
class SeriesRows(FlatSeries):
    """Every series of a sorted Parquet input by where its rows are: no values (the ``input_file`` transport).

    Series ``s`` has rows ``row_offsets[s]..row_offsets[s + 1]`` of the file, sorted by time, and spans grid
    points ``offsets[s]..offsets[s + 1]`` from ``start_us[s]``. The driver checked every row; :meth:`arrays`
    checks again that the rows it reads are those (a file replaced mid-run is refused, never forecast silently).
    """

    location: storage.Location
    series_ids: tuple[str, ...]
    start_us: np.ndarray  # int64 [S]
    offsets: np.ndarray  # int64 [S + 1]
    row_offsets: np.ndarray  # int64 [S + 1]
    group_offsets: np.ndarray  # int64 [G + 1]: first row of each row group of the file
    step_us: int
    covariate_names: tuple[str, ...]
    _groups: OrderedDict[int, tuple[pa.Array, np.ndarray, list[np.ndarray]]] = field(
        default_factory=OrderedDict, repr=False
    )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_groups"] = OrderedDict()  # decoded row groups stay where they were read
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def nbytes(self) -> int:
        """What the dense layout of every series would take (the object store's size, were it used)."""
        return int(self.offsets[-1]) * 8 * (1 + len(self.covariate_names))

    @property
    def n_rows(self) -> int:
        return int(self.row_offsets[-1])

    def __len__(self) -> int:
        return len(self.series_ids)

    def series(self, index: int) -> Series:
        return self[index]

    @overload
    def __getitem__(self, index: int) -> Series: ...

    @overload
    def __getitem__(self, index: slice) -> list[Series]: ...

    def __getitem__(self, index: int | slice) -> Series | list[Series]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"series index {index} out of range for {len(self)} series")
        return self.arrays(index, index + 1).series(index)

    def __iter__(self) -> Iterator[Series]:
        for lo in range(0, len(self), 1024):
            hi = min(lo + 1024, len(self))
            arrays = self.arrays(lo, hi)
            for index in range(lo, hi):
                yield arrays.series(index)

    def arrays(self, lo: int, hi: int) -> SeriesArrays:
        """The flat layout with the values of series ``lo..hi``, read from their rows (vector passes, no loop).

        Its ``offsets`` are shifted so that series ``lo`` starts at 0: series outside ``lo..hi`` have no values.
        """
        lo, hi = max(lo, 0), min(hi, len(self))
        first_row, stop_row = int(self.row_offsets[lo]), int(self.row_offsets[hi]) if hi > lo else 0
        base = int(self.offsets[lo]) if hi > lo else 0
        n_points = int(self.offsets[hi]) - base if hi > lo else 0
        values = np.full(n_points, np.nan)
        covariates = np.full((len(self.covariate_names), n_points), np.nan)
        if hi > lo:
            ids, stamps, columns = self._read_rows(first_row, stop_row)
            rows_per_series = np.diff(self.row_offsets[lo : hi + 1])
            local = np.repeat(np.arange(hi - lo, dtype=np.int64), rows_per_series)
            positions, off_grid = np.divmod(stamps - self.start_us[lo:hi][local], self.step_us)
            lengths = self.lengths[lo:hi]
            firsts = self.row_offsets[lo:hi] - first_row
            lasts = self.row_offsets[lo + 1 : hi + 1] - 1 - first_row
            later = np.diff(positions) > 0
            same = local[1:] == local[:-1]
            unchanged = (
                not off_grid.any()
                and bool(np.all(positions[firsts] == 0))
                and bool(np.all(positions[lasts] == lengths - 1))
                and bool(np.all(later | ~same))
                and ids.at(firsts) == list(self.series_ids[lo:hi])
                and ids.at(lasts) == list(self.series_ids[lo:hi])
            )
            if not unchanged:
                raise DataError(
                    f"{self.location}: the rows of series {self.series_ids[lo]!r}..{self.series_ids[hi - 1]!r} "
                    "changed since the run was planned; do not replace the input file during a run.",
                    path=str(self.location),
                )
            flat = self.offsets[lo:hi][local] - base + positions
            values[flat] = columns[0]
            for k, column in enumerate(columns[1:]):
                covariates[k, flat] = column
        return SeriesArrays(
            series_ids=self.series_ids,
            start_us=self.start_us,
            offsets=self.offsets - base,
            values=values,
            covariates=covariates,
            step_us=self.step_us,
        )

    def _read_rows(self, first: int, stop: int) -> tuple[_Ids, np.ndarray, list[np.ndarray]]:
        """Rows ``first..stop`` of the file: ids, timestamps (UTC us) and ``y`` then covariates."""
        lo = int(np.searchsorted(self.group_offsets, first, side="right")) - 1
        hi = int(np.searchsorted(self.group_offsets, stop, side="left"))
        ids, stamps, columns = [], [], []
        for group in range(lo, hi):
            group_ids, group_stamps, group_columns = self._group(group)
            start = int(self.group_offsets[group])
            a, b = max(first - start, 0), min(stop, int(self.group_offsets[group + 1])) - start
            ids.append(group_ids.slice(a, b - a))
            stamps.append(group_stamps[a:b])
            columns.append([column[a:b] for column in group_columns])
        joined = [np.concatenate([piece[k] for piece in columns]) for k in range(1 + len(self.covariate_names))]
        return _Ids(ids), np.concatenate(stamps), joined

    def _group(self, group: int) -> tuple[pa.Array, np.ndarray, list[np.ndarray]]:
        cached = self._groups.get(group)
        if cached is not None:
            self._groups.move_to_end(group)
            return cached
        columns = [*REQUIRED_COLUMNS, *self.covariate_names]
        source = storage.open_input_file(self.location)
        try:
            parquet = pq.ParquetFile(source, read_dictionary=_dictionary_ids(source))
            # Ids as a dictionary (decoded once per distinct id) and one thread (an actor has its own CPUs):
            # a tenth of the plain read's time (measured on the many-series benchmark's row groups).
            rows = parquet.read_row_group(group, columns=columns, use_threads=False)
        finally:
            if hasattr(source, "close"):
                source.close()
        name = str(self.location)
        column = rows["series_id"]
        kind = column.type
        text_dictionary = pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type)
        ids = (column if text_dictionary else pc.cast(column, pa.string())).combine_chunks()
        with _silenced(logging.getLogger(table_module.__name__)):  # the driver logged its warnings already
            decoded = (
                ids,
                timestamps_us(rows["timestamp"], name),
                [float_column(rows, column, name) for column in ["y", *self.covariate_names]],
            )
        self._groups[group] = decoded
        while len(self._groups) > CACHED_ROW_GROUPS:
            self._groups.popitem(last=False)
        return decoded


class _Ids:
    """The ids of a run of rows, in pieces (one per row group read; their dictionaries may differ)."""

    def __init__(self, pieces: list[pa.Array]) -> None:
        self.pieces = pieces
        self.starts = np.cumsum([0, *(len(piece) for piece in pieces)])

    def at(self, rows: np.ndarray) -> list[str]:
        """The ids of ``rows`` (positions in the run) as text."""
        if len(self.pieces) == 1:
            return list(self.pieces[0].take(pa.array(rows)).to_pylist())
        piece_of = np.searchsorted(self.starts, rows, side="right") - 1
        found: list[str] = [""] * len(rows)
        for piece in np.unique(piece_of):
            where = np.flatnonzero(piece_of == piece)
            local = pa.array(rows[where] - self.starts[piece])
            for i, value in zip(where.tolist(), self.pieces[piece].take(local).to_pylist(), strict=True):
                found[i] = value
        return found


def _dictionary_ids(source: Any) -> list[str]:
    """``["series_id"]`` when the file stores the ids as text (Parquet dictionary-encodes them), else none."""
    kind = pq.read_schema(source).field("series_id").type
    return ["series_id"] if pa.types.is_string(kind) or pa.types.is_large_string(kind) else []


@dataclass(frozen=True)
class Scanned:
    """What the streamed scan keeps: the table's index of series and each series' window count."""

    table: SeriesTable
    windows: WindowPlan


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
    location: storage.Location,
    resolution_minutes: int,
    covariates: Sequence[str],
    spec: WindowSpec,
    chunk_rows: int | None = None,
) -> Scanned | None:
    """Check a sorted Parquet input chunk by chunk and plan its windows, keeping per-series summaries only.

    ``None`` when the input is not a Parquet file of more than one chunk, sorted by (series_id, timestamp), that
    passes every check chunk by chunk: the caller then reads it whole (see the module docstring).
    """
    name = str(location)
    chunk_rows = chunk_rows or STREAM_CHUNK_ROWS
    if storage.suffix(location) in {".csv", ".txt"}:
        return None
    try:
        if not storage.is_file(location):
            return None
        source = storage.open_input_file(location)
        parquet = pq.ParquetFile(source)
    except (pa.ArrowInvalid, OSError):
        return None
    try:
        metadata = parquet.metadata
        if metadata.num_rows <= chunk_rows:
            return None
        names = parquet.schema_arrow.names
        if any(column not in names for column in (*REQUIRED_COLUMNS, *covariates)):
            return None  # the whole-table reader names what is missing
        check_columns(names, covariates, name)
        group_rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        with _once_per_message(logging.getLogger(table_module.__name__)):
            summaries = _scan(parquet, name, resolution_minutes, covariates, spec, chunk_rows)
    finally:
        if hasattr(source, "close"):
            source.close()
    if summaries is None:
        return None
    return _scanned(location, summaries, group_rows, resolution_minutes, covariates)


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
    grew by the file's size over the scan (measured: 3.5x from 10,000 to 100,000 series); per row group, the
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
    # Arrow's own conversions to numpy import pandas where it is installed (see table.numpy_view): stay in Arrow.
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
        checked = validate_table(rows, resolution_minutes, covariates, source=name, check_names=False)
    except DataError:
        return False
    if not checked.presorted:
        return False
    arrays = checked.table.arrays()
    if summaries.ids and not summaries.ids[-1][-1] < arrays.series_ids[0]:
        return False  # a series seen in an earlier chunk again: the file is not sorted by series
    summaries.add(arrays, checked.rows_per_series, plan_windows(arrays, spec))
    return True


def _scanned(
    location: storage.Location,
    summaries: _Summaries,
    group_rows: list[int],
    resolution_minutes: int,
    covariates: Sequence[str],
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
    return Scanned(SeriesTable(rows, list(covariates), resolution_minutes, str(location)), windows)


class _once_per_message:  # noqa: N801 - a context manager used as a function
    """While scanning, each warning of the table reader is logged once (not once per chunk)."""

    def __init__(self, target: logging.Logger) -> None:
        self.target = target
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True

    def __enter__(self) -> None:
        self.target.addFilter(self.filter)

    def __exit__(self, *exc: object) -> None:
        self.target.removeFilter(self.filter)


class _silenced(_once_per_message):  # noqa: N801
    """While reading rows the driver checked, the table reader's warnings are not repeated."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING
