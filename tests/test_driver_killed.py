"""The driver killed mid-run (a real SIGKILL of the ``distributed-onnx backtest`` process), then the same command.

Integration tier: the command runs in a subprocess with its own embedded Ray; it is killed once some parts are
written and others are not, and the same command line is run again. Every window must then be in the forecasts
exactly once, and the metrics must equal those of an undisturbed run of the same settings (bit for bit: sums are
merged in part order).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backtest_data import START_US, STEP_US, planned_window_ids, read_forecasts, settings_for
from listening import process_tree

from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

ray = pytest.importorskip("ray")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

pytestmark = pytest.mark.integration

N_SERIES = 12
N_POINTS = 200
N_WINDOWS = 30  # per series: 360 windows in parts of 2, so the run is still going when it is killed
PARTS_BEFORE_KILL = 8
TIMEOUT_S = 600.0


def _write_data(path: Path) -> Path:
    rng = np.random.default_rng(7)
    ids = np.repeat([f"s{i:02d}" for i in range(N_SERIES)], N_POINTS)
    stamps = np.tile(START_US + np.arange(N_POINTS, dtype=np.int64) * STEP_US, N_SERIES)
    steps = np.tile(np.arange(N_POINTS), N_SERIES)
    y = 100.0 + 10.0 * np.sin(steps * 2 * np.pi / 48) + rng.normal(0, 1, ids.size)
    table = pa.table({"series_id": ids, "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")), "y": y})
    pq.write_table(table, path)
    return path


def _command(checkpoint: Path, data: Path, output: Path) -> list[str]:
    return [
        sys.executable, "-m", "distributed_onnx", "backtest",
        "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(output),
        "--n-windows", str(N_WINDOWS), "--stride", "1", "--quantiles", "0.1,0.5,0.9",
        "--actors", "2", "--cpus-per-actor", "1", "--rows-per-batch", "2", "--windows-per-part", "2",
        "--no-progress",
    ]  # fmt: skip


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def _sums_written(output: Path) -> int:
    return len(list((output / outputs.SCORES_DIR).glob("part-*.arrow")))


@pytest.mark.timeout(900)  # three runs, two of them start Ray: minutes on a loaded machine
@pytest.mark.usefixtures("ray_session")
def test_a_driver_killed_mid_run_then_rerun_gives_every_window_once(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint
) -> None:
    data = _write_data(tmp_path / "load.parquet")
    undisturbed = settings_for(
        tiny_checkpoint.weights_path, data, tmp_path / "undisturbed", n_windows=N_WINDOWS, stride=1,
        rows_per_batch=2, windows_per_part=2,
    )  # fmt: skip
    expected = run_backtest(undisturbed)
    n_parts = expected.summary["parts"]["planned"]
    assert n_parts == N_SERIES * N_WINDOWS // 2

    output = tmp_path / "killed"
    command = _command(tiny_checkpoint.weights_path, data, output)
    driver = subprocess.Popen(command, env=_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while _sums_written(output) < PARTS_BEFORE_KILL and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(driver.pid)  # the embedded Ray it started: to clean up after, not to kill now
        assert driver.poll() is None, f"the run ended before it could be killed: {driver.stderr.read()!r}"  # type: ignore[union-attr]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        written = _sums_written(output)
        assert PARTS_BEFORE_KILL <= written < n_parts, written
        assert not (output / "metrics.parquet").exists()

        rerun = subprocess.run(
            command, check=False, env=_environment(), capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
    finally:
        for pid in tree - {driver.pid}:  # whatever of the killed driver's Ray outlived it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    forecasts = read_forecasts(output)
    horizon = forecasts.num_rows // len(planned_window_ids(undisturbed))
    assert Counter(forecasts["window_id"].to_pylist()) == dict.fromkeys(planned_window_ids(undisturbed), horizon)
    assert pq.read_table(output / "metrics.parquet").equals(expected.read_metrics())
    assert forecasts.equals(read_forecasts(Path(undisturbed.output)))
