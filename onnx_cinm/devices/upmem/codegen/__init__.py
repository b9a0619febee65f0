"""Generate UPMEM kernels: ``host.c``, ``dpu.c``, ``Makefile`` and ``kernel.json`` per cinm op.

Each kernel is one Jinja template family under ``onnx_cinm/templates/upmem/<family>/``. The
generated C uses only the documented UPMEM SDK API (host: ``dpu_alloc``, ``dpu_load``,
``dpu_prepare_xfer``, ``dpu_push_xfer``, ``dpu_broadcast_to``, ``dpu_copy_to/from``,
``dpu_launch``, ``dpu_free``, ``DPU_FOREACH``, ``DPU_ASSERT``; DPU: ``mram_read``,
``mram_write``, ``me()``, ``NR_TASKLETS``, ``BARRIER_INIT``/``barrier_wait``,
``mem_alloc``/``mem_reset``, ``__host``, ``__dma_aligned``) and compiles with
``-Wall -Wextra -Werror``, so the same sources build with the SDK (``make``) and with the
emulator (:mod:`onnx_cinm.sim.upmem_emu`). The only extra is ``EMU_COUNT(n)``, an
instruction-count hint defined away on a real DPU.

The host program's command line is ``host DPU_BINARY IN... OUT...``: every op input in order
(constants too: their sidecar files ``const<i>.bin`` sit in the kernel directory), then every
output; raw little-endian C-order arrays. Shapes are compiled in (a kernel is specialised to
its shapes; emit again for another batch size: builds are cached by content hash).
``kernel.json`` records the kind, dtype, workgroup, block, the inputs (shape, dtype, constant
file) and outputs (shape, dtype; ``null`` shape for a data-dependent length). This package holds
the API (:func:`kernel_for`, :func:`emit_kernel`, :func:`emit_op`); each template family's
emitter is a module of its own (``elementwise``, ``gemm``, ``reduce``, ``histogram``,
``compress``, ``scan``, ``topk``, ``transpose``, ``im2col``, ``popcount``, ``simsearch``,
``rownorm``) beside ``common``, what they share.

Kernel families (``kind`` of :func:`emit_kernel`):

=========== ================================================================================
binary      Add Sub Mul Div Max Min with numpy broadcasting (host-side index arithmetic) [VA]
unary       Relu Abs Neg LeakyRelu HardSigmoid Clip; Exp Log Sqrt Sigmoid Tanh (float32,
            software double without libm)                                          [VA]
gemm        ``Y[..., M, N] = A[..., M, K] @ B[..., K, N] (+ C)`` with matmul broadcasting,
            optional fused ReLU (``relu=True``: the MLP layer); a row-block x column-block
            DPU grid (``grid``, the mapping's ``cnm_grid``)                     [GEMV/MLP]
gemv        ``y[M] = A[M, K] @ x[K] (+ c[M])`` (the gemm kernel with N = 1)            [GEMV]
reduce      add mul max min over ``axes`` (tasklet tree merge in WRAM, host merge)    [RED]
histogram   ``numpy.histogram(X, bins, (min, max))`` counts as int64                  [HST-S]
compress    ``X.ravel()[mask.ravel() != 0]`` (ONNX Compress without axis)             [SEL]
scan        CumSum along ``axis`` (exclusive, reverse), scan-scan-add over DPUs   [SCAN-SSA]
transpose   permutations that swap two adjacent groups of axes (tiled in WRAM; trailing
            runs longer than one DMA are moved in 1 KB chunks)                        [TRNS]
topk        k largest/smallest along ``axis`` with int64 indices (ties: lower index;
            float NaN ranks as the largest value, as in onnxruntime; k up to what one
            tasklet's WRAM list holds, ~5000 float32)
im2col      the patch matrix of a 1-D/2-D convolution (cinm Im2Col), gathered on the DPUs;
            each DPU gets a band of output lines and only the input rows it reads (halo)
popcount    set bits per element (cinm PopCount: bool/uint8/16/32/64 -> int64)
simsearch   top-k rows of D by dot product or cosine for each query (cinm SimSearch, float32)
softmax     softmax over the last axis (cinm Softmax, float32: ``emu_expf``), three passes
            over a row's blocks (a row longer than a block is streamed); whole rows per
            tasklet, or, with few rows per DPU, each row split over ``lanes`` tasklets whose
            partials are combined in WRAM between barriers (``mapping.rownorm_lanes``)
layernorm   LayerNorm over the trailing axes with Scale and optional B (cinm LayerNorm,
            float32), the same row scheme: mean, variance, normalize
=========== ================================================================================

dtypes: int32, uint32, int64, uint64, float32 (float is software-emulated on a real DPU); the
elementwise kernels also int8, uint8, int16, uint16.

NaN and Inf follow onnxruntime: float Max/Min return NaN when either operand is NaN, Relu,
Clip, LeakyRelu and the transcendentals keep NaN (Log(0) = -inf, Sqrt of a negative is NaN).
Reduce max/min of a row holding NaN may differ, as onnxruntime's own result depends on where the
NaN sits. :func:`check_emittable` runs an emitter's checks without writing, so the device's
``supports`` accepts only what can be emitted.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from ....graph import dtype_name
from .. import cost as _cost
from .. import mapping as _mapping

# the public names of the shared module, and what the API below uses of it
from .common import (_ANNOTATE, BINARY, _check_dtype, _check_workgroup, _DRY,  # noqa: F401
                     DTYPES, ELEMENTWISE_DTYPES, KINDS,
                     MATH_HELPER_DEPS, REDUCE, _round_up,
                     _TARGET, TRANSCENDENTAL,
                     _transpose_groups, UNARY, _UNROLL, WRAM_MARGIN)
# the emitters, found by kind in emit_kernel
from .elementwise import _emit_binary, _emit_elementwise, _emit_unary  # noqa: F401
from .gemm import _emit_gemm  # noqa: F401
from .reduce import _emit_reduce  # noqa: F401
from .histogram import _emit_histogram  # noqa: F401
from .compress import _emit_compress  # noqa: F401
from .scan import _emit_scan  # noqa: F401
from .topk import _emit_topk  # noqa: F401
from .transpose import _emit_transpose  # noqa: F401
from .im2col import _emit_im2col  # noqa: F401
from .popcount import _emit_popcount  # noqa: F401
from .simsearch import _emit_simsearch  # noqa: F401
from .rownorm import _emit_layernorm, _emit_rownorm, _emit_softmax  # noqa: F401


def emit_kernel(kind: str, dtype, shapes: list, *, dpus: int, tasklets: int, block_bytes: int,
                outdir, consts: dict | None = None, target: _cost.UpmemParams = _cost.DEFAULT_PARAMS,
                **params) -> list[Path]:
    """Write one UPMEM kernel (``host.c``, ``dpu.c``, ``Makefile``, ``kernel.json``, constant
    sidecars ``const<i>.bin``) into ``outdir``; return the paths written.

    Args:
        kind: one of :data:`KINDS` (see the module docstring).
        dtype: element type of the data inputs (int32, uint32, int64, uint64, float32).
            Compress's mask is bool/uint8; Histogram counts and TopK indices are int64.
        shapes: the shapes of the op's inputs, in order (ints; symbolic dims resolved).
        dpus: DPUs of the workgroup (1..``target.max_dpus``; a kernel may use fewer when the
            data is small).
        tasklets: tasklets per DPU (1..``target.max_tasklets``).
        block_bytes: MRAM<->WRAM transfer block per tasklet, bytes (8..``target.dma_max``,
            multiple of 8); lowered if the kernel's WRAM buffers would not fit the target's WRAM.
        outdir: the kernel's directory (created).
        consts: ``{input index: array}`` for inputs known at compile time (weights); written
            as sidecar files, read by the host program like any input.
        target: the DPU generation (:class:`~onnx_cinm.devices.upmem.cost.UpmemParams`): its
            WRAM, MRAM, DMA limit, most tasklets and DPUs bound the kernel.
        params: per kind: ``op`` (binary/unary), ``alpha``/``beta``/``min``/``max`` (unary),
            ``bias`` (gemm/gemv: a third input C), ``relu`` (gemm), ``grid`` (gemm/gemv:
            ``[row blocks, column blocks]`` of the DPUs, default ``[dpus, 1]``), ``prim_tiles``
            (gemm/gemv: PrIM's GEMV tiling, one row x one column per item, for comparison),
            ``merge`` (reduce: ``tree`` or PrIM's ``host``; histogram: ``tree`` or PrIM HST-L's
            ``mutex``), ``unroll`` (inner loops, default ``mapping.UNROLL``; 1 = PrIM's loops),
            ``reduce`` (add|mul|max|min),
            ``axes``, ``keepdims`` (reduce), ``bins``/``min``/``max`` (histogram), ``axis``,
            ``exclusive``, ``reverse`` (scan), ``perm`` (transpose), ``k``, ``axis``,
            ``largest`` (topk).

    Raises:
        ValueError: unknown kind, unsupported dtype/op/parameters, or data that does not fit
            the DPUs' MRAM.
    """
    return _run_kernel(kind, dtype, shapes, dpus, tasklets, block_bytes,
                       outdir if isinstance(outdir, Path) else Path(outdir), consts or {},
                       target, params)


def _run_kernel(kind: str, dtype, shapes: list, dpus: int, tasklets: int, block_bytes: int,
                outdir: Path, consts: dict, target: _cost.UpmemParams, params: dict) -> list[Path]:
    """:func:`emit_kernel` past its defaults (``params`` is consumed: ``unroll`` is taken
    out); :func:`check_emittable`'s dry run calls it straight, without :func:`emit_op`'s
    bookkeeping of where the files go."""
    if kind not in KINDS:
        raise ValueError(f"unknown UPMEM kernel kind {kind!r}; expected one of {KINDS}")
    dtype = _check_dtype(dtype, kind)
    unroll = int(params.pop("unroll", _mapping.UNROLL))
    if not 1 <= unroll <= 64:
        raise ValueError(f"unroll={unroll}: expected 1..64")
    fn = globals()[f"_emit_{'gemm' if kind in ('gemv', 'mlp') else kind}"]
    tok, ttok = _UNROLL.set(unroll), _TARGET.set(target)
    try:
        _check_workgroup(dpus, tasklets)
        return fn(kind, dtype, [tuple(map(int, s)) for s in shapes], int(dpus), int(tasklets),
                  int(block_bytes), outdir, consts, params)
    finally:
        _UNROLL.reset(tok)
        _TARGET.reset(ttok)



def _attr(attrs: dict, name: str, default=None):
    v = attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v



FAMILY = {"binary": "elementwise", "unary": "elementwise", "gemm": "gemm", "gemv": "gemm",
          "mlp": "gemm", "reduce": "reduce", "histogram": "histogram", "compress": "compress",
          "scan": "scan", "transpose": "transpose", "topk": "topk", "im2col": "im2col",
          "popcount": "popcount", "simsearch": "simsearch", "softmax": "rownorm",
          "layernorm": "rownorm"}



def kernel_for(op, consts: dict | None = None,
               target: _cost.UpmemParams = _cost.DEFAULT_PARAMS) -> tuple[str, str, list, dict]:
    """The kernel that runs cinm ``op`` on DPU generation ``target``, see :func:`_kernel_for`;
    ValueError if its template family is not shipped."""
    kind, dtype, shapes, params = _kernel_for(op, consts, target)
    if not _shipped(FAMILY[kind]):
        raise ValueError(f"the {kind} kernel is not implemented yet")
    return kind, dtype, shapes, params


@functools.cache
def _shipped(family: str) -> bool:
    """Whether the template family ``family`` is shipped (looked up once per process: placement
    asks for every op)."""
    return (Path(__file__).resolve().parents[3] / "templates" / "upmem" / family
            / "dpu.c.j2").is_file()



def _kernel_for(op, consts: dict | None = None,
                target: _cost.UpmemParams = _cost.DEFAULT_PARAMS) -> tuple[str, str, list, dict]:
    """The kernel that runs cinm ``op`` (an :class:`~onnx_cinm.devices.base.OpInfo`):
    ``(kind, dtype, input shapes, params)``. Symbolic dims are taken as 1 (the kernel is
    specialised to the shapes). Constant operands that are parameters (Clip's min/max) are
    read from ``consts`` (by tensor name) when given.

    Raises:
        ValueError: no UPMEM kernel for this op, dtype, shape or attribute (the reason).
    """
    t = op.op_type
    ins = op.inputs
    if not ins or any(x.dtype is None or x.shape is None for x in ins):
        raise ValueError("input types or ranks unknown")
    dtype = dtype_name(ins[0].dtype)
    shapes = [x.static_shape for x in ins]
    a = op.attrs

    def need_dtype(dt, ok=DTYPES):
        if dt not in ok:
            raise ValueError(f"no DPU kernel for dtype {dt} (kernels: {', '.join(ok)})")

    if t in BINARY:
        need_dtype(dtype, ELEMENTWISE_DTYPES)
        return "binary", dtype, shapes, {"op": t}
    if t in UNARY:
        need_dtype(dtype, ELEMENTWISE_DTYPES)
        params = {"op": t}
        if (t in ("LeakyRelu", "HardSigmoid", "Gelu") or t in TRANSCENDENTAL) and dtype != "float32":
            raise ValueError(f"{t} kernel is float32 only")
        for k in ("alpha", "beta"):
            if k in a:
                params[k] = float(a[k])
        if t == "Gelu":
            params["approximate"] = _attr(a, "approximate", "none")
        if t == "Clip":
            if len(ins) == 2:
                raise ValueError("cinm Clip with one bound: name both min and max (to_cinm writes the "
                                 "one an ONNX Clip leaves out as its default)")
            for name, x in zip(("min", "max"), ins[1:]):
                if not x.const:
                    raise ValueError(f"Clip {name} is not a constant")
                if consts is not None and x.name in consts:
                    params[name] = np.asarray(consts[x.name]).reshape(()).item()
            shapes = shapes[:1]
        return "unary", dtype, shapes, params
    if t in ("Gemm", "Gemv"):
        need_dtype(dtype)
        if t == "Gemm" and (len(shapes[0]) < 2 or len(shapes[1]) < 2):
            raise ValueError("Gemm with a 1-D operand")
        # a symbolic reduction dim on one side is the other side's (not 1): A[.., K] B[.., K, N]
        ka, kb = (-1, -2) if t == "Gemm" else (-1, 0)
        sa, sb = ins[0].shape, ins[1].shape
        a_known, b_known = isinstance(sa[ka], int) and sa[ka] >= 0, isinstance(sb[kb], int) and sb[kb] >= 0
        if a_known != b_known:
            k = sa[ka] if a_known else sb[kb]
            shapes = [list(x) for x in shapes]
            shapes[0][ka] = shapes[1][kb] = k
            shapes = [tuple(x) for x in shapes]
        return ("gemm" if t == "Gemm" else "gemv"), dtype, shapes, {}
    if t in ("Reduce", "MergePartial"):
        need_dtype(dtype)
        if t == "MergePartial":
            return "reduce", dtype, shapes, {"reduce": _attr(a, "kind"), "axes": [0], "keepdims": 0}
        return "reduce", dtype, shapes, {"reduce": _attr(a, "kind"), "axes": list(a.get("axes", [])),
                                         "keepdims": int(a.get("keepdims", 1))}
    if t == "Histogram":
        need_dtype(dtype)
        return "histogram", dtype, shapes, {"bins": int(a["bins"]), "min": float(a["min"]),
                                            "max": float(a["max"])}
    if t == "Scan":
        need_dtype(dtype)
        return "scan", dtype, shapes, {"axis": int(a["axis"]), "exclusive": int(a.get("exclusive", 0)),
                                       "reverse": int(a.get("reverse", 0))}
    if t == "TopK":
        need_dtype(dtype)
        return "topk", dtype, shapes, {"k": int(a["k"]), "axis": int(a.get("axis", -1)),
                                       "largest": int(a.get("largest", 1))}
    if t == "Transpose":
        need_dtype(dtype)
        perm = list(a.get("perm", range(len(shapes[0]))[::-1]))
        groups = _transpose_groups(perm)
        if groups is None:
            raise ValueError(f"perm {perm} is not a swap of two adjacent axis groups")
        return "transpose", dtype, shapes, {"perm": perm}
    if t == "SimSearch":
        need_dtype(dtype, ("float32",))
        kk, nd = int(a["k"]), shapes[1][0]
        if not 1 <= kk <= min(nd, 256):
            raise ValueError(f"SimSearch k={kk} must be in 1..min(rows of D, 256)")
        return "simsearch", dtype, shapes, {"k": kk, "metric": _attr(a, "metric", "dot")}
    if t in ("Compress", "Select"):  # ONNX Compress (1-D data, or no axis): no cinm op yet
        need_dtype(dtype)
        if len(ins) != 2 or (a.get("axis") is not None and len(shapes[0]) != 1):
            raise ValueError("Compress kernel: 1-D data (or no axis) and a mask")
        if math.prod(shapes[1]) != math.prod(shapes[0]):
            raise ValueError("Compress kernel: the mask must have one entry per element")
        return "compress", dtype, shapes, {}
    if t == "PopCount":
        need_dtype(dtype, ("bool", "uint8", "uint16", "uint32", "uint64"))
        return "popcount", dtype, shapes, {}
    if t in ("Softmax", "LayerNorm"):
        need_dtype(dtype, ("float32",))
        if t == "Softmax":
            return "softmax", dtype, shapes, {}
        return "layernorm", dtype, shapes, {"axis": int(a["axis"]), "epsilon": float(a["epsilon"])}
    if t == "Im2Col":
        need_dtype(dtype)
        ks = list(a.get("kernel_shape", []))
        if len(ks) not in (1, 2):
            raise ValueError(f"Im2Col kernel handles 1-D and 2-D kernels, not {len(ks)}-D")
        dw = list(a.get("dilations", [1] * len(ks)))[-1]
        span = _round_up((ks[-1] - 1) * dw * np.dtype(dtype).itemsize + 8, 8) + 8
        dma_max = target.dma_max
        if span > dma_max:
            raise ValueError(f"a kernel row spans {span} bytes (> {dma_max}, one DMA)")
        return "im2col", dtype, shapes, {k: list(a[k]) for k in ("kernel_shape", "strides", "pads",
                                                                 "dilations")}
    raise ValueError(f"no UPMEM kernel for cinm.{t}")



#: The folder a dry run (:func:`check_emittable`) is given: it writes nothing
_NOWHERE = Path(".")


def check_emittable(op, attrs: dict, *, target: _cost.UpmemParams = _cost.DEFAULT_PARAMS,
                    default_dpus: int | None = None, default_tasklets: int | None = None,
                    default_block: int = 1024, kernel: tuple | None = None) -> None:
    """Raise ValueError (the emitter's reason) if :func:`emit_op` would refuse ``op`` with the
    plan ``attrs`` (``cnm_dpus``, ``cnm_tasklets``, ``cnm_block_bytes``, ``cnm_grid``,
    ``cnm_lanes``); nothing
    is written. The device's ``supports`` and ``lower`` call it, so placement never accepts an
    op whose kernel cannot be generated (issue 17 #2). ``kernel``: :func:`kernel_for` of
    ``op`` and ``target`` when the caller has it (the device's ``supports`` asks it first)."""
    kind, dtype, shapes, params, dpus, tasklets, block = _emit_args(
        op, attrs, None, target, default_dpus, default_tasklets, default_block, kernel)
    tok = _DRY.set(True)
    try:  # the emitter itself, writing nothing (emit_op's file names and manifest unneeded)
        _run_kernel(kind, dtype, shapes, dpus, tasklets, block, _NOWHERE, {}, target, params)
    finally:
        _DRY.reset(tok)


def _emit_args(op, attrs: dict, consts: dict | None, target: _cost.UpmemParams,
               default_dpus: int | None, default_tasklets: int | None, default_block: int,
               kernel: tuple | None) -> tuple:
    """What :func:`emit_op` passes the emitter: ``(kind, dtype, shapes, params, DPUs,
    tasklets, block bytes)`` (``params`` a fresh dict: the emitter consumes it); ValueError as
    :func:`kernel_for`."""
    if kernel is None:
        kind, dtype, shapes, params = kernel_for(op, consts, target)
    else:  # the caller's kernel_for(op, consts, target); its params are not changed
        kind, dtype, shapes, params = kernel[0], kernel[1], kernel[2], dict(kernel[3])
    if kind in ("gemm", "gemv") and attrs.get("cnm_grid"):
        params["grid"] = [int(x) for x in attrs["cnm_grid"]]
    if kind in ("softmax", "layernorm") and attrs.get("cnm_lanes"):
        params["lanes"] = int(attrs["cnm_lanes"])
    dpus = int(attrs.get("cnm_dpus") or default_dpus or min(target.dpus, target.dpus_per_rank))
    tasklets = int(attrs.get("cnm_tasklets") or default_tasklets or target.tasklets)
    block = int(attrs.get("cnm_block_bytes") or default_block)
    return kind, dtype, shapes, params, dpus, tasklets, block



def emit_op(op, attrs: dict, consts: dict, root, *,
            target: _cost.UpmemParams = _cost.DEFAULT_PARAMS, default_dpus: int | None = None,
            default_tasklets: int | None = None, default_block: int = 1024,
            kernel: tuple | None = None) -> list[Path]:
    """Write the kernel of cinm ``op`` into ``root / attrs["kernel"]`` (see
    :meth:`UpmemDevice.emit <onnx_cinm.devices.upmem.UpmemDevice.emit>`).

    The workgroup and block come from the plan attributes ``cnm_dpus``, ``cnm_tasklets``,
    ``cnm_block_bytes`` (the ``cnm_mapping`` pass), else the defaults (DPUs: one rank, at most
    ``target.dpus``; tasklets: ``target.tasklets``), a matrix product's DPU grid from
    ``cnm_grid``, a row-wise kernel's tasklets per row from ``cnm_lanes`` (else the mapping's
    choice for this workgroup). ``target`` is the DPU generation. ``consts`` maps constant
    input names to arrays: they become sidecar files. ``kernel.json`` also records, per input
    and output, the graph tensor name (``tensor``). ``kernel``: :func:`kernel_for` of ``op``,
    ``consts`` and ``target`` when the caller has it.

    Raises:
        ValueError: no kernel for the op (see :func:`kernel_for`) or no ``kernel`` attribute.
    """
    if not attrs.get("kernel"):
        raise ValueError(f"{op.name}: no 'kernel' attribute (run the cnm_mapping pass first)")
    kind, dtype, shapes, params, dpus, tasklets, block = _emit_args(
        op, attrs, consts, target, default_dpus, default_tasklets, default_block, kernel)
    # a dry run writes nothing: no path built
    outdir = _NOWHERE if _DRY.get() else Path(root) / _attr(attrs, "kernel")
    used = op.inputs[:len(shapes)]
    cidx = {i: consts[x.name] for i, x in enumerate(used) if consts and x.name in consts}

    def annotate(man: dict) -> None:  # kernel.json names the graph's tensors and node
        for spec, x in zip(man["inputs"], used):
            spec["tensor"] = x.name
        for spec, x in zip(man["outputs"], op.outputs):
            spec["tensor"] = x.name
        man["node"] = op.name
        man["op_type"] = op.op_type

    tok = _ANNOTATE.set(annotate)
    try:
        return emit_kernel(kind, dtype, shapes, dpus=dpus, tasklets=tasklets, block_bytes=block,
                           outdir=outdir, consts=cidx, target=target, **params)
    finally:
        _ANNOTATE.reset(tok)

