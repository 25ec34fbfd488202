"""CoreML model specs (.mlmodel): a bounded protobuf wire-format reader and a summary of the spec.

No protobuf library is needed: the wire format is walked directly (varint, 64-bit, length-delimited
and 32-bit fields), every length checked against the buffer, nesting depth limited. Field numbers
follow coremltools' Model.proto: ``Model.specificationVersion`` = 1, ``description`` = 2, the model
type is the oneof field that follows (e.g. ``neuralNetwork`` = 500); ``ModelDescription.input`` = 1,
``output`` = 10; ``FeatureDescription.name`` = 1; ``NeuralNetwork.layers`` = 1 with
``NeuralNetworkLayer.name`` = 1, ``input`` = 2, ``output`` = 3 and the layer's own oneof after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anekit.errors import FormatError

FORMAT = "mlmodel"
MAX_DEPTH = 32

MODEL_TYPES = {
    200: "pipelineClassifier", 201: "pipelineRegressor", 202: "pipeline",
    300: "glmRegressor", 301: "supportVectorRegressor", 302: "treeEnsembleRegressor",
    303: "neuralNetworkRegressor", 400: "glmClassifier", 401: "supportVectorClassifier",
    402: "treeEnsembleClassifier", 403: "neuralNetworkClassifier", 500: "neuralNetwork", 502: "mlProgram",
}  # fmt: skip
LAYER_TYPES = {
    100: "convolution", 120: "pooling", 130: "activation", 140: "innerProduct", 175: "softmax",
    230: "add", 250: "bias",
}  # fmt: skip


@dataclass(frozen=True)
class WireField:
    """One protobuf field as stored: number, wire type, and its value (int, or the raw bytes)."""

    number: int
    wire_type: int
    value: int | bytes
    offset: int


def read_varint(data: bytes, pos: int, field: str) -> tuple[int, int]:
    """A protobuf varint at ``pos``: ``(value, position after it)``; FormatError when malformed."""
    value, shift, start = 0, 0, pos
    while True:
        if pos >= len(data):
            raise FormatError(FORMAT, field, "varint runs past the end", offset=start)
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FormatError(FORMAT, field, "varint longer than 10 bytes", offset=start)


def parse_fields(data: bytes, base: int = 0, path: str = "message") -> list[WireField]:
    """Every field of one message, in order; FormatError for anything malformed."""
    out: list[WireField] = []
    pos = 0
    while pos < len(data):
        at = pos
        key, pos = read_varint(data, pos, f"{path}.key")
        number, wire = key >> 3, key & 7
        if number == 0:
            raise FormatError(FORMAT, f"{path}.key", "field number 0", offset=base + at)
        if wire == 0:
            value, pos = read_varint(data, pos, f"{path}[{number}]")
            out.append(WireField(number, wire, value, base + at))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(data):
                raise FormatError(
                    FORMAT, f"{path}[{number}]", "fixed-size value runs past the end", offset=base + at
                )
            out.append(WireField(number, wire, int.from_bytes(data[pos : pos + size], "little"), base + at))
            pos += size
        elif wire == 2:
            length, pos = read_varint(data, pos, f"{path}[{number}].length")
            if length > len(data) - pos:
                end, want = base + len(data), base + pos + length
                what = (
                    f"truncated at byte {end}, expected {want}"
                    if path == "Model"
                    else "length runs past the end"
                )
                raise FormatError(
                    FORMAT, f"{path}[{number}]", f"{what} (the field's length says {length} bytes)",
                    offset=base + at, expected=f"<= {len(data) - pos}", actual=length,
                )  # fmt: skip
            out.append(WireField(number, wire, bytes(data[pos : pos + length]), base + at))
            pos += length
        else:
            raise FormatError(FORMAT, f"{path}.key", f"unsupported wire type {wire}", offset=base + at)
    return out


def _first(fields: list[WireField], number: int) -> WireField | None:
    return next((f for f in fields if f.number == number), None)


def _text(f: WireField | None) -> str | None:
    if f is None or not isinstance(f.value, bytes):
        return None
    return f.value.decode("utf-8", "replace")


def _message(f: WireField, path: str) -> list[WireField]:
    if not isinstance(f.value, bytes):
        raise FormatError(FORMAT, path, "expected a nested message", offset=f.offset)
    return parse_fields(f.value, f.offset, path)


def detect(data: bytes) -> bool:
    """A Model message: specificationVersion (field 1, varint) first, then a description message."""
    if len(data) < 4 or data[0] != 0x08:
        return False
    try:
        fields = parse_fields(data)
    except FormatError:
        return False
    return bool(fields) and fields[0].number == 1 and any(f.number == 2 and f.wire_type == 2 for f in fields)


def near(data: bytes) -> bool:
    """A Model message cut short: specificationVersion first, then top-level fields until one whose length
    runs past the end (what ``detect`` refuses; ``summarize`` then says where it was truncated)."""
    if len(data) < 4 or data[0] != 0x08:
        return False
    try:
        parse_fields(data, 0, "Model")
    except FormatError as e:
        return "truncated at byte" in str(e)
    return False


def summarize(data: bytes) -> dict[str, Any]:
    """Spec version, model type, inputs and outputs, and for neural networks the layers."""
    fields = parse_fields(data, 0, "Model")
    version = _first(fields, 1)
    if version is None or version.wire_type != 0:
        raise FormatError(FORMAT, "Model.specificationVersion", "missing", offset=0)
    summary: dict[str, Any] = {"format": "CoreML model spec", "specification_version": version.value}
    description = _first(fields, 2)
    if description is not None:
        desc = _message(description, "Model.description")
        features = {"inputs": 1, "outputs": 10}
        for key, number in features.items():
            names = []
            for f in desc:
                if f.number == number and f.wire_type == 2:
                    names.append(_text(_first(_message(f, f"Model.description.{key}"), 1)) or "?")
            summary[key] = names
    kinds = [f for f in fields if f.number >= 200 and f.wire_type == 2]
    if kinds:
        kind = kinds[0]
        summary["model_type"] = MODEL_TYPES.get(kind.number, f"field {kind.number}")
        if kind.number in (303, 403, 500):
            layers = []
            for f in _message(kind, "Model.neuralNetwork"):
                if f.number == 1 and f.wire_type == 2:
                    layer = _message(f, "Model.neuralNetwork.layers")
                    body = next((g for g in layer if g.number >= 100), None)
                    layers.append({
                        "name": _text(_first(layer, 1)),
                        "type": None if body is None else LAYER_TYPES.get(body.number, f"field {body.number}"),  # noqa: E501
                        "inputs": [_text(g) for g in layer if g.number == 2],
                        "outputs": [_text(g) for g in layer if g.number == 3],
                    })  # fmt: skip
            summary["layers"] = layers
    summary["file_size"] = len(data)
    return summary
