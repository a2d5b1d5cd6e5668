"""Unit tier: failed requests in the forecast log (the failures table, the writer's counts, the classification,
the recorder that must never change an answer, and what ``score`` reads of them), on real files, no Ray.

The end-to-end proof (a real Serve replica failing requests of each kind) is tests/test_live_failures.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from distributed_onnx.errors import BackendClosedError, InferenceError, InputValidationError
from distributed_onnx.live.log.failures import (
    ADMISSION,
    FAILURES_DIR,
    INTERNAL,
    MAX_MESSAGE_CHARS,
    MODEL_ERROR,
    UNKNOWN_MODEL_PARTITION,
    VALIDATION,
    FailureLog,
    LoggedFailure,
    failure_files,
    one_line,
)
from distributed_onnx.live.log.layout import log_files, read_states
from distributed_onnx.live.log.writer import LOG_FORMAT, ForecastLog
from distributed_onnx.live.score.failure_rates import failure_reasons, request_counts
from distributed_onnx.location import Location
from distributed_onnx.serve.wire.failure_kinds import classify, describe
from distributed_onnx.serve.wire.http import HttpError

START_US = 1_796_083_200_000_000  # 2026-12-01T00:00Z


def _failure(model: str | None, kind: str = VALIDATION, at: int = 0, message: str = "bad") -> LoggedFailure:
    return LoggedFailure(START_US + at, f"req-{at}", model, kind, "invalid_input", message, 422, "http", "forecast")


def test_failures_are_a_table_of_their_own_partitioned_by_day_and_model_and_counted_in_the_record(
    tmp_path: Path,
) -> None:
    log = ForecastLog(tmp_path / "log", flush_interval_s=0.05, writer_id="w1")
    for _ in range(3):
        log.answered("a")
    log.submit_failure(_failure("a", VALIDATION, at=1))
    log.submit_failure(_failure("a", MODEL_ERROR, at=2))
    log.submit_failure(_failure(None, ADMISSION, at=3))
    log.close()

    files = failure_files(Location(tmp_path / "log"))
    folders = sorted(str(path.parent.relative_to(Location(tmp_path / "log"))) for path in files)
    assert folders == [
        f"{FAILURES_DIR}/day=2026-12-01/model=__HIVE_DEFAULT_PARTITION__",
        f"{FAILURES_DIR}/day=2026-12-01/model=a",
    ]
    assert UNKNOWN_MODEL_PARTITION in folders[0]
    rows = pq.read_table(next(path for path in files if path.parent.name == "model=a")).to_pylist()
    assert [(row["model"], row["kind"], row["status"], row["protocol"]) for row in rows] == [
        ("a", VALIDATION, 422, "http"),
        ("a", MODEL_ERROR, 422, "http"),
    ]
    assert log_files(Location(tmp_path / "log")) == []  # the forecasts' readers never see the failures table
    (state,) = read_states(Location(tmp_path / "log"))
    assert state["format"] == LOG_FORMAT == 2
    assert state["models"]["a"]["requests_answered"] == 3
    assert state["models"]["a"]["requests_failed"] == {VALIDATION: 1, MODEL_ERROR: 1}
    assert state["models"]["a"]["failures_logged"] == 2
    assert state["unattributed"]["requests_failed"] == {ADMISSION: 1}


def test_a_failure_row_the_queue_cannot_take_is_dropped_but_still_counted(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path / "log", max_queued_windows=1, flush_interval_s=30, writer_id="w1")
    assert log.submit_failure(_failure("a", at=1))
    assert not log.submit_failure(_failure("a", at=2))  # the queue holds one
    log.close()
    (state,) = read_states(Location(tmp_path / "log"))
    counts = request_counts([state]).models["a"].record()
    assert counts["failed"] == 2 and counts["failure_rows_logged"] == 1 and counts["failure_rows_dropped"] == 1
    assert counts["failure_rate"] == 1.0  # the rate comes from the counts, not from the rows that survived


def test_a_message_is_one_line_without_secrets_and_bounded() -> None:
    message = "cannot read s3://KEY:SECRET@bucket/m.onnx?secret_key=S now\nTraceback: ..."
    line = one_line(message)
    assert line == "cannot read s3://***@bucket/m.onnx?secret_key=*** now"
    assert "SECRET" not in line and "\n" not in line
    assert len(one_line("x" * 10_000)) == MAX_MESSAGE_CHARS
    bounded = LoggedFailure(0, "i" * 1000, "a", VALIDATION, "r", "a\nb", 422, "http", "forecast").bounded()
    assert len(bounded.request_id) == 128 and bounded.message == "a"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (HttpError(400, "Request body is not valid JSON"), (VALIDATION, "malformed_request", 400)),
        (HttpError(404, "Unknown model 'x'"), (VALIDATION, "unknown_model", 404)),
        (HttpError(413, "too big"), (VALIDATION, "too_large", 413)),
        (InputValidationError("context: bad shape"), (VALIDATION, "invalid_input", 422)),
        (HttpError(503, "Overloaded", {"Retry-After": "1"}), (ADMISSION, "overloaded", 503)),
        (InferenceError("ORT failed"), (MODEL_ERROR, "model_failed", 500)),
        (BackendClosedError("closed"), (MODEL_ERROR, "backend_closed", 503)),
        (RuntimeError("a bug"), (INTERNAL, "internal_error", 500)),
        (asyncio.CancelledError(), ("cancelled", "client_cancelled", 499)),
    ],
)
def test_each_failure_is_classified_by_its_kind_reason_and_status(exc: BaseException, expected: tuple) -> None:
    assert classify(exc) == expected


class _BrokenLog:
    def submit_failure(self, item: Any) -> bool:
        raise OSError("the log is broken")


def test_a_failure_to_record_never_changes_the_answer() -> None:
    recorder = FailureLog(_BrokenLog(), describe)  # type: ignore[arg-type]

    async def refused() -> None:
        raise HttpError(422, "horizon: must be positive")

    async def run() -> None:
        await recorder.watch(
            refused(), protocol="http", endpoint="forecast", model=lambda: "a", request_id=lambda: "r", received_us=1
        )

    with pytest.raises(HttpError) as caught:
        asyncio.run(run())
    assert caught.value.status_code == 422  # still the client's 4xx, not a 5xx
    assert recorder.unrecorded == 1

    def no_model() -> str | None:
        raise KeyError("model lookup broke")

    async def run_lookup() -> None:
        await FailureLog(None, describe).watch(
            refused(), protocol="http", endpoint="x", model=no_model, request_id=lambda: ""
        )

    with pytest.raises(HttpError):
        asyncio.run(run_lookup())  # without a log nothing is even looked up


def test_score_reads_rates_from_the_records_and_reasons_from_the_table(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path / "log", flush_interval_s=0.05, writer_id="w1")
    for _ in range(6):
        log.answered("a")
    log.submit_failure(_failure("a", VALIDATION, at=1, message="first"))
    log.submit_failure(_failure("a", VALIDATION, at=2, message="second"))
    log.submit_failure(_failure("a", ADMISSION, at=3))
    log.submit_failure(_failure(None, VALIDATION, at=4))
    log.close()
    summary = request_counts(read_states(Location(tmp_path / "log"))).record()
    assert summary["recorded"] is True
    a = summary["models"]["a"]
    assert (a["requests"], a["answered"], a["failed"]) == (9, 6, 3)
    assert a["failure_rate"] == pytest.approx(3 / 9)
    assert a["failure_rate_by_kind"][VALIDATION] == pytest.approx(2 / 9)
    assert summary["unattributed"]["failed"] == 1
    reasons, unreadable = failure_reasons(Location(tmp_path / "log"))
    assert unreadable == {}
    rows = reasons.to_pylist()
    # the most frequent first, then the latest
    assert [(row["model"], row["kind"], row["count"]) for row in rows] == [
        ("a", VALIDATION, 2),
        (None, VALIDATION, 1),
        ("a", ADMISSION, 1),
    ]
    assert next(row for row in rows if row["count"] == 2)["message"] == "second"  # the latest message


def test_an_old_log_says_nothing_of_failures_rather_than_a_rate_of_zero(tmp_path: Path) -> None:
    old_record = {"writer_id": "old", "models": {"a": {"submitted": 4, "logged": 4, "dropped": {}}}}
    state_dir = tmp_path / "log" / "_log_state"
    state_dir.mkdir(parents=True)
    (state_dir / "old.json").write_text(json.dumps(old_record))
    summary = request_counts(read_states(Location(tmp_path / "log")))
    assert summary.recorded is False and summary.models == {}
    reasons, _ = failure_reasons(Location(tmp_path / "log"))
    assert reasons.num_rows == 0


def test_an_unreadable_failures_file_is_named_and_the_rest_read(tmp_path: Path) -> None:
    log = ForecastLog(tmp_path / "log", flush_interval_s=0.05, writer_id="w1")
    log.submit_failure(_failure("a", at=1))
    log.close()
    torn = tmp_path / "log" / FAILURES_DIR / "day=2026-12-01" / "model=a" / "part-torn.parquet"
    torn.write_bytes(b"")
    reasons, unreadable = failure_reasons(Location(tmp_path / "log"))
    assert list(unreadable) == [f"{FAILURES_DIR}/day=2026-12-01/model=a/part-torn.parquet"]
    assert reasons.column("count").to_pylist() == [1]
