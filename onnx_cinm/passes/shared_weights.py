"""One weight, one initializer: uses of a weight through ``Identity`` nodes, and byte-identical
copies of it, read the initializer itself.

Exporters write a weight that several layers share (tied embeddings, a layer applied N times)
as ``Identity(W)`` per use. Folded as any other constant node, each ``Identity`` became a copy
of ``W``; every copy then got its own crossbar tiles and its own bytes in the written model
(chython-rxnmap: 54 such nodes, an 85 MB model written as 643 MB), and kernels over the same
weights could never share tiles. This pass runs before :func:`.canonicalize.fold_constants`.
"""
from __future__ import annotations

import hashlib

import onnx

from ..frontend import subgraphs
from . import PassContext, register_pass
from .graph_names import names_used_by


def _constant_initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The initializers of ``graph`` that are constants (not also graph inputs, which a caller
    may override), by name."""
    inputs = {i.name for i in graph.input}
    return {t.name: t for t in graph.initializer if t.name not in inputs}


def _pinned_names(graph: onnx.GraphProto) -> set[str]:
    """Names that must keep their producer: graph outputs and the outer values a body
    captures (bodies are not renamed here)."""
    pinned = {o.name for o in graph.output}
    for node in graph.node:
        if subgraphs(node):
            pinned |= names_used_by(node) - {n for n in node.input}
    return pinned


def _rename_inputs(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Make every main-graph node input named a key of ``names`` read its value instead."""
    for node in graph.node:
        for k, name in enumerate(node.input[:]):  # (renamed in place: same length)
            if name in names:
                node.input[k] = names[name]


def resolve_identities(graph: onnx.GraphProto) -> int:
    """Make every node input that is ``Identity`` (or a chain of them) of a constant
    initializer read the initializer itself, in place; the ``Identity`` nodes nobody reads
    any more go. An ``Identity`` whose output is a graph output or a value a body (If/Loop/Scan)
    captures stays, so the graph's interface and the bodies are unchanged. Main graph only.

    Returns:
        The number of ``Identity`` nodes removed.
    """
    constants = _constant_initializers(graph)
    source: dict[str, str] = {}  # Identity output -> the initializer it passes through
    for node in graph.node:  # topological order: a chain resolves link by link
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and len(node.input) == 1:
            origin = source.get(node.input[0], node.input[0])
            if origin in constants and node.output[0] not in constants:
                source[node.output[0]] = origin
    if not source:
        return 0
    _rename_inputs(graph, source)
    pinned = _pinned_names(graph)
    keep = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in source
                                          and n.output[0] not in pinned)]
    removed = len(graph.node) - len(keep)
    if removed:
        gone = source.keys() - pinned
        del graph.node[:]
        graph.node.extend(keep)
        infos = [v for v in graph.value_info if v.name not in gone]
        if len(infos) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(infos)
    return removed


def _shape_key(tensor: onnx.TensorProto) -> tuple | None:
    """(dtype, dims) of an initializer stored as ``raw_data`` in the model, else None (typed
    fields, external data: left alone)."""
    if not tensor.HasField("raw_data") or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return tensor.data_type, tuple(tensor.dims[:])


def merge_identical_initializers(graph: onnx.GraphProto) -> int:
    """Make the node inputs that read a constant initializer byte-identical to an earlier one
    (same dtype, dims and ``raw_data``; compared in full after a 128-bit digest matches) read
    the earlier one, in place, and delete the copies nobody reads any more (a copy that is a
    graph output or captured by a body stays). Main graph only.

    Returns:
        The number of initializers deleted.
    """
    by_shape: dict[tuple, list[tuple[str, onnx.TensorProto]]] = {}
    for name, tensor in _constant_initializers(graph).items():
        key = _shape_key(tensor)
        if key is not None:
            by_shape.setdefault(key, []).append((name, tensor))
    alias: dict[str, str] = {}
    for group in by_shape.values():
        if len(group) < 2:  # only a weight of the same dtype and dims can be a copy: no hashing
            continue
        first: dict[bytes, onnx.TensorProto] = {}  # digest -> the first tensor with it
        for name, tensor in group:
            digest = hashlib.blake2b(tensor.raw_data, digest_size=16).digest()
            seen = first.setdefault(digest, tensor)
            if seen is not tensor and seen.raw_data == tensor.raw_data:
                alias[name] = seen.name
    if not alias:
        return 0
    _rename_inputs(graph, alias)
    gone = set(alias) - _pinned_names(graph)  # a copy a body captures or the graph outputs stays
    for k in reversed(range(len(graph.initializer))):
        if graph.initializer[k].name in gone:
            del graph.initializer[k]
    return len(gone)


@register_pass("share_weights")
def share_weights(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Resolve ``Identity`` chains of initializers and merge byte-identical initializers, so
    a weight used N times is one initializer (one set of crossbar tiles, stored once).

    ``ctx.stats["share_weights"]`` receives ``{"identities": n, "merged": m}`` (Identity
    nodes removed, initializers deleted). Rewrites ``model`` in place and returns it.
    """
    graph = model.graph
    identities = resolve_identities(graph)
    merged = merge_identical_initializers(graph)
    ctx.stats["share_weights"] = {"identities": identities, "merged": merged}
    if identities or merged:
        ctx.log(f"share_weights: {identities} Identity nodes of initializers resolved, "
                f"{merged} duplicate initializers merged")
    return model
