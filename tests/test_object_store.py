"""Integration tier: a backtest whose ``--data`` and ``--output`` are S3 URLs with options, on a real S3 server.

moto's standalone server runs in a thread of this process on 127.0.0.1; pyarrow's own S3 filesystem talks to it
over HTTP (``endpoint_override=127.0.0.1:PORT&scheme=http``), in the driver and in every actor. Before the fix
every file of such a URL was resolved inside its query string (pyarrow refused ``scheme=http/forecasts/...``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

sys.path.insert(0, str(Path(__file__).parent))

ray = pytest.importorskip("ray")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the 'dev' extra)")

from backtest_data import in_process_forecasts, read_forecasts, settings_for, write_dataset  # noqa: E402

from distributed_onnx import storage  # noqa: E402
from distributed_onnx.evaluation import outputs  # noqa: E402
from distributed_onnx.evaluation.backtest import run_backtest  # noqa: E402
from distributed_onnx.location import Location  # noqa: E402
from distributed_onnx.model.checkpoint import ResolvedCheckpoint  # noqa: E402

pytestmark = pytest.mark.integration

BUCKET = "backtests"


@pytest.fixture
def s3_options(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh S3 server on 127.0.0.1 with one bucket; yields the URL options that reach it.

    pyarrow takes credentials from the environment only, and actors inherit the environment of the Ray that
    started them: the shared test Ray is stopped, so the run starts its own embedded Ray (as the command does)
    after the credentials are set, and stops it at the end.
    """
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups (no network here)
    }.items():
        monkeypatch.setenv(name, value)
    if ray.is_initialized():
        ray.shutdown()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        options = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        filesystem, _ = pafs.FileSystem.from_uri(f"s3://{BUCKET}?{options}&allow_bucket_creation=true")
        filesystem.create_dir(BUCKET)
        yield options
    finally:
        if ray.is_initialized():
            ray.shutdown()
        server.stop()


def _objects(options: str) -> list[str]:
    filesystem, _ = pafs.FileSystem.from_uri(f"s3://{BUCKET}?{options}")
    infos = filesystem.get_file_info(pafs.FileSelector(BUCKET, recursive=True))
    return sorted(info.path for info in infos if info.type == pafs.FileType.File)


@pytest.mark.timeout(900)  # three runs, two of them start Ray: minutes on a loaded machine
def test_a_backtest_on_s3_with_url_options_runs_resumes_and_redoes_a_torn_upload(
    s3_options: str, tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint
) -> None:
    local = write_dataset(tmp_path / "load.parquet")
    data = Location.parse(f"s3://{BUCKET}/inputs/load.parquet?{s3_options}")
    storage.write_bytes(data, local.read_bytes())
    output = Location.parse(f"s3://{BUCKET}/runs/one?{s3_options}")
    settings = settings_for(tiny_checkpoint.weights_path, data, output, rows_per_batch=2, series_transport="input_file")

    first = run_backtest(settings)  # the actors read their series from the S3 input and write parts there
    first_metrics = first.read_metrics()  # metrics.parquet on S3, before the reruns rewrite it

    assert not ray.is_initialized()  # the run started its own Ray (with the credentials) and stopped it
    objects = _objects(s3_options)
    assert all(path.startswith((f"{BUCKET}/inputs/", f"{BUCKET}/runs/one/")) for path in objects), objects
    assert f"{BUCKET}/runs/one/metrics.parquet" in objects and f"{BUCKET}/runs/one/report.html" in objects
    assert len([path for path in objects if "/scores/part-" in path]) == 6
    complete = read_forecasts(output, "tiny")
    expected = in_process_forecasts(settings)
    assert complete["window_id"].equals(expected["window_id"])
    assert first.summary["transport"]["series_transport"] == "input_file"

    # A torn upload: part 1's object cut to half (a copy that stopped part-way), part 2's sums gone.
    torn = outputs.part_path(output, "tiny", 1)
    payload = storage.read_bytes(torn)
    storage.write_bytes(torn, payload[: len(payload) // 2])
    storage.delete(outputs.sums_path(output, 2))

    second = run_backtest(settings)

    assert second.summary["parts"]["done_before"] == 4
    assert second.summary["parts"]["submitted"] == 2
    assert second.read_metrics().equals(first_metrics)
    assert read_forecasts(output, "tiny").equals(complete)

    third = run_backtest(settings)  # a finished run: no Ray, the same numbers from the sums on S3
    assert third.summary["parts"]["submitted"] == 0 and third.summary["actors"] == []
    assert third.read_metrics().equals(first_metrics)
