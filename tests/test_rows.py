"""The streamed reader of a large sorted Parquet input (evaluation/data/rows.py): unit tests, no Ray, no ORT.

Every test compares the streamed scan with the whole-table reader on the same file (small chunks and row
groups stand in for a large file): the same series, grids, values and window counts, and the same errors.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data import rows as rows_module
from distributed_onnx.evaluation.data.rows import SeriesRows
from distributed_onnx.evaluation.data.table import load_series
from distributed_onnx.evaluation.data.windows import WindowSpec, plan_windows
from distributed_onnx.evaluation.dataset import _scan as scan_module
from distributed_onnx.evaluation.dataset._scan import scan_sorted_parquet
from distributed_onnx.evaluation.planning import prepare
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

STEP_US = 30 * 60 * 1_000_000
T0_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
SPEC = WindowSpec(context_length=8, horizon=3, n_windows=4, stride=2, min_context_coverage=0.6)


def _long(n_series: int = 9, seed: int = 0, integer_ids: bool = False) -> pa.Table:
    """Sorted rows of series of 5..40 steps with NaN values, absent rows and a covariate."""
    rng = np.random.default_rng(seed)
    ids, stamps, ys, temps = [], [], [], []
    for s in range(n_series):
        length = int(rng.integers(5, 40))
        steps = np.flatnonzero(rng.random(length) > 0.15)
        steps = np.union1d(steps, [0, length - 1])
        y = rng.normal(10, 2, steps.size)
        y[rng.random(steps.size) < 0.2] = np.nan
        ids += [s if integer_ids else f"s{s:03d}"] * steps.size
        stamps.append(T0_US + (s % 4) * STEP_US + steps * STEP_US)
        ys.append(y)
        temps.append(rng.normal(0, 1, steps.size))
    y_all = np.concatenate(ys)
    return pa.table(
        {
            "series_id": pa.array(ids, pa.int64() if integer_ids else pa.string()),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(y_all, mask=np.isnan(y_all)),
            "temp": np.concatenate(temps),
        }
    )


def _write(table: pa.Table, path: Path | Location, row_group_size: int = 23) -> Location:
    pq.write_table(table, path, row_group_size=row_group_size)
    return Location(path)


def _assert_same(scanned_rows: SeriesRows, path: Location, covariates: list[str]) -> None:
    whole = load_series(path, 30, covariates).arrays()
    assert scanned_rows.series_ids == whole.series_ids
    np.testing.assert_array_equal(scanned_rows.start_us, whole.start_us)
    np.testing.assert_array_equal(scanned_rows.offsets, whole.offsets)
    every = scanned_rows.arrays(0, len(scanned_rows))
    np.testing.assert_array_equal(every.values, whole.values)
    np.testing.assert_array_equal(every.covariates, whole.covariates)
    for lo, hi in [(2, 5), (4, 5), (0, 1), (len(whole) - 2, len(whole))]:
        part = scanned_rows.arrays(lo, hi)
        for index in range(lo, hi):
            one, reference = part.series(index), whole.series(index)
            assert one.series_id == reference.series_id and one.start_us == reference.start_us
            np.testing.assert_array_equal(one.values, reference.values)
            np.testing.assert_array_equal(one.covariates, reference.covariates)


@pytest.mark.parametrize("chunk_rows", [7, 20, 64])
def test_the_streamed_scan_gives_the_whole_reads_series_and_windows(tmp_path: Path, chunk_rows: int) -> None:
    path = _write(_long(), tmp_path / "data.parquet")

    scanned = scan_sorted_parquet(path, 30, ["temp"], SPEC, chunk_rows=chunk_rows)

    assert scanned is not None
    assert isinstance(scanned.table.series, SeriesRows)
    _assert_same(scanned.table.series, path, ["temp"])
    whole_plan = plan_windows(load_series(path, 30, ["temp"]).series, SPEC)
    np.testing.assert_array_equal(scanned.windows.counts, whole_plan.counts)
    np.testing.assert_array_equal(scanned.windows.offsets, whole_plan.offsets)
    assert (scanned.windows.skipped, scanned.windows.capped) == (whole_plan.skipped, whole_plan.capped)
    assert scanned.windows.capped_series == whole_plan.capped_series


def test_integer_ids_and_a_series_longer_than_a_chunk(tmp_path: Path) -> None:
    path = _write(_long(n_series=5, seed=3, integer_ids=True), tmp_path / "data.parquet", row_group_size=5)

    scanned = scan_sorted_parquet(path, 30, [], SPEC, chunk_rows=4)

    assert scanned is not None
    _assert_same(scanned.table.series, path, [])


def test_small_unsorted_and_csv_inputs_are_read_whole(tmp_path: Path) -> None:
    table = _long()
    path = _write(table, tmp_path / "data.parquet")
    assert scan_sorted_parquet(path, 30, [], SPEC, chunk_rows=table.num_rows) is None  # one chunk: read whole

    shuffled = table.take(np.random.default_rng(0).permutation(table.num_rows))
    assert scan_sorted_parquet(_write(shuffled, tmp_path / "shuffled.parquet"), 30, [], SPEC, chunk_rows=7) is None
    # grouped but not in id order: a later chunk starts before an earlier one ends
    backwards = pa.concat_tables([table.slice(60), table.slice(0, 60)])
    assert scan_sorted_parquet(_write(backwards, tmp_path / "backwards.parquet"), 30, [], SPEC, chunk_rows=7) is None

    csv = tmp_path / "data.csv"
    csv.write_text("series_id,timestamp,y\na,2024-01-01T00:00:00Z,1\na,2024-01-01T00:30:00Z,2\n")
    assert scan_sorted_parquet(Location(csv), 30, [], SPEC, chunk_rows=1) is None


def test_a_bad_row_far_in_the_file_is_named_by_the_whole_reader(tmp_path: Path) -> None:
    table = _long()
    stamps = table["timestamp"].to_numpy().astype("datetime64[us]").astype(np.int64)
    bad = table.num_rows - 3  # in the last chunk
    stamps[bad] = stamps[bad - 1]  # a duplicate timestamp
    broken = table.set_column(1, "timestamp", pa.array(stamps, pa.timestamp("us", tz="UTC")))
    path = _write(broken, tmp_path / "data.parquet")

    assert scan_sorted_parquet(path, 30, [], SPEC, chunk_rows=7) is None
    with pytest.raises(DataError, match=rf"duplicate \(series_id, timestamp\) at rows \[{bad - 1}, {bad}\]"):
        load_series(path, 30)


def _scanned_rows(path: Location) -> SeriesRows:
    """The streamed layout the driver's scan plans for ``path`` (sorted, several chunks)."""
    scanned = scan_sorted_parquet(path, 30, [], SPEC, chunk_rows=7)
    assert scanned is not None
    rows = scanned.table.series
    assert isinstance(rows, SeriesRows)
    return rows


def test_a_file_replaced_after_planning_is_refused_by_the_actor(tmp_path: Path) -> None:
    path = _write(_long(), tmp_path / "data.parquet")
    rows = _scanned_rows(path)

    _write(_long(seed=5), path)  # other lengths and ids at the same path

    with pytest.raises(DataError, match="changed since the run was planned"):
        pickle.loads(pickle.dumps(rows)).arrays(0, len(rows))


def test_pickling_drops_the_decoded_row_groups(tmp_path: Path) -> None:
    rows = _scanned_rows(_write(_long(), tmp_path / "data.parquet"))
    rows.arrays(0, 3)
    assert rows._groups  # cached where read

    copy = pickle.loads(pickle.dumps(rows))

    assert not copy._groups
    np.testing.assert_array_equal(copy.arrays(0, 3).values, rows.arrays(0, 3).values)
    assert len(rows._groups) <= rows_module.CACHED_ROW_GROUPS


def test_an_object_store_url_is_streamed_and_read_back(tmp_path: Path) -> None:
    """The scan and the actors' reads go through pyarrow filesystems (fsspec's memory:// here), as local paths."""
    from distributed_onnx import storage

    local = _write(_long(), tmp_path / "data.parquet")
    url = Location.parse(f"memory://{tmp_path.name}/in/data.parquet")
    storage.make_dirs(url.parent)
    storage.write_bytes(url, storage.read_bytes(local))

    scanned = scan_sorted_parquet(url, 30, ["temp"], SPEC, chunk_rows=7)

    assert scanned is not None
    rows = scanned.table.series
    assert isinstance(rows, SeriesRows)
    whole = load_series(local, 30, ["temp"]).arrays()
    every = pickle.loads(pickle.dumps(rows)).arrays(0, len(rows))
    np.testing.assert_array_equal(every.values, whole.values)
    np.testing.assert_array_equal(every.covariates, whole.covariates)


def test_the_plan_of_a_streamed_input_and_its_errors(
    tmp_path: Path, tiny_checkpoint: ResolvedCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prepare`` streams a multi-chunk sorted input (same windows as a whole read), and a bad row far in the
    file is named by its row in the file."""
    monkeypatch.setattr(scan_module, "STREAM_CHUNK_ROWS", 16)
    table = _long()
    path = _write(table, tmp_path / "data.parquet")
    settings = {"checkpoint": tiny_checkpoint.weights_path, "data": path, "n_windows": 3, "progress": False}

    streamed = prepare(BacktestSettings.model_validate({**settings, "output": tmp_path / "a"}))
    whole = prepare(
        BacktestSettings.model_validate({**settings, "output": tmp_path / "b", "series_transport": "object_store"})
    )

    assert isinstance(streamed.table.series, SeriesRows) and not isinstance(whole.table.series, SeriesRows)
    np.testing.assert_array_equal(streamed.windows.counts, whole.windows.counts)
    assert streamed.run_fingerprint == whole.run_fingerprint  # the same run, resumable either way

    y = table["y"].to_numpy(zero_copy_only=False).copy()
    y[table.num_rows - 2] = np.inf
    _write(table.set_column(2, "y", pa.array(y)), path)
    with pytest.raises(DataError, match=rf"infinite values at rows \[{table.num_rows - 2}\]"):
        prepare(BacktestSettings.model_validate({**settings, "output": tmp_path / "c"}))


def test_dictionary_ids_of_integers_read_back_as_their_text(tmp_path: Path) -> None:
    """Ids stored as a dictionary of integers (a pandas categorical) are the same text as the driver checked."""
    table = _long(n_series=6, integer_ids=True)
    as_dictionary = table.set_column(0, "series_id", table["series_id"].dictionary_encode())
    path = _write(as_dictionary, tmp_path / "data.parquet", row_group_size=11)

    scanned = scan_sorted_parquet(path, 30, [], SPEC, chunk_rows=8)

    assert scanned is not None
    _assert_same(scanned.table.series, path, [])
