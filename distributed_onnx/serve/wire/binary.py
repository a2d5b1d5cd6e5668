"""Triton's binary tensor data extension of the Open Inference Protocol: framing of requests and responses.

Existing clients must work unchanged, and ``tritonclient.http`` sends inputs and asks for outputs as binary by
default (JSON lists of floats are also several times larger and slower to parse). With the extension a body is a JSON
header of ``Inference-Header-Content-Length`` bytes followed by the raw bytes of the tensors that carry
``parameters.binary_data_size``, in tensor order: row-major, little-endian, of the declared datatype.

Pure code: the framing is checked here (header length, each size against shape and datatype, sizes summing to
exactly the bytes sent) so every mistake is an :class:`InputValidationError` (a 4xx) naming the tensor; the
values are then checked like JSON data by :func:`distributed_onnx.serve.wire.protocol.decode_inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pydantic_core

from distributed_onnx.errors import InputValidationError
from distributed_onnx.serve.wire.protocol import check_shape, datatype_of, encode_outputs, input_error, numpy_dtype
from distributed_onnx.serve.wire.schemas import InferInputTensor, InferRequest

#: Request and response header giving the size in bytes of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: Server metadata's name of the extension (as Triton reports it).
EXTENSION = "binary_tensor_data"


def byte_count(text: str) -> int | None:
    """``text`` as a byte count (ASCII digits only), else None.

    Not ``str.isdigit`` alone: it accepts ``²`` and other Unicode digits that ``int`` then refuses.
    """
    stripped = text.strip()
    return int(stripped) if stripped.isascii() and stripped.isdigit() else None


def split_body(body: bytes, header_length: str) -> tuple[bytes, bytes]:
    """The JSON header and the binary part of a request body sent with ``Inference-Header-Content-Length``."""
    size = byte_count(header_length)
    if size is None:
        raise InputValidationError(f"{HEADER_LENGTH} must be a byte count, got {header_length!r}.")
    if size == 0 or size > len(body):
        raise InputValidationError(
            f"{HEADER_LENGTH} is {size} bytes but the request body has {len(body)} bytes; "
            "the JSON header must be a non-empty prefix of the body."
        )
    return body[:size], body[size:]


def slice_inputs(tensors: Sequence[InferInputTensor], payload: bytes) -> list[bytes | None]:
    """Each input's raw bytes (``None`` for a JSON input), checking every ``binary_data_size``.

    A size is checked against the tensor's shape and datatype first, so a wrong size is reported on its own
    tensor rather than as a shortfall or surplus at the end of the body.
    """
    raw: list[bytes | None] = []
    offset = 0
    binary_names: list[str] = []
    for tensor in tensors:
        size = binary_size(tensor)
        if size is None:
            raw.append(None)
            continue
        name = tensor.name
        if tensor.data is not None:
            raise InputValidationError(f"Input {name!r} has both 'data' and binary_data_size; send one.", tensor=name)
        dtype = numpy_dtype(tensor)
        expected = check_shape(tensor) * dtype.itemsize
        if size != expected:
            takes = f"shape {tensor.shape} of {tensor.datatype} takes {expected} bytes ({dtype.itemsize} per value)"
            raise input_error(name, f"binary_data_size is {size} bytes, {takes}.")
        if offset + size > len(payload):
            left = f"({len(payload) - offset} binary bytes left for it)"
            raise input_error(name, f"binary_data_size {size} runs past the end of the body {left}.")
        raw.append(payload[offset : offset + size])
        binary_names.append(name)
        offset += size
    if offset != len(payload):
        raise InputValidationError(
            f"The body has {len(payload) - offset} bytes after the binary data of input(s) {binary_names} "
            f"({offset} bytes in all by their binary_data_size); {HEADER_LENGTH} or a size is wrong.",
            tensor=binary_names[-1] if binary_names else None,
        )
    return raw


def binary_size(tensor: InferInputTensor) -> int | None:
    """The tensor's ``parameters.binary_data_size``, or ``None`` when its data is JSON."""
    value = (tensor.parameters or {}).get("binary_data_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise input_error(tensor.name, f"binary_data_size must be a byte count, got {value!r}.")
    return value


def binary_outputs(request: InferRequest, names: Sequence[str]) -> set[str]:
    """The outputs to send as binary: those asking ``binary_data``, else all if ``binary_data_output``.

    As in Triton, a requested output's own ``binary_data`` overrides the request-wide default.
    """
    default = _flag(request.parameters, "binary_data_output", "Request parameter")
    chosen = set(names) if default else set()
    for output in request.outputs or ():
        if output.parameters and "binary_data" in output.parameters:
            if _flag(output.parameters, "binary_data", f"Output {output.name!r}: parameter"):
                chosen.add(output.name)
            else:
                chosen.discard(output.name)
    return chosen


def encode_response(
    document: Mapping[str, Any], outputs: Mapping[str, np.ndarray], names: Sequence[str], binary: set[str]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output is binary (``None``: plain JSON).

    ``document`` holds every field but ``outputs``. JSON outputs are encoded as without the extension.
    """
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name in names:
        value = np.asarray(outputs[name])
        if name not in binary:
            tensors.append(encode_outputs({name: value}, [name])[0].model_dump())
            continue
        data = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()  # C order
        tensors.append(
            {
                "name": name,
                "shape": list(value.shape),
                "datatype": datatype_of(value.dtype),
                "parameters": {"binary_data_size": len(data)},
            }
        )
        chunks.append(data)
    header = pydantic_core.to_json({**document, "outputs": tensors})  # far faster than json.dumps
    if not binary:
        return header, None
    return b"".join([header, *chunks]), len(header)


def _flag(parameters: Mapping[str, Any] | None, key: str, where: str) -> bool:
    value = (parameters or {}).get(key, False)
    if not isinstance(value, bool):
        raise InputValidationError(f"{where} {key!r} must be true or false, got {value!r}.")
    return value
