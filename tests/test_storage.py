"""Run directories and data on local paths, ``file://`` URLs and an object store (fsspec's memory://)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.data.table import read_table
from distributed_onnx.evaluation.settings import BacktestSettings

TABLE = pa.table({"series_id": ["a", "a"], "timestamp": pa.array([0, 1800_000_000], pa.timestamp("us")), "y": [1, 2]})


def test_locations_keep_paths_local_and_urls_as_urls(tmp_path: Path) -> None:
    assert storage.local_path(tmp_path.as_uri()) == tmp_path
    assert storage.local_path("runs/x") == Path("runs/x")
    assert storage.local_path("s3://bucket/runs") is None
    assert storage.join("s3://bucket/runs/", "forecasts", "part-000001.parquet") == (
        "s3://bucket/runs/forecasts/part-000001.parquet"
    )
    assert storage.join(tmp_path, "a") == tmp_path / "a"
    settings = BacktestSettings(output="s3://bucket/runs/x", data=str(tmp_path / "d.parquet"))
    assert settings.output == "s3://bucket/runs/x" and settings.data == tmp_path / "d.parquet"


def test_url_options_stay_options_when_files_are_named() -> None:
    """Joined onto the whole string, every file of an URL with options landed inside its query string."""
    run = "s3://bucket/runs/x/?endpoint_override=127.0.0.1:9000&scheme=http"
    part = storage.join(run, "forecasts", "part-000001.parquet")
    assert part == "s3://bucket/runs/x/forecasts/part-000001.parquet?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.normalize(run) == "s3://bucket/runs/x?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.suffix("s3://bucket/in/load.CSV?region=eu-west-1") == ".csv"
    assert storage.suffix("s3://bucket/in/load.parquet?region=eu-west-1") == ".parquet"
    assert storage.suffix(Path("/data.d/load")) == ""


@pytest.mark.parametrize("kind", ["path", "file-url", "object-store"])
def test_run_directory_round_trip(kind: str, tmp_path: Path) -> None:
    output: storage.Location = {
        "path": tmp_path / "run",
        "file-url": (tmp_path / "run").as_uri(),
        "object-store": f"memory://{tmp_path.name}/run",  # fsspec's (process-global) store, through pyarrow
    }[kind]
    outputs.prepare_output(output, "fp-1", {"settings": {}})
    outputs.prepare_output(output, "fp-1", {"settings": {}})  # same run: resumes
    for index in (3, 0):
        size = outputs.write_part(output, index, TABLE, {"part": index})
        assert storage.file_size(outputs.part_path(output, index)) == size
    outputs.clean_partials(output)
    assert [outputs.part_record(output, index) for index in (0, 1, 3)] == [({"part": 0}, 2), None, ({"part": 3}, 2)]
    assert storage.read_parquet(outputs.part_path(output, 3)).replace_schema_metadata(None).equals(TABLE)
    storage.write_bytes(storage.join(output, "summary.json"), b"{}")
    assert storage.read_bytes(storage.join(output, "summary.json")) == b"{}"
    with pytest.raises(Exception, match="other settings"):
        outputs.prepare_output(output, "fp-2", {})
    if kind != "object-store":  # local writes leave no temporary file behind
        assert sorted(p.name for p in (tmp_path / "run" / "forecasts").iterdir()) == [
            "part-000000.parquet",
            "part-000003.parquet",
        ]


def test_data_is_read_from_a_url(tmp_path: Path) -> None:
    path = tmp_path / "series.parquet"
    storage.write_parquet(path, TABLE)
    assert read_table(path.as_uri()).equals(TABLE)
    assert storage.sha256(path.as_uri()) == storage.sha256(path)
    storage.make_dirs("memory://bucket/data")
    storage.write_bytes("memory://bucket/data/series.csv", b"series_id,timestamp,y\na,2024-01-01T00:00:00Z,1.5\n")
    assert read_table("memory://bucket/data/series.csv").column("y").to_pylist() == [1.5]
    with pytest.raises(DataError, match="not found"):
        read_table("memory://bucket/data/missing.parquet")


def test_an_upload_that_fails_part_way_leaves_no_torn_object() -> None:
    """pyarrow closes (publishes) a stream an exception left: the final name held half a file before."""
    import uuid

    import flaky_storage

    run = f"flaky://{uuid.uuid4().hex}/run"
    target = storage.join(run, "forecasts", "part-000003.parquet")
    storage.make_dirs(storage.join(run, "forecasts"))
    flaky_storage.FAILURES["write:part-000003.parquet"] = 1
    try:
        with pytest.raises(OSError, match="injected"):
            storage.write_parquet(target, TABLE)
    finally:
        flaky_storage.FAILURES.clear()
    assert not storage.is_file(target)
    assert storage.list_files(storage.join(run, "forecasts"), "", "") == []  # no temporary object left either
    storage.write_parquet(target, TABLE)  # the retry writes the whole file
    assert storage.read_parquet(target).replace_schema_metadata(None).equals(TABLE)
