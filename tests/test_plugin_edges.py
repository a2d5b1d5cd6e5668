"""A plugin that exits at import, and one that claims a built-in family: each is one line naming the plugin.

Issue 40, defect 17: a plugin module calling ``sys.exit`` at import took the worker with it ("A worker actor
died" in a backtest, ``ActorDiedError()`` in serve, neither naming the plugin), and a plugin registered as
``chronos2`` was silently ignored. The module is real (imported from a temporary folder); what is faked is only
the list of installed entry points (installing a package that claims ``chronos2`` into the shared environment
would change every other run there).
"""

from __future__ import annotations

from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest
from backtest_data import write_dataset
from graphs import tiny_chronos2_metadata, tiny_context_quantiles_model, write_tiny_context_quantiles

from distributed_onnx import cli
from distributed_onnx.errors import PluginError
from distributed_onnx.model.adapters import PLUGIN_GROUP, adapter_for
from distributed_onnx.model.adapters import base as adapters_base
from distributed_onnx.model.checkpoint import write_checkpoint

EXITING = "tiny_exiting_family"


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[importlib_metadata.EntryPoint]:
    """Installed entry points: a family whose module exits at import, and one claiming ``chronos2``."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "exiting_plugin.py").write_text("import sys\n\nsys.exit(3)\n")
    (folder / "shadowing_plugin.py").write_text("from distributed_onnx.model.adapters import Chronos2Adapter\n")
    monkeypatch.syspath_prepend(str(folder))
    entries = [
        importlib_metadata.EntryPoint(name=EXITING, value="exiting_plugin:Adapter", group=PLUGIN_GROUP),
        importlib_metadata.EntryPoint(name="chronos2", value="shadowing_plugin:Chronos2Adapter", group=PLUGIN_GROUP),
    ]
    monkeypatch.setattr(adapters_base, "_plugins", lambda: list(entries))
    monkeypatch.setattr(adapters_base, "_SHADOW_CHECKED", set(), raising=False)
    return entries


@pytest.mark.usefixtures("plugins")
def test_a_plugin_that_exits_at_import_is_a_plugin_error_naming_it() -> None:
    metadata = tiny_chronos2_metadata().model_copy(update={"model_family": EXITING})
    with pytest.raises(PluginError, match=r"'tiny_exiting_family' \('exiting_plugin:Adapter'.*SystemExit: 3"):
        adapter_for(metadata)


@pytest.mark.usefixtures("plugins")
def test_a_plugin_claiming_a_built_in_family_is_refused_naming_it() -> None:
    for _ in range(2):  # every time, not only the first
        with pytest.raises(PluginError, match=r"'shadowing_plugin:Chronos2Adapter'.*model_family 'chronos2'"):
            adapter_for(tiny_chronos2_metadata())


@pytest.mark.usefixtures("plugins")
def test_a_backtest_with_a_plugin_that_exits_names_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = write_tiny_context_quantiles(tmp_path)
    metadata = plain.metadata.model_copy(update={"model_family": EXITING})
    graph = tiny_context_quantiles_model().SerializeToString()
    checkpoint = write_checkpoint(tmp_path / "exiting.onnx", graph, metadata)
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    argv = ["backtest", "--checkpoint", str(checkpoint.weights_path), "--data", str(data)]
    argv += ["--output", str(tmp_path / "run"), "--n-windows", "2", "--no-progress"]
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "exiting_plugin:Adapter" in errors[0] and "SystemExit" in errors[0], errors
