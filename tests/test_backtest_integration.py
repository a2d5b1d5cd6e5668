"""The distributed backtest end to end: real local Ray, real ORT sessions, real Parquet on disk.

Integration tier. The tiny Chronos-2 graph of tests/graphs.py keeps runs short; one test runs the bundled
reference checkpoint on the bundled Taylor data. Every distributed result is compared with the same windows
forecast in-process by one :class:`InferenceWorker`, which is the product's claim: distribution changes
nothing about the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import (  # noqa: E402
    COVARIATE,
    STEP_US,
    dense_series,
    in_process_forecasts,
    long_table,
    planned_window_ids,
    read_forecasts,
    settings_for,
    write_dataset,
)
from conftest import start_test_ray  # noqa: E402
from failing_graph import POISON, write_failing_chronos2  # noqa: E402
from graphs import tiny_chronos2_metadata  # noqa: E402
from ray_actors import wait_dead  # noqa: E402

from distributed_onnx import cli  # noqa: E402
from distributed_onnx.errors import BatchError, ConfigError, DataError  # noqa: E402
from distributed_onnx.evaluation import outputs  # noqa: E402
from distributed_onnx.evaluation.backtest import BacktestResult, run_backtest  # noqa: E402
from distributed_onnx.evaluation.data.windows import plan_series  # noqa: E402
from distributed_onnx.evaluation.dataset import _scan as scan_module  # noqa: E402
from distributed_onnx.evaluation.driver import _dispatching as dispatching_module  # noqa: E402
from distributed_onnx.evaluation.driver import run as run_module  # noqa: E402
from distributed_onnx.evaluation.planning import prepare  # noqa: E402
from distributed_onnx.evaluation.settings import BacktestSettings  # noqa: E402
from distributed_onnx.model.checkpoint import ResolvedCheckpoint, write_checkpoint  # noqa: E402
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET  # noqa: E402
from distributed_onnx.runtime import actors as actors_module  # noqa: E402

pytestmark = pytest.mark.integration

FORECAST_COLUMNS = ["series_id", "window_id", "origin", "cutoff", "timestamp", "lead", "y", "q0.1", "q0.5", "q0.9"]


def assert_same_forecasts(distributed: pa.Table, local: pa.Table, rtol: float = 1e-6) -> None:
    assert distributed.column_names == local.column_names
    for name in distributed.column_names:
        if name.startswith("q"):
            np.testing.assert_allclose(
                distributed[name].to_numpy(), local[name].to_numpy(), rtol=rtol, atol=1e-6, err_msg=name
            )
        else:
            assert distributed[name].equals(local[name]), name


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "load.parquet")


@pytest.fixture
def tiny(tiny_checkpoint: ResolvedCheckpoint) -> Path:
    return tiny_checkpoint.weights_path


@pytest.fixture(scope="module")
def default_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: ResolvedCheckpoint
) -> tuple[BacktestSettings, BacktestResult]:
    """The tiny checkpoint on :func:`write_dataset`'s data at :func:`settings_for`'s defaults, run once for the
    tests that compare with it (each run starts a pool of actors and a report process). Read it; never write to
    its run directory."""
    start_test_ray()
    root = tmp_path_factory.mktemp("default-run")
    settings = settings_for(tiny_checkpoint.weights_path, write_dataset(root / "load.parquet"), root / "run")
    return settings, run_backtest(settings)


# --- 1. distributed == in-process ---------------------------------------------------------------------------


def test_distributed_forecasts_equal_an_in_process_loop(default_run: tuple[BacktestSettings, BacktestResult]) -> None:
    settings, result = default_run  # settings_for(tiny, data, run), run here

    distributed = read_forecasts(Path(settings.output))
    assert distributed.column_names == FORECAST_COLUMNS
    assert_same_forecasts(distributed, in_process_forecasts(settings))
    planned = planned_window_ids(settings)
    assert len(planned) == 5 + 5 + 2  # "c" has 14 points: only origins 3 and 6 fit a horizon of 8
    assert Counter(distributed["window_id"].to_pylist()) == dict.fromkeys(planned, 8)
    summary = result.summary
    assert summary["windows"]["planned"] == 12
    assert summary["windows"]["run_now"] == 12
    assert summary["parts"]["planned"] == 3
    assert summary["parts"]["completed"] == 3
    assert len(summary["actors"]) == 2
    # Per unit of work only a part descriptor crosses to an actor, and only a receipt comes back.
    assert summary["transport"]["descriptor_bytes"] < 300
    assert summary["transport"]["receipt_bytes"] < 1000
    assert summary["transport"]["series_transport"] == "object_store"
    assert json.loads((Path(settings.output) / "summary.json").read_text())["windows"] == summary["windows"]
    # The result holds the run-wide rows of metrics.parquet (every row but the series scope's) and its path.
    written = pq.read_table(Path(settings.output) / "metrics.parquet")
    assert result.run_wide_metrics.equals(written.filter(pa.compute.field("scope") != "series"))
    assert result.read_metrics().equals(written) and written.filter(pa.compute.field("scope") == "series").num_rows
    # The report draws the fans the actors picked (series spread over the run), without a part read back.
    # Series a is long enough for a seasonal scale (48 steps) before its origins: its windows are ranked by MASE;
    # b and c are not, so only their latest window is drawn.
    page = (Path(settings.output) / "report.html").read_text()
    assert "a · best MASE" in page  # scored on the common pairs (both baselines defined): few windows of a
    assert "b · latest" in page and "c · latest" in page and "b · best" not in page
    # Drawn (with leaderboard.parquet) by the report process, so the driver's CPU stays on its parts.
    assert summary["timing"]["report_drawn_by"] == "report process"
    assert (Path(settings.output) / "leaderboard.parquet").exists()
    # Every phase of the driver is timed in wall and CPU seconds; dispatching is one of them.
    phases = ["start_and_plan", "ray_start", "series_and_pool", "dispatch", "merge", "report", "ray_stop"]
    assert list(summary["timing"]["driver_cpu_phases_s"]) == list(summary["timing"]["driver_wall_phases_s"]) == phases
    assert summary["timing"]["driver_wall_phases_s"]["dispatch"] == round(summary["timing"]["dispatch_s"], 4)
    # The short series' context starts before its data: missing history, masked, still forecast.
    short = distributed.filter(pa.compute.equal(distributed["series_id"], "c"))
    assert short.num_rows == 16 and not np.isnan(short["q0.5"].to_numpy()).any()
    # A target step whose actual is missing stays null in y.
    assert distributed["y"].null_count > 0


@pytest.mark.usefixtures("ray_session")
def test_reference_checkpoint_distributed_equals_in_process(tmp_path: Path) -> None:
    settings = settings_for(
        REFERENCE_CHECKPOINT,
        REFERENCE_DATASET,
        tmp_path / "run",
        horizon=48,
        n_windows=6,
        stride=48,
        rows_per_batch=2,
        seasonality=48,
    )

    result = run_backtest(settings)

    assert_same_forecasts(read_forecasts(Path(settings.output)), in_process_forecasts(settings), rtol=1e-5)
    scores = {
        (row["model"], row["metric"]): row["value"]
        for row in result.run_wide_metrics.to_pylist()
        if row["scope"] == "global" and row["quantile"] is None
    }
    # The reference model beats seasonal naive by a wide margin on its own data (see its metadata).
    assert scores[(REFERENCE_CHECKPOINT.stem, "mase")] < scores[("seasonal_naive", "mase")]


# --- 2. an actor killed mid-run, through run_backtest ------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_actor_killed_mid_run_loses_and_doubles_nothing(
    tmp_path: Path, tiny: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills the actor the dispatcher is about to hand a part to, the first time it does so after a part's
    receipt is in: the loss is then certain, not a race between the kill and a tiny part finishing (killing an
    actor whose calls had all finished, and which the dispatcher's tail then left idle, lost nothing to notice)."""
    started: list[Any] = []
    receipts: list[int] = []
    killed: list[Any] = []
    real_start, real_on_result = actors_module.start_worker_actor, run_module._BacktestRun._on_result
    real_dispatcher = dispatching_module.Dispatcher

    def start_and_record(*args: Any, **kwargs: Any) -> Any:
        started.append(real_start(*args, **kwargs))
        return started[-1]

    def on_result_and_record(self: Any, part: Any, receipt: Any) -> None:
        real_on_result(self, part, receipt)
        receipts.append(part.index)

    def kill_then_submit(submit: Any) -> Any:
        def submit_to(actor: Any, part: Any) -> Any:
            if receipts and not killed:
                killed.append(actor)
                ray.kill(actor, no_restart=True)
                wait_dead(actor)
                # Ray's view of free resources lags the actor's death; the run starts a replacement once it
                # shows room. Waiting here (inside the dispatcher) keeps the tiny run from finishing first.
                deadline = time.monotonic() + 60
                while not actors_module.has_room(settings.cpus_per_actor, settings.gpus_per_actor):
                    assert time.monotonic() < deadline, "the killed actor's CPU never showed as free"
                    time.sleep(0.05)
            return submit(actor, part)

        return submit_to

    def dispatcher_killing_once(actors: Any, callbacks: Any, *args: Any, **kwargs: Any) -> Any:
        callbacks = dataclasses.replace(callbacks, submit=kill_then_submit(callbacks.submit))
        return real_dispatcher(actors, callbacks, *args, **kwargs)

    monkeypatch.setattr(actors_module, "start_worker_actor", start_and_record)
    monkeypatch.setattr(dispatching_module, "start_worker_actor", start_and_record)
    monkeypatch.setattr(dispatching_module, "Dispatcher", dispatcher_killing_once)
    monkeypatch.setattr(run_module._BacktestRun, "_on_result", on_result_and_record)
    settings = settings_for(tiny, data, tmp_path / "run", rows_per_batch=1)

    result = run_backtest(settings)

    assert sorted(receipts) == list(range(12))  # every part reported exactly once
    parts = result.summary["parts"]
    assert parts["actors_lost"] == 1
    assert parts["retried"] >= 1
    assert parts["completed"] == 12 and parts["failed"] == 0
    assert parts["replacements_started"] == 1
    assert len(killed) == 1 and len(started) == 3  # two in the pool, one replacement
    forecasts = read_forecasts(Path(settings.output))
    assert Counter(forecasts["window_id"].to_pylist()) == dict.fromkeys(planned_window_ids(settings), 8)
    assert_same_forecasts(forecasts, in_process_forecasts(settings))
    for actor in started:  # the run kills its replacements too, not only the actors it started with
        wait_dead(actor)


# --- 3. resume --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_rerun_redoes_missing_torn_and_foreign_parts_and_refuses_other_settings(
    tmp_path: Path, tiny: Path, data: Path
) -> None:
    settings = settings_for(tiny, data, tmp_path / "run", rows_per_batch=2)
    first = run_backtest(settings)
    first_metrics = first.read_metrics()  # the run directory's metrics.parquet, before the reruns rewrite it
    complete = read_forecasts(Path(settings.output))
    parts = Path(settings.output) / outputs.FORECASTS_DIR / "model=tiny"
    sums = Path(settings.output) / outputs.SCORES_DIR
    assert len(list(parts.glob("part-*.parquet"))) == 6
    assert len(list(sums.glob("part-*.arrow"))) == 6
    other = settings_for(tiny, data, tmp_path / "other", rows_per_batch=2, quantiles=[0.2, 0.5, 0.8])
    run_backtest(other)
    (parts / "part-000001.parquet").unlink()  # missing forecasts, sums left behind
    torn = parts / "part-000002.parquet"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # a torn copy
    (sums / "part-000003.arrow").write_bytes(b"ARROW1 torn")  # torn sums
    foreign = Path(other.output)
    (parts / "part-000004.parquet").write_bytes(  # a foreign part: another run's files
        (foreign / outputs.FORECASTS_DIR / "model=tiny" / "part-000004.parquet").read_bytes()
    )
    (sums / "part-000004.arrow").write_bytes((foreign / outputs.SCORES_DIR / "part-000004.arrow").read_bytes())
    partial = parts / ".tmp-killed.parquet"
    partial.write_bytes(b"PAR1 half a file")

    second = run_backtest(settings)

    assert not partial.exists()
    assert read_forecasts(Path(settings.output)).equals(complete)
    assert second.read_metrics().equals(first_metrics)  # merged in part order: bit-identical
    assert second.summary["parts"]["done_before"] == 2
    assert second.summary["parts"]["submitted"] == 4
    assert second.summary["windows"]["done_before"] == 4
    assert second.summary["windows"]["run_now"] == 8
    assert second.summary["resume"]["resumed"] is True

    third = run_backtest(settings)  # nothing left: no actor starts, the metrics are merged from the sums on disk
    assert third.summary["parts"]["done_before"] == 6
    assert third.summary["parts"]["submitted"] == 0
    assert third.summary["actors"] == []
    assert third.read_metrics().equals(first_metrics)
    # The record of who computed the parts survives the rerun that computed nothing.
    assert [record["windows"] for record in third.summary["computed_by"]] == [12, 8]
    assert third.summary["computed_by"][0]["providers"] == ["CPUExecutionProvider"]

    with pytest.raises(ConfigError, match="holds a backtest with other settings"):
        run_backtest(settings_for(tiny, data, Path(settings.output), rows_per_batch=2, quantiles=[0.2, 0.5, 0.8]))
    assert read_forecasts(Path(settings.output)).equals(complete)


@pytest.mark.usefixtures("ray_session")
def test_input_file_transport_gives_the_object_store_forecasts(
    tmp_path: Path, tiny: Path, default_run: tuple[BacktestSettings, BacktestResult]
) -> None:
    by_store, by_store_result = default_run  # settings_for's defaults: the object store carries these series
    assert by_store_result.summary["transport"]["series_transport"] == "object_store"
    by_file = settings_for(tiny, by_store.data.local_path, tmp_path / "file", series_transport="input_file")

    result = run_backtest(by_file)

    assert result.summary["transport"]["series_transport"] == "input_file"
    assert read_forecasts(Path(by_file.output)).equals(read_forecasts(Path(by_store.output)))


@pytest.mark.usefixtures("ray_session")
def test_a_streamed_input_gives_the_object_store_forecasts(
    tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sorted input of several chunks is checked streamed; the actors read their series' rows themselves."""
    sorted_rows = long_table(dense_series()).sort_by([("series_id", "ascending"), ("timestamp", "ascending")])
    data = tmp_path / "sorted.parquet"
    pq.write_table(sorted_rows, data, row_group_size=17)
    monkeypatch.setattr(scan_module, "STREAM_CHUNK_ROWS", 20)
    by_store = settings_for(tiny, data, tmp_path / "store", series_transport="object_store", covariates=[COVARIATE])
    streamed = settings_for(tiny, data, tmp_path / "streamed", covariates=[COVARIATE])

    run_backtest(by_store)
    result = run_backtest(streamed)

    assert result.summary["transport"]["series_transport"] == "input_file"
    assert "streamed" in result.summary["transport"]["reason"]
    assert read_forecasts(Path(streamed.output)).equals(read_forecasts(Path(by_store.output)))
    assert pq.read_table(Path(streamed.output) / "metrics.parquet").equals(
        pq.read_table(Path(by_store.output) / "metrics.parquet")
    )


@pytest.mark.usefixtures("ray_session")
def test_a_part_that_cannot_be_written_fails_alone_and_resumes(tmp_path: Path, tiny: Path, data: Path) -> None:
    """A real storage error (a directory where the part's file must go) is retried, recorded, never fatal."""
    settings = settings_for(tiny, data, tmp_path / "run")
    blocker = Path(settings.output) / outputs.FORECASTS_DIR / "model=tiny" / "part-000001.parquet"
    blocker.mkdir(parents=True)  # empty: a folder holding files but no run record is refused (test_run_folder.py)

    with pytest.raises(BatchError, match="part 1") as info:
        run_backtest(settings)

    assert info.value.failed_parts == [1]
    failed = json.loads((Path(settings.output) / "failed_windows.json").read_text())
    assert "StorageError" in failed[0]["error"] and "failed 3 times" in failed[0]["error"]
    assert len(failed[0]["window_ids"]) == 4
    assert {path.name for path in blocker.parent.glob("part-*.parquet") if path.is_file()} == {
        "part-000000.parquet",
        "part-000002.parquet",
    }
    blocker.rmdir()

    resumed = run_backtest(settings)

    assert resumed.summary["parts"]["done_before"] == 2
    assert resumed.summary["windows"]["run_now"] == 4
    assert_same_forecasts(read_forecasts(Path(settings.output)), in_process_forecasts(settings))
    # The earlier invocation's list of failed windows is gone: those windows are done now.
    assert not (Path(settings.output) / "failed_windows.json").exists()
    assert any("failed_windows.json of an earlier invocation was removed" in note for note in resumed.summary["notes"])


# --- 5. a failing part -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_failing_part_is_reported_and_the_others_are_written(tmp_path: Path, data: Path) -> None:
    failing = write_failing_chronos2(tmp_path, "fixed").weights_path
    settings = settings_for(failing, data, tmp_path / "run", n_windows=4, rows_per_batch=4)
    planned = planned_window_ids(settings)
    assert len(planned) == 10
    # 4 + 4 + 2 windows: a value above POISON in the context of the last two windows (the last series' two
    # latest origins: its last cutoffs) makes ONNX Runtime fail their call, as a broken model would.
    plan = prepare(settings)
    last = plan.table.series[-1]
    poisoned_step = int(plan_series(last, plan.spec).origins[-2]) - 1
    table = pq.read_table(data)
    rows = np.flatnonzero(np.asarray(pa.compute.equal(table["series_id"], last.series_id)))
    y = table["y"].to_numpy(zero_copy_only=False).copy()
    y[rows[poisoned_step]] = 2 * POISON
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pa.array(y)), data)

    with pytest.raises(BatchError, match=r"failed_windows\.json") as info:
        run_backtest(settings)

    assert info.value.failed_parts == [2]
    failed = json.loads((Path(settings.output) / "failed_windows.json").read_text())
    assert [entry["part"] for entry in failed] == [2]
    assert failed[0]["window_ids"] == planned[8:]
    assert "out of" in failed[0]["error"] or "indices" in failed[0]["error"]
    assert {path.name for path in (Path(settings.output) / outputs.FORECASTS_DIR / "model=fixed").glob("part-*")} == {
        "part-000000.parquet",
        "part-000001.parquet",
    }
    assert {path.name for path in (Path(settings.output) / outputs.SCORES_DIR).glob("part-*")} == {
        "part-000000.arrow",
        "part-000001.arrow",
    }
    assert set(read_forecasts(Path(settings.output))["window_id"].to_pylist()) == set(planned[:8])
    summary = json.loads((Path(settings.output) / "summary.json").read_text())
    assert summary["windows"]["failed"] == 2
    assert summary["windows"]["run_now"] == 8
    assert pq.read_table(Path(settings.output) / "metrics.parquet").num_rows > 0


# --- 6. bad input, refused before any actor starts ---------------------------------------------------------


def _write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


def test_bad_input_is_refused_before_anything_starts(tmp_path: Path, tiny: Path, data: Path) -> None:
    good = long_table(dense_series())
    output = tmp_path / "run"
    duplicated = _write(pa.concat_tables([good, good.slice(5, 1)]), tmp_path / "dup.parquet")
    with pytest.raises(DataError, match=rf"duplicate .* at rows \[5, {good.num_rows}\]"):
        run_backtest(settings_for(tiny, duplicated, output))

    stamps = good["timestamp"].cast(pa.int64()).to_numpy().copy()
    stamps[3] += 60_000_000
    off_grid = _write(
        good.set_column(1, "timestamp", pa.array(stamps).cast(pa.timestamp("us", tz="UTC"))), tmp_path / "off.parquet"
    )
    with pytest.raises(DataError, match=r"off the 30-minute grid .* rows \[3\]"):
        run_backtest(settings_for(tiny, off_grid, output))

    with pytest.raises(DataError, match=r"declared covariates \['wind'\]"):
        run_backtest(settings_for(tiny, data, output, covariates=[COVARIATE, "wind"]))

    on_the_hour = (good["timestamp"].cast(pa.int64()).to_numpy() // STEP_US) % 2 == 0
    hourly = _write(good.filter(pa.array(on_the_hour)), tmp_path / "hourly.parquet")
    with pytest.raises(DataError, match="60-minute grid, but the checkpoint expects 30-minute"):
        run_backtest(settings_for(tiny, hourly, output))

    with pytest.raises(ConfigError, match="horizon 9 is longer than the checkpoint emits"):
        run_backtest(settings_for(tiny, data, output, horizon=9))
    with pytest.raises(ConfigError, match="context_length 17 is longer than the checkpoint takes"):
        run_backtest(settings_for(tiny, data, output, context_length=17))

    with pytest.raises(DataError, match="no rows"):
        run_backtest(settings_for(tiny, _write(good.slice(0, 0), tmp_path / "empty.parquet"), output))
    with pytest.raises(DataError, match="not found"):
        run_backtest(settings_for(tiny, tmp_path / "absent.parquet", output))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="Cannot read data file"):
        run_backtest(settings_for(tiny, tmp_path / "broken.parquet", output))

    assert not output.exists()  # every refusal came before the run directory (and any actor)


def test_csv_input_plans_like_parquet(tmp_path: Path, tiny: Path, data: Path) -> None:
    import pyarrow.csv as pa_csv

    csv = tmp_path / "load.csv"
    pa_csv.write_csv(pq.read_table(data), csv)
    from_csv = prepare(settings_for(tiny, csv, tmp_path / "a"))
    from_parquet = prepare(settings_for(tiny, data, tmp_path / "b"))
    assert [s.series_id for s in from_csv.table.series] == ["a", "b", "c"]
    for left, right in zip(from_csv.table.series, from_parquet.table.series, strict=True):
        np.testing.assert_array_equal(left.values, right.values)
        assert left.start_us == right.start_us
    assert planned_window_ids(settings_for(tiny, csv, tmp_path / "a")) == planned_window_ids(
        settings_for(tiny, data, tmp_path / "b")
    )


# --- 7. covariates -----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_known_future_covariates_reach_the_model(
    tmp_path: Path, tiny: Path, default_run: tuple[BacktestSettings, BacktestResult]
) -> None:
    without, _ = default_run  # settings_for(tiny, data, without), run once for the module
    with_covariate = settings_for(tiny, without.data.local_path, tmp_path / "with", covariates=[COVARIATE])

    run_backtest(with_covariate)

    forecasts_with = read_forecasts(Path(with_covariate.output))
    assert_same_forecasts(forecasts_with, in_process_forecasts(with_covariate))
    # Window ids include the run configuration (the covariates too): match windows by (series, origin, lead).
    by_window = [("series_id", "ascending"), ("origin", "ascending"), ("lead", "ascending")]
    forecasts_with = forecasts_with.sort_by(by_window)
    forecasts_without = read_forecasts(Path(without.output)).sort_by(by_window)
    assert forecasts_with["origin"].equals(forecasts_without["origin"])
    assert forecasts_with["series_id"].equals(forecasts_without["series_id"])
    # The tiny graph adds to the target row the mean of the observed future covariate of its group.
    series = dense_series()
    origins = forecasts_with["origin"].cast(pa.int64()).to_numpy()
    shift = forecasts_with["q0.5"].to_numpy() - forecasts_without["q0.5"].to_numpy()
    for row, (series_id, origin_us) in enumerate(zip(forecasts_with["series_id"].to_pylist(), origins, strict=True)):
        dense = series[series_id]
        origin = (origin_us - dense["start_us"]) // STEP_US
        future = dense[COVARIATE][origin : origin + 8]
        future = np.where(dense["present"][origin : origin + 8], future, np.nan)
        expected = np.nanmean(future) if np.isfinite(future).any() else 0.0
        assert shift[row] == pytest.approx(expected, abs=1e-4), (series_id, origin)
    assert np.abs(shift).max() > 1.0


# --- 8. the command line -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_cli_backtest_with_a_config_file_and_an_overriding_flag(
    tmp_path: Path, tiny: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run"
    config = tmp_path / "backtest.yaml"
    config.write_text(
        f"checkpoint: {tiny}\ndata: {data}\noutput: {output}\nn-windows: 5\nstride: 3\n"
        "quantiles: [0.1, 0.5, 0.9]\nactors: 2\nrows_per_batch: 4\nprogress: false\n"
    )

    code = cli.main(["backtest", "--config", str(config), "--n-windows", "2"])

    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads((output / "summary.json").read_text())
    assert summary["settings"]["n_windows"] == 2  # the flag beat the file
    assert summary["settings"]["stride"] == 3  # the file beat the default
    assert summary["windows"]["planned"] == 2 + 2 + 2
    headline = json.loads(captured.out[: captured.out.rindex("}") + 1])
    assert headline["windows"]["planned"] == 6
    assert {"tiny.mae", "seasonal_naive.mae"} <= set(headline["global"])
    assert f"wrote {output}/" in captured.out


def test_cli_inspect_prints_the_checkpoint(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", str(tiny)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["metadata"]["model_family"] == "chronos2"
    assert document["metadata"]["horizon_length"] == 8
    assert [spec.split(":")[0] for spec in document["inputs"]] == tiny_chronos2_metadata().input_names
    assert "CPUExecutionProvider" in document["available_providers"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["backtest", "--checkpoint", "{tmp}/tiny.onnx", "--data", "{tmp}/absent.parquet", "--output", "{tmp}/run"],
            "Data file not found",
        ),
        (["backtest", "--config", "{tmp}/absent.yaml"], "Config file not found"),
        (["backtest", "--config", "{tmp}/unknown.yaml"], "Extra inputs are not permitted"),
        (["backtest", "--output", "{tmp}/run", "--horizon", "0"], "horizon"),
        (["inspect", "{tmp}/absent.onnx"], "Checkpoint weights not found"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path, tiny: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "unknown.yaml").write_text(f"output: {tmp_path}/run\nwindows: 3\n")
    (tmp_path / "tiny.onnx").symlink_to(tiny)
    (tmp_path / "tiny.metadata.json").symlink_to(tiny.with_suffix(".metadata.json"))

    code = cli.main([arg.format(tmp=tmp_path) for arg in argv])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ")
    assert "\n" not in err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("ray_session")
def test_cli_gpu_providers_without_gpus_per_actor_exit_2_before_any_actor(
    tmp_path: Path, tiny: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run"
    argv = ["backtest", "--checkpoint", str(tiny), "--data", str(data), "--output", str(output)]

    code = cli.main([*argv, "--providers", "cuda,cpu", "--actors", "1", "--no-progress"])

    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err
    assert "cuda" in err and "gpus_per_actor" in err
    assert not output.exists()


def test_corrupt_weights_stop_the_pool_with_a_typed_error(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The metadata records the sha256 of these (corrupt) bytes, so resolving passes and the actors are the
    # first to open the graph: their start-up error must come back typed, not as a dead-actor traceback.
    write_checkpoint(tmp_path / "broken.onnx", b"not an onnx graph", tiny_chronos2_metadata())
    output = tmp_path / "run"
    argv = ["backtest", "--checkpoint", str(tmp_path / "broken.onnx"), "--data", str(data), "--output", str(output)]

    code = cli.main([*argv, "--actors", "2", "--n-windows", "2", "--no-progress"])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "cannot load checkpoint weights" in err and "broken.onnx" in err
    assert not list((output / "forecasts").glob("model=*/part-*.parquet"))
