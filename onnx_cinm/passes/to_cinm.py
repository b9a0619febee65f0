"""Pass ``to_cinm``: rewrite standard ONNX compute ops into device-agnostic ``cinm`` ops.

Patterns and their replacements (everything else stays a standard op on the host):

==============================  =============================================================
ONNX                            cinm
==============================  =============================================================
MatMul A[.., M, K] B[.., K, N]  Gemm(A, B)
MatMul A[M, K] b[K]             Gemv(A, b)
MatMul a[K] B[K, N]             Gemv(B^T, a) if B is constant, else Gemm(a[None], B)[.., 0, :]
MatMul a[K] b[K]                Gemv(a[None], b)[0]
Gemm (canonical: no trans,      Gemm(A, B, C); with C, onnx_gemm=1 (its body is ONNX Gemm)
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
LSTM GRU RNN (static length)    Gemm for the input projection of all steps, a Gemm per step
                                over the shared R, gate math as standard ops (.recurrent)
com.microsoft                   the LSTM form with int32 Gemms: X (whole sequence) and each
DynamicQuantizeLSTM             H_{t-1} by DynamicQuantizeLinear, (q - zp) @ (W - w_zp), Cast,
                                Mul by a_scale * w_scale, as onnxruntime's kernel (.recurrent)
QLinearMatMul, QLinearConv      the MatMulInteger/ConvInteger lowering (QLinearConv's int32
                                bias in the Gemm), then Cast, Mul by the float32 multiplier
                                (x_scale * w_scale) / y_scale and QuantizeLinear(scale 1,
                                y_zp) on the host: onnxruntime's requantization, bit-exact
MatMul/Conv/Gemm of two         Gemm(int32(x_q) - x_zp, int32(w_q) - w_zp), Cast, Mul by
DequantizeLinear outputs (QDQ)  x_scale * w_scale (+ a float bias) on the host; the weight's
                                DequantizeLinear is not folded (canonicalize keeps it)
Softmax (float32)               Softmax over the last axis; over another axis: Transpose (the
                                axis last), Softmax, Transpose back
LayerNormalization (float32,    LayerNorm(X, Scale, B; axis, epsilon) when only Y is read
static normalized dims)
Gelu (opset 20, float32)        Gelu(approximate)
com.microsoft Gelu, BiasGelu,   Gelu (none; tanh for FastGelu), after an Add of the bias
FastGelu (float32)
Div(x, sqrt 2) or Mul(x, 1/     Gelu(x): the erf pattern exporters emit (fused before the
sqrt 2) -> Erf -> Add 1 ->      other rules run, so its Div/Mul/Add stay in one piece)
Mul x -> Mul 0.5 (any order)
Pow(x, 3) or x * x * x ->       Gelu(x; approximate tanh): the tanh pattern (PyTorch's
Mul 0.044715 -> Add x -> Mul    gelu(approximate='tanh'), GPT-2's NewGELU, Keras), fused
sqrt(2/pi) -> Tanh -> Add 1,    before the other rules; the model's constants and the place
times x and 0.5 (three orders)  of its 0.5 go into attributes, so the body repeats its ops
==============================  =============================================================

A cinm op lowered 1:1 from a standard op has a reference body that computes, in onnxruntime,
what the original op computes there, bit for bit, where the model's opset has that op
(LayerNormalization >= 17, Gelu >= 20, Softmax, Gemm with C; the erf pattern keeps its Div,
the tanh pattern its constants and order):
an op the placement leaves on the host runs that body, and a last-bit difference before a
DynamicQuantizeLinear would move whole quantization steps. Conv (Im2Col + Gemm) rounds as a
MatMul does, not as onnxruntime's Conv kernel: within the check's tolerance, not bit-exact.

Ops on the shape path (computing shapes from ``Shape``/``Size``) are never lowered: they are
bookkeeping, not work for a device. Nor are ops with an empty operand or result (a static
zero-sized dim): there is nothing to compute. Weights that are initializers are reshaped and transposed
here, in numpy; non-constant operands get explicit Reshape/Transpose nodes.
"""
from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import onnx

from .. import frontend
from ..analysis import tensor_infos, type_node_outputs
from ..dialects import cinm
from ..graph import TensorInfo
from ..rewrite import (
    Builder,
    Edit,
    Recast,
    Replacement,
    Rule,
    apply,
    ir,
    is_splat,
    names_of,
    plain,
    rule_key,
)
from . import PassContext, register_pass
from .graph_names import Names
from .origins import slim_origins
from .recurrent import RULES as _RECURRENT_RULES

_BINARY = set(cinm.BINARY_OPS)
_UNARY = set(cinm.UNARY_OPS)
_REDUCE = {"ReduceSum": "add", "ReduceProd": "mul", "ReduceMax": "max", "ReduceMin": "min"}
_MATMUL_TYPES = {"float32", "float64", "float16", "int32", "int64", "uint32", "uint64"}
_NUMERIC = _MATMUL_TYPES | {"int8", "uint8", "int16", "uint16"}


class _Rewriter(Edit):
    """The model being rewritten (an :class:`onnx_cinm.rewrite.Edit`) with its tensor infos (by
    name; constants made here are added) and the values on the shape path."""

    def __init__(self, model: onnx.ModelProto, fills: dict) -> None:
        self.infos = tensor_infos(model)
        super().__init__(model, Names(model.graph).fresh, fills)
        self.opset = cinm.default_opset(model)
        self.shape_path = self._shape_path()
        self.planned = frontend.planned_dims(model)
        #: ``{dim name: size}`` the rewritten graph is fixed to (a recurrence unrolled over a
        #: sequence that dim sizes; see :func:`onnx_cinm.frontend.unrolled_dims`)
        self.unrolled: dict[str, int] = {}
        self._infos_at: dict = {}

    def infos_at(self, dims: dict[str, int]) -> dict:
        """The tensor infos of the model as it was before this edit, with the symbolic dims
        bound to ``dims`` instead of the planned sizes (computed once per ``dims``)."""
        key = tuple(sorted(dims.items()))
        if key not in self._infos_at:
            self._infos_at[key] = tensor_infos(self.proto, dims=dims)
        return self._infos_at[key]

    def _shape_path(self) -> set[ir.Value]:
        """Values computed from Shape/Size (shape bookkeeping): use-def order of the graph."""
        path: set[ir.Value] = set()
        for n in self.graph:
            # (the nodes' attributes are looked at only where the rest would add the node:
            # most graphs have no Shape node, and the path stays empty; 6 M instructions of
            # 7 on light DenseNet121)
            if (n.op_type in ("Shape", "Size") or path and (
                    any(v in path for v in n.inputs if v is not None) and
                    all(v is None or v in path or v in self._original for v in n.inputs))) and \
                    not any(a.type == ir.AttributeType.GRAPH for a in plain(n.attributes).values()):
                path.update(n.outputs)  # (not If/Loop/Scan: their bodies read outer values)
        return path

    def const(self, base: str, array: np.ndarray) -> str:
        name = super().const(base, array)
        self.infos[name] = TensorInfo(name, array.dtype, tuple(array.shape), True)
        return name

    def value(self, name: str) -> np.ndarray | None:
        """The array of constant ``name``: an initializer of the model, or one made by this
        pass (a rule lowering the zero-point-corrected weight of another rule folds it too)."""
        got = self.constant(name)
        if got is None:
            v = self.lookup(name)
            if v is not None and any(v is c for c in self._new_consts):
                got = v.const_value.numpy()
        return got

    def reach(self, node: ir.Node) -> None:
        """Make the inputs of ``node`` (a producer of the focused node's inputs, matched by a
        multi-node pattern) resolvable by name too."""
        self._scope.update((v.name, v) for v in node.inputs if v is not None)

    def info(self, name: str) -> TensorInfo | None:
        return self.infos.get(name)

    def dtype_name(self, name: str) -> str | None:
        i = self.info(name)
        return None if i is None or i.dtype is None else _dtype_name(i.dtype)

    def empty(self, names) -> bool:
        """True when one of the tensors has a static zero-sized dim (it holds no elements)."""
        infos = self.infos
        for name in names:
            i = infos.get(name) if name else None
            if i is not None and i.shape is not None and 0 in i.shape:
                return True
        return False

    def rank(self, name: str) -> int | None:
        i = self.info(name)
        return None if i is None or i.shape is None else len(i.shape)


@functools.cache
def _dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, once per dtype: numpy works it out again on every call (its
    ``issubdtype`` checks were a tenth of checking an elementwise node)."""
    return np.dtype(dtype).name


def _attrs(node: ir.Node) -> dict:
    return {k: a.value for k, a in plain(node.attributes).items()}


def _ins(node: ir.Node) -> list[str]:
    return names_of(node.inputs)


def _outs(node: ir.Node) -> list[str]:
    return names_of(node.outputs)


class _Lowering(Builder):
    """Builds the replacement nodes of one source node: cinm ops, standard ops, int64 constants."""

    def cinm(self, op: str, inputs: list[str], outputs: list[str] | None = None, suffix: str = "",
             **attrs) -> str:
        return self.node(cinm.make_node, op, inputs, outputs, suffix or op.lower(), **attrs)

    def cinm_recast(self, op: str, inputs: list[str], outputs: list[str], **attrs):
        """The source node as the one cinm op ``op`` (:meth:`onnx_cinm.rewrite.Builder.recast`):
        what a rule lowering a node 1:1 returns."""
        return self.recast(cinm.make_node, op, inputs, outputs, **attrs)

    def std(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        return self.node(_std_node, op, inputs, outputs, op.lower(), **attrs)

    def ints(self, suffix: str, values) -> str:
        return self.edit.const(f"{self.base}_{suffix}", np.asarray(values, dtype=np.int64))


def _std_node(op_type: str, inputs: list[str], outputs: list[str], name: str | None = None,
              **attrs) -> onnx.NodeProto:
    """``onnx.helper.make_node(op_type, inputs, outputs, name=name, **attrs)``: the same
    NodeProto (attributes sorted by name, None ones left out), its attributes built as
    :func:`onnx_cinm.dialects.cinm.make_node` builds them: ``make_attribute``'s type dispatch
    cost more than the node (a Conv's Transposes and Reshapes)."""
    node = onnx.NodeProto(op_type=op_type, input=inputs, output=outputs)
    if name:
        node.name = name
    node.attribute.extend(cinm._attribute(k, v) for k, v in sorted(attrs.items()) if v is not None)
    return node


# ---------------------------------------------------------------------------------------------
# Rules: a check (returns why the node stays, or what the replacement needs) beside its
# replacement (returns the new nodes); the pattern is the op types in the table at the end.
# ---------------------------------------------------------------------------------------------

def _check_matmul(rw: _Rewriter, node: ir.Node):
    a, b = _ins(node)
    ra, rb = rw.rank(a), rw.rank(b)
    if ra is None or rb is None:
        return "operand rank unknown"
    if rw.dtype_name(a) not in _MATMUL_TYPES:
        return f"dtype {rw.dtype_name(a)}"
    if ra == 0 or (ra >= 2 and rb == 0):
        return "unsupported ranks"
    return ra, rb


def _matmul(rw: _Rewriter, node: ir.Node, ranks):
    (a, b), (ra, rb) = _ins(node), ranks
    lo, y = _Lowering(rw, node), _outs(node)[0]
    if ra >= 2 and rb >= 2:
        return lo.cinm_recast("Gemm", [a, b], [y])
    if ra == 2 and rb == 1:
        return lo.cinm_recast("Gemv", [a, b], [y])
    if ra == 1 and rb == 2 and rw.value(b) is not None:
        bt = rw.const(f"{lo.base}_BT", rw.value(b).T)
        lo.cinm("Gemv", [bt, a], [y])
    elif ra >= 2 and rb == 1:  # batched matrix times vector: b as a column
        bcol = lo.std("Unsqueeze", [b, lo.ints("axis", [-1])])
        lo.std("Squeeze", [lo.cinm("Gemm", [a, bcol]), lo.ints("axis", [-1])], [y])
    elif ra == 1 and rb == 1:  # dot product: a as a 1 x K matrix
        arow = lo.std("Unsqueeze", [a, lo.ints("axis", [0])])
        lo.std("Squeeze", [lo.cinm("Gemv", [arow, b]), lo.ints("axis", [0])], [y])
    else:  # vector times (batched) matrix: a as a row
        arow = lo.std("Unsqueeze", [a, lo.ints("axis", [0])])
        lo.std("Squeeze", [lo.cinm("Gemm", [arow, b]), lo.ints("axis", [-2])], [y])
    return lo.nodes


def _check_gemm(rw: _Rewriter, node: ir.Node):
    at, ins = _attrs(node), _ins(node)
    if at.get("transA", 0) or at.get("transB", 0) or at.get("alpha", 1.0) != 1.0 or \
            (at.get("beta", 1.0) != 1.0 and len(ins) > 2 and ins[2]):
        return "non-canonical Gemm attributes (the normalize pass was skipped)"
    if rw.dtype_name(ins[0]) not in _MATMUL_TYPES:
        return f"dtype {rw.dtype_name(ins[0])}"
    return True


def _gemm(rw: _Rewriter, node: ir.Node, _):
    lo = _Lowering(rw, node)
    ins = [i for i in _ins(node) if i]
    # with a bias, onnxruntime's Gemm adds C inside the product: the body keeps that op, so a
    # Gemm the placement leaves on the host rounds as the original did
    exact = {"onnx_gemm": 1} if len(ins) == 3 and rw.rank(ins[0]) == 2 and rw.rank(ins[1]) == 2 else {}
    return lo.cinm_recast("Gemm", ins, [_outs(node)[0]], **exact)


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


def _check_conv(rw: _Rewriter, node: ir.Node):
    """Shapes and the explicit window of a Conv: {r, m, cg, ks, st, dl, g, pads}."""
    ins = _ins(node)
    xi, wi = rw.info(ins[0]), rw.info(ins[1])
    if xi is None or xi.shape is None or wi is None or wi.shape is None:
        return "input or weight shape unknown"
    if not all(isinstance(d, int) for d in wi.shape) or not isinstance(xi.shape[1], int):
        return "weight shape or channel count not static"
    if rw.dtype_name(ins[0]) not in ("float32", "float64", "float16", "int32"):  # int32: ConvInteger's
        return f"dtype {rw.dtype_name(ins[0])}"
    r = len(wi.shape) - 2
    at = _attrs(node)
    ks = list(at.get("kernel_shape", wi.shape[2:]))
    st = list(at.get("strides", [1] * r))
    dl = list(at.get("dilations", [1] * r))
    auto_pad = at.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(xi.shape[2:], ks, st, dl, auto_pad)
        if pads is None:
            return "auto_pad SAME with dynamic spatial dims"
    elif auto_pad == "VALID":
        pads = [0] * (2 * r)
    else:
        pads = list(at.get("pads", [0] * (2 * r)))
    return {"r": r, "m": wi.shape[0], "cg": wi.shape[1], "ks": ks, "st": st, "dl": dl,
            "g": int(at.get("group", 1)), "pads": pads}


def _conv(rw: _Rewriter, node: ir.Node, p: dict):
    ins = _ins(node)
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 and ins[2] else None
    r, m, cg, g = p["r"], p["m"], p["cg"], p["g"]
    kk = math.prod(p["ks"])  # (ints: numpy's prod costs more than the whole product here)
    lo = _Lowering(rw, node)
    y = _outs(node)[0]
    cols = lo.cinm("Im2Col", [x], suffix="cols", kernel_shape=p["ks"], strides=p["st"], pads=p["pads"],
                   dilations=p["dl"])
    to_nchw = [0, r + 1] + list(range(1, r + 1))
    w_val = rw.value(w)
    if g == 1:
        if w_val is not None:  # a weight of one value repeated: its transpose is its bytes
            wm = rw.const(f"{lo.base}_W_gemm", w_val.reshape(cg * kk, m) if is_splat(w_val)
                          else w_val.reshape(m, cg * kk).T)
        else:
            wm = lo.std("Transpose", [lo.std("Reshape", [w, lo.ints("wshape", [m, cg * kk])])], perm=[1, 0])
        gemm = lo.cinm("Gemm", [cols, wm] + ([bias] if bias else []), suffix="gemm")
        lo.std("Transpose", [gemm], [y], perm=to_nchw)
        return lo.nodes
    mg = m // g
    wshape = [g] + [1] * (r - 1) + [cg * kk, mg]
    if w_val is not None:
        wm = rw.const(f"{lo.base}_W_gemm", w_val.reshape(wshape) if is_splat(w_val) else
                      w_val.reshape(g, mg, cg * kk).transpose(0, 2, 1).reshape(wshape))
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


def _check_elementwise(rw: _Rewriter, node: ir.Node):
    op, ins = node.op_type, _ins(node)
    if op in ("Max", "Min") and len(ins) != 2:
        return "variadic Max/Min"
    if op in _BINARY and len(ins) != 2:
        return "unexpected arity"
    if op == "Clip" and rw.opset < 11:
        return "Clip below opset 11"
    dt = rw.dtype_name(ins[0])
    allowed = {"float32", "float64", "float16"} if op in ("Exp", "Log", "Sqrt", "Sigmoid", "Tanh",
                                                          "LeakyRelu", "HardSigmoid") else _NUMERIC
    if dt not in allowed:
        return f"dtype {dt}"
    return True


def _elementwise(rw: _Rewriter, node: ir.Node, _):
    op = node.op_type
    lo = _Lowering(rw, node)
    keep = {k: v for k, v in _attrs(node).items() if k in cinm.OPS[op].attrs}
    inputs = _ins(node)
    if op == "Clip":
        inputs = _clip_bounds(rw, inputs)
    return lo.cinm_recast(op, inputs, [_outs(node)[0]], **keep)


def _clip_bounds(rw: _Rewriter, inputs: list[str]) -> list[str]:
    """A Clip's inputs ``[X, min, max]`` with a bound it leaves out (absent or named ``""``)
    given as the constant ONNX takes for it: ``numeric_limits<T>::lowest()`` for min and
    ``max()`` for max (the Clip-11/13 spec; onnxruntime clips to them, so a float's -inf
    becomes -3.4e38 either way). The cinm Clip then always names both bounds: a device's
    :class:`~onnx_cinm.analysis.OpInfo` lists a node's named inputs only, so ``[X, min]`` and
    ``[X, "", max]`` would look alike there (the UPMEM kernel refused both)."""
    inputs = inputs + [""] * (3 - len(inputs))
    if all(inputs[1:]):
        return inputs
    dtype = np.dtype(rw.dtype_name(inputs[0]))
    lim = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    for k, (base, value) in enumerate((("clip_min", lim.min), ("clip_max", lim.max)), start=1):
        if not inputs[k]:
            inputs[k] = rw.const(base, np.array(value, dtype))
    return inputs


def _reduce_axes(rw: _Rewriter, node: ir.Node):
    """Explicit, sorted, non-negative axes of a Reduce node, or a reason string."""
    at, ins = _attrs(node), _ins(node)
    rank = rw.rank(ins[0])
    if len(ins) > 1 and ins[1]:
        v = rw.value(ins[1])
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


def _check_reduce(rw: _Rewriter, node: ir.Node):
    """(axes, keepdims, dtype name)."""
    x = _ins(node)[0]
    dt = rw.dtype_name(x)
    if dt not in _NUMERIC:
        return f"dtype {dt}"
    axes = _reduce_axes(rw, node)
    if isinstance(axes, str):
        return axes
    if node.op_type == "ReduceMean":
        shape = rw.info(x).shape if rw.info(x) is not None else None
        if shape is None:
            return "ReduceMean over dims of unknown size"
        if not all(isinstance(shape[a], int) for a in axes) or dt not in ("float32", "float64", "float16"):
            return "ReduceMean over dynamic dims"
    return axes, int(_attrs(node).get("keepdims", 1)), dt


def _reduce(rw: _Rewriter, node: ir.Node, binding):
    (axes, keepdims, dt), x, y = binding, _ins(node)[0], _outs(node)[0]
    lo = _Lowering(rw, node)
    if node.op_type != "ReduceMean":
        return lo.cinm_recast("Reduce", [x], [y], kind=_REDUCE[node.op_type], axes=axes,
                              keepdims=keepdims)
    shape = rw.info(x).shape
    total = lo.cinm("Reduce", [x], kind="add", axes=axes, keepdims=keepdims, suffix="sum")
    count = rw.const(f"{lo.base}_count", np.array(int(np.prod([shape[a] for a in axes])), dtype=np.dtype(dt)))
    lo.cinm("Div", [total, count], [y])
    return lo.nodes


def _check_cumsum(rw: _Rewriter, node: ir.Node):
    x, axis_name = _ins(node)[:2]
    axis = rw.value(axis_name)
    if axis is None:
        return "axis computed at run time"
    dt = rw.dtype_name(x)
    if dt not in ("float32", "float64", "int32", "int64", "uint32", "uint64"):
        return f"dtype {dt}"
    return int(axis.reshape(-1)[0])


def _cumsum(rw: _Rewriter, node: ir.Node, axis: int):
    at = _attrs(node)
    lo = _Lowering(rw, node)
    return lo.cinm_recast("Scan", [_ins(node)[0]], [_outs(node)[0]], kind="add", axis=axis,
                          exclusive=int(at.get("exclusive", 0)), reverse=int(at.get("reverse", 0)))


def _check_topk(rw: _Rewriter, node: ir.Node):
    ins = _ins(node)
    if rw.opset < 10 or len(ins) < 2:
        return "TopK below opset 10"
    k = rw.value(ins[1])
    if k is None:
        return "k computed at run time"
    dt = rw.dtype_name(ins[0])
    if dt not in _NUMERIC:
        return f"dtype {dt}"
    return int(k.reshape(-1)[0])


def _topk(rw: _Rewriter, node: ir.Node, k: int):
    at = _attrs(node)
    lo = _Lowering(rw, node)
    outs = _outs(node) + [""] * (2 - len(node.outputs))
    outs = [o or rw.fresh(f"{lo.base}_unused") for o in outs]
    return lo.cinm_recast("TopK", [_ins(node)[0]], outs, k=k, axis=int(at.get("axis", -1)),
                          largest=int(at.get("largest", 1)), sorted=int(at.get("sorted", 1)))


def _check_transpose(rw: _Rewriter, node: ir.Node):
    perm = _attrs(node).get("perm")
    if perm is None:
        rank = rw.rank(_ins(node)[0])
        if rank is None:
            return "rank unknown"
        perm = list(reversed(range(rank)))
    return list(perm)


def _transpose(rw: _Rewriter, node: ir.Node, perm: list[int]):
    lo = _Lowering(rw, node)
    return lo.cinm_recast("Transpose", [_ins(node)[0]], [_outs(node)[0]], perm=perm)


def _minus_zero_point(rw: _Rewriter, lo: _Lowering, x: str, zp: str | None, zp_shape: list | None,
                      tag: str) -> str:
    """``int32(x) - int32(zp)``: folded into an int32 initializer when both are constant, else a
    Cast and a Sub on the host (a zero point made at run time, as DynamicQuantizeLinear's, is
    cast too). ``zp_shape`` reshapes a per-row/per-channel zero point for broadcasting (None:
    as it is). The shapes of ``x`` and ``zp`` are known (see :func:`_check_integer`)."""
    xi, zi = rw.info(x), (rw.info(zp) if zp else None)
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


def _check_integer(rw: _Rewriter, node: ir.Node):
    """Operand dtypes and shapes known: the zero-point shapes for broadcasting (x's, w's)."""
    x, w, xzp, wzp = (_ins(node) + [""] * 4)[:4]
    return _zp_shapes(rw, "MatMul" if node.op_type == "MatMulInteger" else "Conv", x, w, xzp, wzp)


def _integer_product(rw: _Rewriter, lo: _Lowering, node: ir.Node, std_op: str, operands: list[str],
                     y: str):
    """The MatMul/Conv rule's lowering of ``std_op`` (the attributes of ``node``) on the int32
    ``operands`` (x, w and an optional bias), writing ``y``: its nodes, or the reason it
    refuses (the nodes built so far by ``lo`` are then dropped)."""
    proxy = ir.Node("", std_op, [rw.lookup(o) for o in operands], name=node.name,
                    attributes=[ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
                    outputs=[ir.Value(name=y)])
    inner = _RULE_OF[std_op](rw, proxy)
    if isinstance(inner, Recast):  # the proxy is no node of the graph: what it would become, built
        inner = [rw.add(inner.proto)]
    rw.detach(proxy)
    if isinstance(inner, str):
        for n in lo.nodes:
            rw.detach(n)
    return inner


def _integer(rw: _Rewriter, node: ir.Node, zp_shapes):
    """MatMulInteger / ConvInteger as an int32 cinm Gemm (and Im2Col) of zero-point-corrected
    operands: ``(A - a_zp) @ (B - b_zp)``, exact in int32 as onnxruntime computes it. Padding a
    corrected input with 0 equals padding the raw one with its zero point, as ConvInteger does.
    The MatMul/Conv rule lowers the corrected operands, and may still refuse (with its reason)."""
    x, w, xzp, wzp = (_ins(node) + [""] * 4)[:4]
    lo = _Lowering(rw, node)
    x32 = _minus_zero_point(rw, lo, x, xzp or None, zp_shapes[0], "x32")
    w32 = _minus_zero_point(rw, lo, w, wzp or None, zp_shapes[1], "w32")
    std_op = "MatMul" if node.op_type == "MatMulInteger" else "Conv"
    inner = _integer_product(rw, lo, node, std_op, [x32, w32], _outs(node)[0])
    return inner if isinstance(inner, str) else lo.nodes + inner


# ---------------------------------------------------------------------------------------------
# Quantized products: QLinearMatMul / QLinearConv (int32 product, then requantization), and the
# QDQ form (DequantizeLinear on activation and weight -> MatMul / Conv / Gemm). The product is
# the int32 cinm Gemm of MatMulInteger's rule; the scales stay on the host, after it.
# ---------------------------------------------------------------------------------------------

_INT8 = ("int8", "uint8")


def _zp_shapes(rw: _Rewriter, std_op: str, x: str, w: str, xzp: str, wzp: str):
    """The broadcast shapes of x's and w's zero points in an integer ``std_op`` (MatMul or
    Conv) of int8/uint8 operands, or why the operands do not fit."""
    if rw.dtype_name(x) not in _INT8 or rw.dtype_name(w) not in _INT8:
        return f"dtype {rw.dtype_name(x)} x {rw.dtype_name(w)}"
    wi, xi = rw.info(w), rw.info(x)
    if wi is None or wi.shape is None or xi is None or xi.shape is None:
        return "operand shape unknown"
    if any(zp and (rw.info(zp) is None or rw.info(zp).shape is None) for zp in (xzp, wzp)):
        return "operand or zero point shape unknown"
    xz, wz = (rw.value(n) if n else None for n in (xzp, wzp))
    if std_op == "MatMul":
        # a per-row zero point of a 2-D A is [M]: a column for broadcasting; B's per-column [N] as is
        xzi = rw.info(xzp) if xzp else None
        per_row = (xz is not None and xz.ndim == 1 and xz.size > 1) or \
            (xz is None and xzi is not None and xzi.shape is not None and len(xzi.shape) == 1)
        return ([-1, 1] if per_row else None), None
    # Conv: x's zero point is a scalar; w's may be per output channel [M]
    return None, ([-1] + [1] * (len(wi.shape) - 1) if wz is not None and wz.ndim == 1 and wz.size > 1 else None)


def _requantize(rw: _Rewriter, lo: _Lowering, acc: str, multiplier: np.ndarray, y_zp: str, y: str) -> None:
    """``y = saturate(round_half_even(float32(acc) * multiplier) + y_zp)`` as host ops (Cast, Mul,
    QuantizeLinear with scale 1, whose division by 1 is exact): what onnxruntime's QLinearMatMul
    and QLinearConv do after their int32 product (MLAS ``MlasRequantizeOutput``: the float32
    multiplier ``(x_scale * w_scale) / y_scale``, rounding to nearest even, clamping to the
    output type), so the result is bit-exact wherever onnxruntime's product is."""
    f = lo.std("Cast", [acc], to=onnx.TensorProto.FLOAT)
    f = lo.std("Mul", [f, rw.const(f"{lo.base}_requant", multiplier)])
    lo.std("QuantizeLinear", [f, rw.const(f"{lo.base}_one", np.array(1.0, np.float32)), y_zp], [y])


def _check_qlinear(rw: _Rewriter, node: ir.Node):
    """QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) and QLinearConv (x,
    x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?): constant scales, per-tensor for the
    activation and the output, per-tensor or per output channel for the weight."""
    x, xs, xzp, w, ws, wzp, ys, yzp, bias = (_ins(node) + [""] * 9)[:9]
    std_op = "MatMul" if node.op_type == "QLinearMatMul" else "Conv"
    shapes = _zp_shapes(rw, std_op, x, w, xzp, wzp)
    if isinstance(shapes, str):
        return shapes
    scales = [rw.value(n) for n in (xs, ws, ys)]
    if any(v is None for v in scales):
        return "scales computed at run time"
    if scales[0].size != 1 or scales[2].size != 1:
        return "per-row activation or output scale"
    x_s, w_s, y_s = (v.astype(np.float32) for v in scales)
    mult = (x_s.reshape(()) * w_s.reshape(-1)) / y_s.reshape(())  # float32, onnxruntime's order
    if std_op == "Conv" and mult.size > 1:
        mult = mult.reshape([-1] + [1] * (len(rw.info(w).shape) - 2))  # per channel of [N, M, *S]
    elif mult.size == 1:
        mult = mult.reshape(())
    return shapes, mult


def _qlinear(rw: _Rewriter, node: ir.Node, binding):
    """QLinearMatMul / QLinearConv as the int32 Gemm of MatMulInteger / ConvInteger (QLinearConv's
    int32 bias added in the Gemm, as onnxruntime adds it before scaling), then
    :func:`_requantize` on the host."""
    (zp_shapes, mult), (x, _, xzp, w, _, wzp, _, yzp, bias) = binding, (_ins(node) + [""] * 9)[:9]
    lo = _Lowering(rw, node)
    x32 = _minus_zero_point(rw, lo, x, xzp or None, zp_shapes[0], "x32")
    w32 = _minus_zero_point(rw, lo, w, wzp or None, zp_shapes[1], "w32")
    std_op = "MatMul" if node.op_type == "QLinearMatMul" else "Conv"
    acc = rw.fresh(f"{lo.base}_acc")
    inner = _integer_product(rw, lo, node, std_op, [x32, w32] + ([bias] if bias else []), acc)
    if isinstance(inner, str):
        return inner
    lo.nodes += inner
    _requantize(rw, lo, acc, mult, yzp, _outs(node)[0])
    return lo.nodes


def _dequantized(rw: _Rewriter, value: ir.Value | None, weight: bool):
    """``(q, scale, zero point name, transposed)`` when ``value`` is ``DequantizeLinear(q, scale,
    zp)`` of an int8/uint8 ``q`` with a constant scale (a weight's may be per output channel;
    ``weight`` allows a ``Transpose`` [1, 0] of a constant 2-D q in between, as ``normalize``
    leaves a Gemm's transB), else None."""
    node = value.producer() if value is not None else None
    transposed = False
    if weight and node is not None and node.op_type == "Transpose" and node.domain in ("", "ai.onnx", cinm.DOMAIN):
        perm = _attrs(node).get("perm")
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if list(perm or []) == [1, 0] and inner is not None:
            rw.reach(node)
            node, transposed = inner, True
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    q, s, zp = (names_of(node.inputs) + ["", ""])[:3]
    rw.reach(node)
    scale = rw.value(s)
    if rw.dtype_name(q) not in _INT8 or scale is None or (not weight and scale.size != 1):
        return None
    if transposed and rw.value(q) is None:
        return None
    axis = int(_attrs(node).get("axis", 1))
    return q, scale.astype(np.float32), zp, transposed, axis


def _check_qdq(rw: _Rewriter, node: ir.Node):
    """MatMul / Conv / canonical Gemm on ``DequantizeLinear`` outputs: the int8 operands, their
    zero points and the float32 rescale ``x_scale * w_scale`` (per output channel or one)."""
    ins = _ins(node)
    if node.op_type == "Gemm" and isinstance(_check_gemm(rw, node), str):
        return "non-canonical Gemm"
    x = _dequantized(rw, node.inputs[0], weight=False)
    w = _dequantized(rw, node.inputs[1], weight=True)
    if x is None or w is None:
        return "operands not both DequantizeLinear outputs of int8/uint8 with constant scales"
    (xq, xs, xzp, _, _), (wq, ws, wzp, transposed, axis) = x, w
    std_op = "Conv" if node.op_type == "Conv" else "MatMul"
    wi = rw.info(wq)
    if wi is None or wi.shape is None:
        return "weight shape unknown"
    rank = len(wi.shape)
    out_axis = 0 if std_op == "Conv" else (0 if transposed else rank - 1)
    if ws.size > 1 and (axis % rank != out_axis or (std_op == "MatMul" and rank != 2) or
                        ws.ndim != 1 or ws.size != wi.shape[axis % rank]):
        return "weight scale not per output channel"  # (blocked scales among them)
    if transposed:  # a constant: transpose q (and its per-channel zero point needs no change)
        wq = rw.const(f"{node.name or ins[0]}_wqT", rw.value(wq).T)
    zps = _zp_shapes(rw, std_op, xq, wq, xzp, wzp)
    if isinstance(zps, str):
        return zps
    scale = xs.reshape(()) * ws.reshape(-1)
    if std_op == "Conv" and scale.size > 1:
        scale = scale.reshape([-1] + [1] * (rank - 2))
    elif scale.size == 1:
        scale = scale.reshape(())
    bias = ins[2] if len(ins) > 2 and ins[2] else None
    if bias and std_op == "Conv" and rw.value(bias) is None:
        return "Conv bias computed at run time"
    return std_op, xq, xzp, wq, wzp, zps, scale, bias


def _qdq(rw: _Rewriter, node: ir.Node, binding):
    """``float32(Gemm_int32(x_q - x_zp, w_q - w_zp)) * (x_scale * w_scale) (+ bias)``: the
    product runs in exact int32 on the int8 values; the float rescale (and a float bias) on the
    host. The reference multiplies the dequantized floats and sums in float32, so the two differ
    by float32 accumulation error (a QuantizeLinear after may round one step apart)."""
    std_op, xq, xzp, wq, wzp, zps, scale, bias = binding
    lo = _Lowering(rw, node)
    x32 = _minus_zero_point(rw, lo, xq, xzp or None, zps[0], "x32")
    w32 = _minus_zero_point(rw, lo, wq, wzp or None, zps[1], "w32")
    acc = rw.fresh(f"{lo.base}_acc")
    attrs_node = node if std_op == "Conv" else ir.Node("", "MatMul", [], name=node.name)
    inner = _integer_product(rw, lo, attrs_node, std_op, [x32, w32], acc)
    if isinstance(inner, str):
        return inner
    lo.nodes += inner
    f = lo.std("Cast", [acc], to=onnx.TensorProto.FLOAT)
    y = _outs(node)[0]
    f = lo.std("Mul", [f, rw.const(f"{lo.base}_rescale", scale)], None if bias else [y])
    if bias:
        b = rw.value(bias)
        if std_op == "Conv":
            bias = rw.const(f"{lo.base}_bias", b.reshape([-1] + [1] * (len(rw.info(wq).shape) - 2)))
        lo.std("Add", [f, bias], [y])
    return lo.nodes


def _check_product(rw: _Rewriter, node: ir.Node):
    """MatMul / Gemm / Conv: the QDQ rule where it matches, else the float rule."""
    q = _check_qdq(rw, node)
    if not isinstance(q, str):
        return _qdq, q
    rule = _FLOAT_RULES[node.op_type]
    binding = rule.check(rw, node)
    return binding if isinstance(binding, str) else (rule.replace, binding)


def _product(rw: _Rewriter, node: ir.Node, binding):
    replace, inner = binding
    return replace(rw, node, inner)


def _drop_dead_dequantize(rw: _Rewriter) -> None:
    """Remove the DequantizeLinear nodes (and a Transpose of one) nothing reads any more: the
    QDQ rule read their int8 inputs instead. Their float copies of the weights go with them."""
    for node in reversed(list(rw.graph)):
        if any(v.uses() or v.is_graph_output() for v in node.outputs):
            continue
        src = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
        if node.op_type == "DequantizeLinear" or (
                node.op_type == "Transpose" and src is not None and src.op_type == "DequantizeLinear"):
            rw.graph.remove(node, safe=True)


_FLOAT_RULES = {"MatMul": Rule(frozenset({"MatMul"}), _check_matmul, _matmul),
                "Gemm": Rule(frozenset({"Gemm"}), _check_gemm, _gemm),
                "Conv": Rule(frozenset({"Conv"}), _check_conv, _conv)}

# ---------------------------------------------------------------------------------------------
# The rest of a transformer block (issue 11): Softmax, LayerNormalization, Gelu and the erf
# and tanh patterns of Gelu, float32 (what the device kernels take).
# ---------------------------------------------------------------------------------------------

def _float32_input(rw: _Rewriter, node: ir.Node):
    """X's rank when X is float32 with a known rank, else the reason the node stays."""
    x = _ins(node)[0]
    if rw.dtype_name(x) != "float32":
        return f"dtype {rw.dtype_name(x)} (the cinm op is float32)"
    rank = rw.rank(x)
    if not rank:
        return "rank unknown or 0"
    return rank


def _check_softmax(rw: _Rewriter, node: ir.Node):
    """``(axis, rank)``: float32 X of known rank; ``axis`` in 0..rank-1 (opset >= 13: the one
    axis Softmax normalizes over; canonicalize turned older opsets' flattening into explicit
    reshapes)."""
    rank = _float32_input(rw, node)
    if isinstance(rank, str):
        return rank
    axis = int(_attrs(node).get("axis", -1 if rw.opset >= 13 else 1))
    if not -rank <= axis < rank:
        return f"Softmax axis {axis} out of range for rank {rank}"
    return axis % rank, rank


def _softmax(rw: _Rewriter, node: ir.Node, binding):
    """cinm Softmax normalizes over the last axis: another axis is moved there and back by
    cinm Transposes (rotations of the trailing axes, which a device's transpose takes)."""
    axis, rank = binding
    lo = _Lowering(rw, node)
    x, y = _ins(node)[0], _outs(node)[0]
    if axis == rank - 1:
        return lo.cinm_recast("Softmax", [x], [y])
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = [perm.index(d) for d in range(rank)]
    t = lo.cinm("Transpose", [x], suffix="axis_last", perm=perm)
    lo.cinm("Transpose", [lo.cinm("Softmax", [t])], [y], suffix="axis_back", perm=back)
    return lo.nodes


def _read(v) -> bool:
    """Whether a value is read (by a node or as a graph output)."""
    return v is not None and (bool(v.uses()) or v.is_graph_output())


def _check_layernorm(rw: _Rewriter, node: ir.Node):
    """``(axis, epsilon, Scale, B)``: float32 X with static normalized dims, Scale and B of as
    many elements (or broadcast to them from a constant), Mean and InvStdDev not read."""
    rank = _float32_input(rw, node)
    if isinstance(rank, str):
        return rank
    if any(_read(v) for v in node.outputs[1:]):
        return "its Mean or InvStdDev output is read"
    at, ins = _attrs(node), _ins(node) + [""]
    if int(at.get("stash_type", 1)) != 1:
        return f"stash_type {at['stash_type']} (cinm LayerNorm computes in float32, stash_type 1)"
    axis = int(at.get("axis", -1)) % rank
    norm = rw.info(ins[0]).shape[axis:]
    if not all(isinstance(d, int) and d > 0 for d in norm):
        return "normalized dims not static"
    operands = []
    for name in ins[1:3]:
        if not name:
            operands.append(None)
            continue
        i = rw.info(name)
        if rw.dtype_name(name) != "float32" or i is None or i.shape is None:
            return "Scale or B of unknown type or shape"
        if tuple(i.shape) != tuple(norm):
            v = rw.value(name)
            if v is None or np.broadcast_shapes(v.shape, tuple(norm)) != tuple(norm):
                return f"Scale or B of shape {list(i.shape)}, not the normalized {list(norm)}"
            name = ("broadcast", np.broadcast_to(v, norm).copy())
        operands.append(name)
    return axis, float(at.get("epsilon", 1e-5)), operands[0], operands[1]


def _layernorm(rw: _Rewriter, node: ir.Node, binding):
    axis, eps, scale, bias = binding
    lo = _Lowering(rw, node)
    ins = [_ins(node)[0]]
    for tag, x in (("scale", scale), ("bias", bias)):
        if isinstance(x, tuple):  # a constant broadcast to the normalized shape
            x = rw.const(f"{lo.base}_{tag}", x[1])
        if x:
            ins.append(x)
    return lo.cinm_recast("LayerNorm", ins, [_outs(node)[0]], axis=axis, epsilon=eps)


#: onnxruntime's contrib Gelus (com.microsoft): their approximation (FastGelu is the tanh one)
_CONTRIB_GELU = {"Gelu": "none", "BiasGelu": "none", "FastGelu": "tanh"}


def _check_gelu(rw: _Rewriter, node: ir.Node):
    """``(approximate, bias or None)`` of ONNX Gelu-20 or a com.microsoft Gelu/BiasGelu/
    FastGelu (whose optional second input is a bias added first)."""
    rank = _float32_input(rw, node)
    if isinstance(rank, str):
        return rank
    ins = _ins(node)
    if node.domain == "com.microsoft":
        bias = ins[1] if len(ins) > 1 and ins[1] else None
        if bias and rw.dtype_name(bias) != "float32":
            return f"bias dtype {rw.dtype_name(bias)}"
        return _CONTRIB_GELU[node.op_type], bias
    approx = _attrs(node).get("approximate", "none")
    return (approx, None) if approx in ("none", "tanh") else f"approximate={approx!r}"


def _gelu(rw: _Rewriter, node: ir.Node, binding: tuple):
    approx, bias = binding
    lo = _Lowering(rw, node)
    x = _ins(node)[0]
    if bias:
        x = lo.cinm("Add", [x, bias], suffix="biased")
    return lo.cinm_recast("Gelu", [x], [_outs(node)[0]], approximate=approx)


def _scalar(rw: _Rewriter, v) -> float | None:
    """The value of a one-element constant (an initializer or a Constant node's), else None."""
    if v is None:
        return None
    a = rw.array(v)
    p = v.producer()
    if a is None and p is not None and p.op_type == "Constant" and "value" in p.attributes:
        a = p.attributes["value"].value.numpy()
    if a is None or a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(-1)[0])


def _only_use(v):
    """The node reading ``v`` when it is its one reader (and no graph output), else None."""
    if v is None or v.is_graph_output():
        return None
    uses = list(v.uses())
    if len(uses) != 1:
        return None
    return uses[0][0]


def _other(node, v):
    """The input of a two-input ``node`` that is not ``v``, or None."""
    ins = list(node.inputs)
    if len(ins) != 2:
        return None
    return ins[1] if ins[0] is v else (ins[0] if ins[1] is v else None)


def _near(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-4 * abs(b)


def _check_erf_gelu(rw: _Rewriter, erf: ir.Node):
    """``(x, nodes of the pattern in graph order, output)`` for x / 2 * (1 + erf(x / sqrt 2))
    written as Div(x, sqrt 2) or Mul(x, 1 / sqrt 2), Erf, Add 1, then Mul by x and Mul by 0.5
    in either order (or Mul by Mul(x, 0.5)), each intermediate read once; else the reason."""
    t = erf.inputs[0]
    scale = t.producer() if t is not None else None
    if scale is None or _only_use(t) is not erf or scale.op_type not in ("Div", "Mul")             or len(scale.inputs) != 2:
        return "not the erf pattern of Gelu"
    a, b = scale.inputs
    if scale.op_type == "Div" and _near(_scalar(rw, b), 2 ** 0.5):
        x = a
    elif scale.op_type == "Mul" and _near(_scalar(rw, b), 2 ** -0.5):
        x = a
    elif scale.op_type == "Mul" and _near(_scalar(rw, a), 2 ** -0.5):
        x = b
    else:
        return "not the erf pattern of Gelu"
    if rw.dtype_name(x.name) != "float32":
        return f"dtype {rw.dtype_name(x.name)}"
    add = _only_use(erf.outputs[0])
    if add is None or add.op_type != "Add" or not _near(_scalar(rw, _other(add, erf.outputs[0])), 1.0):
        return "not the erf pattern of Gelu"
    m1 = _only_use(add.outputs[0])
    if m1 is None or m1.op_type != "Mul":
        return "not the erf pattern of Gelu"
    other = _other(m1, add.outputs[0])
    nodes = [scale, erf, add, m1]
    if other is x:  # x * (1 + erf) then * 0.5
        m2 = _only_use(m1.outputs[0])
        if m2 is None or m2.op_type != "Mul" or not _near(_scalar(rw, _other(m2, m1.outputs[0])), 0.5):
            return "not the erf pattern of Gelu"
        nodes.append(m2)
        out = m2.outputs[0]
    else:  # (x * 0.5) * (1 + erf)
        h = other.producer() if other is not None else None
        if h is None or h.op_type != "Mul" or _only_use(other) is not m1 or _other(h, x) is None                 or not _near(_scalar(rw, _other(h, x)), 0.5):
            return "not the erf pattern of Gelu"
        nodes.append(h)
        out = m1.outputs[0]
    order = {n: i for i, n in enumerate(rw.graph)}
    return x, scale, sorted(nodes, key=order.__getitem__), out


def _erf_gelu(rw: _Rewriter, erf: ir.Node, binding):
    x, scale, nodes, out = binding
    rw.focus(scale)  # x is an input of the scaling node, not of the anchor (Erf)
    lo = _Lowering(rw, erf)
    # a Div by sqrt 2 rounds differently from a Mul by 1 / sqrt 2: the body keeps the model's form
    div = {"div_sqrt2": 1} if scale.op_type == "Div" else {}
    lo.cinm("Gelu", [x.name], [out.name], approximate="none", **div)
    return Replacement(lo.nodes, nodes)


def _producer_of(v, op_type: str, reader):
    """The ``op_type`` node computing ``v`` when ``reader`` is ``v``'s one reader, else None."""
    p = v.producer() if v is not None else None
    return p if p is not None and p.op_type == op_type and _only_use(v) is reader else None


def _scaled(rw: _Rewriter, node, value: float):
    """``(the other operand, the model's constant)`` of a two-input ``node`` (Mul or Add) one of
    whose operands is a one-element constant near ``value`` (:func:`_near`), else None."""
    ins = list(node.inputs) if node is not None else []
    if len(ins) != 2:
        return None
    for c, other in ((ins[1], ins[0]), (ins[0], ins[1])):
        k = _scalar(rw, c)
        if _near(k, value):
            return other, k
    return None


def _cube_of(rw: _Rewriter, c, reader):
    """``(x, cube nodes, cube_pow)`` when ``c``, read by ``reader`` alone, is x^3 written as
    Pow(x, 3) (a float exponent exactly 3) or Mul(x, Mul(x, x)) in either order; else None."""
    p = c.producer() if c is not None else None
    if p is None or _only_use(c) is not reader or len(p.inputs) != 2:
        return None
    a, b = p.inputs
    if p.op_type == "Pow":
        return (a, [p], 1) if _scalar(rw, b) == 3.0 else None
    if p.op_type != "Mul":
        return None
    for sq_v, x in ((a, b), (b, a)):
        sq = _producer_of(sq_v, "Mul", p)
        if sq is not None and sq.inputs[0] is x and sq.inputs[1] is x:
            return x, [sq, p], 0
    return None


def _check_tanh_gelu(rw: _Rewriter, tanh: ir.Node):
    """``(x, the cube's first node, nodes of the pattern in graph order, output, Gelu
    attributes)`` for the tanh approximation of Gelu as exporters write it, 0.5 x (1 + tanh(s
    (x + k x^3))): x^3 by Pow(x, 3) or Mul(x, Mul(x, x)); Mul by k (near 0.044715), Add x, Mul
    by s (near sqrt(2 / pi)), Tanh, Add 1, then the 0.5 and x multiplied in one of the orders
    of :data:`onnx_cinm.dialects.cinm.GELU_HALF_AT` (PyTorch's ``gelu(approximate='tanh')``:
    ``0.5 (x (1 + t))``; GPT-2's NewGELU and ``tf.nn.gelu``: ``(0.5 x) (1 + t)``; Keras's
    numpy backend: ``x (0.5 (1 + t))``); operands of Mul/Add in either order, constants as
    initializers or Constant nodes, 0.5 and 1 exact, each intermediate read once, x float32;
    else the reason. The model's k and s (float32) go
    into the attributes, so the reference body computes what the matched nodes compute."""
    nope = "not the tanh pattern of Gelu"
    scale = _producer_of(tanh.inputs[0], "Mul", tanh)
    hit = _scaled(rw, scale, math.sqrt(2 / math.pi))
    if hit is None:
        return nope
    inner, s = hit
    add = _producer_of(inner, "Add", scale)
    if add is None or len(add.inputs) != 2:
        return nope
    for kc, x in ((add.inputs[1], add.inputs[0]), (add.inputs[0], add.inputs[1])):
        kmul = _producer_of(kc, "Mul", add)
        hit = _scaled(rw, kmul, 0.044715)
        cube = _cube_of(rw, hit[0], kmul) if hit is not None else None
        if cube is not None and cube[0] is x:
            break
    else:
        return nope
    k = hit[1]
    if rw.dtype_name(x.name) != "float32":
        return f"dtype {rw.dtype_name(x.name)}"
    one = _only_use(tanh.outputs[0])
    if one is None or one.op_type != "Add" or _scalar(rw, _other(one, tanh.outputs[0])) != 1.0:
        return nope
    t1 = one.outputs[0]
    m1 = _only_use(t1)
    if m1 is None or m1.op_type != "Mul":
        return nope
    other = _other(m1, t1)
    nodes = [*cube[1], kmul, add, scale, tanh, one, m1]
    m2 = _only_use(m1.outputs[0])
    if other is x and m2 is not None and m2.op_type == "Mul" \
            and _scalar(rw, _other(m2, m1.outputs[0])) == 0.5:  # 0.5 (x (1 + t))
        half, out = "product", m2.outputs[0]
        nodes.append(m2)
    elif other is not None and _scalar(rw, other) == 0.5 and m2 is not None \
            and m2.op_type == "Mul" and _other(m2, m1.outputs[0]) is x:  # x (0.5 (1 + t))
        half, out = "sum", m2.outputs[0]
        nodes.append(m2)
    else:  # (0.5 x) (1 + t)
        h = _producer_of(other, "Mul", m1)
        hx = _scaled(rw, h, 0.5)
        if hx is None or hx[0] is not x or hx[1] != 0.5:
            return nope
        half, out = "x", m1.outputs[0]
        nodes.append(h)
    if rw.rank(out.name) != rw.rank(x.name):  # a constant of higher rank broadcast x
        return nope
    order = {n: i for i, n in enumerate(rw.graph)}
    nodes.sort(key=order.__getitem__)
    attrs = {"tanh_cubic": float(np.float32(k)), "tanh_scale": float(np.float32(s)),
             "cube_pow": cube[2], "half_at": half}
    return x, cube[1][0], nodes, out, attrs


def _tanh_gelu(rw: _Rewriter, tanh: ir.Node, binding):
    x, first, nodes, out, attrs = binding
    rw.focus(first)  # x is an input of the cube's first node, not of the anchor (Tanh)
    lo = _Lowering(rw, tanh)
    lo.cinm("Gelu", [x.name], [out.name], approximate="tanh", **attrs)
    return Replacement(lo.nodes, nodes)


#: run before :data:`_RULES`: patterns over several nodes whose parts another rule would take
_FUSIONS = [Rule(frozenset({"Erf"}), _check_erf_gelu, _erf_gelu),
            Rule(frozenset({"Tanh"}), _check_tanh_gelu, _tanh_gelu)]


_RULES = [
    Rule(frozenset({"Softmax"}), _check_softmax, _softmax),
    Rule(frozenset({"LayerNormalization"}), _check_layernorm, _layernorm),
    Rule(frozenset({"Gelu", *(f"com.microsoft::{op}" for op in _CONTRIB_GELU)}), _check_gelu, _gelu),
    Rule(frozenset(_FLOAT_RULES), _check_product, _product),
    Rule(frozenset({"CumSum"}), _check_cumsum, _cumsum),
    Rule(frozenset({"TopK"}), _check_topk, _topk),
    Rule(frozenset({"Transpose"}), _check_transpose, _transpose),
    Rule(frozenset({"ReduceMean", *_REDUCE}), _check_reduce, _reduce),
    Rule(frozenset({"MatMulInteger", "ConvInteger"}), _check_integer, _integer),
    Rule(frozenset({"QLinearMatMul", "QLinearConv"}), _check_qlinear, _qlinear),
    Rule(frozenset(_BINARY | _UNARY), _check_elementwise, _elementwise),
    *_RECURRENT_RULES,
]
_RULE_OF = {op: rule for rule in _RULES for op in rule.ops} | _FLOAT_RULES


def lowerable_ops() -> tuple[str, ...]:
    """The source op types ``to_cinm`` has a rule for (its rewrites and fusions), sorted: the
    names ``lower_ops`` (``--lower-ops``) accepts, exactly as ONNX spells them (a contrib op
    as ``com.microsoft::Name``)."""
    return tuple(sorted({op for rule in (*_RULES, *_FUSIONS) for op in rule.ops}))


def _any_candidate(graph: onnx.GraphProto, rules: list[Rule]) -> bool:
    """Whether a node of the main graph has an op type one of ``rules`` anchors on (by
    :func:`onnx_cinm.rewrite.rule_key`, as :func:`onnx_cinm.rewrite.apply` matches)."""
    ops = set().union(*(r.ops for r in rules))
    return any(rule_key(n) in ops for n in graph.node)


@register_pass("to_cinm")
def to_cinm(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Rewrite MatMul/Gemm/Conv, elementwise, Reduce*, CumSum, TopK, Transpose into cinm ops.

    Reads ``ctx.options["lower_ops"]`` (optional set of source op types to lower; default all)
    and ``ctx.fills`` (weights known to hold one value: not read back; ``fold_batchnorm``
    hands them on).
    Records ``ctx.stats["to_cinm"] = {"lowered": Counter, "kept": {op: Counter of reasons}}``.
    Rewrites ``model`` in place (:class:`onnx_cinm.rewrite.Edit`) and returns it, with the
    types of the tensors between the ops it added in its value_info when they are all static
    (:func:`onnx_cinm.analysis.type_node_outputs`: what onnx's inference gives them), so
    ``placement``'s tensor infos are read, not inferred over the whole graph again.
    """
    only = ctx.options.get("lower_ops")
    rules = [r if only is None else Rule(r.ops & frozenset(only), r.check, r.replace) for r in _RULES]
    fusions = [r if only is None else Rule(r.ops & frozenset(only), r.check, r.replace)
               for r in _FUSIONS]
    if not _any_candidate(model.graph, rules + fusions):  # e.g. a tree ensemble: opening the
        ctx.stats["to_cinm"] = {"lowered": Counter(), "kept": {}}  # graph costs minutes
        ctx.log("to_cinm: no node of a type it lowers")
        return model
    rw = _Rewriter(model, ctx.fills)  # the light models' weights: not read back (DenseNet121: 32 MB)

    def guard(node: ir.Node) -> str | None:
        if any(v in rw.shape_path for v in node.outputs):
            return "shape computation"
        if rw.empty(v.name for v in (*node.inputs, *node.outputs) if v is not None):
            return "empty tensor (a zero-sized dim): no work for a device"
        return None

    fused, _ = apply(rw, fusions, guard)  # the Erf left unfused stays, as before, on the host
    # a fusion's op comes from several source ops: its anchor's type (the Tanh of a tanh
    # GELU) is not what it was lowered from, and a hint naming that type must not take it
    rw.source_ops.clear()
    lowered, kept = apply(rw, rules, guard)
    _drop_dead_dequantize(rw)
    lowered.update(fused)
    model = rw.commit()
    cinm.attach_functions(model)
    frontend.add_unrolled_dims(model, rw.unrolled)
    # the ops it added typed node by node: placement's tensor infos then read them instead of
    # inferring the whole graph again (nothing written when a type would stay open)
    type_node_outputs(model)
    ctx.stats["to_cinm"] = {"lowered": lowered, "kept": kept}
    ctx.origins = slim_origins(rw.origins)
    ctx.source_ops.update(rw.source_ops)  # (the If branches' are added to it after)
    ctx.log(f"to_cinm: lowered {sum(lowered.values())} nodes {dict(lowered)}")
    return model
