"""The protobuf wire format of ONNX models, for what the ``protobuf`` API does slowly or not at
all on large models: copying a message without one (large) field, reading the raw sizes of the
initializers from the serialized bytes without parsing them into ``bytes`` objects, and writing
a model one initializer at a time. Encoding: protobuf's documented wire format
(https://protobuf.dev/programming-guides/encoding/): varints, and field keys ``number << 3 |
wire type``, length-delimited fields (wire type 2) holding strings, bytes and messages.
"""
from __future__ import annotations

import math

import onnx


def copy_except(message, skipped_field: str, into=None):
    """Copy a protobuf message except one (large) field, without touching that field (not even
    reading it: ``ListFields`` would hand out a copy of a tensor's raw_data). ``into``: an
    empty message of the same type to copy into (a field of another message, say), else a new
    one; returns the copy."""
    copy = type(message)() if into is None else into
    for field in message.DESCRIPTOR.fields:
        if field.name == skipped_field:
            continue
        if field.is_repeated:
            values = getattr(message, field.name)
            if len(values):
                getattr(copy, field.name).extend(values)
        elif message.HasField(field.name):
            if field.message_type is not None:
                getattr(copy, field.name).CopyFrom(getattr(message, field.name))
            else:
                setattr(copy, field.name, getattr(message, field.name))
    return copy


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The protobuf varint at ``buf[pos]`` and the position after it."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def message_fields(buf, start: int, end: int):
    """Yield ``(field number, wire type, key offset, value start, value end)`` of each field of
    the serialized message ``buf[start:end]``, in the order written (a length-delimited
    value's start is after its length). Raises ValueError on a group (not used by onnx.proto)."""
    pos = start
    while pos < end:
        at = pos
        key, pos = read_varint(buf, pos)
        wire = key & 7
        value = pos
        if wire == 0:
            _, pos = read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, value = read_varint(buf, pos)
            pos = value + length
        else:  # groups: not used by onnx.proto
            raise ValueError(f"unexpected protobuf wire type {wire}")
        yield key >> 3, wire, at, value, pos


def length_delimited_fields(buf: memoryview, start: int, end: int):
    """Yield ``(field number, value start, value end)`` of the length-delimited fields of the
    serialized message ``buf[start:end]`` (other wire types are skipped)."""
    return ((number, v_start, v_end)
            for number, wire, _, v_start, v_end in message_fields(buf, start, end) if wire == 2)


_GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER_FIELD = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA_FIELD = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number


def initializer_raw_sizes(buf: memoryview, count: int) -> list:
    """``len(raw_data)`` (None: no raw_data) of each main-graph initializer of the serialized
    model ``buf``, in order, read from the wire format: reading ``tensor.raw_data`` from the
    parsed model would copy the bytes (upb hands out a new ``bytes`` object each time). All
    None if the walk does not find ``count`` initializers."""
    sizes: list = []
    try:
        for number, start, end in length_delimited_fields(buf, 0, len(buf)):
            if number != _GRAPH_FIELD:
                continue
            for inner, t_start, t_end in length_delimited_fields(buf, start, end):
                if inner == _INITIALIZER_FIELD:
                    size = None
                    for field, r_start, r_end in length_delimited_fields(buf, t_start, t_end):
                        if field == _RAW_DATA_FIELD:
                            size = r_end - r_start
                    sizes.append(size)
    except (IndexError, ValueError):
        sizes = []
    return sizes if len(sizes) == count else [None] * count


#: the varints of one byte, by value
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def varint(n: int) -> bytes:
    """The varint encoding of ``n >= 0`` (7 bits a byte, least significant first, the high bit
    set on every byte but the last); :func:`read_varint` reads it back."""
    if n < 0x80:  # a key or a short length: one byte (most of a model's)
        return _ONE_BYTE[n]
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


#: bytes per element of the common element types (TensorProto.DataType)
_ITEMSIZE = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2,
             onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT8: 1,
             onnx.TensorProto.INT16: 2, onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT32: 4,
             onnx.TensorProto.UINT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.UINT64: 8,
             onnx.TensorProto.BOOL: 1}

#: Tensors up to this many bytes go out as their own serialization: it copies the bytes once
#: more than reading ``raw_data`` does, which is cheaper than the field-by-field copy only
#: below ~64 KiB (measured: 4 KiB 0.5 vs 30 us, 1 MiB 410 vs 76 us)
_WHOLE_BYTES = 1 << 16


def _small(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor``'s elements (by its dims and type) take at most :data:`_WHOLE_BYTES`."""
    size = _ITEMSIZE.get(tensor.data_type)
    return size is not None and math.prod(tensor.dims[:]) * size <= _WHOLE_BYTES


def _without_raw_data(fields: list) -> bytes:
    """The serialization of a TensorProto whose set fields are ``fields`` (``ListFields()`` of
    a tensor, ``raw_data`` left out): what :func:`copy_except` ``(tensor, "raw_data")`` would
    serialize, built from the few fields set (a name, dims, a type) rather than by asking for
    each of TensorProto's 16."""
    meta = onnx.TensorProto()
    for field, value in fields:
        if field.is_repeated:
            getattr(meta, field.name).extend(value)
        elif field.message_type is not None:
            getattr(meta, field.name).CopyFrom(value)
        else:
            setattr(meta, field.name, value)
    return meta.SerializeToString()


#: GraphProto's fields, in number order (the order protobuf writes them in)
_GRAPH_FIELDS = sorted(onnx.GraphProto.DESCRIPTOR.fields, key=lambda f: f.number)


def _without_initializers(graph: onnx.GraphProto) -> bytes | None:
    """The serialization of ``graph`` without its initializers (what :func:`copy_except`
    ``(graph, "initializer")`` would serialize: the known fields), built field by field from
    each node's and value's own serialization rather than from a copy of every node
    (DenseNet121: 730 nodes and 729 value infos, a copy 4x slower than serializing them).
    None when a set field is neither a message nor a string (GraphProto has none in
    ``onnx.proto`` today)."""
    parts = []
    for field in _GRAPH_FIELDS:
        if field.name == "initializer":
            continue
        key = varint(field.number << 3 | 2)  # messages and strings: length-delimited
        if field.is_repeated:
            values = getattr(graph, field.name)
            if not len(values):
                continue
            if field.message_type is None:
                return None
            for value in values:
                body = value.SerializeToString()
                parts += (key, varint(len(body)), body)
        elif graph.HasField(field.name):
            if field.type != field.TYPE_STRING:
                return None
            body = getattr(graph, field.name).encode()
            parts += (key, varint(len(body)), body)
    return b"".join(parts)


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose main graph has no initializers (the weightless skeletons of
    :mod:`onnx_cinm.frontend`, :func:`write_streamed`'s first part). The graph is copied into
    the copy's once (a graph built apart and then copied in was copied twice: 0.7 of the
    3.5 ms of ``strip_weights`` on light DenseNet121)."""
    skeleton = copy_except(model, "graph")
    skeleton.graph.SetInParent()  # present even when ``model``'s graph has nothing to copy
    copy_except(model.graph, "initializer", into=skeleton.graph)
    return skeleton


def write_streamed(handle, model: onnx.ModelProto) -> int:
    """Write ``model`` serialized, one initializer at a time: the model without its weights,
    then per initializer the encoding of a ModelProto whose graph holds just that tensor.
    Protobuf parsing merges repeated occurrences of an embedded message (the graph) and appends
    repeated fields (the initializers) in order, so the file reads back as exactly ``model``;
    but no serialization of the whole model (a second copy of every weight) is ever held.
    Returns the length of the first part (the model without its weights), bytes."""
    graph_key = varint(_GRAPH_FIELD << 3 | 2)  # length-delimited: wire type 2
    graph = _without_initializers(model.graph)
    if graph is None:  # a field it does not spell out: through a copy of the graph
        first = copy_without_initializers(model).SerializeToString()
    else:  # the graph's bytes in the place of its field number among the model's fields
        rest = copy_except(model, "graph").SerializeToString()  # small: no graph
        cut = next((at for number, _, at, _, _ in message_fields(memoryview(rest), 0, len(rest))
                    if number > _GRAPH_FIELD),
                   len(rest))
        first = b"".join((rest[:cut], graph_key, varint(len(graph)), graph, rest[cut:]))
    handle.write(first)
    init_key = varint(_INITIALIZER_FIELD << 3 | 2)
    raw_key = varint(_RAW_DATA_FIELD << 3 | 2)
    for tensor in model.graph.initializer[:]:
        # the set fields in number order, in one call (raw_data's bytes read: the one copy of
        # them written below, as reading tensor.raw_data would make)
        fields = tensor.ListFields()
        if fields and fields[-1][0].number == _RAW_DATA_FIELD:  # raw_data the last field set
            if _small(tensor):
                # protobuf writes the fields in number order: the tensor's own serialization is
                # the same bytes as the branch below writes, with no field-by-field copy (10-30
                # us a tensor in Python, 700 tensors on DenseNet121)
                body = tensor.SerializeToString()
                inner = init_key + varint(len(body))
                handle.write(graph_key + varint(len(inner) + len(body)) + inner)
                handle.write(body)
                continue
            # the bytes go out as they are, not re-serialized
            raw = fields[-1][1]
            meta = _without_raw_data(fields[:-1]) + raw_key + varint(len(raw))
        elif tensor.HasField("raw_data"):  # fields after it (external_data, ...): rare
            meta = copy_except(tensor, "raw_data").SerializeToString()
            raw = tensor.raw_data
            meta += raw_key + varint(len(raw))
        else:
            meta, raw = tensor.SerializeToString(), b""
        inner = init_key + varint(len(meta) + len(raw))
        handle.write(graph_key + varint(len(inner) + len(meta) + len(raw)) + inner + meta)
        handle.write(raw)
    return len(first)
