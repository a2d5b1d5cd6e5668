"""Chronos-Bolt and TiRex, built from their upstream packages, exported, backtested, equal to their pipelines.

Each family's model is a small random-weight one built from the package's own classes (tests/families.py),
exported with ``distributed-onnx export``, backtested through the CLI on data with gaps (NaN) and a horizon
longer than one call, and compared with the upstream pipeline's own forecasts on the same windows
(``ChronosBoltPipeline.predict``, ``TiRexZero.forecast``). Then the three families side by side in one run.

Integration tier: real ONNX Runtime sessions, the shared local Ray; the models are exported once per session
(tests/families.py's session fixtures, shared with the families' own modules).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("chronos")
pytest.importorskip("tirex")

from backtest_data import read_forecasts  # noqa: E402
from families import (  # noqa: E402, F401 (data, root, series: the shared module fixtures)
    BOLT_STEPS,
    LEVELS,
    RESOLUTION_MINUTES,
    TIREX_STEPS,
    WINDOWS,
    data,
    forecast_block,
    gappy_series,
    root,
    series,
    window_contexts,
    write_gappy_dataset,
)
from graphs import write_tiny_upstream_chronos2  # noqa: E402

from distributed_onnx import cli  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]

BOLT_HORIZON = BOLT_STEPS + BOLT_STEPS // 2  # two calls, the second cut
TIREX_HORIZON = 2 * TIREX_STEPS + TIREX_STEPS // 2  # three calls
#: The families added after the first three, exported here with ``--random-weights --size tiny``.
LATER_FAMILIES = ("moirai2", "toto", "timesfm")


@pytest.fixture(scope="module")
def bolt(bolt_export: Path, tiny_bolt_pretrained: Path) -> tuple[Path, Any]:
    """The session's Chronos-Bolt export (with its dynamic int8 variant, tests/families.py) and its pipeline."""
    from chronos import ChronosBoltPipeline

    return bolt_export, ChronosBoltPipeline.from_pretrained(str(tiny_bolt_pretrained), local_files_only=True)


@pytest.fixture(scope="module")
def tirex(tirex_export: Path, tiny_tirex_pretrained: Path) -> tuple[Path, Any]:
    """The session's TiRex export (with its dynamic int8 variant, tests/families.py) and upstream's model."""
    from tirex.models.tirex import TiRexZero

    checkpoint = str(tiny_tirex_pretrained / "model.ckpt")
    return tirex_export, TiRexZero.from_pretrained(checkpoint, backend="torch", device="cpu").eval()


def _backtest(checkpoints: list[Path], data: Path, output: Path, *flags: str) -> int:
    argv = ["backtest", "--data", str(data), "--output", str(output), *WINDOWS, *flags]
    for checkpoint in checkpoints:
        argv += ["--checkpoint", str(checkpoint)]
    return cli.main(argv)


def _assert_equal_to_upstream(ours: np.ndarray, theirs: np.ndarray) -> None:
    scale = float(np.abs(theirs).max())
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * scale)


def test_exports_write_external_data_metadata_and_parity(bolt: tuple[Path, Any], tirex: tuple[Path, Any]) -> None:
    for weights, family, layout, unroll in (
        (bolt[0], "chronos_bolt", "quantile_step", "quantile_paths"),
        (tirex[0], "tirex", "step_quantile", "append_missing"),
    ):
        assert weights.with_suffix(".onnx.data").stat().st_size > 0  # the weights, outside the protobuf
        metadata = json.loads(weights.with_suffix(".metadata.json").read_text())
        assert (metadata["model_family"], metadata["missing_value"]) == (family, "nan")
        assert (metadata["output_layout"], metadata["long_horizon"]) == (layout, unroll)
        parity = json.loads(weights.with_suffix(".parity.json").read_text())
        assert parity["calls"] == 2 and parity["missing_values"] > 0
        assert parity["max_rel_diff"] < 1e-5, parity


def test_chronos_bolt_backtest_equals_its_pipeline(
    bolt: tuple[Path, Any], data: Path, series: dict[str, np.ndarray], tmp_path: Path
) -> None:
    weights, pipeline = bolt
    assert _backtest([weights], data, tmp_path / "run", "--horizon", str(BOLT_HORIZON)) == 0
    forecasts = read_forecasts(tmp_path / "run")
    windows = window_contexts(series, forecasts, pipeline.model_context_length)
    assert np.isnan(windows["context"]).any() and len(windows["window_ids"]) == 9

    with torch.no_grad():
        predicted = pipeline.predict(torch.from_numpy(windows["context"]), prediction_length=BOLT_HORIZON)
    theirs = predicted.numpy().transpose(0, 2, 1)  # [W, Q, H] -> [W, H, Q]
    _assert_equal_to_upstream(forecast_block(forecasts, windows["window_ids"], BOLT_HORIZON, LEVELS), theirs)


def test_tirex_backtest_equals_its_forecast(
    tirex: tuple[Path, Any], data: Path, series: dict[str, np.ndarray], tmp_path: Path
) -> None:
    weights, model = tirex
    assert _backtest([weights], data, tmp_path / "run", "--horizon", str(TIREX_HORIZON)) == 0
    forecasts = read_forecasts(tmp_path / "run")
    windows = window_contexts(series, forecasts, model.config.train_ctx_len)
    assert np.isnan(windows["context"]).any()

    theirs, _ = model.forecast(torch.from_numpy(windows["context"]), prediction_length=TIREX_HORIZON)
    ours = forecast_block(forecasts, windows["window_ids"], TIREX_HORIZON, LEVELS)
    _assert_equal_to_upstream(ours, theirs.numpy())


def test_a_graph_disagreeing_with_its_metadata_is_refused_before_any_part(
    tirex: tuple[Path, Any], data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights, _ = tirex
    copy = tmp_path / "wrong" / "tirex.onnx"
    shutil.copytree(weights.parent, copy.parent)
    metadata_path = copy.with_suffix(".metadata.json")
    metadata = json.loads(metadata_path.read_text())
    metadata["output_layout"] = "quantile_step"  # the graph answers [rows, steps, quantiles]
    metadata_path.write_text(json.dumps(metadata))

    capsys.readouterr()
    assert _backtest([copy], data, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "output_layout 'quantile_step'" in err and "[rows, 9, 8]" in err, err
    assert not list((tmp_path / "run").glob("forecasts/*/part-*.parquet"))


@pytest.fixture(scope="module")
def later(moirai2_random_export: Path, toto_export: Path, timesfm_export: Path) -> dict[str, Path]:
    """:data:`LATER_FAMILIES`, each the session's export of its tiny model with its static int8 variant
    (tests/families.py: Moirai 2 ``--random-weights``, Toto and TimesFM ``--from-pretrained``)."""
    return {"moirai2": moirai2_random_export, "toto": toto_export, "timesfm": timesfm_export}


def test_the_int8_variant_of_every_exported_family_quantizes_runs_and_stays_near_its_parent(
    bolt: tuple[Path, Any], tirex: tuple[Path, Any], later: dict[str, Path]
) -> None:
    """Issue 52 (5): ``export --quantize int8`` for every family whose record declares it (Chronos-2's, both
    modes, in tests/test_chronos2_pipeline.py): here dynamic for Chronos-Bolt and TiRex, static for the others.
    Each variant is a quantized graph (integer MatMuls) whose metadata names its parent by identity, and its
    forecasts moved, within the variant tolerance."""
    import onnx

    from distributed_onnx.export.variants import VARIANT_TOLERANCE
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.model.families import family as declared
    from distributed_onnx.model.identity import identity_of

    exported = {"chronos_bolt": (bolt[0], "dynamic"), "tirex": (tirex[0], "dynamic")}
    exported |= {family: (path, "static") for family, path in later.items()}
    for family, (parent, mode) in exported.items():
        assert mode in declared(family).int8.modes
        variant = parent.with_name(f"{parent.stem}-int8.onnx")
        metadata = json.loads(variant.with_suffix(".metadata.json").read_text())
        assert metadata["precision"] == "int8" and metadata["quantization"]["mode"] == mode, family
        assert metadata["parent"]["identity"] == identity_of(LocalCheckpoint(path=parent).resolve()).record()
        report = json.loads(variant.with_suffix(".parity.json").read_text())
        assert report["passed"] is True and report["tolerance"] == VARIANT_TOLERANCE, (family, report)
        assert 0 < report["max_rel_diff"] <= VARIANT_TOLERANCE, (family, report)  # moved: something was quantized
        ops = {node.op_type for node in onnx.load(variant, load_external_data=False).graph.node}
        assert ops & {"MatMulInteger", "QuantizeLinear", "DynamicQuantizeLinear"}, (family, sorted(ops))


def test_tune_weighs_a_real_int8_variant_and_says_why(bolt: tuple[Path, Any], tmp_path: Path) -> None:
    """``tune`` finds Chronos-Bolt's int8 variant beside it, runs the report's accuracy verdict on the data's windows
    and writes its choice with the reason (which one wins is this CPU's and these random weights' business)."""
    from distributed_onnx.resources import REFERENCE_DATASET

    tuned = tmp_path / "tune.json"
    argv = ["tune", str(bolt[0]), "--data", str(REFERENCE_DATASET), "--budget-s", "2", "--cpus", "2"]
    assert cli.main([*argv, "--output", str(tuned)]) == 0
    document = json.loads(tuned.read_text())
    [weighed] = document["variants"]["weighed"]
    verdict = weighed["verdict"]
    assert (verdict["variant"], verdict["parent"]) == ("bolt-int8", "bolt") and verdict["n"] >= 8
    assert verdict["quantization"]["mode"] == "dynamic" and verdict["differs"] in (True, False)
    choice = document["choice"]
    assert choice["parent"] == "bolt" and choice["chosen"] in ("bolt", "bolt-int8")
    assert choice["reason"].startswith("fp32 kept: " if choice["chosen"] == "bolt" else "int8 chosen: ")
    assert "Diebold-Mariano p " in choice["reason"] and document["machine"]["cpu"]["flags"] is not None


def test_six_families_side_by_side_on_one_leaderboard(
    bolt: tuple[Path, Any], tirex: tuple[Path, Any], later: dict[str, Path], data: Path, tmp_path: Path
) -> None:
    """The leaderboard's families in one run: Chronos-2, Chronos-Bolt, TiRex, Moirai 2, Toto and TimesFM 2.5
    (each built from its upstream package's classes, tiny, random weights) scored on the same pairs."""
    checkpoints = {
        "chronos2": write_tiny_upstream_chronos2(tmp_path, name="chronos2").weights_path,
        "bolt": bolt[0],
        "tirex": tirex[0],
        **later,
    }
    output = tmp_path / "run"
    flags = ["--context-length", "16", "--horizon", str(TIREX_STEPS), "--quantiles", "0.1,0.5,0.9"]
    assert _backtest(list(checkpoints.values()), data, output, *flags) == 0

    summary = json.loads((output / "summary.json").read_text())
    scored = {name: summary["pairs"][name]["pairs_scored"] for name in checkpoints}
    assert len(set(scored.values())) == 1 and next(iter(scored.values())) > 0, scored  # the same pairs for all
    board = pq.read_table(output / "leaderboard.parquet")
    ranked = set(board.filter(pc.field("kind") == "metric").column("model").to_pylist())
    assert set(checkpoints) <= ranked
    for name in checkpoints:
        forecasts = read_forecasts(output, name)
        assert forecasts.num_rows == 9 * TIREX_STEPS
        assert not np.isnan(forecasts["q0.5"].to_numpy(zero_copy_only=False)).any()
