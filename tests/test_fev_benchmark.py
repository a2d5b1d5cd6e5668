"""fev tasks run as backtests: the summaries equal fev's own on predictions from a plain ONNX Runtime loop.

Three tasks in fev's dataset format, written here (hourly counted back from the series' ends; daily with a
known-future and a past-only covariate and timestamp cutoffs; weekly with gaps and positional cutoffs) plus a
multivariate one, against the bundled reference checkpoint and a tiny graph (tests/graphs.py) whose horizon is
too short for the weekly task. The reference loop reads each window with ``task.iter_windows()`` and calls
ONNX Runtime directly with the Chronos-2 (OpenSTEF) tensors; fev scores both sets of predictions.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.graphs import write_tiny_chronos2

fev = pytest.importorskip("fev")

REFERENCE = Path(__file__).resolve().parents[1] / "distributed_onnx" / "resources" / "reference"
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _write_fev_dataset(path: Path, series: list[dict[str, Any]]) -> str:
    """fev's dataset format: one row per series, the time-varying columns as lists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list[Any]] = {key: [row[key] for row in series] for key in series[0]}
    arrays = {key: pa.array(values) for key, values in columns.items()}
    arrays["timestamp"] = pa.array(columns["timestamp"], pa.list_(pa.timestamp("ms")))
    pq.write_table(pa.table(arrays), path)
    return str(path)


def _stamps(start: str, n: int, freq: str) -> list[Any]:
    import pandas as pd

    return list(pd.date_range(start, periods=n, freq=freq).to_pydatetime())


def _tasks(root: Path) -> list[Any]:
    rng = np.random.default_rng(7)
    hourly = [
        {
            "id": f"h{i}",
            "timestamp": _stamps("2021-03-01", n, "h"),
            "target": list(10 + 3 * np.sin(np.arange(n) * 2 * np.pi / 24) + rng.normal(0, 0.5, n) + i),
        }
        for i, n in enumerate([180, 200, 230])
    ]
    daily = []
    for i, (start, n) in enumerate([("2022-01-01", 90), ("2022-01-11", 80), ("2022-01-06", 85)]):
        price = rng.normal(5, 1, n)
        daily.append(
            {
                "id": f"d{i}",
                "timestamp": _stamps(start, n, "D"),
                "target": list(20 + 2 * price + rng.normal(0, 1, n)),
                "price": list(price),
                "load_lag": list(rng.normal(0, 1, n)),
            }
        )
    weekly = []
    for i, n in enumerate([70, 75, 80]):
        values = 100 + np.cumsum(rng.normal(0, 1, n))
        values[[5, 6, 7, 20 + i, 41]] = np.nan  # gaps, in the context of every window
        weekly.append({"id": f"w{i}", "timestamp": _stamps("2019-01-06", n, "W-SUN"), "target": list(values)})
    multivariate = [
        {"id": "m0", "timestamp": _stamps("2020-01-01", 40, "D"), "a": list(rng.normal(0, 1, 40)), "b": [1.0] * 40}
    ]
    common = {"quantile_levels": LEVELS}
    return [
        fev.Task(
            dataset_path=_write_fev_dataset(root / "hourly" / "data.parquet", hourly),
            task_name="hourly",
            horizon=24,
            num_windows=2,
            window_step_size=12,
            seasonality=24,
            eval_metric="MASE",
            extra_metrics=["WQL", "SQL", "MAE"],
            **common,
        ),
        fev.Task(
            dataset_path=_write_fev_dataset(root / "daily" / "data.parquet", daily),
            task_name="daily_covariates",
            horizon=7,
            num_windows=3,
            initial_cutoff="2022-03-10",
            window_step_size=7,
            seasonality=7,
            known_dynamic_columns=["price"],
            past_dynamic_columns=["load_lag"],
            eval_metric="WQL",
            extra_metrics=["MASE", "SQL"],
            **common,
        ),
        fev.Task(
            dataset_path=_write_fev_dataset(root / "weekly" / "data.parquet", weekly),
            task_name="weekly_gaps",
            horizon=32,
            num_windows=2,
            initial_cutoff=36,
            window_step_size=1,
            eval_metric="SQL",
            extra_metrics=["MASE", "RMSE"],
            **common,
        ),
        fev.Task(  # planned with hourly: the same checkpoints, no covariates; its own horizon, windows, levels
            dataset_path=str(root / "weekly" / "data.parquet"),
            task_name="weekly_short",
            horizon=16,
            num_windows=3,
            window_step_size=5,
            quantile_levels=[0.1, 0.5, 0.9],
            eval_metric="WQL",
            extra_metrics=["MASE"],
        ),
        fev.Task(
            dataset_path=_write_fev_dataset(root / "multi" / "data.parquet", multivariate),
            task_name="multivariate",
            target=["a", "b"],
            horizon=4,
            **common,
        ),
    ]


def _plain_onnx_predictions(task: Any, checkpoint: Any) -> list[list[dict[str, Any]]]:
    """Predictions of a plain ONNX Runtime loop over ``task.iter_windows()`` (the OpenSTEF Chronos-2 tensors)."""
    import onnxruntime as ort

    metadata = checkpoint.metadata
    length, graph_horizon = metadata.context_length, metadata.horizon_length
    session = ort.InferenceSession(str(checkpoint.weights_path), providers=["CPUExecutionProvider"])
    covariates = [*task.past_dynamic_columns, *task.known_dynamic_columns]  # past-only rows first
    per_window = []
    for window in task.iter_windows():
        past, future = window.get_input_data()
        rows, groups = [], []
        for index in range(len(past)):
            item, ahead = past[index], future[index]

            def history(values: Any) -> np.ndarray:
                values = np.asarray(values, dtype=np.float64)[-length:]
                return np.concatenate([np.full(length - len(values), np.nan), values])

            group = [np.concatenate([history(item[task.target]), np.full(graph_horizon, np.nan)])]
            for name in covariates:
                known = np.full(graph_horizon, np.nan)
                if name in task.known_dynamic_columns:
                    known[: task.horizon] = np.asarray(ahead[name], dtype=np.float64)
                group.append(np.concatenate([history(item[name]), known]))
            rows += group
            groups += [index] * len(group)
        grid = np.asarray(rows, dtype=np.float32)
        mask = np.isfinite(grid).astype(np.float32)
        values = np.where(mask > 0, grid, np.float32(0))
        inputs = {
            "context": values[:, :length],
            "attention_mask": mask[:, :length],
            "group_ids": np.asarray(groups, dtype=np.int64),
            "future_covariates": values[:, length:],
            "future_covariates_mask": mask[:, length:],
        }
        (output,) = session.run(["quantile_preds"], inputs)
        targets = output[np.arange(len(past)) * (1 + len(covariates))][:, :, : task.horizon].astype(np.float64)
        predictions = []
        for forecast in targets:
            entry = {"predictions": list(forecast[LEVELS.index(0.5)])}
            entry |= {str(level): list(forecast[LEVELS.index(level)]) for level in task.quantile_levels}
            predictions.append(entry)
        per_window.append(predictions)
    return per_window


def _metrics(task: Any) -> list[str]:
    return [fev.metrics.get_metric(m).name for m in [task.eval_metric, *task.extra_metrics]]


@pytest.fixture
def report_processes_started(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When (``time.time()``) each report process this process starts from now was started (the real ones,
    counted); a child an earlier test's run left warm is stopped first, so the test's first run starts its own."""
    import time

    from distributed_onnx.evaluation.driver import report_process

    report_process.close_kept_report_process()
    started: list[float] = []
    real_init = report_process.ReportProcess.__init__

    def counted_init(self: report_process.ReportProcess) -> None:
        started.append(time.time())
        real_init(self)

    monkeypatch.setattr(report_process.ReportProcess, "__init__", counted_init)
    return started


@pytest.fixture
def windows_cut_for_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The cutoffs of the fev windows this process cuts from now to learn which series fev keeps in them (fev's
    ``get_ground_truth``, counted; fev's own scoring cuts its windows apart)."""
    cut: list[str] = []
    real = fev.task.EvaluationWindow.get_ground_truth

    def counted(self: Any) -> Any:
        cut.append(str(self.cutoff))
        return real(self)

    monkeypatch.setattr(fev.task.EvaluationWindow, "get_ground_truth", counted)
    return cut


@pytest.mark.integration
def test_fev_benchmark_summaries_equal_fev_on_a_plain_onnx_loop(
    ray_session: None, tmp_path: Path, report_processes_started: list[float], windows_cut_for_ids: list[str]
) -> None:
    from distributed_onnx import fev_benchmark
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    tasks = _tasks(tmp_path / "datasets")
    # The reference's context: the two share each task's run (one backtest, one report comparing them).
    tiny = write_tiny_chronos2(
        tmp_path / "ckpt", name="tiny", context_length=512, output_patch_size=8, horizon_patches=3
    )
    reference = LocalCheckpoint(path=REFERENCE / "taylor_chronos2_patchtst.onnx").resolve()
    output = tmp_path / "out"

    result = fev_benchmark(
        fev.Benchmark(tasks), checkpoint=[reference.weights_path, tiny.weights_path], output=output, actors=1
    )
    # Once per window of each task forecast, whichever of its checkpoints are scored there (hourly and
    # weekly_short by both), not once per checkpoint.
    assert len(windows_cut_for_ids) == sum(task.num_windows for task in tasks[:4]), windows_cut_for_ids

    status = {(p["task"], p["model"]): (p["status"], p["reason"]) for p in result.pairs}
    assert status[("weekly_gaps", "tiny")][0] == "skipped"
    assert "horizon 32 is longer than the checkpoint emits" in status[("weekly_gaps", "tiny")][1]
    for model in ("taylor_chronos2_patchtst", "tiny"):
        assert status[("multivariate", model)][0] == "skipped"
        assert "multivariate target" in status[("multivariate", model)][1]
    done = {(s["task_name"], s["model_name"]): s for s in result.summaries}
    assert sorted(done) == sorted(
        [
            (t, m)
            for t in ("hourly", "daily_covariates", "weekly_gaps", "weekly_short")
            for m in ("taylor_chronos2_patchtst", "tiny")
            if (t, m) != ("weekly_gaps", "tiny")
        ]
    )
    for task in tasks[:4]:
        for checkpoint in (reference, tiny):
            key = (task.task_name, checkpoint.name)
            if key not in done:
                continue
            expected = task.evaluation_summary(_plain_onnx_predictions(task, checkpoint), model_name=checkpoint.name)
            got = done[key]
            assert got["num_forecasts"] == expected["num_forecasts"]
            assert got["inference_time_s"] > 0
            for metric in ["test_error", *_metrics(task)]:
                assert got[metric] == pytest.approx(expected[metric], rel=1e-9, abs=1e-12), (key, metric)

    lines = (output / "summaries.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == result.summaries
    board = fev.leaderboard(
        str(output / "summaries.json"), baseline_model="taylor_chronos2_patchtst", missing_strategy="drop"
    )
    assert set(board.index) == {"taylor_chronos2_patchtst", "tiny"}
    import pandas as pd

    pivot = fev.pivot_table(pd.read_json(output / "summaries.jsonl", lines=True), task_columns=["task_name"])
    assert pivot.shape == (4, 2)
    # Planned together: hourly and weekly_short (both checkpoints, context 512, no covariates) in one run; daily
    # (its covariates) and weekly_gaps (the reference alone serves it) in one each; one report per run.
    run_of = {(p["task"], p["model"]): p.get("run_dir") for p in result.pairs if p["status"] == "done"}
    assert run_of[("hourly", "tiny")] == run_of[("hourly", "taylor_chronos2_patchtst")]
    assert run_of[("weekly_short", "tiny")] == run_of[("hourly", "tiny")]
    assert len(set(run_of.values())) == 3
    runs = sorted((output / "runs").iterdir())
    assert len(runs) == 3
    for run in runs:  # each run's own report, naming the models it compared
        page = (run / "report.html").read_text()
        assert "<svg" in page and "taylor_chronos2_patchtst" in page
        # drawn by the report process, one for the three runs: the first run's, kept warm (its imports paid once)
        assert json.loads((run / "summary.json").read_text())["timing"]["report_drawn_by"] == "report process"
        # fev scored the run's pairs while its report was drawn: their records are there before its summary.json
        records = [
            output / "pairs" / p["task_dir"] / f"{p['model']}.json"
            for p in result.pairs
            if p.get("run_dir") == str(run)
        ]
        assert records and all(r.stat().st_mtime_ns <= (run / "summary.json").stat().st_mtime_ns for r in records)
    assert len(report_processes_started) == 1, report_processes_started
    # started once the plan showed runs to make, before the first run's folder: its imports beside the pool's start
    assert report_processes_started[0] < min((run / "run.json").stat().st_mtime for run in runs)
    models = set(pq.read_table(Path(run_of[("hourly", "tiny")]) / "leaderboard.parquet").column("model").to_pylist())
    assert {"taylor_chronos2_patchtst", "tiny"} <= models
    assert done[("hourly", "tiny")]["inference_time_shared_with"] == "taylor_chronos2_patchtst"
    # The actors are started once per set of checkpoints, not per run: daily's run ran on hourly's actors.
    actors = {
        task: sorted(
            a["pid"] for a in json.loads((Path(run_of[(task, "tiny")]) / "summary.json").read_text())["actors"]
        )
        for task in ("hourly", "daily_covariates")
    }
    assert actors["hourly"] and actors["hourly"] == actors["daily_covariates"]


def test_tasks_share_a_run_only_with_the_same_grid_context_and_covariates(tmp_path: Path) -> None:
    from distributed_onnx.evaluation.fev_tasks.run_plan import run_shape
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    reference = LocalCheckpoint(path=REFERENCE / "taylor_chronos2_patchtst.onnx").resolve()
    same = write_tiny_chronos2(tmp_path, name="same", context_length=512, output_patch_size=8, horizon_patches=3)
    shorter = write_tiny_chronos2(tmp_path, name="short", context_length=64, output_patch_size=8, horizon_patches=3)
    task = fev.Task(dataset_path="x/y/data.parquet", horizon=8, known_dynamic_columns=["price"])
    other = fev.Task(dataset_path="x/z/data.parquet", horizon=16, num_windows=3, known_dynamic_columns=["price"])
    types = {"price": "double"}
    shapes = {each.name: run_shape(task, each, types) for each in (reference, same, shorter)}
    assert shapes["taylor_chronos2_patchtst"] == shapes["same"] == (30, 512, (("price", "double"),), ())
    assert shapes["short"] == (30, 64, (("price", "double"),), ())
    assert run_shape(other, reference, types) == shapes["taylor_chronos2_patchtst"]  # horizon, windows: any
    assert run_shape(other, reference, {"price": "int64"}) != shapes["taylor_chronos2_patchtst"]
    capped = fev.Task(dataset_path="x/y/data.parquet", horizon=8, max_context_length=100)
    assert [run_shape(capped, each, {})[:2] for each in (reference, same, shorter)] == [(30, 100), (30, 100), (30, 64)]


def _hourly_yaml(root: Path, extra_tasks: list[dict[str, Any]]) -> Path:
    import yaml

    task = _tasks(root / "datasets")[0]
    fields = {key: task.to_dict()[key] for key in ("dataset_path", "task_name", "horizon", "num_windows")}
    fields |= {"window_step_size": 12, "seasonality": 24, "quantile_levels": LEVELS, "eval_metric": "MASE"}
    path = root / "bench.yaml"
    path.write_text(yaml.safe_dump({"tasks": [fields, *extra_tasks]}))
    return path


@pytest.mark.integration
def test_fev_resumes_and_adds_a_checkpoint_from_the_command(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished task x checkpoint is not recomputed; an added checkpoint is; a task fev cannot load fails
    alone (exit 1, the others' summaries written)."""
    from distributed_onnx import cli, fev_benchmark

    bench = _hourly_yaml(tmp_path, [{"dataset_path": str(tmp_path / "absent" / "data.parquet"), "task_name": "gone"}])
    first = write_tiny_chronos2(
        tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8, horizon_patches=3
    )
    second = write_tiny_chronos2(
        tmp_path / "ckpt", name="tiny2", context_length=64, output_patch_size=8, horizon_patches=4
    )
    output = tmp_path / "out"
    tasks = fev.Benchmark.from_yaml(bench).tasks[:1]
    fev_benchmark(tasks, checkpoint=first.weights_path, output=output, actors=1)
    pair = output / "pairs" / "000-hourly" / "tiny.json"
    written = pair.read_bytes()
    parts = sorted((output / "runs").glob("*/forecasts/model=tiny/*.parquet"))
    stamps = [part.stat().st_mtime_ns for part in parts]

    code = cli.main(
        [
            "fev",
            str(bench),
            "--checkpoint",
            str(first.weights_path),
            "--checkpoint",
            str(second.weights_path),
            "--output",
            str(output),
            "--actors",
            "1",
        ]
    )

    err = capsys.readouterr().err
    assert code == 1
    assert "error: 2 task x checkpoint pair(s) failed (e.g. gone x tiny: fev could not load the task's data" in err
    assert pair.read_bytes() == written  # resumed, not recomputed
    document = json.loads((output / "fev_summary.json").read_text())
    status = {(p["task"], p["model"]): p["status"] for p in document["pairs"]}
    assert status == {
        ("hourly", "tiny"): "resumed",
        ("hourly", "tiny2"): "done",
        ("gone", "tiny"): "failed",
        ("gone", "tiny2"): "failed",
    }
    summaries = [json.loads(line) for line in (output / "summaries.jsonl").read_text().splitlines()]
    assert [s["model_name"] for s in summaries] == ["tiny", "tiny2"]
    assert summaries[1]["inference_time_shared_with"] is None  # only tiny2 was computed by that run
    assert parts and [part.stat().st_mtime_ns for part in parts] == stamps  # tiny's forecasts not rewritten
    # tiny2 joined tiny's run directory (same tasks), where tiny's parts were kept
    assert [part.parent.parent.parent for part in (output / "runs").glob("*/forecasts/model=tiny2/*.parquet")] == [
        parts[0].parent.parent.parent
    ] * len(list((output / "runs").glob("*/forecasts/model=tiny2/*.parquet")))


def test_fev_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from distributed_onnx import cli

    monkeypatch.setitem(sys.modules, "fev", None)  # as if not installed: `import fev` raises ImportError
    code = cli.main(["fev", "bench.yaml", "--output", "out"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: fev is not installed. Install it with: pip install 'distributed-onnx[fev]'"
    )


@pytest.mark.integration  # fev's loader validates the data in worker processes (datasets' map)
def test_every_fev_window_starts_at_its_origin_on_the_grid(tmp_path: Path) -> None:
    """The layout's invariant, in all three cutoff modes: the first future value fev gives each series it keeps
    sits at the window's origin on the grid, and the values before it are fev's past."""
    import pyarrow.compute as pc

    from distributed_onnx.evaluation.fev_tasks.tasks import task_data

    for task in _tasks(tmp_path)[:4]:
        data = task_data(task)
        ids = np.asarray(data.series_ids.to_pylist())
        values = data.target.to_numpy(zero_copy_only=False)
        for window, origin in zip(task.iter_windows(), data.origins, strict=True):
            past, _ = window.get_input_data()
            truth = window.get_ground_truth()
            assert len(truth) > 0
            future_values = truth.data.table.column(task.target).to_pylist()  # the values fev scores
            past_values = past.data.table.column(task.target).to_pylist()
            for row, series_id in enumerate(truth.data.table.column(task.id_column).to_pylist()):
                mine = ids == series_id
                at = np.flatnonzero(data.positions[mine] == origin)
                assert at.size == 1, (task.task_name, origin)
                series = values[mine]
                np.testing.assert_array_equal(series[at[0] : at[0] + task.horizon], np.array(future_values[row], float))
                np.testing.assert_array_equal(series[: at[0]], np.array(past_values[row], float))
        assert (
            np.diff(data.origins).tolist()
            == {"hourly": [12], "daily_covariates": [7, 7], "weekly_gaps": [1], "weekly_short": [5, 5]}[task.task_name]
        )
        assert pc.all(pc.is_valid(data.series_ids)).as_py()


def test_fev_with_a_benchmark_fev_cannot_read_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from distributed_onnx import cli

    missing = tmp_path / "absent.yaml"
    code = cli.main(["fev", str(missing), "--output", str(tmp_path / "out")])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {missing} is not a benchmark fev can read (a YAML 'tasks' list of fev.Task fields): "
        f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}'"
    )
    assert not (tmp_path / "out").exists()  # refused before anything is written or started


def test_the_package_and_the_fev_modules_do_not_import_fev_until_used() -> None:
    """fev is an optional extra: importing the package, the command and the fev modules leaves it unimported."""
    import subprocess

    code = (
        "import sys, distributed_onnx, distributed_onnx.cli, distributed_onnx.evaluation.fev_tasks.runner; "
        "print(sorted({'fev', 'datasets'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def _forecasts_of(output: Path, prefix: str, horizon: int) -> pa.Table:
    """Every forecast row of ``output``'s runs whose merged id starts with ``prefix``, leads up to ``horizon``."""
    import pyarrow.compute as pc

    from distributed_onnx.model.quantiles import quantile_column_name

    columns = ["series_id", "lead", *(quantile_column_name(q) for q in (0.1, 0.5, 0.9))]
    parts = sorted(output.glob("runs/*/forecasts/model=tiny/*.parquet"))
    table = pa.concat_tables([pq.read_table(part, columns=columns) for part in parts])
    keep = pc.and_(pc.starts_with(table.column("series_id"), prefix), pc.less_equal(table.column("lead"), horizon))
    return table.filter(keep).sort_by([("series_id", "ascending"), ("lead", "ascending")])


@pytest.mark.integration
def test_a_task_planned_with_longer_ones_forecasts_bit_for_bit_as_alone(ray_session: None, tmp_path: Path) -> None:
    """Merged with a task of a longer horizon (and, for the covariate task, the same covariates), a task's
    forecasts are those of its run alone, bit for bit: the graph emits its fixed horizon and the shorter one
    is cut, and no known covariate beyond the task's own horizon reaches the model."""
    from distributed_onnx import fev_benchmark

    tasks = _tasks(tmp_path / "datasets")
    daily, weekly_short, hourly = tasks[1], tasks[3], tasks[0]
    daily_long = fev.Task(
        dataset_path=daily.dataset_path,
        task_name="daily_long",
        horizon=14,
        num_windows=2,
        known_dynamic_columns=["price"],
        past_dynamic_columns=["load_lag"],
        quantile_levels=[0.25, 0.5, 0.75],
    )
    tiny = write_tiny_chronos2(
        tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8, horizon_patches=3
    )
    alone, merged = tmp_path / "alone", tmp_path / "merged"
    first = fev_benchmark([daily, weekly_short], checkpoint=tiny.weights_path, output=alone, actors=1)
    second = fev_benchmark(
        [daily, weekly_short, daily_long, hourly], checkpoint=tiny.weights_path, output=merged, actors=1
    )

    runs = {p["task"]: p["run_dir"] for p in second.pairs}
    assert runs["daily_covariates"] == runs["daily_long"] != runs["weekly_short"] == runs["hourly"]
    assert len({p["run_dir"] for p in first.pairs}) == 2  # alone: covariates or not keep them apart
    for number, task in enumerate([daily, weekly_short]):
        by_itself = _forecasts_of(alone, f"{number}:", task.horizon)
        with_others = _forecasts_of(merged, f"{number}:", task.horizon)
        assert by_itself.num_rows > 0
        assert by_itself.equals(with_others), task.task_name
    assert first.summaries == [
        {
            **summary,
            "inference_time_s": first.summaries[n]["inference_time_s"],
            "run_dir": first.summaries[n]["run_dir"],
        }
        | {"run_tasks": 1}
        for n, summary in enumerate(second.summaries[:2])
    ]


def test_window_series_ids_keep_any_data_id_apart_and_hold_each_window_s_context_and_horizon() -> None:
    """Ids are data: a task's ``1:0`` and another's ``0`` cannot meet as one merged series, and a window's
    series holds its context and horizon only, with its origin at the run's one origin."""
    from distributed_onnx.evaluation.fev_tasks.predictions import window_predictions
    from distributed_onnx.evaluation.fev_tasks.tasks import TaskData, merged_origin, merged_series_id
    from distributed_onnx.model.quantiles import quantile_column_name

    def data(ids: list[str], n: int, origins: tuple[int, ...]) -> TaskData:
        return TaskData(
            pa.array([i for i in ids for _ in range(n)]),
            np.tile(np.arange(n, dtype=np.int64), len(ids)),
            pa.array(np.arange(n * len(ids), dtype=np.float64)),
            {},
            origins,
            3,
        )

    tables = [
        data(["1:0", "a"], 10, (6, 7)).window_table(0, 4, 30, covariates=False),
        data(["0", "a"], 10, (5,)).window_table(1, 4, 30, covariates=False),
    ]
    table = pa.concat_tables(tables)
    ids = table.column("series_id").to_pylist()
    assert len(set(ids)) == 6  # 2 series x 2 windows + 2 series x 1 window
    assert merged_series_id(0, 1, "1:0") != merged_series_id(1, 0, "1:0") == "1:0:1:0"
    origin_us = int(merged_origin(30, 4).timestamp()) * 1_000_000
    stamps = np.asarray(table.column("timestamp").cast(pa.int64()).to_numpy())
    step_us = 30 * 60_000_000
    first = [i for i, each in enumerate(ids) if each == "0:1:1:0"]  # task 0, window 1 (origin 7) of id "1:0"
    assert table.column("y").to_numpy()[first].tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # 4 back, 3 on
    assert ((stamps[first] - origin_us) // step_us).tolist() == [-4, -3, -2, -1, 0, 1, 2]

    levels = [0.1, 0.5, 0.9]
    rows = [(series_id, lead) for series_id in sorted(set(ids)) for lead in range(1, 6)]
    forecasts = pa.table(
        {
            "series_id": [r[0] for r in rows],
            "origin": pa.array([origin_us] * len(rows), pa.timestamp("us", tz="UTC")),
            "lead": pa.array([r[1] for r in rows], pa.int32()),
        }
        | {quantile_column_name(q): [ids.index(r[0]) + r[1] * q for r in rows] for q in levels}
    )
    got = window_predictions(forecasts, ["1:0:0", "1:0:a"], 3, [0.1, 0.9])
    assert got.column_names == ["predictions", "0.1", "0.9"]
    expected = [[ids.index(series_id) + lead * 0.5 for lead in (1, 2, 3)] for series_id in ("1:0:0", "1:0:a")]
    assert got.column("predictions").to_pylist() == expected


@pytest.mark.integration
def test_a_task_no_rerun_can_get_past_is_rejected_alone(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One task's data the backtest refuses (an infinite covariate) rejects that task alone, not the tasks planned
    with it: the merged run is retried one run per task (issue 51: it said "failed ... rerun to retry"). A task
    whose target is letters stopped where its data is laid out and was recorded ``failed`` ("rerun to retry"),
    though a rerun fails the same way: it is now refused before anything starts (exit 2,
    ``tests/test_cli_refusals.py``). One status for what is found while running, and for fev's own refusals:
    ``rejected`` (the two words the branches had, ``refused`` and ``rejected``, said the same)."""
    import yaml

    from distributed_onnx import cli

    def task(name: str, bad: bool = False) -> dict[str, Any]:
        n = 60
        covariate = np.ones(n)
        if bad:
            covariate[3] = np.inf
        target = list(np.sin(np.arange(n)))
        rows = [{"id": "a", "timestamp": _stamps("2021-01-01", n, "h"), "target": target, "x": list(covariate)}]
        path = _write_fev_dataset(tmp_path / name / "data.parquet", rows)
        return {"dataset_path": path, "task_name": name, "horizon": 8, "known_dynamic_columns": ["x"]}

    bench = tmp_path / "bench.yaml"
    bench.write_text(yaml.safe_dump({"tasks": [task("good"), task("bad", bad=True)]}))
    tiny = write_tiny_chronos2(
        tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8, horizon_patches=3
    )
    argv = ["fev", str(bench), "--checkpoint", str(tiny.weights_path), "--output", str(tmp_path / "out")]
    assert cli.main([*argv, "--actors", "1"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        "error: 1 task x checkpoint pair(s) rejected (e.g. bad x tiny: the backtest refuses the task: DataError: "
    ), line
    assert "column 'x' has infinite values" in line, line
    assert line.endswith("fix or drop the rejected tasks (a rerun rejects them again)"), line
    assert "failed" not in line and "rerun to retry" not in line, line
    document = json.loads((tmp_path / "out" / "fev_summary.json").read_text())
    status = {p["task"]: p["status"] for p in document["pairs"]}
    assert status == {"good": "done", "bad": "rejected"}
    assert document["counts"] == {"done": 1, "resumed": 0, "skipped": 0, "rejected": 1, "failed": 0}
    summaries = [json.loads(line) for line in (tmp_path / "out" / "summaries.jsonl").read_text().splitlines()]
    assert [(s["task_name"], s["run_tasks"]) for s in summaries] == [("good", 1)]
    assert len(list((tmp_path / "out" / "data").iterdir())) == 3  # the merged run's input, then each task's


@pytest.mark.integration
def test_sets_of_checkpoints_run_one_pool_at_a_time_and_a_task_fev_rejects_fails_alone(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three checkpoints, one too short for a task, make two sets of checkpoints. On the test's 2-CPU Ray the
    first set's pool (filling the cluster) kept both CPUs and the second set's waited for room it never got:
    no progress, no error. And a task whose windows or data fev refuses as it scores them (an initial cutoff past
    the data, more windows than the data holds; a target of numbers written as text too, now refused before
    anything starts: ``tests/test_cli_refusals.py``) ended the whole run with exit 4 from inside scoring, the
    healthy tasks' summaries never written; a rerun crashed the same way.

    Now each set's pool is released before the next set's starts, the rejected tasks' pairs are recorded with
    fev's reason, everything else is written, the command exits 1 naming them, and a rerun says the same from
    the records without forecasting anything again."""
    import yaml

    from distributed_onnx import cli

    hourly = _tasks(tmp_path / "datasets")[0].dataset_path
    base = {"dataset_path": hourly, "horizon": 8, "num_windows": 2, "window_step_size": 12, "seasonality": 24}
    tasks = [
        {**base, "task_name": "short"},  # every checkpoint serves it
        {**base, "task_name": "long", "horizon": 20},  # short3's 8 steps do not: a second set of checkpoints
        {**base, "task_name": "late", "initial_cutoff": "2030-01-01"},
        {**base, "task_name": "many", "num_windows": 30},
    ]
    bench = tmp_path / "bench.yaml"
    bench.write_text(yaml.safe_dump({"tasks": tasks}))
    sizes = {"long1": 3, "long2": 3, "short3": 1}  # output patches of 8 steps
    paths = [
        write_tiny_chronos2(tmp_path / "ckpt", name=name, context_length=64, output_patch_size=8, horizon_patches=n)
        for name, n in sizes.items()
    ]
    output = tmp_path / "out"
    argv = ["fev", str(bench), "--output", str(output)]
    for each in paths:
        argv += ["--checkpoint", str(each.weights_path)]

    assert cli.main(argv) == 1
    first = capsys.readouterr().err.strip().splitlines()[-1]
    assert first.startswith(
        "error: 6 task x checkpoint pair(s) rejected (e.g. late x long1: fev rejects the task: ValueError: "
        "All time series in the dataset are too short for the chosen cutoff"
    ), first
    assert first.endswith("fix or drop the rejected tasks (a rerun rejects them again)"), first
    document = json.loads((output / "fev_summary.json").read_text())
    status = {(p["task"], p["model"]): p["status"] for p in document["pairs"]}
    assert status == {
        **{("short", model): "done" for model in sizes},
        ("long", "long1"): "done",
        ("long", "long2"): "done",
        ("long", "short3"): "skipped",
        **{(task, model): "rejected" for task in ("late", "many") for model in sizes},
    }
    reasons = {p["task"]: p["reason"] for p in document["pairs"] if p["status"] == "rejected"}
    assert all(reason.startswith("fev rejects the task: ") for reason in reasons.values()), reasons
    summaries = [json.loads(line) for line in (output / "summaries.jsonl").read_text().splitlines()]
    assert sorted((s["task_name"], s["model_name"]) for s in summaries) == sorted(
        [("short", model) for model in sizes] + [("long", "long1"), ("long", "long2")]
    )
    # One pool per set, one set at a time: the second set ran on new actors, the first's released before.
    run_of = {(p["task"], p["model"]): p["run_dir"] for p in document["pairs"] if p["status"] == "done"}
    pids = {
        task: {a["pid"] for a in json.loads((Path(run_of[(task, "long1")]) / "summary.json").read_text())["actors"]}
        for task in ("short", "long")
    }
    assert len(pids["short"]) == len(pids["long"]) == 2 and not pids["short"] & pids["long"]

    stamps = {path: path.stat().st_mtime_ns for path in output.glob("runs/*/forecasts/*/*.parquet")}
    assert cli.main(argv) == 1  # the rerun: the same line, from the records
    assert capsys.readouterr().err.strip().splitlines()[-1] == first
    again = json.loads((output / "fev_summary.json").read_text())
    assert {(p["task"], p["model"]): p["status"] for p in again["pairs"]} == {
        pair: "resumed" if done == "done" else done for pair, done in status.items()
    }
    assert {path: path.stat().st_mtime_ns for path in output.glob("runs/*/forecasts/*/*.parquet")} == stamps


class _Holder:
    """An actor that holds its CPU (``kill_and_wait`` calls ``ready``)."""

    def ready(self) -> None:
        return None


@pytest.mark.integration
def test_fev_takes_the_backtests_pool_settings_and_deadlines(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51 follow-up: the pool deadlines (--placement-timeout-s, --ready-timeout-s) were backtest's flags
    only, so a fev benchmark whose pool found no room waited its default 120 s (then 600 s) with no way to say
    less; nor could fev's pools be given a GPU or a provider chain. fev's request copies every backtest setting
    its pools use. A GPU chain without a GPU is refused before anything (exit 2, nothing written, as backtest
    does); a pool of two 1-CPU actors, while another actor holds one of the test Ray's two CPUs, fails within
    --placement-timeout-s 3 naming what it asked (exit 3)."""
    import time

    import ray
    import yaml
    from ray_actors import kill_and_wait

    from distributed_onnx import cli
    from distributed_onnx.evaluation.fev_tasks.request import FevRequest
    from distributed_onnx.evaluation.settings import BacktestSettings

    pool_settings = {"actors", "cpus_per_actor", "gpus_per_actor", "providers", "graph_optimization"}
    pool_settings |= {"placement_timeout_s", "ready_timeout_s", "address"}
    assert pool_settings <= set(FevRequest.model_fields)
    for name in pool_settings:  # the backtest's own field: its bounds, default and help
        ours, theirs = FevRequest.model_fields[name], BacktestSettings.model_fields[name]
        assert (ours.default, ours.metadata, ours.description) == (theirs.default, theirs.metadata, theirs.description)

    hourly = _tasks(tmp_path / "datasets")[0].dataset_path
    bench = tmp_path / "bench.yaml"
    bench.write_text(yaml.safe_dump({"tasks": [{"dataset_path": hourly, "horizon": 8, "seasonality": 24}]}))
    tiny = write_tiny_chronos2(tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8)
    argv = ["fev", str(bench), "--checkpoint", str(tiny.weights_path), "--output", str(tmp_path / "out")]

    assert cli.main([*argv, "--providers", "cuda,cpu"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: Invalid fev settings: --providers: providers ['cuda'] need a GPU"), line
    assert not (tmp_path / "out").exists()

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _Holder is defined here
    holder = ray.remote(num_cpus=1)(_Holder).remote()
    ray.get(holder.ready.remote(), timeout=60)
    started = time.monotonic()
    try:
        code = cli.main([*argv, "--actors", "2", "--placement-timeout-s", "3", "--ready-timeout-s", "30"])
    finally:
        kill_and_wait(holder)
    assert code == 3
    assert time.monotonic() - started < 60  # the task's data, three seconds of waiting, the pool stopped
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: 1 of 2 worker actors (1 CPU, 0 GPU each) were placed within 3 s; "), line


@pytest.mark.integration
def test_an_object_store_task_loads_through_the_store_and_a_task_no_rerun_helps_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outside tester's three findings, met through the command, on moto's S3 server on 127.0.0.1:

    - a task whose ``dataset_path`` is an S3 URL with options (credentials in its user-info, an endpoint holding
      ``/``) never loaded (fev checked the file type on the whole text, query included: "failed ... rerun to
      retry"), and fev named it after its text's folders, which the endpoint's ``/`` moved into the query: the
      error line, fev_summary.json and the pairs folder showed ``fevdir/data.parquet?endpoint_override=http:``.
      Now it is read through the store with its options and scored, named ``***@bkt/fevdir``, and no file or
      line holds its credentials or any option's value;
    - an ``initial_cutoff`` without the zone its data's timestamps carry was ``failed`` ("rerun to retry"),
      though every rerun fails the same way: ``rejected``, naming initial_cutoff;
    - Ray's token-authentication notice reached stderr without -v (the backtest silenced it, fev did not).
    """
    import subprocess

    import pyarrow.fs as pafs
    import yaml

    moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the 'dev' extra)")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookups (no network here)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        options = f"endpoint_override=http://127.0.0.1:{port}&scheme=http&region=us-east-1"
        bucket = f"s3://FEVKEY:FEVSECRET99@bkt?{options}&allow_bucket_creation=true"
        pafs.FileSystem.from_uri(bucket)[0].create_dir("bkt")
        url = f"s3://FEVKEY:FEVSECRET99@bkt/fevdir/data.parquet?{options}"
        store, inner = pafs.FileSystem.from_uri(url)
        with store.open_output_stream(inner) as upload:
            upload.write(Path(_tasks(tmp_path / "datasets")[0].dataset_path).read_bytes())
        stamps = pa.array([_stamps("2029-12-25", 200, "h")], pa.list_(pa.timestamp("ms", tz="UTC")))
        zoned = pa.table({"id": ["z"], "timestamp": stamps, "target": [list(np.sin(np.arange(200.0)))]})
        (tmp_path / "zoned").mkdir()
        pq.write_table(zoned, tmp_path / "zoned" / "data.parquet")
        common = {"horizon": 8, "num_windows": 2, "window_step_size": 12, "seasonality": 24}
        naive = {"dataset_path": str(tmp_path / "zoned" / "data.parquet"), "task_name": "naive"}
        tasks = [{"dataset_path": url, **common}, {**naive, **common, "initial_cutoff": "2030-01-01T00:00:00"}]
        bench = tmp_path / "bench.yaml"
        bench.write_text(yaml.safe_dump({"tasks": tasks}))
        tiny = write_tiny_chronos2(
            tmp_path / "ckpt", name="tiny", context_length=64, output_patch_size=8, horizon_patches=3
        )
        output = tmp_path / "out"
        command = [sys.executable, "-m", "distributed_onnx", "fev", str(bench), "--checkpoint", str(tiny.weights_path)]
        environment = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
        done = subprocess.run(
            [*command, "--output", str(output), "--actors", "1"],
            env=environment,  # without RAY_AUTH_MODE Ray announces token authentication as it starts
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        server.stop()

    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "error: 1 task x checkpoint pair(s) rejected (e.g. naive x tiny: the task's data cannot be used: "
        "ConfigError: initial_cutoff '2030-01-01T00:00:00' cannot be compared with the task's timestamps"
    ), line
    assert line.endswith("fix or drop the rejected tasks (a rerun rejects them again)"), line
    assert "write it with the offset of the data's zone UTC: '2030-01-01T00:00:00+00:00'" in line, line
    assert "failed" not in line and "rerun to retry" not in line, line
    assert "Token authentication" not in done.stderr, done.stderr
    document = json.loads((output / "fev_summary.json").read_text())
    assert [(p["task"], p["task_dir"], p["status"]) for p in document["pairs"]] == [
        ("***@bkt/fevdir", "000-bkt_fevdir", "done"),
        ("naive", "001-naive", "rejected"),
    ]
    assert [path.name for path in (output / "pairs").iterdir()] == ["000-bkt_fevdir"]  # a load's refusal: no record
    (summary,) = json.loads((output / "summaries.json").read_text())
    assert summary["task_name"] == "***@bkt/fevdir" and summary["num_forecasts"] > 0
    assert summary["dataset_path"] == "s3://***@bkt/fevdir/data.parquet?endpoint_override=***&scheme=***&region=***"
    written = [done.stdout, done.stderr] + [
        f"{path.relative_to(output)}\n{path.read_text() if path.suffix in ('.json', '.jsonl', '.csv') else ''}"
        for path in output.rglob("*")
    ]
    for secret in ("FEVKEY", "FEVSECRET99", f"127.0.0.1:{port}", "endpoint_override=http", "scheme=http"):
        assert not [text for text in written if secret in text], secret


def test_a_task_named_after_its_url_shows_no_part_of_its_query() -> None:
    """fev names a task without ``task_name`` after its path's folders, on the whole text: a ``/`` in an option's
    value moved the name into the query (``dir/data.parquet?sig=ab``). The name is the redacted path's only."""
    from distributed_onnx.evaluation.fev_tasks.sources import named

    for url, name in [
        ("s3://K1:S3CRET@bkt/dir/data.parquet?sig=ab/S3CRET/cd&region=r", "***@bkt/dir"),
        ("s3://bkt/a/b/data.parquet?endpoint_override=http://127.0.0.1:9/x", "a/b"),
        ("https://host/data.parquet?token=a/b/c", "host"),
    ]:
        task = fev.Task(dataset_path=url, horizon=4)
        assert named(task).task_name == name, url
        assert task.task_name != name  # the user's own Task is left as fev made it
    given = fev.Task(dataset_path="s3://bkt/dir/data.parquet?x=a/b", horizon=4, task_name="mine")
    assert named(given).task_name == "mine"


@pytest.mark.parametrize(
    ("cutoff", "stamps", "advice"),
    [
        (
            "2030-01-01T00:00:00",
            pa.timestamp("ms", tz="UTC"),
            "offset of the data's zone UTC: '2030-01-01T00:00:00+00:00'",
        ),
        (
            "2030-07-01T00:00:00",
            pa.timestamp("ms", tz="America/Argentina/ComodRivadavia"),
            "data's zone America/Argentina/ComodRivadavia: '2030-07-01T00:00:00-03:00'",
        ),
        ("2030-01-01T00:00:00+01:00", pa.timestamp("ms"), "write it without one, as the data's are"),
    ],
)
def test_an_initial_cutoff_without_the_data_zone_is_rejected_with_the_whole_advice(
    cutoff: str, stamps: pa.DataType, advice: str
) -> None:
    """Outside test: the pair's reason for a naive ``initial_cutoff`` on zoned data ended mid-sentence (pyarrow's
    words cut: "... cast to timestamp without timezone, then"), without docs/fev.md's advice. It is the package's
    own sentence, whole in the pair's reason: the task's initial_cutoff, the data's zone and what to write."""
    from distributed_onnx.errors import ConfigError
    from distributed_onnx.evaluation.fev_tasks.reasons import pair_reason
    from distributed_onnx.evaluation.fev_tasks.tasks import _cutoff_us

    with pytest.raises(ConfigError) as refused:
        _cutoff_us(cutoff, stamps, cutoff)
    reason = pair_reason(refused.value)
    assert reason.startswith(f"ConfigError: initial_cutoff {cutoff!r} cannot be compared with the task's timestamps")
    assert reason.endswith(advice), reason
