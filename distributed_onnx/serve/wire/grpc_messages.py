"""The KServe v2 / Open Inference Protocol gRPC messages and service, loaded from KServe's own schema.

``inference.GRPCInferenceService`` as KServe's ``grpc_predict_v2.proto`` defines it, committed compiled (a
``FileDescriptorSet``, ``distributed_onnx/resources/kserve/``, Apache-2.0) and loaded at import into a private
descriptor pool: no ``protoc`` and no generated Python at run time (generated code pins the protobuf major
version), and no clash with a client's own copy of the same messages (``tritonclient`` registers Triton's in
protobuf's default pool) in one process. Of its methods this server implements ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata and ModelInfer (:data:`METHODS`): what Triton's ``tritonclient.grpc``
uses for inference; the repository methods are left unregistered (gRPC answers UNIMPLEMENTED).

:func:`add_inference_service` is the ``add_..._to_server`` function Serve's gRPC ingress takes
(``gRPCOptions.grpc_servicer_functions``): Serve routes each method to the deployment method of the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from distributed_onnx.resources import KSERVE_PREDICT_V2_DESCRIPTOR

PACKAGE = "inference"
SERVICE = "GRPCInferenceService"
#: Import path for ``gRPCOptions(grpc_servicer_functions=[...])``.
SERVICER_FUNCTION = "distributed_onnx.serve.wire.grpc_messages:add_inference_service"
#: The methods served: RPC -> (request, response), all unary (checked against the schema at import).
METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}


def _load_pool() -> descriptor_pool.DescriptorPool:
    files = descriptor_pb2.FileDescriptorSet.FromString(KSERVE_PREDICT_V2_DESCRIPTOR.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    service = pool.FindServiceByName(f"{PACKAGE}.{SERVICE}")
    for method, (request, response) in METHODS.items():
        found = service.methods_by_name.get(method)
        if found is None or (found.input_type.name, found.output_type.name) != (request, response):
            raise RuntimeError(f"{KSERVE_PREDICT_V2_DESCRIPTOR} does not define {SERVICE}.{method}({request})")
    return pool


_POOL = _load_pool()


def message_class(name: str) -> Any:
    """The protobuf class of a message of the protocol, e.g. ``message_class("ModelInferRequest")``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def _export(name: str) -> Any:
    # Module-level and named after the message, so Ray pickles requests by reference: through Serve's proxy
    # a gRPC request travels to the replica pickled, and a class it cannot import fails the call (measured).
    cls = message_class(name)
    cls.__module__, cls.__qualname__ = __name__, name
    return cls


ServerLiveRequest = _export("ServerLiveRequest")
ServerLiveResponse = _export("ServerLiveResponse")
ServerReadyRequest = _export("ServerReadyRequest")
ServerReadyResponse = _export("ServerReadyResponse")
ModelReadyRequest = _export("ModelReadyRequest")
ModelReadyResponse = _export("ModelReadyResponse")
ServerMetadataRequest = _export("ServerMetadataRequest")
ServerMetadataResponse = _export("ServerMetadataResponse")
ModelMetadataRequest = _export("ModelMetadataRequest")
ModelMetadataResponse = _export("ModelMetadataResponse")
ModelInferRequest = _export("ModelInferRequest")
ModelInferResponse = _export("ModelInferResponse")


class UndecodableRequest:
    """What a method receives for bytes that are not its request message (protobuf refused them).

    gRPC's server answers an exception in a request's deserializer with UNKNOWN "Unexpected DecodeError": the
    client's bytes would read as the server's fault. The deserializer returns this instead and the method
    refuses it (INVALID_ARGUMENT, :func:`.grpc_api.check_decoded`). Its empty names keep the code that labels a
    request (``model_name``, ``name``, ``id``) working; module-level, so Ray pickles it by reference.
    """

    model_name = ""
    name = ""
    id = ""

    def __init__(self, method: str, error: str) -> None:
        self.method = method
        self.error = error


def lenient_parser(method: str, request: str) -> Callable[[bytes], Any]:
    """``request``'s ``FromString``, an :class:`UndecodableRequest` for bytes it refuses."""
    parse = message_class(request).FromString

    def parsed(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or anything protobuf raises on bytes it cannot read
            return UndecodableRequest(method, f"{type(exc).__name__}: {exc}")

    return parsed


def add_inference_service(servicer: Any, server: Any) -> None:
    """Register ``inference.GRPCInferenceService`` on ``server``, each method served by ``servicer.<Method>``."""
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method),
            request_deserializer=lenient_parser(method, request),
            response_serializer=message_class(response).SerializeToString,
        )
        for method, (request, response) in METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(f"{PACKAGE}.{SERVICE}", handlers),))
