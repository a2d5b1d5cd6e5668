"""Covariates as known at each cutoff (``--covariate-data``): every window's rows equal an as-of join done here.

The reference join is a plain loop over the vintage table (latest ``available_at <= cutoff - latency`` per
step), independent of :mod:`distributed_onnx.evaluation.data.vintages`' sorted-key search. A vintage issued one
step after the last cutoff carries an impossible value: it must never reach a window's tensors (and it does,
with the realized covariates, so the check can fail).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.packing import VintageJoin, pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesStore
from distributed_onnx.evaluation.data.vintages import VintageStats
from distributed_onnx.evaluation.data.windows import PlannedBatch, plan_series
from distributed_onnx.evaluation.dataset._vintages import index_vintages
from distributed_onnx.evaluation.planning import RunPlan, prepare
from distributed_onnx.location import Location
from tests.backtest_data import SERIES_LENGTHS, START_US, STEP_US, settings_for, write_dataset
from tests.graphs import write_tiny_chronos2

IMPOSSIBLE = 1.0e6
LEADS_ISSUED = (1, 2, 4, 7, 11)  # each timestamp's vintages are issued this many steps before it


def _truth(series_id: str, step: int, name: str) -> float:
    return float(len(series_id) * 3 + step % 17 + (5.0 if name == "price" else 0.0))


def vintage_table(per_series: bool, names: tuple[str, ...] = ("wind",), last_cutoff_us: int = 0) -> pa.Table:
    """Several vintages per timestamp (an error that shrinks as the timestamp nears), and one impossible
    vintage of every timestamp issued one step after ``last_cutoff_us``."""
    rows: dict[str, list[object]] = defaultdict(list)
    span = max(SERIES_LENGTHS.values()) + 20
    keys = ["a", "b"] if per_series else ["*"]  # "c" has no vintages in the per-series table: all missing
    for key in keys:
        for step in range(-10, span):
            stamp = START_US + step * STEP_US
            issues = [stamp - lead * STEP_US for lead in LEADS_ISSUED]
            if last_cutoff_us and last_cutoff_us + STEP_US not in issues:
                issues.append(last_cutoff_us + STEP_US)
            for issued in issues:
                rows["timestamp"].append(stamp)
                rows["available_at"].append(issued)
                if per_series:
                    rows["series_id"].append(key)
                for name in names:
                    late = issued == last_cutoff_us + STEP_US and last_cutoff_us
                    error = (stamp - issued) / STEP_US * 0.25
                    rows[name].append(IMPOSSIBLE if late else _truth(key, step, name) + error)
    columns: dict[str, pa.Array] = {
        "timestamp": pa.array(rows["timestamp"], pa.timestamp("us", tz="UTC")),
        "available_at": pa.array(rows["available_at"], pa.timestamp("us", tz="UTC")),
    }
    if per_series:
        columns["series_id"] = pa.array(rows["series_id"], pa.string())
    for name in names:
        columns[name] = pa.array(rows[name], pa.float64())
    order = np.random.default_rng(3).permutation(len(rows["timestamp"]))  # the file's order is no help
    return pa.table(columns).take(pa.array(order))


def reference_as_of(
    table: pa.Table, name: str, series_id: str, stamps_us: np.ndarray, limit_us: int | None
) -> np.ndarray:
    """The plain as-of join: for each timestamp, the value of the latest vintage issued by ``limit_us``
    (``None``: the latest of all)."""
    stamp = table["timestamp"].cast(pa.int64()).to_numpy()  # microseconds
    issued = table["available_at"].cast(pa.int64()).to_numpy()
    values = table[name].to_numpy()
    if "series_id" in table.column_names:
        mine = np.asarray(table["series_id"].to_pylist()) == series_id
    else:
        mine = np.ones(table.num_rows, dtype=bool)
    out = np.full(stamps_us.size, np.nan)
    for j, wanted in enumerate(stamps_us):
        best = None
        for row in np.flatnonzero(mine & (stamp == wanted)):
            if limit_us is not None and issued[row] > limit_us:
                continue
            if best is None or issued[row] > issued[best]:
                best = row
        if best is not None:
            out[j] = values[best]
    return out


def _plan(tmp_path: Path, per_series: bool, latency_min: int = 0, **overrides: object) -> tuple[RunPlan, pa.Table]:
    checkpoint = write_tiny_chronos2(tmp_path / "ckpt")
    data = write_dataset(tmp_path / "data.parquet")  # its own column "temp" stays "known exactly"
    settings = settings_for(checkpoint.weights_path, data, tmp_path / "run", **overrides)
    plan = prepare(settings.model_copy(update={"covariates": [], "past_covariates": []}))  # the same windows
    last_cutoff = max(
        int(series.timestamp_us(int(plan_series(series, plan.spec).origins.max()))) - STEP_US
        for series in plan.table.series
        if plan_series(series, plan.spec).origins.size
    )
    names = tuple(name for name in settings.covariate_columns if name != "temp")
    vintages = vintage_table(per_series, names, last_cutoff)
    pq.write_table(vintages, tmp_path / "vintages.parquet")
    settings = settings.model_copy(
        update={"covariate_data": Location(tmp_path / "vintages.parquet"), "covariate_latency": latency_min}
    )
    return prepare(settings), vintages


def _packed_windows(plan: RunPlan, realized: bool = False) -> list[tuple[str, int, np.ndarray]]:
    """Every planned window packed as the actors pack it: (series id, origin us, covariates [K, C + H])."""
    store = SeriesStore.from_table(plan.table)
    spec = plan.spec
    stats = VintageStats(spec.horizon, plan.step_us)
    out = []
    for index, series in enumerate(plan.table.series):
        origins = plan_series(series, spec).origins
        if not origins.size:
            continue
        planned = PlannedBatch(index, np.full(origins.size, index, dtype=np.int64), origins)
        assert plan.vintaged is not None
        join = VintageJoin(plan.vintaged, realized=realized, stats=stats)
        batch = pack_batch(store, planned, spec.context_length, spec.horizon, plan.window_fingerprint, plan.roles, join)
        width = spec.context_length + spec.horizon
        k = len(plan.settings.covariate_columns)
        covariates = batch.column("covariates").flatten().to_numpy().reshape(len(origins), k, width)
        stamps = batch.column("origin").cast(pa.int64()).to_numpy()
        out += [(series.series_id, int(stamps[w]), covariates[w]) for w in range(len(origins))]
    return out


@pytest.mark.parametrize("per_series", [False, True], ids=["global", "per_series"])
@pytest.mark.parametrize("latency_min", [0, 60])
def test_each_window_equals_a_plain_as_of_join(tmp_path: Path, per_series: bool, latency_min: int) -> None:
    plan, vintages = _plan(tmp_path, per_series, latency_min, covariates=["temp", "wind"], past_covariates=["price"])
    spec = plan.spec
    names = plan.settings.covariate_columns
    assert names == ["price", "temp", "wind"]
    assert plan.vintaged is not None and plan.vintaged.vintaged == (True, False, True)
    windows = _packed_windows(plan)
    assert len(windows) == plan.windows.planned > 0
    seen_values = 0
    for series_id, origin_us, covariates in windows:
        cutoff = origin_us - STEP_US
        stamps = origin_us + np.arange(-spec.context_length, spec.horizon) * STEP_US
        for row, name in enumerate(names):
            if name == "temp":
                continue
            expected = reference_as_of(vintages, name, series_id, stamps, cutoff - latency_min * 60_000_000)
            if name == "price":  # past-only: its future is unknown, whatever the vintages say
                expected[spec.context_length :] = np.nan
            np.testing.assert_array_equal(covariates[row], expected.astype(np.float32), err_msg=f"{series_id} {name}")
            seen_values += int(np.isfinite(expected).sum())
        assert not (covariates == np.float32(IMPOSSIBLE)).any()
    assert seen_values > 100
    if per_series:  # "c" has no vintages: every step of its vintaged rows is missing
        assert all(np.isnan(cov[[0, 2]]).all() for sid, _, cov in windows if sid == "c")


def test_the_realized_covariates_are_the_latest_vintage_so_the_check_can_fail(tmp_path: Path) -> None:
    plan, vintages = _plan(tmp_path, per_series=False, covariates=["wind"])
    windows = _packed_windows(plan, realized=True)
    assert any((cov == np.float32(IMPOSSIBLE)).any() for _, _, cov in windows)
    series_id, origin_us, covariates = windows[0]
    stamps = origin_us + np.arange(-plan.spec.context_length, plan.spec.horizon) * STEP_US
    np.testing.assert_array_equal(covariates[0], reference_as_of(vintages, "wind", series_id, stamps, None))


def test_missing_steps_and_ages_are_counted_per_lead() -> None:
    step = STEP_US
    table = pa.table(
        {
            "timestamp": pa.array([10 * step, 10 * step, 11 * step, 12 * step], pa.timestamp("us", tz="UTC")),
            "available_at": pa.array([2 * step, 8 * step, 9 * step, 20 * step], pa.timestamp("us", tz="UTC")),
            "wind": [1.0, 2.0, 3.0, 4.0],
        }
    )
    vintages = index_vintages(table, ["wind"], step, ["s"])
    stats = VintageStats(horizon=3, step_us=step)
    origin = np.array([10 * step])  # cutoff 9 steps: the vintage of step 12 (issued at 20) is not known yet
    joined = vintages.as_of("wind", np.array([0]), origin - step, origin - step, 4)
    np.testing.assert_array_equal(joined.values, [[np.nan, 2.0, 3.0, np.nan]])
    stats.observe("wind", joined, origin - step, context_length=1)
    assert stats.missing["wind"] == [0, 0, 1]
    assert stats.ages["wind"] == [{1: 1}, {0: 1}, {}]  # cutoff 9 - issued 8, 9 - 9
    assert stats.context_missing["wind"] == 1
    merged = VintageStats.from_json(stats.to_json())
    merged.add(stats)
    assert merged.found["wind"] == [2, 2, 0]
    assert merged.age_rows()[0]["age_median_steps"] == 1


def test_bad_vintage_tables_are_refused_naming_rows() -> None:
    step = STEP_US
    stamps = pa.array([0, step, step], pa.timestamp("us", tz="UTC"))
    with pytest.raises(DataError, match="available_at"):
        index_vintages(pa.table({"timestamp": stamps, "wind": [1.0, 2.0, 3.0]}), ["wind"], step, ["s"])
    twice = pa.table({"timestamp": stamps, "available_at": stamps, "wind": [1.0, 2.0, 3.0]})
    with pytest.raises(DataError, match=r"two values .* rows \[2\]|two values .* rows \[1\]"):
        index_vintages(twice, ["wind"], step, ["s"])
    utc = pa.timestamp("us", tz="UTC")
    off = pa.table({"timestamp": pa.array([0, 7], utc), "available_at": pa.array([0, 0], utc)})
    with pytest.raises(DataError, match="off the checkpoint"):
        index_vintages(off.append_column("wind", pa.array([1.0, 2.0])), ["wind"], step, ["s"])
