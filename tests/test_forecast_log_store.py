"""Issue 51: ``serve --forecast-log`` at an S3 URL with options, on a real S3 server (moto's, on 127.0.0.1).

The log's folder was found by cutting the URL at its last ``/``, which dropped its query
(``?endpoint_override=...``): every forecast went to AWS and was dropped as ``write_failed``, while requests
answered 200, the ready line said the log was on, and nothing reached serve's stderr. Now the log's files land
in the bucket; a log that cannot be written stops serve at start with one line; a write that fails later is a
warning on serve's stderr; and the URL's credentials (its user-info) are in none of what serve prints.

Integration tier: ``distributed-onnx serve`` in a subprocess (embedded Ray), real HTTP, pyarrow's S3 client.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distributed_onnx.model.checkpoint import ResolvedCheckpoint

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the 'dev' extra)")
from test_serve_ingress import Server  # noqa: E402

pytestmark = pytest.mark.integration

BUCKET = "logs"
#: The URL's user-info: pyarrow takes S3 credentials from it; moto takes any.
KEY, SECRET = "AKIALOGKEY51", "LoGsEcReT51pw"


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh S3 server on 127.0.0.1 with one bucket; yields its endpoint (``http://127.0.0.1:PORT``)."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookups (no network here)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _bucket(endpoint: str) -> pafs.FileSystem:
    url = f"s3://{KEY}:{SECRET}@{BUCKET}?endpoint_override={endpoint}&region=us-east-1&allow_bucket_creation=true&allow_bucket_deletion=true"
    filesystem, _ = pafs.FileSystem.from_uri(url)
    return filesystem


def _log_files(filesystem: pafs.FileSystem) -> list[str]:
    infos = filesystem.get_file_info(pafs.FileSelector(BUCKET, recursive=True, allow_not_found=True))
    return sorted(info.path for info in infos if info.type == pafs.FileType.File and info.base_name.startswith("part-"))


def _output_until(process: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """What ``process`` wrote to its stdout pipe until it wrote ``text`` (or ``timeout_s`` passed, or it ended),
    read from the pipe's descriptor: the rest stays in the pipe for ``communicate``."""
    assert process.stdout is not None
    descriptor, read = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in read and (left_s := deadline - time.monotonic()) > 0:
        if not select.select([descriptor], [], [], left_s)[0]:
            break
        chunk = os.read(descriptor, 65536)
        if not chunk:
            break
        read += chunk
    return read.decode(errors="replace")


def test_a_forecast_log_at_an_s3_url_with_options_lands_in_the_bucket(
    endpoint: str, tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path
) -> None:
    log = f"s3://{KEY}:{SECRET}@{BUCKET}/served?endpoint_override={endpoint}&region=us-east-1"
    checkpoint = str(tiny_checkpoint.weights_path)

    # The bucket does not exist yet: serve stops before Ray starts, in one line that names the log redacted.
    refused = subprocess.run(
        [sys.executable, "-m", "distributed_onnx", "serve", "--checkpoint", checkpoint, "--forecast-log", log],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"},
    )
    assert refused.returncode == 3, refused.stderr
    assert "ready:" not in refused.stdout
    assert refused.stderr.startswith(
        f"error: Cannot write the forecast log s3://***@{BUCKET}/served?endpoint_override="
    )
    assert SECRET not in refused.stdout + refused.stderr and KEY not in refused.stdout + refused.stderr

    bucket = _bucket(endpoint)
    bucket.create_dir(BUCKET)
    server = Server("--checkpoint", checkpoint, "--forecast-log", log, "--forecast-log-flush-s", "0.2")
    output = ""
    try:
        body = {"series": [{"series_id": f"s{k}", "y": [float(k)] * 24} for k in range(3)], "horizon": 4}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.post("/v1/forecast", json=body).status_code == 200
            deadline = time.monotonic() + 60
            while not _log_files(bucket):
                assert time.monotonic() < deadline, "no forecast reached the bucket"
                time.sleep(0.3)
            files = _log_files(bucket)
            assert all(path.startswith(f"{BUCKET}/served/day=") and "/model=tiny/" in path for path in files), files
            assert sum(pq.read_metadata(path, filesystem=bucket).num_rows for path in files) == 3 * 4
            # The bucket goes away: requests still answer, and serve's stderr says the log drops them.
            bucket.delete_dir_contents(BUCKET)
            bucket.delete_dir(BUCKET)
            assert client.post("/v1/forecast", json=body).status_code == 200
            output = _output_until(server.process, "writing failed", timeout_s=60)
    finally:
        output += server.stop()
    assert server.process.returncode == 0, output
    ready = next(line for line in output.splitlines() if line.startswith("ready:"))
    assert f"forecast log: s3://***@{BUCKET}/served?endpoint_override=***" in ready, ready
    assert "warning: Forecast log s3://***@" in output and "writing failed" in output, output
    assert SECRET not in output and KEY not in output
