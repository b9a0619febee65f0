"""Frontend passes: bring any supported ONNX model into one canonical standard-ONNX form.

========================  ==================================================================
``canonicalize_opset``    default-domain opset >= 13, IR version 10..11, one opset_import per
                          domain, initializers are not graph inputs
``fold_constants``        every node computable from constants becomes an initializer
``normalize``             Reduce* with explicit sorted axes, Gemm with transA=transB=0 and
                          alpha=beta=1
``fold_batchnorm``        Conv -> BatchNormalization becomes one Conv
========================  ==================================================================

Each pass keeps symbolic dimensions symbolic and its output runnable by stock onnxruntime.
Passes rewrite the model they are given **in place** and return it: copying a model costs about
a second per few hundred MB here, and the pipeline (``onnx_cinm.pipeline``) already works on its
own copy.

Constants. A tensor is constant when it is an initializer that is *not* a graph input (an
initializer listed as an input is a default value the user may override). ``canonicalize_opset``
removes initializers from the graph inputs, so after it every initializer is a constant; this
is onnxsim's default (its ``--mutable-initializer`` keeps them overridable, we do not).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper

from ..analysis import inference_adds_nothing
from ..anonymous_dims import static_shapes
from ..errors import CinmError
from ..frontend import WEIGHTLESS_MAX_ELEMENTS, infer_shapes, iter_graphs, restore_weights, strip_weights
from ..frontend import subgraphs as _subgraphs
from ..rewrite import (Edit, Replacement, Rule, add_initializer, add_unwritten, apply, fill_record,
                       ir, is_fill, unwritten_fill, write_unwritten,
                       is_splat, known_fill, repeated, tensor_array, whole_bytes)
from . import PassContext, register_pass
from .graph_names import Names as _Names
from .graph_names import drop_unread_initializers, names_read_by
from .graph_names import names_read as _names_read

#: Default-domain opset the ``cinm`` reference functions need (Constant ``value_ints``, ReduceSum
#: ``axes`` input).
TARGET_OPSET = 13

#: IR version range written by ``canonicalize_opset``: 10 allows model-local function overloads,
#: 11 is the newest onnxruntime 1.32 is documented to load.
MIN_IR_VERSION, MAX_IR_VERSION = 10, 11

#: Never folded: their outputs change from run to run.
NONDETERMINISTIC_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli"}
)

#: Reductions whose ``axes`` ``normalize`` makes explicit.
REDUCE_OPS = frozenset(
    {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
)

_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
     onnx.TensorProto.BFLOAT16}
)
_SUBGRAPH_ATTRIBUTES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


# --- graph queries ---------------------------------------------------------------------------


def _is_default_domain(node: onnx.NodeProto) -> bool:
    return node.domain in _DEFAULT_DOMAINS


def _default_opset(model: onnx.ModelProto) -> int | None:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    return max(versions) if versions else None


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute[:]}


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Initializers that are not graph inputs, by name."""
    inputs = {value.name for value in graph.input}
    return {tensor.name: tensor for tensor in graph.initializer if tensor.name not in inputs}


def _value_infos(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    return {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}


class _TypeInfo:
    """Element types and ranks of the values of a graph (initializers and value_info)."""

    def __init__(self, graph: onnx.GraphProto):
        self._tensors = {tensor.name: tensor for tensor in graph.initializer}
        self._infos = _value_infos(graph)

    def elem_type(self, name: str) -> int:
        """Element type of ``name`` (0 = unknown)."""
        if name in self._tensors:
            return self._tensors[name].data_type
        value = self._infos.get(name)
        return value.type.tensor_type.elem_type if value is not None else 0

    def rank(self, name: str) -> int | None:
        """Rank of ``name`` (None = unknown)."""
        if name in self._tensors:
            return len(self._tensors[name].dims)
        value = self._infos.get(name)
        if value is None or not value.type.tensor_type.HasField("shape"):
            return None
        return len(value.type.tensor_type.shape.dim)


def _replace_nodes(
    graph: onnx.GraphProto | onnx.FunctionProto, nodes: list[onnx.NodeProto]
) -> None:
    del graph.node[:]
    graph.node.extend(nodes)


def _remove_dead_values(graph: onnx.GraphProto) -> None:
    """Drop initializers nobody reads and value_info of names that are no node output anymore."""
    drop_unread_initializers(graph, keep={value.name for value in graph.input})
    produced = {name for node in graph.node for name in node.output[:]}
    if all(v.name in produced for v in graph.value_info):
        return
    # rebuilt in one go: removing entries one by one shifts the rest each time (quadratic;
    # 1,078 of 1,745 on DenseNet121 after folding its constants)
    kept = onnx.GraphProto()
    kept.value_info.extend(v for v in graph.value_info if v.name in produced)
    del graph.value_info[:]
    graph.value_info.extend(kept.value_info)


# --- canonicalize_opset ----------------------------------------------------------------------


def _dedupe_opset_imports(model: onnx.ModelProto) -> None:
    """Keep one opset_import per domain (the highest version; ``ai.onnx`` counts as ``""``)."""
    versions: dict[str, int] = {}
    for opset in model.opset_import:
        domain = "" if opset.domain in _DEFAULT_DOMAINS else opset.domain
        versions[domain] = max(versions.get(domain, 0), opset.version)
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in versions.items())


def _flatten_hardmax(graph: onnx.GraphProto) -> None:
    """:func:`_flatten_hardmaxes` of ``graph`` when it or a subgraph has a Hardmax (a graph
    without one is left as it is: no names collected, no node list rebuilt)."""
    if any(node.op_type == "Hardmax" and _is_default_domain(node)
           for g in iter_graphs(graph) for node in g.node):
        _flatten_hardmaxes(graph, _Names(graph))


def _flatten_hardmaxes(graph: onnx.GraphProto, names: _Names) -> None:
    """Rewrite pre-13 ``Hardmax(x, axis=a)`` as ``Reshape(Hardmax(Flatten(x, a), 1), Shape(x))``.

    Before opset 13, Hardmax flattens its input to 2-D at ``axis`` and works on whole rows;
    from 13 it works along ``axis`` only. onnx's version converter has adapters for Softmax and
    LogSoftmax but just relabels Hardmax, which changes the result for inputs of rank > 2. On
    the flattened 2-D tensor both semantics agree, so the rewritten form survives the
    conversion. Subgraphs are rewritten too.
    """
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for sub in _subgraphs(node):
            _flatten_hardmaxes(sub, names)
        if not (_is_default_domain(node) and node.op_type == "Hardmax"):
            nodes.append(node)
            continue
        base = node.output[0]
        shape, flat, hard = (names.fresh(f"{base}_{tag}") for tag in ("shape", "flat", "2d"))
        nodes += [
            onnx.helper.make_node("Shape", [node.input[0]], [shape], name=shape),
            onnx.helper.make_node("Flatten", [node.input[0]], [flat], name=flat,
                                  axis=_attributes(node).get("axis", 1)),
            onnx.helper.make_node("Hardmax", [flat], [hard], name=node.name or hard, axis=1),
            onnx.helper.make_node("Reshape", [hard, shape], [base], name=names.fresh(base)),
        ]
    _replace_nodes(graph, nodes)


def _convert_version(
    model: onnx.ModelProto, target: int, what: str, version: int
) -> onnx.ModelProto:
    """``onnx.version_converter.convert_version`` with its errors as CinmError."""
    try:
        return onnx.version_converter.convert_version(model, target)
    except Exception as error:  # the C++ converter raises RuntimeError, IndexError, ...
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise CinmError(
            f"cannot convert {what} from opset {version} to {target}: {message}"
        ) from None


#: Ops whose step ``v -> v + 1`` (key ``v``) onnx's version converter (1.23) takes with its
#: ``CompatibleAdapter``: the node is kept as it is, only the opset changes.
_RELABELLED = {
    9: frozenset({"AveragePool", "Dropout", "MaxPool"}),
    10: frozenset({
        "ArgMax", "ArgMin", "AveragePool", "Compress", "Concat", "Constant", "Conv",
        "ConvTranspose", "DepthToSpace", "Equal", "Flatten", "Gather", "Gemm", "Hardmax", "If",
        "LogSoftmax", "Loop", "LpPool", "MaxPool", "MaxUnpool", "NonMaxSuppression", "OneHot",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Scan", "Slice", "Softmax",
        "Split", "Squeeze", "TopK", "Unsqueeze"}),
    11: frozenset({
        "ArgMax", "ArgMin", "BatchNormalization", "Clip", "Constant", "GatherND", "Max",
        "MaxPool", "Min", "Pow", "ReduceMax", "ReduceMin"}),
    12: frozenset({
        "Abs", "Add", "ArgMax", "ArgMin", "Cast", "Ceil", "Clip", "Concat", "Constant",
        "DepthToSpace", "DequantizeLinear", "Div", "Dropout", "Equal", "Erf", "Exp", "Expand",
        "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gemm", "Greater", "Hardmax",
        "Identity", "If", "IsNaN", "LRN", "Less", "Log", "Loop", "MatMul", "Max", "Mean",
        "MeanVarianceNormalization", "Min", "Mod", "Mul", "Neg", "NegativeLogLikelihoodLoss",
        "NonZero", "Pad", "Pow", "QuantizeLinear", "Reciprocal", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
        "ReduceSumSquare", "Relu", "Reshape", "Resize", "ScatterElements", "ScatterND", "Shape",
        "Sigmoid", "Sign", "Size", "Slice", "SoftmaxCrossEntropyLoss", "SpaceToDepth", "Sqrt",
        "Sub", "Sum", "Tanh", "Tile", "Transpose"}),
}
#: Besides: at 11 -> 12 Dropout's ``ratio`` attribute (default 0.5) becomes a Constant input.
#: Ops whose ``axes`` attribute the converter's step 12 -> 13 moves into a Constant input.
_AXES_TO_INPUT = frozenset({"ReduceSum", "Squeeze", "Unsqueeze"})
#: Ops whose step 12 -> 13 the converter takes by setting ``axis=-1`` when the old axis is the
#: last one of an input of known rank (else it inserts Shape/Flatten/Reshape: not done here).
_SOFTMAXES = frozenset({"Softmax", "LogSoftmax"})


#: Default-domain ops with graph attributes (bodies the converter converts too): not taken by
#: :func:`_convert_directly`. Another op's graph attribute is refused by onnx's checker (an
#: attribute its schema does not declare).
_WITH_BODIES = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def _constant_node(name: str, tensor: onnx.TensorProto) -> onnx.NodeProto:
    """A Constant node as the version converter writes one it creates: no name, output ``name``."""
    node = onnx.NodeProto(output=[name], op_type="Constant")
    node.attribute.add(name="value", t=tensor, type=onnx.AttributeProto.TENSOR)
    return node


def _changed_steps(op_type: str, version: int) -> list[int] | None:
    """The steps ``v -> v + 1`` from ``version`` to ``TARGET_OPSET`` at which the default-domain
    ``op_type`` has a new schema, or None when one of them is none :func:`_convert_directly`
    takes (or the op has no schema)."""
    steps = []
    for step in range(version, TARGET_OPSET):
        try:
            schema = onnx.defs.get_schema(op_type, step + 1, "")
        except onnx.defs.SchemaError:
            return None
        if schema.since_version != step + 1 or step in _RELABELLED and op_type in _RELABELLED[step]:
            continue
        if (step, op_type) != (11, "Dropout") and \
                (step != 12 or op_type not in _AXES_TO_INPUT | _SOFTMAXES):
            return None
        steps.append(step)
    return steps


def _convert_directly(model: onnx.ModelProto, version: int,
                      inferred: onnx.ModelProto | None = None) -> onnx.ModelProto | None:
    """What ``onnx.version_converter.convert_version(model, TARGET_OPSET)`` returns, message for
    message, for a model whose every step only relabels its ops, moves an ``axes`` attribute
    into a Constant input (ReduceSum, Squeeze, Unsqueeze at 13) or makes a last-axis Softmax's
    axis -1; None for any other model (then the converter runs). One difference, on models
    that carry one: a value_info entry of a name no node or input holds is kept, where the
    converter drops it (canonicalize's later passes drop it too: the written model is the
    same); an invalid model with a name twice among the inputs or initializers may number the
    ``_v_`` constants otherwise.

    The converter infers shapes (onnx's defaults), converts, and writes the graph back; here
    the same inference runs and the few nodes that change are rewritten in the inferred copy:
    the converter's fixed cost (its adapter table, the graph round trip: 30 ms of 36 on light
    DenseNet121, 8 ms on a small model) is not paid. Its Constant outputs are named as it
    names a value it creates, ``_v_<n>``, numbering on from the values it imported: one per
    graph input, initializer outside the inputs and node output, plus two.

    Taken only for a main graph of default-domain nodes without bodies, omitted (empty)
    inputs or outputs, values named ``_v_...`` or sparse initializers, from opset 9..12 with
    one default-domain import, spelled ``""``; the converter's messages are its own, so a
    model it may refuse (an op without a schema, a step it has no adapter for) goes to it.
    ``inferred``: that inference of ``model`` already run (:func:`conversion_inference`),
    used (and rewritten) instead of running it again.
    """
    graph = model.graph
    imports = [o.domain for o in model.opset_import]
    if not 9 <= version < TARGET_OPSET or imports.count("") != 1 or "ai.onnx" in imports or \
            len(graph.sparse_initializer):
        return None
    nodes = graph.node[:]
    op_types = {node.op_type for node in nodes}
    if op_types & _WITH_BODIES or any(node.domain for node in nodes):
        return None
    steps = {}
    for op_type in op_types:
        steps[op_type] = _changed_steps(op_type, version)
        if steps[op_type] is None:
            return None
    names = [value.name for value in graph.input]
    inputs = set(names)
    names += [t.name for t in graph.initializer]
    values = len(inputs) + sum(name not in inputs for name in names[len(inputs):]) + 2
    for node in nodes:
        outputs = node.output[:]
        if "" in outputs or "" in node.input[:]:
            return None
        values += len(outputs)
        names += outputs
    if "\n_v_" in "\n" + "\n".join(names):
        return None  # a name the converter may mint: it would pick another
    if inferred is None:
        inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    ranks = {}
    for step in sorted({step for changed in steps.values() for step in changed}):
        if step == 12 and any(steps.get(op) for op in _SOFTMAXES):
            for value in (*graph.input, *graph.value_info, *graph.output):
                if value.type.tensor_type.HasField("shape"):
                    ranks.setdefault(value.name, len(value.type.tensor_type.shape.dim))
        rewritten = []
        for node in graph.node:
            if step not in steps.get(node.op_type, ()):
                pass
            elif node.op_type in _SOFTMAXES:
                axis = next((a for a in node.attribute if a.name == "axis"), None)
                rank = ranks.get(node.input[0], 0)
                old = axis.i if axis is not None else 1
                if (old + rank if old < 0 else old) != rank - 1:
                    return None
                if axis is None:
                    node.attribute.append(onnx.helper.make_attribute("axis", -1))
                else:
                    axis.i = -1
            elif node.op_type == "Dropout":  # ratio: an attribute (default 0.5) -> an input
                index = next((i for i, a in enumerate(node.attribute) if a.name == "ratio"), None)
                ratio = node.attribute[index].f if index is not None else 0.5
                if index is not None:
                    del node.attribute[index]
                rewritten.append(_constant_node(f"_v_{values}", onnx.TensorProto(
                    data_type=onnx.TensorProto.FLOAT, float_data=[ratio])))
                values += 1
                node.input.append(rewritten[-1].output[0])
            else:  # axes: an attribute -> an input, when there is one
                index = next((i for i, a in enumerate(node.attribute) if a.name == "axes"), None)
                if index is not None:
                    axes = node.attribute[index].ints
                    rewritten.append(_constant_node(f"_v_{values}", onnx.TensorProto(
                        dims=[len(axes)], data_type=onnx.TensorProto.INT64, int64_data=axes)))
                    values += 1
                    del node.attribute[index]
                    node.input.append(rewritten[-1].output[0])
            rewritten.append(node)
        _replace_nodes(graph, rewritten)
    for opset in inferred.opset_import:
        if opset.domain == "":
            opset.version = TARGET_OPSET
    return inferred


def _convert_function(function: onnx.FunctionProto, target: int) -> None:
    """Lift a model-local function body below the model's opset ``target`` to it, in place.

    The checker rejects a function whose default-domain opset differs from the model's when an
    op it uses changed in between (e.g. Add at 13), so bodies follow the model.
    """
    versions = [o.version for o in function.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions or max(versions) >= target:
        return
    graph = onnx.helper.make_graph(
        list(function.node), function.name,
        [onnx.ValueInfoProto(name=name) for name in function.input],
        [onnx.ValueInfoProto(name=name) for name in function.output])
    _flatten_hardmax(graph)
    body = onnx.helper.make_model(graph, opset_imports=list(function.opset_import),
                                  ir_version=MIN_IR_VERSION)
    converted = _convert_version(body, target, f"function {function.domain}.{function.name}",
                                 max(versions))
    _replace_nodes(function, list(converted.graph.node))
    del function.opset_import[:]
    function.opset_import.extend(converted.opset_import)


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """The weightless copy :func:`canonicalize_opset` converts, and the names of the weights
    it moved to the graph inputs (:func:`onnx_cinm.frontend.strip_weights`)."""
    skeleton, moved = strip_weights(model)
    _flatten_hardmax(skeleton.graph)
    return skeleton, moved


def conversion_inference(model: onnx.ModelProto) -> tuple | None:
    """The weightless copy :func:`canonicalize_opset` converts ``model`` (below
    :data:`TARGET_OPSET`) from, and the shape inference it runs first to convert it directly
    (:func:`_convert_directly`: onnx's defaults), made now: ``(model, copy, names of the
    weights moved to its inputs, inferred copy)``. For the planning probe, which reads the same
    inference first, to hand on in :attr:`onnx_cinm.passes.PassContext.opset_inference` when it
    leaves ``model`` as it is: one whole-graph inference and one weightless copy fewer on the
    light models (opset 9). None for a model without a default opset below
    :data:`TARGET_OPSET`, or when onnx raises (the pass then runs it, and reports what it
    raises)."""
    version = _default_opset(model)
    if version is None or version >= TARGET_OPSET:
        return None
    skeleton, moved = _skeleton(model)
    try:
        return model, skeleton, moved, onnx.shape_inference.infer_shapes(skeleton)
    except Exception:  # noqa: BLE001 - the pass runs it again and reports the error
        return None


def _opsets(model: onnx.ModelProto) -> list[bytes]:
    return [opset.SerializeToString() for opset in model.opset_import]


@register_pass("canonicalize_opset")
def canonicalize_opset(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Lift the default opset to >= 13 and the IR version to 10..11; drop initializer inputs.

    - opset < 13 is converted with ``onnx.version_converter``, which also rewrites the pre-13
      Softmax/LogSoftmax flatten-to-2-D semantics into explicit Flatten/Reshape; Hardmax, which
      the converter merely relabels, is made explicit beforehand (:func:`_flatten_hardmax`).
      The converter runs on a weightless copy; nodes of other domains (e.g. ``ai.onnx.ml``)
      pass through unchanged and model-local functions (dropped by the converter) are kept.
      A model without a default-domain import gets one (13).
    - Function bodies below the model's opset are lifted to it (the checker rejects a body
      whose ops resolve to other versions than the model's).
    - ``ir_version`` becomes ``min(max(ir, 10), 11)``; opset_import keeps one entry per domain.
    - Graph inputs that are also initializers are removed (light models list every weight as
      an input): they are constants for us, which lets ``fold_constants`` fold them.

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.
    ctx : PassContext
        ``ctx.stats["canonicalize_opset"]`` receives ``{"from_opset": v, "to_opset": w,
        "frozen_inputs": [graph inputs that were initializers, now constants]}``.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    CinmError
        The version converter cannot convert the model (its first message line).
    """
    _dedupe_opset_imports(model)
    version = _default_opset(model)
    if version is None:
        model.opset_import.append(onnx.helper.make_opsetid("", TARGET_OPSET))
    elif version < TARGET_OPSET:
        given, ctx.opset_inference = ctx.opset_inference, None
        # made of this very model, untouched since (the probe hands it on to the first pass
        # only), but for the opset imports just deduplicated
        if given and given[0] is model and _opsets(given[1]) == _opsets(model):
            _, skeleton, moved, inferred = given
        else:
            (skeleton, moved), inferred = _skeleton(model), None
        converted = _convert_directly(skeleton, version, inferred) or \
            _convert_version(skeleton, TARGET_OPSET, "the model", version)
        restore_weights(model, converted, moved)
        _dedupe_opset_imports(model)
    for function in model.functions:
        _convert_function(function, _default_opset(model))
    model.ir_version = min(max(model.ir_version, MIN_IR_VERSION), MAX_IR_VERSION)
    initializers = {tensor.name for tensor in model.graph.initializer}
    kept = [value for value in model.graph.input if value.name not in initializers]
    frozen = [value.name for value in model.graph.input if value.name in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    ctx.stats["canonicalize_opset"] = {"from_opset": version, "to_opset": _default_opset(model),
                                       "frozen_inputs": frozen}
    return model


# --- fold_constants --------------------------------------------------------------------------


def _session_options():
    import onnxruntime as ort  # here: a model with nothing onnxruntime must fold never loads it

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return options


def _run_nodes(
    nodes: list[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    outputs: list[str],
    opset_import,
) -> dict[str, np.ndarray]:
    """Evaluate ``nodes`` on ``feeds`` with one onnxruntime session (no graph optimizations).

    Raises whatever onnxruntime raises; also raises ``TypeError`` if an output is not a tensor
    (a sequence or an optional).
    """
    graph = onnx.helper.make_graph(
        nodes,
        "fold_constants",
        [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
         for name, array in feeds.items()],
        [onnx.ValueInfoProto(name=name) for name in outputs],
    )
    model = onnx.helper.make_model(graph, opset_imports=opset_import, ir_version=MIN_IR_VERSION)
    import onnxruntime as ort

    session = ort.InferenceSession(
        model.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"]
    )
    values = dict(zip(outputs, session.run(outputs, feeds)))
    if not all(isinstance(value, np.ndarray) for value in values.values()):
        raise TypeError("a folded value is not a tensor")
    return values


def _evaluate(
    nodes: list[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    wanted: list[str],
    opset_import,
) -> tuple[list[bool], dict[str, np.ndarray]]:
    """Evaluate constant ``nodes``; return which nodes could be evaluated, and the values.

    First all nodes in one session (returning ``wanted``). If that fails (an op or type
    onnxruntime cannot run, a sequence output), node by node, returning every computed value;
    a node that fails stays unevaluated, and so does everything downstream of it.
    """
    try:
        return [True] * len(nodes), _run_nodes(nodes, feeds, wanted, opset_import)
    except Exception:  # any failure: retry node by node to find what can be folded
        pass
    values = dict(feeds)
    evaluated = []
    for node in nodes:
        inputs = [name for name in node.input if name]
        outputs = [name for name in node.output if name]
        ok = all(name in values for name in inputs)
        if ok:
            try:
                feeds_of_node = {name: values[name] for name in inputs}
                values.update(_run_nodes([node], feeds_of_node, outputs, opset_import))
            except Exception:  # onnxruntime cannot evaluate this node: it stays in the graph
                ok = False
        evaluated.append(ok)
    return evaluated, values


def _is_foldable(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """Whether ``node`` may be replaced by its value when its inputs are constant."""
    if not _is_default_domain(node) or node.op_type in NONDETERMINISTIC_OPS:
        return False
    if any(attr.type in _SUBGRAPH_ATTRIBUTES for attr in node.attribute[:]):
        return False
    if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        training_mode = constants.get(node.input[2])
        return training_mode is not None and not tensor_array(training_mode).any()
    return True


def _qdq_weights(graph: onnx.GraphProto) -> set[str]:
    """Outputs of the DequantizeLinear nodes of QDQ weights, kept unfolded: read (directly or
    through a Transpose) as input 1 of a MatMul, Gemm or Conv whose input 0 is also a
    DequantizeLinear output. ``to_cinm`` lowers such a product to an integer Gemm of the int8
    values; folded, the weight would be a float32 copy (4x the bytes) and the product float."""
    if not any(n.op_type == "DequantizeLinear" for n in graph.node):
        return set()  # (a float model: no producer map of every output)
    made = {o: n for n in graph.node for o in n.output if o}
    keep = set()
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.input) < 2 or \
                not _is_default_domain(node):
            continue
        x, w = made.get(node.input[0]), made.get(node.input[1])
        chain = [w]
        if w is not None and w.op_type == "Transpose":  # normalize's transB
            w = made.get(w.input[0])
            chain.append(w)
        if x is not None and x.op_type == "DequantizeLinear" and w is not None and \
                w.op_type == "DequantizeLinear":
            keep.update(n.output[0] for n in chain)
    return keep
#: Element types whose arrays :func:`_transpose_value` permutes (one element per array item; not
#: strings or packed 4/2-bit types).
_PERMUTABLE_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL})


def _transpose_value(node: onnx.NodeProto, tensor: onnx.TensorProto,
                     fill: bytes | None = None) -> np.ndarray:
    """``Transpose`` of the initializer ``tensor`` (``perm``, default: reversed axes), computed
    by numpy: a permutation of the elements, so exactly onnxruntime's result, without feeding
    the weight to a session (one session was fed a copy of every transposed weight at once:
    the peak of ``normalize`` on Gemms with ``transB``, light VGG19 1.95 GB, now 1.55 GB).
    ``fill``: the bytes of the one value ``tensor`` is known to repeat
    (:func:`onnx_cinm.rewrite.known_fill`);
    the result is then that value broadcast to the permuted dims, ``tensor`` is not read."""
    perm = _attributes(node).get("perm")
    if fill is not None:
        dims = list(tensor.dims)
        axes = list(perm) if perm else list(range(len(dims)))[::-1]
        value = np.frombuffer(fill, helper.tensor_dtype_to_np_dtype(tensor.data_type))
        return repeated(value.reshape(()), [dims[a] for a in axes])
    array = tensor_array(tensor)
    if is_splat(array):  # one value repeated (light models' weights): so is any permutation,
        axes = list(perm) if perm else list(range(array.ndim))[::-1]  # so the same bytes serve
        return array.reshape([array.shape[a] for a in axes])  # (add_initializer keeps them)
    if array.ndim != 2 or list(perm or [1, 0]) != [1, 0]:
        # np.asarray(order="C"), not np.ascontiguousarray: the latter turns a 0-d scalar into 1-d
        return np.asarray(np.transpose(array, perm or None), order="C")
    # a matrix (a Gemm's B) in 128 x 128 tiles: numpy's element-by-element strided copy is
    # about 3x slower than onnxruntime's blocked transpose on a VGG19 FC weight; tiles match it
    out = np.empty(array.shape[::-1], array.dtype)
    for i in range(0, array.shape[0], _TILE):
        for j in range(0, array.shape[1], _TILE):
            out[j:j + _TILE, i:i + _TILE] = array[i:i + _TILE, j:j + _TILE].T
    return out


def _fill_of(array: np.ndarray) -> bytes | None:
    """The bytes of the one value ``array`` repeats when it is a broadcast view of it (a fill:
    ``ConstantOfShape``; plain numeric or bool dtypes), else None."""
    if array.size and not any(array.strides) and array.dtype.kind in "biuf":
        return array.reshape(-1)[:1].tobytes()
    return None


def _keeps_bytes(value: np.ndarray, tensor: onnx.TensorProto) -> bool:
    """Whether ``value`` views, in C order, all of the bytes read from ``tensor``'s
    ``raw_data`` (so ``tensor`` with ``value``'s dims holds ``value``)."""
    return tensor.HasField("raw_data") and whole_bytes(value) is not None


#: Side of the tiles :func:`_transpose_value` copies a matrix in (a 128 x 128 float32 tile and
#: its transpose fit a 256 KB L2 cache).
_TILE = 128


#: Element types :func:`_filled_value` fills with numpy (exactly as onnxruntime: one value
#: repeated; not strings or the packed and ml_dtypes types).
_FILLABLE_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16, onnx.TensorProto.INT32, onnx.TensorProto.UINT32,
    onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})


#: numpy dtypes :func:`_direct_value` moves (one element per array item: not strings, not the
#: ml_dtypes types).
_PLAIN_DTYPES = frozenset(np.dtype(t) for t in (
    np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32,
    np.uint32, np.int64, np.uint64, np.bool_))


def _direct_value(node: onnx.NodeProto, constants: dict, direct: dict) -> np.ndarray | None:
    """The value of a foldable node numpy computes exactly as onnxruntime would, without a
    session: ``ConstantOfShape`` (:func:`_filled_value`), ``Constant`` with a ``value`` tensor,
    ``Unsqueeze`` (a reshape) of a constant; None for every other node or form (onnxruntime
    evaluates those). ``direct`` holds the values computed so far in this fold."""
    if not _is_default_domain(node):
        return None
    if node.op_type == "ConstantOfShape":
        return _filled_value(node, constants)
    if node.op_type == "Constant":
        value = _constant_value(node)
        if value is None or value.data_type not in _FILLABLE_TYPES or \
                value.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return tensor_array(value)
    if node.op_type == "Unsqueeze":
        return _unsqueezed(node, constants, direct)
    return None


def _known_array(name: str, constants: dict, direct: dict) -> np.ndarray | None:
    if name in direct:
        return direct[name]
    if name in constants and constants[name].data_location != onnx.TensorProto.EXTERNAL:
        return tensor_array(constants[name])
    return None


def _unsqueezed(node: onnx.NodeProto, constants: dict, direct: dict) -> np.ndarray | None:
    """``Unsqueeze`` of a constant (axes as the attribute of opset < 13 or the constant input
    of 13+): the data reshaped with a 1 at every axis of the output; None if an input is not
    known yet, the dtype is not a plain one or the axes are invalid (left to onnxruntime, which
    says why)."""
    inputs = node.input[:]
    if not inputs or not inputs[0]:
        return None
    attrs = _attributes(node)
    if "axes" in attrs:
        axes = list(attrs["axes"])
    elif len(inputs) == 2 and inputs[1]:
        given = _known_array(inputs[1], constants, direct)
        if given is None or given.dtype != np.int64 or given.ndim != 1:
            return None
        axes = [int(a) for a in given]
    else:
        return None
    data = _known_array(inputs[0], constants, direct)
    if data is None or data.dtype not in _PLAIN_DTYPES:
        return None
    rank = data.ndim + len(axes)
    axes = [a + rank if a < 0 else a for a in axes]
    if len(set(axes)) != len(axes) or not all(0 <= a < rank for a in axes):
        return None
    dims = iter(data.shape)
    return data.reshape([1 if k in axes else next(dims) for k in range(rank)])


def _filled_value(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """The value of a default-domain ``ConstantOfShape`` whose shape is an initializer, filled by
    numpy (``value``, default float32 0, repeated: exactly onnxruntime's result, without an
    onnxruntime session; the light models' weights are such nodes); None when onnxruntime
    should evaluate it (another form, a shape computed by other nodes, a negative dim, a
    value of another element type or not of shape [1], which onnxruntime refuses)."""
    if not _is_default_domain(node) or len(node.input) != 1 or node.input[0] not in constants:
        return None
    shape = tensor_array(constants[node.input[0]])
    if shape.dtype != np.int64 or shape.ndim != 1:
        return None
    dims = tuple(shape.tolist())  # a handful of ints: compared in Python, not by numpy
    if any(d < 0 for d in dims):
        return None
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    if value is None:
        fill = np.zeros((), np.float32)
    elif value.data_type not in _FILLABLE_TYPES or value.dims[:] != [1]:  # as onnxruntime
        return None
    else:
        fill = tensor_array(value).reshape(())
    # a view of the one value: add_initializer writes its bytes without filling an array first
    try:
        return repeated(fill, dims)
    except ValueError:  # more bytes than an address space holds: left to onnxruntime to refuse
        return None


def _shape_value(node: onnx.NodeProto, dims: list[int]) -> np.ndarray:
    """Value of ``Shape``/``Size`` of a tensor with static ``dims``."""
    if node.op_type == "Size":
        return np.array(np.prod(dims, dtype=np.int64), dtype=np.int64)
    attrs = _attributes(node)
    return np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], dtype=np.int64)


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The ``value`` tensor of a default-domain ``Constant`` node (other nodes/forms: None)."""
    if node.op_type != "Constant" or not _is_default_domain(node):
        return None
    return next((a.t for a in node.attribute if a.name == "value"), None)


def _fold(
    model: onnx.ModelProto,
    static_shapes: dict[str, list[int]],
    only: set[str] | None = None,
    fills: dict | None = None,
    unwritten: dict | None = None,
) -> int:
    """Replace constant-computable nodes by initializers; return how many nodes were removed.

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.
    static_shapes : dict of str to list of int
        Known static shapes; ``Shape``/``Size`` of these values are folded even when the value
        itself is not constant.
    only : set of str, optional
        If given, only nodes whose first output is in this set are considered.
    fills : dict, optional
        ``{initializer name: (element type, dims, bytes of its one value)}``: the initializers
        known to hold one value repeated (:attr:`onnx_cinm.passes.PassContext.fills`); a
        ``Transpose`` of one is folded without reading it. Updated in place: the initializers
        this fold writes as one value repeated are added, those it renames are moved.
    unwritten : dict, optional
        Given: a result of one value repeated with more elements than shape inference reads
        (``WEIGHTLESS_MAX_ELEMENTS``) is appended without its bytes
        (:func:`onnx_cinm.rewrite.add_unwritten`) and its record added here
        (:attr:`onnx_cinm.passes.PassContext.unwritten`).
    """
    graph = model.graph
    fills = {} if fills is None else fills
    constants = _constants(graph)
    known = set(constants)
    direct: dict[str, np.ndarray] = {}
    folded: set[int] = set()
    to_run: list[int] = []
    keep = _qdq_weights(graph)
    # a Transpose whose result is its input's bytes (one value repeated: the light models'
    # weights) renames that initializer when nothing else reads it, rather than storing a
    # copy (light VGG19: 478 MB of FC weights)
    renamed: dict[str, str] = {}
    readers: Counter | None = None
    for index, node in enumerate(graph.node):
        if only is not None and node.output[0] not in only:
            continue
        inputs = [name for name in node.input[:] if name]
        # an input not known to be constant: only Shape/Size of a static tensor folds (every
        # other way below reads constant or folded inputs); most nodes of a network end here
        if node.op_type not in ("Shape", "Size") and not all(name in known for name in inputs):
            continue
        if not _is_foldable(node, constants) or node.output[0] in keep:
            continue
        filled = _direct_value(node, constants, direct)
        if node.op_type == "Transpose" and len(inputs) == 1 and inputs[0] in constants and \
                constants[inputs[0]].data_type in _PERMUTABLE_TYPES:
            fill = known_fill(fills, inputs[0], constants[inputs[0]])
            direct[node.output[0]] = _transpose_value(node, constants[inputs[0]], fill)
            if fill is not None or _keeps_bytes(direct[node.output[0]], constants[inputs[0]]):
                if readers is None:
                    readers = Counter(name for n in graph.node for name in names_read_by(n))
                    readers.update(o.name for o in graph.output)
                if readers[inputs[0]] == 1:  # this Transpose only: the initializer is renamed
                    renamed[node.output[0]] = inputs[0]
        elif filled is not None:
            direct[node.output[0]] = filled
        elif all(name in known for name in inputs):
            to_run.append(index)
        elif node.op_type in ("Shape", "Size") and inputs[0] in static_shapes:
            direct[node.output[0]] = _shape_value(node, static_shapes[inputs[0]])
        else:
            continue
        folded.add(index)
        known.update(name for name in node.output[:] if name)
    if not folded:
        return 0

    run_nodes = [graph.node[index] for index in to_run]
    produced_by_run = {name for node in run_nodes for name in node.output}
    feeds = {}
    for node in run_nodes:
        for name in node.input:
            if name and name not in produced_by_run and name not in feeds:
                # onnxruntime reads C-ordered arrays (a fill is a broadcast view)
                feeds[name] = np.ascontiguousarray(direct[name]) if name in direct else \
                    tensor_array(constants[name])
    read = _names_read(graph, skip=folded)
    wanted = sorted(read & produced_by_run)
    if wanted:
        evaluated, values = _evaluate(run_nodes, feeds, wanted, model.opset_import)
    else:  # nothing outside reads them: dead code, nothing to evaluate
        evaluated, values = [True] * len(run_nodes), {}
    del feeds  # copies of the inputs: free them before the results become initializers
    values.update(direct)
    del direct  # the results below are the only references: each is freed once stored
    failed = {index for index, ok in zip(to_run, evaluated) if not ok}
    if failed:  # the nodes left in the graph read more (every node was walked once more)
        folded -= failed
        read = _names_read(graph, skip=folded)
    needed = read & {name for i in folded for name in graph.node[i].output[:] if name}
    results = {name: values.pop(name) for name in sorted(needed)}
    del values
    # the folded nodes go first, and with them the initializers only they read (e.g. a weight
    # a Gemm transposed), so the old and the new weights are not both held
    _replace_nodes(graph, [node for i, node in enumerate(graph.node) if i not in folded])
    for name, source in renamed.items():
        if name in results:
            tensor = constants[source]
            tensor.name = name
            del tensor.dims[:]
            tensor.dims.extend(results.pop(name).shape)
            known = fills.pop(source, None)
            if known is not None:
                fills[name] = (known[0], tuple(tensor.dims), known[2])
    _remove_dead_values(graph)
    for name in sorted(results):
        fill = _fill_of(results[name])
        if fill is not None and unwritten is not None and \
                results[name].size > WEIGHTLESS_MAX_ELEMENTS:
            unwritten[name] = add_unwritten(graph, results.pop(name), name)
        else:
            add_initializer(graph, results.pop(name), name)
        if fill is not None:
            tensor = graph.initializer[len(graph.initializer) - 1]
            fills[name] = (tensor.data_type, tuple(tensor.dims[:]), fill)
        else:
            fills.pop(name, None)
    return len(folded)


def _current(fills: dict, graph: onnx.GraphProto) -> dict:
    """The entries of ``fills`` (:attr:`onnx_cinm.passes.PassContext.fills`) whose initializer
    is still in ``graph``: a name folding freed may be handed out again for another tensor."""
    names = {t.name for t in graph.initializer}
    return {name: fill for name, fill in fills.items() if name in names}


def _if_nodes(graph: onnx.GraphProto) -> list:
    return [(k, n) for k, n in enumerate(graph.node)
            if n.op_type == "If" and _is_default_domain(n)]


def condition(value) -> bool | None:
    """The branch an If's condition ``value`` picks (True: then), or None when it is not one
    value (absent, or not a single element)."""
    a = np.asarray(value) if value is not None else None
    return None if a is None or a.size != 1 else bool(a.reshape(-1)[0])


def inline_constant_ifs(model: onnx.ModelProto) -> int:
    """Replace every If of the main graph whose condition is an initializer by the nodes of the
    branch it takes (its outputs renamed to the If's; its initializers moved out), in place;
    repeated for the Ifs those branches bring. Returns how many Ifs went."""
    done = 0
    while True:
        g = model.graph
        inits = {i.name: i for i in g.initializer}
        found = next(((k, n) for k, n in _if_nodes(g) if n.input[0] in inits), None)
        if found is None:
            return done
        k, node = found
        cond = condition(tensor_array(inits[node.input[0]]))
        if cond is None:
            return done
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if cond else "else_branch"))
        nodes = list(branch.node)
        g.initializer.extend(branch.initializer)
        for out, target in zip(branch.output, node.output):
            if target:
                nodes.append(helper.make_node("Identity", [out.name], [target],
                                              name=f"{node.name or 'If'}_{target}_taken"))
        rest = list(g.node)
        del g.node[:]
        g.node.extend(rest[:k] + nodes + rest[k + 1:])
        done += 1


@register_pass("fold_constants")
def fold_constants(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Replace every node computable from constants by initializers.

    Folded: ``Constant`` nodes; any default-domain node whose inputs are all constant
    (initializers that are not graph inputs, or folded values), evaluated by onnxruntime
    (``ORT_DISABLE_ALL``, one session for the whole foldable subgraph), so dtypes are exactly
    those onnxruntime computes (a ``value_float`` Constant stays float32); ``Shape``/``Size``
    of a value whose dimensions are all static (after shape inference, repeated until
    nothing more folds; a main graph without Shape/Size is not inferred: nothing here reads
    the shapes then, and the model's value_info stays as it came). Large constants such as the ``ConstantOfShape`` weights of the light
    models become initializers.

    Never folded: nondeterministic ops (:data:`NONDETERMINISTIC_OPS`, ``Dropout`` unless its
    ``training_mode`` is a constant false) and what depends on them, ops with subgraphs
    (If/Loop/Scan; their bodies are left alone), ops of other domains, ops onnxruntime cannot
    evaluate and sequence/optional values. Folded values are not size-limited (an ``Expand``
    of a constant becomes its full result). An If whose condition folds is replaced by the
    branch it takes (:func:`inline_constant_ifs`), and folding goes on in its nodes.

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.
    ctx : PassContext
        ``ctx.stats["fold_constants"]`` receives the number of nodes removed; ``ctx.fills`` the
        initializers it wrote as one value repeated, for the next pass
        (:attr:`onnx_cinm.passes.PassContext.fills`). With ``ctx.unwritten`` a dict (a
        :class:`~onnx_cinm.passes.PassManager` run), the large ones are appended without their
        bytes and recorded there, when the graph has no ``Shape``, ``Size`` or ``If`` (one round
        of folding then).

    Returns
    -------
    onnx.ModelProto
    """
    graph = model.graph
    kept, count = [], 0
    for node in graph.node:
        value = _constant_value(node)
        if value is None:
            kept.append(node)
        else:
            tensor = graph.initializer.add()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            count += 1
    if count:
        _replace_nodes(graph, kept)
    fills: dict = {}  # the initializers folded as one value repeated, for normalize
    # the large ones are left unwritten for the manager's next passes (normalize,
    # fold_batchnorm) when one round folds all: no Shape, Size or If to fold again after it
    # (a later round would read them)
    unwritten = {} if ctx.unwritten is not None and not any(
        node.op_type in ("Shape", "Size", "If") for node in graph.node) else None
    while True:
        # the inferred shapes serve only to fold Shape/Size of static tensors: without such a
        # node in the main graph, no whole-graph inference (normalize, next, infers the folded
        # graph unless it is typed already; most CNNs, DenseNet121 one inference fewer)
        shaped = any(node.op_type in ("Shape", "Size") for node in graph.node)
        if shaped:
            infer_shapes(model, strict=False)
        folded = _fold(model, static_shapes(graph, initializers=False) if shaped else {},
                       fills=fills, unwritten=unwritten)
        inlined = inline_constant_ifs(model)
        count += folded + inlined
        if not inlined and (not folded or not any(node.op_type in ("Shape", "Size")
                                                  for node in graph.node)):
            break
    ctx.stats["fold_constants"] = count
    ctx.fills = _current(fills, graph)
    if unwritten:
        ctx.unwritten.update(unwritten)
    return model


# --- normalize -------------------------------------------------------------------------------


#: Reduce* with empty axes and ``noop_with_empty_axes=1``: the elementwise op that remains
#: (any other Reduce* is the identity; log(exp(x)) is x for LogSumExp in onnxruntime too).
_NOOP_REDUCE = {"ReduceL1": "Abs", "ReduceL2": "Abs", "ReduceSumSquare": "Mul",
                "ReduceLogSum": "Log"}


def _reduce_axes_as_input(op_type: str, opset: int) -> bool:
    return opset >= 18 or (op_type == "ReduceSum" and opset >= 13)


def _normalize_reduce(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    opset: int,
    constants: dict[str, onnx.TensorProto],
    types: _TypeInfo,
    names: _Names,
) -> bool:
    """Give a Reduce* node explicit, sorted, non-negative axes; return whether it changed."""
    attrs = _attributes(node)
    as_input = _reduce_axes_as_input(node.op_type, opset)
    axes_name = node.input[1] if as_input and len(node.input) > 1 else ""
    if axes_name:
        if axes_name not in constants:
            return False  # axes computed at run time
        given = tensor_array(constants[axes_name]).reshape(-1).tolist()
    else:
        given = list(attrs.get("axes", []))
    if not given and as_input and attrs.get("noop_with_empty_axes", 0):
        # "no reduction" still applies the elementwise step (ONNX spec, onnxruntime and
        # onnx.reference agree): |x| for L1 and L2, x * x for SumSquare, log x for LogSum
        node.op_type = _NOOP_REDUCE.get(node.op_type, "Identity")
        del node.input[1:]
        if node.op_type == "Mul":
            node.input.append(node.input[0])
        del node.attribute[:]
        return True
    rank = types.rank(node.input[0])
    if given and min(given) >= 0:
        canonical = sorted(set(given))
    elif rank is None or rank == 0:
        return False  # the rank is needed but unknown (or a scalar: no axis to reduce)
    elif given:
        canonical = sorted({axis + rank if axis < 0 else axis for axis in given})
    else:
        canonical = list(range(rank))
    if canonical == given:
        return False  # already canonical
    if as_input:
        name = names.fresh(f"{node.output[0]}_axes")
        add_initializer(graph, np.array(canonical, dtype=np.int64), name)
        del node.input[1:]
        node.input.append(name)
        for attr in [a for a in node.attribute if a.name == "noop_with_empty_axes"]:
            node.attribute.remove(attr)
        return True
    for attr in [a for a in node.attribute if a.name == "axes"]:
        node.attribute.remove(attr)
    node.attribute.append(onnx.helper.make_attribute("axes", canonical))
    return True


def _normalize_gemm(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    constants: dict[str, onnx.TensorProto],
    types: _TypeInfo,
    names: _Names,
    shared: dict,
) -> list[onnx.NodeProto] | None:
    """Rewrite a Gemm to transA=transB=0, alpha=beta=1 in place.

    Returns the Transpose/Mul nodes to insert before it (None: the Gemm is left unchanged,
    because it is canonical already or because scaling needs a float type that is unknown).
    ``alpha`` scales B when B is constant, else A; ``beta`` scales C; ``beta == 0`` drops C.
    ``shared`` maps an (op, inputs, attributes) key to the tensor an earlier Gemm already made,
    so Gemms sharing one weight share its transpose too (one folded copy, not one per consumer).
    """
    attrs = _attributes(node)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
    has_c = len(node.input) > 2 and node.input[2] != ""
    if not {"alpha", "beta", "transA", "transB"} & set(attrs):
        return None
    elem_type = types.elem_type(node.input[0])
    if (alpha != 1.0 or (has_c and beta not in (0.0, 1.0))) and elem_type not in _FLOAT_TYPES:
        return None
    created: list[onnx.NodeProto] = []

    def add(op_type: str, inputs: list[str], tag: str, **attributes) -> str:
        key = (op_type, tuple(inputs), tuple(sorted((k, repr(v)) for k, v in attributes.items())))
        if key not in shared:
            output = names.fresh(f"{node.output[0]}_{tag}")
            created.append(onnx.helper.make_node(op_type, inputs, [output], name=output,
                                                 **attributes))
            shared[key] = output
        return shared[key]

    def scalar(value: float, tag: str) -> str:
        key = ("scalar", elem_type, value)
        if key not in shared:
            shared[key] = names.fresh(f"{node.output[0]}_{tag}")
            graph.initializer.add().CopyFrom(onnx.helper.make_tensor(shared[key], elem_type, [], [value]))
        return shared[key]

    a, b = node.input[0], node.input[1]
    if trans_a:
        a = add("Transpose", [a], "a_t", perm=[1, 0])
    if trans_b:
        b = add("Transpose", [b], "b_t", perm=[1, 0])
    if alpha != 1.0:
        if node.input[1] in constants:
            b = add("Mul", [b, scalar(alpha, "alpha")], "b_alpha")
        else:
            a = add("Mul", [a, scalar(alpha, "alpha")], "a_alpha")
    inputs = [a, b]
    if has_c and beta != 0.0:
        c = node.input[2]
        if beta != 1.0:
            c = add("Mul", [c, scalar(beta, "beta")], "c_beta")
        inputs.append(c)
    del node.input[:]
    node.input.extend(inputs)
    for attr in [at for at in node.attribute if at.name in ("alpha", "beta", "transA", "transB")]:
        node.attribute.remove(attr)
    return created


@register_pass("normalize", reads_unwritten=True)
def normalize(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Rewrite opset-dependent forms into one canonical standard-ONNX form.

    - ``Reduce*`` (:data:`REDUCE_OPS`): explicit, sorted, non-negative axes, as the ``axes``
      input where the opset requires it (ReduceSum >= 13, all >= 18) and as the attribute
      below. Without axes: ``noop_with_empty_axes=1`` becomes the elementwise step alone (``Abs``
      for L1/L2, ``x * x`` for SumSquare, ``Log`` for LogSum, else ``Identity``), otherwise all axes
      (needs the input rank from shape inference; a node of unknown rank, or whose axes input
      is computed at run time, is left unchanged).
    - ``Gemm``: transA=0, transB=0, alpha=1, beta=1. Transposes and scales of constant
      operands are folded numerically (onnxruntime evaluates them); for other operands explicit
      ``Transpose``/``Mul`` nodes are inserted; beta=0 drops C. The C operand keeps its shape
      (any of Gemm's unidirectional broadcast shapes). Input Transpose nodes are never merged
      into trans flags (an identity ``perm`` is not a transpose: field notes §5 #7).

    The model is shape-inferred first (the later passes read the types it leaves), unless
    its value_info already types every node output fully
    (:func:`onnx_cinm.analysis.inference_adds_nothing`: inference would change nothing).

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.
    ctx : PassContext
        ``ctx.stats["normalize"]`` receives the number of rewritten nodes. ``ctx.fills``
        (fold_constants' initializers of one value repeated) is read, so that a transposed
        one is not read back, and handed on, kept current, to the next pass. The initializers
        of ``ctx.unwritten`` a Reduce or Gemm reads are written first, with those before them
        in the initializer list.

    Returns
    -------
    onnx.ModelProto
    """
    if not inference_adds_nothing(model):  # (the types are there already: same value_info)
        infer_shapes(model, strict=False)
    graph = model.graph
    fills = _current(ctx.fills, graph)  # before a fresh name could take a freed one's
    rewritten = 0
    created_outputs: set[str] = set()
    rewritable = [node for node in graph.node if _is_default_domain(node) and
                  (node.op_type in REDUCE_OPS or node.op_type == "Gemm")]
    if rewritable:  # (else nothing to rewrite: no names, types, node copies)
        if ctx.unwritten:  # what the rewrite and its folding read (axes, a Gemm's operands),
            # and those appended before them, in their order: written as fold_constants would
            # have, the weights take the memory they took then (light VGG19's FC weights
            # written before its conv weights: peak RSS 1107 -> 1113 MB; in order 1102 MB)
            read = {name for node in rewritable for name in node.input[:]}
            order = [t.name for t in graph.initializer[:] if t.name in ctx.unwritten]
            last = max((k for k, name in enumerate(order) if name in read), default=-1)
            write_unwritten(graph, ctx.unwritten, order[:last + 1])
        rewritten, created_outputs = _normalize_nodes(model)
    if created_outputs:  # the weights fold_constants filled are permuted without reading them
        _fold(model, {}, only=created_outputs, fills=fills)
    _remove_dead_values(graph)
    ctx.stats["normalize"] = rewritten
    ctx.fills = _current(fills, graph)  # handed on, kept current, to fold_batchnorm
    return model


def _normalize_nodes(model: onnx.ModelProto) -> tuple[int, set[str]]:
    """:func:`normalize`'s rewrite of the Reduce* and Gemm nodes; returns how many it rewrote
    and the outputs of the nodes it created (to fold)."""
    graph = model.graph
    opset = _default_opset(model)
    names = _Names(graph)
    constants, types = _constants(graph), _TypeInfo(graph)
    rewritten = 0
    nodes: list[onnx.NodeProto] = []
    created_outputs: set[str] = set()
    shared: dict = {}  # transposes and scales made once for every Gemm that needs them
    for node in graph.node:
        if _is_default_domain(node) and node.op_type in REDUCE_OPS:
            rewritten += _normalize_reduce(graph, node, opset, constants, types, names)
        elif _is_default_domain(node) and node.op_type == "Gemm":
            created = _normalize_gemm(graph, node, constants, types, names, shared)
            if created is not None:
                rewritten += 1
                nodes.extend(created)
                created_outputs.update(n.output[0] for n in created)
        nodes.append(node)
    _replace_nodes(graph, nodes)
    return rewritten, created_outputs


# --- fold_batchnorm --------------------------------------------------------------------------


def _check_batchnorm(edit: Edit, bn: ir.Node):
    """Pattern: ``BatchNormalization(Conv(x, W, b?), scale, B, mean, var)``; the Conv's output
    read by the BN alone, the BN's extra outputs unread, all parameters constant, inference form.
    Returns ``(conv, W, b or None, scale, B, mean, var)`` as arrays (float64 but W), or why not."""
    x = bn.inputs[0]
    conv = x.producer() if x is not None else None
    if conv is None or conv.op_type != "Conv" or conv.domain not in _DEFAULT_DOMAINS:
        return "not fed by a Conv"
    if len(x.uses()) + x.is_graph_output() != 1:
        return "the Conv output has other readers"
    if any(v.uses() or v.is_graph_output() for v in bn.outputs[1:] if v.name):
        return "training outputs are read"
    params = [*conv.inputs[1:3], *bn.inputs[1:5]]
    arrays = [edit.array(v, inputs_too=False) if v is not None else None for v in params]
    if len(bn.inputs) < 5 or any(v is not None and a is None for v, a in zip(params, arrays)):
        return "parameters are not constant"
    if "training_mode" in bn.attributes and bn.attributes["training_mode"].value:
        return "training mode"
    weight = arrays[0]
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    scale, bias, mean, var = (a.astype(np.float64) for a in arrays[-4:])
    channels = weight.shape[0]
    if any(p.shape != (channels,) for p in (scale, bias, mean, var)):
        return "per-channel parameters of another size"
    conv_bias = arrays[1].astype(np.float64) if has_bias else None
    return conv, weight, conv_bias, scale, bias, mean, var


def _folded(weight, conv_bias, scale, bias, mean, var, epsilon) -> tuple[np.ndarray, np.ndarray]:
    """The Conv weight and bias with the BN folded in (see :func:`fold_batchnorm`)."""
    channels = weight.shape[0]
    factor = scale / np.sqrt(var + epsilon)
    per_channel = (channels,) + (1,) * (weight.ndim - 1)
    # one value repeated (the light models'; known from fold_constants or read): one product
    # per channel,
    if is_fill(weight) or is_splat(weight):
        first = weight[(0,) * weight.ndim].reshape(1)
        rows = np.multiply(first, factor, dtype=np.float64).astype(weight.dtype)
        # a view, not multiplied out (one value when every channel's is the same)
        new_weight = np.broadcast_to(rows[:1] if is_splat(rows) else rows.reshape(per_channel),
                                     weight.shape)
    else:  # products in float64, each rounded once to the weight's dtype as it is stored
        # (numpy buffers the cast): no float64 array of the whole weight, no pass casting it
        new_weight = np.multiply(weight, factor.reshape(per_channel), dtype=np.float64,
                                 out=np.empty(weight.shape, weight.dtype), casting="unsafe")
    new_bias = ((conv_bias if conv_bias is not None else np.zeros(channels)) - mean) * factor + bias
    return new_weight, new_bias.astype(weight.dtype)


def _fold_batchnorm(edit: Edit, bn: ir.Node, binding) -> Replacement:
    """The Conv with the BN folded into its weights and bias (new initializers: the old ones
    may be shared), writing the BN's output, where the Conv was."""
    conv, weight, conv_bias, scale, bias, mean, var = binding
    epsilon = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
    new_weight, new_bias = _folded(weight, conv_bias, scale, bias, mean, var, epsilon)
    w_in = conv.inputs[1].name
    weight_name = edit.const(f"{w_in}_bn", new_weight)
    bias_base = conv.inputs[2].name if conv_bias is not None else conv.outputs[0].name
    bias_name = edit.const(f"{bias_base}_bn_bias", new_bias)
    folded = ir.Node(conv.domain, conv.op_type,
                     [conv.inputs[0], edit.lookup(weight_name), edit.lookup(bias_name)],
                     attributes=[ir.Attr(a.name, a.type, a.value) for a in conv.attributes.values()],
                     name=conv.name, doc_string=conv.doc_string, overload=conv.overload,
                     metadata_props=dict(conv.metadata_props),
                     outputs=[ir.Value(name=bn.outputs[0].name)])
    return Replacement([folded], [conv, bn])


_FOLD_BATCHNORM = Rule(frozenset({"BatchNormalization"}), _check_batchnorm, _fold_batchnorm)


def _fold_batchnorms_on_protos(model: onnx.ModelProto, fills: dict,
                               unwritten: dict | None = None) -> tuple[int, dict]:
    """:data:`_FOLD_BATCHNORM` applied to the ``NodeProto`` list itself, for a main graph
    without subgraphs, external or sparse initializers: the same checks, in the same order, on
    the same facts (the readers of each tensor, its producer, the initializers the model had),
    the same fresh names and the same result as :class:`~onnx_cinm.rewrite.Edit` gives (its
    write-back puts every node back as it was and appends the new initializers in the order
    made), without opening the graph on onnx_ir and writing every node back (two thirds of
    the pass on DenseNet121). Returns ``(count, made_fills)``: how many BNs were folded, and
    the :attr:`~onnx_cinm.passes.PassContext.fills` entries of the new initializers that hold
    one value broadcast (:func:`~onnx_cinm.rewrite.fill_record`, by name), as
    :meth:`~onnx_cinm.rewrite.Edit.commit` records them. An initializer ``unwritten`` records
    (:attr:`~onnx_cinm.passes.PassContext.unwritten`) is read as its one value broadcast."""
    graph = model.graph
    nodes = list(graph.node)
    fresh = _Names(graph).fresh
    graph_inputs = {v.name for v in graph.input}
    graph_outputs = {v.name for v in graph.output}
    original = {t.name: t for t in graph.initializer}
    readers = Counter(name for n in nodes for name in n.input[:] if name)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output[:] if o}  # -> index in current

    def array(name):  # Edit.array(..., inputs_too=False)
        tensor = original.get(name)
        if tensor is None or name in graph_inputs:
            return None
        fill = known_fill(fills, name, tensor)
        if fill is None:
            fill = unwritten_fill(unwritten, name, tensor)
        if fill is not None:
            one = np.frombuffer(fill, helper.tensor_dtype_to_np_dtype(tensor.data_type))
            return repeated(one.reshape(()), tensor.dims[:])
        return tensor_array(tensor)

    made: list = []
    current: list = list(nodes)  # a Conv's place takes its folded Conv, a folded BN's None
    for index, bn in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or not _is_default_domain(bn):
            continue
        x = bn.input[0] if bn.input else ""
        at = producer.get(x) if x else None
        conv = current[at] if at is not None else None
        if conv is None or conv.op_type != "Conv" or not _is_default_domain(conv):
            continue  # not fed by a Conv
        if readers[x] + (x in graph_outputs) != 1:
            continue  # the Conv output has other readers
        if any(readers[o] or o in graph_outputs for o in bn.output[1:] if o):
            continue  # training outputs are read
        params = [*conv.input[1:3], *bn.input[1:5]]
        arrays = [array(v) if v else None for v in params]
        if len(bn.input) < 5 or any(v and a is None for v, a in zip(params, arrays)):
            continue  # parameters are not constant (a folded Conv's are new: never folded twice)
        attrs = {a.name: a for a in bn.attribute[:]}
        if "training_mode" in attrs and attrs["training_mode"].i:
            continue
        weight = arrays[0]
        has_bias = len(conv.input) > 2 and conv.input[2] != ""
        scale, bias, mean, var = (a.astype(np.float64) for a in arrays[-4:])
        channels = weight.shape[0]
        if any(p.shape != (channels,) for p in (scale, bias, mean, var)):
            continue  # per-channel parameters of another size
        conv_bias = arrays[1].astype(np.float64) if has_bias else None
        epsilon = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
        new_weight, new_bias = _folded(weight, conv_bias, scale, bias, mean, var, epsilon)
        weight_name = fresh(f"{conv.input[1]}_bn")
        made.append((weight_name, new_weight))
        bias_name = fresh(f"{conv.input[2] if conv_bias is not None else conv.output[0]}_bn_bias")
        made.append((bias_name, new_bias))
        folded = onnx.NodeProto()
        folded.CopyFrom(conv)
        del folded.input[:], folded.output[:]
        folded.input.extend([conv.input[0], weight_name, bias_name])
        folded.output.append(bn.output[0])
        readers.subtract(name for name in (*conv.input[:], *bn.input[:]) if name)
        readers.update(name for name in folded.input[:] if name)
        current[at], current[index] = folded, None
        producer[bn.output[0]] = at
    if not made:
        return 0, {}
    _replace_nodes(graph, [node for node in current if node is not None])
    made_fills = {}
    for name, value in made:
        if is_fill(value):  # as Edit.commit records them
            made_fills[name] = fill_record(value)
        add_initializer(graph, value, name)
    return len(made) // 2, made_fills


@register_pass("fold_batchnorm", reads_unwritten=True)
def fold_batchnorm(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Fold ``BatchNormalization`` into the ``Conv`` that feeds it.

    Applies when the Conv weights (and bias) and all BN parameters are constants, the BN is
    in inference form (no ``training_mode``, no used extra outputs) and the Conv output is read
    by that BN only. Per output channel ``k``, with ``f = scale / sqrt(var + epsilon)``::

        W'[k] = W[k] * f[k]
        b'[k] = (b[k] - mean[k]) * f[k] + B[k]      (b = 0 when the Conv has no bias)

    computed in float64 and cast back to the weight dtype. The new weights are new
    initializers (the old ones may be shared); unused ones are removed. A main graph without
    subgraphs (and without external or sparse initializers) is rewritten as the list of
    ``NodeProto`` it is (:func:`_fold_batchnorms_on_protos`); one with bodies, which may read
    the Conv's output, through :class:`~onnx_cinm.rewrite.Edit`'s use-def links.

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.
    ctx : PassContext
        ``ctx.stats["fold_batchnorm"]`` receives the number of folded BatchNormalization nodes.
        A Conv weight ``ctx.fills`` knows to hold one value repeated is not read back;
        ``ctx.fills`` is handed on to ``to_cinm``, kept current (the folded weights of one
        value added: :meth:`onnx_cinm.rewrite.Edit.current_fills`). The weights
        ``ctx.unwritten`` records (fold_constants' fills) are read as their value: those it
        folds are dropped without their bytes ever written (16 MB on light DenseNet121).

    Returns
    -------
    onnx.ModelProto
    """
    if not any(node.op_type == "BatchNormalization" and _is_default_domain(node)
               for node in model.graph.node):  # nothing to fold: no need to open the graph
        ctx.stats["fold_batchnorm"] = 0
        ctx.fills = dict(ctx.fills)  # still current: handed on to to_cinm
        return model
    # the weights fold_constants filled with one value are not read back (ResNet50: 94 MB)
    graph = model.graph
    if not graph.sparse_initializer and not any(_subgraphs(n) for n in graph.node) and \
            not any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer):
        folded, made_fills = _fold_batchnorms_on_protos(model, ctx.fills, ctx.unwritten)
        fills = {**ctx.fills, **made_fills}
    else:  # bodies capturing values, or tensors onnx_ir reads its own way: its use-def links
        if ctx.unwritten:  # (onnx_ir reads every initializer)
            write_unwritten(graph, ctx.unwritten)
        edit = Edit(model, _Names(graph).fresh, fills=ctx.fills)
        folded = sum(apply(edit, [_FOLD_BATCHNORM])[0].values())
        if folded:
            edit.commit(keep_graph_inputs=True)
        fills = edit.current_fills()
    if folded:
        _remove_dead_values(graph)
    ctx.stats["fold_batchnorm"] = folded
    # handed on, kept current (Edit.current_fills: the entries whose initializer is still
    # there, and the folded weights of one value), to to_cinm
    names = {t.name for t in graph.initializer}
    ctx.fills = {name: fill for name, fill in fills.items() if name in names}
    if ctx.unwritten:  # the weights it folded are gone, never written
        for name in [name for name in ctx.unwritten if name not in names]:
            del ctx.unwritten[name]
    return model
