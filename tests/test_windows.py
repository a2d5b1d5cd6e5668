"""Unit tier: window planning (Nixtla-style counts, start/end ranges, coverage, batching, streaming)."""

from __future__ import annotations

import inspect
import re
import tracemalloc

import numpy as np
import pytest
from pydantic import ValidationError

from distributed_onnx.table import Series, SeriesTable
from distributed_onnx.windows import PlanCounts, WindowSpec, plan_batches, series_origins, window_ids

STEP_US = 15 * 60_000_000
START_US = 1_700_000_100 * 1_000_000 // STEP_US * STEP_US


def _series(series_id: str, n_points: int, start_us: int = START_US, values: np.ndarray | None = None) -> Series:
    data = np.arange(n_points, dtype=np.float64) if values is None else values
    return Series(series_id, start_us, STEP_US, data, np.empty((0, n_points)))


def _table(*series: Series) -> SeriesTable:
    return SeriesTable(list(series), [], 15, "<test>")


def _windows(table: SeriesTable, spec: WindowSpec, rows_per_batch: int = 1000) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for batch in plan_batches(table, spec, rows_per_batch):
        pairs.extend(zip(batch.series_index.tolist(), batch.origin_index.tolist(), strict=True))
    return pairs


# --- Nixtla-style counting --------------------------------------------------------------------------------


def test_last_window_ends_at_each_series_end_others_step_back_by_stride() -> None:
    spec = WindowSpec(context_length=4, horizon=3, n_windows=3, stride=2)
    origins = series_origins(_series("a", 20), spec)
    np.testing.assert_array_equal(origins, [13, 15, 17])
    assert origins[-1] + spec.horizon == 20  # last target step is the series' last point (index 19)


def test_n_windows_counts_back_from_each_series_own_end() -> None:
    spec = WindowSpec(context_length=4, horizon=2, n_windows=2, stride=1)
    table = _table(_series("a", 10), _series("b", 30, start_us=START_US + 5 * STEP_US))
    assert _windows(table, spec) == [(0, 7), (0, 8), (1, 27), (1, 28)]


def test_n_windows_drops_origins_without_history() -> None:
    spec = WindowSpec(context_length=4, horizon=3, n_windows=10, stride=1)
    origins = series_origins(_series("a", 8), spec)
    np.testing.assert_array_equal(origins, [1, 2, 3, 4, 5])  # origin 0 has no history at all


# --- start/end ranges -------------------------------------------------------------------------------------


def test_start_end_origins_on_the_series_grid_within_range() -> None:
    spec = WindowSpec(context_length=4, horizon=2, start_us=START_US + 3 * STEP_US, end_us=START_US + 7 * STEP_US)
    np.testing.assert_array_equal(series_origins(_series("a", 20), spec), [3, 4, 5, 6, 7])


def test_start_end_off_grid_start_is_ceiled_and_end_floored() -> None:
    spec = WindowSpec(
        context_length=4, horizon=2, start_us=START_US + 3 * STEP_US + 1, end_us=START_US + 7 * STEP_US - 1
    )
    np.testing.assert_array_equal(series_origins(_series("a", 20), spec), [4, 5, 6])


def test_start_end_with_stride_starts_at_first_grid_step() -> None:
    spec = WindowSpec(
        context_length=4, horizon=2, stride=3, start_us=START_US + 2 * STEP_US, end_us=START_US + 12 * STEP_US
    )
    np.testing.assert_array_equal(series_origins(_series("a", 20), spec), [2, 5, 8, 11])


def test_start_end_needs_one_step_of_history_and_at_most_one_step_past_the_data() -> None:
    spec = WindowSpec(context_length=4, horizon=2, start_us=START_US - 5 * STEP_US, end_us=START_US + 50 * STEP_US)
    origins = series_origins(_series("a", 10), spec)
    assert origins[0] == 1
    assert origins[-1] == 10  # forecasting the step right after the last point is allowed
    assert origins.size == 10


def test_start_end_uses_each_series_grid() -> None:
    # Series b starts 2 steps later: the same wall-clock range maps to other indices.
    spec = WindowSpec(context_length=2, horizon=1, start_us=START_US + 4 * STEP_US, end_us=START_US + 5 * STEP_US)
    table = _table(_series("a", 10), _series("b", 10, start_us=START_US + 2 * STEP_US))
    assert _windows(table, spec) == [(0, 4), (0, 5), (1, 2), (1, 3)]


# --- context coverage -------------------------------------------------------------------------------------


def test_min_context_coverage_skips_and_counts() -> None:
    values = np.arange(20, dtype=np.float64)
    values[:8] = np.nan  # the first 8 steps are missing
    spec = WindowSpec(
        context_length=4, horizon=1, start_us=START_US, end_us=START_US + 19 * STEP_US, min_context_coverage=0.5
    )
    counts = PlanCounts()
    pairs = [
        pair
        for batch in plan_batches(_table(_series("a", 20, values=values)), spec, 100, counts)
        for pair in zip(batch.series_index.tolist(), batch.origin_index.tolist(), strict=True)
    ]
    # origin o has context o-4..o-1; observed share >= 0.5 needs >= 2 of them at index >= 8, i.e. o >= 10.
    assert [origin for _, origin in pairs] == list(range(10, 20))
    assert counts.planned == 10
    assert counts.skipped == 9  # origins 1..9
    assert counts.planned + counts.skipped == 19


def test_context_before_the_series_start_counts_as_missing() -> None:
    spec = WindowSpec(context_length=4, horizon=1, n_windows=4, min_context_coverage=0.75)
    counts = PlanCounts()
    batches = list(plan_batches(_table(_series("a", 5)), spec, 10, counts))
    # origins 1..4 have 1, 2, 3, 4 observed context steps of 4
    assert batches[0].origin_index.tolist() == [3, 4]
    assert (counts.planned, counts.skipped) == (2, 2)


def test_windows_without_observed_context_are_skipped_even_at_zero_coverage() -> None:
    values = np.arange(12, dtype=np.float64)
    values[:6] = np.nan
    spec = WindowSpec(context_length=3, horizon=1, start_us=START_US, end_us=START_US + 11 * STEP_US)
    counts = PlanCounts()
    origins = [
        o
        for b in plan_batches(_table(_series("a", 12, values=values)), spec, 100, counts)
        for o in b.origin_index.tolist()
    ]
    assert origins == list(range(7, 12))
    assert counts.skipped == 6  # origins 1..6 see only NaN


# --- batching ---------------------------------------------------------------------------------------------


def test_batches_of_rows_per_batch_span_series_boundaries() -> None:
    spec = WindowSpec(context_length=2, horizon=1, n_windows=5)
    table = _table(_series("a", 20), _series("b", 20), _series("c", 20))
    batches = list(plan_batches(table, spec, rows_per_batch=4))
    assert [b.index for b in batches] == [0, 1, 2, 3]
    assert [b.n_windows for b in batches] == [4, 4, 4, 3]
    assert batches[1].series_index.tolist() == [0, 1, 1, 1]
    assert batches[1].origin_index.tolist() == [19, 15, 16, 17]
    assert batches[2].series_index.tolist() == [1, 1, 2, 2]
    for batch in batches:
        assert batch.series_index.dtype == np.int64
        assert batch.origin_index.dtype == np.int64


def test_empty_plan_yields_nothing() -> None:
    spec = WindowSpec(context_length=2, horizon=1, start_us=START_US - 10 * STEP_US, end_us=START_US - STEP_US)
    counts = PlanCounts()
    assert list(plan_batches(_table(_series("a", 10)), spec, 4, counts)) == []
    assert (counts.planned, counts.skipped) == (0, 0)


def test_plan_is_deterministic() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(size=200)
    values[rng.random(200) < 0.3] = np.nan
    table = _table(*[_series(f"s{i}", 150 + i, values=values[: 150 + i].copy()) for i in range(7)])
    spec = WindowSpec(context_length=8, horizon=4, n_windows=30, stride=3, min_context_coverage=0.4)
    first, second = list(plan_batches(table, spec, 13)), list(plan_batches(table, spec, 13))
    assert len(first) == len(second) > 1
    for a, b in zip(first, second, strict=True):
        assert a.index == b.index
        np.testing.assert_array_equal(a.series_index, b.series_index)
        np.testing.assert_array_equal(a.origin_index, b.origin_index)


# --- streaming --------------------------------------------------------------------------------------------


def test_plan_batches_is_a_lazy_generator() -> None:
    spec = WindowSpec(context_length=2, horizon=1, n_windows=3)
    counts = PlanCounts()
    plan = plan_batches(_table(_series("a", 10), _series("b", 10)), spec, 2, counts)
    assert inspect.isgenerator(plan)
    assert counts.planned == 0  # nothing planned before the first batch is asked for
    next(plan)
    assert counts.planned == 3  # only the first series so far


def _peak_while_iterating(table: SeriesTable, spec: WindowSpec, rows_per_batch: int) -> tuple[int, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        baseline, _ = tracemalloc.get_traced_memory()
        n_windows = 0
        for batch in plan_batches(table, spec, rows_per_batch):
            n_windows += batch.n_windows
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - baseline, n_windows


def test_a_ten_times_larger_plan_does_not_use_more_memory() -> None:
    spec = WindowSpec(context_length=16, horizon=4, n_windows=50)
    small = _table(*[_series(f"s{i}", 200) for i in range(40)])
    large = _table(*[_series(f"s{i}", 200) for i in range(400)])
    small_peak, small_windows = _peak_while_iterating(small, spec, 64)
    large_peak, large_windows = _peak_while_iterating(large, spec, 64)
    assert large_windows == 10 * small_windows == 20_000
    # Materialising the plan would take >= 16 bytes per window (series + origin index): 320 kB for the large one.
    assert large_peak < 2 * small_peak, (small_peak, large_peak)
    assert large_peak < 16 * large_windows / 4


# --- WindowSpec validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "modes",
    [
        {},
        {"n_windows": 3, "start_us": 0, "end_us": 10},
        {"n_windows": 3, "start_us": 0},
        {"start_us": 0},
        {"end_us": 10},
    ],
    ids=["neither", "both", "count-and-start", "start-only", "end-only"],
)
def test_spec_needs_exactly_one_mode(modes: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match=r"n_windows|start"):
        WindowSpec(context_length=4, horizon=2, **modes)


def test_spec_refuses_start_after_end() -> None:
    with pytest.raises(ValidationError, match="start <= end"):
        WindowSpec(context_length=4, horizon=2, start_us=10, end_us=9)


def test_spec_accepts_start_equal_end() -> None:
    spec = WindowSpec(context_length=4, horizon=2, start_us=START_US + STEP_US, end_us=START_US + STEP_US)
    np.testing.assert_array_equal(series_origins(_series("a", 5), spec), [1])


@pytest.mark.parametrize(
    "bad",
    [{"context_length": 0}, {"horizon": 0}, {"stride": 0}, {"n_windows": 0}, {"min_context_coverage": 1.5}],
)
def test_spec_field_constraints(bad: dict[str, float]) -> None:
    values: dict[str, float] = {"context_length": 4, "horizon": 2, "n_windows": 1, **bad}
    with pytest.raises(ValidationError):
        WindowSpec(**values)  # type: ignore[arg-type]


# --- window ids -------------------------------------------------------------------------------------------


def test_window_ids_stable_and_distinct() -> None:
    series_ids = np.array(["a", "a", "b", "b"], dtype=object)
    origins = np.array([100, 200, 100, 200], dtype=np.int64)
    ids = window_ids(series_ids, origins, "run-1")
    assert ids == window_ids(series_ids.copy(), origins.copy(), "run-1")
    assert len(set(ids)) == 4
    assert all(re.fullmatch(r"[0-9a-f]{16}", window_id) for window_id in ids)  # 8 bytes, lowercase hex
    other_run = window_ids(series_ids, origins, "run-2")
    assert not set(ids) & set(other_run)


def test_window_id_depends_only_on_its_own_window() -> None:
    alone = window_ids(np.array(["b"], dtype=object), np.array([200]), "fp")
    among = window_ids(np.array(["a", "b"], dtype=object), np.array([100, 200]), "fp")
    assert among[1] == alone[0]


def test_window_ids_length_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        window_ids(np.array(["a", "b"], dtype=object), np.array([1]), "fp")
