"""The ``cinm`` domain: device-agnostic compute ops (the top abstraction level of CINM).

Every op here says *what* to compute, never *where*. Each has

* an :class:`onnx.defs.OpSchema` (registered on import) whose shape inference runs the op's
  reference body, so shapes have one source of truth, and
* a reference body: a model-local :class:`onnx.FunctionProto` made of standard ONNX ops.
  :func:`attach_functions` adds the bodies a model needs, so every model we write passes
  ``onnx.checker.check_model(full_check=True)`` and stock onnxruntime runs it with no
  registration (it inlines local functions).

Some ops have variants whose bodies differ (a Gemm with or without bias, the Reduce kinds, the
Im2Col spatial rank, the SimSearch metric). ONNX functions cannot branch on attributes, so each
variant is a function *overload* (IR version 10). The overload is derived from the node's
attributes and arity by :func:`overload_of` whenever :func:`attach_functions` runs, so tools that
drop ``NodeProto.overload`` (onnx-graphsurgeon does) lose nothing.

Op catalogue (inputs -> outputs; attributes), with numpy-like semantics:

==============  ==============================================  ==========================================
op              signature                                        semantics
==============  ==============================================  ==========================================
Gemm            A[..., M, K], B[..., K, N], C? -> Y[..., M, N]   ``A @ B (+ C)``; matmul broadcasting, C
                y_perm?, onnx_gemm?                              broadcast to Y; with ``y_perm`` the result
                                                                 is ``Transpose(A @ B (+ C), y_perm)``: the
                                                                 layout its consumer reads (a Conv's NCHW);
                                                                 onnx_gemm=1: body ONNX Gemm (C added inside)
Gemv            A[M, K], x[K], c?[M] -> y[M]                     ``A @ x (+ c)``
Im2Col          X[N, C, *S] -> Y[N, *O, C*prod(kernel_shape)]    patches of X (zero padded), channel-major
                kernel_shape, strides, pads, dilations           then kernel position, as Conv sees them
Add Sub Mul     A, B -> Y                                        elementwise with broadcasting
Div Max Min
Relu Abs Neg    X -> Y                                           elementwise unary, ONNX semantics
Exp Log Sqrt
Sigmoid Tanh
LeakyRelu       X -> Y; alpha                                    ONNX LeakyRelu
HardSigmoid     X -> Y; alpha, beta                              ONNX HardSigmoid
Clip            X, min?, max? -> Y                               ONNX Clip (opset 13 form)
Reduce          X -> Y; kind in add|mul|max|min, axes, keepdims  reduction over explicit axes
Scan            X -> Y; kind=add, axis, exclusive, reverse       inclusive/exclusive prefix sums (CumSum)
TopK            X -> values, indices; k, axis, largest, sorted   ONNX TopK with k as an attribute
Transpose       X -> Y; perm                                     ONNX Transpose
Histogram       X -> counts[bins] int64; bins, min, max          ``numpy.histogram(X, bins, (min, max))``
PopCount        X (bool or unsigned int) -> Y int64              set bits per element
SimSearch       Q[Nq, d], D[Nd, d] -> values[Nq, k],             top-k of ``Q @ D.T`` (metric=dot) or of
                indices[Nq, k]; k, metric in dot|cos             cosine similarity (metric=cos)
MergePartial    P[S, ...] -> Y[...]; kind in add|mul|max|min     combine S partial results of a tiled op
Softmax         X[..., L] -> Y[..., L] (float32)                 softmax over the last axis
LayerNorm       X, Scale, B? -> Y; axis, epsilon (float32)       ``(x - mean) / sqrt(var + eps) * Scale + B``
                                                                 over the axes from ``axis`` on (ONNX
                                                                 LayerNormalization, Y only)
Gelu            X -> Y; approximate in none|tanh,                ``x / 2 * (1 + erf(x / sqrt 2))`` (none) or
                div_sqrt2; tanh_cubic, tanh_scale,               its tanh approximation (ONNX Gelu-20);
                cube_pow, half_at (float32)                      div_sqrt2=1: x / sqrt 2 is a division;
                                                                 tanh_cubic etc.: the tanh pattern's own
                                                                 constants and op order (below)
==============  ==============================================  ==========================================

Bodies of ops lowered 1:1 from a standard op call that op where the model's opset has it
(:data:`STANDARD_SINCE`; Gemm with ``onnx_gemm``; Gelu's ``div_sqrt2``): a cinm op left on the
host then computes in onnxruntime exactly what the original op computes there.

Every op also accepts the placement attributes ``device`` (a device name) and ``placement`` (the
reason it was chosen); paradigm passes add their plan attributes the same way.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, TensorProto, helper
from onnx.defs import OpSchema

DOMAIN = "cinm"
VERSION = 1
#: The oldest default-domain opset the reference bodies are written for (Constant value_ints,
#: Unsqueeze/ReduceSum axes as inputs). ``canonicalize_opset`` lifts older models to it.
MIN_OPSET = 13
#: Minimum IR version: function overloads were added in IR 10.
MIN_IR_VERSION = 10

#: Attributes every cinm op accepts, written by the placement pass and the device-level passes:
#: ``device`` (a registry name), ``placement`` (the reason, in words) and ``kernel`` (the path of
#: the node's generated kernel relative to the ``<model>.cinm/`` folder).
PLACEMENT_ATTRS = {"device": AttributeProto.STRING, "placement": AttributeProto.STRING,
                   "kernel": AttributeProto.STRING}

#: Plan attributes: the node attributes the devices' plans write (a node's plan is attributes,
#: never extra nodes). Each device declares its own, named under its prefix (``cim_*`` for the
#: crossbars, ``cnm_*`` for UPMEM), and the device registry adds them here when the device
#: registers (:func:`declare_plan_attrs`); the dialect itself knows no device.
PLAN_ATTRS: dict[str, int] = {}


#: Plan attribute types by the names devices declare them with.
ATTR_TYPES = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT,
              "string": AttributeProto.STRING, "ints": AttributeProto.INTS,
              "floats": AttributeProto.FLOATS, "strings": AttributeProto.STRINGS}


def check_plan_attrs(attrs: dict) -> None:
    """ValueError if a plan attribute name is an op attribute or a placement attribute."""
    for name in attrs:
        if name in PLACEMENT_ATTRS or any(name in spec.attrs for spec in OPS.values()):
            raise ValueError(f"plan attribute '{name}' is an attribute of the cinm dialect")


def sync_plan_attrs() -> None:
    """Bring :data:`PLAN_ATTRS` up to the declared plan attributes
    (:data:`onnx_cinm.dialects.DECLARED_PLAN_ATTRS`) and replace the registered op schemas, so
    the checker accepts them."""
    from . import DECLARED_PLAN_ATTRS

    new = {k: ATTR_TYPES[t] for k, t in DECLARED_PLAN_ATTRS.items() if k not in PLAN_ATTRS}
    if not new:
        return
    check_plan_attrs(new)
    PLAN_ATTRS.update(new)
    for spec in OPS.values():
        if onnx.defs.has(spec.name, DOMAIN):
            onnx.defs.deregister_schema(spec.name, VERSION, DOMAIN)
    register_schemas()


_NUMERIC = [
    "tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)",
    "tensor(int8)", "tensor(int16)", "tensor(int32)", "tensor(int64)",
    "tensor(uint8)", "tensor(uint16)", "tensor(uint32)", "tensor(uint64)",
]
_FLOAT = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
_MATMUL = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)",
           "tensor(int32)", "tensor(int64)", "tensor(uint32)", "tensor(uint64)"]
_ANY = _NUMERIC + ["tensor(bool)"]

BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min")
UNARY_OPS = ("Relu", "Abs", "Neg", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "LeakyRelu",
             "HardSigmoid", "Clip")
REDUCE_KINDS = {"add": "ReduceSum", "mul": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin"}


@dataclass(frozen=True)
class OpSpec:
    """Static description of one cinm op.

    Attributes:
        name: op type in domain ``cinm``.
        inputs: formal inputs as ``(name, type var, optional)``.
        outputs: formal outputs as ``(name, type var)``.
        types: type constraints ``{type var: allowed types}``.
        attrs: op attributes ``{name: (AttributeProto type, required)}`` (placement attrs excluded).
        doc: one-line description.
    """

    name: str
    inputs: tuple
    outputs: tuple
    types: dict
    attrs: dict = field(default_factory=dict)
    doc: str = ""


_I, _F, _S, _IS = AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING, AttributeProto.INTS

OPS: dict[str, OpSpec] = {}


def _spec(*args, **kw) -> None:
    s = OpSpec(*args, **kw)
    OPS[s.name] = s


_spec("Gemm", (("A", "T", False), ("B", "T", False), ("C", "T", True)), (("Y", "T"),),
      {"T": _MATMUL}, {"y_perm": (_IS, False), "onnx_gemm": (_I, False)},
      doc="Y = A @ B (+ C), matmul broadcasting; with y_perm, Transpose(A @ B (+ C), y_perm); "
          "onnx_gemm=1 (2-D A and B with C, lowered from an ONNX Gemm): the reference body is "
          "ONNX Gemm, which adds C inside the product as onnxruntime's Gemm kernel does (a "
          "MatMul then an Add rounds differently)")
_spec("Gemv", (("A", "T", False), ("x", "T", False), ("c", "T", True)), (("y", "T"),),
      {"T": _MATMUL}, doc="y = A @ x (+ c) for a matrix A[M, K] and a vector x[K]")
_spec("Im2Col", (("X", "T", False),), (("Y", "T"),), {"T": _ANY},
      {"kernel_shape": (_IS, True), "strides": (_IS, True), "pads": (_IS, True),
       "dilations": (_IS, True)},
      doc="patch matrix of X[N, C, *S] for a convolution: Y[N, *O, C*prod(kernel_shape)]")
for _op in BINARY_OPS:
    _spec(_op, (("A", "T", False), ("B", "T", False)), (("Y", "T"),), {"T": _NUMERIC},
          doc=f"elementwise {_op} with numpy broadcasting")
for _op in UNARY_OPS:
    if _op == "Clip":
        _spec(_op, (("X", "T", False), ("min", "T", True), ("max", "T", True)), (("Y", "T"),),
              {"T": _NUMERIC}, doc="elementwise clip to [min, max]")
        continue
    _attrs = {"LeakyRelu": {"alpha": (_F, False)},
              "HardSigmoid": {"alpha": (_F, False), "beta": (_F, False)}}.get(_op, {})
    _types = _NUMERIC if _op in ("Relu", "Abs", "Neg") else _FLOAT
    _spec(_op, (("X", "T", False),), (("Y", "T"),), {"T": _types}, _attrs,
          doc=f"elementwise {_op}")
_spec("Reduce", (("X", "T", False),), (("Y", "T"),), {"T": _NUMERIC},
      {"kind": (_S, True), "axes": (_IS, True), "keepdims": (_I, False)},
      doc="reduce X over axes with kind add|mul|max|min")
_spec("Scan", (("X", "T", False),), (("Y", "T"),),
      {"T": ["tensor(float)", "tensor(double)", "tensor(int32)", "tensor(int64)",
             "tensor(uint32)", "tensor(uint64)"]},
      {"kind": (_S, False), "axis": (_I, True), "exclusive": (_I, False), "reverse": (_I, False)},
      doc="prefix sums along axis (kind add), CumSum semantics")
_spec("TopK", (("X", "T", False),), (("values", "T"), ("indices", "I")),
      {"T": _NUMERIC, "I": ["tensor(int64)"]},
      {"k": (_I, True), "axis": (_I, False), "largest": (_I, False), "sorted": (_I, False)},
      doc="k largest (or smallest) elements along axis, with their indices")
_spec("Transpose", (("X", "T", False),), (("Y", "T"),), {"T": _ANY}, {"perm": (_IS, True)},
      doc="permute dimensions")
_spec("Histogram", (("X", "T", False),), (("counts", "I"),),
      {"T": ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(int32)",
             "tensor(int64)", "tensor(uint8)", "tensor(int8)"], "I": ["tensor(int64)"]},
      {"bins": (_I, True), "min": (_F, True), "max": (_F, True)},
      doc="counts of X in `bins` equal bins over [min, max] (numpy.histogram semantics)")
_spec("PopCount", (("X", "T", False),), (("Y", "I"),),
      {"T": ["tensor(bool)", "tensor(uint8)", "tensor(uint16)", "tensor(uint32)",
             "tensor(uint64)"], "I": ["tensor(int64)"]},
      doc="number of set bits of every element")
_spec("SimSearch", (("Q", "T", False), ("D", "T", False)), (("values", "T"), ("indices", "I")),
      {"T": ["tensor(float)", "tensor(double)"], "I": ["tensor(int64)"]},
      {"k": (_I, True), "metric": (_S, False)},
      doc="top-k most similar rows of D for every row of Q, metric dot|cos")
_spec("MergePartial", (("P", "T", False),), (("Y", "T"),), {"T": _NUMERIC},
      {"kind": (_S, True)},
      doc="combine partial results P[S, ...] of a tiled op over the leading axis (add|mul|max|min)")
# the rest of a transformer block (issue 11): float32 only, the dtype their UPMEM kernels take
_spec("Softmax", (("X", "T", False),), (("Y", "T"),), {"T": ["tensor(float)"]},
      doc="softmax over the last axis")
_spec("LayerNorm", (("X", "T", False), ("Scale", "T", False), ("B", "T", True)), (("Y", "T"),),
      {"T": ["tensor(float)"]}, {"axis": (_I, True), "epsilon": (_F, True)},
      doc="layer normalization over the axes from `axis` on, times Scale plus B (ONNX "
          "LayerNormalization's Y)")
_spec("Gelu", (("X", "T", False),), (("Y", "T"),), {"T": ["tensor(float)"]},
      {"approximate": (_S, False), "div_sqrt2": (_I, False), "tanh_cubic": (_F, False),
       "tanh_scale": (_F, False), "cube_pow": (_I, False), "half_at": (_S, False)},
      doc="x / 2 * (1 + erf(x / sqrt(2))), or its tanh approximation (approximate='tanh'); "
          "div_sqrt2=1: the reference body divides x by sqrt(2) (float32) where it otherwise "
          "multiplies by 1 / sqrt(2), as the model it was fused from did (the last bit differs). "
          "tanh_cubic and tanh_scale (with approximate='tanh'; fused from the tanh pattern): "
          "the body is tanh(tanh_scale * (x + tanh_cubic * c)) + 1, c = Pow(x, 3) (cube_pow=1) "
          "or x * x * x, times x and 0.5 in the order half_at says: x (0.5 x, then the product), "
          "product (0.5 times the product) or sum (x times 0.5 (1 + tanh)), the model's order")


# --------------------------------------------------------------------------------------------
# Variants (overloads)
# --------------------------------------------------------------------------------------------

#: The ops whose overload (:func:`overload_of`) depends on their attributes; every other op's
#: on its arity alone (:func:`attach_functions` reads no attributes of theirs)
ATTR_OVERLOADS = frozenset({"Gemm", "Reduce", "MergePartial", "Scan", "Im2Col", "SimSearch", "Gelu"})

#: Where the tanh pattern of Gelu (``tanh_cubic`` set) applies its 0.5, as the model wrote it:
#: ``(0.5 x) (1 + t)``, ``0.5 (x (1 + t))`` or ``x (0.5 (1 + t))``. The three round alike but
#: where a product overflows or is subnormal, so the body keeps the model's order.
GELU_HALF_AT = ("x", "product", "sum")

#: The attributes :func:`overload_of` reads.
OVERLOAD_ATTRS = frozenset({"onnx_gemm", "y_perm", "kind", "kernel_shape", "metric",
                            "approximate", "div_sqrt2", "tanh_cubic", "tanh_scale", "cube_pow",
                            "half_at"})


def overload_of(op_type: str, attrs: dict, n_inputs: int) -> str:
    """Return the reference-function overload for a node.

    Args:
        op_type: cinm op type.
        attrs: the node's attributes as python values (``helper.get_attribute_value``).
        n_inputs: number of non-empty inputs of the node.

    Returns:
        The overload name ("" for the plain body).

    Raises:
        ValueError: if the attributes name an unknown variant (e.g. ``Reduce(kind="xor")``).
    """
    if op_type == "Gemm" and attrs.get("onnx_gemm") and n_inputs >= 3:
        return "gemm_perm" if attrs.get("y_perm") is not None else "gemm"
    if op_type == "Gemm" and attrs.get("y_perm") is not None:
        return "bias_perm" if n_inputs >= 3 else "perm"
    if op_type in ("Gemm", "Gemv"):
        return "bias" if n_inputs >= 3 else ""
    if op_type in ("Reduce", "MergePartial"):
        kind = _as_str(attrs.get("kind"))
        if kind not in REDUCE_KINDS:
            raise ValueError(f"cinm.{op_type}: kind must be one of {sorted(REDUCE_KINDS)}, got {kind!r}")
        return kind
    if op_type == "Scan":
        kind = _as_str(attrs.get("kind", "add"))
        if kind != "add":
            raise ValueError(f"cinm.Scan: only kind='add' is supported, got {kind!r}")
        return ""
    if op_type == "Im2Col":
        return f"{len(attrs.get('kernel_shape', []))}d"
    if op_type == "SimSearch":
        metric = _as_str(attrs.get("metric", "dot"))
        if metric not in ("dot", "cos"):
            raise ValueError(f"cinm.SimSearch: metric must be 'dot' or 'cos', got {metric!r}")
        return metric
    if op_type == "LayerNorm":
        return "bias" if n_inputs >= 3 else ""
    if op_type == "Gelu":
        approx = _as_str(attrs.get("approximate", "none"))
        if approx not in ("none", "tanh"):
            raise ValueError(f"cinm.Gelu: approximate must be 'none' or 'tanh', got {approx!r}")
        if approx == "tanh" and "tanh_cubic" in attrs:
            half = _as_str(attrs.get("half_at"))
            if "tanh_scale" not in attrs:  # the body reads both constants
                raise ValueError("cinm.Gelu: tanh_cubic without tanh_scale")
            if half not in GELU_HALF_AT:
                raise ValueError(f"cinm.Gelu: half_at must be one of {list(GELU_HALF_AT)}, got {half!r}")
            return f"tanh_{'pow' if attrs.get('cube_pow', 0) else 'mul'}_{half}"
        if approx == "tanh":
            return "tanh"
        return "div" if attrs.get("div_sqrt2", 0) else ""
    return ""  # one body serves every other op (Clip's absent min/max are empty input names)


def _as_str(v) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


# --------------------------------------------------------------------------------------------
# Reference bodies
# --------------------------------------------------------------------------------------------

class _Body:
    """Tiny builder for function bodies: unique temporaries, constants, nodes."""

    def __init__(self) -> None:
        self.nodes: list[NodeProto] = []
        self._n = 0

    def tmp(self) -> str:
        self._n += 1
        return f"t{self._n}"

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, out: list[str] | None = None,
           **attrs) -> str | list[str]:
        outs = out or [self.tmp() for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def const_ints(self, values: list[int]) -> str:
        return self.op("Constant", [], value=helper.make_tensor("v", TensorProto.INT64, [len(values)], values))

    def const_int(self, value: int) -> str:
        return self.op("Constant", [], value=helper.make_tensor("v", TensorProto.INT64, [], [value]))

    def ref(self, attr: str, name: str, atype: int) -> str:
        """A Constant whose value comes from the calling node's attribute ``name``."""
        a = AttributeProto()
        a.name = attr
        a.ref_attr_name = name
        a.type = atype
        out = self.tmp()
        n = helper.make_node("Constant", [], [out])
        n.attribute.append(a)
        self.nodes.append(n)
        return out


def _ref_attr(attr: str, ref: str, atype: int) -> AttributeProto:
    a = AttributeProto()
    a.name, a.ref_attr_name, a.type = attr, ref, atype
    return a


def _node_with_refs(op_type, inputs, outputs, refs: list[AttributeProto], **attrs) -> NodeProto:
    n = helper.make_node(op_type, inputs, outputs, **attrs)
    n.attribute.extend(refs)
    return n


def _reduce_node(b: _Body, onnx_op: str, x: str, out: str, opset: int, axes_ref: str | None,
                 axes: list[int] | None = None, keepdims_ref: bool = False, keepdims: int | None = None):
    """Append ``onnx_op`` over axes (given by a node attribute ref or a literal) in the opset's form."""
    axes_as_input = opset >= 18 or (onnx_op == "ReduceSum" and opset >= 13)
    refs = [_ref_attr("keepdims", "keepdims", _I)] if keepdims_ref else []
    kw = {} if keepdims is None else {"keepdims": keepdims}
    if axes_as_input:
        ax = b.ref("value_ints", axes_ref, _IS) if axes_ref else b.const_ints(axes)
        b.nodes.append(_node_with_refs(onnx_op, [x, ax], [out], refs, **kw))
    elif axes_ref:
        b.nodes.append(_node_with_refs(onnx_op, [x], [out], refs + [_ref_attr("axes", axes_ref, _IS)], **kw))
    else:
        b.nodes.append(_node_with_refs(onnx_op, [x], [out], refs, axes=axes, **kw))


def _im2col_body(b: _Body, rank: int) -> None:
    """Pad, go channels-last, gather whole channel rows with one flat patch index, transpose.

    X[N, C, S1..Sr] -> Pad -> Xp[N, C, P1..Pr] -> Transpose, Reshape -> [N, P1*..*Pr, C]; one
    Gather on axis 1 with the flat index I[O1..Or, K1..Kr] of the padded position each output
    position and kernel offset reads (per axis o*stride + k*dilation, row-major over P) gives
    [N, O1..Or, K1..Kr, C]; a transpose that moves only the channel axis gives
    [N, O1..Or, C, K1..Kr], and the last 1 + r axes merge (their length C * prod(kernel_shape)
    is computed, not -1, so an empty batch reshapes too). Pure data movement: the values, NaN
    and Inf included, are X's. Each Gather copy is a row of C values; a Gather per spatial
    axis (the last one of single elements) then a transpose of every axis (the body before)
    ran DNSMOS's conv2d_1 (C=128, 900x161, 3x3) in 3.8 s of CPU in onnxruntime against 1.4 s
    (1 thread).
    """
    ks = b.ref("value_ints", "kernel_shape", _IS)
    st = b.ref("value_ints", "strides", _IS)
    dl = b.ref("value_ints", "dilations", _IS)
    pd = b.ref("value_ints", "pads", _IS)
    zeros2 = b.const_ints([0, 0])
    begins = b.op("Slice", [pd, b.const_ints([0]), b.const_ints([rank])])
    ends = b.op("Slice", [pd, b.const_ints([rank]), b.const_ints([2 * rank])])
    pads = b.op("Concat", [zeros2, begins, zeros2, ends], axis=0)
    xp = b.op("Pad", ["X", pads])
    xp_shape = b.op("Shape", [xp])
    spatial = b.op("Slice", [xp_shape, b.const_ints([2]), b.const_ints([2 + rank])])
    one = b.const_int(1)
    zero = b.const_int(0)
    # O = (P - dilation*(k-1) - 1) / stride + 1  (non-negative, so truncating Div is floor)
    span = b.op("Mul", [dl, b.op("Sub", [ks, one])])
    outs = b.op("Add", [b.op("Div", [b.op("Sub", [b.op("Sub", [spatial, span]), one]), st]), one])
    flat = None  # I[O1..Or, K1..Kr], built row-major over P: flat = flat * P_a + (o_a*s_a + k_a*d_a)
    for a in range(rank):
        ia = b.const_int(a)
        k_a, o_a = b.op("Gather", [ks, ia]), b.op("Gather", [outs, ia])
        s_a, d_a = b.op("Gather", [st, ia]), b.op("Gather", [dl, ia])
        koff = b.op("Mul", [b.op("Range", [zero, k_a, one]), d_a])
        ooff = b.op("Mul", [b.op("Range", [zero, o_a, one]), s_a])
        # o_a at axis a, k_a at axis rank + a of the 2*rank index axes
        o_axes = [i for i in range(2 * rank) if i != a]
        k_axes = [i for i in range(2 * rank) if i != rank + a]
        term = b.op("Add", [b.op("Unsqueeze", [ooff, b.const_ints(o_axes)]),
                            b.op("Unsqueeze", [koff, b.const_ints(k_axes)])])
        flat = term if flat is None else b.op(
            "Add", [b.op("Mul", [flat, b.op("Gather", [spatial, ia])]), term])
    # channels last: [N, P1..Pr, C] -> [N, P1*..*Pr, C]
    xt = b.op("Transpose", [xp], perm=[0] + [2 + a for a in range(rank)] + [1])
    n = b.op("Slice", [xp_shape, b.const_ints([0]), b.const_ints([1])])
    c = b.op("Slice", [xp_shape, b.const_ints([1]), b.const_ints([2])])
    rows = b.op("Reshape", [xt, b.op("Concat", [n, b.op("ReduceProd", [spatial], keepdims=1), c], axis=0)])
    cur = b.op("Gather", [rows, flat], axis=1)
    # cur: [N, O1..Or, K1..Kr, C]
    perm = [0] + [1 + a for a in range(rank)] + [1 + 2 * rank] + [1 + rank + a for a in range(rank)]
    t = b.op("Transpose", [cur], perm=perm)
    # merged length C * prod(kernel_shape) spelled out: a -1 cannot be inferred for N = 0
    lead = b.op("Slice", [b.op("Shape", [t]), b.const_ints([0]), b.const_ints([1 + rank])])
    chans = b.op("Slice", [b.op("Shape", ["X"]), b.const_ints([1]), b.const_ints([2])])
    merged = b.op("Mul", [chans, b.op("ReduceProd", [ks], keepdims=1)])
    b.op("Reshape", [t, b.op("Concat", [lead, merged], axis=0)], out=["Y"])


def _histogram_body(b: _Body, opset: int) -> None:
    """numpy.histogram with uniform bins: idx = floor((x - lo) * bins / (hi - lo)), x == hi in the last bin."""
    dbl = TensorProto.DOUBLE
    x = b.op("Reshape", [b.op("Cast", ["X"], to=dbl), b.const_ints([-1])])
    lo = b.op("Cast", [b.ref("value_float", "min", _F)], to=dbl)
    hi = b.op("Cast", [b.ref("value_float", "max", _F)], to=dbl)
    nb = b.ref("value_int", "bins", _I)
    t = b.op("Div", [b.op("Mul", [b.op("Sub", [x, lo]), b.op("Cast", [nb], to=dbl)]), b.op("Sub", [hi, lo])])
    idx = b.op("Cast", [b.op("Floor", [t])], to=TensorProto.INT64)
    last = b.op("Sub", [nb, b.const_int(1)])
    idx = b.op("Min", [idx, last])
    inside = b.op("And", [b.op("GreaterOrEqual", [x, lo]), b.op("LessOrEqual", [x, hi])])
    idx = b.op("Where", [inside, idx, b.const_int(-1)])
    bins = b.op("Range", [b.const_int(0), nb, b.const_int(1)])
    onehot = b.op("Equal", [b.op("Unsqueeze", [idx, b.const_ints([1])]),
                            b.op("Unsqueeze", [bins, b.const_ints([0])])])
    counts = b.op("Cast", [onehot], to=TensorProto.INT64)
    _reduce_node(b, "ReduceSum", counts, "counts", opset, None, axes=[0], keepdims=0)


def _popcount_body(b: _Body, opset: int) -> None:
    """Widen to uint64, shift right by 0..63, keep bit 0 (mod 2), sum over the bit axis."""
    u = b.op("Cast", ["X"], to=TensorProto.UINT64)
    u = b.op("Unsqueeze", [u, b.const_ints([-1])])
    shifts = b.op("Constant", [], value=helper.make_tensor("s", TensorProto.UINT64, [64], list(range(64))))
    two = b.op("Constant", [], value=helper.make_tensor("two", TensorProto.UINT64, [], [2]))
    bits = b.op("Mod", [b.op("BitShift", [u, shifts], direction="RIGHT"), two])
    bits = b.op("Cast", [bits], to=TensorProto.INT64)
    _reduce_node(b, "ReduceSum", bits, "Y", opset, None, axes=[-1], keepdims=0)


def _simsearch_body(b: _Body, metric: str, opset: int) -> None:
    q, d = "Q", "D"
    if metric == "cos":
        qn, dn = b.tmp(), b.tmp()
        _reduce_node(b, "ReduceL2", q, qn, opset, None, axes=[-1], keepdims=1)
        _reduce_node(b, "ReduceL2", d, dn, opset, None, axes=[-1], keepdims=1)
        q, d = b.op("Div", [q, qn]), b.op("Div", [d, dn])
    scores = b.op("MatMul", [q, b.op("Transpose", [d], perm=[1, 0])])
    k = b.op("Reshape", [b.ref("value_int", "k", _I), b.const_ints([1])])
    b.op("TopK", [scores, k], out=["values", "indices"], axis=-1, largest=1, sorted=1)


def _const_float(b: _Body, value: float) -> str:
    return b.op("Constant", [], value=helper.make_tensor("v", TensorProto.FLOAT, [], [value]))


#: First default-domain opsets with the standard op a cinm op was lowered from 1:1. From there
#: the reference body is that one op, so a cinm op the placement leaves on the host computes
#: bit for bit what onnxruntime's kernel of the original computes (a decomposition differs in
#: the last bits, and a later DynamicQuantizeLinear can turn that into a whole int8 step).
STANDARD_SINCE = {"LayerNorm": 17, "Gelu": 20}


def _layernorm_body(b: _Body, bias: bool, opset: int) -> None:
    """ONNX LayerNormalization (opset >= 17, Y only). Below: X flattened to [outer, L] at
    ``axis``; mean and (two-pass) variance per row; Scale and B read as [1, L] rows; the result
    reshaped back to X's shape."""
    if opset >= STANDARD_SINCE["LayerNorm"]:
        ins = ["X", "Scale", "B"] if bias else ["X", "Scale"]
        b.nodes.append(_node_with_refs("LayerNormalization", ins, ["Y"],
                                       [_ref_attr("axis", "axis", _I),
                                        _ref_attr("epsilon", "epsilon", _F)]))
        return
    x2 = b.tmp()
    b.nodes.append(_node_with_refs("Flatten", ["X"], [x2], [_ref_attr("axis", "axis", _I)]))
    mean, var = b.tmp(), b.tmp()
    _reduce_node(b, "ReduceMean", x2, mean, opset, None, axes=[1], keepdims=1)
    d = b.op("Sub", [x2, mean])
    _reduce_node(b, "ReduceMean", b.op("Mul", [d, d]), var, opset, None, axes=[1], keepdims=1)
    eps = b.ref("value_float", "epsilon", _F)
    y = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, eps])])])
    row = b.const_ints([1, -1])
    y = b.op("Mul", [y, b.op("Reshape", ["Scale", row])])
    if bias:
        y = b.op("Add", [y, b.op("Reshape", ["B", row])])
    b.op("Reshape", [y, b.op("Shape", ["X"])], out=["Y"])


def _tanh_pattern_body(b: _Body, overload: str) -> None:
    """Overload ``tanh_<pow|mul>_<half_at>``: the tanh pattern of Gelu in the ops and order of
    the model it was fused from, so that onnxruntime computes it bit for bit as the original:
    c = Pow(X, 3) or (X X) X; t = Tanh(tanh_scale (X + tanh_cubic c)); then 0.5, X and (t + 1)
    multiplied in the order :data:`GELU_HALF_AT` names (the constants are the node's attributes,
    the model's float32 values)."""
    _, cube, half = overload.split("_")
    if cube == "pow":
        x3 = b.op("Pow", ["X", _const_float(b, 3.0)])
    else:
        x3 = b.op("Mul", [b.op("Mul", ["X", "X"]), "X"])
    inner = b.op("Add", ["X", b.op("Mul", [x3, b.ref("value_float", "tanh_cubic", _F)])])
    t1 = b.op("Add", [b.op("Tanh", [b.op("Mul", [inner, b.ref("value_float", "tanh_scale", _F)])]),
                      _const_float(b, 1.0)])
    if half == "x":
        b.op("Mul", [b.op("Mul", ["X", _const_float(b, 0.5)]), t1], out=["Y"])
    elif half == "product":
        b.op("Mul", [b.op("Mul", ["X", t1]), _const_float(b, 0.5)], out=["Y"])
    else:
        b.op("Mul", ["X", b.op("Mul", [t1, _const_float(b, 0.5)])], out=["Y"])


def _gelu_body(b: _Body, overload: str, opset: int) -> None:
    """ONNX Gelu (opset >= 20; not for overload ``div``). Else 0.5 x (1 + erf(x / sqrt 2)), x / sqrt 2
    as Div by float32(sqrt 2) (``div``: the erf pattern PyTorch exports) or Mul by float32(1 / sqrt 2),
    or 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (``tanh``); the fused tanh pattern's
    overloads: :func:`_tanh_pattern_body`."""
    if overload.startswith("tanh_"):
        _tanh_pattern_body(b, overload)
        return
    tanh = overload == "tanh"
    if opset >= STANDARD_SINCE["Gelu"] and overload != "div":
        b.nodes.append(_node_with_refs("Gelu", ["X"], ["Y"],
                                       [_ref_attr("approximate", "approximate", _S)]))
        return
    if tanh:
        x3 = b.op("Mul", [b.op("Mul", ["X", "X"]), "X"])
        inner = b.op("Add", ["X", b.op("Mul", [x3, _const_float(b, 0.044715)])])
        t = b.op("Tanh", [b.op("Mul", [inner, _const_float(b, 0.7978845608028654)])])
    elif overload == "div":
        t = b.op("Erf", [b.op("Div", ["X", _const_float(b, 1.4142135623730951)])])
    else:
        t = b.op("Erf", [b.op("Mul", ["X", _const_float(b, 0.7071067811865476)])])
    half_x = b.op("Mul", ["X", _const_float(b, 0.5)])
    b.op("Mul", [half_x, b.op("Add", [t, _const_float(b, 1.0)])], out=["Y"])


def build_function(op_type: str, overload: str, opset: int) -> FunctionProto:
    """Build the reference body of ``cinm.<op_type>`` (variant ``overload``) for ``opset``.

    Args:
        op_type: a key of :data:`OPS`.
        overload: the variant, as returned by :func:`overload_of`.
        opset: the default-domain opset the body is written in; it must equal the model's
            (the checker requires it) and be at least :data:`MIN_OPSET`.

    Returns:
        A FunctionProto in domain ``cinm`` whose formal inputs/outputs are the op's.

    Raises:
        ValueError: unknown op, unsupported variant, or ``opset < MIN_OPSET``.
    """
    if op_type not in OPS:
        raise ValueError(f"unknown cinm op {op_type!r}")
    if opset < MIN_OPSET:
        raise ValueError(f"cinm reference bodies need opset >= {MIN_OPSET}, got {opset}")
    spec = OPS[op_type]
    inputs = [n for n, _, _ in spec.inputs]
    outputs = [n for n, _ in spec.outputs]
    b = _Body()
    if op_type in ("Gemm", "Gemv"):
        # the product written in its consumer's layout (y_perm): the same Transpose the
        # lowering would otherwise put after the node, so the result is bit-identical
        perm = overload.endswith("perm")
        if not overload.startswith(("bias", "gemm")):
            inputs = inputs[:2]
        if overload.startswith("gemm"):  # lowered from a 2-D ONNX Gemm: its own kernel
            y = b.op("Gemm", inputs, out=None if perm else outputs)
        else:
            y = b.op("MatMul", inputs[:2], out=None if perm or len(inputs) > 2 else outputs)
        if len(inputs) > 2 and not overload.startswith("gemm"):
            y = b.op("Add", [y, inputs[2]], out=None if perm else outputs)
        if perm:
            b.nodes.append(_node_with_refs("Transpose", [y], outputs,
                                           [_ref_attr("perm", "y_perm", _IS)]))
    elif op_type == "Im2Col":
        _im2col_body(b, int(overload[:-1]))
    elif op_type in BINARY_OPS:
        b.op(op_type, inputs, out=outputs)
    elif op_type in UNARY_OPS:
        refs = [_ref_attr(a, a, t) for a, (t, _) in spec.attrs.items()]
        b.nodes.append(_node_with_refs(op_type, inputs, outputs, refs))
    elif op_type in ("Reduce", "MergePartial"):
        onnx_op = REDUCE_KINDS[overload]
        if op_type == "Reduce":
            _reduce_node(b, onnx_op, "X", "Y", opset, "axes", keepdims_ref=True)
        else:
            _reduce_node(b, onnx_op, "P", "Y", opset, None, axes=[0], keepdims=0)
    elif op_type == "Scan":
        axis = b.ref("value_int", "axis", _I)
        b.nodes.append(_node_with_refs("CumSum", ["X", axis], ["Y"],
                                       [_ref_attr("exclusive", "exclusive", _I),
                                        _ref_attr("reverse", "reverse", _I)]))
    elif op_type == "TopK":
        k = b.op("Reshape", [b.ref("value_int", "k", _I), b.const_ints([1])])
        b.nodes.append(_node_with_refs("TopK", ["X", k], outputs,
                                       [_ref_attr(a, a, _I) for a in ("axis", "largest", "sorted")]))
    elif op_type == "Transpose":
        b.nodes.append(_node_with_refs("Transpose", ["X"], ["Y"], [_ref_attr("perm", "perm", _IS)]))
    elif op_type == "Histogram":
        _histogram_body(b, opset)
    elif op_type == "PopCount":
        _popcount_body(b, opset)
    elif op_type == "SimSearch":
        _simsearch_body(b, overload, opset)
    elif op_type == "Softmax":  # opset >= 13: Softmax normalizes over the one axis it is given
        b.op("Softmax", ["X"], out=["Y"], axis=-1)
    elif op_type == "LayerNorm":
        if overload != "bias":
            inputs = inputs[:2]
        _layernorm_body(b, overload == "bias", opset)
    elif op_type == "Gelu":
        _gelu_body(b, overload, opset)
    else:  # pragma: no cover - every op of OPS is handled above
        raise ValueError(f"no reference body for cinm.{op_type}")
    fn = helper.make_function(DOMAIN, op_type, inputs, outputs, b.nodes,
                              [helper.make_opsetid("", opset)],
                              attributes=sorted(set(spec.attrs) | set(PLACEMENT_ATTRS) | set(PLAN_ATTRS)),
                              doc_string=spec.doc)
    fn.overload = overload
    return fn


# --------------------------------------------------------------------------------------------
# Schemas (static checking and shape inference in this process)
# --------------------------------------------------------------------------------------------

_INFER_OPSET = 18


def _dims(t: onnx.TypeProto) -> list | None:
    """Dims of a tensor type as ints (known), strings (symbolic) or None (unknown); None if no shape."""
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim[:]]


def _tensor_type(elem_type: int, dims: list | None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem_type, dims)


def _infer_im2col(types, attrs):
    ks, st, pd, dl = (attrs[a] for a in ("kernel_shape", "strides", "pads", "dilations"))
    x = _dims(types[0])
    r = len(ks)
    if x is None:
        return [_tensor_type(types[0].tensor_type.elem_type, None)]
    if len(x) != r + 2 or len(st) != r or len(dl) != r or len(pd) != 2 * r:
        raise onnx.shape_inference.InferenceError(
            f"cinm.Im2Col: input rank {len(x)} does not match kernel_shape {ks} (needs rank {r + 2}), "
            f"strides {st}, dilations {dl}, pads {pd}")
    out = [x[0]]
    for a in range(r):
        s = x[2 + a]
        out.append((s + pd[a] + pd[r + a] - dl[a] * (ks[a] - 1) - 1) // st[a] + 1
                   if isinstance(s, int) else None)
    c = x[1]
    out.append(c * _prod(ks) if isinstance(c, int) else None)
    return [_tensor_type(types[0].tensor_type.elem_type, out)]


def _prod(v) -> int:
    p = 1
    for e in v:
        p *= e
    return p


def _infer_topk(types, attrs):
    x = _dims(types[0])
    if x is not None:
        axis = attrs.get("axis", -1) % len(x)
        x = x[:axis] + [attrs["k"]] + x[axis + 1:]
    return [_tensor_type(types[0].tensor_type.elem_type, x), _tensor_type(TensorProto.INT64, x)]


def _infer_simsearch(types, attrs):
    q = _dims(types[0])
    out = None if q is None else [q[0], attrs["k"]]
    return [_tensor_type(types[0].tensor_type.elem_type, out), _tensor_type(TensorProto.INT64, out)]


def _infer_like_x(types, attrs):
    """Y has X's type and shape (LayerNorm's body reshapes to ``Shape(X)``, which body
    inference cannot follow)."""
    return [types[0]]


def _static_matmul_type(types: list) -> onnx.TypeProto | None:
    """The type onnx's inference gives the output of ``MatMul(A, B)`` (the body of a cinm Gemm
    without y_perm), or of ``Add(MatMul(A, B), C)`` (with a bias), for ``types`` the types of
    A, B (and C): A's element type, A's and B's batch dims broadcast, then ``[M, N]``; worked
    out directly where it is plain: A and B of rank >= 2 and every dim a known size, K the
    same, the batch dims broadcastable and C broadcasting to the product without changing its
    shape; None otherwise, and for types of different element types (the body's inference
    decides then, and says what fails). That inference ran once per distinct Gemm signature:
    67 of light DenseNet121's 121 Gemms, 7 M instructions of one ``optimize`` (valgrind)."""
    elem = types[0].tensor_type.elem_type
    if not elem or any(t.tensor_type.elem_type != elem for t in types):
        return None
    dims = [_dims(t) for t in types]
    if any(d is None or not all(type(v) is int for v in d) for d in dims):
        return None
    a, b = dims[0], dims[1]
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    batch = _broadcast(a[:-2], b[:-2])
    if batch is None:
        return None
    out = batch + [a[-2], b[-1]]
    if len(dims) > 2:
        c = dims[2]
        if len(c) > len(out) or any(v != 1 and v != o for v, o in zip(c[::-1], out[::-1])):
            return None
    return _tensor_type(elem, out)


def _broadcast(x: list[int], y: list[int]) -> list[int] | None:
    """Numpy's broadcast of the static shapes ``x`` and ``y`` (ONNX's multidirectional
    broadcasting), or None when they do not broadcast."""
    if len(x) < len(y):
        x, y = y, x
    out = list(x)
    for k in range(1, len(y) + 1):
        u, v = x[-k], y[-k]
        if u == v or v == 1:
            continue
        if u != 1:
            return None
        out[-k] = v
    return out


#: Ops whose output shapes depend on attribute *values* in ways body inference cannot propagate.
_DIRECT_INFER = {"Im2Col": _infer_im2col, "TopK": _infer_topk, "SimSearch": _infer_simsearch,
                 "LayerNorm": _infer_like_x}


@functools.lru_cache(maxsize=None)
def _inference_function(op_type: str, overload: str) -> FunctionProto:
    """The body used for shape inference (shared; never mutate the result)."""
    return build_function(op_type, overload, _INFER_OPSET)


#: Memo of :func:`_body_output_types`: every shape inference of a model asks for each cinm
#: node's outputs (onnx calls back into Python per node), and the nodes of one network repeat
#: a few signatures (DenseNet121: 605 cinm ops, 7 inferences of the graph per optimize).
_BODY_TYPES: dict = {}
_BODY_TYPES_MAX = 4096


def _body_output_types(op_type: str, overload: str, fn: FunctionProto, types: list,
                       protos: list) -> list:
    """``onnx.shape_inference.infer_function_output_types(fn, types, protos)``, remembered
    per op type, overload, input types and attributes (their serialized bytes: the same bytes,
    the same inference); raises what it raises."""
    key = (op_type, overload, tuple(t.SerializeToString() for t in types),
           tuple(p.SerializeToString() for p in protos))
    hit = _BODY_TYPES.get(key)
    if hit is None:
        hit = onnx.shape_inference.infer_function_output_types(fn, types, protos)
        if len(_BODY_TYPES) >= _BODY_TYPES_MAX:
            _BODY_TYPES.clear()
        _BODY_TYPES[key] = hit
    return hit


def _output_types(op_type: str, protos: list, n_in: int, present: list[int],
                  input_type: Callable[[int], onnx.TypeProto | None]) -> list | None:
    """The output types of a cinm node (its inference function's core, shared by the schema's
    callback and :func:`output_types`): ``protos`` its attributes among the op's declared ones
    (:attr:`OpSpec.attrs` order), ``n_in`` its input count, ``present`` the indices of the
    non-empty inputs, ``input_type(i)`` the type of input ``i`` (None: unknown). None when an
    input's type is unknown (the outputs stay unknown); raises what the op's inference raises
    (ValueError, onnx's InferenceError)."""
    attrs = {p.name: helper.get_attribute_value(p) for p in protos}
    overload = overload_of(op_type, attrs, len(present))
    if any(input_type(i) is None for i in present):
        return None  # an input of unknown type (e.g. made by a contrib op): the output stays unknown
    if op_type in _DIRECT_INFER:
        return _DIRECT_INFER[op_type]([input_type(i) for i in range(n_in)], attrs)
    if op_type == "Clip":  # optional min/max: the output has the input's type
        return [input_type(0)]
    if op_type == "Gemm" and overload in ("", "bias"):
        got = _static_matmul_type([input_type(i) for i in present])
        if got is not None:
            return [got]
    fn = _inference_function(op_type, overload)
    types = [input_type(i) if i < n_in else onnx.TypeProto() for i in range(len(fn.input))]
    if any(t is None for t in types):  # an input of unknown type (after an op onnx cannot
        return None                    # infer): the output stays unknown too
    return _body_output_types(op_type, overload, fn, types, protos)


def _infer(op_type: str):
    spec = OPS[op_type]

    def infer(ctx) -> None:
        n_in = ctx.get_num_inputs()
        present = [i for i in range(n_in) if ctx.has_input(i)]
        protos = [a for a in map(ctx.get_attribute, spec.attrs) if a is not None]
        got: dict = {}  # each input's type converted once (onnx hands out a fresh copy per call)

        def input_type(i: int):
            if i not in got:
                got[i] = ctx.get_input_type(i)
            return got[i]

        for i, t in enumerate(_output_types(op_type, protos, n_in, present, input_type) or ()):
            ctx.set_output_type(i, t)

    return infer


@functools.cache
def _allowed_elem_types(op_type: str) -> dict[str, frozenset]:
    """``{type variable: the TensorProto element types its constraint allows}`` of a cinm op
    (``tensor(float)`` -> FLOAT), once per op."""
    names = {f"tensor({k.lower()})": v for k, v in TensorProto.DataType.items()}
    return {tvar: frozenset(names[t] for t in allowed if t in names)
            for tvar, allowed in OPS[op_type].types.items()}


def output_types(node: NodeProto, types: dict) -> list | None:
    """The types onnx's shape inference gives the outputs of the cinm ``node`` (its schema's
    check of the input element types, then the op's inference function), from the types of
    its inputs (``{name: TypeProto}``), without a round trip through onnx's C++ inference
    context: the types of the nodes ``to_cinm`` adds (:func:`onnx_cinm.analysis.type_node_outputs`).
    None when onnx would leave them unknown or reject the node (an unknown op or input type,
    an element type outside the op's constraints, inputs of one type variable that differ, an
    attribute the inference rejects)."""
    spec = OPS.get(node.op_type)
    if spec is None or node.domain != DOMAIN:
        return None
    names = node.input[:]
    if len(names) > len(spec.inputs):
        return None
    allowed = _allowed_elem_types(node.op_type)
    bound: dict[str, int] = {}
    for name, (_, tvar, _) in zip(names, spec.inputs):
        if not name:
            continue
        t = types.get(name)
        if t is None or not t.HasField("tensor_type"):
            return None
        elem = t.tensor_type.elem_type
        if bound.setdefault(tvar, elem) != elem or elem not in allowed[tvar]:
            return None
    by_name = {a.name: a for a in node.attribute[:]}
    protos = [by_name[n] for n in spec.attrs if n in by_name]
    present = [i for i, name in enumerate(names) if name]
    try:
        return _output_types(node.op_type, protos, len(names), present,
                             lambda i: types.get(names[i]) if names[i] else None)
    except Exception:  # noqa: BLE001 - what onnx's non-strict inference leaves unknown
        return None


def _shared_attrs() -> list:
    """The attributes every cinm op accepts: the placement annotations, then the device plans
    (:data:`PLAN_ATTRS`), as ``OpSchema.Attribute`` objects (each schema copies them)."""
    return ([OpSchema.Attribute(n, OpSchema.AttrType(t), "placement annotation", required=False)
             for n, t in PLACEMENT_ATTRS.items()]
            + [OpSchema.Attribute(n, OpSchema.AttrType(t), "device plan", required=False)
               for n, t in PLAN_ATTRS.items()])


def _make_schema(spec: OpSpec, shared: list) -> OpSchema:
    """The schema of ``spec``, its own attributes followed by ``shared`` (:func:`_shared_attrs`)."""
    P = OpSchema.FormalParameterOption
    inputs = [OpSchema.FormalParameter(n, t, param_option=P.Optional if opt else P.Single)
              for n, t, opt in spec.inputs]
    outputs = [OpSchema.FormalParameter(n, t) for n, t in spec.outputs]
    attrs = [OpSchema.Attribute(n, OpSchema.AttrType(t), "", required=req)
             for n, (t, req) in spec.attrs.items()] + shared
    schema = OpSchema(spec.name, DOMAIN, VERSION, doc=spec.doc, inputs=inputs, outputs=outputs,
                      type_constraints=[(k, v, "") for k, v in spec.types.items()], attributes=attrs)
    schema.set_type_and_shape_inference_function(_infer(spec.name))
    return schema


class _ReferenceWithoutCinm(importlib.abc.MetaPathFinder):
    """Imports ``onnx.reference.op_run`` (imported by ``onnx.reference``) with the cinm
    schemas left out of what it indexes: it indexes every registered schema by op name alone
    when it is imported and raises NotImplementedError for two domains under one name
    (cinm.Mul next to Mul). While its module runs, ``onnx.defs.get_all_schemas_with_history``
    (what it reads) lists every schema but the cinm ops'; the schemas stay registered for
    everyone else (shape inference and the checker in other threads), and ``onnx.reference``
    never runs cinm ops (a model's cinm ops carry their reference bodies as functions).
    Importing ``onnx.reference`` before registering instead cost every process 20 ms
    (``python -c 'import onnx, onnx.reference'`` against ``import onnx``: 142 / 122 ms,
    session 35) that almost none needs."""

    NAME = "onnx.reference.op_run"

    def find_spec(self, name, path, target=None):
        if name != self.NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module) -> None:
            listed = onnx.defs.get_all_schemas_with_history
            onnx.defs.get_all_schemas_with_history = lambda: [
                x for x in listed() if x.domain != DOMAIN]
            try:
                run(module)
            finally:
                onnx.defs.get_all_schemas_with_history = listed

        loader.exec_module = exec_module  # (this spec's own loader object)
        return spec


def _guard_reference_import() -> None:
    """Put :class:`_ReferenceWithoutCinm` first on ``sys.meta_path`` (once), unless
    ``onnx.reference.op_run`` is imported already (it indexed the schemas before ours)."""
    if _ReferenceWithoutCinm.NAME not in sys.modules and \
            not any(isinstance(f, _ReferenceWithoutCinm) for f in sys.meta_path):
        sys.meta_path.insert(0, _ReferenceWithoutCinm())


def register_schemas() -> None:
    """Register the schemas of every cinm op with ``onnx.defs`` (idempotent); a later import
    of ``onnx.reference`` leaves them out of its index (:class:`_ReferenceWithoutCinm`)."""
    _guard_reference_import()
    shared = None  # built once for every op (66 attributes each with every device's plans)
    for spec in OPS.values():
        if not onnx.defs.has(spec.name, DOMAIN):
            if shared is None:
                shared = _shared_attrs()
            onnx.defs.register_schema(_make_schema(spec, shared))


# the plan attributes declared before the dialect loaded (the devices register first on the
# command line) first: then each schema is registered once, not registered and replaced
sync_plan_attrs()
register_schemas()  # (done by sync_plan_attrs when there were any)


# --------------------------------------------------------------------------------------------
# Building and finishing models
# --------------------------------------------------------------------------------------------

def make_node(op_type: str, inputs: list[str], outputs: list[str], name: str | None = None,
              **attrs) -> NodeProto:
    """Create a ``cinm.<op_type>`` node. Raises ValueError for an unknown op or a missing required attribute."""
    spec = OPS.get(op_type)
    if spec is None:
        raise ValueError(f"unknown cinm op {op_type!r}")
    for a, (_, required) in spec.attrs.items():
        if required and a not in attrs:
            raise ValueError(f"cinm.{op_type} needs attribute {a!r}")
    # what onnx.helper.make_node writes (attributes sorted by name, None ones left out)
    node = NodeProto(op_type=op_type, input=inputs, output=outputs, domain=DOMAIN)
    if name:
        node.name = name
    node.attribute.extend(_attribute(k, v) for k, v in sorted(attrs.items()) if v is not None)
    return node


def _attribute(name: str, value) -> AttributeProto:
    """``onnx.helper.make_attribute(name, value)``, built directly for the kinds the passes
    write most (a Python int, float, str, or non-empty list of ints): the helper's checks
    against the ``numbers`` ABCs cost more than the attribute."""
    kind = type(value)
    if kind is int:
        return AttributeProto(name=name, type=_INT, i=value)
    if kind is float:
        return AttributeProto(name=name, type=_FLOAT, f=value)
    if kind is str:
        return AttributeProto(name=name, type=_STRING, s=value.encode())
    if kind is list and value and all(type(v) is int for v in value):
        return AttributeProto(name=name, type=_INTS, ints=value)
    return helper.make_attribute(name, value)


def node_attrs(node: NodeProto, names: frozenset | None = None) -> dict:
    """The node's attributes as python values (strings decoded; what
    ``onnx.helper.get_attribute_value`` gives otherwise); only those ``names`` when given (the
    others, a planned op's whole plan, are not converted). Raises ValueError on a reference
    attribute or an unknown attribute type, as that function does."""
    out = {}
    # every pass asks for every node's: the plain kinds read directly, each field once, the
    # repeated ones as slices (lists: iterating the field ends on an IndexError protobuf formats)
    for a in node.attribute[:]:
        name = a.name
        if names is not None and name not in names:
            continue
        kind = a.type
        if kind == _INT and not a.ref_attr_name:
            out[name] = a.i
        elif kind == _INTS and not a.ref_attr_name:
            out[name] = a.ints[:]
        elif kind == _STRING and not a.ref_attr_name:
            out[name] = a.s.decode()
        elif kind == _FLOAT and not a.ref_attr_name:
            out[name] = a.f
        elif kind == _FLOATS and not a.ref_attr_name:
            out[name] = a.floats[:]
        elif kind == _STRINGS and not a.ref_attr_name:
            out[name] = a.strings[:]
        else:
            out[name] = _as_str(helper.get_attribute_value(a))
    return out


_INT, _INTS, _STRING = AttributeProto.INT, AttributeProto.INTS, AttributeProto.STRING
_FLOAT, _FLOATS, _STRINGS = AttributeProto.FLOAT, AttributeProto.FLOATS, AttributeProto.STRINGS
_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS


def all_nodes(graph: onnx.GraphProto):
    """Yield every node of ``graph`` and, recursively, of its nodes' subgraphs (If branches,
    Loop and Scan bodies), each graph's nodes in order before its subgraphs' are visited."""
    for node in graph.node[:]:  # slices: see node_attrs
        yield node
        if node.domain == DOMAIN:
            continue  # no cinm op takes a graph attribute (none is declared: see the schemas)
        for attr in node.attribute[:]:
            kind = attr.type
            if kind == _GRAPH:
                yield from all_nodes(attr.g)
            elif kind == _GRAPHS:
                for sub in attr.graphs[:]:
                    yield from all_nodes(sub)


def string_attrs(node: NodeProto, *names: str) -> tuple:
    """The values of ``node``'s attributes ``names`` as :func:`node_attrs` gives them (None:
    absent), without converting the others: a planned op's whole plan, which the FLOP count,
    the device count and the passes after placement never read (converting it was most of
    their time). An attribute of another kind than a plain string: all converted by
    :func:`node_attrs`."""
    found = {}
    for a in node.attribute[:]:
        name = a.name
        if name in names:
            found[name] = a.s.decode() if a.type == AttributeProto.STRING and \
                not a.ref_attr_name else None
    if any(found.get(n, "") is None for n in names):
        at = node_attrs(node)
        return tuple(at.get(n) for n in names)
    return tuple(found.get(n) for n in names)


def device_of(node: NodeProto) -> str | None:
    """``node_attrs(node).get("device")``, read alone (:func:`string_attrs`)."""
    return string_attrs(node, "device")[0]


def ops_per_device(model: onnx.ModelProto) -> dict[str, int]:
    """``{device name: count}`` of the cinm ops of ``model`` as it stands (If branches and
    loop bodies too), by their ``device`` attribute; ``"unplaced"`` before placement. What
    ``optimize`` prints as "cinm ops per device" and ``sweep`` as its ``devices`` column: the
    ops of the lowered model, after the passes that follow placement (``fold_layouts`` drops
    host Transposes that placement had counted)."""
    counts: dict[str, int] = {}
    for node in all_nodes(model.graph):
        if node.domain == DOMAIN:
            dev = device_of(node) or "unplaced"
            counts[dev] = counts.get(dev, 0) + 1
    return counts


def node_label(node: NodeProto, index: int) -> str:
    """The name a person reads for ``node``, the ``index``-th node of its graph, in every
    table and note (optimize's kernel tables, ``run --profile``, ``report``, the run's
    errors): its name (a lowered op's ``<source node>/<Op>``), or ``<OpType #index>`` when it
    has none (an unnamed host node the optimizer left as it was), which no real name
    collides with (an exporter's ``Relu_20`` is a name)."""
    return node.name or f"<{node.op_type} #{index}>"


def branch_label(if_label: str, branch: str) -> str:
    """The prefix naming the nodes of branch ``branch`` (``then_branch``/``else_branch``) of
    the If labelled ``if_label``: ``/dec/If_1[then] `` (the provider's profile says the same)."""
    return f"{if_label}[{branch.removesuffix('_branch')}] "


def is_if(node: NodeProto) -> bool:
    """True for a standard If node with both branches."""
    return node.op_type == "If" and node.domain in ("", "ai.onnx") and \
        {a.name for a in node.attribute if a.type == onnx.AttributeProto.GRAPH} == \
        {"then_branch", "else_branch"}


def if_branches(node: NodeProto, taken: dict, counted: bool = True, ifs: dict | None = None):
    """Yield ``(branch name, body, counted)`` for the then and the else branch of the If
    ``node`` (:func:`is_if`), in that order: the rule of what runs per inference. A branch
    counts when the graph of ``node`` counts (``counted``) and the If's condition is not
    recorded in ``taken`` (``{If name: True for then}``, the planning probe's; then either
    branch may run, both count) or takes it. ``ifs``, if given and ``counted``, counts the If
    (``"taken"``: its condition is recorded, else ``"both"``) when the first branch is asked
    for."""
    seen = taken.get(node.name)
    if ifs is not None and counted:
        key = "both" if seen is None else "taken"
        ifs[key] = ifs.get(key, 0) + 1
    bodies = {a.name: a.g for a in node.attribute}
    for branch in ("then_branch", "else_branch"):
        yield branch, bodies[branch], counted and seen in (None, branch == "then_branch")


def labelled_nodes(graph: onnx.GraphProto, taken: dict, ifs: dict | None = None,
                   label: str = "", counted: bool = True):
    """Yield ``(label, node, counted)`` for every node of ``graph`` in order, an If followed by
    the nodes of its then and else branches (nested Ifs alike; Loop and Scan bodies are not
    entered). ``label`` is the branch path before the node's name (``""`` in the main graph,
    :func:`branch_label`); ``counted`` is False inside a branch that does not run per
    inference (:func:`if_branches` says which: ``taken`` records ``{If name: True for then}``).
    ``ifs``, if given, counts the Ifs met in counted graphs: ``"taken"`` (by ``taken``) and
    ``"both"``."""
    for node in graph.node:
        yield label, node, counted
        if not is_if(node):
            continue
        for branch, body, runs in if_branches(node, taken, counted, ifs):
            yield from labelled_nodes(body, taken, ifs,
                                      label + branch_label(node.name or node.op_type, branch), runs)


def forget_plans(model: onnx.ModelProto) -> int:
    """Drop the ``kernel`` and plan attributes (:data:`PLAN_ATTRS`) of every cinm node of the
    model (control-flow bodies included), in place, so that an already optimized model can be compiled again: placement
    may move a node, and the device passes plan and emit afresh. ``device`` and ``placement``
    stay (they are what ``--skip-pass placement`` keeps). Returns the number of nodes changed."""
    changed = 0
    for node in all_nodes(model.graph):
        if node.domain != DOMAIN:
            continue
        keep = [a for a in node.attribute if a.name != "kernel" and a.name not in PLAN_ATTRS]
        if len(keep) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(keep)
            changed += 1
    return changed


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset version."""
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    raise ValueError("model has no default-domain opset import")


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give ``model`` the reference bodies of the cinm ops it uses (in place; also returned).

    Sets each cinm node's overload, replaces the model's cinm functions by freshly built ones in
    the model's default opset, adds the ``cinm`` opset import and lifts the IR version to
    :data:`MIN_IR_VERSION`. Control-flow bodies are scanned too (cinm ops compiled inside If
    branches).

    Raises:
        ValueError: a cinm node names an unknown op or variant, or the opset is below MIN_OPSET.
    """
    opset = default_opset(model)
    needed: dict[tuple[str, str], None] = {}
    for node in all_nodes(model.graph):
        if node.domain != DOMAIN:
            continue
        op = node.op_type  # (each field read once: three passes call this on every node)
        if op not in OPS:
            raise ValueError(f"node {node.name!r}: unknown cinm op {op!r}")
        names = node.input[:]
        n_in = len(names) - names.count("")
        attrs = node_attrs(node, OVERLOAD_ATTRS) if op in ATTR_OVERLOADS else {}
        overload = overload_of(op, attrs, n_in)
        node.overload = overload  # (set even when it is "": the field then is present)
        needed[(op, overload)] = None
    keep = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(keep + [build_function(op, ov, opset) for op, ov in needed])
    imports = {o.domain: o for o in model.opset_import}
    if needed and DOMAIN not in imports:
        model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    if not needed and DOMAIN in imports:
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    model.ir_version = max(model.ir_version, MIN_IR_VERSION)
    return model
