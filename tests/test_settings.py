"""Unit tier: command settings (flags > DISTRIBUTED_ONNX_* > YAML > defaults, paths relative to the YAML file,
flags generated from the models, one-line errors naming file and key)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import Field

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.backend.providers import provider_from_kind
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.settings_flags import add_flags, given_flags
from distributed_onnx.settings_sources import ENV_PREFIX, CommandSettings


@pytest.fixture(autouse=True)
def _no_settings_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own DISTRIBUTED_ONNX_* variables must not leak into these tests."""
    import os

    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def _yaml(folder: Path, text: str, name: str = "backtest.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def _flags(**given: Any) -> dict[str, Any]:
    """Flags as a caller may pass them: None means not given."""
    flags: dict[str, Any] = {"output": None, "n_windows": None, "stride": None, "quantiles": None, "actors": None}
    flags.update(given)
    return flags


def _parse(model: type[CommandSettings], argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_flags(parser, model)
    return given_flags(parser.parse_args(argv))


# --- defaults and precedence ------------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    settings = BacktestSettings.from_sources(_flags(output=tmp_path / "run", n_windows=3))
    assert settings.checkpoint == [REFERENCE_CHECKPOINT]
    assert settings.data == REFERENCE_DATASET
    assert settings.stride == 1
    assert settings.rows_per_batch is None  # chosen by the plan (part_count.default_rows_per_batch)
    assert settings.quantiles is None
    assert settings.covariates == []
    assert settings.providers is None


def test_precedence_flags_over_environment_over_yaml_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _yaml(tmp_path, "output: out\nstride: 2\nrows_per_batch: 64\nactors: 3\nn_windows: 7\n")
    monkeypatch.setenv("DISTRIBUTED_ONNX_STRIDE", "4")
    monkeypatch.setenv("DISTRIBUTED_ONNX_ROWS_PER_BATCH", "32")
    monkeypatch.setenv("distributed_onnx_max_in_flight_per_actor", "5")  # names are case-insensitive

    settings = BacktestSettings.from_sources({"stride": 6}, config, environment=True)

    assert settings.stride == 6  # flag over environment and file
    assert settings.rows_per_batch == 32  # environment over file
    assert settings.max_in_flight_per_actor == 5  # environment over default
    assert settings.actors == 3  # file over default
    assert settings.cpus_per_actor == 1.0  # default where nobody says
    # Without environment=True (the Serve config path, the Python API) the variables do not apply.
    assert BacktestSettings.from_sources({}, config).rows_per_batch == 64


def test_direct_construction_reads_only_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRIBUTED_ONNX_STRIDE", "4")
    assert BacktestSettings(output="out").stride == 1
    assert ServeSettings().port == 8000


def test_environment_lists_and_booleans_read_like_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRIBUTED_ONNX_OUTPUT", "from-env")
    monkeypatch.setenv("DISTRIBUTED_ONNX_QUANTILES", "0.1, 0.9")
    monkeypatch.setenv("DISTRIBUTED_ONNX_PROVIDERS", "cpu")
    monkeypatch.setenv("DISTRIBUTED_ONNX_PROGRESS", "false")
    settings = BacktestSettings.from_sources({}, environment=True)
    assert settings.output == Path("from-env")
    assert settings.quantiles == [0.1, 0.9]
    assert settings.providers == [provider_from_kind("cpu")]
    assert settings.progress is False


def test_flags_that_are_none_do_not_erase_yaml(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nactors: 4\n")
    assert BacktestSettings.from_sources(_flags(actors=None), config).actors == 4


def test_empty_yaml_is_no_settings(tmp_path: Path) -> None:
    settings = BacktestSettings.from_sources(_flags(output="out"), _yaml(tmp_path, ""))
    assert settings.output == Path("out")


def test_yaml_keys_with_dashes(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nn-windows: 5\nrows-per-batch: 32\nmin-context-coverage: 0.5\n")
    settings = BacktestSettings.from_sources(_flags(), config)
    assert (settings.n_windows, settings.rows_per_batch, settings.min_context_coverage) == (5, 32, 0.5)


# --- paths in a YAML file -------------------------------------------------------------------------------------


def test_relative_paths_in_yaml_are_read_from_the_files_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    config = _yaml(project / "configs", "checkpoint: ../models/m.onnx\ndata: series.parquet\noutput: ../runs/a\n")
    monkeypatch.chdir(tmp_path)  # not the file's folder

    settings = BacktestSettings.from_sources({}, config.relative_to(tmp_path))

    assert [path.resolve() for path in settings.checkpoint] == [project / "models" / "m.onnx"]
    assert Path(settings.data).resolve() == project / "configs" / "series.parquet"
    assert Path(settings.output).resolve() == project / "runs" / "a"


def test_urls_and_absolute_paths_in_yaml_stay_as_written(tmp_path: Path) -> None:
    absolute = tmp_path / "elsewhere" / "d.parquet"
    config = _yaml(tmp_path / "cfg", f"data: {absolute}\noutput: s3://bucket/runs/x\n")
    settings = BacktestSettings.from_sources({}, config)
    assert settings.data == absolute
    assert settings.output.reveal() == "s3://bucket/runs/x"


def test_relative_paths_from_flags_and_environment_stay_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _yaml(tmp_path / "cfg", "output: from-file\n")
    monkeypatch.setenv("DISTRIBUTED_ONNX_DATA", "env.parquet")
    settings = BacktestSettings.from_sources({"output": "from-flag"}, config, environment=True)
    assert settings.output == Path("from-flag")
    assert settings.data == Path("env.parquet")


def test_serve_checkpoint_in_yaml_is_relative_to_the_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path / "cfg", "checkpoint: model.onnx\nreplicas: 2\n", name="serve.yaml")
    settings = ServeSettings.from_sources({}, config)
    assert settings.checkpoint == [tmp_path / "cfg" / "model.onnx"]
    assert settings.replicas == 2


# --- values ------------------------------------------------------------------------------------------------------


def test_comma_lists_from_flags() -> None:
    settings = BacktestSettings.from_sources(
        _flags(output="out", quantiles="0.1, 0.5,0.9", covariates="temp,wind ", providers="cuda,cpu")
    )
    assert settings.quantiles == [0.1, 0.5, 0.9]
    assert settings.covariates == ["temp", "wind"]
    assert settings.providers == [provider_from_kind("cuda"), provider_from_kind("cpu")]
    # An empty entry (a trailing comma included) is refused naming the flag, as docs/cli.md says of every list.
    with pytest.raises(ConfigError, match=r"covariates.*empty entry between commas"):
        BacktestSettings.from_sources(_flags(output="out", covariates="temp,wind , "))


#: One entry of each list setting, for the test below: a new list setting of a command must be added here.
_LIST_ENTRIES = {
    "checkpoint": "m.onnx",
    "quantiles": "0.5",
    "covariates": "temp",
    "past_covariates": "load_lag",
    "providers": "cpu",
    "shadow": "challenger",
}


def _command_settings() -> list[type[CommandSettings]]:
    """Every command's settings model (each command's module imported, so each has registered its subclass)."""
    import distributed_onnx.evaluation.fev_tasks.request
    import distributed_onnx.export.request
    import distributed_onnx.live.score.settings
    import distributed_onnx.model.inspection
    import distributed_onnx.tune  # noqa: F401

    found: list[type[CommandSettings]] = []
    pending = list(CommandSettings.__subclasses__())
    while pending:
        model = pending.pop()
        found.append(model)
        pending.extend(model.__subclasses__())
    return found


def test_every_list_setting_of_every_command_refuses_an_empty_entry_or_an_entry_twice() -> None:
    """Outside test: ``--providers 'cpu,,'``, ``',cpu'`` and ``cpu,cpu`` ran (exit 0; ONNX Runtime's "Duplicate
    provider" warning reached the console from each worker), while docs/cli.md says a list with an empty entry or
    the same entry twice is exit 2 naming the flag. Every list setting reads the one parser of comma lists."""
    lists = {
        (model.__name__, name)
        for model in _command_settings()
        for name, field in model.model_fields.items()
        if "list[" in str(field.annotation)
    }
    assert {name for _, name in lists} <= set(_LIST_ENTRIES), "a new list setting: add an entry to _LIST_ENTRIES"
    assert len(lists) >= 10, lists  # the three commands' checkpoint and providers, backtest's four, serve's shadow
    models = {model.__name__: model for model in _command_settings()}
    for model_name, name in sorted(lists):
        entry = _LIST_ENTRIES[name]
        for given, says in (
            (f"{entry},,", "empty entry between commas"),
            (f",{entry}", "empty entry between commas"),
            (f"{entry},{entry}", "given more than once"),
        ):
            with pytest.raises(ConfigError) as refused:
                models[model_name].from_sources({name: given}, as_flags=True)
            flag = "--" + name.replace("_", "-")
            assert f"{flag}: " in str(refused.value) and says in str(refused.value), (model_name, str(refused.value))


def test_lists_from_yaml(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nquantiles: [0.25, 0.75]\ncovariates: [temp]\nproviders: [cpu]\n")
    settings = BacktestSettings.from_sources(_flags(), config)
    assert settings.quantiles == [0.25, 0.75]
    assert settings.covariates == ["temp"]
    assert settings.providers == [provider_from_kind("cpu")]


def test_comma_string_in_yaml(tmp_path: Path) -> None:
    settings = BacktestSettings.from_sources(_flags(), _yaml(tmp_path, "output: out\nquantiles: 0.1,0.9\n"))
    assert settings.quantiles == [0.1, 0.9]


def test_naive_start_and_end_are_read_as_utc(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nstart: 2024-01-01 00:00:00\n")
    settings = BacktestSettings.from_sources(_flags(end="2024-02-01T12:00:00"), config)
    assert settings.start == datetime(2024, 1, 1, tzinfo=UTC)
    assert settings.end == datetime(2024, 2, 1, 12, tzinfo=UTC)


def test_aware_start_keeps_its_offset() -> None:
    settings = BacktestSettings.from_sources(
        _flags(output="out", start="2024-01-01T02:00:00+02:00", end="2024-01-02T00:00:00Z")
    )
    assert settings.start is not None
    assert settings.start.utcoffset() == timedelta(hours=2)
    assert settings.start == datetime(2024, 1, 1, tzinfo=UTC)
    assert settings.start.tzinfo == timezone(timedelta(hours=2))


def test_what_summary_json_records_rebuilds_the_same_settings(tmp_path: Path) -> None:
    """summary.json stores ``model_dump(mode="json")``: read back, it must mean the same run (paths, URLs,
    timestamps, provider configs)."""
    settings = BacktestSettings.from_sources(
        _flags(
            output="s3://bucket/run",
            data=str(tmp_path / "d.parquet"),
            start="2024-01-01T00:00:00",
            end="2024-01-03T00:00:00+01:00",
            quantiles="0.1,0.5,0.9",
            providers="cuda,cpu",
            gpus_per_actor=0.5,
            progress=False,
        )
    )
    recorded = json.loads(json.dumps(settings.model_dump(mode="json")))
    assert BacktestSettings.from_sources(recorded) == settings


# --- errors: one line, naming the key and where it came from -----------------------------------------------------


def test_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="providers"):
        BacktestSettings.from_sources(_flags(output="out", providers="cpu,quantum"))


def test_unknown_yaml_key_names_key_file_and_the_likely_one(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nn_windowz: 3\n")
    with pytest.raises(ConfigError, match="n_windowz") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert f"[from {config}]" in str(caught.value)
    assert "did you mean 'n_windows'" in str(caught.value)
    assert caught.value.key == "n_windowz"
    assert caught.value.path == str(config)


def test_invalid_value_names_key_and_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nstride: 0\n")
    with pytest.raises(ConfigError, match="stride") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_invalid_value_names_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRIBUTED_ONNX_STRIDE", "zero")
    with pytest.raises(ConfigError) as caught:
        BacktestSettings.from_sources({"output": "out"}, environment=True)
    assert "stride" in str(caught.value)
    assert "[from environment DISTRIBUTED_ONNX_STRIDE]" in str(caught.value)


def test_a_flag_overriding_a_bad_file_value_is_blamed_on_the_flag(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nstride: 3\n")
    with pytest.raises(ConfigError) as caught:
        BacktestSettings.from_sources({"stride": "-1"}, config)
    assert "stride: Input should be greater than 0 [from command line]" in str(caught.value)


def test_invalid_yaml_names_the_file_on_one_line(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        BacktestSettings.from_sources(_flags(output="out"), tmp_path / "absent.yaml")


def test_missing_output_says_how_to_give_it() -> None:
    with pytest.raises(ConfigError, match="output: Field required") as caught:
        BacktestSettings.from_sources(_flags())
    assert "--output, DISTRIBUTED_ONNX_OUTPUT or 'output:' in --config" in str(caught.value)


@pytest.mark.parametrize("quantiles", ["0.1,1.0", "0,0.5", "-0.1", "0.5,1.5"])
def test_quantiles_outside_zero_one_are_rejected(quantiles: str) -> None:
    with pytest.raises(ConfigError, match="quantiles"):
        BacktestSettings.from_sources(_flags(output="out", quantiles=quantiles))


def test_invalid_quantiles_from_yaml_name_the_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nquantiles: [0.5, 1.5]\n")
    with pytest.raises(ConfigError, match="quantiles") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"start": "2024-01-01"}, "start is given without end"),
        ({"end": "2024-01-01"}, "end is given without start"),
        ({"start": "2024-01-02", "end": "2024-01-01"}, "is before start"),
        ({"start": "2024-01-01", "end": "2024-01-02", "n_windows": 3}, "either n_windows or start and end"),
    ],
)
def test_window_range_errors_are_settings_errors(given: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        BacktestSettings.from_sources({"output": "out", **given})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("context_length", "0"), ("horizon", "0"), ("stride", "0"), ("n_windows", "0"), ("min_context_coverage", "1.5")],
)
def test_window_settings_out_of_range_name_the_key_and_the_flag(key: str, value: str) -> None:
    """The user's side of the window spec's bounds: refused before any planning, naming what to fix."""
    expected = rf"^Invalid backtest settings: {key}: Input should be .* \[from command line\]$"
    with pytest.raises(ConfigError, match=expected):
        BacktestSettings.from_sources({"output": "out", key: value})


def test_the_command_reports_start_without_end_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["backtest", "--output", "out", "--start", "2000-08-01"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: Invalid backtest settings: end: ") and "start is given without end" in err


# --- flags generated from the models ------------------------------------------------------------------------


@pytest.mark.parametrize("model", [BacktestSettings, ServeSettings])
def test_every_field_is_a_flag_with_its_description_as_help(model: type[CommandSettings]) -> None:
    parser = argparse.ArgumentParser(formatter_class=lambda prog: argparse.HelpFormatter(prog, width=10_000))
    add_flags(parser, model)
    text = parser.format_help()
    for name, field in model.model_fields.items():
        assert f"--{name.replace('_', '-')}" in text, name
        assert field.description and field.description.strip() in text, name


def test_flags_parse_into_settings_and_absent_flags_stay_absent() -> None:
    flags = _parse(BacktestSettings, ["--output", "o", "--n-windows", "3", "--quantiles", "0.1,0.9", "--no-progress"])
    assert flags == {"output": "o", "n_windows": "3", "quantiles": "0.1,0.9", "progress": False}
    settings = BacktestSettings.from_sources(flags)
    assert (settings.n_windows, settings.quantiles, settings.progress) == (3, [0.1, 0.9], False)


def test_a_new_field_is_a_new_flag_without_touching_the_cli() -> None:
    """How the serve settings grow (a gRPC port, an ingress choice): a field, nothing else."""

    class Grown(ServeSettings):
        label: ClassVar[str] = "grown settings"
        grpc_port: int | None = Field(default=None, ge=1, le=65535, description="gRPC port (default: off).")

    settings = Grown.from_sources(_parse(Grown, ["--grpc-port", "9001", "--replicas", "2"]))
    assert (settings.grpc_port, settings.replicas) == (9001, 2)
    with pytest.raises(ConfigError, match=r"grpc_port: Input should be less than or equal to 65535 \[from command"):
        Grown.from_sources(_parse(Grown, ["--grpc-port", "70000"]))


def test_the_serve_command_has_every_serve_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = capsys.readouterr().out
    for name in ServeSettings.model_fields:
        assert f"--{name.replace('_', '-')}" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from distributed_onnx import __version__

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"distributed-onnx {__version__} (python ")
    assert "onnxruntime " in out and "ray " in out


def test_checkpoints_repeat_as_flags_list_in_yaml_and_stay_one_path_compatible(tmp_path: Path) -> None:
    import argparse

    from distributed_onnx.settings_flags import add_flags, given_flags

    config = _yaml(tmp_path / "cfg", "checkpoint: [a.onnx, /abs/b.onnx]\noutput: run\n")
    from_file = BacktestSettings.from_sources({}, config)
    assert from_file.checkpoint == [tmp_path / "cfg" / "a.onnx", Path("/abs/b.onnx")]
    parser = argparse.ArgumentParser()
    add_flags(parser, BacktestSettings)
    flags = given_flags(parser.parse_args(["--checkpoint", "x.onnx", "--checkpoint", "y.onnx", "--output", "r"]))
    assert BacktestSettings.from_sources(flags).checkpoint == [Path("x.onnx"), Path("y.onnx")]
    assert BacktestSettings(output="r", checkpoint=Path("one.onnx")).checkpoint == [Path("one.onnx")]


def test_serve_several_checkpoints_with_a_shadow(tmp_path: Path) -> None:
    settings = ServeSettings.from_sources({"checkpoint": "a/champion.onnx,b/challenger.onnx", "shadow": "challenger"})
    assert settings.model_names == ["champion", "challenger"]
    assert settings.model_name == "champion"
    assert settings.worker_config().checkpoint == Path("a/champion.onnx")
    config = _yaml(tmp_path / "cfg", "checkpoint: [x.onnx, y.onnx]\nshadow: [x]\nforecast_log: log\n", name="s.yaml")
    from_file = ServeSettings.from_sources({}, config)
    assert from_file.checkpoint == [tmp_path / "cfg" / "x.onnx", tmp_path / "cfg" / "y.onnx"]
    assert from_file.model_name == "y"  # the first that is not a shadow
    assert from_file.forecast_log == tmp_path / "cfg" / "log"
    forecast_log = ServeSettings(forecast_log="s3://bucket/log").forecast_log
    assert forecast_log is not None and forecast_log.reveal() == "s3://bucket/log"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"checkpoint": "a/m.onnx,b/m.onnx"}, "['m'] names several"),
        ({"checkpoint": "m.onnx", "shadow": "other"}, "shadow ['other'] names no checkpoint"),
        ({"checkpoint": "m.onnx", "shadow": "m"}, "every checkpoint (['m']) is a shadow"),
    ],
)
def test_serve_models_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServeSettings.from_sources(values)


def test_serve_checkpoint_flag_repeated() -> None:
    from distributed_onnx.cli import _parser
    from distributed_onnx.settings_flags import given_flags

    arguments = ["serve", "--checkpoint", "x/a.onnx", "--checkpoint", "y/b.onnx", "--shadow", "b"]
    settings = ServeSettings.from_sources(given_flags(_parser(arguments).parse_args(arguments)))
    assert settings.checkpoint == [Path("x/a.onnx"), Path("y/b.onnx")]
    assert settings.model_name == "a" and settings.shadow == ["b"]


def test_only_the_command_given_gets_its_flags_and_every_command_is_listed() -> None:
    """Each settings model costs its imports before a backtest can start Ray: the others are not loaded."""
    import subprocess
    import sys

    script = (
        "import sys; from distributed_onnx import cli; parser = cli._parser(['-v', 'backtest', '--n-windows', '3']);"
        "args = parser.parse_args(['-v', 'backtest', '--n-windows', '3']); assert str(args.n_windows) == '3', args;"
        "assert 'distributed_onnx.serve.settings' not in sys.modules;"
        "assert 'distributed_onnx.live.score.settings' not in sys.modules;"
        "print(parser.format_help())"
    )
    listing = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "{inspect,export,fev,tune,backtest,serve,score}" in listing


def _numeric_fields_without_bounds(model: type[Any]) -> list[str]:
    import annotated_types

    missing = []
    for name, field in model.model_fields.items():
        kinds = {arg for arg in getattr(field.annotation, "__args__", (field.annotation,))}
        if not kinds & {int, float} or bool in kinds:
            continue
        constraints = field.metadata
        low = any(isinstance(item, annotated_types.Ge | annotated_types.Gt) for item in constraints)
        high = any(isinstance(item, annotated_types.Le | annotated_types.Lt) for item in constraints)
        if not (low and high):
            missing.append(name)
    return missing


def test_every_numeric_setting_has_bounds() -> None:
    """Issue 40 (settings have bounds): every int or float setting of every command is bounded both ways where it
    is parsed, so nothing overflows later (a latency in int64 nanoseconds, 2 x replicas + 2 ports)."""
    models = [command.settings() for command in cli.COMMANDS]  # every command's, enumerated (issue 51)
    named = {model.__name__ for model in models}
    assert named >= {"BacktestSettings", "ServeSettings", "ScoreSettings", "ExportRequest", "TuneRequest"}
    for model in models:
        assert _numeric_fields_without_bounds(model) == [], model.__name__


@pytest.mark.parametrize(
    ("arguments", "setting"),
    [
        (["serve", "--max-replicas", "3000"], "max_replicas"),
        (["serve", "--replicas", "3000"], "replicas"),
        (
            ["backtest", "--data", "d.parquet", "--output", "o", "--covariate-latency", "153722867280"],
            "covariate_latency",
        ),
        (["backtest", "--data", "d.parquet", "--output", "o", "--covariate-latency", str(10**17)], "covariate_latency"),
        (["backtest", "--data", "d.parquet", "--output", "o", "--n-windows", str(10**12)], "n_windows"),
        (["backtest", "--data", "d.parquet", "--output", "o", "--stride", str(10**12)], "stride"),
        (["backtest", "--data", "d.parquet", "--output", "o", "--horizon", str(10**12)], "horizon"),
        (["backtest", "--data", "d.parquet", "--output", "o", "--rows-per-batch", str(10**12)], "rows_per_batch"),
        (["backtest", "--data", "d.parquet", "--output", "o", "--actors", str(10**9)], "actors"),
        (
            ["export", "chronos2", "--from-pretrained", ".", "--output", "m.onnx", "--parity-windows", "0"],
            "parity_windows",
        ),
        (
            ["export", "chronos2", "--from-pretrained", ".", "--output", "m.onnx", "--resolution-minutes", "-5"],
            "resolution_minutes",
        ),
    ],
)
def test_a_setting_beyond_its_bound_is_one_line_naming_it(
    arguments: list[str], setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40, defects 3, 15 and 16: ``--max-replicas 3000`` exited 3 ("no 6002 consecutive free ports ...
    rerun"), a huge latency wrapped around, ``export --parity-windows 0`` exited 4: each is now exit 2, one line
    naming the setting (as the flag the user typed, issue 51), before anything starts."""
    assert cli.main(arguments) == 2
    printed = capsys.readouterr().err.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("error: "), printed
    assert f"--{setting.replace('_', '-')}:" in printed[0] and "Traceback" not in printed[0]


def test_auto_joins_a_running_ray_for_a_backtest_and_serve_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``address: auto`` (docs/cluster.md) is a backtest's; serve keeps Serve in the Ray it runs on, so it joins
    one only by its address."""
    monkeypatch.setenv("DISTRIBUTED_ONNX_ADDRESS", "auto")
    settings = BacktestSettings.from_sources(_flags(output=tmp_path / "run", n_windows=3), environment=True)
    assert settings.address == "auto"
    with pytest.raises(ValueError, match=r"joins a running Ray only by its address \(--address HOST:PORT\)"):
        ServeSettings(checkpoint=["m.onnx"], address="auto")
    assert ServeSettings(checkpoint=["m.onnx"], address="127.0.0.1:6379").address == "127.0.0.1:6379"


@pytest.mark.parametrize(
    "argv",
    [
        ["backtest", "--output", "o", "--cpus-per-actor", "1e-300"],
        ["backtest", "--output", "o", "--gpus-per-actor", "1e-9"],
        ["serve", "--cpus-per-replica", "0.00001"],
        ["serve", "--gpus-per-replica", "1e-300"],
    ],
)
def test_a_share_below_rays_unit_is_one_line_naming_the_flag(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack E: Ray counts resources in units of 0.0001 and refused a smaller share with its own ValueError,
    which the command reported as an internal error (exit 4)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and argv[-2] in err, err


def test_zero_gpus_and_one_unit_are_taken() -> None:
    settings = BacktestSettings(checkpoint=[REFERENCE_CHECKPOINT], data=REFERENCE_DATASET, output="o")
    assert settings.model_copy(update={"gpus_per_actor": 0.0}).gpus_per_actor == 0.0
    assert BacktestSettings(
        checkpoint=[REFERENCE_CHECKPOINT], data=REFERENCE_DATASET, output="o", cpus_per_actor=1e-4, gpus_per_actor=1e-4
    ).cpus_per_actor == pytest.approx(1e-4)
