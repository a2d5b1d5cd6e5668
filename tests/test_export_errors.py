"""Issue 40, defects 7 and 15: what ``export`` says when its inputs are not what it needs.

Each bad input (a flag out of bounds, ``--data`` without ``series_id``, another family's folder, a config with
context 0, corrupt weights, a ``config.json`` that is not JSON, an ``--output`` that is a folder) exited 4 with a
traceback file, or 3 with "Finished parts are kept; rerun" (an export has no parts): each is now exit 2 and one
``error:`` line naming the input. A graph whose parity is not finite (inf weights gave ``max_abs_diff: NaN``,
exit 0) is refused and removed; and a one-series ``--data`` no longer fixes TiRex's batch axis at 1.
The folders are the tiny random-weight models of ``families.py``, built once per session; every command runs
in-process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from families import gappy_series, write_gappy_dataset

from distributed_onnx import cli

pytestmark = pytest.mark.integration  # real torch exports and ONNX Runtime sessions


@pytest.fixture(scope="module")
def folders(
    tmp_path_factory: pytest.TempPathFactory, tiny_bolt_pretrained: Path, tiny_tirex_pretrained: Path
) -> dict[str, Path]:
    """The inputs, bad and good; the good models are the session's (tests/families.py: read-only, copied here
    where a case edits them)."""
    root = tmp_path_factory.mktemp("export-errors")
    bolt = tiny_bolt_pretrained
    made = {"bolt": bolt, "tirex": tiny_tirex_pretrained}
    series = gappy_series()
    made["data"] = write_gappy_dataset(root / "data.parquet", series)
    made["one-series"] = write_gappy_dataset(root / "one.parquet", {"a": series["a"]})
    made["no-series-id"] = root / "noid.parquet"
    pq.write_table(pq.read_table(made["data"]).drop(["series_id"]), made["no-series-id"])
    made["garbage-config"] = root / "garbage"
    made["garbage-config"].mkdir()
    (made["garbage-config"] / "config.json").write_text("{not json")
    made["corrupt-weights"] = shutil.copytree(bolt, root / "corrupt")
    (made["corrupt-weights"] / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    made["context-0"] = shutil.copytree(bolt, root / "context0")
    config = json.loads((bolt / "config.json").read_text())
    config["chronos_config"]["context_length"] = 0
    (made["context-0"] / "config.json").write_text(json.dumps(config))
    made["tirex-garbage"] = root / "tirexbad"
    made["tirex-garbage"].mkdir()
    (made["tirex-garbage"] / "model.ckpt").write_bytes(b"garbage")
    made["folder"] = root / "a-folder"
    made["folder"].mkdir()
    return made


def _export(family: str, pretrained: Path, output: Path, *flags: str) -> int:
    resolution = [] if "--data" in flags else ["--resolution-minutes", "60"]  # never assumed (issue 46)
    argv = ["export", family, "--from-pretrained", str(pretrained), "--output", str(output), *resolution]
    return cli.main([*argv, *flags])


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    (line,) = lines
    assert "Traceback" not in err and "internal error" not in line and "Finished parts" not in line, line
    return line


@pytest.mark.parametrize(
    ("family", "folder", "flags", "named"),
    [
        ("chronos_bolt", "bolt", ["--data", "{no-series-id}"], "series_id"),
        ("chronos2", "bolt", [], "--from-pretrained"),
        ("chronos_bolt", "context-0", [], "context_length"),
        ("chronos_bolt", "corrupt-weights", [], "--from-pretrained"),
        ("chronos_bolt", "garbage-config", [], "--from-pretrained"),
        ("chronos2", "garbage-config", [], "--from-pretrained"),
        ("tirex", "tirex-garbage", [], "--from-pretrained"),
        ("chronos_bolt", "bolt", ["--output-is-a-folder"], "--output"),
    ],
    ids=["no-series-id", "chronos2-on-bolt", "context-0", "corrupt-weights", "garbage-config", "chronos2-garbage",
         "tirex-garbage", "output-folder"],
)  # fmt: skip
def test_a_bad_export_input_is_exit_2_naming_it(
    folders: dict[str, Path],
    family: str,
    folder: str,
    flags: list[str],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "model.onnx"
    if flags == ["--output-is-a-folder"]:
        output, flags = folders["folder"], []
    flags = [flag.format(**{key: str(value) for key, value in folders.items()}) for flag in flags]
    assert _export(family, folders[folder], output, *flags) == 2
    line = _one_error_line(capsys)
    assert named in line, line
    assert not output.with_suffix(".metadata.json").exists()


def test_a_parity_that_is_not_finite_is_refused_and_leaves_no_checkpoint(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 7: inf weights exported with ``max_abs_diff: NaN`` and exit 0, a checkpoint that looked valid."""
    import torch
    from safetensors.torch import load_file, save_file

    pretrained = shutil.copytree(folders["bolt"], tmp_path / "inf")
    weights = load_file(pretrained / "model.safetensors")
    name = next(key for key in sorted(weights) if "layer_norm" in key)
    weights[name] = torch.full_like(weights[name], float("inf"))
    save_file(weights, pretrained / "model.safetensors")
    output = tmp_path / "out" / "inf.onnx"
    assert _export("chronos_bolt", pretrained, output, "--parity-windows", "2") == 2
    line = _one_error_line(capsys)
    assert "parity" in line and "inf.onnx" in line, line
    assert sorted(path.name for path in output.parent.iterdir()) == ["inf.parity.json"]  # no checkpoint left
    parity = json.loads(output.with_suffix(".parity.json").read_text())  # strict JSON: NaN written as null
    assert parity["passed"] is False and parity["max_abs_diff"] is None


def test_tirex_exported_on_one_series_keeps_a_dynamic_batch_axis(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 7: a one-series ``--data`` traced the graph on one row and fixed its batch axis at 1; every part
    of the backtest then failed (``Input 'context' has size 20 on axis 0 ... expected 1``)."""
    import onnxruntime as ort

    output = tmp_path / "tirex.onnx"
    assert (
        _export("tirex", folders["tirex"], output, "--data", str(folders["one-series"]), "--parity-windows", "2") == 0
    )
    parity = json.loads(output.with_suffix(".parity.json").read_text())
    assert parity["windows"] == 1 and parity["passed"] is True
    (context,) = ort.InferenceSession(str(output), providers=["CPUExecutionProvider"]).get_inputs()
    assert not isinstance(context.shape[0], int), context.shape  # a symbolic batch axis


@pytest.mark.usefixtures("ray_session")
def test_a_graph_whose_fixed_batch_axis_cannot_take_the_runs_batches_is_refused_naming_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 7: a graph traced on one row (batch axis fixed at 1) failed every part of a backtest with ONNX
    Runtime's ``Input 'context' has size 20 on axis 0 ... expected 1``, not naming the model, exit 1 "rerun to
    resume"; docs/tirex.md promises such a graph is refused at load. Now: exit 2, one line naming the model."""
    from backtest_data import write_dataset
    from graphs import tiny_context_quantiles_model

    from distributed_onnx.model.checkpoint import CheckpointMetadata, write_checkpoint

    model = tiny_context_quantiles_model()
    for tensor in (*model.graph.input, *model.graph.output):
        tensor.type.tensor_type.shape.dim[0].dim_value = 1  # what the exporter traced on one row wrote
    metadata = CheckpointMetadata(
        model_family="context_quantiles",
        input_names=["context"],
        output_name="quantiles",
        native_quantiles=[0.1, 0.5, 0.9],
        context_length=16,
        output_patch_size=8,
        horizon_patches=1,
        resolution_minutes=30,
    )
    checkpoint = write_checkpoint(tmp_path / "fixed_one.onnx", model.SerializeToString(), metadata).weights_path
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    arguments = ["backtest", "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(tmp_path / "run")]
    arguments += ["--actors", "1", "--cpus-per-actor", "1", "--n-windows", "5", "--stride", "3", "--no-progress"]
    # Batches of 4 (a run whose default batch is 1 window calls such a graph as it can take, and runs).
    arguments += ["--rows-per-batch", "4"]
    assert cli.main(arguments) == 2
    line = _one_error_line(capsys)
    assert "fixed_one" in line and "batch axis is fixed at 1" in line, line
