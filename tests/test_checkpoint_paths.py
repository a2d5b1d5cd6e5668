"""Issue 46: ``--checkpoint`` as people type it: a folder of checkpoints, or either file of a checkpoint's pair.

A folder is every ``*.onnx`` in it with its ``.metadata.json`` (one line on stderr per checkpoint taken); an
empty folder is exit 2 naming it; ``x.metadata.json`` is the checkpoint ``x.onnx``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from backtest_data import write_dataset

from distributed_onnx import cli
from distributed_onnx.model.checkpoint import ResolvedCheckpoint, default_metadata_path


def _copy(checkpoint: ResolvedCheckpoint, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / f"{name}.onnx"
    shutil.copyfile(checkpoint.weights_path, weights)
    shutil.copyfile(default_metadata_path(checkpoint.weights_path), default_metadata_path(weights))
    return weights


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_folder_is_every_checkpoint_in_it_and_a_metadata_file_its_weights(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("onnxruntime")
    models = tmp_path / "models"
    _copy(tiny_checkpoint, models, "alpha")
    _copy(tiny_checkpoint, models, "beta")
    (models / "notes.onnx").write_bytes(b"")  # no metadata beside it: not a checkpoint
    gamma = _copy(tiny_checkpoint, tmp_path / "other", "gamma")
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    argv = ["backtest", "--checkpoint", str(models), "--checkpoint", str(default_metadata_path(gamma))]
    argv += ["--data", str(data), "--output", str(tmp_path / "run"), "--n-windows", "2", "--no-progress"]

    assert cli.main([*argv, "--actors", "1"]) == 0

    # Logged at INFO: the command's stderr ("... INFO distributed_onnx.model.checkpoint: --checkpoint ...").
    took = [message for message in caplog.messages if message.startswith("checkpoint folder")]
    assert took == [f"checkpoint folder {models}: took alpha.onnx", f"checkpoint folder {models}: took beta.onnx"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    metrics = pq.read_table(tmp_path / "run" / "metrics.parquet")
    assert {"alpha", "beta", "gamma"} <= set(metrics["model"].to_pylist()), summary


@pytest.mark.integration
def test_inspect_takes_the_metadata_file_as_its_checkpoint(
    tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    assert cli.main(["inspect", str(default_metadata_path(tiny_checkpoint.weights_path))]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"] == str(tiny_checkpoint.weights_path)


def test_an_empty_folder_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "orphan.onnx").write_bytes(b"")
    for extra in (["backtest", "--output", str(tmp_path / "run")], ["serve"]):
        code = cli.main([*extra, "--checkpoint", str(tmp_path / "models")])
        err = capsys.readouterr().err
        assert code == 2, err
        line = [one for one in err.splitlines() if one.startswith("error: ")]
        assert len(line) == 1 and f"the folder {tmp_path / 'models'} holds no checkpoint" in line[0], err
