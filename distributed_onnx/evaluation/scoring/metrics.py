"""Streaming, mergeable accumulation of the backtest metrics (docs/design.md, Metrics).

A backtest scores millions of (window, lead) pairs spread over many actors, so metrics are accumulated as
*sums* and only divided at the end:

- memory grows with the number of series, leads and quantiles, never with the number of windows;
- two accumulators over disjoint batches ``merge`` into exactly the accumulator over both batches, so each
  actor can score its own batches and the driver adds them up (order does not matter, up to float rounding).

Per series we keep sums over all its (window, lead) pairs plus window-level sums for MASE/SQL; per lead we
keep the same sums across all series. The global scope is the sum of the per-series sums.

A (window, lead) pair counts when its actual is observed *and* every requested quantile of the forecast is
finite, and, when the caller passes ``valid``, when that mask says so: the backtest passes the run's one set
of pairs (:mod:`.pairs`: every model's forecast finite there), so every model is scored on the same pairs.
One validity mask shared by all metrics keeps ``n`` comparable between them and keeps the WQL denominator the
same for every level; ``n`` always counts (window, lead) pairs, MASE and SQL included (the pairs of windows
with a usable scale). Missing pairs and windows without a usable scale are left out and counted
(``n_missing_pairs``, ``n_unscaled_windows``). The seasonal scale ``s_w`` and the seasonal-naive
baseline (scored by a second accumulator) come from :mod:`distributed_onnx.evaluation.scoring.naive`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.model.quantiles import LEVEL_TOLERANCE, central_intervals, validate_quantiles

__all__ = ["METRICS_SCHEMA", "POOLED", "MetricsAccumulator", "SeriesCodes", "finite_pairs"]

F64 = npt.NDArray[np.float64]

#: The long ``metrics`` table (docs/design.md, Outputs).
METRICS_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("series_id", pa.string()),
        pa.field("lead", pa.int32()),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("quantile", pa.float64()),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("convention", pa.string(), nullable=False),
    ]
)
#: Sums over every pair of a scope (this module); the other convention is :mod:`.conventions` (``fev``).
POOLED = "pooled"

# Sums kept per unit (a series, or a lead); the trailing shape is () unless noted.
# pairs: valid (window, lead) pairs; abs_err / sq_err: |y - q0.5| and its square; abs_y: |y|;
# rho[Q]: pinball losses rho_q; hits[C]: actuals inside each central interval;
# scaled: windows (series) or pairs (lead) with a usable scale; mase / sql: their scaled losses;
# scaled_pairs: the valid pairs of those windows (the ``n`` of mase and sql rows).
_FIELDS = ("pairs", "abs_err", "sq_err", "abs_y", "rho", "hits", "scaled", "mase", "sql", "scaled_pairs")


class _Sums(NamedTuple):
    """The sums of one reporting unit (everything, one series, or one lead)."""

    pairs: float
    abs_err: float
    sq_err: float
    abs_y: float
    rho: F64
    hits: F64
    scaled: float
    mase: float
    sql: float
    scaled_pairs: float


def _group_sum(codes: npt.NDArray[np.intp], values: npt.NDArray[Any], n_groups: int) -> F64:
    """Sum ``values[W, ...]`` by ``codes[W]`` into ``[n_groups, ...]`` with one ``bincount`` (no loop)."""
    flat = values.reshape(values.shape[0], -1)
    width = flat.shape[1]
    index = (codes[:, None] * width + np.arange(width)).ravel()
    sums = np.bincount(index, weights=flat.ravel().astype(np.float64), minlength=n_groups * width)
    return sums.reshape((n_groups, *values.shape[1:]))


def finite_pairs(forecast: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """``[W, H]``: every quantile of the pair's forecast finite. One fast pass when all are (the usual batch): the
    reduction over the short quantile axis costs ten times more and only runs when something is not finite.
    """
    if forecast.ndim == 3 and forecast.shape[2] > 1 and forecast.strides[2] == 0:  # one point for every level
        return np.asarray(np.isfinite(forecast[..., 0]))
    finite = np.isfinite(forecast)
    if finite.all():
        return np.ones(forecast.shape[:2], dtype=bool)
    return np.asarray(finite.all(axis=2))


class SeriesCodes(NamedTuple):
    """A batch's series ids as its distinct ids and each window's position among them (computed once a batch)."""

    distinct: list[str]
    local: npt.NDArray[np.intp]
    size: int

    @classmethod
    def of(cls, series_ids: Sequence[str] | npt.NDArray[Any]) -> SeriesCodes:
        ids = np.asarray(series_ids, dtype=object).ravel().astype(np.str_)
        distinct, local = np.unique(ids, return_inverse=True)
        return cls([str(sid) for sid in distinct], local.ravel().astype(np.intp), int(ids.size))


class MetricsAccumulator:
    """Accumulates forecast metrics batch by batch; ``merge`` adds another accumulator's sums.

    ``quantiles`` are the requested levels, ascending, in the order of the forecast's last axis. Point
    metrics (mae, rmse, mase) need the median, so they are only reported when 0.5 is requested. Counts are
    kept as float64 sums (exact up to 2**53 pairs) so every state array is added the same way.
    """

    def __init__(self, quantiles: Sequence[float], horizon: int) -> None:
        self.quantiles = validate_quantiles(quantiles)
        if horizon < 1:
            raise ConfigError(f"horizon must be at least 1 step; got {horizon}.", key="horizon")
        self.horizon = int(horizon)
        self.intervals = central_intervals(self.quantiles)
        self._levels = np.asarray(self.quantiles)
        self._median = next((i for i, q in enumerate(self.quantiles) if abs(q - 0.5) <= LEVEL_TOLERANCE), None)
        self._lower = np.asarray([self.quantiles.index(lo) for lo, _ in self.intervals], dtype=np.intp)
        self._upper = np.asarray([self.quantiles.index(hi) for _, hi in self.intervals], dtype=np.intp)
        self._series_index: dict[str, int] = {}
        self._series = {name: self._zeros(0, name) for name in _FIELDS}
        self._leads = {name: self._zeros(self.horizon, name) for name in _FIELDS}
        self.n_windows = 0
        self.n_missing_pairs = 0
        self.n_unscaled_windows = 0

    def _zeros(self, rows: int, name: str) -> F64:
        trailing = {"rho": (len(self.quantiles),), "hits": (len(self.intervals),)}.get(name, ())
        return np.zeros((rows, *trailing))

    def _rows_of(self, series_ids: Sequence[str]) -> npt.NDArray[np.intp]:
        """Map distinct series ids to rows of the per-series state, growing it for series seen first."""
        new = [sid for sid in series_ids if sid not in self._series_index]
        if new:
            for sid in new:
                self._series_index[sid] = len(self._series_index)
            self._series = {
                name: np.concatenate([arr, self._zeros(len(new), name)]) for name, arr in self._series.items()
            }
        return np.asarray([self._series_index[sid] for sid in series_ids], dtype=np.intp)

    def update(
        self,
        series_ids: Sequence[str] | npt.NDArray[Any] | SeriesCodes,
        actual: npt.ArrayLike,
        forecast: npt.ArrayLike,
        scale: npt.ArrayLike,
        valid: npt.NDArray[np.bool_] | None = None,
    ) -> dict[str, F64]:
        """Add one batch: ``actual[W, H]`` (NaN = missing), ``forecast[W, H, Q]``, ``scale[W]`` (s_w).

        ``valid[W, H]``, when given, are the pairs scored (the run's common pairs: observed, forecast finite; the
        caller guarantees it). Windows whose
        scale is NaN or not positive still count for every metric except mase and sql. Returns the batch's
        per-window sums over leads (``pairs``, ``abs_err``, ``sq_err``, ``abs_y``, ``rho[W, Q]``...), which the
        fev convention (:mod:`.conventions`) adds per origin without recomputing a loss.
        """
        ids = series_ids if isinstance(series_ids, SeriesCodes) else SeriesCodes.of(series_ids)
        y = np.ascontiguousarray(actual, dtype=np.float64)
        # float32 forecasts stay float32 here: the subtraction below casts them exactly, in one pass.
        f = np.asarray(forecast)
        if f.dtype not in (np.float32, np.float64):
            f = f.astype(np.float64)
        s = np.asarray(scale, dtype=np.float64)
        n_win, horizon, n_q = ids.size, self.horizon, len(self.quantiles)
        expected = {"actual": (n_win, horizon), "forecast": (n_win, horizon, n_q), "scale": (n_win,)}
        for name, array in (("actual", y), ("forecast", f), ("scale", s)):
            if array.shape != expected[name]:
                raise DataError(
                    f"{name} must have shape {expected[name]} (windows={n_win}, horizon={horizon}, "
                    f"quantiles={n_q}); got {array.shape}.",
                    array=name,
                )
        if n_win == 0:
            return {}

        if valid is None:
            valid = np.isfinite(y) & finite_pairs(f)  # [W, H]
        else:  # the caller's pairs (pairs.common_pairs): observed, every forecast finite; not checked again
            valid = np.asarray(valid, dtype=bool).reshape(n_win, horizon)
        all_valid = bool(valid.all())
        y0 = y if all_valid else np.where(valid, y, 0.0)  # invalid pairs become 0 - 0: they add nothing to any sum
        if f.ndim == 3 and n_q > 1 and f.strides[2] == 0:
            rho, point, hits = self._point_losses(y0, f[..., 0], valid, all_valid)
        else:
            rho, point, hits = self._losses(y0, f, valid, all_valid)

        scaled = np.isfinite(s) & (s > 0.0)
        s_safe = np.where(scaled, s, 1.0)
        n_valid = valid.sum(axis=1)
        use_window = scaled & (n_valid > 0)
        denom = np.where(use_window, n_valid, 1) * s_safe
        step_sql = 2.0 * rho.mean(axis=2)  # [W, H]: mean over q of 2 * rho_q
        lead_scaled = valid & scaled[:, None]

        per_pair = {
            "pairs": valid,
            "abs_err": point,
            "sq_err": point**2,
            "abs_y": np.abs(y0),
            "rho": rho,
            "hits": hits,
        }
        window_level = {
            "scaled": use_window,
            "mase": np.where(use_window, point.sum(axis=1) / denom, 0.0),
            "sql": np.where(use_window, step_sql.sum(axis=1) / denom, 0.0),
            "scaled_pairs": np.where(use_window, n_valid, 0),
        }
        lead_level = {
            "scaled": lead_scaled,
            "mase": np.where(lead_scaled, point / s_safe[:, None], 0.0),
            "sql": np.where(lead_scaled, step_sql / s_safe[:, None], 0.0),
            "scaled_pairs": lead_scaled,
        }

        # The batch's distinct series (found once per batch, not once per model); windows grouped by bincount.
        rows = self._rows_of(ids.distinct)
        per_window: dict[str, F64] = {}
        for name, values in per_pair.items():
            # Series scope sums over leads; lead scope sums over windows.
            per_window[name] = values.sum(axis=1)
            self._series[name][rows] += _group_sum(ids.local, per_window[name], rows.size)
            self._leads[name] += values.sum(axis=0)
        for name, values in window_level.items():
            self._series[name][rows] += _group_sum(ids.local, values, rows.size)
        for name, values in lead_level.items():
            self._leads[name] += values.sum(axis=0)

        self.n_windows += n_win
        self.n_missing_pairs += int(valid.size - valid.sum())
        self.n_unscaled_windows += int((~scaled).sum())
        return per_window

    def _losses(
        self, y0: F64, f: npt.NDArray[Any], valid: npt.NDArray[np.bool_], all_valid: bool
    ) -> tuple[F64, F64, npt.NDArray[np.bool_]]:
        """``rho[W, H, Q]``, ``|y - q0.5|[W, H]`` and coverage hits ``[W, H, C]`` (zero on invalid pairs)."""
        n_win, horizon, n_q = f.shape
        # error = y0 - f0 into one fresh C-ordered float64 array (reductions then follow one memory order whatever
        # the forecast's layout, so a forecast read back from its Parquet part rescores bit for bit); invalid
        # pairs are zeroed afterwards, which is the 0 - 0 of the masked operands, bit for bit.
        error = np.empty((n_win, horizon, n_q))
        np.subtract(y0[..., None], f, out=error)
        if not all_valid:
            error[~valid] = 0.0
        # Coverage from the signs of the errors: y - f >= 0 exactly when f <= y (an IEEE difference of finite values
        # is 0 only for equal operands and keeps its sign on overflow), so the forecast is not read a second time.
        hits = (np.take(error, self._lower, axis=2) >= 0.0) & (np.take(error, self._upper, axis=2) <= 0.0)
        if not all_valid:
            hits &= valid[..., None]
        point = np.abs(error[..., self._median]) if self._median is not None else np.zeros_like(y0)
        # rho_q(u) = max(q*u, (q-1)*u) = q*u - min(u, 0); np.maximum was ~10x slower here (measured). In place:
        # the [W, H, Q] arrays are the scoring's whole cost (benchmarks/results/scoring.md).
        rho = np.minimum(error, 0.0)
        np.subtract(np.multiply(error, self._levels, out=error), rho, out=rho)  # error is spent from here on
        return rho, point, hits

    def _point_losses(
        self, y0: F64, point_forecast: npt.NDArray[Any], valid: npt.NDArray[np.bool_], all_valid: bool
    ) -> tuple[F64, F64, npt.NDArray[np.bool_]]:
        """:meth:`_losses` of a forecast whose every level is one point ``[W, H]`` (the seasonal naive, broadcast).

        The same numbers element for element, so the same sums bit for bit: the error is one ``[W, H]`` array,
        ``rho_q = q*e - min(e, 0)`` is built from it in two passes, and an interval holds the actual exactly when
        the error is zero, whatever the interval.
        """
        error = np.subtract(y0, point_forecast, dtype=np.float64)
        if not all_valid:
            error[~valid] = 0.0
        hits = np.repeat(((error >= 0.0) & (error <= 0.0))[..., None], len(self.intervals), axis=2)
        if not all_valid:
            hits &= valid[..., None]
        point = np.abs(error) if self._median is not None else np.zeros_like(y0)
        rho = np.multiply(error[..., None], self._levels)
        np.subtract(rho, np.minimum(error, 0.0)[..., None], out=rho)
        return rho, point, hits

    def merge(self, other: MetricsAccumulator) -> Self:
        """Add ``other``'s sums to this accumulator (in place) and return it, for ``functools.reduce``."""
        if other.quantiles != self.quantiles or other.horizon != self.horizon:
            raise ConfigError(
                f"cannot merge metrics of different runs: quantiles {list(self.quantiles)} vs "
                f"{list(other.quantiles)}, horizon {self.horizon} vs {other.horizon}.",
                key="quantiles",
            )
        other_ids = list(other._series_index)  # insertion order == row order
        rows = self._rows_of(other_ids)
        for name, values in other._series.items():
            self._series[name][rows] += values
        for name, values in other._leads.items():
            self._leads[name] += values
        self.n_windows += other.n_windows
        self.n_missing_pairs += other.n_missing_pairs
        self.n_unscaled_windows += other.n_unscaled_windows
        return self

    def state(self, prefix: str = "") -> dict[str, npt.NDArray[Any]]:
        """Every sum as five plain arrays (no objects, no pickle) for a part's sums file; see :meth:`from_state`.

        The fields of each scope are packed side by side into one ``[rows, columns]`` matrix: a driver merging
        thousands of parts reads a handful of arrays per part, not one per field (measured: 51 arrays per part
        cost the driver 7 ms a part to read).
        """
        return {
            f"{prefix}series_ids": np.asarray(self.series_ids, dtype=np.str_),
            f"{prefix}quantiles": np.asarray(self.quantiles, dtype=np.float64),
            f"{prefix}counters": np.asarray(
                [self.horizon, self.n_windows, self.n_missing_pairs, self.n_unscaled_windows], dtype=np.int64
            ),
            f"{prefix}series": self._packed(self._series),
            f"{prefix}leads": self._packed(self._leads),
        }

    @classmethod
    def from_state(cls, arrays: Mapping[str, npt.NDArray[Any]], prefix: str = "") -> MetricsAccumulator:
        """Rebuild an accumulator from :meth:`state`; a missing or misshapen array raises ``DataError``."""
        try:
            horizon, n_windows, n_missing, n_unscaled = (int(v) for v in arrays[prefix + "counters"])
            restored = cls([float(q) for q in arrays[prefix + "quantiles"]], horizon)
            restored._rows_of([str(sid) for sid in arrays[prefix + "series_ids"]])
            restored._series = restored._unpacked(arrays[prefix + "series"], len(restored._series_index), "series")
            restored._leads = restored._unpacked(arrays[prefix + "leads"], horizon, "leads")
        except (KeyError, ValueError) as exc:
            raise DataError(f"metric sums are incomplete or misshapen: {exc}") from exc
        restored.n_windows, restored.n_missing_pairs, restored.n_unscaled_windows = n_windows, n_missing, n_unscaled
        return restored

    def _widths(self) -> list[tuple[str, int]]:
        return [(name, int(np.prod(self._zeros(0, name).shape[1:], dtype=np.int64))) for name in _FIELDS]

    def _packed(self, table: dict[str, F64]) -> F64:
        rows = table["pairs"].shape[0]
        return np.concatenate([table[name].reshape(rows, width) for name, width in self._widths()], axis=1)

    def _unpacked(self, packed: npt.NDArray[Any], rows: int, scope: str) -> dict[str, F64]:
        widths = self._widths()
        expected = (rows, sum(width for _, width in widths))
        matrix = np.asarray(packed, dtype=np.float64)
        if matrix.shape != expected:
            raise ValueError(f"{scope} sums have shape {matrix.shape}, expected {expected}")
        out, start = {}, 0
        for name, width in widths:
            trailing = self._zeros(0, name).shape[1:]
            out[name] = matrix[:, start : start + width].reshape((rows, *trailing)).copy()
            start += width
        return out

    def series_sums(self) -> dict[str, F64]:
        """Every per-series sum (rows in :attr:`series_ids` order): the leaderboard resamples series from them."""
        return {name: values.copy() for name, values in self._series.items()}

    @property
    def series_ids(self) -> list[str]:
        """The series seen so far, in first-seen order."""
        return list(self._series_index)

    def _unit(self, table: dict[str, F64], row: int | None) -> _Sums:
        if row is None:
            pick = {name: values.sum(axis=0) for name, values in table.items()}
        else:
            pick = {name: values[row] for name, values in table.items()}
        scalars = {n: float(pick[n]) for n in _FIELDS if n not in ("rho", "hits")}
        return _Sums(rho=pick["rho"], hits=pick["hits"], **scalars)

    def _rows(self, sums: _Sums) -> list[tuple[str, float | None, float, int]]:
        """The (metric, quantile, value, n) rows of one unit; rows with n == 0 are left out."""
        rows: list[tuple[str, float | None, float, int]] = []
        pairs = sums.pairs
        if pairs > 0 and self._median is not None:
            rows.append(("mae", None, sums.abs_err / pairs, int(pairs)))
            rows.append(("rmse", None, float(np.sqrt(sums.sq_err / pairs)), int(pairs)))
        if sums.scaled > 0:
            if self._median is not None:
                rows.append(("mase", None, sums.mase / sums.scaled, int(sums.scaled_pairs)))
            rows.append(("sql", None, sums.sql / sums.scaled, int(sums.scaled_pairs)))
        if pairs <= 0:
            return rows
        # Undefined (NaN) rather than infinite when every actual in scope is exactly zero.
        wql = float(np.mean(2.0 * sums.rho / sums.abs_y)) if sums.abs_y > 0 else float("nan")
        rows.append(("wql", None, wql, int(pairs)))
        for q, loss in zip(self.quantiles, sums.rho, strict=True):
            rows.append(("pinball", q, float(loss) / pairs, int(pairs)))
        for (lo, _), hit in zip(self.intervals, sums.hits, strict=True):
            rows.append(("coverage", lo, float(hit) / pairs, int(pairs)))
        return rows

    def to_table(self, model: str) -> pa.Table:
        """The long ``metrics`` table: global rows, then one block per series (sorted), then per lead.

        Built in vector passes over every unit at once (:meth:`_unit_rows`), in exactly the order and with
        exactly the arithmetic of :meth:`_rows` per unit: at 40,000 series a loop per unit cost the driver
        seconds (measured).
        """
        order = sorted(self._series_index)
        series_rows = np.asarray([self._series_index[sid] for sid in order], dtype=np.intp)
        scopes = [
            ("global", {name: values.sum(axis=0)[None, ...] for name, values in self._series.items()}),
            ("series", {name: values[series_rows] for name, values in self._series.items()}),
            ("lead", self._leads),
        ]
        columns: dict[str, list[pa.Array]] = {name: [] for name in METRICS_SCHEMA.names}
        for scope, sums in scopes:
            metric_names, levels, values, counts, valid = self._unit_rows(sums)
            unit, column = np.nonzero(valid)  # row-major: unit after unit, each in _rows' order
            n = unit.size
            columns["model"].append(pa.array(np.full(n, model, dtype=object), pa.string()))
            columns["scope"].append(pa.array(np.full(n, scope, dtype=object), pa.string()))
            if scope == "series":
                ids = pa.array(order, pa.string()) if order else pa.array([], pa.string())
                columns["series_id"].append(ids.take(pa.array(unit)))
            else:
                columns["series_id"].append(pa.nulls(n, pa.string()))
            lead = pa.array((unit + 1).astype(np.int32)) if scope == "lead" else pa.nulls(n, pa.int32())
            columns["lead"].append(lead)
            columns["metric"].append(pa.array(np.asarray(metric_names, dtype=object)[column], pa.string()))
            level = levels[column]
            columns["quantile"].append(pa.array(level, pa.float64(), mask=np.isnan(level)))
            columns["value"].append(pa.array(values[unit, column], pa.float64()))
            columns["n"].append(pa.array(counts[unit, column], pa.int64()))
            columns["convention"].append(pa.array(np.full(n, POOLED, dtype=object), pa.string()))
        arrays = [
            pa.concat_arrays(columns[name]).cast(field.type)
            for name, field in zip(METRICS_SCHEMA.names, METRICS_SCHEMA, strict=True)
        ]
        return pa.Table.from_arrays(arrays, schema=METRICS_SCHEMA)

    def _unit_rows(
        self, sums: dict[str, F64]
    ) -> tuple[list[str], F64, F64, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """:meth:`_rows` for every unit at once: (metric per column, quantile per column, value, n, kept).

        ``sums`` holds each field for ``U`` units (``[U, ...]``); the columns are every row :meth:`_rows` can
        emit, in its order, and ``kept[U, R]`` says which it does emit for each unit.
        """
        pairs, scaled = sums["pairs"], sums["scaled"]
        units = pairs.shape[0]
        has_median = self._median is not None
        metric_names: list[str] = ["mae", "rmse", "mase", "sql", "wql"]
        metric_names += ["pinball"] * len(self.quantiles) + ["coverage"] * len(self.intervals)
        levels = np.asarray([np.nan] * 5 + list(self.quantiles) + [lo for lo, _ in self.intervals], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            safe_abs_y = np.where(sums["abs_y"] > 0, sums["abs_y"], 1.0)
            wql = np.where(sums["abs_y"] > 0, np.mean(2.0 * sums["rho"] / safe_abs_y[:, None], axis=1), np.nan)
            values = np.column_stack(
                [
                    sums["abs_err"] / pairs,
                    np.sqrt(sums["sq_err"] / pairs),
                    sums["mase"] / scaled,
                    sums["sql"] / scaled,
                    wql,
                    *(sums["rho"][:, k] / pairs for k in range(len(self.quantiles))),
                    *(sums["hits"][:, c] / pairs for c in range(len(self.intervals))),
                ]
            ).reshape(units, len(metric_names))
        by_pairs = pairs.astype(np.int64)
        by_scaled = sums["scaled_pairs"].astype(np.int64)  # MASE and SQL count the pairs of their windows
        counts = np.column_stack(
            [by_pairs, by_pairs, by_scaled, by_scaled, *([by_pairs] * (1 + len(self.quantiles) + len(self.intervals)))]
        ).reshape(units, len(metric_names))
        paired = pairs > 0
        kept = np.column_stack(
            [
                paired & has_median,
                paired & has_median,
                (scaled > 0) & has_median,
                scaled > 0,
                *([paired] * (1 + len(self.quantiles) + len(self.intervals))),
            ]
        ).reshape(units, len(metric_names))
        return metric_names, levels, values, counts, kept
