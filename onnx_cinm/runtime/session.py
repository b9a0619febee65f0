"""The CINM execution provider: run an optimized model with host parts in onnxruntime and device
nodes in their device kernels, with a per-node profile.

onnxruntime has no Python API for a real execution provider, so this class does an EP's job
around it (DESIGN.md §5):

- *GetCapability*: a cinm node is claimed when its device has a runtime kernel in the chosen
  mode: crossbar nodes run their ``.xbar`` file in the simulator; UPMEM nodes run their generated
  C in the emulator (``upmem_mode="emulate"``) or stay inside the host partition, where
  onnxruntime executes their reference body and the profile charges the cost model's figures
  (``upmem_mode="model"``, the default: numpy-exact and fast).
- *Partitioning*: every other node goes to a host partition. A host node joins the earliest
  partition all its inputs are ready for (a *stage*: host partition ``s`` runs, then the device
  nodes of stage ``s``), so each partition is a maximal host subgraph between device nodes. Each
  partition is one onnxruntime session, created once and reused.
- Arrays cross between partitions and kernels as numpy arrays without copies where the layouts
  allow.
- Two fusions keep the provider from doing work a device would not: a device node whose first
  input is made by a model-mode Im2Col that only it reads may compute from the Im2Col's input
  (:meth:`Device.from_patches`: a crossbar product in ideal mode runs as one onnxruntime
  convolution, the patches never copied, when that is measured faster); and a model-mode Relu
  that alone reads a device kernel's output is applied right after it (in place, or inside
  that convolution) rather than in a host partition of its own. Both are still charged by
  their cost model and get their profile rows (with no wall time when folded into the
  convolution). Likewise a host Relu or Add of a constant (a bias) that alone reads a device
  kernel's output runs on it in numpy, in place, with onnxruntime's bits
  (:meth:`InferenceSession._post_op`): a small model's layer is then one step, not a kernel
  and an onnxruntime call.
- What does not depend on the inputs is worked out when the session is created: the run is a
  flat list of steps (partitions with their native run call, device nodes with their inputs,
  outputs and profile labels); kernels keep plans per input shape (Im2Col's copies, the
  crossbar simulator's steady inferences, :mod:`onnx_cinm.sim.crossbar`); a feed is checked
  once per (name, dtype, shape).
- A device node whose input is empty (a zero-size batch) launches no kernel: its outputs come
  from the op's reference body in onnxruntime (empty, or a reduction's identity); the profile
  records it with mode ``empty``.

The kernels are the files under ``<model>.cinm/`` listed in its manifest. When the session is
created, before anything else, the folder must be the model's own (the kernel digest the model
records, :func:`onnx_cinm.artifacts.check_pair`) and every file must have its listed hash: that
catches a stale or swapped folder, not tampering. The folder is untrusted input: paths stay
inside it, and UPMEM kernels in emulate mode are regenerated from the model's plan.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from .. import artifacts, devices, frontend
from ..analysis import op_info, tensor_infos
from ..devices.base import accepts_keyword
from ..dialects import cinm
from ..errors import CinmError
from ..options import OptionSpec, from_text, option, specs, validate
from ..passes.branches import branch_model
from ..passes.graph_names import names_used_by
from ..sim import blas, scratch
from . import numpy_kernels, profile

PROVIDER = "CinmExecutionProvider"
#: The kind (:meth:`InferenceSession.partitions`) of a cinm op on the host that the provider
#: runs with a numpy kernel, outside any host partition.
HOST_KERNEL = "host-numpy"
#: The most elements (at the planned sizes) of a host Relu or bias Add run in numpy on a
#: device kernel's output (:meth:`InferenceSession._post_op`) instead of in its host
#: partition. Measured on the project machine (1 thread): numpy's in-place Relu takes about
#: 0.55 ns per float32 element (a mask, then a masked copy), onnxruntime's 0.35 ns plus 12-15
#: us per call: even at about 60k elements; and on light SqueezeNet's 1x64x111x111 first
#: activation numpy took several times onnxruntime's time.
POST_MAX_ELEMENTS = 65536
#: ``graph_optimization`` values: onnxruntime's GraphOptimizationLevel names for the host
#: partitions (``compare`` uses ``disable_all``, its reference's setting, so ORT's own fusions
#: are not mistaken for our error).
_GRAPH_OPT_LEVELS = tuple(blas.GRAPH_LEVELS)


@dataclass(frozen=True)
class ProviderOptions:
    """The provider's own options (each device adds ``<name>_mode``, :func:`mode_options`)."""

    intra_op_threads: int = option(0, low=0, help="onnxruntime threads per host partition "
                                   "(0: onnxruntime's default)")
    graph_optimization: str = option("all", choices=_GRAPH_OPT_LEVELS,
                                     help="onnxruntime's graph optimization level of the host "
                                     "partitions (all: extended for those without a convolution)")
    blas_threads: int = option(1, low=0, help="numpy BLAS threads while a run is active (0: the "
                               "library's own setting)")
    matmul: str = option("auto", choices=blas.MATMULS,
                         help="the crossbar simulator's product kernel")


def mode_options() -> dict[str, tuple]:
    """``{"<device>_mode": (modes, the default first)}`` for every device with a choice of run
    modes (:attr:`Device.modes`), e.g. ``upmem_mode``: ``("model", "emulate")``."""
    return {f"{d.name}_mode": d.modes for d in devices.all_devices()
            if d.paradigm != "host" and len(d.modes) > 1}


def provider_option_specs() -> dict[str, OptionSpec]:
    """Every provider option, typed (:mod:`onnx_cinm.options`): :class:`ProviderOptions`, one
    ``<device>_mode`` per device with a choice of run modes, its default the device's first
    mode, and each device's run options (:meth:`Device.run_option_specs`, e.g. the crossbar's
    ``cim_time_s``; unset by default: the kernels run as compiled)."""
    out = specs(ProviderOptions, "", PROVIDER)
    for key, modes in mode_options().items():
        dev = key.removesuffix("_mode")
        out[key] = OptionSpec(key, str, modes[0], help=f"how the {dev} nodes run", choices=modes,
                              owner=dev, section=PROVIDER, name=key)
    for d in devices.all_devices():
        out.update(d.run_option_specs())
    return out


def run_options_of(dev, options: dict) -> dict:
    """The run options of device ``dev`` set in the provider ``options``, by field name (what
    :meth:`Device.kernel` takes)."""
    return {spec.name: options[key] for key, spec in dev.run_option_specs().items()
            if options.get(key) is not None}


def check_provider_options(given: dict) -> dict:
    """``given`` provider options checked against :func:`provider_option_specs` and completed
    with the defaults. A value may be given as text, as onnxruntime's own provider options are
    (``{"cim_seed": "3", "cim_effects": "none"}``): it is read as ``--provider-option
    KEY=VALUE`` reads it (:func:`onnx_cinm.options.from_text`). Raises CinmError naming an
    unknown option (and the known ones) or a bad value."""
    schema = provider_option_specs()
    out = {k: s.default for k, s in schema.items()}
    for key, value in given.items():
        spec = schema.get(key)
        if spec is not None and spec.type is not str and isinstance(value, str):
            out[key] = from_text(spec, value)
        else:
            out.update(validate({key: value}, schema, f"{PROVIDER} option"))
    return out


def _modeled(at: dict, dev) -> dict:
    return {"latency_s": None, "energy_j": None} if dev is None else \
        (lambda r: {"latency_s": r.cost.latency_s, "energy_j": r.cost.energy_j} if r else
         {"latency_s": None, "energy_j": None})(dev.recorded(at))


def _load_of(at: dict, dev) -> dict | None:
    """The one-time load a node's recorded plan charges (``Priced.load_s``/``load_j``), in the
    shape of a crossbar kernel's ``load_metrics``; None if it has none."""
    r = dev.recorded(at) if dev is not None else None
    if r is None or not (r.load_s or r.load_j):
        return None
    return {"tile_writes": 0, "latency_s": float(r.load_s), "energy_j": float(r.load_j)}


@dataclass
class _Partition:
    """One host partition: its nodes, the onnxruntime session over them, inputs and outputs."""

    index: int
    stage: int
    nodes: list
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    session: object = None
    modeled: list = field(default_factory=list)  # device nodes run in model mode inside it
    #: their profile records but ``run``: the cost model's figures, computed once
    modeled_records: list = field(default_factory=list)
    #: ``call(output names, feeds, run options)``: the session's run (:func:`_run_call`)
    call: object = None
    label: str = ""  # its profile record's node and op_type
    op_text: str = ""
    #: its inputs declared by the arriving arrays' element type and rank (_relax)
    relaxed: bool = False


#: Ops onnxruntime's layout optimizations (``all`` over ``extended``: the NCHWc blocked
#: layout of its CPU convolutions, the NHWC layout of its quantized ones) are built around.
_LAYOUT_OPS = frozenset({"Conv", "ConvTranspose", "QLinearConv", "ConvInteger", "FusedConv",
                         "NhwcConv", "QLinearConvTranspose"})


def _partition_level(level: str, nodes) -> str:
    """The graph optimization level a host partition of ``nodes`` runs at: ``level`` (a key of
    :data:`onnx_cinm.sim.blas.GRAPH_LEVELS`), but ``extended`` (every fusion, no layout
    transform: :data:`onnx_cinm.sim.blas.CONV_PLAIN_LEVEL`) for ``all`` when no node is a
    convolution (:data:`_LAYOUT_OPS`). Without a convolution the layout level only wraps the
    partition's pools in reorders to the blocked layout and back: measured on the project
    machine (1 thread, best of 50), a MaxPool 3x3/2 of 1x64x111x111 (light SqueezeNet's first,
    a partition of its own) took 436 us at ``all`` and 285 us at ``extended``."""
    if level == "all" and not any(n.op_type in _LAYOUT_OPS for n in nodes):
        return blas.CONV_PLAIN_LEVEL
    return level


def _run_call(sess):
    """The callable that runs onnxruntime session ``sess``: its native ``run`` (what
    ``InferenceSession.run`` calls after checking the feed's names and ownership, which the
    provider's own partitions do not need: it builds the feeds from the partition's inputs),
    or the public ``run`` if this onnxruntime has no ``_sess``. Measured on the project
    machine (onnxruntime 1.24, one Relu on 1x32x150): 11.4 us per call against 18.7 us, on
    each of the 18 host partitions a small model runs per inference."""
    native = getattr(sess, "_sess", None)
    return native.run if native is not None and hasattr(native, "run") else sess.run


def _relu_in_place(inputs: list, attrs: dict) -> list:
    """cinm Relu on an array nothing else reads (:meth:`InferenceSession._post_op`): written in
    place."""
    x = inputs[0]
    return [np.maximum(x, 0, out=x) if isinstance(x, np.ndarray) and x.flags.writeable
            else np.maximum(x, 0)]


def _relu_like_onnxruntime(inputs: list, attrs: dict) -> list:
    """Relu of a host node on an array nothing else reads (:meth:`InferenceSession._post_op`),
    in place: the negative elements set to zero, the rest (``-0.0`` and NaN too) kept, as
    onnxruntime's Relu gives them (``np.maximum`` would turn ``-0.0`` into ``0.0``)."""
    x = inputs[0]
    if not (isinstance(x, np.ndarray) and x.flags.writeable):
        x = np.array(x)
    np.copyto(x, 0, where=x < 0)
    return [x]


def _add_bias(inputs: list, attrs: dict) -> list:
    """Add of a host node, a device output (input ``attrs["x"]``, nothing else reads it) and a
    constant (:meth:`InferenceSession._post_op`): in place when the constant broadcasts to the
    output's shape and dtype, else into a new array. IEEE addition commutes, so the order of
    the operands does not change a bit."""
    x, c = inputs[attrs["x"]], inputs[1 - attrs["x"]]
    if isinstance(x, np.ndarray) and x.flags.writeable and isinstance(c, np.ndarray) and \
            c.dtype == x.dtype:
        try:
            return [np.add(x, c, out=x)]
        except ValueError:  # c broadcasts x to a larger shape (checked before any write)
            return [np.add(inputs[0], inputs[1])]
    return [np.add(inputs[0], inputs[1])]


class _ModelKernel:
    """A node run by a numpy kernel (its op's semantics) and charged the cost model's figures
    from its recorded plan (:meth:`Device.recorded` of ``dev``); none on the host."""

    def __init__(self, fn, attrs: dict, dev) -> None:
        self.fn, self.attrs = fn, attrs
        self.metrics = _modeled(attrs, dev) if dev is not None else {}
        self.load_metrics = _load_of(attrs, dev)

    def __call__(self, inputs: list) -> tuple[list, dict]:
        return self.fn(inputs, self.attrs), dict(self.metrics)


@dataclass
class _DeviceNode:
    node: onnx.NodeProto
    stage: int
    device: str
    kernel: object
    mode: str
    label: str = ""  # its name in the profile
    outputs: list = field(default_factory=list)  # its non-empty output names
    inputs: list = field(default_factory=list)  # its input names ("" for an absent one)
    #: an Im2Col whose only reader computes from the Im2Col's input: that reader's node
    fused_into: _DeviceNode | None = None
    #: (the Im2Col node making input 0, f(x) -> (outputs, metrics) | None: Device.from_patches,
    #: [the view nodes between them]: _group_views)
    patches: tuple | None = None
    #: a Relu or bias Add applied to this node's output, the only reader of it (_post_op)
    post: _DeviceNode | None = None
    #: for such a post op: the producer's output it reads (any of a TopK's, say), dropped from
    #: a run's values once the post op has written its own output over it
    reads: str = ""
    #: a model-mode Relu a convolution computing this post op's producer may apply itself
    conv_act: bool = False
    #: for a Concat run in place (:meth:`_join_in_place`): the key of a run's values under
    #: which its producers leave the buffer they wrote their parts into
    joins: str = ""
    #: for a node whose convolution may write its (or its Relu's) output straight into its
    #: slice of a Concat's buffer: (that key, the slice, the buffer's shape (None first: the
    #: run's batch, in place when 1), its dtype)
    into: tuple | None = None
    #: for a node whose convolution may add a residual connection itself
    #: (:meth:`_attach_residuals`): (the host partition of that Add and Relu, run right after
    #: this node when the convolution does not, the Add's other input, "Relu" or None)
    residual: tuple | None = None


def _owner(d: _DeviceNode) -> _DeviceNode:
    """The device node whose step runs ``d``: ``d``, or the node it is fused into, followed to
    the end of the chain (a Relu applied after a bias Add applied after a product)."""
    while d.fused_into is not None:
        d = d.fused_into
    return d


def _group_views(g: onnx.GraphProto, inits: dict, uses: dict) -> dict:
    """The Reshape and Transpose nodes that split the patches of a cinm Im2Col into the groups
    of a grouped convolution for the cinm Gemm that alone reads them, ``{its output: attrs of
    :func:`_view`}``: ``Reshape(cols, [0, 0.., G, Kg])`` (``[n, *O, C*k] -> [n, *O, G, Kg]``,
    the shape an initializer) then ``Transpose`` ``[0, r+1, 1..r, r+2]`` (``-> [n, G, *O,
    Kg]``), each the only reader of its input, and the Reshape and Transpose merging the Gemm's
    ``[n, *O, G, Ng]`` back into ``[n, G*Ng, *O]`` after it. The provider runs them as numpy
    views (no
    copy: onnxruntime copies int32 patches in its Transpose, 7 s per inference on LEADER's
    three largest depthwise convolutions), and a device may compute the Gemm from the Im2Col's
    input (:meth:`InferenceSession._fuse_patches`)."""
    made = {o: n for n in g.node for o in n.output if o}
    readers: dict = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out = {}
    for t in g.node:
        if t.op_type != "Transpose" or t.domain not in ("", "ai.onnx") or len(t.output) != 1:
            continue
        r_node = made.get(t.input[0])
        if r_node is not None and len(r_node.output) != 1:
            continue
        src = made.get(r_node.input[0]) if r_node is not None and r_node.input else None
        gemm = readers.get(t.output[0], [])
        if src is None or r_node.op_type != "Reshape" or r_node.domain not in ("", "ai.onnx") \
                or len(r_node.input) != 2 or r_node.input[1] not in inits or \
                src.op_type != "Im2Col" or src.domain != cinm.DOMAIN or len(gemm) != 1 or \
                gemm[0].op_type != "Gemm" or gemm[0].domain != cinm.DOMAIN or \
                gemm[0].input[0] != t.output[0] or \
                any(uses.get(v, 0) != 1 for v in (src.output[0], r_node.output[0], t.output[0])):
            continue
        shape = [int(v) for v in numpy_helper.to_array(inits[r_node.input[1]]).reshape(-1)]
        r = len(cinm.node_attrs(src)["kernel_shape"])
        perm = next(([int(p) for p in a.ints] for a in t.attribute if a.name == "perm"), None)
        if len(shape) != r + 3 or any(shape[:r + 1]) or min(shape[r + 1:]) < 1 or \
                perm != [0, r + 1] + list(range(1, r + 1)) + [r + 2]:
            continue
        out[r_node.output[0]] = {"shape": shape, "groups": shape[r + 1]}
        out[t.output[0]] = {"perm": perm}
        # the Gemm's [n, *O, G, Ng] merged back into channels: Reshape [0.., G*Ng] then
        # Transpose [0, r+1, 1..r] (-> [n, G*Ng, *O]): views of a grouped convolution's output
        r2 = readers.get(gemm[0].output[0], [])
        t2 = readers.get(r2[0].output[0], []) if len(r2) == 1 and len(r2[0].output) == 1 else []
        if len(t2) != 1 or r2[0].op_type != "Reshape" or r2[0].domain not in ("", "ai.onnx") or \
                len(r2[0].input) != 2 or r2[0].input[0] != gemm[0].output[0] or \
                r2[0].input[1] not in inits or t2[0].op_type != "Transpose" or \
                t2[0].domain not in ("", "ai.onnx") or len(t2[0].output) != 1 or \
                any(uses.get(v, 0) != 1 for v in (gemm[0].output[0], r2[0].output[0])):
            continue
        shape2 = [int(v) for v in numpy_helper.to_array(inits[r2[0].input[1]]).reshape(-1)]
        perm2 = next(([int(p) for p in a.ints] for a in t2[0].attribute if a.name == "perm"),
                     None)
        if len(shape2) == r + 2 and not any(shape2[:r + 1]) and shape2[r + 1] >= 1 and \
                perm2 == [0, r + 1] + list(range(1, r + 1)):
            out[r2[0].output[0]] = {"shape": shape2}
            out[t2[0].output[0]] = {"perm": perm2}
    return out


def _concat(inputs: list, attrs: dict) -> list:
    """A Concat of ``inputs[:-1]`` along ``attrs["axis"]``; ``inputs[-1]`` is the buffer its
    producers were given to write their parts into (:attr:`_DeviceNode.into`), or None. When
    every part is its slice of that buffer (the same memory, at its offset, of its shape) the
    buffer is the result, nothing copied; otherwise numpy concatenates them."""
    *parts, buf = inputs
    if buf is not None and _fills(buf, parts, attrs["axis"]):
        return [buf]
    return [np.concatenate(parts, axis=attrs["axis"])]


def _fills(buf: np.ndarray, parts: list, axis: int) -> bool:
    """Whether ``parts`` are, in order, the consecutive slices along ``axis`` of C-contiguous
    ``buf`` that fill it, each in ``buf``'s own memory (not a copy of it)."""
    if not buf.flags.c_contiguous:
        return False
    at = buf.__array_interface__["data"][0]
    step = buf.itemsize * math.prod(buf.shape[axis + 1:])
    for x in parts:
        if type(x) is not np.ndarray or x.dtype != buf.dtype or x.ndim != buf.ndim or \
                x.shape[:axis] != buf.shape[:axis] or x.shape[axis + 1:] != buf.shape[axis + 1:] \
                or x.__array_interface__["data"][0] != at or not x.flags.c_contiguous:
            return False
        at += step * x.shape[axis]
    return at == buf.__array_interface__["data"][0] + buf.nbytes


def _view(inputs: list, attrs: dict) -> list:
    """A Reshape (``attrs["shape"]``, 0 keeping the input's dim) or Transpose
    (``attrs["perm"]``) of :func:`_group_views` as a numpy view of ``inputs[0]`` (a Reshape
    copies when numpy cannot view it)."""
    x = inputs[0]
    if "perm" in attrs:
        return [np.transpose(x, attrs["perm"])]
    return [np.reshape(x, [x.shape[i] if v == 0 else v for i, v in enumerate(attrs["shape"])])]


def _declared(name: str, vi: onnx.ValueInfoProto | None, value=None) -> onnx.ValueInfoProto:
    """How a model the provider cuts out of the optimized one (a host partition, an If branch)
    declares ``name``, a tensor crossing into or out of it.

    With ``vi`` (the whole model's graph input or value_info entry for ``name``, or its
    graph-output entry reduced to the element type, :func:`_element_type_only`): its
    type as the whole model knows it, element type and shape, each dim a number, a symbolic
    ``dim_param`` or open as it is there (rank kept), so no op's shape inference in the part
    sees less than in the whole model: onnx's Resize takes an unranked or ``[?]`` ``sizes`` for
    0 elements and refuses the node; declared ``[4]``, as the whole model infers it, it runs.
    Without a typed entry: the element type and rank of ``value`` (the array arriving there at
    the first run), if given; else no type (onnxruntime infers an output's)."""
    if vi is not None and vi.HasField("type") and (
            not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type):
        return onnx.ValueInfoProto(name=name, type=vi.type)
    if value is None:
        return onnx.ValueInfoProto(name=name)
    a = np.asarray(value)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                         [None] * a.ndim)


def _element_type_only(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """``vi`` without its shape (a tensor's element type alone; another type as it is)."""
    if not vi.type.HasField("tensor_type"):
        return vi
    return helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, None)


def _inside(if_label: str, branch: str, label: str) -> str:
    """The profile's name of node or partition ``label`` of an If's branch:
    ``/dec/If_1[then] /dec/rnn/LSTM/Gemm``, ``/dec/If_1[else] host partition 0``
    (:func:`onnx_cinm.dialects.cinm.branch_label`, as the report names them)."""
    return cinm.branch_label(if_label, branch) + label


def _has_device_nodes(node: onnx.NodeProto) -> bool:
    """True for an If whose branches (nested bodies included) hold a cinm op placed on a
    device: the provider runs it itself (:class:`_IfKernel`)."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
        return False
    return any(n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device", "host") != "host"
               for g in frontend.subgraphs(node) for n in cinm.all_nodes(g))


class _IfKernel:
    """An If whose branches hold device nodes, run by the provider: the condition picks the
    branch, which runs as a session of its own (:meth:`InferenceSession._branch`: its host
    partitions in onnxruntime, its device nodes in their kernels) on the values of the outer
    graph it reads. An If without device nodes stays inside its host partition.

    Each branch becomes a model: its nodes, its initializers plus the outer initializers it
    reads, an input for every other outer value it reads (declared as the outer graph declares
    it, :func:`_declared`, or at the first run by the element type and rank of the arrays that
    arrive). Sessions are built when the
    parent is (both branches: their kernels are loaded once), or at the first run of a branch
    whose inputs have no known type."""

    def __init__(self, parent: "InferenceSession", node: onnx.NodeProto) -> None:
        self.parent, self.node = parent, node
        self.branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        self.sessions: dict = {}
        self._lock = threading.Lock()

    def _model(self, branch: str, values: dict | None) -> onnx.ModelProto | None:
        """Branch ``branch`` as a model (:func:`onnx_cinm.passes.branches.branch_model`, with
        the branch's value_info), or None when an input's type is not known yet."""
        graph, parent = self.branches[branch], self.parent

        def typed(n):
            vi = _declared(n, parent._vis.get(n), None if values is None else values.get(n))
            return vi if vi.HasField("type") else None

        m = branch_model(parent._model, graph, weights=True, input_type=typed,
                         inits=parent._inits, name=graph.name or branch)
        if m is not None:
            m.graph.value_info.extend(graph.value_info)
        return m

    def build_eagerly(self) -> None:
        """Build the sessions of the branches whose inputs have known types."""
        for branch in self.branches:
            m = self._model(branch, None)
            if m is not None:
                self.sessions[branch] = InferenceSession._branch(self.parent, m)

    def run(self, values: dict, run_index: int, label: str) -> tuple[list, list]:
        """``(the If's outputs, the profile records of the branch that ran)``; the records'
        ``node`` says the If and branch (:func:`_inside`). Raises CinmError on a condition
        that is not one element."""
        cond = np.asarray(values[self.node.input[0]])
        if cond.size != 1:
            raise CinmError(f"If '{label}': its condition has {cond.size} elements, expected 1")
        branch = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        sess = self.sessions.get(branch)
        if sess is None:
            with self._lock:
                sess = self.sessions.get(branch)
                if sess is None:
                    sess = self.sessions[branch] = InferenceSession._branch(
                        self.parent, self._model(branch, values))
        feed = {vi.name: values[vi.name] for vi in sess._inputs}
        out, records = sess._execute(feed, run_index)
        names = [o.name for o in self.branches[branch].output]
        return sess._values_of(out, names), [{**r, "node": _inside(label, branch, r["node"])}
                                             for r in records]


class InferenceSession:
    """Run an optimized model like ``onnxruntime.InferenceSession``, with device kernels.

    Args:
        path_or_model: an optimized ``.onnx`` path (its kernels in ``<path>.cinm/``,
            :func:`onnx_cinm.artifacts.find_artifact_dir`) or a
            ModelProto (then ``kernel_dir`` names the kernel folder, if it has device kernels).
        providers: ``["CinmExecutionProvider", "CPUExecutionProvider"]`` (default) or
            ``["CPUExecutionProvider"]`` (everything in onnxruntime: the reference bodies).
        provider_options: one dict per provider; the CINM provider reads ``<device>_mode``
            per device with a choice of run modes (:func:`mode_options`; ``upmem_mode``:
            ``"model"``, the default, or ``"emulate"``), ``intra_op_threads`` (onnxruntime threads per
            partition, 0 = its default), ``graph_optimization`` (onnxruntime's graph
            optimization level of the host partitions: ``disable_all``, ``basic``,
            ``extended`` or ``all``, the default; :func:`_partition_level`),
            ``blas_threads`` (numpy BLAS threads while a run is active, default 1, 0 = the
            library's own setting) and ``matmul`` (the
            crossbar simulator's product kernel: ``"auto"``, the default, ``"numpy"`` or
            ``"onnxruntime"``; see :mod:`onnx_cinm.sim.blas`), and each device's run options
            (:meth:`Device.run_option_specs`, e.g. the crossbar's ``cim_time_s``), handed to
            its kernels.
        kernel_dir: the kernel folder when ``path_or_model`` is a ModelProto.

    Raises:
        CinmError: unreadable model, unknown provider or option, a missing or stale kernel file.
    """

    def __init__(self, path_or_model, providers=None, provider_options=None, kernel_dir=None):
        providers = list(providers or [PROVIDER, "CPUExecutionProvider"])
        for p in providers:
            if p not in (PROVIDER, "CPUExecutionProvider"):
                raise CinmError(f"unknown provider '{p}' (available: {PROVIDER}, CPUExecutionProvider)")
        if provider_options is not None and len(provider_options) != len(providers):
            raise CinmError("provider_options needs one dict per provider")
        given = {}
        if provider_options and PROVIDER in providers:
            given = provider_options[providers.index(PROVIDER)] or {}
        opts = check_provider_options(given)
        try:
            self._kernels = blas.MatrixKernels(opts["blas_threads"], opts["matmul"],
                                               opts["graph_optimization"])
        except ValueError as e:
            raise CinmError(f"{PROVIDER}: {e}") from None
        self._providers = providers
        self._options = opts
        # what device kernels derive from the constants, one copy for the kernels over the
        # same ones (Device.kernel's ``shared``): an unrolled int8 LSTM's 80 steps per layer
        # held 80 float64 copies of its recurrent weights, 4.6 GB for three layers of 768
        self._shared: dict = {}
        if isinstance(path_or_model, onnx.ModelProto):
            model = path_or_model
            root = Path(kernel_dir) if kernel_dir else None
            self._label_text = "the model"
        else:
            self._label_text = f"model '{path_or_model}'"
            model = frontend.load_model(path_or_model)
            root = Path(kernel_dir) if kernel_dir else artifacts.find_artifact_dir(path_or_model)
        self._setup(model, root)
        if not isinstance(path_or_model, onnx.ModelProto) and not kernel_dir:
            self._own_root = artifacts.artifact_dir(path_or_model)
        self._build(use_devices=PROVIDER in providers)

    def _setup(self, model: onnx.ModelProto, root) -> None:
        self._model = model
        self._unrolled = frontend.unrolled_dims(model)  # sizes its graph is fixed to
        self._root = root
        self._own_root = None  # the folder the model's name gives, if ``root`` was looked up
        self._profile: list[dict] = []
        self._profile_lock = threading.Lock()
        #: the output memory every kernel of a run draws from (an If branch's session runs
        #: inside its parent's run, so its kernels draw from the parent's)
        self._scratch = scratch.Scratch()
        self._runs = 0
        self._feeds_ok: set = set()  # (name, dtype, shape) of feeds _check_feed passed
        self._inputs = [vi for vi in model.graph.input
                        if vi.name not in {i.name for i in model.graph.initializer}]
        self._outputs = list(model.graph.output)

    @classmethod
    def _branch(cls, parent: "InferenceSession", model: onnx.ModelProto) -> "InferenceSession":
        """A session over ``model``, an If branch made a model (:class:`_IfKernel`), sharing
        ``parent``'s options, matrix kernels, kernel folder, its checked manifest and its tensor
        infos (which cover the branches' tensors at the planned sizes)."""
        self = cls.__new__(cls)
        self._kernels, self._providers = parent._kernels, parent._providers
        self._shared = parent._shared
        self._options, self._label_text = parent._options, parent._label_text
        self._setup(model, parent._root)
        self._build(use_devices=True, manifest_kernels=parent._manifest_kernels,
                    infos=parent._infos)
        return self

    # ------------------------------------------------------------------ partitioning
    def _claim(self, node, infos, consts, manifest_kernels) -> tuple | None:
        """(device name, kernel, mode) if a device kernel runs ``node``, else None."""
        if node.domain != cinm.DOMAIN:
            return None
        at = cinm.node_attrs(node)
        dev_name = at.get("device", "host")
        fast = numpy_kernels.KERNELS.get(node.op_type)
        fast = fast() if fast else None  # the node's own kernel (it keeps its plans)
        if dev_name == "host":
            return (dev_name, _ModelKernel(fast, at, None), "numpy") if fast else None
        dev = devices.get_device(dev_name)
        mode = self._options.get(f"{dev_name}_mode", dev.modes[0])
        if mode == "model":
            return dev_name, (_ModelKernel(fast, at, dev) if fast else None), "model"
        if "kernel" not in at:
            return None
        if self._root is None:
            raise CinmError(f"node '{node.name}' runs on {dev_name} but no kernel folder was given")
        if at["kernel"] not in manifest_kernels:
            raise CinmError(f"node '{node.name}': kernel '{at['kernel']}' is not in "
                            f"{self._root / artifacts.MANIFEST}")
        node_consts = {n: consts[n] for n in node.input if n in consts}
        try:
            kernel = dev.kernel(op_info(node, infos), at, self._root, node_consts, mode,
                                run_options_of(dev, self._options), self._shared)
        except CinmError as e:  # a kernel file it cannot read: say whose, as the tables do
            raise self._named(e, node, dev_name) from None
        return None if kernel is None else (dev_name, kernel, mode)

    def _build(self, use_devices: bool, manifest_kernels: set | None = None,
               infos: dict | None = None) -> None:
        g = self._model.graph
        has_kernels = use_devices and any(
            n.domain == cinm.DOMAIN and any(a.name == "kernel" for a in n.attribute)
            for n in cinm.all_nodes(g))
        if manifest_kernels is None:  # a branch's session has its parent's, checked
            manifest_kernels = set()
            if has_kernels and self._root is not None:
                manifest = artifacts.check_pair(self._model, self._root, self._label_text,
                                                own=self._own_root)
                manifest_kernels = {k["kernel"] for k in manifest["kernels"]}
        self._manifest_kernels = manifest_kernels
        if infos is None:  # a branch's session has its parent's (they cover the bodies)
            infos = tensor_infos(self._model, infer=False) if has_kernels else {}
        self._infos = infos
        inits = {i.name: i for i in g.initializer}
        consts: dict = {}
        if has_kernels:
            consts = {n: numpy_helper.to_array(inits[n]) for node in g.node
                      if node.domain == cinm.DOMAIN for n in node.input if n in inits}
        ready: dict[str, int] = {vi.name: 0 for vi in self._inputs}
        for name in inits:
            ready[name] = 0
        parts: dict[int, _Partition] = {}
        self._device_nodes: list[_DeviceNode] = []
        uses: dict[str, int] = {o.name: 1 for o in g.output}  # readers of each value
        for node in g.node:
            for n in names_used_by(node):
                uses[n] = uses.get(n, 0) + 1
        made_by: dict[str, _DeviceNode] = {}  # output name -> the device node making it
        views = _group_views(g, inits, uses) if use_devices else {}
        for node in g.node:
            stage = max((ready.get(n, 0) for n in names_used_by(node)), default=0)
            claim = self._claim(node, infos, consts, manifest_kernels) if use_devices else None
            view = views.get(node.output[0]) if len(node.output) == 1 else None
            if view is not None:  # a view of grouped patches (_group_views)
                claim = ("host", _ModelKernel(_view, view, None), "numpy")
                consts.update((n, numpy_helper.to_array(inits[n])) for n in node.input[1:]
                              if n in inits)
            if claim is None and use_devices and _has_device_nodes(node):
                claim = ("If", _IfKernel(self, node), "branch")
            if claim is None and use_devices:
                axis = self._concat_axis(node, made_by, uses, infos)
                if axis is not None:
                    claim = ("host", _ModelKernel(_concat, {"axis": axis}, None), "numpy")
            post = self._post_op(node, claim, made_by, uses, inits, consts, infos)
            if post is not None:  # applied by the provider to its producer's output
                self._device_nodes.append(post)
                made_by.update((o, post) for o in node.output if o)  # a chain: Add, Relu
                for o in node.output:
                    ready[o] = post.stage + 1
                continue
            if claim is not None and claim[1] is not None:
                dev_name, kernel, mode = claim
                self._device_nodes.append(_DeviceNode(node, stage, dev_name, kernel, mode))
                made_by.update((o, self._device_nodes[-1]) for o in node.output if o)
                for o in node.output:
                    ready[o] = stage + 1
                continue
            part = parts.get(stage)
            if part is None:
                part = parts[stage] = _Partition(len(parts), stage, [])
            part.nodes.append(node)
            if claim is not None:  # model mode: runs in onnxruntime, charged by the cost model
                part.modeled.append((node, claim[0]))
            for o in node.output:
                ready[o] = stage
        self._parts = [parts[s] for s in sorted(parts)]
        for i, p in enumerate(self._parts):  # number the partitions in execution order
            p.index = i
        # partition boundaries
        consumed_later: dict[str, set] = {}
        for p in self._parts:
            for node in p.nodes:
                for n in names_used_by(node):
                    consumed_later.setdefault(n, set()).add(("p", p.index))
        for d in self._device_nodes:
            for n in names_used_by(d.node):  # an If's: its condition and what its branches read
                consumed_later.setdefault(n, set()).add(("d", id(d)))
        graph_outputs = {o.name for o in g.output}
        # a graph output's declaration gives its element type only: an exporter may declare
        # an output [1, 4] the model computes [n, 4] (onnxruntime only warns), which, given to
        # a partition reading it, would refuse batch 2; shapes come from value_info and inputs
        vis = {vi.name: _element_type_only(vi) for vi in g.output}
        vis.update((vi.name, vi) for vi in list(g.input) + list(g.value_info))
        for p in self._parts:
            produced = [o for node in p.nodes for o in node.output if o]
            pset = set(produced)
            needed = []
            for node in p.nodes:
                for n in names_used_by(node):
                    if n not in pset and n not in inits and n not in needed:
                        needed.append(n)
            p.inputs = needed
            p.outputs = [o for o in produced
                         if o in graph_outputs or (consumed_later.get(o, set()) - {("p", p.index)})]
            # a boundary input without a known type (e.g. produced inside a Loop body): the
            # session is built at the first run, from the arrays that arrive
            if all(n in vis for n in p.inputs):
                p.session = self._session(p, inits, vis)
                p.call = _run_call(p.session)
        self._inits, self._vis = inits, vis
        self._lazy_lock = threading.Lock()
        for d in self._device_nodes:
            if isinstance(d.kernel, _IfKernel):
                d.kernel.build_eagerly()
        self._empty_sessions: dict = {}
        self._fused_records: dict = {}  # id(device node) -> its record (_fused_record)
        self._consts = {n: consts[n] for d in self._device_nodes for n in d.node.input if n in consts}
        # what every run would otherwise recompute per node: labels, outputs, modeled figures
        for d in self._device_nodes:
            d.label, d.outputs = self._label(d.node), [o for o in d.node.output if o]
            d.inputs = list(d.node.input)
        self._fuse_patches(consumed_later, graph_outputs)
        self._join_in_place(infos)
        for p in self._parts:
            p.modeled_records = [
                {"node": self._label(node), "op_type": node.op_type, "device": dev,
                 "mode": "model", "wall_s": None, "basis": "plan",
                 **_modeled(cinm.node_attrs(node), devices.get_device(dev)),
                 "writes": 0, "bytes_moved": None, "nodes": 1, "in_partition": True}
                for node, dev in p.modeled]
        # the execution order, once: per stage, its host partitions, then its device nodes
        self._schedule = [(s, [p for p in self._parts if p.stage == s],
                           [d for d in self._device_nodes if d.stage == s])
                          for s in sorted({p.stage for p in self._parts}
                                          | {d.stage for d in self._device_nodes})]
        # ... as one flat list of what a run calls: partitions, and the device nodes not run
        # by their reader (a fused Im2Col, views, a Relu applied after its producer)
        self._steps = [step for _, parts, devs in self._schedule
                       for step in parts + [d for d in devs if d.fused_into is None]]
        for p in self._parts:  # profile texts, not formatted at every run
            p.label, p.op_text = f"host partition {p.index}", f"{len(p.nodes)} nodes"
        self._attach_residuals(uses, infos)
        self._drops = self._last_uses()

    def _last_uses(self) -> list[list[str]]:
        """Per step of :attr:`_steps`, the values a run drops after it: those no later step
        reads (a step reads what its nodes use, its fused Im2Col, views and post ops
        included, and what an If's branches capture) and that are no graph output. Without
        it a run held every intermediate to its end: 1.5 GB of activations on DNSMOS at batch
        4 where onnxruntime keeps what is still to be read."""
        index = {id(step): i for i, step in enumerate(self._steps)}
        last: dict = {}
        for i, step in enumerate(self._steps):
            nodes = step.nodes if type(step) is _Partition else [step.node]
            for node in nodes:
                for n in node.output:  # made and never read: dropped after the step making it
                    if n:
                        last.setdefault(n, i)
                for n in names_used_by(node):
                    last[n] = max(last.get(n, i), i)
        for d in self._device_nodes:
            if d.residual is not None:  # its Add's partition runs in its step
                i = index[id(d)]
                for node in d.residual[0].nodes:
                    for n in list(names_used_by(node)) + [o for o in node.output if o]:
                        last[n] = max(last.get(n, i), i)
            if d.fused_into is None:
                continue
            i = index.get(id(_owner(d)))
            if i is None:
                continue
            for n in list(names_used_by(d.node)) + [o for o in d.node.output if o]:
                last[n] = max(last.get(n, i), i)
        keep = {o.name for o in self._outputs}
        drops: list = [[] for _ in self._steps]
        for n, i in last.items():
            if n not in keep:
                drops[i].append(n)
        return drops

    @staticmethod
    def _post_op(node, claim, made_by: dict, uses: dict, inits: dict, consts: dict,
                 infos: dict) -> _DeviceNode | None:
        """Elementwise work on a device kernel's output that would otherwise be a host
        partition of its own, applied by the provider right after the kernel runs, in numpy,
        in place (:attr:`_DeviceNode.post`): the node's input is made by a device kernel the
        provider runs (not a model-mode or If node), or by such a post op (a chain: a bias Add
        then a Relu), and only this node reads it. Two kinds:

        - a cinm Relu in model mode (charged by its device's cost model; a convolution
          computing the producer may apply it, :meth:`Device.from_patches`);
        - on the host (not claimed by a device): a Relu, or an Add of that output and a
          constant (an initializer: a bias), cinm or standard, on at most
          :data:`POST_MAX_ELEMENTS` elements at the planned sizes. A separate onnxruntime
          call costs 15-20 us (a small model's whole layer); numpy's copy-where and addition
          give onnxruntime's bits (:func:`_relu_like_onnxruntime`, :func:`_add_bias`).

        None otherwise."""
        model_relu = claim is not None and claim[1] is None and claim[2] == "model" and \
            node.op_type == "Relu" and node.domain == cinm.DOMAIN
        on_host = claim is None and node.op_type in ("Relu", "Add") and \
            (node.domain in ("", "ai.onnx") or
             (node.domain == cinm.DOMAIN and cinm.node_attrs(node).get("device") == "host"))
        if not (model_relu or on_host) or len(node.output) != 1 or \
                len(node.input) != (1 if node.op_type == "Relu" else 2):
            return None
        if on_host and not 0 < getattr(infos.get(node.output[0]), "numel", 0) <= POST_MAX_ELEMENTS:
            return None  # a large (or unknown) array: onnxruntime's one pass is faster
        x = next((i for i, n in enumerate(node.input) if n in made_by), None)
        if x is None:
            return None
        src = made_by[node.input[x]]
        if uses.get(node.input[x]) != 1 or src.post is not None or \
                isinstance(src.kernel, _IfKernel) or \
                (isinstance(src.kernel, _ModelKernel) and src.fused_into is None):
            return None
        if model_relu:
            at = cinm.node_attrs(node)
            post = _DeviceNode(node, src.stage, claim[0],
                               _ModelKernel(_relu_in_place, at, devices.get_device(claim[0])),
                               "model", fused_into=src, conv_act=True)
        elif node.op_type == "Relu":
            post = _DeviceNode(node, src.stage, "host",
                               _ModelKernel(_relu_like_onnxruntime, {}, None), "numpy",
                               fused_into=src)
        else:
            bias = node.input[1 - x]
            if bias not in inits or bias == node.input[x]:
                return None
            consts.setdefault(bias, numpy_helper.to_array(inits[bias]))
            post = _DeviceNode(node, src.stage, "host", _ModelKernel(_add_bias, {"x": x}, None),
                               "numpy", fused_into=src)
        src.post, post.reads = post, node.input[x]
        return post

    @staticmethod
    def _concat_axis(node, made_by: dict, uses: dict, infos: dict) -> int | None:
        """The axis of host Concat ``node`` when the provider runs it itself, in place
        (:func:`_concat`, :meth:`_join_in_place`), else None: every input is made by a device
        node and read by this Concat alone (not a graph output), and its output's shape is
        static from the axis on, with only 1s before it (each part then a contiguous block of
        it, a channel concatenation at batch 1: light SqueezeNet's fire modules) or a symbolic
        batch before the channels (in place at the runs of batch 1)."""
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or \
                len(node.input) < 2 or len(node.output) != 1:
            return None
        out = infos.get(node.output[0])
        shape = getattr(out, "shape", None)
        if shape is None or getattr(out, "dtype", None) is None:
            return None
        axis = cinm.node_attrs(node).get("axis")
        if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
            return None
        axis %= len(shape)
        if not all(isinstance(d, int) for d in shape[axis:]):
            return None
        lead = shape[:axis]
        if all(isinstance(d, int) for d in lead):
            if math.prod(lead) != 1:
                return None
        elif axis != 1:  # only a symbolic batch before the channels: 1 or not, at run time
            return None
        if len(set(node.input)) != len(node.input) or \
                any(n not in made_by or uses.get(n) != 1 for n in node.input):
            return None
        return axis

    def _join_in_place(self, infos: dict) -> None:
        """Give each Concat the provider runs (:meth:`_concat_axis`) a key for its buffer, and
        each of its producers whose convolution computes its part and takes an ``out`` array
        (:meth:`Device.from_patches`) the slice of that buffer to write it into
        (:attr:`_DeviceNode.into`): the parts then never move. Measured on the project
        machine: light SqueezeNet's eight Concats took 27-175 us each in onnxruntime."""
        writer = {}  # a value -> the device node whose patch runner makes it
        for d in self._device_nodes:
            if d.patches is None:
                continue
            last = d.post if d.post is not None and d.post.conv_act else d
            if last.post is None and len(last.outputs) == 1:
                writer[last.outputs[0]] = d
        for c in self._device_nodes:
            if not (isinstance(c.kernel, _ModelKernel) and c.kernel.fn is _concat):
                continue
            c.joins = f"\0concat {c.label}"
            axis = c.kernel.attrs["axis"]
            info = infos[c.outputs[0]]
            # a symbolic batch as None: the producer's batch at run time (_run_device)
            shape = tuple(v if isinstance(v, int) else None for v in info.shape)
            dtype = np.dtype(info.dtype)
            at = 0
            for n in c.inputs:
                part = getattr(infos.get(n), "shape", None)
                if part is None or len(part) != len(shape) or \
                        not all(isinstance(v, int) for v in part[axis:]):
                    break
                d = writer.get(n)
                if d is not None and accepts_keyword(d.patches[1], "out"):
                    d.into = (c.joins, (slice(None),) * axis + (slice(at, at + part[axis]),),
                              shape, dtype)
                at += part[axis]

    def _attach_residuals(self, uses: dict, infos: dict) -> None:
        """Give a host partition that is only a residual connection's Add (or Sum) of two
        inputs, then maybe a Relu of it, to the device node computing one of them by a
        convolution (:attr:`_DeviceNode.residual`) that takes a ``residual`` (its patch
        runner's keyword, :meth:`Device.from_patches`): the convolution adds the other input
        and applies the Relu itself, as onnxruntime fuses them in a whole model, and the
        partition runs, right after that node, only when it declines. Its output must be read
        by the Add alone, the other input be made by an earlier step (or be a graph input),
        both of one static float32 shape. Measured on the project machine (1 thread): light
        ResNet50's 16 Sum+Relu partitions took 0.4-0.8 ms each of its 75 ms run."""
        index = {id(step): i for i, step in enumerate(self._steps)}
        made_at = {}  # a value -> the index of the step making it
        for i, step in enumerate(self._steps):
            nodes = step.nodes if type(step) is _Partition else [step.node]
            for node in nodes:
                made_at.update((o, i) for o in node.output if o)
        for d in self._device_nodes:  # a fused node's (a post op's) in its owner's step
            owner = _owner(d)
            if owner is not d and id(owner) in index:
                made_at.update((o, index[id(owner)]) for o in d.outputs)
        by_output = {d.outputs[0]: d for d in self._device_nodes
                     if d.patches is not None and d.post is None and d.into is None
                     and len(d.outputs) == 1 and id(d) in index}
        attached = set()
        for p in self._parts:
            act = self._residual_of(p, uses)
            if act is None or p.session is None:
                continue
            add = p.nodes[0]
            for x in (0, 1):
                y, z = add.input[x], add.input[1 - x]
                d = by_output.get(y)
                if d is None or uses.get(y) != 1 or z in self._inits or \
                        made_at.get(z, -1) >= index[id(d)] or \
                        not accepts_keyword(d.patches[1], "residual"):
                    continue
                iy, iz = infos.get(y), infos.get(z)
                if iy is None or iz is None or iy.shape is None or iy.shape != iz.shape or \
                        not all(isinstance(v, int) for v in iy.shape) or \
                        iy.dtype != np.float32 or iz.dtype != np.float32:
                    continue
                d.residual = (p, z, act[0])
                attached.add(id(p))
                break
        if attached:
            self._steps = [s for s in self._steps if id(s) not in attached]

    @staticmethod
    def _residual_of(p: _Partition, uses: dict) -> tuple | None:
        """``(activation,)`` (``"Relu"`` or None) when partition ``p`` is an Add (or Sum) of two
        distinct inputs, then maybe a Relu that alone reads it, with one output; else None.
        Standard ops or cinm ones (on the host, or a device's in model mode, still charged by
        its cost model)."""
        if not 1 <= len(p.nodes) <= 2 or len(p.outputs) != 1:
            return None
        add = p.nodes[0]
        if add.op_type not in ("Add", "Sum") or add.domain not in ("", "ai.onnx", cinm.DOMAIN) or \
                len(add.input) != 2 or add.input[0] == add.input[1] or len(add.output) != 1:
            return None
        if len(p.nodes) == 1:
            return (None,) if p.outputs == [add.output[0]] else None
        relu = p.nodes[1]
        if relu.op_type != "Relu" or list(relu.input) != [add.output[0]] or \
                uses.get(add.output[0]) != 1 or p.outputs != [relu.output[0]] or \
                relu.domain not in ("", "ai.onnx", cinm.DOMAIN):
            return None
        return ("Relu",)

    def _fuse_patches(self, consumed: dict, graph_outputs: set) -> None:
        """Pair each Im2Col run by a numpy kernel (model mode) with its only reader, a device
        node whose device computes it from the Im2Col's input (:meth:`Device.from_patches`):
        the patches are then never materialized, unless that callable declines a run. The
        reader may take the patches through the views that split them into groups
        (:func:`_group_views`: a grouped convolution's Reshape and Transpose); the device
        then computes the grouped product (``groups``), if its ``from_patches`` takes
        ``groups`` (:func:`onnx_cinm.devices.base.accepts_keyword`: a plugin written before
        :meth:`Device.from_patches` took it is never asked for a grouped convolution's patches)."""
        by_id = {id(d): d for d in self._device_nodes}

        def only_reader(d):
            out = d.outputs[0] if len(d.outputs) == 1 else None
            readers = consumed.get(out, set())
            if out is None or out in graph_outputs or len(readers) != 1:
                return None
            kind, ref = next(iter(readers))
            e = by_id.get(ref) if kind == "d" else None
            if e is None or isinstance(e.kernel, _IfKernel) or not e.inputs or \
                    e.inputs[0] != out or out in e.inputs[1:]:
                return None
            return e

        for d in self._device_nodes:
            if d.node.op_type != "Im2Col" or d.node.domain != cinm.DOMAIN or \
                    not isinstance(d.kernel, _ModelKernel):
                continue
            e, between, groups = only_reader(d), [], 1
            if e is not None and e.node.op_type == "Reshape" and e.kernel.fn is _view:
                t = only_reader(e)
                if t is not None and t.node.op_type == "Transpose" and t.kernel.fn is _view:
                    between, groups = [e, t], e.kernel.attrs["groups"]
                    e = only_reader(t)
                else:
                    e = None
            if e is None:
                continue
            at = d.kernel.attrs
            geometry = (at["kernel_shape"], at["strides"], at["pads"], at["dilations"])
            dev = devices.get_device(e.device)
            if groups > 1 and not accepts_keyword(dev.from_patches, "groups"):
                continue
            act = "Relu" if e.post is not None and e.post.conv_act else None
            runner = dev.from_patches(e.kernel, geometry, act, groups=groups) if groups > 1 \
                else dev.from_patches(e.kernel, geometry, act)
            if runner is not None:
                for v in [d] + between:
                    v.fused_into = e
                e.patches = (d, runner, between)

    def _session(self, p: _Partition, inits: dict, vis: dict):
        g = self._model.graph
        used = set()
        for node in p.nodes:
            used |= names_used_by(node)
        # boundary tensors as the whole model declares them (_declared); outputs may go untyped
        # (onnxruntime infers them), inputs need a type (see _late_session)
        sub = helper.make_graph(
            p.nodes, f"{g.name or 'graph'}_host{p.index}",
            [_declared(n, vis.get(n)) for n in p.inputs],
            [_declared(n, vis.get(n)) for n in p.outputs],
            initializer=[inits[n] for n in inits if n in used])
        m = helper.make_model(sub, opset_imports=list(self._model.opset_import),
                              ir_version=self._model.ir_version)
        m.functions.extend(self._model.functions)
        so = ort.SessionOptions()
        blas.share_arena(so)
        so.graph_optimization_level = blas.graph_level(_partition_level(
            self._options["graph_optimization"], p.nodes))
        so.log_severity_level = 4  # a failed run raises one CinmError; no duplicate ORT log line
        # many sessions share the cores: idle threads must sleep, not spin, between partitions
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if self._options["intra_op_threads"]:
            so.intra_op_num_threads = int(self._options["intra_op_threads"])
        data = m.SerializeToString()
        try:
            return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - onnxruntime raises its own types
            pass
        # onnxruntime's graph optimizations can trip over a partition the plain graph runs
        # (its constant folding re-infers shapes, e.g. a Range fed by a folded [1] tensor)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
            raise CinmError(f"onnxruntime rejects host partition {p.index}: "
                            f"{str(e).splitlines()[0]}") from None

    # ------------------------------------------------------------------ the ORT-like API
    def get_inputs(self):
        """Graph inputs as onnxruntime ``NodeArg``-like objects (name, shape, type)."""
        return [_Arg.of(vi) for vi in self._inputs]

    def get_outputs(self):
        """Graph outputs as ``NodeArg``-like objects."""
        return [_Arg.of(vi) for vi in self._outputs]

    def get_providers(self) -> list[str]:
        """The providers in use, in priority order."""
        return list(self._providers)

    def get_provider_options(self) -> dict:
        """The CINM provider's options, defaults filled in."""
        return {PROVIDER: dict(self._options)} if PROVIDER in self._providers else {}

    def _check_feed(self, feed: dict) -> dict:
        """``feed`` checked against the model's inputs (names, dtypes, ranks, fixed and
        unrolled sizes), as arrays in input order. What passed is remembered by (name, dtype,
        shape) of numpy arrays, so a run on arrays like an earlier one's is not checked again
        (20 us per run on a one-input model)."""
        key = None
        if type(feed) is dict and all(type(a) is np.ndarray for a in feed.values()):
            key = tuple((n, a.dtype.str, a.shape) for n, a in feed.items())
            if key in self._feeds_ok:
                return {vi.name: feed[vi.name] for vi in self._inputs}
        out = self._checked_feed(feed)
        if key is not None:
            if len(self._feeds_ok) >= 16:  # a few shapes (dynamic batch), not every one
                self._feeds_ok.clear()
            self._feeds_ok.add(key)
        return out

    def _checked_feed(self, feed: dict) -> dict:
        if not isinstance(feed, dict):
            raise CinmError("input_feed must be a dict {input name: array}")
        names = {vi.name for vi in self._inputs}
        fixed = self._unrolled
        extra = set(feed) - names
        if extra:
            raise CinmError(f"unknown input(s) {', '.join(sorted(extra))} "
                            f"(the model's inputs: {', '.join(sorted(names))})")
        out = {}
        for vi in self._inputs:
            if vi.name not in feed:
                raise CinmError(f"input '{vi.name}' is missing")
            if vi.type.WhichOneof("value") != "tensor_type":  # a sequence or map: onnxruntime
                out[vi.name] = feed[vi.name]                   # checks it
                continue
            a = np.asarray(feed[vi.name])
            tt = vi.type.tensor_type
            want = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            if a.dtype != want:
                raise CinmError(f"input '{vi.name}' has dtype {a.dtype}, the model expects {want}")
            if tt.HasField("shape"):
                dims = tt.shape.dim
                if len(dims) != a.ndim:
                    raise CinmError(f"input '{vi.name}' has rank {a.ndim} {list(a.shape)}, the "
                                    f"model expects rank {len(dims)}")
                for i, d in enumerate(dims):
                    if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != a.shape[i]:
                        raise CinmError(f"input '{vi.name}' has shape {list(a.shape)}, the model "
                                        f"expects {_shape_text(vi)}")
                    if fixed and d.HasField("dim_param"):  # its Split would fail in ORT
                        frontend.check_unrolled_size(fixed, d.dim_param, a.shape[i],
                                                     f"input '{vi.name}'", self._label_text)
            out[vi.name] = a
        return out

    def run(self, output_names, input_feed: dict, run_options=None) -> list:
        """One inference. ``output_names``: names or None for all; returns arrays in that order.

        Raises CinmError for an unknown, missing or mis-shaped input or an unknown output name;
        the session stays usable.
        """
        feed = self._check_feed(input_feed)
        with self._kernels.active(), scratch.use(self._scratch):
            return self._run(output_names, feed)

    def _run(self, output_names, feed: dict) -> list:
        all_out = [o.name for o in self._outputs]
        names = list(output_names) if output_names else all_out
        bad = [n for n in names if n not in all_out]
        if bad:
            raise CinmError(f"unknown output(s) {', '.join(bad)} (outputs: {', '.join(all_out)})")
        with self._profile_lock:
            run_index = self._runs
            self._runs += 1
        values, records = self._execute(feed, run_index)
        with self._profile_lock:
            self._profile.extend(records)
        return self._values_of(values, names)

    def _values_of(self, values: dict, names: list) -> list:
        """``values[n]`` for each of ``names``; a name no node computes is a constant of the
        graph (an output that is an initializer)."""
        for n in names:
            if n not in values:
                init = next(i for i in self._model.graph.initializer if i.name == n)
                values[n] = numpy_helper.to_array(init)
        return [values[n] for n in names]

    def _execute(self, feed: dict, run_index: int, keep: dict | None = None) -> tuple[dict, list]:
        """Run every partition and device node once on ``feed``: ``(the graph's outputs and
        what else is still held, by name; the profile records of this run)``; each value is
        dropped after the last step that reads it (:meth:`_last_uses`). ``keep``: a copy of
        every tensor value present after each step is added to it, by name (see
        :meth:`run_keeping`)."""
        values = dict(feed)
        records: list = []
        pop = values.pop
        for step, drops in zip(self._steps, self._drops):
            if type(step) is not _Partition:
                self._run_device(step, values, records, run_index)
            else:
                self._run_partition(step, values, records, run_index)
            if keep is not None:
                _keep_new(values, keep)
            for n in drops:
                pop(n, None)
        return values, records

    def run_keeping(self, input_feed: dict) -> dict:
        """One inference that returns every tensor value it computes, by name: a copy of each
        as the step that made it left it (graph outputs, device nodes' and host partitions'
        outputs), for a check node by node (:func:`onnx_cinm.golden.compare_node_by_node`).
        A value computed inside a neighbour's kernel and never held (the patches of an
        Im2Col fused into its convolution, a convolution's output its Relu overwrote in
        place) is not among them. Not profiled; the kernels run as in :meth:`run`. Raises
        as :meth:`run`."""
        feed = self._check_feed(input_feed)
        keep: dict = {}
        with self._kernels.active(), scratch.use(self._scratch):
            self._execute(feed, self._runs, keep)
        return keep

    def _run_partition(self, p: _Partition, values: dict, records: list, run_index: int,
                       outs: list | None = None) -> None:
        """Run host partition ``p`` on ``values`` (its outputs added there, its profile
        records to ``records``); ``outs`` given: its outputs, computed by the convolution it
        is attached to (:meth:`_attach_residuals`), recorded with no wall time and its
        ``op_type`` saying so (``"2 in conv"``, :data:`onnx_cinm.runtime.profile.IN_CONV`)."""
        done = outs is not None
        if not done:
            if p.session is None:
                self._late_session(p, values)
            t0 = time.perf_counter()
            try:
                outs = p.call(p.outputs, {n: values[n] for n in p.inputs}, None)
            except Exception as e:  # noqa: BLE001 - onnxruntime's own error types
                outs = self._relax(p, values, e)
            wall = time.perf_counter() - t0
        else:
            wall = 0.0
        values.update(zip(p.outputs, outs))
        records.append({"run": run_index, "node": p.label,
                        "op_type": f"{len(p.nodes)}{profile.IN_CONV}" if done else p.op_text,
                        "device": "host", "mode": "onnxruntime", "wall_s": wall,
                        "latency_s": None, "energy_j": None, "writes": 0, "bytes_moved": 0,
                        "nodes": len(p.nodes), "basis": None})
        if p.modeled_records:
            records += [{"run": run_index, **r} for r in p.modeled_records]

    def _run_device(self, d: _DeviceNode, values: dict, records: list, run_index: int) -> None:
        """Run device node ``d`` on ``values`` (its outputs added there, its profile records
        to ``records``); a node computed from the input of the Im2Col making its first input
        (:attr:`_DeviceNode.patches`) runs that way when its callable accepts the run, and the
        Im2Col is recorded with no wall time of its own; otherwise the Im2Col runs first."""
        if isinstance(d.kernel, _IfKernel):
            outs, inner = d.kernel.run(values, run_index, d.label)
            values.update((o, v) for o, v in zip(d.node.output, outs) if o)
            records += inner
            return
        if d.patches is not None:
            src, runner, between = d.patches
            x = values[src.inputs[0]] if src.inputs[0] in values else self._consts[src.inputs[0]]
            t0 = time.perf_counter()
            res = d.residual
            try:
                if not isinstance(x, np.ndarray) or not x.size:
                    got = None
                elif res is not None:  # the residual's Add (and Relu) inside the convolution
                    got = runner(x, residual=values[res[1]], residual_activation=res[2])
                elif d.into is None:
                    got = runner(x)
                else:  # its part of a Concat's buffer, written in place
                    key, part, shape, dtype = d.into
                    if shape[0] is None:  # a symbolic batch: this run's, in place at 1
                        shape = (x.shape[0],) + shape[1:]
                    if shape[0] != 1 and None in d.into[2]:
                        got = runner(x)
                    else:
                        buf = values.get(key)
                        if buf is None:
                            buf = values[key] = scratch.take(shape, dtype)
                        got = runner(x, out=buf[part])
            except ValueError as e:
                raise self._named(CinmError(str(e).splitlines()[0]), d.node, d.device,
                                  "failed") from None
            except CinmError as e:
                raise self._named(e, d.node, d.device, "failed") from None
            if got is None:
                for v in [src] + between:
                    self._run_device(v, values, records, run_index)
            else:
                wall = time.perf_counter() - t0
                for v in [src] + between:
                    records.append(self._fused_record(v, run_index, d.label))
                records.append(self._record(d, run_index, wall, got[1], False))
                if res is not None:  # its outputs are the residual partition's
                    self._run_partition(res[0], values, records, run_index, got[0])
                    return
                post = d.post
                if post is not None and post.conv_act:  # the Relu was applied by the convolution
                    values[post.outputs[0]] = got[0][0]
                    records.append(self._fused_record(post, run_index, d.label))
                    d, post = post, post.post
                else:
                    values.update(zip(d.outputs, got[0]))
                if post is not None:  # the ops after it, in place on what only they read
                    self._run_device(post, values, records, run_index)
                    values.pop(post.reads, None)
                return
        ins = [(values[n] if n in values else self._consts[n]) if n else None for n in d.inputs]
        t0 = time.perf_counter()
        empty = any((x.size if isinstance(x, np.ndarray) else np.size(x)) == 0
                    for x in ins if x is not None)
        if d.joins:  # the buffer its producers wrote into, if any did
            buf = values.pop(d.joins, None)
            if not empty:
                ins.append(buf)
        if empty:  # nothing to compute: no kernel is launched (issue 12 #8)
            outs, metrics = self._run_empty(d, ins), {"latency_s": 0.0, "energy_j": 0.0,
                                                      "bytes_moved": 0}
        else:
            try:
                outs, metrics = d.kernel(ins)
            except ValueError as e:  # inputs the kernel cannot take (too small, ...)
                raise self._named(CinmError(str(e).splitlines()[0]), d.node, d.device,
                                  "failed") from None
            except CinmError as e:  # a kernel program's own error names only its file
                raise self._named(e, d.node, d.device, "failed") from None
        wall = time.perf_counter() - t0
        values.update(zip(d.outputs, outs))
        records.append(self._record(d, run_index, wall, metrics, empty))
        if d.post is not None:  # its Relu or bias, in place on the output only it reads
            self._run_device(d.post, values, records, run_index)
            values.pop(d.post.reads, None)
        if d.residual is not None:  # the convolution declined it: its partition adds it
            self._run_partition(d.residual[0], values, records, run_index)

    def _fused_record(self, d: _DeviceNode, run_index: int, owner: str) -> dict:
        """The record of model-mode node ``d`` computed inside the kernel of its neighbour
        labelled ``owner`` (an Im2Col or view before a convolution, a Relu it applies), with no
        wall time of its own (``fused_into``: ``owner``, which the profile's note explains):
        the same at every run but ``run``, so built once per session and copied."""
        rec = self._fused_records.get(id(d))
        if rec is None:
            rec = self._fused_records[id(d)] = {
                **self._record(d, 0, 0.0, d.kernel.metrics, False), "fused_into": owner}
        rec = dict(rec)
        rec["run"] = run_index
        return rec

    @staticmethod
    def _record(d: _DeviceNode, run_index: int, wall: float, metrics: dict, empty: bool) -> dict:
        """The profile record of one run of device node ``d``."""
        return {"run": run_index, "node": d.label, "op_type": d.node.op_type,
                "device": d.device, "mode": "empty" if empty else d.mode, "wall_s": wall,
                "latency_s": metrics.get("latency_s"), "energy_j": metrics.get("energy_j"),
                "writes": metrics.get("tile_writes", 0),
                "bytes_moved": metrics.get("bytes_moved"), "nodes": 1,
                "basis": "run" if empty else metrics.get("basis") or "plan",
                **({"bytes_note": metrics["bytes_note"]} if metrics.get("bytes_note") else {}),
                **({"replanned": [list(s) for s in metrics["replanned"]]}
                   if metrics.get("replanned") else {}),
                **({"adc_clipped": metrics["adc_clipped"],
                    "adc_conversions": metrics.get("adc_conversions", 0),
                    "clipped_note": metrics.get("clipped_note", "")}
                   if metrics.get("adc_clipped") else {})}

    def _run_empty(self, d: _DeviceNode, ins: list) -> list:
        """The outputs of device node ``d`` on inputs of which one is empty (0 elements): no
        kernel runs; the op's reference body in onnxruntime gives the empty outputs (or a
        reduction's identity, e.g. zeros for a sum over an empty axis). The session is built at
        the first such run and kept."""
        names = [n for n in d.node.input if n]
        vals = [np.asarray(x) for n, x in zip(d.node.input, ins) if n]
        key = (id(d), tuple((v.dtype.str, v.ndim) for v in vals))
        with self._lazy_lock:
            sess = self._empty_sessions.get(key)
            if sess is None:
                g = helper.make_graph(
                    [d.node], "empty", [helper.make_tensor_value_info(
                        n, helper.np_dtype_to_tensor_dtype(v.dtype), [None] * v.ndim)
                        for n, v in zip(names, vals)],
                    [onnx.ValueInfoProto(name=o) for o in d.node.output if o])
                m = helper.make_model(g, opset_imports=list(self._model.opset_import),
                                      ir_version=self._model.ir_version)
                m.functions.extend(self._model.functions)
                so = ort.SessionOptions()
                so.log_severity_level = 4
                try:
                    sess = ort.InferenceSession(m.SerializeToString(), so,
                                                providers=["CPUExecutionProvider"])
                except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
                    raise CinmError(f"node '{self._label(d.node)}' on an empty input: "
                                    f"{str(e).splitlines()[0]}") from None
                self._empty_sessions[key] = sess
        try:
            return sess.run(None, dict(zip(names, vals)))
        except Exception as e:  # noqa: BLE001 - onnxruntime's own error types
            raise CinmError(f"node '{self._label(d.node)}' on an empty input: "
                            f"{str(e).splitlines()[0]}") from None

    def _relax(self, p: _Partition, values: dict, error: Exception) -> list:
        """Partition ``p``'s outputs after its session refused a run (``error``), from a
        session whose inputs are declared by the element type and rank of the arrays arriving
        (kept for later runs): a shape the model's value_info gives may be one onnx's shape
        inference took from an exporter's graph-output declaration (``[1, 4]`` for an output
        the model computes ``[n, 4]``; onnxruntime only warns on the whole model and never
        checks an inner tensor). Raises CinmError with ``error``'s first line when the
        partition was relaxed already, cannot be, or fails that way too."""
        from ..golden import ort_error_line

        fail = CinmError(f"host partition {p.index} failed: {ort_error_line(error)}")
        with self._lazy_lock:
            if not p.relaxed:  # once: a partition failing either way fails at once next time
                p.relaxed = True
                try:
                    session = self._session(
                        p, self._inits, {n: _declared(n, None, values[n]) for n in p.inputs})
                except CinmError:  # it needs the declared shapes (a Resize's sizes)
                    raise fail from None
                p.call, p.session = _run_call(session), session
        try:
            return p.call(p.outputs, {n: values[n] for n in p.inputs}, None)
        except Exception:  # noqa: BLE001 - onnxruntime's own error types
            raise fail from None

    def _late_session(self, p: _Partition, values: dict) -> None:
        """Build partition ``p``'s session from the arrays arriving at its untyped inputs."""
        with self._lazy_lock:
            if p.session is not None:
                return
            vis = dict(self._vis)
            for n in p.inputs:
                if n not in vis:
                    vis[n] = _declared(n, None, values[n])
            session = self._session(p, self._inits, vis)
            p.call = _run_call(session)
            p.session = session

    def as_runner(self):
        """This session as a runner for :func:`onnx_cinm.golden.compare` (``input_names``,
        ``output_names``, ``run(feeds)``; inputs the model does not take are dropped)."""
        return _Runner(self)

    def profile(self) -> list[dict]:
        """Per-node records of every run so far: ``run``, ``node``, ``op_type``, ``device``,
        ``mode``, ``wall_s`` (host wall time, seconds; None for nodes charged by a model),
        ``latency_s`` and ``energy_j`` (modeled device time and energy; None on the host),
        ``writes`` (crossbar tile writes), ``bytes_moved`` (host<->device bytes), ``nodes``
        (graph nodes the record covers: all the nodes of a host partition's onnxruntime
        session, UPMEM nodes charged by the cost model inside it included; 1 otherwise);
        ``in_partition`` is True on the records of such model-mode nodes inside a host
        partition (absent otherwise); ``basis`` of the modeled figures: ``"run"`` (counted
        on this run's inputs, at their sizes), ``"plan"`` (the recorded plan's, at the planned
        sizes: nodes in 'model' mode and kernels that report their plan's), None on the host;
        ``replanned`` (absent otherwise): ``[planned, this run's]`` shapes ``[G, K, N]`` of a
        crossbar kernel's programmed activation when the run's differed, so the kernel ran a
        program planned again at this run's shape (its figures are that program's);
        ``adc_clipped``, ``adc_conversions`` and ``clipped_note`` (absent when none
        saturated): the ADC conversions of this run that saturated, of how many, and why
        they can (the device's words)."""
        with self._profile_lock:
            return [dict(r) for r in self._profile]

    def _named(self, e: CinmError, node, device: str, what: str = "") -> CinmError:
        """``e`` (its type kept) with its message after the node's name as every table gives
        it (:meth:`_label`), its device and, unless the message names it already (a kernel
        program's own error names only its file, which a person finds in no table), its
        kernel's file: ``node 'n20/Gemm' on memristor (kernel memristor/0025_n20_Gemm.xbar in
        lenet.cinm) failed: ...``."""
        rel = cinm.node_attrs(node).get("kernel")
        where = f" (kernel {rel} in {self._root})" if rel and self._root is not None and \
            rel.rsplit("/", 1)[-1] not in str(e) else ""
        e.args = (f"node '{self._label(node)}' on {device}{where}{' ' + what if what else ''}: "
                  f"{e}", *e.args[1:])
        return e

    def _label(self, node) -> str:
        """The node's name in the profile, as report and optimize's tables give it
        (:func:`onnx_cinm.dialects.cinm.node_label`)."""
        if node.name:
            return node.name
        if not hasattr(self, "_index"):
            self._index = {id(n): k for k, n in enumerate(self._model.graph.node)}
        return cinm.node_label(node, self._index.get(id(node), "?"))

    def wear(self, seconds_per_inference: float | None = None) -> dict:
        """``{device: Wear}`` (:class:`onnx_cinm.devices.Wear`) of the devices whose kernels
        in this model wear write-limited cells, e.g. a crossbar chip's writes per cell per
        inference and lifetime (:func:`onnx_cinm.pipeline.device_wear`); the lifetime in
        seconds runs inferences back to back every ``seconds_per_inference`` seconds (e.g.
        the model's modeled latency, as optimize and report take it), or at each device's own
        modeled latency when None, a lower bound of the period."""
        from ..pipeline import device_wear

        return device_wear(self._model, seconds_per_inference)

    def load_profile(self) -> list[dict]:
        """What loading the model does on the devices, once per session and never per
        inference: per crossbar kernel the tiles programmed at load (``writes``), per UPMEM
        kernel its DPU program and resident weights; with modeled ``latency_s`` and
        ``energy_j``. (:meth:`profile` holds the per-inference figures.)"""
        out = []
        loads = [(d.node, d.device, d.kernel.load_metrics) for d in self._device_nodes
                 if not isinstance(d.kernel, _IfKernel)]
        loads += [(node, dev, _load_of(cinm.node_attrs(node), devices.get_device(dev)))
                  for _, parts, _ in self._schedule for p in parts for node, dev in p.modeled]
        for node, device, load in loads:
            if load:
                out.append({"node": self._label(node), "device": device, "writes": load["tile_writes"],
                            "latency_s": load["latency_s"], "energy_j": load["energy_j"]})
        for d, branch, sess in self._branch_sessions():  # both branches' kernels are loaded
            out += [{**r, "node": _inside(d.label, branch, r["node"])} for r in sess.load_profile()]
        return out

    def _branch_sessions(self) -> list:
        """``(If device node, branch name, its session)`` of the branch sessions built so far."""
        return [(d, b, sess) for d in self._device_nodes if isinstance(d.kernel, _IfKernel)
                for b, sess in d.kernel.sessions.items()]

    def provider_ifs(self) -> list[str]:
        """Labels of the If nodes the provider runs itself (their branches hold device nodes,
        :class:`_IfKernel`), nested ones inside the branch sessions built so far included
        (labelled as :func:`_inside` says): the Ifs :meth:`partitions` counts both branches of."""
        return [d.label for d in self._device_nodes if isinstance(d.kernel, _IfKernel)] + \
            [_inside(d.label, b, label) for d, b, sess in self._branch_sessions()
             for label in sess.provider_ifs()]

    def modeled_nodes(self) -> list[tuple[str, str]]:
        """``(node label, device)`` of the device nodes that run inside a host partition and
        are charged by their device's cost model (UPMEM in ``upmem_mode="model"``); those of
        If branches labelled as :func:`_inside` says."""
        return [(self._label(node), dev) for p in self._parts for node, dev in p.modeled] + \
            [(_inside(d.label, b, label), dev) for d, b, sess in self._branch_sessions()
             for label, dev in sess.modeled_nodes()]

    def inexact_kernels(self) -> list[str]:
        """What makes this session's device kernels differ from the exact ops by design, one
        entry per distinct reason (:meth:`Device.inexact` of each lowered node in the run mode
        it runs in here, e.g. ``"crossbar data path q8"``); empty if every kernel is meant to
        be exact."""
        out: list[str] = []
        for node in cinm.all_nodes(self._model.graph):
            if node.domain != cinm.DOMAIN:
                continue
            at = cinm.node_attrs(node)
            if at.get("device", "host") == "host":
                continue
            dev = devices.get_device(at["device"])
            why = dev.inexact(at, self._options.get(f"{dev.name}_mode", dev.modes[0]),
                              run_options_of(dev, self._options))
            if why and why not in out:
                out.append(why)
        return out

    def configuration(self) -> dict:
        """What the session runs under, for a report: the provider options, the BLAS libraries
        and their thread limit during runs, the matrix kernel chosen per product shape (see
        :mod:`onnx_cinm.sim.blas`), and the partitions (``{kind: count}``: host
        partitions and device nodes)."""
        parts: dict = {}
        for kind, _ in self.partitions():
            parts[kind] = parts.get(kind, 0) + 1
        return {"options": dict(self._options), **self._kernels.describe(), "partitions": parts}

    def partitions(self) -> list[tuple[str, int]]:
        """``(kind, node count)`` in execution order, for inspection: ``("host", n)`` per host
        partition (one onnxruntime session over ``n`` graph nodes, model-mode device nodes
        included), ``(device, 1)`` per device node the provider runs itself; a cinm op on the
        host run by a numpy kernel is kind :data:`HOST_KERNEL`, not a host partition. An If
        the provider runs itself (its branches hold device nodes) counts as the partitions of
        both its branches, in branch order, though one branch runs per inference."""
        out = []
        for _, stage_parts, stage_devices in self._schedule:
            out += [("host", len(p.nodes)) for p in stage_parts]
            for d in stage_devices:
                if isinstance(d.kernel, _IfKernel):
                    for branch in d.kernel.branches:
                        sess = d.kernel.sessions.get(branch)
                        out += sess.partitions() if sess is not None else []
                else:
                    out.append((HOST_KERNEL if d.device == "host" else d.device, 1))
        return out


def _keep_new(values: dict, keep: dict) -> None:
    """Add to ``keep`` a copy of each array of ``values`` it does not hold yet (not the
    buffers a Concat's producers write into, whose names start with NUL)."""
    for name, v in values.items():
        if name not in keep and isinstance(v, np.ndarray) and not name.startswith("\0"):
            keep[name] = v.copy()


class _Runner:
    def __init__(self, sess: InferenceSession) -> None:
        self.sess = sess
        self.input_names = [a.name for a in sess.get_inputs()]
        self.output_names = [a.name for a in sess.get_outputs()]
        #: whether every device kernel is meant to be exact (:meth:`InferenceSession.inexact_kernels`)
        self.exact = not sess.inexact_kernels()

    def run(self, feeds) -> list:
        return self.sess.run(None, {n: feeds[n] for n in self.input_names if n in feeds})

    def run_keeping(self, feeds) -> dict:
        """:meth:`InferenceSession.run_keeping` on ``feeds`` (inputs the model does not take
        are dropped)."""
        return self.sess.run_keeping({n: feeds[n] for n in self.input_names if n in feeds})


@dataclass(frozen=True)
class _Arg:
    name: str
    shape: list
    type: str

    @staticmethod
    def of(vi) -> "_Arg":
        """A graph input or output; sequence, map and optional values (a ZipMap output) get
        onnxruntime's type text, e.g. ``seq(map(int64,tensor(float)))``, and shape None."""
        if vi.type.WhichOneof("value") != "tensor_type":
            return _Arg(vi.name, None, _type_text(vi.type))
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in tt.shape.dim]
        return _Arg(vi.name, shape, _type_text(vi.type))


def _elem_name(elem_type: int) -> str:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError):  # 0 (undefined) or a type numpy has no name for
        return helper.tensor_dtype_to_string(elem_type).split(".")[-1].lower() \
            if elem_type else "undefined"


def _type_text(tp) -> str:
    """onnxruntime's text for a TypeProto: ``tensor(float)``, ``seq(tensor(int64))``,
    ``map(int64,tensor(float))``, ``optional(...)``."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({_elem_name(tp.tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({_elem_name(tp.map_type.key_type)},{_type_text(tp.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    return kind or "undefined"


def _shape_text(vi) -> str:
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                           for d in vi.type.tensor_type.shape.dim) + "]"
