"""The CLI against a Ray or a store that is not there, and signals: each ends bounded, with its documented exit code
and one line (docs/cli.md's exit codes), never a hang, a crash or a signal's number.

Each test runs the command as a user does (a subprocess), with a deadline well under what the hang took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

#: Far below the minutes the defects took (a refused address hung > 9 minutes): a hang fails the test.
DEADLINE_S = 90


def _command(*words: str) -> list[str]:
    return [sys.executable, "-m", "distributed_onnx", *words]


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def _run(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(*words), env=_environment(), capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_an_address_ray_cannot_parse_is_refused_naming_the_flag(tmp_path: Path) -> None:
    for command in (["backtest", "--output", str(tmp_path / "run")], ["serve"], ["fev", "b.yaml", "--output", "x"]):
        done = _run(*command, "--address", "garbage:xyz")
        line = _error_line(done.stderr)
        assert done.returncode == 2, done.stderr
        assert "--address" in line and "'garbage:xyz'" in line and "port 'xyz'" in line, line
        assert "internal error" not in done.stderr


def test_an_address_port_of_other_digits_is_refused_and_auto_is_taken_in_any_case(tmp_path: Path) -> None:
    """Outside test: ``--address 127.0.0.1:\\u0661`` (an Arabic-Indic digit) was port 1, and ``--address AUTO`` was
    refused as "no HOST:PORT". A port is ASCII digits; auto is auto in any case."""
    from distributed_onnx.evaluation.settings import BacktestSettings

    done = _run("backtest", "--output", str(tmp_path / "run"), "--address", "127.0.0.1:\u0661")
    line = _error_line(done.stderr)
    assert done.returncode == 2, done.stderr
    assert "--address" in line and "port '\u0661' is not a number from 1 to 65535" in line, line
    for given in ("AUTO", "Auto"):
        assert BacktestSettings.from_sources({"output": "run", "address": given}).address == "auto"


def test_tune_refuses_more_cpus_than_the_machine_has(tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path) -> None:
    here = os.cpu_count() or 1
    done = _run(
        "tune", str(tiny_checkpoint.weights_path), "--cpus", str(here + 998), "--output", str(tmp_path / "t.json")
    )
    line = _error_line(done.stderr)
    assert done.returncode == 2, done.stderr
    assert "--cpus" in line and f"has {here} cores" in line, line
    assert not (tmp_path / "t.json").exists()


@pytest.mark.integration
def test_an_address_where_no_ray_answers_ends_with_exit_3_naming_it(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    backtest = ["backtest", "--output", str(tmp_path / "run"), "--checkpoint", str(tiny_checkpoint.weights_path)]
    # serve's ports are its defaults: the refusal comes before any is bound
    for command in ([*backtest, "--no-progress", "--n-windows", "2", "--stride", "48"], ["serve"]):
        done = _run(*command, "--address", "127.0.0.1:1")  # a hang is _run's timeout (it hung for good before)
        line = _error_line(done.stderr)
        assert done.returncode == 3, done.stderr
        assert "No Ray answered at 127.0.0.1:1" in line, line
        assert "192.0.2" not in done.stderr and "Failed to connect to GCS" not in done.stderr


@pytest.mark.integration
def test_a_data_store_that_does_not_answer_is_exit_3(tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    url = "s3://K:S@bkt/data/taylor.parquet?endpoint_override=http://127.0.0.1:1&scheme=http"
    done = _run(
        "backtest", "--output", str(tmp_path / "run"), "--checkpoint", str(tiny_checkpoint.weights_path),
        "--data", url, "--no-progress", "--n-windows", "2", "--actors", "1",
    )  # fmt: skip
    line = _error_line(done.stderr)
    assert done.returncode == 3, done.stderr
    assert "does not answer" in line and "s3://***@bkt/data/taylor.parquet" in line, line
    assert "K:S" not in done.stderr


@pytest.mark.integration
def test_sigterm_of_a_running_backtest_is_exit_130_without_rays_stack_dump(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    command = _command(
        "backtest", "--output", str(tmp_path / "run"), "--checkpoint", str(tiny_checkpoint.weights_path),
        "--no-progress", "--n-windows", "1500", "--stride", "1", "--actors", "1", "--rows-per-batch", "1",
        "--windows-per-part", "10",
    )  # fmt: skip
    process = subprocess.Popen(command, env=_environment(), stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen = []
    deadline = time.monotonic() + DEADLINE_S
    for line in process.stderr:  # the first part done: Ray and the pool are up, the run under way
        seen.append(line)
        if "progress:" in line or time.monotonic() > deadline:
            break
    process.send_signal(signal.SIGTERM)
    try:
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
    stderr = "".join(seen) + rest
    assert process.returncode == 130, stderr
    assert _error_line(stderr) == "error: interrupted by SIGTERM; rerun the same command to resume"
    assert "SIGTERM received" not in stderr and "PC: @" not in stderr, stderr


def test_a_data_store_that_does_not_answer_is_asked_once(tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path) -> None:
    """The backtest's data read asked a store that does not answer twice: the streamed scan's look at the file
    failed, was taken for "not a file it can stream", and the whole read asked again. pyarrow's S3 client retries
    for seconds before it gives up, so the user of the test above waited that out twice before the error line."""
    import uuid

    import flaky_storage

    from distributed_onnx.errors import StorageError
    from distributed_onnx.evaluation.dataset import load
    from distributed_onnx.evaluation.planning import resolve
    from distributed_onnx.evaluation.settings import BacktestSettings

    data = f"flaky://{uuid.uuid4().hex}/data/taylor.parquet"
    settings = BacktestSettings.model_validate(
        {"checkpoint": tiny_checkpoint.weights_path, "data": data, "output": tmp_path / "run", "n_windows": 2}
    )
    models = resolve(settings)
    flaky_storage.REFUSING.add(data.removeprefix("flaky://"))
    flaky_storage.FAILED.clear()
    try:
        with pytest.raises(StorageError, match="does not answer") as refused:
            load(settings, models.spec, models.resolution_minutes)
        asked = list(flaky_storage.FAILED)
    finally:
        flaky_storage.REFUSING.clear()
        flaky_storage.FAILED.clear()
    assert "Cannot read data file flaky://" in str(refused.value)
    assert len(asked) == 1, asked
