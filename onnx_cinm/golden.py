"""The golden check: does the optimized model compute what the original computes?

The oracle is stock onnxruntime on the CPU with **all graph optimizations disabled**
(``ORT_DISABLE_ALL``): ORT's own fusions have produced silently wrong numbers before (e.g.
GemmTransposeFusion, microsoft/onnxruntime#32228), and we want to compare *our* rewrite, not
ORT's. Both models are run on the same input sets and their outputs are compared by name.

Public API
----------
random_inputs(model, *, seed=0, dims=None, shapes=None, fill="random") -> dict[str, ndarray]
run_onnxruntime(model_or_path, feeds) -> list[ndarray]
compare(reference, candidate, *, n=1, rtol=None, atol=None, seed=0, dims=None, shapes=None,
        fill="random", feeds=None) -> CheckReport
compare_special(reference, candidate, *, n=1, ...) -> CheckReport | None   (NaN/Inf inputs)
compare_stepwise(reference, candidate, input_sets) -> StepwiseCheck | None  (QDQ, tensor by tensor)
default_tolerance(dtype) -> (rtol, atol)

Tolerances follow ``numpy.allclose`` with the *reference* as ``b``:
``|candidate - reference| <= atol + rtol * |reference|``. Unless given, they follow each
output's dtype (:func:`default_tolerance`): onnxsim's ``--check-rtol/--check-atol`` defaults
(rtol 1e-4, atol 1e-5) for float32 and float64, widened to :data:`TOLERANCE_ULPS` units in the
last place at magnitude 1 (``ULPS * eps``) for coarser floats: float16 gets rtol = atol =
4 * 2**-10 = 0.0039, because a rewrite that only reorders or folds float16 arithmetic (BatchNorm
into Conv, Gemm's alpha into B) moves results by an ulp or two, and 1e-4 is far below float16's
resolution (0.00098 at 1).
"""
from __future__ import annotations

import functools
import itertools
import os
import re
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence, Union

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import TensorProto

from . import quantref
from .errors import CheckFailed, CinmError, ReferenceFailed
from .frontend import is_recurrent, iter_graphs, recurrent_layout, subgraphs
from .text import progress_bar
# re-exported: the tolerances are the check's public names
from .tolerance import DEFAULT_ATOL, DEFAULT_RTOL, TOLERANCE_ULPS, default_tolerance  # noqa: F401

if TYPE_CHECKING:
    from .checkreport import CheckReport, NodeCheck, OutputCheck, StepwiseCheck

ModelLike = Union[onnx.ModelProto, str, os.PathLike, bytes]

__all__ = [
    "random_inputs",
    "index_ranges",
    "run_onnxruntime",
    "compare",
    "CheckReport",
    "OutputCheck",
    "DEFAULT_FIRST_DIM",
    "DEFAULT_OTHER_DIM",
    "default_tolerance",
    "compare_special",
    "compare_stepwise",
    "StepwiseCheck",
    "onnxruntime_self_difference",
    "lowered_nan_squashers",
]

#: The check's results, re-exported from :mod:`onnx_cinm.checkreport` on first use.
_REPORT_NAMES = frozenset({"OutputCheck", "CheckReport", "StepwiseCheck", "MAX_NONFINITE_SHARE"})


def __getattr__(name: str):  # lazy: an optimize run that checks nothing does not load them
    if name in _REPORT_NAMES:
        from . import checkreport

        return getattr(checkreport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Size given to an unknown/symbolic first axis (the batch axis, by convention).
DEFAULT_FIRST_DIM = 1
#: Size given to any other unknown/symbolic axis.
DEFAULT_OTHER_DIM = 8

# ONNX element type -> numpy dtype, for the element types we can feed through ORT's Python API.
_FEEDABLE: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
    TensorProto.STRING: np.dtype(object),
}

_FILLS = ("random", "arange", "ones", "zeros", "special")
#: Share of the elements of a float input the ``special`` fill sets to NaN, +Inf and -Inf.
SPECIAL_SHARE = 0.1


#: Multiple of the expected accumulation error a default absolute tolerance allows (see
#: :func:`accumulation_atol`): the largest of many roughly Gaussian errors is a few sigma.
ACCUMULATION_SIGMAS = 4


def reduction_length(model: ModelLike, dims: Mapping[str, int] | None = None) -> int:
    """The longest reduction in ``model``'s main graph: the K of MatMul/Gemm (and their integer
    forms), C/group x prod(kernel) of Conv, the reduced extent of Reduce*, and T x (input size
    + hidden size) of an LSTM, GRU or RNN over T steps (its state is a running sum over the
    steps of terms that are each a length-(I + H) product: the rounding of T steps adds up as
    that of one sum of T (I + H) terms; a trial's 300-step LSTM encoder was 9.5e-4 off where
    onnxruntime's own float32 LSTM is 4.7e-4 off a float64 one, over an atol widened for
    K = 512 only); 1 if there is none or the shapes are unknown (symbolic dims count as their
    size in ``dims``, e.g. the sizes of the arrays compared, else their planned size, else 1)."""
    from .analysis import tensor_infos  # the check needs it only here

    proto = _load_header(model)
    try:
        infos = tensor_infos(proto, dims=dims) if dims else tensor_infos(proto)
    except CinmError:
        return 1
    longest = 1
    for node in proto.graph.node[:]:
        ins = [infos.get(n) for n in node.input[:]]
        k = 1
        if node.op_type in ("MatMul", "MatMulInteger", "Gemm", "QLinearMatMul") and ins and ins[0] \
                and ins[0].shape:
            a = ins[0].static_shape
            trans_a = next((x.i for x in node.attribute[:] if x.name == "transA"), 0)
            k = a[0] if node.op_type == "Gemm" and trans_a else a[-1]
        elif node.op_type in ("Conv", "ConvInteger", "ConvTranspose", "QLinearConv"):
            w = ins[3] if node.op_type == "QLinearConv" and len(ins) > 3 else (ins[1] if len(ins) > 1 else None)
            if w is not None and w.shape:
                k = int(np.prod(w.static_shape[1:]))
        elif node.op_type.startswith("Reduce") and ins and ins[0] and ins[0].shape and node.output \
                and infos.get(node.output[0]) is not None:
            k = max(1, ins[0].numel // max(1, infos[node.output[0]].numel))
        elif is_recurrent(node) and len(ins) > 2 \
                and all(t is not None and t.shape for t in ins[:3]):
            steps = ins[0].static_shape[1 if recurrent_layout(node) else 0]
            k = steps * (ins[1].static_shape[-1] + ins[2].static_shape[-1])
        longest = max(longest, int(k))
    return longest


def accumulation_atol(ref: np.ndarray, k: int) -> float:
    """An absolute tolerance for float outputs that went through a reduction of length ``k``:
    ``ACCUMULATION_SIGMAS * eps * sqrt(k) * rms(ref)``.

    Two correct programs summing the same ``k`` terms in different orders (our tiled crossbar
    product, onnxruntime's blocked GEMM) differ by rounding: with the terms' rounding errors
    independent, the error of a length-``k`` sum grows like ``sqrt(k) * u`` times the size of the
    partial sums (Higham and Mary, "A new approach to probabilistic rounding error analysis",
    SIAM J. Sci. Comput. 41(5), 2019), and those are about the size of the outputs (their root
    mean square). An element that cancels to near zero therefore carries an absolute error of
    that size, which a fixed ``atol`` (1e-5) cannot cover at large ``k``; a relative tolerance
    does not help there either. Finite elements only; 0 for an empty or all-NaN output.
    """
    finite = ref[np.isfinite(ref)]
    if k <= 1 or not finite.size:
        return 0.0
    rms = float(np.sqrt(np.mean(np.square(finite, dtype=np.float64))))
    return ACCUMULATION_SIGMAS * float(np.finfo(ref.dtype).eps) * float(np.sqrt(k)) * rms


def _one_line(text: object, limit: int = 300) -> str:
    """First non-empty line of ``text``, shortened to ``limit`` characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else type(text).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def ort_error_line(error: BaseException) -> str:
    """Onnxruntime's run error in one short line: the innermost failing node and its message.

    Onnxruntime prefixes ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :`` and nests
    ``Non-zero status code returned while running <Op> node. Name:'<name>' Status Message:``
    once per enclosing If/Loop/Scan; only the innermost node says what went wrong.
    """
    text = " ".join(str(error).split())
    # the C++ assertion onnxruntime prefixes to its message (``/onnxruntime_src/...h:91 <the
    # function's signature> <condition> was false.``) says nothing to a user: only the sentence after it
    text = re.sub(r"\S+\.(?:h|cc|cpp):\d+ [^.]*? was false\. ", "", text)
    nodes = re.findall(r"running (\w+) node\. Name:'([^']*)' Status Message: ", text)
    if nodes:
        op, name = nodes[-1]
        text = f"{op} node '{name}': {text.rsplit('Status Message: ', 1)[1]}"
    else:
        text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    return _one_line(text)


#: Onnxruntime's run errors that a tensor's *shape* causes, not its values: a Reshape whose
#: element count differs, operands that do not broadcast, a MatMul or Concat dimension
#: mismatch, a kernel, pool window or reflect pad larger than its input, shape inference
#: refusing a shape.
#: Messages as onnxruntime 1.x's CPU kernels word them (``reshape_helper.h``,
#: ``element_wise_ops.h``, ``matmul_helper.h``, ``conv_attributes.h``, ``pool_attributes.h``,
#: ``pad.cc``; the recurrent kernels' "Input W must have shape {1,75,314}. Actual:{1,75,24}"
#: (``deep_cpu_gru.cc``, ``rnn_helpers.cc``); a Conv's input channels against its weight's;
#: the session's own "Got invalid dimensions for input"). Compiled at the first question
#: (:func:`_pattern`), not at import: only a failed run asks, and compiling this alternation
#: was about 5 M instructions of every ``optimize`` (valgrind, this session).
_SHAPE_ERRORS = (
    r"cannot be reshaped|broadcast|dimension mismatch|dimensions? (?:do not|don't) match"
    r"|shape mismatch|mismatch(?:ed)? (?:in )?(?:dimension|shape)|incompatible (?:dimensions|shapes)"
    r"|invalid input shape|invalid expand shape|output dimension is negative|ShapeInferenceError"
    r"|pad\b.*exceeds maximum allowed"
    r"|must have shape|must have \d+ dimensions|num_dims does not match"
    r"|is not equal to kernel channels|invalid dimensions for input")


@functools.cache
def _pattern(text: str) -> re.Pattern:
    """``text`` compiled, ignoring case (once per process)."""
    return re.compile(text, re.IGNORECASE)


def is_shape_error(message: str) -> bool:
    """Whether an onnxruntime run error (``message``: its text, as :func:`compare` and
    :class:`ReferenceFailed` word it) is a *shape* error, caused by the sizes of the inputs and
    not by their values: such a run fails on every input of those sizes.

    The rule is by category of the message (:data:`_SHAPE_ERRORS`): a Reshape to a count of
    elements the input does not have ("cannot be reshaped": a model that hard-codes batch 1),
    operands that do not broadcast, a MatMul/Concat/Split dimension mismatch, an input shorter
    than a Conv kernel, a pool window or a reflect pad ("Invalid input shape", "output
    dimension is negative", "pre-pad exceeds maximum allowed": a model that needs a minimum
    length), onnx shape inference refusing a shape. Anything else
    (an index out of range, a value a kernel rejects) may depend on the values drawn, and is not
    a shape error. A shape computed from an input's *values* (an int64 input read by a
    Reshape) fails in the same category: that input is then better given as data.
    """
    return bool(_pattern(_SHAPE_ERRORS).search(message))


#: Onnxruntime's run errors that mean it ran out of memory: the C++ ``std::bad_alloc``, and
#: its allocator's own refusal (``bfc_arena.cc``/``allocator.cc``: "Failed to allocate memory").
_OUT_OF_MEMORY = r"bad_alloc|Failed to allocate memory"


def is_out_of_memory(message: str) -> bool:
    """Whether an onnxruntime run error (``message``: its text) says it ran out of memory (at
    the sizes of the inputs fed, not because of their values: :data:`_OUT_OF_MEMORY`)."""
    return bool(_pattern(_OUT_OF_MEMORY).search(message))


def input_nbytes(model: ModelLike, dims: Mapping[str, int] | None = None) -> dict[str, int]:
    """Bytes of each real tensor input of ``model`` that :func:`random_inputs` would draw at
    ``dims`` (``{input name: prod(shape) x itemsize}``), computed without allocating anything;
    inputs of unknown rank or of an element type it cannot draw (strings, bfloat16) are left
    out."""
    proto = _load_header(model)
    sizes = dict(dims or {})
    out: dict[str, int] = {}
    for vi in real_inputs(proto.graph):
        tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
        if tt is None or tt.elem_type not in _FEEDABLE or not tt.HasField("shape") \
                or _FEEDABLE[tt.elem_type] == object:
            continue
        shape = _concrete_shape(vi, sizes, None)
        out[vi.name] = int(np.prod(shape, dtype=object)) * np.dtype(_FEEDABLE[tt.elem_type]).itemsize
    return out


def _load_header(model: ModelLike) -> onnx.ModelProto:
    """The model as a ModelProto; external weights are not loaded (only the graph is needed)."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        return onnx.load(os.fspath(model), load_external_data=False)
    except FileNotFoundError:
        raise CinmError(f"model file not found: {os.fspath(model)}") from None
    except Exception as e:  # protobuf DecodeError and friends
        raise CinmError(f"cannot read model {model if not isinstance(model, bytes) else '<bytes>'}: "
                        f"{_one_line(e)}") from None


def real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old IR models list weights as inputs too)."""
    inits = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    return [vi for vi in graph.input if vi.name not in inits]


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
#: Ops an index passes through unchanged on its way to a table lookup.
_INDEX_PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand",
                       "Transpose", "Slice", "Gather", "GatherElements"}

#: Lookups ``(op type, index input position) -> table input position``; the table's axis is the
#: op's ``axis`` attribute (0 by default). EmbedLayerNormalization is onnxruntime's fused BERT
#: embedding (input_ids -> word_embedding, segment_ids -> segment_embedding).
_LOOKUPS = {("Gather", 1): 0, ("GatherElements", 1): 0, ("EmbedLayerNormalization", 0): 2,
            ("EmbedLayerNormalization", 1): 4, ("ScatterElements", 1): 0, ("GatherND", 1): 0}


def index_ranges(model: ModelLike, sizes: Mapping[str, int] | None = None
                 ) -> dict[str, tuple[int, int]]:
    """Valid ranges ``{input name: (low, high)}`` (``high`` exclusive) of the integer inputs
    whose values index something, so random check inputs stay meaningful:

    - an input reaching a lookup (Gather/GatherElements/GatherND indices, ScatterElements
      indices, a OneHot's indices, the ids of onnxruntime's EmbedLayerNormalization), directly
      or through ops that keep its values (Cast, Reshape, Unsqueeze, a Gather of its rows,
      ...): ``(0, table size along the axis)``, the smallest over all its lookups. The table
      is a constant (an embedding's ``token_type_ids`` get ``(0, 2)``) or a computed tensor
      whose size along the axis shape inference gives, as a number or as a symbolic dim that
      ``sizes`` (``{dim name: size}``, the sizes the inputs are drawn at) sizes: a graph
      model's ``edge_index`` into its ``num_nodes`` node features;
    - an input whose name says it is a mask (``attention_mask``, ``mask``): ``(0, 2)``.

    Random integers in [-10, 10] otherwise index outside an embedding or a node table
    (onnxruntime refuses the run) or make an attention mask of large negative values that
    turns every output into NaN.
    """
    proto = _load_header(model)
    g = proto.graph
    sizes = dict(sizes or {})
    table_dims = {t.name: t.dims[:] for t in g.initializer[:]}
    inferred: dict = {}

    def table_size(name: str, axis: int) -> int | None:
        dims = table_dims.get(name)
        if dims is not None:
            return dims[axis] if -len(dims) <= axis < len(dims) and dims[axis] > 0 else None
        if not inferred:  # a computed table: its shape, once, from onnx's shape inference
            try:
                typed = onnx.shape_inference.infer_shapes(proto)
            except Exception:  # noqa: BLE001 - no inferred shapes: no range from them
                typed = proto
            inferred.update({vi.name: vi for vi in [*typed.graph.value_info[:],
                                                    *typed.graph.input[:]]})
            inferred.setdefault("", None)  # inferred once, even with nothing found
        vi = inferred.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        shape = vi.type.tensor_type.shape.dim
        if not -len(shape) <= axis < len(shape):
            return None
        d = shape[axis]
        size = d.dim_value if d.HasField("dim_value") else sizes.get(d.dim_param)
        return size if size and size > 0 else None

    def table_rank(name: str) -> int:
        if name in table_dims:
            return len(table_dims[name])
        table_size(name, 0)  # infers the shapes once
        vi = inferred.get(name)
        return len(vi.type.tensor_type.shape.dim) if vi is not None and \
            vi.type.tensor_type.HasField("shape") else 0

    nodes = g.node[:]  # slices: see rewrite's note on repeated fields
    for node in nodes:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute[:]:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    table_dims[node.output[0]] = a.t.dims[:]
    scalar_values = {t.name: t for t in g.initializer[:] if int(np.prod(t.dims[:], dtype=np.int64)) == 1}
    consumers: dict[str, list] = {}
    for node in nodes:
        for pos, name in enumerate(node.input[:]):
            if name:
                consumers.setdefault(name, []).append((node, pos))
    ranges: dict[str, tuple[int, int]] = {}
    for vi in real_inputs(g):
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if elem not in _FEEDABLE or _FEEDABLE[elem].kind not in "iu":
            continue
        if "mask" in vi.name.lower():
            ranges[vi.name] = (0, 2)
            continue
        high = None
        seen, todo = set(), [vi.name]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, pos in consumers.get(name, []):
                size = None
                if node.op_type in _INDEX_PASS_THROUGH and pos == 0:
                    todo.extend(o for o in node.output if o)
                elif (node.op_type, pos) in _LOOKUPS:
                    table = node.input[_LOOKUPS[(node.op_type, pos)]] \
                        if len(node.input) > _LOOKUPS[(node.op_type, pos)] else ""
                    if node.op_type == "GatherND":  # a tuple over the axes after batch_dims:
                        # each of its values within the smallest of them
                        b = next((a.i for a in node.attribute if a.name == "batch_dims"), 0)
                        sizes_nd = [table_size(table, ax) for ax in range(b, table_rank(table))]
                        size = min(sizes_nd) if sizes_nd and None not in sizes_nd else None
                    else:
                        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                        size = table_size(table, axis) if table else None
                elif node.op_type == "OneHot" and pos == 0 and len(node.input) > 1:
                    depth = scalar_values.get(node.input[1])
                    if depth is not None:
                        size = int(onnx.numpy_helper.to_array(depth).reshape(-1)[0])
                if size:
                    high = size if high is None else min(high, size)
        if high:
            ranges[vi.name] = (0, high)
    return ranges


def random_inputs(
    model: ModelLike,
    *,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    fill: str = "random",
) -> dict[str, np.ndarray]:
    """One input array per real graph input of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto or path or bytes
        The model whose ``graph.input`` is read. Inputs that are also initializers (IR < 4
        style) are skipped: they have a value already. A path is read without its external
        data.
    seed : int
        Seed of the ``numpy.random.default_rng`` generator; the arrays are drawn in graph input
        order, so the same ``(model, seed, dims, shapes)`` always gives the same arrays.
    dims : dict[str, int], optional
        Sizes for symbolic dimensions, by ``dim_param`` name (e.g. ``{"batch": 3}``). A symbolic
        dimension not named here, or a dimension with neither a value nor a name (or a negative
        value, as some exporters write), gets :data:`DEFAULT_FIRST_DIM` (1) on axis 0 and
        :data:`DEFAULT_OTHER_DIM` (8) elsewhere; a name keeps the size of its first use (in
        graph input order) in every later input. Unused names are ignored here (see
        :func:`check_dim_names`).
    shapes : dict[str, list[int]], optional
        Full shape per input name; overrides the declared shape and ``dims`` for that input,
        and sizes its symbolic dims in the other inputs (unless ``dims`` names them).
        Required for an input whose rank is unknown.
    fill : {"random", "arange", "ones", "zeros", "special"}
        ``"random"``: floats standard normal (signed), signed integers uniform in [-10, 10],
        unsigned integers uniform over their range up to 16 bits ([0, 255] for uint8,
        [0, 65535] wider), bool uniform, strings short random words; integer inputs that index
        a table or are masks are drawn within their valid range instead (:func:`index_ranges`).
        ``"arange"``: ``arange(n) / n`` reshaped (float inputs; integers get ``arange(n)``),
        the rule of ``onnx.backend.test.runner`` for the ``light`` models. ``"ones"``/``"zeros"``
        are constant fills. ``"special"``: ``"random"`` with NaN, +Inf and -Inf each at about
        :data:`SPECIAL_SHARE` / 3 of the elements of every float input (at least one of each
        when there is room): the input of the NaN/Inf check (:func:`compare_special`).

    Returns
    -------
    dict[str, numpy.ndarray]
        Input name -> array with the input's dtype (float32 for ``FLOAT``, ...) and concrete
        shape.

    Raises
    ------
    CinmError
        An input is not a tensor (sequence, map, optional, sparse), has an element type ORT's
        Python API cannot feed (bfloat16, float8, int4, complex), has unknown rank and no entry
        in ``shapes``, has a ``shapes`` entry of the wrong rank or with negative sizes; or
        ``shapes`` names something that is not a real graph input; or ``fill`` is unknown.
    """
    if fill not in _FILLS:
        raise CinmError(f"unknown input fill {fill!r}; choose one of {', '.join(_FILLS)}")
    proto = _load_header(model)
    dims = dict(dims or {})
    shapes = {k: list(v) for k, v in (shapes or {}).items()}
    inputs = real_inputs(proto.graph)
    names = [vi.name for vi in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise CinmError(
            f"shape given for {', '.join(map(repr, unknown))}, which is not a graph input "
            f"(inputs: {', '.join(names) or 'none'})"
        )
    for vi in inputs:  # a given shape sizes its symbolic dims in the other inputs too
        tt = vi.type.tensor_type
        if vi.name in shapes and tt.HasField("shape") and len(tt.shape.dim) == len(shapes[vi.name]):
            for d, size in zip(tt.shape.dim, shapes[vi.name]):
                if d.HasField("dim_param") and d.dim_param and d.dim_param not in dims:
                    dims[d.dim_param] = int(size)
    rng = np.random.default_rng(seed)
    ranges = index_ranges(proto, _drawn_sizes(inputs, dims, shapes)) \
        if fill in ("random", "special") else {}
    feeds: dict[str, np.ndarray] = {}
    for vi in inputs:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise CinmError(
                f"input {vi.name!r} has type {kind or 'unknown'}; only tensor inputs are supported"
            )
        tt = vi.type.tensor_type
        if tt.elem_type not in _FEEDABLE:
            tname = TensorProto.DataType.Name(tt.elem_type) if tt.elem_type else "UNDEFINED"
            raise CinmError(f"input {vi.name!r} has element type {tname}, which is not supported")
        dtype = _FEEDABLE[tt.elem_type]
        shape = _concrete_shape(vi, dims, shapes.get(vi.name))
        if vi.name in ranges:
            _fill(rng, dtype, shape, "zeros")  # only for its size limit (draws nothing)
            low, high = ranges[vi.name]
            feeds[vi.name] = rng.integers(low, high, size=shape).astype(dtype)
        else:
            feeds[vi.name] = _fill(rng, dtype, shape, "random" if fill == "special" else fill)
        if fill == "special" and dtype.kind == "f":
            feeds[vi.name] = _with_specials(rng, feeds[vi.name])
    return feeds


def _drawn_sizes(inputs: list, dims: dict[str, int],
                 shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """``{dim name: size}`` of every symbolic dim of ``inputs`` at the sizes
    :func:`random_inputs` draws them (``dims``, ``shapes``, the defaults; the first use of a
    name sizes it), for :func:`index_ranges`. An input of unknown rank without a shape, or
    whose type is not a tensor, sizes nothing (random_inputs refuses it)."""
    sizes = dict(dims)
    for vi in inputs:
        if vi.type.WhichOneof("value") != "tensor_type" or not vi.type.tensor_type.HasField("shape"):
            continue
        try:
            shape = _concrete_shape(vi, sizes, shapes.get(vi.name))
        except CinmError:
            continue
        for d, size in zip(vi.type.tensor_type.shape.dim, shape):
            if d.HasField("dim_param") and d.dim_param:
                sizes.setdefault(d.dim_param, int(size))
    return sizes


def _with_specials(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """``a`` with NaN, +Inf and -Inf at random positions (see ``fill="special"``)."""
    flat = a.reshape(-1).copy()
    each = max(1, int(round(flat.size * SPECIAL_SHARE / 3))) if flat.size >= 3 else 0
    pos = rng.permutation(flat.size)[:3 * each]
    for i, v in enumerate((np.nan, np.inf, -np.inf)):
        flat[pos[i * each:(i + 1) * each]] = v
    return flat.reshape(a.shape)


def _concrete_shape(vi: onnx.ValueInfoProto, dims: dict[str, int],
                    override: list[int] | None) -> tuple[int, ...]:
    tt = vi.type.tensor_type
    if override is not None:
        if tt.HasField("shape") and len(tt.shape.dim) != len(override):
            raise CinmError(
                f"shape {override} for input {vi.name!r} has rank {len(override)}, "
                f"but the model declares rank {len(tt.shape.dim)}"
            )
        if any(int(d) < 0 for d in override):
            raise CinmError(f"shape {override} for input {vi.name!r} has a negative size")
        return tuple(int(d) for d in override)
    if not tt.HasField("shape"):
        raise CinmError(f"input {vi.name!r} has unknown rank; give its shape explicitly")
    out = []
    for axis, d in enumerate(tt.shape.dim):
        default = DEFAULT_FIRST_DIM if axis == 0 else DEFAULT_OTHER_DIM
        if d.HasField("dim_value") and d.dim_value >= 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param in dims:
            out.append(int(dims[d.dim_param]))
        else:
            out.append(default)
            if d.HasField("dim_param") and d.dim_param:  # one name, one size in every input
                dims[d.dim_param] = default
    return tuple(out)


def dims_from_shapes(model: ModelLike, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The sizes ``shapes`` (``{input name: shape}``, e.g. of the arrays a user gave, or of the
    static inputs of a model optimized with ``--overwrite-input-shape``) give the symbolic
    dimensions of ``model``'s real inputs: ``{dim name: size}``, the first use of a name
    winning. Inputs of another rank, or not in ``model``, size nothing."""
    proto = _load_header(model)
    dims: dict[str, int] = {}
    for vi in real_inputs(proto.graph):
        tt = vi.type.tensor_type
        shape = shapes.get(vi.name)
        if shape is None or not tt.HasField("shape") or len(tt.shape.dim) != len(shape):
            continue
        for d, size in zip(tt.shape.dim, shape):
            if d.HasField("dim_param") and d.dim_param and int(size) > 0:
                dims.setdefault(d.dim_param, int(size))
    return dims


def dim_conflicts(model: ModelLike, arrays: Mapping[str, np.ndarray],
                  dims: Mapping[str, int]) -> list[tuple[str, int, str, int]]:
    """The sizes ``dims`` (``--dim NAME=SIZE``) gives symbolic dimensions that a given array
    (``{input name: array}``) has at another size: ``[(dim, size in dims, input name, size in
    the array)]``, one per dim (the first input using it), in input order."""
    if not dims or not arrays:
        return []
    out, seen = [], set()
    for vi in real_inputs(_load_header(model).graph):
        arr = arrays.get(vi.name)
        tt = vi.type.tensor_type
        if arr is None or not tt.HasField("shape") or len(tt.shape.dim) != np.ndim(arr):
            continue
        for d, size in zip(tt.shape.dim, np.shape(arr)):
            name = d.dim_param if d.HasField("dim_param") else ""
            if name in dims and name not in seen and int(size) != dims[name]:
                seen.add(name)
                out.append((name, int(dims[name]), vi.name, int(size)))
    return out


def check_given_inputs(model: ModelLike, arrays: Mapping[str, np.ndarray], label: str = "--input",
                       empty_ok: bool = True, empty_hint: str = "") -> None:
    """Raise a one-line CinmError when a given array cannot feed ``model``: not an input of it,
    another element type (``float64`` for a ``float32`` input: numpy's default), another rank,
    or another size on a static dimension; with ``empty_ok=False`` (a comparison against
    onnxruntime, a run of a model onnxruntime runs an LSTM of), also an array with a
    dimension of size 0, which leaves nothing to compare and aborts the whole process in
    onnxruntime 1.32's LSTM (a trial's batch of 0: SIGABRT, no message). Arrays of the right
    kind pass unchanged. ``empty_hint`` ends the message of an empty array (what the caller
    offers instead)."""
    proto = _load_header(model)
    inputs = {vi.name: vi for vi in real_inputs(proto.graph)}
    for name, arr in arrays.items():
        if name not in inputs:
            raise CinmError(f"{label} '{name}' is not an input of the model (inputs: {', '.join(inputs)})")
        tt = inputs[name].type.tensor_type
        want = _FEEDABLE.get(tt.elem_type)
        arr = np.asarray(arr)
        if want is not None and arr.dtype != want:
            raise CinmError(f"{label} '{name}' holds {arr.dtype}, but the model's input is {want} "
                            f"(convert it, e.g. numpy's a.astype(np.{want.name}))")
        if not empty_ok and arr.size == 0:
            raise CinmError(f"{label} '{name}' has shape {list(arr.shape)}: a dimension of size 0 "
                            "leaves nothing to compute or compare, and onnxruntime aborts the "
                            "process on some ops given none (an LSTM); give at least one "
                            f"element{empty_hint}")
        if not tt.HasField("shape"):
            continue
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                    for d in tt.shape.dim]
        if arr.ndim != len(declared) or any(isinstance(d, int) and d != n for d, n in zip(declared, arr.shape)):
            raise CinmError(f"{label} '{name}' has shape {list(arr.shape)}, but the model's input is "
                            f"[{', '.join(map(str, declared))}]")


def every_dim_sized(model: ModelLike, dims: Mapping[str, int]) -> bool:
    """Whether every dim of ``model``'s real tensor inputs has a size: a fixed value or a
    symbolic name in ``dims``. False when :func:`random_inputs` would draw one of them (an
    anonymous dim, an unsized name, an input of unknown rank)."""
    for vi in real_inputs(_load_header(model).graph):
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            return False
        if not all((d.HasField("dim_value") and d.dim_value >= 0) or
                   (d.HasField("dim_param") and d.dim_param in dims) for d in tt.shape.dim):
            return False
    return True


def symbolic_dims(model: ModelLike) -> list[str]:
    """The names of the symbolic dimensions of ``model``'s real graph inputs, in order."""
    proto = _load_header(model)
    names: dict[str, None] = {}
    for vi in real_inputs(proto.graph):
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param:
                    names[d.dim_param] = None
    return list(names)


def check_dim_names(model: ModelLike, dims: Mapping[str, int]) -> None:
    """Raise CinmError if ``dims`` names a symbolic dimension ``model``'s inputs do not have
    (a typo would otherwise be ignored)."""
    known = symbolic_dims(model)
    unknown = sorted(set(dims) - set(known))
    if unknown:
        raise CinmError(f"no input has a symbolic dimension named {', '.join(map(repr, unknown))} "
                        f"(named ones: {', '.join(known) or 'none'})")


#: Largest input the check generates (elements); bigger ones are a mistake in the shape given.
MAX_INPUT_ELEMENTS = 2**28


def _fill(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], fill: str) -> np.ndarray:
    n = int(np.prod(shape, dtype=object))
    if n > MAX_INPUT_ELEMENTS:
        raise CinmError(f"a check input of shape {list(shape)} has {n:,} elements (limit "
                        f"{MAX_INPUT_ELEMENTS:,}); fix the shape or disable the check with --check 0")
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == object:  # strings
        if fill == "random":
            letters = np.array(list("abcdefghij"))
            words = ["".join(rng.choice(letters, size=int(rng.integers(1, 6)))) for _ in range(n)]
            return np.array(words, dtype=object).reshape(shape)
        return np.full(shape, "" if fill == "zeros" else "a", dtype=object)
    if fill == "zeros":
        return np.zeros(shape, dtype)
    if fill == "ones":
        return np.ones(shape, dtype)
    if fill == "arange":
        if dtype.kind == "f":
            # same arithmetic as onnx.backend.test.runner.Runner.generate_dummy_data
            return (np.arange(n).reshape(shape) / max(n, 1)).astype(dtype)
        if dtype.kind == "b":
            return (np.arange(n) % 2 == 1).reshape(shape)
        return np.arange(n).reshape(shape).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float64).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind == "i":
        return rng.integers(-10, 10, size=shape, endpoint=True).astype(dtype)
    # unsigned: every bit of the low 16 (0..255 for uint8, 0..65535 wider), not only 0..10,
    # where any bit above the fourth is always 0 (bitwise ops and shifts would go unchecked);
    # capped at 16 bits so the product of two inputs still fits a uint32
    top = min(int(np.iinfo(dtype).max), 0xFFFF)
    return rng.integers(0, top, size=shape, endpoint=True).astype(dtype)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------
#: Ops whose onnxruntime result depends on the session's thread count: the contrib int8 LSTM
#: splits a batch of 2 or more rows over the threads (at most 256 hidden units, or more than 4
#: rows) and quantizes each part's hidden state on that part's own range (onnxruntime's
#: ``uni_directional_lstm.cc``: ``SetNumThreads``, ``ComputeImpl``). A session over a model with
#: one runs on one thread: the result every machine gives (and the lowering's).
THREAD_DEPENDENT = frozenset({"com.microsoft::DynamicQuantizeLSTM"})


def _thread_dependent(model: ModelLike) -> bool:
    """Whether ``model`` (any graph) has an op of :data:`THREAD_DEPENDENT` (False when it cannot
    be read: onnxruntime then says why it cannot load it)."""
    try:
        graph = _load_header(model).graph
    except CinmError:
        return False
    return any(f"{n.domain}::{n.op_type}" in THREAD_DEPENDENT for g in iter_graphs(graph) for n in g.node)


class _OrtModel:
    """One onnxruntime CPU session with optimizations disabled (or at ``level``, a
    ``GraphOptimizationLevel`` name; on one thread for a model with an op of
    :data:`THREAD_DEPENDENT`); knows its I/O names."""

    def __init__(self, model: ModelLike, level: str = "ORT_DISABLE_ALL"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.log_severity_level = 4  # a failure is raised as one CinmError; no ORT log line
        # no arena: each tensor's memory goes back when its last reader is done, so a session
        # kept alive (the reference across input sets) does not hold its run's peak, and the
        # check's sessions one after another do not add their peaks up (OriNet QDQ at batch
        # 16, `compare` with its tensor-by-tensor check: 3.6 GB peak with arenas, 2.0 GB
        # without, no slower); the values computed are the same
        so.enable_cpu_mem_arena = False
        if _thread_dependent(model):
            so.intra_op_num_threads = 1
        if isinstance(model, onnx.ModelProto):
            try:
                source: object = model.SerializeToString()
            except (ValueError, EncodeError):  # > 2 GiB: one protobuf cannot hold it
                self._load_from_folder(model, so)
                return
        elif isinstance(model, (bytes, bytearray)):
            source = bytes(model)
        else:
            source = os.fspath(model)
            if not os.path.exists(source):
                raise CinmError(f"model file not found: {source}")
        self._load(source, so)

    def _load(self, source, so) -> None:
        """Create the session from ``source`` (bytes or a path); CinmError if onnxruntime
        refuses it."""
        import onnxruntime as ort

        try:
            self.sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise CinmError(f"onnxruntime cannot load the model: {_one_line(e)}") from None
        self.input_names = [i.name for i in self.sess.get_inputs()]
        self.output_names = [o.name for o in self.sess.get_outputs()]

    def _load_from_folder(self, model: onnx.ModelProto, so) -> None:
        """Create the session from a temporary copy with external data (models > 2 GiB)."""
        import tempfile

        from .frontend import save_model

        with tempfile.TemporaryDirectory(prefix="onnx_cinm_check_") as folder:
            path = os.path.join(folder, "model.onnx")
            save_model(model, path, external_data_threshold_bytes=0)
            self._load(path, so)

    def run(self, feeds: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """The values of ``outputs`` (default: every output, in :attr:`output_names` order) on
        ``feeds``; CinmError when an input is missing or onnxruntime fails."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise CinmError(f"no value given for model input(s) {', '.join(missing)}")
        try:
            return self.sess.run(None if outputs is None else list(outputs),
                                 {n: feeds[n] for n in self.input_names})
        except Exception as e:
            raise CinmError(f"onnxruntime failed to run the model: {ort_error_line(e)}") from None


def run_onnxruntime(model_or_path: ModelLike, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model once in stock onnxruntime (CPU, ``ORT_DISABLE_ALL``).

    Parameters
    ----------
    model_or_path : onnx.ModelProto or path or bytes
        A path is handed to ORT as a path, so external data next to it is found; a ModelProto is
        serialized (must be < 2 GB and must not reference external data by relative path).
    feeds : dict[str, numpy.ndarray]
        Input name -> array. Entries the model does not take are ignored.

    Returns
    -------
    list[numpy.ndarray]
        The outputs in graph output order (sequence outputs come back as Python lists).

    Raises
    ------
    CinmError
        ORT cannot load or run the model, or a model input has no value in ``feeds``; the
        message is one line.
    """
    return _OrtModel(model_or_path).run(feeds)


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------
def map_keys(value: object) -> list | None:
    """The sorted keys of a map output (a dict, or a non-empty sequence of dicts with one key
    set: ZipMap's ``seq(map(...))``), else None."""
    if isinstance(value, dict):
        return sorted(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        keys = sorted(value[0])
        return keys if all(sorted(v) == keys for v in value) else None
    return None


def as_array(value: object) -> np.ndarray | None:
    """An output value as a numeric array, so tolerances apply to it as to a tensor: a tensor
    as it is; a map as its values in :func:`map_keys` order; a sequence of maps with one key set
    as ``[len, keys]``; a sequence of tensors of one shape stacked. None if none of these."""
    if isinstance(value, np.ndarray):
        return value
    keys = map_keys(value)
    if keys is not None:
        rows = [value] if isinstance(value, dict) else value
        out = np.asarray([[row[k] for k in keys] for row in rows])
        return out[0] if isinstance(value, dict) else out
    try:
        return np.asarray(value)
    except Exception:
        return None


def _compare_arrays(rec: OutputCheck, ref: np.ndarray, cand: np.ndarray,
                    rtol: float | None, atol: float | None, k: int = 1, step: float = 0.0) -> None:
    """Fold one run's comparison of one output into ``rec`` (None: the dtype's default; a
    default ``atol`` widens with the reduction length ``k``, :func:`accumulation_atol`, and to
    one quantization ``step`` of an output on a quantization grid,
    :func:`onnx_cinm.quantref.output_steps`; an integer output of a QuantizeLinear may be
    ``step`` = 1 level off)."""
    rec.dtype, rec.shape = str(ref.dtype), tuple(ref.shape)
    if ref.dtype != object:
        d_rtol, d_atol = default_tolerance(ref.dtype)
        if atol is None and ref.dtype.kind == "f":
            acc = accumulation_atol(ref, k)
            wide = max(d_atol, acc, step)
            if wide > d_atol and wide >= (rec.atol or 0.0):  # the rule of the atol kept below
                rec.widened_by = "step" if step >= acc else "sum"
                if rec.widened_by == "sum":
                    rec.k = max(rec.k, k)
            d_atol = wide
        rtol = d_rtol if rtol is None else rtol
        atol = d_atol if atol is None else atol
        rec.rtol, rec.atol = rtol, max(atol, rec.atol or 0.0)
    if ref.dtype != cand.dtype:
        rec._fail(f"dtype {ref.dtype} vs {cand.dtype}")
        return
    if ref.shape != cand.shape:
        rec._fail(f"shape {ref.shape} vs {cand.shape}")
        return
    rec.elements += ref.size
    if ref.size == 0:
        return
    if ref.dtype.kind == "f":
        finite = np.isfinite(ref)
        rec.ref_nonfinite += int(ref.size - finite.sum())
        if len(rec.ref_values) < 2 and finite.any():  # two distinct values: not constant
            rec.ref_values.update({float(ref[finite].min()), float(ref[finite].max())})
    if ref.dtype.kind in "fc":
        r = ref.astype(np.float64) if ref.dtype.kind == "f" else ref.astype(np.complex128)
        c = cand.astype(r.dtype)
        close = np.isclose(c, r, rtol=rtol, atol=atol, equal_nan=True)
        both_finite = np.isfinite(r) & np.isfinite(c)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(both_finite, np.abs(c - r), 0.0)
        # NaN/Inf in one place but not the same special value in the other: infinite error
        special_bad = ~both_finite & ~close
        abs_err = float(np.max(diff)) if diff.size else 0.0
        if ref.dtype.kind == "f":
            rec.sq_err += float(np.sum(np.square(diff)))
            rec.sq_ref += float(np.sum(np.square(np.where(both_finite, r, 0.0))))
            if ref.ndim and ref.shape[-1] >= 2:
                same = np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)
                rec.argmax_rows += same.size
                rec.argmax_same += int(same.sum())
        if special_bad.any():
            abs_err = float("inf")
        nz = both_finite & (r != 0)
        rel_err = 0.0
        if nz.any():
            rel = np.abs(c[nz] - r[nz]) / np.abs(r[nz])
            at = int(np.argmax(rel))
            rel_err = float(rel[at])
            if rel_err > rec.max_rel_err:
                rec.rel_err_ref = float(np.abs(r[nz][at]))
        if special_bad.any():
            rel_err = float("inf")
        off = int((~close).sum())
    elif ref.dtype.kind in "iub":
        r, c = ref.astype(np.float64), cand.astype(np.float64)
        d = np.abs(c - r)
        abs_err = float(d.max())
        nz = r != 0
        rel_err = float((d[nz] / np.abs(r[nz])).max()) if nz.any() else 0.0
        off = int((d > step).sum())
    else:  # strings, objects: exact
        neq = np.asarray(ref != cand)
        off = int(neq.sum())
        abs_err = rel_err = float("inf") if off else 0.0
    rec.max_abs_err = max(rec.max_abs_err, abs_err)
    rec.max_rel_err = max(rec.max_rel_err, rel_err)
    if off:
        rec.ok = False
        rec.mismatched += off


#: Quantized element types the stepwise check compares (onnxruntime returns them as numpy
#: integers).
_STEPWISE_TYPES = frozenset({TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16,
                             TensorProto.INT16, TensorProto.INT32})

#: Steps of :func:`compare_stepwise` per input set, each named to its ``step`` callback as it
#: starts: the original's run, the rewired optimized model's run, the rounding ties.
STEPWISE_STEPS = 3


def _full_model(model: ModelLike) -> onnx.ModelProto:
    """``model`` as a ModelProto with its weights (a path: external data next to it loaded)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return onnx.load(os.fspath(model))


def onnxruntime_self_difference(model: ModelLike, feeds: Mapping[str, np.ndarray]) -> float:
    """Max abs err over the float outputs of ``model`` between onnxruntime's
    ``ORT_ENABLE_ALL`` and ``ORT_DISABLE_ALL`` sessions on ``feeds`` (finite elements): how
    much onnxruntime's own graph optimizations (fused integer kernels of a QDQ model, say) move
    its results. The ``ORT_ENABLE_ALL`` session runs in a child process
    (:func:`_run_in_child`): its optimizers can crash the process on a model the other levels
    run (onnxruntime 1.32 segfaults on a QDQ model of spindle-detector-eeg made by its own
    ``quantize_static``; trial s36), and this figure is only for scale. Raises CinmError when
    either session cannot run it, the child's crash included."""
    a = _OrtModel(model).run(feeds)
    b = _run_in_child(model, feeds, "ORT_ENABLE_ALL")
    worst = 0.0
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.shape == y.shape:
            ok = np.isfinite(x) & np.isfinite(y)
            if ok.any():
                worst = max(worst, float(np.abs(x[ok].astype(np.float64) - y[ok]).max()))
    return worst


#: What :func:`_run_in_child` runs: one onnxruntime session of a model file at a level on the
#: arrays of an ``.npz`` file, its outputs saved to another, in output order (``o0``, ``o1``,
#: ...; a non-tensor output as an empty array).
_CHILD = """
import sys, numpy as np, onnxruntime as ort
model, level, feeds, out = sys.argv[1:5]
so = ort.SessionOptions()
so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
so.log_severity_level = 4
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
with np.load(feeds, allow_pickle=False) as f:
    given = {k: f[k] for k in f.files}
got = sess.run(None, given)
np.savez(out, **{f"o{i}": v if isinstance(v, np.ndarray) else np.zeros(0) for i, v in enumerate(got)})
"""


def _run_in_child(model: ModelLike, feeds: Mapping[str, np.ndarray], level: str) -> list:
    """The outputs of onnxruntime's CPU session of ``model`` at optimization ``level`` (a
    ``GraphOptimizationLevel`` name) on ``feeds``, computed in a child process (this
    interpreter, ``python -c``), so that a crash of onnxruntime ends only the child. A model
    given in memory is written to a temporary file first. Raises CinmError when the child
    fails (its last stderr line, or the signal that ended it) or an input is no array."""
    import signal
    import subprocess
    import sys
    import tempfile

    from .frontend import save_model

    if not all(isinstance(v, np.ndarray) and v.dtype != object for v in feeds.values()):
        raise CinmError("an input is no plain array (a sequence or a map)")
    with tempfile.TemporaryDirectory(prefix="onnx_cinm_ort_") as folder:
        if isinstance(model, onnx.ModelProto):
            path = os.path.join(folder, "model.onnx")
            save_model(model, path)
        elif isinstance(model, (bytes, bytearray)):
            path = os.path.join(folder, "model.onnx")
            with open(path, "wb") as f:
                f.write(model)
        else:
            path = os.fspath(model)
        given, out = os.path.join(folder, "feeds.npz"), os.path.join(folder, "out.npz")
        np.savez(given, **feeds)
        proc = subprocess.run([sys.executable, "-c", _CHILD, path, level, given, out],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            if proc.returncode < 0:
                try:
                    why = f"crashed ({signal.Signals(-proc.returncode).name})"
                except ValueError:
                    why = f"crashed (signal {-proc.returncode})"
            else:
                lines = proc.stderr.strip().splitlines()
                why = f"failed: {lines[-1][:300]}" if lines else f"failed (exit {proc.returncode})"
            raise CinmError(f"onnxruntime's {level} session {why}")
        with np.load(out, allow_pickle=False) as f:
            return [f[f"o{i}"] for i in range(len(f.files))]


def compare_stepwise(reference: ModelLike, candidate: ModelLike,
                     input_sets: Iterable[Mapping[str, np.ndarray]],
                     step: Callable[[str], None] | None = None) -> StepwiseCheck | None:
    """Compare a quantized model with its rewrite tensor by tensor (:class:`StepwiseCheck`).

    Parameters
    ----------
    reference, candidate : onnx.ModelProto or path or bytes
        The original (with ``QuantizeLinear`` nodes) and the rewritten model; the candidate's
        nodes that read a quantized tensor of the reference's (by name) read the reference's
        values instead (:func:`onnx_cinm.quantref.fed_from_reference`).
    input_sets : iterable of dict[str, numpy.ndarray]
        The inputs, as for :func:`compare`.
    step : callable, optional
        Called with the name of each of the :data:`STEPWISE_STEPS` steps of an input set as it
        starts (for a progress bar).

    Returns
    -------
    StepwiseCheck or None
        None when the reference has no quantized tensor to compare.

    Notes
    -----
    Memory: one model's onnxruntime run at a time (besides the quantized tensors of one input
    set, as the candidate is fed them); the tensors are compared one by one as integers and
    freed, and only the elements one step off are judged for ties (their float values taken
    from one more run of the reference that returns the quantizers' inputs of those tensors).

    Raises
    ------
    CinmError
        Onnxruntime cannot load or run either rewired model.
    """
    from .checkreport import OutputCheck, StepwiseCheck

    ref = _exact_integers(_full_model(reference))[0]
    quantized = {n: t for n, t in quantref.quantized_tensors(ref).items() if t in _STEPWISE_TYPES}
    if not quantized:
        return None
    cand = _exact_integers(_full_model(candidate))[0]
    made = {o for node in cand.graph.node for o in node.output}
    shared = {n: t for n, t in quantized.items() if n in made}
    check = StepwiseCheck(tensors=len(shared), total=len(quantized))
    if not shared:
        return check
    ref_run = _OrtModel(quantref.with_outputs(ref, shared))
    cand_run = _OrtModel(quantref.fed_from_reference(cand, shared))
    before = quantref.quantizer_inputs(ref, shared)
    graph_inputs = {i.name for i in ref.graph.input}
    k, grid = reduction_length(ref), quantref.output_steps(ref)
    records = {o.name: OutputCheck(o.name) for o in ref.graph.output}
    check.outputs = list(records.values())
    sizes = dict.fromkeys(shared, 0)
    off: dict[str, list[int]] = {}  # name -> [elements off, largest difference in steps]

    start = step or (lambda what: None)

    def count(name: str, bad: int, steps: int) -> None:
        rec = off.setdefault(name, [0, 0])
        rec[0] += bad
        rec[1] = max(rec[1], steps)

    for feeds in input_sets:
        start("the original's quantized tensors")
        r = dict(zip(ref_run.output_names, ref_run.run(feeds)))
        start("the optimized model fed them")
        c = dict(zip(cand_run.output_names,
                     cand_run.run({**feeds, **{n + quantref.FED_SUFFIX: r[n] for n in shared}})))
        for name, rec in records.items():
            got = as_array(c[name]) if name in c else None
            if got is None:
                rec._fail("missing in candidate")
            else:
                _compare_arrays(rec, as_array(r[name]), got, None, None, k, grid.get(name, 0.0))
        # as integers, one tensor at a time, each freed once compared; only the elements that
        # differ are widened (to int64, for the size of the difference)
        one_step = {}  # name -> (flat indices one step off, the candidate's levels there, shape)
        for name in shared:
            a, b = np.asarray(r.pop(name)), np.asarray(c.pop(name))
            sizes[name] += a.size
            if a.shape != b.shape:
                count(name, a.size, 0)
                continue
            where = np.flatnonzero(a != b)
            if not where.size:
                continue
            shape, a, b = a.shape, a.reshape(-1)[where], b.reshape(-1)[where]
            d = np.abs(a.astype(np.int64) - b.astype(np.int64))
            if (d > 1).any():
                count(name, int((d > 1).sum()), int(d.max()))
            if (d == 1).any():
                one_step[name] = (where[d == 1], b[d == 1], shape)
        del r, c
        start("rounding ties")
        # one step off: is the reference at a rounding tie there? its floats, one more run;
        # judged on those elements only
        floats = {before[n].input: before[n].input_type for n in one_step
                  if before[n].input not in graph_inputs}
        values = {}
        if floats:
            run = _OrtModel(quantref.with_outputs(ref, floats))
            values = dict(zip(floats, run.run(feeds, floats)))
            del run
        for name, (where, level, shape) in one_step.items():
            q = before[name]
            value = np.asarray(values.pop(q.input) if q.input in values else feeds[q.input])
            near = quantref.at_rounding_tie(value.reshape(-1)[where], level,
                                            quantref.elements_of(q, where, shape))
            check.at_ties += int(near.sum())
            if not near.all():
                count(name, int((~near).sum()), 1)
    check.elements = sum(sizes.values())
    check.off = [(n, off[n][0], sizes[n], off[n][1]) for n in shared if n in off]
    return check


def compare(
    reference: ModelLike,
    candidate: ModelLike,
    *,
    n: int = 1,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    fill: str = "random",
    feeds: Iterable[Mapping[str, np.ndarray]] | None = None,
    stepwise: ModelLike | None = None,
    progress: bool = False,
) -> CheckReport:
    """Run both models on the same inputs and compare their outputs by name.

    Parameters
    ----------
    reference, candidate : onnx.ModelProto or path or bytes
        The original and the rewritten model (paths keep external data working). The candidate
        may also be a runner: an object with ``input_names``, ``output_names`` and
        ``run(feeds) -> list of arrays`` (see ``InferenceSession.as_runner``).
    n : int
        Number of random input sets; set ``i`` uses seed ``seed + i``. Ignored with ``feeds``.
    rtol, atol : float, optional
        ``numpy.allclose`` tolerances for float outputs, reference as ``b``; None (default):
        each output's dtype decides (:func:`default_tolerance`: 1e-4/1e-5 for float32, 0.0039
        for float16), and a default ``atol`` of a float output widens with the model's longest
        reduction (:func:`reduction_length`, :func:`accumulation_atol`: about 2e-3 for outputs
        of RMS 64 after a K = 4096 product). NaN equals NaN and Inf equals same-signed Inf in
        the same position.
        Integer, bool and string outputs must match exactly.
    seed, dims, shapes, fill
        Passed to :func:`random_inputs` (inputs are generated from the *reference* model).
    feeds : iterable of dict[str, numpy.ndarray], optional
        Use these input sets instead of random ones (e.g. a real test set).
    stepwise : onnx.ModelProto or path or bytes, optional
        The candidate as a model, when ``candidate`` is a runner: a quantized reference whose
        float outputs fail with default tolerances is then judged tensor by tensor
        (:func:`compare_stepwise`: one-step rounding-tie differences cascade through the
        layers of a QDQ model) on onnxruntime's run of this model, after the runner's outputs
        (kept from the main comparison for every input set, so the runner is run once per set)
        are found to equal that run's. A candidate given as a model is used itself (this
        argument is then ignored). Not used for a reference with no quantized tensor. With a
        runner that keeps its values (``run_keeping``) and whose kernels are all exact
        (``exact``: the CINM provider's), float outputs still off are then judged node by
        node on this model (:func:`compare_node_by_node`; ``CheckReport.nodes``): they pass
        when every device node matches onnxruntime on its own inputs and the reference
        quantizes at run time (:data:`RUNTIME_QUANTIZERS`).
    progress : bool
        Show a progress bar on stderr (only when it is a terminal) for the tensor-by-tensor
        check, which takes a few onnxruntime runs of both models per input set.

    Returns
    -------
    CheckReport
        ``ok`` is False for numeric mismatches and for structural differences: an output
        present in only one model, a shape or dtype difference, or different input names.

    Raises
    ------
    CinmError
        The reference model cannot be read, or inputs cannot be generated
        (see :func:`random_inputs`).
    ReferenceFailed
        Onnxruntime cannot run the reference model on any of the input sets (the message
        names the first set's shapes): random inputs may not suit it (give ``dims``,
        ``shapes`` or ``feeds``). Sets it cannot run among others that it can are skipped and
        listed in ``CheckReport.skipped``.
    CheckFailed
        The candidate model cannot be loaded or run by onnxruntime.
    """
    if feeds is None:
        if n < 1:
            raise CinmError(f"the number of check runs must be at least 1, got {n}")
        first = random_inputs(reference, seed=seed, dims=dims, shapes=shapes, fill=fill)
        # the rest one set at a time: n runs need the memory of one
        input_sets = itertools.chain([first], (
            random_inputs(reference, seed=seed + i, dims=dims, shapes=shapes, fill=fill)
            for i in range(1, n)))
        runs = n
    else:
        input_sets = [dict(f) for f in feeds]
        runs = len(input_sets)
        if not input_sets:
            raise CinmError("compare() got an empty list of input sets")

    from .checkreport import CheckReport, OutputCheck

    reference, exact = _exact_integers(reference)
    ref_model = _OrtModel(reference)
    k = 1  # widens the default atol only
    if atol is None:
        k = reduction_length(reference)
        # at the sizes of the first set compared too (an LSTM's steps); never below what the
        # model alone gives: a size known only from probed shapes, which inference at given
        # dims does not read, stays counted (no dim sized: the same figure, not asked twice)
        sized = {**dims_from_shapes(reference, {name: np.shape(v) for name, v in (
            first if feeds is None else input_sets[0]).items()}), **(dims or {})}
        if sized:
            k = max(k, reduction_length(reference, sized))
    header = _load_header(reference)
    steps = quantref.output_steps(header)
    try:
        # a runner object (``input_names``, ``output_names``, ``run(feeds)``, e.g. the CINM
        # execution provider's) is used as it is; anything else is loaded into onnxruntime
        cand_model = candidate if hasattr(candidate, "output_names") else \
            _OrtModel(_exact_integers(candidate)[0])
    except CinmError as e:
        raise CheckFailed(f"candidate model: {e}") from None

    report = CheckReport(ok=True, runs=runs, rtol=rtol, atol=atol, special=fill == "special")
    if exact:
        report.notes.append(f"reference: {exact} MatMulInteger/QLinearMatMul/QLinearConv with full-range int8 "
                            "weights computed exactly in int32, as onnxruntime's u8s8 kernels "
                            "saturate on this CPU")
    if steps:
        named = ", ".join(f"{k} {v:.3g}" for k, v in list(steps.items())[:2])
        more = f" (+{len(steps) - 2} more)" if len(steps) > 2 else ""
        report.notes.append(f"allowed one quantization step ({named}{more}): an exact int32 product "
                            "and onnxruntime's float32 sum of dequantized terms can round to "
                            "neighbouring levels")
    if set(ref_model.input_names) != set(cand_model.input_names):
        only_ref = sorted(set(ref_model.input_names) - set(cand_model.input_names))
        only_cand = sorted(set(cand_model.input_names) - set(ref_model.input_names))
        parts = []
        if only_ref:
            parts.append(f"inputs only in reference: {', '.join(only_ref)}")
        if only_cand:
            parts.append(f"inputs only in candidate: {', '.join(only_cand)}")
        report.problems.append("; ".join(parts))
        report.ok = False

    names = list(ref_model.output_names) + [
        o for o in cand_model.output_names if o not in ref_model.output_names]
    records = {name: OutputCheck(name) for name in names}
    report.outputs = [records[name] for name in names]
    for name in names:
        if name not in cand_model.output_names:
            records[name]._fail("missing in candidate")
        elif name not in ref_model.output_names:
            records[name]._fail("not in reference")

    if report.problems:  # the candidate may not even be runnable on these feeds
        report.ok = False
        return report

    runner = candidate if hasattr(candidate, "output_names") else None
    if runner is None:
        stepwise = candidate
    # judged tensor by tensor if it fails: decided on the reference's graph before any run
    judge = stepwise is not None and rtol is None and atol is None and _is_quantized(header)
    ran: list = []  # the input sets both models ran on, for the stepwise check
    replies: dict = {}  # with a runner: its outputs per input set (by the arrays fed)
    for inputs in input_sets:
        try:
            ref_out = dict(zip(ref_model.output_names, ref_model.run(inputs)))
        except CinmError as e:  # this set does not suit the model: skip it, keep the others
            shapes_seen = ", ".join(f"{k} {list(np.shape(v))}" for k, v in inputs.items())
            report.skipped.append(f"{e} (inputs: {shapes_seen})")
            continue
        try:
            cand_list = cand_model.run(inputs)
        except CinmError as e:
            raise CheckFailed(f"candidate model: {e}") from None
        cand_out = dict(zip(cand_model.output_names, cand_list))
        ran.append(inputs)
        if judge and runner is not None:
            replies[_feeds_key(inputs)] = cand_list
        for name in names:
            if name not in ref_out or name not in cand_out:
                continue
            if map_keys(ref_out[name]) != map_keys(cand_out[name]):
                records[name]._fail("map keys differ")
                continue
            r, c = as_array(ref_out[name]), as_array(cand_out[name])
            if r is None or c is None:
                records[name]._fail("output is not a tensor")
                continue
            _compare_arrays(records[name], r, c, rtol, atol, k, steps.get(name, 0.0))
    report.runs -= len(report.skipped)
    if not report.runs:  # not one set ran: the check cannot judge anything
        raise ReferenceFailed(report.skipped[0])
    report.ok = all(o.ok for o in report.outputs) and not report.problems
    failed = [o for o in report.outputs if not o.ok]
    del ref_model, cand_model  # their sessions (and weights) are not needed any more
    if failed and judge and not report.problems \
            and all(not o.note and o.dtype.startswith("float") for o in failed):
        _judge_stepwise(report, failed, reference, stepwise, ran,
                        _Replay(runner, replies) if runner is not None else None, progress)
    failed = [o for o in report.outputs if not o.ok]
    if failed and runner is not None and stepwise is not None and not report.problems \
            and getattr(runner, "exact", False) and hasattr(runner, "run_keeping") \
            and all(not o.note and o.dtype.startswith("float") for o in failed):
        _judge_by_node(report, failed, reference, stepwise, runner, ran, header)
    return report


#: Ops that quantize with a scale computed at run time from their input's range: a last-bit
#: difference upstream can move a whole quantization step, on some inputs and not others.
RUNTIME_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "com.microsoft::DynamicQuantizeMatMul",
                                "com.microsoft::DynamicQuantizeLSTM"})


def runtime_quantizers(model: onnx.ModelProto) -> list[str]:
    """The ops of :data:`RUNTIME_QUANTIZERS` in any graph of ``model`` (``domain::op`` for a
    contrib op), sorted."""
    keys = {node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            for graph in iter_graphs(model.graph) for node in graph.node}
    return sorted(keys & RUNTIME_QUANTIZERS)


def _judge_by_node(report: CheckReport, failed: list[OutputCheck], reference: ModelLike,
                   candidate: ModelLike, runner, input_sets: list, header: onnx.ModelProto) -> None:
    """Judge the failed outputs of a runner's comparison node by node
    (:func:`compare_node_by_node`), recorded in ``report.nodes``; when that explains the
    failure (:attr:`~onnx_cinm.checkreport.NodeCheck.ok`), the outputs in ``failed`` are
    cleared (``by_node``) and ``report`` passes. ``reference``: the original, which onnxruntime
    on ``candidate`` must match end to end (:func:`compare`, model against model: the rewrite
    of the host ops and the cinm ops' reference bodies, which no node-by-node comparison of
    the runner sees); ``header``: its graph (which ops quantize at run time). A model without
    device nodes adds nothing."""
    try:
        check = compare_node_by_node(candidate, runner, input_sets)
    except CinmError as e:  # the end-to-end verdict stands; say why it was not refined
        report.notes.append(f"not judged node by node: {e}")
        return
    if not check.total:
        return
    check.quantizers = runtime_quantizers(header)
    if check.quantizers and not check.off and not check.unjudged:
        try:
            rewrite = compare(reference, candidate, feeds=input_sets)
            check.rewrite = "" if rewrite.ok else rewrite.summary()
        except CinmError as e:
            check.rewrite = f"onnxruntime could not run it: {e}"
    report.nodes = check
    if check.ok:
        for o in failed:
            o.ok = o.by_node = True
        report.ok = True


#: Suffix of the graph inputs through which :func:`compare_node_by_node` gives a node the
#: runner's value of one of its inputs.
PROVIDER_SUFFIX = "__provider"


def compare_node_by_node(candidate: ModelLike, runner, input_sets: list) -> NodeCheck:
    """Judge the runner's computation of ``candidate`` (an optimized model) node by node: every
    value ``runner`` computed (``runner.run_keeping(feeds) -> {name: array}``, the CINM
    provider's: ``InferenceSession.as_runner``) against onnxruntime's run of the node that
    makes it (a device node's reference body, a host node as it is) on the very inputs the
    runner gave that node, with :func:`compare`'s default rtol and an atol at the value's own
    scale (:func:`_node_atol`), over every set of ``input_sets``.

    One onnxruntime session runs ``candidate`` with each node (in If branches too) reading the
    runner's values of the main graph it reads through new graph inputs (``name`` +
    :data:`PROVIDER_SUFFIX`) and returning what it makes: a difference upstream of a node
    cannot reach it. A value the runner never holds (an Im2Col computed inside its
    convolution's kernel, a node inside a host partition) is computed by onnxruntime on the
    way, and its node is judged with the nodes that read it; a device node in an If branch
    with its If. A device node none of whose readers are judged is listed as not judged.
    The device nodes are :attr:`~onnx_cinm.checkreport.NodeCheck.nodes`; a host value off is
    in :attr:`~onnx_cinm.checkreport.NodeCheck.host_off`.

    Whether onnxruntime on ``candidate`` computes what the original computes is not judged
    here (:func:`_judge_by_node` compares the two models).

    Memory: a copy of every value of one run of the runner, and one more session of the model.

    Raises:
        CinmError: the runner or onnxruntime cannot run the model on an input set.
    """
    from .checkreport import NodeCheck, OutputCheck
    from .dialects import cinm

    def on_device(node) -> str:
        return (cinm.device_of(node) or "host") if node.domain == cinm.DOMAIN else "host"

    model = _full_model(candidate)
    graph = model.graph
    device = {i: on_device(n) for i, n in enumerate(graph.node) if on_device(n) != "host"}
    # device nodes in the branches of each main-graph node (an If): judged with it
    nested = {i: [m.name or m.output[0] for body in subgraphs(n) for sub in iter_graphs(body)
                  for m in sub.node if on_device(m) != "host"]
              for i, n in enumerate(graph.node)}
    nested = {i: names for i, names in nested.items() if names}
    check = NodeCheck(total=len(device) + sum(map(len, nested.values())))
    if not check.total:
        return check
    outer = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    k = reduction_length(model)
    session = fed = outs = None
    records: dict = {}
    for feeds in input_sets:
        kept = runner.run_keeping(feeds)
        if session is None:
            # (an If's branches read values of the main graph too: fed alike)
            fed = {n: kept[n] for node in graph.node for n in _reads(node)
                   if n in kept and n not in outer}
            outs = {o: kept[o] for node in graph.node for o in node.output if o in kept}
            session = _OrtModel(_reading_fed(model, fed, outs))
            judged = _judged(graph, set(outs))
            check.unjudged = [graph.node[i].name or graph.node[i].output[0]
                              for i in device if i not in judged] + \
                [name for i, names in nested.items() if i not in judged for name in names]
        given = {**{n: feeds[n] for n in session.input_names if n in feeds},
                 **{n + PROVIDER_SUFFIX: kept[n] for n in fed}}
        got = dict(zip(session.output_names, session.run(given)))
        for o in outs:
            _compare_arrays(records.setdefault(o, OutputCheck(o)), got[o], kept[o], None,
                            _node_atol(got[o], k), k)
    for i, node in enumerate(graph.node):
        checks = [records[o] for o in node.output if o in records]
        if not checks:
            continue
        entry = (node.name or node.output[0], f"{node.domain or 'ai.onnx'}.{node.op_type}",
                 device.get(i, "host"), checks)
        if i in device:
            check.nodes.append(entry)
        elif not all(o.ok for o in checks):
            check.host_off.append(entry)
    return check


def _reading_fed(model: onnx.ModelProto, fed: dict, outs: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes read each tensor of ``fed`` (``{name: an array of it}``,
    values of the main graph) from a new graph input ``name`` + :data:`PROVIDER_SUFFIX`, those
    of its If branches and Loop bodies too (an adversarial review: a branch's DynamicQuantize-
    Linear of onnxruntime's own recomputation of a UPMEM Tanh's output failed a correct
    model), and that also returns the tensors of ``outs`` (likewise)."""
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for graph in iter_graphs(out.graph):  # the branches' reads of the main graph's values too
        for node in graph.node:
            for j, name in enumerate(node.input):
                if name in fed:
                    node.input[j] = name + PROVIDER_SUFFIX

    def info(name: str, value: np.ndarray):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                             None)

    out.graph.input.extend(info(n + PROVIDER_SUFFIX, v) for n, v in fed.items())
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(info(n, v) for n, v in outs.items() if n not in have)
    return out


def _reads(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads: its inputs, then what its branches and bodies read from
    outside them (in order, with repeats)."""
    names = list(node.input)
    for body in subgraphs(node):
        made = {o for g in iter_graphs(body) for n in g.node for o in n.output} | \
            {v.name for g in iter_graphs(body) for v in g.input} | \
            {t.name for g in iter_graphs(body) for t in g.initializer}
        names += [x for g in iter_graphs(body) for n in g.node for x in n.input if x not in made]
    return names


def _node_atol(ref: np.ndarray, k: int) -> float | None:
    """The absolute tolerance of one value in :func:`compare_node_by_node`: the dtype's
    default (1e-5 for float32) scaled down to the value's own size when it is smaller than 1,
    and at least :func:`accumulation_atol`; None (the default) for a non-float value. A fixed
    1e-5 let a Tanh kernel with its sign flipped pass on values of size 1e-7 (an adversarial
    review), which a DynamicQuantizeLinear after it then scaled to whole int8 steps: what this
    check excuses is the last bits of a value, in proportion to it."""
    if ref.dtype.kind != "f" or not ref.size:
        return None
    finite = ref[np.isfinite(ref)]
    top = float(np.max(np.abs(finite))) if finite.size else 0.0
    floor = default_tolerance(ref.dtype)[1] * (min(1.0, top) if top > 0 else 1.0)
    return max(accumulation_atol(ref, k), floor)


def _judged(graph: onnx.GraphProto, kept: set) -> set:
    """The indices of the main graph's nodes :func:`compare_node_by_node` judges: those with an
    output in ``kept``, and those whose every output is read only by judged nodes (and is no
    graph output)."""
    readers: dict = {}
    for j, node in enumerate(graph.node):
        for name in _reads(node):
            readers.setdefault(name, []).append(j)
    outputs = {o.name for o in graph.output}
    judged: set = set()
    for i in range(len(graph.node) - 1, -1, -1):  # readers come after their producer
        made = [o for o in graph.node[i].output if o]
        if any(o in kept for o in made) or all(
                o not in outputs and all(j in judged for j in readers.get(o, ())) for o in made):
            judged.add(i)
    return judged


def _is_quantized(header: onnx.ModelProto) -> bool:
    """Whether a model (``header``: its graph; external weights need not be loaded) has a
    quantized tensor for :func:`compare_stepwise`: a ``QuantizeLinear`` output of a
    :data:`_STEPWISE_TYPES` type, or a QLinearMatMul/QLinearConv (which :func:`_exact_integers`
    may rewrite into one)."""
    return any(n.op_type in ("QLinearMatMul", "QLinearConv") for n in header.graph.node) or any(
        t in _STEPWISE_TYPES for t in quantref.quantized_tensors(header).values())


def _feeds_key(feeds: Mapping[str, np.ndarray]) -> tuple:
    """An input set by the identity of its arrays (they stay alive for the whole check)."""
    return tuple(sorted((k, id(v)) for k, v in feeds.items()))


class _Replay:
    """A runner that answers each input set with the outputs another runner gave for it in
    :func:`compare`'s main loop (``replies``: :func:`_feeds_key` -> list of outputs), so that
    its results can be compared with another model's without running it again."""

    def __init__(self, runner, replies: dict):
        self.input_names = list(runner.input_names)
        self.output_names = list(runner.output_names)
        self._replies = replies

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        """The outputs kept for ``feeds``; CinmError for a set the runner was not run on."""
        got = self._replies.get(_feeds_key(feeds))
        if got is None:
            raise CinmError("the runner was not run on this input set")
        return got


def _judge_stepwise(report: CheckReport, failed: list[OutputCheck], reference: ModelLike,
                    candidate: ModelLike, input_sets: list, runner: _Replay | None = None,
                    progress: bool = False) -> None:
    """Judge a failed check of a quantized ``reference`` tensor by tensor: the outputs in
    ``failed`` are cleared (``stepwise``) and ``report`` passes when :func:`compare_stepwise`
    does; the report records the stepwise check either way (nothing when the reference has no
    quantized tensor). With a ``runner`` (the outputs the execution provider on ``candidate``
    gave for each of ``input_sets``), the stepwise check runs onnxruntime on ``candidate`` (the
    model's reference functions), so the runner must first have computed what that computes
    (:func:`compare` of the two, every input set; the runner is not run again). ``progress``:
    a bar on stderr (a terminal's) over its onnxruntime runs."""
    sets = len(input_sets)
    bar = progress_bar((sets if runner is not None else 0) + STEPWISE_STEPS * sets + 1,
                       "check tensor by tensor", "step", progress)
    running = 0

    def start(what: str, steps: int = 1) -> None:
        """The bar counts the steps done and names the one now running (``steps`` long)."""
        nonlocal running
        bar.update(running)
        running = steps
        bar.set_postfix_str(what)

    try:
        try:
            if runner is not None:
                start("the optimized model in onnxruntime, as the runner", sets)
                same = compare(candidate, runner, feeds=input_sets)
                if not same.ok:
                    report.notes.append("not judged tensor by tensor: the runner differs from "
                                        f"onnxruntime on the optimized model ({same.summary()})")
                    return
            step = compare_stepwise(reference, candidate, input_sets, start)
        except CinmError as e:  # the end-to-end verdict stands; say why it was not refined
            report.notes.append(f"not judged tensor by tensor: {e}")
            return
        if step is None:
            return
        report.stepwise = step
        if step.ok:
            start("onnxruntime's own optimizations, for scale")
            try:  # for scale; not on NaN/Inf inputs (the ordinary check has measured it)
                if not report.special:
                    step.onnxruntime_self = onnxruntime_self_difference(reference, input_sets[0])
            except CinmError as e:  # a figure for scale: the verdict stands without it
                report.notes.append(f"onnxruntime's own difference not measured: {e}")
    finally:
        bar.close()
    if step.ok:
        for o in failed:
            o.ok = o.stepwise = True
        report.ok = True


def _exact_integers(model: ModelLike) -> tuple[ModelLike, int]:
    """``model`` with the integer products onnxruntime saturates here rewritten to exact ones
    (:func:`onnx_cinm.quantref.exact_integer_products`) and their count; the model as given
    when there are none (a path is read whole only when it has MatMulInteger/QLinearMatMul)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        header = _load_header(model)
        if not any(n.op_type in quantref.REWRITTEN for n in header.graph.node) \
                or not quantref.u8s8_saturates():
            return model, 0
        proto = header if isinstance(model, (bytes, bytearray)) else onnx.load(os.fspath(model))
    return quantref.exact_integer_products(proto)


def has_float_input(model: ModelLike) -> bool:
    """Whether ``model`` takes a float tensor input (where NaN/Inf can enter at all)."""
    return any(vi.type.WhichOneof("value") == "tensor_type"
               and _FEEDABLE.get(vi.type.tensor_type.elem_type, np.dtype(object)).kind == "f"
               for vi in real_inputs(_load_header(model).graph))


#: Why the NaN/Inf check (:func:`compare_special`) has nothing to do: one clause, as
#: ``optimize``'s summary puts it in parentheses after "skipped".
NO_FLOAT_INPUT = "the model has no float input to put NaN or Inf in"


def compare_special(reference: ModelLike, candidate: ModelLike, *, n: int = 1,
                    rtol: float | None = None, atol: float | None = None, seed: int = 0,
                    dims: Mapping[str, int] | None = None,
                    shapes: Mapping[str, Sequence[int]] | None = None,
                    stepwise: ModelLike | None = None,
                    given: Mapping[str, np.ndarray] | None = None) -> CheckReport | None:
    """The NaN/Inf check: :func:`compare` on ``fill="special"`` inputs (random values with NaN,
    +Inf and -Inf in every float input), kept apart from the ordinary check so that one stays
    meaningful (a NaN row hides every other difference in it). Outputs must carry NaN and
    same-signed Inf exactly where the reference does; the finite rest is judged as usual.

    ``given``: the user's input arrays (``--input``); each set then keeps them, with NaN and
    Inf put into the float ones, and their integers (indices, ids, lengths) as given: random
    integers would index outside the user's tables. The inputs not given are drawn at their
    sizes. Returns None when the model has no float input (nothing to inject,
    :data:`NO_FLOAT_INPUT`). Raises as :func:`compare`; ReferenceFailed when the reference
    cannot run on such inputs."""
    if not has_float_input(reference):
        return None
    feeds = None
    if given:
        shapes = {**(shapes or {}), **{k: np.shape(v) for k, v in given.items()}}
        feeds = []
        for i in range(n):
            rng = np.random.default_rng(seed + i)
            drawn = random_inputs(reference, seed=seed + i, dims=dims, shapes=shapes, fill="special")
            feeds.append({**drawn, **{k: _with_specials(rng, np.asarray(v))
                                      if np.asarray(v).dtype.kind == "f" else np.asarray(v)
                                      for k, v in given.items()}})
    return compare(reference, candidate, n=n, rtol=rtol, atol=atol, seed=seed, dims=dims,
                   shapes=shapes, fill="special", stepwise=stepwise, feeds=feeds)


#: Ops whose onnxruntime kernels turn NaN inputs into finite outputs: their activations clamp
#: their inputs (MLAS's logistic and tanh), which the ONNX spec leaves undefined; the contrib
#: int8 LSTM also quantizes its inputs (a contrib op as ``domain::name``).
NAN_SQUASHERS = ("GRU", "LSTM", "RNN", "com.microsoft::DynamicQuantizeLSTM")


def lowered_nan_squashers(reference: ModelLike, candidate: ModelLike) -> list[str]:
    """The op types of :data:`NAN_SQUASHERS` of which ``reference`` (its If/Loop/Scan bodies
    included) has more than ``candidate``: lowered into standard ops, which propagate NaN as ONNX's Sigmoid and Tanh
    do, so a NaN/Inf check would compare onnxruntime's clamping against that (callers skip it
    and say why)."""
    def count(model: ModelLike) -> dict:
        ops = [n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
               for g in iter_graphs(_load_header(model).graph) for n in g.node]
        return {op: ops.count(op) for op in NAN_SQUASHERS}

    ref, cand = count(reference), count(candidate)
    return [op for op in NAN_SQUASHERS if ref[op] > cand[op]]


def nan_squash_reason(ops: list[str]) -> str:
    """Why the NaN/Inf check is skipped for the lowered ``ops`` (:func:`lowered_nan_squashers`),
    one clause without the "skipped" lead (``optimize``'s summary puts it in parentheses)."""
    return (f"onnxruntime's {'/'.join(ops)} kernels clamp the inputs of their activations, so a "
            "NaN input gives finite outputs (the ONNX spec leaves it undefined); the lowered "
            "gate math propagates NaN as Sigmoid/Tanh do")


def nan_squash_note(ops: list[str]) -> str:
    """:func:`nan_squash_reason` as a line of its own, as ``compare`` prints it."""
    return "NaN/Inf check skipped: " + nan_squash_reason(ops)
