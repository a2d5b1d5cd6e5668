"""The backtest's scores, recomputed independently: the reference checkpoint on the Taylor hold-out.

A few hundred windows run through ``run_backtest`` (real local Ray, real ORT), then MAE, MASE, WQL and
interval coverage of the model and of the seasonal-naive baseline are computed again here with plain numpy,
from the forecast parts and the raw data file, following docs/design.md's Metrics section literally (a loop per
window, timestamps looked up in the raw rows). Nothing of ``evaluation.scoring.metrics``, ``naive`` or the
window planner is used to compute the expected values.

Integration tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray")
pytest.importorskip("onnxruntime")

from backtest_data import read_forecasts, settings_for

from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET

pytestmark = pytest.mark.integration

N_WINDOWS, STRIDE, HORIZON, SEASON = 300, 3, 96, 48  # origins over the last 21 days (the held-out part)
STEP_US = 30 * 60 * 1_000_000
QUANTILES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
INTERVALS = [(0.1, 0.9), (0.2, 0.8), (0.3, 0.7), (0.4, 0.6)]


def _rho(q: float, u: np.ndarray) -> np.ndarray:
    return np.maximum(q * u, (q - 1.0) * u)


def _scores(
    actual: np.ndarray, forecast: dict[float, np.ndarray], scale: np.ndarray
) -> dict[tuple[str, float | None], float]:
    """docs/design.md's definitions over ``actual[W, H]`` and ``forecast[q][W, H]`` (every pair observed here)."""
    error = np.abs(actual - forecast[0.5])
    scores: dict[tuple[str, float | None], float] = {
        ("mae", None): float(error.mean()),
        ("mase", None): float(np.mean(error.mean(axis=1) / scale)),
        ("wql", None): float(
            np.mean([2.0 * _rho(q, actual - forecast[q]).sum() / np.abs(actual).sum() for q in QUANTILES])
        ),
    }
    for low, high in INTERVALS:
        inside = (forecast[low] <= actual) & (actual <= forecast[high])
        scores[("coverage", low)] = float(inside.mean())
    return scores


@pytest.mark.usefixtures("ray_session")
def test_scores_equal_an_independent_computation_on_the_taylor_hold_out(tmp_path: Path) -> None:
    settings = settings_for(
        REFERENCE_CHECKPOINT,
        REFERENCE_DATASET,
        tmp_path / "run",
        n_windows=N_WINDOWS,
        stride=STRIDE,
        horizon=HORIZON,
        seasonality=SEASON,
        quantiles=QUANTILES,
        rows_per_batch=64,
    )
    run_backtest(settings)

    raw = pq.read_table(REFERENCE_DATASET)
    assert set(raw["series_id"].to_pylist()) == {"taylor_ew"}  # one series: raw rows are keyed by timestamp
    stamps = raw["timestamp"].cast("int64").to_numpy()
    value_at = dict(zip(stamps.tolist(), raw["y"].to_numpy().tolist(), strict=True))
    first_us = int(stamps.min())
    forecasts = read_forecasts(settings.output)
    origins = sorted(set(forecasts["origin"].cast("int64").to_pylist()))
    assert len(origins) == N_WINDOWS
    assert min(origins) >= first_us + (4032 - 1008) * STEP_US  # every origin in the 21 held-out days

    by_window: dict[int, dict[int, dict[str, Any]]] = {origin: {} for origin in origins}  # origin -> lead -> row
    for row in forecasts.select(["origin", "lead", *(f"q{q:g}" for q in QUANTILES)]).to_pylist():
        by_window[int(row["origin"].timestamp() * 1_000_000)][row["lead"]] = row
    actual = np.empty((N_WINDOWS, HORIZON))
    model = {q: np.empty((N_WINDOWS, HORIZON)) for q in QUANTILES}
    naive = np.empty((N_WINDOWS, HORIZON))
    scale = np.empty(N_WINDOWS)
    for w, origin in enumerate(origins):
        for h in range(HORIZON):
            actual[w, h] = value_at[origin + h * STEP_US]
            naive[w, h] = value_at[origin - SEASON * STEP_US + (h % SEASON) * STEP_US]
            for q in QUANTILES:
                model[q][w, h] = by_window[origin][h + 1][f"q{q:g}"]
        # s_w: mean |y_t - y_(t-m)| over every observed pair of the history strictly before the origin
        pairs = [
            abs(value_at[t] - value_at[t - SEASON * STEP_US])
            for t in range(first_us + SEASON * STEP_US, origin, STEP_US)
            if t in value_at and t - SEASON * STEP_US in value_at
        ]
        scale[w] = float(np.mean(pairs))

    expected = {
        REFERENCE_CHECKPOINT.stem: _scores(actual, model, scale),
        "seasonal_naive": _scores(actual, dict.fromkeys(QUANTILES, naive), scale),
    }
    metrics = pq.read_table(Path(settings.output) / "metrics.parquet").to_pylist()
    reported = {
        (row["model"], row["metric"], row["quantile"]): (row["value"], row["n"])
        for row in metrics
        if row["scope"] == "global" and row["convention"] == "pooled"
    }
    for model_name, scores in expected.items():
        for (metric, quantile), value in scores.items():
            got, n = reported[(model_name, metric, quantile)]
            assert got == pytest.approx(value, rel=1e-9, abs=1e-12), (model_name, metric, quantile)
            assert n == N_WINDOWS * HORIZON, (model_name, metric)  # n counts pairs, MASE included
    # The lead scope too: MAE at leads 1 and 96.
    for lead in (1, HORIZON):
        row = next(
            r
            for r in metrics
            if r["scope"] == "lead"
            and r["lead"] == lead
            and r["metric"] == "mae"
            and r["model"] == REFERENCE_CHECKPOINT.stem
        )
        assert row["value"] == pytest.approx(np.abs(actual[:, lead - 1] - model[0.5][:, lead - 1]).mean(), rel=1e-9)
    # The numbers are the reference model's, not a degenerate run's (resources/README.md: MASE ~0.21 vs ~1.26).
    assert expected[REFERENCE_CHECKPOINT.stem][("mase", None)] < 0.5
    assert expected["seasonal_naive"][("mase", None)] > 1.0
