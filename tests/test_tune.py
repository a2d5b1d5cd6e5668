"""``distributed-onnx tune`` writes settings measured here; ``backtest --tuned`` reads them, below what a user
writes (flags > environment > --config > --tuned > defaults). No speed is asserted: only that the file is
valid and its settings reach the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from graphs import write_tiny_chronos2

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from distributed_onnx import cli
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.model.identity import identity_of
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET
from distributed_onnx.tune import FORMAT, LEVELS, TUNED_KEYS, affordable_batches, read_tuned


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_tune_writes_settings_a_backtest_then_runs_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tuned = tmp_path / "tuned" / "tune.json"  # in a folder that does not exist yet: tune makes it
    argv = ["tune", str(REFERENCE_CHECKPOINT), "--budget-s", "1", "--cpus", "2", "--output", str(tuned)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    document = json.loads(tuned.read_text())
    settings = document["settings"]
    assert document["format"] == FORMAT and settings["graph_optimization"] in LEVELS
    assert (settings["actors"], settings["cpus_per_actor"]) in ((1, 2.0), (2, 1.0))
    assert {trial["stage"] for trial in document["trials"]} == {"level", "batch", "layout"}
    assert set(settings) == set(TUNED_KEYS)  # what --tuned accepts is what tune writes
    assert all(trial["windows_per_s"] > 0 for trial in document["trials"])
    # Issue 52 (5): the CPU beside every figure; no variant beside the checkpoint, so no choice.
    assert document["machine"]["cpu"]["model"] and "avx512_vnni" in document["machine"]["cpu"]["flags"]
    assert "choice" not in document and "variants" not in document

    output = tmp_path / "run"
    argv = ["backtest", "--tuned", str(tuned), "--data", str(REFERENCE_DATASET), "--output", str(output)]
    assert cli.main([*argv, "--n-windows", "4", "--stride", "48", "--no-progress"]) == 0, capsys.readouterr().err
    summary = json.loads((output / "summary.json").read_text())
    for key in ("actors", "cpus_per_actor", "rows_per_batch", "graph_optimization"):
        assert summary["settings"][key] == settings[key], key
    assert summary["resolved"]["rows_per_batch"] == settings["rows_per_batch"]
    assert {actor["intra_op_num_threads"] for actor in summary["actors"]} == {int(settings["cpus_per_actor"])}
    assert len(summary["actors"]) == settings["actors"]

    # Issue 51 (3): only the keys tune writes are taken, and only for the checkpoint it measured.
    tiny = write_tiny_chronos2(tmp_path / "tiny")
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**document, "settings": {**settings, "checkpoint": str(tiny.weights_path)}}))
    line = _refused(["backtest", "--tuned", str(edited), "--output", str(tmp_path / "edited-run")], capsys)
    assert "settings.checkpoint [from" in line and "is not a key distributed-onnx tune writes" in line, line
    other = ["backtest", "--tuned", str(tuned), "--checkpoint", str(tiny.weights_path)]
    line = _refused([*other, "--output", str(tmp_path / "other-run")], capsys)
    digest = document["checkpoint_identity"]["digest"]
    assert f"was tuned for checkpoint {REFERENCE_CHECKPOINT.stem} (identity {digest})" in line, line
    assert f"not for this run's tiny (identity {identity_of(tiny).digest}): sha256" in line, line
    assert not (tmp_path / "edited-run").exists() and not (tmp_path / "other-run").exists()


def test_an_output_tune_cannot_write_is_refused_before_anything_is_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51 follow-up: ``--output`` naming a folder, or a file below a file, failed only after the whole
    measuring budget (an I/O error, exit 3, the measurements lost). Now refused at once (exit 2), naming it."""
    import time

    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    argv = ["tune", str(REFERENCE_CHECKPOINT), "--budget-s", "600", "--output"]
    for output, says in (
        (tmp_path / "a-folder", f"--output {tmp_path / 'a-folder'} is a folder; give the file to write (e.g. "),
        (tmp_path / "a-file" / "tune.json", f"--output {tmp_path / 'a-file' / 'tune.json'} cannot be written: "),
    ):
        started = time.monotonic()
        line = _refused([*argv, str(output)], capsys)
        assert time.monotonic() - started < 30, "it measured first"
        assert line.startswith(f"error: {says}"), line
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file", "a-folder"]  # no probe left behind
    assert not list((tmp_path / "a-folder").iterdir())


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_tuned_file_is_below_config_environment_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tuned = tmp_path / "tune.json"
    values = {"actors": 2, "cpus_per_actor": 1.0, "rows_per_batch": 16, "graph_optimization": "basic"}
    tuned.write_text(json.dumps({"format": FORMAT, "settings": values}))
    config = tmp_path / "run.yaml"
    config.write_text("output: out\nrows_per_batch: 8\n")
    monkeypatch.setenv("DISTRIBUTED_ONNX_ACTORS", "3")
    settings = BacktestSettings.from_sources(
        {"cpus_per_actor": "0.5"}, config, environment=True, tuned=read_tuned(tuned)
    )
    assert (settings.cpus_per_actor, settings.actors, settings.rows_per_batch) == (0.5, 3, 8)
    assert settings.graph_optimization == "basic"  # only the tuned file says
    assert settings.session_options().graph_optimization_level == "ENABLE_BASIC"
    plain = BacktestSettings.from_sources({"output": "out"})
    assert plain.graph_optimization == "all" and plain.rows_per_batch is None  # the defaults


def test_a_file_that_is_not_a_tuned_settings_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not found: .*distributed-onnx tune"):
        read_tuned(tmp_path / "missing.json")
    other = tmp_path / "summary.json"
    other.write_text(json.dumps({"settings": {"actors": 2}}))
    with pytest.raises(ConfigError, match="is not a tuned settings file"):
        read_tuned(other)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": FORMAT, "settings": {"actorz": 2}}))
    with pytest.raises(ConfigError, match=r"actorz.*\[from .*bad.json\]"):
        BacktestSettings.from_sources({"output": "out"}, tuned=read_tuned(bad))


def test_a_tuned_file_of_the_first_format_is_refused_saying_to_tune_again(tmp_path: Path) -> None:
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"format": "distributed-onnx tune 1", "settings": {"actors": 2}}))
    with pytest.raises(ConfigError, match=r"older distributed-onnx tune .* run distributed-onnx tune again"):
        read_tuned(older)
    for key in ("data", "horizon", "quantiles", "seasonality", "address"):  # what a run computes: never tuned
        foreign = tmp_path / f"{key}.json"
        foreign.write_text(json.dumps({"format": FORMAT, "settings": {"actors": 2, key: 1}}))
        with pytest.raises(ConfigError, match=rf"settings\.{key} \[from .*\] is not a key distributed-onnx tune"):
            read_tuned(foreign)
    assert set(TUNED_KEYS) == {"actors", "cpus_per_actor", "rows_per_batch", "graph_optimization"}


def test_tune_times_only_the_batches_one_trial_can_hold() -> None:
    # 45 s over 3 levels, 5 batch sizes and 2 layouts: 4.5 s a trial, a call of at most 2.25 s.
    assert affordable_batches(256, window_s=1.7, budget_s=45, layouts=2) == [1]  # Chronos-2-sized, one core
    assert affordable_batches(256, window_s=0.075, budget_s=45, layouts=2) == [1, 4, 16]  # bolt-small-sized
    assert affordable_batches(256, window_s=0.001, budget_s=45, layouts=2) == [1, 4, 16, 64, 256]
    assert affordable_batches(10, window_s=0.001, budget_s=45, layouts=2) == [1, 4]
    assert affordable_batches(256, window_s=60.0, budget_s=45, layouts=2) == [1]  # nothing fits: one window


def test_a_tuned_file_whose_identity_is_not_a_record_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An outside tester's report: a tuned file whose ``checkpoint_identity`` was replaced by a string was refused
    as one that "records no checkpoint identity", though it records one, of the wrong type: the line says what it
    holds."""
    edited = tmp_path / "edited.json"
    document = {"format": FORMAT, "settings": {"actors": 1}, "checkpoint": str(REFERENCE_CHECKPOINT)}
    document["checkpoint_identity"] = "x1"
    edited.write_text(json.dumps(document))
    argv = ["backtest", "--tuned", str(edited), "--data", str(REFERENCE_DATASET), "--output", str(tmp_path / "run")]
    line = _refused(argv, capsys)
    assert f'{edited} records checkpoint_identity as a str ("x1"), not the identity record tune writes' in line, line
    assert "records no checkpoint identity" not in line and "run distributed-onnx tune again" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_a_tuned_file_without_a_choice_is_recorded_and_said_with_what_it_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An outside tester's report: ``backtest --tuned F`` with a valid file that holds no variant choice (``tune
    --no-variants``, or no variant beside the checkpoint) wrote no ``tuned`` key to summary.json and said nothing
    on stderr: the settings file a run used was recorded nowhere. Now the file, the settings the run took from it
    and those a flag gave instead are said and recorded, choice or not."""
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    reference = LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve()
    tuned = tmp_path / "tune.json"
    settings = {"actors": 1, "cpus_per_actor": 1.0, "rows_per_batch": 16, "graph_optimization": "basic"}
    document = {
        "format": FORMAT,
        "settings": settings,
        "checkpoint": str(REFERENCE_CHECKPOINT),
        "checkpoint_identity": identity_of(reference).record(),
    }
    tuned.write_text(json.dumps(document))
    output = tmp_path / "run"
    argv = ["backtest", "--tuned", str(tuned), "--data", str(REFERENCE_DATASET), "--output", str(output)]
    argv += ["--n-windows", "2", "--stride", "48", "--rows-per-batch", "8", "--no-progress"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    said = (
        f"distributed-onnx backtest --tuned {tuned}: ran with its actors=1, cpus_per_actor=1.0, "
        "graph_optimization=basic; a flag, the environment or --config gave rows_per_batch=8 (its 16); it holds no "
        "choice of checkpoint (no variant was chosen): the checkpoints ran as given"
    )
    assert said in err.splitlines(), err
    recorded = json.loads((output / "summary.json").read_text())["tuned"]
    assert recorded["file"] == str(tuned) and recorded["choice"] is None and recorded["replaced"] == {}
    assert recorded["settings"] == {"actors": 1, "cpus_per_actor": 1.0, "graph_optimization": "basic"}
    assert recorded["overridden"] == {"rows_per_batch": {"tuned": 16, "used": 8}}
    assert recorded["said"] == said
