"""The flat series layout: every series of a dataset on its own dense grid, in a few flat arrays.

:mod:`.table` reads and checks the input and builds this layout; planning (:mod:`.windows`), packing
(:mod:`.packing`) and the transports (:mod:`.series_source`) work on it. Gaps are NaN (masked downstream).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

_US_PER_MINUTE = 60_000_000


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


class FlatSeries(Sequence[Series]):
    """Series in the run's order whose grids are known as arrays: ids, first instants, grid offsets.

    :class:`SeriesArrays` holds the values too; the streamed reader's index (:mod:`.rows`) holds only where
    each series' rows are in the input file and reads the values of a range of series on demand. Planning,
    packing and scoring work on :meth:`arrays` of the series they need.
    """

    series_ids: tuple[str, ...]
    start_us: np.ndarray  # int64 [S]
    offsets: np.ndarray  # int64 [S + 1]: series ``s`` spans grid points offsets[s]..offsets[s + 1]
    step_us: int

    def arrays(self, lo: int, hi: int) -> SeriesArrays:
        """The flat layout with the values of series ``lo..hi`` (only those may be read from it)."""
        raise NotImplementedError

    def series(self, index: int) -> Series:
        """Series ``index`` (0 <= index < len), its values a view where the layout holds them."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.series_ids)

    @overload
    def __getitem__(self, index: int) -> Series: ...

    @overload
    def __getitem__(self, index: slice) -> list[Series]: ...

    def __getitem__(self, index: int | slice) -> Series | list[Series]:
        if isinstance(index, slice):
            return [self.series(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"series index {index} out of range for {len(self)} series")
        return self.series(index)

    @property
    def lengths(self) -> np.ndarray:
        """Grid points of every series (int64 [S])."""
        return np.diff(self.offsets)


@dataclass(frozen=True, eq=False)
class SeriesArrays(FlatSeries):
    """Every series of a dataset in flat arrays: series ``s`` is ``values[offsets[s]:offsets[s + 1]]``.

    The layout the reader builds in a few vector passes (no Python per series) and the one the actors read:
    planning, packing and the object store work on the flat arrays, and a :class:`Series` is a view made on
    demand (``arrays[s]``), so a run over 100,000 series holds no 100,000 objects.
    """

    series_ids: tuple[str, ...]
    start_us: np.ndarray  # int64 [S]
    offsets: np.ndarray  # int64 [S + 1]
    values: np.ndarray  # float64 [N]
    covariates: np.ndarray  # float64 [K, N]
    step_us: int

    @classmethod
    def from_series(cls, series: Sequence[Series], step_us: int | None = None) -> SeriesArrays:
        """Concatenate a list of :class:`Series` (hand-built tables, tests) into the flat layout."""
        if isinstance(series, SeriesArrays):
            return series
        lengths = np.asarray([one.n_points for one in series], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.concatenate([one.values for one in series]) if series else np.empty(0)
        k = series[0].covariates.shape[0] if series else 0
        covariates = np.concatenate([one.covariates for one in series], axis=1) if k else np.empty((0, values.size))
        return cls(
            series_ids=tuple(one.series_id for one in series),
            start_us=np.asarray([one.start_us for one in series], dtype=np.int64),
            offsets=offsets,
            values=np.ascontiguousarray(values, dtype=np.float64),
            covariates=np.ascontiguousarray(covariates, dtype=np.float64),
            step_us=series[0].step_us if series else int(step_us or 0),
        )

    def arrays(self, lo: int, hi: int) -> SeriesArrays:
        """Every series' values are here already."""
        return self

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.covariates.nbytes + self.offsets.nbytes + self.start_us.nbytes)

    def series(self, index: int) -> Series:
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        return Series(
            self.series_ids[index],
            int(self.start_us[index]),
            self.step_us,
            self.values[lo:hi],
            self.covariates[:, lo:hi],
        )


@dataclass
class SeriesTable:
    """All series of a dataset, in ``series_id`` order, plus what was read.

    ``series`` is a :class:`SeriesArrays` when read from data (the flat layout), or any list of :class:`Series`.
    """

    series: Sequence[Series]
    covariate_names: list[str]
    resolution_minutes: int
    source: str

    @property
    def n_points(self) -> int:
        if isinstance(self.series, FlatSeries):
            return int(self.series.offsets[-1])
        return sum(series.n_points for series in self.series)

    @property
    def start_us(self) -> np.ndarray:
        """Each series' first instant (int64 [S], series order): its grid is ``start_us + k * step``."""
        if isinstance(self.series, FlatSeries):
            return np.asarray(self.series.start_us, dtype=np.int64)
        return np.asarray([series.start_us for series in self.series], dtype=np.int64)

    def index_of(self) -> dict[str, int]:
        return {series_id: i for i, series_id in enumerate(self.series_ids)}

    @property
    def series_ids(self) -> tuple[str, ...]:
        if isinstance(self.series, FlatSeries):
            return self.series.series_ids
        return tuple(series.series_id for series in self.series)

    def arrays(self) -> SeriesArrays:
        """The flat layout of every series (no copy when the table was read from data)."""
        if isinstance(self.series, FlatSeries):
            return self.series.arrays(0, len(self.series))
        return SeriesArrays.from_series(self.series, self.resolution_minutes * _US_PER_MINUTE)


def dense_layout(
    run_ids: Sequence[str],
    first_us: np.ndarray,
    rows_per_series: np.ndarray,
    positions: np.ndarray,
    columns: Sequence[np.ndarray],
    step_us: int,
) -> tuple[SeriesArrays, np.ndarray]:
    """Lay rows (grouped by series, each series' rows at ``positions`` steps from its first) on dense grids.

    ``columns[0]`` is ``y``, the rest the covariates, all in the same row order. Returns the layout and each
    row's index into the flat arrays. Vector passes: each row lands at its series' offset plus its position.
    """
    ends = np.cumsum(rows_per_series)
    n_points = positions[ends - 1] + 1 if ends.size else np.empty(0, dtype=np.int64)
    series_offsets = np.concatenate([[0], np.cumsum(n_points)]).astype(np.int64)
    flat_index = np.repeat(series_offsets[:-1], rows_per_series) + positions
    dense = np.full(int(series_offsets[-1]), np.nan)
    dense[flat_index] = columns[0]
    covariate_block = np.full((len(columns) - 1, dense.size), np.nan)
    for k, column in enumerate(columns[1:]):
        covariate_block[k, flat_index] = column
    arrays = SeriesArrays(
        series_ids=tuple(run_ids),
        start_us=np.ascontiguousarray(first_us, dtype=np.int64),
        offsets=series_offsets,
        values=dense,
        covariates=covariate_block,
        step_us=step_us,
    )
    return arrays, flat_index
