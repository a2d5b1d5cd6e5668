"""Checkpoint metadata, resolution and atomic writing (unit tier: no ORT, no Ray)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import jsonschema
import pytest
from graphs import tiny_chronos2_metadata

from distributed_onnx.errors import (
    CheckpointIntegrityError,
    CheckpointMetadataError,
    CheckpointNotFoundError,
    DistributedOnnxError,
)
from distributed_onnx.model.checkpoint import CheckpointMetadata, LocalCheckpoint, read_metadata, write_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"


def test_metadata_written_by_openstef_loads_unchanged() -> None:
    metadata = read_metadata(FIXTURES / "openstef_written.metadata.json")
    assert metadata.model_family == "chronos2"
    assert metadata.horizon_length == 64
    assert metadata.max_covariates == 3
    assert metadata.precision == "fp16"
    assert metadata.sha256 is None


def test_our_metadata_validates_under_openstef_schema(tmp_path: Path) -> None:
    schema = json.loads((FIXTURES / "openstef_checkpoint_metadata_v2.schema.json").read_text())
    written = write_checkpoint(tmp_path / "m.onnx", b"weights", tiny_chronos2_metadata(description="ours"))
    document = json.loads((tmp_path / "m.metadata.json").read_text())
    jsonschema.validate(document, schema)  # extra keys (sha256, description) are allowed: OpenSTEF ignores them
    assert document["sha256"] == written.metadata.sha256
    # ... and every OpenSTEF field has the same name here.
    assert set(schema["properties"]) <= set(CheckpointMetadata.model_fields)


def test_openstef_schema_defaults_match_ours() -> None:
    schema = json.loads((FIXTURES / "openstef_checkpoint_metadata_v2.schema.json").read_text())
    for name, prop in schema["properties"].items():
        if "default" in prop:
            assert CheckpointMetadata.model_fields[name].default == prop["default"], name
    assert set(schema["required"]) == {n for n, f in CheckpointMetadata.model_fields.items() if f.is_required()}


def test_write_then_resolve_round_trips(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path / "m.onnx", b"abc", tiny_chronos2_metadata())
    resolved = LocalCheckpoint(path=tmp_path / "m.onnx").resolve()
    assert resolved == written
    assert resolved.metadata.sha256 is not None
    assert resolved.name == "m"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_missing_weights_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"weights not found: .*nope\.onnx"):
        LocalCheckpoint(path=tmp_path / "nope.onnx").resolve()


def test_missing_metadata_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(CheckpointNotFoundError, match=r"metadata not found: .*m\.metadata\.json"):
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()


def test_explicit_metadata_path(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m.onnx", b"x", tiny_chronos2_metadata())
    (tmp_path / "m.metadata.json").rename(tmp_path / "other.json")
    resolved = LocalCheckpoint(path=tmp_path / "m.onnx", metadata_path=tmp_path / "other.json").resolve()
    assert resolved.metadata.context_length == 16


def test_invalid_json_is_a_metadata_error(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "m.metadata.json").write_text('{"model_family": "chronos2",')
    with pytest.raises(CheckpointMetadataError, match=r"not valid JSON.*line 1"):
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"context_length": 0}, "context_length"),
        ({"native_quantiles": [0.5, 0.1]}, "strictly ascending"),
        ({"native_quantiles": [0.1, 1.5]}, r"native_quantiles: .*strictly between 0 and 1, got \[1\.5\]"),
        ({"native_quantiles": [0.0, 0.5, 1.0]}, r"got \[0\.0, 1\.0\] in \[0\.0, 0\.5, 1\.0\]: levels 0 and 1"),
        ({"native_quantiles": [0.5, 1.0]}, r"strictly between 0 and 1, got \[1\.0\]"),
        ({"precision": "fp8"}, "precision"),
        ({"schema_version": 3}, "schema_version 3 is not supported"),
        ({"input_names": []}, "input_names"),
        ({"sha256": "zz"}, "sha256"),
    ],
)
def test_schema_violations_name_the_key(tmp_path: Path, change: dict[str, object], message: str) -> None:
    document = tiny_chronos2_metadata().model_dump(mode="json") | change
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "m.metadata.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointMetadataError, match=message) as info:
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()
    assert "m.metadata.json" in str(info.value)


def test_native_levels_within_the_level_tolerance_are_one_level_twice(tmp_path: Path) -> None:
    """Issue 53: the checkpoint took two native levels 1e-12 apart, which every consumer of levels treats as one
    (model/quantiles.py's LEVEL_TOLERANCE); the metadata now refuses them by the same rule as requested levels."""
    document = tiny_chronos2_metadata().model_dump(mode="json")
    levels = list(document["native_quantiles"])
    document["native_quantiles"] = sorted([*levels, levels[0] + 1e-12])
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "m.metadata.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointMetadataError, match=r"strictly ascending \(no two within 1e-09\)"):
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    document = tiny_chronos2_metadata().model_dump(mode="json")
    del document["output_name"]
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "m.metadata.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointMetadataError, match="output_name: Field required"):
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()


def test_sha256_mismatch_is_an_integrity_error(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m.onnx", b"original", tiny_chronos2_metadata())
    (tmp_path / "m.onnx").write_bytes(b"tampered")
    with pytest.raises(CheckpointIntegrityError, match="sha256"):
        LocalCheckpoint(path=tmp_path / "m.onnx").resolve()


def test_errors_survive_pickling() -> None:
    error = CheckpointIntegrityError("bad weights", path="/x.onnx")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is CheckpointIntegrityError
    assert str(clone) == "bad weights"
    assert clone.path == "/x.onnx"
    assert isinstance(clone, DistributedOnnxError)
