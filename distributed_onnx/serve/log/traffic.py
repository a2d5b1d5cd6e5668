"""What a replica does once a forecast is answered: log it, run the shadow models on it, count both.

Nothing here is on the request's path: the route hands over the parsed request and the forecasts it answered
with (references, no copies) and :meth:`LiveTraffic.answered` schedules the rest as a task on the replica's
event loop, which runs after the handler has returned its response. A KServe v2 infer request hands over a
function instead (:meth:`LiveTraffic.answered_later`), which turns its tensors into the same request and
forecasts inside that task (:mod:`distributed_onnx.serve.log.infer_windows`). The task builds the log rows' inputs
(:class:`~distributed_onnx.live.log.layout.LoggedForecast`; the rows themselves are built by the log's
writer thread), then asks each shadow model for its forecast of the same request, in that model's own thread,
and logs it with role ``shadow``. A shadow that fails (a horizon it cannot emit, a broken session) is counted
per model and window (``/metrics`` and the log's record) and reported at most once per minute; one whose
forecasts hold NaN or inf is logged as it is and counted too; the client never sees either. The Python work of
the task (the v2 request's windows, the log's inputs, a shadow's plan) runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np

from distributed_onnx.live.log.layout import MAX_REQUEST_ID_CHARS, LoggedForecast, Role
from distributed_onnx.live.log.throttled import ThrottledWarning
from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.wire.forecasting import window_origin
from distributed_onnx.serve.wire.schemas import ForecastRequest

logger = logging.getLogger(__name__)

#: Why a shadow's windows were not forecast (``/metrics`` reason, the log's ``shadow_failed``), or not finitely.
SHADOW_ERROR = "error"
SHADOW_NONFINITE = "nonfinite"
#: The request header whose value becomes the log's ``request_id`` (a fresh UUID when absent).
REQUEST_ID_HEADER = "x-request-id"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

#: What the log and the shadows take of an answered request: the request (series, starts), the forecasts
#: ``[series, horizon, quantiles]`` and their levels; ``None`` when there is nothing to log.
Served = tuple[ForecastRequest, np.ndarray, tuple[float, ...]]


class LoggedModel(Protocol):
    """What the log records of a model: its name, its checkpoint's digest, its time step, its native levels
    (which of a request's levels it served clamped: the log's record of them) and its context length (the
    history ``score``'s seasonal-quantile baseline looks back over, as a backtest's does)."""

    @property
    def name(self) -> str: ...

    @property
    def checkpoint_sha256(self) -> str: ...

    @property
    def resolution_minutes(self) -> int: ...

    @property
    def native_quantiles(self) -> tuple[float, ...]: ...

    @property
    def context_length(self) -> int: ...


class ShadowModel(LoggedModel, Protocol):
    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        """The model's forecasts ``[series, horizon, quantiles]`` of ``request`` and their levels."""
        ...


def request_id(header: str | None) -> str:
    """The client's request id when it sent one (cut to :data:`MAX_REQUEST_ID_CHARS`), else a fresh one.

    Data only: the log's window ids come from the key :meth:`LiveTraffic.answered_later` draws per request.
    """
    return header[:MAX_REQUEST_ID_CHARS] if header else uuid.uuid4().hex


def origins_us(request: ForecastRequest, resolution_minutes: int) -> list[int | None]:
    """Each series' origin (:func:`~distributed_onnx.serve.wire.forecasting.window_origin`) in microseconds, None
    without ``start``."""
    origins = (window_origin(series, resolution_minutes) for series in request.series)
    return [None if origin is None else (origin - _EPOCH) // _MICROSECOND for origin in origins]


@dataclass(frozen=True)
class RequestStamp:
    """Who asked and when: the client's id (data), the time received, and the server's key of the request."""

    request_id: str
    request_time_us: int
    #: The log's name for the request's windows (:func:`~distributed_onnx.live.log.layout.window_id`), drawn
    #: by the server; empty: derived from ``request_id`` (see :class:`LoggedForecast`).
    key: str = ""


def logged_forecast(
    model: LoggedModel,
    role: Role,
    request: ForecastRequest,
    forecasts: np.ndarray,
    quantiles: Sequence[float],
    stamp: RequestStamp,
) -> LoggedForecast:
    return LoggedForecast(
        model=model.name,
        checkpoint_sha256=model.checkpoint_sha256,
        role=role,
        request_id=stamp.request_id,
        request_time_us=stamp.request_time_us,
        resolution_minutes=model.resolution_minutes,
        series_ids=[series.series_id for series in request.series],
        origins_us=origins_us(request, model.resolution_minutes),
        quantiles=tuple(quantiles),
        forecasts=forecasts,
        request_key=stamp.key,
        native_quantiles=tuple(model.native_quantiles),
        context_length=model.context_length,
    )


def in_shadow_sample(request_id: str, fraction: float) -> bool:
    """Whether the shadows forecast this request: a hash of its id below ``fraction`` of the hash range.

    Drawn from the id rather than at random, so a request replayed with its id is drawn the same way, in every
    replica; CRC-32 is uniform enough over ids for a share (and costs nothing next to a forecast).
    """
    if fraction >= 1.0:
        return True
    return zlib.crc32(request_id.encode()) < fraction * 2**32


class LiveTraffic:
    """The replica's after-the-answer work: the forecast log, the shadow models, the live counters."""

    def __init__(
        self,
        log: ForecastLog | None,
        metrics: LiveMetrics,
        shadows: Sequence[ShadowModel] = (),
        warn_period_s: float = 60.0,
        max_pending: int = 64,
        shadow_fraction: float = 1.0,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.shadows = list(shadows)
        #: The share of requests the shadows forecast (:func:`in_shadow_sample`: drawn from the request id).
        self.shadow_fraction = shadow_fraction
        #: Answers whose after-work may wait at once; beyond it a request's shadows are skipped (counted), so a
        #: shadow slower than the traffic cannot pile up work (and memory) without bound.
        self.max_pending = max_pending
        self.shadow_failures = 0
        self._warning = ThrottledWarning(warn_period_s)
        self._tasks: set[asyncio.Task[None]] = set()

    def answered(
        self,
        model: LoggedModel,
        request: ForecastRequest,
        forecasts: np.ndarray,
        quantiles: Sequence[float],
        request_id: str,
        request_time_us: int,
    ) -> None:
        """Count a served forecast and schedule its logging and shadows (call from the event loop; returns at once)."""
        served: Served = (request, forecasts, tuple(quantiles))
        self.answered_later(model, int(forecasts.shape[0]), lambda: served, request_id, request_time_us)

    def answered_later(
        self,
        model: LoggedModel,
        windows: int,
        served: Callable[[], Served | None],
        request_id: str,
        request_time_us: int,
    ) -> None:
        """:meth:`answered` for a request whose log view ``served()`` builds after the answer (``windows``: its
        forecasts, counted now); a ``served`` that fails or returns None logs and shadows nothing."""
        self.metrics.served(model.name, windows)
        if self.log is not None:
            self.log.answered(model.name)  # the failure rate's denominator (with the failed requests)
        if self.log is None and not self.shadows:
            return
        shadows = [shadow for shadow in self.shadows if shadow.name != model.name]
        if shadows and not in_shadow_sample(request_id, self.shadow_fraction):
            shadows = []
        if shadows and len(self._tasks) >= self.max_pending:
            for shadow in shadows:
                self.metrics.shadow_skipped(shadow.name, windows)
            shadows = []
        # The windows' key in the log: drawn here, once per answered request, shared by its primary and shadows.
        stamp = RequestStamp(request_id, request_time_us, uuid.uuid4().hex)
        task = asyncio.get_running_loop().create_task(self._after(model, shadows, served, stamp))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the scheduled work (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _after(
        self,
        model: LoggedModel,
        shadows: Sequence[ShadowModel],
        served: Callable[[], Served | None],
        stamp: RequestStamp,
    ) -> None:
        """Log the answer, then each shadow's forecast of it; the Python work in a thread, off the event loop.

        Building a v2 request's windows as a /v1 request, the log's inputs and a shadow's plan cost about a
        millisecond per thousand values; on the loop they stalled every other request for that long.
        """
        await asyncio.sleep(0)  # let the handler's response go first
        try:
            request = await asyncio.to_thread(self._log_served, model, served, stamp)
        except Exception as exc:  # the answer has gone; what it was cannot be logged
            self._warning.warn("An answer of %s could not be logged: %s: %s", model.name, type(exc).__name__, exc)
            return
        if request is None:
            return
        for shadow in shadows:
            try:
                shadow_forecasts, shadow_levels = await shadow.shadow_forecast(request)
            except Exception as exc:  # a shadow never fails a request, nor the replica
                windows = len(request.series)
                self.shadow_failures += 1
                self.metrics.shadow_failed(shadow.name, windows, SHADOW_ERROR)
                if self.log is not None:
                    self.log.shadow_problems(shadow.name, failed=windows)
                self._warning.warn("Shadow model %s failed on a request: %s: %s", shadow.name, type(exc).__name__, exc)
                continue
            await asyncio.to_thread(self._log_shadow, shadow, request, shadow_forecasts, shadow_levels, stamp)

    def _log_served(
        self, model: LoggedModel, served: Callable[[], Served | None], stamp: RequestStamp
    ) -> ForecastRequest | None:
        """The answer's request as the shadows take it, its forecasts submitted to the log (in a thread)."""
        found = served()
        if found is None:
            return None
        request, forecasts, quantiles = found
        if self.log is not None:
            self.log.submit(logged_forecast(model, "served", request, forecasts, quantiles, stamp))
        return request

    def _log_shadow(
        self,
        shadow: ShadowModel,
        request: ForecastRequest,
        forecasts: np.ndarray,
        levels: tuple[float, ...],
        stamp: RequestStamp,
    ) -> None:
        """Count a shadow's forecasts (its NaN or inf windows apart) and submit them all to the log (in a thread).

        Non-finite windows are logged as they are: ``score`` leaves them out of the pairs and counts them, as a
        backtest does with a checkpoint's non-finite forecasts; the count here says so before any scoring.
        """
        windows = int(forecasts.shape[0])
        nonfinite = int((~np.isfinite(forecasts.reshape(windows, -1)).all(axis=1)).sum())
        self.metrics.shadow(shadow.name, windows)
        if nonfinite:
            self.metrics.shadow_failed(shadow.name, nonfinite, SHADOW_NONFINITE)
        if self.log is not None:
            if nonfinite:
                self.log.shadow_problems(shadow.name, nonfinite=nonfinite)
            self.log.submit(logged_forecast(shadow, "shadow", request, forecasts, levels, stamp))
