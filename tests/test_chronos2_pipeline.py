"""Chronos-2 as its own pipeline takes it: exported by ``distributed-onnx export chronos2``, backtested through the
CLI, equal to upstream's ``Chronos2Pipeline.predict_df`` on the same windows.

A small seeded random-weight model is built from chronos-forecasting's own classes (``Chronos2Model``,
``Chronos2CoreConfig``: nothing is downloaded; ``export --random-weights --size tiny``'s model), saved with
``save_pretrained`` and exported once per module for HORIZON, with its dynamic int8 variant beside it, and once
for another horizon, with its static int8 variant; the export at the defaults is the session's random-weights one
(tests/families.py), of the same weights.
The data has gaps in the target (NaN rows), a numeric known-future covariate, a numeric past-only one, a text
day type (with nulls) and a bool holiday flag, and a per-series region for ``--group-by``. Each window's
reference is ``predict_df`` on that window's own ``df`` (its context rows) and ``future_df`` (its horizon's
known-future values): for past-only and categorical covariates exactly what upstream would be given.

Integration tier: real ONNX Runtime sessions and the shared local Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("ray")
chronos = pytest.importorskip("chronos")
pd = pytest.importorskip("pandas")
torch = pytest.importorskip("torch")

from backtest_data import read_forecasts  # noqa: E402

from distributed_onnx import cli  # noqa: E402
from distributed_onnx.export.random_weights import CHRONOS2  # noqa: E402

pytestmark = pytest.mark.integration

CONTEXT, PATCH, PATCHES = 64, 16, 2
HORIZON = PATCH * PATCHES
#: The model's max_output_patches (its default prediction length is MAX_PATCHES x PATCH steps); the module's
#: checkpoint is exported for HORIZON, i.e. PATCHES of them, as upstream computes a HORIZON-step forecast.
MAX_PATCHES = 5
assert (CHRONOS2["tiny"]["chronos_config"]["context_length"], CHRONOS2["tiny"]["chronos_config"]["patch"]) == (
    CONTEXT,
    PATCH,
)
assert CHRONOS2["tiny"]["chronos_config"]["max_output_patches"] == MAX_PATCHES
LEVELS = [0.1, 0.5, 0.9]
N_SERIES, LENGTH = 6, 160
REGIONS = ["north", "north", "north", "south", "south", "north"]
WINDOW_FLAGS = ["--n-windows", "3", "--stride", "16", "--quantiles", "0.1,0.5,0.9", "--no-progress"]
START = pd.Timestamp("2024-01-01 00:00")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chronos2")


@pytest.fixture(scope="module")
def frame() -> Any:
    """The long table as pandas (naive UTC timestamps, as predict_df wants them)."""
    rng = np.random.default_rng(7)
    steps = np.arange(LENGTH)
    rows = []
    for index in range(N_SERIES):
        y = 50.0 + 10 * index + 8 * np.sin(2 * np.pi * steps / 24) + np.cumsum(rng.normal(0, 1, LENGTH))
        y[rng.random(LENGTH) < 0.06] = np.nan  # gaps in the target
        temp = 15 + 5 * np.sin(2 * np.pi * (steps + index) / 24) + rng.normal(0, 1, LENGTH)
        lagged = np.roll(y, 1) + rng.normal(0, 0.5, LENGTH)
        daytype = np.array(["work", "weekend", "bridge"], dtype=object)[(steps // 24 + index) % 3]
        daytype[rng.random(LENGTH) < 0.05] = None
        holiday = (steps // 24) % 5 == index % 5
        rows.append(
            pd.DataFrame(
                {
                    "series_id": f"s{index}",
                    "timestamp": START + pd.to_timedelta(steps, unit="h"),
                    "y": y,
                    "temp": temp,
                    "lagged": lagged,
                    "daytype": daytype,
                    "holiday": holiday,
                    "region": REGIONS[index],
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def data(frame: Any, workdir: Path) -> Path:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    utc = pa.timestamp("us", tz="UTC")
    table = table.set_column(1, "timestamp", table["timestamp"].cast(pa.timestamp("us")).cast(utc))
    path = workdir / "data.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def pipeline(workdir: Path) -> Any:
    """``export --random-weights --size tiny``'s Chronos-2 (``Chronos2Model`` of ``Chronos2CoreConfig``, seeded),
    saved by ``save_pretrained``: the same weights as the session's random-weights export (tests/families.py)."""
    from chronos.chronos2.pipeline import Chronos2Pipeline

    from distributed_onnx.export.random_weights import write_chronos2

    write_chronos2(workdir / "pretrained", "tiny")
    return Chronos2Pipeline.from_pretrained(str(workdir / "pretrained"))


@pytest.fixture(scope="module")
def exported(pipeline: Any, workdir: Path, data: Path) -> tuple[Path, str]:
    """The module's checkpoint, exported for HORIZON with its dynamic int8 variant beside it (one export serves
    the forecasts' tests and the dynamic variant's), and what the export printed on stdout. Read-only."""
    import contextlib
    import io

    output = workdir / "export" / "chronos2-tiny.onnx"
    argv = ["export", "chronos2", "--from-pretrained", str(workdir / "pretrained"), "--output", str(output)]
    argv += ["--data", str(data), "--parity-windows", "6", "--horizon", str(HORIZON)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert cli.main([*argv, "--quantize", "int8", "--quantize-mode", "dynamic"]) == 0
    return output, printed.getvalue()


@pytest.fixture(scope="module")
def checkpoint(exported: tuple[Path, str]) -> Path:
    return exported[0]


#: The patches of the module's second export (:func:`sized_static`): a horizon other than HORIZON's.
SIZED_PATCHES = 4


@pytest.fixture(scope="module")
def sized_static(pipeline: Any, workdir: Path, data: Path) -> tuple[Path, str]:
    """The module's second checkpoint, exported for SIZED_PATCHES patches with its static int8 variant beside it:
    one export for the test of an export sized to its horizon (the parent) and the static variant's test. What
    the export printed on stdout. Read-only. (``pipeline`` wrote the pretrained folder it exports.)"""
    import contextlib
    import io

    output = workdir / f"sized-{SIZED_PATCHES}-int8-static" / "chronos2-tiny.onnx"
    argv = ["export", "chronos2", "--from-pretrained", str(workdir / "pretrained"), "--output", str(output)]
    argv += ["--data", str(data), "--parity-windows", "6", "--horizon", str(SIZED_PATCHES * PATCH)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert cli.main([*argv, "--quantize", "int8", "--quantize-mode", "static"]) == 0
    return output, printed.getvalue()


def backtest(checkpoint: Path, data: Path, output: Path, *flags: str) -> pa.Table:
    argv = ["backtest", "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(output)]
    assert cli.main([*argv, *WINDOW_FLAGS, *flags]) == 0
    return read_forecasts(output)


def forecasts_by_window(table: pa.Table) -> dict[tuple[str, pd.Timestamp], np.ndarray]:
    """(series, origin) -> ``[H, levels]``."""
    frame = table.to_pandas()
    frame["origin"] = frame["origin"].dt.tz_convert(None)
    out = {}
    for (series_id, origin), rows in frame.groupby(["series_id", "origin"]):
        ordered = rows.sort_values("lead")
        out[(series_id, origin)] = ordered[[f"q{level:g}" for level in LEVELS]].to_numpy()
    return out


def upstream_forecasts(
    pipeline: Any,
    frame: Any,
    windows: list[tuple[str, Any]],
    *,
    known: list[str],
    past: list[str],
    cross_learning: bool = False,
    horizon: int = HORIZON,
) -> dict[tuple[str, Any], np.ndarray]:
    """``predict_df`` on each window's own df (its context rows) and future_df, one item per window."""
    dfs, futures = [], []
    for number, (series_id, origin) in enumerate(windows):
        rows = frame[frame["series_id"] == series_id].set_index("timestamp")
        history = rows.loc[origin - pd.Timedelta(hours=CONTEXT) : origin - pd.Timedelta(hours=1)]
        future = rows.loc[origin : origin + pd.Timedelta(hours=horizon - 1)]
        item = f"w{number:04d}"
        dfs.append(history.reset_index()[["timestamp", "y", *past, *known]].assign(item_id=item))
        futures.append(future.reset_index()[["timestamp", *known]].assign(item_id=item))
    result = pipeline.predict_df(
        pd.concat(dfs, ignore_index=True),
        future_df=pd.concat(futures, ignore_index=True) if known else None,
        target="y",
        prediction_length=horizon,
        quantile_levels=LEVELS,
        batch_size=1024,
        cross_learning=cross_learning,
    )
    out = {}
    for number, window in enumerate(windows):
        rows = result[result["item_id"] == f"w{number:04d}"].sort_values("timestamp")
        out[window] = rows[[str(level) for level in LEVELS]].to_numpy()
    return out


def assert_equal_to_upstream(got: dict[Any, np.ndarray], want: dict[Any, np.ndarray]) -> float:
    assert set(got) == set(want)
    worst = 0.0
    for window, values in got.items():
        np.testing.assert_allclose(values, want[window], rtol=1e-5, atol=1e-5, err_msg=str(window))
        worst = max(worst, float(np.abs(values - want[window]).max()))
    return worst


CASES = {
    "target only": ([], []),
    "known-future": (["--covariates", "temp"], []),
    "past-only and categorical": (
        ["--covariates", "temp,daytype", "--past-covariates", "lagged,holiday"],
        ["lagged", "holiday"],
    ),
}


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("case", list(CASES))
def test_backtest_equals_predict_df(
    case: str, checkpoint: Path, data: Path, pipeline: Any, frame: Any, workdir: Path
) -> None:
    flags, past = CASES[case]
    known = [name for name in (flags[1].split(",") if flags[:1] == ["--covariates"] else [])]
    got = forecasts_by_window(backtest(checkpoint, data, workdir / f"run-{case.replace(' ', '-')}", *flags))
    assert len(got) == N_SERIES * 3

    want = upstream_forecasts(pipeline, frame, sorted(got), known=known, past=past)

    assert_equal_to_upstream(got, want)


@pytest.fixture(scope="module")
def default_export(chronos2_random_export: Path) -> Path:
    """Exported as a user first does, without ``--horizon``: up to the model's default prediction length (the
    session's ``export chronos2 --random-weights --size tiny``, tests/families.py: :func:`pipeline`'s weights)."""
    import json

    metadata = json.loads(chronos2_random_export.with_suffix(".metadata.json").read_text())
    assert (metadata["horizon_patches"], metadata["short_horizon"]) == (MAX_PATCHES, "output_patches")
    return chronos2_random_export


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("horizon", [PATCH, 2 * PATCH + 5, MAX_PATCHES * PATCH])
def test_one_export_forecasts_every_horizon_as_predict_df_does(
    horizon: int, default_export: Path, pipeline: Any, data: Path, frame: Any, workdir: Path
) -> None:
    """``predict_df(prediction_length=H)`` runs the model with ``ceil(H / 16)`` output patches, which attend to
    each other, so its forecast is not the first H steps of a longer one. The graph takes the patch count from
    ``future_covariates``' width and the runner sends the patches H spans: a backtest at each horizon, of the
    one checkpoint exported at the defaults, equals ``predict_df`` at that horizon (1 patch, 3 cut within the
    last, all 5)."""
    got = forecasts_by_window(
        backtest(default_export, data, workdir / f"run-default-{horizon}", "--horizon", str(horizon))
    )
    want = upstream_forecasts(pipeline, frame, sorted(got), known=[], past=[], horizon=horizon)

    assert_equal_to_upstream(got, want)
    if horizon < MAX_PATCHES * PATCH:  # what a cut of the longest forecast gives instead: far from upstream's
        longest = upstream_forecasts(pipeline, frame, sorted(got), known=[], past=[], horizon=MAX_PATCHES * PATCH)
        assert max(float(np.abs(longest[w][:horizon] - want[w]).max()) for w in want) > 1e-3


@pytest.mark.usefixtures("ray_session")
def test_export_sized_to_the_horizon_equals_predict_df(
    sized_static: tuple[Path, str], pipeline: Any, data: Path, frame: Any, workdir: Path
) -> None:
    """A graph exported for a horizon (``--horizon``) says so (``horizon_patches``, the longest a run may ask)
    and forecasts what ``predict_df`` does at that horizon (:func:`sized_static`'s parent)."""
    import json

    patches = SIZED_PATCHES
    horizon = patches * PATCH
    output, _ = sized_static
    assert json.loads(output.with_suffix(".metadata.json").read_text())["horizon_patches"] == patches

    got = forecasts_by_window(backtest(output, data, workdir / f"run-sized-{patches}", "--horizon", str(horizon)))
    want = upstream_forecasts(pipeline, frame, sorted(got), known=[], past=[], horizon=horizon)

    assert_equal_to_upstream(got, want)


@pytest.mark.usefixtures("pipeline")
def test_export_beyond_the_models_patches_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = workdir / "too-long" / "chronos2-tiny.onnx"
    argv = ["export", "chronos2", "--from-pretrained", str(workdir / "pretrained"), "--output", str(output)]
    assert cli.main([*argv, "--horizon", str(MAX_PATCHES * PATCH + 1), "--resolution-minutes", "60"]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # not the loading bars
    assert len(error) == 1 and f"--horizon {MAX_PATCHES * PATCH} or less" in error[0], error
    assert not output.exists()


def test_second_session_loads_the_cached_optimized_graph(
    checkpoint: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first CPU session saves its optimized graph (weights as external data), the second loads it
    unoptimized; both forecast bit for bit what a session that optimizes the graph itself does."""
    import logging

    from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    monkeypatch.setenv("DISTRIBUTED_ONNX_CACHE", str(tmp_path / "cache"))
    windows = np.random.default_rng(3).normal(50.0, 5.0, (5, CONTEXT)).astype(np.float32)
    windows[1, :20] = np.nan

    def forecast(**options: Any) -> np.ndarray:
        config = WorkerConfig(
            checkpoint=checkpoint, providers=[CpuProvider()], session_options=SessionOptionsConfig(**options)
        )
        worker = InferenceWorker.from_config(config)
        try:
            return worker.forecast(windows, HORIZON, LEVELS)
        finally:
            worker.close()

    uncached = forecast(cache_optimized_graph=False)
    assert not (tmp_path / "cache").exists()
    with caplog.at_level(logging.INFO, logger="distributed_onnx.model.backend.onnx"):
        first = forecast()
        (folder,) = (tmp_path / "cache" / "optimized-graphs").iterdir()
        assert {path.name for path in folder.iterdir()} == {"model.onnx", "model.onnx.data"}
        assert "optimized (ENABLE_EXTENDED) and cached" in caplog.text
        caplog.clear()
        second = forecast()
    assert f"loaded its optimized graph from {folder / 'model.onnx'}" in caplog.text
    assert len(list((tmp_path / "cache" / "optimized-graphs").iterdir())) == 1  # no second copy, no staging left
    assert np.array_equal(first, uncached) and np.array_equal(second, uncached)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_int8_variant_names_its_parent_and_stays_near_it(
    mode: str, request: pytest.FixtureRequest, pipeline: Any
) -> None:
    """The dynamic variant is the module checkpoint's (:func:`exported`, the export command with ``--quantize int8
    --quantize-mode dynamic``, for HORIZON); the static one :func:`sized_static`'s (``--quantize-mode static``,
    for SIZED_PATCHES patches), beside its own parent."""
    import json

    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    output, printed = request.getfixturevalue("exported" if mode == "dynamic" else "sized_static")
    horizon = HORIZON if mode == "dynamic" else SIZED_PATCHES * PATCH
    assert f"chronos2-tiny-int8.onnx (int8, {mode})" in printed

    variant = output.with_name("chronos2-tiny-int8.onnx")
    parent_metadata = json.loads(output.with_suffix(".metadata.json").read_text())
    metadata = json.loads(variant.with_suffix(".metadata.json").read_text())
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.model.identity import identity_of

    identity = identity_of(LocalCheckpoint(path=output).resolve()).record()  # the parent's, its fields and graph
    assert metadata["parent"] == {"name": "chronos2-tiny", "sha256": parent_metadata["sha256"], "identity": identity}
    assert metadata["quantization"]["mode"] == mode and metadata["quantization"]["weight_type"] == "int8"
    assert metadata["precision"] == "int8" and metadata["horizon_patches"] == parent_metadata["horizon_patches"]
    comparison = json.loads(variant.with_suffix(".parity.json").read_text())
    assert (comparison["parent"], comparison["variant"]) == ("chronos2-tiny", "chronos2-tiny-int8")
    assert comparison["windows"] == 6 and comparison["horizon"] == horizon
    # int8 moves the forecasts (a variant equal to its parent would mean nothing was quantized), but not far.
    assert 0.0 < comparison["max_rel_diff"] < 0.5, comparison
    windows = np.random.default_rng(5).normal(60.0, 8.0, (4, CONTEXT)).astype(np.float32)
    windows[0, :30] = np.nan
    forecasts = []
    for checkpoint in (output, variant):
        worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint, providers=[CpuProvider()]))
        forecasts.append(worker.forecast(windows, horizon, LEVELS))
        worker.close()
    parent, int8 = forecasts
    assert not np.array_equal(parent, int8)  # it is a different graph
    assert float(np.abs(int8 - parent).max()) < 0.1 * float(np.abs(parent).max())


@pytest.mark.usefixtures("pipeline")
def test_static_int8_without_data_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = workdir / "int8-no-data" / "chronos2-tiny.onnx"
    argv = ["export", "chronos2", "--from-pretrained", str(workdir / "pretrained"), "--output", str(output)]
    assert cli.main([*argv, "--quantize", "int8", "--quantize-mode", "static"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: --quantize-mode static") and "--data" in error[0], error
    assert not output.exists()


def test_export_restores_upstream_and_reports_parity(checkpoint: Path) -> None:
    import json

    from chronos.chronos2 import layers
    from chronos.chronos2 import model as upstream

    from distributed_onnx.export.chronos2 import _float_group_time_mask, _prepare_patched_future_unchecked

    assert upstream.Chronos2Model._prepare_patched_future is not _prepare_patched_future_unchecked
    assert upstream.Chronos2Encoder._construct_and_invert_group_time_mask is not _float_group_time_mask
    assert layers.GroupSelfAttention.forward.__module__ == "chronos.chronos2.layers"
    assert checkpoint.with_name(checkpoint.name + ".data").is_file()  # weights as external data
    parity = json.loads(checkpoint.with_suffix(".parity.json").read_text())
    assert parity["windows"] == 6 and parity["max_rel_diff"] < 1e-4, parity


# ------------------------------------------------------------------------------------- univariate: own row

#: The tiny model's shape (the ``pipeline`` fixture): layers, d_model, heads x d_kv.
LAYERS, D_MODEL, HEADS, D_KV = 2, 64, 4, 16


def gappy_windows() -> np.ndarray:
    """Univariate windows with every kind of masked time step: leading NaN, a NaN run inside, a short series
    (NaN-padded on the left), a NaN at the end, and one fully observed."""
    rng = np.random.default_rng(11)
    windows = (40 + np.cumsum(rng.normal(0, 1, (5, CONTEXT)), axis=1)).astype(np.float32)
    windows[0, :20] = np.nan
    windows[1, 30:41] = np.nan
    windows[2, : CONTEXT - 9] = np.nan
    windows[3, -3:] = np.nan
    return windows


def test_univariate_gappy_windows_equal_upstream_predict(checkpoint: Path, pipeline: Any) -> None:
    """Every row its own group: the graph's group attention is ``o(v(LN(h)))`` (no query has another key). A
    masked time step has no key at all, where upstream averages the batch's values; nothing attends a masked
    token, so the forecasts still equal upstream's, gaps and all."""
    from distributed_onnx.export.chronos2 import _upstream_forecast
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    windows = gappy_windows()
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint))
    try:
        got = worker.forecast(windows, HORIZON, worker.metadata.native_quantiles)
    finally:
        worker.close()
    want = _upstream_forecast(pipeline)(windows, HORIZON)

    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def matmul_macs(checkpoint: Path, windows: np.ndarray, group_ids: np.ndarray) -> int:
    """MatMul/Gemm multiply-adds of one ORT call, from its profiler: each node's output elements x its first
    input's last dimension (benchmarks/roofline.py ``window_macs``'s count)."""
    import json
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(str(checkpoint), options, providers=["CPUExecutionProvider"])
        feeds = {
            "context": windows,
            "group_ids": group_ids.astype(np.int64),
            "attention_mask": np.isfinite(windows).astype(np.float32),
            "future_covariates": np.full((windows.shape[0], HORIZON), np.nan, np.float32),
        }
        session.run(None, feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    total = 0
    for event in trace:
        args = event.get("args", {})
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if args.get("op_name") in {"MatMul", "Gemm", "FusedMatMul", "FusedGemm"}:
            first = next(iter(args["input_type_shape"][0].values()))
            output = next(iter(args["output_type_shape"][0].values()))
            total += int(np.prod(output)) * int(first[-1])
    return total


def test_univariate_call_skips_the_group_attentions_arithmetic(checkpoint: Path) -> None:
    """The graph branches (one ONNX ``If`` per block): rows in groups of their own skip the group attention's
    q and k projections and its attention, and do v then o as one folded d_model x d_model product."""
    import onnx

    graph = onnx.load(str(checkpoint), load_external_data=False).graph
    assert sum(node.op_type == "If" for node in graph.node) == LAYERS

    windows = gappy_windows()[:4]
    solo = matmul_macs(checkpoint, windows, np.arange(4))
    shared = matmul_macs(checkpoint, windows, np.array([0, 0, 1, 1]))

    rows, inner = windows.shape[0], HEADS * D_KV
    tokens = rows * (CONTEXT // PATCH + 1 + PATCHES)  # the context patches, REG, the output patches
    # Per token and block: q, k, v, o (4 d x inner) and the attention over the batch (2 x rows x inner) become
    # one d x d product.
    saved = 4 * D_MODEL * inner + 2 * rows * inner - D_MODEL * D_MODEL
    assert shared - solo == LAYERS * tokens * saved, (shared, solo)


# --------------------------------------------------------------------------------------------- --group-by

GROUP_FLAGS = ["--covariates", "temp", "--group-by", "region", "--max-group-size", "2"]
#: The groups --max-group-size 2 makes of the regions, in series order: north's four series split in two.
GROUPS = [["s0", "s1"], ["s2", "s5"], ["s3", "s4"]]


@pytest.mark.usefixtures("ray_session")
def test_group_by_equals_cross_learning_and_depends_on_nothing_else(
    checkpoint: Path, data: Path, pipeline: Any, frame: Any, workdir: Path
) -> None:
    first = workdir / "group-2-actors"
    two_actors = backtest(checkpoint, data, first, *GROUP_FLAGS, "--actors", "2", "--rows-per-batch", "4")
    one_actor = backtest(
        checkpoint,
        data,
        workdir / "group-1-actor",
        *GROUP_FLAGS,
        "--actors",
        "1",
        "--rows-per-batch",
        "64",
        "--windows-per-part",
        "2",
    )
    parts = sorted((first / "forecasts" / f"model={checkpoint.stem}").glob("part-*.parquet"))
    assert len(parts) > 2
    parts[1].unlink()  # an interrupted run: one part's forecasts and sums are missing
    next((first / "scores").glob("part-000001.*")).unlink()
    resumed = backtest(checkpoint, data, first, *GROUP_FLAGS, "--actors", "2", "--rows-per-batch", "4")

    got = forecasts_by_window(two_actors)
    for other in (one_actor, resumed):  # bit for bit
        again = forecasts_by_window(other)
        assert set(again) == set(got)
        for window, values in got.items():
            assert np.array_equal(values, again[window]), window
    origins = sorted({origin for _, origin in got})
    pair = [(series_id, origins[0]) for series_id in GROUPS[0]]
    alone = upstream_forecasts(pipeline, frame, pair, known=["temp"], past=[])
    # The group changed the forecasts, by far more than the equality's tolerance below.
    assert max(float(np.abs(got[w] - alone[w]).max()) for w in pair) > 2e-3
    for members in GROUPS:
        for origin in origins:
            windows = [(series_id, origin) for series_id in members]
            want = upstream_forecasts(pipeline, frame, windows, known=["temp"], past=[], cross_learning=True)
            assert_equal_to_upstream({w: got[w] for w in windows}, want)


@pytest.mark.usefixtures("ray_session")
def test_horizon_beyond_the_graph_is_refused_in_one_line(
    checkpoint: Path, data: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["backtest", "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(workdir / "long")]
    assert cli.main([*argv, *WINDOW_FLAGS, "--horizon", str(HORIZON + PATCH)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"checkpoint emits ({HORIZON} =" in error[0], error
    assert "distributed-onnx export chronos2 --horizon STEPS" in error[0], error
