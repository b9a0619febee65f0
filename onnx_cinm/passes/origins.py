"""What ``to_cinm`` lowered, for ``restore_host_ops`` (:mod:`.host_restore`): each node it replaced
alone, as ``(NodeProto, {initializer name: TensorProto it read, or a FillWeight of it},
[names of the nodes it became])`` (:attr:`onnx_cinm.rewrite.Edit.origins`; a
:class:`onnx_cinm.rewrite.FillWeight` stands for a weight of one value that the lowering made
its reshaped copy of without copying it), kept in :attr:`onnx_cinm.passes.PassContext.origins`
from one pass to the other."""
from __future__ import annotations

import onnx

from ..rewrite import rule_key
from .recurrent import RULES as RECURRENT_RULES

#: Source ops never put back: a recurrence unrolled over its sequence (:mod:`.recurrent`) fixed
#: the model to that length (:func:`onnx_cinm.frontend.add_unrolled_dims`), which one restored
#: node would not undo.
NEVER_RESTORED = frozenset().union(*(rule.ops for rule in RECURRENT_RULES))




def _stub(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)


def stub_origins(origins: list) -> list:
    """``origins`` with every weight a stub (name, type and dims): enough to price the nodes
    put back (:func:`onnx_cinm.sweep.evaluate`), not to run them."""
    return [(proto, {n: _stub(t) for n, t in weights.items()}, names)
            for proto, weights, names in origins]


def slim_origins(origins: list) -> list:
    """``to_cinm``'s record (:attr:`onnx_cinm.rewrite.Edit.origins`) with the weights of the
    nodes ``restore_host_ops`` never puts back (1:1 lowerings, recurrences) as stubs: name, type and
    dims, all the cost model reads; the data of a weight the lowering rewrote (a Conv's,
    reshaped) is then not held beside its rewritten copy through placement."""
    out = []
    for proto, weights, names in origins:
        if rule_key(proto) in NEVER_RESTORED or len(names) < 2:
            weights = {n: _stub(t) for n, t in weights.items()}
        out.append((proto, weights, names))
    return out
