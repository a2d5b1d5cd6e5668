"""An object store that does not answer a command's output: one line in the project's words naming the location
(redacted), exit 3, where the command ended on pyarrow's raw ``I/O error: OSError: ... Failed to connect to ***``.

A store killed in the middle of a backtest failed every part left (each after its write attempts) and then the
driver's write of ``metrics.parquet``, which ended the run on that raw line; a store down from the start failed the
first look at ``--output``. Both are the storage's "does not answer" line now (distributed_onnx/storage.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from distributed_onnx import cli, storage
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups (no network here)
}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 nothing listens on (bound, never listened): a store that is down."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield closed.getsockname()[1]


def _store(port: int, key: str) -> str:
    return f"s3://KEY:SECRET@bkt/{key}?endpoint_override=http://127.0.0.1:{port}&scheme=http&region=us-east-1"


@pytest.mark.integration  # the command as a subprocess, pyarrow's S3 client against 127.0.0.1
def test_a_backtest_whose_output_store_does_not_answer_says_so_naming_it(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, closed_port: int
) -> None:
    output = _store(closed_port, "runs/one")
    command = [sys.executable, "-m", "distributed_onnx", "backtest", "--checkpoint", str(tiny_checkpoint.weights_path)]
    command += ["--output", output, "--n-windows", "2", "--actors", "1", "--no-progress"]
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"} | CREDENTIALS

    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)

    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 3 and len(errors) == 1, done.stderr
    expected = "error: Cannot read s3://***@bkt/runs/one?endpoint_override=***&scheme=***&region=***: the storage"
    assert errors[0].startswith(expected + " does not answer ("), errors[0]
    assert "I/O error" not in done.stderr and "SECRET" not in done.stderr and str(closed_port) not in done.stderr


@pytest.mark.integration  # pyarrow's S3 client against 127.0.0.1
def test_a_write_the_store_does_not_answer_is_the_storage_line_and_still_an_os_error(
    closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write the run ended on (the driver's ``metrics.parquet``): the storage's line through the command's error
    handling (exit 3); and an ``OSError`` still, which an actor's part write retries on before it fails the part."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    metrics = Location.parse(_store(closed_port, "runs/one/metrics.parquet"))

    with pytest.raises(storage.StorageNotAnsweringError) as raised:
        storage.write_parquet(metrics, pa.table({"x": [1.0]}))

    assert isinstance(raised.value, OSError)
    code, line = cli.describe_error(raised.value, resumes=True, flags={})
    assert code == 3, line
    assert line.startswith(
        "Cannot write s3://***@bkt/runs/one/metrics.parquet?endpoint_override=***&scheme=***&region=***: the storage "
        "does not answer ("
    ), line
    assert line.endswith("Check the URL's endpoint and the network, and rerun when the storage answers."), line
    assert "SECRET" not in line and str(closed_port) not in line, line
