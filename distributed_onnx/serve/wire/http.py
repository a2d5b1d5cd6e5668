"""HTTP plumbing of the deployment, without Ray: the FastAPI app, body reading with a size limit, error mapping.

Every error leaves as ``{"error": "..."}`` with a 4xx naming the field or tensor (the Open Inference
Protocol's error shape), never a 500 for bad input:

==============================================  ====
malformed JSON                                  400
missing/extra field, wrong type, NaN/inf        422
bad tensor (datatype, shape, name, NaN)         422  (``InputValidationError``)
bad binary tensor data (sizes, header length)   422  (``InputValidationError``, naming the tensor)
other project error on the request (settings)   422  (``ConfigError``)
unknown model name, unknown route               404
body above ``max_body_bytes``                   413
backend closed                                  503
model failed on valid input                     500  (``InferenceError``; every request of a failed batch)
any other exception (a bug)                     500  (caught by the catch-all handler, still JSON)
overload (``max_queued_requests``)              503 + Retry-After (the replica's own admission check)
overload (``max_request_memory_bytes``)         503 + Retry-After (bodies' and responses' memory in flight)
one request needing more than that alone        413
value beyond float32 in a forecast history      422  (before the model call)
model's forecast NaN/inf for a request          422  (that request alone; readiness unaffected)
==============================================  ====
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from distributed_onnx.errors import (
    BackendClosedError,
    ConfigError,
    DistributedOnnxError,
    InferenceError,
    InputValidationError,
    describe_validation,
)
from distributed_onnx.redact import shown
from distributed_onnx.serve.wire.binary import HEADER_LENGTH, byte_count, slice_inputs, split_body
from distributed_onnx.serve.wire.schemas import InferRequest

ModelT = TypeVar("ModelT", bound=BaseModel)
T = TypeVar("T")
logger = logging.getLogger(__name__)


class HttpError(Exception):
    """An HTTP error with a status code and the message for ``{"error": ...}``."""

    def __init__(self, status_code: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code, message, headers)
        self.status_code = status_code
        self.message = message
        self.headers = headers


class ModelUnavailableError(HttpError):
    """A 503 for one model that did not load (its checkpoint is broken, or the repository does not answer).

    Apart from admission's 503: the failures table records it as kind ``load`` with ``cause`` (the error's class,
    or ``repository_unavailable``) as its reason, not as an overload.
    """

    def __init__(self, message: str, cause: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(503, message, headers)
        self.args = (message, cause, headers)
        self.cause = cause


def status_of(exc: BaseException) -> int:
    """The HTTP status an exception maps to (see the module docstring)."""
    if isinstance(exc, asyncio.CancelledError):
        return 499  # the client went away (nginx's code, which Serve's proxy uses too)
    if isinstance(exc, HttpError | StarletteHTTPException):
        return exc.status_code
    if isinstance(exc, RequestValidationError | InputValidationError | ConfigError):
        return 422
    if isinstance(exc, BackendClosedError):
        return 503
    if isinstance(exc, InferenceError):
        return 500
    if isinstance(exc, DistributedOnnxError):
        return 422
    return 500


def error_response(status_code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Every error body: its message as the CLI's error line shows one (:func:`~distributed_onnx.redact.shown`: no
    location's secret, no control byte a client's terminal would act on; a message may quote a file or a body)."""
    return JSONResponse({"error": shown(message)}, status_code=status_code, headers=headers)


class BodyCharge(Protocol):
    """Charges a body's memory before it is held (:class:`distributed_onnx.serve.operations.admission.Ticket`)."""

    def charge_body(self, body_bytes: int) -> None: ...


async def read_body(request: Request, max_body_bytes: int, charge: BodyCharge | None = None) -> bytes:
    """The request body, refusing (413) one above ``max_body_bytes`` by its Content-Length or as it streams.

    With ``charge``, the body's memory is charged from its Content-Length before a byte is read, and as it
    streams when it has none, so a replica that is full refuses (503) before it holds the body.
    """
    declared = byte_count(request.headers.get("content-length", ""))
    if declared is not None:
        if declared > max_body_bytes:
            raise HttpError(
                413, f"Request body is {declared} bytes, the limit is {max_body_bytes} bytes (max_body_bytes)."
            )
        if charge is not None:
            charge.charge_body(declared)
    chunks: list[bytes] = []
    size = 0
    request.state.body = "reading"  # for drained_on_refusal: what is left on the wire
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise HttpError(413, f"Request body exceeds the limit of {max_body_bytes} bytes (max_body_bytes).")
        if charge is not None:
            charge.charge_body(size)  # charges only what exceeds the declared size
        chunks.append(chunk)
    request.state.body = "read"
    return b"".join(chunks)


async def drained_on_refusal(request: Request, max_body_bytes: int, answer: Awaitable[T]) -> T:
    """``answer``, and when it is a refusal (503) of a body still unread, read that body off the wire first.

    A server that answers before reading a body and then closes the connection with the body's bytes unread
    makes the kernel reset it, and the client loses the answer with it (nearly every one of many concurrent
    large uploads saw "connection reset" instead of its 503). So the rest of the body is read and dropped, one
    chunk at a time (never held), up to ``max_body_bytes``. Not with ``Expect: 100-continue``: such a client sends
    the body only after the server's go (``100 Continue``, sent when the body is first read), so none is coming.
    """
    try:
        return await answer
    except HttpError as exc:
        if exc.status_code == 503 and request.headers.get("expect", "").lower() != "100-continue":
            await _drain(request, max_body_bytes)
        raise


async def _drain(request: Request, max_body_bytes: int) -> None:
    declared = byte_count(request.headers.get("content-length", ""))
    if getattr(request.state, "body", None) == "read" or (declared is not None and declared > max_body_bytes):
        return
    seen = 0
    while seen <= max_body_bytes:
        message = await request.receive()
        if message["type"] != "http.request":
            return  # the client went away
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def parse_body(body: bytes, model: type[ModelT]) -> ModelT:
    """Validate a JSON body: 400 for malformed JSON, 422 naming each offending field otherwise.

    Parsed by pydantic's own JSON parser straight into the model: for a 64-series request several times faster
    than ``json.loads`` plus validation (profiled when this was chosen).
    """
    if not body.strip():
        raise HttpError(400, "Request body is empty; send a JSON object.")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        invalid = next((error for error in errors if error["type"] == "json_invalid"), None)
        if invalid is not None:
            raise HttpError(400, f"Request body is not valid JSON: {invalid['msg']}") from None
        if any(error["type"] == "model_type" and not error["loc"] for error in errors):
            raise HttpError(422, "Request body must be a JSON object.") from None
        raise HttpError(422, describe_validation(errors, root="body")) from None


def parse_infer_request(body: bytes, header_length: str | None) -> tuple[InferRequest, list[bytes | None] | None]:
    """A v2 infer request and, when sent with the binary extension, each input's raw bytes (``None``: JSON).

    ``header_length`` is the request's ``Inference-Header-Content-Length`` (``None``: a plain JSON body); the
    size limit has applied to the whole body, JSON header and binary data together.
    """
    if header_length is None:
        return parse_body(body, InferRequest), None
    header, payload = split_body(body, header_length)
    parsed = parse_body(header, InferRequest)
    return parsed, slice_inputs(parsed.inputs, payload)


def infer_response(body: bytes, header_length: int | None) -> Response:
    """A v2 infer response: JSON, or a JSON header of ``header_length`` bytes followed by binary outputs."""
    if header_length is None:
        return Response(body, media_type="application/json")
    return Response(body, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)})


def install_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": ...}`` with the status of :func:`status_of`."""

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, HttpError):
            return error_response(exc.status_code, exc.message, exc.headers)
        assert isinstance(exc, StarletteHTTPException)
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, describe_validation(exc.errors(), root="body"))

    async def on_project_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(status_of(exc), str(exc))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still JSON, naming the exception, so no client ever has to parse a text 500.
        logger.exception("Unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, f"Internal error ({type(exc).__name__}): {exc}")

    app.add_exception_handler(HttpError, on_http_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(DistributedOnnxError, on_project_error)
    app.add_exception_handler(Exception, on_unexpected)


def json_body(model: type[BaseModel], examples: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body that the route reads itself (to enforce the size limit first).

    ``examples``: named OpenAPI example objects (``{"name": {"summary": ..., "value": body}}``), which Swagger UI
    offers in a list and puts in the editor of "Try it out" (what FastAPI's ``openapi_examples`` writes for a body
    it parses itself).
    """
    media: dict[str, Any] = {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
    if examples:
        media["examples"] = examples
    return {"requestBody": {"required": True, "content": {"application/json": media}}}


def install_openapi_models(app: FastAPI, models: list[type[BaseModel]], first_paths: tuple[str, ...] = ()) -> None:
    """Add ``models`` (and the models they use) to the OpenAPI components, for :func:`json_body` references, and
    list ``first_paths`` first (Swagger UI shows the paths in the document's order, which is otherwise the order
    the routes were declared in)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        paths = document.get("paths", {})
        document["paths"] = {path: paths[path] for path in first_paths if path in paths} | paths
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
