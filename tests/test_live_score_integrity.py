"""Issue 29, defects 5, 6, 12, 13 and 14: what ``score`` mixed, hid or could not get past.

Unit tier: a real :class:`ForecastLog` on a temporary folder, ramp actuals, ``score`` in-process and through
the command (exit codes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_live_score import REQUEST_TIME_US, STEP_MIN, _item, _ramp_actuals

from distributed_onnx.cli import main
from distributed_onnx.errors import ConfigError, DataError
from distributed_onnx.live.log.layout import LoggedForecast
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.location import Location


def _settings(tmp_path: Path, **extra: object) -> ScoreSettings:
    return ScoreSettings(
        forecasts=tmp_path / "log", actuals=tmp_path / "actuals.parquet", output=tmp_path / "score", **extra
    )


def _log(tmp_path: Path, *items: LoggedForecast) -> None:
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    for item in items:
        assert log.submit(item)
    log.close()


def test_a_rerun_with_another_seasonality_is_refused_not_mixed(tmp_path: Path) -> None:
    """Defect 5: a rerun with ``--seasonality 336`` was added to a run made with 48: one MASE over both."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    _log(tmp_path, _item("r1", "a", start + 60 * step_us))
    score_log(_settings(tmp_path, seasonality=48))
    _log(tmp_path, _item("r2", "a", start + 70 * step_us))
    with pytest.raises(ConfigError, match="seasonality 48 there, 336 now"):
        score_log(_settings(tmp_path, seasonality=336))
    with pytest.raises(ConfigError, match="context_length None there, 96 now"):
        score_log(_settings(tmp_path, seasonality=48, context_length=96))
    assert score_log(_settings(tmp_path, seasonality=48)).summary["windows"] == {"m": {"scored": 2}}


def test_actuals_that_arrive_as_nulls_first_are_scored_once_they_arrive(tmp_path: Path) -> None:
    """Defect 6: a null inside the grid counted as arrived; the window was settled and never scored."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    actuals = pq.read_table(tmp_path / "actuals.parquet")
    y = actuals["y"].to_numpy().copy()
    placeholders = pa.array(np.where(np.arange(100) >= 90, np.nan, y), pa.float64(), mask=np.arange(100) >= 90)
    pq.write_table(actuals.set_column(2, "y", placeholders), tmp_path / "actuals.parquet")
    _log(tmp_path, _item("late", "a", start + 89 * step_us), _item("early", "a", start + 50 * step_us))
    first = score_log(_settings(tmp_path))
    assert first.summary["windows"] == {"m": {"scored": 1, "pending_actuals_not_arrived": 1}}
    pq.write_table(actuals, tmp_path / "actuals.parquet")  # the real values arrive
    rerun = score_log(_settings(tmp_path))
    assert rerun.summary["windows"] == {"m": {"scored": 2}}
    fresh = score_log(_settings(tmp_path).model_copy(update={"output": Location(tmp_path / "fresh")}))
    assert rerun.metrics.equals(fresh.metrics)  # the rerun equals a fresh score


def test_score_refuses_to_write_into_a_backtests_output(tmp_path: Path) -> None:
    """Defect 12: ``--output`` at a backtest folder overwrote its metrics, leaderboard, summary and report."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    _log(tmp_path, _item("r1", "a", start + 60 * step_us))
    backtest = tmp_path / "score"
    (backtest / "forecasts" / "model=m").mkdir(parents=True)
    (backtest / "run.json").write_text('{"fingerprint": "abc"}')
    (backtest / "metrics.parquet").write_bytes(b"the backtest's")
    with pytest.raises(ConfigError, match="is a backtest's output directory"):
        score_log(_settings(tmp_path))
    assert (backtest / "metrics.parquet").read_bytes() == b"the backtest's"


@pytest.mark.parametrize(
    "damage",
    [b"", b"not parquet at all", "foreign"],
    ids=["empty", "bad-magic", "foreign-table"],
)
def test_a_corrupt_or_foreign_file_in_the_log_is_named_and_the_rest_is_scored(
    tmp_path: Path, damage: bytes | str, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 13: a 0-byte file, bad magic bytes or a file missing a field exited 4 without the path."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    _log(tmp_path, _item("r1", "a", start + 60 * step_us))
    bad = tmp_path / "log" / "day=2026-12-01" / "model=m" / "part-20261201T000000000000-bad-000000.parquet"
    if damage == "foreign":
        pq.write_table(pa.table({"series_id": ["a"], "lead": [1]}), bad)
    else:
        assert isinstance(damage, bytes)
        bad.write_bytes(damage)
    code = main(["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(tmp_path / "actuals.parquet"),
                 "--output", str(tmp_path / "score")])  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "score" / "summary.json").read_text())
    assert summary["windows"] == {"m": {"scored": 1}}
    (name,) = summary["files_unreadable"]
    assert name.endswith(bad.name) and bad.name in caplog.text


def test_a_model_of_another_resolution_leaves_the_other_models_scored(tmp_path: Path) -> None:
    """Defect 14: one model of another resolution in the log failed ``score`` for every model."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")  # on a 30-minute grid
    other = LoggedForecast(**{**_item("r2", "a", start + 60 * step_us, model="hourly").__dict__,
                              "resolution_minutes": 7})  # fmt: skip
    _log(tmp_path, _item("r1", "a", start + 60 * step_us), other)
    result = score_log(_settings(tmp_path))
    assert result.summary["windows"] == {"m": {"scored": 1}, "hourly": {"actuals_not_at_resolution": 1}}
    assert REQUEST_TIME_US and STEP_MIN == 30


def test_actuals_that_fit_no_model_of_the_log_are_still_an_error(tmp_path: Path) -> None:
    """Defect 14's fix sets one model of another resolution aside; actuals that fit none are a wrong file."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    other = LoggedForecast(**{**_item("r2", "a", start + 60 * step_us).__dict__, "resolution_minutes": 7})
    _log(tmp_path, other)
    with pytest.raises(DataError, match=r"actuals\.parquet"):
        score_log(_settings(tmp_path))
    assert not (tmp_path / "score" / "scored").exists()  # nothing written


def _score_cli(tmp_path: Path) -> int:
    return main(["score", "--forecasts", str(tmp_path / "log"), "--actuals", str(tmp_path / "actuals.parquet"),
                 "--output", str(tmp_path / "score")])  # fmt: skip


@pytest.mark.parametrize("resolution", [-5, 0])
def test_a_log_part_with_a_resolution_that_is_no_interval_is_named_not_a_bug(
    tmp_path: Path, resolution: int, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40, defect 14: a log part whose ``resolution_minutes`` is negative exited 4. It is now a file that
    is not a forecast log, named and set aside as a corrupt one is; the rest is scored."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    _log(tmp_path, _item("r1", "a", start + 60 * step_us))
    bad = LoggedForecast(**{**_item("r2", "a", start + 60 * step_us, model="odd").__dict__,
                            "resolution_minutes": resolution})  # fmt: skip
    _log(tmp_path, bad)
    assert _score_cli(tmp_path) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "score" / "summary.json").read_text())
    assert summary["windows"] == {"m": {"scored": 1}}
    (name,) = summary["files_unreadable"]
    assert "model=odd" in name and "resolution_minutes" in caplog.text


@pytest.mark.parametrize(
    "record",
    [["a", "list"], {"models": [1, 2]}, {"models": {"m": {"requests_failed": "many"}}}, {"format": "two"}, "text"],
    ids=["list", "models-list", "counts-text", "format-text", "string"],
)
def test_a_writer_record_of_another_shape_is_one_error_naming_it(
    tmp_path: Path, record: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40, defect 14: a ``_log_state/*.json`` of another shape exited 4; now exit 2 naming the file."""
    step_us, start = _ramp_actuals(tmp_path / "actuals.parquet")
    _log(tmp_path, _item("r1", "a", start + 60 * step_us))
    state = tmp_path / "log" / "_log_state" / "foreign.json"
    state.write_text(json.dumps(record))
    assert _score_cli(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "foreign.json" in err, err
