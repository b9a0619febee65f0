"""Graph walking shared by the passes: names read, names captured, fresh names."""
from __future__ import annotations

import onnx

from ..frontend import subgraphs


def names_read_by(node: onnx.NodeProto) -> set[str]:
    """Names ``node`` reads: its inputs and everything its subgraphs read (captured values)."""
    names = {name for name in node.input[:] if name}
    for graph in subgraphs(node):
        for inner in graph.node:
            names |= names_read_by(inner)
        names.update(output.name for output in graph.output)
    return names


def names_used_by(node: onnx.NodeProto) -> set[str]:
    """Exactly the names ``node`` takes from its scope: its inputs and the outer-scope values its
    subgraphs capture (names a subgraph defines itself -- its inputs, initializers and node
    outputs -- are not captures). :func:`names_read_by` over-approximates; this does not."""
    names = {name for name in node.input[:] if name}
    for graph in subgraphs(node):
        names |= captured(graph)
    return names


def captured(graph: onnx.GraphProto) -> set[str]:
    """The outer-scope names ``graph`` (a body) reads: names neither its inputs, initializers
    nor node outputs define, its nested bodies' captures included."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    read: set[str] = set()
    for inner in graph.node:
        read |= names_used_by(inner) - defined
        defined.update(o for o in inner.output if o)
    read |= {o.name for o in graph.output} - defined
    return read


def names_read(graph: onnx.GraphProto, skip: set[int] = frozenset()) -> set[str]:
    """Names read by the nodes of ``graph`` (except those at indices ``skip``) or its outputs."""
    names = {output.name for output in graph.output}
    inputs: set[str] = set()  # of every node at once (a set per node was most of the cost)
    for index, node in enumerate(graph.node):
        if index not in skip:
            inputs.update(node.input[:])  # (slices: lists, see rewrite's note)
            if subgraphs(node):
                names |= names_read_by(node)
    inputs.discard("")
    return names | inputs


class Names:
    """Hands out tensor/node names not used anywhere in a graph (subgraphs included)."""

    def __init__(self, graph: onnx.GraphProto):
        self._taken: set[str] = set()
        #: per base, a suffix below which every name is taken (names are only ever added, so
        #: the search for the next free one starts there: an unrolled recurrence asks one
        #: base thousands of times, and probing from 1 each time was quadratic: 6.4 s of a
        #: 200-step GRU's to_cinm)
        self._from: dict[str, int] = {}
        self._collect(graph)

    def _collect(self, graph: onnx.GraphProto) -> None:
        self._taken.update(t.name for t in graph.initializer)
        self._taken.update(v.name for v in (*graph.input, *graph.output, *graph.value_info))
        for node in graph.node:
            self._taken.update((node.name, *node.input[:], *node.output[:]))  # (slices: lists)
            for sub in subgraphs(node):
                self._collect(sub)

    def reserve(self, names) -> None:
        """Mark ``names`` as used: :meth:`fresh` never hands them out."""
        self._taken.update(names)

    def fresh(self, base: str) -> str:
        """The first of ``base``, ``base_1``, ``base_2``, ... not used yet, now used."""
        suffix = self._from.get(base, 0)
        name = base if suffix == 0 else f"{base}_{suffix}"
        while name in self._taken:
            suffix += 1
            name = f"{base}_{suffix}"
        self._taken.add(name)
        self._from[base] = suffix + 1
        return name


def drop_unread_initializers(graph: onnx.GraphProto, keep: set[str] = frozenset()) -> int:
    """Delete the initializers of ``graph`` nobody reads (but those named in ``keep``), in place:
    each is deleted where it stands, so the others are neither copied nor moved to a new list
    (rebuilding the list copies every weight). Returns how many were deleted."""
    read = names_read(graph)
    dropped = 0
    for index in reversed(range(len(graph.initializer))):
        name = graph.initializer[index].name
        if name not in read and name not in keep:
            del graph.initializer[index]
            dropped += 1
    return dropped
