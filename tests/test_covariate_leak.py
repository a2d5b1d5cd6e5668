"""``--compare-realized`` on a panel whose covariate the model reads: the leak of perfect foresight, measured.

The tiny Chronos-2 graph (tests/graphs.py) adds the mean of each window's future covariate to its forecast, so
what the covariate says reaches every forecast. The vintages of each timestamp are issued every step before it
with an error that grows with how early they were issued (so with the lead), and the exact value is issued one
step after it (the measurement). The run as of each cutoff and its ``@realized`` twin are both in the
leaderboard, the realized one better, and the gap and its Diebold-Mariano p-value are in summary.json and the
report. Real local Ray, real ONNX Runtime.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.evaluation.backtest import run_backtest
from tests.backtest_data import START_US, STEP_US, settings_for
from tests.graphs import write_tiny_chronos2

pytestmark = pytest.mark.integration

SERIES, LENGTH, EARLIEST = 6, 120, 12  # vintages issued up to 12 steps ahead


def write_panel(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    data: dict[str, list[object]] = defaultdict(list)
    vintages: dict[str, list[object]] = defaultdict(list)
    steps = np.arange(-20, LENGTH + 20)
    wind = 2.0 * np.sin(2 * np.pi * steps / 40)  # the realized covariate, one region for every series
    for s in range(SERIES):
        for step in range(LENGTH):
            data["series_id"].append(f"s{s}")
            data["timestamp"].append(START_US + step * STEP_US)
            data["y"].append(100.0 + s + rng.normal(0, 1.0))
    for index, step in enumerate(steps):
        stamp = START_US + int(step) * STEP_US
        for ahead in range(-1, EARLIEST + 1):  # -1: issued one step after its time, exact
            if ahead == 0:
                continue
            vintages["timestamp"].append(stamp)
            vintages["available_at"].append(stamp - ahead * STEP_US)
            error = 0.0 if ahead < 0 else rng.normal(0, 1.5 * ahead)
            vintages["wind"].append(float(wind[index] + error))
    utc = pa.timestamp("us", tz="UTC")
    panel = pa.table(
        {
            "series_id": pa.array(data["series_id"], pa.string()),
            "timestamp": pa.array(data["timestamp"], utc),
            "y": pa.array(data["y"], pa.float64()),
        }
    )
    table = pa.table(
        {
            "timestamp": pa.array(vintages["timestamp"], utc),
            "available_at": pa.array(vintages["available_at"], utc),
            "wind": pa.array(vintages["wind"], pa.float64()),
        }
    )
    pq.write_table(panel, directory / "panel.parquet")
    pq.write_table(table, directory / "vintages.parquet")
    return directory / "panel.parquet", directory / "vintages.parquet"


@pytest.mark.usefixtures("ray_session")
def test_compare_realized_measures_the_leak(tmp_path: Path) -> None:
    checkpoint = write_tiny_chronos2(tmp_path / "ckpt")
    panel, vintages = write_panel(tmp_path)
    settings = settings_for(
        checkpoint.weights_path,
        panel,
        tmp_path / "run",
        n_windows=30,
        stride=3,
        rows_per_batch=16,
        covariates=["wind"],
        covariate_data=vintages,
        compare_realized=True,
    )
    result = run_backtest(settings)
    output = Path(settings.output)
    board = pq.read_table(output / "leaderboard.parquet").to_pylist()
    mae = {row["model"]: row["value"] for row in board if row["kind"] == "metric" and row["metric"] == "mae"}
    assert {"tiny", "tiny@realized"} <= set(mae)
    assert mae["tiny@realized"] < mae["tiny"]
    dm = [row for row in board if row["kind"] == "dm" and row["model"] == "tiny" and row["versus"] == "tiny@realized"]
    assert len(dm) == 1 and dm[0]["p_value"] < 0.05

    summary = json.loads((output / "summary.json").read_text())
    assert result.summary["covariates"]["columns"]["wind"]["source"] == "vintaged"
    (gap,) = summary["covariates"]["realized_comparison"]
    assert gap["model"] == "tiny" and gap["gap"] > 0 and gap["dm_p_value"] == pytest.approx(dm[0]["p_value"])
    assert summary["models"]["tiny@realized"]["realized_of"] == "tiny"
    # Issued every step before its time: at lead h the model saw the vintage issued at the cutoff (age 0).
    ages = pq.read_table(output / "covariate_ages.parquet").to_pylist()
    assert [row["age_median_steps"] for row in ages] == [0] * 8
    assert all(row["missing"] == 0 for row in ages)

    report = (output / "report.html").read_text()
    assert "The leak" in report and "tiny@realized" in report
    assert f"{gap['dm_p_value']:.3g}" in report
    assert (output / "forecasts" / "model=tiny@realized").is_dir()
