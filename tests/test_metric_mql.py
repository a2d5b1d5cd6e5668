"""The mean quantile loss (the CRPS approximated from the quantiles) in the fev convention, against fev's own MQL.

fev 0.10.0 scores an evaluation window (one cutoff over every series) with ``fev.metrics.MQL`` and averages the
windows; here the windows sharing an origin are that window. A panel with gaps (missing actuals, pairs left out)
and a forecast that leaves one series' window out entirely: what fev's ``nanmean`` skips, the sums skip too.
"""

from __future__ import annotations

import numpy as np
import pytest

from distributed_onnx.evaluation.scoring.pairs import PairScores


def test_mql_in_the_fev_convention_equals_fev_itself() -> None:
    import fev.metrics as fm

    rng = np.random.default_rng(11)
    horizon, quantiles, n_series = 5, [0.1, 0.25, 0.5, 0.75, 0.9], 4
    scores = PairScores(["model"], quantiles, horizon)
    expected = []
    for origin in (0, 3_600_000_000, 7_200_000_000, 10_800_000_000):
        actual = rng.gamma(3.0, 10.0, (n_series, horizon))
        actual[rng.random(actual.shape) < 0.2] = np.nan
        forecast = np.sort(actual[:, :, None] + rng.normal(0, 6, (n_series, horizon, len(quantiles))), axis=2)
        forecast = np.where(np.isnan(forecast), rng.normal(30, 5, forecast.shape), forecast)
        ids = np.asarray([f"s{i}" for i in range(n_series)])
        valid = scores.update(ids, np.full(n_series, origin), ids, actual, {"model": forecast}, np.ones(n_series))
        y_true = np.where(valid, actual, np.nan)[:, :, None]
        expected.append(
            fm.MQL().compute(
                y_true=y_true,
                y_pred=forecast[:, :, 2:3],
                y_past=np.zeros((n_series, 1)),
                y_past_lengths=np.ones(n_series, dtype=int),
                q_pred=forecast[:, :, None, :],
                seasonality=1,
                quantile_levels=quantiles,
            )
        )
    rows = {metric: (value, n) for metric, value, n in scores.windows["model"].rows()}
    assert rows["mql"][0] == pytest.approx(float(np.mean(expected)), rel=1e-12)
    assert rows["mql"][1] == rows["mae"][1] == scores.pooled["model"].pairs_scored()
    assert "mql" not in set(scores.pooled["model"].to_table("model").column("metric").to_pylist())  # fev only
