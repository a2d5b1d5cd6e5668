"""TimesFM 2.5, built from the ``timesfm`` package's own classes, exported, backtested, equal to its ``forecast``.

A small random-weight model (``export --random-weights --size tiny``'s: ``TimesFM_2p5_200M_torch_module`` built from
a small ``TimesFM_2p5_200M_Definition`` set as its class attribute, saved by ``save_pretrained``) is exported
through the CLI (``--random-weights --size tiny``, the session's export of tests/families.py) at a horizon of two
output patches (the autoregressive decode step in the graph), backtested through the CLI on data with gaps (leading,
scattered and a run of NaN), and compared with upstream's own ``compile`` + ``forecast`` on the same windows. A
horizon beyond the exported one is refused in one line.

Integration tier: real ONNX Runtime sessions, the shared local Ray; the model is exported once per session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("ray")
pytest.importorskip("torch")
timesfm = pytest.importorskip("timesfm")

from backtest_data import read_forecasts  # noqa: E402
from families import (  # noqa: E402, F401 (data, root, series: the shared module fixtures)
    LEVELS,
    TIMESFM_HORIZON,
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
from distributed_onnx.export.random_weights import TIMESFM  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]

CONTEXT = TIMESFM["tiny"]["forecast_config"]["max_context"]
PATCH = TIMESFM["tiny"]["sizes"]["output_patch_len"]
HORIZON = PATCH + PATCH // 2  # two output patches decoded in the graph, the second cut
assert HORIZON == TIMESFM_HORIZON  # the session's export (tests/families.py) is traced for it
#: TimesFM README's ``ForecastConfig`` (the export's default flags), at the tiny context and this horizon.
FORECAST = {
    "max_context": CONTEXT,
    "max_horizon": HORIZON,
    "normalize_inputs": True,
    "use_continuous_quantile_head": True,
    "force_flip_invariance": True,
    "infer_is_positive": True,
    "fix_quantile_crossing": True,
}


@pytest.fixture(scope="module")
def pretrained(timesfm_pretrained: Path) -> Path:
    """The session's tiny TimesFM 2.5 folder written by ``write_timesfm`` (tests/families.py; read-only)."""
    return timesfm_pretrained


@pytest.fixture(scope="module")
def exported(timesfm_export: Path, pretrained: Path) -> tuple[Path, Any]:
    """The session's ``export timesfm --from-pretrained`` of :func:`pretrained` at ``--horizon 24``
    (tests/families.py), and upstream's own model loaded from the same folder, compiled as the graph was."""
    from distributed_onnx.export.timesfm import load_model

    model = load_model(pretrained)  # the package's classes, its class-attribute config set to the tiny one
    model.compile(timesfm.ForecastConfig(**FORECAST, per_core_batch_size=4))
    return timesfm_export, model


def _backtest(checkpoint: Path, data: Path, output: Path, *flags: str) -> int:
    argv = ["backtest", "--data", str(data), "--output", str(output), "--checkpoint", str(checkpoint)]
    return cli.main([*argv, *WINDOWS, *flags])


def test_export_writes_the_contract_and_a_passing_parity(exported: tuple[Path, Any]) -> None:
    weights, _ = exported
    assert weights.with_suffix(".onnx.data").stat().st_size > 0
    metadata = json.loads(weights.with_suffix(".metadata.json").read_text())
    assert (metadata["model_family"], metadata["missing_value"], metadata["output_layout"]) == (
        "timesfm",
        "nan",
        "step_quantile",
    )
    assert (metadata["long_horizon"], metadata["context_length"]) == ("refuse", CONTEXT)
    assert metadata["output_patch_size"] * metadata["horizon_patches"] == 2 * PATCH  # rounded up to whole patches
    assert "force_flip_invariance True" in metadata["description"]
    parity = json.loads(weights.with_suffix(".parity.json").read_text())
    assert parity["passed"] and parity["missing_values"] > 0 and parity["horizon"] == HORIZON
    assert parity["max_rel_diff"] < 1e-5, parity


def test_backtest_equals_upstream_forecast_on_gappy_windows(
    exported: tuple[Path, Any], pretrained: Path, data: Path, series: dict[str, np.ndarray], tmp_path: Path
) -> None:
    weights, model = exported
    assert _backtest(weights, data, tmp_path / "run", "--horizon", str(HORIZON)) == 0
    forecasts = read_forecasts(tmp_path / "run")
    windows = window_contexts(series, forecasts, CONTEXT)
    context = windows["context"]
    assert np.isnan(context).any() and len(windows["window_ids"]) == 9
    assert np.isnan(context[:, 0]).any()  # a window with leading NaN (a short series): masked, as upstream strips

    _, quantiles = model.forecast(horizon=HORIZON, inputs=list(context))  # [W, H, mean + 9 levels]
    theirs = np.asarray(quantiles)[..., 1:]
    ours = forecast_block(forecasts, windows["window_ids"], HORIZON, LEVELS)
    # Measured: max abs diff 3.05e-5 on values up to 178.5 (two float32 ulps: sums in another order).
    assert float(np.abs(ours - theirs).max()) < 1e-4

    # A shorter horizon is the graph's first steps (the family's short_horizon 'first_steps'): upstream compiled
    # for one output patch only, as for a run of half a patch, forecasts those steps (its decode is causal).
    from distributed_onnx.export.timesfm import load_model

    shorter = load_model(pretrained)
    shorter.compile(timesfm.ForecastConfig(**(FORECAST | {"max_horizon": PATCH}), per_core_batch_size=4))
    _, first = shorter.forecast(horizon=PATCH // 2, inputs=list(context))
    assert float(np.abs(ours[:, : PATCH // 2] - np.asarray(first)[..., 1:]).max()) < 1e-4


def test_a_shorter_horizon_decodes_only_its_patches(
    exported: tuple[Path, Any], pretrained: Path, tmp_path: Path
) -> None:
    """A run of one output patch on the graph of two: upstream's forecast for that horizon, and the graph's
    autoregressive step not run at all (its layers' products absent from ONNX Runtime's profile of the call)."""
    import onnxruntime as ort

    from distributed_onnx.export.timesfm import load_model
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    weights, _ = exported
    metadata = json.loads(weights.with_suffix(".metadata.json").read_text())
    assert metadata["input_names"] == ["context", "num_output_patches"]
    assert metadata["short_horizon"] == "output_patches" and metadata["horizon_patches"] == 2

    windows = np.stack([gappy_series()[name][-CONTEXT:] for name in ("a", "b")]).astype(np.float32)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=weights, providers=[CpuProvider()]))
    try:
        ours = worker.forecast(windows, PATCH // 2, LEVELS)
    finally:
        worker.close()
    shorter = load_model(pretrained)
    shorter.compile(timesfm.ForecastConfig(**(FORECAST | {"max_horizon": PATCH}), per_core_batch_size=4))
    _, theirs = shorter.forecast(horizon=PATCH // 2, inputs=list(windows))
    assert float(np.abs(ours - np.asarray(theirs)[..., 1:]).max()) < 1e-4

    def products(patches: int, folder: Path) -> int:
        options = ort.SessionOptions()
        options.enable_profiling, options.profile_file_prefix = True, str(folder / f"profile-{patches}")
        session = ort.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])
        out = session.run(None, {"context": windows, "num_output_patches": np.array(patches, dtype=np.int64)})[0]
        assert out.shape == (2, patches * PATCH, len(LEVELS))
        trace = json.loads(Path(session.end_profiling()).read_text())
        return sum(1 for e in trace if e.get("cat") == "Node" and e["args"].get("op_name") == "MatMul")

    one, two = products(1, tmp_path), products(2, tmp_path)  # the profiles: not in the shared export's folder
    layers = TIMESFM["tiny"]["sizes"]["num_layers"]
    assert two - one >= 4 * layers, (one, two)  # the step's attention and feed-forward products, per layer


def test_a_horizon_beyond_the_export_is_refused_in_one_line(
    exported: tuple[Path, Any], data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights, _ = exported
    capsys.readouterr()
    assert _backtest(weights, data, tmp_path / "run", "--horizon", str(2 * PATCH + 1)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "export timesfm --horizon" in err, err
    assert not list((tmp_path / "run").glob("forecasts/*/part-*.parquet"))


def test_the_graphs_nan_handling_is_forecasts_host_side() -> None:
    """``_prepared`` (traced into the graph) against upstream's ``strip_leading_nans`` + ``linear_interpolation``
    and ``forecast``'s padding, on windows with leading, inner, trailing and single values."""
    import torch
    from timesfm.timesfm_2p5.timesfm_2p5_base import linear_interpolation, strip_leading_nans

    from distributed_onnx.export.timesfm import _prepared

    rng = np.random.default_rng(1)
    width = 40
    windows = rng.normal(100.0, 30.0, (8, width)).astype(np.float32)
    windows[rng.random(windows.shape) < 0.3] = np.nan
    windows[1, :25] = np.nan  # leading
    windows[2, -6:] = np.nan  # trailing: the last value repeated
    windows[3, :] = np.nan
    windows[3, 17] = 5.0  # one value
    windows[4, 10:30] = np.nan  # a long run
    values, masks = _prepared(torch.from_numpy(windows))
    for row, window in enumerate(windows):
        kept = linear_interpolation(strip_leading_nans(window.copy()))
        expected = np.pad(kept, (width - kept.size, 0))
        np.testing.assert_array_equal(values[row].numpy(), expected)
        assert masks[row].numpy().tolist() == [True] * (width - kept.size) + [False] * kept.size
    # A window without any value: upstream's forecast raises on it (numpy's truth value of an empty array); the
    # graph forecasts from zeros, unmasked, what upstream's fallback in linear_interpolation meant to give.
    values, masks = _prepared(torch.full((1, width), float("nan")))
    assert not values.any() and not masks.any()


def test_a_folder_without_weights_and_a_horizon_beyond_the_quantile_head_are_refused(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["export", "timesfm", "--output", str(tmp_path / "m.onnx"), "--resolution-minutes", "30"]
    empty = tmp_path / "empty"
    empty.mkdir()
    spread = TIMESFM["tiny"]["sizes"]["output_quantile_len"]
    for argv, expected in (
        ([*base, "--from-pretrained", str(empty)], "holds no model.safetensors"),
        ([*base, "--from-pretrained", str(pretrained), "--horizon", str(spread + 1)], "continuous quantile head"),
    ):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and expected in err, err
    assert not (tmp_path / "m.onnx").exists()


def test_a_window_without_any_value_forecasts_beside_the_others(exported: tuple[Path, Any]) -> None:
    """A context all NaN (a gap longer than the context) in a batch: the other rows' forecasts stay upstream's, and
    that row's is finite (the graph's gather once went out of range on it, failing the whole batch)."""
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    weights, model = exported
    series = gappy_series()["a"][-CONTEXT:].astype(np.float32)
    windows = np.stack([np.full(CONTEXT, np.nan, dtype=np.float32), series])
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=weights, providers=[CpuProvider()]))
    try:
        ours = worker.forecast(windows, HORIZON, LEVELS)  # [W, H, levels]
    finally:
        worker.close()
    assert np.isfinite(ours).all()
    _, quantiles = model.forecast(horizon=HORIZON, inputs=[series])
    assert float(np.abs(ours[1] - np.asarray(quantiles)[0, :, 1:]).max()) < 1e-4


def test_a_v2_infer_call_of_fewer_patches_is_logged_at_the_horizon_it_computed(
    exported: tuple[Path, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A KServe v2 call sending ``num_output_patches`` 1 to the graph of two: the forecast log gets its windows at
    the one patch the graph computed (the worker's forecast for that horizon), not nothing. The session is not
    built from a cached optimized graph that ORT cannot load (its ``If`` subgraphs): no warning at every start."""
    from distributed_onnx.errors import InputValidationError
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
    from distributed_onnx.serve.log.infer_windows import infer_windows, served_request

    weights, _ = exported
    windows = np.stack([gappy_series()[name][-CONTEXT:] for name in ("a", "b")]).astype(np.float32)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=weights, providers=[CpuProvider()]))
    try:
        inputs = {"context": windows, "num_output_patches": np.array(1, dtype=np.int64)}
        worker.adapter.check_tensors(inputs)
        placed = infer_windows(worker.adapter, worker.metadata, inputs, {"series_ids": "a,b"})
        served = served_request(placed, worker.metadata, worker.backend.run(inputs), worker.adapter_of)
        native = tuple(worker.metadata.native_quantiles)
        expected = worker.forecast(windows, PATCH, native)
    finally:
        worker.close()
    assert "does not load" not in caplog.text  # the export's session found the saved graph unloadable, once
    assert served is not None, "the answered call was not logged"
    request, forecasts, levels = served
    assert levels == native and request.horizon == PATCH and forecasts.shape == (2, PATCH, len(native))
    assert [series.series_id for series in request.series] == ["a", "b"]
    np.testing.assert_allclose(forecasts, expected, rtol=1e-5, atol=1e-6)
    # a count the graph would clamp (0 answers no steps; 3 or -1 another count than asked) is the client's error
    for wrong in (0, -1, 3):
        with pytest.raises(InputValidationError, match=r"num_output_patches must be one whole number from 1 to"):
            worker.adapter.check_tensors({"context": windows, "num_output_patches": np.array(wrong, dtype=np.int64)})
