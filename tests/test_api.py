"""The Python API: ``distributed_onnx.backtest(data, ...)`` gives the command's numbers, errors and resume.

Integration tier (real local Ray, real ORT sessions) except the import checks. The comparison runs the bundled
checkpoint on the bundled Taylor data, once through ``distributed-onnx backtest`` and once through the API
handed a pandas DataFrame of the same rows.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import distributed_onnx
from distributed_onnx import cli
from distributed_onnx.api import INPUTS_DIR
from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.resources import REFERENCE_DATASET

REPO = Path(__file__).resolve().parent.parent
SMALL = {"horizon": 48, "n_windows": 6, "stride": 48, "quantiles": [0.1, 0.5, 0.9]}
SMALL_FLAGS = ["--horizon", "48", "--n-windows", "6", "--stride", "48", "--quantiles", "0.1,0.5,0.9"]
POOL = {"actors": 2, "rows_per_batch": 2, "progress": False}
POOL_FLAGS = ["--actors", "2", "--rows-per-batch", "2", "--no-progress"]


def _cli_forecasts(output: Path) -> pa.Table:
    """The forecasts folder read as the dataset it is (Hive partitions: ``model`` a column)."""
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("model", pa.string())]), flavor="hive")
    table = ds.dataset(output / "forecasts", format="parquet", partitioning=partitioning).to_table()
    return table.sort_by(
        [("model", "ascending"), ("series_id", "ascending"), ("origin", "ascending"), ("lead", "ascending")]
    )


# --- unit: what importing the package costs and binds --------------------------------------------------------


def test_importing_the_package_loads_neither_pandas_nor_ray() -> None:
    code = "import sys, distributed_onnx; print(sorted({'pandas', 'ray', 'onnxruntime'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_name_backtest_stays_the_function_after_the_evaluation_package_is_used() -> None:
    import distributed_onnx.evaluation.driver.run
    import distributed_onnx.evaluation.report.page

    assert callable(distributed_onnx.backtest)
    assert distributed_onnx.backtest is distributed_onnx.api.backtest


def test_no_subpackage_shares_the_api_functions_name() -> None:
    """``import distributed_onnx.backtest.x`` once resolved ``backtest`` on the API function: the name is free now."""
    assert not (REPO / "distributed_onnx" / "backtest").exists()
    assert not (REPO / "distributed_onnx" / "backtest.py").exists()


def test_data_of_another_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"data must be a path or URL, a pyarrow.Table.*got builtins.list"):
        distributed_onnx.backtest([1, 2, 3])


# --- integration ---------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_dataframe_gives_the_commands_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    frame = pq.read_table(REFERENCE_DATASET).to_pandas()
    assert cli.main(["backtest", "--output", str(tmp_path / "cli"), *SMALL_FLAGS, *POOL_FLAGS]) == 0
    # The command's folder rerun with other settings: refused naming each setting that differs, with both values
    # (it said only "other settings (fingerprint A, this run B)"; a changed checkpoint was named field by field).
    other = ["--horizon", "24", "--n-windows", "6", "--stride", "48", "--quantiles", "0.2,0.5,0.8"]
    other += ["--actors", "2", "--rows-per-batch", "7", "--no-progress"]
    capsys.readouterr()
    assert cli.main(["backtest", "--output", str(tmp_path / "cli"), *other]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    for named in (
        "horizon 48 (recorded) against 24 (this run)",
        "quantiles [0.1, 0.5, 0.9] (recorded) against [0.2, 0.5, 0.8] (this run)",
        "rows_per_batch 2 (recorded) against 7 (this run)",
    ):
        assert named in line, line

    result = distributed_onnx.backtest(frame, **SMALL, **POOL)

    assert result.output is None  # a temporary run directory, gone
    assert result.forecasts.equals(_cli_forecasts(tmp_path / "cli"))
    assert result.metrics.equals(pq.read_table(tmp_path / "cli" / "metrics.parquet"))
    assert result.summary["windows"]["run_now"] == 6
    assert result.forecasts.column_names[:7] == ["series_id", "window_id", "origin", "cutoff", "timestamp", "lead", "y"]


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_an_arrow_table_with_an_output_directory_keeps_its_input_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    table = pq.read_table(REFERENCE_DATASET)
    output = tmp_path / "run"

    first = distributed_onnx.backtest(table, output=output, **SMALL, **POOL)
    again = distributed_onnx.backtest(table, output=str(output), **SMALL, **POOL)

    assert first.output == output and "Backtest of" in (output / "report.html").read_text()
    inputs = sorted((output / INPUTS_DIR).glob("table-*.parquet"))
    assert len(inputs) == 1 and pq.read_table(inputs[0]).equals(table)
    assert first.summary["data"] == str(inputs[0])
    assert again.summary["windows"]["done_before"] == 6  # the same bytes, the same fingerprint: resumed
    assert again.forecasts.equals(first.forecasts)
    assert again.metrics.equals(first.metrics)


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_errors_are_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    table = pq.read_table(REFERENCE_DATASET)

    with pytest.raises(ConfigError, match=r"colour: Extra inputs are not permitted \[from backtest\(\) arguments\]"):
        distributed_onnx.backtest(table, colour="red")
    with pytest.raises(ConfigError, match="start is given without end"):
        distributed_onnx.backtest(table, start="2000-08-01")

    duplicated = pa.concat_tables([table, table.slice(10, 1)])
    with pytest.raises(DataError, match=r"duplicate \(series_id, timestamp\) at rows") as from_api:
        distributed_onnx.backtest(duplicated, output=tmp_path / "api", **SMALL)
    pq.write_table(duplicated, tmp_path / "duplicated.parquet")
    code = cli.main(["backtest", "--data", str(tmp_path / "duplicated.parquet"), "--output", str(tmp_path / "c")])
    assert code == 2
    # The same rows are named; only the file differs (the API's is the table it wrote under inputs/).
    rows = re.search(r"at rows [^)]*", str(from_api.value))
    assert rows is not None and rows.group(0) in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_the_other_settings_pass_through(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    table = pq.read_table(REFERENCE_DATASET)
    last = pc.max(table.column("timestamp")).as_py()
    start = last.replace(hour=0, minute=0) - timedelta(days=3)

    result = distributed_onnx.backtest(
        table, horizon=48, start=start.isoformat(), end=(start + timedelta(hours=2)).isoformat(), stride=2, **POOL
    )

    origins = sorted(set(result.forecasts.column("origin").to_pylist()))
    assert len(origins) == 3  # 00:00, 01:00, 02:00 on a 30-minute grid with stride 2
    assert result.summary["settings"]["start"].startswith(start.date().isoformat())


def test_the_apis_inputs_folder_is_the_one_a_run_folder_check_exempts() -> None:
    from distributed_onnx.evaluation import outputs

    assert INPUTS_DIR == outputs.INPUTS_DIR
