"""The compiler's front door: load, check, save and shape-infer ONNX models.

Everything here turns tool errors (protobuf, checker, shape inference, file system) into a
:class:`~onnx_cinm.errors.CinmError` with a one-line message.

Large models. A protobuf message cannot exceed 2 GiB, and copying or serializing big messages
is slow with the ``upb`` protobuf backend (about 1 s per 200-500 MB on the project machines).
So:

- :func:`load_model` parses the file once: ``onnx.checker`` gets the model without its large
  weights (a few KB to parse again), and those weights get the checker's tensor rules from their
  sizes in the file's wire format;
- :func:`save_model` writes weights beyond a threshold to a side file (external data) without
  copying the model;
- :func:`infer_shapes` runs onnx shape inference on a *weightless* copy (:func:`strip_weights`)
  and writes the result back (:func:`restore_weights`), so a 550 MB model costs the same as a
  1 MB one; it only falls back to ``infer_shapes_path`` when even the weightless copy exceeds
  2 GiB.

:func:`infer_shapes` and :func:`overwrite_input_shapes` update the model **in place** and return
it, for the same reason; callers that need the original keep their own copy.
"""
from __future__ import annotations

import math

import os
import tempfile
from collections.abc import Callable

import onnx
from google.protobuf.message import DecodeError

from .errors import CinmError
from .protowire import copy_without_initializers as _without_initializers
from .protowire import initializer_raw_sizes, write_streamed

#: Oldest default-domain opset accepted by :func:`load_model`.
MIN_OPSET = 9

#: Largest protobuf message (bytes) that protobuf can serialize: 2 GiB - 1.
PROTOBUF_LIMIT = 2**31 - 1

#: Initializers with more elements than this are moved out of the weightless copy made by
#: :func:`strip_weights`. Shape tensors (Reshape targets, Slice bounds, axes) are far smaller,
#: so shape inference and data propagation still see every value they use.
WEIGHTLESS_MAX_ELEMENTS = 1024

#: Tensors smaller than this (bytes) stay inside the protobuf when writing external data.
_EXTERNAL_MIN_TENSOR_BYTES = 1024

#: Offsets of tensors in an external data file are multiples of this (page size; lets
#: onnxruntime memory-map them).
_EXTERNAL_ALIGNMENT = 4096

_DEFAULT_DOMAINS = ("", "ai.onnx")


def is_recurrent(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is an ONNX LSTM, GRU or RNN (the default domain's; time-major X
    ``[seq, batch, input]`` unless its ``layout`` is 1)."""
    return node.op_type in ("LSTM", "GRU", "RNN") and node.domain in _DEFAULT_DOMAINS


def recurrent_layout(node: onnx.NodeProto) -> int:
    """The ``layout`` attribute of a recurrent ``node`` (:func:`is_recurrent`): 0 (the default),
    X ``[seq, batch, input]``; 1, X ``[batch, seq, input]``."""
    return next((a.i for a in node.attribute if a.name == "layout"), 0)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def subgraphs(node: onnx.NodeProto) -> list:
    """The bodies of ``node`` (If branches, Loop and Scan bodies), in attribute order. A cinm
    op has none, and its attributes (a planned op's plan: dozens) are not looked at: no cinm
    op declares a graph attribute (its schema; the checker refuses an undeclared one)."""
    if node.domain == "cinm":
        return []
    out = []
    for attr in node.attribute[:]:  # asked for every node of every walk: the enum values bound
        # once; a slice, a list: iterating the field ends on an IndexError protobuf formats
        kind = attr.type
        if kind == _GRAPH:
            out.append(attr.g)
        elif kind == _GRAPHS:
            out.extend(attr.graphs)
    return out


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def iter_graphs(graph: onnx.GraphProto):
    """Yield ``graph`` and, recursively, every subgraph of its nodes (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node[:]:  # a slice: see subgraphs
        for sub in subgraphs(node):
            yield from iter_graphs(sub)


def _iter_tensors(model: onnx.ModelProto, graphs: list | None = None,
                  graph_nodes: list | None = None):
    """Yield every TensorProto that may hold data: initializers and tensor-valued attributes.
    ``graphs``/``graph_nodes``: ``list(iter_graphs(model.graph))`` and their nodes, when the
    caller has them already."""
    nodes = [node for function in model.functions for node in function.node]
    for graph in graphs if graphs is not None else iter_graphs(model.graph):
        yield from graph.initializer[:]  # slices: see subgraphs
        for sparse in graph.sparse_initializer[:]:
            yield sparse.values
            yield sparse.indices
        if graph_nodes is None:
            nodes.extend(graph.node[:])
    if graph_nodes is not None:
        nodes.extend(graph_nodes)
    for node in nodes:
        for attr in node.attribute[:]:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _tensor_elements(tensor: onnx.TensorProto) -> int:
    # math.prod of Python ints: a tenth of np.prod's cost, asked for every initializer on every
    # shape inference (strip_weights)
    return math.prod(tensor.dims[:])


def _check_opsets(model: onnx.ModelProto, path: str, nodes: list, domains: list) -> None:
    """``nodes``: those of every graph (:func:`iter_graphs`), ``domains`` theirs."""
    imported: dict[str, int] = {}
    for opset in model.opset_import:
        domain = "" if opset.domain in _DEFAULT_DOMAINS else opset.domain
        imported[domain] = max(imported.get(domain, 0), opset.version)
    default = imported.get("")
    if default is not None and not MIN_OPSET <= default <= onnx.defs.onnx_opset_version():
        raise CinmError(
            f"'{path}': unsupported opset {default} (supported: {MIN_OPSET}.."
            f"{onnx.defs.onnx_opset_version()})"
        )
    missing = {d for d in set(domains) if ("" if d in _DEFAULT_DOMAINS else d) not in imported}
    for node, domain in zip(nodes, domains):
        if domain in missing:  # the first node of a domain not imported
            raise CinmError(
                f"'{path}': node '{node.name or node.output[0]}' ({node.op_type}) uses domain "
                f"'{node.domain}' but the model has no opset_import for it"
            )


#: Domains whose ops a model may use without a model-local function: onnx's own, onnxruntime's
#: contrib ops, and ours.
_KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training",
                            "com.microsoft", "com.microsoft.nchwc", "cinm"})

#: Largest element count numpy, protobuf and onnxruntime can index (int64).
_INT64_MAX = 2**63 - 1


def _one_line(error: BaseException, limit: int = 300) -> str:
    """All lines of an error message joined into one (onnx's checker breaks messages up)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _node_label(node: onnx.NodeProto) -> str:
    if node.name:
        return f"'{node.name}' ({node.op_type})"
    first = next((o for o in node.output if o), "")
    return f"{node.op_type} writing '{first}'" if first else f"an unnamed {node.op_type}"


def _check_unknown_ops(model: onnx.ModelProto, path: str, nodes: list, domains: list) -> None:
    """Every op of a non-standard domain must be defined by a model-local function, and no
    cinm op has a graph attribute: none declares one (the checker refuses it), and the walks
    before the checker (:func:`subgraphs`: tensors, external data) do not look for one.
    ``nodes``: those of every graph (:func:`iter_graphs`), ``domains`` theirs."""
    if not any(d == "cinm" or d not in _KNOWN_DOMAINS for d in set(domains)):
        return  # only onnx's and onnxruntime's ops: nothing to look at node by node
    local = {(f.domain, f.name) for f in model.functions}
    for node, domain in zip(nodes, domains):
        if domain == "cinm" and any(a.type in (_GRAPH, _GRAPHS) for a in node.attribute[:]):
            raise CinmError(f"'{path}': cinm op {_node_label(node)} has a graph attribute; "
                            "no cinm op takes one")
        if domain in _KNOWN_DOMAINS or domain.startswith("cinm."):
            continue
        if (domain, node.op_type) not in local:
            raise CinmError(
                f"'{path}': node {_node_label(node)} uses op '{domain}:{node.op_type}', which "
                f"neither onnx nor onnxruntime defines and no model-local function provides"
            )


def _shape_of(value: onnx.ValueInfoProto) -> list | None:
    tensor_type = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor_type.shape.dim[:]]


def _check_shapes(model: onnx.ModelProto, path: str, graphs: list | None = None,
                  nodes: list | None = None) -> list[onnx.TensorProto]:
    """No int64-overflowing shapes anywhere and no negative tensor dims. Returns the tensors
    with external data, met on the way (:func:`load_model` checks them next: one walk over
    every tensor, not two).

    A negative dim in a declared (value info) shape means "unknown", as some exporters write it.
    A zero-sized dim is legal ONNX (an empty tensor; onnx's own suite has empty-set Reduce
    cases) and is compiled, not refused.
    """
    graph = model.graph
    declared = [("input", v) for v in graph.input] + [("output", v) for v in graph.output] + \
        [("value_info", v) for v in graph.value_info]
    for kind, value in declared:
        # the product of the static dims, each at least 1 (exporters write -1 for unknown): an
        # unset dim_value reads 0, and a value that is no tensor or has no shape has no dims
        if math.prod(max(d.dim_value, 1) for d in value.type.tensor_type.shape.dim[:]) \
                > _INT64_MAX:  # Python ints: exact
            raise CinmError(f"'{path}': graph {kind} '{value.name}' has shape "
                            f"{_shape_of(value)}, whose element count overflows int64")
    external = []
    for tensor in _iter_tensors(model, graphs, nodes):
        if tensor.data_location == _EXTERNAL:
            external.append(tensor)
        dims = tensor.dims
        if not dims:  # a scalar
            continue
        low = min(dims)  # one C-level pass over the dims of each of thousands of tensors
        if low < 0 or (math.prod(dims) if low else math.prod(max(d, 1) for d in dims)) > _INT64_MAX:
            raise CinmError(f"'{path}': tensor '{tensor.name}' has shape {list(tensor.dims)}, "
                            "which is negative or overflows int64")
    return external


_EXTERNAL = onnx.TensorProto.EXTERNAL


def _check_graph_structure(graph: onnx.GraphProto, path: str) -> None:
    """The main graph is a DAG in topological order, in SSA form, with no dangling reads.

    onnx's checker finds most of these too, but reports a cycle, a dangling input and an
    ordering problem alike and over several lines; this names the problem in one line.
    """
    inputs = [v.name for v in graph.input]
    initializers = {t.name for t in graph.initializer} | \
        {t.values.name for t in graph.sparse_initializer}
    seen_inputs: set[str] = set()
    for name in inputs:
        if name in seen_inputs:
            raise CinmError(f"'{path}' is not a valid ONNX model: graph input '{name}' is listed twice")
        seen_inputs.add(name)
    sources = set(inputs) | initializers
    writer: dict[str, onnx.NodeProto] = {}
    nodes = graph.node[:]
    for node in nodes:
        for out in node.output[:]:
            if not out:
                continue
            if out in writer:
                raise CinmError(f"'{path}' is not a valid ONNX model: tensor '{out}' is written by two nodes, "
                                f"{_node_label(writer[out])} and {_node_label(node)}")
            if out in sources:
                raise CinmError(f"'{path}' is not a valid ONNX model: node {_node_label(node)} writes '{out}', which is "
                                "already a graph input or initializer")
            writer[out] = node
    # in the same walk, the order: the first read of a tensor not written yet (what cannot be
    # scheduled in any order lies on a cycle, else the order is wrong: told after the outputs)
    ready = set(sources)
    order_problem = None
    for node in nodes:
        for name in node.input[:]:
            if name and name not in ready:
                if name not in sources and name not in writer:
                    raise CinmError(f"'{path}' is not a valid ONNX model: node {_node_label(node)} reads tensor '{name}', "
                                    "which no node, graph input or initializer produces")
                if order_problem is None:
                    order_problem = (node, name)
        ready.update(node.output[:])
    for value in graph.output:
        if value.name in set(inputs) - initializers:
            raise CinmError(f"'{path}' is not a valid ONNX model: graph output '{value.name}' is also a graph input (a "
                            "pass-through); remove it from the outputs or copy it with Identity")
        if value.name not in sources and value.name not in writer:
            raise CinmError(f"'{path}' is not a valid ONNX model: graph output '{value.name}' is not produced by any node")
    if order_problem is None:
        return
    available, remaining = set(sources), list(range(len(graph.node)))
    progress = True
    while remaining and progress:
        progress = False
        for i in list(remaining):
            if all(not name or name in available for name in graph.node[i].input):
                available.update(graph.node[i].output)
                remaining.remove(i)
                progress = True
    if remaining:
        names = ", ".join(_node_label(graph.node[i]) for i in remaining[:4])
        more = ", ..." if len(remaining) > 4 else ""
        raise CinmError(f"'{path}' is not a valid ONNX model: the graph has a cycle; these nodes can never run: "
                        f"{names}{more}")
    node, name = order_problem
    raise CinmError(f"'{path}' is not a valid ONNX model: nodes are not in topological order: {_node_label(node)} reads "
                    f"'{name}' before {_node_label(writer[name])} writes it")


def validate_structure(model: onnx.ModelProto, label: str = "<model>", *,
                       opsets: bool = True) -> None:
    """Refuse a model whose structure onnx-cinm cannot compile, with a one-line message.

    :func:`load_model` runs this on every file; call it for in-memory models too.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    label : str
        How the messages name the model (a path, or ``"<model>"``).
    opsets : bool
        Also refuse default-domain opsets outside the range files are accepted with
        (``optimize()`` on an in-memory model skips it: the version converter lifts older ones).

    Raises
    ------
    CinmError
        A default-domain opset outside ``[9, onnx.defs.onnx_opset_version()]``; a node whose
        domain is not imported, or whose op no known domain or local function defines; a cinm
        op with a graph attribute; a graph
        input listed twice; a tensor written twice (or a graph input/initializer overwritten);
        a read of a tensor nobody produces; a graph output nobody produces or that is a graph
        input; a cycle; nodes out of topological order; a shape whose element count overflows
        int64; a negative tensor dim.
    """
    _validate_structure(model, label, opsets)


def _validate_structure(model: onnx.ModelProto, label: str, opsets: bool) -> list:
    """:func:`validate_structure`; returns the tensors with external data (:func:`_check_shapes`)."""
    graphs = list(iter_graphs(model.graph))  # one walk for every check
    nodes = [node for graph in graphs for node in graph.node[:]]
    domains = [node.domain for node in nodes]
    if opsets:
        _check_opsets(model, label, nodes, domains)
    _check_unknown_ops(model, label, nodes, domains)
    _check_graph_structure(model.graph, label)
    return _check_shapes(model, label, graphs, nodes)


def _check_external_data(tensors: list, path: str, folder: str) -> bool:
    """Refuse external data of ``tensors`` (those of a model with external data) outside
    ``folder``, missing or too short (CinmError); return whether there is any."""
    external = False
    for tensor in tensors:
        external = True
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        normalized = os.path.normpath(location)
        if not location or os.path.isabs(location) or normalized.split(os.sep)[0] == "..":
            raise CinmError(
                f"'{path}': external data location '{location}' of tensor '{tensor.name}' "
                "is not a relative path inside the model's folder"
            )
        data_path = os.path.join(folder, normalized)
        if not os.path.isfile(data_path):
            raise CinmError(
                f"'{path}': external data file '{location}' of tensor '{tensor.name}' not found"
            )
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", 0))
        except ValueError:
            raise CinmError(
                f"'{path}': bad external data offset/length of tensor '{tensor.name}'"
            ) from None
        if offset < 0 or length < 0:
            raise CinmError(
                f"'{path}': external data of tensor '{tensor.name}' has a negative "
                f"{'offset' if offset < 0 else 'length'} ({min(offset, length)})"
            )
        end = offset + length
        if end > os.path.getsize(data_path):
            raise CinmError(
                f"'{path}': external data file '{location}' is too short for tensor "
                f"'{tensor.name}' (needs {end} bytes)"
            )
    return external


def _external_length(tensor: onnx.TensorProto, folder: str) -> int:
    """Bytes that loading the external data of ``tensor`` puts in its raw_data."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    offset = int(info.get("offset", 0))
    if "length" in info:
        return int(info["length"])
    return os.path.getsize(os.path.join(folder, os.path.normpath(info["location"]))) - offset


#: Element types whose raw_data holds ``elements * itemsize`` bytes (no packed 4/2-bit types,
#: no strings): :func:`_checker_skeleton` checks such tensors itself.
_PLAIN_TYPES = {t: onnx.helper.tensor_dtype_to_np_dtype(t).itemsize for t in (
    onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8, onnx.TensorProto.UINT16,
    onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.BOOL,
    onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128,
    onnx.TensorProto.BFLOAT16)}

_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")


def _checker_skeleton(model: onnx.ModelProto, raw_sizes: list, path: str) -> onnx.ModelProto:
    """What ``onnx.checker`` checks of ``model`` when :func:`load_model` reads it: the model
    with its large raw_data initializers (more than :data:`WEIGHTLESS_MAX_ELEMENTS` elements of
    a :data:`_PLAIN_TYPES` type) left out, each as a graph input of its type and shape (as
    :func:`strip_weights` does), so the checker parses a few KB instead of the weights again.
    Those tensors get the checker's tensor rules here, from their raw sizes (``raw_sizes``,
    per main-graph initializer): raw_data the only value field, at least ``elements *
    itemsize`` bytes. Raises CinmError with the checker's wording. Without a raw size (no
    large initializer: the light models) the skeleton would be a whole copy of ``model``, so
    ``model`` itself is returned (on light DenseNet121, 1,746 nodes, 850 inputs and 848
    initializers were copied one by one for nothing)."""
    if not any(size is not None for size in raw_sizes):
        return model
    skeleton = _without_initializers(model)
    inputs = {value.name for value in model.graph.input}
    for tensor, size in zip(model.graph.initializer, raw_sizes):
        itemsize = _PLAIN_TYPES.get(tensor.data_type)
        elements = _tensor_elements(tensor)
        if size is None or itemsize is None or elements <= WEIGHTLESS_MAX_ELEMENTS:
            skeleton.graph.initializer.append(tensor)
            continue
        label = f"'{path}' is not a valid ONNX model: TensorProto (tensor name: {tensor.name})"
        if any(len(getattr(tensor, field)) for field in _VALUE_FIELDS):
            raise CinmError(f"{label} should contain one and only one value field.")
        if size < elements * itemsize:
            raise CinmError(f"{label} raw_data size ({size} bytes) is too small for the declared "
                            f"shape and type ({elements * itemsize} bytes required).")
        if tensor.name not in inputs:
            skeleton.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return skeleton


def check_model_file(path) -> None:
    """Raise CinmError (one line) if ``path`` is missing or a directory: what
    :func:`load_model` checks first, for a caller that checks several files before loading
    any (``compare``)."""
    if not os.path.exists(path):
        raise CinmError(f"no such file: '{path}'")
    if os.path.isdir(path):
        raise CinmError(f"'{path}' is a directory, not an ONNX file")


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and check an ONNX model, with its external data.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.onnx`` file. External data files are resolved relative to its folder and must
        stay inside that folder.

    Returns
    -------
    onnx.ModelProto
        The model, external data loaded into the tensors, checked by ``onnx.checker``.

    Raises
    ------
    CinmError
        The file is missing, a directory, empty, unreadable, not an ONNX protobuf (random bytes,
        truncated), has no graph or no outputs, fails :func:`validate_structure` (opsets,
        unknown ops, a cinm op with a graph attribute, cycles, order, dangling reads, double
        writes, bad shapes), refers to
        missing, escaping or too short external data, or fails ``onnx.checker.check_model``
        (its message joined into one line).
    """
    path = os.fspath(path)
    check_model_file(path)
    size = os.path.getsize(path)
    if size == 0:
        raise CinmError(f"'{path}' is empty")
    if size > PROTOBUF_LIMIT:
        raise CinmError(f"'{path}' is larger than 2 GiB and cannot be one ONNX protobuf")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        model = onnx.load_model_from_string(data)  # the one parse of the file
    except OSError as error:
        raise CinmError(f"cannot read '{path}': {error.strerror or _first_line(error)}") from None
    except (DecodeError, ValueError, RuntimeError) as error:
        raise CinmError(
            f"'{path}' is not an ONNX model, or is truncated or corrupt (protobuf parse "
            f"failed: {_first_line(error)})"
        ) from None
    if not model.HasField("graph"):
        raise CinmError(f"'{path}' is not an ONNX model: it has no graph")
    if not model.graph.output:
        raise CinmError(f"'{path}' has no graph outputs: nothing to compute")
    externals = _validate_structure(model, path, opsets=True)
    folder = os.path.dirname(os.path.abspath(path))
    external = _check_external_data(externals, path, folder)
    initializers = model.graph.initializer
    # only the large initializers' raw sizes are read (_checker_skeleton): without one, the
    # walk over the whole file's wire format has nothing to tell
    raw_sizes = initializer_raw_sizes(memoryview(data), len(initializers)) \
        if any(_tensor_elements(t) > WEIGHTLESS_MAX_ELEMENTS for t in initializers) \
        else [None] * len(initializers)
    del data
    if external:
        for index, tensor in enumerate(model.graph.initializer):
            if _is_external(tensor):  # its raw_data will be the stored byte range
                raw_sizes[index] = _external_length(tensor, folder)
        onnx.external_data_helper.load_external_data_for_model(model, folder)
    skeleton = _checker_skeleton(model, raw_sizes, path)
    try:
        onnx.checker.check_model(skeleton)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise CinmError(f"'{path}' is not a valid ONNX model: {_one_line(error)}") from None
    return model


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, computed from its shape (the data itself is not touched)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return _tensor_elements(tensor) * itemsize


def _total_tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the data of every main-graph initializer."""
    return sum(_tensor_bytes(tensor) for tensor in model.graph.initializer)


def _external_skeleton(model: onnx.ModelProto, data_file, location: str) -> onnx.ModelProto:
    """Write the large initializers of ``model`` to ``data_file``; return a model pointing at them.

    ``model`` is not modified. Tensors smaller than 1 KiB, and tensors whose data is not in
    ``raw_data`` (typed fields, strings), stay inside the returned protobuf.
    """
    skeleton = _without_initializers(model)
    for tensor in model.graph.initializer:
        if _is_external(tensor):
            raise CinmError(
                f"tensor '{tensor.name}' still refers to external data; load it with load_model"
            )
        if not tensor.HasField("raw_data") or _tensor_bytes(tensor) < _EXTERNAL_MIN_TENSOR_BYTES:
            skeleton.graph.initializer.append(tensor)
            continue
        data_file.write(b"\0" * (-data_file.tell() % _EXTERNAL_ALIGNMENT))
        offset = data_file.tell()
        data = tensor.raw_data
        data_file.write(data)
        reference = skeleton.graph.initializer.add()
        reference.name = tensor.name
        reference.data_type = tensor.data_type
        reference.dims.extend(tensor.dims)
        reference.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", len(data))):
            entry = reference.external_data.add()
            entry.key, entry.value = key, str(value)
    return skeleton


def write_file_atomic(path, data: bytes | str) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` through a temporary file in the same
    folder and a rename, with the permissions an ordinary new file gets (umask applied): readers
    see the old file or the new one, never a partial one. Raises OSError (the temporary removed)."""
    path = os.fspath(path)
    raw = data.encode() if isinstance(data, str) else data
    temporary = _new_temporary(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    try:
        _write_file(temporary, lambda handle: handle.write(raw))
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def missing_parent(folder, what: str) -> None:
    """Raise CinmError if the output folder ``folder`` does not exist and neither does its
    parent: an output folder is created, never a chain of them (a typo in a path would
    otherwise create a tree), as an output file's folder must exist."""
    from pathlib import Path

    out = Path(folder)
    if not out.exists() and not out.absolute().parent.is_dir():
        state = f"'{out.parent}' is a file, not a folder" if out.absolute().parent.exists() \
            else f"folder '{out.parent}' does not exist"
        raise CinmError(f"cannot write the {what} into '{folder}': {state}")


def write_files_into(folder, files: dict, what: str) -> list:
    """Write ``{file name: bytes or text}`` into ``folder`` (created if missing; its parent must
    exist, as for every output file), each atomically; return the paths. Raises CinmError (one
    line naming ``what``) if ``folder`` is a file, its parent is missing or a write fails."""
    from pathlib import Path

    out = Path(folder)
    try:
        if out.exists() and not out.is_dir():
            raise CinmError(f"{what} folder '{folder}' exists and is not a folder")
        missing_parent(out, what)
        out.mkdir(exist_ok=True)
        written = []
        for name, data in files.items():
            write_file_atomic(out / name, data)
            written.append(out / name)
    except OSError as e:
        raise CinmError(f"cannot write the {what} into '{folder}': {e.strerror or e}") from None
    return written


def _new_temporary(folder: str, name: str) -> str:
    # the process id in the name lets a later save remove what a killed one left behind
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp",
                                         dir=folder)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    return temporary


def _write_file(path: str, writer) -> None:
    with open(path, "wb") as handle:
        writer(handle)
        handle.flush()
        os.fsync(handle.fileno())


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data_threshold_bytes: int = 1_800_000_000,
) -> None:
    """Write ``model`` to ``path`` atomically.

    The model is written to a temporary file in the destination folder, then moved into place
    with ``os.replace``: readers see the old file or the new one, never a partial one, and on
    failure the old file is untouched. ``model`` itself is never modified.

    Parameters
    ----------
    model : onnx.ModelProto
        The model to write; its tensors must hold their data (not external references).
    path : str or os.PathLike
        Destination ``.onnx`` file.
    external_data_threshold_bytes : int, optional
        When the initializers of the main graph total more bytes than this (default 1.8 GB,
        below the 2 GiB protobuf limit), every initializer of at least 1 KiB stored as
        ``raw_data`` goes to ``<file name>.data`` next to the model (4 KiB aligned offsets,
        also written to a temporary file and moved into place). Above 2 GiB external data is
        used whatever the threshold.

    Raises
    ------
    CinmError
        The folder does not exist or is not writable, the disk is full, the model cannot be
        serialized, or a tensor still refers to external data. Temporary files are removed.
    """
    staged = stage_model(model, path, external_data_threshold_bytes=external_data_threshold_bytes)
    try:
        staged.place()
    finally:
        staged.discard()


def _datasync(fd: int) -> None:
    """Flush ``fd``'s data to disk: ``os.fdatasync`` (the metadata a size change needs too),
    ``os.fsync`` where there is none (macOS and Windows have no ``fdatasync``). Raises
    OSError."""
    getattr(os, "fdatasync", os.fsync)(fd)


class StagedModel:
    """A model written beside its destination under a temporary name by :func:`stage_model`,
    its flush to disk (``fsync``) under way in a background thread: the caller does other work
    meanwhile (``artifacts.save`` writes the kernel folder), may :meth:`patch` bytes of equal
    length, then :meth:`place` s it (or :meth:`discard` s it). A thread only waits in the one
    ``fsync`` call, which releases the GIL: it takes no time from the caller's."""

    def __init__(self, path: str):
        self.path = path
        self.temporaries: list[str] = []
        self._data_temporary: str | None = None
        self._handle = None
        self._head = 0          # bytes of the file before the first initializer's data
        self._flush = None      # the fsync thread
        self._error: OSError | None = None
        self._patched = False

    def _start_flush(self) -> None:
        import threading  # only a save starts a thread

        def flush():
            try:
                os.fsync(self._handle.fileno())
            except OSError as error:
                self._error = error

        self._flush = threading.Thread(target=flush, name="onnx-cinm model fsync", daemon=True)
        self._flush.start()

    def _wait(self) -> None:
        if self._flush is not None:
            self._flush.join()
            self._flush = None

    def patch(self, old: bytes, new: bytes) -> bool:
        """Replace, in the written file, the one occurrence of ``old`` in the serialized model
        without its weights' data (its metadata, nodes, types) by ``new``, of the same length:
        the file then holds what writing the model changed that way would have. False, and
        nothing changed, when ``old`` does not occur exactly once there. Raises CinmError if the
        file cannot be read or written."""
        if len(old) != len(new):
            raise ValueError("a patch keeps the length")
        try:
            fd = self._handle.fileno()
            head = os.pread(fd, self._head, 0)
            at = head.find(old)
            if at < 0 or head.find(old, at + 1) >= 0:
                return False
            if os.pwrite(fd, new, at) != len(new):
                raise OSError(0, "short write")
        except OSError as error:
            raise CinmError(f"cannot write '{self.path}': {error.strerror or error}") from None
        self._patched = True
        return True

    def place(self) -> None:
        """Wait for the flush (and flush a patch), then move the model (and its ``.data`` file)
        into place with ``os.replace``. Raises CinmError if a write or the rename fails."""
        try:
            self._wait()
            if self._error is not None:
                raise self._error
            if self._patched:  # the page the patch wrote: data only, the size is the same
                _datasync(self._handle.fileno())
            self._handle.close()
            if self._data_temporary is not None:
                os.replace(self._data_temporary, self.path + ".data")
            os.replace(self.temporaries[0], self.path)
        except OSError as error:
            raise CinmError(f"cannot write '{self.path}': {error.strerror or error}") from None

    def discard(self) -> None:
        """Remove what is still temporary (nothing after :meth:`place`); no error."""
        self._wait()
        if self._handle is not None:
            self._handle.close()
        for temporary in self.temporaries:
            if os.path.exists(temporary):
                os.remove(temporary)


def stage_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data_threshold_bytes: int = 1_800_000_000,
) -> StagedModel:
    """The first half of :func:`save_model`: ``model`` written to a temporary file in the
    destination folder (and its external data, synced, when the weights are that large), the
    file's ``fsync`` started in a background thread. Call :meth:`StagedModel.place` to move it
    into place, or :meth:`StagedModel.discard`; the temporaries are removed on an error here.
    Arguments and errors as :func:`save_model`'s. ``model`` is not modified."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    external = _total_tensor_bytes(model) > min(external_data_threshold_bytes, PROTOBUF_LIMIT)
    staged = StagedModel(path)
    try:
        if not os.path.isdir(folder):
            raise CinmError(f"cannot write '{path}': folder '{folder}' does not exist")
        if os.path.lexists(path) and not os.path.isfile(path) or os.path.islink(path):
            raise CinmError(f"cannot write '{path}': it exists and is not a regular file "
                            "(a device, pipe, folder or link); choose a file path")
        staged.temporaries.append(_new_temporary(folder, name))
        if external:
            data_temporary = _new_temporary(folder, name + ".data")
            staged.temporaries.append(data_temporary)
            with open(data_temporary, "wb") as data_file:
                skeleton = _external_skeleton(model, data_file, name + ".data")
                data_file.flush()
                os.fsync(data_file.fileno())
            staged._data_temporary = data_temporary
            # kept open past this function (place or discard closes it); w+: patch reads it
            staged._handle = open(staged.temporaries[0], "w+b")  # noqa: SIM115
            head = skeleton.SerializeToString()
            staged._handle.write(head)
            staged._head = len(head)
        else:
            staged._handle = open(staged.temporaries[0], "w+b")  # noqa: SIM115
            staged._head = write_streamed(staged._handle, model)
        staged._handle.flush()
        staged._start_flush()
    except OSError as error:
        staged.discard()
        raise CinmError(f"cannot write '{path}': {error.strerror or _first_line(error)}") from None
    except ValueError as error:  # protobuf: message too large to serialize
        staged.discard()
        raise CinmError(f"cannot write '{path}': {_first_line(error)}") from None
    except BaseException:
        staged.discard()
        raise
    return staged


def strip_weights(
    model: onnx.ModelProto, max_elements: int = WEIGHTLESS_MAX_ELEMENTS
) -> tuple[onnx.ModelProto, set[str]]:
    """Return a weightless copy of ``model`` for tools that only need the graph.

    Every main-graph initializer with more than ``max_elements`` elements is left out; unless
    it is already a graph input, it becomes a graph input of the same element type and shape.
    Shape inference, data propagation and the version converter give the same result on the
    copy, because they read values only of small (shape-like) tensors. The data of the large
    initializers is not touched, so this costs almost nothing even for GB-sized models.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; not modified.
    max_elements : int, optional
        Initializers with more elements are left out.

    Returns
    -------
    skeleton : onnx.ModelProto
        The weightless copy.
    moved : set of str
        Names of the initializers that were added to the skeleton's graph inputs.
    """
    skeleton = _without_initializers(model)
    inputs = {value.name for value in model.graph.input}
    moved: set[str] = set()
    small = []  # appended at once (light DenseNet121's 848 shape tensors one at a time:
    # 2.0 ms for the whole copy, 1.85 at once)
    for tensor in model.graph.initializer[:]:  # a slice: see subgraphs
        if _tensor_elements(tensor) <= max_elements:
            small.append(tensor)
        elif tensor.name not in inputs:
            moved.add(tensor.name)
            skeleton.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    skeleton.graph.initializer.extend(small)
    return skeleton, moved


def restore_weights(
    model: onnx.ModelProto, skeleton: onnx.ModelProto, moved: set[str]
) -> onnx.ModelProto:
    """Update ``model`` in place from a rewritten weightless copy made by :func:`strip_weights`.

    ``model`` takes the skeleton's ``ir_version``, ``opset_import``, nodes, graph inputs (minus
    ``moved``), outputs, value_info and small initializers (new ones are added, same-named ones
    replaced); its large initializers and its local functions are kept.

    Parameters
    ----------
    model : onnx.ModelProto
        The original model, updated in place.
    skeleton : onnx.ModelProto
        The rewritten skeleton.
    moved : set of str
        As returned by :func:`strip_weights`.

    Returns
    -------
    onnx.ModelProto
        ``model``.
    """
    model.ir_version = skeleton.ir_version
    del model.opset_import[:]
    model.opset_import.extend(skeleton.opset_import)
    graph, rewritten = model.graph, skeleton.graph
    for field in ("node", "output", "value_info"):
        del getattr(graph, field)[:]
        getattr(graph, field).extend(getattr(rewritten, field))
    del graph.input[:]
    graph.input.extend(value for value in rewritten.input if value.name not in moved)
    small = {tensor.name: tensor for tensor in rewritten.initializer}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name in small:
            del graph.initializer[index]
    graph.initializer.extend(small.values())
    return model


def wants_data_propagation(graph: onnx.GraphProto) -> bool:
    """Whether shape inference should propagate values: only shape arithmetic needs it (values
    computed from ``Shape``/``Size``), and onnx's propagation materializes integer tensors,
    which exhausts memory on large integer inputs (1e8 elements: PrIM's VA and RED)."""
    return any(node.op_type in ("Shape", "Size") for g in iter_graphs(graph) for node in g.node[:])


def _infer_skeleton(skeleton: onnx.ModelProto, strict: bool) -> onnx.ModelProto:
    options = dict(check_type=strict, strict_mode=strict,
                   data_prop=wants_data_propagation(skeleton.graph))
    if skeleton.ByteSize() <= PROTOBUF_LIMIT:
        return onnx.shape_inference.infer_shapes(skeleton, **options)
    with tempfile.TemporaryDirectory(prefix="onnx_cinm_shapes_") as folder:
        source, target = os.path.join(folder, "in.onnx"), os.path.join(folder, "out.onnx")
        save_model(skeleton, source, external_data_threshold_bytes=0)
        onnx.shape_inference.infer_shapes_path(source, target, **options)
        return onnx.load_model(target, load_external_data=False)


def _add_missing_ranks(graph: onnx.GraphProto) -> bool:
    """Give a rank to Reshape/Expand outputs that onnx left without a shape; True if any.

    onnx infers nothing for ``Reshape(x, shape)`` and ``Expand(x, shape)`` when ``shape`` is
    computed at run time from symbolic dimensions (e.g. ``Concat(Shape(x)[:2], [-1])``), although
    the output rank is the length of ``shape`` (for Expand at least the rank of ``x``).
    """
    infos = {v.name: v for v in graph.input[:] + graph.value_info[:] + graph.output[:]}
    tensors = {t.name: t for t in graph.initializer}

    def static_dims(name: str) -> list[int] | None:
        if name in tensors:
            return list(tensors[name].dims)
        tensor_type = infos[name].type.tensor_type if name in infos else None
        if tensor_type is None or not tensor_type.HasField("shape"):
            return None
        dims = tensor_type.shape.dim
        return [d.dim_value for d in dims] if all(d.HasField("dim_value") for d in dims) else None

    added = False
    for node in graph.node:
        if node.op_type not in ("Reshape", "Expand") or node.domain not in _DEFAULT_DOMAINS:
            continue
        output = infos.get(node.output[0])
        if output is not None and output.type.tensor_type.HasField("shape"):
            continue
        target = static_dims(node.input[1])
        if target is None or len(target) != 1:
            continue
        rank = target[0]
        if node.op_type == "Expand":
            data = infos.get(node.input[0])
            if data is None or not data.type.tensor_type.HasField("shape"):
                continue
            rank = max(rank, len(data.type.tensor_type.shape.dim))
        if output is None:
            data = node.input[0]
            if data in tensors:
                elem_type = tensors[data].data_type
            elif data in infos and infos[data].type.tensor_type.elem_type:
                elem_type = infos[data].type.tensor_type.elem_type
            else:
                continue  # unknown element type: leave it to onnx
            output = graph.value_info.add()
            output.CopyFrom(onnx.helper.make_tensor_value_info(node.output[0], elem_type, None))
        for _ in range(rank):
            output.type.tensor_type.shape.dim.add()
        added = True
    return added


#: ``ai.onnx.ml`` ops whose output has its input's shape, and the output element type (None:
#: the input's). onnx registers no shape inference for them, so without this inference stops
#: there and every op downstream (a MatMul after a Scaler) stays on the host.
ML_SHAPE_PRESERVING = {"Scaler": onnx.TensorProto.FLOAT, "Normalizer": onnx.TensorProto.FLOAT,
                       "Binarizer": None, "Imputer": None}


def _add_ml_shapes(graph: onnx.GraphProto) -> bool:
    """Type the outputs of :data:`ML_SHAPE_PRESERVING` nodes onnx left untyped (the input's
    shape, the op's element type); True if any."""
    infos = {v.name: v for v in graph.input[:] + graph.value_info[:] + graph.output[:]}
    added = False
    for node in graph.node:
        if node.domain != "ai.onnx.ml" or node.op_type not in ML_SHAPE_PRESERVING:
            continue
        src, out = infos.get(node.input[0]), infos.get(node.output[0])
        if src is None or not src.type.tensor_type.elem_type:
            continue
        if out is not None and out.type.tensor_type.HasField("shape"):
            continue
        elem = ML_SHAPE_PRESERVING[node.op_type] or src.type.tensor_type.elem_type
        typed = onnx.helper.make_tensor_value_info(node.output[0], elem, None)
        if src.type.tensor_type.HasField("shape"):
            typed.type.tensor_type.shape.CopyFrom(src.type.tensor_type.shape)
        if out is None:
            graph.value_info.add().CopyFrom(typed)
        else:  # a graph output declared without a shape
            out.type.CopyFrom(typed.type)
        infos[node.output[0]] = typed
        added = True
    return added


def infer_shapes(model: onnx.ModelProto, strict: bool = True) -> onnx.ModelProto:
    """Run onnx shape inference (with data propagation) and store the result in ``model``.

    Fills ``graph.value_info`` (and the value_info of subgraphs), and refines the types of the
    graph outputs. Where onnx gives up on a ``Reshape``/``Expand`` whose target shape is
    computed at run time, the output gets its rank (unknown dimensions), and the outputs of
    shape-preserving ``ai.onnx.ml`` ops (:data:`ML_SHAPE_PRESERVING`) their input's shape; then
    inference runs again, so shapes keep flowing downstream. Works on a weightless copy (:func:`strip_weights`),
    so the cost does not grow with the size of the weights; if even that copy exceeds 2 GiB, it
    goes through ``onnx.shape_inference.infer_shapes_path`` in a temporary folder.

    Parameters
    ----------
    model : onnx.ModelProto
        Updated in place.
    strict : bool, optional
        Raise on inconsistencies (``strict_mode`` and ``check_type``) instead of leaving the
        affected shapes unknown.

    Returns
    -------
    onnx.ModelProto
        ``model``.

    Raises
    ------
    CinmError
        Shape inference failed (only when ``strict``), with onnx's first message line.
    """
    skeleton, moved = strip_weights(model)
    weights = {t.name: t.dims[:] for t in model.graph.initializer[:] if t.name in moved}
    try:
        inferred = _infer_skeleton(skeleton, strict)
        while True:
            ranks = _add_missing_ranks(inferred.graph)
            ks = k_from_constants(inferred.graph, weights)
            if not (_add_ml_shapes(inferred.graph) or ranks or ks):
                break
            inferred = _infer_skeleton(inferred, strict)
    except (
        onnx.shape_inference.InferenceError,
        onnx.checker.ValidationError,
        RuntimeError,
    ) as error:
        raise CinmError(f"shape inference failed: {_first_line(error)}") from None
    return restore_weights(model, inferred, moved)


def _plain_static(value: onnx.ValueInfoProto) -> bool:
    """Whether ``value`` is what onnx shape inference writes for a tensor whose element type
    and every dim it knows: a name and a tensor type of element type and dim values, nothing
    else (no doc string, denotation or dim parameter)."""
    if len(value.ListFields()) != 2 or len(value.type.ListFields()) != 1:
        return False
    tensor_type = value.type.tensor_type
    if len(tensor_type.ListFields()) != 2 or not tensor_type.elem_type:
        return False
    for dim in tensor_type.shape.dim[:]:  # dim_value set (so no dim_param), no denotation
        if not dim.HasField("dim_value") or dim.denotation:
            return False
    return True


def keep_inferred_types(model: onnx.ModelProto) -> bool:
    """Leave ``model`` as ``infer_shapes(model, strict=False)`` after ``del
    model.graph.value_info[:]`` would, without the inference, when its value_info already
    holds what that inference gives; True if so, else False and ``model`` is unchanged.

    It holds when the caller knows every entry to be current (the passes' tensor infos of this
    very graph: :meth:`onnx_cinm.passes.PassContext.infos_current`) and its own (written by
    inferences and analysis from a graph without value_info: an entry the model was loaded
    with, an exporter's or a trace's, is kept by every inference as it is, wrong or sized
    where a fresh inference leaves a dim open, and so are the types inferred from it;
    :func:`onnx_cinm.pipeline.optimize` infers afresh then), and each is one inference
    writes for a tensor it sizes in full (:func:`_plain_static`): then every main-graph node
    output but the graph outputs has such an entry, the graph outputs are typed the same way,
    no node has a body, and none is a ``Shape`` or ``Size``: without them no shape arithmetic
    is folded by the passes' analysis beyond onnx's inference
    (:func:`onnx_cinm.anonymous_dims.size_anonymous_dims` folds only with data propagation on,
    :func:`wants_data_propagation`), so no entry is sized where a fresh inference would leave
    a dim anonymous. A fresh inference then gives the same types (it keeps typed graph
    outputs; the rank, ``ai.onnx.ml`` and reduction-length fix-ups of :func:`infer_shapes` only
    fill open dims), so what remains of it is done here: value_info in node-output order
    without the entries of tensors no node writes, and the small initializers
    (:func:`strip_weights`' threshold) after the large ones, as :func:`restore_weights` leaves
    them. That whole-graph inference was 45 ms of light DenseNet121's optimize (a Python
    callback per cinm node, the model serialized both ways)."""
    graph = model.graph
    if not all(_plain_static(v) for v in graph.output):
        return False
    outputs = {v.name for v in graph.output}
    entries = {}
    for value in graph.value_info:
        if value.name in entries:  # the first would win in a lookup, inference writes one
            return False
        entries[value.name] = value
    order = []
    for node in graph.node[:]:
        # a cinm op declares no graph attribute (its schema): its many plan attributes unread
        if node.op_type in ("Shape", "Size") or node.domain != "cinm" and subgraphs(node):
            return False
        for name in node.output[:]:
            if not name or name in outputs:
                continue
            value = entries.pop(name, None)
            if value is None or not _plain_static(value):
                return False
            order.append(value)
    # in node-output order, without entries of tensors no node writes (inference writes none)
    if len(graph.value_info) != len(order) or \
            any(a.name != b.name for a, b in zip(graph.value_info, order)):
        ordered = [onnx.ValueInfoProto() for _ in order]
        for copy, value in zip(ordered, order):
            copy.CopyFrom(value)
        del graph.value_info[:]
        graph.value_info.extend(ordered)
    small = {t.name: t for t in graph.initializer if _tensor_elements(t) <= WEIGHTLESS_MAX_ELEMENTS}
    if small:  # what restore_weights does with the skeleton's (copies of the) small ones
        moved = list(small.values())
        for index, tensor in enumerate(moved):
            moved[index] = onnx.TensorProto()
            moved[index].CopyFrom(tensor)
        for index in reversed(range(len(graph.initializer))):
            if graph.initializer[index].name in small:
                del graph.initializer[index]
        graph.initializer.extend(moved)
    return True


def k_from_constants(graph: onnx.GraphProto, weights: dict | None = None) -> bool:
    """Give a matrix product's activation its reduction length from the constant operand
    (``MatMul(x, W[K, N])``: x's last dim is K; ``Gemm`` likewise, with ``transA``/``transB``;
    the cinm dialect's ``Gemm(A[..., M, K], B[K, N])``) where shape inference left it
    anonymous; True if any was set. ``weights``: ``{name: dims}`` of constants moved out of
    ``graph`` (:func:`strip_weights`). Used by :func:`infer_shapes` and by
    :func:`onnx_cinm.anonymous_dims.size_anonymous_dims`; ``graph`` is changed in place."""
    infos = {v.name: v for v in graph.input[:] + graph.value_info[:]}
    weights = {**(weights or {}), **{t.name: t.dims[:] for t in graph.initializer[:]}}
    changed = False
    for node in graph.node[:]:
        if not (node.domain in _DEFAULT_DOMAINS and node.op_type in ("MatMul", "Gemm")
                or node.domain == "cinm" and node.op_type == "Gemm"):
            continue
        if len(node.input) < 2 or node.input[1] not in weights or node.input[0] not in infos:
            continue
        w = weights[node.input[1]]
        if len(w) != 2:
            continue
        tensor_type = infos[node.input[0]].type.tensor_type
        if not tensor_type.HasField("shape") or not tensor_type.shape.dim:
            continue
        # the attributes only of a product whose activation lacks the dim (every product of
        # a static model has it: the final inference of DenseNet121 read 121 nodes' for nothing)
        trans = {a.name: a.i for a in node.attribute if a.name in ("transA", "transB")} \
            if node.op_type == "Gemm" else {}
        dims = tensor_type.shape.dim
        dim = dims[0] if trans.get("transA", 0) else dims[-1]
        if not dim.HasField("dim_value"):
            dim.dim_value = w[1] if trans.get("transB", 0) else w[0]  # clears the dim_param
            changed = True
    return changed


def check_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict:
    """Check ``shapes`` (``{input name: dims}``, ``--overwrite-input-shape``) against
    ``model``'s graph inputs without changing it; returns ``{name: ValueInfoProto}`` of its
    inputs (initializers are not inputs here).

    Raises:
        CinmError: a name is not a graph input, a rank differs from the input's declared
            rank, or a dimension is not positive.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = {value.name: value for value in model.graph.input if value.name not in initializers}
    for name, dims in shapes.items():
        if name not in inputs:
            raise CinmError(
                f"--overwrite-input-shape: the model has no input '{name}' "
                f"(inputs: {', '.join(inputs) or 'none'})"
            )
        tensor_type = inputs[name].type.tensor_type
        if tensor_type.HasField("shape") and len(tensor_type.shape.dim) != len(dims):
            raise CinmError(
                f"--overwrite-input-shape: input '{name}' has rank {len(tensor_type.shape.dim)}, "
                f"got {len(dims)} dimensions"
            )
        if any(int(d) <= 0 for d in dims):
            raise CinmError(f"--overwrite-input-shape: dimensions of '{name}' must be positive")
    return inputs


def overwrite_input_shapes(
    model: onnx.ModelProto, shapes: dict[str, list[int]]
) -> onnx.ModelProto:
    """Bake static dimensions into graph inputs (onnxsim's ``--overwrite-input-shape``).

    The intermediate value_info is dropped and the output dimensions are made unknown (their
    rank is kept), since both may have been computed from the old input shapes; run
    :func:`infer_shapes` afterwards to refill them.

    Parameters
    ----------
    model : onnx.ModelProto
        Updated in place.
    shapes : dict of str to list of int
        Input name -> new dimensions (all positive), e.g. ``{"x": [1, 3, 224, 224]}``.

    Returns
    -------
    onnx.ModelProto
        ``model``.

    Raises
    ------
    CinmError
        A name is not a graph input (initializers are not inputs here), a rank differs from the
        input's declared rank, or a dimension is not positive.
    """
    inputs = check_input_shapes(model, shapes)
    for name, dims in shapes.items():
        tensor_type = inputs[name].type.tensor_type
        tensor_type.shape.Clear()
        for d in dims:
            tensor_type.shape.dim.add().dim_value = int(d)
    del model.graph.value_info[:]
    for output in model.graph.output:
        for dim in output.type.tensor_type.shape.dim:
            dim.Clear()
    return model


def parse_shape_spec(text: str) -> tuple[str, list[int]]:
    """Parse a CLI shape spec ``name:d0,d1,...`` (e.g. ``data_0:1,3,224,224``).

    The name is everything before the *last* colon, so names such as ``input:0`` work.

    Parameters
    ----------
    text : str
        The spec.

    Returns
    -------
    name : str
    dims : list of int

    Raises
    ------
    CinmError
        No colon, an empty name or an empty/non-integer/non-positive dimension.
    """
    name, colon, dims_text = text.rpartition(":")
    if not colon or not name:
        raise CinmError(f"bad shape spec '{text}': expected name:d0,d1,... e.g. x:1,3,224,224")
    try:
        dims = [int(part) for part in dims_text.split(",")]
    except ValueError:
        raise CinmError(f"bad shape spec '{text}': dimensions must be integers") from None
    if any(d <= 0 for d in dims):
        raise CinmError(f"bad shape spec '{text}': dimensions must be positive")
    return name, dims


#: ``metadata_props`` key of the sizes of symbolic dimensions a model was planned for: a JSON
#: object ``{"name": size}``. ``optimize --dim`` writes it; planning, FLOPs, ``run`` and
#: ``compare`` read it, so a model is sized the same way at every step.
PLANNED_DIMS_KEY = "onnx_cinm.planned_dims"

#: ``metadata_props`` key of the sizes of the symbolic dims onnx-cinm named itself inside If
#: branches (a captured value whose shape the outer graph's inference does not know, sized by
#: a probe run; a dim of a branch tensor that inference leaves anonymous without the planned
#: sizes: :mod:`onnx_cinm.passes.control_flow`), a JSON object like
#: :data:`PLANNED_DIMS_KEY`'s. Tensor infos bind them as planned sizes; they are no input's
#: dims, so nothing else reads them.
BRANCH_DIMS_KEY = "onnx_cinm.branch_dims"

#: ``metadata_props`` key of the shapes a *probe* (one onnxruntime run of the model at its
#: planned sizes, :func:`onnx_cinm.passes.control_flow.probe`) saw for the main graph's tensors
#: whose shape onnx's inference leaves open even at those sizes (a ``Pad`` whose pads are
#: computed from ``Shape(x)``, the outputs of a contrib op onnx has no schema for): a JSON object
#: ``{tensor name: [element type, d0, d1, ...]}``. Tensor infos at the planned sizes take them
#: (:func:`onnx_cinm.analysis.tensor_infos`), so FLOPs and plans see real sizes; the graph keeps
#: its symbolic shapes, so the model still runs at other sizes.
PROBED_SHAPES_KEY = "onnx_cinm.probed_shapes"

#: ``metadata_props`` key of the branches the planning probe saw the model's If nodes take
#: (:mod:`onnx_cinm.passes.control_flow`): a JSON object ``{If node name: true (then) | false
#: (else)}``. The report counts those branches in its per-inference totals; an If it does not
#: name counts both of its branches (an upper bound).
IF_TAKEN_KEY = "onnx_cinm.if_taken"

#: ``metadata_props`` key: why ``optimize`` could not check the model it wrote against the
#: original (the check was skipped: the original does not run on the inputs drawn), a JSON
#: string; absent when the check ran or was turned off (``--check 0``). ``report`` and ``run``
#: say so: the model written carries no record of a check otherwise.
CHECK_SKIPPED_KEY = "onnx_cinm.check_skipped"

#: ``metadata_props`` key of :func:`source_digest` of the model ``optimize`` was given (kept
#: through a re-optimization: the first original's), so that ``compare`` can tell an original
#: from another model before comparing numbers.
SOURCE_DIGEST_KEY = "onnx_cinm.source_sha256"


def source_digest(model: onnx.ModelProto) -> str | None:
    """A SHA-256 (64 hex digits) of what makes ``model`` this model: the element types and
    names of the graph's inputs and outputs, every node (type, domain, input and output names,
    attributes, subgraphs included; not its name) and every initializer's name, type, dims and
    values (however they are stored: raw bytes or typed fields). Metadata, names of nodes,
    doc strings, value infos and the inputs' shapes (``--overwrite-input-shape`` rewrites
    them) do not count. None when an initializer's data is external and not loaded."""
    import hashlib

    from onnx import numpy_helper

    h = hashlib.sha256()
    g = model.graph
    # the graph's parts hashed in one update (the same digest: SHA-256 reads one stream),
    # not one call per node and attribute
    parts = [f"{vi.name}\0{vi.type.tensor_type.elem_type}\0".encode() for vi in g.input[:] + g.output[:]]
    for node in g.node[:]:  # slices: see subgraphs
        parts.append(f"{node.op_type}\0{node.domain}\0{node.input[:]}\0{node.output[:]}\0"
                     .encode())
        parts.extend(a.SerializeToString(deterministic=True) for a in node.attribute[:])
    h.update(b"".join(parts))
    del parts
    for t in g.initializer[:]:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        h.update(f"{t.name}\0{t.data_type}\0{t.dims[:]}\0".encode())
        if t.data_type == onnx.TensorProto.STRING:  # an object array's bytes are pointers
            for v in t.string_data:
                h.update(len(v).to_bytes(8, "little"))
                h.update(v)
        elif t.raw_data:  # as stored: no array copy (a VGG's 574 MB hash in ~0.35 s)
            h.update(t.raw_data)
        else:  # typed fields: the same little-endian bytes raw_data would hold
            h.update(numpy_helper.to_array(t).tobytes())
    return h.hexdigest()


def recorded_source(model: onnx.ModelProto) -> str | None:
    """The :data:`SOURCE_DIGEST_KEY` ``model`` records (an optimized model), or None."""
    return next((p.value for p in model.metadata_props if p.key == SOURCE_DIGEST_KEY), None)


def set_recorded_source(model: onnx.ModelProto, digest: str | None) -> None:
    """Record ``digest`` under :data:`SOURCE_DIGEST_KEY` in ``model`` (in place), replacing an
    earlier record; None removes it."""
    keep = [p for p in model.metadata_props if p.key != SOURCE_DIGEST_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if digest is not None:
        model.metadata_props.add(key=SOURCE_DIGEST_KEY, value=digest)


#: Largest size accepted for one symbolic dimension (a size is a tensor extent: int32 range).
_MAX_DIM = 2**31 - 1


def planned_dims(model: onnx.ModelProto, key: str = PLANNED_DIMS_KEY) -> dict[str, int]:
    """The symbolic-dimension sizes recorded in ``model`` (see :data:`PLANNED_DIMS_KEY`; with
    ``key`` :data:`BRANCH_DIMS_KEY`, the dims named inside If branches).

    Returns:
        ``{dim name: size}``; empty if the model records none.

    Raises:
        CinmError: the record is not a JSON object of names to positive integers (a model file
            is untrusted input).
    """
    return _dims_record(model, key)


def _input_dim_names(model: onnx.ModelProto) -> set[str]:
    """The symbolic dim names of ``model``'s graph inputs (initializers excluded)."""
    consts = {t.name for t in model.graph.initializer}
    return {d.dim_param for vi in model.graph.input if vi.name not in consts
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def batch_note(model: onnx.ModelProto, dims: dict[str, int]) -> str:
    """What one inference is when ``dims`` (``{dim name: size}``, the planned sizes) sizes a
    symbolic dim of a graph input above 1 (a batch, a sequence): ``"per inference: ..."``,
    every per-inference figure being for one run at those sizes, and not per sample when one
    of them is an input's batch axis: by the usual layouts its first, or its second for the
    time-major X of an ONNX LSTM, GRU or RNN (a heuristic: an audio clip's ``samples`` dim on
    axis 1 is its length, where a trial's batch-1 mel front end read "not per sample"); ''
    when no input's dim is planned above 1."""
    named = _input_dim_names(model)
    sized = {k: v for k, v in dims.items() if k in named and v > 1}
    if not sized:
        return ""
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(sized.items()))
    consts = {t.name for t in model.graph.initializer}
    # the batch axis, by the usual layouts: the first, but the second of an input an ONNX
    # LSTM/GRU/RNN reads as its time-major X (layout 0: [seq, batch, input])
    time_major = {n.input[0] for n in model.graph.node if is_recurrent(n) and n.input
                  and not recurrent_layout(n)}
    batch_dims = set()
    for vi in model.graph.input:
        dims_ = vi.type.tensor_type.shape.dim
        axis = 1 if vi.name in time_major else 0
        if vi.name not in consts and len(dims_) > axis:
            batch_dims.add(dims_[axis].dim_param)
    batch = ", not per sample" if batch_dims & set(sized) else ""
    return (f"per inference: one run of the model at {sizes}: every per-inference figure "
            f"(latency, energy, tile writes, wear) is for the whole run{batch}")


def unsized_note(model: onnx.ModelProto, dims: dict[str, int]) -> str:
    """What the figures of ``model`` take for its inputs' symbolic dims that ``dims`` (the
    planned sizes) does not size: ``"the figures take T as 1 ..."``; '' when every one is
    sized."""
    open_ = sorted(_input_dim_names(model) - set(dims))
    if not open_:
        return ""
    # a dim shape inference cannot size without the input's counts 1 too, not its size at 1
    # (a tf2onnx BERT's 32 tokens a row: 1.67 MFLOP planned unsized, 14.2 at --dim ...=1);
    # whether there are such dims, optimize's summary says ("dims left unsized")
    return (f"the figures take {', '.join(open_)} as 1: the model was planned without "
            f"{'its size' if len(open_) == 1 else 'their sizes'}; optimize --dim "
            f"{open_[0]}=SIZE plans at a size (if optimize named dims left unsized, --dim "
            f"{open_[0]}=1 sizes them too: unsized, they count 1 as well)")


def _json_record(model: onnx.ModelProto, key: str, valid: Callable[[object], bool],
                 expected: str):
    """The JSON value under metadata ``key`` (None if absent), which ``valid`` must accept;
    CinmError ``... is malformed: expected <expected>`` otherwise (a model file is untrusted
    input)."""
    import json

    text = next((p.value for p in model.metadata_props if p.key == key), None)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not valid(value):
        raise CinmError(f"the model's metadata '{key}' is malformed: expected {expected}")
    return value


def _set_json_record(model: onnx.ModelProto, key: str, value) -> None:
    """Record ``value`` as JSON under metadata ``key``, replacing any earlier record; an empty
    ``value`` removes it (in place)."""
    import json

    keep = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if value:
        model.metadata_props.add(key=key, value=json.dumps(value))


def _dims_record(model: onnx.ModelProto, key: str) -> dict[str, int]:
    """The ``{dim name: size}`` JSON object under metadata ``key`` ({} if absent); CinmError if
    it is malformed."""
    return _json_record(model, key, lambda d: isinstance(d, dict) and all(
        isinstance(k, str) and k and type(v) is int and 1 <= v <= _MAX_DIM for k, v in d.items()),
        "a JSON object of dimension names to positive integers") or {}


def _set_dims_record(model: onnx.ModelProto, key: str, dims: dict[str, int]) -> None:
    _set_json_record(model, key, dict(sorted(dims.items())))


#: ``metadata_props`` key of the symbolic dimensions whose planned size the compiled graph
#: bakes in (a recurrence unrolled over a sequence sized by ``--dim``: one ``Split`` output per
#: step): a JSON object ``{"name": size}``. The execution provider refuses other sizes of them
#: with a one-line error instead of the ``Split`` failing inside onnxruntime.
UNROLLED_DIMS_KEY = "onnx_cinm.unrolled_dims"


def unrolled_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The dims ``model`` was unrolled for (see :data:`UNROLLED_DIMS_KEY`): ``{dim name: size}``,
    empty if none. Raises CinmError if the record is malformed."""
    return _dims_record(model, UNROLLED_DIMS_KEY)


def check_unrolled_size(fixed: dict[str, int], dim: str, size: int, given: str, label: str,
                        original: bool = False) -> None:
    """Raise a one-line CinmError when ``size`` is not the size ``dim`` was unrolled for
    (``fixed``, :func:`unrolled_dims` of the model): its ``Split`` would fail inside
    onnxruntime. ``given`` says where ``size`` came from (``"input 'X'"``, ``"--dim"``),
    ``label`` names the model (``"model 'gru.onnx'"``); ``original``: the advice is to
    re-optimize the original model, not this one (``optimize`` given an unrolled model). A dim
    not in ``fixed`` passes at any size."""
    want = fixed.get(dim)
    if want is not None and size != want:
        again = "re-optimize the original model" if original else "re-optimize"
        raise CinmError(f"{label} was unrolled for {dim}={want} ({given} has {dim}={size}); "
                        f"{again} with --dim {dim}={size}, or without sizing {dim} to keep its "
                        "steps in a Scan that runs at any length")


def add_unrolled_dims(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    """Add ``dims`` (``{dim name: size}``) to the record of the dims ``model``'s graph was
    unrolled for (in place); an empty ``dims`` changes nothing."""
    if dims:
        _set_dims_record(model, UNROLLED_DIMS_KEY, {**unrolled_dims(model), **dims})


def set_planned_dims(model: onnx.ModelProto, dims: dict[str, int],
                     key: str = PLANNED_DIMS_KEY) -> None:
    """Record ``dims`` (``{dim name: size}``) as the sizes ``model`` is planned for (under
    ``key``, see :func:`planned_dims`), replacing any earlier record; an empty ``dims`` removes
    it. ``model`` is changed in place."""
    _set_dims_record(model, key, dims)


def if_taken(model: onnx.ModelProto) -> dict[str, bool]:
    """The If branches the planning probe saw taken (see :data:`IF_TAKEN_KEY`): ``{If node
    name: True for then, False for else}``; empty if the model records none.

    Raises:
        CinmError: the record is not a JSON object of names to booleans (a model file is
            untrusted input).
    """
    return _json_record(model, IF_TAKEN_KEY, lambda t: isinstance(t, dict) and all(
        isinstance(k, str) and isinstance(v, bool) for k, v in t.items()),
        "a JSON object of If node names to true or false") or {}


def probed_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The shapes the planning probe saw (see :data:`PROBED_SHAPES_KEY`): ``{tensor name:
    (onnx element type, dims)}``; empty if the model records none.

    Raises:
        CinmError: the record is not a JSON object of names to lists of non-negative integers
            (a model file is untrusted input).
    """
    record = _json_record(model, PROBED_SHAPES_KEY, lambda r: isinstance(r, dict) and all(
        isinstance(k, str) and k and isinstance(v, list) and v
        and all(type(d) is int and 0 <= d <= _MAX_DIM for d in v) for k, v in r.items()),
        "a JSON object of tensor names to [element type, dims...]") or {}
    return {k: (v[0], tuple(v[1:])) for k, v in record.items()}


def set_probed_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, tuple[int, ...]]]) -> None:
    """Record ``shapes`` (``{tensor name: (onnx element type, dims)}``, see
    :data:`PROBED_SHAPES_KEY`) in ``model``, replacing any earlier record; an empty ``shapes``
    removes it. In place."""
    _set_json_record(model, PROBED_SHAPES_KEY,
                     {k: [int(t), *map(int, d)] for k, (t, d) in sorted(shapes.items())})


def set_check_skipped(model: onnx.ModelProto, reason: str | None) -> None:
    """Record why the check of ``model`` was skipped (:data:`CHECK_SKIPPED_KEY`), replacing any
    earlier record; None removes it. In place."""
    _set_json_record(model, CHECK_SKIPPED_KEY, reason or None)


def check_skipped(model: onnx.ModelProto) -> str | None:
    """Why ``optimize`` could not check ``model`` (:data:`CHECK_SKIPPED_KEY`): the recorded
    reason, its non-printable characters escaped and cut at 400 characters, or None. Raises
    CinmError if the record is not a JSON string (a model file is untrusted input)."""
    from .text import printable

    value = _json_record(model, CHECK_SKIPPED_KEY, lambda v: isinstance(v, str), "a string")
    return printable(value)[:400] if value else None


def set_if_taken(model: onnx.ModelProto, taken: dict[str, bool]) -> None:
    """Record ``taken`` (``{If node name: condition}``, see :data:`IF_TAKEN_KEY`) in ``model``,
    replacing any earlier record; an empty ``taken`` removes it. In place."""
    _set_json_record(model, IF_TAKEN_KEY, {k: bool(v) for k, v in sorted(taken.items())})


def bind_dims(graph: onnx.GraphProto, dims: dict[str, int]) -> None:
    """Replace every symbolic dimension named in ``dims`` by its size, in the declared types of
    ``graph``'s inputs, outputs and value_info, and of its subgraphs' (in place)."""
    for node in graph.node[:]:
        for sub in subgraphs(node):
            bind_dims(sub, dims)
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
