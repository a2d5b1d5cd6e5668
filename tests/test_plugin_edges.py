"""A plugin that exits at import, and one that claims a built-in family: each is one line naming the plugin.

Issue 40, defect 17: a plugin module calling ``sys.exit`` at import took the worker with it ("A worker actor
died" in a backtest, ``ActorDiedError()`` in serve, neither naming the plugin), and a plugin registered as
``chronos2`` was silently ignored. The module is real (imported from a temporary folder); what is faked is only
the list of installed entry points (installing a package that claims ``chronos2`` into the shared environment
would change every other run there).
"""

from __future__ import annotations

import json
from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest
from backtest_data import write_dataset
from graphs import tiny_chronos2_metadata, tiny_context_quantiles_model, write_tiny_context_quantiles

from distributed_onnx import cli
from distributed_onnx.errors import PluginError
from distributed_onnx.model import families
from distributed_onnx.model.adapters import PLUGIN_GROUP, adapter_for
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
    monkeypatch.setattr(families, "_plugins", lambda: list(entries))
    monkeypatch.setattr(families, "_SHADOW_CHECKED", set())
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


RECORDED = "tiny_recorded_family"
RECORD_MODULE = f'''
"""A plugin declaring a whole Family record: the plain graph's adapter and an exporter of its own."""
from graphs import tiny_context_quantiles_model, write_tiny_context_quantiles

from distributed_onnx.export import ExportResult
from distributed_onnx.model.checkpoint import default_metadata_path, write_checkpoint
from distributed_onnx.model.families import Family

FAMILY = Family(
    name="{RECORDED}",
    adapter="distributed_onnx.model.adapters:ContextQuantilesAdapter",
    exporter="recorded_plugin",
    hub_repository="example/recorded",
)


def export(request):
    plain = write_tiny_context_quantiles(request.folder)
    metadata = plain.metadata.model_copy(update={{"model_family": "{RECORDED}"}})
    written = write_checkpoint(request.output, tiny_context_quantiles_model().SerializeToString(), metadata)
    parity = request.output.with_suffix(".parity.json")
    parity.write_text("{{}}")
    return ExportResult(
        weights_path=written.weights_path, metadata_path=default_metadata_path(request.output), parity_path=parity,
        parity={{"windows": 0}},
    )
'''


@pytest.mark.integration
def test_a_plugin_family_record_brings_its_exporter_to_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: adding a family is one record; a plugin's record reaches export's help, export and inspect."""
    (tmp_path / "recorded_plugin.py").write_text(RECORD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib_metadata.EntryPoint(name=RECORDED, value="recorded_plugin:FAMILY", group=PLUGIN_GROUP)
    monkeypatch.setattr(families, "_plugins", lambda: [entry])
    monkeypatch.setattr(families, "_LOADED", {})
    monkeypatch.setattr(families, "_FACTORIES", {})

    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    assert f"installed plugins: {RECORDED}" in " ".join(capsys.readouterr().out.split())

    (tmp_path / "folder").mkdir()
    output = tmp_path / "recorded.onnx"
    argv = ["export", RECORDED, "--from-pretrained", str(tmp_path / "folder"), "--output", str(output)]
    assert cli.main([*argv, "--resolution-minutes", "30"]) == 0, capsys.readouterr().err
    assert f"wrote {output}" in capsys.readouterr().out

    # Issue 52 (5): a record that declares no int8 quantization is refused --quantize up front, saying why.
    quantized = ["export", RECORDED, "--from-pretrained", str(tmp_path / "folder"), "--quantize", "int8"]
    assert cli.main([*quantized, "--output", str(tmp_path / "q.onnx"), "--resolution-minutes", "30"]) == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert f"--quantize int8 --quantize-mode dynamic is refused for family '{RECORDED}'" in error, error
    assert "declares no int8 quantization" in error and "Export without --quantize" in error, error
    assert not (tmp_path / "q.onnx").exists()

    assert cli.main(["inspect", str(output)]) == 0
    described = json.loads(capsys.readouterr().out)["family"]
    assert (described["name"], described["exporter"], described["hub_repository"]) == (
        RECORDED,
        "recorded_plugin",
        "example/recorded",
    )
