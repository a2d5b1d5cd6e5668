"""The scoring's vector fast paths give exactly what the plain definitions give (bit for bit, no tolerance)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import references

from distributed_onnx.evaluation.scoring import naive
from distributed_onnx.evaluation.scoring.batch_pairs import SeriesCodes
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, flat_seasonal_scales

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


@pytest.mark.parametrize("gaps", [False, True])
def test_seasonal_quantiles_match_numpy_nanquantile(gaps: bool) -> None:
    rng = np.random.default_rng(3)
    m, seasons, horizon = 4, 5, 9
    history = rng.normal(size=(6, seasons * m))
    if gaps:
        history[rng.random(history.shape) < 0.3] = np.nan
        history[0, ::m] = np.nan  # one cell with no value at all
    got = references.seasonal_quantiles_batch(history, m, horizon, QUANTILES)
    with warnings.catch_warnings():  # numpy warns of the all-NaN cell
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanquantile(history.reshape(6, seasons, m), QUANTILES, axis=1)  # [Q, W, m]
    expected = np.moveaxis(expected, 0, 2)[:, np.arange(horizon) % m, :]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("gaps", [False, True])
def test_seasonal_quantiles_of_shared_cells_equal_those_of_every_window(gaps: bool) -> None:
    """Windows of one series placed by their origins share cells; each cell's quantiles are computed once."""
    from distributed_onnx.evaluation.data.packing import gather_blocks

    rng = np.random.default_rng(8)
    m, seasons, horizon = 6, 4, 15
    values = rng.normal(size=200)
    if gaps:
        values[rng.random(values.size) < 0.2] = np.nan
    origins = np.concatenate([np.arange(10, 60), np.arange(90, 200, 7)]).astype(np.int64)  # some before K m steps
    history = gather_blocks(values, origins, seasons * m, 0)
    for positions in (origins, origins * 1000):  # dense keys, and keys far apart (sorted instead)
        shared = references.seasonal_quantiles_batch(history, m, horizon, QUANTILES, positions)
        each = references.seasonal_quantiles_batch(history, m, horizon, QUANTILES)
        np.testing.assert_array_equal(shared.view(np.uint64), each.view(np.uint64))


@pytest.mark.parametrize("gaps", [False, True])
def test_cells_read_from_the_series_equal_those_of_the_gathered_history(gaps: bool) -> None:
    """An actor reads a batch's distinct seasonal cells straight from its series: the same values, the same cells of
    every pair, so both baselines are the same bit for bit as from the ``[W, K m]`` history."""
    from distributed_onnx.evaluation.data.packing import gather_blocks

    rng = np.random.default_rng(11)
    m, seasons, horizon = 6, 4, 15
    values = rng.normal(size=400)
    if gaps:
        values[rng.random(values.size) < 0.2] = np.nan
    batches = {
        "consecutive, some before K m steps": np.arange(5, 70),
        "strided and unsorted": rng.permutation(np.arange(30, 390, 7)),
        "far apart (sorted keys)": np.array([3, 398, 200]),
        "one window": np.array([400]),
    }
    for name, batch in batches.items():
        origins = batch.astype(np.int64)
        history = gather_blocks(values, origins, seasons * m, 0)
        expected = naive.season_cells(history, m, horizon, origins)
        got = naive.series_season_cells(values, origins, m, seasons, horizon)
        np.testing.assert_array_equal(got.values.view(np.uint64), expected.values.view(np.uint64), err_msg=name)
        np.testing.assert_array_equal(got.of_pair, expected.of_pair, err_msg=name)
        for built, reference in zip(
            references.seasonal_baselines(got, QUANTILES),
            (
                references.seasonal_naive_batch(history[:, -m:], horizon),
                references.seasonal_quantiles_batch(history, m, horizon, QUANTILES),
            ),
            strict=True,
        ):
            np.testing.assert_array_equal(built.view(np.uint64), reference.view(np.uint64), err_msg=name)
    empty = naive.series_season_cells(values, np.empty(0, np.int64), m, seasons, horizon)
    assert empty.values.shape == (0, seasons) and empty.of_pair.shape == (0, horizon)


def test_flat_scales_equal_the_per_series_scaler_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 120, size=30)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.normal(size=int(offsets[-1])) * 50
    values[rng.random(values.size) < 0.15] = np.nan
    for m in (1, 5, 24):
        series = np.sort(rng.integers(0, 30, size=200))
        origins = (rng.random(200) * (lengths[series] + 1)).astype(np.int64)
        got = flat_seasonal_scales(values, offsets, series, origins, m)
        assert got is not None
        expected = [
            SeasonalScaler(values[offsets[s] : offsets[s + 1]], m).scales([o])[0]
            for s, o in zip(series, origins, strict=True)
        ]
        np.testing.assert_array_equal(got.view(np.uint64), np.asarray(expected).view(np.uint64))


def test_flat_scales_decline_a_batch_of_long_series(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(naive, "FLAT_SCALE_CELLS", 10)
    offsets = np.asarray([0, 50, 100], dtype=np.int64)
    values = np.arange(100.0)
    assert flat_seasonal_scales(values, offsets, np.asarray([0, 1]), np.asarray([40, 40]), 2) is None


def test_float32_views_score_like_their_float64_copies() -> None:
    """The accumulator casts float32 forecasts (any layout) itself; the sums equal those of a float64 C copy."""
    rng = np.random.default_rng(5)
    windows, horizon = 7, 6
    actual = rng.normal(size=(windows, horizon))
    actual[2, 3] = np.nan
    forecast = np.sort(rng.normal(size=(windows, len(QUANTILES), horizon)), axis=1).astype(np.float32)
    view = forecast.transpose(0, 2, 1)  # [W, H, Q], not C-ordered
    scale = np.abs(rng.normal(size=windows))
    ids = np.asarray(["a", "b", "a", "c", "b", "a", "c"], dtype=object)
    valid = np.isfinite(actual)
    direct, copied = MetricsAccumulator(QUANTILES, horizon), MetricsAccumulator(QUANTILES, horizon)
    direct.update(SeriesCodes.of(ids), actual, view, scale, valid)
    copied.update(ids, actual, np.ascontiguousarray(view, dtype=np.float64), scale, valid)
    for name, values in direct.state().items():
        np.testing.assert_array_equal(values, copied.state()[name], err_msg=name)


def test_flat_history_equals_the_per_series_gather() -> None:
    from distributed_onnx.evaluation.actor.part_history import gather_history
    from distributed_onnx.evaluation.data.packing import gather_blocks
    from distributed_onnx.evaluation.data.table import SeriesArrays

    rng = np.random.default_rng(6)
    lengths = rng.integers(1, 40, size=12)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.normal(size=int(offsets[-1]))
    source = SeriesArrays(
        tuple(f"s{i}" for i in range(12)), np.zeros(12, np.int64), offsets, values, np.empty((0, values.size)), 60
    )
    series = np.sort(rng.integers(0, 12, size=50))
    origins = (rng.random(50) * (lengths[series] + 1)).astype(np.int64)
    got = gather_history(source, series, origins, 9)
    for row, (s, o) in enumerate(zip(series, origins, strict=True)):
        expected = gather_blocks(values[offsets[s] : offsets[s + 1]], np.asarray([o]), 9, 0)[0]
        np.testing.assert_array_equal(got[row], expected)


def test_a_broadcast_point_scores_like_its_copy() -> None:
    """The seasonal naive passed as a stride-0 view takes the point path; its sums equal the copy's bit for bit."""
    rng = np.random.default_rng(7)
    windows, horizon = 9, 5
    actual = rng.normal(size=(windows, horizon))
    actual[1, 2] = np.nan
    point = rng.normal(size=(windows, horizon))
    point[0, 0] = actual[0, 0]  # an exact hit of every interval
    point[3, 4] = np.nan
    scale = np.abs(rng.normal(size=windows))
    ids = ["a", "b", "a", "b", "c", "a", "b", "c", "c"]
    view = naive.broadcast_quantiles(point, len(QUANTILES), copy=False)
    assert view.strides[2] == 0
    by_view, by_copy = MetricsAccumulator(QUANTILES, horizon), MetricsAccumulator(QUANTILES, horizon)
    by_view.update(ids, actual, view, scale)
    by_copy.update(ids, actual, naive.broadcast_quantiles(point, len(QUANTILES)), scale)
    for name, values in by_view.state().items():
        np.testing.assert_array_equal(values, by_copy.state()[name], err_msg=name)
    assert by_view.series_sums()["hits"].sum() > 0


def test_window_sums_appended_equal_the_general_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose origins follow those kept is appended, skipping the unique/add.at merge; the sums are the same
    bit for bit, whatever the batches that come before and after (new origins, kept ones, both, repeated)."""
    from distributed_onnx.evaluation.scoring import conventions
    from distributed_onnx.evaluation.scoring.conventions import WindowSums

    rng = np.random.default_rng(9)
    batches = [np.arange(0, 40), np.arange(40, 70), np.arange(10, 30), rng.permutation(np.arange(100, 130))]
    batches.append(np.arange(60, 90))  # kept and new: a part's next series on the same time grid
    batches.append(rng.permutation(np.arange(20, 120, 3)))  # kept and new, not ascending
    batches.append(np.asarray([200, 200, 5]))  # repeated and kept origins: the general path
    blocks = [rng.normal(size=(b.size, 7 + len(QUANTILES))) for b in batches]
    blocks[0][3] = -0.0  # a negative zero becomes 0 + -0.0 = 0.0 on both paths
    blocks[4][:5] = -0.0  # added to kept sums and to new ones

    def run() -> WindowSums:
        sums = WindowSums(QUANTILES, 2)
        for origins, block in zip(batches, blocks, strict=True):
            sums._add(origins.astype(np.int64), block)
        return sums

    fast = run()
    monkeypatch.setattr(conventions, "_after", lambda kept, origins: False)
    general = run()
    np.testing.assert_array_equal(fast.origins, general.origins)
    np.testing.assert_array_equal(fast.sums.view(np.uint64), general.sums.view(np.uint64))


@pytest.mark.parametrize("chunk_bytes", [1, 8 * 5 * 6 * 3, 1 << 20])
def test_the_sums_do_not_depend_on_how_many_windows_are_scored_at_once(
    chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of one window, of three, or the whole batch: every sum the same, bit for bit (lead sums carry over)."""
    from distributed_onnx.evaluation.scoring import losses

    rng = np.random.default_rng(10)
    windows, horizon = 11, 6
    actual = rng.normal(size=(windows, horizon))
    actual[4, 2] = np.nan
    forecast = np.sort(rng.normal(size=(windows, len(QUANTILES), horizon)), axis=1).astype(np.float32)
    scale = np.abs(rng.normal(size=windows))
    ids = ["a", "b", "a", "c", "b", "a", "c", "a", "a", "b", "c"]
    reference = MetricsAccumulator(QUANTILES, horizon)
    reference.update(ids, actual, forecast.transpose(0, 2, 1), scale)
    monkeypatch.setattr(losses, "CHUNK_BYTES", chunk_bytes)
    chunked = MetricsAccumulator(QUANTILES, horizon)
    chunked.update(ids, actual, forecast.transpose(0, 2, 1), scale)
    for name, values in chunked.state().items():
        np.testing.assert_array_equal(values, reference.state()[name], err_msg=name)


@pytest.mark.parametrize("chunk_bytes", [1, 8 * 5 * 6 * 3, 1 << 20])
def test_seasonal_quantiles_gathered_chunk_by_chunk_score_like_their_copy(
    chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seasonal quantiles reach the losses as a table of cells, gathered a chunk at a time: every sum, the
    common pairs (cells with no observed value) and the fans' medians equal those of the materialized copy."""
    from distributed_onnx.evaluation.data.packing import gather_blocks
    from distributed_onnx.evaluation.scoring import losses
    from distributed_onnx.evaluation.scoring.pairs import SEASONAL_QUANTILES, PairScores, cell_baselines

    monkeypatch.setattr(losses, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(13)
    m, seasons, horizon = 3, 4, 6
    values = rng.normal(size=120)
    values[40:52] = np.nan  # four seasons missing: some cells have no value, their pairs are left out
    origins = np.arange(50, 70, dtype=np.int64)
    cells = naive.series_season_cells(values, origins, m, seasons, horizon)
    baselines = cell_baselines(cells, QUANTILES)
    table = baselines[SEASONAL_QUANTILES]
    assert isinstance(table, losses.CellForecast)
    copy = references.seasonal_quantiles_batch(gather_blocks(values, origins, seasons * m, 0), m, horizon, QUANTILES)
    np.testing.assert_array_equal(table.materialized().view(np.uint64), copy.view(np.uint64))
    assert not table.finite().all()
    actual = gather_blocks(values, origins, 0, horizon)
    scale = np.abs(rng.normal(size=origins.size)) + 0.1
    model = np.sort(rng.normal(size=(origins.size, len(QUANTILES), horizon)), axis=1).astype(np.float32)
    scores = {}
    for name, seasonal in (("table", table), ("copy", copy)):
        scores[name] = PairScores(["model", *baselines], QUANTILES, horizon)
        forecasts = {"model": model.transpose(0, 2, 1), **baselines, SEASONAL_QUANTILES: seasonal}
        ids = np.full(origins.size, "s", dtype=object)
        scores[name].update(ids, origins * 1000, ids, actual, forecasts, scale)
    for key, array in scores["table"].state().items():
        np.testing.assert_array_equal(array, scores["copy"].state()[key], err_msg=key)
    assert scores["table"].excluded["baseline_undefined"] > 0
    rows = np.asarray([0, 5, 19])
    np.testing.assert_array_equal(table.level(rows, 2), copy[rows, :, 2])


def test_scores_with_work_buffers_kept_between_batches_equal_fresh_ones() -> None:
    """A runner keeps one set of buffers for every batch and part (any size): the sums are those of fresh buffers."""
    from distributed_onnx.evaluation.scoring.losses import Scratch
    from distributed_onnx.evaluation.scoring.pairs import PairScores

    rng = np.random.default_rng(11)
    horizon = 5
    kept = PairScores(["a", "b"], QUANTILES, horizon, Scratch())
    fresh = PairScores(["a", "b"], QUANTILES, horizon)
    for windows in (7, 3, 9, 1):
        actual = rng.normal(size=(windows, horizon))
        forecasts = {
            name: np.sort(rng.normal(size=(windows, horizon, len(QUANTILES))), axis=2).astype(np.float32)
            for name in ("a", "b")
        }
        ids = rng.choice(["s1", "s2"], size=windows)
        origins = rng.integers(0, 10**6, size=windows)
        window_ids = np.asarray([f"w{i}" for i in range(windows)], dtype=object)
        scale = np.abs(rng.normal(size=windows)) + 0.1
        for scores in (kept, fresh):
            scores.update(ids, origins, window_ids, actual, forecasts, scale)
            fresh.scratch = Scratch()  # new buffers before every batch
    for name, values in kept.state().items():
        np.testing.assert_array_equal(values, fresh.state()[name], err_msg=name)


def test_finite_pairs_finds_every_non_finite_value() -> None:
    """NaN and either infinity mark their pair; huge finite values do not."""
    from distributed_onnx.evaluation.scoring.batch_pairs import finite_pairs

    forecast = np.random.default_rng(14).normal(size=(6, len(QUANTILES), 4)).astype(np.float32).transpose(0, 2, 1)
    assert finite_pairs(forecast).all()
    for bad in (np.nan, np.inf, -np.inf):
        broken = np.array(forecast)
        broken[3, 2, 1] = bad
        expected = np.ones((6, 4), dtype=bool)
        expected[3, 2] = False
        np.testing.assert_array_equal(finite_pairs(broken), expected)
    assert finite_pairs(np.full((2, 3, 5), 3e38, dtype=np.float32)).all()
