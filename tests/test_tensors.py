"""Unit tier: Arrow batch codecs (pack/unpack round trip, fresh buffers, zero-copy decode, gather_blocks)."""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from distributed_onnx.evaluation.data.packing import gather_blocks, pack_batch
from distributed_onnx.evaluation.data.series_source import SeriesStore
from distributed_onnx.evaluation.data.table import Series, SeriesTable
from distributed_onnx.evaluation.data.windows import PlannedBatch, window_ids
from distributed_onnx.model.window_batch import unpack_batch

STEP_US = 60 * 60_000_000
START_US = 1_704_067_200_000_000  # 2024-01-01T00:00Z
CONTEXT, HORIZON = 4, 3


def _table(n_points: tuple[int, ...] = (10, 6), n_covariates: int = 0) -> SeriesTable:
    series = []
    for i, n in enumerate(n_points):
        values = 100.0 * i + np.arange(n, dtype=np.float64)
        covariates = (
            np.stack([1000.0 * (k + 1) + values for k in range(n_covariates)]) if n_covariates else (np.empty((0, n)))
        )
        series.append(Series(f"s{i}", START_US + i * STEP_US, STEP_US, values, covariates))
    return SeriesTable(series, [f"c{k}" for k in range(n_covariates)], 60, "<test>")


def _store(n_points: tuple[int, ...] = (10, 6), n_covariates: int = 0) -> SeriesStore:
    return SeriesStore.from_table(_table(n_points, n_covariates))


def _planned(pairs: list[tuple[int, int]], index: int = 0) -> PlannedBatch:
    series_index, origin_index = zip(*pairs, strict=True)
    return PlannedBatch(index, np.array(series_index, dtype=np.int64), np.array(origin_index, dtype=np.int64))


def _expected_block(values: np.ndarray, origin: int, before: int, after: int) -> np.ndarray:
    out = np.full(before + after, np.nan)
    for j, position in enumerate(range(origin - before, origin + after)):
        if 0 <= position < values.shape[0]:
            out[j] = values[position]
    return out


def test_round_trip_pads_context_and_target_with_nan() -> None:
    table = _table()
    planned = _planned([(0, 1), (0, 5), (0, 9), (1, 2), (1, 6)])
    batch = pack_batch(SeriesStore.from_table(table), planned, CONTEXT, HORIZON, "fp")
    block = unpack_batch(batch, CONTEXT, HORIZON)

    assert block.n_windows == 5
    assert block.series_ids == ["s0", "s0", "s0", "s1", "s1"]
    assert block.context.shape == (5, CONTEXT)
    assert block.context.dtype == np.float32
    assert block.target.shape == (5, HORIZON)
    assert block.target.dtype == np.float64
    assert block.covariates is None
    for row, (series_index, origin) in enumerate(zip(planned.series_index, planned.origin_index, strict=True)):
        values = table.series[series_index].values
        expected = _expected_block(values, int(origin), CONTEXT, HORIZON)
        np.testing.assert_array_equal(block.context[row], expected[:CONTEXT].astype(np.float32))
        np.testing.assert_array_equal(block.target[row], expected[CONTEXT:])
    # before the series start: left-padded; past the end: NaN target
    np.testing.assert_array_equal(block.context[0], [np.nan, np.nan, np.nan, 0.0])
    np.testing.assert_array_equal(block.target[2], [9.0, np.nan, np.nan])
    np.testing.assert_array_equal(block.target[4], [np.nan, np.nan, np.nan])  # origin one step past s1's data


def test_round_trip_origins_and_window_ids() -> None:
    table = _table()
    planned = _planned([(0, 3), (1, 4)])
    batch = pack_batch(SeriesStore.from_table(table), planned, CONTEXT, HORIZON, "fp")
    block = unpack_batch(batch, CONTEXT, HORIZON)
    expected_origins = np.array([START_US + 3 * STEP_US, START_US + STEP_US + 4 * STEP_US])
    np.testing.assert_array_equal(block.origins_us, expected_origins)
    assert block.window_ids == window_ids(np.array(["s0", "s1"], dtype=object), expected_origins, "fp")
    assert batch.schema.field("origin").type == pa.timestamp("us", tz="UTC")
    assert batch.schema.names == ["window_id", "series_id", "origin", "context", "target"]


def test_covariate_blocks_span_context_and_horizon() -> None:
    table = _table(n_covariates=2)
    planned = _planned([(0, 2), (1, 5)])
    block = unpack_batch(pack_batch(SeriesStore.from_table(table), planned, CONTEXT, HORIZON, "fp"), CONTEXT, HORIZON)
    assert block.covariates is not None
    assert block.covariates.shape == (2, 2, CONTEXT + HORIZON)
    assert block.covariates.dtype == np.float32
    for row, (series_index, origin) in enumerate([(0, 2), (1, 5)]):
        for k in range(2):
            covariate = table.series[series_index].covariates[k]
            expected = _expected_block(covariate, origin, CONTEXT, HORIZON).astype(np.float32)
            np.testing.assert_array_equal(block.covariates[row, k], expected)
    # known-future values reach the block; the target's own future stays in ``target`` only
    assert block.covariates[0, 1, CONTEXT] == np.float32(2002.0)


def test_round_trip_survives_pickling() -> None:
    table = _table(n_covariates=1)
    planned = _planned([(0, 4), (1, 1)])
    batch = pack_batch(SeriesStore.from_table(table), planned, CONTEXT, HORIZON, "fp")
    direct = unpack_batch(batch, CONTEXT, HORIZON)
    travelled = unpack_batch(pickle.loads(pickle.dumps(batch)), CONTEXT, HORIZON)
    np.testing.assert_array_equal(direct.context, travelled.context)
    np.testing.assert_array_equal(direct.target, travelled.target)
    np.testing.assert_array_equal(direct.covariates, travelled.covariates)  # type: ignore[arg-type]
    assert direct.window_ids == travelled.window_ids


def test_batch_owns_fresh_buffers_so_it_pickles_small() -> None:
    long_series = 1_000_000  # 8 MB of float64 per series row, 8 MB per covariate row
    context, horizon = 64, 16
    table = _table((long_series,), n_covariates=1)
    planned = _planned([(0, 500_000), (0, 500_100), (0, 999_990)])
    batch = pack_batch(SeriesStore.from_table(table), planned, context, horizon, "fp")
    payload = 3 * (context * 4 + horizon * 8 + (context + horizon) * 4 + 16 + 2 + 8)
    size = len(pickle.dumps(batch))
    assert size < 2 * payload + 4096, (size, payload)


def test_slices_of_a_packed_batch_decode_correctly() -> None:
    table = _table()
    planned = _planned([(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)])
    batch = pack_batch(SeriesStore.from_table(table), planned, CONTEXT, HORIZON, "fp")
    whole = unpack_batch(batch, CONTEXT, HORIZON)
    part = unpack_batch(batch.slice(2, 2), CONTEXT, HORIZON)
    np.testing.assert_array_equal(part.context, whole.context[2:4])
    np.testing.assert_array_equal(part.target, whole.target[2:4])
    assert part.series_ids == ["s0", "s1"]


def test_decode_is_zero_copy() -> None:
    table = _table(n_covariates=1)
    batch = pack_batch(SeriesStore.from_table(table), _planned([(0, 3), (1, 2)]), CONTEXT, HORIZON, "fp")
    block = unpack_batch(batch, CONTEXT, HORIZON)

    def buffer(name: str, dtype: type) -> np.ndarray:
        return np.frombuffer(batch.column(name).values.buffers()[1], dtype=dtype)

    assert np.shares_memory(block.context, buffer("context", np.float32))
    assert np.shares_memory(block.target, buffer("target", np.float64))
    assert block.covariates is not None
    assert np.shares_memory(block.covariates, buffer("covariates", np.float32))


def test_missing_values_travel_as_nan_not_nulls() -> None:
    table = _table()
    table.series[0].values[2] = np.nan
    batch = pack_batch(SeriesStore.from_table(table), _planned([(0, 1), (0, 4)]), CONTEXT, HORIZON, "fp")
    assert batch.column("context").values.null_count == 0
    assert batch.column("target").values.null_count == 0
    block = unpack_batch(batch, CONTEXT, HORIZON)
    np.testing.assert_array_equal(block.context[1], [0.0, 1.0, np.nan, 3.0])


# --- gather_blocks ----------------------------------------------------------------------------------------


def test_gather_blocks_inside_the_series() -> None:
    values = np.arange(10, dtype=np.float64)
    out = gather_blocks(values, np.array([3, 5]), 2, 2)
    np.testing.assert_array_equal(out, [[1, 2, 3, 4], [3, 4, 5, 6]])


def test_gather_blocks_at_both_edges() -> None:
    values = np.arange(5, dtype=np.float64)
    out = gather_blocks(values, np.array([0, 5]), 3, 2)
    np.testing.assert_array_equal(out[0], [np.nan, np.nan, np.nan, 0, 1])
    np.testing.assert_array_equal(out[1], [2, 3, 4, np.nan, np.nan])


def test_gather_blocks_longer_than_the_series() -> None:
    values = np.array([7.0, 8.0])
    out = gather_blocks(values, np.array([1]), 5, 4)
    np.testing.assert_array_equal(out, [[np.nan] * 4 + [7.0, 8.0] + [np.nan] * 3])


def test_gather_blocks_without_future() -> None:
    values = np.arange(6, dtype=np.float64)
    out = gather_blocks(values, np.array([2, 6]), 3, 0)
    np.testing.assert_array_equal(out, [[np.nan, 0, 1], [3, 4, 5]])


def test_gather_blocks_empty_origins_and_repeats() -> None:
    values = np.arange(6, dtype=np.float64)
    assert gather_blocks(values, np.array([], dtype=np.int64), 2, 1).shape == (0, 3)
    out = gather_blocks(values, np.array([4, 4]), 2, 1)
    np.testing.assert_array_equal(out[0], out[1])


def test_gather_blocks_owns_its_memory() -> None:
    values = np.arange(100, dtype=np.float64)
    out = gather_blocks(values, np.array([10, 20]), 4, 4)
    assert not np.shares_memory(out, values)
    out[:] = -1.0
    assert values[10] == 10.0


def test_gather_blocks_rejects_origins_past_one_step_after_the_data() -> None:
    values = np.arange(6, dtype=np.float64)
    np.testing.assert_array_equal(gather_blocks(values, np.array([6]), 1, 1), [[5.0, np.nan]])
    with pytest.raises(ValueError, match=r"origins must lie in 0\.\.6 \(the series' steps\), got 2\.\.7"):
        gather_blocks(values, np.array([2, 7]), 1, 1)
    with pytest.raises(ValueError, match=r"got -1\.\.3"):
        gather_blocks(values, np.array([-1, 3]), 1, 1)


def test_gather_blocks_copies_only_the_span_of_the_origins() -> None:
    values = np.arange(1_000_000, dtype=np.float64)
    tracemalloc.start()
    try:
        out = gather_blocks(values, np.array([500_000, 500_010]), 8, 4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out[1], np.arange(500_002, 500_014, dtype=np.float64))
    assert peak < 100_000  # a whole-series pad would be 8 MB


@pytest.mark.parametrize("n_covariates", [0, 2])
def test_a_one_series_batch_packs_as_the_general_gather_does(n_covariates: int) -> None:
    """A batch of one series takes a sliding-window view of it; each window equals the general path's."""
    store = _store((10, 6), n_covariates)
    windows = [(0, 0), (0, 2), (0, 5), (0, 9), (0, 10)]  # before the start, inside, and one step past the end
    alone = unpack_batch(pack_batch(store, _planned(windows), CONTEXT, HORIZON, "fp"), CONTEXT, HORIZON)
    mixed = unpack_batch(pack_batch(store, _planned([*windows, (1, 3)]), CONTEXT, HORIZON, "fp"), CONTEXT, HORIZON)
    for name in ("context", "target", "covariates", "origins_us"):
        got, expected = getattr(alone, name), getattr(mixed, name)
        if got is None:
            assert expected is None and n_covariates == 0
            continue
        np.testing.assert_array_equal(got, expected[: len(windows)], err_msg=name)
    assert alone.window_ids == mixed.window_ids[: len(windows)]


def test_targets_and_origins_read_from_the_buffers_equal_the_unpacked_blocks() -> None:
    """Scoring reads a batch's targets and origins straight from their buffers, sliced batches included."""
    from distributed_onnx.model.window_batch import TIMESTAMP, arrow_array, fixed_lists, targets_and_origins

    rng = np.random.default_rng(0)
    windows, context, horizon = 10, 7, 5
    target = rng.normal(size=(windows, horizon))
    target[2, 3] = np.nan
    batch = pa.RecordBatch.from_pydict(
        {
            "origin": arrow_array(rng.integers(0, 10**12, windows).astype(np.int64), TIMESTAMP),
            "context": fixed_lists(rng.normal(size=(windows, context)).astype(np.float32), context),
            "target": fixed_lists(target, horizon),
        }
    )
    for part in (batch, batch.slice(3, 4), batch.slice(0, 0)):
        got_target, got_origins = targets_and_origins(part, horizon)
        block = unpack_batch(part, context, horizon)
        np.testing.assert_array_equal(got_target, block.target)
        np.testing.assert_array_equal(got_origins, block.origins_us)
