"""Writes the forecast log off the request path: a bounded queue, one background thread, batched files.

The serving side calls :meth:`ForecastLog.submit` after it has its answer; submit never blocks and never
raises: it counts the forecasts and puts them on a queue, or, when the queue already holds
``max_queued_windows`` forecasts (the sink is slower than the traffic, or failing), drops them and counts the
drop. The thread wakes every ``flush_interval_s`` (sooner when ``max_batch_windows`` are queued), takes what is
queued, and writes one Parquet file per (day, model, quantile levels, native levels) group of the batch
(:mod:`.layout`). A failed write drops that group's forecasts, counted with the reason; the next batch tries
again, so logging resumes by itself when the sink comes back. Failures are logged at most once per
``warn_period_s`` (with how many were dropped since), never once per request.

Every forecast submitted ends in exactly one counter: ``logged`` (its file was written) or ``dropped`` (by
reason: ``queue_full``, ``write_failed``); until then it is ``pending``. The counts are per model
(:meth:`ForecastLog.counts`, read by ``/metrics``) and are written, after each batch, to the writer's own
record ``LOG/_log_state/<writer>.json``, so the log says itself what it is missing. So are a shadow model's
problems (:meth:`ForecastLog.shadow_problems`): windows it failed to forecast (``shadow_failed``: never
submitted, so nothing else would say they are missing) and windows it forecast NaN or inf for
(``shadow_nonfinite``: logged as they are, left out of the pairs by ``score`` as the backtest leaves them out).

Requests that failed (:meth:`ForecastLog.submit_failure`, :mod:`.failures`) go through the same queue and thread
into the failures table, one file per (day, model) group of a batch; the record counts, per model, the requests
answered (:meth:`ForecastLog.answered`) and failed by kind, and the failure rows written or dropped, so the
failure rate is known even when rows were dropped. A request whose model is not known is counted under
``unattributed``. The record says its format (:data:`LOG_FORMAT`; absent: 1, written before requests and failures
were counted).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.live.log.failures import LoggedFailure, failure_partition, failure_rows
from distributed_onnx.live.log.layout import LoggedForecast, file_name, forecast_rows, partition, state_path
from distributed_onnx.live.log.throttled import ThrottledWarning
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.redact import redact_text

logger = logging.getLogger(__name__)

QUEUE_FULL = "queue_full"
WRITE_FAILED = "write_failed"
#: The log's format, in each writer's record: 2 counts requests answered and failed and writes the failures table
#: (:mod:`.failures`); a record without it (1) predates them, so its log says nothing of failures.
LOG_FORMAT = 2


class LogSink(Protocol):
    """Where the log's files go. The default writes through :mod:`distributed_onnx.storage`."""

    def write_table(self, location: Location, table: pa.Table) -> int: ...

    def write_bytes(self, location: Location, payload: bytes) -> int: ...


class StorageSink:
    """Atomic Parquet and JSON writes to a local folder or an object store (:mod:`distributed_onnx.storage`)."""

    def write_table(self, location: Location, table: pa.Table) -> int:
        storage.make_dirs(location.parent)  # the partition folder (a no-op on object stores)
        # lz4 as the backtest's parts (measured there: faster to write than zstd for slightly larger files).
        return storage.write_parquet(location, table, compression="lz4", use_dictionary=["series_id", "window_id"])

    def write_bytes(self, location: Location, payload: bytes) -> int:
        storage.make_dirs(location.parent)
        return storage.write_bytes(location, payload)


@dataclass
class ModelCounts:
    """Forecasts (windows) of one model, by outcome."""

    submitted: int = 0
    logged: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {QUEUE_FULL: 0, WRITE_FAILED: 0})
    rows_logged: int = 0
    shadow_failed: int = 0
    shadow_nonfinite: int = 0
    #: Requests this model answered, and those that failed by kind (:data:`.failures.KINDS`).
    requests_answered: int = 0
    requests_failed: dict[str, int] = field(default_factory=dict)
    #: Failure rows written to the failures table, and dropped (queue full, write failed).
    failures_logged: int = 0
    failures_dropped: int = 0

    def copy(self) -> ModelCounts:
        return replace(self, dropped=dict(self.dropped), requests_failed=dict(self.requests_failed))

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def pending(self) -> int:
        return self.submitted - self.logged - self.dropped_total


@dataclass(frozen=True)
class _Flush:
    done: threading.Event


_STOP = object()
#: The key under which requests whose model is not known are counted (the record's ``unattributed``).
_UNATTRIBUTED = ""


class ForecastLog:
    """The log of one process (a Serve replica): :meth:`submit` from any thread, :meth:`close` at exit."""

    def __init__(
        self,
        root: LocationLike,
        *,
        max_queued_windows: int = 100_000,
        max_batch_windows: int = 20_000,
        flush_interval_s: float = 1.0,
        warn_period_s: float = 60.0,
        sink: LogSink | None = None,
        writer_id: str | None = None,
    ) -> None:
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive (the writer wakes that often); got {flush_interval_s}")
        self.root = Location.parse(root)
        self.writer_id = writer_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.max_queued_windows = max_queued_windows
        self.max_batch_windows = max_batch_windows
        self.flush_interval_s = flush_interval_s
        self._sink: LogSink = sink or StorageSink()
        self._warning = ThrottledWarning(warn_period_s, log=logger)
        self._lock = threading.Lock()
        self._counts: dict[str, ModelCounts] = {}
        self._queued_windows = 0
        self._files_written = 0
        self._write_failures = 0
        self._last_error: str | None = None
        self._sequence = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._state_submitted = 0
        self._problems = 0  # shadow problems counted, so that a record with only those is written too
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"forecast-log-{self.writer_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ the request side

    def submit(self, item: LoggedForecast) -> bool:
        """Queue ``item`` for the log; False (and counted as dropped) when the queue is full or the log closed.

        Constant time, no I/O, never raises: safe to call from an event loop.
        """
        windows = item.n_windows
        with self._lock:
            counts = self._counts.setdefault(item.model, ModelCounts())
            counts.submitted += windows
            if self._closed or self._queued_windows + windows > self.max_queued_windows:
                counts.dropped[QUEUE_FULL] += windows
                full = True
            else:
                self._queued_windows += windows
                full = False
        if full:
            self._warning.warn(
                "Forecast log %s: queue full (%d forecasts waiting); dropping forecasts until the sink keeps up",
                self.root,
                self.max_queued_windows,
            )
            return False
        self._queue.put(item)
        if self._queued_windows >= self.max_batch_windows:
            self._wake.set()  # a full batch: write it now rather than at the next interval
        return True

    def shadow_problems(self, model: str, failed: int = 0, nonfinite: int = 0) -> None:
        """Count a shadow model's windows that failed, or that it forecast NaN or inf for (constant time)."""
        with self._lock:
            counts = self._counts.setdefault(model, ModelCounts())
            counts.shadow_failed += failed
            counts.shadow_nonfinite += nonfinite
            self._problems += failed + nonfinite

    def answered(self, model: str) -> None:
        """Count one request ``model`` answered: with the failed ones, the failure rate's denominator (O(1))."""
        with self._lock:
            self._counts.setdefault(model, ModelCounts()).requests_answered += 1
            self._problems += 1

    def submit_failure(self, item: LoggedFailure) -> bool:
        """Count a failed request and queue its row for the failures table; False when dropped (counted).

        Constant time, no I/O, never raises. A row takes one place of ``max_queued_windows``, so a flood of
        refused requests is bounded like a flood of forecasts.
        """
        with self._lock:
            counts = self._counts.setdefault(item.model or _UNATTRIBUTED, ModelCounts())
            counts.requests_failed[item.kind] = counts.requests_failed.get(item.kind, 0) + 1
            self._problems += 1
            if self._closed or self._queued_windows + 1 > self.max_queued_windows:
                counts.failures_dropped += 1
                return False
            self._queued_windows += 1
        self._queue.put(item)
        return True

    def counts(self) -> dict[str, ModelCounts]:
        """A snapshot of the counts per model."""
        with self._lock:
            return {model: c.copy() for model, c in self._counts.items() if model != _UNATTRIBUTED}

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Write everything submitted so far (or drop it, counted); False if that took longer than ``timeout_s``."""
        if not self._thread.is_alive():
            return False
        done = threading.Event()
        self._queue.put(_Flush(done))
        self._wake.set()
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread; later submits are dropped (counted)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._wake.set()
        self._thread.join(timeout_s)

    def state(self) -> dict[str, Any]:
        """The writer's record (what ``_log_state/<writer>.json`` holds)."""
        with self._lock:
            counts = {model: c.copy() for model, c in self._counts.items()}
        unattributed = counts.pop(_UNATTRIBUTED, None)
        with self._lock:
            return {
                "format": LOG_FORMAT,
                "writer_id": self.writer_id,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files_written": self._files_written,
                "write_failures": self._write_failures,
                "last_error": self._last_error,
                "queued_windows": self._queued_windows,
                "models": {
                    model: {
                        "submitted": c.submitted,
                        "logged": c.logged,
                        "dropped": c.dropped,
                        "pending": c.pending,
                        "rows_logged": c.rows_logged,
                        "shadow_failed": c.shadow_failed,
                        "shadow_nonfinite": c.shadow_nonfinite,
                        **_request_counts(c),
                    }
                    for model, c in counts.items()
                },
                "unattributed": _request_counts(unattributed or ModelCounts()),
            }

    # ------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        """Wake once per ``flush_interval_s`` (or when a batch is full, or on flush/close), take everything queued.

        Not once per submitted forecast: every wake-up of this thread takes the GIL from the replica's event loop,
        and at hundreds of requests a second per-item wake-ups cost the serving path more than the writes.
        """
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            messages = []
            while True:
                try:
                    messages.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [message for message in messages if isinstance(message, LoggedForecast)]
            failures = [message for message in messages if isinstance(message, LoggedFailure)]
            controls = [message for message in messages if not isinstance(message, LoggedForecast | LoggedFailure)]
            batch: list[LoggedForecast] = []
            windows = 0
            for item in items:
                batch.append(item)
                windows += item.n_windows
                if windows >= self.max_batch_windows:
                    self._write_batch(batch)
                    batch, windows = [], 0
            if batch:
                self._write_batch(batch)
            if failures:
                self._write_failure_rows(failures)
            if items or failures or controls or self._state_stale():
                self._write_state()  # the drops counted since the last batch reach the record too
            for message in controls:
                if isinstance(message, _Flush):
                    message.done.set()
            if any(message is _STOP for message in controls):
                return

    def _state_stale(self) -> bool:
        with self._lock:
            seen = sum(counts.submitted for counts in self._counts.values()) + self._problems
            stale = seen != self._state_submitted
            self._state_submitted = seen
        return stale

    def _write_batch(self, batch: list[LoggedForecast]) -> None:
        # One file per set of levels, native levels and context length: a file's columns and its records of
        # clamping and context are its own.
        groups: dict[tuple[str, str, tuple[float, ...], tuple[float, ...], int], list[LoggedForecast]] = {}
        for item in batch:
            key = (item.day, item.model, item.quantiles, item.native_quantiles, item.context_length)
            groups.setdefault(key, []).append(item)
        for (day, model, *_), items in groups.items():
            windows = sum(item.n_windows for item in items)
            try:
                table = forecast_rows(items)
                with self._lock:
                    sequence = self._sequence
                    self._sequence += 1
                name = file_name(min(item.request_time_us for item in items), self.writer_id, sequence)
                self._sink.write_table(partition(self.root, day, model) / name, table)
            except Exception as exc:  # any sink failure drops this group only; the thread must live on
                self._settle(model, windows, 0, WRITE_FAILED, redact_text(f"{type(exc).__name__}: {exc}"))
                self._warning.warn(
                    "Forecast log %s: writing failed (%s: %s); dropping these forecasts, counted, and retrying "
                    "with the next batch",
                    self.root,
                    type(exc).__name__,
                    exc,
                )
                continue
            self._settle(model, windows, table.num_rows, None, None)

    def _write_failure_rows(self, batch: list[LoggedFailure]) -> None:
        """One file of the failures table per (day, model) of the batch; a failed write drops its rows, counted."""
        groups: dict[tuple[str, str | None], list[LoggedFailure]] = {}
        for item in batch:
            groups.setdefault((item.day, item.model), []).append(item)
        for (day, model), items in groups.items():
            written = True
            try:
                table = failure_rows(items)
                with self._lock:
                    sequence = self._sequence
                    self._sequence += 1
                name = file_name(min(item.request_time_us for item in items), self.writer_id, sequence)
                self._sink.write_table(failure_partition(self.root, day, model) / name, table)
            except Exception as exc:  # as for forecasts: this group is dropped, counted; the thread lives on
                written = False
                self._warning.warn(
                    "Forecast log %s: writing failed requests failed (%s: %s); dropping these rows, counted",
                    self.root,
                    type(exc).__name__,
                    exc,
                )
            with self._lock:
                self._queued_windows -= len(items)
                counts = self._counts.setdefault(model or _UNATTRIBUTED, ModelCounts())
                if written:
                    counts.failures_logged += len(items)
                    self._files_written += 1
                else:
                    counts.failures_dropped += len(items)
                    self._write_failures += 1

    def _settle(self, model: str, windows: int, rows: int, reason: str | None, error: str | None) -> None:
        with self._lock:
            self._queued_windows -= windows
            counts = self._counts.setdefault(model, ModelCounts())
            if reason is None:
                counts.logged += windows
                counts.rows_logged += rows
                self._files_written += 1
            else:
                counts.dropped[reason] += windows
                self._write_failures += 1
                self._last_error = error

    def _write_state(self) -> None:
        try:
            payload = json.dumps(self.state(), indent=2, sort_keys=True).encode()
            self._sink.write_bytes(state_path(self.root, self.writer_id), payload)
        except Exception as exc:  # the record follows the sink: written again once it is back
            logger.debug("Forecast log %s: cannot write the state record: %s", self.root, redact_text(str(exc)))


def _request_counts(counts: ModelCounts) -> dict[str, Any]:
    """The record's request counts of one model: answered, failed by kind, failure rows written and dropped."""
    return {
        "requests_answered": counts.requests_answered,
        "requests_failed": dict(counts.requests_failed),
        "failures_logged": counts.failures_logged,
        "failures_dropped": counts.failures_dropped,
    }
