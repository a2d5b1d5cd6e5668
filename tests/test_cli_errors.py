"""Every error a user can cause or meet is one line on stderr and an exit code (docs/cli.md's table).

Unit tier for the mapping (:func:`distributed_onnx.cli.describe_error`, with Ray's own exception classes), and
the command itself for the errors that happen before Ray starts: an ``--output`` that names a file, a
``run.json`` that is not a manifest, metadata or a config file that is not UTF-8, an unexpected internal error
(one line naming the log file that holds the traceback). Each of these was a traceback before.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pandas as pd
import pytest
from backtest_data import write_dataset

from distributed_onnx import cli
from distributed_onnx.errors import (
    BatchError,
    ConfigError,
    InferenceError,
    LoopbackError,
    RayLostError,
    StorageError,
    UnsupportedRayError,
    WorkerStartError,
)
from distributed_onnx.evaluation import planning
from distributed_onnx.evaluation.dataset import _load as load_module
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

ray_exceptions = pytest.importorskip("ray.exceptions")


def _backtest(checkpoint: Path, data: Path, output: Path | str, *extra: str) -> list[str]:
    return ["backtest", "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(output), *extra]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "load.parquet")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BatchError("2 part(s) failed"), 1),
        (ConfigError("bad"), 2),
        (StorageError("cannot read"), 3),
        (WorkerStartError("died"), 3),
        (LoopbackError("the raylet listens on 10.0.0.5:6379"), 3),
        (RayLostError("Ray went away under serve: the embedded Ray's raylet (pid 7) exited"), 3),
        (UnsupportedRayError("ray 9.0 lacks ray._private.services"), 3),
        (InferenceError("ONNX Runtime failed: CUDA out of memory"), 3),
        (ray_exceptions.OutOfDiskError("Local disk is full"), 3),
        (ray_exceptions.TaskCancelledError(error_message="cancelled"), 3),
        (ray_exceptions.RaySystemError("the raylet died"), 3),
        (ray_exceptions.ObjectStoreFullError("full"), 3),
        (MemoryError(), 3),
        (OSError(28, "No space left on device"), 3),
        (ValueError("a bug\nwith two lines"), 4),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_each_error_has_its_code_and_one_line(error: BaseException, code: int) -> None:
    found, line = cli.describe_error(error)
    assert found == code
    assert "\n" not in line and line


def test_our_error_inside_a_ray_task_error_keeps_its_code() -> None:
    wrapped = ray_exceptions.RayTaskError("run", "Traceback ...", ConfigError("bad setting"))
    assert cli.describe_error(wrapped) == (2, "bad setting")
    pickled = pickle.loads(pickle.dumps(ray_exceptions.RayTaskError("run", "...", LoopbackError("beyond"))))
    assert cli.describe_error(pickled) == (3, "beyond")


def test_output_naming_a_file_is_one_line(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "results.txt"
    output.write_text("not a directory")
    code = cli.main(_backtest(tiny_checkpoint.weights_path, data, output))
    assert code == 2
    assert f"--output {output} is a file" in _one_line(capsys)
    assert output.read_text() == "not a directory"


@pytest.mark.parametrize(
    ("content", "found"),
    [(b"[1, 2]", "a JSON list"), (b"\xff\xfe not utf-8", "UnicodeDecodeError"), (b"{not json", "JSONDecodeError")],
    ids=["list", "not-utf8", "not-json"],
)
def test_a_run_json_that_is_not_a_manifest_is_one_line(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    found: str,
) -> None:
    output = tmp_path / "run"
    output.mkdir()
    (output / "run.json").write_bytes(content)
    code = cli.main(_backtest(tiny_checkpoint.weights_path, data, output))
    assert code == 2
    line = _one_line(capsys)
    assert f"{output / 'run.json'} is not a backtest manifest" in line and found in line


def test_checkpoint_metadata_that_is_not_utf8_is_one_line(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = tmp_path / "model.onnx"
    weights.write_bytes(tiny_checkpoint.weights_path.read_bytes())
    metadata = tiny_checkpoint.weights_path.with_suffix(".metadata.json").read_text()
    document = json.loads(metadata)
    document.pop("sha256", None)
    (tmp_path / "model.metadata.json").write_bytes(json.dumps(document).encode() + b" \xe9")  # latin-1 at the end
    code = cli.main(_backtest(weights, data, tmp_path / "run"))
    assert code == 2
    assert "is not UTF-8 text" in _one_line(capsys)


@pytest.mark.parametrize(
    ("field", "value"),
    [("context_length", 10**15), ("horizon_patches", 10**12), ("native_quantiles", [i / 2002 for i in range(1, 2002)])],
)
def test_checkpoint_metadata_beyond_its_bounds_is_exit_2_naming_the_field_for_every_command(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: object,
) -> None:
    """``"context_length": 10**15``: ``inspect`` took it (exit 0) and ``backtest`` sized its arrays by it, failing
    as "out of memory (MemoryError)", exit 3, naming nothing. Each size is bounded where the metadata is read."""
    weights = tmp_path / "model.onnx"
    weights.write_bytes(tiny_checkpoint.weights_path.read_bytes())
    document = json.loads(tiny_checkpoint.weights_path.with_suffix(".metadata.json").read_text())
    document.pop("sha256", None)
    document[field] = value
    (tmp_path / "model.metadata.json").write_text(json.dumps(document))
    for argv in (["inspect", str(weights)], _backtest(weights, data, tmp_path / "run")):
        assert cli.main(argv) == 2, argv[0]
        line = _one_line(capsys)
        assert "violates the schema" in line and f"{field}: " in line, line
        assert "less than or equal to" in line or "at most 1000 items" in line, line


def test_a_config_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_bytes(b"n_windows: 3 # caf\xe9\n")
    code = cli.main([*_backtest(tiny_checkpoint.weights_path, data, tmp_path / "run"), "--config", str(config)])
    assert code == 2
    assert f"Config file {config} is not UTF-8 text" in _one_line(capsys)


def test_an_unbounded_start_and_end_plans_without_a_memory_error(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path
) -> None:
    """``--start 0001-01-01 --end 9999-12-31`` allocated every origin of the range before clipping to the data
    (175 M per half-hourly series here, billions on minute data: a MemoryError)."""
    settings = BacktestSettings.model_validate(
        {"checkpoint": tiny_checkpoint.weights_path, "data": data, "output": tmp_path / "run", "progress": False}
        | {"start": "0001-01-01T00:00:00Z", "end": "9999-12-31T23:30:00Z", "stride": 1}
    )
    plan = planning.prepare(settings)
    assert 0 < plan.windows.planned < 200


def test_an_internal_error_is_one_line_naming_its_traceback_log(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(load_module, "plan_windows", broken)
    code = cli.main(_backtest(tiny_checkpoint.weights_path, data, tmp_path / "run"))
    assert code == 4
    line = _one_line(capsys)
    assert line.startswith("error: internal error: KeyError: 'a bug'. The traceback is in ")
    log = Path(line.split("The traceback is in ")[1].split(";")[0])
    try:
        assert "Traceback (most recent call last)" in log.read_text() and "KeyError: 'a bug'" in log.read_text()
    finally:
        log.unlink()


@pytest.mark.parametrize(
    "error", [OSError(28, "No space left on device"), MemoryError(), ray_exceptions.RaySystemError("the raylet died")]
)
def test_only_commands_a_rerun_resumes_say_finished_parts_are_kept(error: BaseException) -> None:
    """Issue 40 (exit codes mean what they say): "Finished parts are kept; rerun to resume" was said by every
    command (``export``, ``inspect``, ``serve``), where nothing is kept and nothing resumes."""
    code, line = cli.describe_error(error, resumes=False)
    assert code == 3 and "kept" not in line and "resume" not in line and "rerun" in line, line
    code, line = cli.describe_error(error, resumes=True)
    assert code == 3 and "kept" in line and "resume" in line, line


def test_score_output_that_is_a_file_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: ``score --output FILE`` exited 3 "I/O error: FileExistsError ... Finished parts are kept"."""
    from test_live_score import REQUEST_TIME_US, STEP_MIN, _item

    from distributed_onnx.live.log.writer import ForecastLog

    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    assert log.submit(_item("r1", "a", REQUEST_TIME_US + 60 * STEP_MIN * 60_000_000))
    log.close()
    output = tmp_path / "a-file"
    output.write_text("x")
    data = Path(__file__).parents[1] / "distributed_onnx" / "resources" / "taylor.parquet"
    arguments = ["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(data), "--output", str(output)]
    assert cli.main(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --output") and "a-file" in err and "rerun" not in err, err


def test_a_quantile_or_provider_list_with_an_empty_entry_or_one_twice_is_refused_naming_the_flag(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside test: ``--quantiles 0.5,,0.9`` ran with [0.5, 0.9] (the empty entry dropped), while ``''`` was
    refused; docs/cli.md says an empty value is exit 2. The one parser of comma lists refuses an empty entry."""
    for given in ("0.5,,0.9", "0.5,0.9,"):
        code = cli.main(_backtest(tiny_checkpoint.weights_path, data, tmp_path / "run", "--quantiles", given))
        assert code == 2
        line = _one_line(capsys)
        assert "--quantiles" in line and repr(given) in line and "empty entry" in line, line
    # Outside test: --providers 'cpu,,', ',cpu' and cpu,cpu ran (the last with ONNX Runtime's "Duplicate provider"
    # warning from each worker): the same parser, naming the flag and the entry.
    for given, says in (
        ("cpu,,", "'cpu,,' has an empty entry"),
        (",cpu", "',cpu' has an empty entry"),
        ("cpu,cpu", "['cpu'] given more than once"),
    ):
        code = cli.main(_backtest(tiny_checkpoint.weights_path, data, tmp_path / "run", "--providers", given))
        assert code == 2
        line = _one_line(capsys)
        assert "--providers" in line and says in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_run_that_plans_no_window_is_refused_naming_why(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside test: a range after the data (``--start 3000-01-01 --end 3000-01-02``), or series shorter than a
    window, planned 0 windows, and the run went on: Ray, an empty report, exit 0. Refused before any file is
    written, naming the range or the series' lengths against what a window needs."""
    output = tmp_path / "run"
    argv = _backtest(tiny_checkpoint.weights_path, data, output, "--start", "3000-01-01", "--end", "3000-01-02")
    assert cli.main(argv) == 2
    line = _one_line(capsys)
    assert "no window to evaluate" in line and "3000-01-01T00:00:00Z" in line and "start/end" in line, line
    assert not output.exists()

    short = tmp_path / "short.csv"
    first_steps = pd.read_parquet(data).sort_values("timestamp").groupby("series_id").head(5)
    first_steps[["series_id", "timestamp", "y"]].to_csv(short, index=False)
    assert cli.main(_backtest(tiny_checkpoint.weights_path, short, output, "--n-windows", "2")) == 2
    line = _one_line(capsys)
    assert "no window to evaluate" in line and "5..5 steps each" in line and "context + horizon = 24" in line, line
    assert not output.exists()


def test_an_http_server_that_closes_mid_answer_is_an_io_error_not_an_internal_one() -> None:
    """Attack F: a server that sent half of a Content-Length body and closed ended the backtest with exit 4
    ``internal error: ClientPayloadError`` (aiohttp's errors are not ``OSError``): the store failed, exit 3."""
    import aiohttp

    error = aiohttp.ClientPayloadError("Response payload is not completed: not enough data (received 88715 of 177430)")
    code, line = cli.describe_error(error)
    assert code == 3 and line.startswith("I/O error: ClientPayloadError: Response payload is not completed"), line
    assert line.endswith("rerun the same command to resume.")
