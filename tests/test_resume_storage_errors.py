"""A resume never deletes finished work because the storage did not answer (integration tier for ORT, no Ray).

The run directory lives on a filesystem that fails on demand (:mod:`flaky_storage`, reached through
:mod:`distributed_onnx.storage` as an object store is). Absent or corrupt files are redone; a read that fails
with any other ``OSError`` is retried with backoff, then the run stops with one line, deleting nothing. Before
this, any ``OSError`` while reading a part's sums or footer marked the part not done and both good files were
deleted, and an ``OSError`` from the size check was a traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

import flaky_storage
from backtest_data import run_parts_in_process, settings_for, write_dataset

from distributed_onnx import cli, storage, writable
from distributed_onnx.errors import StorageError
from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.backtest import run_backtest
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.evaluation.sums import read_done_part
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Retries without sleeping (three attempts), and no failure left armed for the next test."""
    monkeypatch.setattr(storage, "READ_RETRY_DELAYS_S", (0.0, 0.0), raising=False)
    # flaky:// is an fsspec store, which a command's output does not take (writable.WRITABLE_SCHEMES): this
    # in-process test writes there as an object store would be written
    monkeypatch.setattr(writable, "WRITABLE_SCHEMES", (*writable.WRITABLE_SCHEMES, "flaky"))
    flaky_storage.FAILURES.clear()
    flaky_storage.FAILED.clear()
    yield
    flaky_storage.FAILURES.clear()


@pytest.fixture
def finished(tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint) -> BacktestSettings:
    """A run whose every part is written (by the actors' own code, in process) to the flaky filesystem."""
    data = write_dataset(tmp_path / "load.parquet")
    output = f"flaky://{uuid.uuid4().hex}/run"
    settings = settings_for(tiny_checkpoint.weights_path, data, output, rows_per_batch=4)
    run_parts_in_process(settings)
    return settings


def _files(settings: BacktestSettings) -> list[str]:
    directories = [storage.join(settings.output, outputs.SCORES_DIR), outputs.model_dir(settings.output, "tiny")]
    return [str(path).rsplit("/", 1)[-1] for folder in directories for path in storage.list_files(folder, "part-", "")]


def _verify(settings: BacktestSettings, index: int) -> object:
    from distributed_onnx.evaluation.planning import prepare

    plan = prepare(settings)
    part = plan.parts()[index]
    return read_done_part(
        settings.output, index, plan.run_fingerprint, part.n_windows, plan.spec.horizon, plan.model_fingerprints
    )


@pytest.mark.parametrize("pattern", ["part-000001.arrow", "part-000001.parquet"])
def test_a_read_that_fails_now_and_then_is_retried(finished: BacktestSettings, pattern: str) -> None:
    flaky_storage.FAILURES[pattern] = 2  # the first two reads fail, the third answers
    assert _verify(finished, 1) is not None
    assert len(flaky_storage.FAILED) == 2


@pytest.mark.parametrize(
    ("pattern", "operation"),
    [("part-000001.arrow", "open"), ("part-000001.parquet", "open"), ("part-000001.parquet", "info")],
)
def test_a_read_that_keeps_failing_stops_the_resume_and_deletes_nothing(
    finished: BacktestSettings, pattern: str, operation: str
) -> None:
    before = _files(finished)
    assert len(before) == 6  # three parts, two files each

    flaky_storage.FAILURES[f"{operation}:{pattern}"] = -1
    with pytest.raises(StorageError, match=r"Cannot read part 1 of flaky://.* \(3 attempts over 0 s\): .*injected"):
        run_backtest(finished)  # the resume verifies every part before Ray starts
    assert _files(finished) == before
    assert {failed[0] for failed in flaky_storage.FAILED} == {operation}, flaky_storage.FAILED


def test_absent_and_corrupt_files_are_still_redone(finished: BacktestSettings) -> None:
    storage.delete(outputs.sums_path(finished.output, 0))
    torn = outputs.part_path(finished.output, "tiny", 2)
    payload = storage.read_bytes(torn)
    storage.write_bytes(torn, payload[: len(payload) // 2])
    assert _verify(finished, 0) is None
    assert _verify(finished, 2) is None
    assert _verify(finished, 1) is not None
    assert flaky_storage.FAILED == []


def test_the_command_says_so_in_one_line(finished: BacktestSettings, capsys: pytest.CaptureFixture[str]) -> None:
    flaky_storage.FAILURES["part-000000.parquet"] = -1
    argv = ["backtest", "--checkpoint", str(finished.checkpoint[0]), "--data", str(finished.data)]
    argv += ["--output", str(finished.output), "--n-windows", "5", "--stride", "3", "--quantiles", "0.1,0.5,0.9"]
    argv += ["--rows-per-batch", "4", "--actors", "2", "--cpus-per-actor", "1", "--no-progress"]
    code = cli.main(argv)
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(error) == 1 and error[0].startswith("error: Cannot read part 0 of flaky://"), error
    assert "Nothing was deleted" in error[0]
