"""A small scored panel for the report's tests: random-walk actuals, two models and both baselines."""

from __future__ import annotations

import numpy as np

from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores

QUANTILES = (0.1, 0.5, 0.9)
HORIZON = 4
STEP_US = 3_600_000_000


def panel_scores(
    n_series: int, n_origins: int, models: tuple[str, ...] = ("good", "bad"), level: float = 100.0
) -> PairScores:
    """Random-walk actuals around ``level``; the first model close to them, the second further, any others copies
    of the first; the baselines the window's first value (plus 1.5), the quantile one with a spread."""
    rng = np.random.default_rng(7)
    scores = PairScores([*models, *BASELINES], QUANTILES, HORIZON)
    origins = np.arange(n_origins, dtype=np.int64) * HORIZON * STEP_US  # windows that do not overlap: blocks of 1
    unit = level / 100.0
    for s in range(n_series):
        actual = level + unit * np.cumsum(rng.normal(size=(n_origins, HORIZON)), axis=1)
        noise = unit * rng.normal(size=(n_origins, HORIZON, 1))
        spread = unit * np.array([-1.0, 0.0, 1.0])
        first = np.repeat(actual[:, :1, None] + 1.5 * unit, HORIZON, axis=1)
        forecasts = {
            models[0]: actual[:, :, None] + 0.5 * noise + spread,
            models[1]: actual[:, :, None] + 2.0 * noise + spread,
            "seasonal_naive": first + 0 * spread,
            "seasonal_quantiles": first + 2 * spread,
        }
        for extra in models[2:]:
            forecasts[extra] = forecasts[models[0]]
        ids = np.array([f"s{s:03d}"] * n_origins)
        window_ids = np.array([f"{s}-{o}" for o in range(n_origins)])
        scores.update(ids, origins, window_ids, actual, forecasts, np.ones(n_origins))
    return scores


def panel_summary(scores: PairScores) -> dict[str, object]:
    models = [m for m in scores.models if m not in BASELINES]
    return {"model": models[0], "models": {m: {} for m in models}, "pairs": scores.left_out()}
