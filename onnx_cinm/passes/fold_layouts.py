"""Pass ``fold_layouts``: a device Gemm writes its result in the layout its consumer reads.

Pattern, check and replacement:

==========================================  ==========================================
pattern                                     replacement
==========================================  ==========================================
``Y0 = cinm.Gemm(A, B, C?)`` on device D,   ``Y = cinm.Gemm(A, B, C?; y_perm=perm)`` on D
``Y = Transpose(Y0; perm)``
==========================================  ==========================================

The match holds when the Transpose (a standard one, or a cinm one left on the host) is the
only reader of ``Y0``, ``Y0`` is no graph output, and D declares that its kernel writes the
permuted layout itself (:meth:`Device.writes_permuted`); a Gemm on any other device keeps its
Transpose. ``to_cinm`` lowers every Conv to ``Im2Col -> Gemm -> Transpose`` (the product is
``[N, *O, M]``, the Conv's result ``[N, M, *O]``); after this pass a crossbar Gemm writes NCHW
itself and the host runs no Transpose (issue 16; ``benchmarks/runtime_overhead.py``, one
thread: light ResNet50's host partitions took 17 ms per run before, 9 ms after; SqueezeNet's
4.2 and 2.3 ms). The reference body of a Gemm with ``y_perm`` is the same
MatMul (+ Add) then that Transpose, so the model's numbers do not change.

It runs after ``placement`` (it needs each Gemm's device) and before the paradigm passes,
which plan the Gemm as before: the product and its tiles are the same, only the layout it is
written in changes.
"""
from __future__ import annotations

import onnx
from onnx import helper

from .. import devices
from ..analysis import op_info
from ..dialects import cinm
from .graph_names import names_used_by
from . import PassContext, register_pass


def _perm(node: onnx.NodeProto, rank: int | None) -> list[int] | None:
    """A Transpose's permutation (its default, the reversed axes, needs the rank)."""
    for a in node.attribute[:]:
        if a.name == "perm":
            return a.ints[:]
    return None if rank is None else list(range(rank))[::-1]


def _is_host_transpose(node: onnx.NodeProto) -> bool:
    if node.op_type != "Transpose":
        return False
    if node.domain in ("", "ai.onnx"):
        return True
    return node.domain == cinm.DOMAIN and cinm.node_attrs(node).get("device", "host") == "host"


@register_pass("fold_layouts", keeps_shapes=True)
def fold_layouts(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Fold the Transpose after a device Gemm into the Gemm (``y_perm``) when the device writes
    that layout itself: a crossbar Conv writes NCHW.

    Records ``ctx.stats["fold_layouts"] = {"folded": n}``.
    """
    g = model.graph
    readers: dict[str, list] = {}
    for node in g.node:
        for name in names_used_by(node):
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in g.output}
    infos = None
    folded, dropped = 0, []
    for node in g.node:
        if node.domain != cinm.DOMAIN or node.op_type != "Gemm":
            continue
        at = cinm.node_attrs(node)
        if at.get("device", "host") == "host" or "y_perm" in at:
            continue
        y0 = node.output[0]
        users = readers.get(y0, [])
        if y0 in outputs or len(users) != 1 or not _is_host_transpose(users[0]):
            continue
        t = users[0]
        if infos is None:
            infos = ctx.tensor_infos(model)
        info = op_info(node, infos)
        shape = info.outputs[0].shape if info.outputs else None
        perm = _perm(t, None if shape is None else len(shape))
        if perm is None or not devices.get_device(at["device"]).writes_permuted(info, perm):
            continue
        node.attribute.append(helper.make_attribute("y_perm", perm))
        node.output[0] = t.output[0]
        dropped.append(t)
        folded += 1
    if folded:
        gone = {id(t) for t in dropped}
        keep = [n for n in g.node if id(n) not in gone]
        del g.node[:]
        g.node.extend(keep)
        stale = {t.input[0] for t in dropped}  # the Gemms' former outputs
        vis = [vi for vi in g.value_info if vi.name not in stale]
        del g.value_info[:]
        g.value_info.extend(vis)
        cinm.attach_functions(model)  # the Gemm's overload and body with y_perm
        ctx.infos_still_hold(model)  # each Gemm writes its Transpose's output, same shape
    ctx.stats["fold_layouts"] = {"folded": folded}
    return model
