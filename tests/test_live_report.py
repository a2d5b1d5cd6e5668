"""``score`` writes the backtest's report for live scoring, and ``--backtest`` sets live against backtest skill.

Integration tier: one real backtest of two tiny checkpoints (real ORT sessions, the shared local Ray), whose
forecasts are logged through the forecast log's writer as a service would have answered them (``tiny`` served,
``season_copy`` its shadow, one window id each): live then equals the backtest on the same origins, and a model
made worse (its logged forecasts shifted) must be flagged. Unit tests: a directory that is not a backtest's
output, and the leaderboard's interval where no series has a scored pair.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from backtest_data import QUANTILES, dense_series, long_table, read_forecasts
from conftest import start_test_ray
from graphs import write_season_copy, write_tiny_chronos2
from test_cli_refusals import run_cli
from test_live_score import _assert_same_metrics

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError, NotABacktestError
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.live.log.layout import LoggedForecast
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.live.score.versus_backtest import BacktestRun, compare
from distributed_onnx.location import Location

STEP_MIN = 30
REQUEST_TIME_US = 1_796_083_200_000_000  # 2026-12-01T00:00:00Z
MODELS = ("tiny", "season_copy")


@pytest.fixture(scope="module")
def backtest_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A finished backtest (through the CLI) of two tiny checkpoints on the shared panel: (its data, its output)."""
    pytest.importorskip("ray")
    pytest.importorskip("onnxruntime")
    start_test_ray()  # what the shared ray_session fixture does, at module scope
    root = tmp_path_factory.mktemp("live_report")
    table = long_table(dense_series(0), covariate=False)
    data = root / "panel.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pc.round(table["y"])), data)
    tiny = write_tiny_chronos2(root, "tiny").weights_path
    copy = write_season_copy(root).weights_path
    output = root / "backtest"
    argv = ["backtest", "--data", str(data), "--output", str(output), "--seasonality", "8", "--n-windows", "6"]
    argv += ["--stride", "2", "--actors", "2", "--rows-per-batch", "4", "--no-progress", "--quantiles", "0.1,0.5,0.9"]
    assert cli.main([*argv, "--checkpoint", str(tiny), "--checkpoint", str(copy)]) == 0
    yield data, output


def _log_backtest(
    output: Path, log_dir: Path, shift: dict[str, float] | None = None, context_length: int = 0, **extra_models: str
) -> int:
    """Each backtest window logged as one request: ``tiny`` served, ``season_copy`` its shadow (same window id).

    ``shift`` adds a constant to a model's logged forecasts (a worse model under the same name); ``extra_models``
    logs another name with a backtest model's forecasts (``newcomer="tiny"``); ``context_length`` is the
    checkpoints' as serve records it (0: not recorded, as in a log written before it was). Returns the windows
    logged.
    """
    log = ForecastLog(log_dir, flush_interval_s=60.0)
    names = {**{model: model for model in MODELS}, **extra_models}
    n_windows = 0
    for name, source in names.items():
        forecasts = read_forecasts(output, source)
        horizon = int(pc.max(forecasts["lead"]).as_py())
        n_windows = forecasts.num_rows // horizon
        series = forecasts["series_id"].to_pylist()[::horizon]
        origins = forecasts["origin"].cast(pa.int64()).to_pylist()[::horizon]
        values = np.stack([forecasts[f"q{format(q, 'g')}"].to_numpy() for q in QUANTILES], axis=-1)
        values = values.reshape(n_windows, horizon, len(QUANTILES)) + (shift or {}).get(name, 0.0)
        for w in range(n_windows):
            assert log.submit(
                LoggedForecast(
                    model=name,
                    checkpoint_sha256="0" * 64,
                    role="served" if name == "tiny" else "shadow",
                    request_id=f"request-{w}",
                    request_time_us=REQUEST_TIME_US + w * 60_000_000,
                    resolution_minutes=STEP_MIN,
                    series_ids=[series[w]],
                    origins_us=[origins[w]],
                    quantiles=tuple(QUANTILES),
                    forecasts=values[w : w + 1].astype(np.float32),
                    context_length=context_length,
                )
            )
    log.close()
    return n_windows


def _score(log_dir: Path, data: Path, output: Path, backtest: Path | None = None) -> int:
    argv = ["score", "--forecasts", str(log_dir), "--actuals", str(data), "--output", str(output)]
    argv += ["--seasonality", "8", "--context-length", "16"]
    return cli.main([*argv, *(["--backtest", str(backtest)] if backtest else [])])


@pytest.mark.integration
def test_score_writes_a_report_with_the_backtests_tables_and_every_models_counts(
    tmp_path: Path, backtest_run: tuple[Path, Path]
) -> None:
    data, backtest = backtest_run
    n_windows = _log_backtest(backtest, tmp_path / "log")
    late = ForecastLog(tmp_path / "log", flush_interval_s=60.0)  # a request without start: logged, not placeable
    assert late.submit(
        LoggedForecast("tiny", "0" * 64, "served", "no-start", REQUEST_TIME_US + 10**9, STEP_MIN, ["a"], [None],
                       tuple(QUANTILES), np.ones((1, 8, 3), dtype=np.float32))
    )  # fmt: skip
    late.close()
    assert _score(tmp_path / "log", data, tmp_path / "live") == 0
    page = (tmp_path / "live" / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<h1>Live scoring of" in page
    # The header: the log's span of request times, and per model windows logged / scored / pending / not placeable.
    assert "requested from 2026-12-01T00:00:00+00:00 to 2026-12-01T00:16:40+00:00" in page
    assert f"<tr><th>tiny</th><td>{n_windows + 1}</td><td>{n_windows}</td><td>0</td><td>0</td><td>1</td>" in page
    assert f"<tr><th>season_copy</th><td>{n_windows}</td><td>{n_windows}</td><td>0</td><td>0</td><td>0</td>" in page
    # The backtest report's own tables, for the group the two checkpoints were scored in.
    assert "Scored together: tiny, season_copy" in page or "Scored together: season_copy, tiny" in page
    for text in ("<h3>Leaderboard</h3>", "pooled [95%]", "fev skill", "Diebold-Mariano", "left out baseline undefined",
                 "MASE skill by lead, every model", "tiny: scores against seasonal naive (pooled)"):  # fmt: skip
        assert text in page, text
    board = pq.read_table(tmp_path / "live" / "leaderboard.parquet")
    mase = board.filter((pc.field("kind") == "metric") & (pc.field("metric") == "mase")).to_pylist()
    for row in mase:  # each model's leaderboard row, with its interval, is on the page
        assert re.search(rf"<th>{row['model']}</th>.*?{row['value']:.4g}<br><span class='hint'>\[", page), row["model"]
    assert {row["model"] for row in mase} == {*MODELS, *BASELINES}


@pytest.mark.integration
def test_live_equal_to_the_backtest_is_not_flagged(tmp_path: Path, backtest_run: tuple[Path, Path]) -> None:
    data, backtest = backtest_run
    _log_backtest(backtest, tmp_path / "log")
    assert _score(tmp_path / "log", data, tmp_path / "live", backtest) == 0
    table = pq.read_table(tmp_path / "live" / "live_vs_backtest.parquet")
    assert set(table["model"].to_pylist()) == set(MODELS)
    assert set(table["metric"].to_pylist()) == {"mase", "wql"}
    overall = table.filter(pc.field("lead").is_null()).to_pylist()
    assert len(overall) == 4
    for row in overall:
        assert row["live"] == pytest.approx(row["backtest"], rel=1e-9), row
        assert row["live_n"] == row["backtest_n"] > 0
        assert row["backtest_ci_low"] <= row["backtest"] <= row["backtest_ci_high"]
        assert row["outside"] is False and row["direction"] is None
    by_lead = table.filter(pc.field("lead").is_valid())
    assert by_lead.num_rows == 2 * 2 * 8  # two models, two metrics, horizon 8
    np.testing.assert_allclose(by_lead["live"].to_numpy(), by_lead["backtest"].to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(by_lead["live_skill"].to_numpy(), by_lead["backtest_skill"].to_numpy(), rtol=1e-9)
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["versus_backtest"]["flagged"] == {} and summary["versus_backtest"]["warnings"] == []
    assert sorted(summary["versus_backtest"]["compared"]) == sorted(MODELS)
    page = (tmp_path / "live" / "report.html").read_text()
    assert "<h2>Live against the backtest</h2>" in page and "OUTSIDE" not in page and "FLAGGED" not in page


@pytest.mark.integration
def test_a_worse_live_model_is_flagged_and_an_unknown_one_is_a_warning(
    tmp_path: Path, backtest_run: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """``tiny``'s logged forecasts shifted by 40 (its series move by ~10 around 100-300): a different model under
    its name, so its live MASE and WQL leave the backtest's interval; ``season_copy`` is untouched and stays in.
    ``newcomer`` was served but never backtested: named in a warning, not a crash."""
    data, backtest = backtest_run
    _log_backtest(backtest, tmp_path / "log", shift={"tiny": 40.0}, newcomer="tiny")
    assert _score(tmp_path / "log", data, tmp_path / "live", backtest) == 0
    table = pq.read_table(tmp_path / "live" / "live_vs_backtest.parquet")
    overall = {(row["model"], row["metric"]): row for row in table.filter(pc.field("lead").is_null()).to_pylist()}
    for metric in ("mase", "wql"):
        worse = overall[("tiny", metric)]
        assert worse["outside"] is True and worse["direction"] == "worse"
        assert worse["live"] > worse["backtest_ci_high"]
        assert overall[("season_copy", metric)]["outside"] is False
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["versus_backtest"]["flagged"] == {"tiny": ["mase", "wql"]}
    (warning,) = summary["versus_backtest"]["warnings"]
    assert "'newcomer'" in warning and "did not score it" in warning
    assert any("'newcomer'" in record.getMessage() for record in caplog.records)
    page = (tmp_path / "live" / "report.html").read_text()
    assert "FLAGGED: tiny" in page and "OUTSIDE (worse)" in page and "newcomer" in page


@pytest.mark.integration
def test_the_baselines_are_the_backtests_with_or_without_it_and_a_pending_window_is_counted_once(
    tmp_path: Path, backtest_run: tuple[Path, Path]
) -> None:
    """Attack I: without ``--backtest`` (nor ``--context-length``) the seasonal-quantile baseline looked back one
    season, not the seasons within the checkpoints' context as the backtest's does: its quantiles collapsed onto
    seasonal naive (80% coverage 0). The log records the checkpoints' context length (16 steps, two seasons of 8)
    as serve does, so ``score`` (the command, as a user runs it) gives the backtest's baselines either way. One
    request pending (served and shadowed: one window, two forecasts) is said as one window, not two."""
    data, backtest = backtest_run
    _log_backtest(backtest, tmp_path / "log", context_length=16)
    first = read_forecasts(backtest, "tiny").slice(0, 1).to_pylist()[0]  # a request 1,000 steps after a window
    origin_us = int(first["origin"].timestamp() * 1e6) + 1000 * STEP_MIN * 60_000_000
    later = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    for model, role in (("tiny", "served"), ("season_copy", "shadow")):
        assert later.submit(
            LoggedForecast(model, "0" * 64, role, "later", REQUEST_TIME_US + 10**9, STEP_MIN, [first["series_id"]],
                           [origin_us], tuple(QUANTILES), np.ones((1, 8, 3), np.float32), context_length=16)
        )  # fmt: skip
    later.close()
    expected = pq.read_table(backtest / "metrics.parquet").filter(pc.field("model").isin(list(BASELINES)))
    for name, extra in (("alone", []), ("with_backtest", ["--backtest", str(backtest)])):
        argv = ["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(data), "--output", str(tmp_path / name)]
        code, lines = run_cli([*argv, "--seasonality", "8", *extra], tmp_path)
        assert code == 0, lines
        assert [line for line in lines if line.startswith("note: ")] == [
            "note: 1 window(s) not scored (2 forecasts of them, by 2 models): 1 because their actuals have not "
            "arrived yet (rerun score when they have)."
        ], lines
        assert not [line for line in lines if "context length" in line], lines  # the log records it
        live = pq.read_table(tmp_path / name / "metrics.parquet").filter(pc.field("model").isin(list(BASELINES)))
        _assert_same_metrics(live.select(expected.column_names), expected)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["windows_not_scored"] == {"pending_actuals_not_arrived": 1}
    # Not collapsed: the quantile baseline's 80% coverage is not the naive's 0 (each of its levels the naive's value).
    coverage = expected.filter((pc.field("metric") == "coverage") & pc.field("lead").is_null()
                               & (pc.field("scope") == "global") & (pc.field("convention") == "pooled"))  # fmt: skip
    by_model = dict(zip(coverage["model"].to_pylist(), coverage["value"].to_pylist(), strict=True))
    assert by_model["seasonal_naive"] == 0.0 < by_model["seasonal_quantiles"], by_model


def test_a_directory_that_is_not_a_backtest_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "elsewhere").mkdir()
    settings = ScoreSettings(forecasts=tmp_path / "log", actuals=tmp_path / "actuals.parquet",
                             output=tmp_path / "live", backtest=tmp_path / "elsewhere")  # fmt: skip
    with pytest.raises(NotABacktestError, match=r"has no summary\.json, metrics\.parquet, leaderboard\.parquet"):
        score_log(settings)
    assert not (tmp_path / "live").exists()
    assert issubclass(NotABacktestError, ConfigError)
    # A score directory is not a backtest either, although it holds files of the same names.
    fake = tmp_path / "score_output"
    fake.mkdir()
    summary = {"run_fingerprint": "x", "resolved": {"horizon": 3, "quantiles": [0.5]}}
    (fake / "summary.json").write_text(json.dumps(summary))
    columns = ("model", "scope", "lead", "metric", "quantile", "value", "n", "convention", "scored_with")
    metrics = pa.table({name: pa.array([], pa.string()) for name in columns})
    pq.write_table(metrics, fake / "metrics.parquet")
    pq.write_table(metrics, fake / "leaderboard.parquet")
    with pytest.raises(NotABacktestError, match="output of `distributed-onnx score`"):
        score_log(settings.model_copy(update={"backtest": Location(fake)}))
    (fake / "summary.json").write_text("[]")
    code = cli.main(["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(tmp_path / "a.parquet"),
                     "--output", str(tmp_path / "live"), "--backtest", str(fake)])  # fmt: skip
    assert code == 2


def test_the_leaderboard_interval_of_series_without_scored_pairs_is_nan_without_a_warning() -> None:
    """Two series whose every actual is missing: no resample has a defined metric, so no interval (NaN), and
    numpy's "All-NaN slice" RuntimeWarning is not raised on the way."""
    scores = PairScores(["m", *BASELINES], [0.1, 0.5, 0.9], 3)
    forecasts = {name: np.ones((2, 3, 3)) for name in scores.models}
    scores.update(np.asarray(["a", "b"]), np.asarray([0, 0]), np.asarray(["w1", "w2"]), np.full((2, 3), np.nan),
                  forecasts, np.ones(2))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        board = leaderboard(scores, 60_000_000)
    rows = board.filter((pc.field("kind") == "metric") & (pc.field("model") == "m")).to_pylist()
    assert rows and all(np.isnan(row["ci_low"]) and np.isnan(row["ci_high"]) for row in rows)


def _scores(models: list[str], horizon: int, seed: int, shift: float = 0.0, spacing: int = 1) -> PairScores:
    """Four series, three windows each ``spacing`` hours apart, a forecast near the actual (``shift`` added to
    ``m``'s)."""
    rng = np.random.default_rng(seed)
    scores = PairScores([*models, *BASELINES], [0.1, 0.5, 0.9], horizon)
    n = 12
    actual = 100.0 + rng.normal(0, 5, (n, horizon))
    forecasts = {name: actual[..., None] + rng.normal(0, 3, (n, horizon, 1)) + [-4.0, 0.0, 4.0] for name in
                 scores.models}  # fmt: skip
    forecasts["m"] = forecasts["m"] + shift
    series = np.repeat(np.asarray(["a", "b", "c", "d"]), 3)
    origins = np.tile(np.arange(3, dtype=np.int64) * spacing * 3_600_000_000, 4)
    scores.update(series, origins, np.asarray([f"w{i}" for i in range(n)]), actual, forecasts, np.full(n, 5.0))
    return scores


def test_live_against_backtest_merges_a_models_groups_and_names_what_it_leaves_out() -> None:
    """``m`` scored alone (group ``m``) and with a shadow (``m,s``) at the backtest's horizon 3, and once at
    horizon 5: its live numbers are both horizon-3 groups merged, the horizon-5 pairs a warning; ``s``, never
    backtested, a warning; the flag compares with the backtest's interval (shifted live ``m``: outside). Four series
    are too few to resample, so the backtest's interval resamples its window origins: three a horizon apart (three
    overlapping ones would be fewer than two blocks: no interval, issue 40)."""
    backtest_scores = _scores(["m"], 3, seed=1, spacing=3)
    backtest = BacktestRun(
        "bt", ("m",), 3, (0.1, 0.5, 0.9), backtest_scores.to_table(), leaderboard(backtest_scores, 3_600_000_000), 4
    )
    merged = {
        (("m",), 3, (0.1, 0.5, 0.9), 60): _scores(["m"], 3, seed=2),
        (("m", "s"), 3, (0.1, 0.5, 0.9), 60): _scores(["m", "s"], 3, seed=3),
        (("m",), 5, (0.1, 0.5, 0.9), 60): _scores(["m"], 5, seed=4),
    }
    versus = compare(merged, backtest, ["m", "s"])
    assert versus.compared == ["m"]
    overall = {row["metric"]: row for row in versus.table.filter(pc.field("lead").is_null()).to_pylist()}
    assert overall["mase"]["live_n"] == 2 * 12 * 3  # both horizon-3 groups, not the horizon-5 one
    assert overall["mase"]["backtest_n"] == 12 * 3
    assert len(versus.warnings) == 2
    assert "'m': 60 live pairs of another horizon" in versus.warnings[0]
    assert "'s' was served but the backtest bt did not score it" in versus.warnings[1]
    shifted = {key: _scores(list(key[0]), 3, seed=2, shift=30.0) for key in list(merged)[:1]}
    flagged = compare(shifted, backtest, ["m"])
    assert flagged.flagged == {"m": ["mase", "wql"]}
    assert flagged.backtest_resampling == "origin_blocks" and flagged.record()["backtest_resampling"] == "origin_blocks"
