"""Open Inference Protocol (KServe v2) tensors <-> numpy, checked against the model's tensor specs.

Pure code (numpy and the backend's :class:`TensorSpec` only): every message names the tensor, what the model
takes and what was sent, and every problem is an :class:`InputValidationError`, which the HTTP layer turns
into a 4xx. Names, ranks, fixed dimensions and shared symbolic axes are then checked once more by the
backend's own validation, the same code the backtest's batches pass through; which values may be NaN or
infinite is the model family's rule, applied by the route through the family's adapter. Data comes as JSON
``data`` or, with Triton's binary tensor data extension, as raw bytes that :mod:`distributed_onnx.serve.wire.binary`
cut out of the body; both go through the same checks here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from distributed_onnx.errors import InputValidationError
from distributed_onnx.model.backend.validation import TensorSpec, validate_inputs
from distributed_onnx.serve.wire.schemas import InferInputTensor, InferOutputTensor, RequestedOutput, TensorMetadata

#: v2 datatype -> numpy dtype; the inverse names a model's tensors in ``GET /v2/models/{name}``.
DATATYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(dtype)
    for name, dtype in {
        "BOOL": np.bool_,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
    }.items()
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items()}

# Which kinds of JSON values each numpy kind accepts ("b" bool, "i"/"u" integers, "f" floats).
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The v2 datatype of a numpy dtype (``float32`` -> ``FP32``)."""
    try:
        return _BY_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise InputValidationError(f"numpy dtype {dtype} has no Open Inference Protocol datatype") from None


def numpy_dtype(tensor: InferInputTensor) -> np.dtype[Any]:
    """The numpy dtype of an input's datatype; BYTES and BF16 are refused naming the tensor (no model takes them)."""
    try:
        return DATATYPES[tensor.datatype]
    except KeyError:
        supported = f"this server takes {sorted(DATATYPES)} tensors"
        raise input_error(tensor.name, f"datatype {tensor.datatype} is not supported; {supported}.") from None


def tensor_metadata(spec: TensorSpec) -> TensorMetadata:
    """A graph tensor as ``GET /v2/models/{name}`` describes it (-1 for a dynamic axis)."""
    shape = [dim if isinstance(dim, int) else -1 for dim in spec.shape]
    return TensorMetadata(name=spec.name, datatype=datatype_of(spec.dtype), shape=shape)


def check_shape(tensor: InferInputTensor) -> int:
    """The number of values ``tensor``'s shape holds, refusing a shape that holds none.

    Checked before any array is built: a zero on one axis lets any other axis be as large as a client likes
    (``[0, 10**30]`` holds no values, so no data check catches it), which numpy cannot even reshape to, and a
    model call on no rows forecasts nothing. With every axis at least 1, the count must match data that fit in
    the body, so an absurd axis is refused by the data checks.
    """
    if 0 in tensor.shape:
        raise input_error(tensor.name, f"shape {tensor.shape} holds no values; send at least one value on every axis.")
    return math.prod(tensor.shape)


def decode_tensor(tensor: InferInputTensor, raw: bytes | None = None) -> np.ndarray:
    """One v2 input tensor as a numpy array of its declared datatype and shape.

    ``raw`` is the tensor's binary data (little-endian, row-major), its size already checked against the
    shape by :func:`distributed_onnx.serve.wire.binary.slice_inputs`; without it the data is the JSON ``data``.
    """
    name = tensor.name
    dtype = numpy_dtype(tensor)
    expected = check_shape(tensor)
    parameters = tensor.parameters or {}
    if "shared_memory_region" in parameters:
        raise input_error(name, "shared-memory tensor data is not supported; send JSON 'data' or binary data.")
    if raw is not None:
        return _from_bytes(tensor, dtype, raw)
    if "binary_data_size" in parameters:
        raise InputValidationError(
            f"Input {name!r} has binary_data_size but the request has no Inference-Header-Content-Length "
            "header saying where its binary data starts.",
            tensor=name,
        )
    if tensor.data is None:
        raise InputValidationError(f"Input {name!r} has no 'data' (nor binary_data_size).", tensor=name)
    try:
        values = np.asarray(tensor.data)
    except ValueError as exc:  # ragged nesting
        raise input_error(name, f"'data' is not a rectangular array: {exc}") from None
    if values.size != expected:
        raise input_error(name, f"shape {tensor.shape} holds {expected} values, 'data' has {values.size}.")
    if values.size and values.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        wanted = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}[dtype.kind]
        raise input_error(name, f"datatype {tensor.datatype} takes {wanted}, 'data' holds {_describe(values)}.")
    if values.ndim > 1 and list(values.shape) != tensor.shape:
        raise input_error(name, f"nested 'data' has shape {list(values.shape)}, the tensor declares {tensor.shape}.")
    if (
        dtype.kind in "iu"
        and values.size
        and (values.min() < np.iinfo(dtype).min or values.max() > np.iinfo(dtype).max)
    ):
        raise input_error(name, f"values out of range for {tensor.datatype}.")
    if dtype.kind == "f" and values.size and values.dtype.kind == "f":
        _check_float_range(name, tensor.datatype, dtype, values)
    return values.astype(dtype, copy=False).reshape(tensor.shape)


def _check_float_range(name: str, datatype: str, dtype: np.dtype[Any], values: np.ndarray) -> None:
    """Refuse finite JSON numbers that the tensor's float type turns into inf (1e39 as FP32), naming one."""
    limit = float(np.finfo(dtype).max)
    flat = values.reshape(-1)
    with np.errstate(invalid="ignore"):
        beyond = np.flatnonzero(np.isfinite(flat) & (np.abs(flat) > limit))  # NaN/inf: the family's rule
    if beyond.size:
        value = f"value {flat[beyond[0]]:g} (flat index {int(beyond[0])})"
        raise input_error(name, f"{value} is beyond {datatype}'s range (+-{limit:.4g}); {beyond.size} value(s) are.")


def decode_inputs(
    tensors: Sequence[InferInputTensor], specs: Sequence[TensorSpec], raw: Sequence[bytes | None] | None = None
) -> dict[str, np.ndarray]:
    """All input tensors of a request, checked against the model: names, datatypes, ranks, dims.

    ``raw`` holds each tensor's binary data (``None`` for a JSON tensor), as :func:`binary.slice_inputs` cuts it.
    """
    names = [tensor.name for tensor in tensors]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputValidationError(f"Input(s) {duplicates} given more than once.", tensor=duplicates[0])
    by_name = {spec.name: spec for spec in specs}
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(tensors):
        spec = by_name.get(tensor.name)
        if spec is not None and numpy_dtype(tensor) != spec.dtype:
            raise InputValidationError(
                f"Input {tensor.name!r} has datatype {tensor.datatype}, the model takes "
                f"{datatype_of(spec.dtype)} ({spec.describe()}).",
                tensor=tensor.name,
            )
        arrays[tensor.name] = decode_tensor(tensor, None if raw is None else raw[index])
    validate_inputs(arrays, specs)
    return arrays


def select_outputs(available: Iterable[str], requested: Sequence[RequestedOutput] | None) -> list[str]:
    """The output names to return: all of them, or those requested (an unknown one is a 4xx naming it)."""
    names = list(available)
    if not requested:
        return names
    unknown = [output.name for output in requested if output.name not in names]
    if unknown:
        raise InputValidationError(f"Requested output(s) {unknown} do not exist; the model has {names}.")
    return [output.name for output in requested]


def run_checked(
    run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    inputs: Mapping[str, np.ndarray],
    names: Sequence[str],
) -> Mapping[str, np.ndarray]:
    """``run(inputs)``, refusing NaN or infinite values in the outputs to return (422 for this request alone).

    A v2 infer request is one model call of its own, so non-finite outputs come from its values (too large for
    the model's arithmetic, say): an :class:`InputValidationError`, which the replica's health does not count
    (a session that runs is not broken), while an error inside ONNX Runtime stays an :class:`InferenceError`.
    """
    outputs = run(inputs)
    broken = [name for name in names if outputs[name].dtype.kind == "f" and not np.isfinite(outputs[name]).all()]
    if broken:
        raise InputValidationError(
            f"the model produced NaN or infinite values in output(s) {broken} for this request's inputs: their "
            "values are outside the range the model handles (e.g. too large in magnitude); rescale them."
        )
    return outputs


def encode_outputs(outputs: Mapping[str, np.ndarray], names: Sequence[str]) -> list[InferOutputTensor]:
    """Model outputs as v2 tensors: datatype, shape and flat row-major data."""
    encoded = []
    for name in names:
        value = np.asarray(outputs[name])
        encoded.append(
            InferOutputTensor.model_construct(
                name=name,
                shape=list(value.shape),
                datatype=datatype_of(value.dtype),
                parameters=None,
                data=value.reshape(-1).tolist(),
            )
        )
    return encoded


def _from_bytes(tensor: InferInputTensor, dtype: np.dtype[Any], raw: bytes) -> np.ndarray:
    if len(raw) != math.prod(tensor.shape) * dtype.itemsize:  # before frombuffer, which fails on a partial value
        short = f"{len(raw)} bytes of binary data do not fill shape {tensor.shape} of {tensor.datatype}."
        raise input_error(tensor.name, short)
    if dtype.kind == "b" and np.frombuffer(raw, dtype=np.uint8).max(initial=0) > 1:
        raise input_error(tensor.name, "BOOL binary data must be bytes 0 or 1.")
    values = np.frombuffer(raw, dtype=dtype.newbyteorder("<"))
    return values.astype(dtype).reshape(tensor.shape)  # a writable, native-order copy


def input_error(name: str, problem: str) -> InputValidationError:
    """``Input 'name': problem``, the 4xx of a tensor the request got wrong (its ``tensor`` field names it)."""
    return InputValidationError(f"Input {name!r}: {problem}", tensor=name)


def _describe(values: np.ndarray) -> str:
    kind = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings", "O": "mixed values"}
    return kind.get(values.dtype.kind, f"values of type {values.dtype}")
