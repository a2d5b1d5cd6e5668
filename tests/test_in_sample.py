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

from distributed_onnx.evaluation.data.windows import plan_series
from distributed_onnx.evaluation.plan import prepare
from distributed_onnx.evaluation.run import run_backtest
from distributed_onnx.model.checkpoint import write_checkpoint
from tests.backtest_data import START_US, STEP_US, settings_for, write_dataset
from tests.graphs import tiny_chronos2_metadata, tiny_chronos2_model

pytestmark = pytest.mark.integration

END_STEP = 41  # series "a" has one origin at or before it, "b" four


def _pairs(output: Path, scope: str) -> int:
    metrics = pq.read_table(output / "metrics.parquet")
    rows = metrics.filter(
        pc.and_(
            pc.and_(pc.equal(metrics["model"], "trained"), pc.equal(metrics["scope"], scope)),
            pc.equal(metrics["metric"], "mae"),
        )
    ).to_pylist()
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
    settings = settings_for(checkpoint.weights_path, data, tmp_path / "run")
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

    included = settings_for(checkpoint.weights_path, data, tmp_path / "included", include_in_sample=True)
    run_backtest(included)
    output = Path(included.output)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["in_sample"]["windows"] == expected and summary["in_sample"]["in_leaderboard"] is True
    board = pq.read_table(output / "leaderboard.parquet").to_pylist()
    (mae,) = [r for r in board if r["kind"] == "metric" and r["model"] == "trained" and r["metric"] == "mae"]
    assert mae["n"] == _pairs(output, "global") == out_of_sample + in_sample
    assert _pairs(output, "in_sample") == in_sample  # still scored apart too
