"""Comparisons that hold: every model of a run on the same pairs, several checkpoints in one pass, fev's numbers.

Integration tier (real ORT sessions on tiny graphs; the Ray tests use the shared local Ray). A panel with gaps
(the shared test data: missing values and absent rows) makes the seasonal naive undefined on some pairs, which
is where comparisons used to go wrong.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import dense_series, long_table, merged_sums, run_parts_in_process, settings_for
from graphs import write_season_copy, write_tiny_chronos2, write_tiny_chronos2_nan

from distributed_onnx import cli
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.location import Location

pytestmark = pytest.mark.integration


@pytest.fixture
def integer_data(tmp_path: Path) -> Path:
    """The shared panel with gaps, rounded to integers: float32 contexts then hold the actuals exactly."""
    table = long_table(dense_series(0), covariate=False)
    y = pc.round(table["y"])
    path = tmp_path / "panel.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", y), path)
    return path


def _merged(settings: object) -> tuple[object, PairScores]:
    plan = run_parts_in_process(settings)  # type: ignore[arg-type]
    sums = merged_sums(plan)
    return plan, sums.merged()


def test_every_model_has_the_same_n_and_a_naive_copy_has_skill_zero(tmp_path: Path, integer_data: Path) -> None:
    tiny = write_tiny_chronos2(tmp_path, "tiny").weights_path
    copy = write_season_copy(tmp_path).weights_path
    settings = settings_for(tiny, integer_data, tmp_path / "run", seasonality=8, n_windows=6, stride=2)
    settings = settings.model_copy(update={"checkpoint": [tiny, copy]})
    plan, scores = _merged(settings)
    table = scores.to_table()
    assert set(table["model"].to_pylist()) == {"tiny", "season_copy", *BASELINES}
    n_by_key: dict[tuple[object, ...], set[int]] = defaultdict(set)
    for row in table.filter(pc.field("convention") != "count").to_pylist():
        n_by_key[(row["scope"], row["series_id"], row["lead"], row["metric"], row["quantile"], row["convention"])].add(
            row["n"]
        )
        n_by_key[("models", row["scope"], row["series_id"], row["lead"], row["metric"], row["quantile"])].add(
            hash(row["model"])
        )
    same_n = {key: ns for key, ns in n_by_key.items() if key[0] != "models"}
    assert all(len(ns) == 1 for ns in same_n.values()), {k: v for k, v in same_n.items() if len(v) > 1}
    models_per_row = [ns for key, ns in n_by_key.items() if key[0] == "models"]
    assert all(len(ns) == 4 for ns in models_per_row)  # every scope has a row of every model
    assert scores.excluded["baseline_undefined"] > 0  # the gaps matter here
    board = leaderboard(scores, plan.step_us)  # type: ignore[attr-defined]
    skill = {
        (row["model"], row["metric"]): row["value"]
        for row in board.filter(pc.field("kind") == "skill").to_pylist()
        if row["versus"] == "seasonal_naive"
    }
    versus_quantiles = board.filter((pc.field("kind") == "skill") & (pc.field("versus") == "seasonal_quantiles"))
    assert set(versus_quantiles["metric"].to_pylist()) == {"sql", "wql"}
    _check_report(tmp_path, scores, board, plan)
    assert abs(skill[("season_copy", "mase")]) < 1e-9
    assert abs(skill[("seasonal_naive", "mase")]) < 1e-9
    assert skill[("tiny", "mase")] != pytest.approx(0.0, abs=1e-3)
    # forecasts/ is one dataset, as it is, with the model as a column.
    rows = plan.windows.planned * plan.spec.horizon  # type: ignore[attr-defined]
    import pandas as pd

    frame = pd.read_parquet(Path(settings.output) / "forecasts")
    assert len(frame) == 2 * rows
    assert sorted(frame["model"].astype(str).unique()) == ["season_copy", "tiny"]
    dataset = ds.dataset(Path(settings.output) / "forecasts", partitioning="hive").to_table()
    assert dataset.num_rows == 2 * rows
    assert pc.count_distinct(dataset["model"]).as_py() == 2


def _check_report(tmp_path: Path, scores: PairScores, board: pa.Table, plan: object) -> None:
    """The report compares: its first section is the leaderboard of every model, intervals and conventions named."""
    from distributed_onnx.evaluation.report.page import write_report

    summary = {"model": "tiny", "models": {"tiny": {}, "season_copy": {}}, "pairs": scores.left_out()}
    page = Path(write_report(Location(tmp_path), summary, scores.to_table(), [0.1, 0.5, 0.9], [], board)).read_text()
    first = page.index("<h2>")
    assert page[first:].startswith("<h2>Leaderboard</h2>")
    for text in ("season_copy", "seasonal_quantiles", "fev skill", "pooled [95%]", "Diebold-Mariano", "seed 123"):
        assert text in page, text
    assert "MASE skill by lead, every model" in page
    assert "left out baseline undefined" in page


def test_two_checkpoints_in_one_run_equal_two_single_runs(tmp_path: Path, integer_data: Path) -> None:
    tiny = write_tiny_chronos2(tmp_path, "tiny").weights_path
    copy = write_season_copy(tmp_path).weights_path
    common = {"seasonality": 8, "n_windows": 6, "stride": 2}
    both = settings_for(tiny, integer_data, tmp_path / "both", **common).model_copy(update={"checkpoint": [tiny, copy]})
    _, together = _merged(both)
    for path, name in ((tiny, "tiny"), (copy, "season_copy")):
        _, alone = _merged(settings_for(path, integer_data, tmp_path / name, **common))
        # Both checkpoints are finite everywhere, so the common pairs are those of each single run.
        joint = together.to_table().filter(pc.field("model") != ("season_copy" if name == "tiny" else "tiny"))
        assert joint.equals(alone.to_table()), name


def _fev_window_scores(
    values: dict[str, np.ndarray], origin: int, actual: np.ndarray, forecast: np.ndarray, m: int, quantiles: list[float]
) -> dict[str, float]:
    import fev.metrics as fm

    names = sorted(values)
    y_past = np.concatenate([values[name][:origin] for name in names])[:, None]
    lengths = np.asarray([origin] * len(names))
    median = quantiles.index(0.5)
    arguments = {
        "y_true": actual[:, :, None],
        "y_pred": forecast[:, :, median][:, :, None],
        "y_past": y_past,
        "y_past_lengths": lengths,
        "q_pred": forecast[:, :, None, :],
        "seasonality": m,
        "quantile_levels": quantiles,
    }
    return {
        name.lower(): metric().compute(**arguments)
        for name, metric in (("MAE", fm.MAE), ("RMSE", fm.RMSE), ("MASE", fm.MASE), ("SQL", fm.SQL), ("WQL", fm.WQL))
    }


def test_the_fev_convention_equals_fev_itself_on_a_panel_with_gaps() -> None:
    rng = np.random.default_rng(3)
    m, horizon, quantiles = 4, 6, [0.1, 0.5, 0.9]
    series = {f"s{i}": 50.0 + 10 * np.sin(np.arange(80) / 3) + rng.normal(0, 2, 80) for i in range(3)}
    for i, values in enumerate(series.values()):
        values[rng.choice(80, size=10 + i, replace=False)] = np.nan  # gaps in history and in targets
    origins = [40, 46, 52, 58, 64]
    scores = PairScores(["model", *BASELINES], quantiles, horizon)
    expected: dict[str, list[float]] = defaultdict(list)
    for origin in origins:
        ids = np.asarray(sorted(series))
        actual = np.stack([series[name][origin : origin + horizon] for name in ids])
        forecast = actual[:, :, None] + rng.normal(0, 3, (len(ids), horizon, len(quantiles))) + [-2.0, 0.0, 2.0]
        forecast = np.sort(forecast, axis=2)
        naive = np.stack([series[name][origin - m : origin][np.arange(horizon) % m] for name in ids])
        baselines = {name: np.repeat(naive[:, :, None], len(quantiles), axis=2) for name in BASELINES}
        scale = np.asarray([SeasonalScaler(series[name], m).scales([origin])[0] for name in ids])
        valid = scores.update(
            ids, np.full(len(ids), origin, dtype=np.int64), ids, actual, {"model": forecast, **baselines}, scale
        )
        for metric, value in _fev_window_scores(
            series, origin, np.where(valid, actual, np.nan), forecast, m, quantiles
        ).items():
            expected[metric].append(value)
    ours = {metric: value for metric, value, _ in scores.windows["model"].rows()}
    assert scores.excluded["actual_missing"] > 0 and scores.excluded["baseline_undefined"] > 0
    for metric in ("mae", "rmse", "mase", "sql", "wql"):
        assert ours[metric] == pytest.approx(float(np.mean(expected[metric])), rel=1e-9, abs=1e-12), metric


@pytest.mark.usefixtures("ray_session")
def test_nan_windows_fail_the_run_and_adding_a_checkpoint_computes_only_it(
    tmp_path: Path, integer_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = write_tiny_chronos2(tmp_path, "tiny").weights_path
    copy = write_season_copy(tmp_path).weights_path
    output = tmp_path / "run"
    base = ["backtest", "--data", str(integer_data), "--output", str(output), "--seasonality", "8"]
    base += ["--n-windows", "6", "--stride", "2", "--actors", "2", "--rows-per-batch", "4", "--no-progress"]
    base += ["--quantiles", "0.1,0.5,0.9"]
    assert cli.main([*base, "--checkpoint", str(tiny), "--checkpoint", str(copy)]) == 0, capsys.readouterr().err
    first = json.loads((output / "summary.json").read_text())
    n_parts = first["parts"]["planned"]
    assert first["parts"]["computed_by_model"] == {"tiny": n_parts, "season_copy": n_parts}
    before = pq.read_table(output / "metrics.parquet")
    page = (output / "report.html").read_text()
    assert page.index("<h2>Leaderboard</h2>") < page.index("<h2>Forecasts</h2>")
    for name in ("season_copy", "seasonal_naive", "seasonal_quantiles"):  # every model on the same fan windows
        assert f"{name} median" in page, name

    # A third, finite checkpoint: only its forecasts are computed; the others' numbers do not move.
    twin = write_tiny_chronos2(tmp_path, "twin").weights_path
    argv = [*base, "--checkpoint", str(tiny), "--checkpoint", str(copy), "--checkpoint", str(twin)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    second = json.loads((output / "summary.json").read_text())
    assert second["parts"]["computed_by_model"] == {"twin": n_parts}
    after = pq.read_table(output / "metrics.parquet")
    assert after.filter(pc.field("model") != "twin").equals(before)
    board = pq.read_table(output / "leaderboard.parquet")  # the newcomer joins the leaderboard of all three
    ranked = set(board.filter(pc.field("kind") == "metric").column("model").to_pylist())
    assert {"twin", "season_copy"} <= ranked

    # A fourth that emits NaN on the windows of series b and c (levels above 150): exit 1 with one line, the
    # windows listed, every model rescored on the pairs that remain, only the newcomer computed.
    write_tiny_chronos2_nan(tmp_path, threshold=150.0, name="broken")
    capsys.readouterr()
    code = cli.main([*argv, "--checkpoint", str(tmp_path / "broken.onnx")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: ") and "\n" not in err and "non-finite" in err
    listed = json.loads((output / "nonfinite_windows.json").read_text())
    forecasts = pq.read_table(output / "forecasts" / "model=broken")
    bad = forecasts.filter(pc.is_nan(forecasts["q0.5"]))
    assert sorted(set(bad["window_id"].to_pylist())) == sorted(listed["broken"])
    assert set(bad["series_id"].to_pylist()) == {"b", "c"}
    third = json.loads((output / "summary.json").read_text())
    assert third["parts"]["computed_by_model"] == {"broken": n_parts}
    assert third["pairs"]["broken"]["nonfinite_windows"] == len(listed["broken"])
    metrics = pq.read_table(output / "metrics.parquet")
    global_mae = metrics.filter(
        (pc.field("scope") == "global") & (pc.field("metric") == "mae") & (pc.field("convention") == "pooled")
    ).to_pylist()
    assert len({row["n"] for row in global_mae}) == 1 and len(global_mae) == 6
    old_n = before.filter((pc.field("scope") == "global") & (pc.field("metric") == "mae")).to_pylist()[0]["n"]
    assert global_mae[0]["n"] < old_n
    assert global_mae[0]["n"] == third["pairs"]["tiny"]["pairs_scored"]
    assert third["pairs"]["tiny"]["left_out_model_nonfinite"] > 0


def test_different_grids_are_refused_with_one_line(tmp_path: Path, integer_data: Path) -> None:
    from distributed_onnx.errors import ConfigError
    from distributed_onnx.evaluation.planning import prepare

    tiny = write_tiny_chronos2(tmp_path, "tiny").weights_path
    wide = write_tiny_chronos2(tmp_path, "wide", context_length=32).weights_path
    settings = settings_for(tiny, integer_data, tmp_path / "run").model_copy(update={"checkpoint": [tiny, wide]})
    with pytest.raises(ConfigError, match="different context lengths"):
        prepare(settings)
    twice = settings.model_copy(update={"checkpoint": [tiny, tiny]})
    with pytest.raises(ConfigError, match="distinct file stems"):
        prepare(twice)
    assert pa is not None


def test_the_bootstrap_drawn_in_chunks_gives_the_one_draw_leaderboard(
    tmp_path: Path, integer_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resamples drawn and applied a few rows at a time (bounded memory) give the leaderboard of one [B, S] draw."""
    from distributed_onnx.evaluation.scoring import leaderboard as leaderboard_module

    tiny = write_tiny_chronos2(tmp_path, "tiny").weights_path
    plan, scores = _merged(settings_for(tiny, integer_data, tmp_path / "run", seasonality=8, n_windows=6, stride=2))
    monkeypatch.setattr(leaderboard_module, "RESAMPLE_CHUNK", 1000)  # every resample at once
    at_once = leaderboard(scores, plan.step_us)  # type: ignore[attr-defined]
    monkeypatch.setattr(leaderboard_module, "RESAMPLE_CHUNK", 7)  # a chunk size that does not divide 1000
    chunked = leaderboard(scores, plan.step_us)  # type: ignore[attr-defined]

    assert chunked.num_rows == at_once.num_rows > 0
    assert np.isfinite(chunked["ci_low"].to_numpy(zero_copy_only=False)).any()
    for name in chunked.column_names:
        a, b = chunked[name].to_numpy(zero_copy_only=False), at_once[name].to_numpy(zero_copy_only=False)
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert a.tolist() == b.tolist(), name
