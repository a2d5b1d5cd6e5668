"""KServe v2 over gRPC <-> the HTTP path's own tensor checks: requests in, responses and status codes out.

Pure code. A ``ModelInferRequest``'s inputs become the same :class:`InferInputTensor` models the HTTP route
parses (typed ``contents`` as ``data``, ``raw_input_contents`` as binary data), so
:func:`distributed_onnx.serve.wire.protocol.decode_inputs` applies the same validation and the same messages; the
errors map to gRPC status codes the way Triton maps them. Outputs go back as ``raw_output_contents`` (what
Triton sends and ``tritonclient.grpc`` reads), little-endian and row-major.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from distributed_onnx.errors import BackendClosedError, InferenceError, InputValidationError
from distributed_onnx.runtime import ray_private
from distributed_onnx.serve.wire.grpc_messages import ModelInferResponse, ModelMetadataResponse, UndecodableRequest
from distributed_onnx.serve.wire.http import HttpError, status_of
from distributed_onnx.serve.wire.protocol import datatype_of
from distributed_onnx.serve.wire.schemas import InferInputTensor, ModelMetadata, RequestedOutput

#: HTTP status of the shared error mapping -> gRPC status code.
GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # what gRPC itself answers for a message above its limit
    422: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
}

# v2 datatype -> the typed contents field that carries it (FP16/BF16 have none: raw only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


logger = logging.getLogger(__name__)

#: Ray Serve's setting of its gRPC servers' message limit (send and receive; 2 GiB by default), read from the
#: environment when Serve's processes start: the proxy's and the direct-ingress replicas' servers. gRPC refuses a
#: larger message (RESOURCE_EXHAUSTED) before it is parsed.
MESSAGE_LIMIT_VARIABLE = ray_private.GRPC_MAX_MESSAGE_SIZE


def message_limit_environment(max_body_bytes: int) -> dict[str, str]:
    """The environment that limits Serve's gRPC messages to ``max_body_bytes`` (set before Ray starts)."""
    return {MESSAGE_LIMIT_VARIABLE: str(max_body_bytes)}


def message_limit() -> int | None:
    """The gRPC message limit Serve's servers in this process use, when set (else Ray's 2 GiB)."""
    value = os.environ.get(MESSAGE_LIMIT_VARIABLE, "")
    return int(value) if value.isdigit() else None


def warn_if_grpc_unbounded(max_body_bytes: int) -> None:
    """Say once per replica when gRPC parses messages larger than the body limit (a cluster set up elsewhere)."""
    limit = message_limit()
    if limit is None or limit > max_body_bytes:
        logger.warning(
            "gRPC messages up to %s bytes are received and parsed before the body limit of %d bytes applies; "
            "start Ray with %s=%d (distributed-onnx serve does this on its embedded Ray).",
            limit or "2 GiB",
            max_body_bytes,
            MESSAGE_LIMIT_VARIABLE,
            max_body_bytes,
        )


def grpc_code(http_status: int) -> grpc.StatusCode:
    return GRPC_CODES.get(http_status, grpc.StatusCode.INTERNAL)


def check_decoded(request: Any) -> None:
    """Refuse (400: INVALID_ARGUMENT) a request whose bytes were not its protobuf message."""
    if isinstance(request, UndecodableRequest):
        raise HttpError(400, f"The {request.method} request is not a protobuf message of its type ({request.error}).")


async def grpc_call(context: Any, empty: Any, handler: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run a gRPC method; an error sets the status code (as Triton's) and the same message as over HTTP."""
    try:
        return await handler(*args)
    except Exception as exc:
        if status_of(exc) >= 500 and not isinstance(exc, HttpError | InferenceError | BackendClosedError):
            logger.exception("Unexpected error in a gRPC call")
        context.set_code(grpc_code(status_of(exc)))
        context.set_details(exc.message if isinstance(exc, HttpError) else f"{exc}")
        return empty


def check_response_fits(response: Any) -> None:
    """Refuse (RESOURCE_EXHAUSTED, naming the sizes) a response above the gRPC message limit, which gRPC would drop."""
    limit = message_limit()
    size = response.ByteSize()
    if limit is not None and size > limit:
        raise HttpError(
            413,
            f"The response is {size} bytes, above the gRPC message limit of {limit} bytes (max_body_bytes); "
            "send fewer rows per request.",
        )


def infer_inputs(request: Any) -> tuple[list[InferInputTensor], list[bytes | None] | None]:
    """The request's inputs as the HTTP path's tensors, and their raw bytes (``None`` when sent as contents)."""
    raw_contents = list(request.raw_input_contents)
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InputValidationError(
            f"raw_input_contents has {len(raw_contents)} entries for {len(request.inputs)} inputs; "
            "send one per input, in input order, or none."
        )
    tensors = []
    for index, tensor in enumerate(request.inputs):
        fields: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if not raw_contents:
            field = _CONTENTS.get(tensor.datatype)
            fields["data"] = list(getattr(tensor.contents, field)) if field else None
        tensors.append(_validated(fields, index))
    if not tensors:
        raise InputValidationError("inputs: the request has no input tensors.")
    return tensors, (list(raw_contents) if raw_contents else None)


def request_parameters(request: Any) -> dict[str, Any]:
    """The request's ``parameters`` map as plain values (``InferParameter`` holds one of bool, int, double, str)."""
    found: dict[str, Any] = {}
    for key, value in request.parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            found[key] = getattr(value, choice)
    return found


def requested_outputs(request: Any) -> list[RequestedOutput] | None:
    return [RequestedOutput(name=output.name) for output in request.outputs] or None


def model_infer_response(model: str, request_id: str, outputs: Mapping[str, np.ndarray], names: Sequence[str]) -> Any:
    """A ``ModelInferResponse`` with every output as raw little-endian bytes."""
    response = ModelInferResponse(model_name=model, id=request_id)
    for name in names:
        value = np.asarray(outputs[name])
        response.outputs.add(name=name, datatype=datatype_of(value.dtype), shape=list(value.shape))
        response.raw_output_contents.append(value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes())
    return response


def metadata_response(metadata: ModelMetadata) -> Any:
    response = ModelMetadataResponse(name=metadata.name, versions=metadata.versions, platform=metadata.platform)
    for target, tensors in ((response.inputs, metadata.inputs), (response.outputs, metadata.outputs)):
        for tensor in tensors:
            target.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    return response


def _validated(fields: dict[str, Any], index: int) -> InferInputTensor:
    from pydantic import ValidationError

    from distributed_onnx.errors import describe_validation

    try:
        return InferInputTensor.model_validate(fields)
    except ValidationError as exc:
        errors = [{**error, "loc": ("inputs", index, *error["loc"])} for error in exc.errors()]
        raise InputValidationError(describe_validation(errors)) from None
