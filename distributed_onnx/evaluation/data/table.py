"""The input table: long format (``series_id``, ``timestamp``, ``y``, declared covariates) -> dense series.

Reads Parquet or CSV with pyarrow and hands the table to its checks: the columns (:mod:`.columns`), then the
contract of docs/design.md and the layout as dense series (:mod:`.validation`; the layout itself is
:mod:`.layout`, the streamed reading of a large sorted input :mod:`.rows`). The file may be local or a URL
(``s3://...``, see :mod:`distributed_onnx.storage`). Every error names the file and, where rows are at fault, the
rows (0-based data rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.csv as pa_csv

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.columns import OWN_NAMES, ColumnNames, check_columns
from distributed_onnx.evaluation.data.layout import Series, SeriesArrays, SeriesTable
from distributed_onnx.evaluation.data.validation import validate_table
from distributed_onnx.location import Location
from distributed_onnx.redact import quoted

__all__ = [
    "Series",
    "SeriesArrays",
    "SeriesTable",
    "load_series",
    "read_schema",
    "read_table",
    "series_from_table",
]


def read_table(path: Location, names: ColumnNames = OWN_NAMES) -> pa.Table:
    """Read a Parquet or CSV file into Arrow, with a clear error for a missing or unreadable file; the columns
    ``names`` gives (``--id-col``...) come back under the project's names (the one place they are mapped)."""
    try:
        if not storage.is_file(path, "data file"):
            raise DataError(f"Data file not found: {path}", path=str(path))
        if path.suffix in {".csv", ".txt"}:
            # Ids as written: type-guessing would read ``007`` and ``7`` as one integer series (leading zeros lost).
            ids_as_text = pa_csv.ConvertOptions(column_types={names.series_id: pa.string()})
            table = pa_csv.read_csv(storage.open_input_stream(path), convert_options=ids_as_text)
        else:
            table = storage.read_parquet(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise storage.read_error(exc, path, "data file") or DataError(
            f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path)
        ) from exc
    return names.rename(table, str(path))


def read_schema(path: Location, names: ColumnNames = OWN_NAMES) -> pa.Schema:
    """The columns and types of a Parquet or CSV file (a Parquet file's footer only), under the project's names."""
    if path.suffix in {".csv", ".txt"}:
        return read_table(path, names).schema
    import pyarrow.parquet as pq

    try:
        return names.rename_schema(pq.read_schema(storage.open_input_file(path)), str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise storage.read_error(exc, path, "data file") or DataError(
            f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path)
        ) from exc


def load_series(
    path: Location,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    also_read: Sequence[str] = (),
    names: ColumnNames = OWN_NAMES,
) -> SeriesTable:
    """Read ``path`` and lay it out as dense series on a ``resolution_minutes`` grid (``also_read``: columns
    the run reads elsewhere, such as ``--group-by``'s, not warned about as ignored; ``names``: the user's
    names of the required columns)."""
    table = read_table(path, names)
    check_columns(table.column_names, covariates, str(path), also_read)
    return validate_table(table, resolution_minutes, covariates, source=str(path)).table


def series_from_table(
    table: pa.Table,
    resolution_minutes: int,
    covariates: Sequence[str] = (),
    *,
    source: str = "<table>",
) -> SeriesTable:
    """Validate an Arrow table against the input contract and build dense series from it."""
    check_columns(table.column_names, covariates, source)
    return validate_table(table, resolution_minutes, covariates, source=source).table
