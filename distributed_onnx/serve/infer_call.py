"""A KServe v2 infer request in a model, HTTP or gRPC: decoded and checked into an :class:`InferCall`, answered.

Pure code over what a model offers (:class:`InferModel`, :class:`distributed_onnx.serve.core.ModelCore` in a
replica): the tensors are checked against the session's specs and the family's NaN rule, the outputs to
return are selected, and the request's windows are placed by its parameters for the forecast log
(:mod:`distributed_onnx.serve.log.infer_windows`), all before the model runs, so a bad request is a 4xx that costs no
model call. What an answered call hands the log is an :class:`InferServed`: references, turned into the log's
rows after the answer has gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from distributed_onnx.model.backend.validation import TensorSpec
from distributed_onnx.model.checkpoint import CheckpointMetadata
from distributed_onnx.model.worker import InferenceWorker
from distributed_onnx.serve.log.infer_windows import InferWindows, infer_windows, served_request
from distributed_onnx.serve.wire.binary import binary_outputs
from distributed_onnx.serve.wire.grpc_api import infer_inputs, request_parameters, requested_outputs
from distributed_onnx.serve.wire.http import parse_infer_request
from distributed_onnx.serve.wire.protocol import decode_inputs, select_outputs
from distributed_onnx.serve.wire.schemas import ForecastRequest


class InferModel(Protocol):
    """What planning a v2 call reads of a model."""

    @property
    def name(self) -> str: ...

    @property
    def worker(self) -> InferenceWorker: ...

    @property
    def metadata(self) -> CheckpointMetadata: ...

    @property
    def input_specs(self) -> Sequence[TensorSpec]: ...

    @property
    def output_specs(self) -> Sequence[TensorSpec]: ...


@dataclass(frozen=True)
class InferCall:
    """A decoded v2 infer request: the model's inputs, what to send back, and its windows for the log."""

    inputs: dict[str, np.ndarray]
    names: list[str]
    binary: set[str]
    document: dict[str, Any]
    windows: InferWindows
    request_id: str | None = None  # the request's own ``id``, when it has one


@dataclass(frozen=True)
class InferServed:
    """An answered v2 call, as the forecast log and the shadows take it (built into rows after the answer)."""

    model: InferModel
    windows: InferWindows
    outputs: Mapping[str, np.ndarray]
    request_id: str | None

    def request(self) -> tuple[ForecastRequest, np.ndarray, tuple[float, ...]] | None:
        """The windows as a /v1 request, their forecasts and levels (None: not finite, nothing to log)."""
        return served_request(self.windows, self.model.metadata, self.outputs, self.model.worker.adapter_of)


def plan_http(model: InferModel, body: bytes, header_length: str | None) -> InferCall:
    """An HTTP v2 body (JSON, or with the binary extension when ``header_length`` is given) for ``model``."""
    parsed, raw = parse_infer_request(body, header_length)
    names = select_outputs((spec.name for spec in model.output_specs), parsed.outputs)
    document: dict[str, Any] = {"model_name": model.name}
    if parsed.id is not None:
        document["id"] = parsed.id
    inputs = decode_inputs(parsed.inputs, model.input_specs, raw)
    model.worker.adapter.check_tensors(inputs)  # the family's NaN/inf rule (docs/design.md, Model families)
    windows = infer_windows(model.worker.adapter, model.metadata, inputs, parsed.parameters)
    return InferCall(inputs, names, binary_outputs(parsed, names), document, windows, parsed.id)


def plan_grpc(model: InferModel, request: Any) -> InferCall:
    """A ``ModelInferRequest`` for ``model``: the same checks and messages as over HTTP."""
    tensors, raw = infer_inputs(request)
    names = select_outputs((spec.name for spec in model.output_specs), requested_outputs(request))
    inputs = decode_inputs(tensors, model.input_specs, raw)
    model.worker.adapter.check_tensors(inputs)  # the same family NaN/inf rule as over HTTP
    windows = infer_windows(model.worker.adapter, model.metadata, inputs, request_parameters(request))
    return InferCall(inputs, names, set(), {}, windows, request.id or None)
