"""Issue 29, defect 11: a checkpoint removed from a run leaves the ``forecasts/`` dataset, kept aside.

Integration tier: two real backtests on the shared local Ray (two tiny checkpoints, then one) in one directory.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest
from backtest_data import settings_for, write_dataset
from graphs import write_tiny_chronos2

from distributed_onnx.evaluation.backtest import run_backtest

pytestmark = pytest.mark.integration


def test_a_checkpoint_removed_from_the_run_leaves_the_forecasts_dataset(tmp_path: Path, ray_session: None) -> None:
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    kept = write_tiny_chronos2(tmp_path / "models", name="kept").weights_path
    old = write_tiny_chronos2(tmp_path / "models", name="old").weights_path
    output = tmp_path / "run"
    both = settings_for(kept, data, output, n_windows=2, actors=1)
    run_backtest(both.model_copy(update={"checkpoint": [kept, old]}))
    assert sorted(path.name for path in (output / "forecasts").iterdir()) == ["model=kept", "model=old"]
    run_backtest(both.model_copy(update={"checkpoint": [kept]}))
    assert [path.name for path in (output / "forecasts").iterdir()] == ["model=kept"]
    models = ds.dataset(output / "forecasts", partitioning="hive").to_table(columns=["model"])["model"].unique()
    assert models.to_pylist() == ["kept"]  # the dataset the README promises: this run's models
    assert list((output / "removed" / "model=old").glob("part-*.parquet"))  # kept aside, not deleted
