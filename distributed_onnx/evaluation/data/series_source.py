"""Where an actor reads the series of the windows it runs: the object store, or the input file itself.

The driver reads and validates the input table once (every error names the file and rows before an actor
starts). It then hands the actors the dense series in one of two ways:

- :class:`SeriesStore`: every series concatenated into a few flat numpy arrays, put into Ray's object store
  once per run. An actor on any node maps them zero-copy from its node's shared memory (Ray transfers the
  object once per node), so a part costs the actor no I/O at all.
- :class:`ParquetSeriesReader`: for inputs larger than the object store should hold, each actor reads the rows
  of the series it needs from the input Parquet file (row groups pruned by the ``series_id`` filter) and lays
  them out with the same code the driver validated them with, keeping a few recently used series cached.

A large sorted Parquet input is not read whole at all: the driver streams it and the actors read their parts'
row ranges (:class:`~.rows.SeriesRows`, also reported as ``input_file``). All of them give the same
:class:`~.layout.Series` for the same index, so a part's forecasts do not depend on the transport. The rule
that picks one (``choose_transport``) is documented in docs/backtest.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.columns import OWN_NAMES, ColumnNames
from distributed_onnx.evaluation.data.table import (
    Series,
    SeriesArrays,
    SeriesTable,
    series_from_table,
)
from distributed_onnx.location import Location


class SeriesTransport(StrEnum):
    """How the actors get the series: ``auto`` picks by size (:func:`choose_transport`)."""

    AUTO = "auto"
    OBJECT_STORE = "object_store"
    INPUT_FILE = "input_file"


#: ``auto`` keeps the series in the object store up to this share of the smallest node's object store memory.
OBJECT_STORE_SHARE = 0.25


class SeriesSource(Protocol):
    """Dense series by index, in the driver's ``series_id`` order."""

    @property
    def series_ids(self) -> Sequence[str]: ...

    def series(self, index: int) -> Series: ...


class SeriesStore(SeriesArrays):
    """All series of a run in flat arrays (:class:`~.table.SeriesArrays`), put into the object store once.

    Flat numpy arrays (not a list of objects) because Ray maps numpy buffers zero-copy out of the object
    store: an actor reading a series costs a slice, not a deserialisation.
    """

    @classmethod
    def from_table(cls, table: SeriesTable) -> SeriesStore:
        """The table's flat layout as a store: no copy when the table was read from data."""
        arrays = table.arrays()
        return cls(
            series_ids=arrays.series_ids,
            start_us=arrays.start_us,
            offsets=arrays.offsets,
            values=arrays.values,
            covariates=arrays.covariates,
            step_us=arrays.step_us,
        )


@dataclass
class ParquetSeriesReader:
    """Reads series from the input Parquet file on demand (the ``input_file`` transport).

    The driver validated the whole file, so the same rows give the same dense series here; a series whose
    rows changed since (the file was replaced mid-run) is refused rather than silently forecast differently.
    """

    location: Location
    series_ids: tuple[str, ...]
    n_points: tuple[int, ...]
    resolution_minutes: int
    covariate_names: tuple[str, ...]
    cache_series: int = 64
    names: ColumnNames = OWN_NAMES  # the user's names of the required columns (--id-col...)
    _cache: OrderedDict[int, Series] = field(default_factory=OrderedDict, repr=False)

    def series(self, index: int) -> Series:
        cached = self._cache.get(index)
        if cached is not None:
            self._cache.move_to_end(index)
            return cached
        self.prefetch([index])
        return self._cache[index]

    def prefetch(self, indices: Sequence[int]) -> None:
        """Read the series of ``indices`` not cached yet in one filtered scan of the file."""
        wanted = [i for i in dict.fromkeys(indices) if i not in self._cache]
        if not wanted:
            return
        ids = [self.series_ids[i] for i in wanted]
        names = self.names
        columns = [names.series_id, names.timestamp, names.y, *self.covariate_names]
        # Cast in the filter: a file whose ids are integers is matched on the same text the driver used.
        wanted_rows = pc.field(names.series_id).cast(pa.string()).isin(ids)
        rows = storage.read_parquet(self.location, columns=columns, filters=wanted_rows)
        rows = names.rename(rows, str(self.location))
        found = series_from_table(rows, self.resolution_minutes, self.covariate_names, source=str(self.location))
        by_id = {one.series_id: one for one in found.series}
        for index, series_id in zip(wanted, ids, strict=True):
            one = by_id.get(series_id)
            if one is None or one.n_points != self.n_points[index]:
                raise DataError(
                    f"{self.location}: series {series_id!r} changed since the run was planned "
                    f"({self.n_points[index]} grid steps then, {None if one is None else one.n_points} now); "
                    "do not replace the input file during a run.",
                    path=str(self.location),
                )
            self._cache[index] = one
        while len(self._cache) > max(self.cache_series, len(wanted)):
            self._cache.popitem(last=False)


def choose_transport(
    requested: SeriesTransport, store_bytes: int, object_store_bytes: float | None, data: Location
) -> tuple[SeriesTransport, str]:
    """The transport to use and why (logged and written to summary.json).

    ``auto``: the object store while the series take at most :data:`OBJECT_STORE_SHARE` of the smallest
    node's object store, else the input file when it is Parquet (CSV has no row groups to prune: then the
    object store after all, and the reason says so).
    """
    is_parquet = data.suffix not in {".csv", ".txt"}
    if requested is SeriesTransport.INPUT_FILE and not is_parquet:
        raise DataError(
            f"series_transport=input_file needs a Parquet input; {data} is CSV. Convert it or use object_store.",
            path=str(data),
        )
    if requested is not SeriesTransport.AUTO:
        return requested, "requested"
    if object_store_bytes is None or store_bytes <= OBJECT_STORE_SHARE * object_store_bytes:
        limit = "unknown" if object_store_bytes is None else f"{OBJECT_STORE_SHARE:.0%} of {object_store_bytes:,.0f}"
        return SeriesTransport.OBJECT_STORE, f"{store_bytes:,} bytes of series fit the object store (limit {limit})"
    if not is_parquet:
        return SeriesTransport.OBJECT_STORE, f"{store_bytes:,} bytes exceed the share, but CSV input has no row groups"
    return SeriesTransport.INPUT_FILE, f"{store_bytes:,} bytes exceed {OBJECT_STORE_SHARE:.0%} of the object store"
