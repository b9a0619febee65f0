"""What the UPMEM kernel emitters share: C types, the template context, WRAM blocks, literals, the
kernel files, input sidecars, checks and row layouts (see
:mod:`onnx_cinm.devices.upmem.codegen`)."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import contextvars

import numpy as np

from ....graph import dtype_name
from ...base import json_text, render, template, write_kernel_file
from .. import cost as _cost
from .. import mapping as _mapping


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



@functools.lru_cache(maxsize=256)
def math_helpers_for(expr: str) -> frozenset:
    """The math helpers (:data:`MATH_HELPER_DEPS`) the C expression ``expr`` calls, with their
    dependencies; empty for an expression that calls none. Memoized by the expression (a
    function of the string alone): every elementwise op placement asks about searches the
    same few expressions."""
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



#: A callable given the ``kernel.json`` dict of the kernel being emitted before it is written
#: (set by :func:`emit_op`: the graph's tensor and node names), or None
_ANNOTATE: contextvars.ContextVar = contextvars.ContextVar("upmem_annotate", default=None)



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



def broadcast_shape(*shapes) -> tuple:
    """``np.broadcast_shapes(*shapes)`` of tuples of ints, worked out in Python (the emitters'
    dry runs ask for every op placement prices); numpy's own ValueError when they do not
    broadcast (or a dim is negative): the shapes are handed to numpy then."""
    if not shapes:
        return ()
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        off = n - len(s)
        for i, d in enumerate(s):
            o = out[off + i]
            if d == o:
                continue
            if d < 0 or o != 1 and d != 1:
                return tuple(np.broadcast_shapes(*shapes))  # raises numpy's error
            if o == 1:
                out[off + i] = d
    return tuple(out)



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



#: Rendered template texts by ``(template, context key)`` (:func:`_context_key`): a model's
#: kernels of one kind share most of their files (DenseNet121's 31 ReLU kernels: 2 distinct
#: Makefiles, 10 dpu.c, 13 host.c), and a template is a function of its context alone
_RENDERED: dict = {}


def _plain(v) -> bool:
    """Whether ``repr(v)`` spells all of ``v``: numbers, strings, None, numpy scalars, and
    lists, tuples, sets and str-keyed dicts of them (not an array: its repr elides)."""
    kind = type(v)
    if kind in _ATOMS:
        return True
    if kind in _SEQUENCES:
        return all(map(_plain, v))
    if kind is dict:
        return all(type(x) is str and _plain(y) for x, y in v.items())
    return isinstance(v, np.generic) and not isinstance(v, np.void)


_ATOMS = frozenset({str, int, float, bool, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})


def _context_key(k: _K) -> str | None:
    """A string that determines everything a template reads of the kernel context ``k``: its
    attributes and its tensors' (all of them, dynamically set ones too), the target DPU
    generation and the cost constants its properties read; None when a value is not plain
    (:func:`_plain`): that kernel is rendered, not looked up."""
    fields = {n: ([vars(t) for t in v] if n in ("inputs", "outputs") else v)
              for n, v in vars(k).items()}
    if not all(type(t) is _Tensor for n in ("inputs", "outputs") for t in vars(k)[n]):
        return None
    target = _target_key(_TARGET.get())
    if target is None:
        return None
    context = (fields, type(k).__name__, _cost.LOOP_CONTROL, _mapping.BLOCK_INSTR)
    return repr(context) + target if _plain(context[:1]) else None


def _target_key(target: _cost.UpmemParams) -> str | None:
    """``repr`` of the target's fields (None when one is not :func:`_plain`), worked out once
    per target (a frozen dataclass: 40 fields, the same for every kernel of a model)."""
    known = _TARGET_KEYS.get(id(target))
    if known is None or known[0] is not target:
        fields = vars(target)
        if len(_TARGET_KEYS) >= 64:  # targets made from options: one per optimize call
            _TARGET_KEYS.clear()
        known = _TARGET_KEYS[id(target)] = (target, repr(fields) if _plain(fields) else None)
    return known[1]


#: :func:`_target_key` by id of the target: ``(target, key)`` (the target kept alive, so its
#: id is not reused)
_TARGET_KEYS: dict = {}


def _render(name: str, k: _K, key: str | None) -> str:
    """The template ``name`` rendered with ``k`` (once per distinct :func:`_context_key`)."""
    if key is None:
        return render(template(name), k=k)
    text = _RENDERED.get((name, key))
    if text is None:
        text = render(template(name), k=k)
        if len(_RENDERED) >= 512:
            _RENDERED.clear()
        _RENDERED[name, key] = text
    return text


def _write(outdir: Path, family: str, k: _K, manifest: dict) -> list[Path]:
    if _DRY.get():
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    key = _context_key(k)
    for tmpl, name in (("host.c.j2", "host.c"), ("dpu.c.j2", "dpu.c"), ("Makefile.j2", "Makefile")):
        text = _render(f"upmem/{family}/{tmpl}", k, key)
        paths.append(write_kernel_file(outdir / name, text))
    man = {"format": "onnx-cinm-upmem-kernel/1", "kind": k.kind, "family": family,
           "dtype": k.dtype, "dpus": k.dpus, "tasklets": k.tasklets, "block_bytes": k.block,
           "unroll": k.unroll,
           "argv": "host DPU_BINARY " + " ".join(t.name.upper() for t in k.inputs + k.outputs),
           "inputs": [t.to_json() for t in k.inputs],
           "outputs": [t.to_json() for t in k.outputs], **manifest}
    annotate = _ANNOTATE.get()
    if annotate is not None:
        annotate(man)
    paths.append(write_kernel_file(outdir / "kernel.json", json_text(man)))
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
                write_kernel_file(outdir / t.const, arr.reshape(-1).view(np.uint8))
        ts.append(t)
    return ts



def _check_dtype(dtype: str, kind: str = "") -> str:
    dtype = dtype_name(dtype)
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



def _check_mram(per_dpu_bytes: int, what: str) -> None:
    mram = _TARGET.get().mram_bytes
    if per_dpu_bytes > mram:
        raise ValueError(f"{what}: {per_dpu_bytes} bytes per DPU exceed the {mram} B of MRAM; "
                         "use more DPUs")



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



def _max_tasklets(tasklets: int, per_tasklet: int, fixed: int = 0) -> int:
    """The most tasklets (<= ``tasklets``) whose ``per_tasklet`` WRAM bytes plus stacks fit."""
    t, wram = tasklets, _TARGET.get().wram_bytes
    while t > 1 and t * (per_tasklet + STACK_BYTES) + fixed + WRAM_MARGIN > wram:
        t -= 1
    if t * (per_tasklet + STACK_BYTES) + fixed + WRAM_MARGIN > wram:
        raise ValueError(f"does not fit in {wram} B of WRAM even with one tasklet")
    return t



def _inverse_gather(shape, perm):
    """(X's shape, strides reading an array laid out as X permuted by ``perm``) - the gather
    that undoes :func:`_perm_gather`."""
    pshape = tuple(shape[p] for p in perm)
    sp = _c_strides(pshape)
    return tuple(shape), tuple(sp[perm.index(a)] for a in range(len(shape)))

