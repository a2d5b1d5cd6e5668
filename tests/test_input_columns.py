"""Issue 46: another tool's column names (``--id-col``, ``--time-col``, ``--target-col``) and the errors around them.

A statsforecast-style table (``unique_id, ds, y``) backtested with the three flags gives the forecasts and metrics
of the same table under the project's names; a table that looks like Nixtla's or fev's without the flags is
refused naming the flags to pass; the Python API names the caller's table, never the file it wrote.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backtest_data import write_dataset

import distributed_onnx
from distributed_onnx import cli
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.resources import REFERENCE_DATASET

SMALL_FLAGS = ["--horizon", "24", "--n-windows", "3", "--stride", "48", "--quantiles", "0.1,0.5,0.9"]
POOL_FLAGS = ["--actors", "1", "--rows-per-batch", "4", "--no-progress"]
NIXTLA = {"series_id": "unique_id", "timestamp": "ds"}


def _renamed(table: pa.Table, names: dict[str, str]) -> pa.Table:
    return table.rename_columns([names.get(name, name) for name in table.column_names])


def _forecasts(output: Path) -> pa.Table:
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("model", pa.string())]), flavor="hive")
    table = ds.dataset(output / "forecasts", format="parquet", partitioning=partitioning).to_table()
    return table.sort_by([(name, "ascending") for name in ("model", "series_id", "origin", "lead")])


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- integration: the same numbers under other names ----------------------------------------------------------


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_statsforecast_table_with_the_three_flags_equals_the_renamed_table(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    table = pq.read_table(REFERENCE_DATASET)
    pq.write_table(_renamed(table, {**NIXTLA, "y": "y"}), tmp_path / "nixtla.parquet")
    own = ["backtest", "--output", str(tmp_path / "own"), *SMALL_FLAGS, *POOL_FLAGS]
    assert cli.main(own) == 0
    flags = ["--id-col", "unique_id", "--time-col", "ds", "--target-col", "y"]
    nixtla = ["backtest", "--data", str(tmp_path / "nixtla.parquet"), "--output", str(tmp_path / "nixtla")]
    assert cli.main([*nixtla, *flags, *SMALL_FLAGS, *POOL_FLAGS]) == 0

    forecasts = _forecasts(tmp_path / "nixtla")
    assert forecasts.equals(_forecasts(tmp_path / "own"))  # the project's own column names out
    assert forecasts.column_names[0] == "series_id" and "timestamp" in forecasts.column_names
    metrics = pq.read_table(tmp_path / "nixtla" / "metrics.parquet")
    assert metrics.equals(pq.read_table(tmp_path / "own" / "metrics.parquet"))


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_the_api_maps_fevs_names_and_names_the_callers_table_in_errors(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    small = {"horizon": 24, "n_windows": 2, "stride": 48, "quantiles": [0.1, 0.5, 0.9], "progress": False}
    table = pq.read_table(REFERENCE_DATASET)
    fev = _renamed(table, {"series_id": "id", "y": "target"})
    mapped = distributed_onnx.backtest(fev, id_col="id", target_col="target", actors=1, **small)
    own = distributed_onnx.backtest(table, actors=1, **small)
    assert mapped.forecasts.equals(own.forecasts) and mapped.metrics.equals(own.metrics)

    with pytest.raises(DataError) as refused:
        distributed_onnx.backtest(fev.to_pandas(), output=tmp_path / "api", **small)
    message = str(refused.value)
    assert message.startswith("the pandas DataFrame passed as data: missing column(s)"), message
    assert "id_col='id', target_col='target'" in message and "table-" not in message, message


# --- the settings and the refusals (planning; after the integration tests: a refused run reuses their Ray) ----


def test_the_column_names_come_from_yaml_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("id_col: unique_id\ntime_col: ds\n")
    monkeypatch.setenv("DISTRIBUTED_ONNX_TARGET_COL", "target")
    settings = BacktestSettings.from_sources({"output": tmp_path / "run"}, config, environment=True)
    assert (settings.id_col, settings.time_col, settings.target_col) == ("unique_id", "ds", "target")


@pytest.mark.parametrize(
    ("names", "flags"),
    [
        (NIXTLA, "--id-col unique_id --time-col ds"),
        ({"series_id": "id", "y": "target"}, "--id-col id --target-col target"),  # fev's
    ],
)
def test_another_tools_table_without_the_flags_is_refused_naming_them(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    capsys: pytest.CaptureFixture[str],
    names: dict[str, str],
    flags: str,
) -> None:
    data = tmp_path / "data.parquet"
    pq.write_table(_renamed(pq.read_table(write_dataset(tmp_path / "own.parquet", covariate=False)), names), data)
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data)]
    line = _refused([*argv, "--output", str(tmp_path / "run"), "--n-windows", "2", "--no-progress"], capsys)
    assert "data.parquet: missing column(s)" in line and f"pass {flags}" in line, line
    assert not (tmp_path / "run").exists()


def test_score_of_actuals_in_another_tools_names_suggests_its_own_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``score --actuals nixtla.csv``: the hint said ``pass id_col='unique_id', time_col='ds'`` (Python's words: the
    actuals' error was copied into a new one as text, losing its suggestion); it names score's own flags now."""
    import pyarrow.csv as pa_csv

    log, actuals = score_inputs(tmp_path)
    nixtla = tmp_path / "nixtla.csv"
    pa_csv.write_csv(_renamed(pq.read_table(actuals), NIXTLA), nixtla)
    argv = ["score", "--forecasts", str(log), "--actuals", str(nixtla), "--output", str(tmp_path / "out")]
    line = _refused(argv, capsys)
    assert "nixtla.csv: missing column(s)" in line and "pass --id-col unique_id --time-col ds." in line, line


def test_a_flag_naming_no_column_is_refused_naming_the_flag(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), "--id-col", "uid"]
    line = _refused([*argv, "--output", str(tmp_path / "run"), "--n-windows", "2", "--no-progress"], capsys)
    assert "data.parquet: --id-col uid: no such column" in line, line


def test_the_input_file_reader_maps_the_columns_as_the_driver_did(tmp_path: Path) -> None:
    """``series_transport=input_file``: each actor rereads the file, so it renames as the driver's read did."""
    from distributed_onnx.evaluation.data.columns import ColumnNames
    from distributed_onnx.evaluation.data.series_source import ParquetSeriesReader
    from distributed_onnx.evaluation.data.table import load_series

    own = write_dataset(tmp_path / "own.parquet", covariate=False)
    pq.write_table(_renamed(pq.read_table(own), {**NIXTLA, "y": "target"}), tmp_path / "nixtla.parquet")
    names = ColumnNames("unique_id", "ds", "target")
    table = load_series(Location(tmp_path / "nixtla.parquet"), 30, names=names)
    assert table.series_ids == load_series(Location(own), 30).series_ids
    lengths = tuple(one.n_points for one in table.series)
    reader = ParquetSeriesReader(Location(tmp_path / "nixtla.parquet"), table.series_ids, lengths, 30, (), names=names)
    for index, expected in enumerate(table.series):
        found = reader.series(index)
        assert found.series_id == expected.series_id and found.n_points == expected.n_points
        assert found.values.tobytes() == expected.values.tobytes()


# --- issue 51 (4): the mapping is one-to-one, and a table's columns have distinct names ------------------------


def score_inputs(directory: Path) -> tuple[Path, Path]:
    """A forecast log of one placeable window and actuals under the project's own names."""
    import numpy as np

    from distributed_onnx.live.log.layout import LoggedForecast
    from distributed_onnx.live.log.writer import ForecastLog

    step_us, start_us = 30 * 60_000_000, 1_796_083_200_000_000
    actuals = directory / "actuals.parquet"
    timestamps = pa.array([start_us + i * step_us for i in range(100)], pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({"series_id": ["a"] * 100, "timestamp": timestamps, "y": np.arange(100.0)}), actuals)
    log = ForecastLog(directory / "log", flush_interval_s=60.0)
    log.submit(
        LoggedForecast(
            model="m",
            checkpoint_sha256="0" * 64,
            role="served",
            request_id="r",
            request_time_us=start_us,
            resolution_minutes=30,
            series_ids=["a"],
            origins_us=[start_us + 60 * step_us],
            quantiles=(0.5,),
            forecasts=np.ones((1, 3, 1), dtype=np.float32),
        )
    )
    log.close()
    return directory / "log", actuals


@pytest.mark.parametrize("command", ["backtest", "score"])
@pytest.mark.parametrize(
    ("flags", "column", "roles"),
    [
        (["--id-col", "y"], "y", "--id-col y and --target-col y"),
        (["--id-col", "timestamp"], "timestamp", "--id-col timestamp and --time-col timestamp"),
        (["--time-col", "y"], "y", "--time-col y and --target-col y"),
    ],
)
def test_a_column_given_two_roles_is_refused_not_dropped(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    capsys: pytest.CaptureFixture[str],
    command: str,
    flags: list[str],
    column: str,
    roles: str,
) -> None:
    """``--id-col y`` on a table with the project's names: the renaming kept ``y`` as the target and dropped the
    flag, while summary.json recorded it. Each role takes one column and each column one role: refused."""
    output = tmp_path / "out"
    if command == "backtest":
        data = write_dataset(tmp_path / "data.parquet", covariate=False)
        argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data)]
        argv += ["--n-windows", "2", "--no-progress"]
    else:
        log, actuals = score_inputs(tmp_path)
        argv = ["score", "--forecasts", str(log), "--actuals", str(actuals)]
    line = _refused([*argv, "--output", str(output), *flags], capsys)
    assert f"the column {column!r} is given two roles: {roles}" in line, line
    assert not output.exists()


@pytest.mark.parametrize(
    ("flags", "role"),
    [
        (["--covariates", "y"], "--target-col y"),  # the target as a known-future covariate: a leak
        (["--past-covariates", "timestamp"], "--time-col timestamp"),
        (["--id-col", "unique_id", "--covariates", "series_id"], "the series_id column"),  # the renamed ids
    ],
)
def test_a_required_column_named_as_a_covariate_is_refused(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    role: str,
) -> None:
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), *flags]
    line = _refused([*argv, "--output", str(tmp_path / "out"), "--no-progress"], capsys)
    assert f"covariate {flags[-1]!r} is also {role}: a required column cannot be a covariate" in line, line


def test_swapped_roles_are_one_to_one_and_accepted() -> None:
    settings = BacktestSettings(output="out", id_col="y", target_col="series_id")
    assert settings.column_names.renames() == {"y": "series_id", "series_id": "y"}


@pytest.mark.parametrize("command", ["backtest", "score"])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_table_whose_columns_repeat_a_name_is_refused_naming_it(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    capsys: pytest.CaptureFixture[str],
    command: str,
    suffix: str,
) -> None:
    """A required column twice (Parquet with two ``y``; CSV header ``series_id,timestamp,y,y``) was an internal
    error (KeyError, exit 4): one line naming the column, exit 2, for backtest's data and score's actuals."""
    import pyarrow.csv as pa_csv

    if command == "backtest":
        table = pq.read_table(write_dataset(tmp_path / "own.parquet", covariate=False))
    else:
        log, actuals = score_inputs(tmp_path)
        table = pq.read_table(actuals)
    doubled = pa.Table.from_arrays([*table.columns, table["y"]], names=[*table.column_names, "y"])
    path = tmp_path / f"doubled{suffix}"
    if suffix == ".csv":
        pa_csv.write_csv(doubled, path)
        assert path.read_text().splitlines()[0] == '"series_id","timestamp","y","y"'
    else:
        pq.write_table(doubled, path)
    if command == "backtest":
        argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(path)]
        argv += ["--n-windows", "2", "--no-progress"]
    else:
        argv = ["score", "--forecasts", str(log), "--actuals", str(path)]
    line = _refused([*argv, "--output", str(tmp_path / "out")], capsys)
    assert f"{path.name}: the table has column(s) of the same name ('y' 2 times)" in line, line


def test_the_streamed_scan_of_a_large_parquet_refuses_a_repeated_name_before_reading_it(tmp_path: Path) -> None:
    from distributed_onnx.evaluation.data.windows import WindowSpec
    from distributed_onnx.evaluation.dataset._scan import scan_sorted_parquet

    table = pq.read_table(write_dataset(tmp_path / "own.parquet", covariate=False)).sort_by("series_id")
    path = tmp_path / "doubled.parquet"
    pq.write_table(pa.Table.from_arrays([*table.columns, table["y"]], names=[*table.column_names, "y"]), path)
    spec = WindowSpec(context_length=8, horizon=3, n_windows=2, stride=2)
    with pytest.raises(DataError, match=r"doubled.parquet: the table has column\(s\) of the same name \('y' 2 times\)"):
        scan_sorted_parquet(Location(path), 30, [], spec, chunk_rows=4)
