"""``score``: the forecast log joined with the actuals, scored by the backtest's own code, incrementally.

Integration tier for ONNX Runtime, no Ray: a backtest's parts are run in-process (what each actor does), its
forecasts are written through the forecast log's writer as if a service had answered them, and ``score`` over
that log must give the backtest's metrics. Unit tests cover placement (pending, not placeable) and reruns.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from backtest_data import QUANTILES, merged_sums, read_forecasts, run_parts_in_process, settings_for, write_dataset

from distributed_onnx.cli import main
from distributed_onnx.evaluation.planning import RunPlan
from distributed_onnx.evaluation.scoring.leaderboard import leaderboard
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.live.log.layout import LoggedForecast
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

STEP_MIN = 30
REQUEST_TIME_US = 1_796_083_200_000_000
METRIC_COLUMNS = ["model", "scope", "series_id", "lead", "metric", "quantile", "convention", "value", "n"]


def _log_windows(forecasts: pa.Table, horizon: int, model: str, log: ForecastLog, **extra: object) -> None:
    """Each window of a backtest's forecast table as one logged request of one series."""
    n_windows = forecasts.num_rows // horizon
    series = forecasts["series_id"].to_pylist()[::horizon]
    origins = forecasts["origin"].cast(pa.int64()).to_pylist()[::horizon]
    values = np.stack([forecasts[f"q{format(q, 'g')}"].to_numpy() for q in QUANTILES], axis=-1)
    values = values.reshape(n_windows, horizon, len(QUANTILES))
    for w in range(n_windows):
        item = LoggedForecast(
            model=model,
            checkpoint_sha256="0" * 64,
            role="served",
            request_id=f"request-{w}",
            request_time_us=REQUEST_TIME_US + w,
            resolution_minutes=STEP_MIN,
            series_ids=[series[w]],
            origins_us=[origins[w]],
            quantiles=tuple(QUANTILES),
            forecasts=values[w : w + 1],
        )
        for key, value in extra.items():
            item = LoggedForecast(**{**item.__dict__, key: value})
        assert log.submit(item)


def _sorted_metrics(table: pa.Table) -> pa.Table:
    return table.select(METRIC_COLUMNS).sort_by(
        [(name, "ascending") for name in ("model", "convention", "scope", "series_id", "lead", "metric", "quantile")]
    )


def _assert_same_metrics(live: pa.Table, backtest: pa.Table) -> None:
    live, backtest = _sorted_metrics(live), _sorted_metrics(backtest)
    assert live.num_rows == backtest.num_rows
    for name in METRIC_COLUMNS:
        if name == "value":
            np.testing.assert_allclose(live[name].to_numpy(), backtest[name].to_numpy(), rtol=1e-9, equal_nan=True)
        else:
            assert live[name].equals(backtest[name]), name


@pytest.fixture
def backtest(tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint) -> tuple[Path, pa.Table, pa.Table, int]:
    """A finished in-process backtest: (its data, its forecasts, its metrics, its horizon)."""
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    settings = settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", n_windows=6, stride=2)
    plan = run_parts_in_process(settings)
    return data, read_forecasts(settings.output), backtest_metrics(plan), plan.spec.horizon


def backtest_metrics(plan: RunPlan) -> pa.Table:
    """The metrics table of an in-process backtest, merged from its parts' sums as the driver merges them."""
    return backtest_scores(plan).to_table()


def backtest_scores(plan: RunPlan) -> PairScores:
    """The merged scores of an in-process backtest, as the driver merges its parts' sums."""
    sums = merged_sums(plan)
    return sums.merged()


@pytest.mark.integration
def test_score_of_logged_backtest_forecasts_gives_the_backtest_metrics(
    tmp_path: Path, backtest: tuple[Path, pa.Table, pa.Table, int]
) -> None:
    data, forecasts, expected, horizon = backtest
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    _log_windows(forecasts, horizon, "tiny", log)
    log.close()
    result = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=data, output=tmp_path / "score"))
    windows = forecasts.num_rows // horizon
    assert result.summary["windows"] == {"tiny": {"scored": windows}}
    assert set(result.metrics["scored_with"].to_pylist()) == {"tiny"}
    assert set(result.metrics["quantile_levels"].to_pylist()) == {"0.1,0.5,0.9"}
    assert set(result.metrics["model"].to_pylist()) == {"tiny", "seasonal_naive", "seasonal_quantiles"}
    assert set(result.metrics["convention"].to_pylist()) == {"pooled", "fev", "count"}
    _assert_same_metrics(result.metrics, expected)
    _assert_same_metrics(pq.read_table(tmp_path / "score" / "metrics.parquet"), expected)


@pytest.mark.integration
def test_score_writes_the_backtests_leaderboard(tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint) -> None:
    """The leaderboard of the logged forecasts is the backtest's: intervals, skill, win rates, DM tests alike."""
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    settings = settings_for(tiny_checkpoint.weights_path, data, tmp_path / "run", n_windows=6, stride=2)
    plan = run_parts_in_process(settings)
    expected = leaderboard(backtest_scores(plan), plan.step_us)
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    _log_windows(read_forecasts(settings.output), plan.spec.horizon, "tiny", log)
    log.close()
    result = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=data, output=tmp_path / "score"))
    written = pq.read_table(tmp_path / "score" / "leaderboard.parquet")
    assert written.schema.equals(result.leaderboard.schema) and written.num_rows == result.leaderboard.num_rows
    assert set(written["scored_with"].to_pylist()) == {"tiny"}
    keys = [("kind", "ascending"), ("model", "ascending"), ("versus", "ascending"), ("metric", "ascending")]
    live, backtest = written.select(expected.column_names).sort_by(keys), expected.sort_by(keys)
    assert live.num_rows == backtest.num_rows > 0
    for name in expected.column_names:
        if pa.types.is_floating(expected.schema.field(name).type):
            np.testing.assert_allclose(live[name].to_numpy(), backtest[name].to_numpy(), rtol=1e-9, equal_nan=True)
        else:
            assert live[name].equals(backtest[name]), name


@pytest.mark.integration
def test_a_rerun_scores_only_what_arrived_since(tmp_path: Path, backtest: tuple[Path, pa.Table, pa.Table, int]) -> None:
    data, forecasts, expected, horizon = backtest
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    _log_windows(forecasts, horizon, "tiny", log)
    log.close()
    full = pq.read_table(data)
    last = pc.max(full["timestamp"]).value
    early = tmp_path / "early.parquet"
    pq.write_table(full.filter(pc.less(full["timestamp"].cast(pa.int64()), last - 4 * STEP_MIN * 60_000_000)), early)
    output = tmp_path / "score"
    first = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=early, output=output))
    counts = first.summary["windows"]["tiny"]
    assert counts["scored"] > 0 and counts["pending_actuals_not_arrived"] > 0
    assert counts["scored"] + counts["pending_actuals_not_arrived"] == forecasts.num_rows // horizon
    second = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=data, output=output))
    assert second.new_batch == 1
    assert second.summary["windows"] == {"tiny": {"scored": forecasts.num_rows // horizon}}
    _assert_same_metrics(second.metrics, expected)
    third = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=data, output=output))
    assert third.new_batch is None  # nothing new: no batch, the same numbers
    assert third.metrics.equals(second.metrics)
    assert len(list((output / "scored").glob("batch-*.npz"))) == 2


def _item(request: str, series: str, origin_us: int | None, model: str = "m", horizon: int = 3) -> LoggedForecast:
    return LoggedForecast(
        model=model,
        checkpoint_sha256="0" * 64,
        role="served",
        request_id=request,
        request_time_us=REQUEST_TIME_US,
        resolution_minutes=STEP_MIN,
        series_ids=[series],
        origins_us=[origin_us],
        quantiles=(0.5,),
        forecasts=np.ones((1, horizon, 1), dtype=np.float32),
    )


def _ramp_actuals(path: Path) -> tuple[int, int]:
    """100 actuals of series ``a`` (0, 1, 2, ...) from the request time on; returns (step_us, first instant)."""
    step_us = STEP_MIN * 60_000_000
    start = REQUEST_TIME_US
    actuals = pa.table(
        {
            "series_id": ["a"] * 100,
            "timestamp": pa.array([start + i * step_us for i in range(100)], pa.timestamp("us", tz="UTC")),
            "y": np.arange(100, dtype=np.float64),
        }
    )
    pq.write_table(actuals, path)
    return step_us, start


def test_windows_that_cannot_be_placed_are_counted_not_scored(tmp_path: Path) -> None:
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    log.submit(_item("placed", "a", start + 60 * step_us))
    log.submit(_item("placed-shadow", "a", start + 60 * step_us, model="shadow"))
    log.submit(_item("no-start", "a", None))
    log.submit(_item("off-grid", "a", start + 60 * step_us + 1))
    log.submit(_item("early", "a", start - 10 * step_us))
    log.submit(_item("later", "a", start + 99 * step_us))
    log.submit(_item("unknown", "zz", start))
    log.close()
    output = tmp_path / "score"
    code = main(
        ["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(tmp_path / "actuals.parquet"), "--output",
         str(output)]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["windows"] == {
        "m": {
            "scored": 1,
            "no_start": 1,
            "off_grid": 1,
            "before_actuals": 1,
            "pending_actuals_not_arrived": 1,
            "pending_series_not_in_actuals": 1,
        },
        "shadow": {"scored": 1},
    }
    metrics = pq.read_table(output / "metrics.parquet")
    mae = metrics.filter(
        (pc.field("model") == "m")
        & (pc.field("scope") == "global")
        & (pc.field("metric") == "mae")
        & (pc.field("convention") == "pooled")
    ).to_pylist()
    assert mae[0]["n"] == 3 and mae[0]["value"] == pytest.approx(np.mean(np.abs(np.array([60.0, 61, 62]) - 1)))
    naive = metrics.filter((pc.field("model") == "seasonal_naive") & (pc.field("scored_with") == "m"))
    assert naive.num_rows > 0


def test_score_maps_the_actuals_columns_and_says_why_windows_are_not_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: ``--id-col``/``--time-col`` read Nixtla-named actuals as the project's own (the same scores),
    and the command says in one line why windows were not scored, not only in summary.json's counts."""
    step_us, start = _ramp_actuals(tmp_path / "own.parquet")
    own = pq.read_table(tmp_path / "own.parquet")
    pq.write_table(own.rename_columns(["unique_id", "ds", "y"]), tmp_path / "nixtla.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    log.submit(_item("placed", "a", start + 60 * step_us))
    log.submit(_item("later", "a", start + 99 * step_us))
    log.submit(_item("unknown", "zz", start))
    log.close()
    scores = {}
    for name, extra in (("own", []), ("nixtla", ["--id-col", "unique_id", "--time-col", "ds"])):
        argv = ["score", "--forecasts", str(tmp_path / "log"), "--output", str(tmp_path / name)]
        assert main([*argv, "--actuals", str(tmp_path / f"{name}.parquet"), *extra]) == 0
        scores[name] = pq.read_table(tmp_path / name / "metrics.parquet")
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
        assert notes == [
            "note: 2 window(s) not scored: 1 because their actuals have not arrived yet (rerun score when they "
            "have); 1 because their series are not in the actuals (check the ids and --actuals)."
        ], notes
    assert scores["nixtla"].num_rows > 0 and scores["nixtla"].equals(scores["own"])
    assert "series_id" in scores["nixtla"].column_names
    # Outside test: without --id-col/--time-col, a misleading "Windows of 30-minute models are not scored: the
    # actuals are not on that grid" warning came before the missing columns' error: that error alone is said.
    argv = ["score", "--forecasts", str(tmp_path / "log"), "--output", str(tmp_path / "unmapped")]
    caplog.clear()
    assert main([*argv, "--actuals", str(tmp_path / "nixtla.parquet")]) == 2
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("error: ") and "missing column(s)" in said[0], said
    assert "not scored" not in said[0] and "grid" not in said[0], said


def test_a_primary_and_its_shadow_are_scored_together_on_their_common_pairs(tmp_path: Path) -> None:
    """One request answered by ``m`` and shadowed by ``shadow`` (one window id), the shadow NaN at one lead: both
    models and both baselines are scored on the same two pairs, and the left-out pair is counted, as in a backtest
    of the two checkpoints; a window ``m`` answered alone is scored in a group of its own."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    nan_at_lead_2 = np.array([[[1.0], [np.nan], [1.0]]], dtype=np.float32)
    log.submit(_item("both", "a", start + 60 * step_us))
    log.submit(LoggedForecast(**{**_item("both", "a", start + 60 * step_us, model="shadow").__dict__,
                                 "role": "shadow", "forecasts": nan_at_lead_2}))  # fmt: skip
    log.submit(_item("alone", "a", start + 70 * step_us))
    log.close()
    result = score_log(ScoreSettings(forecasts=tmp_path / "log", actuals=tmp_path / "actuals.parquet",
                                     output=tmp_path / "score"))  # fmt: skip
    assert result.summary["windows"] == {"m": {"scored": 2}, "shadow": {"scored": 1}}
    pooled = result.metrics.filter(
        (pc.field("scope") == "global") & (pc.field("metric") == "mae") & (pc.field("convention") == "pooled")
    )
    rows = {(row["scored_with"], row["model"]): row for row in pooled.to_pylist()}
    assert set(rows) == {(group, model) for group in ("m", "m,shadow") for model in (*group.split(","), *BASELINES)}
    for model in ("m", "shadow", *BASELINES):
        assert rows[("m,shadow", model)]["n"] == 2  # the pairs every model has: leads 1 and 3
    assert rows[("m,shadow", "m")]["value"] == pytest.approx(np.mean(np.abs(np.array([60.0, 62]) - 1)))
    assert rows[("m", "m")]["n"] == 3
    left_out = result.metrics.filter(
        (pc.field("scored_with") == "m,shadow") & (pc.field("metric") == "left_out_model_nonfinite")
    )
    assert set(left_out["value"].to_pylist()) == {1.0}
    pairs = {entry["scored_with"]: entry["left_out"] for entry in result.summary["pairs"]}
    assert pairs["m,shadow"]["shadow"]["nonfinite_windows"] == 1


def test_score_refuses_a_folder_of_other_files_and_reruns_into_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside tester: ``score --output DIR`` wrote its files into a folder of unrelated ones (backtest refuses
    such a folder): refused the same way, naming them, nothing written; its own folder reruns."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    log.submit(_item("placed", "a", start + 60 * step_us))
    log.close()
    argv = ["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(tmp_path / "actuals.parquet")]
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    for name in ("notes.txt", "sub/data.csv", "summary.json"):
        (mine / name).write_text("mine")
    assert main([*argv, "--output", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"--output {mine} holds 2 file(s) that score does not write: notes.txt, sub/data.csv" in err, err
    assert sorted(str(path.relative_to(mine)) for path in mine.rglob("*")) == [
        "notes.txt", "sub", "sub/data.csv", "summary.json"
    ]  # fmt: skip
    output = tmp_path / "score"
    assert main([*argv, "--output", str(output)]) == 0, capsys.readouterr().err
    assert main([*argv, "--output", str(output)]) == 0, capsys.readouterr().err  # its own folder: reruns
