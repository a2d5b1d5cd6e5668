"""The files an ONNX graph loads its weights from (ONNX external data), read from the graph without loading them.

A graph exported with its weights as external data (every family ``export`` writes: ``NAME.onnx.data`` beside
``NAME.onnx``) holds, for each such tensor, the file it lives in (the ``location`` entry of the tensor's
``external_data``, relative to the graph's folder) and ``data_location: EXTERNAL``. What the graph computes
depends on those files' bytes as much as on its own, so whoever asks "is this the same checkpoint?"
(:mod:`.identity`) or keys something on the graph (the optimized-graph cache) needs them.

Why a scan of the protobuf's wire format here and not ``onnx.load(path, load_external_data=False)``: onnx is not
a dependency of the package's main install (``pip install -e '.[cpu]'``: ONNX Runtime only), and ONNX Runtime
has no call that lists a graph's external files. The wire format is stable by design (field numbers never
change meaning), and the scan follows only the fields through which a message can hold a tensor (:data:`_HOLDS`,
checked against onnx's own descriptors by ``tests/test_external_data.py``): everything else, the weights kept
inside the file included, is skipped by its length without being read. The file is memory-mapped, so a graph of
a few GiB with its weights inside costs its field headers, not its size. A file that is not an ONNX protobuf
names no external file here: ONNX Runtime says what is wrong with it where it loads it (a checkpoint's
:class:`~distributed_onnx.errors.CheckpointCorruptError`). Pure: no ONNX Runtime.
"""

from __future__ import annotations

import mmap
from pathlib import Path

__all__ = ["external_data_files", "external_data_locations"]

#: For each ONNX message that can hold a tensor: its fields (number -> message type) through which it can.
_HOLDS: dict[str, dict[int, str]] = {
    "ModelProto": {7: "GraphProto", 20: "TrainingInfoProto", 25: "FunctionProto"},
    "TrainingInfoProto": {1: "GraphProto", 2: "GraphProto"},
    "FunctionProto": {7: "NodeProto", 11: "AttributeProto"},
    "GraphProto": {1: "NodeProto", 5: "TensorProto", 15: "SparseTensorProto"},
    "NodeProto": {5: "AttributeProto"},
    "AttributeProto": {
        5: "TensorProto",
        6: "GraphProto",
        10: "TensorProto",
        11: "GraphProto",
        22: "SparseTensorProto",
        23: "SparseTensorProto",
    },
    "SparseTensorProto": {1: "TensorProto", 2: "TensorProto"},
}
#: TensorProto's ``external_data`` (StringStringEntryProto: ``key`` 1, ``value`` 2) and ``data_location``.
_EXTERNAL_DATA, _DATA_LOCATION, _EXTERNAL = 13, 14, 1
#: Protobuf's wire types: a varint, 8 bytes, a length-delimited field, 4 bytes (3 and 4, groups, ONNX never uses).
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _MalformedError(ValueError):
    """The bytes are not a protobuf message where one was expected."""


def external_data_locations(graph: Path) -> list[str]:
    """The ``location`` of every tensor the graph at ``graph`` keeps as external data, each once, sorted (as the
    graph writes them: relative to its folder); none for a file that is not an ONNX protobuf (module docstring).
    """
    with graph.open("rb") as handle:
        if handle.seek(0, 2) == 0:
            return []
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            found: set[str] = set()
            try:
                _scan(view, 0, len(view), "ModelProto", found)
            except _MalformedError:
                return []
            finally:
                view.release()
            return sorted(found)


def external_data_files(graph: Path) -> list[Path]:
    """The files of :func:`external_data_locations`, as paths (relative to the graph's folder, as ONNX Runtime
    reads them)."""
    return [graph.parent / location for location in external_data_locations(graph)]


def _scan(data: memoryview, start: int, end: int, message: str, found: set[str]) -> None:
    """Add to ``found`` the external locations of the tensors inside ``message``, read from ``data[start:end]``."""
    holds = _HOLDS.get(message, {})
    position = start
    while position < end:
        tag, position = _varint(data, position, end)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, position = _varint(data, position, end)
        elif wire == _FIXED64:
            position += 8
        elif wire == _FIXED32:
            position += 4
        elif wire == _LENGTH:
            length, position = _varint(data, position, end)
            if position + length > end:
                raise _MalformedError(f"a field of {message} runs past its end at byte {position}")
            child = holds.get(number)
            if child == "TensorProto":
                _tensor(data, position, position + length, found)
            elif child is not None:
                _scan(data, position, position + length, child, found)
            position += length
        else:
            raise _MalformedError(f"wire type {wire} in {message} at byte {position}")
    if position != end:
        raise _MalformedError(f"{message} ends inside a field at byte {end}")


def _tensor(data: memoryview, start: int, end: int, found: set[str]) -> None:
    """A TensorProto: its ``location`` added to ``found`` when its ``data_location`` is EXTERNAL."""
    locations: list[str] = []
    external = False
    position = start
    while position < end:
        tag, position = _varint(data, position, end)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            number_value, position = _varint(data, position, end)
            external = external or (number == _DATA_LOCATION and number_value == _EXTERNAL)
        elif wire == _FIXED64:
            position += 8
        elif wire == _FIXED32:
            position += 4
        elif wire == _LENGTH:
            length, position = _varint(data, position, end)
            if position + length > end:
                raise _MalformedError(f"a field of a tensor runs past its end at byte {position}")
            if number == _EXTERNAL_DATA:
                key, text = _entry(data, position, position + length)
                if key == "location":
                    locations.append(text)
            position += length
        else:
            raise _MalformedError(f"wire type {wire} in a tensor at byte {position}")
    if external:
        found.update(locations)


def _entry(data: memoryview, start: int, end: int) -> tuple[str, str]:
    """A StringStringEntryProto's ``key`` and ``value``."""
    texts = {1: "", 2: ""}
    position = start
    while position < end:
        tag, position = _varint(data, position, end)
        if tag & 7 != _LENGTH:
            raise _MalformedError(f"an external-data entry holds wire type {tag & 7} at byte {position}")
        length, position = _varint(data, position, end)
        if position + length > end:
            raise _MalformedError(f"an external-data entry runs past its end at byte {position}")
        if tag >> 3 in texts:
            try:
                texts[tag >> 3] = bytes(data[position : position + length]).decode("utf-8")
            except UnicodeDecodeError:
                raise _MalformedError(f"an external-data entry is not UTF-8 at byte {position}") from None
        position += length
    return texts[1], texts[2]


def _varint(data: memoryview, position: int, end: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    value = shift = 0
    while True:
        if position >= end or shift > 63:
            raise _MalformedError(f"a truncated number at byte {position}")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
