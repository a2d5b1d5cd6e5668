"""Run directories and data on local paths, ``file://`` URLs and an object store (fsspec's memory://)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.evaluation import output_cleanup, outputs, run_manifest
from distributed_onnx.evaluation.data.table import read_table
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location

TABLE = pa.table({"series_id": ["a", "a"], "timestamp": pa.array([0, 1800_000_000], pa.timestamp("us")), "y": [1, 2]})


def test_locations_keep_paths_local_and_urls_as_urls(tmp_path: Path) -> None:
    assert Location.parse(tmp_path.as_uri()).local_path == tmp_path
    assert Location.parse("runs/x").local_path == Path("runs/x")
    assert Location.parse("s3://bucket/runs").local_path is None
    assert storage.join(Location.parse("s3://bucket/runs/"), "forecasts", "part-000001.parquet").reveal() == (
        "s3://bucket/runs/forecasts/part-000001.parquet"
    )
    assert storage.join(Location(tmp_path), "a").local_path == tmp_path / "a"
    settings = BacktestSettings(output="s3://bucket/runs/x", data=str(tmp_path / "d.parquet"))
    assert settings.output.reveal() == "s3://bucket/runs/x" and settings.data.local_path == tmp_path / "d.parquet"


def test_url_options_stay_options_when_files_are_named() -> None:
    """Joined onto the whole string, every file of an URL with options landed inside its query string."""
    run = "s3://bucket/runs/x/?endpoint_override=127.0.0.1:9000&scheme=http"
    part = storage.join(Location.parse(run), "forecasts", "part-000001.parquet")
    assert part.reveal() == (
        "s3://bucket/runs/x/forecasts/part-000001.parquet?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert Location.parse(run).reveal() == "s3://bucket/runs/x?endpoint_override=127.0.0.1:9000&scheme=http"
    assert Location.parse("s3://bucket/in/load.CSV?region=eu-west-1").suffix == ".csv"
    assert Location.parse("s3://bucket/in/load.parquet?region=eu-west-1").suffix == ".parquet"
    assert Location.parse(Path("/data.d/load")).suffix == ""


@pytest.mark.parametrize("kind", ["path", "file-url", "object-store"])
def test_run_directory_round_trip(kind: str, tmp_path: Path) -> None:
    given: Path | str = {
        "path": tmp_path / "run",
        "file-url": (tmp_path / "run").as_uri(),
        "object-store": f"memory://{tmp_path.name}/run",  # fsspec's (process-global) store, through pyarrow
    }[kind]
    output = Location.parse(given)
    run_manifest.prepare_output(output, "fp-1", {"settings": {}})
    run_manifest.prepare_output(output, "fp-1", {"settings": {}})  # same run: resumes
    for index in (3, 0):
        size = outputs.write_part(output, "m", index, TABLE, {"part": index})
        assert storage.file_size(outputs.part_path(output, "m", index)) == size
    output_cleanup.clean_partials(output, ["m"])
    records = [outputs.part_record(output, "m", index) for index in (0, 1, 3)]
    assert records == [({"part": 0}, 2), None, ({"part": 3}, 2)]
    assert storage.read_parquet(outputs.part_path(output, "m", 3)).replace_schema_metadata(None).equals(TABLE)
    storage.write_bytes(storage.join(output, "summary.json"), b"{}")
    assert storage.read_bytes(storage.join(output, "summary.json")) == b"{}"
    with pytest.raises(Exception, match="other settings"):
        run_manifest.prepare_output(output, "fp-2", {})
    if kind != "object-store":  # local writes leave no temporary file behind
        assert sorted(p.name for p in (tmp_path / "run" / "forecasts" / "model=m").iterdir()) == [
            "part-000000.parquet",
            "part-000003.parquet",
        ]


def test_data_is_read_from_a_url(tmp_path: Path) -> None:
    path = tmp_path / "series.parquet"
    storage.write_parquet(Location(path), TABLE)
    assert read_table(Location.parse(path.as_uri())).equals(TABLE)
    assert storage.sha256(Location.parse(path.as_uri())) == storage.sha256(Location(path))
    storage.make_dirs(Location.parse("memory://bucket/data"))
    csv = Location.parse("memory://bucket/data/series.csv")
    storage.write_bytes(csv, b"series_id,timestamp,y\na,2024-01-01T00:00:00Z,1.5\n")
    assert read_table(csv).column("y").to_pylist() == [1.5]
    with pytest.raises(DataError, match="not found"):
        read_table(Location.parse("memory://bucket/data/missing.parquet"))


def test_an_upload_that_fails_part_way_leaves_no_torn_object() -> None:
    """pyarrow closes (publishes) a stream an exception left: the final name held half a file before."""
    import uuid

    import flaky_storage

    run = Location.parse(f"flaky://{uuid.uuid4().hex}/run")
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
