"""What a failed request's exception means on the wire (kind, reason, status, gRPC code): the serving side's
half of the failure records, whose one home is :mod:`distributed_onnx.live.log.failures` (it knows no HTTP)."""

from __future__ import annotations

import asyncio

from distributed_onnx.errors import BackendClosedError, InferenceError
from distributed_onnx.live.log.failures import (
    ADMISSION,
    CANCELLED,
    INTERNAL,
    LOAD,
    MODEL_ERROR,
    VALIDATION,
    FailureCause,
)
from distributed_onnx.serve.wire.grpc_api import grpc_code
from distributed_onnx.serve.wire.http import HttpError, ModelUnavailableError, status_of

#: HTTP status -> the reason code of a request refused as invalid.
_VALIDATION_REASONS = {
    400: "malformed_request",
    404: "unknown_model",
    408: "timed_out",
    413: "too_large",
    422: "invalid_input",
}


def classify(exc: BaseException) -> tuple[str, str, int]:
    """The (kind, reason, HTTP status) of the failure ``exc`` is (kinds: the log's ``KINDS``)."""
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


def describe(exc: BaseException, protocol: str) -> FailureCause:
    """``exc`` as a row of the failures table describes it (``protocol``: ``http`` or ``grpc``)."""
    kind, reason, status = classify(exc)
    grpc_status = grpc_code(status).name if protocol == "grpc" else None
    return FailureCause(kind, reason, status, _message(exc), grpc_status)
