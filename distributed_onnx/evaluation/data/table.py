"""The input table: long format (``series_id``, ``timestamp``, ``y``, declared covariates) -> dense series.

Reads Parquet or CSV with pyarrow and hands the table to its checks: the columns (:mod:`.columns`), then the
contract of docs/design.md and the layout as dense series (:mod:`.validation`; the layout itself is
:mod:`.layout`, the streamed reading of a large sorted input :mod:`.rows`). The file may be local or a URL
(``s3://...``, see :mod:`distributed_onnx.storage`). Every error names the file and, where rows are at fault, the
rows (0-based data rows).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.columns import OWN_NAMES, ColumnNames, check_columns
from distributed_onnx.evaluation.data.layout import Series, SeriesArrays, SeriesTable
from distributed_onnx.evaluation.data.validation import validate_table
from distributed_onnx.local_paths import name_too_long_error, not_a_file
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
            raise _not_found(path)
        if path.suffix in {".csv", ".txt"}:
            # Ids as written: type-guessing would read ``007`` and ``7`` as one integer series (leading zeros lost).
            ids_as_text = pa_csv.ConvertOptions(column_types={names.series_id: pa.string()})
            table = pa_csv.read_csv(storage.open_input_stream(path), convert_options=ids_as_text)
        else:
            table = storage.read_parquet(path)
        return names.rename(table, str(path))  # a column name that is not UTF-8: a UnicodeDecodeError here
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise (
            name_too_long_error(exc)
            or storage.read_error(exc, path, "data file")
            or _not_text(path)
            or DataError(f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path))
        ) from exc


def _not_found(path: Location) -> DataError:
    """The error of a data file that is not there: what is there instead (a folder, a link in a loop or to
    nothing: :func:`~distributed_onnx.local_paths.not_a_file`), else "not found"."""
    local = path.local_path
    there = not_a_file(local) if local is not None else None
    if there is None:
        return DataError(f"Data file not found: {path}", path=str(path))
    return DataError(f"Data file {path} {there}; give a data file (.parquet, or .csv).", path=str(path))


#: The bytes of a CSV file looked at to tell whether it is text at all (its parser failed on it).
_SNIFFED_BYTES = 4096


def _not_text(path: Location) -> DataError | None:
    """The error of a ``.csv`` file that is not UTF-8 text (an image, a Parquet file renamed): said so, as a
    Parquet reader says "not a Parquet file", instead of the parser's complaint quoting the file's binary bytes;
    None when its start is text (the parser's own words then apply) or cannot be read again."""
    if path.suffix not in {".csv", ".txt"}:
        return None
    try:
        opened = storage.open_input_stream(path)
        with opened.open("rb") if isinstance(opened, Path) else opened as stream:
            head = bytes(stream.read(_SNIFFED_BYTES))
    except OSError:
        return None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        odd = head.find(b"\0")
    except UnicodeDecodeError as exc:
        odd = exc.start
    if odd < 0:
        return None
    return DataError(
        f"Data file {path} is not text (byte {odd} is 0x{head[odd]:02x}: a binary file, such as an image or a "
        "Parquet file), so it cannot be read as CSV; give a CSV file saved as UTF-8 text, or a Parquet file.",
        path=str(path),
    )


def read_schema(path: Location, names: ColumnNames = OWN_NAMES) -> pa.Schema:
    """The columns and types of a Parquet or CSV file (a Parquet file's footer only), under the project's names.
    What is there when it is not a file is said as :func:`read_table` says it (``--covariate-data`` a folder or a
    link in a loop printed the system's errno text)."""
    if path.suffix in {".csv", ".txt"}:
        return read_table(path, names).schema
    import pyarrow.parquet as pq

    try:
        if not storage.is_file(path, "data file"):
            raise _not_found(path)
        return names.rename_schema(pq.read_schema(storage.open_input_file(path)), str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise (
            name_too_long_error(exc)
            or storage.read_error(exc, path, "data file")
            or DataError(f"Cannot read data file {path}: {path.scrub(quoted(exc))}", path=str(path))
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
