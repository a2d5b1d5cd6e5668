"""One set of pairs per run: every model, checkpoints and baselines alike, scored on the same (window, lead) pairs.

A pair is scored when its actual is observed and *every* model's forecast is finite there. Scoring each model
on its own finite pairs compares different sets: measured on real hourly data with gaps, a checkpoint equal to
seasonal naive wherever the naive exists was reported 11% worse than the naive, because the naive alone
skipped the pairs after a gap. What is left out is counted, per reason, with the first reason that applies:

- ``actual_missing``: the actual is not observed;
- ``baseline_undefined``: a baseline has no value there (its season lies in a gap or before the series);
- ``model_nonfinite``: a checkpoint emitted NaN or an infinity there. That is a model *failure*, not a gap: the
  windows are listed per model (``nonfinite``) and the run exits 1 after writing everything.

:class:`PairScores` is the whole scoring of a set of forecasts: it takes arrays (series ids, origins, window
ids, actuals, the models' forecasts, scales), so the backtest's actors and anything else holding forecasts and
actuals (a live log joined with its actuals) score with the same code. Its state is sums, so the scores of
parts merge exactly (:meth:`merge`); everything in it is vectorised over windows, leads and quantiles.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.scoring.batch_pairs import BatchPairs, SeriesCodes, finite_pairs
from distributed_onnx.evaluation.scoring.conventions import FEV, WindowSums
from distributed_onnx.evaluation.scoring.losses import CellForecast, Scratch
from distributed_onnx.evaluation.scoring.metrics import METRICS_SCHEMA, SERIES_PER_TABLE, MetricsAccumulator
from distributed_onnx.evaluation.scoring.naive import (
    SeasonCells,
    broadcast_quantiles,
    cell_naive,
    cell_quantiles,
    season_cells,
)
from distributed_onnx.evaluation.scoring.registry import has_median, median_index, primary
from distributed_onnx.names import BASELINE_NAMES

__all__ = [
    "BASELINES",
    "ORIGIN_SCHEMA",
    "REASONS",
    "SEASONAL_NAIVE",
    "SEASONAL_QUANTILES",
    "PairScores",
    "baseline_forecasts",
    "cell_baselines",
    "common_pairs",
]

#: The baselines every run scores; seasonal naive is the reference of skill. Their names are the names rule's
#: (:data:`distributed_onnx.names.BASELINE_NAMES`), which no model may take.
SEASONAL_NAIVE, SEASONAL_QUANTILES = BASELINE_NAMES
BASELINES = (SEASONAL_NAIVE, SEASONAL_QUANTILES)
REASONS = ("actual_missing", "baseline_undefined", "model_nonfinite")
#: Each model's fev-convention score per window origin (:meth:`PairScores.origin_table`).
ORIGIN_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("origin", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("convention", pa.string(), nullable=False),
    ]
)
F64 = npt.NDArray[np.float64]
#: A model's or baseline's forecast ``[W, H, Q]``: an array (float32 or float64, any layout) or a table of cells.
Forecast = npt.NDArray[np.floating[Any]] | CellForecast


def baseline_forecasts(
    history: F64,
    m: int,
    horizon: int,
    quantiles: Sequence[float],
    positions: npt.NDArray[np.int64] | None = None,
) -> dict[str, Forecast]:
    """Both baselines ``[W, H, Q]`` from ``history[W, K * m]`` (the ``K`` seasons before each origin).

    ``positions`` (each window's origin on one axis of time per series, see :func:`.naive.season_cells`) let
    windows share the quantiles of their common cells.
    """
    return cell_baselines(season_cells(history, m, horizon, positions), quantiles)


def cell_baselines(cells: SeasonCells, quantiles: Sequence[float]) -> dict[str, Forecast]:
    """Both baselines ``[W, H, Q]`` from a batch's seasonal cells (:mod:`.naive`).

    The one place the baselines are built, for the backtest's parts (whose actors gather the cells straight from
    the series) and for live scoring (from its history blocks) alike, so both score the same baselines from the
    same values. The naive's quantile axis has stride 0 (the accumulator scores its point once); the seasonal
    quantiles are a :class:`~.losses.CellForecast` (the losses gather them chunk by chunk).
    """
    return {
        SEASONAL_NAIVE: broadcast_quantiles(cell_naive(cells), len(quantiles), copy=False),
        SEASONAL_QUANTILES: cell_quantiles(cells, quantiles),
    }


def common_pairs(
    actual: F64, forecasts: Mapping[str, Forecast], baselines: Sequence[str]
) -> tuple[npt.NDArray[np.bool_], dict[str, int], dict[str, npt.NDArray[np.bool_]]]:
    """``(valid[W, H], left out per reason, per checkpoint: which windows hold a non-finite forecast)``."""
    observed = np.isfinite(actual)
    finite = {name: finite_pairs(values) for name, values in forecasts.items()}
    baseline_ok = np.ones_like(observed)
    model_ok = np.ones_like(observed)
    for name, ok in finite.items():
        if name in baselines:
            baseline_ok &= ok
        else:
            model_ok &= ok
    valid = observed & baseline_ok & model_ok
    excluded = {
        "actual_missing": int((~observed).sum()),
        "baseline_undefined": int((observed & ~baseline_ok).sum()),
        "model_nonfinite": int((observed & baseline_ok & ~model_ok).sum()),
    }
    # A non-finite forecast is a failure wherever it is, observed actual or not.
    nonfinite = {name: ~np.asarray(ok.all(axis=1)) for name, ok in finite.items() if name not in baselines}
    return valid, excluded, nonfinite


class PairScores:
    """The pooled and fev-convention sums of every model of a run, on the run's common pairs."""

    def __init__(
        self, models: Sequence[str], quantiles: Sequence[float], horizon: int, scratch: Scratch | None = None
    ) -> None:
        """``scratch``: the scoring's work buffers, reused batch after batch (an actor passes its own to every part)."""
        if len(set(models)) != len(models):
            raise DataError(f"model names must be distinct; got {list(models)}")
        self.models = tuple(models)
        self.quantiles = tuple(float(q) for q in quantiles)
        self.horizon = horizon
        self.pooled = {name: MetricsAccumulator(self.quantiles, horizon) for name in self.models}
        #: The median's position among the levels (None without it: no metric that needs it is scored).
        self.median = median_index(self.quantiles)
        self.windows = {name: WindowSums(self.quantiles, self.median) for name in self.models}
        self.excluded = dict.fromkeys(REASONS, 0)
        self.nonfinite: dict[str, list[str]] = {name: [] for name in self.models if name not in BASELINES}
        self.scratch = scratch if scratch is not None else Scratch()

    def update(
        self,
        series_ids: npt.NDArray[Any] | SeriesCodes,
        origin_us: npt.NDArray[np.int64],
        window_ids: npt.NDArray[Any] | pa.Array,
        actual: F64,
        forecasts: Mapping[str, Forecast],
        scale: F64,
    ) -> npt.NDArray[np.bool_]:
        """Score one batch of windows for every model on their common pairs; returns those pairs.

        ``series_ids`` may be the batch's :class:`SeriesCodes` already, and ``window_ids`` an Arrow string column
        (its ids are only read for the windows of a non-finite forecast).
        """
        if set(forecasts) != set(self.models):
            raise DataError(f"forecasts of {sorted(forecasts)} given, the scores hold {sorted(self.models)}")
        # The forecasts keep their dtype and layout (a model's output may be a float32 transposed view): the
        # accumulator casts them exactly while it subtracts, into a C-ordered error array, so a forecast read back
        # from its Parquet part rescores bit for bit without a float64 copy of every model's output here.
        actual = np.ascontiguousarray(actual, dtype=np.float64)
        arrays = {name: _as_float(values) for name, values in forecasts.items()}
        valid, excluded, nonfinite = common_pairs(actual, arrays, BASELINES)
        for reason, count in excluded.items():
            self.excluded[reason] += count
        for name, rows in nonfinite.items():
            if rows.any():
                self.nonfinite[name] += _ids_at(window_ids, rows)
        scale = np.asarray(scale, dtype=np.float64)
        if actual.shape[0] == 0:
            return valid
        codes = series_ids if isinstance(series_ids, SeriesCodes) else SeriesCodes.of(series_ids)
        shared = BatchPairs.of(codes, actual, scale, valid, scratch=self.scratch)
        for name in self.models:
            per_window = self.pooled[name].add(shared, arrays[name])
            self.windows[name].update(origin_us, per_window, scale)
        return valid

    def merge(self, other: PairScores) -> Self:
        if other.models != self.models:
            raise DataError(f"cannot merge the scores of models {list(other.models)} into {list(self.models)}")
        for name in self.models:
            self.pooled[name].merge(other.pooled[name])
            self.windows[name].merge(other.windows[name])
        for reason, count in other.excluded.items():
            self.excluded[reason] += count
        for name, ids in other.nonfinite.items():
            self.nonfinite[name] += ids
        return self

    @property
    def n_nonfinite_windows(self) -> int:
        return sum(len(ids) for ids in self.nonfinite.values())

    def state(self, prefix: str = "") -> dict[str, npt.NDArray[Any]]:
        """Plain arrays (no pickle): models by position, each model's sums under ``m<i>.``."""
        arrays: dict[str, npt.NDArray[Any]] = {
            f"{prefix}models": np.asarray(self.models, dtype=np.str_),
            f"{prefix}excluded": np.asarray([self.excluded[r] for r in REASONS], dtype=np.int64),
        }
        for i, name in enumerate(self.models):
            arrays |= self.pooled[name].state(f"{prefix}m{i}.")
            arrays |= self.windows[name].state(f"{prefix}m{i}.w.")
            if name in self.nonfinite:
                arrays[f"{prefix}m{i}.nonfinite"] = np.asarray(self.nonfinite[name], dtype=np.str_)
        return arrays

    @classmethod
    def from_state(cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str = "") -> PairScores:
        try:
            models = [str(name) for name in arrays[prefix + "models"]]
            first = MetricsAccumulator.from_state(arrays, f"{prefix}m0.")
            restored = cls(models, first.quantiles, first.horizon)
            restored.excluded = dict(zip(REASONS, (int(v) for v in arrays[prefix + "excluded"]), strict=True))
            for i, name in enumerate(models):
                restored.pooled[name] = MetricsAccumulator.from_state(arrays, f"{prefix}m{i}.")
                restored.windows[name] = WindowSums.from_state(
                    arrays, f"{prefix}m{i}.w.", first.quantiles, restored.median
                )
                if name in restored.nonfinite:
                    restored.nonfinite[name] = [str(w) for w in arrays.get(f"{prefix}m{i}.nonfinite", [])]
        except (KeyError, ValueError, IndexError) as exc:
            raise DataError(f"scores are incomplete or misshapen: {exc}") from exc
        return restored

    @property
    def has_median(self) -> bool:
        """Whether the median is forecast: which metrics exist, and which is :func:`.registry.primary`."""
        return has_median(self.quantiles)

    @property
    def primary(self) -> str:
        """The metric that ranks these models (:func:`.registry.primary`)."""
        return primary(self.has_median)

    def left_out(self) -> dict[str, dict[str, int]]:
        """Per model: pairs scored, pairs left out per reason, and (checkpoints) windows with non-finite values."""
        out = {}
        for name in self.models:
            pairs = self.pooled[name].pairs_scored()
            record = {"pairs_scored": pairs, **{f"left_out_{reason}": n for reason, n in self.excluded.items()}}
            if name in self.nonfinite:
                record["nonfinite_windows"] = len(self.nonfinite[name])
            out[name] = record
        return out

    def to_table(self) -> pa.Table:
        """The long metrics table: each model pooled (every scope), then fev (global), then left-out counts."""
        return pa.concat_tables(list(self.tables(SERIES_PER_TABLE)))

    def tables(self, series_per_table: int = SERIES_PER_TABLE, *, with_series: bool = True) -> Iterator[pa.Table]:
        """:meth:`to_table`'s rows a table at a time (the series block ``series_per_table`` series at a time), so
        ``metrics.parquet`` is written without the whole table in memory (:func:`.metrics_table.metrics_tables`);
        not ``with_series``: the run-wide rows only (every scope but ``series``), in the same order."""
        for name in self.models:
            yield from self.pooled[name].tables(name, series_per_table, with_series=with_series)
        yield self.fev_and_count_rows()

    def origin_table(self) -> pa.Table:
        """Every model's fev-convention score of each window origin (:data:`ORIGIN_SCHEMA`): the scope ``origin``,
        one row per (model, origin, metric) that origin defines; the mean of a metric's rows over the origins is
        its ``fev`` row of the metrics table. Built from the sums already merged (no forecast read)."""
        columns: dict[str, list[Any]] = {name: [] for name in ORIGIN_SCHEMA.names}
        for name in self.models:
            window_sums = self.windows[name]
            for metric, values, counts in window_sums.by_origin():
                defined = np.isfinite(values)
                size = int(defined.sum())
                columns["model"] += [name] * size
                columns["origin"] += window_sums.origins[defined].tolist()
                columns["metric"] += [metric] * size
                columns["value"] += values[defined].tolist()
                columns["n"] += counts[defined].tolist()
        columns["convention"] = [FEV] * len(columns["model"])
        return pa.table(columns, schema=ORIGIN_SCHEMA)

    def fev_and_count_rows(self) -> pa.Table:
        """The fev rows and the left-out counts of every model (global scope; the last rows of the table)."""
        records = []
        for name in self.models:
            for metric, value, n in self.windows[name].rows():
                records.append(_row(name, metric, value, n, FEV))
            for key, count in self.left_out()[name].items():
                if key.startswith("left_out_") or key == "nonfinite_windows":
                    records.append(_row(name, key, float(count), count, "count"))
        return pa.Table.from_pylist(records, schema=METRICS_SCHEMA)


def _ids_at(window_ids: npt.NDArray[Any] | pa.Array, rows: npt.NDArray[np.bool_]) -> list[str]:
    """The ids of the windows ``rows`` marks, from an array or an Arrow column (read only there)."""
    if isinstance(window_ids, pa.Array | pa.ChunkedArray):
        return [str(window_ids[int(i)].as_py()) for i in np.flatnonzero(rows)]
    return [str(w) for w in np.asarray(window_ids)[rows]]


def _as_float(values: npt.ArrayLike | CellForecast) -> Forecast:
    """float32 and float64 arrays (and tables of cells) as they are (no copy); anything else as float64."""
    if isinstance(values, CellForecast):
        return values
    array = np.asarray(values)
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)


def _row(model: str, metric: str, value: float, n: int, convention: str) -> dict[str, Any]:
    return {
        "model": model,
        "scope": "global",
        "series_id": None,
        "lead": None,
        "metric": metric,
        "quantile": None,
        "value": value,
        "n": n,
        "convention": convention,
    }
