"""Rewriting ONNX graphs on onnx_ir: use-def links, and rules written as pattern, check, replacement.

The passes rewrite models through this module instead of editing ``NodeProto`` lists and building
their own producer/consumer/constant maps: :class:`Edit` opens the main graph of a ``ModelProto``
as an ``onnx_ir`` graph (built directly when the graph is plain, else read by onnx_ir), whose
values know their producer, their uses and their constant, and writes the result back. Why
onnx_ir and not onnx-graphsurgeon: ``docs/architecture.md`` ("Rewriting IR"), measured
by ``benchmarks/rewrite_ir.py`` (graphsurgeon drops function overloads, tensor/graph/type
attributes and metadata on a round trip; onnx_ir keeps them and rewrites faster).

A :class:`Rule` puts side by side, as onnxscript's rewriter does (its ``RewriteRule``: a target
pattern, a condition, a replacement):

- the *pattern*: the op types of the node it anchors on (default domain);
- the *check*: ``check(edit, node)`` returns a string saying why the node stays as it is, or any
  other value (a binding: what the check worked out, handed to the replacement);
- the *replacement*: ``replace(edit, node, binding)`` returns the new nodes (built with a
  :class:`Builder`), or a :class:`Replacement` when they replace more nodes than the anchor
  (a pattern over several nodes, found by the check through use-def links). A replacement may
  still refuse with a reason string when its last condition can only be decided on what it
  builds (a rule delegating to another rule); what it built is then discarded. A replacement
  by one node reading the same inputs and writing the same outputs (a 1:1 lowering) is a
  :class:`Recast` (:meth:`Builder.recast`): the node is changed in place.

:func:`apply` runs a table of rules over the main graph, counts what it rewrote and why the rest
stayed. Tensor names are kept: a replacement writes the replaced node's output names, so
consumers, graph outputs and recorded tensor infos stay valid.

Write-back (:meth:`Edit.commit`) puts the nodes back into the same ``ModelProto`` and deletes or
appends initializers in place, rather than serializing a new model with ``ir.to_proto``: that
copies every weight (1.35 s for the 575 MB of VGG19, more than the whole ``to_cinm`` pass). A
node goes back as the NodeProto it was read or built from unless it was changed since (or
onnx_ir would write that proto differently), not serialized again.
"""
from __future__ import annotations

import importlib
import math
import sys
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import CinmError


class _Deferred(types.ModuleType):
    """Stands in ``sys.modules`` for a module until one of its attributes is read, then imports
    the real one (and leaves ``sys.modules`` to it). Its ``__spec__`` is None, so an ``import``
    statement finding it there does not load it."""

    def __getattr__(self, attr: str):
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = self.__dict__["_real"] = importlib.import_module(self.__name__)
        return getattr(real, attr)


#: Modules ``import onnx_ir`` loads that no rewrite uses, deferred until first used: sympy and
#: onnx_ir's expression parser (see :func:`_import_onnx_ir`), and onnx_ir's op schemas (four
#: dataclasses). (Its external-data module is read as ``import onnx_ir`` runs: not deferred.)
_DEFERRED = ("sympy", "onnx_ir._symbolic_shapes", "onnx_ir.schemas")


def _import_onnx_ir():
    """``import onnx_ir`` without importing sympy: onnx_ir 1.1 imports it eagerly (0.6 s of CPU
    per process on the build machine, about 10% of ``optimize`` on ResNet-50; measured with
    ``python -X importtime``) for symbolic-dimension arithmetic the passes never do. sympy and
    onnx_ir's expression parser, and the other modules of :data:`_DEFERRED`, are deferred
    until first used (``tests/test_rewrite.py`` checks them: not loaded by a rewrite, and
    still working)."""
    if "onnx_ir" not in sys.modules:
        for name in _DEFERRED:
            sys.modules.setdefault(name, _Deferred(name))
    return importlib.import_module("onnx_ir")


ir = _import_onnx_ir()


# Note: the passes read a protobuf repeated field as a slice (``node.input[:]``: a list) where
# they go through it per node: iterating the field itself ends, as Python's old sequence
# protocol does, on an IndexError that protobuf formats (about 2,000 instructions a loop).


def plain(mapping):
    """The plain ``dict`` under one of onnx_ir's mappings (a node's ``attributes``, a graph's
    ``initializers``: ``collections.UserDict``, whose views iterate in Python), else the mapping
    itself. Read through it; write through it only what the mapping's own ``__setitem__``
    would store unchanged (:meth:`Edit.recast` sets a node's attributes: ``str`` keys and
    ``ir.Attr`` values, all Attributes checks), for its checks and bookkeeping are bypassed
    (a graph's initializers register their values with the graph: none is written this way).
    Tested against the onnx_ir installed (tests/test_rewrite.py)."""
    return getattr(mapping, "data", mapping)


def names_of(values) -> list[str]:
    """Names of ``values`` (a node's inputs or outputs), ``""`` for an omitted optional one."""
    return [v.name if v is not None else "" for v in values]


def add_initializer(graph: onnx.GraphProto, array: np.ndarray, name: str) -> None:
    """Append ``array`` to the initializers of ``graph`` as ``name``, with exactly its dtype.

    Fills the new entry in place with ``raw_data``: appending a ready TensorProto would copy
    it again, and ``numpy_helper.from_array`` makes further copies (seconds for the 550 MB of
    light_vgg19). A broadcast view of one value (``np.broadcast_to``: no array filled) is
    written as that value's bytes repeated; an array viewing the whole of a ``bytes`` object
    in C order (``numpy_helper.to_array`` of a ``raw_data`` tensor, reshaped) as that object.
    """
    tensor = graph.initializer.add()
    if array.dtype.kind in "OSU":
        tensor.CopyFrom(numpy_helper.from_array(array, name))
        return
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    raw = whole_bytes(array)  # a view of an initializer's bytes (to_array of raw_data): no copy
    if raw is None and array.size and not any(array.strides):  # one value broadcast (a fill)
        raw = array[(0,) * array.ndim].tobytes() * array.size
    elif raw is None:
        raw = array.tobytes()  # C order in one copy, whatever the array's layout
    del array  # the caller's last reference (``add_initializer(g, values.pop(k), k)``): freed
    tensor.raw_data = raw  # before protobuf copies the bytes, so 2 copies at a time, not 3


#: Element types :func:`tensor_array` reads itself: ``{type: (numpy dtype, the typed field
#: numpy_helper reads when there is no raw_data, or None: left to numpy_helper then)}``.
_DIRECT_TYPES = {
    onnx.TensorProto.FLOAT: (np.dtype(np.float32), "float_data"),
    onnx.TensorProto.DOUBLE: (np.dtype(np.float64), "double_data"),
    onnx.TensorProto.INT64: (np.dtype(np.int64), "int64_data"),
    onnx.TensorProto.INT32: (np.dtype(np.int32), "int32_data"),
    onnx.TensorProto.UINT64: (np.dtype(np.uint64), "uint64_data"),
    onnx.TensorProto.INT8: (np.dtype(np.int8), None),
    onnx.TensorProto.UINT8: (np.dtype(np.uint8), None),
    onnx.TensorProto.INT16: (np.dtype(np.int16), None),
    onnx.TensorProto.UINT16: (np.dtype(np.uint16), None),
    onnx.TensorProto.UINT32: (np.dtype(np.uint32), None),
    onnx.TensorProto.FLOAT16: (np.dtype(np.float16), None),
    onnx.TensorProto.BOOL: (np.dtype(np.bool_), None),
}


def repeated(one: np.ndarray, dims) -> np.ndarray:
    """``np.broadcast_to(one.reshape(()), dims)`` for an array ``one`` of one element and a
    sequence of non-negative ints ``dims``: the same read-only view of its one value (shape
    ``dims``, every stride 0, ``one``'s buffer, ``one`` its base), made directly: half of
    ``broadcast_to``'s cost, asked once per weight of one value (836 ConstantOfShape weights
    on light DenseNet121). Raises ValueError when ``dims`` hold more bytes than an address
    space."""
    dims = tuple(dims)
    view = np.ndarray(dims, one.dtype, one, 0, (0,) * len(dims))
    view.flags.writeable = False
    return view


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(tensor)``: the same dtype, shape, values and flags (read-only
    over ``raw_data``, a fresh writable array from a typed field), read directly for the
    plain element types of :data:`_DIRECT_TYPES` on a little-endian host; anything else
    (external data, segments, strings, packed and ml_dtypes types) is numpy_helper's.
    numpy_helper works out the dtype, storage type and field anew on every call: three
    quarters of reading the 836 shapes and fill values of light DenseNet121's
    ``ConstantOfShape`` weights. Raises as numpy_helper does (dims not matching the data)."""
    direct = _DIRECT_TYPES.get(tensor.data_type)
    if direct is None or _BIG_ENDIAN or tensor.data_location == onnx.TensorProto.EXTERNAL or \
            tensor.HasField("segment"):
        return numpy_helper.to_array(tensor)
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, direct[0]).reshape(tensor.dims[:])
    if direct[1] is None:
        return numpy_helper.to_array(tensor)
    values = getattr(tensor, direct[1])[:]  # (numpy reads a protobuf container slowly: iterated)
    return np.fromiter(values, direct[0], len(values)).reshape(tensor.dims[:])


_BIG_ENDIAN = sys.byteorder == "big"

#: The fields of a TensorProto :func:`add_initializer` does not set for a plain numeric array
#: (it sets name, data_type, dims, raw_data), repeated and singular ones; asked one by one:
#: ``ListFields`` would copy the raw_data out.
_OTHER_REPEATED = tuple(f.name for f in onnx.TensorProto.DESCRIPTOR.fields
                        if f.name not in ("name", "data_type", "dims", "raw_data") and
                        f.is_repeated)
_OTHER_SINGULAR = tuple(f.name for f in onnx.TensorProto.DESCRIPTOR.fields
                        if f.name not in ("name", "data_type", "dims", "raw_data") and
                        not f.is_repeated)


def is_splat(array: np.ndarray) -> bool:
    """Whether ``array`` (C-ordered, of a plain numeric or bool dtype, not empty) holds one
    value repeated, bit for bit (so NaN and -0.0 count as themselves): any reordering of it
    (a transpose) is then the same bytes. Compared a chunk at a time, so an array of distinct
    values (any trained weight) is told from its first chunk and the check allocates little."""
    if not array.size or array.dtype.kind not in "biuf" or \
            array.dtype.itemsize not in (1, 2, 4, 8) or not array.flags.c_contiguous:
        return False
    bits = array.reshape(-1).view(f"u{array.dtype.itemsize}")
    first = bits[0]
    return all((bits[k:k + _SPLAT_CHUNK] == first).all()
               for k in range(0, bits.size, _SPLAT_CHUNK))


#: Elements :func:`is_splat` compares at a time.
_SPLAT_CHUNK = 1 << 18


def fill_record(array: np.ndarray) -> tuple[int, tuple, bytes]:
    """The entry of :attr:`onnx_cinm.passes.PassContext.fills` for ``array``, one value
    broadcast (:func:`is_fill`): ``(TensorProto element type, dims, the value's bytes)``."""
    return (onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
            array[(0,) * array.ndim].tobytes())


def is_fill(array: np.ndarray) -> bool:
    """Whether ``array`` (of a plain numeric or bool dtype, not empty) is one value broadcast:
    every stride 0, as :meth:`Edit.array` gives an initializer known to repeat one value."""
    return bool(array.size) and not any(array.strides) and array.dtype.kind in "biuf" and \
        array.dtype.itemsize in (1, 2, 4, 8)


def known_fill(fills: dict, name: str, tensor: onnx.TensorProto) -> bytes | None:
    """The bytes of the one value ``fills`` records for the initializer ``name`` (``{name:
    (element type, dims, bytes)}``, see :attr:`onnx_cinm.passes.PassContext.fills`) when
    ``tensor`` still has that element type and those dims in ``raw_data``; else None."""
    known = fills.get(name)
    if known is None or known[0] != tensor.data_type or known[1] != tuple(tensor.dims[:]) or \
            not tensor.HasField("raw_data"):
        return None
    return known[2]


def add_unwritten(graph: onnx.GraphProto, array: np.ndarray, name: str) -> tuple[int, tuple, bytes]:
    """Append ``array``, one value broadcast (:func:`is_fill`), to the initializers of ``graph``
    as ``name`` with the element type and dims :func:`add_initializer` gives it, but no data
    yet; returns its record ``(element type, dims, the value's bytes)`` for
    :func:`write_unwritten`, which writes the bytes add_initializer would have written (the
    value repeated, as ``raw_data``) where the entry stands: the serialized model is the same
    bytes (a message's fields are written in field-number order, not in the order set). Used
    for a weight that a later pass may drop unread (fold_batchnorm replaces the Conv weights
    it folds: 16 of the 32 MB fold_constants fills on light DenseNet121), so it is not
    written only to be dropped."""
    record = fill_record(array)
    tensor = graph.initializer.add()
    tensor.name = name
    tensor.data_type = record[0]
    tensor.dims.extend(record[1])
    return record


def unwritten_fill(unwritten: dict | None, name: str, tensor: onnx.TensorProto) -> bytes | None:
    """The bytes of the one value of the initializer ``tensor`` called ``name`` when
    ``unwritten`` (``{name: (element type, dims, bytes)}``, :func:`add_unwritten`'s records)
    says it is still to be written: same element type and dims, no data of any kind; else
    None."""
    known = unwritten.get(name) if unwritten else None
    if known is None or known[0] != tensor.data_type or known[1] != tuple(tensor.dims[:]) or \
            tensor.HasField("raw_data") or \
            any(len(getattr(tensor, field)) for field in _OTHER_REPEATED) or \
            any(tensor.HasField(field) for field in _OTHER_SINGULAR):
        return None
    return known[2]


def write_unwritten(graph: onnx.GraphProto, unwritten: dict, names=None) -> None:
    """Write the bytes of the initializers of ``graph`` that :func:`add_unwritten` appended
    without them (``unwritten``: its records by name; those of ``names`` only when given), as
    ``raw_data`` in place, and drop their records from ``unwritten``; a record whose
    initializer is gone (or no longer matches it: :func:`unwritten_fill`) is dropped too when
    ``names`` is None. Consecutive entries of one value and size (light DenseNet121's 58
    [32, 128, 3, 3] weights) are written from one ``bytes`` object: protobuf copies it."""
    if not unwritten:
        return
    wanted = set(unwritten) if names is None else set(names) & set(unwritten)
    last = (None, b"")  # ((value, count), its bytes): one kept at a time, not a cache
    for tensor in graph.initializer[:]:
        if tensor.name in wanted:
            value = unwritten_fill(unwritten, tensor.name, tensor)
            if value is not None:
                key = (value, math.prod(tensor.dims[:]))
                if last[0] != key:
                    last = (None, b"")  # (freed before the next is made)
                    last = (key, value * key[1])
                tensor.raw_data = last[1]
    del last
    for name in wanted:
        del unwritten[name]


def whole_bytes(array: np.ndarray) -> bytes | None:
    """The ``bytes`` object ``array`` views all of, in C order from its first byte; else None."""
    root = array
    while isinstance(root, np.ndarray):
        root = root.base
    if not isinstance(root, bytes) or len(root) != array.nbytes or not array.flags.c_contiguous \
            or not array.size:
        return None
    start = np.frombuffer(root, np.uint8).__array_interface__["data"][0]
    return root if array.__array_interface__["data"][0] == start else None


def _hide_unreadable_types(graph: onnx.GraphProto) -> list[tuple[onnx.ValueInfoProto, onnx.TypeProto]]:
    """Clear, in place, the types onnx_ir 1.1 cannot read (maps, as in ZipMap's
    ``seq(map(int64, float))`` output) of the graph's inputs and outputs (:func:`_read_graph` sets
    the value_info aside), and return them to be put back: the rules need no types (``commit``
    does not write these back)."""
    hidden = []
    for value in graph.input[:] + graph.output[:]:
        if value.type.WhichOneof("value") in ("tensor_type", None):
            continue
        try:
            ir.serde.deserialize_type_proto_for_type(value.type)
        except Exception:  # noqa: BLE001 -- SerdeError wrapping NotImplementedError, ValueError
            saved = onnx.TypeProto()
            saved.CopyFrom(value.type)
            value.ClearField("type")
            hidden.append((value, saved))
    return hidden


def _read_graph(model: onnx.ModelProto) -> ir.Graph:
    """The main graph of ``model`` read by onnx_ir (``ir.from_proto``), for a model
    :func:`_open_graph` leaves to it. Raises CinmError when onnx_ir cannot read it."""
    # the main graph's value_info is set aside while onnx_ir reads the graph: typing every
    # value from it was a third of opening DenseNet121's (27 -> 19 ms CPU), and no rule
    # reads a value's type (they read tensor infos); the entries go back as they were
    infos = onnx.GraphProto()
    infos.value_info.extend(model.graph.value_info)
    del model.graph.value_info[:]
    hidden = _hide_unreadable_types(model.graph)
    try:
        return ir.from_proto(model).graph
    except Exception as e:  # noqa: BLE001 -- e.g. sparse tensors, which onnx_ir cannot read
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise CinmError(f"cannot rewrite the model: {type(cause).__name__}: "
                        f"{str(cause).splitlines()[0]}") from None
    finally:
        for value, saved in hidden:
            value.type.CopyFrom(saved)
        model.graph.value_info.extend(infos.value_info)


#: Attribute types whose values onnx_ir writes anew (graphs, tensors, types), or none (no type)
_REWRITTEN_ATTRS = frozenset({
    onnx.AttributeProto.UNDEFINED, onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS,
    onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS, onnx.AttributeProto.SPARSE_TENSOR,
    onnx.AttributeProto.SPARSE_TENSORS, onnx.AttributeProto.TYPE_PROTO,
    onnx.AttributeProto.TYPE_PROTOS})


def _as_serialized(proto: onnx.NodeProto) -> bool:
    """Whether ``ir.serde.serialize_node`` of the node read from ``proto`` gives ``proto`` back
    byte for byte: it writes no string field set to ``""`` (domain, name, overload, doc_string),
    drops trailing empty outputs and writes anew metadata, device configurations and the
    attributes of :data:`_REWRITTEN_ATTRS`; a node of none of these can keep its NodeProto."""
    return not ((proto.HasField("domain") and not proto.domain) or
                (proto.HasField("name") and not proto.name) or
                (proto.HasField("overload") and not proto.overload) or
                (proto.HasField("doc_string") and not proto.doc_string) or
                (proto.output and not proto.output[-1]) or proto.metadata_props or
                len(getattr(proto, "device_configurations", ())) or
                any(a.type in _REWRITTEN_ATTRS or a.ref_attr_name or a.HasField("doc_string")
                    for a in proto.attribute[:]))


_PLAIN_ATTRS = {onnx.AttributeProto.INT: (ir.AttributeType.INT, "i"),
                onnx.AttributeProto.INTS: (ir.AttributeType.INTS, "ints"),
                onnx.AttributeProto.FLOAT: (ir.AttributeType.FLOAT, "f")}


def _attribute(proto: onnx.AttributeProto) -> ir.Attr:
    """``ir.serde.deserialize_attribute(proto)``, read directly for an int, ints or float
    attribute without doc string (what the rules' builders write): the same ``ir.Attr``."""
    plain = _PLAIN_ATTRS.get(proto.type)
    if plain is None or proto.ref_attr_name or proto.HasField("doc_string"):
        return ir.serde.deserialize_attribute(proto)
    value = getattr(proto, plain[1])  # ints as a slice: Attr's walk of the field ended on an
    # IndexError protobuf formats (see the note above :func:`plain`)
    return ir.Attr(proto.name, plain[0], value[:] if plain[0] is ir.AttributeType.INTS else value)


#: Attribute types :func:`_open_graph` reads itself (:func:`_attribute`); the others are left
#: to onnx_ir's reader: subgraphs, whose nodes may read the outer graph's values (onnx_ir
#: resolves them through its scopes), types, sparse tensors
_OPENED_ATTRS = frozenset({
    onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT,
    onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS,
    onnx.AttributeProto.TENSOR})


def _open_graph(model: onnx.ModelProto) -> tuple[ir.Graph, list[onnx.NodeProto]] | None:
    """The main graph of ``model`` as ``ir.from_proto(model).graph`` reads it, built directly
    when the model is plain: its nodes, their attributes and use-def links, the graph's inputs,
    outputs and initializers (``const_value``: onnx_ir's tensor of each TensorProto, not a
    copy), names as in the model. Unlike onnx_ir's, no value carries a type or shape (no rule
    reads them: the rules read tensor infos; :meth:`Edit.commit` writes back nodes and
    initializers only), and neither the value_info nor the model's functions are read (nor
    set aside and put back, as :func:`_read_graph` does): to_cinm on light DenseNet121 went
    from 567 to 520 M instructions. None, for onnx_ir to read it, when the model has anything else:
    functions, device configurations, an attribute not of :data:`_OPENED_ATTRS`, node or graph
    metadata, quantization annotations, sparse initializers, external data, an initializer
    without a name or named twice, a value written twice (by two nodes, or by a node and as
    an input or initializer), or a name read that nothing writes (onnx_ir creates a value for
    it, or raises). With the graph, the NodeProtos of its nodes, in order."""
    g = model.graph
    if len(model.functions) or len(getattr(model, "configuration", ())) or \
            len(g.quantization_annotation) or len(g.sparse_initializer) or len(g.metadata_props):
        return None
    values: dict[str, ir.Value] = {}
    inputs = []
    for info in g.input[:]:
        if info.name in values:
            return None
        inputs.append(values.setdefault(info.name, ir.Value(name=info.name)))
    initializers = []
    for tensor in g.initializer[:]:
        name = tensor.name
        value = values.get(name) if name else None
        if value is None:
            value = values[name] = ir.Value(name=name)
        if not name or value.const_value is not None or \
                tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value.const_value = ir.serde.deserialize_tensor(tensor)
        initializers.append(value)
    protos = g.node[:]
    for proto in protos:  # every output first: a node may read one written further on
        if len(proto.metadata_props) or len(getattr(proto, "device_configurations", ())):
            return None
        for name in proto.output[:]:
            if name:
                if name in values:
                    return None
                values[name] = ir.Value(name=name)
    nodes = []
    for proto in protos:
        ins = []
        for name in proto.input[:]:
            value = values.get(name) if name else None
            if name and value is None:
                return None
            ins.append(value)
        attributes = []
        for a in proto.attribute[:]:
            if a.type not in _OPENED_ATTRS or (a.type == onnx.AttributeProto.TENSOR and
                                                a.t.data_location == onnx.TensorProto.EXTERNAL):
                return None
            attributes.append(_attribute(a))
        nodes.append(ir.Node(proto.domain, proto.op_type, ins, attributes,
                             overload=proto.overload, name=proto.name,
                             outputs=[values[o] if o else ir.Value(name="") for o in proto.output[:]],
                             doc_string=proto.doc_string if proto.HasField("doc_string") else None))
    outputs = []
    for info in g.output[:]:
        value = values.get(info.name)
        if value is None:
            return None
        outputs.append(value)
    return ir.Graph(inputs, outputs, nodes=nodes, initializers=initializers,
                    doc_string=g.doc_string if g.HasField("doc_string") else None,
                    name=g.name if g.HasField("name") else None), protos


class Edit:
    """A ``ModelProto`` opened for rewriting on onnx_ir (main graph).

    Args:
        model: the model; it is changed in place by :meth:`commit` (and returned by it).
        fresh: ``fresh(base) -> name``: a name used nowhere in the model, subgraphs included
            (:class:`onnx_cinm.passes.graph_names.Names` hands them out).
        fills: initializers known to hold one value repeated (``{name: (element type, dims,
            bytes of the value)}``, :attr:`onnx_cinm.passes.PassContext.fills`): :meth:`array`
            gives them as that value broadcast, without reading their bytes.

    Raises:
        CinmError: onnx_ir cannot read the model (sparse tensors, say).

    Attributes:
        graph: the ``ir.Graph`` of the main graph: iterate it for the nodes in order.
    """

    def __init__(self, model: onnx.ModelProto, fresh: Callable[[str], str],
                 fills: dict | None = None) -> None:
        self.proto = model
        self._fills = fills or {}
        opened = _open_graph(model)
        self.graph, protos = opened or (_read_graph(model), model.graph.node[:])
        #: the NodeProto each node was read from or built from (:meth:`add`): written back by
        #: :meth:`commit` as it is, instead of serializing the node again (``_proto_of``)
        self._protos: dict[ir.Node, onnx.NodeProto] = dict(zip(self.graph, protos))
        self.fresh = fresh
        self._original = set(plain(self.graph.initializers).values())
        self._new_consts: list[ir.Value] = []
        #: the bytes :meth:`array` read from the raw_data of initializers of one value
        #: repeated, by id: (bytes, initializer name)
        self._read: dict[int, tuple[bytes, str]] = {}
        self._scope: dict[str, ir.Value] = {}
        #: ``[(node, weights, names)]``: each node :func:`apply` replaced alone, as a NodeProto,
        #: with the initializers it read (``{name: TensorProto}``, the model's own, not copies;
        #: after :meth:`commit`, a :class:`FillWeight` for one it turned into a constant) and
        #: the names of the nodes it became (:mod:`onnx_cinm.passes.host_restore`)
        self.origins: list[tuple[onnx.NodeProto, dict, list[str]]] = []
        #: the constants :meth:`commit` wrote that are one value broadcast, as fills
        self._made_fills: dict[str, tuple[int, tuple, bytes]] = {}
        #: the one-element arrays :meth:`array` broadcast a fill from, by id: (the array, kept
        #: alive so that ids stay unique; the initializer; its name then)
        self._fill_sources: dict[int, tuple[np.ndarray, onnx.TensorProto, str]] = {}
        #: ``{name of a node a Builder made: op type of the node it replaces}`` (a fusion's
        #: nodes: its anchor's; ``to_cinm`` drops those), so placement hints can name the op
        #: types a user knows
        self.source_ops: dict[str, str] = {}

    # -- values ------------------------------------------------------------------------------

    def focus(self, node: ir.Node) -> None:
        """Start rewriting ``node``: its inputs become resolvable by name for the builders."""
        self._scope = {v.name: v for v in node.inputs if v is not None}

    def lookup(self, name: str) -> ir.Value | None:
        """The value called ``name`` among the focused node's inputs and what was built for it."""
        return self._scope.get(name) if name else None

    def constant(self, name: str) -> np.ndarray | None:
        """The array of the initializer ``name`` read by the focused node (see :meth:`array`)."""
        return self.array(self.lookup(name))

    def array(self, value: ir.Value | None, inputs_too: bool = True) -> np.ndarray | None:
        """The array of ``value`` if it is an initializer the model had before this edit
        (constants made by :meth:`const` are not folded again), else None. ``inputs_too=False``:
        None for an initializer that is also a graph input (a default the caller may override).
        One of the edit's ``fills`` is its value broadcast (:func:`is_fill`)."""
        if value is None or value not in self._original or (not inputs_too and value.is_graph_input()):
            return None
        t = value.const_value
        if not isinstance(t, ir.TensorProtoTensor):
            return t.numpy()
        fill = known_fill(self._fills, value.name, t.raw)
        if fill is not None:  # read-only, as numpy_helper's arrays of raw_data are
            one = np.frombuffer(fill, onnx.helper.tensor_dtype_to_np_dtype(t.raw.data_type))
            self._fill_sources[id(one)] = (one, t.raw, value.name)
            return repeated(one, t.raw.dims[:])
        array = tensor_array(t.raw)
        root = whole_bytes(array)
        # one value repeated: a reshape of it may stand for its transpose (:meth:`commit` then
        # renames the initializer); its bytes are kept alive (ids stay unique), no others'
        if root is not None and t.raw.HasField("raw_data") and not value.is_graph_input() \
                and is_splat(array):
            self._read[id(root)] = (root, value.name)
        return array

    def const(self, base: str, array: np.ndarray) -> str:
        """Add an initializer holding ``array`` under a fresh name from ``base``; returns the name."""
        name = self.fresh(base)
        # np.asarray(order="C"), not np.ascontiguousarray: the latter turns a 0-d scalar into
        # 1-d; no copy of an array that is C-ordered already (a weight the rule just computed),
        # nor of one value broadcast (add_initializer writes it as that value's bytes repeated)
        array = np.asarray(array)
        if not (array.size and not any(array.strides)):
            array = np.asarray(array, order="C")
        value = ir.Value(name=name, const_value=ir.Tensor(array, name=name))
        self.graph.register_initializer(value)
        self._new_consts.append(value)
        self._scope[name] = value
        return name

    def add(self, proto: onnx.NodeProto) -> ir.Node:
        """An ``ir.Node`` made from ``proto`` (not yet in the graph), its inputs resolved by name
        (:meth:`lookup`), its outputs new values resolvable from now on."""
        inputs = []
        for name in proto.input[:]:
            v = self.lookup(name)
            if name and v is None:
                raise KeyError(f"rewrite of {proto.name!r}: input {name!r} is neither an input of "
                               "the replaced node nor built for it")
            inputs.append(v)
        node = ir.Node(proto.domain, proto.op_type, inputs, name=proto.name or None,
                       attributes=[_attribute(a) for a in proto.attribute[:]],
                       outputs=[ir.Value(name=o) for o in proto.output[:]],
                       doc_string=proto.doc_string or None)
        self._scope.update((v.name, v) for v in node.outputs if v.name)
        self._protos[node] = proto
        return node

    def _proto_of(self, node: ir.Node) -> onnx.NodeProto:
        """``node`` as a NodeProto: the one it was read from or built from when it still says
        the same (the nodes are not changed in place: :meth:`replace` moves uses to values of
        the same names), else serialized again (``ir.serde.serialize_node``)."""
        proto = self._protos.get(node)
        # (a node's outputs are never None: their names are read directly)
        if proto is None or node.name != proto.name or node.op_type != proto.op_type or \
                [v.name for v in node.outputs] != proto.output[:] or \
                names_of(node.inputs) != proto.input[:] or \
                len(node.attributes) != len(proto.attribute) or not _as_serialized(proto):
            return ir.serde.serialize_node(node)
        return proto

    @staticmethod
    def detach(node: ir.Node) -> None:
        """Drop ``node``'s uses of its inputs (a node built but not kept)."""
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)

    # -- rewriting ---------------------------------------------------------------------------

    def recast(self, node: ir.Node, proto: onnx.NodeProto) -> None:
        """Make ``node`` the node ``proto`` says (its domain, op type, name and attributes),
        in place: ``proto`` reads the node's inputs and writes its outputs, by name and in
        order (:class:`Recast`); :meth:`commit` writes ``proto``."""
        node.domain, node.op_type, node.name = proto.domain, proto.op_type, proto.name
        node.overload = proto.overload
        node.doc_string = proto.doc_string or None
        node.metadata_props.clear()
        # the plain dict under onnx_ir's Attributes (UserDict: clear() pops item by item; its
        # __setitem__ only checks the key is a str and the value an Attr, as _attribute's are)
        attributes = plain(node.attributes)
        attributes.clear()
        for a in proto.attribute[:]:
            attributes[a.name] = _attribute(a)
        self._protos[node] = proto

    def record_origin(self, node: ir.Node, new: list) -> None:
        """Append ``node`` (about to be replaced by ``new``: ir nodes, or the NodeProto of a
        :class:`Recast`) to :attr:`origins`."""
        weights = {}
        for v in node.inputs:
            if v is not None and v in self._original:
                t = v.const_value
                weights[v.name] = t.raw if isinstance(t, ir.TensorProtoTensor) else ir.serde.serialize_tensor(t)
        original = onnx.NodeProto()  # a copy: :meth:`commit` empties the graph's node list
        original.CopyFrom(self._proto_of(node))
        self.origins.append((original, weights, [n.name for n in new]))

    def replace(self, old: list[ir.Node], new: list[ir.Node]) -> None:
        """Put ``new`` where the first of ``old`` is and remove ``old``. The consumers and graph
        outputs of each output of ``old`` move to the output of ``new`` with the same name; an
        output of ``old`` without one must have no readers outside ``old`` (else ValueError)."""
        made = {v.name: v for n in new for v in n.outputs if v.name}
        for node in old:
            for v in node.outputs:
                if v.name in made:
                    v.replace_all_uses_with(made[v.name], replace_graph_outputs=True)
        self.graph.insert_before(old[0], new)
        self.graph.remove(old, safe=True)

    def commit(self, keep_graph_inputs: bool = False) -> onnx.ModelProto:
        """Write the graph back into the ``ModelProto`` and return it: the nodes, and the
        initializers nothing reads any more deleted in place (weights are not copied; with
        ``keep_graph_inputs``, those that are graph inputs stay); the constants made by
        :meth:`const` that are read are appended, in the order made. A constant whose array is
        all of the bytes read from an initializer that is gone now (a weight of one value
        repeated, reshaped as its own transpose) takes that initializer's place instead: it
        is renamed and reshaped, its bytes neither copied nor held twice; not a weight
        :attr:`origins` holds for a node lowered into several, which must stay as it was. A
        constant that views the one value of a fill :meth:`array` gave (a Conv's weight of one
        value as its Gemm matrix) is copied from that initializer with its own dims, in one go
        (:meth:`_fill_source`: the bytes :func:`add_initializer` would write); when that
        initializer is gone now, the first such constant is that initializer instead, renamed,
        reshaped and moved to the constant's place (no bytes copied), and :attr:`origins`
        holds a :class:`FillWeight` of it where it held the initializer."""
        g = self.proto.graph
        # a NodeProto taken out of the list it is in stays valid (protobuf detaches it): the
        # nodes are copied once, into the emptied list, not out and back; a later commit
        # writes these same NodeProtos again (mapping the nodes to the graph's copies of them
        # instead read every entry of the list back: 4 M instructions on light DenseNet121)
        self._protos = {n: self._proto_of(n) for n in self.graph}
        del g.node[:]
        g.node.extend(self._protos.values())
        dead = {v.name for v in plain(self.graph.initializers).values()
                if not v.uses() and not v.is_graph_output() and not (keep_graph_inputs and v.is_graph_input())}
        made = []  # (name, array) of the constants read, in the order made
        heirs: dict[str, int] = {}  # an initializer gone now -> the constant of its bytes
        # the weights of a node lowered into several, held by :attr:`origins` as they are
        # (restore_host_ops may put the node back on them): not renamed nor reshaped
        held = {name for _, weights, names in self.origins if len(names) > 1 for name in weights}
        for v in self._new_consts:
            if v.name in dead:
                continue
            made.append((v.name, v.const_value.numpy()))
            root = whole_bytes(made[-1][1])
            source = self._read.get(id(root)) if root is not None else None
            if source is not None and source[0] is root and source[1] in dead and \
                    source[1] not in heirs and source[1] not in held:
                heirs[source[1]] = len(made) - 1
        # the initializer each constant of one value broadcast is written from (its bytes are
        # what add_initializer writes), looked up while every initializer has its name; one
        # that is gone now becomes the first such constant in place (renamed, reshaped, moved
        # to its place among the constants: not copied), its reads in :attr:`origins` a
        # FillWeight of it
        sources: dict[int, onnx.TensorProto] = {}
        moves: dict[int, int] = {}  # id(initializer gone now) -> the constant it becomes
        for k, (_, array) in enumerate(made):
            source = self._fill_source(array) if is_fill(array) else None
            if source is not None:
                sources[k] = source
                if source.name in dead and source.name not in heirs and id(source) not in moves:
                    moves[id(source)] = k
        moves = {i: k for i, k in moves.items() if k not in heirs.values()}
        reads: dict[int, list[dict]] = {}  # id(initializer) -> the origins' weights reading it
        if moves:
            for _, weights, _ in self.origins:
                for t in weights.values():
                    reads.setdefault(id(t), []).append(weights)
        taken = set()
        moved: dict[int, int] = {}  # id(initializer) -> the constant it became
        for index in reversed(range(len(g.initializer))):
            tensor = g.initializer[index]
            k = heirs.get(tensor.name)
            if k is not None and \
                    tensor.data_type == onnx.helper.np_dtype_to_tensor_dtype(made[k][1].dtype):
                tensor.name = made[k][0]
                del tensor.dims[:]
                tensor.dims.extend(made[k][1].shape)
                taken.add(k)
            elif tensor.name in dead:
                k = moves.get(id(tensor))
                if k is None or sources[k] is not tensor:
                    del g.initializer[index]
                    continue
                self._hand_over(tensor, made[k][1], reads)
                tensor.name = made[k][0]
                del tensor.dims[:]
                tensor.dims.extend(made[k][1].shape)
                moved[id(tensor)] = k
        appended = []  # the constants appended, in order
        for k, (name, array) in enumerate(made):
            if k not in taken:
                if is_fill(array):
                    self._made_fills[name] = fill_record(array)
                if k in moved.values():
                    continue
                appended.append(k)
                source = sources.get(k)
                if source is None:
                    add_initializer(g, array, name)
                    continue
                # the same fields and bytes add_initializer writes, copied in one go from the
                # initializer of that one value (a Conv's weight as its Gemm matrix)
                tensor = g.initializer.add()
                tensor.CopyFrom(source)
                tensor.name = name
                del tensor.dims[:]
                tensor.dims.extend(array.shape)
        if moved:  # the initializers kept, in their order, then the constants in theirs
            items = g.initializer[:]  # (alive while sorted: their ids stay theirs)
            tail = len(items) - len(appended)
            keys = {id(t): (1, moved[id(t)]) if id(t) in moved else (0, i)
                    for i, t in enumerate(items[:tail])}
            keys.update((id(t), (1, k)) for t, k in zip(items[tail:], appended))
            g.initializer.sort(key=lambda t: keys[id(t)])  # (moves the messages, no copies)
        return self.proto

    def _hand_over(self, tensor: onnx.TensorProto, array: np.ndarray, reads: dict) -> None:
        """Put a :class:`FillWeight` of ``tensor`` (an initializer of one value, about to
        become the constant ``array`` broadcasts it to) where :attr:`origins` holds it
        (``reads``: ``{id(TensorProto): [weights dicts of origins holding it]}``)."""
        weights = reads.get(id(tensor), ())
        if weights:
            weight = FillWeight(tensor.name, tensor.data_type, tuple(tensor.dims[:]),
                                array[(0,) * array.ndim].tobytes())
            for held in weights:
                for name, t in held.items():
                    if t is tensor:
                        held[name] = weight

    def _fill_source(self, array: np.ndarray) -> onnx.TensorProto | None:
        """The initializer whose bytes are what :func:`add_initializer` writes for ``array``,
        one value broadcast (:func:`is_fill`), when ``array`` views the value :meth:`array`
        broadcast from that initializer, a fill, and has its dtype and element count; the
        initializer (maybe gone from the graph now, still readable) has its name then and no
        field but the four add_initializer sets. Else None."""
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        entry = self._fill_sources.get(id(root))
        if entry is None or entry[0] is not root:
            return None
        _, tensor, name = entry
        if tensor.name != name or array.dtype != root.dtype or \
                tensor.data_type != onnx.helper.np_dtype_to_tensor_dtype(array.dtype) or \
                math.prod(tensor.dims[:]) != array.size or not tensor.HasField("raw_data") or \
                any(len(getattr(tensor, field)) for field in _OTHER_REPEATED) or \
                any(tensor.HasField(field) for field in _OTHER_SINGULAR):
            return None
        return tensor

    def current_fills(self) -> dict:
        """The initializers of the model now known to hold one value repeated, as the edit's
        ``fills`` are given (:attr:`onnx_cinm.passes.PassContext.fills`), for the next pass to
        use without reading their bytes: the edit's own ``fills`` whose initializer is still
        there under its name (an edit changes no initializer it keeps, but for the one renamed
        by :meth:`commit`, whose old name is gone), and the constants :meth:`commit` wrote as
        one value broadcast (:func:`is_fill`). Without a commit: the former alone. Every entry
        is checked again where it is read (:func:`known_fill`: element type, dims, raw_data)."""
        names = {t.name for t in self.proto.graph.initializer[:]}
        fills = {name: fill for name, fill in self._fills.items() if name in names}
        fills.update((name, fill) for name, fill in self._made_fills.items() if name in names)
        return fills


@dataclass(frozen=True)
class FillWeight:
    """A weight :attr:`Edit.origins` holds that :meth:`Edit.commit` turned into a constant of
    the rewritten model instead of copying it (a Conv's weight of one value repeated, as its
    Gemm matrix): the initializer as it was, held as its name, element type (a TensorProto
    data type) and dims, all a cost model reads, and the bytes of its one value.

    Attributes:
        name: the initializer's name.
        data_type: its ``TensorProto`` element type.
        dims: its dims.
        value: the bytes of the one value it holds (its element type's size).
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    value: bytes

    def tensor(self) -> onnx.TensorProto:
        """The initializer it was: name, data_type, dims, and raw_data the value repeated."""
        return onnx.TensorProto(name=self.name, data_type=self.data_type, dims=self.dims,
                                raw_data=self.value * math.prod(self.dims))


class Builder:
    """Builds the replacement of one node (``nodes``, in order); fresh names start with the
    node's name (or its first output's)."""

    def __init__(self, edit: Edit, node: ir.Node) -> None:
        self.edit, self.nodes, self.source = edit, [], node
        self.base = node.name or node.outputs[0].name

    def _proto(self, make: Callable[..., onnx.NodeProto], op: str, inputs: list[str],
               outputs: list[str] | None, suffix: str, attrs: dict) -> onnx.NodeProto:
        outs = outputs or [self.edit.fresh(f"{self.base}_{suffix}")]
        name = self.edit.fresh(f"{self.base}/{op}")
        self.edit.source_ops[name] = self.source.op_type
        return make(op, inputs, outs, name=name, **attrs)

    def node(self, make: Callable[..., onnx.NodeProto], op: str, inputs: list[str],
             outputs: list[str] | None, suffix: str, **attrs) -> str:
        """Append the node ``make(op, inputs, outputs, name=<base>/<op>, **attrs)`` (e.g.
        ``onnx.helper.make_node``); returns the name of its first output (``outputs[0]`` or a
        fresh ``<base>_<suffix>``)."""
        proto = self._proto(make, op, inputs, outputs, suffix, attrs)
        self.nodes.append(self.edit.add(proto))
        return proto.output[0]

    def recast(self, make: Callable[..., onnx.NodeProto], op: str, inputs: list[str],
               outputs: list[str], **attrs) -> Recast | list[ir.Node]:
        """The replacement of the node by the one node :meth:`node` would build (nothing
        built before it): a :class:`Recast` when it reads the node's inputs and writes its
        outputs, exactly (no input or output added, dropped or moved), else the built node."""
        proto = self._proto(make, op, inputs, outputs, "", attrs)
        if not self.nodes and proto.input[:] == names_of(self.source.inputs) and \
                proto.output[:] == names_of(self.source.outputs):
            return Recast(proto)
        self.nodes.append(self.edit.add(proto))
        return self.nodes


@dataclass(frozen=True)
class Replacement:
    """What a replacement returns when it replaces more than its anchor node.

    Attributes:
        nodes: the new nodes, in order; they go where the first of ``removes`` was.
        removes: the matched nodes they replace, anchor included, in graph order.
    """

    nodes: list[ir.Node]
    removes: list[ir.Node]


@dataclass(frozen=True)
class Recast:
    """What a replacement returns to turn its node into one other node that reads the same
    inputs and writes the same outputs (:meth:`Builder.recast`): the node is changed in place
    (:meth:`Edit.recast`), its values, their uses and its place kept, where a new node would be
    linked in and the old one unlinked from every input and output.

    Attributes:
        proto: the node it becomes.
    """

    proto: onnx.NodeProto


@dataclass(frozen=True)
class Rule:
    """A rewrite rule: pattern (``ops``), check and replacement, see the module docstring.

    Attributes:
        ops: op types of the nodes the rule anchors on: default domain, or
            ``"<domain>::<op type>"`` (``"com.microsoft::Gelu"``).
        check: ``check(edit, node) -> str | binding``: a string is the reason the node stays.
        replace: ``replace(edit, node, binding) -> list[ir.Node] | Replacement | Recast |
            str``: a list replaces ``node`` alone, a :class:`Recast` changes it in place.
    """

    ops: frozenset[str]
    check: Callable[[Edit, ir.Node], Any]
    replace: Callable[[Edit, ir.Node, Any], Any]

    def __call__(self, edit: Edit, node: ir.Node):
        """The replacement nodes of ``node``, or the reason it stays."""
        binding = self.check(edit, node)
        if isinstance(binding, str):
            return binding
        return self.replace(edit, node, binding)


def rule_key(node) -> str:
    """The key :func:`apply` matches a node (``onnx.NodeProto`` or ``ir.Node``) to a rule's
    :attr:`Rule.ops` by: the op type, or ``<domain>::<op type>`` outside the default domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def apply(edit: Edit, rules: list[Rule], guard: Callable[[ir.Node], str | None] = lambda n: None
          ) -> tuple[Counter, dict[str, Counter]]:
    """Run ``rules`` once over the nodes of the main graph, in order (the first rule whose pattern
    has the op type; a node of another domain matches ``"<domain>::<op type>"``). ``guard(node)`` may veto a node with a reason
    before its rule's check. Returns ``(rewritten: Counter by op type, kept: {op type: Counter of
    reasons})``."""
    table = {op: rule for rule in rules for op in rule.ops}
    rewritten: Counter = Counter()
    kept: dict[str, Counter] = {}
    for node in list(edit.graph):
        rule = table.get(rule_key(node))
        if rule is None or node.graph is not edit.graph:  # (no longer there: matched by a rule)
            continue
        edit.focus(node)
        result = guard(node)
        if result is None:
            result = rule(edit, node)
        if isinstance(result, Recast):
            op = node.op_type
            edit.record_origin(node, [result.proto])
            edit.recast(node, result.proto)
            rewritten[op] += 1
        elif isinstance(result, (list, Replacement)):
            if isinstance(result, list):
                result = Replacement(result, [node])
            if result.removes == [node]:
                edit.record_origin(node, result.nodes)
            edit.replace(result.removes, result.nodes)
            rewritten[node.op_type] += 1
        elif result:
            kept.setdefault(node.op_type, Counter())[result] += 1
    return rewritten, kept
