"""The KServe v2 / Open Inference Protocol gRPC messages and service, described in code (no generated files).

``inference.GRPCInferenceService`` with ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and
ModelInfer: the subset Triton's ``tritonclient.grpc`` uses for inference, with the protocol's package, names
and field numbers, so any v2 gRPC client talks to it. The descriptors are built at import into a private
descriptor pool, not compiled from a ``.proto`` by ``protoc``: nothing generated to keep in step with the
installed protobuf (generated code pins the protobuf major version), and no clash with a client's own copy of
the same messages (``tritonclient`` registers them in protobuf's default pool) in one process.

:func:`add_inference_service` is the ``add_..._to_server`` function Serve's gRPC ingress takes
(``gRPCOptions.grpc_servicer_functions``): Serve routes each method to the deployment method of the same name.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = "GRPCInferenceService"
#: Import path for ``gRPCOptions(grpc_servicer_functions=[...])``.
SERVICER_FUNCTION = "distributed_onnx.serve.grpc_messages:add_inference_service"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_PARAMETERS = ("map", "InferParameter")

# message -> [(field, number, type, repeated)]; a type not in _SCALARS names a message of this package, a
# ("map", X) type is a map<string, X>. Nested messages are written "Outer.Inner".
_MESSAGES: dict[str, list[tuple[str, int, Any, bool]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool", False)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", False)],
    "ModelReadyRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelReadyResponse": [("ready", 1, "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [
        ("name", 1, "string", False),
        ("version", 2, "string", False),
        ("extensions", 3, "string", True),
    ],
    "ModelMetadataRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelMetadataResponse": [
        ("name", 1, "string", False),
        ("versions", 2, "string", True),
        ("platform", 3, "string", False),
        ("inputs", 4, "ModelMetadataResponse.TensorMetadata", True),
        ("outputs", 5, "ModelMetadataResponse.TensorMetadata", True),
    ],
    "ModelMetadataResponse.TensorMetadata": [
        ("name", 1, "string", False),
        ("datatype", 2, "string", False),
        ("shape", 3, "int64", True),
    ],
    "InferParameter": [  # a oneof (parameter_choice), see _ONEOFS
        ("bool_param", 1, "bool", False),
        ("int64_param", 2, "int64", False),
        ("string_param", 3, "string", False),
        ("double_param", 4, "double", False),
        ("uint64_param", 5, "uint64", False),
    ],
    "InferTensorContents": [
        ("bool_contents", 1, "bool", True),
        ("int_contents", 2, "int32", True),
        ("int64_contents", 3, "int64", True),
        ("uint_contents", 4, "uint32", True),
        ("uint64_contents", 5, "uint64", True),
        ("fp32_contents", 6, "float", True),
        ("fp64_contents", 7, "double", True),
        ("bytes_contents", 8, "bytes", True),
    ],
    "ModelInferRequest": [
        ("model_name", 1, "string", False),
        ("model_version", 2, "string", False),
        ("id", 3, "string", False),
        ("parameters", 4, _PARAMETERS, True),
        ("inputs", 5, "ModelInferRequest.InferInputTensor", True),
        ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor", True),
        ("raw_input_contents", 7, "bytes", True),
    ],
    "ModelInferRequest.InferInputTensor": [
        ("name", 1, "string", False),
        ("datatype", 2, "string", False),
        ("shape", 3, "int64", True),
        ("parameters", 4, _PARAMETERS, True),
        ("contents", 5, "InferTensorContents", False),
    ],
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, "string", False),
        ("parameters", 2, _PARAMETERS, True),
    ],
    "ModelInferResponse": [
        ("model_name", 1, "string", False),
        ("model_version", 2, "string", False),
        ("id", 3, "string", False),
        ("parameters", 4, _PARAMETERS, True),
        ("outputs", 5, "ModelInferResponse.InferOutputTensor", True),
        ("raw_output_contents", 6, "bytes", True),
    ],
    "ModelInferResponse.InferOutputTensor": [
        ("name", 1, "string", False),
        ("datatype", 2, "string", False),
        ("shape", 3, "int64", True),
        ("parameters", 4, _PARAMETERS, True),
        ("contents", 5, "InferTensorContents", False),
    ],
}
_ONEOFS = {"InferParameter": "parameter_choice"}
#: RPC -> (request, response), all unary.
METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="distributed_onnx/open_inference.proto", package=PACKAGE)
    file.syntax = "proto3"
    built: dict[str, descriptor_pb2.DescriptorProto] = {}
    for name, fields in _MESSAGES.items():  # outer messages come before their nested ones in the table
        outer, _, inner = name.rpartition(".")
        message = (built[outer].nested_type if outer else file.message_type).add(name=inner)
        built[name] = message
        oneof = _ONEOFS.get(name)
        if oneof:
            message.oneof_decl.add(name=oneof)
        for field, number, kind, repeated in fields:
            entry = message.field.add(name=field, number=number, json_name=_camel(field))
            entry.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if oneof:
                entry.oneof_index = 0
            if isinstance(kind, tuple):  # map<string, X>: a nested XEntry message, as protoc writes it
                entry_name = "".join(part.title() for part in field.split("_")) + "Entry"
                if entry_name not in [nested.name for nested in message.nested_type]:
                    map_entry = message.nested_type.add(name=entry_name)
                    map_entry.options.map_entry = True
                    map_entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
                    map_entry.field.add(
                        name="value",
                        number=2,
                        type=_F.TYPE_MESSAGE,
                        label=_F.LABEL_OPTIONAL,
                        type_name=f".{PACKAGE}.{kind[1]}",
                    )
                entry.type = _F.TYPE_MESSAGE
                entry.type_name = f".{PACKAGE}.{name}.{entry_name}"
            elif kind in _SCALARS:
                entry.type = _SCALARS[kind]
            else:
                entry.type = _F.TYPE_MESSAGE
                entry.type_name = f".{PACKAGE}.{kind}"
    service = file.service.add(name=SERVICE)
    for method, (request, response) in METHODS.items():
        service.method.add(name=method, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}")
    return file


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


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


def add_inference_service(servicer: Any, server: Any) -> None:
    """Register ``inference.GRPCInferenceService`` on ``server``, each method served by ``servicer.<Method>``."""
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method),
            request_deserializer=message_class(request).FromString,
            response_serializer=message_class(response).SerializeToString,
        )
        for method, (request, response) in METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(f"{PACKAGE}.{SERVICE}", handlers),))
