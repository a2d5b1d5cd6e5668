"""Unit tier: window planning (Nixtla-style counts, start/end ranges, coverage, parts, batching, window ids)."""

from __future__ import annotations

import hashlib
import re
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import ValidationError
from references import series_origins

from distributed_onnx.evaluation.data.table import Series, SeriesTable
from distributed_onnx.evaluation.data.windows import (
    PartSpec,
    PlannedBatch,
    SeriesPlan,
    WindowSpec,
    batches,
    dispatch_order,
    plan_series,
    plan_windows,
    window_id_array,
    window_ids,
)

STEP_US = 15 * 60_000_000
START_US = 1_700_000_100 * 1_000_000 // STEP_US * STEP_US


def _series(series_id: str, n_points: int, start_us: int = START_US, values: np.ndarray | None = None) -> Series:
    data = np.arange(n_points, dtype=np.float64) if values is None else values
    return Series(series_id, start_us, STEP_US, data, np.empty((0, n_points)))


def _table(*series: Series) -> SeriesTable:
    return SeriesTable(list(series), [], 15, "<test>")


@dataclass
class PlanCounts:
    planned: int = 0
    skipped: int = 0


def plan_batches(
    table: SeriesTable, spec: WindowSpec, rows_per_batch: int, counts: PlanCounts | None = None
) -> Iterator[PlannedBatch]:
    """What the driver and the actors do together: count, cut parts of one batch, re-plan each part's windows."""
    plan = plan_windows(table.series, spec)
    if counts is not None:
        counts.planned, counts.skipped = plan.planned, plan.skipped
    for part in plan.parts(rows_per_batch):
        segments = [
            (series, plan_series(table.series[series], spec).origins[lo:hi])
            for series, lo, hi in plan.segments(part.start, part.stop)
        ]
        for batch in batches(segments, rows_per_batch):
            yield PlannedBatch(part.index, batch.series_index, batch.origin_index)


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


# --- parts -----------------------------------------------------------------------------------------------


def test_parts_cut_the_window_sequence_and_segments_map_back_to_series() -> None:
    spec = WindowSpec(context_length=2, horizon=1, n_windows=5)
    table = _table(_series("a", 20), _series("empty", 1), _series("b", 20), _series("c", 3))
    plan = plan_windows(table.series, spec)
    assert plan.counts.tolist() == [5, 0, 5, 2]
    assert plan.planned == 12
    parts = plan.parts(4)
    assert parts == [PartSpec(0, 0, 4), PartSpec(1, 4, 8), PartSpec(2, 8, 12)]
    assert list(plan.segments(4, 8)) == [(0, 4, 5), (2, 0, 3)]  # the empty series contributes nothing
    assert list(plan.segments(8, 12)) == [(2, 3, 5), (3, 0, 2)]
    assert sum(hi - lo for part in parts for _, lo, hi in plan.segments(part.start, part.stop)) == 12


def test_parts_ramp_up_from_one_batch_then_keep_their_size() -> None:
    spec = WindowSpec(context_length=2, horizon=1, n_windows=100)
    plan = plan_windows([_series("a", 200)], spec)
    parts = plan.parts(32, first_part=4)
    assert [part.n_windows for part in parts] == [4, 8, 16, 32, 32, 8]
    assert [(part.start, part.stop) for part in parts[:2]] == [(0, 4), (4, 12)]
    assert parts[-1].stop == 100 and [part.index for part in parts] == list(range(6))
    assert [part.n_windows for part in plan.parts(32)] == [32, 32, 32, 4]  # without a ramp
    assert plan_windows([], spec).parts(32, first_part=4) == []


def test_parts_go_out_first_part_first_then_largest_first_so_the_small_ones_end_the_run() -> None:
    spec = WindowSpec(context_length=2, horizon=1, n_windows=200)
    plan = plan_windows([_series("a", 300)], spec)
    parts = plan.parts(32, first_part=4)  # 4, 8, 16, 32 x 5, 12
    ordered = dispatch_order(parts)
    assert [part.n_windows for part in ordered] == [4, 32, 32, 32, 32, 32, 16, 12, 8]
    assert [part.index for part in ordered] == [0, 3, 4, 5, 6, 7, 2, 8, 1]  # equal sizes keep the plan's order
    assert sorted(ordered, key=lambda part: part.index) == parts  # the same parts, only their order changes
    resumed = [parts[2], parts[5], parts[8]]  # what a resumed run has left: its first part still goes first
    assert [part.index for part in dispatch_order(resumed)] == [2, 5, 8]
    assert dispatch_order([]) == []


def test_a_part_descriptor_is_a_few_integers() -> None:
    import pickle

    assert len(pickle.dumps(PartSpec(123_456, 9_000_000, 9_004_096))) < 120


def test_n_windows_beyond_the_data_is_counted_as_capped() -> None:
    spec = WindowSpec(context_length=4, horizon=3, n_windows=10, stride=1)
    plan = plan_windows([_series("a", 8), _series("b", 30)], spec)
    assert plan.counts.tolist() == [5, 10]
    assert plan.capped == 5  # series a: origins -2..0 have no history at all
    assert plan.capped_series == ("a",)


def _planning_peak_bytes(series: Series, spec: WindowSpec) -> tuple[int, SeriesPlan]:
    tracemalloc.start()
    try:
        plan = plan_series(series, spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, plan


def test_an_unbounded_start_end_range_costs_the_series_not_the_range() -> None:
    """``--start 0001-01-01 --end 9999-12-31`` on minute data allocated 5 billion origins before clipping."""
    minute_us = 60_000_000
    series = Series("a", START_US, minute_us, np.arange(100, dtype=np.float64), np.empty((0, 100)))
    # Ten million minutes each side (80 MB of origins before the fix; years 1-9999 were 42 GB, too many to test
    # the old code with on a shared machine).
    spec = WindowSpec(
        context_length=4,
        horizon=2,
        stride=7,
        start_us=START_US - 10**7 * minute_us,
        end_us=START_US + 10**7 * minute_us,
    )
    peak, plan = _planning_peak_bytes(series, spec)
    assert peak < 1_000_000, peak
    first_step = -(-(spec.start_us - START_US) // minute_us)  # type: ignore[operator]
    expected = np.arange(first_step, 101, 7)
    np.testing.assert_array_equal(plan.origins, expected[expected >= 1])


def test_a_huge_n_windows_costs_the_series_not_the_request() -> None:
    spec = WindowSpec(context_length=4, horizon=3, n_windows=10**7, stride=2)
    peak, plan = _planning_peak_bytes(_series("a", 30), spec)
    assert peak < 1_000_000, peak
    np.testing.assert_array_equal(plan.origins, np.arange(1, 28, 2))
    assert plan.capped == 10**7 - 14


def _plan_peak(table: SeriesTable, spec: WindowSpec) -> tuple[int, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        baseline, _ = tracemalloc.get_traced_memory()
        plan = plan_windows(table.series, spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - baseline, plan.planned


def test_the_plan_grows_with_series_not_windows() -> None:
    few = WindowSpec(context_length=16, horizon=4, n_windows=10)
    many = WindowSpec(context_length=16, horizon=4, n_windows=1000)
    table = _table(*[_series(f"s{i}", 2000) for i in range(50)])
    few_peak, few_windows = _plan_peak(table, few)
    many_peak, many_windows = _plan_peak(table, many)
    assert many_windows == 100 * few_windows == 50_000
    # Holding the windows would take >= 16 bytes each (series + origin index): 800 kB for the larger plan;
    # the plan keeps one count per series (per-series temporaries are freed as it goes).
    assert many_peak < 16 * many_windows / 4, (few_peak, many_peak)


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


# --- window ids -------------------------------------------------------------------------------------------


def _reference_id(series_id: str, origin_us: int, fingerprint: str) -> str:
    """The id scheme written out in plain Python integers (splitmix64 of the series digest and the origin)."""
    mask = (1 << 64) - 1
    key = int.from_bytes(hashlib.blake2b(f"{series_id}|{fingerprint}".encode(), digest_size=8).digest(), "big")
    z = key ^ ((origin_us & mask) * 0x9E3779B97F4A7C15 & mask)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return f"{z ^ (z >> 31):016x}"


def test_window_ids_match_the_scheme_written_out() -> None:
    series_ids = ["a", "a", "b", "ünï"]
    origins = np.array([100, 1_704_067_200_000_000, -5, 2**62], dtype=np.int64)
    ids = window_ids(series_ids, origins, "run-1")
    assert ids == [_reference_id(s, int(o), "run-1") for s, o in zip(series_ids, origins, strict=True)]


def test_window_ids_stable_and_distinct() -> None:
    series_ids = np.array(["a", "a", "b", "b"], dtype=object)
    origins = np.array([100, 200, 100, 200], dtype=np.int64)
    ids = window_ids(series_ids, origins, "run-1")
    assert ids == window_ids(series_ids.copy(), origins.copy(), "run-1")
    assert len(set(ids)) == 4
    assert all(re.fullmatch(r"[0-9a-f]{16}", window_id) for window_id in ids)  # 8 bytes, lowercase hex
    other_run = window_ids(series_ids, origins, "run-2")
    assert not set(ids) & set(other_run)


def test_window_ids_do_not_collide_over_a_million_windows() -> None:
    keys = np.repeat(np.arange(100, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15), 10_000)
    origins = np.tile(np.arange(10_000, dtype=np.int64) * 1_800_000_000, 100)
    ids = window_id_array(keys, origins)
    assert len(ids) == 1_000_000
    assert len(ids.unique()) == 1_000_000


def test_window_id_depends_only_on_its_own_window() -> None:
    alone = window_ids(np.array(["b"], dtype=object), np.array([200]), "fp")
    among = window_ids(np.array(["a", "b"], dtype=object), np.array([100, 200]), "fp")
    assert among[1] == alone[0]


def test_window_ids_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="2 series ids for 1 origins"):
        window_ids(np.array(["a", "b"], dtype=object), np.array([1]), "fp")
