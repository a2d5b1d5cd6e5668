"""Write the KServe v2 gRPC schema (``grpc_predict_v2.proto``, compiled) as a descriptor set the server loads.

The schema is KServe's (Apache-2.0), as compiled by ``protoc`` into the ``kserve`` package's
``kserve/protocol/grpc/grpc_predict_v2_pb2.py``: that module carries the proto's ``FileDescriptorProto``
serialized. This script reads it from a ``kserve`` wheel without importing the module (nothing of kserve is
installed or run) and writes it, wrapped in a ``FileDescriptorSet``, to
``distributed_onnx/resources/kserve/grpc_predict_v2.binpb``, and beside it ``grpc_predict_v2.proto``: the same
schema rendered back as proto3 text for reading (the upstream file's comments are not in the descriptor).
To reproduce::

    python -m pip download --no-deps kserve==0.21.0 -d /tmp/kserve
    python scripts/kserve_descriptor.py /tmp/kserve/kserve-0.21.0-py3-none-any.whl
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

MODULE = "kserve/protocol/grpc/grpc_predict_v2_pb2.py"
TARGET = Path(__file__).resolve().parents[1] / "distributed_onnx" / "resources" / "kserve" / "grpc_predict_v2.binpb"


def serialized_file(source: str) -> bytes:
    """The bytes literal the generated module passes to ``AddSerializedFile``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            value = ast.literal_eval(node.args[0])
            if isinstance(value, bytes):
                return value
    raise SystemExit(f"error: no AddSerializedFile(b'...') call in {MODULE}")


_TYPES = {
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
}


def render(file: descriptor_pb2.FileDescriptorProto) -> str:
    """The descriptor as proto3 text (messages, maps, oneofs, the service)."""
    lines = [
        f"// Rendered by scripts/kserve_descriptor.py from {file.name} as compiled in the kserve package",
        "// (Apache-2.0, see LICENSE beside this file). The server loads grpc_predict_v2.binpb, not this file.",
        'syntax = "proto3";',
        f"package {file.package};",
        "",
    ]
    for service in file.service:
        lines.append(f"service {service.name} {{")
        for method in service.method:
            request, response = method.input_type.rsplit(".", 1)[1], method.output_type.rsplit(".", 1)[1]
            lines.append(f"  rpc {method.name}({request}) returns ({response}) {{}}")
        lines += ["}", ""]
    for message in file.message_type:
        lines += [*_message(message, ""), ""]
    return "\n".join(lines)


def _message(message: descriptor_pb2.DescriptorProto, indent: str) -> list[str]:
    lines = [f"{indent}message {message.name} {{"]
    maps = {nested.name: nested for nested in message.nested_type if nested.options.map_entry}
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, indent + "  ")
    oneofs: dict[int, list[str]] = {}
    for field in message.field:
        kind = _TYPES.get(field.type) or field.type_name.rsplit(".", 1)[1]
        label = "repeated " if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED else ""
        if kind in maps:
            key, value = maps[kind].field
            kind = f"map<{_TYPES.get(key.type)}, {_TYPES.get(value.type) or value.type_name.rsplit('.', 1)[1]}>"
            label = ""
        line = f"{label}{kind} {field.name} = {field.number};"
        if field.HasField("oneof_index"):
            oneofs.setdefault(field.oneof_index, []).append(line)
        else:
            lines.append(f"{indent}  {line}")
    for index, members in oneofs.items():
        lines.append(f"{indent}  oneof {message.oneof_decl[index].name} {{")
        lines += [f"{indent}    {member}" for member in members]
        lines.append(f"{indent}  }}")
    lines.append(f"{indent}}}")
    return lines


def main(wheel: str) -> int:
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(MODULE).decode()
    file = descriptor_pb2.FileDescriptorProto.FromString(serialized_file(source))
    if (file.name, file.package) != ("grpc_predict_v2.proto", "inference"):
        raise SystemExit(f"error: {MODULE} describes {file.name} (package {file.package}), not grpc_predict_v2.proto")
    TARGET.write_bytes(descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString(deterministic=True))
    TARGET.with_suffix(".proto").write_text(render(file))
    print(f"wrote {TARGET} ({len(file.message_type)} messages, service {file.service[0].name})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    raise SystemExit(main(sys.argv[1]))
