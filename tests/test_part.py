"""The worker side of the backtest without Ray: one part from series to a verified part and its sums.

Integration tier for ONNX Runtime (the tiny Chronos-2 graph), no Ray: :class:`PartRunner` is exactly what
each actor runs, so its output is checked against an independent in-process forecast, its sums against the
metrics of the forecasts it wrote, and its files against the verification a resumed run applies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from backtest_data import (
    in_process_forecasts,
    merged_sums,
    read_forecasts,
    run_parts_in_process,
    settings_for,
    write_dataset,
)

from distributed_onnx.evaluation import outputs
from distributed_onnx.evaluation.fans import FanCandidates, FanCollector, FanPicker, fan_series, window_scores
from distributed_onnx.evaluation.planning._part_count import default_windows_per_part
from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores
from distributed_onnx.evaluation.sums import SUMS_FORMAT, PartSums, read_done_part
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.integration


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "load.parquet")


@pytest.fixture
def tiny(tiny_checkpoint: ResolvedCheckpoint) -> Path:
    return tiny_checkpoint.weights_path


def test_parts_hold_exactly_the_independent_forecasts(tmp_path: Path, tiny: Path, data: Path) -> None:
    settings = settings_for(tiny, data, tmp_path / "run", covariates=["temp"], rows_per_batch=3, windows_per_part=5)
    plan = run_parts_in_process(settings)
    assert [part.n_windows for part in plan.parts()] == [3, 5, 4]  # ramp: one batch first, then parts of 5
    written = read_forecasts(settings.output)
    expected = in_process_forecasts(settings)
    assert written.column_names == expected.column_names
    for name in written.column_names:
        if name.startswith("q"):
            np.testing.assert_allclose(written[name].to_numpy(), expected[name].to_numpy(), rtol=1e-6, atol=1e-6)
        else:
            assert written[name].equals(expected[name]), name


def test_packing_overlapped_with_the_model_writes_the_same_parts(tmp_path: Path, tiny: Path, data: Path) -> None:
    plain = settings_for(tiny, data, tmp_path / "plain", rows_per_batch=2, windows_per_part=6)
    overlapped = settings_for(tiny, data, tmp_path / "overlap", rows_per_batch=2, windows_per_part=6)
    run_parts_in_process(plain)
    run_parts_in_process(overlapped, overlap_packing=True)
    assert read_forecasts(overlapped.output).equals(read_forecasts(plain.output))


def test_sums_score_what_the_parts_hold(tmp_path: Path, tiny: Path, data: Path) -> None:
    """The metrics merged from the sums equal the metrics of the forecast files, scored from scratch."""
    settings = settings_for(tiny, data, tmp_path / "run", rows_per_batch=4)
    plan = run_parts_in_process(settings)
    sums = merged_sums(plan)
    merged = sums.metrics_table().to_pylist()
    forecasts = read_forecasts(settings.output)
    horizon = plan.spec.horizon
    actual = forecasts["y"].to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, horizon)
    median = forecasts["q0.5"].to_numpy().reshape(-1, horizon)
    # The common pairs: observed, and both baselines defined (the last season observed).
    valid = np.isfinite(actual)
    ours = next(
        r
        for r in merged
        if (r["model"], r["scope"], r["metric"], r["convention"]) == ("tiny", "global", "mae", "pooled")
    )
    left_out = {r["metric"]: r["n"] for r in merged if r["model"] == "tiny" and r["convention"] == "count"}
    assert ours["n"] + left_out["left_out_actual_missing"] + left_out["left_out_baseline_undefined"] == actual.size
    assert left_out["left_out_actual_missing"] == int((~valid).sum())
    if left_out["left_out_baseline_undefined"] == 0:
        mae = np.abs(actual - median)[valid].mean()
        assert ours["value"] == pytest.approx(mae, rel=1e-9)
        assert ours["n"] == int(valid.sum())


def test_a_part_verifies_only_with_its_own_run_part_and_size(tmp_path: Path, tiny: Path, data: Path) -> None:
    settings = settings_for(tiny, data, tmp_path / "run")
    plan = run_parts_in_process(settings)
    part = plan.parts()[1]
    horizon = plan.spec.horizon

    models = plan.model_fingerprints

    def verified(fingerprint: str = plan.run_fingerprint, index: int = part.index, windows: int = 4) -> bool:
        return read_done_part(settings.output, index, fingerprint, windows, horizon, models) is not None

    assert verified()
    assert not verified(fingerprint="another-run")
    assert not verified(windows=3)
    assert read_done_part(settings.output, part.index, plan.run_fingerprint, 4, horizon, {"tiny": "other"}) is None
    path = outputs.part_path(settings.output, "tiny", part.index)
    table = pq.read_table(path)
    pq.write_table(table, path)  # the same rows, rewritten without our footer record: foreign
    assert not verified()
    outputs.write_part(
        settings.output,
        "tiny",
        part.index,
        table.slice(0, 8),
        json.loads(table.schema.metadata[b"distributed_onnx.part"]),
    )
    assert not verified()  # right record, wrong rows and size


def test_sums_round_trip_and_refuse_torn_or_foreign_bytes() -> None:
    scores = PairScores(["m", *BASELINES], [0.1, 0.5, 0.9], 2)
    forecasts = {name: np.ones((2, 2, 3)) for name in scores.models}
    forecasts["m"] = np.where(np.arange(2)[:, None, None] == 1, np.nan, 1.0) * np.ones((2, 2, 3))
    ids, origins = np.array(["a", "b"]), np.array([0, 1800_000_000])
    scores.update(
        ids, origins, np.array(["w0", "w1"]), np.array([[1.0, np.nan], [3.0, 4.0]]), forecasts, np.array([1.0, 2.0])
    )
    sums = PartSums({"run_fingerprint": "fp", "part": 3}, scores, FanCandidates.empty(2, 3))
    payload = sums.to_bytes()
    back = PartSums.from_bytes(payload)
    assert back.header == {"run_fingerprint": "fp", "part": 3, "format": SUMS_FORMAT}
    assert back.scores.to_table().equals(scores.to_table())
    assert back.scores.nonfinite == {"m": ["w1"]}
    assert back.scores.excluded == {"actual_missing": 1, "baseline_undefined": 0, "model_nonfinite": 2}
    from distributed_onnx.errors import DataError

    with pytest.raises(DataError, match="unreadable"):
        PartSums.from_bytes(payload[: len(payload) // 2])
    with pytest.raises(DataError, match="unreadable"):
        PartSums.from_bytes(b"not an Arrow file at all")


def test_default_part_size_is_whole_batches_and_independent_of_the_cluster() -> None:
    assert default_windows_per_part(913, 256) == 256
    assert default_windows_per_part(150_000, 256) == 2560
    assert default_windows_per_part(10_000_000, 256) == 64 * 256
    assert default_windows_per_part(12, 4) == 4


def test_fans_pick_best_typical_worst_and_latest_over_parts() -> None:
    quantiles = (0.1, 0.5, 0.9)
    horizon = 2
    assert fan_series(10) == (0, 3, 6, 9)
    assert fan_series(2) == (0, 1)
    picker = FanPicker(horizon, quantiles)
    rng = np.random.default_rng(0)
    all_scores: list[tuple[float, int]] = []
    for part in range(3):
        collector = FanCollector(frozenset({0}), quantiles, horizon)
        for batch in range(2):
            n = 5
            origins = np.arange(n) + 10 * (2 * part + batch)
            actual = rng.normal(size=(n, horizon))
            forecast = np.repeat(actual[..., None], 3, axis=2) + rng.normal(size=(n, horizon, 1))
            scale = np.ones(n)
            series = np.array([0, 0, 0, 1, 1])  # only series 0 is a fan series
            collector.observe(series, origins, actual, forecast, scale)
            scores = window_scores(actual, forecast, scale, quantiles)
            all_scores += [(float(s), int(o)) for s, o, sid in zip(scores, origins, series, strict=True) if sid == 0]
        picker.add(collector.candidates())
    picked = picker.pick({0: float(np.mean([s for s, _ in all_scores]))})
    by_label = dict(zip(picked.label.tolist(), picked.origin_us.tolist(), strict=True))
    assert by_label["best"] == min(all_scores)[1]
    assert by_label["worst"] == max(all_scores)[1]
    assert by_label["latest"] == max(origin for _, origin in all_scores)
    assert "typical" in by_label
    assert set(picked.series_index.tolist()) == {0}


def test_a_part_opens_only_the_footers_the_driver_says_may_be_written(
    tmp_path: Path, tiny: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh (``written=()``): no footer is read and the part is computed; unknown (None) or named: read back."""
    from dataclasses import replace

    from distributed_onnx.evaluation.actor import part_written
    from distributed_onnx.evaluation.actor.part import PartRunner
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    settings = settings_for(tiny, data, tmp_path / "run", rows_per_batch=4)
    plan = run_parts_in_process(settings)  # every part written
    opened: list[str] = []
    verifies = part_written.model_part_verifies

    def counting(output: object, model: str, *args: object) -> bool:
        opened.append(model)
        return verifies(output, model, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(part_written, "model_part_verifies", counting)
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=tiny))
    runner = PartRunner(worker, plan.job(SeriesStore.from_table(plan.table)))
    part = plan.parts()[0]
    assert runner.run(replace(part, written=())).models_computed == [worker.model_name]
    assert opened == []
    assert runner.run(replace(part, written=None)).models_computed == []  # verified: read back, rescored
    assert runner.run(replace(part, written=(worker.model_name,))).models_computed == []
    assert opened == [worker.model_name, worker.model_name]
