"""A variant (here an actual int8 quantization of the reference graph) against its parent in one backtest:
summary.json and report.html say whether its accuracy differs, by how much, and how much faster it is."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from distributed_onnx import cli
from distributed_onnx.evaluation.scoring.variants import variant_verdicts
from distributed_onnx.model.checkpoint import LocalCheckpoint, ParentCheckpoint, Quantization, write_checkpoint
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
