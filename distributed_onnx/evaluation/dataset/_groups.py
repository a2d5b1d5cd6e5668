"""``--group-by COLUMN``: each series' group, read from the table the load stage already holds.

A grouped run reads its table whole (its parts take series from anywhere in it), so the column is taken from
that same table rather than from a second read of the file. The group-major plan of the windows is
:mod:`distributed_onnx.evaluation.grouping`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.row_errors import rows_error
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.settings_flags import flag_name

#: The setting whose column these messages are about: only a run given it reaches them (its flag, from its field).
GROUP_BY = flag_name(BacktestSettings, "group_by")


def series_groups(table: pa.Table, column: str, series_ids: Sequence[str], source: str) -> list[str]:
    """Each series' value of the per-series ``column`` of ``table`` (as text), in the run's series order.

    A series with two values, or none (null or NaN), is refused with one line naming it (or the rows of
    ``source``, the file the table was read from).
    """
    if column not in table.column_names:
        raise DataError(
            f"{source}: {GROUP_BY} column {column!r} is not a column of the data; it has {table.column_names}.",
            path=source,
        )
    keys = table[column]
    # NaN is no group (it would become one group "nan" of unrelated series): refused like null.
    missing = pc.is_null(keys, nan_is_null=pa.types.is_floating(keys.type))
    if pc.any(missing).as_py():
        rows = np.flatnonzero(np.asarray(missing.to_numpy(zero_copy_only=False)))
        raise rows_error(
            source,
            f"{GROUP_BY} column {column!r} is null or NaN at rows",
            rows,
            "; give every row its series' group.",
        )
    pairs = pa.table({"series_id": pc.cast(table["series_id"], pa.string()), "value": pc.cast(keys, pa.string())})
    distinct = pairs.group_by(["series_id", "value"]).aggregate([])
    ids, values = distinct["series_id"].to_pylist(), distinct["value"].to_pylist()
    found: dict[str, str] = {}
    for series_id, value in zip(ids, values, strict=True):
        if series_id in found and found[series_id] != value:
            raise DataError(
                f"{source}: {GROUP_BY} column {column!r} must hold one value per series; series {series_id!r} has "
                f"{sorted({found[series_id], value})}.",
                path=source,
            )
        found[series_id] = value
    return [found[series_id] for series_id in series_ids]
