"""The load stage: the user's files read and checked once, into one frozen :class:`Dataset`.

Everything a backtest takes from its input files is taken here, in one pass over each file: the input table
(streamed in chunks when it is a large sorted Parquet file, else read whole), its columns under the project's
names, the covariates' roles, each series' group, the vintage table, and the files' digests. The plan reads
the data only through the record, so no later stage opens the user's files again (the actors read their own
rows of a streamed input, :mod:`distributed_onnx.evaluation.data.rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, Suggestion
from distributed_onnx.evaluation.data.categories import is_categorical
from distributed_onnx.evaluation.data.columns import ColumnNames, check_columns
from distributed_onnx.evaluation.data.layout import SeriesTable
from distributed_onnx.evaluation.data.series_source import SeriesTransport
from distributed_onnx.evaluation.data.table import read_schema, read_table
from distributed_onnx.evaluation.data.validation import validate_table
from distributed_onnx.evaluation.data.vintages import VintagedCovariates
from distributed_onnx.evaluation.data.window_covariates import CovariateRoles
from distributed_onnx.evaluation.data.windows import WindowPlan, WindowSpec, plan_windows
from distributed_onnx.evaluation.dataset._groups import series_groups
from distributed_onnx.evaluation.dataset._scan import scan_sorted_parquet
from distributed_onnx.evaluation.dataset._vintages import read_vintaged
from distributed_onnx.evaluation.grouping import GroupedWindows, plan_groups
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location

#: The settings that declare covariate columns, as a suggestion names them.
DECLARE_COVARIATES = (("covariates", None), ("past_covariates", None))


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """A backtest's data, read from the user's files and checked once: what planning and the actors take from them.

    ``table`` holds the dense series, or (a streamed input) each series' place in the file, which the actors read
    themselves; ``windows`` counts each series' windows on the grid and window shape the data was loaded for.
    """

    #: The input table (the ``data`` setting) and the user's names of its three required columns, as applied.
    source: Location
    names: ColumnNames
    table: SeriesTable
    windows: WindowPlan
    #: Which covariate rows are past-only or categorical (None: every covariate is numeric and known-future).
    roles: CovariateRoles | None
    #: With ``--group-by``: the run's windows in group-major order (:mod:`..grouping`), else None.
    grouping: GroupedWindows | None
    #: With ``--covariate-data``: the covariate rows and the vintage table some of them come from.
    vintaged: VintagedCovariates | None
    #: The input table's sha256, and the vintage table's (None without one): they enter the run's fingerprint.
    sha256: str
    vintages_sha256: str | None

    @property
    def vintaged_names(self) -> tuple[str, ...]:
        """The declared covariates read from the vintage table (the others are the input table's)."""
        return () if self.vintaged is None else self.vintaged.vintages.names


def load(settings: BacktestSettings, spec: WindowSpec, resolution_minutes: int) -> Dataset:
    """Read and check the run's files for windows of ``spec`` on a ``resolution_minutes`` grid.

    A large sorted Parquet input is checked in streamed chunks and its values stay in the file (the actors read
    them): the driver keeps a summary per series. Anything else is read whole, as the object store needs, and a
    grouped run reads it whole too (its parts take series from anywhere in it).
    """
    source, names = settings.data, settings.column_names
    vintaged = _vintaged_names(settings)
    covariates = [name for name in settings.covariate_columns if name not in vintaged]
    # Renamed columns (--id-col...) are read whole: the streamed scan reads the project's names from the file.
    streamable = settings.group_by is None and names.is_default
    scanned = None
    if settings.series_transport is not SeriesTransport.OBJECT_STORE and streamable:
        scanned = scan_sorted_parquet(source, resolution_minutes, covariates, spec)
    if scanned is not None:
        table, windows, schema, labels = scanned.table, scanned.windows, scanned.schema, None
    else:
        table, windows, schema, labels = _read_whole(settings, resolution_minutes, covariates, spec)
    grouping = None if labels is None else plan_groups(table.arrays(), spec, labels, settings.max_group_size)
    return Dataset(
        source=source,
        names=names,
        table=table,
        windows=windows,
        roles=_roles(settings.covariate_columns, len(settings.past_covariates), vintaged, schema),
        grouping=grouping,
        vintaged=read_vintaged(settings, vintaged, table),
        sha256=storage.sha256(source),
        vintages_sha256=None if settings.covariate_data is None else storage.sha256(settings.covariate_data),
    )


def _read_whole(
    settings: BacktestSettings, resolution_minutes: int, covariates: list[str], spec: WindowSpec
) -> tuple[SeriesTable, WindowPlan, pa.Schema, list[str] | None]:
    """The input read whole, checked and laid out as dense series; its windows, its columns and, with
    ``--group-by``, each series' group, taken from the same read. The Arrow table itself is not kept."""
    source = settings.data
    whole = read_table(source, settings.column_names)
    also_read = [settings.group_by] if settings.group_by is not None else []
    check_columns(whole.column_names, covariates, str(source), also_read)
    table = validate_table(whole, resolution_minutes, covariates, source=str(source)).table
    labels = None
    if settings.group_by is not None:
        labels = series_groups(whole, settings.group_by, table.arrays().series_ids, str(source))
    return table, plan_windows(table.series, spec), whole.schema, labels


def _vintaged_names(settings: BacktestSettings) -> tuple[str, ...]:
    """The declared covariates that ``--covariate-data`` holds (read from there, as of each cutoff)."""
    if settings.covariate_data is None:
        return ()
    held = set(read_schema(settings.covariate_data).names)
    names = tuple(name for name in settings.covariate_columns if name in held)
    if not names:
        raise ConfigError(
            f"{settings.covariate_data} holds none of the declared covariates {settings.covariate_columns}.",
            key="covariate_data",
            suggestions=(Suggestion("Declare its columns with {} or {}.", DECLARE_COVARIATES),),
        )
    return names


def _roles(
    columns: Sequence[str], past_only: int, vintaged: tuple[str, ...], schema: pa.Schema
) -> CovariateRoles | None:
    """Which covariate rows are past-only, and which columns are categorical (by their type in the data; a
    vintaged covariate is numeric)."""
    if not columns:
        return None
    categorical = tuple(False if name in vintaged else is_categorical(schema.field(name).type) for name in columns)
    return CovariateRoles(past_only=past_only, categorical=categorical)
