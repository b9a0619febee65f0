"""What the golden check needs to judge quantized models: an exact reference for the integer
products onnxruntime gets wrong on this CPU, and the size of one quantization step of an output.

**Saturating u8s8 products.** onnxruntime's MatMulInteger and QLinearMatMul with uint8
activations and int8 weights run MLAS u8s8 kernels; on x86 CPUs without VNNI (SSE4.1, AVX2,
AVX-512 without VNNI: ``VPMADDUBSW``) they add each pair of u8 x s8 products in int16 and
saturate there, so int8 weights outside [-64, 64] can give wrong sums (onnxruntime PR #12088,
"x86/64 U8S8 Gemm Precision Fix", which adds the opt-in session option
``session.x64quantprecision`` to convert such weights to u8 at graph-optimization level 2; the
quantizer's ``reduce_range`` keeps weights in 7 bits for the same reason). The lowered model's
int32 Gemm is exact, so comparing it with such a reference compares it with onnxruntime's
saturation. :func:`u8s8_saturates` probes this machine once (255 x 127 twice: 64770 exact, 32767
saturated); where it does, :func:`exact_integer_products` rewrites the affected nodes of a model
into standard ops that onnxruntime computes exactly (int32 ``MatMul`` of the zero-point-
corrected operands; for QLinearConv, ``ConvInteger`` on the weights moved to uint8 (``w + 128``,
zero point + 128: its u8u8 kernels widen to 16 bits before multiplying, so they do not
saturate); the QLinear requantization after it, the float32 multiplier in onnxruntime's order),
and the check says so. The level-2 route was not taken: it also fuses and reorders the float
parts of the reference. ConvInteger takes no int8 weights in onnxruntime; a QLinearConv with
per-channel weight zero points that differ is not rewritten (ConvInteger takes one).

**Quantization steps.** A QDQ model's outputs are rounded to a grid (``DequantizeLinear`` of a
``QuantizeLinear``): a product computed exactly in int32 and rescaled in float32 differs from
onnxruntime's float32 sum of dequantized terms by rounding, and where a value sits at a rounding
tie of a ``QuantizeLinear`` the two land on neighbouring levels. :func:`output_steps` gives, per
output, the step of the last ``QuantizeLinear``/``DequantizeLinear`` grid it comes from
(through shape ops and 1-Lipschitz elementwise ops: Relu, Sigmoid, Tanh, which move a one-step
difference by at most one step); the check allows that one step (``golden.compare``).

**Tensor by tensor.** In a deep QDQ model a one-step difference at a rounding tie does not stay
one step: the layers after it (LayerNorm, GELU, an atan2 that wraps at +-pi) grow it, so the
outputs of two correct computations can differ by far more (LEADER: 6.26, as much as
onnxruntime's own optimized and unoptimized sessions differ). :func:`quantized_tensors`,
:func:`with_outputs` and :func:`fed_from_reference` let ``golden.compare_stepwise`` compute
each quantized tensor of the candidate from the reference's quantized inputs, and
:func:`quantizer_inputs` and :func:`at_rounding_tie` tell a one-step difference at a tie (the
reference's float value within a few ulps of a half step, inside the type's range, the
candidate on one of the two levels around it) from one that is not.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: int8 weights within this magnitude never saturate the u8s8 int16 pair sums (255 * 64 * 2 =
#: 32640 <= 32767): the quantizer's reduce_range.
SAFE_INT8 = 64

#: Ops that pass a one-step difference on unchanged in size or smaller (shape ops, and
#: elementwise ops with a slope of at most 1).
_PASS_THROUGH = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Relu",
                 "Sigmoid", "Tanh", "Clip"}


@functools.lru_cache(maxsize=1)
def u8s8_saturates() -> bool:
    """Whether this machine's onnxruntime MatMulInteger sums u8 x s8 pairs in saturating int16
    (a 1 x 2 by 2 x 1 product of 255s and 127s: 32767 instead of 64770)."""
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                          [numpy_helper.from_array(np.full((2, 1), 127, np.int8), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.full((1, 2), 255, np.uint8)})[0]
    return int(y.reshape(-1)[0]) != 2 * 255 * 127


def _full_range_weights(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """MatMulInteger / QLinearMatMul / QLinearConv nodes with a constant int8 weight beyond
    ``SAFE_INT8`` (QLinearConv: with one weight zero point)."""
    inits = {t.name: t for t in graph.initializer}
    out = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in REWRITTEN:
            continue
        w = inits.get(node.input[1] if node.op_type == "MatMulInteger" else node.input[3])
        if w is None or w.data_type != TensorProto.INT8 or \
                np.abs(numpy_helper.to_array(w).astype(np.int32)).max(initial=0) <= SAFE_INT8:
            continue
        if node.op_type == "QLinearConv" and _one_zero_point(graph, node.input[5]) is None:
            continue
        out.append(node)
    return out


#: The ops :func:`exact_integer_products` rewrites.
REWRITTEN = ("MatMulInteger", "QLinearMatMul", "QLinearConv")


def _one_zero_point(graph: onnx.GraphProto, name: str) -> int | None:
    """The single value of weight zero point ``name`` (0 when absent; None when computed at run
    time or when its per-channel values differ)."""
    if not name:
        return 0
    t = next((t for t in graph.initializer if t.name == name), None)
    values = None if t is None else np.unique(numpy_helper.to_array(t))
    return int(values[0]) if values is not None and values.size == 1 else None


def saturating_nodes(model: onnx.ModelProto) -> int:
    """How many nodes of ``model`` onnxruntime computes with saturating u8s8 kernels here (0 on
    a machine whose kernels are exact)."""
    return len(_full_range_weights(model.graph)) if u8s8_saturates() else 0


def exact_integer_products(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``(model', count)``: ``model`` (unchanged, count 0) or a copy whose ``count``
    MatMulInteger / QLinearMatMul nodes with full-range int8 weights are standard ops onnxruntime
    computes exactly: ``MatMul(int32(A) - a_zp, int32(B) - b_zp)``, for QLinearMatMul then
    ``QuantizeLinear(float32(acc) * ((a_scale * b_scale) / y_scale), 1, y_zp)`` (onnxruntime's
    requantization). Only where :func:`u8s8_saturates`."""
    nodes = _full_range_weights(model.graph) if u8s8_saturates() else []
    if not nodes:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewrite = {n.name or n.output[0] for n in nodes}
    new_nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        key = node.name or node.output[0]
        if key in rewrite and node.op_type in REWRITTEN:
            new_nodes.extend(_exact(node, out.graph))
        else:
            new_nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    return out, len(nodes)


def _exact(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The standard-op form of one MatMulInteger / QLinearMatMul (see
    :func:`exact_integer_products`)."""
    base = f"{node.name or node.output[0]}__exact"
    made: list[onnx.NodeProto] = []

    def op(kind, inputs, **attrs):
        name = f"{base}_{len(made)}"
        made.append(helper.make_node(kind, inputs, [name], name=name, **attrs))
        return name

    def corrected(x, zp, per_row):
        v = op("Cast", [x], to=TensorProto.INT32)
        if zp:
            z = op("Cast", [zp], to=TensorProto.INT32)
            if per_row:  # a per-row zero point [M] of a 2-D A: a column
                z = op("Unsqueeze", [z, _const(graph, f"{base}_axis", np.array([-1], np.int64))])
            v = op("Sub", [v, z])
        return v

    ins = list(node.input) + [""] * 9
    if node.op_type == "MatMulInteger":
        a, b, azp, bzp = ins[:4]
    else:
        a, a_s, azp, b, b_s, bzp, y_s, yzp, bias = ins[:9]
    if node.op_type == "QLinearConv":  # int8 weights as uint8 (+128) for ConvInteger's u8u8
        w = next(t for t in graph.initializer if t.name == b)
        wu8 = (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8)
        zp = np.array(_one_zero_point(graph, bzp) + 128, np.uint8)
        acc = op("ConvInteger", [a, _const(graph, f"{base}_w", wu8), azp, _const(graph, f"{base}_wzp", zp)],
                 **{at.name: helper.get_attribute_value(at) for at in node.attribute})
        # per output channel [M] -> [M, 1, ...] against the [N, M, *S] result
        trailing = _const(graph, f"{base}_axes", np.arange(1, len(w.dims) - 1, dtype=np.int64))
        if bias:
            acc = op("Add", [acc, op("Unsqueeze", [bias, trailing])])
        mult = op("Unsqueeze", [op("Div", [op("Mul", [a_s, op("Reshape", [b_s, _const(graph, f"{base}_flat", np.array([-1], np.int64))])]), y_s]), trailing])
        f = op("Mul", [op("Cast", [acc], to=TensorProto.FLOAT), mult])
        made.append(helper.make_node("QuantizeLinear", [f, _const(graph, f"{base}_one", np.array(1.0, np.float32)), yzp],
                                     [node.output[0]], name=f"{base}_q"))
        return made
    acc = op("MatMul", [corrected(a, azp, _is_vector(graph, azp)), corrected(b, bzp, False)])
    if node.op_type == "MatMulInteger":
        made[-1].output[0] = node.output[0]
        return made
    mult = op("Div", [op("Mul", [a_s, b_s]), y_s])
    f = op("Mul", [op("Cast", [acc], to=TensorProto.FLOAT), mult])
    made.append(helper.make_node("QuantizeLinear", [f, _const(graph, f"{base}_one", np.array(1.0, np.float32)), yzp],
                                 [node.output[0]], name=f"{base}_q"))
    return made


def _is_vector(graph: onnx.GraphProto, name: str) -> bool:
    """Whether initializer ``name`` is a 1-D tensor of more than one element (a per-row zero
    point); a zero point computed at run time is taken as a scalar."""
    t = next((t for t in graph.initializer if t.name == name), None) if name else None
    return t is not None and len(t.dims) == 1 and t.dims[0] > 1


def _const(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """``{output name: step}`` for the graph outputs that come from a quantization grid: the
    largest scale of the ``DequantizeLinear`` (float outputs) they come from through
    :data:`_PASS_THROUGH` ops, or 1 for an integer output of a ``QuantizeLinear`` (one level).
    Scales must be initializers; other outputs are not listed."""
    made = {o: n for n in model.graph.node for o in n.output if o}
    inits = {t.name: t for t in model.graph.initializer}
    steps: dict[str, float] = {}
    for out in model.graph.output:
        node = made.get(out.name)
        if node is not None and node.op_type == "QuantizeLinear":
            steps[out.name] = 1.0
            continue
        while node is not None and node.op_type in _PASS_THROUGH and node.input:
            node = made.get(node.input[0])
        scale = inits.get(node.input[1]) if node is not None and len(node.input) > 1 else None
        if node is not None and node.op_type == "DequantizeLinear" and scale is not None and \
                scale.data_location != TensorProto.EXTERNAL:
            steps[out.name] = float(np.abs(numpy_helper.to_array(scale)).max(initial=0))
    return steps


# --------------------------------------------------------------------------------------------
# the stepwise check of a QDQ model: each quantized tensor from the reference's quantized inputs
# --------------------------------------------------------------------------------------------
#: Suffix of the graph inputs through which a rewired candidate reads the reference's quantized
#: tensors (:func:`fed_from_reference`).
FED_SUFFIX = "__reference_levels"


def quantized_tensors(model: onnx.ModelProto) -> dict[str, int]:
    """``{name: element type}`` of the outputs of the main graph's ``QuantizeLinear`` nodes whose
    scale is an initializer and whose quantization is per tensor or per axis (blocked
    quantization is left out), in graph order. The element type is the zero point's (uint8
    without one; ``output_dtype`` when set)."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type != "QuantizeLinear" or not node.output[0]:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("block_size") or len(node.input) < 2 or node.input[1] not in inits:
            continue
        zp = node.input[2] if len(node.input) > 2 else ""
        if zp and zp not in inits:
            continue
        out[node.output[0]] = inits[zp].data_type if zp else attrs.get("output_dtype") or TensorProto.UINT8
    return out


def _fed_inputs(model: onnx.ModelProto, tensors: dict[str, int]) -> list:
    """The graph inputs ``name + FED_SUFFIX`` through which :func:`fed_from_reference` feeds the
    tensors ``tensors`` (``{name: element type}``) of ``model``'s main graph, each with the type
    and shape ``model``'s value_info (or graph outputs) gives it (symbolic dims kept, unknown
    ones open), so the ops reading it see in shape inference what they see in ``model`` (a
    Resize whose ``sizes`` are computed from the tensor's ``Shape`` refuses them unranked); the
    element type alone where ``model`` declares none or another."""
    known = {v.name: v for v in (*model.graph.value_info, *model.graph.output)}
    out = []
    for n, t in tensors.items():
        vi = known.get(n)
        if vi is not None and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == t:
            out.append(onnx.ValueInfoProto(name=n + FED_SUFFIX, type=vi.type))
        else:
            out.append(helper.make_tensor_value_info(n + FED_SUFFIX, t, None))
    return out


def with_outputs(model: onnx.ModelProto, outputs: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the tensors ``outputs`` (``{name: element type}``;
    names that already are graph outputs are not added twice)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()
                            if n not in have)
    return out


def fed_from_reference(model: onnx.ModelProto, tensors: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` whose main-graph nodes read each tensor of ``tensors`` (``{name:
    element type}``) from a new graph input ``name + FED_SUFFIX`` instead of computing it, and
    that returns the tensors it computes as extra outputs: fed the reference's quantized
    tensors, each of its own is computed from the reference's quantized inputs, so a rounding
    difference upstream cannot cascade into it. The new inputs are declared as ``model``
    declares the tensors (:func:`_fed_inputs`)."""
    out = with_outputs(model, tensors)
    for node in out.graph.node:
        for i, name in enumerate(node.input):
            if name in tensors:
                node.input[i] = name + FED_SUFFIX
    out.graph.input.extend(_fed_inputs(model, tensors))
    return out


#: A candidate's level one step off the reference's is a rounding question where the reference's
#: float value lies within ``TIE_RTOL x |value in steps|`` or :data:`TIE_ULPS` ulps of the value
#: (float32 for a float32 model; in steps), whichever is wider, of a rounding tie: the value
#: is only known to the float check's relative tolerance (1e-4, :func:`~onnx_cinm.golden.
#: default_tolerance`), since the reference's float32 sum of K dequantized terms rounds on the
#: way to it, a few ulps of the value per term where terms cancel. Measured: LEADER (afis
#: 1.2.7 QDQ; exact int32 products against onnxruntime's float32 sums) has its farthest
#: one-step difference 5.4 ulps from its tie; OriNet (occular-deskew 0.5.0, QDQ per channel, batch
#: 16) one element beyond 8 ulps, inside 1e-4. The window is bounded: only values inside the
#: type's range count (a saturated value is no tie), so for 8-bit types it is at most 0.026
#: steps.
TIE_ULPS = 8
TIE_RTOL = 1e-4


class QuantizerInput(NamedTuple):
    """A ``QuantizeLinear``'s float input and its grid (:func:`quantizer_inputs`).

    ``scale`` float64, a scalar or one value per index of ``axis``; ``zero_point`` int64 of
    the same shape (0 without one); ``qmin``, ``qmax`` the range of the quantized type
    (uint8: 0, 255)."""

    input: str
    input_type: int
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    qmin: int
    qmax: int


def quantizer_inputs(model: onnx.ModelProto, names: dict[str, int]) -> dict[str, QuantizerInput]:
    """``{quantized tensor: QuantizerInput}`` for the ``QuantizeLinear`` outputs ``names``
    (``{name: element type}``, :func:`quantized_tensors`) of ``model``'s main graph: the float
    input, its element type (the scale's), scale as float64, zero point as int64, axis as
    written (default 1) and the range of the element type."""
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in names:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            scale = inits[node.input[1]]
            zp = node.input[2] if len(node.input) > 2 else ""
            info = np.iinfo(helper.tensor_dtype_to_np_dtype(names[node.output[0]]))
            out[node.output[0]] = QuantizerInput(
                node.input[0], scale.data_type, numpy_helper.to_array(scale).astype(np.float64),
                numpy_helper.to_array(inits[zp]).astype(np.int64) if zp else np.zeros((), np.int64),
                axis, int(info.min), int(info.max))
    return out


def _along(a: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A scalar as it is, a vector shaped to broadcast along ``axis`` of an ``ndim`` array."""
    if not np.ndim(a):
        return a
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return np.reshape(a, shape)


def in_steps(value: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    """``value / scale`` in float64: a quantizer's float input in quantization steps (before
    the zero point). ``scale`` is a scalar or one value per index of ``axis``."""
    steps = np.asarray(value, np.float64)
    return steps / _along(scale, axis, steps.ndim)


def elements_of(q: QuantizerInput, where: np.ndarray, shape: tuple[int, ...]) -> QuantizerInput:
    """``q`` for the elements at flat indices ``where`` (int array) of a tensor of ``shape``,
    as a 1-D array of them: its scale and zero point one value per element along axis 0 (a
    scalar kept as it is), so :func:`at_rounding_tie` can judge those elements alone without
    the whole tensor in float64."""
    def pick(a: np.ndarray) -> np.ndarray:
        if not np.ndim(a):
            return a
        return np.broadcast_to(_along(a, q.axis, len(shape)), shape)[np.unravel_index(where, shape)]

    return q._replace(scale=pick(q.scale), zero_point=pick(q.zero_point), axis=0)


def tie_distance(steps: np.ndarray) -> np.ndarray:
    """How far values in quantization steps (:func:`in_steps`) lie from the nearest rounding
    tie, a half-integer: 0 at a tie, 0.5 on a level."""
    return np.abs(steps - np.floor(steps) - 0.5)


def at_rounding_tie(value: np.ndarray, level: np.ndarray, q: QuantizerInput,
                    ulps: float = TIE_ULPS) -> np.ndarray:
    """Where a quantizer's float input ``value`` (the reference's; float32 or float16, an
    integer input counted as float32) sits so close to a
    rounding tie that ``level`` (the candidate's integer output, same shape) may rightly be the
    other neighbour: bool array, True where all of

    - ``value / scale + zero_point`` lies inside the type's range (``qmin - 0.5 < v < qmax +
      0.5``): outside it the quantizer saturates, and no tie is involved;
    - ``level`` is ``floor(v)`` or ``floor(v) + 1``, the two levels around ``v``;
    - ``v`` lies within ``ulps`` ulps of ``value`` in its float type or :data:`TIE_RTOL` x
      ``|value / scale|``, whichever is wider (in steps), of a half-integer.
    """
    value = np.asarray(value)
    v = in_steps(value, q.scale, q.axis) + _along(q.zero_point, q.axis, value.ndim)
    inside = (v > q.qmin - 0.5) & (v < q.qmax + 0.5)
    low = np.floor(v)
    level = np.asarray(level, np.int64)
    neighbour = (level == low) | (level == low + 1)
    mag = np.abs(value)
    ulp = np.spacing(mag if mag.dtype.kind == "f" else mag.astype(np.float32)).astype(np.float64)
    scale = np.abs(_along(q.scale, q.axis, value.ndim))
    window = np.maximum(ulps * ulp, TIE_RTOL * mag.astype(np.float64)) / scale
    return inside & neighbour & (tie_distance(v) <= window)
