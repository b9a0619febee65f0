"""Static facts about a model: tensor types and shapes, constants, and FLOPs per node.

FLOPs count multiplies and adds separately (a multiply-accumulate is 2), for one inference at
the sizes the model is planned for (:func:`onnx_cinm.frontend.planned_dims`, set by ``optimize
--dim NAME=SIZE``); symbolic dims without a size are taken as 1 (a dynamic batch counts as batch
1). Data movement (Reshape, Transpose,
Concat, Gather, Im2Col, Pad, Cast, ...) counts 0.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from . import frontend
from .devices.base import OpInfo, TensorInfo
from .dialects import cinm

_MOVE = {"Reshape", "Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Im2Col", "Pad",
         "Cast", "CastLike", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Slice",
         "Split", "Expand", "Tile", "Constant", "ConstantOfShape", "Dropout", "DepthToSpace",
         "SpaceToDepth", "Resize", "Upsample", "ScatterND", "ScatterElements", "Range", "NonZero"}
_PER_OUTPUT = {"Softmax": 5, "LogSoftmax": 5, "BatchNormalization": 2, "LRN": 6,
               "InstanceNormalization": 5, "LayerNormalization": 8, "HardSigmoid": 3, "HardSwish": 4,
               "Gelu": 8, "Erf": 4}


def tensor_infos(model: onnx.ModelProto, infer: bool = True) -> dict[str, TensorInfo]:
    """Type, shape and constness of every tensor of the main graph that shape inference can tell.

    Runs (non-strict) shape inference on a copy without initializer data, so it is cheap for
    big models; with ``infer=False`` it reads the model's value_info as it is (for a model that
    was just inferred). Initializers are ``const``.

    Symbolic dims with a planned size (:func:`onnx_cinm.frontend.planned_dims`) are bound to it
    before inference, so shapes computed from them (a sequence length through a Reshape) are
    known too; with ``infer=False`` only the named dims are replaced.

    Raises:
        CinmError: the model's planned-dims record is malformed.
    """
    dims = frontend.planned_dims(model)
    if not infer:
        return _collect(model.graph, {i.name: (i.data_type, tuple(i.dims)) for i in model.graph.initializer},
                        dims)
    # A copy without the weight bytes: inference needs only their types and dims.
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                            functions=model.functions)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    if dims:  # bound on the copy: the model itself stays dynamic
        del g.value_info[:]  # entries computed from the symbolic sizes would contradict them
        frontend.bind_dims(g, dims)
    consts = {}
    for init in model.graph.initializer:
        consts[init.name] = (init.data_type, tuple(init.dims))
        # small ones (axes, shapes, k) carry values inference reads; the element count is a
        # cheap bound (ByteSize() walks the whole tensor, ~60 ms for a 100 MB one)
        if int(np.prod(init.dims, dtype=np.int64)) <= 512:
            g.initializer.append(init)
        else:
            g.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
    try:
        inferred = onnx.shape_inference.infer_shapes(
            light, strict_mode=False, data_prop=frontend.wants_data_propagation(model.graph))
    except Exception:  # noqa: BLE001 - inference is best effort here; unknown shapes stay unknown
        inferred = light
    return _collect(inferred.graph, consts, dims)


def _collect(graph: onnx.GraphProto, consts: dict, dims: dict | None = None) -> dict[str, TensorInfo]:
    dims = dims or {}
    infos: dict[str, TensorInfo] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
        shape = None
        if tt.HasField("shape"):
            # a negative dim_value (some exporters write -1 for "dynamic") is unknown, like a
            # dim_param
            shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                          else dims.get(d.dim_param, d.dim_param or "?") for d in tt.shape.dim)
        infos[vi.name] = TensorInfo(vi.name, dtype, shape, False)
    for name, (dtype, dims) in consts.items():
        infos[name] = TensorInfo(name, helper.tensor_dtype_to_np_dtype(dtype), dims, True)
    return infos


def _numel(info: TensorInfo | None) -> int:
    return 0 if info is None else info.numel


def node_flops(node: onnx.NodeProto, infos: dict[str, TensorInfo]) -> int:
    """FLOPs of one node for one inference (see the module docstring); 0 if shapes are unknown."""
    ins = [infos.get(n) for n in node.input]
    outs = [infos.get(n) for n in node.output]
    out = outs[0] if outs else None
    op = node.op_type
    if op in _MOVE:
        return 0
    if op in ("MatMul", "Gemm", "Gemv", "MatMulInteger", "SimSearch") and ins and ins[0] and ins[0].shape:
        k = ins[0].static_shape[-1] if (op != "Gemm" or node.domain == cinm.DOMAIN) else None
        if op == "Gemm" and node.domain != cinm.DOMAIN:
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            s = ins[0].static_shape
            k = s[0] if trans_a else s[-1]
        if op == "SimSearch" and ins[1] is not None and ins[1].static_shape:
            return 2 * ins[0].numel * ins[1].static_shape[0]
        return 2 * k * _numel(out)
    if op in ("Conv", "ConvTranspose", "ConvInteger") and len(ins) > 1 and ins[1] and ins[1].shape:
        w = ins[1].static_shape
        kernel = int(np.prod(w[1:]))  # C/group * prod(kernel) per output element
        if op == "ConvTranspose":  # W[C, M/group, *k]: every input element meets M/group * k weights
            return 2 * kernel * _numel(ins[0])
        return 2 * kernel * _numel(out)
    if op in ("Reduce", "MergePartial", "Histogram", "PopCount", "Scan", "TopK", "CumSum") or \
            op.startswith("Reduce"):
        return _numel(ins[0]) if ins else 0
    if op in ("MaxPool", "AveragePool", "LpPool"):
        ks = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1])
        return int(np.prod(ks)) * _numel(out)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        return _numel(ins[0]) if ins else 0
    return _PER_OUTPUT.get(op, 1) * _numel(out)


def op_info(node: onnx.NodeProto, infos: dict[str, TensorInfo]) -> OpInfo:
    """The :class:`OpInfo` of ``node`` for device queries."""
    unknown = lambda n: TensorInfo(n, None, None, False)  # noqa: E731
    return OpInfo(
        name=node.name, op_type=node.op_type, attrs=cinm.node_attrs(node),
        inputs=tuple(infos.get(n, unknown(n)) for n in node.input if n),
        outputs=tuple(infos.get(n, unknown(n)) for n in node.output if n),
        flops=node_flops(node, infos),
    )
