"""Covariates as they were known at each forecast time: the vintage table and its as-of join (no Ray).

A covariate that is itself a forecast (weather, prices) has several values per timestamp, each issued at its
``available_at``. A backtest that feeds the model the last of them tells it what it could not have known at
the cutoff; here each window reads, for each step, the latest vintage with ``available_at <= cutoff -
latency`` (OpenSTEF's ``filter_by_available_before`` + ``select_version``), and a step with none is missing.
The *realized* covariates (``--compare-realized``) are the latest vintage of each timestamp, whenever issued.

The join is one vector pass per batch, never a loop per window: every (key, timestamp) pair of the table is a
*group* (``key * n_steps + grid step``), every distinct ``available_at`` a *rank*, and the rows are sorted by
``group * n_ranks + rank``. A query (key, step, cutoff) is then one ``searchsorted`` of ``group * n_ranks +
rank(cutoff - latency)`` (the count of issue times at or before it, less one) on that sorted key: the row just
left of it is the latest vintage issued by then, if it belongs to the query's group.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.bounds import MAX_LATENCY_MINUTES
from distributed_onnx.errors import DataError, Suggestion
from distributed_onnx.evaluation.data.table import float_column, read_table, rows_error, rows_text, timestamps_us
from distributed_onnx.location import Location

TIMESTAMP = "timestamp"
AVAILABLE_AT = "available_at"
SERIES_ID = "series_id"
#: The name of a model's twin run on the realized covariates (``--compare-realized``).
REALIZED_SUFFIX = "@realized"
#: Returned in ``available_us`` where no vintage was found.
NOT_FOUND = np.iinfo(np.int64).min

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VintageColumn:
    """One covariate's vintages, sorted by (group, rank): the sorted search key, the value and its issue time."""

    keys: np.ndarray  # int64 [N], ascending
    values: np.ndarray  # float64 [N]
    available_us: np.ndarray  # int64 [N]


@dataclass(frozen=True)
class AsOf:
    """What a join found for ``[W, S]`` steps: the values (NaN where missing) and their issue times."""

    values: np.ndarray  # float64 [W, S]
    available_us: np.ndarray  # int64 [W, S], NOT_FOUND where missing

    @property
    def found(self) -> np.ndarray:
        return self.available_us != NOT_FOUND


@dataclass(frozen=True)
class CovariateVintages:
    """A vintage table, indexed for the as-of join; sent to every actor once (inside its job).

    ``per_series``: the table has a ``series_id`` column (else its values hold for every series, like one
    weather station for a region); ``series_codes`` maps a series id to its key.
    """

    source: str
    names: tuple[str, ...]
    step_us: int
    first_us: int
    n_steps: int
    ranks: np.ndarray  # int64: the distinct issue times, ascending
    columns: dict[str, VintageColumn]
    per_series: bool = False
    series_codes: dict[str, int] = field(default_factory=dict)
    latency_us: int = 0

    def has(self, name: str) -> bool:
        return name in self.columns

    def keys_of(self, series_ids: Sequence[str]) -> np.ndarray:
        """The key of each series id (-1: a series the table has no values for; every step is missing)."""
        if not self.per_series:
            return np.zeros(len(series_ids), dtype=np.int64)
        return np.asarray([self.series_codes.get(one, -1) for one in series_ids], dtype=np.int64)

    def as_of(
        self,
        name: str,
        keys: np.ndarray,
        cutoff_us: np.ndarray,
        first_step_us: np.ndarray,
        width: int,
        realized: bool = False,
    ) -> AsOf:
        """Window ``w``'s steps ``first_step_us[w] + j * step`` (``j < width``), each the latest vintage of
        covariate ``name`` for the window's key issued at or before ``cutoff_us[w] - latency`` (any time with
        ``realized``)."""
        column = self.columns[name]
        keys = np.asarray(keys, dtype=np.int64)
        n_windows = keys.shape[0]
        steps = (np.asarray(first_step_us, dtype=np.int64)[:, None] - self.first_us) // self.step_us + np.arange(
            width, dtype=np.int64
        )
        inside = (steps >= 0) & (steps < self.n_steps) & (keys[:, None] >= 0)
        group = np.where(inside, keys[:, None] * self.n_steps + steps, 0)
        n_ranks = self.ranks.size
        if realized:
            rank = np.full(n_windows, n_ranks - 1, dtype=np.int64)
        else:
            limit = _minus(np.asarray(cutoff_us, dtype=np.int64), self.latency_us)
            rank = np.searchsorted(self.ranks, limit, side="right").astype(np.int64) - 1  # -1: nothing issued yet
        query = group * n_ranks + rank[:, None]
        position = np.searchsorted(column.keys, query.ravel(), side="right").reshape(query.shape) - 1
        safe = np.clip(position, 0, max(column.keys.size - 1, 0))
        if column.keys.size:
            found = inside & (position >= 0) & (column.keys[safe] // n_ranks == group)
            values = np.where(found, column.values[safe], np.nan)
            available = np.where(found, column.available_us[safe], NOT_FOUND)
        else:
            values = np.full(query.shape, np.nan)
            available = np.full(query.shape, NOT_FOUND, dtype=np.int64)
        return AsOf(values, available)

    @property
    def nbytes(self) -> int:
        return int(sum(c.keys.nbytes + c.values.nbytes + c.available_us.nbytes for c in self.columns.values()))


def _minus(instants_us: np.ndarray, latency_us: int) -> np.ndarray:
    """``instants - latency``, saturating at int64's minimum (before every issue time) instead of wrapping
    around to a late instant: a wrapped limit would let a window read vintages issued after its cutoff."""
    if latency_us < 0:
        raise ValueError(f"latency must be >= 0, got {latency_us}")
    floor = int(np.iinfo(np.int64).min)
    if latency_us > int(np.iinfo(np.int64).max):
        return np.full(instants_us.shape, floor, dtype=np.int64)
    safe = instants_us >= floor + latency_us
    return np.where(safe, instants_us - np.where(safe, latency_us, 0), floor)


def read_vintages(
    path: Location,
    names: Sequence[str],
    step_us: int,
    series_ids: Sequence[str],
    latency_us: int = 0,
    series_start_us: np.ndarray | None = None,
) -> CovariateVintages:
    """Read and index the vintage table: the covariates of ``names`` it holds (others stay the input table's).

    Errors name the file and the rows: a missing ``timestamp`` or ``available_at`` column, no rows, empty or
    off-grid timestamps, non-numeric, infinite or beyond-float32 values, two values for one (series, timestamp,
    available_at), series ids none of which is a series of the run.
    """
    source = str(Location.parse(path))
    table = read_table(path)
    return index_vintages(table, names, step_us, series_ids, latency_us, source, series_start_us=series_start_us)


def index_vintages(
    table: pa.Table,
    names: Sequence[str],
    step_us: int,
    series_ids: Sequence[str],
    latency_us: int = 0,
    source: str = "covariate data",
    *,
    series_start_us: np.ndarray | None = None,
) -> CovariateVintages:
    """:func:`read_vintages` on a table in memory (the Python API passes one).

    ``series_start_us`` (each run series' first instant, in ``series_ids`` order) puts the timestamps on the
    data's grid: a vintage 15 minutes off it would otherwise be read for the step it floors to. Without it the
    timestamps need only share one grid among themselves.
    """
    check_latency_us(latency_us, source)
    for required in (TIMESTAMP, AVAILABLE_AT):
        if required not in table.column_names:
            raise DataError(
                f"{source}: the covariate data needs columns {TIMESTAMP!r} and {AVAILABLE_AT!r}; "
                f"{required!r} is missing (columns: {table.column_names})",
                path=source,
            )
    held = [name for name in names if name in table.column_names]
    if not held:
        raise DataError(
            f"{source}: none of the declared covariates {list(names)} is a column of the covariate data "
            f"(columns: {table.column_names})",
            path=source,
        )
    if table.num_rows == 0:
        raise DataError(
            f"{source}: the covariate data has no rows; give at least one vintage.",
            path=source,
            suggestions=(Suggestion("Or drop {}.", (("covariate_data", None),)),),
        )
    stamps = timestamps_us(table[TIMESTAMP], source)
    issued = timestamps_us(table[AVAILABLE_AT], source)
    per_series = SERIES_ID in table.column_names
    codes: dict[str, int] = {}
    if per_series:
        keys = _series_keys(table[SERIES_ID], series_ids, source)
        codes = {series_id: index for index, series_id in enumerate(series_ids)}
        n_keys = max(len(series_ids), 1)
    else:
        keys = np.zeros(stamps.size, dtype=np.int64)
        n_keys = 1
    _check_grid(stamps, keys, per_series, step_us, series_ids, series_start_us, source)
    first_us = int(stamps.min())
    steps = (stamps - first_us) // step_us
    n_steps = int(steps.max()) + 1
    ranks = np.unique(issued)
    if n_keys * n_steps * ranks.size >= 2**62:
        raise DataError(f"{source}: too many series x timestamps x issue times to index", path=source)
    group = keys * n_steps + steps
    search = group * ranks.size + np.searchsorted(ranks, issued)
    known = keys >= 0  # rows of series not in the run are left out
    columns = {}
    for name in held:
        values = float_column(table, name, source)
        keep = known & ~np.isnan(values)  # a null vintage is no vintage: an earlier one stays in force
        order = np.argsort(search[keep], kind="stable")
        sorted_keys = search[keep][order]
        duplicate = np.flatnonzero(np.diff(sorted_keys) == 0)
        if duplicate.size:
            rows = np.flatnonzero(keep)[order][duplicate]
            twice = f"covariate {name!r} has two values for one (series, timestamp, available_at) at rows"
            raise rows_error(source, twice, rows)
        columns[name] = VintageColumn(
            np.ascontiguousarray(sorted_keys),
            np.ascontiguousarray(values[keep][order]),
            np.ascontiguousarray(issued[keep][order]),
        )
    return CovariateVintages(
        source=source,
        names=tuple(held),
        step_us=step_us,
        first_us=first_us,
        n_steps=n_steps,
        ranks=ranks,
        columns=columns,
        per_series=per_series,
        series_codes=codes,
        latency_us=latency_us,
    )


def check_latency_us(latency_us: int, source: str = "covariate data") -> None:
    """Refuse a latency the as-of arithmetic cannot hold (the settings bound it first, in minutes)."""
    if not 0 <= latency_us <= MAX_LATENCY_MINUTES * 60_000_000:
        raise DataError(
            f"{source}: covariate latency {latency_us} us is outside 0..{MAX_LATENCY_MINUTES} minutes (100 years).",
            path=source,
            suggestions=(Suggestion("Give a smaller {}.", (("covariate_latency", None),)),),
        )


def _series_keys(column: pa.ChunkedArray, series_ids: Sequence[str], source: str) -> np.ndarray:
    """Each row's series key (-1: a series not in the run). None matching is an error naming ids of both
    sides; some run series without a vintage is a warning."""
    ids = pc.cast(column, pa.string())
    if ids.null_count:
        rows = np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))
        raise DataError(f"{source}: empty series ids at rows {rows_text(rows)}", path=source)
    codes = {series_id: index for index, series_id in enumerate(series_ids)}
    encoded = pc.dictionary_encode(ids).combine_chunks()
    distinct = encoded.dictionary.to_pylist()
    lookup = np.asarray([codes.get(one, -1) for one in distinct], dtype=np.int64)
    keys = lookup[encoded.indices.to_numpy(zero_copy_only=False)]
    if series_ids and not (lookup >= 0).any():
        raise DataError(
            f"{source}: none of its series_id values ({_some(distinct)}, column type {column.type}) is a series "
            f"of the data ({_some(series_ids)}, read as text): every vintaged covariate would be missing. Write "
            "the ids exactly as the data does (integers and text of other digits never match), or drop series_id "
            "so the vintages hold for every series",
            path=source,
        )
    without = sorted(set(series_ids) - set(distinct))
    if without:
        logger.warning(
            "%s: %d of %d series have no vintages (%s): their vintaged covariates are missing at every step",
            source,
            len(without),
            len(series_ids),
            _some(without),
        )
    return keys


def _some(ids: Sequence[str], shown: int = 3) -> str:
    """``'a', 'b', 'c' and 7 more``: a few ids for a message."""
    listed = ", ".join(repr(one) for one in list(ids)[:shown])
    return listed + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _check_grid(
    stamps: np.ndarray,
    keys: np.ndarray,
    per_series: bool,
    step_us: int,
    series_ids: Sequence[str],
    series_start_us: np.ndarray | None,
    source: str,
) -> None:
    """Every timestamp on the grid of the series it is read for (see :func:`index_vintages`)."""
    minutes = step_us // 60_000_000
    if series_start_us is None or not len(series_ids):
        off_grid = (stamps - stamps.min()) % step_us != 0
        if off_grid.any():
            rows = np.flatnonzero(off_grid)
            raise rows_error(source, f"timestamps off the checkpoint's {minutes}-minute grid at rows", rows)
        return
    starts = np.asarray(series_start_us, dtype=np.int64)
    if per_series:
        known = keys >= 0
        anchor = np.where(known, starts[np.where(known, keys, 0)], stamps)  # rows of other series are not read
        off_grid = (stamps - anchor) % step_us != 0
        if off_grid.any():
            rows = np.flatnonzero(off_grid)
            example = f"{_iso(int(stamps[rows[0]]))} for series {series_ids[int(keys[rows[0]])]!r}"
            grid = f"its series starting {_iso(int(starts[int(keys[rows[0]])]))}"
            after = f" (e.g. {example}, whose grid runs from {grid}): align them with the data's timestamps."
            raise rows_error(source, f"timestamps off the data's {minutes}-minute grid at rows", rows, after)
        return
    phases = starts % step_us
    if (phases != phases[0]).any():
        other = int(np.flatnonzero(phases != phases[0])[0])
        raise DataError(
            f"{source}: the covariate data has no series_id, so its values hold for every series, but the data's "
            f"series lie on different {minutes}-minute grids ({series_ids[0]!r} starts {_iso(int(starts[0]))}, "
            f"{series_ids[other]!r} {_iso(int(starts[other]))}): add a series_id column",
            path=source,
        )
    off_grid = (stamps - starts[0]) % step_us != 0
    if off_grid.any():
        rows = np.flatnonzero(off_grid)
        after = (
            f" (e.g. {_iso(int(stamps[rows[0]]))}; the data's grid runs from {_iso(int(starts[0]))}): align them "
            "with the data's timestamps."
        )
        raise rows_error(source, f"timestamps off the data's {minutes}-minute grid at rows", rows, after)


def _iso(timestamp_us: int) -> str:
    return str(np.datetime64(timestamp_us, "us")) + "Z"


@dataclass(frozen=True)
class VintagedCovariates:
    """The run's covariate rows (model order) and the vintage table that some of them come from.

    The rows the table does not hold come from the input table ("known exactly", the perfect-foresight
    default); the series carry only those, in the same relative order.
    """

    names: tuple[str, ...]
    vintages: CovariateVintages

    @property
    def vintaged(self) -> tuple[bool, ...]:
        return tuple(self.vintages.has(name) for name in self.names)

    def assemble(
        self,
        exact: np.ndarray | None,
        keys: np.ndarray,
        origin_us: np.ndarray,
        context_length: int,
        horizon: int,
        realized: bool = False,
        stats: VintageStats | None = None,
    ) -> np.ndarray:
        """``[W, K, C + H]``: the input table's rows ``exact`` (``[W, K_exact, C + H]``) with the vintaged rows
        joined in, each as of its window's cutoff (``origin - step``), or realized."""
        step = self.vintages.step_us
        origin_us = np.asarray(origin_us, dtype=np.int64)
        width = context_length + horizon
        cutoff_us = origin_us - step
        first_step_us = origin_us - context_length * step
        out = np.empty((origin_us.size, len(self.names), width), dtype=np.float64)
        next_exact = 0
        for row, name in enumerate(self.names):
            if not self.vintages.has(name):
                if exact is None:
                    raise ValueError(f"covariate {name!r} is taken from the input table, but no rows were packed")
                out[:, row] = exact[:, next_exact]
                next_exact += 1
                continue
            found = self.vintages.as_of(name, keys, cutoff_us, first_step_us, width, realized=realized)
            out[:, row] = found.values
            if stats is not None:
                stats.observe(name, found, cutoff_us, context_length)
        return out


@dataclass
class VintageStats:
    """Per vintaged covariate and lead: steps missing, steps found, and the age (``cutoff - available_at``, in
    steps) of the values used; mergeable (counts add), one small JSON per part."""

    horizon: int
    step_us: int
    missing: dict[str, list[int]] = field(default_factory=dict)
    found: dict[str, list[int]] = field(default_factory=dict)
    context_missing: dict[str, int] = field(default_factory=dict)
    context_steps: dict[str, int] = field(default_factory=dict)
    #: ``ages[name][lead - 1]``: {age in steps: count}
    ages: dict[str, list[dict[int, int]]] = field(default_factory=dict)

    def _ensure(self, name: str) -> None:
        if name not in self.missing:
            self.missing[name] = [0] * self.horizon
            self.found[name] = [0] * self.horizon
            self.context_missing[name] = 0
            self.context_steps[name] = 0
            self.ages[name] = [{} for _ in range(self.horizon)]

    def observe(self, name: str, joined: AsOf, cutoff_us: np.ndarray, context_length: int) -> None:
        """Count one batch's join: the horizon per lead, the context as one total."""
        self._ensure(name)
        found = joined.found
        future = found[:, context_length:]
        self.context_missing[name] += int((~found[:, :context_length]).sum())
        self.context_steps[name] += int(found[:, :context_length].size)
        counts = future.sum(axis=0)
        for lead in range(self.horizon):
            self.found[name][lead] += int(counts[lead])
            self.missing[name][lead] += int(future.shape[0] - counts[lead])
        age_steps = (cutoff_us[:, None] - joined.available_us[:, context_length:]) // self.step_us
        lead_of = np.broadcast_to(np.arange(self.horizon, dtype=np.int64), future.shape)
        pairs, tally = np.unique(np.stack([lead_of[future], age_steps[future]], axis=1), axis=0, return_counts=True)
        for (lead, age), count in zip(pairs.tolist(), tally.tolist(), strict=True):
            table = self.ages[name][lead]
            table[age] = table.get(age, 0) + count

    def add(self, other: VintageStats) -> None:
        for name in other.missing:
            self._ensure(name)
            for lead in range(self.horizon):
                self.missing[name][lead] += other.missing[name][lead]
                self.found[name][lead] += other.found[name][lead]
                for age, count in other.ages[name][lead].items():
                    self.ages[name][lead][age] = self.ages[name][lead].get(age, 0) + count
            self.context_missing[name] += other.context_missing[name]
            self.context_steps[name] += other.context_steps[name]

    def to_json(self) -> dict[str, object]:
        return {
            "horizon": self.horizon,
            "step_us": self.step_us,
            "covariates": {
                name: {
                    "missing": self.missing[name],
                    "found": self.found[name],
                    "context_missing": self.context_missing[name],
                    "context_steps": self.context_steps[name],
                    "ages": [{str(age): count for age, count in sorted(lead.items())} for lead in self.ages[name]],
                }
                for name in self.missing
            },
        }

    @classmethod
    def from_json(cls, document: dict[str, object]) -> VintageStats:
        stats = cls(int(document["horizon"]), int(document["step_us"]))  # type: ignore[call-overload]
        covariates = document["covariates"]
        assert isinstance(covariates, dict)
        for name, record in covariates.items():
            stats.missing[name] = list(record["missing"])
            stats.found[name] = list(record["found"])
            stats.context_missing[name] = int(record["context_missing"])
            stats.context_steps[name] = int(record["context_steps"])
            stats.ages[name] = [{int(age): int(n) for age, n in lead.items()} for lead in record["ages"]]
        return stats

    def age_rows(self) -> list[dict[str, object]]:
        """Per covariate and lead: values used, missing, and the age's min, median and max in steps and hours
        (the rows of ``covariate_ages.parquet``, which joins ``metrics.parquet`` on ``lead``)."""
        rows: list[dict[str, object]] = []
        hours = self.step_us / 3_600_000_000
        for name in self.missing:
            for lead in range(self.horizon):
                table = self.ages[name][lead]
                ages = np.asarray(sorted(table), dtype=np.int64)
                counts = np.asarray([table[a] for a in ages], dtype=np.int64)
                median = None
                if counts.size:
                    cumulative = np.cumsum(counts)
                    median = int(ages[np.searchsorted(cumulative, (cumulative[-1] + 1) // 2)])
                rows.append(
                    {
                        "covariate": name,
                        "lead": lead + 1,
                        "n": self.found[name][lead],
                        "missing": self.missing[name][lead],
                        "age_min_steps": int(ages[0]) if ages.size else None,
                        "age_median_steps": median,
                        "age_max_steps": int(ages[-1]) if ages.size else None,
                        "age_median_hours": None if median is None else median * hours,
                    }
                )
        return rows
