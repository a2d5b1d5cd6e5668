"""Issue 51 (3): one checkpoint identity (the graph's sha256 and every metadata field that changes an output),
compared by resume. A checkpoint edited between two runs on one output folder is refused or redone whole,
never mixed with the forecasts computed under its old meaning.

The unit tests edit each field of the metadata model in turn (enumerated from the model, not listed here) and
check the comparison; the integration test proves the wiring through the command, with a real local Ray and
real ONNX Runtime sessions on a tiny graph.
"""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
from backtest_data import write_dataset
from graphs import tiny_chronos2_metadata, write_tiny_chronos2
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.driver._identities import check_identities
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.identity import CheckpointIdentity, descriptive_fields, identity_fields

GRAPH_SHA = "a" * 64

#: The fields that change no output, each for its reason (docstring of distributed_onnx/model/identity.py):
#: marking another one descriptive must be a decision, so this list is written out.
DESCRIPTIVE = {
    "schema_version": "the layout of the metadata file",
    "sha256": "the recorded digest; the identity holds the graph's own",
    "description": "free text",
    "parent": "provenance: the graph's digest holds what the making did",
    "quantization": "provenance, likewise",
}


def _base() -> CheckpointMetadata:
    """Metadata in which every field can be edited alone to another valid value."""
    return tiny_chronos2_metadata(missing_value="nan", long_horizon="quantile_paths", max_horizon_length=16)


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [member for arg in typing.get_args(annotation) for member in _literals(arg)]


def _candidates(value: Any, info: FieldInfo) -> list[Any]:
    """Other values for a field, by its type: whatever the field, one of them is valid."""
    found: list[Any] = _literals(info.annotation)
    if isinstance(value, bool):
        found.append(not value)
    elif isinstance(value, int):
        found += [value + 1, value * 2]
    elif isinstance(value, str):
        found.append(value + "_edited")
    elif isinstance(value, list) and value and all(isinstance(each, float) for each in value):
        found.append([each / 2 for each in value])
    elif isinstance(value, list):
        found += [[*value, "extra"], value[::-1]]
    found += [1, 64, "2020-01-01T00:00:00Z", "0" * 64, "text", {"name": "p", "sha256": "0" * 64}, {"mode": "dynamic"}]
    return found


def _edited(base: CheckpointMetadata, name: str) -> CheckpointMetadata | None:
    """``base`` with field ``name`` changed to the first candidate the schema accepts (None: no candidate is
    valid, as for ``schema_version``: such an edit is refused when the checkpoint resolves)."""
    document = base.model_dump(mode="json")
    for candidate in _candidates(document[name], CheckpointMetadata.model_fields[name]):
        if candidate == document[name]:
            continue
        try:
            return CheckpointMetadata.model_validate({**document, name: candidate})
        except ValidationError:
            continue
    return None


def test_the_identity_counts_every_field_unless_it_is_marked_descriptive() -> None:
    assert set(descriptive_fields()) == set(DESCRIPTIVE)
    assert set(identity_fields()) == set(CheckpointMetadata.model_fields) - set(DESCRIPTIVE)

    class Later(CheckpointMetadata):  # a field added later, unmarked, counts
        patch_stride: int = 1

    assert "patch_stride" in identity_fields(Later) and "patch_stride" not in descriptive_fields(Later)


@pytest.mark.parametrize("name", list(CheckpointMetadata.model_fields))
def test_each_metadata_field_edited_between_two_runs_is_refused_or_has_no_effect(name: str, tmp_path: Path) -> None:
    """Per field: the edit changes the identity (every part's model fingerprint holds its digest, so nothing of
    the old meaning verifies, and the resume is refused naming the field and both values), or the field is
    descriptive and the identity, like every forecast, stays the same."""
    base = _base()
    before = CheckpointIdentity.of(base, GRAPH_SHA)
    edited = _edited(base, name)
    if name in DESCRIPTIVE:
        assert edited is None or CheckpointIdentity.of(edited, GRAPH_SHA) == before
        return
    assert edited is not None, f"no valid edit of {name}: give _candidates a value of its type"
    after = CheckpointIdentity.of(edited, GRAPH_SHA)
    assert after.digest != before.digest
    [difference] = before.differences(after)
    assert difference.field == name

    output = tmp_path / "run"
    (output / "forecasts" / "model=m").mkdir(parents=True)
    (output / "forecasts" / "model=m" / "part-000000.parquet").write_bytes(b"a part computed before the edit")
    manifest = {"fingerprint": "f", "checkpoints": {"m": before.record()}}
    (output / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as refused:
        check_identities(Location(output), {"m": after})
    message = str(refused.value)
    assert f"{name} {json.dumps(before.value(name))} (recorded)" in message, message
    assert f"{json.dumps(after.value(name))} (now)" in message, message
    assert "Use another --output, or move" in message and "model=m" in message, message
    assert json.loads((output / "run.json").read_text()) == manifest  # nothing recorded over the old identity


def test_another_graph_changes_the_identity_and_a_field_at_its_default_is_the_same_absent_or_written() -> None:
    base = _base()
    assert CheckpointIdentity.of(base, "b" * 64).differences(CheckpointIdentity.of(base, GRAPH_SHA))[0].field == (
        "sha256"
    )
    record = CheckpointIdentity.of(base, GRAPH_SHA).record()
    del record["fields"]["output_layout"], record["fields"]["precision"]  # at their defaults: as an older record
    older = CheckpointIdentity.from_record(record)
    assert older is not None and older.digest == CheckpointIdentity.of(base, GRAPH_SHA).digest
    assert not older.differences(CheckpointIdentity.of(base, GRAPH_SHA))


def test_the_parts_fingerprint_holds_the_identity_so_an_edited_checkpoints_parts_never_verify(
    tmp_path: Path,
) -> None:
    """Whatever run.json says (a directory written before identities were recorded says nothing), a part
    computed under another identity does not verify: the model's fingerprint it carries differs."""
    from backtest_data import settings_for

    from distributed_onnx.evaluation.planning import prepare

    checkpoint = write_tiny_chronos2(tmp_path / "checkpoint")
    settings = settings_for(checkpoint.weights_path, write_dataset(tmp_path / "data.parquet"), tmp_path / "run")
    before = prepare(settings)
    metadata_path = tmp_path / "checkpoint" / "tiny.metadata.json"
    document = json.loads(metadata_path.read_text())
    metadata_path.write_text(json.dumps({**document, "native_quantiles": [0.05, *document["native_quantiles"][1:]]}))
    after = prepare(settings)
    assert after.run_fingerprint == before.run_fingerprint  # the same windows and settings...
    assert after.model_fingerprints["tiny"] != before.model_fingerprints["tiny"]  # ...another model's parts
    assert after.identities["tiny"].differences(before.identities["tiny"])[0].field == "native_quantiles"


# --- through the command ---------------------------------------------------------------------------------------


def _summary(output: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((output / "summary.json").read_text())
    return document


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_checkpoint_edited_between_two_runs_on_one_folder_is_refused_never_mixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = write_tiny_chronos2(tmp_path / "checkpoint")
    metadata_path = tmp_path / "checkpoint" / "tiny.metadata.json"
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    output = tmp_path / "run"
    parts = output / "forecasts" / "model=tiny"
    argv = ["backtest", "--checkpoint", str(checkpoint.weights_path), "--data", str(data), "--output", str(output)]
    argv += ["--n-windows", "10", "--quantiles", "0.1,0.5,0.9", "--windows-per-part", "4", "--actors", "1"]
    argv += ["--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    planned = _summary(output)["windows"]["planned"]
    assert _summary(output)["models"]["tiny"]["identity"]["fields"]["native_quantiles"] == [
        0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9
    ]  # fmt: skip

    def edit(**changes: Any) -> None:
        document = json.loads(metadata_path.read_text())
        metadata_path.write_text(json.dumps({**document, **changes}))

    # A descriptive field edited: the forecasts mean the same, so the run resumes (only the removed part runs).
    edit(description="the same graph, described")
    (parts / "part-000001.parquet").unlink()
    assert cli.main(argv) == 0, capsys.readouterr().err
    windows = _summary(output)["windows"]
    assert 0 < windows["run_now"] < planned and windows["done_before"] + windows["run_now"] == planned

    # native_quantiles edited (the graph unchanged) and a part removed: refused, naming the field and both values.
    edit(native_quantiles=[0.05, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95])
    (parts / "part-000002.parquet").unlink()
    kept = sorted(path.name for path in parts.iterdir())
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "native_quantiles [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9] (recorded)" in lines[0], lines[0]
    assert "[0.05, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95] (now)" in lines[0], lines[0]
    assert f"move {parts}" in lines[0], lines[0]
    assert sorted(path.name for path in parts.iterdir()) == kept  # nothing deleted, nothing computed

    # The way the message gives: the checkpoint's forecasts moved out, everything of it is computed again.
    shutil.move(parts, tmp_path / "old-forecasts")
    assert cli.main(argv) == 0, capsys.readouterr().err
    windows = _summary(output)["windows"]
    assert (windows["done_before"], windows["run_now"]) == (0, planned)
    recorded = json.loads((output / "run.json").read_text())["checkpoints"]["tiny"]
    assert recorded["fields"]["native_quantiles"][0] == 0.05


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_weights_kept_beside_the_graph_edited_between_two_runs_are_refused_never_mixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51 follow-up: the identity hashed the .onnx file only, while an export keeps the weights in
    NAME.onnx.data beside it. The weights edited (the graph file byte for byte the same) and a part removed, the
    rerun resumed: the part computed again with the new weights sat beside the others, computed with the old."""
    from graphs import write_tiny_chronos2_external

    checkpoint = write_tiny_chronos2_external(tmp_path / "checkpoint")
    graph_bytes = checkpoint.weights_path.read_bytes()
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    output = tmp_path / "run"
    parts = output / "forecasts" / "model=tiny"
    argv = ["backtest", "--checkpoint", str(checkpoint.weights_path), "--data", str(data), "--output", str(output)]
    argv += ["--n-windows", "10", "--quantiles", "0.1,0.5,0.9", "--windows-per-part", "4", "--actors", "1"]
    argv += ["--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    recorded = _summary(output)["models"]["tiny"]["identity"]
    assert set(recorded["external"]) == {"tiny.onnx.data"}

    write_tiny_chronos2_external(tmp_path / "checkpoint", shift=1.0)  # every offset one higher
    assert checkpoint.weights_path.read_bytes() == graph_bytes
    (parts / "part-000001.parquet").unlink()
    kept = sorted(path.name for path in parts.iterdir())
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f'external data tiny.onnx.data "{recorded["external"]["tiny.onnx.data"]}" (recorded)' in lines[0]
    assert f"move {parts}" in lines[0], lines[0]
    assert sorted(path.name for path in parts.iterdir()) == kept  # nothing deleted, nothing computed


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_each_identity_field_of_the_bundled_checkpoint_edited_is_refused_naming_it_not_by_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside test: a copy of the bundled checkpoint run into a folder, then one metadata field edited and the
    same command rerun. ``native_quantiles``, ``context_length``, ``horizon_patches`` and ``training_data_end``
    also change the run's fingerprint, and the fingerprint was compared first: the refusal named two digests,
    no field, and advised deleting the folder. Each identity field (enumerated from the metadata model) edited
    alone must be refused naming it, the forecasts untouched: never the fingerprint line, never a mixed run."""
    from distributed_onnx.model.checkpoint import read_metadata
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    folder = tmp_path / "ck"
    folder.mkdir()
    weights = folder / REFERENCE_CHECKPOINT.name
    shutil.copy(REFERENCE_CHECKPOINT, weights)
    metadata_path = folder / f"{REFERENCE_CHECKPOINT.stem}.metadata.json"
    shutil.copy(REFERENCE_CHECKPOINT.with_name(metadata_path.name), metadata_path)
    original = metadata_path.read_text()
    base = read_metadata(metadata_path)
    output = tmp_path / "rid"
    argv = ["backtest", "--output", str(output), "--checkpoint", str(weights), "--n-windows", "4", "--stride", "48"]
    argv += ["--actors", "1", "--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    parts = output / "forecasts" / f"model={weights.stem}"
    kept = {path.name: path.stat().st_mtime_ns for path in parts.iterdir()}
    run_record = (output / "run.json").read_text()
    for name in identity_fields():
        edited = _edited(base, name)
        document = json.loads(original)
        if edited is not None:
            document[name] = edited.model_dump(mode="json")[name]
        else:  # no value valid alone on this checkpoint (max_horizon_length without unrolling): refused as invalid
            info = CheckpointMetadata.model_fields[name]
            document[name] = next(each for each in _candidates(document.get(name), info) if each != document.get(name))
        metadata_path.write_text(json.dumps(document))
        capsys.readouterr()
        assert cli.main(argv) == 2, (name, capsys.readouterr().err)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in err, (name, err)
        # Named by the identity check, or by a check the edited value fails first (a 31-minute grid the data is not on).
        value = document[name]
        assert name in lines[0] or f"{value}-minute" in lines[0], (name, lines[0])
        assert "other settings" not in lines[0], (name, lines[0])
        assert {path.name: path.stat().st_mtime_ns for path in parts.iterdir()} == kept, name  # nothing redone
        assert (output / "run.json").read_text() == run_record, name
    metadata_path.write_text(original)
