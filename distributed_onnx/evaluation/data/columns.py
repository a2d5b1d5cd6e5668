"""A table's columns: the three required ones under the user's names (``--id-col``, ``--time-col``,
``--target-col``), and the check that they and the declared covariates are there (:func:`check_columns`).

Nixtla's libraries (statsforecast, mlforecast, neuralforecast, utilsforecast) take long tables as
``unique_id, ds, y`` and let the caller name them (``id_col``, ``time_col``, ``target_col``); fev's tasks use
``id, timestamp, target``. A table is renamed to the project's own names (``series_id``, ``timestamp``, ``y``)
in one place, where it is read (:func:`~.table.read_table`), so everything after, the outputs included, speaks
the project's names. A table that misses the project's names but holds another tool's gets an error suggesting
the settings to give (:func:`suggestion_for`): shown as flags by a command that has them (``backtest``,
``score``), as keywords in Python, and not at all by a command that reads a table without them (``tune``,
``export``).

The mapping is one-to-one, checked once, in the settings (:meth:`ColumnSettings._one_role_per_column`, through
:func:`check_roles`): each role (id, time, target, each covariate) names one column and each column takes one
role. ``--id-col y`` on a table with the default names would otherwise give ``y`` two roles, and renaming
``y -> series_id`` beside ``y -> y`` kept only one of them: the flag silently dropped while summary.json
recorded it. A table whose columns repeat a name is refused where it is read (:func:`check_unique`), naming the
column: which of the two is "the" ``y`` is the user's call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
from pydantic import Field, model_validator

from distributed_onnx.errors import DataError, Suggestion
from distributed_onnx.settings_flags import flag_name
from distributed_onnx.settings_sources import CommandSettings

__all__ = [
    "OWN_NAMES",
    "REQUIRED_COLUMNS",
    "ColumnNames",
    "ColumnSettings",
    "check_columns",
    "check_roles",
    "check_unique",
    "suggestion_for",
]

logger = logging.getLogger(__name__)

#: The columns every input table has, under the project's names (after :meth:`ColumnNames.rename`).
REQUIRED_COLUMNS = ("series_id", "timestamp", "y")

#: Other tools' names of each required column, in the order they are suggested.
_OTHER_NAMES = {
    "series_id": ("unique_id", "id", "item_id"),
    "timestamp": ("ds", "timestamp", "time", "date"),
    "y": ("y", "target", "value"),
}
#: The setting that names each required column (a field of :class:`ColumnSettings`).
_SETTINGS = {"series_id": "id_col", "timestamp": "time_col", "y": "target_col"}


@dataclass(frozen=True)
class ColumnNames:
    """Which column of the user's table holds the series id, the timestamp and the target."""

    series_id: str = "series_id"
    timestamp: str = "timestamp"
    y: str = "y"

    @property
    def is_default(self) -> bool:
        return self == OWN_NAMES

    def renames(self) -> dict[str, str]:
        """The user's name -> the project's, for the columns that differ."""
        pairs = {self.series_id: "series_id", self.timestamp: "timestamp", self.y: "y"}
        return {user: own for user, own in pairs.items() if user != own}

    def rename(self, table: pa.Table, source: str) -> pa.Table:
        """``table`` with the user's columns under the project's names; a name the table repeats, a named column
        that is not there, or one the renaming would shadow, is a :class:`DataError` naming it."""
        check_unique(table.column_names, source)
        renames = self.renames()
        if not renames:
            return table
        names = table.column_names
        for user, own in renames.items():
            flag = flag_name(ColumnSettings, _SETTINGS[own])  # given, so the command has it (or its YAML key)
            if user not in names:
                raise DataError(f"{source}: {flag} {user}: no such column; the file has {names}.", path=source)
            if own in names and own not in renames:
                raise DataError(
                    f"{source}: {flag} {user} would rename {user!r} to {own!r}, which the file already has: drop "
                    f"or rename that column, or leave {flag} out.",
                    path=source,
                )
        return table.rename_columns([renames.get(name, name) for name in names])

    def rename_schema(self, schema: pa.Schema, source: str) -> pa.Schema:
        """The schema the renamed table has (a repeated name refused; the rest is checked where the table is
        read)."""
        check_unique(schema.names, source)
        renames = self.renames()
        return pa.schema([field.with_name(renames.get(field.name, field.name)) for field in schema])


#: The project's own names: no renaming.
OWN_NAMES = ColumnNames()


def check_roles(names: ColumnNames, covariates: Sequence[str] = ()) -> None:
    """Refuse a mapping that is not one-to-one: a column given two roles (``--id-col y`` beside the default
    ``--target-col y``), or a covariate naming a required column (the user's name or, once renamed, the
    project's). Raises ValueError (a settings error, exit 2) naming the column, both roles and the flags."""
    roles: dict[str, str] = {}
    for own, setting in _SETTINGS.items():
        flag = flag_name(ColumnSettings, setting)  # the settings' own flags: only they call this
        column = getattr(names, own)
        if column in roles:
            raise ValueError(
                f"the column {column!r} is given two roles: {roles[column]} and {flag} {column} (a flag not given "
                f"keeps its default); each role takes its own column and each column one role: give "
                f"{roles[column].split()[0]} and {flag} different columns"
            )
        roles[column] = f"{flag} {column}"
    required = {**{own: f"the {own} column" for own in _SETTINGS}, **roles}  # the user's names and the project's
    for covariate in covariates:
        if covariate in required:
            raise ValueError(
                f"covariate {covariate!r} is also {required[covariate]}: a required column cannot be a covariate "
                "(each column takes one role); drop it from the covariates"
            )


def check_unique(column_names: Sequence[str], source: str) -> None:
    """Refuse a table whose columns repeat a name (a :class:`DataError` naming it): readers would take one of
    them at random, or fail."""
    repeated = [name for name, count in Counter(column_names).items() if count > 1]
    if repeated:
        counts = ", ".join(f"{name!r} {column_names.count(name)} times" for name in repeated)
        raise DataError(
            f"{source}: the table has column(s) of the same name ({counts}); each column needs its own name: "
            "rename or drop the repeats.",
            path=source,
        )


def check_columns(
    column_names: Sequence[str], covariates: Sequence[str], source: str, also_read: Sequence[str] = ()
) -> None:
    """Refuse missing required or declared columns; warn about undeclared extra columns (not ``also_read``)."""
    missing = [name for name in (*REQUIRED_COLUMNS, *covariates) if name not in column_names]
    if missing:
        declared = [name for name in missing if name in covariates]
        hint = f" (declared covariates {declared} are not columns of the data)" if declared else ""
        suggestion = suggestion_for([name for name in missing if name in REQUIRED_COLUMNS], column_names)
        raise DataError(
            f"{source}: missing column(s) {missing}{hint}; the file has {list(column_names)}.",
            path=source,
            suggestions=() if suggestion is None else (suggestion,),
        )
    extra = [name for name in column_names if name not in (*REQUIRED_COLUMNS, *covariates, *also_read)]
    if extra:
        logger.warning("%s: ignoring column(s) %s that are not declared covariates", source, extra)


def suggestion_for(missing: Sequence[str], column_names: Sequence[str]) -> Suggestion | None:
    """For required columns ``missing`` from a table holding ``column_names``: the settings that map another tool's
    names (``id_col='unique_id', time_col='ds'``), or None when the table holds none of them."""
    found = []
    for own in missing:
        other = next((name for name in _OTHER_NAMES.get(own, ()) if name in column_names and name != own), None)
        if other is not None:
            found.append((_SETTINGS[own], other))
    if not found:
        return None
    others = ", ".join(other for _, other in found)
    return Suggestion(f"If {others} hold them (Nixtla's or fev's names), pass {{}}.", tuple(found))


class ColumnSettings(CommandSettings):
    """The three column-name settings, shared by ``backtest`` and ``score`` (flags, YAML keys, environment)."""

    label: ClassVar[str] = "settings"

    id_col: str = Field(
        default="series_id",
        min_length=1,
        examples=["unique_id"],
        description="The input table's series id column (Nixtla: unique_id, fev: id); outputs call it series_id.",
    )
    time_col: str = Field(
        default="timestamp",
        min_length=1,
        examples=["ds"],
        description="The input table's timestamp column (Nixtla: ds); outputs call it timestamp.",
    )
    target_col: str = Field(
        default="y",
        min_length=1,
        examples=["target"],
        description="The input table's target column (fev: target); outputs call it y.",
    )

    @property
    def column_names(self) -> ColumnNames:
        return ColumnNames(self.id_col, self.time_col, self.target_col)

    def mapped_covariates(self) -> list[str]:
        """The covariate columns these settings read beside the three required ones (none here)."""
        return []

    @model_validator(mode="after")
    def _one_role_per_column(self) -> ColumnSettings:
        check_roles(self.column_names, self.mapped_covariates())
        return self
