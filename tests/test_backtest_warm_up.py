"""A backtest's actors warm up on one row: the first batch pays ORT's lazy set-up anyway, and a warm-up of the
worker's default 8 rows made each actor of a Chronos-2-sized graph spend seconds before its first part."""

from __future__ import annotations

from pathlib import Path

from distributed_onnx.evaluation.driver.early import BACKTEST_WARM_UP_ROWS, worker_configs
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.worker import WorkerConfig


def test_backtest_actors_warm_up_on_one_row_where_the_worker_default_is_larger(tmp_path: Path) -> None:
    settings = BacktestSettings(output=str(tmp_path / "run"))
    configs = worker_configs(settings, [tmp_path / "a.onnx", tmp_path / "b.onnx"])
    assert [config.warm_up_rows for config in configs] == [1, 1] == [BACKTEST_WARM_UP_ROWS] * 2
    assert WorkerConfig(checkpoint=tmp_path / "a.onnx").warm_up_rows > BACKTEST_WARM_UP_ROWS
