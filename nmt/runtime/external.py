"""The files an ONNX graph makes onnxruntime read: the `location` of each tensor's external data, found by
walking the graph's protobuf wire format, since the runtime has no `onnx` package. A folder may come from
someone else, so every location must be the folder's own weights file before onnxruntime opens the graph:
onnxruntime refuses absolute paths and paths out of the folder itself, but reads any other file in it."""

from __future__ import annotations

from collections.abc import Iterator

# Where tensors (TensorProto) occur, by message: field number -> the message it holds (onnx.proto).
MODEL, GRAPH, FUNCTION, TRAINING, NODE, ATTRIBUTE, SPARSE, TENSOR, ENTRY = range(9)
HOLDS = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},      # graph, training_info, functions
    TRAINING: {1: GRAPH, 2: GRAPH},                     # initialization, algorithm
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},            # node, initializer, sparse_initializer
    FUNCTION: {7: NODE, 11: ATTRIBUTE},                 # node, attribute_proto
    NODE: {5: ATTRIBUTE},
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},
    SPARSE: {1: TENSOR, 2: TENSOR},                     # values, indices
    TENSOR: {13: ENTRY},                                # external_data: key/value entries
}


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("a truncated number")
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview | None]]:
    """(field number, its bytes if length-delimited else None) of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        wire, value = key & 7, None
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos: pos + size], pos + size
        else:
            raise ValueError(f"wire type {wire}")
        if pos > len(data):
            raise ValueError("a truncated field")
        yield key >> 3, value


def external_locations(data: bytes) -> set[str]:
    """The external-data locations a serialized ModelProto names (ValueError: not a protobuf message)."""
    found: set[str] = set()
    todo = [(MODEL, memoryview(data))]
    while todo:
        kind, message = todo.pop()
        if kind == ENTRY:
            entry = {number: bytes(value) for number, value in _fields(message) if value is not None}
            if entry.get(1) == b"location":
                found.add(entry.get(2, b"").decode("utf-8", "replace"))
            continue
        todo.extend((HOLDS[kind][number], value) for number, value in _fields(message)
                    if value is not None and number in HOLDS[kind])
    return found
