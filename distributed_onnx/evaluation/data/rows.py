"""The rows of a large sorted Parquet input, read by the actors: a few row groups at a time, per part.

The load stage's streamed scan (:mod:`distributed_onnx.evaluation.dataset`) keeps per series only its id, first
instant, grid length and rows in the file (:class:`SeriesRows`); the actor that runs a part reads the rows of the
part's series itself (:meth:`SeriesRows.arrays`), decoding ids as a dictionary and keeping the last row groups it
decoded (consecutive parts of one actor usually share them). It re-checks ids, grid and row counts, so a file
replaced mid-run is refused, not misread.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data import column_values
from distributed_onnx.evaluation.data.column_values import covariate_column, float_column, timestamps_us
from distributed_onnx.evaluation.data.columns import REQUIRED_COLUMNS
from distributed_onnx.evaluation.data.layout import FlatSeries, Series, SeriesArrays
from distributed_onnx.evaluation.data.log_filters import silenced
from distributed_onnx.location import Location

#: Decoded row groups an actor keeps: consecutive parts of one actor usually share their row groups.
CACHED_ROW_GROUPS = 2


@dataclass(frozen=True, eq=False)
class SeriesRows(FlatSeries):
    """Every series of a sorted Parquet input by where its rows are: no values (the ``input_file`` transport).

    Series ``s`` has rows ``row_offsets[s]..row_offsets[s + 1]`` of the file, sorted by time, and spans grid
    points ``offsets[s]..offsets[s + 1]`` from ``start_us[s]``. The driver checked every row; :meth:`arrays`
    checks again that the rows it reads are those (a file replaced mid-run is refused, never forecast silently).
    """

    location: Location
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

    def series(self, index: int) -> Series:
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
        with silenced(logging.getLogger(column_values.__name__)):  # the driver logged its warnings already
            decoded = (
                ids,
                timestamps_us(rows["timestamp"], name),
                [
                    float_column(rows, "y", name),
                    *(covariate_column(rows, column, name) for column in self.covariate_names),
                ],
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
