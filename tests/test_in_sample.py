"""A checkpoint whose ``training_data_end`` lies inside the data: its in-sample windows are counted, scored apart
(scope ``in_sample``) and kept out of the leaderboard; ``--include-in-sample`` keeps them in. Real local Ray and
ONNX Runtime on the tiny Chronos-2 graph."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.evaluation.data.windows import plan_series
from distributed_onnx.evaluation.driver.merge import RunSums
from distributed_onnx.evaluation.driver.report import write_leaderboard
from distributed_onnx.evaluation.planning import prepare
from distributed_onnx.evaluation.sums import PartSums, read_done_part
from distributed_onnx.model.checkpoint import write_checkpoint
from tests.backtest_data import START_US, STEP_US, run_parts_in_process, settings_for, write_dataset
from tests.graphs import tiny_chronos2_metadata, tiny_chronos2_model
from tests.test_metrics_writer import assert_same_table

pytestmark = pytest.mark.integration

END_STEP = 41  # series "a" has one origin at or before it, "b" four
SEASON = 4  # short enough for the seasonal baselines to be defined on the early (in-sample) windows


def _pairs(output: Path, scope: str) -> int:
    metrics = pq.read_table(output / "metrics.parquet")
    rows = [
        row
        for row in metrics.filter(pc.equal(metrics["model"], "trained")).to_pylist()
        if row["scope"] == scope and row["metric"] == "mae" and row["convention"] == "pooled"
    ]
    assert len(rows) == 1, rows
    return int(rows[0]["n"])


@pytest.mark.usefixtures("ray_session")
def test_in_sample_windows_are_counted_and_scored_apart(tmp_path: Path) -> None:
    end_us = START_US + END_STEP * STEP_US
    end = datetime.fromtimestamp(end_us / 1e6, tz=UTC)
    checkpoint = write_checkpoint(
        tmp_path / "trained.onnx",
        tiny_chronos2_model().SerializeToString(),
        tiny_chronos2_metadata(training_data_end=end),
    )
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    settings = settings_for(checkpoint.weights_path, data, tmp_path / "run", seasonality=SEASON)
    plan = prepare(settings)
    assert plan.in_sample_end_us == end_us
    origins = np.concatenate(
        [series.timestamp_us(plan_series(series, plan.spec).origins) for series in plan.table.series]
    )
    expected = int((origins <= end_us).sum())
    assert 0 < expected < origins.size

    run_backtest(settings)
    output = Path(settings.output)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["in_sample"]["windows"] == expected
    assert summary["in_sample"]["in_leaderboard"] is False
    board = pq.read_table(output / "leaderboard.parquet").to_pylist()
    (mae,) = [r for r in board if r["kind"] == "metric" and r["model"] == "trained" and r["metric"] == "mae"]
    out_of_sample, in_sample = _pairs(output, "global"), _pairs(output, "in_sample")
    assert mae["n"] == out_of_sample > 0 and in_sample > 0

    included = settings_for(
        checkpoint.weights_path, data, tmp_path / "included", include_in_sample=True, seasonality=SEASON
    )
    run_backtest(included)
    output = Path(included.output)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["in_sample"]["windows"] == expected and summary["in_sample"]["in_leaderboard"] is True
    board = pq.read_table(output / "leaderboard.parquet").to_pylist()
    (mae,) = [r for r in board if r["kind"] == "metric" and r["model"] == "trained" and r["metric"] == "mae"]
    assert mae["n"] == _pairs(output, "global") == out_of_sample + in_sample
    assert _pairs(output, "in_sample") == in_sample  # still scored apart too


def _in_process(checkpoint: Path, data: Path, output: Path, **overrides: object) -> tuple[int, int, int, int]:
    """The parts run in this process (no Ray), merged as the driver merges them: (in-sample windows counted,
    the leaderboard's MAE pairs, global pairs, in-sample pairs)."""
    settings = settings_for(checkpoint, data, output, seasonality=SEASON, **overrides)
    plan = run_parts_in_process(settings)
    sums = RunSums(plan.quantiles, plan.spec.horizon, plan.model_names)
    by_index = {part.index: part for part in plan.parts()}

    def read(index: int) -> PartSums | None:
        part = by_index[index]
        args = (plan.settings.output, index, plan.run_fingerprint, part.n_windows, plan.spec.horizon)
        return read_done_part(*args, plan.model_fingerprints)

    scores, unverified = sums.merge_parts(list(by_index), read)
    assert not unverified
    run_wide = sums.write_metrics(plan.settings.output, scores)
    assert ("in_sample" in run_wide.column("scope").to_pylist()) == (sums.in_sample is not None)
    assert_same_table(sums.run_wide(scores), run_wide)  # built without the series block, before the file
    board = write_leaderboard(plan.settings.output, scores, plan.step_us).to_pylist()
    (mae,) = [r for r in board if r["kind"] == "metric" and r["model"] == "trained" and r["metric"] == "mae"]
    return sums.in_sample_windows, mae["n"], _pairs(output, "global"), _pairs(output, "in_sample")


def test_in_sample_split_in_process(tmp_path: Path) -> None:
    end = datetime.fromtimestamp((START_US + END_STEP * STEP_US) / 1e6, tz=UTC)
    checkpoint = write_checkpoint(
        tmp_path / "trained.onnx",
        tiny_chronos2_model().SerializeToString(),
        tiny_chronos2_metadata(training_data_end=end),
    ).weights_path
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    plan = prepare(settings_for(checkpoint, data, tmp_path / "x"))
    origins = np.concatenate(
        [series.timestamp_us(plan_series(series, plan.spec).origins) for series in plan.table.series]
    )
    expected = int((origins <= START_US + END_STEP * STEP_US).sum())
    counted, board_n, global_n, in_n = _in_process(checkpoint, data, tmp_path / "default")
    assert counted == expected > 0
    assert board_n == global_n > 0 and in_n > 0
    counted, board_n, global_all, in_again = _in_process(checkpoint, data, tmp_path / "all", include_in_sample=True)
    assert counted == expected
    assert board_n == global_all == global_n + in_n and in_again == in_n
