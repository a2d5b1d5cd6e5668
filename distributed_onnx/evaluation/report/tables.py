"""The report's tables: scores indexed from the metrics table, the headline and the per-series ranking (see
:mod:`.page`; the page's furniture, the run's facts and the CSS, is :mod:`.furniture`).

Which metrics a table shows, and which one ranks, is the registry's answer (:mod:`..scoring.registry`: the primary
metric, the headline and skill ones, the report's order), never a name written here: a metric registered at run
time is ranked by and shown like a built-in one."""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_onnx.evaluation.data.column_values import numpy_view
from distributed_onnx.evaluation.scoring.pairs import SEASONAL_NAIVE
from distributed_onnx.evaluation.scoring.registry import (
    METRICS,
    Metric,
    has_median,
    per_checkpoint,
    primary,
    reported,
    series_listing,
    skill,
)

#: Series beyond this many are shown as the best and worst halves of it (all of them are in metrics.parquet).
MAX_TABLE_SERIES = 200


class SeriesValues(Protocol):
    """Per-series values of each model, aligned with :attr:`series_ids` (the series a model scored)."""

    @property
    def series_ids(self) -> Sequence[str]: ...

    def values(self, model: str, metric: str, quantile: float | None = None) -> np.ndarray:
        """Every series' value, NaN where it has none."""
        ...

    def counts(self, model: str) -> np.ndarray:
        """Every series' scored pairs, -1 where it has none."""
        ...


class Scores:
    """The metrics indexed by scope: ``value(model, metric, quantile=None, series=None)``, by lead.

    The run-wide and per-lead rows (a few hundred) become Python objects. The series scope comes from
    ``series`` when given (a backtest's driver passes :class:`~distributed_onnx.evaluation.scoring.series_scores.
    SeriesScores`, computed from the merged sums: it never holds the long table), else from the table's series
    rows (:class:`TableSeries`).
    """

    def __init__(self, metrics: pa.Table, series: SeriesValues | None = None) -> None:
        self.cells: dict[tuple[str, str, str | None, float | None], float] = {}
        leads: dict[tuple[str, str, float | None], list[tuple[int, float]]] = defaultdict(list)
        # fev and count rows belong to the comparison section. One filter per scope over the columns each needs:
        # the series rows are most of a whole table, and a filtered copy of every column cost hundreds of MB of
        # the driver's peak at 40,000 series (benchmarks/results/time_to_results.md).
        is_series = pc.equal(metrics.column("scope"), "series")
        pooled = pc.equal(metrics.column("convention"), "pooled") if "convention" in metrics.column_names else None
        run_wide = pc.invert(is_series) if pooled is None else pc.and_(pooled, pc.invert(is_series))
        for row in metrics.filter(run_wide).to_pylist():
            quantile = None if row["quantile"] is None else round(float(row["quantile"]), 9)
            if row["scope"] == "lead":
                leads[(row["model"], row["metric"], quantile)].append((int(row["lead"]), float(row["value"])))
                continue
            self.cells[(row["model"], row["metric"], None, quantile)] = float(row["value"])
        self.leads = {key: sorted(points) for key, points in leads.items()}
        self.max_lead = max((lead for points in leads.values() for lead, _ in points), default=0)
        if series is None:
            series_rows = is_series if pooled is None else pc.and_(pooled, is_series)
            columns = ["series_id", "model", "metric", "quantile", "value", "n"]
            series = TableSeries(metrics.select(columns).filter(series_rows))
        self._series = series
        self._series_row: dict[str, int] | None = None
        #: The quantile levels the table was scored at (:func:`levels_of`).
        self.quantiles = levels_of(metrics)

    @property
    def has_median(self) -> bool:
        """Whether the run forecast the median (:func:`~..scoring.registry.has_median` of its levels)."""
        return has_median(self.quantiles)

    @property
    def primary(self) -> str:
        """The metric that ranks the models (:func:`~..scoring.registry.primary`: MASE where the median was
        forecast)."""
        return primary(self.has_median)

    @property
    def series_ids(self) -> Sequence[str]:
        return self._series.series_ids

    def value(self, model: str, metric: str, quantile: float | None = None, series: str | None = None) -> float | None:
        level = None if quantile is None else round(quantile, 9)
        if series is None:
            return self.cells.get((model, metric, None, level))
        if self._series_row is None:
            self._series_row = {name: i for i, name in enumerate(self.series_ids)}
        row = self._series_row.get(series)
        if row is None:
            return None
        value = self.series_values(model, metric, quantile)[row]
        return float(value) if np.isfinite(value) else None

    def series_values(self, model: str, metric: str, quantile: float | None = None) -> np.ndarray:
        """Every series' value (NaN where it has none), aligned with :attr:`series_ids`."""
        return self._series.values(model, metric, quantile)

    def series_counts(self, model: str) -> np.ndarray:
        """Every series' scored pairs (-1 where it has none), aligned with :attr:`series_ids`."""
        return self._series.counts(model)

    def by_lead(self, model: str, metric: str, quantile: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Values on the common grid of leads 1..max (NaN where this model has no value: no scored pair)."""
        points = self.leads.get((model, metric, None if quantile is None else round(quantile, 9)))
        if not points:
            return None
        values = np.full(self.max_lead, np.nan)
        for lead, value in points:
            values[lead - 1] = value
        return np.arange(1, self.max_lead + 1, dtype=float), values


def levels_of(metrics: pa.Table) -> list[float]:
    """The quantile levels ``metrics`` was scored at, ascending: those of its run-wide rows of a metric with one
    value per level (pinball), which every scored model has at every level."""
    per_level = [metric.name for metric in METRICS if metric.per == "quantile"]
    rows = metrics.filter(
        pc.and_(
            pc.is_in(metrics.column("metric"), pa.array(per_level, pa.string())), pc.equal(metrics["scope"], "global")
        )
    )
    return sorted(
        {round(float(level), 9) for level in pc.unique(rows.column("quantile")).to_pylist() if level is not None}
    )


class TableSeries:
    """The series-scope rows of a metrics table as one value array per (model, metric, quantile), built in vector
    passes (live scoring's tables, tests); :attr:`series_ids` are the series a model scored (those with a row of
    :func:`~..scoring.registry.series_listing`), in the order they first appear among its rows."""

    def __init__(self, rows: pa.Table) -> None:
        self._values: dict[tuple[str, str, float | None], np.ndarray] = {}
        self._counts: dict[str, np.ndarray] = {}
        self.series_ids: list[str] = []
        if rows.num_rows == 0:
            return
        series, names = _encoded(rows.column("series_id"))
        models, model_names = _encoded(rows.column("model"))
        metrics, metric_names = _encoded(rows.column("metric"))
        quantile = _floats(rows.column("quantile"))
        levels, level_codes = np.unique(np.round(np.nan_to_num(quantile, nan=-1.0), 9), return_inverse=True)
        listing = series_listing().name
        with_listing = series[metrics == metric_names.index(listing)] if listing in metric_names else series[:0]
        _, first = np.unique(with_listing, return_index=True)
        listed = with_listing[np.sort(first)]
        position = np.full(len(names), -1, dtype=np.int64)
        position[listed] = np.arange(listed.size)
        self.series_ids = [str(names[code]) for code in listed.tolist()]
        row = position[series]
        keep = row >= 0
        value, count = _floats(rows.column("value")), _floats(rows.column("n")).astype(np.int64)
        key = (models * len(metric_names) + metrics) * len(levels) + level_codes.ravel()
        order = np.argsort(key[keep], kind="stable")
        kept = np.flatnonzero(keep)[order]
        cuts = np.flatnonzero(np.diff(key[kept])) + 1
        for group in np.split(kept, cuts) if kept.size else []:
            k = int(key[group[0]])
            model = model_names[k // (len(metric_names) * len(levels))]
            metric = metric_names[(k // len(levels)) % len(metric_names)]
            level_value = float(levels[k % len(levels)])
            level = None if level_value < 0 else round(level_value, 9)
            values = np.full(len(self.series_ids), np.nan)
            values[row[group]] = value[group]
            self._values[(model, metric, level)] = values
            if metric == listing:
                counts = np.full(len(self.series_ids), -1, dtype=np.int64)
                counts[row[group]] = count[group]
                self._counts[model] = counts

    def values(self, model: str, metric: str, quantile: float | None = None) -> np.ndarray:
        found = self._values.get((model, metric, None if quantile is None else round(quantile, 9)))
        return found if found is not None else np.full(len(self.series_ids), np.nan)

    def counts(self, model: str) -> np.ndarray:
        found = self._counts.get(model)
        return found if found is not None else np.full(len(self.series_ids), -1, dtype=np.int64)


def _encoded(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A string column as (int64 code per row, the distinct strings); no string per row becomes Python."""
    encoded = column.combine_chunks().dictionary_encode()
    return numpy_view(encoded.indices).astype(np.int64), [str(name) for name in encoded.dictionary.to_pylist()]


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64, null as NaN."""
    filled = pc.cast(column, pa.float64()).fill_null(float("nan")).combine_chunks()
    return numpy_view(filled)


def escape(value: Any) -> str:
    return html.escape(str(value))


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.{digits}g}"


def skill_value(model: float | None, naive: float | None) -> float | None:
    return None if model is None or not naive else float(skill(model, naive))


def headline(scores: Scores, model: str) -> str:
    rows = []
    for metric in reported():
        ours, naive = scores.value(model, metric), scores.value(SEASONAL_NAIVE, metric)
        if ours is None:
            continue
        versus_naive = skill_value(ours, naive)
        rows.append(
            f"<tr><th>{metric.upper()}</th><td>{number(ours)}</td><td>{number(naive)}</td>"
            f"<td>{number(versus_naive, 3)}</td></tr>"
        )
    return (
        "<table><tr><th>metric</th><th>model</th><th>seasonal naive</th><th>skill (1 - model/naive)</th></tr>"
        + "".join(rows)
        + "</table><p class='hint'>Lower is better for every metric; skill above 0 beats the baseline. "
        "Definitions: the docstrings of distributed_onnx/evaluation/scoring/metrics.py.</p>"
    )


def series_table(scores: Scores, model: str, *, search: bool = True) -> str:
    """The per-series section: the distribution over series, then the best and worst (bounded, searchable).

    Its metrics are :func:`~..scoring.registry.per_checkpoint`'s: ranked by the first (the primary), a column of
    each, and seasonal naive's value and the skill beside each skill metric. Bounded whatever the number of series
    (:data:`MAX_TABLE_SERIES` rows at most): every series' scores are in ``metrics.parquet``, and the hint below the
    table says how to look one up. ``search``: the filter box, on the page once (it filters every checkpoint's
    series table).
    """
    n_series = len(scores.series_ids)
    shown = per_checkpoint(scores.has_median)
    columns, skills = _series_columns(scores, model, shown)
    rank_label, by = columns[0]
    # Ranked by the primary metric, series without one last (stable: ties keep the metrics' order).
    ranked = np.lexsort((np.where(np.isnan(by), 0.0, by), np.isnan(by)))
    note = ""
    listed = ranked
    if n_series > MAX_TABLE_SERIES:
        half = MAX_TABLE_SERIES // 2
        note = (
            f"<p class='hint'>{n_series} series: the {half} best and {half} worst by {rank_label} "
            "(all: metrics.parquet).</p>"
        )
        listed = np.concatenate([ranked[:half], ranked[-half:]])
    rank_of = np.empty(n_series, dtype=np.int64)
    rank_of[ranked] = np.arange(1, n_series + 1)
    counts = scores.series_counts(model)
    header = ["rank", "series", *(label for label, _ in columns), "scored pairs"]
    body = "".join(
        f"<tr><td>{rank_of[i]}</td><th>{escape(scores.series_ids[i])}</th>"
        + "".join(f"<td>{number(_finite(values[i]))}</td>" for _, values in columns)
        + f"<td>{counts[i] if counts[i] >= 0 else '-'}</td></tr>"
        for i in listed.tolist()
    )
    head = "".join(f"<th>{name}</th>" for name in header)
    search_box = (
        "<p><input type='search' id='series-search' placeholder='filter the rows by series id' "
        "oninput='filterSeries(this.value)'></p>"
        if n_series > 1 and search
        else ""
    )
    return (
        _distribution([(rank_label, by), *skills])
        + note
        + search_box
        + f"<div class='series-table'><table class='sortable'><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
        + "</table></div>"
        + "<p class='hint'>Click a column to sort. Skill = 1 - model/naive. Any series, from Python: "
        "<code>pyarrow.parquet.read_table('metrics.parquet', filters=[('series_id', '=', 'ID')])</code>.</p>"
    )


def _series_columns(
    scores: Scores, model: str, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    """The per-series table's value columns (label, a value per series), the first the ranking metric's; and the
    skill columns among them."""
    columns: list[tuple[str, np.ndarray]] = []
    skills: list[tuple[str, np.ndarray]] = []
    for metric in metrics:
        label = metric.name.upper()
        ours = scores.series_values(model, metric.name)
        columns.append((label, ours))
        if metric.skill:
            naive = scores.series_values(SEASONAL_NAIVE, metric.name)
            versus_naive = skill(ours, naive)
            columns += [(f"{label} naive", naive), (f"{label} skill", versus_naive)]
            skills.append((f"{label} skill", versus_naive))
    return columns, skills


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


#: The points of the per-series distribution table.
_PERCENTILES = (0, 10, 25, 50, 75, 90, 100)


def _distribution(rows_of: Sequence[tuple[str, np.ndarray]]) -> str:
    """Percentiles over series of the ranking metric and of each skill against naive, and the share of series
    beating it (``rows_of``: the ranking metric first, then the skills)."""
    rows = []
    for index, (label, values) in enumerate(rows_of):
        finite = values[np.isfinite(values)]
        if finite.size < 2:
            continue
        points = np.percentile(finite, _PERCENTILES)
        share = f"{np.mean(finite > 0):.1%}" if index else "-"
        rows.append(
            f"<tr><th>{label}</th><td>{finite.size}</td>"
            + "".join(f"<td>{number(float(p))}</td>" for p in points)
            + f"<td>{share}</td></tr>"
        )
    if not rows:
        return ""
    head = "".join(f"<th>{'min' if p == 0 else 'max' if p == 100 else f'p{p}'}</th>" for p in _PERCENTILES)
    return (
        f"<table class='distribution'><tr><th>over series</th><th>series</th>{head}"
        f"<th>series beating naive</th></tr>{''.join(rows)}</table>"
    )
