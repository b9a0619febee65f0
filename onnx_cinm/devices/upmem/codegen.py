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
file) and outputs (shape, dtype; ``null`` shape for a data-dependent length).

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
softmax     softmax over the last axis (cinm Softmax, float32: ``emu_expf``), whole rows per
            tasklet, three passes over a row's blocks (a row longer than a block is streamed)
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
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import contextvars

import jinja2
import numpy as np

from . import cost as _cost
from . import mapping as _mapping

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("onnx_cinm", "templates"), keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=False)

#: numpy dtype name -> (C type, unsigned C type of the same width for wrapping arithmetic)
CTYPES = {
    "int32": ("int32_t", "uint32_t"), "uint32": ("uint32_t", "uint32_t"),
    "int64": ("int64_t", "uint64_t"), "uint64": ("uint64_t", "uint64_t"),
    "float32": ("float", "uint32_t"),
}
DTYPES = tuple(CTYPES)
#: narrow integers, elementwise kernels only (binary, unary); arithmetic in uint32_t so that
#: products do not overflow C's int promotion, then truncated (wraps like numpy)
SMALL_CTYPES = {"int8": ("int8_t", "uint32_t"), "uint8": ("uint8_t", "uint32_t"),
                "int16": ("int16_t", "uint32_t"), "uint16": ("uint16_t", "uint32_t")}
ELEMENTWISE_DTYPES = DTYPES + tuple(SMALL_CTYPES)
KINDS = ("binary", "unary", "gemm", "gemv", "mlp", "reduce", "histogram", "compress", "scan",
         "transpose", "topk", "im2col", "popcount", "simsearch", "softmax", "layernorm")
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min")
#: float32 ops computed in software double (a DPU has no libm): C expression, doc
TRANSCENDENTAL = {
    "Exp": ("(float)emu_exp((double)a)", "exp(X)"),
    "Log": ("(float)emu_log((double)a)", "log(X)"),
    "Sqrt": ("(float)emu_sqrt((double)a)", "sqrt(X)"),
    "Sigmoid": ("(float)(1.0 / (1.0 + emu_exp(-(double)a)))", "1 / (1 + exp(-X))"),
    "Tanh": ("(float)(a > 20.0f ? 1.0 : (a < -20.0f ? -1.0 : "
             "emu_expm1(2.0 * (double)a) / (emu_expm1(2.0 * (double)a) + 2.0)))", "tanh(X)"),
}
#: the software-double helpers of ``_common.j2``'s ``math_helpers`` and the helpers each calls:
#: a kernel gets only those its expression needs, because clang (the DPU compiler) rejects an
#: unused ``static inline`` function under -Wall -Werror (gcc does not; issue 14)
MATH_HELPER_DEPS = {"emu_exp2i": (), "emu_exp": ("emu_exp2i",), "emu_expm1": ("emu_exp",),
                    "emu_log": (), "emu_sqrt": (), "emu_expf": (), "emu_erff": ("emu_expf",),
                    "emu_gelu": ("emu_erff",), "emu_gelu_tanh": ("emu_expf",)}
#: Gelu (cinm Gelu) in float32 helpers, by ``approximate``: C expression, doc, cost-model op
GELU = {"none": ("emu_gelu(a)", "x / 2 * (1 + erf(x / sqrt 2))", "gelu"),
        "tanh": ("emu_gelu_tanh(a)", "x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))",
                 "gelu_tanh")}


def math_helpers_for(expr: str) -> frozenset:
    """The math helpers (:data:`MATH_HELPER_DEPS`) the C expression ``expr`` calls, with their
    dependencies; empty for an expression that calls none."""
    need, todo = set(), [f for f in MATH_HELPER_DEPS if re.search(rf"\b{f}\(", expr)]
    while todo:
        f = todo.pop()
        if f not in need:
            need.add(f)
            todo.extend(MATH_HELPER_DEPS[f])
    return frozenset(need)


#: instruction-equivalents of one transcendental in software double: ~20 double operations of
#: ~150 instructions each (our estimate; PrIM measures DOUBLE add at 3.32 MOPS ~ 105
#: instructions and mul at 0.53 MOPS ~ 660, field notes §1.5)
_SOFT_DOUBLE_INSTR = 4000
#: ONNX op -> the cost model's operation (cost.op_instructions)
_COST_OP = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min",
            "Relu": "relu", "Abs": "abs", "Neg": "neg", "LeakyRelu": "leakyrelu",
            "HardSigmoid": "hardsigmoid", "Clip": "clip", "Exp": "exp", "Log": "log",
            "Sqrt": "sqrt", "Sigmoid": "sigmoid", "Tanh": "tanh"}
UNARY = ("Relu", "Abs", "Neg", "LeakyRelu", "HardSigmoid", "Clip") + tuple(TRANSCENDENTAL) + ("Gelu",)
REDUCE = ("add", "mul", "max", "min")

#: Chunk of a long Transpose run (trailing elements moved together), bytes: one sub-tile
#: buffer of 1 KB keeps 16 tasklets' two buffers and stacks within 64 KB (our choice)
TRANSPOSE_CHUNK_BYTES = 1024
#: The stack we assume per tasklet (the SDK's STACK_SIZE_DEFAULT; our assumption, also the
#: emulator's default; the mapping's): with the buffers, what must fit the target's WRAM.
STACK_BYTES = _mapping.STACK_BYTES
#: WRAM the generated globals take besides the per-tasklet buffers (arguments, barrier, partials
#: are accounted per kernel); a margin for the runtime's own globals.
WRAM_MARGIN = 512

# Instruction-equivalents per element of a streaming loop, for the emulator's counters:
# 350 MHz / measured MOPS of PrIM's arithmetic-throughput loops (>= 11 tasklets), field notes
# upmem.md §1.5 (values recalled there, to verify against PrIM Fig. 4): INT32 add 58.56 MOPS ->
# 6, mul 10.27 -> 34, div 11.27 -> 31; INT64 add 50.16 -> 7, mul 2.56 -> 137, div 1.40 -> 250;
# FLOAT add 4.91 -> 71, sub 4.59 -> 76, mul 1.91 -> 183, div 0.34 -> 1029. Compare/select ops
# are our estimate: the add loop plus 2 (integers) or a float compare (~ a float add).
_INSTR = {
    "int32": {"add": 6, "sub": 6, "mul": 34, "div": 31, "cmp": 8},
    "int64": {"add": 7, "sub": 7, "mul": 137, "div": 250, "cmp": 10},
    "float32": {"add": 71, "sub": 76, "mul": 183, "div": 1029, "cmp": 71},
}
for _t in ("uint32", "int8", "uint8", "int16", "uint16"):
    _INSTR[_t] = _INSTR["int32"]
_INSTR["uint64"] = _INSTR["int64"]


def instr_per_elem(dtype: str, what: str) -> int:
    """Instruction-equivalents per element for op class ``what`` (add sub mul div cmp)."""
    return _INSTR[dtype][what]


@dataclass
class _Tensor:
    name: str
    shape: tuple
    dtype: str
    const: str | None = None  # sidecar file name
    bstrides: tuple = ()      # element strides broadcasting it to the output shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype, "const": self.const}


#: True while :func:`check_emittable` runs the emitters: they compute and check their geometry
#: but write nothing
_DRY: contextvars.ContextVar = contextvars.ContextVar("upmem_dry_run", default=False)

#: the unrolling of the kernel being emitted (set by :func:`emit_kernel`)
_UNROLL: contextvars.ContextVar = contextvars.ContextVar("upmem_unroll", default=_mapping.UNROLL)

#: the DPU generation the kernel being emitted is for (set by :func:`emit_kernel`): its WRAM,
#: MRAM, DMA limit, tasklets and DPUs bound every kernel's geometry
_TARGET: contextvars.ContextVar = contextvars.ContextVar("upmem_target", default=_cost.DEFAULT_PARAMS)


def elem_instr(op: str, dtype: str) -> int:
    """Instructions of one operation on one element, from the cost model
    (:func:`onnx_cinm.devices.upmem.cost.op_instructions`): the same numbers the mapping charges."""
    return _cost.op_instructions(op, dtype)


@dataclass
class _K:
    """The template context of one kernel (``k`` in the templates)."""

    kind: str
    dtype: str
    dpus: int
    tasklets: int
    block: int
    inputs: list
    outputs: list
    extra: dict = field(default_factory=dict)
    #: inner-loop unrolling of the generated loops (``emit_kernel(unroll=...)``, default the
    #: mapping's ``UNROLL``)
    unroll: int = field(default_factory=lambda: _UNROLL.get())

    @property
    def merge(self) -> str:
        """How partial results merge (``tree``, or ``mutex``/``host``: PrIM's, for comparison)."""
        return self.extra.get("merge", "tree")

    @property
    def gathers(self) -> bool:
        """Whether the host program calls ``gather_strided`` (broadcast or permuted operands,
        a bias): the prelude defines it only then, because clang rejects an unused static
        function under -Wall -Werror (issue 14)."""
        return self.kind in ("binary", "unary", "reduce", "scan", "topk") or bool(self.extra.get("bias"))

    @property
    def dma_max(self) -> int:
        """Most bytes one MRAM<->WRAM DMA moves on the target (``UpmemParams.dma_max``)."""
        return _TARGET.get().dma_max

    @property
    def loop_ctl(self) -> int:
        """Loop-control instructions per loop iteration (cost model: ``LOOP_CONTROL``)."""
        return _cost.LOOP_CONTROL

    @property
    def block_instr(self) -> int:
        """Instructions per DMA block outside the element loop (mapping: ``BLOCK_INSTR``)."""
        return _mapping.BLOCK_INSTR

    @property
    def ctype(self) -> str:
        return {**CTYPES, **SMALL_CTYPES, "bool": ("uint8_t", "uint32_t")}[self.dtype][0]

    @property
    def utype(self) -> str:
        return {**CTYPES, **SMALL_CTYPES, "bool": ("uint8_t", "uint32_t")}[self.dtype][1]

    @property
    def esize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def __getattr__(self, name):  # extra fields read as attributes in the templates
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError(name)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _c_strides(shape) -> list[int]:
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return st[::-1]


def broadcast_strides(shape, out_shape) -> tuple:
    """Element strides reading ``shape`` (numpy-broadcast) at every index of ``out_shape``."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    st = _c_strides(shape)
    return tuple(0 if s == 1 and o != 1 else t for s, o, t in zip(shape, out_shape, st))


def _fit_block(block_bytes: int, tasklets: int, per_tasklet_blocks: float, fixed: int = 0,
               cap: int | None = None) -> int:
    """The largest block <= ``block_bytes`` (multiple of 8, 8..``dma_max`` of the target)
    such that ``tasklets * (per_tasklet_blocks * block + stack) + fixed + margin <= WRAM``
    (the target's ``wram_bytes``); also at most ``cap`` bytes (rounded up to 8). Raises
    ValueError if even 8 bytes do not fit."""
    tg = _TARGET.get()
    b = max(8, min(tg.dma_max, int(block_bytes)) // 8 * 8)
    if cap is not None:
        b = min(b, max(8, _round_up(int(cap), 8)))
    while b > 8 and tasklets * (per_tasklet_blocks * b + STACK_BYTES) + fixed + WRAM_MARGIN > tg.wram_bytes:
        b -= 8
    if tasklets * (per_tasklet_blocks * b + STACK_BYTES) + fixed + WRAM_MARGIN > tg.wram_bytes:
        raise ValueError(f"{tasklets} tasklets do not fit in {tg.wram_bytes} B of WRAM with their buffers")
    return b


def _c_float(v: float) -> str:
    v = float(np.float32(v))
    if math.isinf(v):
        return "(-__builtin_inff())" if v < 0 else "__builtin_inff()"
    return f"{v!r}f"


def _c_lit(v, dtype: str) -> str:
    """A C literal of ``v`` in ``dtype`` (integers cast, floats as float32)."""
    if dtype == "float32":
        return _c_float(v)
    info = np.iinfo(np.dtype(dtype))
    v = int(max(info.min, min(info.max, v)))
    if dtype == "int64" and v == info.min:
        return "INT64_MIN"
    if dtype == "int32" and v == info.min:
        return "INT32_MIN"
    suffix = {"int32": "", "uint32": "u", "int64": "ll", "uint64": "ull"}.get(dtype, "")
    ctype = (CTYPES.get(dtype) or SMALL_CTYPES[dtype])[0]
    return f"(({ctype}){v}{suffix})"


def _limits(dtype: str) -> tuple[str, str]:
    if dtype == "float32":
        return "(-__builtin_inff())", "__builtin_inff()"
    info = np.iinfo(np.dtype(dtype))
    return _c_lit(info.min, dtype), _c_lit(info.max, dtype)


def _binary_expr(op: str, dtype: str) -> tuple[str, str, int]:
    """C expression of ``op(a, b)``, its doc, instructions per element."""
    flt = dtype == "float32"
    if op in ("Add", "Sub", "Mul"):
        sym = {"Add": "+", "Sub": "-", "Mul": "*"}[op]
        cls = {"Add": "add", "Sub": "sub", "Mul": "mul"}[op]
        e = f"a {sym} b" if flt else f"(T)((UT)a {sym} (UT)b)"  # wrap around, as numpy does
        return e, f"A {sym} B", instr_per_elem(dtype, cls)
    if op == "Div":
        if flt:
            return "a / b", "A / B", instr_per_elem(dtype, "div")
        # C truncation (as onnxruntime); x / 0 -> 0 and MIN / -1 -> MIN instead of a trap
        if dtype.startswith("u"):
            return "b == 0 ? (T)0 : a / b", "A / B (truncating; x / 0 = 0)", instr_per_elem(dtype, "div")
        return ("b == 0 ? (T)0 : (b == -1 ? (T)(0 - (UT)a) : a / b)",
                "A / B (truncating; x / 0 = 0)", instr_per_elem(dtype, "div"))
    if op in ("Max", "Min"):
        sym = ">" if op == "Max" else "<"
        if flt:  # NaN in either operand gives NaN (onnxruntime's Max/Min; a != a is isnan)
            return (f"(a {sym} b || a != a) ? a : b", f"{op.lower()}(A, B), NaN if either is NaN",
                    instr_per_elem(dtype, "cmp"))
        return f"a {sym} b ? a : b", f"{op.lower()}(A, B)", instr_per_elem(dtype, "cmp")
    raise ValueError(f"no UPMEM kernel for binary op {op!r}; expected one of {BINARY}")


def _unary_expr(op: str, dtype: str, params: dict) -> tuple[str, str, int]:
    flt = dtype == "float32"
    cmp = instr_per_elem(dtype, "cmp")
    unsigned = dtype.startswith("u")
    if op == "Relu":
        if flt:  # Relu(NaN) = NaN, as onnxruntime (a > 0 would map NaN to 0)
            return ("a < 0.0f ? 0.0f : a", "max(X, 0), NaN stays NaN", cmp)
        return ("a > 0 ? a : (T)0", "max(X, 0)", cmp)
    if op == "Abs":
        if unsigned:
            return "a", "|X|", 1
        return ("a < 0 ? -a : a" if flt else "a < 0 ? (T)(0 - (UT)a) : a"), "|X|", cmp
    if op == "Neg":
        if flt:
            return "-a", "-X", cmp
        return "(T)(0 - (UT)a)", "-X (wrapping)", instr_per_elem(dtype, "sub")
    if op == "LeakyRelu":
        if not flt:
            raise ValueError("LeakyRelu needs float32")
        al = _c_float(params.get("alpha", 0.01))
        return f"a < 0 ? {al} * a : a", f"X < 0 ? {al} * X : X", cmp + instr_per_elem(dtype, "mul")
    if op == "HardSigmoid":
        if not flt:
            raise ValueError("HardSigmoid needs float32")
        al, be = _c_float(params.get("alpha", 0.2)), _c_float(params.get("beta", 0.5))
        v = f"({al} * a + {be})"
        return (f"{v} < 0.0f ? 0.0f : ({v} > 1.0f ? 1.0f : {v})",
                f"clip({al} * X + {be}, 0, 1)",
                2 * cmp + instr_per_elem(dtype, "mul") + instr_per_elem(dtype, "add"))
    if op == "Clip":
        # ONNX Clip: min applied first, then max (so min > max gives max). A bound that is
        # absent or at the type's limit is left out (the comparison would be always false,
        # which -Wtype-limits rejects).
        lo_v, hi_v = params.get("min"), params.get("max")
        e, doc = "a", "X"
        if flt:
            lo_ok, hi_ok = lo_v is not None, hi_v is not None
        else:
            info = np.iinfo(np.dtype(dtype))
            lo_ok = lo_v is not None and lo_v > info.min
            hi_ok = hi_v is not None and hi_v < info.max
        if lo_ok:
            lo = _c_lit(lo_v, dtype)
            e, doc = f"(a < {lo} ? {lo} : a)", f"max(X, {lo})"
        if hi_ok:
            hi = _c_lit(hi_v, dtype)
            e, doc = f"({e} > {hi} ? {hi} : {e})", f"min({doc}, {hi})"
        return e, doc, 2 * cmp
    if op in TRANSCENDENTAL:
        if not flt:
            raise ValueError(f"{op} needs float32")
        return TRANSCENDENTAL[op] + (_SOFT_DOUBLE_INSTR,)
    if op == "Gelu":
        if not flt:
            raise ValueError("Gelu needs float32")
        expr, doc, cop = GELU[params.get("approximate", "none")]
        return expr, doc, elem_instr(cop, dtype)
    raise ValueError(f"no UPMEM kernel for unary op {op!r}; expected one of {UNARY}")


def _write(outdir: Path, family: str, k: _K, manifest: dict) -> list[Path]:
    if _DRY.get():
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for tmpl, name in (("host.c.j2", "host.c"), ("dpu.c.j2", "dpu.c"), ("Makefile.j2", "Makefile")):
        text = _ENV.get_template(f"upmem/{family}/{tmpl}").render(k=k)
        p = outdir / name
        p.write_text(text)
        paths.append(p)
    man = {"format": "onnx-cinm-upmem-kernel/1", "kind": k.kind, "family": family,
           "dtype": k.dtype, "dpus": k.dpus, "tasklets": k.tasklets, "block_bytes": k.block,
           "unroll": k.unroll,
           "argv": "host DPU_BINARY " + " ".join(t.name.upper() for t in k.inputs + k.outputs),
           "inputs": [t.to_json() for t in k.inputs],
           "outputs": [t.to_json() for t in k.outputs], **manifest}
    p = outdir / "kernel.json"
    p.write_text(json.dumps(man, indent=1) + "\n")
    paths.append(p)
    paths += [outdir / t.const for t in k.inputs if t.const]
    return paths


def _inputs(names, shapes, dtypes, consts, outdir: Path) -> list[_Tensor]:
    ts = []
    for i, (n, s, dt) in enumerate(zip(names, shapes, dtypes)):
        t = _Tensor(n, tuple(int(d) for d in s), dt)
        if consts and i in consts and consts[i] is not None:
            # np.asarray(order="C"), not ascontiguousarray: that one turns a scalar into shape (1,)
            arr = np.asarray(consts[i], dtype=np.dtype(dt), order="C")
            if arr.shape != t.shape:
                raise ValueError(f"constant input {i} has shape {arr.shape}, expected {t.shape}")
            t.const = f"const{i}.bin"
            if not _DRY.get():
                outdir.mkdir(parents=True, exist_ok=True)
                arr.tofile(outdir / t.const)
        ts.append(t)
    return ts


def _check_dtype(dtype: str, kind: str = "") -> str:
    dtype = np.dtype(dtype).name
    ok = ELEMENTWISE_DTYPES if kind in ("binary", "unary") else DTYPES
    if kind == "popcount":
        ok = ("bool", "uint8", "uint16", "uint32", "uint64")
    if dtype not in ok:
        raise ValueError(f"no UPMEM {kind} kernel for dtype {dtype}; supported: {', '.join(ok)}")
    return dtype


def _check_workgroup(dpus: int, tasklets: int) -> None:
    tg = _TARGET.get()
    if not 1 <= int(dpus) <= tg.max_dpus:
        raise ValueError(f"dpus={dpus}: expected 1..{tg.max_dpus}")
    if not 1 <= int(tasklets) <= tg.max_tasklets:
        raise ValueError(f"tasklets={tasklets}: expected 1..{tg.max_tasklets} (UPMEM hardware "
                         f"threads on {tg.name})")


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
    if kind not in KINDS:
        raise ValueError(f"unknown UPMEM kernel kind {kind!r}; expected one of {KINDS}")
    dtype = _check_dtype(dtype, kind)
    unroll = int(params.pop("unroll", _mapping.UNROLL))
    if not 1 <= unroll <= 64:
        raise ValueError(f"unroll={unroll}: expected 1..64")
    outdir = Path(outdir)
    fn = globals()[f"_emit_{'gemm' if kind in ('gemv', 'mlp') else kind}"]
    tok, ttok = _UNROLL.set(unroll), _TARGET.set(target)
    try:
        _check_workgroup(dpus, tasklets)
        return fn(kind, dtype, [tuple(int(d) for d in s) for s in shapes], int(dpus), int(tasklets),
                  int(block_bytes), outdir, consts or {}, params)
    finally:
        _UNROLL.reset(tok)
        _TARGET.reset(ttok)


def _check_mram(per_dpu_bytes: int, what: str) -> None:
    mram = _TARGET.get().mram_bytes
    if per_dpu_bytes > mram:
        raise ValueError(f"{what}: {per_dpu_bytes} bytes per DPU exceed the {mram} B of MRAM; "
                         "use more DPUs")


# ----------------------------------------------------------------------------------------------
# elementwise (VA)


def _emit_binary(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)


def _emit_unary(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)


def _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    op = params.get("op")
    nin = 2 if kind == "binary" else 1
    if len(shapes) != nin:
        raise ValueError(f"{kind} {op}: expected {nin} input shape(s), got {len(shapes)}")
    if kind == "binary":
        expr, doc, instr = _binary_expr(op, dtype)
        out_shape = tuple(np.broadcast_shapes(*shapes))
    else:
        expr, doc, instr = _unary_expr(op, dtype, params)
        out_shape = shapes[0]
    names = ["A", "B"] if nin == 2 else ["X"]
    ins = _inputs(names, shapes, [dtype] * nin, consts, outdir)
    for t in ins:
        t.bstrides = broadcast_strides(t.shape, out_shape)
    # per element: a WRAM load per input, the operation, a store (mapping's elementwise model)
    cop = GELU[params.get("approximate", "none")][2] if op == "Gelu" else _COST_OP[op]
    instr = nin + elem_instr(cop, dtype) + 1
    es = np.dtype(dtype).itemsize
    n = math.prod(out_shape)
    per = 8 // math.gcd(8, es)                       # elements per 8 bytes
    cap = max(per, _round_up(_ceil(n, dpus), per))   # elements per DPU, 8-byte multiple
    _check_mram((nin + 1) * cap * es, f"{op} of {n} elements on {dpus} DPUs")
    blk = _fit_block(block, tasklets, nin, cap=cap * es)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(op=op, expr=expr, expr_doc=doc, instr=instr, n=n, cap=cap, cap_bytes=cap * es,
                out_shape=out_shape, math=math_helpers_for(expr)))
    return _write(outdir, "elementwise", k, {"op": op, "params": {
        x: params[x] for x in ("alpha", "beta", "min", "max", "approximate")
        if params.get(x) is not None}})


# ----------------------------------------------------------------------------------------------
# gemm / gemv / MLP layer (GEMV, MLP)


def _emit_gemm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    bias = len(shapes) == 3
    relu = bool(params.get("relu", kind == "mlp"))
    if kind == "gemv":
        if len(shapes[0]) != 2 or len(shapes[1]) != 1 or shapes[0][1] != shapes[1][0]:
            raise ValueError(f"gemv: expected A[M, K], x[K], got {shapes}")
        M, K = shapes[0]
        ashape, bshape, yshape = (M, K), (K, 1), (M, 1)
        cshape = (M, 1) if bias else None
        names, out_shape = ["A", "x", "c"], (M,)
        if bias and shapes[2] != (M,):
            raise ValueError(f"gemv: bias must be [M] = [{M}], got {shapes[2]}")
    else:
        if len(shapes) not in (2, 3) or len(shapes[0]) < 2 or len(shapes[1]) < 2:
            raise ValueError(f"{kind}: expected A[..., M, K], B[..., K, N] (, C), got {shapes}")
        ashape, bshape = shapes[0], shapes[1]
        if ashape[-1] != bshape[-2]:
            raise ValueError(f"{kind}: inner dims differ: A{list(ashape)} @ B{list(bshape)}")
        M, K, N = ashape[-2], ashape[-1], bshape[-1]
        batch = tuple(np.broadcast_shapes(ashape[:-2], bshape[:-2]))
        yshape = batch + (M, N)
        cshape = shapes[2] if bias else None
        if bias:
            np.broadcast_shapes(cshape, yshape)
            if tuple(np.broadcast_shapes(cshape, yshape)) != yshape:
                raise ValueError(f"{kind}: C{list(cshape)} does not broadcast to Y{list(yshape)}")
        names, out_shape = ["A", "B", "C"], yshape
    M, K = ashape[-2], ashape[-1]
    N = bshape[-1]
    batch = yshape[:-2]
    G = math.prod(batch)
    GB = math.prod(bshape[:-2])
    b_batched = GB > 1
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    rows = G * M
    # DPU grid: DR row blocks x DC column blocks (the cnm mapping's cnm_grid), else all rows
    grid = params.get("grid")
    DR, DC = (int(grid[0]), int(grid[1])) if grid else (min(dpus, rows), 1)
    if DR < 1 or DC < 1 or DR * DC > _TARGET.get().max_dpus or (DC > 1 and b_batched) or DC > max(N, 1):
        raise ValueError(f"{kind}: no {DR} x {DC} DPU grid for {rows} rows x {N} columns"
                         + (" with a batched B" if b_batched and DC > 1 else ""))
    K_pad = _round_up(K, per)
    row_cap = max(1, _ceil(rows, DR))
    N_cap = _round_up(_ceil(N, DC), per)
    if not grid:  # our own choice: no DPU without rows; a given grid is kept as planned
        DR = _ceil(rows, row_cap)
    R = 1 if b_batched else min(4, row_cap)
    NT = min(N_cap, _round_up(64, per))
    if params.get("prim_tiles"):   # PrIM's GEMV for comparison: one row and one column per item
        R, NT = 1, per
    groups = _ceil(row_cap, R)
    if not params.get("prim_tiles") and row_cap < tasklets and groups * _ceil(N_cap, NT) < tasklets:
        # few rows (a layer at batch 1): narrower column tiles so that every tasklet works
        NT = max(per, _round_up(_ceil(N_cap, _ceil(tasklets, groups)), per))
    ins = _inputs(names[:len(shapes)], shapes, [dtype] * len(shapes), consts, outdir)
    a_bstride = [s * M * K for s in broadcast_strides(ashape[:-2], batch)]
    b_bstride = [s * K * N for s in broadcast_strides(bshape[:-2], batch)]
    # per-DPU MRAM layout, bytes (8-aligned)
    y_off = row_cap * K_pad * es
    c_off = y_off + row_cap * N_cap * es
    rb_off = c_off + (row_cap * N_cap * es if bias else 0)
    b_off = rb_off + (row_cap * 8 if b_batched else 0)
    _check_mram(b_off + GB * N_cap * K_pad * es,
                f"{kind} {list(ashape)} @ {list(bshape)} on a {DR} x {DC} DPU grid")
    blk = _fit_block(block, tasklets, R + 1, fixed=tasklets * (R * NT * es + 8), cap=K_pad * es)
    # per multiply-accumulate: 2 WRAM loads, mul, add (mapping's matrix-product model)
    mac = 2 + elem_instr("mul", dtype) + elem_instr("add", dtype)
    doc = (f"Y{list(yshape)} = A{list(ashape)} @ B{list(bshape)}" + (f" + C{list(cshape)}" if bias else "")
           + (", then ReLU" if relu else "") + f" ({dtype}; integer products wrap around)")
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(doc=doc, M=M, K=K, N=N, G=G, GB=GB, rows=rows, row_cap=row_cap, K_pad=K_pad,
                N_cap=N_cap, DR=DR, DC=DC, R=R, NT=NT, y_off=y_off, c_off=c_off, rb_off=rb_off,
                b_off=b_off, bias=bias, relu=relu, b_batched=b_batched, batch=batch,
                a_bstride=a_bstride, b_bstride=b_bstride, y_shape=yshape,
                c_strides=broadcast_strides(cshape, yshape) if bias else (), instr=mac,
                n_comp=1 if N == 1 else N_cap))
    return _write(outdir, "gemm", k, {"relu": relu, "bias": bias, "grid": [DR, DC],
                                      "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# row layouts shared by reduce / scan / topk: [O, L] split over a DR x DC grid of DPUs


def _rows_layout(shape, axes, dpus, per, min_cols=1):
    """Kept axes first, reduced/scanned axes last: ``(perm, O, L)``; and the DPU grid
    ``(DR, DC, row_cap, c_cap)`` splitting L over DC DPUs (``c_cap`` a multiple of ``per``,
    at least ``min_cols``) and the rows over DR."""
    nd = len(shape)
    axes = sorted({a % nd for a in axes}) if nd else []
    keep = [a for a in range(nd) if a not in axes]
    perm = keep + axes
    O = math.prod(shape[a] for a in keep)
    L = math.prod(shape[a] for a in axes)
    DC = max(1, min(dpus, _ceil(L, max(per, min_cols))))
    c_cap = _round_up(max(_ceil(L, DC), min_cols), per)
    DC = _ceil(L, c_cap)
    DR = max(1, min(dpus // DC, O))
    row_cap = max(1, _ceil(O, DR))
    DR = _ceil(O, row_cap) if O else 1
    return perm, O, L, DR, DC, row_cap, c_cap


def _perm_gather(shape, perm):
    """(shape of X permuted by perm, strides reading X in that order)."""
    st = _c_strides(shape)
    return tuple(shape[p] for p in perm), tuple(st[p] for p in perm)


def _combine(kind: str, dtype: str) -> tuple[str, str, int]:
    """C expression combining ``a`` and ``b``, the identity, instructions per element."""
    flt = dtype == "float32"
    lo, hi = _limits(dtype)
    if kind == "add":
        return ("a + b" if flt else "(T)((UT)a + (UT)b)"), "(T)0", instr_per_elem(dtype, "add")
    if kind == "mul":
        return ("a * b" if flt else "(T)((UT)a * (UT)b)"), "(T)1", instr_per_elem(dtype, "mul")
    if kind == "max":
        return "a > b ? a : b", lo, instr_per_elem(dtype, "cmp")
    if kind == "min":
        return "a < b ? a : b", hi, instr_per_elem(dtype, "cmp")
    raise ValueError(f"reduce kind must be one of {REDUCE}, got {kind!r}")


def _emit_reduce(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    rk = params.get("reduce", "add")
    axes = list(params.get("axes", range(len(shape))))
    keepdims = int(params.get("keepdims", 1))
    if math.prod(shape) == 0:
        raise ValueError("reduce: empty input")
    expr, ident, instr = _combine(rk, dtype)
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, axes, dpus, per)
    nd = len(shape)
    axes_n = sorted({a % nd for a in axes}) if nd else []
    out_shape = tuple((1 if a in axes_n else shape[a]) for a in range(nd)) if keepdims else \
        tuple(shape[a] for a in range(nd) if a not in axes_n)
    GR = min(_round_up(row_cap, per), max(per, 256 // es))
    row_pad = _round_up(row_cap, GR)
    merge = params.get("merge", "tree")
    if merge not in ("tree", "host"):
        raise ValueError(f"reduce: merge={merge!r}; expected 'tree' or 'host' (PrIM's default)")
    p_off = row_cap * c_cap * es
    _check_mram(p_off + row_pad * es * (tasklets if merge == "host" else 1),
                f"reduce {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * GR * es, cap=c_cap * es)
    pshape, pstride = _perm_gather(shape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(reduce=rk, axes=axes_n, O=O, L=L, DR=DR, DC=DC, row_cap=row_cap, row_pad=row_pad,
                c_cap=c_cap, p_off=p_off, GR=GR, expr=expr, ident=ident,
                instr=1 + elem_instr(rk, dtype), op_instr=elem_instr(rk, dtype), merge=merge,
                pshape=pshape, pstride=pstride))
    return _write(outdir, "reduce", k, {"reduce": rk, "axes": axes_n, "keepdims": keepdims,
                                        "dpus_requested": dpus, "merge": merge})


# ----------------------------------------------------------------------------------------------
# cinm op -> kernel (UpmemDevice.supports / emit)


def _attr(attrs: dict, name: str, default=None):
    v = attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _transpose_groups(perm) -> tuple | None:
    """``perm`` as a swap of two adjacent axis groups: ``(lead, a, b, trail)`` axis counts such
    that Y = X[lead][A][B][trail] -> Y[lead][B][A][trail]; None if it is not one."""
    perm = list(perm)
    n = len(perm)
    lead = 0
    while lead < n and perm[lead] == lead:
        lead += 1
    trail = 0
    while trail < n - lead and perm[n - 1 - trail] == n - 1 - trail:
        trail += 1
    mid = perm[lead:n - trail]
    if not mid:
        return (lead, 0, 0, trail)
    # mid must be [b0..b_end) + [lead..b0): a rotation of the axes lead..n-trail-1
    b0 = mid[0]
    nb = n - trail - b0
    want = list(range(b0, n - trail)) + list(range(lead, b0))
    if mid != want:
        return None
    return (lead, b0 - lead, nb, trail)


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
    return (Path(__file__).resolve().parents[2] / "templates" / "upmem" / family
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
    dtype = np.dtype(ins[0].dtype).name
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
                raise ValueError("Clip with one bound: cannot tell min from max in OpInfo")
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


def check_emittable(op, attrs: dict, *, target: _cost.UpmemParams = _cost.DEFAULT_PARAMS,
                    default_dpus: int | None = None, default_tasklets: int | None = None,
                    default_block: int = 1024) -> None:
    """Raise ValueError (the emitter's reason) if :func:`emit_op` would refuse ``op`` with the
    plan ``attrs`` (``cnm_dpus``, ``cnm_tasklets``, ``cnm_block_bytes``, ``cnm_grid``); nothing
    is written. The device's ``supports`` and ``lower`` call it, so placement never accepts an
    op whose kernel cannot be generated (issue 17 #2)."""
    tok = _DRY.set(True)
    try:
        emit_op(op, dict(attrs, kernel=attrs.get("kernel") or "dry-run"), {}, Path("."),
                target=target, default_dpus=default_dpus, default_tasklets=default_tasklets,
                default_block=default_block)
    finally:
        _DRY.reset(tok)


def emit_op(op, attrs: dict, consts: dict, root, *,
            target: _cost.UpmemParams = _cost.DEFAULT_PARAMS, default_dpus: int | None = None,
            default_tasklets: int | None = None, default_block: int = 1024) -> list[Path]:
    """Write the kernel of cinm ``op`` into ``root / attrs["kernel"]`` (see
    :meth:`UpmemDevice.emit <onnx_cinm.devices.upmem.UpmemDevice.emit>`).

    The workgroup and block come from the plan attributes ``cnm_dpus``, ``cnm_tasklets``,
    ``cnm_block_bytes`` (the ``cnm_mapping`` pass), else the defaults (DPUs: one rank, at most
    ``target.dpus``; tasklets: ``target.tasklets``). ``target`` is the DPU generation. ``consts`` maps constant
    input names to arrays: they become sidecar files. ``kernel.json`` also records, per input
    and output, the graph tensor name (``tensor``).

    Raises:
        ValueError: no kernel for the op (see :func:`kernel_for`) or no ``kernel`` attribute.
    """
    if not attrs.get("kernel"):
        raise ValueError(f"{op.name}: no 'kernel' attribute (run the cnm_mapping pass first)")
    kind, dtype, shapes, params = kernel_for(op, consts, target)
    if kind in ("gemm", "gemv") and attrs.get("cnm_grid"):
        params["grid"] = [int(x) for x in attrs["cnm_grid"]]
    outdir = Path(root) / _attr(attrs, "kernel")
    dpus = int(attrs.get("cnm_dpus") or default_dpus or min(target.dpus, target.dpus_per_rank))
    tasklets = int(attrs.get("cnm_tasklets") or default_tasklets or target.tasklets)
    block = int(attrs.get("cnm_block_bytes") or default_block)
    used = op.inputs[:len(shapes)]
    cidx = {i: consts[x.name] for i, x in enumerate(used) if consts and x.name in consts}
    paths = emit_kernel(kind, dtype, shapes, dpus=dpus, tasklets=tasklets, block_bytes=block,
                        outdir=outdir, consts=cidx, target=target, **params)
    if _DRY.get():
        return paths
    man_p = outdir / "kernel.json"
    man = json.loads(man_p.read_text())
    for spec, x in zip(man["inputs"], used):
        spec["tensor"] = x.name
    for spec, x in zip(man["outputs"], op.outputs):
        spec["tensor"] = x.name
    man["node"] = op.name
    man["op_type"] = op.op_type
    man_p.write_text(json.dumps(man, indent=1) + "\n")
    return paths


# ----------------------------------------------------------------------------------------------
# histogram (HST-S)


def _c_double(v: float) -> str:
    v = float(np.float32(v))  # the attribute is a float32 (ONNX AttributeProto.FLOAT)
    if math.isinf(v):
        return "(-__builtin_inf())" if v < 0 else "__builtin_inf()"
    return f"({v!r})"


def _max_tasklets(tasklets: int, per_tasklet: int, fixed: int = 0) -> int:
    """The most tasklets (<= ``tasklets``) whose ``per_tasklet`` WRAM bytes plus stacks fit."""
    t, wram = tasklets, _TARGET.get().wram_bytes
    while t > 1 and t * (per_tasklet + STACK_BYTES) + fixed + WRAM_MARGIN > wram:
        t -= 1
    if t * (per_tasklet + STACK_BYTES) + fixed + WRAM_MARGIN > wram:
        raise ValueError(f"does not fit in {wram} B of WRAM even with one tasklet")
    return t


def _emit_histogram(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    bins = int(params["bins"])
    if not 1 <= bins <= 8192:
        raise ValueError(f"histogram: bins={bins}, the kernel handles 1..8192")
    lo, hi = float(params["min"]), float(params["max"])
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    N = math.prod(shape)
    cap = max(per, _round_up(_ceil(N, dpus), per))
    shift = _mapping.hist_pow2_shift(dtype, bins, lo, hi)
    # the integer path keeps one overflow slot (x == max) after the bins
    bins_pad = _round_up(bins + (1 if shift is not None else 0), 2)
    # private histograms: fewer tasklets when they would not fit (a choice HST-L avoids with
    # a shared histogram and mutexes)
    merge = params.get("merge", "tree")
    if merge not in ("tree", "mutex"):
        raise ValueError(f"histogram: merge={merge!r}; expected 'tree' or 'mutex' (PrIM HST-L)")
    blk0 = max(8, min(_TARGET.get().dma_max, block) // 8 * 8)
    if merge == "mutex":   # one shared histogram
        tasklets = _max_tasklets(tasklets, min(blk0, cap * es), fixed=bins_pad * 4)
        blk = _fit_block(block, tasklets, 1, fixed=bins_pad * 4, cap=cap * es)
    else:
        tasklets = _max_tasklets(tasklets, bins_pad * 4 + min(blk0, cap * es))
        blk = _fit_block(block, tasklets, 1, fixed=tasklets * bins_pad * 4, cap=cap * es)
    _check_mram(cap * es + bins_pad * 4, f"histogram of {N} elements on {dpus} DPUs")
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    # per element, as the mapping's histogram model: ld, bin + range check, address, ld/add/st
    instr = 1 + _mapping.hist_bin_instr(dtype, shift is not None)
    if merge == "tree":
        instr += 1 + 3   # the count's address, ld/add/st (under the mutex: MUTEX_CS_INSTR)
    flo, fhi = float(np.float32(lo)), float(np.float32(hi))
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("counts", (bins,), "int64")],
           dict(N=N, cap=cap, bins=bins, bins_pad=bins_pad, h_off=cap * es, lo=lo, hi=hi,
                lo_c=_c_double(lo), hi_c=_c_double(hi), instr=instr, shift=shift,
                lo_i=_c_lit(int(flo) if shift is not None else 0, dtype),
                span=(int(fhi) - int(flo) if shift is not None else 0),
                add_instr=elem_instr("add", "int32"), merge=merge,
                cs_instr=_mapping.MUTEX_CS_INSTR))
    return _write(outdir, "histogram", k, {"bins": bins, "min": lo, "max": hi, "merge": merge})


# ----------------------------------------------------------------------------------------------
# compress (SEL)


def _emit_compress(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if len(shapes) != 2 or math.prod(shapes[0]) != math.prod(shapes[1]):
        raise ValueError(f"compress: expected X and a mask of as many elements, got {shapes}")
    es = np.dtype(dtype).itemsize
    N = math.prod(shapes[0])
    TL = max(8, _round_up(_ceil(N, dpus * tasklets), 8))  # elements per tasklet, 8 of them = 8 mask bytes
    cap = TL * tasklets
    m_off = cap * es
    y_off = m_off + cap
    _check_mram(y_off + cap * es, f"compress of {N} elements on {dpus} DPUs")
    # buffers: X block, staging block, mask block (BLOCK / sizeof(T) bytes); >= 8 mask bytes
    blk = _fit_block(max(block, 8 * es), tasklets, 2 + 1 / es,
                     fixed=tasklets * 2 * _UNROLL.get() * es, cap=TL * es)
    blk = max(blk, 8 * es) // (8 * es) * (8 * es)
    ins = _inputs(["X", "mask"], shapes, [dtype, "bool"], consts, outdir)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", None, dtype)],
           dict(N=N, cap=cap, TL=TL, m_off=m_off, y_off=y_off,
                # ld x, ld mask, st, the mask test, the index add (mapping's select model)
                instr=1 + 1 + 1 + elem_instr("and", "int32") + elem_instr("add", "int32")))
    return _write(outdir, "compress", k, {})


# ----------------------------------------------------------------------------------------------
# scan (SCAN-SSA)


def _inverse_gather(shape, perm):
    """(X's shape, strides reading an array laid out as X permuted by ``perm``) - the gather
    that undoes :func:`_perm_gather`."""
    pshape = tuple(shape[p] for p in perm)
    sp = _c_strides(pshape)
    return tuple(shape), tuple(sp[perm.index(a)] for a in range(len(shape)))


def _emit_scan(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    if not shape or math.prod(shape) == 0:
        raise ValueError(f"scan: needs a non-empty tensor of rank >= 1, got {list(shape)}")
    axis = int(params.get("axis", 0)) % len(shape)
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    # every tasklet's piece is CT elements (a multiple of 8 bytes): C_CAP = tasklets * CT
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, [axis], dpus, per * tasklets)
    CT = c_cap // tasklets
    TB = min(_round_up(row_cap, per), max(per, 256 // es))
    row_pad = _round_up(row_cap, TB)
    tot_off = row_cap * c_cap * es
    ofs_off = tot_off + tasklets * row_pad * es
    _check_mram(ofs_off + tasklets * row_pad * es, f"scan {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * TB * es, cap=CT * es)
    pshape, pstride = _perm_gather(shape, perm)
    ishape, istride = _inverse_gather(shape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", shape, dtype)],
           dict(axis=axis, exclusive=int(params.get("exclusive", 0)),
                reverse=int(params.get("reverse", 0)), O=O, L=L, DC=DC, row_cap=row_cap,
                row_pad=row_pad, c_cap=c_cap, CT=CT, TB=TB, tot_off=tot_off, ofs_off=ofs_off,
                pshape=pshape, pstride=pstride, ishape=ishape, istride=istride,
                instr=instr_per_elem(dtype, "add")))
    return _write(outdir, "scan", k, {"axis": axis, "exclusive": k.exclusive,
                                      "reverse": k.reverse, "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# topk


def _topk_better(dtype: str, largest: int) -> str:
    """C expression: does candidate ``(a, ia)`` rank before ``(b, ib)``? Ties go to the lower
    index (ONNX). For floats NaN ranks as the largest value, equal to another NaN, as in
    onnxruntime's TopK (first when largest=1, last when largest=0)."""
    if dtype != "float32":
        cmp, eq = ("a > b" if largest else "a < b"), "a == b"
    else:
        cmp = "(a > b || (a != a && b == b))" if largest else "(a < b || (a == a && b != b))"
        eq = "(a == b || (a != a && b != b))"
    return f"{cmp} || ({eq} && ia < ib)"


def _emit_topk(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    if not shape:
        raise ValueError("topk: needs rank >= 1")
    axis = int(params.get("axis", -1)) % len(shape)
    kk = int(params["k"])
    largest = 1 if int(params.get("largest", 1)) else 0
    if not 1 <= kk <= shape[axis]:
        raise ValueError(f"topk: k={kk} must be in 1..{shape[axis]} (the axis length)")
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    KP = _round_up(kk, per)
    # every tasklet keeps a sorted list of KP values and int64 indices in WRAM: fewer tasklets
    # for a large k; ValueError when one list does not fit (k ~ 5000 float32, ~ 4000 int64)
    try:
        tasklets = _max_tasklets(tasklets, KP * (es + 8) + 4 + 64)
    except ValueError:
        raise ValueError(f"topk: k={kk}: a candidate list of {KP * (es + 8)} bytes does not fit "
                         f"in {_TARGET.get().wram_bytes} B of WRAM") from None
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, [axis], dpus, per)
    v_off = row_cap * c_cap * es
    i_off = v_off + row_cap * KP * es
    _check_mram(i_off + row_cap * KP * 8, f"topk {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * (KP * (es + 8) + 4), cap=c_cap * es)
    pshape, pstride = _perm_gather(shape, perm)
    yshape = tuple(kk if a == axis else d for a, d in enumerate(shape))
    ishape, istride = _inverse_gather(yshape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins,
           [_Tensor("values", yshape, dtype), _Tensor("indices", yshape, "int64")],
           dict(k=kk, axis=axis, largest=largest, better=_topk_better(dtype, largest), KP=KP, O=O, L=L, DC=DC, row_cap=row_cap,
                c_cap=c_cap, v_off=v_off, i_off=i_off, pshape=pshape, pstride=pstride,
                ishape=ishape, istride=istride, instr=2 * instr_per_elem(dtype, "cmp")))
    return _write(outdir, "topk", k, {"k": kk, "axis": axis, "largest": largest,
                                      "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# transpose (TRNS)


def _emit_transpose(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    perm = [int(p) % max(1, len(shape)) for p in params.get("perm", range(len(shape))[::-1])]
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"transpose: perm {perm} is not a permutation of {len(shape)} axes")
    groups = _transpose_groups(perm)
    if groups is None:
        raise ValueError(f"transpose: perm {perm} is not a swap of two adjacent axis groups")
    lead, na, nb, _ = groups
    G = math.prod(shape[:lead])
    A = math.prod(shape[lead:lead + na])
    B = math.prod(shape[lead + na:lead + na + nb])
    E = math.prod(shape[lead + na + nb:])
    es = np.dtype(dtype).itemsize
    # a trailing run longer than one 8-aligned DMA (<= dma_max bytes) is moved in NC chunks of
    # EC elements (1 KB; the last one padded): each chunk is transposed as if it were its own run
    dma_max = _TARGET.get().dma_max
    EC = E
    if (8 // math.gcd(8, E * es)) * E * es > dma_max:
        EC = TRANSPOSE_CHUNK_BYTES // es
    NC = _ceil(E, EC)
    u = EC * es                      # bytes per unit of EC elements
    q = 8 // math.gcd(8, u)          # units per 8-byte-aligned run
    blk = _fit_block(block, tasklets, 2, cap=None)
    m = max(1, math.isqrt(max(1, blk // (q * q * u))))
    BW = min(q * m, _round_up(B, q))
    AC = min(A, max(1, _ceil(G * A, dpus))) if A else 1
    AW = min(q * m, _round_up(AC, q))
    while AW * BW * u > max(blk, q * q * u) or BW * u > dma_max or AW * u > dma_max:
        if BW >= AW and BW > q:
            BW -= q
        elif AW > q:
            AW -= q
        else:
            break
    blk_used = _round_up(AW * BW * u, 8)
    # two sub-tile buffers per tasklet: fewer tasklets when a long run makes them large
    tasklets = _max_tasklets(tasklets, 2 * blk_used)
    AC_pad, B_pad = _round_up(AC, AW), _round_up(B, BW)
    NA = _ceil(A, AC) if A else 1
    units = G * NC * NA
    US = _ceil(units, dpus)
    used = _ceil(units, US)
    tile = AC_pad * B_pad * EC * es
    _check_mram(2 * US * tile, f"transpose {list(shape)} on {dpus} DPUs")
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    yshape = tuple(shape[p] for p in perm)
    k = _K(kind, dtype, used, tasklets, blk_used, ins, [_Tensor("Y", yshape, dtype)],
           dict(perm=perm, G=G, A=A, B=B, E=E, EC=EC, NC=NC, AC=AC, AC_pad=AC_pad, B_pad=B_pad,
                AW=AW, BW=BW,
                NA=NA, units=units, US=US, out_off=US * tile, instr=4))
    return _write(outdir, "transpose", k, {"perm": perm, "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# im2col (the patch matrix of a convolution)


def _emit_im2col(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    ks = list(params["kernel_shape"])
    if len(ks) not in (1, 2) or len(shape) != 2 + len(ks):
        raise ValueError(f"im2col: 1-D or 2-D kernels on X[N, C, *S], got X{list(shape)}, kernel {ks}")
    g = _mapping.im2col_dims(shape, ks, params["strides"], params["pads"], params["dilations"])
    N, C, H, W, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, HP, WP, OH, OW = (
        g[k] for k in ("N", "C", "H", "W", "KH", "KW", "SH", "SW", "DH", "DW", "PT", "PL", "PB",
                       "PR", "HP", "WP", "OH", "OW"))
    if OH < 1 or OW < 1:
        raise ValueError("im2col: empty output")
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    win = _round_up((KW - 1) * DW * es + es, 8) + 8
    dma_max = _TARGET.get().dma_max
    if win > dma_max:
        raise ValueError(f"im2col: a kernel row spans {win} bytes (> {dma_max}, one DMA)")
    CK = C * KH * KW
    CK_pad = _round_up(CK, per)
    rows = N * OH * OW
    # each DPU: NB images x a tile of LB output lines x CB columns, and only the HB x WB padded
    # input rows and columns (per image and channel) the tile reads (mapping.im2col_split:
    # the cost model's split)
    NB, LB, CB, used = _mapping.im2col_split(N, OH, OW, dpus)
    HB = _mapping.im2col_halo(LB, KH, SH, DH)
    WB = _mapping.im2col_halo(CB, KW, SW, DW)
    row_cap = NB * LB * CB
    xp_off = row_cap * CK_pad * es
    xs_elems = _round_up(NB * C * HB * WB, per) + per  # the last window may reach 8 bytes past
    _check_mram(xp_off + xs_elems * es, f"im2col {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * win, cap=CK_pad * es)
    yshape = (N, OH, OW, CK) if params.get("rank", len(params["kernel_shape"])) == 2 else (N, OW, CK)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, used, tasklets, blk, ins, [_Tensor("Y", yshape, dtype)],
           dict(N=N, C=C, H=H, W=W, HP=HP, WP=WP, PT=PT, PL=PL, OH=OH, OW=OW, KH=KH, KW=KW,
                SH=SH, SW=SW, DH=DH, DW=DW, pads=[PT, PL, PB, PR], CK=CK, CK_pad=CK_pad, rows=rows,
                row_cap=row_cap, xp_off=xp_off, xs_elems=xs_elems, win=win, NB=NB, LB=LB, CB=CB,
                HB=HB, WB=WB, BANDS=_ceil(OH, LB), CBLOCKS=_ceil(OW, CB)))
    return _write(outdir, "im2col", k, {"kernel_shape": list(params["kernel_shape"]),
                                        "strides": list(params["strides"]),
                                        "pads": list(params["pads"]),
                                        "dilations": list(params["dilations"]),
                                        "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# popcount


def _emit_popcount(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    n = math.prod(shape)
    cap = max(per, _round_up(_ceil(n, dpus), per))
    _check_mram(cap * (es + 8), f"popcount of {n} elements on {dpus} DPUs")
    # buffers: a block of X and its int64 counts (8 / sizeof(T) times as large)
    blk = _fit_block(block, tasklets, 1 + 8 / es, cap=cap * es)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", shape, "int64")],
           dict(n=n, cap=cap, y_off=cap * es, instr=16))
    return _write(outdir, "popcount", k, {})


# ----------------------------------------------------------------------------------------------
# simsearch


def _emit_simsearch(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if dtype != "float32" or len(shapes) != 2 or len(shapes[0]) != 2 or len(shapes[1]) != 2 \
            or shapes[0][1] != shapes[1][1]:
        raise ValueError(f"simsearch: float32 Q[Nq, d] and D[Nd, d], got {dtype} {shapes}")
    metric = params.get("metric", "dot")
    if metric not in ("dot", "cos"):
        raise ValueError(f"simsearch: metric must be dot or cos, got {metric!r}")
    (NQ, DIM), (ND, _) = shapes
    kk = int(params["k"])
    if not 1 <= kk <= min(ND, 256):
        raise ValueError(f"simsearch: k={kk} must be in 1..min({ND}, 256)")
    es = 4
    per = 2
    DIM_pad = _round_up(DIM, per)
    KP = _round_up(kk, per)
    ND_cap = max(1, _ceil(ND, dpus))
    used = _ceil(ND, ND_cap)
    q_off = ND_cap * DIM_pad * es
    v_off = q_off + NQ * DIM_pad * es
    i_off = v_off + NQ * KP * es
    _check_mram(i_off + NQ * KP * 8, f"simsearch {shapes} on {dpus} DPUs")
    tasklets = _max_tasklets(tasklets, KP * (es + 8) + 2 * 8)
    blk = _fit_block(block, tasklets, 2, fixed=tasklets * KP * (es + 8), cap=DIM_pad * es)
    ins = _inputs(["Q", "D"], shapes, [dtype] * 2, consts, outdir)
    # per multiply-accumulate: 2 WRAM loads, mul, add (mapping's matrix-product model)
    mac = 2 + elem_instr("mul", dtype) + elem_instr("add", dtype)
    k = _K(kind, dtype, used, tasklets, blk, ins,
           [_Tensor("values", (NQ, kk), dtype), _Tensor("indices", (NQ, kk), "int64")],
           dict(NQ=NQ, ND=ND, DIM=DIM, DIM_pad=DIM_pad, ND_cap=ND_cap, k=kk, KP=KP, q_off=q_off,
                v_off=v_off, i_off=i_off, metric=metric, instr=mac))
    return _write(outdir, "simsearch", k, {"k": kk, "metric": metric, "dpus_requested": dpus})


# ----------------------------------------------------------------------------------------------
# softmax / layernorm (row-wise: whole rows per tasklet)


def _emit_softmax(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)


def _emit_layernorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)


def _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if dtype != "float32":
        raise ValueError(f"{kind}: float32 only, got {dtype}")
    shape = shapes[0]
    if not shape or math.prod(shape) == 0:
        raise ValueError(f"{kind}: needs a non-empty X of rank >= 1, got {list(shape)}")
    ln = kind == "layernorm"
    axis = int(params.get("axis", -1)) % len(shape) if ln else len(shape) - 1
    R, L = _mapping.rownorm_rows(shape, axis)
    if ln:
        if len(shapes) not in (2, 3) or any(math.prod(s) != L for s in shapes[1:]):
            raise ValueError(f"layernorm: Scale (and B) of {L} elements, got {shapes[1:]}")
    elif len(shapes) != 1:
        raise ValueError(f"softmax: one input, got {len(shapes)}")
    es = 4
    row_bytes = _round_up(L * es, 8)
    row_cap, used = _mapping.rownorm_split(R, dpus)
    nparams = len(shapes) - 1
    y_off = row_cap * row_bytes
    s_off = 2 * y_off
    _check_mram(s_off + nparams * row_bytes, f"{kind} {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1 + nparams, cap=row_bytes)
    (i1, i2, i3), i_row = _mapping.rownorm_instr(kind, dtype, nparams > 1)
    names = ["X", "Scale", "B"][:len(shapes)]
    ins = _inputs(names, shapes, [dtype] * len(shapes), consts, outdir)
    eps = float(np.float32(params.get("epsilon", 1e-5)))
    k = _K(kind, dtype, used, tasklets, blk, ins, [_Tensor("Y", shape, dtype)],
           dict(R=R, L=L, row_bytes=row_bytes, row_cap=row_cap, y_off=y_off, s_off=s_off,
                nparams=nparams, one=row_bytes <= blk, i1=i1, i2=i2, i3=i3, i_row=i_row,
                eps=_c_float(eps), inv_l=_c_float(1.0 / L),
                math=frozenset({"emu_expf"}) if kind == "softmax" else frozenset({"emu_sqrt"})))
    return _write(outdir, "rownorm", k, {"axis": axis, "dpus_requested": dpus,
                                         **({"epsilon": eps} if ln else {})})
