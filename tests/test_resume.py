"""A resume on a run whose every part is done (integration tier for ORT, no Ray: nothing is left to dispatch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import run_parts_in_process, settings_for, write_dataset

from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.integration


def test_failed_windows_of_an_earlier_invocation_are_removed_once_done(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint
) -> None:
    """Before, the file stayed and listed windows as failed that the resume had finished."""
    settings = settings_for(tiny_checkpoint.weights_path, write_dataset(tmp_path / "load.parquet"), tmp_path / "run")
    run_parts_in_process(settings)  # every part written, as a resume that finished them leaves the directory
    stale = Path(settings.output) / "failed_windows.json"
    stale.write_text(json.dumps([{"part": 1, "windows": 4, "error": "StorageError: ...", "window_ids": ["a"]}]))

    result = run_backtest(settings)

    assert result.failed_parts == []
    assert not stale.exists()
    assert any("failed_windows.json of an earlier invocation was removed" in note for note in result.summary["notes"])
