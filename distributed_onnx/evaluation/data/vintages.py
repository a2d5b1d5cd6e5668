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
left of it is the latest vintage issued by then, if it belongs to the query's group. The table is read and
indexed once, by the load stage (:mod:`distributed_onnx.evaluation.dataset`); the index travels in each actor's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

TIMESTAMP = "timestamp"
AVAILABLE_AT = "available_at"
SERIES_ID = "series_id"
#: The name of a model's twin run on the realized covariates (``--compare-realized``).
REALIZED_SUFFIX = "@realized"
#: Returned in ``available_us`` where no vintage was found.
NOT_FOUND = np.iinfo(np.int64).min


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
