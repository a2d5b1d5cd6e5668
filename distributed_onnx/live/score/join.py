"""The log's windows placed on the actuals, and the models that forecast the same window joined.

Reading and joining only: what a window is scored against (its actuals, scale and baselines) is taken in
:mod:`.scoring`. Each window of the log (one series of one request, for one model) is placed on its series in
the actuals with one outcome:

- ``scored``: its whole horizon lies within the actuals (it will be scored);
- **pending**: ``series_not_in_actuals`` or ``actuals_not_arrived`` (its horizon runs past the series' actuals,
  or past the last instant at which *any* series has an observed actual: rows whose ``y`` is null after that
  are placeholders of actuals yet to come, not missing ones, while a null before it is missing for good, as
  the backtest takes it): looked at again on the next run, so the log files holding it are not marked done;
- **not placeable** (counted per reason, never scored): ``no_start`` (the request gave no ``start``, so its
  forecasts have no timestamps), ``before_actuals`` (its origin precedes the series' first actual, so the
  history it was cut from is unknown here), ``off_grid`` (its origin is not on the series' grid),
  ``actuals_not_at_resolution`` (the actuals cannot be laid out at the model's resolution: one model of another
  time step in the log; the others are scored).

The checkpoints logged under one window id (a primary and its shadows: :mod:`~distributed_onnx.live.log.layout`)
forecast the same window, so they are joined into one group and scored together, like the checkpoints of one
backtest run (the same pairs rule). A group is keyed by its checkpoints, horizon, quantile levels and
resolution: only windows of one shape stack, and only the same checkpoints share their common pairs.

Two things are set aside, counted per model and never scored, rather than failing the run: a window id that one
model logged twice (``duplicate``: the copy; the first is scored), and a window id whose models disagree on
the series or origin (``conflicting_ids``: every model's; only logs written before the server drew the ids
could hold one, where a client's reused request id made two requests' windows collide).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.columns import OWN_NAMES, ColumnNames, check_columns
from distributed_onnx.evaluation.data.table import SeriesTable, read_table, series_from_table
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, default_season, season_count
from distributed_onnx.live.score.log_windows import LogWindows
from distributed_onnx.location import Location

logger = logging.getLogger(__name__)

SCORED = "scored"
DUPLICATE = "duplicate"
CONFLICTING = "conflicting_ids"
NOT_PLACEABLE = ("no_start", "before_actuals", "off_grid", "actuals_not_at_resolution")
PENDING = ("series_not_in_actuals", "actuals_not_arrived")

GroupKey = tuple[tuple[str, ...], int, tuple[float, ...], int]  # checkpoints, horizon, levels, resolution

#: Why a window of summary.json's ``windows_not_scored`` is not scored, as the command's one line says it.
_WHY_NOT_SCORED = {
    "pending_actuals_not_arrived": "their actuals have not arrived yet (rerun score when they have)",
    "pending_series_not_in_actuals": "their series are not in the actuals (check the ids and --actuals)",
    "no_start": "the request gave no start, so the forecasts have no timestamps",
    "before_actuals": "their origin precedes the series' first actual",
    "off_grid": "their origin is off the series' grid",
    "actuals_not_at_resolution": "the actuals are not on the model's time step",
    DUPLICATE: "a model logged the same window id twice (the copy)",
    CONFLICTING: "the models logged one window id for different windows",
}


def why_not_scored(summary: dict[str, Any]) -> str | None:
    """One line saying how many windows were not scored and why, from summary.json: ``windows_not_scored``
    counts windows (one series of one request: a primary and its shadows forecast it once each), and ``windows``
    each model's forecasts (``{"m": {"scored": 3, "pending_actuals_not_arrived": 2}}``), added when they are
    more than the windows; None when every window was scored."""
    totals = {reason: n for reason, n in dict(summary.get("windows_not_scored") or {}).items() if n}
    if not totals:
        return None
    forecasts = sum(
        n
        for counts in dict(summary.get("windows") or {}).values()
        for outcome, n in counts.items()
        if outcome != SCORED
    )
    windows = sum(totals.values())
    models = sum(
        1 for counts in dict(summary.get("windows") or {}).values() if any(o != SCORED and n for o, n in counts.items())
    )
    by = f" ({forecasts} forecasts of them, by {models} model{'s' * (models != 1)})" if forecasts > windows else ""
    reasons = "; ".join(f"{n} because {_WHY_NOT_SCORED.get(outcome, outcome)}" for outcome, n in totals.items())
    return f"{windows} window(s) not scored{by}: {reasons}."


class Actuals:
    """The actuals laid out as the backtest lays out its data, per resolution (read once)."""

    def __init__(
        self,
        location: Location,
        seasonality: int | None,
        context_length: int | None = None,
        names: ColumnNames = OWN_NAMES,
    ) -> None:
        self._location = location
        self._names = names  # the user's names of the required columns (--id-col...), mapped where read
        self._seasonality = seasonality
        self._context_length = context_length
        self._raw: pa.Table | None = None
        self._tables: dict[int, tuple[SeriesTable, dict[str, int]]] = {}
        self._scalers: dict[tuple[int, int], SeasonalScaler] = {}
        self._arrived_until_us: int | None = None
        self._said_no_context = False
        #: Why the actuals cannot be laid out at a resolution (the error itself, logged once): kept whole, with its
        #: suggestions, so that the command line renders them with its own flags when it is raised
        #: (:meth:`check_some_usable`); a message copied into a new error kept Python's words.
        self.unusable: dict[int, DataError] = {}

    def season(self, resolution_minutes: int) -> int:
        return self._seasonality or default_season(resolution_minutes)

    def seasons(self, resolution_minutes: int, logged_context: int) -> int:
        """Seasons the seasonal-quantile baseline looks back over: those within the checkpoints' context, as in
        the backtest (:func:`~distributed_onnx.evaluation.scoring.naive.season_count`).

        The context is ``--context-length`` (or the ``--backtest``'s) when given, else ``logged_context``, what the
        log records for the window's checkpoints (the shortest of a primary and its shadows: a backtest of them
        runs all at one context, at most the shortest). A log written before it recorded one (``logged_context``
        0) looks back one season, said once.
        """
        context = self._context_length or logged_context
        if not context:
            if not self._said_no_context:
                self._said_no_context = True
                logger.warning(
                    "The forecast log does not record the served checkpoints' context length (it was written "
                    "before the log recorded it): their seasonal-quantile baseline looks back over one season, "
                    "not as a backtest's does; give --context-length (the checkpoints' context_length) to score "
                    "it as a backtest does"
                )
            return 1
        return season_count(context, self.season(resolution_minutes))

    def table(self, resolution_minutes: int) -> tuple[SeriesTable, dict[str, int]]:
        if resolution_minutes not in self._tables:
            series = series_from_table(self._read(), resolution_minutes, source=str(self._location))
            self._tables[resolution_minutes] = (series, series.index_of())
        return self._tables[resolution_minutes]

    def _read(self) -> pa.Table:
        """The actuals' columns, refused (their own :class:`DataError`) where a required one is missing: every
        resolution's problem, said once, not first as each resolution's grid warning (Nixtla's ``unique_id``/``ds``
        once warned that 30-minute windows are not scored before the error)."""
        if self._raw is None:
            raw = read_table(self._location, self._names)
            check_columns(raw.column_names, (), str(self._location), also_read=raw.column_names)
            keep = [name for name in ("series_id", "timestamp", "y") if name in raw.column_names]
            self._raw = raw.select(keep) if len(keep) == 3 else raw
        return self._raw

    def usable(self, resolution_minutes: int) -> bool:
        """Whether the actuals can be laid out at ``resolution_minutes`` (else :attr:`unusable` says why).

        Reading the actuals fails as before; only laying them out on one resolution's grid is per resolution.
        """
        if resolution_minutes in self._tables:
            return True
        if resolution_minutes not in self.unusable:
            self._read()  # the actuals themselves unreadable: every model's problem, raised
            try:
                self.table(resolution_minutes)
                return True
            except DataError as exc:
                self.unusable[resolution_minutes] = exc
                logger.warning(  # what is wrong only: a suggestion is shown by the error, in the command's words
                    "Windows of %d-minute models are not scored: the actuals are not on that grid (%s)",
                    resolution_minutes,
                    exc.message,
                )
        return False

    def check_some_usable(self) -> None:
        """Raise the actuals' own :class:`DataError` when they fit no resolution of the log (a wrong file, not
        one model of another time step)."""
        if self.unusable and not self._tables:
            raise next(iter(self.unusable.values()))

    def arrived_until_us(self) -> int:
        """The last instant at which any series has an observed (non-null) actual (module docstring)."""
        if self._arrived_until_us is None:
            raw = self._read()
            try:
                observed = raw.filter(pc.is_valid(raw["y"]))
                latest = pc.max(observed["timestamp"].cast(pa.timestamp("us"))).value if observed.num_rows else None
            except (KeyError, pa.ArrowException):  # not laid out yet: laying it out names what is wrong
                latest = 2**62
            self._arrived_until_us = int(latest) if latest is not None else -(2**62)
        return self._arrived_until_us

    def scaler(self, resolution_minutes: int, series_index: int) -> SeasonalScaler:
        key = (resolution_minutes, series_index)
        if key not in self._scalers:
            series = self.table(resolution_minutes)[0].series[series_index]
            self._scalers[key] = SeasonalScaler(series.values, self.season(resolution_minutes))
        return self._scalers[key]


@dataclass
class Placement:
    """Where each window of a :class:`LogWindows` lands: an outcome each, and for the scored ones their series."""

    outcome: npt.NDArray[np.str_]
    series_index: npt.NDArray[np.int64]
    position: npt.NDArray[np.int64]  # the origin's index on its series' grid


def place(windows: LogWindows, actuals: Actuals) -> Placement:
    """Each window's outcome (module docstring) and, where it has one, its series and origin on the actuals."""
    n = windows.series_ids.size
    outcome = np.full(n, SCORED, dtype="<U32")
    series_index = np.full(n, -1, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    for w in range(n):
        if not windows.has_origin[w]:
            outcome[w] = "no_start"
            continue
        resolution = int(windows.resolution_minutes[w])
        if not actuals.usable(resolution):
            outcome[w] = "actuals_not_at_resolution"
            continue
        table, index = actuals.table(resolution)
        found = index.get(str(windows.series_ids[w]))
        if found is None:
            outcome[w] = "series_not_in_actuals"
            continue
        series = table.series[found]
        offset = int(windows.origin_us[w]) - series.start_us
        if offset % series.step_us:
            outcome[w] = "off_grid"
        elif offset < 0:
            outcome[w] = "before_actuals"
        elif offset // series.step_us + windows.horizon > series.n_points or (
            int(windows.origin_us[w]) + (windows.horizon - 1) * series.step_us > actuals.arrived_until_us()
        ):
            outcome[w] = "actuals_not_arrived"
        series_index[w] = found
        position[w] = offset // series.step_us
    return Placement(outcome, series_index, position)


@dataclass
class JoinedWindows:
    """The windows that the same checkpoints logged (a primary and its shadows): scored together on their pairs.

    ``windows`` holds what the models share (series, origin, resolution, request time; the first model's
    forecasts), and ``forecasts`` every model's ``[W, H, Q]``, rows aligned by window id.
    """

    key: GroupKey
    windows: LogWindows
    forecasts: dict[str, npt.NDArray[np.float32]]

    @property
    def models(self) -> tuple[str, ...]:
        return self.key[0]


def _shortest_context(rows_of_models: list[list[tuple[LogWindows, int]]]) -> npt.NDArray[np.int64]:
    """Per window, the shortest context length the models of its group record (0 where none records one): the
    longest history a backtest of these checkpoints can give its seasonal-quantile baseline (it runs them all at
    one context, at most the shortest)."""
    recorded = np.asarray([[windows.context_length[row] for windows, row in rows] for rows in rows_of_models])
    known = np.where(recorded > 0, recorded, np.iinfo(np.int64).max)
    shortest = known.min(axis=0)
    return np.where(shortest == np.iinfo(np.int64).max, 0, shortest).astype(np.int64)


@dataclass
class SetAside:
    """Window ids not scored (module docstring): (model, window id, outcome) of each :data:`DUPLICATE` copy and
    every model's :data:`CONFLICTING` window."""

    keys: list[tuple[str, str, str]]


def join_models(found: Sequence[LogWindows], set_aside: SetAside | None = None) -> list[JoinedWindows]:
    """Group fresh windows by the set of checkpoints that logged each window id (its horizon and levels alike).

    A window id names one series of one request, so the models logged under it forecast the same window; they
    are scored together, like the checkpoints of one backtest. A model logging a window id twice is scored
    once, and a window id whose models disagree on its series or origin not at all: both are added to
    ``set_aside`` (counted, never silently dropped).
    """
    aside = set_aside if set_aside is not None else SetAside([])
    by_shape: dict[tuple[int, tuple[float, ...]], dict[str, dict[str, tuple[LogWindows, int]]]] = {}
    for windows in found:
        rows = by_shape.setdefault((windows.horizon, windows.quantiles), {})
        for row, window in enumerate(windows.window_ids.tolist()):
            per_model = rows.setdefault(str(window), {})
            if windows.model in per_model:
                aside.keys.append((windows.model, str(window), DUPLICATE))
            else:
                per_model[windows.model] = (windows, row)
    joined: list[JoinedWindows] = []
    for (horizon, quantiles), rows in sorted(by_shape.items()):
        by_models: dict[tuple[tuple[str, ...], int], list[dict[str, tuple[LogWindows, int]]]] = {}
        for window, per_model in rows.items():
            first, row = next(iter(per_model.values()))
            same = all(
                other.series_ids[other_row] == first.series_ids[row]
                and bool(other.origin_us[other_row] == first.origin_us[row])
                and other.resolution_minutes[other_row] == first.resolution_minutes[row]
                for other, other_row in per_model.values()
            )
            if not same:
                aside.keys.extend((model, window, CONFLICTING) for model in sorted(per_model))
                continue
            resolution = int(first.resolution_minutes[row])
            by_models.setdefault((tuple(sorted(per_model)), resolution), []).append(per_model)
        for (models, resolution), windows_of in sorted(by_models.items()):
            lead = [per_model[models[0]] for per_model in windows_of]

            def pick(name: str, found_rows: list[tuple[LogWindows, int]] = lead) -> npt.NDArray[Any]:
                return np.asarray([getattr(windows, name)[row] for windows, row in found_rows])

            shared = LogWindows(
                model=models[0],
                horizon=horizon,
                quantiles=quantiles,
                series_ids=pick("series_ids").astype(np.str_),
                window_ids=pick("window_ids").astype(np.str_),
                origin_us=pick("origin_us").astype(np.int64),
                has_origin=pick("has_origin").astype(bool),
                resolution_minutes=pick("resolution_minutes").astype(np.int64),
                forecasts=pick("forecasts").astype(np.float32),
                request_time_us=pick("request_time_us").astype(np.int64),
                context_length=_shortest_context([[pm[model] for pm in windows_of] for model in models]),
            )
            forecasts = {
                model: np.stack([windows.forecasts[row] for windows, row in (pm[model] for pm in windows_of)])
                for model in models
            }
            joined.append(JoinedWindows((models, horizon, quantiles, resolution), shared, forecasts))
    return joined
