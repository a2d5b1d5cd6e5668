"""cluster.yaml and jobs/backtest.yaml are valid: Ray's own launcher schema, and the backtest settings model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.runtime import ray_private

REPO = Path(__file__).resolve().parent.parent


def test_cluster_yaml_passes_rays_validation() -> None:
    pytest.importorskip("jsonschema")
    prepare_config = ray_private.AUTOSCALER_PREPARE_CONFIG.get()
    validate_config = ray_private.AUTOSCALER_VALIDATE_CONFIG.get()
    config = prepare_config(yaml.safe_load((REPO / "cluster.yaml").read_text()))  # what `ray up` does first
    validate_config(config)  # raises on any schema or node-type error
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    gpu_types = [name for name, spec in types.items() if spec["resources"].get("GPU", 0) > 0]
    assert gpu_types, "no GPU worker node type"
    assert any("distributed-onnx[gpu]" in command for command in config["setup_commands"])
    starts = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert "RAY_AUTH_MODE=disabled" not in starts
    assert starts.count("RAY_AUTH_MODE=token ray start") == 2


def test_example_job_config_is_valid_settings() -> None:
    settings = BacktestSettings.from_sources({}, REPO / "jobs" / "backtest.yaml")
    assert settings.output is not None and settings.output.is_url and settings.output.scheme == "s3"
    assert settings.quantiles == [0.1, 0.5, 0.9]
