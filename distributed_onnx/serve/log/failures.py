"""Requests that failed, into the forecast log's failures table: what kind of failure, why, for which model.

The routes wrap each request in :meth:`FailureLog.watch`; an exception leaving it (the 4xx of validation, the
503 of admission, a model's 500, anything else) is classified by :func:`classify` from the exception and the
HTTP status of the shared mapping (:func:`distributed_onnx.serve.wire.http.status_of`), turned into a row
(:class:`~distributed_onnx.live.log.failures.LoggedFailure`: a short reason code, the error's one-line
message with URLs redacted, never the body) and handed to the log's queue, then re-raised unchanged: the
client gets exactly the answer it would have got without the log. Recording is a few string operations and a
queue put (constant time: the file is written by the log's thread, off the event loop), and it can never
change the answer: any error while recording is counted, warned about at most once a minute, and swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from distributed_onnx.errors import BackendClosedError, InferenceError
from distributed_onnx.live.log.failures import (
    ADMISSION,
    CANCELLED,
    INTERNAL,
    LOAD,
    MODEL_ERROR,
    VALIDATION,
    LoggedFailure,
)
from distributed_onnx.live.log.writer import ForecastLog, ThrottledWarning
from distributed_onnx.serve.log.traffic import now_us
from distributed_onnx.serve.wire.grpc_api import grpc_code
from distributed_onnx.serve.wire.http import HttpError, ModelUnavailableError, status_of

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: HTTP status -> the reason code of a request refused as invalid.
_VALIDATION_REASONS = {
    400: "malformed_request",
    404: "unknown_model",
    408: "timed_out",
    413: "too_large",
    422: "invalid_input",
}


def classify(exc: BaseException) -> tuple[str, str, int]:
    """The (kind, reason, HTTP status) of the failure ``exc`` is (kinds: :data:`~.failures.KINDS`)."""
    status = status_of(exc)
    if isinstance(exc, asyncio.CancelledError) or status == 499:
        return CANCELLED, "client_cancelled", status
    if isinstance(exc, BackendClosedError):
        return MODEL_ERROR, "backend_closed", status
    if isinstance(exc, InferenceError):
        return MODEL_ERROR, "model_failed", status
    if isinstance(exc, ModelUnavailableError):  # a repository model that did not load: not an overload
        return LOAD, exc.cause, status
    if status == 503 and isinstance(exc, HttpError):  # the replica's admission: requests or memory in flight
        return ADMISSION, "overloaded", status
    if 400 <= status < 500:
        return VALIDATION, _VALIDATION_REASONS.get(status, f"http_{status}"), status
    return INTERNAL, "internal_error", status


def _message(exc: BaseException) -> str:
    if isinstance(exc, HttpError):
        return exc.message
    if isinstance(exc, asyncio.CancelledError):
        return "the request was cancelled before its answer"
    return str(exc) or type(exc).__name__


class FailureLog:
    """A replica's recorder of failed requests (nothing is recorded without a forecast log)."""

    def __init__(self, log: ForecastLog | None, warn_period_s: float = 60.0) -> None:
        self.log = log
        #: Failures that could not be recorded (a bug here, never the client's answer): counted, warned about.
        self.unrecorded = 0
        self._warning = ThrottledWarning(warn_period_s)

    async def watch(
        self,
        answer: Awaitable[T],
        *,
        protocol: str,
        endpoint: str,
        model: Callable[[], str | None],
        request_id: Callable[[], str],
        received_us: int | None = None,
    ) -> T:
        """``answer``'s result; when it raises, the failure is recorded and the same exception re-raised.

        ``model`` and ``request_id`` are read only on failure (the model may become known while the request runs).
        """
        received = now_us() if received_us is None else received_us
        try:
            return await answer
        except BaseException as exc:
            self.record(exc, protocol=protocol, endpoint=endpoint, model=model, request_id=request_id, at_us=received)
            raise

    def record(
        self,
        exc: BaseException,
        *,
        protocol: str,
        endpoint: str,
        model: Callable[[], str | None],
        request_id: Callable[[], str],
        at_us: int,
    ) -> None:
        """Hand ``exc``'s row to the log; never raises (a failure to record must not change the answer)."""
        if self.log is None:
            return
        try:
            kind, reason, status = classify(exc)
            row = LoggedFailure(
                request_time_us=at_us,
                request_id=request_id(),
                model=model(),
                kind=kind,
                reason=reason,
                message=_message(exc),
                status=status,
                protocol=protocol,
                endpoint=endpoint,
                grpc_status=grpc_code(status).name if protocol == "grpc" else None,
            ).bounded()
            self.log.submit_failure(row)
        except Exception as problem:  # the answer stands as it is; the record is what is lost
            self.unrecorded += 1
            self._warning.warn("A failed request could not be recorded: %s: %s", type(problem).__name__, problem)
