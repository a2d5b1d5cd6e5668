"""A newcomer's first hour (issue 28): CLI errors that point, help in plain text, and ``score``'s folder checks.

Every test here failed on the tree before the issue: the typo got the top-level usage and no suggestion,
``--n_windows`` and ``-v`` after the command were refused, a list with spaces got no hint, ``inspect --help``
had no text for its argument, the help showed RST backticks and ``list[Path]``; ``score`` on a missing or empty
log was an I/O error (exit 3) or a claimed ``scored/`` that was not there, ignored ``--backtest``'s settings
and printed no score. No Ray, no ONNX Runtime session: the unit tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.cli import main
from distributed_onnx.cli_words import normalized_words, plain_text
from distributed_onnx.live.log.layout import LoggedForecast
from distributed_onnx.live.log.writer import ForecastLog

STEP_MIN = 30
REQUEST_TIME_US = 1_796_083_200_000_000


def _exit_of(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return int(exited.value.code or 0)


def test_a_mistyped_flag_shows_the_commands_usage_and_the_closest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_of(["backtest", "--output", "x", "--n-windw", "2"]) == 2
    err = capsys.readouterr().err
    assert "usage: distributed-onnx backtest" in err
    assert "unrecognized arguments: --n-windw 2" in err
    assert "did you mean --n-windows?" in err


def test_a_mistyped_flag_of_score_suggests_scores_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_of(["score", "--forecast", "log", "--actuals", "a.parquet", "--output", "o", "--contxt-length", "5"])
    err = capsys.readouterr().err
    assert "usage: distributed-onnx score" in err and "did you mean --context-length?" in err


def test_a_mistyped_command_suggests_the_closest_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46: ``backtst`` got argparse's bare "invalid choice" while mistyped flags got a suggestion."""
    assert _exit_of(["backtst", "--output", "x"]) == 2
    err = capsys.readouterr().err
    assert "error: argument command: invalid choice: 'backtst'" in err
    assert "hint: did you mean backtest?" in err


def test_underscores_and_verbose_anywhere_are_read() -> None:
    assert normalized_words(["backtest", "--n_windows", "2", "-v", "--min_context_coverage=0.5"]) == [
        "-v",
        "backtest",
        "--n-windows",
        "2",
        "--min-context-coverage=0.5",
    ]
    assert normalized_words(["backtest", "--output", "my_dir", "--", "-v"]) == [
        "backtest",
        "--output",
        "my_dir",
        "--",
        "-v",
    ]


def test_underscored_flags_and_a_late_verbose_reach_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """Parsed, not refused: the run then stops on the settings (``--start`` with ``--n-windows``), exit 2."""
    code = main(["backtest", "--output", "x", "--n_windows", "2", "--start", "2000-01-01", "--end", "2000-01-02", "-v"])
    assert code == 2
    assert "unrecognized" not in capsys.readouterr().err


def test_a_list_given_with_spaces_gets_the_comma_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_of(["backtest", "--output", "x", "--quantiles", "0.1", "0.5", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "usage: distributed-onnx backtest" in err
    assert "--quantiles 0.1,0.5,0.9" in err


@pytest.mark.parametrize("command", [[], ["backtest"], ["serve"], ["score"], ["inspect"]])
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_of([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "`" not in out and "list[" not in out and ":class:" not in out


def test_inspect_help_documents_its_argument(capsys: pytest.CaptureFixture[str]) -> None:
    _exit_of(["inspect", "--help"])
    out = capsys.readouterr().out
    assert "CHECKPOINT.onnx" in out and "metadata" in out.split("positional arguments:")[1]


def test_plain_text_of_rst() -> None:
    assert plain_text("The ``x`` of :class:`~a.b.Settings` and `y`") == "The x of Settings and y"


def _item(request: str, origin_us: int, model: str = "m", horizon: int = 3) -> LoggedForecast:
    return LoggedForecast(
        model=model,
        checkpoint_sha256="0" * 64,
        role="served",
        request_id=request,
        request_time_us=REQUEST_TIME_US,
        resolution_minutes=STEP_MIN,
        series_ids=["a"],
        origins_us=[origin_us],
        quantiles=(0.5,),
        forecasts=np.ones((1, horizon, 1), dtype=np.float32),
    )


def _actuals(path: Path) -> int:
    step_us = STEP_MIN * 60_000_000
    stamps = [REQUEST_TIME_US + i * step_us for i in range(100)]
    table = {"series_id": ["a"] * 100, "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC"))}
    pq.write_table(pa.table({**table, "y": np.arange(100, dtype=np.float64)}), path)
    return step_us


def _score(tmp_path: Path, log: Path, *extra: str) -> int:
    actuals = tmp_path / "actuals.parquet"
    if not actuals.exists():
        _actuals(actuals)
    return main(
        ["score", "--forecasts", str(log), "--actuals", str(actuals), "--output", str(tmp_path / "out"), *extra]
    )


def test_score_refuses_a_missing_log_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _score(tmp_path, tmp_path / "lgo") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--forecasts {tmp_path / 'lgo'} does not exist" in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_score_refuses_an_empty_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "out").mkdir()  # an existing output folder: it used to exit 0 and claim scored/
    assert _score(tmp_path, tmp_path / "log") == 2
    assert f"--forecasts {tmp_path / 'log'} is empty" in capsys.readouterr().err


def test_score_refuses_a_foreign_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "runs" / "forecasts").mkdir(parents=True)
    (tmp_path / "runs" / "summary.json").write_text("{}")
    assert _score(tmp_path, tmp_path / "runs") == 2
    err = capsys.readouterr().err
    assert f"--forecasts {tmp_path / 'runs'} is not a forecast log" in err and "forecasts, summary.json" in err


def _log(tmp_path: Path) -> Path:
    step_us = _actuals(tmp_path / "actuals.parquet")
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0)
    log.submit(_item("one", REQUEST_TIME_US + 60 * step_us))
    log.submit(_item("two", REQUEST_TIME_US + 70 * step_us))
    log.close()
    return tmp_path / "log"


def test_score_creates_its_output_and_prints_the_headline_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path)
    assert _score(tmp_path, log) == 0
    out = capsys.readouterr().out
    shown = json.loads(out[: out.rindex("}") + 1])
    # Two windows of three leads, the median 1 against actuals 60, 61, 62 and 70, 71, 72.
    assert shown["global"]["m"]["m.mae"] == pytest.approx(np.mean(np.abs(np.r_[60:63, 70:73] - 1)), abs=1e-4)
    assert "m.mase" in shown["global"]["m"] and "seasonal_naive.mase" in shown["global"]["m"]
    assert (tmp_path / "out" / "scored").is_dir() and "scored/" in out
    page = (tmp_path / "out" / "report.html").read_text()  # one series: the intervals resample window origins
    assert "moving-block bootstrap over the 2 window origins" in page and "class='verdict'" in page
    assert _score(tmp_path, log) == 0  # a rerun with nothing new: it does not claim a new scored/ batch
    assert "scored/" not in capsys.readouterr().out.splitlines()[-1]


def _fake_backtest(folder: Path, **resolved: int) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"resolved": resolved}))
    return folder


def test_score_takes_the_backtests_settings_and_refuses_a_conflicting_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from distributed_onnx.live.score.folders import prepare_score
    from distributed_onnx.live.score.settings import ScoreSettings

    log = _log(tmp_path)
    run = _fake_backtest(tmp_path / "bt", context_length=512, seasonality=48)
    settings = ScoreSettings(forecasts=log, actuals=tmp_path / "actuals.parquet", output=tmp_path / "o", backtest=run)
    prepared, notes = prepare_score(settings)
    assert (prepared.context_length, prepared.seasonality) == (512, 48)
    assert any("--context-length 512" in note for note in notes)
    assert (tmp_path / "o").is_dir()
    code = _score(tmp_path, log, "--backtest", str(run), "--context-length", "96")
    assert code == 2
    err = capsys.readouterr().err
    assert "--context-length 96 differs from the backtest's 512" in err


def test_a_ray_start_failure_through_the_api_is_one_error_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a loaded machine once gave a notebook as Ray's traceback: one RayStartError (exit 3 on the CLI)."""
    from ray.exceptions import RaySystemError

    import distributed_onnx
    from distributed_onnx.cli import EXIT_ENVIRONMENT, describe_error
    from distributed_onnx.errors import RayStartError
    from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET
    from distributed_onnx.runtime import local_ray

    def failing(address: str | None, num_cpus: int | None = None) -> bool:
        raise RaySystemError("Failed to connect to GCS at address 127.0.0.1:6379 within 5 seconds.")

    monkeypatch.setattr(local_ray, "connect", failing)
    with pytest.raises(RayStartError) as raised:
        distributed_onnx.backtest(REFERENCE_DATASET, checkpoint=REFERENCE_CHECKPOINT, n_windows=2, stride=48)
    message = str(raised.value)
    assert (
        "Could not start or join an embedded local Ray on 127.0.0.1: RaySystemError: System error: Failed to connect"
        in message
    )
    assert "\n" not in message and isinstance(raised.value.__cause__, RaySystemError)
    assert describe_error(raised.value)[0] == EXIT_ENVIRONMENT


def test_the_ready_line_and_docs_name_every_model_the_shadows_and_the_log(tmp_path: Path) -> None:
    from distributed_onnx.serve.served_text import docs_description, served_models
    from distributed_onnx.serve.settings import ServeSettings

    checkpoints = [tmp_path / "primary.onnx", tmp_path / "challenger.onnx"]
    settings = ServeSettings.model_construct(
        checkpoint=checkpoints, shadow=["challenger"], shadow_fraction=0.1, forecast_log=tmp_path / "log"
    )
    line = served_models(settings)
    assert line == f"models: primary (default), challenger (shadow, 10% of requests); forecast log: {tmp_path / 'log'}"
    described = docs_description(settings)
    assert "`primary`" in described and "**Shadows**" in described and "`challenger` (10% of requests)" in described
    assert str(tmp_path / "log") in described
