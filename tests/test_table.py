"""The input-table contract (docs/design.md, "Input table"): unit tests, no Ray and no ONNX Runtime."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.table import load_series, series_from_table
from distributed_onnx.location import Location

UTC_TS = pa.timestamp("us", tz="UTC")
T0 = datetime(2024, 1, 1, tzinfo=UTC)
T0_US = int(T0.timestamp() * 1_000_000)
HALF_HOUR_US = 30 * 60 * 1_000_000


def _table(ids: list[str], minutes: list[int], ys: list[float | None], kind: pa.DataType = UTC_TS) -> pa.Table:
    stamps = [T0_US + m * 60_000_000 for m in minutes]
    return pa.table(
        {"series_id": ids, "timestamp": pa.array(stamps, pa.int64()).cast(kind), "y": pa.array(ys, pa.float64())}
    )


def test_gaps_become_nan_on_a_dense_grid_per_series() -> None:
    table = _table(["b", "a", "a", "a", "b"], [30, 0, 90, 30, 60], [5.0, 1.0, 4.0, None, 6.0])
    result = series_from_table(table, 30)
    assert [s.series_id for s in result.series] == ["a", "b"]
    a, b = result.series
    assert a.start_us == T0_US and a.step_us == HALF_HOUR_US
    np.testing.assert_array_equal(a.values, [1.0, np.nan, np.nan, 4.0])  # null and absent row both missing
    assert b.start_us == T0_US + HALF_HOUR_US
    np.testing.assert_array_equal(b.values, [5.0, 6.0])


def test_duplicate_timestamps_name_the_rows() -> None:
    table = _table(["a", "a", "b", "a"], [0, 30, 0, 30], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(DataError, match=r"duplicate \(series_id, timestamp\) at rows \[1, 3\]") as info:
        series_from_table(table, 30, source="load.parquet")
    assert "load.parquet" in str(info.value)
    assert "'a'" in str(info.value)
    assert info.value.rows == [1, 3]


def test_off_grid_timestamps_name_the_rows() -> None:
    table = _table(["a", "a", "a"], [0, 30, 70], [1.0, 2.0, 3.0])
    with pytest.raises(DataError, match=r"off the 30-minute grid .* at rows \[2\]"):
        series_from_table(table, 30)


def test_declared_covariate_missing_is_named() -> None:
    table = _table(["a", "a"], [0, 30], [1.0, 2.0])
    with pytest.raises(DataError, match=r"declared covariates \['temperature'\]"):
        series_from_table(table, 30, ["temperature"])


def test_coarser_data_than_the_checkpoint_is_refused() -> None:
    table = _table(["a"] * 4, [0, 60, 120, 240], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(DataError, match="60-minute grid, but the checkpoint expects 30-minute"):
        series_from_table(table, 30)


def test_empty_data_is_refused() -> None:
    with pytest.raises(DataError, match="no rows"):
        series_from_table(_table([], [], []), 30)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_series(Location(tmp_path / "absent.parquet"), 30)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match=r"Cannot read data file .*garbage\.parquet"):
        load_series(Location(garbage), 30)


def test_csv_input(tmp_path: Path) -> None:
    path = tmp_path / "load.csv"
    path.write_text(
        "series_id,timestamp,y,temp\n"
        "7,2024-01-01T00:00:00Z,1.5,10\n"
        "7,2024-01-01T00:30:00Z,,11\n"
        "7,2024-01-01T01:30:00Z,2.5,\n"
        "8,2024-01-01T00:30:00Z,3.0,12\n"
    )
    result = load_series(Location(path), 30, ["temp"])
    assert [s.series_id for s in result.series] == ["7", "8"]
    np.testing.assert_array_equal(result.series[0].values, [1.5, np.nan, np.nan, 2.5])
    np.testing.assert_array_equal(result.series[0].covariates, [[10.0, 11.0, np.nan, np.nan]])
    assert result.series[0].start_us == T0_US
    assert result.source == str(path)


def test_csv_written_by_pyarrow_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "load.csv"
    pa_csv.write_csv(_table(["a", "a"], [0, 30], [1.0, 2.0]), path)
    np.testing.assert_array_equal(load_series(Location(path), 30).series[0].values, [1.0, 2.0])


def test_extra_columns_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    table = _table(["a", "a"], [0, 30], [1.0, 2.0]).append_column("humidity", pa.array([1.0, 2.0]))
    table = table.append_column("note", pa.array(["x", "y"]))
    with caplog.at_level(logging.WARNING, logger="distributed_onnx.evaluation.data.table"):
        result = series_from_table(table, 30)
    assert result.covariate_names == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("humidity" in m and "note" in m for m in warnings), warnings


def test_tz_naive_timestamps_read_as_utc(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    path = tmp_path / "naive.parquet"
    pq.write_table(_table(["a", "a"], [0, 30], [1.0, 2.0], pa.timestamp("us")), path)
    with caplog.at_level(logging.WARNING, logger="distributed_onnx.evaluation.data.column_values"):
        result = load_series(Location(path), 30)
    assert result.series[0].start_us == T0_US
    assert any("no time zone" in r.getMessage() for r in caplog.records)


def test_other_time_zones_keep_the_instant() -> None:
    table = _table(["a", "a"], [0, 30], [1.0, 2.0], pa.timestamp("us", tz="Europe/Amsterdam"))
    assert series_from_table(table, 30).series[0].start_us == T0_US


def test_non_numeric_and_infinite_values_are_refused() -> None:
    table = _table(["a", "a"], [0, 30], [1.0, float("inf")])
    with pytest.raises(DataError, match=r"infinite values at rows \[1\]"):
        series_from_table(table, 30)
    text = pa.table({"series_id": ["a"], "timestamp": pa.array([T0_US], pa.int64()).cast(UTC_TS), "y": ["high"]})
    with pytest.raises(DataError, match="'y' must be numeric"):
        series_from_table(text, 30)


# --- inputs that used to crash or blow up memory (issue 10, section 2) -----------------------------------


def test_null_series_ids_name_the_rows() -> None:
    table = _table(["a", "a", "a", "b"], [0, 30, 60, 0], [1.0, 2.0, 3.0, 4.0])
    table = table.set_column(0, "series_id", pa.array(["a", None, "a", None], pa.string()))
    with pytest.raises(DataError, match=r"empty series_id at rows \[1, 3\]") as info:
        series_from_table(table, 30)
    assert info.value.rows == [1, 3]  # type: ignore[attr-defined]


def test_series_ids_that_are_not_strings_are_named() -> None:
    table = _table(["a"], [0], [1.0]).set_column(0, "series_id", pa.array([[1, 2]], pa.list_(pa.int64())))
    with pytest.raises(DataError, match=r"'series_id' must hold strings \(or integers\), found list<item: int64>"):
        series_from_table(table, 30)


def test_integer_series_ids_are_read_as_strings() -> None:
    table = _table(["a", "a"], [0, 30], [1.0, 2.0]).set_column(0, "series_id", pa.array([7, 7], pa.int64()))
    assert [s.series_id for s in series_from_table(table, 30).series] == ["7"]


def test_sub_microsecond_timestamps_name_the_rows() -> None:
    stamps_ns = np.array([T0_US, T0_US + HALF_HOUR_US, T0_US + 2 * HALF_HOUR_US], dtype=np.int64) * 1_000
    stamps_ns[2] += 1  # one nanosecond past the grid
    table = pa.table(
        {"series_id": ["a"] * 3, "timestamp": pa.array(stamps_ns, pa.timestamp("ns", tz="UTC")), "y": [1.0, 2.0, 3.0]}
    )
    with pytest.raises(
        DataError, match=r"sub-microsecond parts at rows \[2\] \(e\.g\. 2024-01-01T01:00:00\.000000001Z\)"
    ):
        series_from_table(table, 30)
    whole = table.set_column(1, "timestamp", pa.array(stamps_ns - np.array([0, 0, 1]), pa.timestamp("ns", tz="UTC")))
    assert series_from_table(whole, 30).series[0].start_us == T0_US  # whole microseconds in ns: fine


def test_sub_microsecond_timestamp_strings_name_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "ns.csv"
    path.write_text(
        "series_id,timestamp,y\na,2024-01-01T00:00:00Z,1\na,2024-01-01T00:30:00.000000500Z,2\na,2024-01-01T01:00:00Z,3\n"
    )
    with pytest.raises(DataError, match=r"sub-microsecond parts at rows \[1\]"):
        load_series(Location(path), 30)


def test_timestamps_beyond_the_microsecond_range_are_named() -> None:
    seconds = pa.array([0, 10**15], pa.timestamp("s", tz="UTC"))  # 31.7 million years
    table = pa.table({"series_id": ["a", "a"], "timestamp": seconds, "y": [1.0, 2.0]})
    with pytest.raises(DataError, match=r"out of range at rows \[1\]"):
        series_from_table(table, 30)


def test_a_stray_timestamp_decades_away_is_refused_before_the_grid_is_allocated() -> None:
    minutes = [30 * i for i in range(48 * 14)]  # two weeks, half-hourly
    ys = [float(i) for i in range(len(minutes))]
    stray = -int((T0 - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() // 60)  # an epoch-zero parse
    table = _table(["a", *["a"] * len(minutes)], [stray, *minutes], [0.0, *ys])
    expected = "series 'a' spans 947,376 grid steps for 673 rows: its largest gap, 946,704 steps"
    with pytest.raises(DataError, match=expected) as info:
        series_from_table(table, 30)
    message = str(info.value)
    assert "between rows 0 (1970-01-01T00:00:00.000000Z) and 1 (2024-01-01T00:00:00.000000Z)" in message
    assert "54.0 years" in message
    assert info.value.rows == [0, 1]  # type: ignore[attr-defined]


def test_grid_size_bound_is_ten_points_per_row_plus_slack() -> None:
    positions = list(range(99))  # 99 rows, then one more at the edge of the allowed span
    allowed = 10 * 100 + 1_000  # GRID_POINTS_PER_ROW * rows + GRID_SLACK_POINTS
    at_limit = _table(["a"] * 100, [30 * p for p in [*positions, allowed - 1]], [1.0] * 100)
    assert series_from_table(at_limit, 30).series[0].n_points == allowed
    beyond = _table(["a"] * 100, [30 * p for p in [*positions, allowed]], [1.0] * 100)
    with pytest.raises(DataError, match=r"spans 2,001 grid steps for 100 rows: its largest gap, 1,902 steps"):
        series_from_table(beyond, 30)


def test_csv_series_ids_are_read_as_written(tmp_path: Path) -> None:
    """Type-guessing read ``007`` and ``7`` as the integer 7: one series, refused as duplicates, zeros lost."""
    path = tmp_path / "load.csv"
    path.write_text(
        "series_id,timestamp,y\n"
        "007,2024-01-01T00:00:00Z,1\n"
        "007,2024-01-01T00:30:00Z,2\n"
        "7,2024-01-01T00:00:00Z,3\n"
        "7,2024-01-01T00:30:00Z,4\n"
        "1e3,2024-01-01T00:00:00Z,5\n"
    )
    result = load_series(Location(path), 30)
    assert [s.series_id for s in result.series] == ["007", "1e3", "7"]
    np.testing.assert_array_equal(result.series[0].values, [1.0, 2.0])


def test_parquet_series_ids_are_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / "load.parquet"
    table = _table(["007", "007", "7", "7"], [0, 30, 0, 30], [1.0, 2.0, 3.0, 4.0])
    pq.write_table(table, path)
    assert [s.series_id for s in load_series(Location(path), 30).series] == ["007", "7"]


def test_empty_csv_series_id_is_refused_naming_the_row(tmp_path: Path) -> None:
    path = tmp_path / "load.csv"
    path.write_text("series_id,timestamp,y\na,2024-01-01T00:00:00Z,1\n,2024-01-01T00:30:00Z,2\n")
    with pytest.raises(DataError, match=r"empty series_id at rows \[1\]"):
        load_series(Location(path), 30)


def test_empty_string_series_id_is_refused() -> None:
    table = _table(["a", ""], [0, 30], [1.0, 2.0])
    with pytest.raises(DataError, match=r"empty series_id at rows \[1\]"):
        series_from_table(table, 30)


def test_float_series_ids_are_refused() -> None:
    table = _table(["a"], [0], [1.0]).set_column(0, "series_id", pa.array([7.0], pa.float64()))
    with pytest.raises(DataError, match=r"'series_id' must hold strings \(or integers\), found double"):
        series_from_table(table, 30)


def test_a_huge_series_id_is_refused_before_it_is_copied() -> None:
    huge = "x" * 1_000_000
    table = _table(["a", huge], [0, 0], [1.0, 2.0])
    with pytest.raises(DataError, match=r"longer than 1,024 bytes at rows \[1\] \(the longest: 1,000,000 bytes\)"):
        series_from_table(table, 30)


def test_many_sparse_series_are_refused_by_their_total_grid() -> None:
    """Each two-row series spanning 1,010 steps passes the per-series bound; a million of them is 8 GB."""
    n_series = 12_000
    ids = pa.array(np.repeat(np.arange(n_series), 2).astype(str))
    offsets = np.tile([0, 1_009 * HALF_HOUR_US], n_series) + T0_US
    table = pa.table(
        {"series_id": ids, "timestamp": pa.array(offsets, pa.int64()).cast(UTC_TS), "y": np.ones(2 * n_series)}
    )
    expected = r"the 12,000 series span 12,120,000 grid steps for 24,000 rows \(dense, 0.1 GB of float64\)"
    with pytest.raises(DataError, match=expected) as info:
        series_from_table(table, 30)
    assert "at most 10,240,000 are allowed" in str(info.value)


@pytest.mark.parametrize("extreme", [np.iinfo(np.int64).min + 1, np.iinfo(np.int64).max])
def test_timestamps_near_the_int64_limits_are_refused(extreme: int) -> None:
    """A span across the int64 limits overflowed: "negative dimensions are not allowed" from numpy."""
    stamps = pa.array([0, extreme], pa.int64()).cast(UTC_TS)
    table = pa.table({"series_id": ["a", "a"], "timestamp": stamps, "y": [1.0, 2.0]})
    with pytest.raises(DataError, match=r"timestamps outside years 1-9999 at rows \[1\]"):
        series_from_table(table, 1)
