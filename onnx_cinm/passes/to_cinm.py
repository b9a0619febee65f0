"""Pass ``to_cinm``: rewrite standard ONNX compute ops into device-agnostic ``cinm`` ops.

Patterns and their replacements (everything else stays a standard op on the host):

==============================  =============================================================
ONNX                            cinm
==============================  =============================================================
MatMul A[.., M, K] B[.., K, N]  Gemm(A, B)
MatMul A[M, K] b[K]             Gemv(A, b)
MatMul a[K] B[K, N]             Gemv(B^T, a) if B is constant, else Gemm(a[None], B)[.., 0, :]
MatMul a[K] b[K]                Gemv(a[None], b)[0]
Gemm (canonical: no trans,      Gemm(A, B, C)
alpha = beta = 1, see normalize)
Conv X W B? (1-D/2-D/3-D,       Im2Col(X) -> Gemm(cols, W as [C*k, M], B) -> Transpose to NC*;
groups, strides, dilations,     with groups: per-group batched Gemm W[G, .., C/G*k, M/G]
pads, auto_pad)
Add Sub Mul Div Max Min (2 in)  the same cinm op
Relu Abs Neg Exp Log Sqrt       the same cinm op
Sigmoid Tanh LeakyRelu
HardSigmoid Clip
ReduceSum/Prod/Max/Min          Reduce(kind = add|mul|max|min, explicit axes)
ReduceMean                      Reduce(add) then Div by the (static) element count
CumSum (constant axis)          Scan(axis, exclusive, reverse)
TopK (constant k)               TopK(k, axis, largest, sorted)
Transpose                       Transpose(perm)
MatMulInteger A B a_zp? b_zp?   Gemm(int32(A) - a_zp, int32(B) - b_zp): exact int32, as ORT
ConvInteger X W x_zp? w_zp?     the Conv lowering on int32(X) - x_zp, int32(W) - w_zp
==============================  =============================================================

Ops on the shape path (computing shapes from ``Shape``/``Size``) are never lowered: they are
bookkeeping, not work for a device. Nor are ops with an empty operand or result (a static
zero-sized dim): there is nothing to compute. Weights that are initializers are reshaped and transposed
here, in numpy; non-constant operands get explicit Reshape/Transpose nodes.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..analysis import tensor_infos
from ..dialects import cinm
from ..graph import TensorInfo
from . import PassContext, register_pass
from .graph_names import Names, drop_unread_initializers

_BINARY = set(cinm.BINARY_OPS)
_UNARY = set(cinm.UNARY_OPS)
_REDUCE = {"ReduceSum": "add", "ReduceProd": "mul", "ReduceMax": "max", "ReduceMin": "min"}
_MATMUL_TYPES = {"float32", "float64", "float16", "int32", "int64", "uint32", "uint64"}
_NUMERIC = _MATMUL_TYPES | {"int8", "uint8", "int16", "uint16"}


class _Rewriter:
    """Holds the model being rewritten: fresh names, constants, tensor infos."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.infos = tensor_infos(model)
        self.inits = {i.name: i for i in self.graph.initializer}
        self.new_inits: list[onnx.TensorProto] = []
        self.fresh = Names(self.graph).fresh
        self.opset = cinm.default_opset(model)
        self.shape_path = self._shape_path()

    def _shape_path(self) -> set[str]:
        """Tensors computed from Shape/Size (shape bookkeeping)."""
        path: set[str] = set()
        for n in self.graph.node:
            if n.op_type in ("Shape", "Size") or (
                    any(i in path for i in n.input) and
                    all(i in path or i in self.inits or not i for i in n.input)):
                path.update(n.output)
        return path

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        # np.array(order="C"), not np.ascontiguousarray: the latter turns a 0-d scalar into 1-d
        self.new_inits.append(numpy_helper.from_array(np.array(array, order="C"), name))
        self.infos[name] = TensorInfo(name, array.dtype, tuple(array.shape), True)
        return name

    def value(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def info(self, name: str) -> TensorInfo | None:
        return self.infos.get(name)

    def dtype_name(self, name: str) -> str | None:
        i = self.info(name)
        return None if i is None or i.dtype is None else np.dtype(i.dtype).name

    def empty(self, names) -> bool:
        """True when one of the tensors has a static zero-sized dim (it holds no elements)."""
        for name in names:
            i = self.info(name) if name else None
            if i is not None and i.shape is not None and any(d == 0 for d in i.shape):
                return True
        return False

    def rank(self, name: str) -> int | None:
        i = self.info(name)
        return None if i is None or i.shape is None else len(i.shape)


def _attrs(node: onnx.NodeProto) -> dict:
    return cinm.node_attrs(node)


class _Lowering:
    """Builds the replacement nodes of one source node."""

    def __init__(self, rw: _Rewriter, node: onnx.NodeProto) -> None:
        self.rw, self.node, self.nodes = rw, node, []
        self.base = node.name or node.output[0]

    def cinm(self, op: str, inputs: list[str], outputs: list[str] | None = None, suffix: str = "",
             **attrs) -> str:
        outs = outputs or [self.rw.fresh(f"{self.base}_{suffix or op.lower()}")]
        self.nodes.append(cinm.make_node(op, inputs, outs, name=self.rw.fresh(f"{self.base}/{op}"),
                                         **attrs))
        return outs[0]

    def std(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        outs = outputs or [self.rw.fresh(f"{self.base}_{op.lower()}")]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.rw.fresh(f"{self.base}/{op}"),
                                           **attrs))
        return outs[0]

    def ints(self, suffix: str, values) -> str:
        return self.rw.const(f"{self.base}_{suffix}", np.asarray(values, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# Pattern rules: each returns the replacement nodes, or a string saying why the node stays.
# ---------------------------------------------------------------------------------------------

def _lower_matmul(rw: _Rewriter, node: onnx.NodeProto):
    a, b = node.input
    ra, rb = rw.rank(a), rw.rank(b)
    if ra is None or rb is None:
        return "operand rank unknown"
    if rw.dtype_name(a) not in _MATMUL_TYPES:
        return f"dtype {rw.dtype_name(a)}"
    lo, y = _Lowering(rw, node), node.output[0]
    if ra >= 2 and rb >= 2:
        lo.cinm("Gemm", [a, b], [y])
    elif ra == 2 and rb == 1:
        lo.cinm("Gemv", [a, b], [y])
    elif ra == 1 and rb == 2 and rw.value(b) is not None:
        bt = rw.const(f"{lo.base}_BT", rw.value(b).T)
        lo.cinm("Gemv", [bt, a], [y])
    elif ra >= 2 and rb == 1:  # batched matrix times vector: b as a column
        bcol = lo.std("Unsqueeze", [b, lo.ints("axis", [-1])])
        lo.std("Squeeze", [lo.cinm("Gemm", [a, bcol]), lo.ints("axis", [-1])], [y])
    elif ra == 1 and rb == 1:  # dot product: a as a 1 x K matrix
        arow = lo.std("Unsqueeze", [a, lo.ints("axis", [0])])
        lo.std("Squeeze", [lo.cinm("Gemv", [arow, b]), lo.ints("axis", [0])], [y])
    elif ra == 1:  # vector times (batched) matrix: a as a row
        arow = lo.std("Unsqueeze", [a, lo.ints("axis", [0])])
        lo.std("Squeeze", [lo.cinm("Gemm", [arow, b]), lo.ints("axis", [-2])], [y])
    else:
        return "unsupported ranks"
    return lo.nodes


def _lower_gemm(rw: _Rewriter, node: onnx.NodeProto):
    at = _attrs(node)
    if at.get("transA", 0) or at.get("transB", 0) or at.get("alpha", 1.0) != 1.0 or \
            (at.get("beta", 1.0) != 1.0 and len(node.input) > 2 and node.input[2]):
        return "non-canonical Gemm attributes (the normalize pass was skipped)"
    if rw.dtype_name(node.input[0]) not in _MATMUL_TYPES:
        return f"dtype {rw.dtype_name(node.input[0])}"
    lo = _Lowering(rw, node)
    lo.cinm("Gemm", [i for i in node.input if i], [node.output[0]])
    return lo.nodes


def _same_pads(in_dims, ks, st, dl, mode: str) -> list[int] | None:
    begins, ends = [], []
    for s, k, stride, d in zip(in_dims, ks, st, dl):
        if not isinstance(s, int):
            return None
        out = -(-s // stride)
        total = max(0, (out - 1) * stride + (k - 1) * d + 1 - s)
        small, big = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else big)
        ends.append(big if mode == "SAME_UPPER" else small)
    return begins + ends


def _lower_conv(rw: _Rewriter, node: onnx.NodeProto):
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    xi, wi = rw.info(x), rw.info(w)
    if xi is None or xi.shape is None or wi is None or wi.shape is None:
        return "input or weight shape unknown"
    if not all(isinstance(d, int) for d in wi.shape) or not isinstance(xi.shape[1], int):
        return "weight shape or channel count not static"
    if rw.dtype_name(x) not in ("float32", "float64", "float16", "int32"):  # int32: ConvInteger's
        return f"dtype {rw.dtype_name(x)}"
    r = len(wi.shape) - 2
    at = _attrs(node)
    m, cg = wi.shape[0], wi.shape[1]
    ks = list(at.get("kernel_shape", wi.shape[2:]))
    st = list(at.get("strides", [1] * r))
    dl = list(at.get("dilations", [1] * r))
    g = int(at.get("group", 1))
    auto_pad = at.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(xi.shape[2:], ks, st, dl, auto_pad)
        if pads is None:
            return "auto_pad SAME with dynamic spatial dims"
    elif auto_pad == "VALID":
        pads = [0] * (2 * r)
    else:
        pads = list(at.get("pads", [0] * (2 * r)))
    kk = int(np.prod(ks))
    lo = _Lowering(rw, node)
    y = node.output[0]
    cols = lo.cinm("Im2Col", [x], suffix="cols", kernel_shape=ks, strides=st, pads=pads, dilations=dl)
    to_nchw = [0, r + 1] + list(range(1, r + 1))
    w_val = rw.value(w)
    if g == 1:
        if w_val is not None:
            wm = rw.const(f"{lo.base}_W_gemm", w_val.reshape(m, cg * kk).T)
        else:
            wm = lo.std("Transpose", [lo.std("Reshape", [w, lo.ints("wshape", [m, cg * kk])])], perm=[1, 0])
        gemm = lo.cinm("Gemm", [cols, wm] + ([bias] if bias else []), suffix="gemm")
        lo.std("Transpose", [gemm], [y], perm=to_nchw)
        return lo.nodes
    mg = m // g
    wshape = [g] + [1] * (r - 1) + [cg * kk, mg]
    if w_val is not None:
        wm = rw.const(f"{lo.base}_W_gemm", w_val.reshape(g, mg, cg * kk).transpose(0, 2, 1).reshape(wshape))
    else:
        w3 = lo.std("Reshape", [w, lo.ints("wshape", [g, mg, cg * kk])])
        wm = lo.std("Reshape", [lo.std("Transpose", [w3], perm=[0, 2, 1]), lo.ints("wshape", wshape)])
    bias_in = []
    if bias:
        bshape = [g] + [1] * r + [mg]
        b_val = rw.value(bias)
        bias_in = [rw.const(f"{lo.base}_B_gemm", b_val.reshape(bshape)) if b_val is not None
                   else lo.std("Reshape", [bias, lo.ints("bshape", bshape)])]
    # cols [N, *O, C*k] -> [N, *O, G, C/G*k] -> [N, G, *O, C/G*k]
    grouped = lo.std("Reshape", [cols, lo.ints("gshape", [0] * (1 + r) + [g, cg * kk])])
    grouped = lo.std("Transpose", [grouped], perm=[0, r + 1] + list(range(1, r + 1)) + [r + 2])
    gemm = lo.cinm("Gemm", [grouped, wm] + bias_in, suffix="gemm")  # [N, G, *O, M/G]
    back = lo.std("Transpose", [gemm], perm=[0] + list(range(2, r + 2)) + [1, r + 2])  # [N, *O, G, M/G]
    merged = lo.std("Reshape", [back, lo.ints("mshape", [0] * (1 + r) + [m])])
    lo.std("Transpose", [merged], [y], perm=to_nchw)
    return lo.nodes


def _lower_elementwise(rw: _Rewriter, node: onnx.NodeProto):
    op = node.op_type
    if op in ("Max", "Min") and len(node.input) != 2:
        return "variadic Max/Min"
    if op in _BINARY and len(node.input) != 2:
        return "unexpected arity"
    if op == "Clip" and rw.opset < 11:
        return "Clip below opset 11"
    dt = rw.dtype_name(node.input[0])
    allowed = {"float32", "float64", "float16"} if op in ("Exp", "Log", "Sqrt", "Sigmoid", "Tanh",
                                                          "LeakyRelu", "HardSigmoid") else _NUMERIC
    if dt not in allowed:
        return f"dtype {dt}"
    lo = _Lowering(rw, node)
    keep = {k: v for k, v in _attrs(node).items() if k in cinm.OPS[op].attrs}
    inputs = list(node.input)
    if op == "Clip":  # always 3 inputs: the cinm Clip schema's inference reads input 2 (max)
        inputs += [""] * (3 - len(inputs))
    lo.cinm(op, inputs, [node.output[0]], **keep)
    return lo.nodes


def _reduce_axes(rw: _Rewriter, node: onnx.NodeProto):
    """Explicit, sorted, non-negative axes of a Reduce node, or a reason string."""
    at = _attrs(node)
    rank = rw.rank(node.input[0])
    if len(node.input) > 1 and node.input[1]:
        v = rw.value(node.input[1])
        if v is None:
            return "axes are computed at run time"
        axes = [int(a) for a in v.reshape(-1)]
    else:
        axes = list(at.get("axes", []))
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return "empty axes with noop_with_empty_axes=1"
        if rank is None:
            return "rank unknown"
        axes = list(range(rank))
    if rank is not None:
        axes = sorted({a % rank for a in axes})
    elif any(a < 0 for a in axes):
        return "negative axes with unknown rank"
    return axes


def _lower_reduce(rw: _Rewriter, node: onnx.NodeProto):
    dt = rw.dtype_name(node.input[0])
    if dt not in _NUMERIC:
        return f"dtype {dt}"
    axes = _reduce_axes(rw, node)
    if isinstance(axes, str):
        return axes
    keepdims = int(_attrs(node).get("keepdims", 1))
    lo = _Lowering(rw, node)
    if node.op_type != "ReduceMean":
        lo.cinm("Reduce", [node.input[0]], [node.output[0]], kind=_REDUCE[node.op_type], axes=axes,
                keepdims=keepdims)
        return lo.nodes
    shape = rw.info(node.input[0]).shape
    counted = [shape[a] for a in axes]
    if not all(isinstance(c, int) for c in counted) or dt not in ("float32", "float64", "float16"):
        return "ReduceMean over dynamic dims"
    total = lo.cinm("Reduce", [node.input[0]], kind="add", axes=axes, keepdims=keepdims, suffix="sum")
    count = rw.const(f"{lo.base}_count", np.array(int(np.prod(counted)), dtype=np.dtype(dt)))
    lo.cinm("Div", [total, count], [node.output[0]])
    return lo.nodes


def _lower_cumsum(rw: _Rewriter, node: onnx.NodeProto):
    axis = rw.value(node.input[1])
    if axis is None:
        return "axis computed at run time"
    dt = rw.dtype_name(node.input[0])
    if dt not in ("float32", "float64", "int32", "int64", "uint32", "uint64"):
        return f"dtype {dt}"
    at = _attrs(node)
    lo = _Lowering(rw, node)
    lo.cinm("Scan", [node.input[0]], [node.output[0]], kind="add", axis=int(axis.reshape(-1)[0]),
            exclusive=int(at.get("exclusive", 0)), reverse=int(at.get("reverse", 0)))
    return lo.nodes


def _lower_topk(rw: _Rewriter, node: onnx.NodeProto):
    if rw.opset < 10 or len(node.input) < 2:
        return "TopK below opset 10"
    k = rw.value(node.input[1])
    if k is None:
        return "k computed at run time"
    dt = rw.dtype_name(node.input[0])
    if dt not in _NUMERIC:
        return f"dtype {dt}"
    at = _attrs(node)
    lo = _Lowering(rw, node)
    outs = list(node.output) + [""] * (2 - len(node.output))
    outs = [o or rw.fresh(f"{lo.base}_unused") for o in outs]
    lo.cinm("TopK", [node.input[0]], outs, k=int(k.reshape(-1)[0]), axis=int(at.get("axis", -1)),
            largest=int(at.get("largest", 1)), sorted=int(at.get("sorted", 1)))
    return lo.nodes


def _lower_transpose(rw: _Rewriter, node: onnx.NodeProto):
    perm = _attrs(node).get("perm")
    if perm is None:
        rank = rw.rank(node.input[0])
        if rank is None:
            return "rank unknown"
        perm = list(reversed(range(rank)))
    lo = _Lowering(rw, node)
    lo.cinm("Transpose", [node.input[0]], [node.output[0]], perm=list(perm))
    return lo.nodes


def _minus_zero_point(rw: _Rewriter, lo: _Lowering, x: str, zp: str | None, zp_shape: list | None,
                      tag: str) -> str | None:
    """``int32(x) - int32(zp)``: folded into an int32 initializer when both are constant, else a
    Cast and a Sub on the host (a zero point made at run time, as DynamicQuantizeLinear's, is
    cast too). ``zp_shape`` reshapes a per-row/per-channel zero point for broadcasting (None:
    as it is). None if the shapes are unknown."""
    xi, zi = rw.info(x), (rw.info(zp) if zp else None)
    if xi is None or xi.shape is None or (zp and (zi is None or zi.shape is None)):
        return None
    z = rw.value(zp) if zp else None
    z32 = None if z is None else z.astype(np.int32).reshape(zp_shape if zp_shape else z.shape)
    x_val = rw.value(x)
    if x_val is not None and (z32 is not None or not zp):
        return rw.const(f"{lo.base}_{tag}", x_val.astype(np.int32) - (0 if z32 is None else z32))
    out = lo.std("Cast", [x], to=onnx.TensorProto.INT32)
    if z32 is not None and z32.any():
        out = lo.std("Sub", [out, rw.const(f"{lo.base}_{tag}_zp", z32)])
    elif zp and z is None:  # computed at run time: cast it, and make a 1-D one a column
        zr = lo.std("Cast", [zp], to=onnx.TensorProto.INT32)
        if zp_shape is not None and len(zi.shape) == 1:
            zr = lo.std("Unsqueeze", [zr, lo.ints("axis", [-1])])
        out = lo.std("Sub", [out, zr])
    rw.infos[out] = TensorInfo(out, np.dtype(np.int32), xi.shape, False)
    return out


def _lower_integer(rw: _Rewriter, node: onnx.NodeProto):
    """MatMulInteger / ConvInteger as an int32 cinm Gemm (and Im2Col) of zero-point-corrected
    operands: ``(A - a_zp) @ (B - b_zp)``, exact in int32 as onnxruntime computes it. Padding a
    corrected input with 0 equals padding the raw one with its zero point, as ConvInteger does."""
    ins = list(node.input) + [""] * (4 - len(node.input))
    x, w, xzp, wzp = ins[:4]
    if rw.dtype_name(x) not in ("int8", "uint8") or rw.dtype_name(w) not in ("int8", "uint8"):
        return f"dtype {rw.dtype_name(x)} x {rw.dtype_name(w)}"
    lo = _Lowering(rw, node)
    wi, xi = rw.info(w), rw.info(x)
    if wi is None or wi.shape is None or xi is None or xi.shape is None:
        return "operand shape unknown"
    xz, wz = (rw.value(n) if n else None for n in (xzp, wzp))
    if node.op_type == "MatMulInteger":
        # a per-row zero point of a 2-D A is [M]: a column for broadcasting; B's per-column [N] as is
        xzi = rw.info(xzp) if xzp else None
        per_row = (xz is not None and xz.ndim == 1 and xz.size > 1) or \
            (xz is None and xzi is not None and xzi.shape is not None and len(xzi.shape) == 1)
        x_shape = [-1, 1] if per_row else None
        w_shape = None
    else:  # ConvInteger: x's zero point is a scalar; w's may be per output channel [M]
        x_shape = None
        w_shape = [-1] + [1] * (len(wi.shape) - 1) if wz is not None and wz.ndim == 1 and wz.size > 1 else None
    x32 = _minus_zero_point(rw, lo, x, xzp or None, x_shape, "x32")
    w32 = _minus_zero_point(rw, lo, w, wzp or None, w_shape, "w32")
    if x32 is None or w32 is None:
        return "operand or zero point shape unknown"
    std_op = "MatMul" if node.op_type == "MatMulInteger" else "Conv"
    proxy = helper.make_node(std_op, [x32, w32], list(node.output), name=node.name)
    proxy.attribute.extend(a for a in node.attribute)
    inner = _RULES[std_op](rw, proxy)
    if isinstance(inner, str):
        return inner
    return lo.nodes + inner


_RULES = {"MatMul": _lower_matmul, "Gemm": _lower_gemm, "Conv": _lower_conv, "CumSum": _lower_cumsum,
          "TopK": _lower_topk, "Transpose": _lower_transpose, "ReduceMean": _lower_reduce,
          "MatMulInteger": _lower_integer, "ConvInteger": _lower_integer,
          **{op: _lower_reduce for op in _REDUCE}, **{op: _lower_elementwise for op in _BINARY | _UNARY}}


@register_pass("to_cinm")
def to_cinm(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Rewrite MatMul/Gemm/Conv, elementwise, Reduce*, CumSum, TopK, Transpose into cinm ops.

    Reads ``ctx.options["lower_ops"]`` (optional set of source op types to lower; default all).
    Records ``ctx.stats["to_cinm"] = {"lowered": Counter, "kept": {op: Counter of reasons}}``.
    """
    rw = _Rewriter(model)
    only = ctx.options.get("lower_ops")
    lowered: Counter = Counter()
    kept: dict[str, Counter] = {}
    out_nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        rule = _RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        result = None
        if rule is not None and (only is None or node.op_type in only):
            if any(o in rw.shape_path for o in node.output):
                result = "shape computation"
            elif rw.empty(list(node.input) + list(node.output)):
                result = "empty tensor (a zero-sized dim): no work for a device"
            else:
                result = rule(rw, node)
        if isinstance(result, list):
            out_nodes.extend(result)
            lowered[node.op_type] += 1
        else:
            if result:
                kept.setdefault(node.op_type, Counter())[result] += 1
            out_nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(out_nodes)
    model.graph.initializer.extend(rw.new_inits)
    drop_unread_initializers(model.graph)
    cinm.attach_functions(model)
    ctx.stats["to_cinm"] = {"lowered": lowered, "kept": kept}
    ctx.log(f"to_cinm: lowered {sum(lowered.values())} nodes {dict(lowered)}")
    return model

