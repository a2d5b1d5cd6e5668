"""Bad input tables exit 2 with one line naming the rows, before any actor or session starts (no Ray started).

The cases that used to escape as a TypeError, an uncaught ArrowInvalid or a multi-gigabyte allocation.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx import cli
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

STEP_US = 30 * 60 * 1_000_000
T0_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
N = 64


def _write(path: Path, series_id: list[str | None], stamps: pa.Array) -> Path:
    pq.write_table(pa.table({"series_id": pa.array(series_id, pa.string()), "timestamp": stamps, "y": [1.0] * N}), path)
    return path


def _grid_us() -> np.ndarray:
    return T0_US + np.arange(N, dtype=np.int64) * STEP_US


def null_series_id(path: Path) -> Path:
    ids: list[str | None] = ["a"] * N
    ids[5] = None
    return _write(path, ids, pa.array(_grid_us(), pa.timestamp("us", tz="UTC")))


def nanosecond_timestamp(path: Path) -> Path:
    stamps = _grid_us() * 1_000
    stamps[7] += 250
    return _write(path, ["a"] * N, pa.array(stamps, pa.timestamp("ns", tz="UTC")))


def stray_timestamp(path: Path) -> Path:
    stamps = _grid_us()
    stamps[0] = 0  # 1970-01-01: an epoch-zero parse
    return _write(path, ["a"] * N, pa.array(stamps, pa.timestamp("us", tz="UTC")))


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (null_series_id, "empty series_id at rows [5]"),
        (nanosecond_timestamp, "sub-microsecond parts at rows [7]"),
        (stray_timestamp, "between rows 0 (1970-01-01T00:00:00.000000Z) and 1"),
    ],
    ids=["null-series-id", "nanoseconds", "stray-timestamp"],
)
def test_bad_table_exits_2_with_one_line_naming_rows(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, make: object, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make(tmp_path / "bad.parquet")  # type: ignore[operator]
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data)]

    code = cli.main([*argv, "--output", str(tmp_path / "run")])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert needle in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
