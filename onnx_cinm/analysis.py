"""Static facts about a model: tensor types and shapes, constants, and FLOPs per node.

FLOPs count multiplies and adds separately (a multiply-accumulate is 2), for one inference at
the sizes the model is planned for (:func:`onnx_cinm.frontend.planned_dims`, set by ``optimize
--dim NAME=SIZE``); symbolic dims without a size are taken as 1 (a dynamic batch counts as batch
1). Data movement (Reshape, Transpose,
Concat, Gather, Im2Col, Pad, Cast, ...) counts 0.
"""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from . import frontend
from .anonymous_dims import infer_once, size_anonymous_dims
from .dialects import cinm
from .graph import OpInfo, TensorInfo

_MOVE = {"Reshape", "Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Im2Col", "Pad",
         "Cast", "CastLike", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Slice",
         "Split", "Expand", "Tile", "Constant", "ConstantOfShape", "Dropout", "DepthToSpace",
         "SpaceToDepth", "Resize", "Upsample", "ScatterND", "ScatterElements", "Range", "NonZero"}
_PER_OUTPUT = {"Softmax": 5, "LogSoftmax": 5, "BatchNormalization": 2, "LRN": 6,
               "InstanceNormalization": 5, "LayerNormalization": 8, "HardSigmoid": 3, "HardSwish": 4,
               "Gelu": 8, "Erf": 4, "LayerNorm": 8}


def tensor_infos(model: onnx.ModelProto, infer: bool = True,
                 dims: dict[str, int] | None = None,
                 names: set[str] | None = None) -> dict[str, TensorInfo]:
    """Type, shape and constness of every tensor of the main graph that shape inference can tell.

    Runs (non-strict) shape inference on a copy without initializer data, so it is cheap for
    big models; with ``infer=False`` it reads the model's value_info as it is (for a model that
    was just inferred), and so it does when that already types every node output with all dims
    known and no subgraph (inference would add nothing, :func:`_settled`). Initializers are
    ``const``.

    Symbolic dims with a planned size (:func:`onnx_cinm.frontend.planned_dims`, and the dims
    named inside compiled If branches, :data:`onnx_cinm.frontend.BRANCH_DIMS_KEY`) are bound
    to it before inference (in the bodies' declared types too), so shapes computed from them (a sequence length through a Reshape) are
    known too; such a model is always inferred afresh (its value_info holds the symbolic
    shapes), whatever ``infer`` says. ``dims`` (``{dim name: size}``) replaces the planned sizes
    (to ask what a shape would be at other sizes). ``names``: the tensors asked about; the
    infos of others may be left out (not read: the kernel folder's writer asks for the kernels'
    tensors, a tenth of the model's). Where onnx leaves dims anonymous (``unk__N``:
    a ``Slice``
    bounded by ``Shape(x)[1]``, the attention heads behind it),
    :func:`onnx_cinm.anonymous_dims.size_anonymous_dims` folds the shape arithmetic at those
    sizes and takes a matrix product's reduction length from its constant operand.

    Raises:
        CinmError: the model's planned-dims record is malformed.
    """
    probed = frontend.probed_shapes(model) if dims is None else {}
    dims = {**frontend.planned_dims(model, frontend.BRANCH_DIMS_KEY),
            **(frontend.planned_dims(model) if dims is None else dims)}
    if not dims and not probed:
        consts = {i.name: (i.data_type, tuple(i.dims[:])) for i in model.graph.initializer[:]
                  if names is None or i.name in names}
        if not infer:
            return _collect(model.graph, consts, names=names)
        settled = _settled(model.graph, consts)
        if settled is not None:
            return settled
    light, consts = _weightless_copy(model, dims, probed)
    inferred = size_anonymous_dims(light)
    pins = _probe_pins(inferred.graph, probed)
    if pins:  # again, from the probed shapes of the tensors inference left open
        del inferred.graph.value_info[:]
        inferred = size_anonymous_dims(inferred, pins)
    return _collect(inferred.graph, consts, dims, names)


def keep_static_types(model: onnx.ModelProto, infos: dict[str, TensorInfo]) -> bool:
    """Write into ``model``'s value_info the types ``infos`` (:func:`tensor_infos` of this
    very model) gives its untyped node outputs, when they are all known: element type and
    every dim. Then a later :func:`tensor_infos` of the model, rewritten meanwhile keeping each
    remaining tensor's type (a lowered node put back on the host writes the tensor its cinm ops
    wrote), reads them (:func:`_settled`) instead of inferring every shape again: what
    inference would give, since it keeps typed entries as they are. Nothing is written (False)
    when a dim is open or anonymous (another inference numbers those afresh), for types at
    planned or probed sizes (the model itself stays symbolic), or for a main graph with bodies.
    The final shape inference of :func:`onnx_cinm.pipeline.optimize` starts from no
    value_info, so the written model is the same; when the types are still current there,
    that inference is left out and they are kept, in node order
    (:func:`onnx_cinm.frontend.keep_inferred_types`: the same model), unless the model came
    with value_info of its own (the types inferred since may derive from its entries)."""
    if _sized_elsewhere(model):
        return False
    graph = model.graph
    typed = {v.name for v in graph.value_info[:]}
    typed.update(v.name for v in graph.output[:])
    entries = []
    for node in graph.node[:]:
        if frontend.subgraphs(node):
            return False
        for name in node.output[:]:
            if not name or name in typed:
                continue
            info = infos.get(name)
            if info is None or info.dtype is None or info.shape is None or \
                    not all(isinstance(d, int) for d in info.shape):
                return False
            try:
                elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
            except (KeyError, TypeError, ValueError):
                return False
            if helper.tensor_dtype_to_np_dtype(elem) != info.dtype:
                return False
            typed.add(name)
            entries.append(helper.make_tensor_value_info(name, elem, list(info.shape)))
    graph.value_info.extend(entries)
    return True


def _sized_elsewhere(model: onnx.ModelProto) -> bool:
    """Whether ``model`` records planned or probed sizes: its inferred types are then at those
    sizes, not the model's own, and are not written into it."""
    return bool(frontend.planned_dims(model) or frontend.probed_shapes(model)
                or frontend.planned_dims(model, frontend.BRANCH_DIMS_KEY))


def type_node_outputs(model: onnx.ModelProto) -> bool:
    """Write into ``model``'s value_info the types of its untyped main-graph node outputs, node
    by node (onnx's inference function of each node's schema, the cinm ops' included, on the
    types its inputs have: declared, an initializer's, or written here before), when all of them
    come out static: element type and every dim. The entries are those
    :func:`keep_static_types` would write after a whole-graph :func:`tensor_infos` (the same
    fields, in node order), so a later :func:`tensor_infos` reads them (:func:`_settled`)
    instead of inferring every shape: ``to_cinm`` calls it on the graph it rewrote, whose
    lowered ops write their original ops' typed outputs and only the few tensors between the
    ops it added are new (light DenseNet121: 242 Im2Col and Gemm outputs of 851 nodes; the
    placement's whole-graph inference was 250 M instructions).

    Inference keeps a typed entry as it is and types a node's outputs from its inputs' types
    alone, so node by node it gives what the whole graph's does; inputs' values are read, as
    there, only from the small initializers :func:`_weightless_copy` keeps. Nothing is written
    (False) where a whole-graph inference may know more or number dims afresh: a dim left open
    or anonymous, an input of no known type, an initializer that is a graph input too, a node
    with a body, or sizes planned or probed (:func:`tensor_infos` infers such a model afresh
    anyway). True when every node output is typed then.
    """
    if _sized_elsewhere(model):
        return False
    graph = model.graph
    typed = {v.name for v in graph.value_info[:]}
    typed.update(v.name for v in graph.output[:])
    nodes = graph.node[:]
    # (each field read once: a protobuf field read costs more than the loop around it)
    pending = [(n, outs) for n, outs in zip(nodes, [n.output[:] for n in nodes])
               if any(o and o not in typed for o in outs)]
    if not pending:
        return True
    if any(frontend.subgraphs(n) for n in nodes):
        return False
    pending = [(n, n.input[:], outs) for n, outs in pending]
    needed = {i for _, ins, _ in pending for i in ins if i}
    inputs = {v.name for v in graph.input}
    types: dict[str, onnx.TypeProto] = {}
    values: dict[str, onnx.TensorProto] = {}
    # helper.make_tensor_type_proto(elem, dims) once per distinct type: the protos are only
    # read (by the inference functions, and copied into the entries written)
    made: dict[tuple, onnx.TypeProto] = {}

    def tensor_type(elem: int, dims: list[int]) -> onnx.TypeProto:
        key = (elem, *dims)
        t = made.get(key)
        if t is None:
            t = made[key] = helper.make_tensor_type_proto(elem, dims)
        return t

    for init in graph.initializer[:]:
        name = init.name
        if name in needed:
            if name in inputs:
                return False
            dims = init.dims[:]
            types[name] = tensor_type(init.data_type, dims)
            if math.prod(dims) <= 512:  # what _weightless_copy keeps the values of
                values[name] = init
    for vi in graph.input[:] + graph.value_info[:] + graph.output[:]:
        if vi.name in needed and vi.name not in types:
            types[vi.name] = vi.type
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    entries = []
    for node, ins, outs in pending:
        domain = node.domain
        if domain == cinm.DOMAIN:  # the cinm op's own inference, called directly
            got = cinm.output_types(node, types)
            if got is None:
                return False
            got = dict(zip(outs, got))
        else:
            domain = "" if domain == "ai.onnx" else domain
            try:
                schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
                got = onnx.shape_inference.infer_node_outputs(
                    schema, node, {i: types[i] for i in ins if i},
                    {i: values[i] for i in ins if i in values},
                    opset_imports=list(model.opset_import), ir_version=model.ir_version)
            except Exception:  # noqa: BLE001 - no schema, an untyped input, inference failed
                return False
        for name in outs:
            if not name or name in typed:
                continue
            t = got.get(name)
            if t is None or not t.HasField("tensor_type"):
                return False
            tt = t.tensor_type
            elem = tt.elem_type
            if not elem or not tt.HasField("shape"):
                return False
            dims = tt.shape.dim[:]
            if not all(d.HasField("dim_value") for d in dims):
                return False
            dims = [d.dim_value for d in dims]
            if any(d < 0 for d in dims) or not _numpy_holds(elem):
                return False
            typed.add(name)
            # helper.make_tensor_value_info(name, elem, dims): the name, then that type copied
            entry = onnx.ValueInfoProto(name=name)
            types[name] = made_type = tensor_type(elem, dims)
            entry.type.CopyFrom(made_type)
            entries.append(entry)
    graph.value_info.extend(entries)
    return True


@functools.cache
def _numpy_holds(elem_type: int) -> bool:
    """Whether numpy holds the TensorProto element type ``elem_type`` as it is (the element
    types :func:`keep_static_types` writes): worked out once per type, not per tensor."""
    try:
        return helper.np_dtype_to_tensor_dtype(helper.tensor_dtype_to_np_dtype(elem_type)) == elem_type
    except (KeyError, TypeError, ValueError):
        return False


def _weightless_copy(model: onnx.ModelProto, dims: dict,
                     probed: dict | None = None) -> tuple[onnx.ModelProto, dict]:
    """The copy of ``model`` :func:`tensor_infos` infers (no weight bytes: inference needs only
    their types and dims; ``dims`` bound on it, the model itself stays dynamic; the graph
    outputs ``probed`` sizes pinned, :func:`_pin_outputs`), and
    ``{initializer name: (element type, dims)}``."""
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                            functions=model.functions)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    _pin_outputs(g, probed or {})
    g.value_info.extend(model.graph.value_info)
    if dims:  # bound on the copy: the model itself stays dynamic
        del g.value_info[:]  # entries computed from the symbolic sizes would contradict them
        frontend.bind_dims(g, dims)
    consts = {}
    for init in model.graph.initializer[:]:
        name, data_type, dims = init.name, init.data_type, tuple(init.dims[:])
        consts[name] = (data_type, dims)
        # small ones (axes, shapes, k) carry values inference reads; the element count is a
        # cheap bound (ByteSize() walks the whole tensor, ~60 ms for a 100 MB one)
        if math.prod(dims) <= 512:  # Python ints: no overflow, and 10x np.prod's speed
            g.initializer.append(init)
        else:
            g.initializer.add(name=name, data_type=data_type, dims=dims)
    return light, consts


def open_tensors(model: onnx.ModelProto, names: list[str] | Callable[[], list[str]],
                 first_inference: Callable[[], onnx.ModelProto | None] | None = None,
                 assume: dict | None = None) -> list[str]:
    """The tensors of ``names`` (node outputs of the main graph) whose shape
    :func:`tensor_infos` leaves open: no info, no shape, or a dim without a size; in the order
    given. ``names`` may be a callable giving them: called only when no fast answer below
    gives "none" (the planning probe's list costs a walk of every node and of what each reads).
    ``assume``: symbolic dims taken as sized besides the planned ones (the batches a planning
    probe runs at 1: a tensor whose only open dims are these is not open).

    When the model records no probed shapes and has no value_info (a model as loaded), the
    first inference :func:`tensor_infos` runs (:func:`onnx_cinm.anonymous_dims.infer_once` of
    the same weightless copy at the planned sizes) is run alone first: if it sizes every node
    output of the main graph, or else every one of ``names``, none is open, for the further
    rounds of :func:`~onnx_cinm.anonymous_dims.size_anonymous_dims` only size more dims; the
    rest of :func:`tensor_infos` (every tensor's info, the sizing rounds' checks: half of the
    planning probe's cost on DenseNet121, where nothing is open) is skipped. Otherwise
    :func:`tensor_infos` answers.

    ``first_inference``, for a model with no planned dims and no ``Shape``/``Size`` node (no
    values to propagate): called instead of that first inference, it returns another inference
    of a weightless copy with onnx's defaults that sizes the same tensors (the opset
    conversion's, :func:`onnx_cinm.passes.canonicalize.conversion_inference`, so that it runs
    once), or None (then the first inference runs).

    Raises:
        CinmError: the model's planned-dims record is malformed.
    """
    planned = {**frontend.planned_dims(model, frontend.BRANCH_DIMS_KEY), **frontend.planned_dims(model)}
    dims = {**(assume or {}), **planned}
    if not frontend.probed_shapes(model) and not len(model.graph.value_info):
        inferred = None
        if first_inference is not None and not planned and \
                not frontend.wants_data_propagation(model.graph):
            inferred = first_inference()
            consts = {init.name for init in model.graph.initializer[:]}
        if inferred is None:
            light, consts = _weightless_copy(model, dims)
            inferred = infer_once(light)
        # every node output sized: so is each of names, whatever they are (most models)
        outputs = [o for node in model.graph.node[:] for o in node.output[:] if o]
        if _all_sized(inferred.graph, consts, dims, outputs):
            return []
        names = names() if callable(names) else names
        if _all_sized(inferred.graph, consts, dims, names):
            return []
    names = names() if callable(names) else names
    infos = tensor_infos(model)
    sized = set(assume or ())
    return [o for o in names if o not in infos or infos[o].shape is None or
            not all(isinstance(d, int) or d in sized for d in infos[o].shape)]


def _all_sized(graph: onnx.GraphProto, consts: dict, dims: dict, names: list[str]) -> bool:
    """Whether :func:`_collect` of ``graph`` would give each of ``names`` a shape of known
    dims (a constant's, or the first declaration of the name in the main graph's inputs,
    value_info and outputs, a dim known when it has a value >= 0 or ``dims`` sizes its
    name); False also when a name is declared only in a subgraph. Each type is judged once
    by its bytes (:func:`_sized`): a network's tensors share few (light DenseNet121's 1,746
    node outputs, 168), and reading every dim of each was half of this check's cost."""
    types: dict = {}
    for vi in graph.input[:] + graph.value_info[:] + graph.output[:]:
        types.setdefault(vi.name, vi.type)
    judged: dict[bytes, bool] = {}
    for name in names:
        if name in consts:
            continue
        t = types.get(name)
        if t is None:
            return False
        key = t.SerializeToString()
        if key not in judged:
            judged[key] = _sized(t, dims)
        if not judged[key]:
            return False
    return True


def _sized(t: onnx.TypeProto, dims: dict) -> bool:
    """Whether ``t`` is a tensor type of known dims, as :func:`_all_sized` counts them."""
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") and d.dim_value >= 0 or d.dim_param in dims
               for d in t.tensor_type.shape.dim[:])


def _settled(graph: onnx.GraphProto, consts: dict) -> dict[str, TensorInfo] | None:
    """The infos of ``graph`` as its value_info has them when inference could add nothing (the
    main graph has no subgraph, every node output is typed as a tensor, element type and every
    dim known: the model was inferred and then rewritten keeping each tensor's shape, as
    ``fold_batchnorm`` does before ``to_cinm``); else None. Inference keeps typed entries as
    they are, so this is what it would give, without the whole-graph inference (the optimized
    DenseNet121, a Python callback per cinm node: 33 -> 16 ms)."""
    outputs = _typed_outputs(graph)
    if outputs is None:
        return None
    infos = _collect(graph, dict(consts), bodies=False)  # (_typed_outputs: no node has one)
    static: set[int] = set()  # the shapes found all ints, by id (_collect shares the tuples)
    for o in outputs:
        info = infos.get(o)  # (None: typed only as a sequence, a map or an optional)
        if info is None or info.dtype is None or info.shape is None:
            return None
        if id(info.shape) not in static:
            if not all(isinstance(d, int) for d in info.shape):
                return None
            static.add(id(info.shape))
    return infos


def _typed_outputs(graph: onnx.GraphProto) -> list[str] | None:
    """The main graph's node outputs, in order, when its value_info or outputs declare every
    one (of any type) and no node has a subgraph; else None."""
    typed = {v.name for v in graph.value_info[:]}
    typed.update(v.name for v in graph.output[:])
    outputs = []
    nodes = graph.node[:]
    for node in nodes:  # an untyped output (a model never inferred) ends it at once
        for o in node.output[:]:
            if not o:
                continue
            if o not in typed:
                return None
            outputs.append(o)
    if any(frontend.subgraphs(n) for n in nodes):
        return None
    return outputs


def inference_adds_nothing(model: onnx.ModelProto) -> bool:
    """Whether :func:`onnx_cinm.frontend.infer_shapes` of ``model`` would leave it as it is:
    the main graph has no subgraph and its value_info and outputs type every node output as a
    tensor with an element type and every dim known (what :func:`_settled` asks; inference
    keeps typed entries as they are, and the frontend's own additions only fill untyped
    outputs and open dims). A pass that wants the model inferred (``normalize``) skips the
    inference then: light DenseNet121 comes to it with the value_info of
    ``canonicalize_opset``'s conversion.

    Answered from the entries :func:`_collect` would read (a name's first tensor-typed one
    among the graph's inputs, value_info and outputs; an initializer's name is static),
    without building the infos :func:`_settled` returns: 46 -> 22 M instructions on
    light DenseNet121 as normalize gets it (valgrind)."""
    graph = model.graph
    outputs = _typed_outputs(graph)
    if outputs is None:
        return False
    consts = {i.name for i in graph.initializer[:]}
    first: dict[str, onnx.TypeProto.Tensor] = {}
    for vi in graph.input[:] + graph.value_info[:] + graph.output[:]:
        if vi.name not in first and vi.type.HasField("tensor_type"):
            first[vi.name] = vi.type.tensor_type
    static: dict[bytes, bool] = {}  # by serialized shape: most tensors share one
    for o in outputs:
        if o in consts:
            continue
        tt = first.get(o)
        if tt is None or not tt.elem_type or not tt.HasField("shape"):
            return False
        key = tt.shape.SerializeToString()
        known = static.get(key)
        if known is None:
            known = static[key] = all(d.HasField("dim_value") and d.dim_value >= 0
                                      for d in tt.shape.dim[:])
        if not known:
            return False
    return True


def _pin_outputs(graph: onnx.GraphProto, probed: dict) -> None:
    """Give the graph outputs whose declared shape is open (no shape, or a dim without a value)
    the shape the planning probe saw (``{name: (element type, dims)}``), when the element types
    agree; in place, on the weightless copy :func:`tensor_infos` infers. A declared output type
    is kept by inference over what it infers, and :func:`_probe_pins` cannot pin a graph output
    (a value_info entry of an output's name is not one), so without this an output's open
    declared dim stayed unsized although the probe ran the model (madmom's notes RNN declares
    its output ``[output_0_dim_0]``; onnxruntime gives ``[T, 88]``)."""
    for out in graph.output:
        if out.name not in probed or not out.type.HasField("tensor_type"):
            continue
        tt = out.type.tensor_type
        elem, shape = probed[out.name]
        if tt.elem_type and tt.elem_type != elem:
            continue
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            continue
        out.type.CopyFrom(helper.make_tensor_type_proto(elem, list(shape)))


def _probe_pins(graph: onnx.GraphProto, probed: dict) -> list[onnx.ValueInfoProto]:
    """Static types, from the planning probe's shapes (``{name: (element type, dims)}``), of the
    main graph's node outputs whose inferred shape is open (no shape, or a dim without a value)
    and agrees with the probed one (same rank and element type, equal where both are known):
    a name the passes reused for another tensor keeps what inference says."""
    if not probed:
        return []
    outputs = {o.name for o in graph.output}
    types = {v.name: v.type.tensor_type for v in graph.value_info if v.type.HasField("tensor_type")}
    pins = []
    for node in graph.node[:]:
        for name in node.output[:]:
            if name not in probed or name in outputs:
                continue
            elem, shape = probed[name]
            tt = types.get(name)
            if tt is not None and tt.HasField("shape"):
                known = tt.shape.dim[:]
                if all(d.HasField("dim_value") for d in known) or len(known) != len(shape) or any(
                        d.HasField("dim_value") and d.dim_value != s for d, s in zip(known, shape)):
                    continue
            if tt is not None and tt.elem_type and tt.elem_type != elem:
                continue
            pins.append(helper.make_tensor_value_info(name, elem, list(shape)))
    return pins


def _collect(graph: onnx.GraphProto, consts: dict, dims: dict | None = None,
             names: set[str] | None = None, bodies: bool = True) -> dict[str, TensorInfo]:
    """Infos of the main graph's tensors, then of subgraph tensors (If/Loop/Scan bodies) whose
    names the main graph does not use; only those ``names`` when given. ``bodies=False``: the
    caller knows no node has a body (none is looked for)."""
    dims = dims or {}
    infos: dict[str, TensorInfo] = {}
    values = graph.input[:] + graph.value_info[:] + graph.output[:]
    for sub in list(frontend.iter_graphs(graph))[1:] if bodies else ():
        values += sub.input[:] + sub.value_info[:] + sub.output[:]
        for init in sub.initializer[:]:
            consts.setdefault(init.name, (init.data_type, tuple(init.dims[:])))
    if names is not None:  # the first entry of a name is the one read, as below
        values = [vi for vi in values if vi.name in names]
        consts = {n: c for n, c in consts.items() if n in names}
    # a type read field by field costs protobuf calls for its element type and three a dim (a
    # third of this function's time on DenseNet121); most tensors share their type with
    # others: each distinct one (its bytes) read once, into (dtype, shape), or None for a type
    # that is no tensor's
    types: dict[bytes, tuple | None] = {}
    for vi in values:
        name = vi.name
        if name in infos:
            continue
        typ = vi.type
        key = typ.SerializeToString()
        if key in types:
            known = types[key]
        else:
            known = types[key] = _type_of(typ, dims)
        if known is not None:
            infos[name] = _tensor_info(name, known[0], known[1], False)
    np_types: dict[int, np.dtype] = {}
    for name, (dtype, shape) in consts.items():
        np_type = np_types.get(dtype)
        if np_type is None:
            np_type = np_types[dtype] = helper.tensor_dtype_to_np_dtype(dtype)
        infos[name] = _tensor_info(name, np_type, shape, True)
    return infos


def _type_of(typ: onnx.TypeProto, dims: dict) -> tuple | None:
    """``(numpy dtype or None, shape or None)`` of a tensor type (a dim_param sized by ``dims``,
    else its name, or ``"?"``); None for a type that is not a tensor's (:func:`_collect`)."""
    if not typ.HasField("tensor_type"):
        return None
    tt = typ.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        # a negative dim_value (some exporters write -1 for "dynamic") is unknown, like a
        # dim_param
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                      else dims.get(d.dim_param, d.dim_param or "?") for d in tt.shape.dim[:])
    return dtype, shape


_new_object = object.__new__


def _tensor_info(name: str, dtype, shape: tuple | None, const: bool) -> TensorInfo:
    """``TensorInfo(name, dtype, shape, const)``: the same frozen dataclass instance (equal,
    same hash and repr), its fields put in its ``__dict__`` directly instead of through the
    generated ``__init__``'s ``object.__setattr__`` calls: 3,300 instructions an info instead
    of 7,400 (valgrind), and :func:`_collect` makes one per tensor of the graph, on every
    :func:`tensor_infos` (1,500 on light DenseNet121, five times an ``optimize``).
    ``tests/test_analysis.py`` checks it against the constructor and the dataclass's fields."""
    info = _new_object(TensorInfo)
    fields = info.__dict__
    fields["name"] = name
    fields["dtype"] = dtype
    fields["shape"] = shape
    fields["const"] = const
    return info


def _numel(info: TensorInfo | None) -> int:
    return 0 if info is None else info.numel


#: Gate count of the recurrent ops: per step, each gate is one row block of W (and of R).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


#: onnxruntime's contrib LSTM with int8 weights (com.microsoft DynamicQuantizeLSTM): an LSTM
#: whose W is ``[directions, I, 4 H]`` and R ``[directions, H, 4 H]`` (onnxruntime's
#: ContribOperators.md), X ``[seq, batch, I]``.
_CONTRIB_LSTM = ("com.microsoft", "DynamicQuantizeLSTM")


def _recurrent_flops(node: onnx.NodeProto, ins: list) -> int:
    """FLOPs of an ONNX LSTM/GRU/RNN (and :data:`_CONTRIB_LSTM`): per time step, batch row and
    direction, the two matrix products ``2 G H (I + H)`` (G gates of H units, I input features)
    plus ``(3 G + 5) H`` for the bias adds, gate activations and state update. X is
    ``[seq, batch, I]`` (``[batch, seq, I]`` with ``layout=1``; one step of one row if its shape
    is unknown), W is ``[directions, G H, I]`` (the contrib LSTM's ``[directions, I, G H]``)."""
    x, w = ins[0], ins[1] if len(ins) > 1 else None
    if w is None or w.shape is None or len(w.shape) != 3:
        return 0
    layout = frontend.recurrent_layout(node)
    sx, sw = (x.static_shape if x is not None and x.shape and len(x.shape) == 3 else (1, 1, 1)), w.static_shape
    seq, batch = (sx[1], sx[0]) if layout else (sx[0], sx[1])  # unknown X: one step of one row
    contrib = (node.domain, node.op_type) == _CONTRIB_LSTM
    dirs, gh, n_in = (sw[0], sw[2], sw[1]) if contrib else sw
    gates = 4 if contrib else _GATES[node.op_type]
    hidden = gh // gates
    per_step = 2 * gh * (n_in + hidden) + (3 * gates + 5) * hidden
    return seq * batch * dirs * per_step


def _einsum_flops(node: onnx.NodeProto, ins: list, out: TensorInfo | None) -> int:
    """FLOPs of an Einsum: one multiply per operand beyond the first and one add per summed term,
    over every combination of the equation's indices (2 x the index space for two operands with
    a contraction; 0 for a pure transpose). Falls back to the output size when the equation has
    an ellipsis or a shape is unknown."""
    eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "").replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit output: the indices that appear once
        rhs = "".join(c for c in set(lhs) - {","} if lhs.count(c) == 1)
    if "." in eq or len(terms) != len(ins) or any(t is None or t.shape is None for t in ins):
        return _numel(out)
    sizes: dict = {}
    for term, info in zip(terms, ins):
        if len(term) != len(info.shape):
            return _numel(out)
        for letter, d in zip(term, info.static_shape):
            sizes[letter] = max(sizes.get(letter, 1), d)
    space = math.prod(sizes.values())
    summed = bool(set(sizes) - set(rhs))
    return space * (len(terms) - 1 + summed)


def node_flops(node: onnx.NodeProto, infos: dict[str, TensorInfo]) -> int:
    """FLOPs of one node for one inference (see the module docstring); 0 if shapes are unknown.

    The bodies of control flow (If/Loop/Scan) are not included: see :func:`body_flops`."""
    ins = [infos.get(n) for n in node.input[:]]  # slices: see type_node_outputs' note
    outs = [infos.get(n) for n in node.output[:]]
    return _flops(node, node.op_type, node.domain, ins, outs)


#: The op types :func:`_flops` counts other than by :data:`_PER_OUTPUT` (with those whose name
#: starts with ``Reduce``): every other op counts ``_PER_OUTPUT.get(op, 1)`` per output element,
#: told by one set lookup (most of a network's ops, its elementwise ones).
_COUNTED_APART = frozenset(_MOVE | {"If", "Loop", "Scan", *_GATES, _CONTRIB_LSTM[1], "Einsum",
                                    "QLinearMatMul", "QLinearConv", "MatMul", "Gemm", "Gemv",
                                    "MatMulInteger", "SimSearch", "Conv", "ConvTranspose",
                                    "ConvInteger", "Reduce", "MergePartial", "Histogram",
                                    "PopCount", "TopK", "CumSum", "MaxPool", "AveragePool",
                                    "LpPool", "GlobalAveragePool", "GlobalMaxPool"})


def _flops(node: onnx.NodeProto, op: str, domain: str, ins: list, outs: list) -> int:
    """:func:`node_flops` of ``node`` (op type ``op``, domain ``domain``) whose inputs' and
    outputs' infos are ``ins`` and ``outs`` (None: unknown), the node's fields read once by
    the caller (:func:`op_info` reads them for its own record too)."""
    out = outs[0] if outs else None
    if op not in _COUNTED_APART and not op.startswith("Reduce"):  # what the last line gives
        return _PER_OUTPUT.get(op, 1) * (0 if out is None else out.numel)
    if op in _MOVE or (op in ("If", "Loop", "Scan") and domain in ("", "ai.onnx")):
        return 0  # control flow itself: its bodies are counted by body_flops
    if (op in _GATES and domain in ("", "ai.onnx")) or (domain, op) == _CONTRIB_LSTM:
        return _recurrent_flops(node, ins)
    if op == "Einsum":
        return _einsum_flops(node, ins, out)
    if op == "QLinearMatMul" and len(ins) > 3:  # a, a_scale, a_zero_point, b, ...
        ins = [ins[0], ins[3]]
    if op == "QLinearConv" and len(ins) > 3:  # x, x_scale, x_zero_point, w, ...
        ins, op = [ins[0], ins[3]], "Conv"
    if op in ("MatMul", "Gemm", "Gemv", "MatMulInteger", "QLinearMatMul", "SimSearch") and ins and ins[0] and ins[0].shape:
        k = ins[0].static_shape[-1] if (op != "Gemm" or domain == cinm.DOMAIN) else None
        if op == "Gemm" and domain != cinm.DOMAIN:
            trans_a = next((a.i for a in node.attribute[:] if a.name == "transA"), 0)
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
        ks = next((a.ints[:] for a in node.attribute[:] if a.name == "kernel_shape"), [1])
        return int(np.prod(ks)) * _numel(out)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        return _numel(ins[0]) if ins else 0
    return _PER_OUTPUT.get(op, 1) * _numel(out)


def graph_flops(graph: onnx.GraphProto, infos: dict[str, TensorInfo],
                values: dict[str, np.ndarray]) -> tuple[int, bool]:
    """FLOPs of one run of ``graph``'s nodes, control-flow bodies included (:func:`body_flops`),
    and whether the count is exact (False when a trip count or a branch is known only at run
    time)."""
    total, exact = 0, True
    for node in graph.node[:]:
        total += node_flops(node, infos)
        f, ok = body_flops(node, infos, values)
        total, exact = total + f, exact and ok
    return total, exact


def body_flops(node: onnx.NodeProto, infos: dict[str, TensorInfo],
               values: dict[str, np.ndarray]) -> tuple[int, bool]:
    """FLOPs of the bodies of an If, Loop or Scan node for one inference, and whether the count
    is exact; ``(0, True)`` for a node without bodies.

    - If: the larger branch (which one runs is known only at run time: not exact unless both
      count the same).
    - Loop: the body times the trip count ``M`` when it is a constant in ``values`` (an upper
      bound when the condition can stop the loop early; not exact then); once otherwise.
    - Scan: the body times the length of the first scan input along its scan axis (once if
      that length is unknown).
    ``values`` holds the constant tensors that may give a trip count (small initializers).
    """
    bodies = frontend.subgraphs(node)
    if not bodies:
        return 0, True
    counts = [graph_flops(b, infos, values) for b in bodies]
    if node.op_type == "If":
        flops = max(f for f, _ in counts)
        return flops, all(ok for _, ok in counts) and len({f for f, _ in counts}) == 1
    flops, exact = sum(f for f, _ in counts), all(ok for _, ok in counts)
    if node.op_type == "Loop":
        trip = values.get(node.input[0]) if node.input and node.input[0] else None
        cond = len(node.input) > 1 and node.input[1] != ""
        if trip is None or trip.size != 1:
            return flops, False
        return flops * int(trip.reshape(-1)[0]), exact and not cond
    if node.op_type == "Scan":
        n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
        axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [0])
        first = infos.get(node.input[len(node.input) - n_scan]) if n_scan else None
        if first is None or first.shape is None or not isinstance(first.shape[axes[0]], int):
            return flops, False
        return flops * first.shape[axes[0]], exact
    return flops, False


#: Attribute lists longer than this are left out of a standard op's :attr:`OpInfo.attrs`.
MAX_LISTED_ATTR = 1024


def _attrs(node: onnx.NodeProto, domain: str | None = None) -> dict:
    """``node``'s attributes as python values; outside the cinm domain without the lists of
    more than :data:`MAX_LISTED_ATTR` elements (a tree ensemble's node tables, millions of
    entries: no device reads them, and converting them cost seconds per pass). ``domain``:
    ``node.domain``, when the caller read it already."""
    if (node.domain if domain is None else domain) == cinm.DOMAIN:
        return cinm.node_attrs(node)
    out = {}
    for a in node.attribute[:]:
        if len(a.ints) + len(a.floats) + len(a.strings) + len(a.tensors) <= MAX_LISTED_ATTR:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def op_info(node: onnx.NodeProto, infos: dict[str, TensorInfo]) -> OpInfo:
    """The :class:`OpInfo` of ``node`` for device queries (a standard op's long attribute lists
    left out, see :func:`_attrs`)."""
    # every field read once (node_flops would read the names, type and domain again)
    op, domain, names_in, names_out = node.op_type, node.domain, node.input[:], node.output[:]
    ins = [infos.get(n) for n in names_in]  # None: unknown
    outs = [infos.get(n) for n in names_out]
    # the frozen dataclass's fields put in its __dict__ directly, as _tensor_info does (its
    # generated __init__ sets each through object.__setattr__: 1,912 records an optimize of
    # light DenseNet121); an unknown tensor's record built only when it is needed
    info = _new_object(OpInfo)
    fields = info.__dict__
    fields["name"] = node.name
    fields["op_type"] = op
    fields["attrs"] = _attrs(node, domain)
    fields["inputs"] = _known(names_in, ins)
    fields["outputs"] = _known(names_out, outs)
    fields["flops"] = _flops(node, op, domain, ins, outs)
    if op in _ITERATING and domain in ("", "ai.onnx"):
        # the body is this node's work, on the host (Loop and Scan bodies are not compiled):
        # without it the host priced a GRU's Scan over time at its inputs' bytes alone (a
        # trial: 4 Scans, 30 % of a model's FLOPs, at 307 ns each)
        fields["flops"] += body_flops(node, infos, {})[0]
    return info


_is_none = functools.partial(operator.is_, None)


def _known(names: list, infos: list) -> tuple:
    """The infos of the named tensors of ``names`` (``infos``: theirs, None where unknown: a
    record built then). Most nodes name every tensor and know it: then ``infos`` as a tuple,
    told by two scans in C (a generator over the pairs cost twice as much, 3,800 times an
    optimize of light DenseNet121)."""
    if all(names) and not any(map(_is_none, infos)):
        return tuple(infos)
    return tuple(_tensor_info(n, None, None, False) if t is None else t
                 for n, t in zip(names, infos) if n)


#: Control flow whose body runs as part of the node (an If's branches are compiled as graphs
#: of their own: :mod:`onnx_cinm.passes.branches`)
_ITERATING = frozenset({"Loop", "Scan"})
