"""A variant (here an actual int8 quantization of the reference graph) against its parent in one backtest:
summary.json and report.html say whether its accuracy differs, by how much, and how much faster it is."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import write_dataset
from graphs import scaled_model, tiny_chronos2_model, tiny_context_quantiles_model, write_tiny_chronos2

from distributed_onnx import cli
from distributed_onnx.evaluation.report.variants import variants_section
from distributed_onnx.evaluation.scoring.findings import leaderboard_findings
from distributed_onnx.evaluation.scoring.variants import variant_verdicts
from distributed_onnx.model.checkpoint import (
    CheckpointMetadata,
    LocalCheckpoint,
    ParentCheckpoint,
    Quantization,
    ResolvedCheckpoint,
    write_checkpoint,
)
from distributed_onnx.model.identity import CheckpointIdentity, identity_of
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET


def _int8_variant(directory: Path) -> Path:
    """``onnxruntime.quantization.quantize_dynamic`` of the bundled reference graph, written as its own
    checkpoint whose metadata names its parent."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    parent = LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve()
    quantized = directory / "quantized.onnx"
    quantize_dynamic(REFERENCE_CHECKPOINT, quantized, weight_type=QuantType.QInt8)
    assert parent.metadata.sha256 is not None
    metadata = parent.metadata.model_copy(
        update={
            "precision": "int8",
            "parent": ParentCheckpoint(name=parent.name, sha256=parent.metadata.sha256),
            "quantization": Quantization(mode="dynamic", weight_type="int8"),
        }
    )
    path = directory / "reference_int8.onnx"
    write_checkpoint(path, quantized.read_bytes(), metadata)
    return path


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_backtest_of_a_variant_and_its_parent_says_whether_accuracy_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variant = _int8_variant(tmp_path)
    output = tmp_path / "run"
    argv = ["backtest", "--checkpoint", str(REFERENCE_CHECKPOINT), "--checkpoint", str(variant)]
    argv += ["--data", str(REFERENCE_DATASET), "--output", str(output), "--n-windows", "24", "--stride", "48"]
    argv += ["--actors", "2", "--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    summary = json.loads((output / "summary.json").read_text())
    parent_name = REFERENCE_CHECKPOINT.stem
    assert summary["models"]["reference_int8"]["parent"]["name"] == parent_name
    [verdict] = summary["variants"]
    assert (verdict["variant"], verdict["parent"], verdict["metric"]) == ("reference_int8", parent_name, "mase")
    assert 3 <= verdict["n"] <= summary["windows"]["planned"] and verdict["differs"] in (True, False)
    assert 0 <= verdict["p_value"] <= 1 and abs(verdict["relative_change"]) < 1.0
    assert verdict["speedup"] is not None and verdict["speedup"] > 0
    assert verdict["quantization"] == {"mode": "dynamic", "weight_type": "int8"}
    stages = summary["timing"]["actor_stage_s"]
    assert stages[f"model:{parent_name}"] > 0 and stages["model:reference_int8"] > 0
    page = (output / "report.html").read_text()
    assert "<h2>Variants against their parents</h2>" in page
    assert "reference_int8 against its parent" in page and "Diebold-Mariano" in page


def _board(p_value: float, statistic: float, values: tuple[float, float]) -> pa.Table:
    rows = [
        {"kind": "metric", "model": "v", "metric": "mase", "value": values[0], "versus": None},
        {"kind": "metric", "model": "p", "metric": "mase", "value": values[1], "versus": None},
        {"kind": "dm", "model": "v", "metric": "mase", "value": statistic, "versus": "p", "n": 50},
    ]
    for row in rows:
        row |= {"statistic": statistic if row["kind"] == "dm" else None, "p_value": p_value, "n": 50}
    return pa.Table.from_pylist(rows)


def test_the_verdict_reads_the_leaderboards_test_and_metric() -> None:
    models = {"p": {"sha256": "a" * 64}, "v": {"sha256": "b" * 64, "parent": {"name": "renamed", "sha256": "a" * 64}}}
    stages = {"model:p": 3.0, "model:v": 1.0}
    [worse] = variant_verdicts(models, _board(0.01, 2.5, (1.1, 1.0)), stages)
    assert worse["parent"] == "p"  # found by its digest, whatever its name
    assert worse["differs"] is True and "differs from its parent's (worse" in worse["verdict"]
    assert worse["relative_change"] == pytest.approx(0.1) and worse["speedup"] == pytest.approx(3.0)
    [same] = variant_verdicts(models, _board(0.4, 0.3, (1.0, 1.0)), {})
    assert same["differs"] is False and "no difference in accuracy shown" in same["verdict"]
    assert same["speedup"] is None
    assert (
        variant_verdicts({"p": {}, "v": {"parent": {"name": "gone", "sha256": "c" * 64}}}, _board(0.4, 0, (1, 1))) == []
    )


def test_the_leaderboards_findings_are_read_once_for_the_page_and_summary_json() -> None:
    """The variants' verdicts (and the realized covariates' gaps) are read off the leaderboard once, where it is
    built (scoring/findings.py): the page's section draws that record and summary.json records the same list,
    where each computed them again from the board."""
    models = {"p": {"sha256": "a" * 64}, "v": {"sha256": "b" * 64, "parent": {"name": "p", "sha256": "a" * 64}}}
    board = _board(0.01, 2.5, (1.1, 1.0))
    findings = leaderboard_findings(board, models, {"model:p": 3.0, "model:v": 1.0}, realized=False)
    summary: dict[str, Any] = {"covariates": {}}
    findings.add_to(summary)
    [verdict] = summary["variants"]
    assert summary["variants"] is findings.variants and "realized_comparison" not in summary["covariates"]
    assert verdict["parent"] == "p" and verdict["speedup"] == pytest.approx(3.0)
    assert escape(verdict["verdict"]) in "".join(variants_section(findings, board))  # drawn as recorded
    assert variants_section(findings, board.slice(0, 0)) == []  # an empty leaderboard: no section, as before
    compared = leaderboard_findings(board, models, None, realized=True)  # --compare-realized: recorded, even empty
    summary = {"covariates": {}}
    compared.add_to(summary)
    assert summary["covariates"]["realized_comparison"] == []


# --- issue 51 (3): a variant's parent is the checkpoint of the identity it names, not one of its name ------------


def _variant_of(parent: ResolvedCheckpoint, directory: Path, name: str) -> Path:
    """A variant of ``parent`` (its graph scaled by 1.01, standing for a quantization) whose metadata names
    ``parent``'s name, graph and identity, as ``export --quantize`` writes it."""
    metadata = parent.metadata.model_copy(
        update={
            "precision": "int8",
            "sha256": None,
            "parent": ParentCheckpoint(
                name=parent.name, sha256=identity_of(parent).sha256, identity=identity_of(parent).record()
            ),
            "quantization": Quantization(mode="dynamic", weight_type="int8"),
        }
    )
    graph = scaled_model(tiny_chronos2_model(), 1.01).SerializeToString()
    return write_checkpoint(directory / f"{name}.onnx", graph, metadata).weights_path


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_checkpoint_with_the_parents_name_but_another_identity_is_not_reported_as_the_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run holds ``tiny`` (another family, other weights: not the parent ``tiny_int8`` names) and ``src``
    with its variant ``src_int8``: one verdict against a parent, and for ``tiny_int8`` what differs."""
    exported = write_tiny_chronos2(tmp_path / "exported")  # tiny_int8's parent, not in the run
    variant = _variant_of(exported, tmp_path / "variants", "tiny_int8")
    halved = scaled_model(tiny_chronos2_model(), 0.5).SerializeToString()  # other weights than tiny_int8's parent
    src = write_checkpoint(tmp_path / "src" / "src.onnx", halved, exported.metadata.model_copy(update={"sha256": None}))
    src_variant = _variant_of(src, tmp_path / "variants", "src_int8")
    impostor = CheckpointMetadata(
        model_family="context_quantiles",
        input_names=["context"],
        output_name="quantiles",
        native_quantiles=[0.1, 0.5, 0.9],
        context_length=16,
        output_patch_size=8,
        horizon_patches=1,
        resolution_minutes=30,
    )
    other = write_checkpoint(
        tmp_path / "other" / "tiny.onnx", tiny_context_quantiles_model().SerializeToString(), impostor
    )
    output = tmp_path / "run"
    argv = ["backtest", "--data", str(write_dataset(tmp_path / "data.parquet", covariate=False))]
    for path in (other.weights_path, variant, src.weights_path, src_variant):
        argv += ["--checkpoint", str(path)]
    argv += ["--output", str(output), "--n-windows", "6", "--quantiles", "0.1,0.5,0.9", "--actors", "1"]
    assert cli.main([*argv, "--no-progress"]) == 0, capsys.readouterr().err

    summary = json.loads((output / "summary.json").read_text())
    verdicts = {verdict["variant"]: verdict for verdict in summary["variants"]}
    assert set(verdicts) == {"tiny_int8", "src_int8"}
    assert (
        verdicts["src_int8"]["parent"] == "src" and "src_int8 against its parent src" in verdicts["src_int8"]["verdict"]
    )
    refused = verdicts["tiny_int8"]
    assert refused["parent"] is None and refused["identity_differs"] is True
    assert "relative_change" not in refused and "against its parent" not in refused["verdict"]
    text = refused["verdict"]
    assert "the run's tiny has another identity" in text, text
    assert f'sha256 "{exported.metadata.sha256}" (its parent)' in text, text
    assert 'model_family "chronos2" (its parent) against "context_quantiles" (the run\'s tiny)' in text, text
    page = (output / "report.html").read_text()
    assert "tiny_int8 against its parent" not in page and "the run&#x27;s tiny has another identity" in page


def test_the_parent_is_found_by_the_identity_it_names_and_an_edited_one_is_said_to_differ() -> None:
    metadata = CheckpointMetadata(
        model_family="chronos2",
        input_names=["context"],
        output_name="q",
        native_quantiles=[0.1, 0.5, 0.9],
        context_length=16,
        output_patch_size=4,
        horizon_patches=2,
        resolution_minutes=30,
    )
    parent = CheckpointIdentity.of(metadata, "a" * 64)
    named = {"name": "renamed", "sha256": "a" * 64, "identity": parent.record()}
    board = _board(0.4, 0.3, (1.0, 1.0))
    models = {"p": {"identity": parent.record()}, "v": {"parent": named}}
    [found] = variant_verdicts(models, board)
    assert found["parent"] == "p"  # by its identity, whatever its name

    edited = CheckpointIdentity.of(metadata.model_copy(update={"native_quantiles": [0.2, 0.5, 0.8]}), "a" * 64)
    [differs] = variant_verdicts({"p": {"identity": edited.record()}, "v": {"parent": named}}, board)
    assert differs["parent"] is None and differs["identity_differs"] is True
    assert "native_quantiles [0.1, 0.5, 0.9] (its parent) against [0.2, 0.5, 0.8] (the run's p)" in differs["verdict"]

    older = {"name": "p", "sha256": "b" * 64}  # a variant written before identities: the graph's sha256 decides
    [graph] = variant_verdicts({"p": {"identity": parent.record()}, "v": {"parent": older}}, board)
    assert graph["parent"] is None and "sha256" in graph["verdict"]
