"""Unit tier: streaming metrics against a slow per-window reference, merging, and the naive baseline."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from references import seasonal_naive_batch, seasonal_naive_forecast, seasonal_scale, seasonal_scales

from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.evaluation.scoring.metrics import METRICS_SCHEMA, MetricsAccumulator
from distributed_onnx.evaluation.scoring.naive import broadcast_quantiles

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
HORIZON = 4
Batch = tuple[list[str], np.ndarray, np.ndarray, np.ndarray]
Key = tuple[str, str | None, int | None, str, float | None]


# ---------------------------------------------------------------- reference (slow, obvious, per window)


def _rho(q: float, u: float) -> float:
    return max(q * u, (q - 1.0) * u)


def _reference(batches: Iterable[Batch], quantiles: Sequence[float]) -> dict[Key, tuple[float, int]]:
    windows = [
        (sid, y[w], f[w], s[w]) for ids, y, f, s in batches for w, sid in enumerate(ids)
    ]  # a list of every window: what the accumulator must never keep
    horizon = windows[0][1].shape[0]
    med = quantiles.index(0.5) if 0.5 in quantiles else None
    intervals = [(i, quantiles.index(1 - q)) for i, q in enumerate(quantiles) if q < 0.5 and 1 - q in quantiles]
    out: dict[Key, tuple[float, int]] = {}

    def ok(y: np.ndarray, f: np.ndarray, h: int) -> bool:
        return bool(np.isfinite(y[h]) and np.all(np.isfinite(f[h])))

    def score(scope: str, sid: str | None, lead: int | None, chosen: list[Any]) -> None:
        leads = [lead - 1] if lead is not None else list(range(horizon))
        pairs = [(y[h], f[h]) for _, y, f, _ in chosen for h in leads if ok(y, f, h)]
        key = (scope, sid, lead)
        per_window_mase, per_window_sql, scaled_pairs = [], [], 0
        for _, y, f, s in chosen:
            good = [h for h in leads if ok(y, f, h)]
            if not good or not (np.isfinite(s) and s > 0):
                continue
            scaled_pairs += len(good)
            if med is not None:
                per_window_mase.append(np.mean([abs(y[h] - f[h][med]) for h in good]) / s)
            losses = [2 * _rho(q, y[h] - f[h][i]) for h in good for i, q in enumerate(quantiles)]
            per_window_sql.append(np.mean(losses) / s)
        if pairs and med is not None:
            errors = [yv - fv[med] for yv, fv in pairs]
            out[(*key, "mae", None)] = (float(np.mean(np.abs(errors))), len(pairs))
            out[(*key, "rmse", None)] = (math.sqrt(np.mean(np.square(errors))), len(pairs))
        if per_window_sql:
            if med is not None:
                out[(*key, "mase", None)] = (float(np.mean(per_window_mase)), scaled_pairs)
            out[(*key, "sql", None)] = (float(np.mean(per_window_sql)), scaled_pairs)
        if not pairs:
            return
        total_y = sum(abs(yv) for yv, _ in pairs)
        wql = np.mean([sum(2 * _rho(q, yv - fv[i]) for yv, fv in pairs) / total_y for i, q in enumerate(quantiles)])
        out[(*key, "wql", None)] = (float(wql), len(pairs))
        for i, q in enumerate(quantiles):
            loss = np.mean([_rho(q, yv - fv[i]) for yv, fv in pairs])
            out[(*key, "pinball", q)] = (float(loss), len(pairs))
        for i, j in intervals:
            inside = np.mean([fv[i] <= yv <= fv[j] for yv, fv in pairs])
            out[(*key, "coverage", quantiles[i])] = (float(inside), len(pairs))

    score("global", None, None, windows)
    for sid in sorted({w[0] for w in windows}):
        score("series", sid, None, [w for w in windows if w[0] == sid])
    for lead in range(1, horizon + 1):
        score("lead", None, lead, windows)
    return out


def _as_dict(table: pa.Table) -> dict[Key, tuple[float, int]]:
    rows = table.to_pylist()
    result = {(r["scope"], r["series_id"], r["lead"], r["metric"], r["quantile"]): (r["value"], r["n"]) for r in rows}
    assert len(result) == len(rows), "duplicate metric rows"
    return result


def _assert_matches(table: pa.Table, expected: dict[Key, tuple[float, int]]) -> None:
    got = _as_dict(table)
    assert set(got) == set(expected)
    for key, (value, n) in expected.items():
        assert got[key][1] == n, key
        np.testing.assert_allclose(got[key][0], value, rtol=1e-9, atol=0, err_msg=str(key))


def _random_batch(rng: np.random.Generator, n_windows: int, quantiles: Sequence[float]) -> Batch:
    ids = list(rng.choice(["alpha", "beta", "gamma"], size=n_windows))
    ids[0] = "empty"  # a series whose actuals are all missing: no series rows at all
    actual = rng.normal(5.0, 3.0, size=(n_windows, HORIZON))
    actual[rng.random(actual.shape) < 0.25] = np.nan
    actual[0] = np.nan
    forecast = np.sort(actual[..., None] + rng.normal(0, 2, size=(n_windows, HORIZON, len(quantiles))), axis=-1)
    forecast = np.where(np.isnan(forecast), rng.normal(size=forecast.shape), forecast)
    forecast[rng.random(forecast.shape) < 0.03] = np.nan  # a non-finite forecast drops its pair
    scale = rng.uniform(0.5, 2.0, size=n_windows)
    scale[rng.random(n_windows) < 0.2] = np.nan
    scale[rng.random(n_windows) < 0.1] = 0.0
    return ids, actual, forecast.astype(np.float32), scale


# ---------------------------------------------------------------- against the reference


@pytest.mark.parametrize("quantiles", [QUANTILES, (0.1, 0.9), (0.5,)])
def test_every_metric_and_scope_matches_reference(quantiles: tuple[float, ...]) -> None:
    rng = np.random.default_rng(7)
    batches = [_random_batch(rng, n, quantiles) for n in (40, 1, 25)]
    acc = MetricsAccumulator(quantiles, HORIZON)
    for batch in batches:
        acc.update(*batch)
    reference = _reference([(ids, y, f.astype(np.float64), s) for ids, y, f, s in batches], list(quantiles))
    _assert_matches(acc.to_table("m"), reference)
    metrics = {key[3] for key in reference}
    assert {key[0] for key in reference} == {"global", "series", "lead"}
    assert {key[1] for key in reference} == {None, "alpha", "beta", "gamma"}
    assert "sql" in metrics and "wql" in metrics and "pinball" in metrics
    assert ("mae" in metrics) == (0.5 in quantiles)
    assert ("coverage" in metrics) == (0.1 in quantiles and 0.9 in quantiles)


def test_merge_equals_one_accumulator_over_both_batches() -> None:
    rng = np.random.default_rng(11)
    first, second = _random_batch(rng, 30, QUANTILES), _random_batch(rng, 17, QUANTILES)
    second[0][1:4] = ["delta", "delta", "alpha"]  # a series only the second one has, in another order
    a, b, both = (MetricsAccumulator(QUANTILES, HORIZON) for _ in range(3))
    a.update(*first)
    b.update(*second)
    both.update(*first)
    both.update(*second)
    merged = a.merge(b)
    assert merged is a
    expected = _as_dict(both.to_table("m"))
    _assert_matches(merged.to_table("m"), expected)
    assert merged.to_table("m").column("scope").to_pylist() == both.to_table("m").column("scope").to_pylist()
    assert (a.n_windows, a.n_missing_pairs, a.n_unscaled_windows) == (
        both.n_windows,
        both.n_missing_pairs,
        both.n_unscaled_windows,
    )


def test_merge_of_different_runs_is_refused() -> None:
    with pytest.raises(ConfigError, match="quantiles"):
        MetricsAccumulator(QUANTILES, HORIZON).merge(MetricsAccumulator((0.5,), HORIZON))
    with pytest.raises(ConfigError, match="horizon 4 vs 3"):
        MetricsAccumulator(QUANTILES, HORIZON).merge(MetricsAccumulator(QUANTILES, 3))


# ---------------------------------------------------------------- hand-computed


def _tiny() -> MetricsAccumulator:
    acc = MetricsAccumulator((0.1, 0.5, 0.9), horizon=2)
    forecast = np.array([[[8.0, 9.0, 12.0], [21.0, 22.0, 25.0]]])
    acc.update(["s"], np.array([[10.0, 20.0]]), forecast, np.array([2.0]))
    return acc


def test_tiny_case_by_hand() -> None:
    got = _as_dict(_tiny().to_table("tiny"))
    # errors vs the median: 1 and -2; pinball losses q0.1: 0.2, 0.9; q0.5: 0.5, 1.0; q0.9: 0.2, 0.5.
    expected = {
        "mae": 1.5,
        "rmse": math.sqrt(2.5),
        "mase": 1.5 / 2.0,
        "sql": (2 * (0.2 + 0.9 + 0.5 + 1.0 + 0.2 + 0.5) / 6) / 2.0,
        "wql": (2.2 / 30 + 3.0 / 30 + 1.4 / 30) / 3,
    }
    for metric, value in expected.items():
        assert got[("global", None, None, metric, None)][0] == pytest.approx(value, rel=1e-12)
        assert got[("series", "s", None, metric, None)][0] == pytest.approx(value, rel=1e-12)
    for q, value in ((0.1, 0.55), (0.5, 0.75), (0.9, 0.35)):
        assert got[("global", None, None, "pinball", q)] == (pytest.approx(value, rel=1e-12), 2)
    assert got[("global", None, None, "coverage", 0.1)] == (0.5, 2)  # 10 in [8, 12], 20 not in [21, 25]
    assert got[("lead", None, 1, "coverage", 0.1)] == (1.0, 1)
    assert got[("lead", None, 2, "mase", None)] == (1.0, 1)
    assert got[("lead", None, 1, "mae", None)] == (1.0, 1)
    assert got[("global", None, None, "mase", None)][1] == 2  # n counts pairs for mase/sql too


def test_table_schema_and_nulls() -> None:
    table = _tiny().to_table("tiny")
    assert table.schema.equals(METRICS_SCHEMA)
    for row in table.to_pylist():
        assert row["model"] == "tiny"
        assert (row["series_id"] is not None) == (row["scope"] == "series")
        assert (row["lead"] is not None) == (row["scope"] == "lead")
        assert (row["quantile"] is not None) == (row["metric"] in ("pinball", "coverage"))
    assert set(table.column("lead").to_pylist()) == {None, 1, 2}


def test_missing_actuals_and_unusable_scales_are_left_out_and_counted() -> None:
    acc = MetricsAccumulator((0.5,), horizon=2)
    actual = np.array([[1.0, np.nan], [3.0, 5.0], [np.nan, np.nan]])
    forecast = np.array([[[0.0], [9.0]], [[1.0], [1.0]], [[0.0], [0.0]]])
    acc.update(["a", "a", "b"], actual, forecast, np.array([1.0, np.nan, 0.0]))
    got = _as_dict(acc.to_table("m"))
    assert got[("global", None, None, "mae", None)] == (pytest.approx(7.0 / 3), 3)
    assert got[("global", None, None, "mase", None)] == (1.0, 1)  # only window 0 (one pair) has a usable scale
    assert not any(key[1] == "b" for key in got)  # series b has no observed actual: no rows
    assert (acc.n_windows, acc.n_missing_pairs, acc.n_unscaled_windows) == (3, 3, 2)


def test_all_zero_actuals_give_undefined_wql() -> None:
    acc = MetricsAccumulator((0.5,), horizon=1)
    acc.update(["a"], np.zeros((1, 1)), np.ones((1, 1, 1)), np.array([1.0]))
    assert math.isnan(_as_dict(acc.to_table("m"))[("global", None, None, "wql", None)][0])


def test_empty_accumulator_and_empty_batch() -> None:
    acc = MetricsAccumulator(QUANTILES, HORIZON)
    acc.update([], np.zeros((0, HORIZON)), np.zeros((0, HORIZON, 5)), np.zeros(0))
    table = acc.to_table("m")
    assert table.num_rows == 0
    assert table.schema.equals(METRICS_SCHEMA)


def test_bad_shapes_name_the_array() -> None:
    acc = MetricsAccumulator(QUANTILES, HORIZON)
    with pytest.raises(DataError, match=r"forecast must have shape \(2, 4, 5\).*got \(2, 4, 3\)"):
        acc.update(["a", "b"], np.zeros((2, HORIZON)), np.zeros((2, HORIZON, 3)), np.ones(2))
    with pytest.raises(DataError, match="actual"):
        acc.update(["a"], np.zeros((1, 3)), np.zeros((1, HORIZON, 5)), np.ones(1))


def test_state_does_not_grow_with_windows() -> None:
    rng = np.random.default_rng(3)
    acc = MetricsAccumulator(QUANTILES, HORIZON)
    acc.update(*_random_batch(rng, 50, QUANTILES))
    sizes = sum(a.nbytes for a in (*acc._series.values(), *acc._leads.values()))
    for _ in range(5):
        acc.update(*_random_batch(rng, 200, QUANTILES))
    assert sum(a.nbytes for a in (*acc._series.values(), *acc._leads.values())) == sizes


# ---------------------------------------------------------------- seasonal naive and scale


def test_seasonal_scale_by_hand() -> None:
    history = np.array([1.0, 2.0, np.nan, 4.0, 6.0, 5.0])
    assert seasonal_scale(history, 2) == pytest.approx(1.5)  # |4-2| and |5-4|; pairs with NaN dropped
    assert seasonal_scale(history, 1) == pytest.approx(4.0 / 3)  # |2-1|, |6-4|, |5-6|
    assert math.isnan(seasonal_scale(np.array([1.0, np.nan, 3.0]), 1))
    assert math.isnan(seasonal_scale(np.array([1.0]), 1))
    with pytest.raises(ConfigError, match="seasonality"):
        seasonal_scale(history, 0)


def test_seasonal_scales_equal_per_window_scale() -> None:
    rng = np.random.default_rng(5)
    values = rng.normal(size=60)
    values[rng.random(60) < 0.2] = np.nan
    origins = np.array([0, 1, 3, 7, 8, 20, 41, 60])
    expected = [seasonal_scale(values[:origin], 7) for origin in origins]
    np.testing.assert_allclose(seasonal_scales(values, origins, 7), expected, rtol=1e-12, equal_nan=True)


def test_seasonal_naive_by_hand() -> None:
    history = np.array([1.0, 2.0, 3.0, 4.0, np.nan, 6.0])
    forecast = seasonal_naive_forecast(history, 3, 7)  # H > m: h mod m wraps
    np.testing.assert_array_equal(forecast, [4.0, np.nan, 6.0, 4.0, np.nan, 6.0, 4.0])
    np.testing.assert_array_equal(seasonal_naive_forecast(history, 3, 2), [4.0, np.nan])
    np.testing.assert_array_equal(seasonal_naive_forecast(np.array([7.0]), 3, 4), [np.nan, np.nan, 7.0, np.nan])


def test_seasonal_naive_batch_and_quantile_broadcast() -> None:
    blocks = np.array([[1.0, 2.0], [3.0, np.nan]])
    point = seasonal_naive_batch(blocks, 5)
    np.testing.assert_array_equal(point, [[1, 2, 1, 2, 1], [3, np.nan, 3, np.nan, 3]])
    fan = broadcast_quantiles(point, 3)
    assert fan.shape == (2, 5, 3)
    np.testing.assert_array_equal(fan[..., 2], point)


def test_naive_baseline_scores_like_its_point_forecast() -> None:
    acc = MetricsAccumulator((0.1, 0.5, 0.9), horizon=2)
    point = seasonal_naive_batch(np.array([[4.0, np.nan]]), 2)
    acc.update(["s"], np.array([[5.0, 1.0]]), broadcast_quantiles(point, 3), np.array([1.0]))
    got = _as_dict(acc.to_table("seasonal_naive"))
    assert got[("global", None, None, "mae", None)] == (1.0, 1)  # lead 2 has no naive value: left out
    assert got[("global", None, None, "sql", None)][0] == pytest.approx(1.0)  # equal quantiles: sql == mase


def test_coverage_bounds_are_inclusive() -> None:
    acc = MetricsAccumulator((0.25, 0.5, 0.75), horizon=3)
    forecast = np.array([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]])
    acc.update(["s"], np.array([[1.0, 3.0, 3.5]]), forecast, np.array([1.0]))
    assert _as_dict(acc.to_table("m"))[("global", None, None, "coverage", 0.25)] == (pytest.approx(2 / 3), 3)
