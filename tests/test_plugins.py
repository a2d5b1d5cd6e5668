"""A model family from another package reaches every process: a plugin installed into the venv, then a backtest on
real local Ray (its actors) and ``distributed-onnx serve`` (its replica) with a checkpoint of that family.

The plugin is a real package built in a temporary directory and ``pip install``-ed (uninstalled afterwards). Its
adapter is the plain family's plus 1000 on every output, so a forecast shows which code produced it: a process that
did not load the plugin could not have written it. ``register_adapter`` in the test process would not do: Ray's
actors and Serve's replicas are other processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from backtest_data import in_process_forecasts, read_forecasts, settings_for, write_dataset
from conftest import free_ports, wait_until_ready
from graphs import tiny_context_quantiles_model, write_tiny_context_quantiles

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError, PluginError
from distributed_onnx.location import Location
from distributed_onnx.model import families
from distributed_onnx.model.adapters import PLUGIN_GROUP, adapter_for
from distributed_onnx.model.checkpoint import ResolvedCheckpoint, write_checkpoint

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.integration

FAMILY = "tiny_plugin_family"
BROKEN = "tiny_plugin_broken"
DISTRIBUTION = "distributed-onnx-tiny-plugin"
SHIFT = 1000.0

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{DISTRIBUTION}"
version = "0.1.0"
dependencies = ["distributed-onnx"]

[project.entry-points."{PLUGIN_GROUP}"]
{FAMILY} = "tiny_plugin:ShiftedAdapter"
{BROKEN} = "tiny_plugin.missing:Adapter"

[tool.setuptools]
packages = ["tiny_plugin"]
"""

MODULE = f'''
"""A third-party model family: the plain context-quantiles graph, its outputs shifted by {SHIFT}."""

import numpy as np

from distributed_onnx.model.adapters import ContextQuantilesAdapter


class ShiftedAdapter(ContextQuantilesAdapter):
    def decode(self, outputs, target_rows):
        return super().decode(outputs, target_rows) + np.float32({SHIFT})
'''


def _pip(*arguments: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *arguments], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The plugin package installed into this venv for the module's tests, and uninstalled after them."""
    source = tmp_path_factory.mktemp("plugin")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "tiny_plugin").mkdir()
    (source / "tiny_plugin" / "__init__.py").write_text(MODULE)
    _pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    try:
        yield
    finally:
        _pip("uninstall", "--quiet", "--yes", DISTRIBUTION)


def _plugin_checkpoint(directory: Path) -> ResolvedCheckpoint:
    plain = write_tiny_context_quantiles(directory)
    metadata = plain.metadata.model_copy(update={"model_family": FAMILY})
    return write_checkpoint(directory / "plugged.onnx", tiny_context_quantiles_model().SerializeToString(), metadata)


@pytest.mark.usefixtures("plugin", "ray_session")
def test_a_plugin_family_backtests_on_ray_and_serves_over_http(tmp_path: Path) -> None:
    checkpoint = _plugin_checkpoint(tmp_path)
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    settings = settings_for(checkpoint.weights_path, data, tmp_path / "run", seasonality=8)
    argv = ["backtest", "--checkpoint", str(checkpoint.weights_path), "--data", str(data)]
    argv += ["--output", str(settings.output), "--seasonality", "8", "--n-windows", "5", "--stride", "3"]
    argv += ["--actors", "2", "--rows-per-batch", "4", "--quantiles", "0.1,0.5,0.9", "--no-progress"]
    assert cli.main(argv) == 0

    # The actors' forecasts are the plain graph's, shifted: the plugin's adapter ran there.
    plain = tmp_path / "tiny_plain.onnx"
    expected = in_process_forecasts(
        settings.model_copy(update={"checkpoint": [plain], "output": Location(tmp_path / "ref")})
    )
    got = read_forecasts(settings.output)
    assert got.column("window_id").equals(expected.column("window_id"))
    for level in ("q0.1", "q0.5", "q0.9"):
        shifted = got.column(level).to_numpy() - expected.column(level).to_numpy()
        np.testing.assert_allclose(shifted, SHIFT, rtol=0, atol=1e-2)

    # The replica (another process) loads the plugin too.
    port, grpc_port = free_ports(2)  # both: another serve on this machine may hold the default gRPC port
    command = [sys.executable, "-m", "distributed_onnx", "serve", "--checkpoint", str(checkpoint.weights_path)]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--grpc-port", str(grpc_port), "--max-batch-size", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, process)
        body = {"series": [{"series_id": "a", "y": [float(v) for v in range(1, 21)]}], "quantiles": [0.1, 0.5, 0.9]}
        response = httpx.post(f"{url}/v1/forecast", json=body, timeout=60)
        assert response.status_code == 200, response.text
        quantiles = response.json()["forecasts"][0]["quantiles"]
        assert quantiles["0.5"] == [20.0 + SHIFT] * len(quantiles["0.5"])  # the last value, shifted
        assert quantiles["0.1"][0] == 19.0 + SHIFT
    finally:
        process.terminate()
        process.communicate(timeout=60)


@pytest.mark.usefixtures("plugin")
def test_a_plugin_family_is_listed_by_export_help_and_described_by_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: the family registry reaches the CLI with no other edit than installing the plugin."""
    wide = {**os.environ, "COLUMNS": "1000"}  # argparse wraps at hyphens too: one line per argument's help
    helped = subprocess.run(
        [sys.executable, "-m", "distributed_onnx", "export", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env=wide,
    )
    assert helped.returncode == 0, helped.stderr
    listed = " ".join(helped.stdout.split())  # argparse wraps the help
    built_in = ", ".join(family.name for family in families.BUILT_IN if family.exporter is not None)
    assert f"the model family: {built_in}; installed plugins: " in listed
    assert "chronos2, chronos_bolt, tirex, timesfm, moirai2, toto;" in listed
    assert f"{FAMILY} (from {DISTRIBUTION})" in listed

    checkpoint = _plugin_checkpoint(tmp_path)
    assert cli.main(["inspect", str(checkpoint.weights_path)]) == 0
    family = json.loads(capsys.readouterr().out)["family"]
    assert family["known"] is True
    assert (family["name"], family["adapter"], family["provider"]) == (
        FAMILY,
        "tiny_plugin:ShiftedAdapter",
        DISTRIBUTION,
    )

    # Its entry point is an adapter factory, not a Family record with an exporter: export says so, exit 2.
    argv = ["export", FAMILY, "--random-weights", "--output", str(tmp_path / "x.onnx"), "--resolution-minutes", "60"]
    assert cli.main(argv) == 2
    assert f"error: Cannot export family '{FAMILY}' ({DISTRIBUTION} declares no exporter for it)" in (
        capsys.readouterr().err
    )


@pytest.mark.usefixtures("plugin")
def test_a_plugin_that_fails_to_load_is_named_and_an_unknown_family_says_how_to_add_one(tmp_path: Path) -> None:
    metadata = write_tiny_context_quantiles(tmp_path).metadata
    with pytest.raises(PluginError, match=rf"'{BROKEN}' \('tiny_plugin.missing:Adapter', from {DISTRIBUTION}\)"):
        adapter_for(metadata.model_copy(update={"model_family": BROKEN}))
    with pytest.raises(ConfigError, match=rf"installed plugins: .*'{FAMILY}'.*entry-point group '{PLUGIN_GROUP}'"):
        adapter_for(metadata.model_copy(update={"model_family": "no_such_family"}))
