"""Unit tier: backtest settings (defaults < YAML file < flags, comma lists, errors naming file and key)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from distributed_onnx.backend.providers import provider_from_kind
from distributed_onnx.backtest.settings import BacktestSettings
from distributed_onnx.errors import ConfigError
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "backtest.yaml"
    path.write_text(text)
    return path


def _flags(**given: Any) -> dict[str, Any]:
    """Flags as the CLI passes them: every key present, None when not given."""
    flags: dict[str, Any] = {"output": None, "n_windows": None, "stride": None, "quantiles": None, "actors": None}
    flags.update(given)
    return flags


def test_defaults(tmp_path: Path) -> None:
    settings = BacktestSettings.from_sources(_flags(output=tmp_path / "run", n_windows=3))
    assert settings.checkpoint == REFERENCE_CHECKPOINT
    assert settings.data == REFERENCE_DATASET
    assert settings.stride == 1
    assert settings.rows_per_batch == 256
    assert settings.quantiles is None
    assert settings.covariates == []
    assert settings.providers is None


def test_yaml_overrides_defaults_and_flags_override_yaml(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: from-yaml\nn_windows: 45\nstride: 24\nrows_per_batch: 64\n")
    settings = BacktestSettings.from_sources(_flags(stride=6), config)
    assert settings.output == Path("from-yaml")
    assert settings.n_windows == 45  # YAML over the default
    assert settings.stride == 6  # flag over YAML
    assert settings.rows_per_batch == 64
    assert settings.cpus_per_actor == 1.0  # default where neither says


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


def test_comma_lists_from_flags() -> None:
    settings = BacktestSettings.from_sources(
        _flags(output="out", quantiles="0.1, 0.5,0.9", covariates="temp,wind , ", providers="cuda,cpu")
    )
    assert settings.quantiles == [0.1, 0.5, 0.9]
    assert settings.covariates == ["temp", "wind"]
    assert settings.providers == [provider_from_kind("cuda"), provider_from_kind("cpu")]


def test_lists_from_yaml(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nquantiles: [0.25, 0.75]\ncovariates: [temp]\nproviders: [cpu]\n")
    settings = BacktestSettings.from_sources(_flags(), config)
    assert settings.quantiles == [0.25, 0.75]
    assert settings.covariates == ["temp"]
    assert settings.providers == [provider_from_kind("cpu")]


def test_comma_string_in_yaml(tmp_path: Path) -> None:
    settings = BacktestSettings.from_sources(_flags(), _yaml(tmp_path, "output: out\nquantiles: 0.1,0.9\n"))
    assert settings.quantiles == [0.1, 0.9]


def test_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="providers"):
        BacktestSettings.from_sources(_flags(output="out", providers="cpu,quantum"))


def test_unknown_yaml_key_names_key_and_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nn_windowz: 3\n")
    with pytest.raises(ConfigError, match="n_windowz") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_invalid_value_names_key_and_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nstride: 0\n")
    with pytest.raises(ConfigError, match="stride") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        BacktestSettings.from_sources(_flags(output="out"), tmp_path / "absent.yaml")


def test_output_is_required() -> None:
    with pytest.raises(ConfigError, match="output"):
        BacktestSettings.from_sources(_flags())


@pytest.mark.parametrize("quantiles", ["0.1,1.0", "0,0.5", "-0.1", "0.5,1.5"])
def test_quantiles_outside_zero_one_are_rejected(quantiles: str) -> None:
    with pytest.raises(ConfigError, match="quantiles"):
        BacktestSettings.from_sources(_flags(output="out", quantiles=quantiles))


def test_invalid_quantiles_from_yaml_name_the_file(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nquantiles: [0.5, 1.5]\n")
    with pytest.raises(ConfigError, match="quantiles") as caught:
        BacktestSettings.from_sources(_flags(), config)
    assert str(config) in str(caught.value)


def test_naive_start_and_end_are_read_as_utc(tmp_path: Path) -> None:
    config = _yaml(tmp_path, "output: out\nstart: 2024-01-01 00:00:00\n")
    settings = BacktestSettings.from_sources(_flags(end="2024-02-01T12:00:00"), config)
    assert settings.start == datetime(2024, 1, 1, tzinfo=UTC)
    assert settings.end == datetime(2024, 2, 1, 12, tzinfo=UTC)


def test_aware_start_keeps_its_offset() -> None:
    settings = BacktestSettings.from_sources(_flags(output="out", start="2024-01-01T02:00:00+02:00"))
    assert settings.start is not None
    assert settings.start.utcoffset() == timedelta(hours=2)
    assert settings.start == datetime(2024, 1, 1, tzinfo=UTC)
    assert settings.start.tzinfo == timezone(timedelta(hours=2))


def test_settings_are_frozen() -> None:
    settings = BacktestSettings.from_sources(_flags(output="out"))
    with pytest.raises(ValueError):
        settings.stride = 3  # type: ignore[misc]
