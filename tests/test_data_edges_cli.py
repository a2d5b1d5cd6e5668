"""Issue 40's data edges: each a silent wrong number (or a crash) that is now one ``error:`` line, exit 2.

Every case is refused while planning, before Ray starts or anything is written: off-grid vintages (defect 2), a
latency beyond int64's arithmetic (3), vintage ids matching no series (4), NaN group keys (6), quantile levels
outside the graph's range (9), an empty vintage table (14) and values beyond float32 (17).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx import cli
from distributed_onnx.evaluation.dataset._vintages import index_vintages
from distributed_onnx.evaluation.planning import prepare
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from tests.backtest_data import SERIES_LENGTHS, START_US, STEP_US, dense_series, long_table, settings_for, write_dataset

UTC = pa.timestamp("us", tz="UTC")
MINUTE_US = 60_000_000


def _vintages(path: Path, ids: list[object] | None = None, shift_us: int = 0, value: float = 1.0) -> Path:
    """Vintages of ``wind`` for every step of the data, issued two steps ahead; per series when ``ids``."""
    stamps = START_US + np.arange(-5, 80, dtype=np.int64) * STEP_US + shift_us
    keys = ids if ids is not None else [None]
    columns: dict[str, pa.Array] = {
        "timestamp": pa.array(np.tile(stamps, len(keys)), UTC),
        "available_at": pa.array(np.tile(stamps - 2 * STEP_US, len(keys)), UTC),
        "wind": pa.array(np.full(stamps.size * len(keys), value)),
    }
    if ids is not None:
        columns["series_id"] = pa.array(np.repeat(np.asarray(ids, dtype=object), stamps.size).tolist())
    pq.write_table(pa.table(columns), path)
    return path


def _backtest(tmp_path: Path, checkpoint: ResolvedCheckpoint, data: Path, *extra: str) -> list[str]:
    return [
        "backtest",
        "--checkpoint",
        str(checkpoint.weights_path),
        "--data",
        str(data),
        "--output",
        str(tmp_path / "run"),
        "--n-windows",
        "2",
        "--no-progress",
        *extra,
    ]


def _refused(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; assert exit 2 with one ``error:`` line and nothing written; return the line."""
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    line = [one for one in err.splitlines() if one.startswith("error: ")]
    assert code == 2, err
    assert len(line) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
    return line[0]


def test_vintages_off_the_datas_grid_are_refused_naming_rows(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 2: 15 minutes off the data's 30-minute grid, but on a grid of their own."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    vintages = _vintages(tmp_path / "v.parquet", shift_us=15 * MINUTE_US)
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(vintages))
    line = _refused(tmp_path, argv, capsys)
    assert "v.parquet" in line and "off the data's 30-minute grid at rows [0, 1, 2, 3, 4]" in line
    per_series = _vintages(tmp_path / "vs.parquet", ids=["a", "b"], shift_us=15 * MINUTE_US)
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(per_series))
    assert "off the data's 30-minute grid at rows [0, 1, 2, 3, 4]" in _refused(tmp_path, argv, capsys)


def test_a_latency_beyond_100_years_is_refused_where_it_is_parsed(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 3: 153722867280 minutes wrapped around int64 (look-ahead); 10**17 overflowed in the parts."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    vintages = _vintages(tmp_path / "v.parquet")
    for latency in ("153722867280", str(10**17)):
        argv = _backtest(
            tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(vintages),
            "--covariate-latency", latency,
        )  # fmt: skip
        assert "--covariate-latency:" in _refused(tmp_path, argv, capsys)  # the flag as typed (issue 51)


def test_the_as_of_limit_saturates_instead_of_wrapping() -> None:
    """Defect 3, the arithmetic itself: a latency that would wrap ``cutoff - latency`` finds nothing."""
    stamps = np.array([-10 * 365 * 48, 0, 1], dtype=np.int64) * STEP_US  # data from 1960
    table = pa.table({"timestamp": pa.array(stamps, UTC), "available_at": pa.array(stamps, UTC), "wind": [1.0] * 3})
    vintages = index_vintages(table, ["wind"], STEP_US, ["s"])
    cutoff = stamps[:1] + STEP_US
    assert vintages.as_of("wind", np.zeros(1), cutoff, stamps[:1], 1).found.all()  # latency 0: found
    for latency_us in (153722867280 * MINUTE_US, 2**63 - 1, 2**64):
        huge = dataclasses.replace(vintages, latency_us=latency_us)
        joined = huge.as_of("wind", np.zeros(1), cutoff, stamps[:1], 3)
        assert not joined.found.any() and np.isnan(joined.values).all()


def test_vintage_ids_matching_no_series_are_refused_naming_both_sides(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 4: integer ids against the data's text ids (a, b, c): every covariate value would be missing."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    vintages = _vintages(tmp_path / "v.parquet", ids=[1, 2])
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(vintages))
    line = _refused(tmp_path, argv, capsys)
    assert "'1', '2'" in line and "int64" in line and "'a', 'b', 'c'" in line


def test_series_without_vintages_are_named_in_a_warning(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 4, partly: some series match, one (c) has no vintages: planned, with a warning naming it."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    vintages = _vintages(tmp_path / "v.parquet", ids=["a", "b", "zz"])
    settings = settings_for(
        tiny_checkpoint.weights_path, data, tmp_path / "run", covariates=["wind"], covariate_data=vintages
    )
    with caplog.at_level(logging.WARNING):
        prepare(settings)
    assert "1 of 3 series have no vintages ('c')" in caplog.text


def test_an_empty_vintage_table_is_refused(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 14: it exited 4, ``need at least one array to concatenate``."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"timestamp": pa.array([], UTC), "available_at": pa.array([], UTC), "wind": []}), empty)
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(empty))
    assert "empty.parquet: the covariate data has no rows" in _refused(tmp_path, argv, capsys)


def test_values_beyond_float32_are_one_data_error_up_front(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 17, partly: they failed every part (exit 1, "rerun to resume"), in the vintages or the data."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    vintages = _vintages(tmp_path / "v.parquet", value=1e39)
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--covariates", "wind", "--covariate-data", str(vintages))
    assert "column 'wind' has values beyond float32's range at rows [0, 1, 2, 3, 4]" in _refused(tmp_path, argv, capsys)
    table = long_table(dense_series())
    temp = table["temp"].to_numpy(zero_copy_only=False).copy()
    temp[3] = -4e38
    pq.write_table(table.set_column(3, "temp", pa.array(temp)), tmp_path / "big.parquet")
    argv = _backtest(tmp_path, tiny_checkpoint, tmp_path / "big.parquet", "--covariates", "temp")
    assert "column 'temp' has values beyond float32's range at rows [3]" in _refused(tmp_path, argv, capsys)


def _grouped_data(path: Path, key: list[float]) -> Path:
    """The test data with a per-series float ``region`` (``key`` per series a, b, c)."""
    table = long_table(dense_series(), covariate=False)
    ids = table["series_id"].to_pylist()
    region = [key[list(SERIES_LENGTHS).index(one)] for one in ids]
    pq.write_table(table.append_column("region", pa.array(region, pa.float64())), path)
    return path


def test_a_nan_group_key_is_refused_like_a_null_one(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 6: NaN made one group "nan" of unrelated series."""
    data = _grouped_data(tmp_path / "data.parquet", [1.0, float("nan"), float("nan")])
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--group-by", "region")
    line = _refused(tmp_path, argv, capsys)
    assert "--group-by column 'region' is null or NaN at rows" in line


def test_the_group_by_column_is_not_warned_about_as_ignored(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 6: the run warned that it ignores the very column it groups by."""
    data = _grouped_data(tmp_path / "data.parquet", [1.0, 2.0, 1.0])
    settings = settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", group_by="region")
    with caplog.at_level(logging.WARNING):
        plan = prepare(settings)
    assert plan.grouping is not None
    assert "ignoring column" not in caplog.text


def test_quantiles_outside_the_graphs_range_are_refused_unless_clamping_is_asked_for(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 9: 0.05 on a 0.1..0.9 graph came back as ``q0.05`` holding the 0.1 values."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    argv = _backtest(tmp_path, tiny_checkpoint, data, "--quantiles", "0.05,0.5,0.9")
    line = _refused(tmp_path, argv, capsys)
    assert "0.05 lie outside tiny's native range 0.1..0.9" in line and "--clamp-quantiles" in line
    settings = settings_for(
        tiny_checkpoint.weights_path, data, tmp_path / "run", quantiles=[0.05, 0.5, 0.9], clamp_quantiles=True
    )
    assert [level.requested for level in prepare(settings).clamped] == [0.05]
