"""Sizing the dimensions onnx's shape inference leaves anonymous (``unk__N``).

:func:`size_anonymous_dims` takes a weightless copy whose symbolic inputs are bound to their
planned sizes and folds the shape arithmetic exporters emit (``Shape``, ``Gather``, ``Slice``,
``Concat``, ``Range``, ...) into constants, re-inferring until nothing more folds, so the FLOPs
and plans of :mod:`onnx_cinm.analysis` see real sizes (attention heads, a sliced position table)
instead of 1. Analysis only: the copy it returns is never the model to save.
"""
from __future__ import annotations

import numpy as np
import onnx

from .frontend import k_from_constants, subgraphs, wants_data_propagation

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims[:], dtype=np.int64))


#: Ops :func:`size_anonymous_dims` evaluates when all their inputs are known small values: the
#: arithmetic exporters build shapes with (``Reshape(x, Concat(Shape(x)[:2], [h, -1]))``, a
#: ``Slice`` of a position table up to ``Shape(ids)[1]``). Ops whose output size follows from a
#: value (:data:`_SIZED_BY_VALUE`) are evaluated only when that size is small.
_SHAPE_ARITHMETIC = {"Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Identity",
                     "Reshape", "Flatten", "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs",
                     "Max", "Min", "Floor", "Ceil", "Sqrt", "Equal", "Less", "Greater", "Not",
                     "And", "Or", "Where", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
                     "Constant"}

#: Ops whose output size is a value of their inputs: ``ConstantOfShape(shape)``,
#: ``Expand(x, shape)``, ``Range(start, limit, delta)``, ``Tile(x, repeats)``.
_SIZED_BY_VALUE = {"ConstantOfShape", "Expand", "Range", "Tile"}

#: Largest value (elements) :func:`size_anonymous_dims` computes and folds: shape tensors are
#: far smaller, so this only keeps it from evaluating data.
_SHAPE_VALUE_MAX_ELEMENTS = 1024

#: Rounds of fold-and-infer :func:`size_anonymous_dims` runs at most (each round reaches one
#: level further behind a ``Shape`` of a freshly sized tensor; real transformers need 2-3).
_SIZING_ROUNDS = 8


def static_shapes(graph: onnx.GraphProto, initializers: bool = True) -> dict[str, list[int]]:
    """The shapes of ``graph``'s tensors whose declared dims (graph inputs, value_info, graph
    outputs) are all numbers (>= 0), by name (one static declaration suffices); with
    ``initializers``, every initializer's dims too (a static declaration of its name wins).
    Nested graphs are not read."""
    shapes = {t.name: t.dims[:] for t in graph.initializer[:]} if initializers else {}
    for value in graph.input[:] + graph.value_info[:] + graph.output[:]:
        tensor_type = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            dims = tensor_type.shape.dim
            if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
                shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def _small_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the main graph's small initializers that hold their data inline."""
    values = {}
    for tensor in graph.initializer:
        if _elements(tensor) <= _SHAPE_VALUE_MAX_ELEMENTS and tensor.data_location != onnx.TensorProto.EXTERNAL:
            try:
                value = onnx.numpy_helper.to_array(tensor)
            except Exception:  # noqa: BLE001 - a dims-only placeholder (weightless copy): no value
                continue
            if value.size == _elements(tensor):
                values[tensor.name] = value
    return values


def _fold_shape_values(model: onnx.ModelProto) -> bool:
    """Replace the shape computations of ``model``'s main graph whose values are known by
    initializers: ``Shape``/``Size`` of a statically shaped tensor, then the
    :data:`_SHAPE_ARITHMETIC` ops over known small values (evaluated by onnx's reference
    evaluator). True if a node was replaced."""
    graph = model.graph
    shapes, known = static_shapes(graph), _small_values(graph)
    folded: dict[str, np.ndarray] = {}
    pending: list[onnx.NodeProto] = []
    pending_outputs: set[str] = set()
    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS or not node.output:
            continue
        if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            if node.op_type == "Size":
                folded[node.output[0]] = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
            else:
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                start, end = attrs.get("start", 0), attrs.get("end", len(dims))
                folded[node.output[0]] = np.array(dims[start:end], dtype=np.int64)
        elif node.op_type in _SIZED_BY_VALUE and all(not i or i in known or i in folded
                                                     for i in node.input):
            if _value_sized(node, [known.get(i, folded.get(i)) for i in node.input]):
                pending.append(node)
                pending_outputs.update(o for o in node.output if o)
        elif node.op_type in _SHAPE_ARITHMETIC and not subgraphs(node) and all(
                not i or i in known or i in folded or i in pending_outputs for i in node.input):
            if node.op_type == "Constant" and not all(
                    a.name != "value" or _elements(a.t) <= _SHAPE_VALUE_MAX_ELEMENTS
                    for a in node.attribute):
                continue
            pending.append(node)
            pending_outputs.update(o for o in node.output if o)
    if pending:
        try:
            folded.update(_evaluate(model, pending, {**known, **folded}))
        except Exception:  # noqa: BLE001 - then one by one: what fails stays, and what needs it
            for node in pending:
                if all(not i or i in known or i in folded for i in node.input):
                    try:
                        folded.update(_evaluate(model, [node], {**known, **folded}))
                    except Exception:  # noqa: BLE001 - best effort
                        pass
    done = {name for name, value in folded.items() if value.size <= _SHAPE_VALUE_MAX_ELEMENTS}
    replaced = [n for n in graph.node if n.output and all(not o or o in done for o in n.output)]
    if not any(n.op_type != "Constant" for n in replaced):  # constants alone size nothing new
        return False
    ids = {id(n) for n in replaced}
    kept = [n for n in graph.node if id(n) not in ids]
    del graph.node[:]
    graph.node.extend(kept)
    for node in replaced:
        for name in node.output:
            if name:
                graph.initializer.append(onnx.numpy_helper.from_array(folded[name], name))
    return True


def _value_sized(node: onnx.NodeProto, inputs: list) -> bool:
    """Whether the output of a :data:`_SIZED_BY_VALUE` node over these known inputs has at most
    :data:`_SHAPE_VALUE_MAX_ELEMENTS` elements (so evaluating it is cheap)."""
    try:
        if node.op_type == "ConstantOfShape":
            n = np.prod(inputs[0], dtype=np.int64)
        elif node.op_type == "Expand":
            n = np.prod(np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1])),
                        dtype=np.int64)
        elif node.op_type == "Range":
            start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[:3])
            n = max(np.ceil((limit - start) / delta), 0) if delta else np.inf
        else:  # Tile
            n = inputs[0].size * np.prod(inputs[1], dtype=np.int64)
    except (ValueError, TypeError, IndexError):
        return False
    return 0 <= n <= _SHAPE_VALUE_MAX_ELEMENTS


def _evaluate(model: onnx.ModelProto, nodes: list, values: dict) -> dict[str, np.ndarray]:
    """Outputs of ``nodes`` (default-domain ops) over the input ``values``, by onnx's
    reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    used = {i for n in nodes for i in n.input if i}
    produced = {o for n in nodes for o in n.output if o}
    graph = onnx.helper.make_graph(
        nodes, "shape_values", [],
        [onnx.ValueInfoProto(name=o) for o in sorted(produced)],
        [onnx.numpy_helper.from_array(np.asarray(values[i]), i) for i in sorted(used - produced)])
    sub = onnx.helper.make_model(graph, opset_imports=[
        o for o in model.opset_import if o.domain in _DEFAULT_DOMAINS], ir_version=model.ir_version)
    names = sorted(produced)
    return dict(zip(names, ReferenceEvaluator(sub).run(names, {})))


def _has_unsized(graph: onnx.GraphProto) -> bool:
    return any(not d.HasField("dim_value") for v in graph.value_info
               if v.type.HasField("tensor_type") for d in v.type.tensor_type.shape.dim)


def _infer(model: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
    except Exception:  # noqa: BLE001 - inference is best effort here; unknown shapes stay unknown
        return model


def infer_once(model: onnx.ModelProto) -> onnx.ModelProto:
    """The first of the inferences :func:`size_anonymous_dims` runs on ``model`` (a weightless,
    sized copy; no pinned types): non-strict, propagating values when the model computes
    shapes (:func:`onnx_cinm.frontend.wants_data_propagation`). Returns the inferred copy (onnx
    returns a new message), or ``model`` itself when onnx gives up."""
    return _infer(model, wants_data_propagation(model.graph))


def size_anonymous_dims(model: onnx.ModelProto,
                        pinned: list[onnx.ValueInfoProto] | tuple = ()) -> onnx.ModelProto:
    """Non-strict shape inference of a *weightless, sized copy* (inputs bound to their sizes by
    :func:`onnx_cinm.frontend.bind_dims`), going further than onnx where it leaves dims
    anonymous (``unk__N``).

    onnx's data propagation computes ``Shape``/``Gather``/``Concat`` values, but ops such as
    ``Slice`` with computed bounds, ``Expand`` and ``Range`` read only initializers, so the
    attention heads behind ``Reshape(x, Concat(Shape(x)[:2], [12, -1]))`` or a position table
    sliced to ``Shape(ids)[1]`` stay unknown and would be planned as 1. Here the shape
    computations whose values are known are folded into initializers (:func:`_fold_shape_values`)
    and inference runs again, until nothing more folds; then a matrix product's activation gets
    its reduction length from its constant operand (:func:`onnx_cinm.frontend.k_from_constants`).
    Only the copy changes, so use it for analysis, never as the model to save.

    Parameters
    ----------
    model : onnx.ModelProto
        A copy (changed and returned).
    pinned : list of onnx.ValueInfoProto
        Static types of tensors known from elsewhere (the planning probe's shapes,
        :data:`onnx_cinm.frontend.PROBED_SHAPES_KEY`), kept in the value_info through every
        round so inference starts from them where it alone would leave dims open.

    Returns
    -------
    onnx.ModelProto
        The inferred copy (onnx returns a new message).
    """
    data_prop = wants_data_propagation(model.graph)

    def infer(m):
        return _infer(m, data_prop)

    model.graph.value_info.extend(pinned)
    model = infer(model)
    for _ in range(_SIZING_ROUNDS):
        if not data_prop or not _has_unsized(model.graph) or not _fold_shape_values(model):
            break
        del model.graph.value_info[:]  # onnx keeps an anonymous dim it was given
        model.graph.value_info.extend(pinned)
        model = infer(model)
    if _has_unsized(model.graph) and k_from_constants(model.graph):
        model = infer(model)
    return model
