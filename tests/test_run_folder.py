"""The backtest's output folder holds one run, this one (outside tester's findings, through the command).

A folder without this project's run record that holds files is refused, naming them (it was written into: its
``metrics.parquet`` overwritten, an older run's parts and stray files left inside the ``forecasts/`` dataset and
read back as this run's); a run folder's ``forecasts/`` ends holding this run's parts only (anything else moved
to ``removed/``, said); a ``run.json`` that is not a manifest says so without advice that leads to the first case;
a second run on a folder in use is refused at once, naming the run that holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from backtest_data import write_dataset

from distributed_onnx import cli
from distributed_onnx.model.checkpoint import ResolvedCheckpoint


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tree(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_folder_that_is_not_this_runs_is_refused_and_forecasts_hold_only_the_runs_parts(
    tmp_path: Path,
    tiny_checkpoint: ResolvedCheckpoint,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    output = tmp_path / "rid"
    flags = ["--actors", "1", "--no-progress", "--windows-per-part", "4"]
    base = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), *flags]
    base += ["--output", str(output)]
    first = [*base, "--n-windows", "4", "--quantiles", "0.1,0.5,0.9"]
    assert cli.main(first) == 0, capsys.readouterr().err
    parts = output / "forecasts" / "model=tiny"
    assert len(list(parts.iterdir())) > 1

    # (a) run.json deleted, another command into the folder: refused, nothing touched (it ran, kept the old parts).
    (output / "run.json").unlink()
    before = _tree(output)
    capsys.readouterr()
    assert cli.main([*base, "--n-windows", "2", "--stride", "3", "--quantiles", "0.5"]) == 2
    line = _error(capsys)
    assert "holds" in line and "no run record (run.json)" in line and "forecasts/model=tiny/part-000000" in line
    assert "another --output" in line, line
    assert _tree(output) == before

    # A run.json of {}: not "a JSON object ... found a JSON dict", and no advice to delete it (that leads to (a)).
    (output / "run.json").write_text("{}")
    assert cli.main(first) == 2
    line = _error(capsys)
    assert "found a JSON object without one" in line and "delete" not in line, line

    # (b) a folder of someone's files: refused before anything is written, naming them.
    other = tmp_path / "mine"
    (other / "forecasts" / "model=tiny").mkdir(parents=True)
    for name in ("notes.txt", "metrics.parquet", "forecasts/mynotes.txt", "forecasts/model=tiny/part-000099.parquet"):
        (other / name).write_text("mine")
    before = _tree(other)
    assert cli.main([*base[:-2], "--output", str(other), "--n-windows", "4"]) == 2
    line = _error(capsys)
    assert f"--output {other} holds 4 file(s) but no run record" in line and "notes.txt" in line, line
    assert _tree(other) == before

    # The run's own folder with stray files in forecasts/: the rerun moves them out, said; the dataset is the run's.
    (output / "run.json").unlink()
    for path in sorted(output.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert cli.main(first) == 0, capsys.readouterr().err
    (output / "forecasts" / "mynotes.txt").write_text("mine")
    stray = (parts / "part-000000.parquet").read_bytes()
    (parts / "part-000099.parquet").write_bytes(stray)
    capsys.readouterr()
    assert cli.main(first) == 0, capsys.readouterr().err
    assert "2 file(s) in forecasts/ are not this run's parts: moved to" in caplog.text
    assert (output / "removed" / "mynotes.txt").read_text() == "mine"
    assert (output / "removed" / "model=tiny" / "part-000099.parquet").read_bytes() == stray
    assert not (parts / "part-000099.parquet").exists() and not (output / "forecasts" / "mynotes.txt").exists()
    summary = json.loads((output / "summary.json").read_text())
    forecasts = pd.read_parquet(output / "forecasts")
    assert forecasts["window_id"].nunique() == summary["windows"]["planned"]
    assert len(forecasts) == summary["windows"]["planned"] * tiny_checkpoint.metadata.horizon_length


LOCK_HOLDER = """
import sys, time
from distributed_onnx.evaluation.run_lock import run_lock
from distributed_onnx.location import Location
with run_lock(Location.parse(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_second_backtest_on_a_folder_in_use_is_refused_at_once_naming_the_run_holding_it(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two identical backtests started a second apart both computed every window; summary.json kept one."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    output = tmp_path / "rid"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(output)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data)]
        argv += ["--output", str(output), "--n-windows", "2", "--no-progress"]
        assert cli.main(argv) == 2
        line = _error(capsys)
        assert f"--output {output} is in use by another backtest (pid {holder.pid} on " in line, line
        assert not (output / "forecasts").exists()
    finally:
        holder.kill()
        holder.wait()
    assert cli.main(argv) == 0, capsys.readouterr().err  # the holder gone (killed), its lock went with it


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_entries_planted_in_a_run_folder_are_refused_or_replaced_never_written_through(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside tester: a link at ``run.lock`` had the lock's record written over its target (a checkpoint, notes);
    an entry in the way (``removed`` a file, ``run.lock`` a folder) was exit 3 "rerun to resume"; ``removed/``
    overwrote what an earlier run set aside; a dangling link as --output said "File exists"."""
    data = write_dataset(tmp_path / "data.parquet", covariate=False)
    output = tmp_path / "base"
    argv = ["backtest", "--checkpoint", str(tiny_checkpoint.weights_path), "--data", str(data), "--no-progress"]
    argv += ["--actors", "1", "--n-windows", "2", "--stride", "48", "--output", str(output)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    precious = tmp_path / "precious.onnx"
    precious.write_bytes(tiny_checkpoint.weights_path.read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    lock = output / "run.lock"

    lock.unlink()
    lock.symlink_to(precious)
    assert cli.main(argv) == 2
    line = _error(capsys)
    assert f"{lock}, the run's lock, cannot be written: a symbolic link to {precious}" in line, line
    lock.unlink()
    os.link(notes, lock)
    assert cli.main(argv) == 2
    assert "is a file with 2 names (a hard link)" in _error(capsys)
    lock.unlink()
    lock.mkdir()
    assert cli.main(argv) == 2
    assert f"{lock} is in the way: the run writes a file there, and it is a folder" in _error(capsys)
    lock.rmdir()
    (output / "removed").write_text("in the way")
    assert cli.main(argv) == 2
    assert f"{output / 'removed'} is in the way: the run makes a folder there, and it is a file" in _error(capsys)
    (output / "removed").unlink()
    assert precious.read_bytes() == tiny_checkpoint.weights_path.read_bytes() and notes.read_text() == "my notes"

    # Links planted at the files the run writes are replaced, their targets untouched; removed/ keeps both strays.
    for name in ("summary.json", "report.html", "metrics.parquet"):
        (output / name).unlink()
        (output / name).symlink_to(precious)
    (output / "removed").mkdir()
    (output / "removed" / "README").write_text("first")
    (output / "forecasts" / "README").write_text("second")
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert precious.read_bytes() == tiny_checkpoint.weights_path.read_bytes() and notes.read_text() == "my notes"
    for name in ("summary.json", "report.html", "metrics.parquet", "run.lock"):
        assert (output / name).is_file() and not (output / name).is_symlink(), name
    assert (output / "removed" / "README").read_text() == "first"
    assert (output / "removed" / "README.1").read_text() == "second"

    dangling = tmp_path / "dl"
    dangling.symlink_to(tmp_path / "missing")
    assert cli.main([*argv[:-1], str(dangling)]) == 2
    line = _error(capsys)
    assert f"--output {dangling} is a symbolic link to {tmp_path / 'missing'}, which does not exist" in line, line
