"""Moirai 2, built from uni2ts's own classes, exported, backtested through the CLI, equal to its pipeline.

A small random-weight ``Moirai2Module`` (``export --random-weights --size tiny``'s config: patches of 8, two
patches per model call, context 64) is exported with ``distributed-onnx export moirai2 --horizon 40`` (five
patches: three model calls, the autoregressive quantile rule inside the graph), backtested through the CLI on data
with gaps (NaN), and compared with upstream's own ``Moirai2Forecast.predict`` on the same windows (the entry point
uni2ts's README uses: it marks NaN unobserved, imputes, pads and calls ``forward``; no gluonts predictor).

Integration tier: real ONNX Runtime sessions, the shared local Ray; the model is exported once per module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("uni2ts.model.moirai2")

from backtest_data import read_forecasts  # noqa: E402
from families import (  # noqa: E402, F401 (data, root, series: the shared module fixtures)
    LEVELS,
    RESOLUTION_MINUTES,
    WINDOWS,
    data,
    forecast_block,
    gappy_series,
    root,
    series,
    window_contexts,
    write_gappy_dataset,
)

from distributed_onnx import cli  # noqa: E402
from distributed_onnx.export.random_weights import MOIRAI2, write_moirai2  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]

CONTEXT = 64  # the tiny model's patches x half its max_seq_len (distributed_onnx/export/moirai2.py, context_length_of)
PATCH, PER_CALL = 8, 2
assert (MOIRAI2["tiny"]["patch_size"], MOIRAI2["tiny"]["num_predict_token"]) == (PATCH, PER_CALL)
assert PATCH * (MOIRAI2["tiny"]["max_seq_len"] // 2) == CONTEXT
LONGEST = PATCH * (MOIRAI2["tiny"]["max_seq_len"] - CONTEXT // PATCH)  # the patches beside the context's
HORIZON = 5 * PATCH  # three model calls (2 + 2 + 1 patches), all inside the graph


@pytest.fixture(scope="module")
def moirai(root: Path) -> tuple[Path, Any]:
    from uni2ts.model.moirai2 import Moirai2Module

    pretrained = write_moirai2(root / "pretrained", "tiny")
    output = root / "moirai2" / "moirai2.onnx"
    argv = ["export", "moirai2", "--from-pretrained", str(pretrained), "--output", str(output)]
    argv += ["--horizon", str(HORIZON), "--parity-windows", "4", "--resolution-minutes", str(RESOLUTION_MINUTES)]
    assert cli.main(argv) == 0
    return output, Moirai2Module.from_pretrained(str(pretrained)).eval()


def _predict(module: Any, contexts: np.ndarray, horizon: int) -> np.ndarray:
    """``Moirai2Forecast.predict`` on each window's context: ``[W, horizon, quantiles]``."""
    from uni2ts.model.moirai2 import Moirai2Forecast

    forecast = Moirai2Forecast(
        prediction_length=horizon,
        target_dim=1,
        feat_dynamic_real_dim=0,
        past_feat_dynamic_real_dim=0,
        context_length=CONTEXT,
        module=module,
    ).eval()
    return np.asarray(forecast.predict([row.copy() for row in contexts])).transpose(0, 2, 1)


def _backtest(weights: Path, data: Path, output: Path, horizon: int) -> int:
    argv = ["backtest", "--data", str(data), "--output", str(output), "--checkpoint", str(weights), *WINDOWS]
    return cli.main([*argv, "--horizon", str(horizon)])


def test_export_writes_external_data_metadata_and_parity(moirai: tuple[Path, Any]) -> None:
    weights, _ = moirai
    assert weights.with_suffix(".onnx.data").stat().st_size > 0  # the weights, outside the protobuf
    metadata = json.loads(weights.with_suffix(".metadata.json").read_text())
    assert (metadata["model_family"], metadata["missing_value"]) == ("moirai2", "nan")
    assert (metadata["output_layout"], metadata["long_horizon"]) == ("quantile_step", "refuse")
    assert (metadata["context_length"], metadata["output_patch_size"], metadata["horizon_patches"]) == (64, 8, 5)
    assert "3 model calls" in metadata["description"]
    parity = json.loads(weights.with_suffix(".parity.json").read_text())
    assert parity["horizon"] == HORIZON and parity["missing_values"] > 0 and parity["passed"]
    assert parity["max_rel_diff"] < 1e-5, parity


def test_backtest_equals_moirai2_forecast_predict(
    moirai: tuple[Path, Any], data: Path, series: dict[str, np.ndarray], tmp_path: Path
) -> None:
    weights, module = moirai
    assert _backtest(weights, data, tmp_path / "run", HORIZON) == 0
    forecasts = read_forecasts(tmp_path / "run")
    windows = window_contexts(series, forecasts, CONTEXT)
    assert np.isnan(windows["context"]).any() and len(windows["window_ids"]) == 9

    ours = forecast_block(forecasts, windows["window_ids"], HORIZON, LEVELS)
    theirs = _predict(module, windows["context"], HORIZON)
    scale = float(np.abs(theirs).max())
    assert np.abs(ours - theirs).max() <= 1e-5 * scale, np.abs(ours - theirs).max()  # 3.1e-5 of 160 seen
    # A shorter horizon is the graph's first steps: predict asked for 20 steps (two calls) gives the same.
    shorter = _predict(module, windows["context"], 20)
    assert np.abs(ours[:, :20] - shorter).max() <= 1e-5 * scale


def test_each_model_call_projects_only_the_token_it_reads(moirai: tuple[Path, Any], tmp_path: Path) -> None:
    """Each of the graph's three model calls reads one token's prediction; upstream's module projects every token
    through its head, and runs the horizon's tokens not yet predicted through its layers. ONNX Runtime's profile:
    the head's products ran on one token per path, and the layers on the tokens up to the one read."""
    from profiles import product_outputs, tokens_through

    weights, _ = moirai
    windows = np.stack([gappy_series()[name][-CONTEXT:] for name in ("a", "b")]).astype(np.float32)
    shapes = product_outputs(weights, {"context": windows}, tmp_path)
    levels = len(MOIRAI2["tiny"]["quantile_levels"])
    head = tokens_through(shapes, PER_CALL * levels * PATCH, rows=2)
    # The head's output layer and its residual layer, once per call: the first on one path, the next on 9 paths.
    assert sorted(head) == [1, 1, levels, levels, levels, levels], shapes
    # The layers' feed-forward (d_ff): the context's tokens on the first call, then one or two calls' more.
    context_tokens, d_ff = CONTEXT // PATCH, MOIRAI2["tiny"]["d_ff"]
    assert min(tokens_through(shapes, d_ff, rows=2)) == context_tokens, shapes


def test_a_horizon_beyond_the_exported_one_is_refused_in_one_line(
    moirai: tuple[Path, Any], data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights, _ = moirai
    capsys.readouterr()
    assert _backtest(weights, data, tmp_path / "run", HORIZON + 1) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "export moirai2 --horizon" in err, err
    assert not list((tmp_path / "run").glob("forecasts/*/part-*.parquet"))


def test_a_folder_that_is_not_moirai2_is_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{not json")
    argv = ["export", "moirai2", "--from-pretrained", str(tmp_path), "--output", str(tmp_path / "m.onnx")]
    assert cli.main([*argv, "--resolution-minutes", "60"]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert f"--from-pretrained {tmp_path} cannot be exported as Moirai 2" in error, error
    assert not (tmp_path / "m.onnx").exists()


def test_covariates_are_refused_in_one_line(
    moirai: tuple[Path, Any], data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The graph takes the target alone (upstream's covariate variates are not exported): refused before any part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data)
    with_temp = tmp_path / "with-temp.parquet"
    pq.write_table(table.append_column("temp", pa.array(np.linspace(0.0, 1.0, table.num_rows))), with_temp)
    capsys.readouterr()
    argv = ["backtest", "--data", str(with_temp), "--output", str(tmp_path / "cov"), "--checkpoint", str(moirai[0])]
    assert cli.main([*argv, *WINDOWS, "--horizon", str(PATCH), "--covariates", "temp"]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "model_family 'moirai2' takes no covariates" in error, error
    assert not list((tmp_path / "cov").glob("forecasts/*/part-*.parquet"))


def test_random_weights_without_horizon_export_one_call_and_pass_their_parity(moirai2_random_export: Path) -> None:
    """Without ``--horizon`` the graph is one model call, and the parity compares at that horizon (the shared
    default, two calls, is beyond what the graph answers: the export failed its own parity). The export is the
    session's ``export moirai2 --random-weights --size tiny`` (tests/families.py), which its fixture asserts
    exited 0."""
    output = moirai2_random_export
    metadata = json.loads(output.with_suffix(".metadata.json").read_text())
    assert (metadata["horizon_patches"], metadata["long_horizon"]) == (PER_CALL, "refuse")
    assert metadata["description"].startswith("random weights: forecasts are meaningless")
    parity = json.loads(output.with_suffix(".parity.json").read_text())
    assert (parity["horizon"], parity["passed"]) == (PER_CALL * PATCH, True), parity


def test_a_horizon_beyond_the_model_s_sequence_is_refused_in_seconds_naming_the_longest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--horizon 100000`` (within the settings' bound) sat in tracing for minutes, memory growing, and a kill
    left its temporary folder; now it is refused before anything is traced, naming the longest horizon and why."""
    import time

    output = tmp_path / "moirai2.onnx"
    argv = ["export", "moirai2", "--random-weights", "--size", "tiny", "--output", str(output)]
    started = time.monotonic()
    assert cli.main([*argv, "--horizon", "100000", "--resolution-minutes", "60"]) == 2
    assert time.monotonic() - started < 30  # building the tiny model and refusing: no tracing
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "--horizon 100000 needs 12500 patches of 8 steps" in error, error
    assert f"max_seq_len 16 tokens (its config's longest input sequence), 8 of them the context's {CONTEXT}" in error
    assert f"export with --horizon {LONGEST} or less" in error, error
    assert not output.exists()


def test_an_export_killed_by_sigterm_removes_its_temporary_folder(tmp_path: Path) -> None:
    """SIGTERM while an export traces: before, the process died where it was and left its temporary folder (the
    built model's weights) behind; now the folder is removed and the command ends with exit 130, one line."""
    import os
    import signal
    import subprocess
    import sys

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(root)}
    argv = ["export", "moirai2", "--random-weights", "--size", "tiny", "--horizon", str(LONGEST)]
    argv += ["--resolution-minutes", "60", "--output", str(tmp_path / "moirai2.onnx")]
    command = [sys.executable, "-m", "distributed_onnx", *argv]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "export: tracing and exporting the graph" in line:
            assert list(scratch.glob("distributed-onnx-random-*")), "the model was built in its temporary folder"
            process.send_signal(signal.SIGTERM)
            break
    rest = process.communicate(timeout=120)[1]
    errors = [line for line in [*lines, *rest.splitlines()] if line.startswith("error:")]
    assert process.returncode == 130, (process.returncode, "".join(lines) + rest)
    assert errors == ["error: interrupted by SIGTERM; the export's temporary files were removed"], errors
    assert not list(scratch.iterdir())
