"""Unit tier: the forecast log (layout of its rows and files, the background writer, drops, resumption).

Real files in a temporary folder; the sink is made unwritable by replacing the log's folder with a file (the
tests run as root, whom a read-only mode would not stop), and a slow sink is a small hand-written wrapper.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.evaluation.outputs import forecast_table
from distributed_onnx.live.log.layout import (
    EXTRA_FIELDS,
    LoggedForecast,
    context_length_of,
    forecast_rows,
    log_files,
    read_states,
    window_id,
)
from distributed_onnx.live.log.writer import (
    QUEUE_FULL,
    WRITE_FAILED,
    ForecastLog,
    StorageSink,
    ThrottledWarning,
)
from distributed_onnx.location import Location

START_US = 1_796_083_200_000_000  # 2026-12-01T00:00Z
STEP_MIN = 30
STEP_US = STEP_MIN * 60_000_000
QUANTILES = (0.1, 0.5, 0.9)


def _item(
    request: int = 0, model: str = "m", role: str = "served", series: int = 2, horizon: int = 4, origin: bool = True
) -> LoggedForecast:
    forecasts = np.arange(series * horizon * 3, dtype=np.float32).reshape(series, horizon, 3) + request
    return LoggedForecast(
        model=model,
        checkpoint_sha256="ab" * 32,
        role=role,  # type: ignore[arg-type]
        request_id=f"req-{request}",
        request_time_us=START_US + request * 1_000_000,
        resolution_minutes=STEP_MIN,
        series_ids=[f"s{i}" for i in range(series)],
        origins_us=[START_US + (48 + i) * STEP_US if origin else None for i in range(series)],
        quantiles=QUANTILES,
        forecasts=forecasts,
    )


def _model_of(path: Location) -> str | None:
    """The model a log file's partition names (None outside the layout)."""
    parent = Path(str(path)).parent.name
    return unquote(parent.removeprefix("model=")) if parent.startswith("model=") else None


def _read_log(root: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(path) for path in log_files(Location(root))])


# ------------------------------------------------------------------------------------------------- rows


def test_rows_follow_the_backtest_forecast_schema_then_the_log_fields() -> None:
    item = _item()
    rows = forecast_rows(item)
    backtest_like = forecast_table(
        pa.record_batch(
            {
                "series_id": pa.array(["s0", "s1"]),
                "window_id": pa.array(["x", "y"]),
                "origin": pa.array([START_US + 48 * STEP_US, START_US + 49 * STEP_US], pa.timestamp("us", tz="UTC")),
                "target": pa.array([[np.nan] * 4] * 2, pa.list_(pa.float64(), 4)),
            }
        ),
        item.forecasts,
        QUANTILES,
        STEP_US,
    )
    assert rows.schema.names == [*backtest_like.schema.names, *(field.name for field in EXTRA_FIELDS)]
    for name in backtest_like.schema.names:
        assert rows.schema.field(name).type == backtest_like.schema.field(name).type, name
        if name not in ("window_id", "y"):
            assert rows.column(name).equals(backtest_like.column(name)), name
    assert rows.column("y").null_count == rows.num_rows  # the actuals come later, with score
    assert set(rows.column("model").to_pylist()) == {"m"}
    assert set(rows.column("request_id").to_pylist()) == {"req-0"}


def test_a_request_without_start_is_logged_with_null_timestamps() -> None:
    rows = forecast_rows(_item(origin=False))
    assert rows.num_rows == 8
    for name in ("origin", "cutoff", "timestamp"):
        assert rows.column(name).null_count == rows.num_rows
    assert rows.column("q0.5").null_count == 0


def test_a_shadow_forecast_of_the_same_request_has_the_same_window_ids() -> None:
    served = forecast_rows(_item(model="a"))
    shadow = forecast_rows(_item(model="b", role="shadow"))
    assert served.column("window_id").equals(shadow.column("window_id"))
    assert window_id("req-0", 0) != window_id("req-0", 1) != window_id("req-1", 0)


# ------------------------------------------------------------------------------------------------- writer


def test_the_writer_batches_into_hive_partitions_and_records_its_counts(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path / "log", flush_interval_s=60.0, writer_id="w1")
    for request in range(5):
        assert log.submit(_item(request, model="a"))
        assert log.submit(_item(request, model="b", role="shadow"))
    assert log.flush()
    files = log_files(Location(tmp_path / "log"))
    assert len(files) == 2  # one batch, one file per model
    assert {_model_of(path) for path in files} == {"a", "b"}
    assert all("day=2026-12-01" in str(path) for path in files)
    table = _read_log(tmp_path / "log")
    assert table.num_rows == 2 * 5 * 2 * 4
    counts = log.counts()
    assert counts["a"].logged == counts["b"].logged == 10 and counts["a"].dropped_total == 0
    (state,) = read_states(Location(tmp_path / "log"))
    assert state["models"]["a"]["logged"] == 10  # type: ignore[index]
    log.close()


def test_a_partition_holds_files_of_different_quantile_levels(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path, flush_interval_s=60.0)
    other = _item(1)
    other = LoggedForecast(**{**other.__dict__, "quantiles": (0.5, 0.95, 0.99)})
    log.submit(_item(0))
    log.submit(other)
    log.flush()
    log.close()
    names = sorted(tuple(pq.read_schema(path).names) for path in log_files(Location(tmp_path)))
    assert len(names) == 2 and "q0.99" in names[0] + names[1]


def test_the_sink_replaced_by_a_file_mid_run_drops_counted_and_logging_resumes(tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = ForecastLog(root, flush_interval_s=60.0, warn_period_s=3600.0)
    log.submit(_item(0))
    assert log.flush()
    shutil.rmtree(root)
    root.write_text("not a folder")  # every write under it now fails, even for root
    for request in range(1, 4):
        assert log.submit(_item(request))  # accepted: the failure is the writer's, not the request's
    assert log.flush()
    counts = log.counts()["m"]
    assert counts.dropped[WRITE_FAILED] == 3 * 2 and counts.logged == 2
    root.unlink()  # the sink returns
    log.submit(_item(4))
    log.submit(_item(5))
    assert log.flush()
    log.close()
    counts = log.counts()["m"]
    assert counts.submitted == counts.logged + counts.dropped_total == 6 * 2
    assert counts.logged == 3 * 2 and counts.pending == 0
    table = _read_log(root)
    assert sorted(set(table.column("request_id").to_pylist())) == ["req-4", "req-5"]  # the first went with the folder
    (state,) = read_states(Location(root))
    assert state["models"]["m"]["dropped"][WRITE_FAILED] == 6  # type: ignore[index]
    assert "NotADirectoryError" in str(state["last_error"]) or "FileExistsError" in str(state["last_error"])


class GatedSink:
    """Writes through to storage once ``gate`` is set; until then every write waits (a slow sink)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.inner = StorageSink()

    def write_table(self, location: Location, table: pa.Table) -> int:
        self.gate.wait(30)
        return self.inner.write_table(location, table)

    def write_bytes(self, location: Location, payload: bytes) -> int:
        self.gate.wait(30)
        return self.inner.write_bytes(location, payload)


def test_a_slow_sink_never_blocks_submit_the_overflow_is_dropped_and_counted(tmp_path: Path) -> None:
    sink = GatedSink()
    log = ForecastLog(tmp_path, max_queued_windows=6, max_batch_windows=2, flush_interval_s=0.05, sink=sink)
    accepted = [log.submit(_item(request)) for request in range(10)]  # the sink holds the first batch
    assert accepted[:3] == [True, True, True] and not any(accepted[3:])
    counts = log.counts()["m"]
    assert counts.dropped[QUEUE_FULL] == 7 * 2 and counts.pending == 3 * 2
    sink.gate.set()
    assert log.flush()
    assert log.submit(_item(10))  # room again once the sink caught up
    log.close()
    counts = log.counts()["m"]
    assert counts.logged == 4 * 2 and counts.submitted == counts.logged + counts.dropped_total


class FailingSink:
    """A sink that fails on demand, then writes through."""

    def __init__(self) -> None:
        self.failing = True
        self.inner = StorageSink()
        self.attempts = 0

    def write_table(self, location: Location, table: pa.Table) -> int:
        self.attempts += 1
        if self.failing:
            raise ConnectionError("object store unreachable")
        return self.inner.write_table(location, table)

    def write_bytes(self, location: Location, payload: bytes) -> int:
        if self.failing:
            raise ConnectionError("object store unreachable")
        return self.inner.write_bytes(location, payload)


def test_failures_are_warned_once_per_period_not_per_request(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = FailingSink()
    log = ForecastLog(tmp_path, flush_interval_s=60.0, sink=sink, warn_period_s=3600.0)
    with caplog.at_level(logging.WARNING, logger="distributed_onnx.live.log.writer"):
        for request in range(5):
            log.submit(_item(request))
            assert log.flush()  # five batches, five failed writes
    assert sink.attempts == 5
    warnings = [record for record in caplog.records if "writing failed" in record.getMessage()]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0].getMessage()
    sink.failing = False
    log.submit(_item(5))
    log.close()
    assert log.counts()["m"].logged == 2 and log.counts()["m"].dropped[WRITE_FAILED] == 10
    assert json.loads((tmp_path / "_log_state" / f"{log.writer_id}.json").read_text())["write_failures"] == 5


def test_throttled_warning_says_how_many_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warning = ThrottledWarning(60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert warning.warn("sink down")
        now[0] = 30.0
        assert not warning.warn("sink down")
        assert not warning.warn("sink down")
        now[0] = 61.0
        assert warning.warn("sink down")
    assert [record.getMessage() for record in caplog.records] == [
        "sink down",
        "sink down (2 more since the last warning)",
    ]


def test_submit_after_close_is_dropped_and_counted(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path)
    log.close()
    assert not log.submit(_item())
    assert log.counts()["m"].dropped[QUEUE_FULL] == 2


def test_a_file_records_its_checkpoints_context_length_one_file_per_length(tmp_path: Path) -> None:
    """What ``score``'s seasonal-quantile baseline looks back over (attack I: without it, one season, not the
    backtest's). A log written before it was recorded (context 0) records none, which ``score`` reads as such."""
    log = ForecastLog(tmp_path, flush_interval_s=60.0)
    for context in (16, 512, 0):
        log.submit(LoggedForecast(**{**_item(context).__dict__, "context_length": context}))
    log.close()
    recorded = sorted(str(context_length_of(pq.read_schema(path).metadata)) for path in log_files(Location(tmp_path)))
    assert recorded == ["16", "512", "None"]
    with pytest.raises(ValueError, match="context length 16; expected 512"):
        forecast_rows([LoggedForecast(**{**_item(i).__dict__, "context_length": c}) for i, c in ((0, 512), (1, 16))])


def test_rows_of_a_batch_are_the_rows_of_each_item_laid_end_to_end() -> None:
    items = [_item(0), _item(1, horizon=2, series=3), _item(2, origin=False), _item(3, model="b", role="shadow")]
    batch = forecast_rows(items)
    assert batch.equals(pa.concat_tables([forecast_rows(item) for item in items]))
    assert batch.num_rows == 2 * 4 + 3 * 2 + 2 * 4 + 2 * 4
    assert batch.column("lead").to_pylist()[8:14] == [1, 2, 1, 2, 1, 2]
    with pytest.raises(ValueError, match="levels"):
        forecast_rows([_item(0), LoggedForecast(**{**_item(1).__dict__, "quantiles": (0.2, 0.5, 0.8)})])
