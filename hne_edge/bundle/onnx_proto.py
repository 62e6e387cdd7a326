"""The ONNX protobuf reader the edge needs without the onnx package: which tensors of a serialized model keep
their values in external files (:func:`onnx_external_data`), and the one rule every loader applies to ONNX bytes
(:func:`check_self_contained`)."""

from __future__ import annotations

from ..errors import BundleError

__all__ = ["onnx_external_data", "check_self_contained"]


# onnx.proto field numbers: which fields of each message hold messages that can hold tensors
_ONNX_WALK = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION, _TENSOR_NAME = 13, 14, 8


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def onnx_external_data(data: bytes) -> list[str]:
    """Names of the tensors of a serialized ONNX model that keep their values in external files.

    Reads the protobuf wire format directly (no onnx package on the edge). A
    bundle's files must be self-contained: ONNX Runtime would read external
    data from paths the manifest does not list or hash.
    """
    found: list[str] = []
    stack: list[tuple[str, int, int, int]] = [("model", 0, len(data), 0)]
    while stack:
        kind, pos, end, depth = stack.pop()
        if depth > 64:
            raise BundleError("ONNX model nests subgraphs more than 64 deep")
        name, external = "?", False
        while pos < end:
            key, pos = _varint(data, pos)
            field_no, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = _varint(data, pos)
                if kind == "tensor" and field_no == _TENSOR_DATA_LOCATION and value == 1:
                    external = True
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _varint(data, pos)
                if pos + length > end:
                    raise ValueError("length past the end of its message")
                if kind == "tensor" and field_no == _TENSOR_EXTERNAL_DATA:
                    external = True
                elif kind == "tensor" and field_no == _TENSOR_NAME:
                    name = data[pos : pos + length].decode("utf-8", "replace")
                child = _ONNX_WALK.get(kind, {}).get(field_no)
                if child is not None:
                    stack.append((child, pos, pos + length, depth + 1))
                pos += length
            else:
                raise ValueError(f"unsupported protobuf wire type {wire}")
        if external:
            found.append(name)
    return found


def check_self_contained(data: bytes, name: str) -> None:
    """Refuse ONNX bytes that are no valid protobuf, or that keep tensors in external files (the one rule for
    every loader: the runtime's sessions and ``verify``): those files are neither listed nor hashed, and
    their paths may point anywhere."""
    try:
        external = onnx_external_data(data)
    except ValueError as exc:
        raise BundleError(f"{name}: not a valid ONNX file ({exc})") from None
    if external:
        raise BundleError(
            f"{name}: {len(external)} tensor(s) ({', '.join(external[:3])}) keep their values in external "
            "files, which the manifest neither lists nor hashes; expected one self-contained ONNX file per entry"
        )
