"""The report's intervals mean something (issue 28): origin blocks for few series, series for many, identical
forecasts named, a verdict line, and the score by forecast origin. Pure numpy scoring: the unit tier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from distributed_onnx.evaluation.report.page import write_report
from distributed_onnx.evaluation.report.uncertainty import block_weights, uncertainty
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores

QUANTILES = (0.1, 0.5, 0.9)
HORIZON = 4
STEP_US = 3_600_000_000


def _scores(n_series: int, n_origins: int, models: tuple[str, ...] = ("good", "bad")) -> PairScores:
    """Random-walk actuals, ``good`` close to them, ``bad`` further; baselines the last value (and a spread)."""
    rng = np.random.default_rng(7)
    scores = PairScores([*models, *BASELINES], QUANTILES, HORIZON)
    origins = np.arange(n_origins, dtype=np.int64) * HORIZON * STEP_US  # windows that do not overlap: blocks of 1
    for s in range(n_series):
        actual = 100 + np.cumsum(rng.normal(size=(n_origins, HORIZON)), axis=1)
        noise = rng.normal(size=(n_origins, HORIZON, 1))
        spread = np.array([-1.0, 0.0, 1.0])
        forecasts = {
            "good": actual[:, :, None] + 0.5 * noise + spread,
            "bad": actual[:, :, None] + 2.0 * noise + spread,
            "seasonal_naive": np.repeat(actual[:, :1, None] + 1.5, HORIZON, axis=1) + 0 * spread,
            "seasonal_quantiles": np.repeat(actual[:, :1, None] + 1.5, HORIZON, axis=1) + 2 * spread,
        }
        for extra in models[2:]:
            forecasts[extra] = forecasts["good"]
        ids = np.array([f"s{s:03d}"] * n_origins)
        window_ids = np.array([f"{s}-{o}" for o in range(n_origins)])
        scores.update(ids, origins, window_ids, actual, forecasts, np.ones(n_origins))
    return scores


def test_one_series_gets_origin_block_intervals_of_nonzero_width_and_says_so() -> None:
    scores = _scores(1, 40)
    board = leaderboard(scores, STEP_US)
    sure = uncertainty(scores, STEP_US)
    assert sure.resampling == "origin_blocks" and "moving-block bootstrap over the 40 window origins" in sure.label
    metric = board.filter((pc.field("kind") == "metric") & (pc.field("metric") == "mase")).to_pylist()
    for row in metric:
        assert row["ci_low"] == row["ci_high"]  # the series bootstrap of one series: no width (kept as it is)
        low, high = sure.intervals[(row["model"], "mase")]
        assert low < row["value"] < high  # origin blocks: a real interval around the same point
    low, high = sure.skill_intervals[("good", "mase")]
    assert high - low > 0
    assert sure.verdict is not None and sure.verdict["best"] == "good" and sure.verdict["next"] == "bad"
    assert sure.verdict["margin_low"] > 0


def test_the_pooled_metrics_from_origin_sums_are_the_leaderboards() -> None:
    scores = _scores(3, 12)
    sure_points = {}
    from distributed_onnx.evaluation.report.uncertainty import OriginSums

    origins = OriginSums.of(scores.windows)
    for model in scores.models:
        sure_points[model] = origins.metrics(model, np.ones((1, 12)), True)
    board = leaderboard(scores, STEP_US).filter(pc.field("kind") == "metric").to_pylist()
    for row in board:
        assert sure_points[row["model"]][row["metric"]][0] == pytest.approx(row["value"], rel=1e-12)


def test_a_many_series_panel_keeps_the_series_bootstrap(tmp_path: Path) -> None:
    scores = _scores(40, 5)
    sure = uncertainty(scores, STEP_US)
    assert sure.resampling == "series" and not sure.intervals
    board = leaderboard(scores, STEP_US)
    page = Path(write_report(tmp_path, _summary(scores), scores.to_table(), QUANTILES, [],
                             board, pair_scores=scores, step_us=STEP_US)).read_text()  # fmt: skip
    row = board.filter((pc.field("kind") == "metric") & (pc.field("model") == "good") & (pc.field("metric") == "mase"))
    low, high = row["ci_low"][0].as_py(), row["ci_high"][0].as_py()
    assert f"[{low:.3g}, {high:.3g}]" in page  # the leaderboard's own interval, shown as today
    assert "bootstrap over 40 series" in page


def test_too_few_origins_say_no_interval_can_be_formed(tmp_path: Path) -> None:
    scores = _scores(1, 1)
    sure = uncertainty(scores, STEP_US)
    assert sure.resampling == "none" and "No interval can be formed" in (sure.no_interval or "")


def test_identical_forecasts_are_named_and_the_verdict_leads_the_page(tmp_path: Path) -> None:
    scores = _scores(1, 30, models=("good", "bad", "copy"))
    board = leaderboard(scores, STEP_US)
    sure = uncertainty(scores, STEP_US)
    assert sure.identical == [["good", "copy"]]
    page = Path(write_report(tmp_path, _summary(scores), scores.to_table(), QUANTILES, [], board,
                             pair_scores=scores, step_us=STEP_US)).read_text()  # fmt: skip
    assert "identical forecasts</td>" in page and "Identical forecasts: good, copy" in page
    verdict = page.index("class='verdict'")
    assert verdict < page.index("<h2>Leaderboard</h2>")
    assert "identical forecasts from copy" in page[verdict : verdict + 600]
    assert "Diebold-Mariano p = " in page[verdict : verdict + 800]
    assert "Score by forecast origin" in page
    calibration = page[page.index("<h3>Calibration, every model</h3>") :]
    assert "<tr><th>seasonal_naive</th>" not in calibration[: calibration.index("</table>")]


def test_block_weights_draw_whole_blocks_of_every_resample() -> None:
    weights = block_weights(10, 3, 50)
    assert weights.shape == (50, 10) and np.all(weights.sum(axis=1) == 10)


def _summary(scores: PairScores) -> dict[str, object]:
    models = [m for m in scores.models if m not in BASELINES]
    return {"model": models[0], "models": {m: {} for m in models}, "pairs": scores.left_out()}
