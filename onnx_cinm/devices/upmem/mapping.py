"""The cnm mapping of one cinm op onto UPMEM: workgroup, data distribution, WRAM blocks, merge.

The rules that hold for any near-memory chip (unit counts, padded shares, the scratchpad block,
scatter/broadcast, the product grid, the memory layout, the merge rule) are the cnm paradigm's,
:mod:`onnx_cinm.paradigms.cnm`, applied here to a DPU (:func:`upmem_array`); this module keeps
what is UPMEM's: the kernel families of the generated code, their geometry and the cost model
of each.

:func:`plan_op` turns an :class:`~onnx_cinm.devices.base.OpInfo` into a frozen :class:`CnmPlan`:

* **workgroup** ``ranks x DPUs x tasklets``: tasklets default to 16 (>= 11 fills the pipeline,
  PrIM §3); the DPU count is the one (among powers of two up to the limit, and the limit
  itself) that minimizes the modeled end-to-end time, so small inputs do not pay 2048 DPUs of
  transfer and launch overhead;
* **inputs**: each is ``scatter`` (equal, padded share per DPU: elements, or whole rows for
  row-wise reductions; for matrix products A by row blocks and B by column blocks of a
  ``row blocks x column blocks`` DPU grid, attribute ``cnm_grid``) or ``broadcast`` (the whole
  tensor to every DPU). Constant inputs (weights) stay resident in MRAM across inferences;
  their transfer is a one-time ``load_s``;
* **MRAM layout**: inputs then outputs back to back from ``DPU_MRAM_HEAP_POINTER``, every
  region padded to a multiple of 8 bytes and the same length on every DPU (``dpu_push_xfer``
  moves one length to all DPUs);
* **WRAM block** per tasklet: the largest multiple of 8 <= 2048 bytes such that
  ``tasklets * (stack + buffers * block + private) + shared + reserved <= 64 KB``
  (:func:`wram_block`), but never more than one tasklet's share of the DPU's data (rounded up
  to 8 bytes), so that small inputs still spread over all tasklets;
* **merge** of partial results: ``tree`` (tasklet tree in WRAM, then the host combines one
  partial per DPU), ``host`` (every tasklet's partial goes to the host: PrIM's default),
  ``mutex`` (one shared WRAM histogram guarded by a mutex: PrIM HST-L), ``prefix`` (per-tasklet
  counts/sums combined once; variable-length outputs compacted on the host), ``handshake``
  (PrIM SEL/SCAN: a tasklet-to-tasklet handshake chain every block), or ``none``.

The generated kernels (``codegen`` + ``templates/upmem``) implement these counts: their
``EMU_COUNT`` hints use the same :func:`~onnx_cinm.devices.upmem.cost.op_instructions` and loop
structure, and the emulator costs phases and barriers like :func:`kernel_cycles`, so the
emulator-counted cycles of a generated kernel can be compared with this model
(``benchmarks/upmem_prim.py``). Every launch starts with one barrier (tasklet 0's
``mem_reset``).

Two schedules share the code: ``"cinm"`` (ours: the largest block, inner loops unrolled by
:data:`UNROLL`, contiguous chunks per tasklet where order matters, private histograms, tree
merges) and ``"prim"`` (PrIM's defaults: 16 tasklets, 1 KB blocks, no unrolling, block-cyclic
loops with handshakes, shared mutex histogram, every tasklet's partial merged on the host).
Both are costed by :mod:`onnx_cinm.devices.upmem.cost`; the difference between them is
schedule, never constants.

Instruction counts per element (``ld``/``st`` are WRAM loads/stores, 1 instruction each; ``op``
from :func:`~onnx_cinm.devices.upmem.cost.op_instructions`; ``loop`` = 3 loop-control
instructions / unroll):

===============  ==========================================================================
kind             instructions per element (per MAC for matrix products)
===============  ==========================================================================
elementwise      ld x inputs + op + st + loop (+2 per broadcast operand held in WRAM)
gemv / gemm      ld a + ld b + mul + add + loop; +3 per output (init, store); R x NT blocking
reduce           ld + op + loop
scan             pass 1: ld + add + loop; pass 2: ld + add + st + loop
histogram        ld + bin index and range check (:func:`hist_bin_instr`) + address (1)
                 + ld + add + st + loop
select           ours: ld (+ ld mask) + test + st + index add + (loop + 1) / unroll, branch-free;
                 PrIM: ld + test + branch + p * (st + count) + loop, p = kept fraction
topk             ld + cmp + loop (insertions into the k-list are rare and ignored)
transpose        ld + st + 2 address + loop
rownorm          three passes per row (:func:`rownorm_instr`); rows split over ``lanes``
                 tasklets add per round two combines by the group's first tasklet
                 (:func:`rownorm_combine_instr`) and 4 barriers (:func:`rownorm_lanes`)
===============  ==========================================================================
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ...errors import CinmError
from ...graph import dtype_name
from ...paradigms.cnm import NearMemoryArray
from ...paradigms.cnm import distribution as D
from ...paradigms.cnm import merge as Mg
from ...paradigms.cnm import workgroup as W
from ...paradigms.cnm.workgroup import cdiv as _cdiv
from ..base import Cost, OpInfo
from . import cost as C
from .cost import DEFAULT_PARAMS, CostBreakdown, KernelWork, UpmemParams

#: Inner-loop unrolling of our generated kernels: loop control (3 instructions) once per 8
#: elements. PrIM's loops are not unrolled (its measured loops, PrIM §3).
UNROLL = 8
#: WRAM stack per tasklet, bytes (the generated Makefile's ``STACK_SIZE_DEFAULT``; the SDK
#: requires a multiple of 8).
STACK_BYTES = 1024
#: WRAM kept for globals (``__host`` arguments, per-tasklet partial slots, barrier, runtime),
#: bytes (estimate for our generated kernels).
WRAM_RESERVED = 2048
#: Instructions per DMA block outside the element loop (address, length, bounds, call).
BLOCK_INSTR = 12
#: Instructions of one barrier_wait per tasklet; barriers serialize on an atomic bit, so a
#: barrier of T tasklets costs T * BARRIER_INSTR * 11 cycles (estimate).
BARRIER_INSTR = 6
#: Instructions of one handshake step (wait_for, add own count, notify) in PrIM's chains
#: (estimate from the SDK's handshake API: a call, an add, a call).
HANDSHAKE_INSTR = 4
#: Instructions inside a mutex-guarded histogram update (PrIM HST-L's ``mutex_lock; histo[d]
#: += 1; mutex_unlock``): acquire, branch, address (2), ld, add, st, release.
MUTEX_CS_INSTR = 8
#: Fraction of elements a selection keeps when not known (PrIM SEL's predicate keeps half).
SELECT_KEEP = 0.5
#: Default and maximum DPUs of a workgroup; default tasklets (the default generation's).
DEFAULT_DPUS = DEFAULT_PARAMS.dpus
DEFAULT_TASKLETS = DEFAULT_PARAMS.tasklets

_KINDS = {
    **{op: "elementwise" for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "Abs", "Neg",
                                     "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "LeakyRelu",
                                     "HardSigmoid", "Clip", "PopCount", "Gelu")},
    "Softmax": "rownorm", "LayerNorm": "rownorm",
    "Gemv": "gemv", "Gemm": "gemm", "Reduce": "reduce", "MergePartial": "merge_partial",
    "Scan": "scan", "Histogram": "histogram", "TopK": "topk", "Transpose": "transpose",
    "Im2Col": "im2col", "SimSearch": "simsearch", "Select": "select", "Compress": "select",
}
_OP_NAME = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min",
            "Relu": "relu", "Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
            "Sigmoid": "sigmoid", "Tanh": "tanh", "LeakyRelu": "leakyrelu",
            "HardSigmoid": "hardsigmoid", "Clip": "clip", "PopCount": "popcount", "Gelu": "gelu"}


def _r8(n: int) -> int:
    """``n`` (truncated to an int) rounded up to a multiple of 8: ``W.align_up(n, 8)``, inline
    (the cost model asks thousands of times per network)."""
    return -(-(n if type(n) is int else int(n)) // 8) * 8


def upmem_array(params: UpmemParams = DEFAULT_PARAMS,
                dpus: int = DEFAULT_DPUS) -> NearMemoryArray:
    """The cnm paradigm's view of ``dpus`` DPUs of ``params``: DPUs as units, ranks as groups,
    MRAM as memory, WRAM as scratchpad, tasklets as threads, one lane, DMA words and blocks
    (every figure from :class:`~onnx_cinm.devices.upmem.cost.UpmemParams`)."""
    return NearMemoryArray(units=dpus, units_per_group=params.dpus_per_rank,
                           memory_bytes=params.mram_bytes, scratch_bytes=params.wram_bytes,
                           threads=params.max_tasklets, lanes=1, align_bytes=params.dma_min,
                           block_max_bytes=params.dma_max)


_ARRAY = upmem_array()


def wram_block(tasklets: int, buffers: int, private_bytes: int = 0, shared_bytes: int = 0,
               stack_bytes: int = STACK_BYTES, reserved: int = WRAM_RESERVED,
               wram_bytes: int = DEFAULT_PARAMS.wram_bytes,
               dma_max: int = DEFAULT_PARAMS.dma_max) -> int:
    """The WRAM block per tasklet, bytes: the largest multiple of 8 that is <= ``dma_max``
    (the DMA limit, :attr:`UpmemParams.dma_max`) with ``tasklets * (stack + buffers * block +
    private) + shared + reserved <= wram_bytes``. Returns 0 if not even 8 bytes fit. The cnm
    paradigm's :func:`~onnx_cinm.paradigms.cnm.workgroup.scratch_block` on a DPU's WRAM.

    Example: 16 tasklets, 2 buffers, 1024-B stacks, 2048 B reserved:
    ``(65536 - 2048 - 16 * 1024) / (16 * 2) = 1472``.
    """
    arr = _ARRAY
    if (wram_bytes, dma_max) != (arr.scratch_bytes, arr.block_max_bytes):
        arr = replace(arr, scratch_bytes=wram_bytes, block_max_bytes=dma_max)
    return W.scratch_block(arr, tasklets, buffers, private_bytes, shared_bytes, stack_bytes,
                           reserved)


@dataclass(frozen=True)
class CnmPlan:
    """How one cinm op runs on UPMEM (frozen: plans are data).

    Attributes:
        op_type: cinm op type; ``kind``: the kernel family (``elementwise``, ``gemv``, ...).
        dtype: element dtype name of the data streamed (the first input).
        dpus, tasklets: the workgroup (ranks = ceil(dpus / 64)).
        block_bytes: MRAM<->WRAM DMA block per tasklet, bytes (multiple of 8, <= 2048).
        mram_bytes: MRAM used per DPU (all regions, each padded to 8 B), bytes.
        inputs: ``"name:scatter"`` / ``"name:broadcast"`` per input, in input order.
        merge: ``none | tree | host | mutex | prefix | handshake``.
        schedule: ``"cinm"`` (ours) or ``"prim"`` (PrIM defaults, for comparison).
        unroll: inner-loop unrolling.
        geom: sizes of the problem as ``((key, value), ...)``: ``n`` elements, ``rows``/``cols``
            of matrix products, ``outputs``/``length`` of reductions, ``bins`` ... (see
            :func:`plan_op`).
        params: cost-model constants; ``stack_bytes``: WRAM stack per tasklet, bytes.
        search: what the mapping search tried and what won (:mod:`.search`), or ``""`` for the
            default rule's plan.
    """

    op_type: str
    kind: str
    dtype: str
    dpus: int
    tasklets: int
    block_bytes: int
    mram_bytes: int
    inputs: tuple
    merge: str
    schedule: str = "cinm"
    unroll: int = UNROLL
    geom: tuple = ()
    params: UpmemParams = field(default=DEFAULT_PARAMS, repr=False, compare=False)
    stack_bytes: int = STACK_BYTES
    search: str = field(default="", compare=False)

    @property
    def g(self) -> dict:
        """:attr:`geom` as a dict, built once per plan (the cost model, the device and the
        lowering read it many times); read-only, like the plan."""
        hit = self.__dict__.get("_g")
        if hit is None:
            hit = dict(self.geom)
            object.__setattr__(self, "_g", hit)
        return hit

    @property
    def ranks(self) -> int:
        return self.params.ranks(self.dpus)

    def cost(self) -> CostBreakdown:
        """Modeled cost of one inference (see :mod:`onnx_cinm.devices.upmem.cost`), computed
        once per plan (the search costs a plan, then the device's cost, price and lowering ask
        again; the breakdown is immutable)."""
        hit = self.__dict__.get("_cost")
        if hit is None:
            hit = _COSTERS[self.kind](self)
            object.__setattr__(self, "_cost", hit)
        return hit

    def mram_layout(self) -> list:
        """MRAM regions of one DPU: ``[(name, offset, bytes)]`` (see :func:`mram_layout`)."""
        return mram_layout(self)

    def roofline(self) -> dict:
        """Lower bounds of the kernel on one DPU, seconds: ``dma_s`` (the bytes the op must move
        between MRAM and WRAM at the peak 2 B/cycle, no per-transfer alpha), ``compute_s`` (only
        the arithmetic instructions, at 1 instruction/cycle) and ``bound_s`` (the larger)."""
        return _roofline(self)

    def to_cost(self) -> Cost:
        """The device-protocol :class:`~onnx_cinm.devices.base.Cost` of this plan."""
        b = self.cost()
        return Cost(latency_s=b.latency_s, energy_j=b.energy_j, writes=0,
                    bytes_moved=b.bytes_in + b.bytes_out)

    def attrs(self) -> dict:
        """Node attributes named as in ``onnx_cinm.dialects.cinm.PLAN_ATTRS``:

        ``cnm_dpus`` (DPUs; ranks = ceil(dpus / 64)), ``cnm_tasklets``, ``cnm_block_bytes``
        (MRAM<->WRAM DMA block per tasklet, bytes), ``cnm_mram_bytes`` (MRAM per DPU, bytes),
        ``cnm_inputs`` (``"<input name>:scatter"`` or ``":broadcast"``, in input order),
        ``cnm_merge`` (see the module docstring), ``cnm_latency_s`` (modeled seconds per
        inference, end to end), ``cnm_energy_j`` (estimated joules per inference),
        ``cnm_load_s`` / ``cnm_load_j`` (the one-time load before the first inference: the DPU
        program and the resident constants; seconds, estimated joules) and, for matrix
        products only, ``cnm_grid`` (``[row blocks, column blocks]`` of the DPUs), and
        ``cnm_search`` when a mapping search chose the plan (what it tried, what won).
        """
        b = self.cost()
        pa = self.paradigm_attrs()
        grid = pa.pop("cnm_grid", None)
        return {**pa, "cnm_latency_s": float(b.latency_s), "cnm_energy_j": float(b.energy_j),
                "cnm_load_s": float(b.load_s), "cnm_load_j": float(b.load_j),
                **({"cnm_search": self.search} if self.search else {}),
                **({"cnm_grid": grid} if grid is not None else {})}

    def paradigm_attrs(self) -> dict:
        """The cnm paradigm's part of :meth:`attrs` (the ``paradigm`` level of ``--stop-after``):
        workgroup (``cnm_dpus``, ``cnm_tasklets``, ``cnm_grid``; ``cnm_lanes``: tasklets per
        row of a row-wise kernel, :func:`rownorm_lanes`), scratchpad block
        (``cnm_block_bytes``), memory per unit (``cnm_mram_bytes``), distribution
        (``cnm_inputs``) and merge (``cnm_merge``); no cost."""
        return {"cnm_dpus": int(self.dpus), "cnm_tasklets": int(self.tasklets),
                "cnm_block_bytes": int(self.block_bytes), "cnm_mram_bytes": int(self.mram_bytes),
                "cnm_inputs": [s for s in self.inputs], "cnm_merge": self.merge,
                **({"cnm_grid": [int(x) for x in self.g["grid"]]} if "grid" in self.g else {}),
                **({"cnm_lanes": int(self.g["lanes"])} if "lanes" in self.g else {})}


# ---------------------------------------------------------------------------------------------
# Shared pieces of the per-kind models
# ---------------------------------------------------------------------------------------------

def _esize(dtype: str) -> int:
    """Bytes of one element of the dtype named ``dtype`` (``bool``: 1); remembered per name
    (the cost model and the geometry ask thousands of times)."""
    hit = _ESIZES.get(dtype)
    if hit is None:
        hit = _ESIZES[dtype] = 1 if dtype == "bool" else np.dtype(dtype).itemsize
    return hit


#: :func:`_esize` by dtype name (a handful of names).
_ESIZES: dict = {}


def _loop(p: CnmPlan) -> float:
    return C.LOOP_CONTROL / p.unroll


def _barrier(p: CnmPlan) -> float:
    """Cycles of one barrier of all tasklets (serialized atomic updates)."""
    return p.tasklets * BARRIER_INSTR * p.params.issue_interval if p.tasklets > 1 else 0.0


def _loop_tail(p: CnmPlan, elems: int, per_block: int) -> float:
    """Loop-control instructions the unrolled per-block loops spend beyond ``_loop(p)`` per
    element: ``elems`` elements in blocks of ``per_block`` (the last one shorter) each run
    ``e // U`` unrolled iterations and ``e % U`` single ones (``_common.j2``'s ``unrolled``),
    so every tail element pays ``LOOP_CONTROL * (1 - 1 / U)`` more than the amortized count."""
    u = p.unroll
    if u <= 1 or elems <= 0 or per_block <= 0:
        return 0.0
    full, rest = divmod(elems, per_block)
    tails = full * (per_block % u) + rest % u
    return tails * C.LOOP_CONTROL * (1 - 1 / u)


def _stream_work(p: CnmPlan, n: int, esize: int, instr_per_elem: float, reads: int,
                 writes: float, bufs_read: int | None = None, block_loops: bool = False) -> KernelWork:
    """Work of streaming ``n`` elements of one DPU through WRAM in blocks of ``block_bytes``:
    ``reads`` input streams and ``writes`` output streams (fractional for selections) of
    ``esize``-byte elements; ``instr_per_elem`` instructions per element. ``block_loops``: the
    kernel runs one unrolled loop per block, whose tail elements pay full loop control
    (:func:`_loop_tail`)."""
    pr, t, blk = p.params, p.tasklets, p.block_bytes
    nbytes = _r8(n * esize)
    blocks, per_t_blocks = W.blocks(nbytes, blk, t)
    per_t_elems = min(n, per_t_blocks * blk // esize)
    rd = reads * pr.stream_dma_cycles(nbytes, blk)
    wr = pr.stream_dma_cycles(int(_r8(nbytes * writes)), blk, write=True) if writes else 0.0
    rd_t = reads * per_t_blocks * pr.dma_cycles(blk)
    wr_t = per_t_blocks * pr.dma_cycles(int(_r8(blk * writes)), write=True) if writes else 0.0
    instr_t = per_t_elems * instr_per_elem + per_t_blocks * BLOCK_INSTR
    instr_all = n * instr_per_elem + blocks * BLOCK_INSTR
    if block_loops:
        instr_t += _loop_tail(p, per_t_elems, blk // esize)
        instr_all += _loop_tail(p, n, blk // esize)
    return _work(t, instr_t, instr_all, rd + wr, rd_t + wr_t)


def _work(tasklets: int, instr_t: float, instr_all: float, dma: float, dma_t: float) -> KernelWork:
    """``KernelWork(tasklets, instr_t, instr_all, dma, dma_t)`` (no serial phase), its fields set
    directly: what its generated __init__ sets, without one frozen assignment per field."""
    w = object.__new__(KernelWork)
    w.__dict__.update(tasklets=tasklets, instr_per_tasklet=instr_t, instr_total=instr_all,
                      dma_cycles=dma, dma_cycles_per_tasklet=dma_t, serial_cycles=0.0,
                      serial_dma_cycles=0.0)
    return w


def _finish(p: CnmPlan, works: list, serial: float, bytes_in_dpu: int, bcast_bytes: int,
            bytes_out_dpu: int, merge_host_bytes: int = 0, partial_out_dpu: int = 0,
            assemble_bytes: int = 0, resident: tuple = (0, 0),
            notes: tuple = ()) -> CostBreakdown:
    """Assemble a :class:`CostBreakdown` from per-launch kernel works and transfer sizes.

    Args:
        works: one :class:`KernelWork` per launch (per DPU; all DPUs run the same share).
        serial: in-DPU serial cycles (merge trees, barriers, handshakes), added to the kernel.
        bytes_in_dpu: bytes scattered to each DPU; bcast_bytes: bytes broadcast to every DPU.
        bytes_out_dpu: result bytes gathered from each DPU.
        merge_host_bytes: bytes of partials the host reads to merge them.
        partial_out_dpu: partial-result bytes gathered from each DPU.
        assemble_bytes: result bytes the host copies to assemble variable-length outputs.
        resident: ``(scattered, broadcast)`` bytes per DPU of constant inputs (weights): loaded
            once (``load_s``), not per inference.

    ``load_s`` is the one-time cost: the resident constants plus ``dpu_load`` of the kernel's
    DPU program (``program_load_s``), both before the first inference.
    """
    pr, d = p.params, p.dpus
    # every generated kernel starts with tasklet 0's mem_reset() and a barrier of all tasklets
    # (as PrIM's kernels do): one barrier per launch
    serial += len(works) * _barrier(p)
    f = pr.frequency_hz
    if len(works) == 1 and type(works[0]) is KernelWork:
        # one plain launch (most kernels): C.kernel_cycles' figures without its dict, in the
        # same operations (a sum of one term is that term), so the same floats
        w = works[0]
        compute = float(w.instr_total)
        chain = pr.issue_interval * w.instr_per_tasklet + w.dma_cycles_per_tasklet
        dma = float(w.dma_cycles)
        parallel = max(compute, chain, dma)
        bound = "dma" if parallel == dma else ("compute" if parallel == compute
                                               else "tasklet-chain")
        total = parallel + (w.serial_cycles + w.serial_dma_cycles) + serial
        compute_s, dma_s = compute / f, dma / f
    else:
        cyc = [C.kernel_cycles(w, pr) for w in works]
        total = sum(c["total"] for c in cyc) + serial
        compute_s = sum(c["compute"] for c in cyc) / f
        dma_s = sum(c["dma"] for c in cyc) / f
        bound = max(cyc, key=lambda c: c["total"])["bound"] if cyc else "none"
    kernel_s = total / f
    host_in = pr.push_s(bytes_in_dpu, d) + pr.broadcast_s(bcast_bytes, d)
    host_out = pr.push_s(bytes_out_dpu, d, to_dpu=False) + assemble_bytes / pr.host_merge_bps
    partials = pr.push_s(partial_out_dpu, d, to_dpu=False)
    load = pr.push_s(resident[0], d) + pr.broadcast_s(resident[1], d) + pr.program_load_s
    merge_s = merge_host_bytes / pr.host_merge_bps
    launch = len(works) * pr.launch_overhead_s(d)
    bytes_in = (bytes_in_dpu + bcast_bytes) * d
    bytes_out = (bytes_out_dpu + partial_out_dpu) * d
    host_busy = merge_s + assemble_bytes / pr.host_merge_bps
    e = C.energy_j(kernel_s, d, bytes_in + bytes_out, host_busy,
                   host_in + host_out + partials + launch + merge_s, pr)
    # the load: resident bytes moved while the allocated DPUs wait (no kernel, no merge)
    load_j = C.energy_j(0.0, d, sum(resident) * d, 0.0, load, pr)
    # the breakdown's fields set directly: what its generated __init__ sets, one frozen
    # assignment per field, without that (the search costs hundreds of plans per network)
    out = object.__new__(CostBreakdown)
    out.__dict__.update(
        dpus=d, tasklets=p.tasklets, kernel_cycles=total, compute_s=compute_s, dma_s=dma_s,
        kernel_s=kernel_s, dpu_merge_s=serial / f, host_in_s=host_in, host_out_s=host_out,
        partials_out_s=partials, merge_s=merge_s, launch_s=launch, load_s=load,
        resident_bytes=int(sum(resident) * d), bytes_in=int(bytes_in), bytes_out=int(bytes_out),
        mram_bytes_per_dpu=p.mram_bytes, launches=len(works), bound=bound, energy_j=e,
        load_j=load_j, notes=notes)
    return out


# ---------------------------------------------------------------------------------------------
# Per-kind models
# ---------------------------------------------------------------------------------------------

def _cost_elementwise(p: CnmPlan) -> CostBreakdown:
    g, es = p.g, _esize(p.dtype)
    n = g["n_dpu"]
    op = op_instr = C.op_instructions(g["op"], p.dtype)
    del op
    instr = g["streams"] + op_instr + 1 + 2 * g["wram_bcast"] + _loop(p)
    w = _stream_work(p, n, es, instr, reads=g["streams"], writes=1, block_loops=True)
    out_es = g.get("out_esize", es)
    return _finish(p, [w], 0.0, g["streams"] * _r8(n * es), g["bcast_bytes"], _r8(n * out_es), 0)


def _matvec_instr(dtype: str, unroll: int) -> float:
    """Instructions per multiply-accumulate of ``dtype`` in a loop unrolled ``unroll`` times:
    2 WRAM loads, the multiply, the add, loop control."""
    return 2 + C.op_instructions("mul", dtype) + C.op_instructions("add", dtype) + C.LOOP_CONTROL / unroll


def _matmul_tiles(kind: str, rows: int, n: int, es: int, tasklets: int, batched: bool,
                  schedule: str = "cinm") -> tuple[int, int, int, int]:
    """``(n_pad, R, NT, tiles)`` of a matrix product's ``rows x n`` outputs on one DPU
    (:func:`_cost_matmul`): the columns padded to 8 bytes (a Gemv has one output per row; a
    Gemm pads every output row, even one column), rows per group, columns per tile (narrower
    when there are fewer (group, tile) pairs than tasklets, down to 8 bytes) and tiles."""
    per = 8 // math.gcd(8, es)
    n_pad = _cdiv(n, per) * per if n > 1 or kind == "gemm" else 1
    if schedule == "prim":
        r_grp, nt = 1, 1
    else:
        r_grp = 1 if batched else max(1, min(4, rows))
        nt = min(n_pad, _cdiv(64, per) * per)
        groups = _cdiv(rows, r_grp) if rows else 1
        if rows < tasklets and groups * _cdiv(n_pad, nt) < tasklets:  # every tasklet works
            nt = max(per, _cdiv(_cdiv(n_pad, _cdiv(tasklets, groups)), per) * per) if n_pad > 1 else 1
    return n_pad, r_grp, nt, _cdiv(n_pad, nt)


def _matmul_busiest(rows: int, tasklets: int, n_pad: int, r_grp: int, nt: int,
                    tiles: int) -> tuple[int, int, int, int]:
    """``(rows, row groups, tiles, columns)`` of the busiest tasklet of :func:`_cost_matmul`:
    with at least as many rows as tasklets, a balanced contiguous range of rows against every
    column; else its share of the (row group, column tile) pairs."""
    if rows >= tasklets:
        rows_t = _cdiv(rows, tasklets)
        return rows_t, _cdiv(rows_t, r_grp), tiles, n_pad
    groups = _cdiv(rows, r_grp) if rows else 0
    units_t = _cdiv(groups * tiles, tasklets) if groups else 0
    return min(rows, r_grp), 1, units_t, min(n_pad, units_t * nt)


def _cost_matmul(p: CnmPlan) -> CostBreakdown:
    """Gemv/Gemm/SimSearch on one DPU: ``rows_dpu`` rows of A times ``n_dpu`` columns of B
    (B stored transposed, one K-row per output column, rows padded to 8 bytes).

    Tasklets take balanced contiguous row ranges (``ceil(rows / T)`` rows each); within its
    range a tasklet works on groups of ``R`` rows (R = min(4, rows), 1 for a batched B) and
    tiles of ``NT`` = 64 output columns: for every K block it reads the R A-row blocks and the
    NT B-row blocks and accumulates R x NT outputs in WRAM, then writes them. With fewer rows
    than tasklets, the (row group, column tile) pairs are spread over the tasklets instead, with
    tiles narrowed (down to 8 bytes of columns) until there is one pair per tasklet.
    PrIM's GEMV is R = NT = 1 (every row re-reads the vector), not unrolled, 1 KB blocks.
    The DPUs form a grid of ``row blocks x column blocks`` (``grid``): A is scattered by row
    blocks (broadcast if there is one row block), B by column blocks (broadcast if one).
    One column block is the classic mapping; one row block suits a fully connected layer at
    batch 1 (a big B, few rows); both at once suit convolutions with few output pixels.
    """
    pr, g, es, t, blk = p.params, p.g, _esize(p.dtype), p.tasklets, p.block_bytes
    rows, n, k = g["rows_dpu"], g["n_dpu"], g["k"]
    per = 8 // math.gcd(8, es)
    kb = _cdiv(k, per) * per * es
    n_pad, r_grp, nt, tiles = _matmul_tiles(p.kind, rows, n, es, t, bool(g.get("b_batched")),
                                            p.schedule)
    kblocks = _cdiv(kb, blk)
    mac = _matvec_instr(p.dtype, p.unroll)

    def work(rows_x, groups_x, tiles_x, cols_x):
        """(instructions, DMA cycles) of ``rows_x`` rows in ``groups_x`` groups against
        ``cols_x`` columns in ``tiles_x`` tiles."""
        instr = (rows_x * cols_x * k * mac + groups_x * tiles_x * kblocks * BLOCK_INSTR
                 + 3 * rows_x * cols_x)
        dma = (groups_x * tiles_x * r_grp * pr.stream_dma_cycles(kb, blk)      # A blocks
               + groups_x * cols_x * pr.stream_dma_cycles(kb, blk)               # B rows
               + rows_x * tiles_x * pr.stream_dma_cycles(_r8(min(nt, cols_x) * es), blk, write=True))
        return instr, dma

    busiest = _matmul_busiest(rows, t, n_pad, r_grp, nt, tiles)
    if rows >= t:  # balanced contiguous row ranges
        rows_t = busiest[0]
        # the equal shares are costed once (the sums below add the same terms in the same order)
        full = work(*busiest)
        rest = rows % rows_t
        parts = [full] * (rows // rows_t) + ([work(rest, _cdiv(rest, r_grp), tiles, n_pad)]
                                             if rest else [])
        i_t, d_t = parts[0]
        i_all, d_all = sum(x for x, _ in parts), sum(y for _, y in parts)
    else:  # spread (row group, column tile) pairs over the tasklets
        groups = _cdiv(rows, r_grp) if rows else 0
        i_t, d_t = work(*busiest)
        i_all, d_all = work(rows, groups, tiles, n_pad)
    w = _work(t, i_t, i_all, d_all, d_t)
    a_b, b_b = g["a_bytes"], g["b_bytes"]
    c_b = g.get("c_bytes", 0)
    dr, dc = g["grid"]
    scat = (a_b if dr > 1 else 0) + (b_b if dc > 1 else 0) + c_b
    bcast = (b_b if dc == 1 else 0) + (a_b if dr == 1 else 0)
    res_s, res_b = g.get("resident_scatter", 0), g.get("resident_bcast", 0)
    return _finish(p, [w], 0.0, scat - res_s, bcast - res_b, _r8(rows * n * es),
                   resident=(res_s, res_b))


def _merge_partials(p: CnmPlan, width: int, es: int, op_instr: int, split: bool = True) -> tuple:
    """In-DPU serial cycles and per-DPU bytes the host gathers for merging ``width`` partial
    values per tasklet. ``tree`` (as the generated kernels do it): a barrier ends the parallel
    phase; then log2(T) levels, each ``width`` (ld, ld, op, st) per pair followed by a barrier;
    with ``split`` the pairs' work is spread over all tasklets (histogram: bins striped), else
    each pair's left tasklet does it (reduce); then tasklet 0 writes the result to MRAM.
    ``host``: a barrier, then each tasklet's partial goes to the host (PrIM's default)."""
    pr, t = p.params, p.tasklets
    if p.merge == "tree":
        cyc = _barrier(p)
        s = 1
        while s < t:
            work = Mg.tree_pairs(t, s) * width * (3 + op_instr)
            per_t = _cdiv(work, t) if split else width * (3 + op_instr)
            cyc += max(work, pr.issue_interval * per_t) + _barrier(p)
            s *= 2
        cyc += pr.dma_cycles(min(pr.dma_max, _r8(width * es)), write=True) * _cdiv(_r8(width * es), pr.dma_max)
        return cyc, _r8(width * es)
    # host: one barrier, then each tasklet writes its partial (the T writes serialize on the
    # DMA engine); the host reads all T partials
    cyc = _barrier(p) + t * pr.dma_cycles(_r8(width * es), write=True) * _cdiv(_r8(width * es), pr.dma_max)
    return cyc, t * _r8(width * es)


def _cost_reduce(p: CnmPlan) -> CostBreakdown:
    g, es = p.g, _esize(p.dtype)
    op_instr = C.op_instructions(g["op"], p.dtype)
    instr = 1 + op_instr + _loop(p)
    if g["mode"] == "rows":  # whole rows per DPU, rows split over tasklets: no merge
        n = g["rows_dpu"] * g["length"]
        w = _stream_work(p, n, es, instr, reads=1, writes=0)
        w = replace(w, instr_total=w.instr_total + g["rows_dpu"] * 4)
        return _finish(p, [w], 0.0, _r8(n * es), 0, _r8(g["rows_dpu"] * es), 0)
    n = g["n_dpu"]
    width = g["outputs"]
    w = _stream_work(p, n, es, instr, reads=1, writes=0)
    serial, out_dpu = _merge_partials(p, width, es, op_instr, split=False)
    host_bytes = out_dpu * p.dpus
    return _finish(p, [w], serial, _r8(n * es), 0, 0, host_bytes, partial_out_dpu=out_dpu)


def _cost_merge_partial(p: CnmPlan) -> CostBreakdown:
    g, es = p.g, _esize(p.dtype)
    s, n = g["parts"], g["n_dpu"]
    op_instr = C.op_instructions(g["op"], p.dtype)
    instr = s + (s - 1) * op_instr + 1 + _loop(p)
    w = _stream_work(p, n, es, instr, reads=s, writes=1)
    return _finish(p, [w], 0.0, s * _r8(n * es), 0, _r8(n * es), 0)


def _cost_scan(p: CnmPlan) -> CostBreakdown:
    """Ours (reduce-then-scan): launch 1 reduces each tasklet's contiguous chunk (the sums stay
    in WRAM, persistent across launches), the host scans the per-DPU totals and pushes one
    offset per DPU, launch 2 scans each chunk from its offset (read + write). PrIM's SCAN-SSA:
    launch 1 scans (read + write, a handshake chain every block), launch 2 adds the offsets
    (read + write)."""
    pr, g, es = p.params, p.g, _esize(p.dtype)
    add = C.op_instructions("add", p.dtype)
    if g["mode"] == "rows":
        n = g["rows_dpu"] * g["length"]
        w = _stream_work(p, n, es, 1 + add + 1 + _loop(p), reads=1, writes=1)
        return _finish(p, [w], 0.0, _r8(n * es), 0, _r8(n * es), 0)
    n, t = g["n_dpu"], p.tasklets
    if p.schedule == "prim":
        w1 = _stream_work(p, n, es, 1 + add + 1 + _loop(p), reads=1, writes=1)
        iters = _cdiv(_cdiv(_r8(n * es), p.block_bytes), t)
        serial = iters * (t * HANDSHAKE_INSTR * pr.issue_interval + _barrier(p))
        w2 = _stream_work(p, n, es, 1 + add + 1 + _loop(p), reads=1, writes=1)
    else:
        w1 = _stream_work(p, n, es, 1 + add + _loop(p), reads=1, writes=0)
        serial = 2 * _barrier(p) + t * (2 + add) * pr.issue_interval  # tasklet offsets by tasklet 0
        w2 = _stream_work(p, n, es, 1 + add + 1 + _loop(p), reads=1, writes=1)
    host_bytes = p.dpus * _r8(es)
    return _finish(p, [w1, w2], serial, _r8(n * es) + 8, 0, _r8(n * es), host_bytes,
                   partial_out_dpu=_r8(es))


def hist_pow2_shift(dtype: str, bins: int, lo: float, hi: float) -> int | None:
    """``s`` when the bins of an integer histogram are ``2**s`` wide and start at an integer
    ``lo`` with ``lo`` and ``hi`` inside the dtype's range: then ``bin = (x - lo) >> s`` and one
    unsigned compare ``(x - lo) <= hi - lo`` is the whole range check (the generated kernel
    does exactly that); else None (the kernel bins in double). ``lo``/``hi`` are rounded to
    float32 first (they are ONNX float attributes)."""
    dt = str(dtype)
    if not (dt.startswith("int") or dt.startswith("uint")) or bins < 1:
        return None
    lo, hi = float(np.float32(lo)), float(np.float32(hi))
    if not (lo.is_integer() and hi.is_integer()) or hi <= lo:
        return None
    info = np.iinfo(np.dtype(dt))
    if lo < info.min or hi > info.max:
        return None
    span = int(hi) - int(lo)
    width, rem = divmod(span, bins)
    if rem or width < 1 or width & (width - 1):
        return None
    return width.bit_length() - 1


def hist_bin_instr(dtype: str, pow2: bool) -> int:
    """Instructions to turn one element into a bin index and check its range (the generated
    histogram kernel's two code paths):

    * ``pow2`` (integer data, power-of-two bin width): subtract, shift (the bin), one unsigned
      compare-and-branch (the range): ``sub + shift + 1``;
    * otherwise the kernel converts to double and computes ``(v - lo) * bins / (hi - lo)``
      after two compares: a conversion (costed as a float64 add), 2 float64 compares, sub,
      mul, div in software double (PrIM's DOUBLE throughputs), + 1 for the integer cast.
    """
    if pow2:
        return C.op_instructions("sub", dtype) + C.op_instructions("shift", "int32") + 1
    return (C.op_instructions("add", "float64") + 2 * C.op_instructions("cmp", "float64")
            + C.op_instructions("sub", "float64") + C.op_instructions("mul", "float64")
            + C.op_instructions("div", "float64") + 1)


def _hist_bin_instr(p: CnmPlan) -> int:
    return hist_bin_instr(p.dtype, bool(p.g["pow2"]))


def _cost_histogram(p: CnmPlan) -> CostBreakdown:
    """``tree``: a private histogram per tasklet in WRAM, merged by a tasklet tree, one
    histogram per DPU summed on the host. ``mutex`` (PrIM HST-L): one shared histogram per DPU,
    every update a critical section of MUTEX_CS_INSTR instructions; critical sections of
    different tasklets serialize, each at one instruction per 11 cycles."""
    pr, g, es, t = p.params, p.g, _esize(p.dtype), p.tasklets
    n, bins = g["n_dpu"], g["bins"]
    binx = _hist_bin_instr(p)   # includes the range check
    # histogram slots: the bins (+ 1 overflow slot of the integer path for x == max), 8-B padded
    hb = _r8((bins + (1 if g["pow2"] else 0)) * 4) // 4
    if p.merge == "mutex":
        par = 1 + binx + _loop(p)
        w = _stream_work(p, n, es, par + MUTEX_CS_INSTR, reads=1, writes=0)
        serial_cs = n * MUTEX_CS_INSTR * pr.issue_interval
        # the pipeline can overlap the parallel part of other tasklets with the critical section
        w = replace(w, instr_total=max(w.instr_total, serial_cs))
        # zeroing the shared histogram striped over the tasklets (a loop, not unrolled), a
        # barrier, tasklet 0 writes it
        zero = max(hb, pr.issue_interval * _cdiv(hb, t)) * (1 + C.LOOP_CONTROL)
        serial = (zero + _barrier(p)
                  + pr.dma_cycles(min(pr.dma_max, hb * 4), write=True) * _cdiv(hb * 4, pr.dma_max))
        return _finish(p, [w], serial, _r8(n * es), 0, 0, p.dpus * bins * 4,
                       partial_out_dpu=_r8(hb * 4))
    # per element: ld, bin index + range check, address (1), ld + add + st of the count, loop
    instr = 1 + binx + 1 + 3 + _loop(p)
    w = _stream_work(p, n, es, instr, reads=1, writes=0)
    # the private histograms merged by a bin-striped tree
    serial, out_dpu = _merge_partials(p, hb, 4, C.op_instructions("add", "int32"))
    # each tasklet zeroes its own histogram before the start barrier: one store per bin
    serial += max(pr.issue_interval, t) * hb * (1 + _loop(p))
    return _finish(p, [w], serial, _r8(n * es), 0, 0, out_dpu * p.dpus, partial_out_dpu=out_dpu)


def _cost_select(p: CnmPlan) -> CostBreakdown:
    """Keep the elements satisfying a predicate, in order. Ours (the generated compress kernel):
    each tasklet streams a contiguous chunk and compacts it branch-free into a WRAM staging
    block (per element: ld x, ld mask, st into the staging slot, a nonzero test and an add to
    the staging index; every unrolled group one more compare: is the staging block full?),
    writing full blocks to its own MRAM region; its count goes to a ``__host`` array, and the
    host turns the T x DPUs counts into offsets while it compacts (no in-DPU merge).
    PrIM SEL: block-cyclic, after every block a handshake chain through all tasklets (to place
    the block's output) and a barrier; a branch per element, the store only when kept."""
    pr, g, es, t = p.params, p.g, _esize(p.dtype), p.tasklets
    n, keep = g["n_dpu"], g["keep"]
    mask = g.get("mask_esize", 0)                    # ONNX Compress: a mask input streams too
    # mask != 0 on the 1-byte mask, else the predicate on the element
    test = C.op_instructions("and", "bool" if mask else p.dtype)
    if p.schedule == "prim":
        instr = 1 + (1 if mask else 0) + test + 1 + keep * 2 + _loop(p)
    else:
        instr = 1 + (1 if mask else 0) + test + 1 + 1 + (C.LOOP_CONTROL + 1) / p.unroll
    w = _stream_work(p, n, es, instr, reads=1, writes=keep)
    if mask:
        mb = _r8(n * mask)
        m_blk = max(8, _r8(p.block_bytes * mask // es))
        per_t = _cdiv(_cdiv(mb, m_blk), t)
        w = replace(w, dma_cycles=w.dma_cycles + pr.stream_dma_cycles(mb, m_blk),
                    dma_cycles_per_tasklet=w.dma_cycles_per_tasklet + per_t * pr.dma_cycles(m_blk))
    if p.merge == "handshake":
        iters = _cdiv(_cdiv(_r8(n * es), p.block_bytes), t)
        serial = iters * (t * HANDSHAKE_INSTR * pr.issue_interval + _barrier(p))
    else:
        serial = 0.0
    out_dpu = _r8(n * es * keep) + t * 8
    return _finish(p, [w], serial, _r8(n * es) + (_r8(n * mask) if mask else 0), 0, out_dpu,
                   assemble_bytes=int(p.dpus * n * es * keep))


def _cost_topk(p: CnmPlan) -> CostBreakdown:
    pr, g, es = p.params, p.g, _esize(p.dtype)
    n, k = g["n_dpu"], g["k"]
    instr = 1 + C.op_instructions("cmp", p.dtype) + _loop(p)
    w = _stream_work(p, n, es, instr, reads=1, writes=0)
    if g["mode"] == "rows":
        return _finish(p, [w], 0.0, _r8(n * es), 0, _r8(g["rows_dpu"] * k * (es + 8)), 0)
    serial, out_dpu = _merge_partials(p, k, es + 8, C.op_instructions("cmp", p.dtype))
    del pr
    return _finish(p, [w], serial, _r8(n * es), 0, 0, out_dpu * p.dpus, partial_out_dpu=out_dpu)


def _cost_transpose(p: CnmPlan) -> CostBreakdown:
    """Each DPU transposes a band of rows tile by tile in WRAM: s x s tiles (s * esize a
    multiple of 8, s * s * esize <= block); each tile is s reads and s writes of s elements."""
    pr, g, es, t = p.params, p.g, _esize(p.dtype), p.tasklets
    n = g["n_dpu"]
    s = max(8 // es, int(math.isqrt(max(1, p.block_bytes // es))) // max(1, 8 // es) * max(1, 8 // es))
    seg = _r8(s * es)
    tiles = _cdiv(n, s * s)
    tiles_t = _cdiv(tiles, t)
    per_tile_dma = s * (pr.dma_cycles(seg) + pr.dma_cycles(seg, write=True))
    instr = (2 + 2 + _loop(p)) * s * s + 2 * s * BLOCK_INSTR
    w = KernelWork(t, tiles_t * instr, tiles * instr, tiles * per_tile_dma, tiles_t * per_tile_dma)
    return _finish(p, [w], 0.0, _r8(n * es), 0, _r8(n * es), 0)


#: Im2Col instructions per (channel, kernel row) window: KW * 4 copy + 10 address/loop
#: (the generated dpu.c counts the same; templates/upmem/im2col/dpu.c.j2)
IM2COL_WIN_INSTR = (4, 10)


def im2col_dims(shape, kernel_shape, strides, pads, dilations) -> dict:
    """The convolution geometry the Im2Col kernel works with, a 1-D kernel as the 2-D one with
    one row: ``N, C, H, W`` of ``X``, ``KH, KW, SH, SW, DH, DW``, pads ``PT, PL, PB, PR``, the
    padded ``HP, WP`` and the output ``OH, OW`` (< 1 for an empty output)."""
    shape, ks, st, dl, pd = (list(shape), list(kernel_shape), list(strides), list(dilations),
                             list(pads))
    if len(ks) == 1:
        shape, ks, st, dl, pd = shape[:2] + [1] + shape[2:], [1] + ks, [1] + st, [1] + dl, \
            [0, pd[0], 0, pd[1]]
    n, c, h, w = shape
    hp, wp = h + pd[0] + pd[2], w + pd[1] + pd[3]
    return dict(N=n, C=c, H=h, W=w, KH=ks[0], KW=ks[1], SH=st[0], SW=st[1], DH=dl[0], DW=dl[1],
                PT=pd[0], PL=pd[1], PB=pd[2], PR=pd[3], HP=hp, WP=wp,
                OH=(hp - dl[0] * (ks[0] - 1) - 1) // st[0] + 1,
                OW=(wp - dl[1] * (ks[1] - 1) - 1) // st[1] + 1)


def im2col_split(n: int, oh: int, ow: int, dpus: int) -> tuple[int, int, int, int]:
    """How the Im2Col kernel splits its output over ``dpus`` DPUs: ``(NB, LB, CB, used)``.
    Each DPU gets ``NB`` images' tile of ``LB`` output lines x ``CB`` output columns (every
    output pixel one patch row): with at least as many DPUs as output lines (``n * oh``),
    single lines cut into ``ceil(ow / CB)`` column blocks of ``CB = ceil(ow / (dpus // (n *
    oh)))``; with at least as many DPUs as images, every image cut into bands of ``LB =
    ceil(oh / (dpus // n))`` whole lines; with fewer, ``NB = ceil(n / dpus)`` whole images per
    DPU. ``used`` DPUs get work. The host scatters to each DPU only the padded input rows and
    columns its tile reads (:func:`im2col_halo`), so a DPU never receives the whole input.
    Remembered by its arguments (a network's convolutions of one output size share them)."""
    key = (n, oh, ow, dpus)
    hit = _IM2COL_SPLITS.get(key)
    if hit is None:
        if len(_IM2COL_SPLITS) > 4096:
            _IM2COL_SPLITS.clear()
        hit = _IM2COL_SPLITS[key] = _im2col_split(n, oh, ow, dpus)
    return hit


#: :func:`im2col_split` by its arguments.
_IM2COL_SPLITS: dict = {}


def _im2col_split(n: int, oh: int, ow: int, dpus: int) -> tuple[int, int, int, int]:
    """:func:`im2col_split`, computed."""
    n, oh, ow, dpus = max(1, n), max(1, oh), max(1, ow), max(1, dpus)
    if dpus >= n * oh:
        cb = _cdiv(ow, min(ow, dpus // (n * oh)))
        return 1, 1, cb, n * oh * _cdiv(ow, cb)
    if dpus >= n:
        lb = _cdiv(oh, min(oh, dpus // n))
        return 1, lb, ow, n * _cdiv(oh, lb)
    nb = _cdiv(n, dpus)
    return nb, oh, ow, _cdiv(n, nb)


def im2col_halo(lines: int, k: int, stride: int, dilation: int) -> int:
    """Padded input rows (or columns) a tile of ``lines`` output lines (columns) reads: from
    its first window's through its last's, ``(lines - 1) * stride + (k - 1) * dilation + 1``
    (the halo: ``(k - 1) * dilation + 1 - stride`` of them shared with the next tile)."""
    return (lines - 1) * stride + (k - 1) * dilation + 1


def _im2col_geometry(shape, attrs: dict, d: int, es: int, conv: tuple | None = None) -> dict:
    """The generated Im2Col kernel's split (:func:`im2col_split`): each of ``used`` DPUs gets
    ``row_cap = NB * LB * CB`` output rows (pixels), each row ``C * KH`` windows of ``KW``
    taps, and ``xs_bytes`` of input: its ``NB`` images' ``C`` channels of ``HB`` padded rows
    of ``WB`` elements (what its tile reads, halo included). Unknown dims count as 1.
    ``conv``: :func:`_im2col_conv` of ``shape``, ``attrs`` and ``es`` when the caller has it
    (the same for every DPU count)."""
    g, ck, ck_pad, oh, ow, win_read = conv or _im2col_conv(shape, attrs, es)
    rows = g["N"] * oh * ow
    nb, lb, cb, used = im2col_split(g["N"], oh, ow, d)
    hb = im2col_halo(lb, g["KH"], g["SH"], g["DH"])
    wb = im2col_halo(cb, g["KW"], g["SW"], g["DW"])
    # the scattered input: NB x C x HB x WB elements, and 8 bytes a last window may reach past
    xs_bytes = _r8(nb * g["C"] * hb * wb * es) + 8
    return {"n": rows * ck, "n_dpu": nb * lb * cb * ck_pad, "rows": rows, "row_cap": nb * lb * cb,
            "used": used, "windows": g["C"] * g["KH"], "kw": g["KW"], "ck": ck,
            "ck_pad": ck_pad, "win_read": win_read, "nb": nb, "lb": lb, "cb": cb, "hb": hb,
            "wb": wb, "xs_bytes": xs_bytes}


def _im2col_conv(shape, attrs: dict, es: int) -> tuple:
    """The part of :func:`_im2col_geometry` no DPU count changes: ``(im2col_dims, C*KH*KW, that
    padded to 8 bytes, OH, OW (at least 1), bytes of one window read)``."""
    dims = [int(x) if isinstance(x, int) and x > 0 else 1 for x in (shape or [1, 1, 1])]
    nd = len(dims) - 2
    g = im2col_dims(dims, attrs.get("kernel_shape") or [1] * nd, attrs.get("strides") or [1] * nd,
                    attrs.get("pads") or [0] * (2 * nd), attrs.get("dilations") or [1] * nd)
    per = max(1, 8 // es) if 8 % es == 0 else 1
    ck = g["C"] * g["KH"] * g["KW"]
    span = ((g["KW"] - 1) * g["DW"] + 1) * es
    # bytes of one window read: the taps' span from an 8-aligned start (mean over alignments)
    offs = range(0, 8, es) if es < 8 else [0]
    win_read = sum(_r8(o + span) for o in offs) / len(offs)
    return g, ck, _cdiv(ck, per) * per, max(1, g["OH"]), max(1, g["OW"]), win_read


def _op_im2col_conv(op: OpInfo, es: int) -> tuple:
    """:func:`_im2col_conv` of the Im2Col ``op``'s input and attributes (``es``-byte
    elements), computed once per :class:`OpInfo` (frozen, its attributes never changed) and
    kept on it: its unit geometry, its lower bounds and each plan tried ask (read it, never
    change it)."""
    hit = op.__dict__.get("_cnm_im2col_conv")
    if hit is None or hit[0] != es:
        hit = op.__dict__["_cnm_im2col_conv"] = (es, _im2col_conv(op.inputs[0].shape, op.attrs,
                                                                   es))
    return hit[1]


def _cost_im2col(p: CnmPlan) -> CostBreakdown:
    """Im2Col as the generated kernel runs it: per output row, ``C * KH`` window reads (the KW
    taps of one padded input row) and ``KW * 4 + 10`` instructions each, and the row written
    in blocks of ``min(block, row pitch)``; tasklets take rows round-robin. Each DPU receives
    its band's ``xs_bytes`` of input by a scatter (never the whole input)."""
    g, es, pr, t = p.g, _esize(p.dtype), p.params, p.tasklets
    blk = min(p.block_bytes, _r8(g["ck_pad"] * es))
    be = max(1, blk // es)
    full, rest = divmod(g["ck"], be)
    dma_row = (g["windows"] * pr.dma_cycles(g["win_read"])
               + full * pr.dma_cycles(blk, write=True)
               + (pr.dma_cycles(_r8(rest * es), write=True) if rest else 0.0))
    instr_row = g["windows"] * (IM2COL_WIN_INSTR[0] * g["kw"] + IM2COL_WIN_INSTR[1])
    rows, rows_t = g["row_cap"], _cdiv(g["row_cap"], t)
    w = _work(t, rows_t * instr_row, rows * instr_row, rows * dma_row, rows_t * dma_row)
    return _finish(p, [w], 0.0, g["xs_bytes"], 0, _r8(g["n_dpu"] * es), 0)


def rownorm_rows(shape, axis: int) -> tuple[int, int]:
    """``(rows, length)`` of a row-wise op (Softmax over the last axis, LayerNorm over the axes
    from ``axis`` on) on X of ``shape``: the rows are everything before ``axis``."""
    shape = [int(x) if isinstance(x, int) and x > 0 else 1 for x in shape] or [1]
    axis %= len(shape)
    return math.prod(shape[:axis]), math.prod(shape[axis:])


def rownorm_split(rows: int, dpus: int) -> tuple[int, int]:
    """``(rows per DPU, DPUs with work)``: whole rows in contiguous ranges."""
    row_cap = max(1, _cdiv(rows, max(dpus, 1)))
    return row_cap, _cdiv(rows, row_cap)


def _rownorm_geometry(op: OpInfo, d: int, es: int) -> tuple:
    """Softmax (over the last axis) and LayerNorm (over the axes from ``axis`` on) on ``d``
    DPUs: ``row_cap`` whole rows of ``length`` elements (padded to ``row_bytes``, a multiple
    of 8) per DPU, scattered; LayerNorm's Scale and B broadcast (resident when constant).
    Unknown dims count as 1."""
    ins, a = op.inputs, op.attrs
    shape = list(ins[0].shape or [1])
    ln = op.op_type == "LayerNorm"
    rows, length = rownorm_rows(shape, int(a.get("axis", -1)) if ln else -1)
    row_cap, used = rownorm_split(rows, d)
    row_bytes = _r8(length * es)
    geom = {"rows": rows, "length": length, "row_cap": row_cap, "used": used,
            "row_bytes": row_bytes, "n": rows * length, "n_dpu": row_cap * length,
            "op": "layernorm" if ln else "softmax", "params": len(ins) - 1 if ln else 0}
    names = [D.entry(ins[0].name, D.SCATTER)]
    moved = []
    for t in ins[1:] if ln else []:
        names.append(D.entry(t.name, D.BROADCAST))
        moved.append((row_bytes, D.BROADCAST, t.const))
    geom["resident_scatter"], geom["resident_bcast"] = D.resident(moved)
    geom["bcast_bytes"] = row_bytes * geom["params"]
    return "rownorm", geom, names, 1 + geom["params"]


#: Instructions per element of each pass of the row-wise kernels, and per row outside the
#: element loops (the generated ``templates/upmem/rownorm/dpu.c.j2`` counts the same), from
#: :func:`~onnx_cinm.devices.upmem.cost.op_instructions` (PrIM-measured float add/mul/div,
#: the counted ``expf`` helper): ``ld``/``st`` are one WRAM load/store each.
@functools.lru_cache(maxsize=256)
def rownorm_instr(kind: str, dtype: str = "float32", bias: bool = True) -> tuple:
    """``((pass 1, pass 2, pass 3) instructions per element, instructions per row)``.

    Softmax: max (ld, cmp); exp(x - max) stored and summed (ld, sub, expf, st, add); times
    1 / sum (ld, mul, st); per row one division. LayerNorm: sum (ld, add); squared deviations
    (ld, sub, mul, add); ``(x - mean) * inv * scale (+ bias)`` (ld x, ld scale, [ld bias,] sub,
    2 mul, [add,] st); per row 2 mul (mean and variance), an add (epsilon), a square root in
    software double (the ``emu_sqrt`` helper: 6 Newton steps of a double division and add;
    PrIM's DOUBLE div 0.16 MOPS ~ 2183 instructions) and a division."""
    op = lambda o: C.op_instructions(o, dtype)  # noqa: E731
    if kind == "softmax":
        return (1 + op("cmp"), 1 + op("sub") + op("expf") + 1 + op("add"), 1 + op("mul") + 1), op("div")
    p3 = 2 + op("sub") + 2 * op("mul") + 1 + ((1 + op("add")) if bias else 0)
    sqrt_d = 6 * (C.op_instructions("div", "float64") + C.op_instructions("add", "float64")
                  + C.op_instructions("mul", "float64"))
    return (1 + op("add"), 1 + op("sub") + op("mul") + op("add"), p3), \
        2 * op("mul") + op("add") + sqrt_d + op("div")


def _unrolled_instr(n: int, body: float, unroll: int) -> float:
    """Instructions of ``_common.j2``'s ``unrolled`` loop over ``n`` elements of ``body``."""
    return n * body + (n // unroll + n % unroll) * C.LOOP_CONTROL


def _row_blocks(nbytes: int, n: int, blk: int, es: int) -> list[tuple[int, int, int]]:
    """``[(count, bytes, elements)]`` of the DMA blocks a kernel streams ``nbytes`` (a multiple
    of 8, > 0) holding ``n`` elements in: full blocks of ``blk`` bytes, then the last one,
    shorter or not, with the padding."""
    k = _cdiv(nbytes, blk)
    o = (k - 1) * blk
    return ([(k - 1, blk, blk // es)] if k > 1 else []) + [(1, nbytes - o, n - o // es)]


def _rownorm_rows_work(kind: str, dtype: str, rows: int, length: int, tasklets: int, blk: int,
                       nparams: int, unroll: int, pr: UpmemParams) -> KernelWork:
    """The whole-row kernel (one tasklet per row, tasklets take rows round-robin) on a DPU of
    ``rows`` rows of ``length`` elements: one phase after the start barrier."""
    es, ln = _esize(dtype), kind == "layernorm"
    rb = _r8(length * es)
    (i1, i2, i3), i_row = rownorm_instr(kind, dtype, nparams > 1)
    blocks = _row_blocks(rb, length, blk, es)
    instr_row = i_row + sum(c * (_unrolled_instr(n, i, unroll) + BLOCK_INSTR)
                            for c, _, n in blocks for i in (i1, i2, i3))
    rd = sum(c * pr.dma_cycles(b) for c, b, _ in blocks)
    wr = sum(c * pr.dma_cycles(b, write=True) for c, b, _ in blocks)
    if rb <= blk:
        dma_row = rd + wr
        setup = nparams * pr.dma_cycles(rb)          # Scale and B once per tasklet
    else:  # X read in every pass (Softmax: pass 3 reads back pass 2's exponentials)
        dma_row = (3 * rd + wr + nparams * rd) if ln else (3 * rd + 2 * wr)
        setup = 0.0
    rows_t, busy = _cdiv(rows, tasklets), min(tasklets, rows)
    return KernelWork(tasklets, rows_t * instr_row, rows * instr_row, rows * dma_row + busy * setup,
                      rows_t * dma_row + setup)


#: Instructions of a split row's working tasklet per round beyond its slice's element loops,
#: in passes 1, 2, 3: the store of its partial (passes 1 and 2) and the load of the scalar the
#: group's first tasklet combined the partials into (passes 2 and 3); the generated
#: ``templates/upmem/rownorm/dpu_split.c.j2`` counts the same.
ROWNORM_LANE_INSTR = (1, 2, 1)
#: Barriers of all tasklets per round of the split-row kernel: after each of the two reducing
#: passes, one before the group's first tasklet combines the partials, one after.
ROWNORM_SPLIT_BARRIERS = 4


@functools.lru_cache(maxsize=256)
def rownorm_combine_instr(kind: str, dtype: str, lanes: int) -> tuple:
    """Instructions of the group's first tasklet combining the ``lanes`` partials of a split row
    after pass 1 and after pass 2 (a loop of ``ld`` + operation + loop control per partial, not
    unrolled), with the row's scalar work (:func:`rownorm_instr`'s per-row part):

    Softmax: the max of the partial maxima; the sum of the partial sums and ``1 / sum``.
    LayerNorm: the sum of the partial sums times ``1 / L`` (the mean); the sum of the partial
    squared deviations, times ``1 / L``, plus epsilon, its square root in software double and
    ``1 / sqrt``."""
    op = lambda o: C.op_instructions(o, dtype)  # noqa: E731
    loop = lambda o: lanes * (1 + op(o) + C.LOOP_CONTROL)  # noqa: E731
    if kind == "softmax":
        return loop("cmp"), loop("add") + op("div")
    _, i_row = rownorm_instr(kind, dtype)
    return loop("add") + op("mul"), loop("add") + i_row - op("mul")


def rownorm_slices(length: int, lanes: int, es: int) -> tuple[int, list[tuple[int, int, int]]]:
    """How a split row of ``length`` elements of ``es`` bytes falls to ``lanes`` tasklets:
    ``(slice elements, [(first byte, bytes, elements)] per lane)``. A slice is a whole
    number of 8-byte words (so every slice starts 8-byte aligned in MRAM), the last lanes'
    slices are shorter or empty, the row's padding goes to the last non-empty slice."""
    per = max(1, 8 // es)
    sl = _cdiv(_cdiv(length, max(lanes, 1)), per) * per
    rb = _r8(length * es)
    out = []
    for j in range(lanes):
        lo = j * sl
        n = max(0, min(length, lo + sl) - lo)
        out.append((lo * es, min(rb, (lo + sl) * es) - lo * es if n else 0, n))
    return sl, out


def _rownorm_split_work(kind: str, dtype: str, rows: int, length: int, lanes: int, tasklets: int,
                        blk: int, nparams: int, unroll: int, pr: UpmemParams) -> tuple:
    """``(PhasedWork, barriers)`` of the split-row kernel on a DPU of ``rows`` rows.

    ``G = tasklets // lanes`` groups of ``lanes`` tasklets each take one row per round (rounds:
    ``ceil(rows / G)``; the last may leave groups idle); within a group, lane ``j`` takes slice
    ``j`` (:func:`rownorm_slices`). A round is pass 1 on every slice, a barrier, the group's
    first tasklet combining the partials (:func:`rownorm_combine_instr`), a barrier, pass 2, a
    barrier, the combine, a barrier, pass 3. Pass 3 of a round and pass 1 of the next share a
    phase (no barrier between them); LayerNorm's Scale and B slices, when a slice fits one
    block, are read once before the first round. A slice that fits one block is read once and
    written once; a longer one is streamed in every pass, as a whole row is."""
    es, ln = _esize(dtype), kind == "layernorm"
    (i1, i2, i3), _ = rownorm_instr(kind, dtype, nparams > 1)
    c1, c2 = rownorm_combine_instr(kind, dtype, lanes)
    sl, slices = rownorm_slices(length, lanes, es)
    one = sl * es <= blk
    # per lane: setup DMA, and (instructions, DMA cycles) of passes 1, 2, 3
    lane, seen = [], {}
    for _, b, n in slices:
        if not n:
            lane.append((0.0, ((0.0, 0.0),) * 3))
            continue
        if (b, n) in seen:   # slices but the last are alike
            lane.append(seen[b, n])
            continue
        blocks = _row_blocks(b, n, blk, es)
        ins = [sum(c * (_unrolled_instr(m, i, unroll) + BLOCK_INSTR) for c, _, m in blocks) + extra
               for i, extra in zip((i1, i2, i3), ROWNORM_LANE_INSTR)]
        rd = sum(c * pr.dma_cycles(x) for c, x, _ in blocks)
        wr = sum(c * pr.dma_cycles(x, write=True) for c, x, _ in blocks)
        if one:
            setup, dma = (nparams * rd if ln else 0.0), (rd, 0.0, wr)
        elif ln:
            setup, dma = 0.0, (rd, rd, (1 + nparams) * rd + wr)
        else:
            setup, dma = 0.0, (rd, rd + wr, rd + wr)
        seen[b, n] = (setup, tuple(zip(ins, dma)))
        lane.append(seen[b, n])
    # lane 0 holds the longest slice: the busiest tasklet of every phase
    setup0, first = lane[0]
    group_setup = sum(x for x, _ in lane)
    group = [(sum(w[p][0] for _, w in lane), sum(w[p][1] for _, w in lane)) for p in range(3)]

    def phase(*terms) -> KernelWork:
        """Work of ``(groups, pass)`` terms in one phase (pass -1: the setup reads)."""
        it = dt = i_all = d_all = 0.0
        for g, p in terms:
            if g <= 0:
                continue
            i0, d0 = (0.0, setup0) if p < 0 else first[p]
            gi, gd = (0.0, group_setup) if p < 0 else group[p]
            it, dt, i_all, d_all = it + i0, dt + d0, i_all + g * gi, d_all + g * gd
        return KernelWork(tasklets, it, i_all, d_all, dt)

    def combine(g: int, c: float) -> KernelWork:
        return KernelWork(tasklets, c, g * c, 0.0, 0.0)

    groups = tasklets // lanes
    # rounds: `full` with every group busy, then one with `last` groups if rows do not divide
    full, last = divmod(rows, groups)
    first_a, last_a = (groups if full else last), (last if last else groups)
    counts: dict = {}

    def add(w: KernelWork, n: int = 1) -> None:
        if n > 0:
            counts[w] = counts.get(w, 0) + n

    add(phase((first_a, -1), (first_a, 0)))
    for a, n in ((groups, full), (last, 1 if last else 0)):
        add(combine(a, c1), n)
        add(phase((a, 1)), n)
        add(combine(a, c2), n)
    # pass 3 of a round with pass 1 of the next
    add(phase((groups, 2), (groups, 0)), full - 1)
    add(phase((groups, 2), (last, 0)), 1 if full and last else 0)
    add(phase((last_a, 2)))
    rounds = full + (1 if last else 0)
    return C.PhasedWork(tuple((n, w) for w, n in counts.items())), ROWNORM_SPLIT_BARRIERS * rounds


def _barrier_cycles(tasklets: int, pr: UpmemParams) -> float:
    """Cycles of one barrier of ``tasklets`` tasklets (see :func:`_barrier`)."""
    return tasklets * BARRIER_INSTR * pr.issue_interval if tasklets > 1 else 0.0


def rownorm_work(kind: str, dtype: str, rows: int, length: int, lanes: int, tasklets: int,
                 blk: int, nparams: int, unroll: int = UNROLL,
                 params: UpmemParams = DEFAULT_PARAMS) -> tuple:
    """``(work, barriers)`` of the row-wise kernel with ``lanes`` tasklets per row on one DPU
    holding ``rows`` rows (the barriers beyond the launch's start barrier); ``lanes == 1`` is
    the whole-row kernel (:func:`_rownorm_rows_work`), more the split-row kernel
    (:func:`_rownorm_split_work`)."""
    if lanes <= 1:
        return _rownorm_rows_work(kind, dtype, rows, length, tasklets, blk, nparams, unroll, params), 0
    return _rownorm_split_work(kind, dtype, rows, length, lanes, tasklets, blk, nparams, unroll, params)


@functools.lru_cache(maxsize=4096)
def rownorm_lanes(kind: str, dtype: str, rows: int, length: int, tasklets: int, blk: int,
                  nparams: int, unroll: int = UNROLL, params: UpmemParams = DEFAULT_PARAMS) -> int:
    """Tasklets per row of the row-wise kernel (``softmax``/``layernorm``) on a DPU of ``rows``
    rows of ``length`` elements, ``tasklets`` tasklets and ``blk``-byte blocks: whichever of
    the whole-row kernel (1) and the split-row kernels (``tasklets // G`` lanes for ``G`` =
    1 .. min(rows, tasklets) rows in flight, at most one lane per 8-byte word of the row) the
    cost model finds fastest, barriers and combines included; ties go to fewer lanes. The
    mapping and the code generator both ask this function, so they agree. Memoized (the
    mapping search asks it for every workgroup and block it prices)."""
    es = _esize(dtype)
    words = _cdiv(length, max(1, 8 // es))
    cands = sorted({tasklets // g for g in range(1, min(rows, tasklets) + 1)} | {1})
    best, best_cyc = 1, None
    for lanes in cands:
        if lanes > 1 and lanes > words:
            continue
        w, barriers = rownorm_work(kind, dtype, rows, length, lanes, tasklets, blk, nparams,
                                   unroll, params)
        cyc = C.kernel_cycles(w, params)["total"] + barriers * _barrier_cycles(tasklets, params)
        if best_cyc is None or cyc < best_cyc * (1 - 1e-9):
            best, best_cyc = lanes, cyc
    return best


def _cost_rownorm(p: CnmPlan) -> CostBreakdown:
    """Softmax / LayerNorm as the generated kernel runs them, with ``lanes`` tasklets per row
    (:func:`rownorm_lanes`). Whole rows (1 lane): tasklets take rows round-robin; every row
    is three passes over its blocks (max, exp and sum, scale; mean, variance, normalize). A
    row that fits one block (``row_bytes <= block``) is read once and written once (and a
    LayerNorm's Scale and B read once per tasklet); a longer row is read in every pass (and
    Softmax's exponentials written in pass 2, read back in pass 3; Scale and B read block by
    block in pass 3). Split rows (more lanes): :func:`_rownorm_split_work`, its phases between
    barriers priced one by one and its barriers as serial cycles."""
    g = p.g
    w, barriers = rownorm_work(g["op"], p.dtype, g["row_cap"], g["length"], g.get("lanes", 1),
                               p.tasklets, p.block_bytes, g["params"], p.unroll, p.params)
    res_s, res_b = g.get("resident_scatter", 0), g.get("resident_bcast", 0)
    rows, rb = g["row_cap"], g["row_bytes"]
    return _finish(p, [w], barriers * _barrier(p), rows * rb, g["bcast_bytes"] - res_b, rows * rb,
                   resident=(res_s, res_b))


def _roofline(p: CnmPlan) -> dict:
    g, es, k = p.g, _esize(p.dtype), p.kind
    op = C.op_instructions
    if k == "elementwise":
        nb = (g["streams"] + 1) * g["n_dpu"] * es
        ops = g["n_dpu"] * op(g["op"], p.dtype)
    elif k in ("gemv", "gemm", "simsearch"):
        nb = (g["rows_dpu"] * g["k"] + g["k"] * g["n_dpu"] + g["rows_dpu"] * g["n_dpu"]) * es
        ops = g["rows_dpu"] * g["k"] * g["n_dpu"] * (op("mul", p.dtype) + op("add", p.dtype))
    elif k in ("reduce", "topk"):
        nb = g["n_dpu"] * es
        ops = g["n_dpu"] * op(g["op"], p.dtype)
    elif k == "merge_partial":
        nb = (g["parts"] + 1) * g["n_dpu"] * es
        ops = g["n_dpu"] * (g["parts"] - 1) * op(g["op"], p.dtype)
    elif k == "scan":
        nb = 2 * g["n_dpu"] * es
        ops = g["n_dpu"] * op("add", p.dtype)
    elif k == "histogram":
        nb = g["n_dpu"] * es
        ops = g["n_dpu"] * (_hist_bin_instr(p) + op("add", "int32"))
    elif k == "select":
        nb = g["n_dpu"] * es * (1 + g["keep"])
        ops = g["n_dpu"] * op("and", p.dtype)
    elif k == "rownorm":
        nb = 2 * g["n_dpu"] * es
        (i1, i2, i3), _ = rownorm_instr(g["op"], p.dtype, g["params"] > 1)
        ops = g["n_dpu"] * (i1 + i2 + i3 - 5)
    else:  # transpose, im2col: pure data movement
        nb, ops = 2 * g["n_dpu"] * es, 0
    f = p.params.frequency_hz
    dma_s = nb * p.params.dma_beta / f
    compute_s = ops / f
    return {"dma_s": dma_s, "compute_s": compute_s, "bound_s": max(dma_s, compute_s)}


_COSTERS = {"elementwise": _cost_elementwise, "gemv": _cost_matmul, "gemm": _cost_matmul,
            "reduce": _cost_reduce, "merge_partial": _cost_merge_partial, "scan": _cost_scan,
            "histogram": _cost_histogram, "select": _cost_select, "topk": _cost_topk,
            "transpose": _cost_transpose, "im2col": _cost_im2col, "simsearch": _cost_matmul,
            "rownorm": _cost_rownorm}


# ---------------------------------------------------------------------------------------------
# Choosing the plan
# ---------------------------------------------------------------------------------------------

def _shape(t) -> tuple:
    s = t.static_shape
    return tuple(s) if s is not None else (t.numel or 1,)


def _dtype_name(t) -> str:
    return "float32" if t.dtype is None else dtype_name(t.dtype)


def _share(n: int, d: int, es: int) -> int:
    """Elements per DPU: ceil(n / d), rounded up so the share is a multiple of 8 bytes."""
    return W.share(n, d, es, 8)


def _matmul_geometry(op: OpInfo, kind: str, d: int, es: int, col_blocks: int) -> tuple:
    """Geometry of Gemv (A[M, K] x[K]), Gemm (A[..., M, K] B[..., K, N]) and SimSearch
    (Q[Nq, d] against D[Nd, d]: D is the scattered "B", Q the broadcast "A") on ``d`` DPUs.
    The ``d`` DPUs form a grid of ``d / col_blocks`` row blocks x ``col_blocks`` column blocks."""
    ins = op.inputs
    per = 8 // math.gcd(8, es)
    rpad = lambda k: _cdiv(k, per) * per * es  # noqa: E731 - one padded K-row, bytes
    sa, sb = _shape(ins[0]), _shape(ins[1])
    if kind == "gemv":
        rows, k, n, gb, a_name, b_name = sa[-2], sa[-1], 1, 1, ins[0].name, ins[1].name
        a_const, b_const = ins[0].const, ins[1].const
    elif kind == "gemm":
        k, n = sa[-1], sb[-1]
        rows = math.prod(sa[:-1]) if len(sa) > 1 else 1
        gb = math.prod(sb[:-2]) if len(sb) > 2 else 1
        a_name, b_name, a_const, b_const = ins[0].name, ins[1].name, ins[0].const, ins[1].const
    else:  # simsearch: scores = Q @ D^T; D rows are the columns of the product
        rows, k, n, gb = sa[0], sa[-1], sb[0], 1
        a_name, b_name, a_const, b_const = ins[0].name, ins[1].name, ins[0].const, ins[1].const
    dc = max(1, int(col_blocks))
    shape = D.grid(d, dc, rows, n, gb > 1)
    if shape is None:
        raise CinmError(f"no {d // dc} x {dc} DPU grid for a {rows} x {n} product")
    dr, dc, mode = shape
    rows_dpu = _cdiv(rows, dr)
    n_dpu = _cdiv(n, dc)
    a_bytes = rows_dpu * rpad(k)
    b_bytes = gb * (_cdiv(n_dpu, per) * per if n_dpu > 1 else 1) * rpad(k)
    geom = {"rows": rows, "n": n, "k": k, "mode": mode, "grid": (dr, dc),
            "rows_dpu": rows_dpu, "n_dpu": n_dpu,
            "a_bytes": a_bytes, "b_bytes": b_bytes, "b_batched": gb > 1}
    a_how, b_how = D.grid_inputs(dr, dc)
    names = [D.entry(a_name, a_how), D.entry(b_name, b_how)]
    moved = [(a_bytes, a_how, a_const), (b_bytes, b_how, b_const)]
    if len(ins) > 2:  # bias: scattered with the outputs it adds to
        geom["c_bytes"] = _r8(rows_dpu * n_dpu * es)
        names.append(D.entry(ins[2].name, D.SCATTER))
        moved.append((geom["c_bytes"], D.SCATTER, ins[2].const))
    geom["resident_scatter"], geom["resident_bcast"] = D.resident(moved)
    r_grp = 1 if gb > 1 else max(1, min(4, rows_dpu))
    nt = min(_cdiv(max(n_dpu, 1), per) * per, _cdiv(64, per) * per)
    geom["wram_private"] = r_grp * nt * es + 8   # the R x NT accumulators per tasklet
    return kind, geom, names, r_grp + 1


def _elementwise_geometry(op: OpInfo, es: int) -> tuple[dict, tuple, int]:
    """The part of an elementwise ``op``'s geometry (:func:`_geometry`) no DPU count changes,
    ``es``-byte elements: ``(geom on one DPU, input records, streams)``; :func:`_geometry`
    keeps it on the op (frozen, its attributes never changed) and gives each DPU count a copy
    with its own share ``n_dpu``."""
    ins, outs = op.inputs, op.outputs
    a = op.attrs
    n = max((outs[0] if outs else ins[0]).numel, 1)
    streams, bcast, wram_b, names = 0, 0, 0, []
    for t in ins:
        if t.numel == n or op.op_type in ("Relu", "Abs", "Neg", "Exp", "Log", "Sqrt",
                                           "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid",
                                           "PopCount", "Gelu") and t is ins[0]:
            streams += 1
            names.append(D.entry(t.name, D.SCATTER))
        else:
            bcast += _r8(max(t.numel, 1) * es)
            wram_b += 1 if _r8(max(t.numel, 1) * es) <= DEFAULT_PARAMS.dma_max else 0
            names.append(D.entry(t.name, D.BROADCAST))
    streams = max(streams, 1)
    opn = _OP_NAME[op.op_type]
    approx = a.get("approximate", "none")
    if op.op_type == "Gelu" and (approx.decode() if isinstance(approx, bytes) else approx) == "tanh":
        opn = "gelu_tanh"
    # "n_dpu" depends on the DPU count: _geometry sets it (its place here keeps the keys in
    # the order the plan is written in)
    geom = {"n": n, "n_dpu": None, "op": opn, "streams": streams,
            "bcast_bytes": bcast, "wram_bcast": wram_b}
    if outs and outs[0].dtype is not None:
        geom["out_esize"] = _esize(_dtype_name(outs[0]))
    return geom, tuple(names), streams


def _geometry(op: OpInfo, d: int, es: int, col_blocks: int = 1) -> tuple[str, dict, list, int]:
    """(kind, geom, inputs, buffers per tasklet) of ``op`` on ``d`` DPUs (``col_blocks``: the
    column blocks of a matrix product's DPU grid)."""
    kind = _KINDS.get(op.op_type)
    if kind is None:
        raise CinmError(f"upmem: no kernel for cinm.{op.op_type}")
    if kind == "elementwise":
        base = op.__dict__.get("_cnm_elementwise")
        if base is None or base[0] != es:
            base = op.__dict__["_cnm_elementwise"] = (es, _elementwise_geometry(op, es))
        geom, names, streams = base[1]
        geom = dict(geom)  # every DPU count the same but its share
        geom["n_dpu"] = _share(geom["n"], d, es)
        return kind, geom, list(names), streams
    ins = op.inputs
    a = op.attrs
    if kind in ("gemv", "gemm", "simsearch"):
        return _matmul_geometry(op, kind, d, es, col_blocks)
    if kind in ("reduce", "topk", "scan"):
        shape = _shape(ins[0])
        rank = len(shape)
        n = max(ins[0].numel, 1)
        if kind == "reduce":
            axes = [x % rank for x in (a.get("axes") or range(rank))] if rank else []
            length = math.prod(shape[x] for x in axes) if axes else 1
            opn = {"add": "add", "mul": "mul", "max": "max", "min": "min"}[str(a.get("kind", "add"))]
        elif kind == "topk":
            ax = int(a.get("axis", -1)) % max(rank, 1)
            length, opn = (shape[ax] if shape else 1), "cmp"
        else:
            ax = int(a.get("axis", 0)) % max(rank, 1)
            length, opn = (shape[ax] if shape else 1), "add"
        outputs = max(1, n // max(length, 1))
        mode = "rows" if outputs >= d and outputs > 1 else "split"
        geom = {"n": n, "length": length, "outputs": outputs if mode == "rows" else 1, "op": opn,
                "mode": mode, "rows_dpu": _cdiv(outputs, d),
                "n_dpu": _cdiv(outputs, d) * length if mode == "rows" else _share(n, d, es)}
        if mode == "split" and outputs > 1:  # partials per output
            geom["outputs"] = outputs
        if kind == "topk":
            geom["k"] = int(a.get("k", 1))
        return kind, geom, [D.entry(ins[0].name, D.SCATTER)], 1
    if kind == "merge_partial":
        shape = _shape(ins[0])
        s = shape[0] if shape else 1
        n = max(ins[0].numel // max(s, 1), 1)
        geom = {"n": n, "parts": s, "n_dpu": _share(n, d, es), "op": str(a.get("kind", "add"))}
        return kind, geom, [D.entry(ins[0].name, D.SCATTER)], s
    if kind == "histogram":
        n = max(ins[0].numel, 1)
        bins = int(a.get("bins", 1))
        lo, hi = float(a.get("min", 0.0)), float(a.get("max", 1.0))
        pow2 = hist_pow2_shift(_dtype_name(ins[0]), bins, lo, hi) is not None
        geom = {"n": n, "n_dpu": _share(n, d, es), "bins": bins, "pow2": pow2}
        return kind, geom, [D.entry(ins[0].name, D.SCATTER)], 1
    if kind == "select":
        n = max(ins[0].numel, 1)
        geom = {"n": n, "n_dpu": _share(n, d, es), "keep": float(a.get("keep", SELECT_KEEP))}
        if len(ins) > 1:   # Compress(X, mask): the mask is a second scattered stream
            geom["mask_esize"] = _esize(_dtype_name(ins[1])) if ins[1].dtype is not None else 1
        return kind, geom, [D.entry(t.name, D.SCATTER) for t in ins], 3
    if kind == "transpose":
        n = max(ins[0].numel, 1)
        return kind, {"n": n, "n_dpu": _share(n, d, es)}, [D.entry(ins[0].name, D.SCATTER)], 2
    if kind == "im2col":
        geom = _im2col_geometry(ins[0].shape, a, d, es, _op_im2col_conv(op, es))
        return kind, geom, [D.entry(ins[0].name, D.SCATTER)], 2
    if kind == "rownorm":
        return _rownorm_geometry(op, d, es)
    raise CinmError(f"upmem: no kernel for cinm.{op.op_type}")  # pragma: no cover


def _work_items(kind: str, geom: dict, es: int) -> int:
    """How many DPUs can get work: rows for matrix products, row modes and Im2Col, else 8-byte
    words."""
    if kind in ("gemv", "gemm", "simsearch"):
        return geom["rows"]
    if geom.get("mode") == "rows":
        return geom["n"] // max(geom["length"], 1)
    if kind in ("im2col", "rownorm"):
        return geom["rows"]
    return max(1, _cdiv(geom["n"] * es, 8))


def _mram_regions(kind: str, geom: dict, es: int, tasklets: int) -> list[tuple[str, int]]:
    """MRAM regions of one DPU as ``(name, bytes)`` in heap order, each a multiple of 8 bytes
    and the same on every DPU (inputs first, then outputs, then partials)."""
    g = geom
    if kind in ("gemv", "gemm", "simsearch"):
        return [("A", g["a_bytes"]), ("B", g["b_bytes"]), ("C", g.get("c_bytes", 0)),
                ("Y", _r8(g["rows_dpu"] * g["n_dpu"] * es))]
    if kind == "elementwise":
        return ([(f"in{i}", _r8(g["n_dpu"] * es)) for i in range(g["streams"])]
                + [("bcast", g["bcast_bytes"]), ("out", _r8(g["n_dpu"] * g.get("out_esize", es)))])
    if kind == "merge_partial":
        return [(f"part{i}", _r8(g["n_dpu"] * es)) for i in range(g["parts"])] + \
               [("out", _r8(g["n_dpu"] * es))]
    if kind in ("reduce", "topk"):
        width = g.get("k", 1) * max(1, g.get("outputs", 1)) if g["mode"] == "split" else 0
        return [("X", _r8(g["n_dpu"] * es)),
                ("partials", tasklets * _r8(width * (es + (8 if kind == "topk" else 0)))),
                ("out", _r8(g["rows_dpu"] * g.get("k", 1) * es) if g["mode"] == "rows" else 0)]
    if kind == "histogram":
        return [("X", _r8(g["n_dpu"] * es)), ("counts", _r8(g["bins"] * 4))]
    if kind == "scan":
        return [("X", _r8(g["n_dpu"] * es)), ("Y", _r8(g["n_dpu"] * es)), ("offset", 8)]
    if kind == "select":
        return [("X", _r8(g["n_dpu"] * es)), ("mask", _r8(g["n_dpu"] * g.get("mask_esize", 0))),
                ("Y", _r8(g["n_dpu"] * es)), ("counts", tasklets * 8)]
    if kind == "transpose":
        return [("X", _r8(g["n_dpu"] * es)), ("Y", _r8(g["n_dpu"] * es))]
    if kind == "im2col":
        return [("Y", _r8(g["n_dpu"] * es)), ("X", g["xs_bytes"])]
    if kind == "rownorm":
        return [("X", g["row_cap"] * g["row_bytes"]), ("Y", g["row_cap"] * g["row_bytes"]),
                ("Scale", g["row_bytes"] * g["params"])]
    return []  # pragma: no cover


def mram_layout(plan: "CnmPlan") -> list[tuple[str, int, int]]:
    """``[(region, offset, bytes)]`` from ``DPU_MRAM_HEAP_POINTER``: 8-byte aligned offsets,
    sizes multiples of 8, identical on every DPU; empty regions are left out
    (:func:`~onnx_cinm.paradigms.cnm.distribution.memory_layout`)."""
    return D.memory_layout(_mram_regions(plan.kind, plan.g, _esize(plan.dtype), plan.tasklets))


def make_plan(op: OpInfo, dpus: int, tasklets: int, schedule: str = "cinm",
              params: UpmemParams = DEFAULT_PARAMS, stack_bytes: int = STACK_BYTES,
              col_blocks: int = 1, block_bytes: int | None = None) -> CnmPlan:
    """The plan of ``op`` on exactly ``dpus`` DPUs and ``tasklets`` tasklets.

    ``schedule="prim"`` gives PrIM's default schedule (1 KB blocks, no unrolling, host merge of
    every tasklet's partial, mutex histogram, handshake chains) for comparison.
    ``block_bytes`` (ours only) asks for a smaller WRAM block than the largest that fits (the
    mapping search tries some); it must be a multiple of 8 that fits.

    Raises:
        CinmError: the op has no UPMEM kernel, or its data does not fit WRAM/MRAM, or
            ``block_bytes`` is larger than what fits.
    """
    if not 1 <= tasklets <= params.max_tasklets:
        raise CinmError(f"upmem: {tasklets} tasklets per DPU; this DPU target runs 1..{params.max_tasklets}")
    dt = _dtype_name(op.inputs[0]) if op.inputs else "float32"
    es = _esize(dt)
    if _KINDS.get(op.op_type) == "im2col":  # row ranges leave the rest idle: the split says
        # how many DPUs get work (the geometry's "used"), planned on that many alone
        conv = _op_im2col_conv(op, es)
        dpus = min(dpus, im2col_split(conv[0]["N"], conv[3], conv[4], dpus)[3])
    kind, geom, names, buffers = _geometry(op, dpus, es, col_blocks)
    if kind == "rownorm" and geom["used"] < dpus:  # row ranges leave the rest idle
        dpus = geom["used"]
        kind, geom, names, buffers = _geometry(op, dpus, es, col_blocks)
    private, shared = 0, 0
    if schedule == "prim":
        merge = {"reduce": "host", "topk": "host", "histogram": "mutex", "select": "handshake",
                 "scan": "handshake"}.get(kind, "none")
        if kind in ("gemv", "gemm", "simsearch", "select"):
            buffers = 2
        if kind == "reduce" and geom["mode"] == "rows":
            merge = "none"
        block, unroll = 1024, 1
    else:
        merge = Mg.rule(kind, whole_rows=geom.get("mode") == "rows")
        if kind == "histogram":   # + the overflow slot of the integer path (x == max)
            private = _r8((geom["bins"] + (1 if geom["pow2"] else 0)) * 4)
            if wram_block(tasklets, buffers, private, 0, stack_bytes, wram_bytes=params.wram_bytes) < 64:
                merge, private = "mutex", 0
                shared = _r8(geom["bins"] * 4)
        if kind in ("gemv", "gemm", "simsearch"):
            private = geom["wram_private"]
        if kind == "topk":  # each tasklet's sorted list of k values and int64 indices
            private = _r8(geom["k"] * es) + _r8(geom["k"] * 8)
            while tasklets > 1 and wram_block(tasklets, buffers, private, 0, stack_bytes,
                                              wram_bytes=params.wram_bytes) < 8:
                tasklets -= 1   # a large k: fewer tasklets (as the generated kernel does)
        if kind == "elementwise":
            shared = geom["bcast_bytes"] if geom["wram_bcast"] else 0
        block = wram_block(tasklets, buffers, private, shared, stack_bytes,
                           wram_bytes=params.wram_bytes, dma_max=params.dma_max)
        if kind == "rownorm":  # never a block longer than one (padded) row
            block = min(block, geom["row_bytes"])
        if "n_dpu" in geom and kind not in ("transpose", "im2col", "gemv", "gemm", "simsearch",
                                            "rownorm"):
            # never a block larger than one tasklet's share: all tasklets get work
            share = _r8(_cdiv(geom["n_dpu"] * es, tasklets))
            block = min(block, max(8, share))
        if block_bytes is not None:
            if block_bytes % 8 or not 8 <= block_bytes <= block:
                raise CinmError(f"upmem: a {block_bytes}-byte block does not fit ({block} B at most)")
            block = block_bytes
        unroll = UNROLL
    if schedule == "prim" and kind == "histogram":
        shared = _r8(geom["bins"] * 4)
    if kind == "rownorm":  # tasklets per row: whole rows, or rows split over tasklets
        geom["lanes"] = 1 if schedule == "prim" or block < 8 else rownorm_lanes(
            geom["op"], dt, geom["row_cap"], geom["length"], tasklets, block, geom["params"],
            unroll, params)
    if block < 8 or (schedule == "prim" and wram_block(tasklets, buffers, private, shared, stack_bytes,
                                                       wram_bytes=params.wram_bytes) < block):
        raise CinmError(f"upmem: {op.op_type} {op.name!r} does not fit WRAM with {tasklets} tasklets "
                        f"({buffers} buffers per tasklet, {private + shared} B of tables)")
    mram = sum(size for _, size in _mram_regions(kind, geom, es, tasklets))
    if mram > params.mram_bytes:
        raise CinmError(f"upmem: {op.op_type} {op.name!r} needs {mram} B of MRAM per DPU on {dpus} "
                        f"DPUs (> {params.mram_bytes})")
    # the plan's fields set directly (what CnmPlan's generated __init__ sets, one frozen
    # assignment per field, without it: the search makes hundreds of plans per network)
    plan = object.__new__(CnmPlan)
    plan.__dict__.update(
        op_type=op.op_type, kind=kind, dtype=dt, dpus=dpus, tasklets=tasklets, block_bytes=block,
        mram_bytes=mram, inputs=tuple(names), merge=merge, schedule=schedule, unroll=unroll,
        geom=tuple(sorted(geom.items())), params=params, stack_bytes=stack_bytes, search="")
    return plan


def workgroups(op: OpInfo, max_dpus: int = DEFAULT_DPUS, dpus: int | None = None,
               unit: tuple | None = None) -> list:
    """``[(DPUs, column blocks)]`` the mapping considers for ``op``: DPU counts that are powers
    of two below ``max_dpus`` and ``max_dpus`` itself (or exactly ``dpus``); for matrix
    products, every power of two dividing the count and the count itself as column blocks
    (1 for other ops). ``unit``: :func:`_unit_geometry` of ``op`` when the caller has it."""
    return list(_workgroups(op, max_dpus, dpus, unit))


def _workgroups(op: OpInfo, max_dpus: int, dpus: int | None, unit: tuple | None) -> tuple:
    """:func:`workgroups` as the memo's own tuple (shared by the ops of one memo key: read it,
    never change it; :func:`_combos_arrays` knows it by identity)."""
    kind, geom = unit or _unit_geometry(op)
    matmul = kind in ("gemm", "simsearch")
    items = geom["rows"] * geom["n"] if matmul else \
        _work_items(kind, geom, _esize(_dtype_name(op.inputs[0])))
    # the list depends on the work items only up to max_dpus (no count above either is tried)
    key = (max_dpus, dpus, matmul, min(max(1, items), max_dpus))
    hit = _WORKGROUPS.get(key)
    if hit is None:
        if len(_WORKGROUPS) > _PLANS_MAX:
            _WORKGROUPS.clear()
        hit = _WORKGROUPS[key] = tuple(W.workgroups(items, max_dpus, dpus, grid=matmul))
    return hit


def _combos_arrays(combos) -> tuple:
    """``(DPUs, column blocks)`` of the workgroups ``combos`` as two read-only int64 arrays
    (the lower bounds of :func:`_floor_s` rank them). Remembered for a memo's own tuple
    (:func:`_workgroups`: an op of each network layer asks with the same one); built anew for
    any other sequence."""
    hit = _COMBO_ARRAYS.get(id(combos))
    if hit is not None and hit[0] is combos:
        return hit[1]
    arr = np.array(combos, dtype=np.int64).reshape(-1, 2).T
    out = (np.ascontiguousarray(arr[0]), np.ascontiguousarray(arr[1]))
    for a in out:
        a.flags.writeable = False
    if isinstance(combos, tuple):  # immutable: safe to know by identity while it is held here
        if len(_COMBO_ARRAYS) > 256:
            _COMBO_ARRAYS.clear()
        _COMBO_ARRAYS[id(combos)] = (combos, out)
    return out


#: Memo of :func:`_combos_arrays`: id of a workgroup tuple -> (the tuple, its arrays).
_COMBO_ARRAYS: dict = {}


#: Memo of :func:`workgroups` by (max DPUs, DPUs, grid, work items capped at max DPUs): a
#: network's ops mostly have more work items than DPUs, so they share one list.
_WORKGROUPS: dict = {}


def _unit_geometry(op: OpInfo) -> tuple[str, dict]:
    """``(kind, geom)`` of ``op`` on one DPU (:func:`_geometry`): what the workgroups and the
    lower bounds of a plan search read. Raises CinmError for an op no kernel runs."""
    return _geometry(op, 1, _esize(_dtype_name(op.inputs[0])))[:2]


#: Memo of :func:`plan_op` (the search prices up to hundreds of DPU counts and column splits; the
#: device's ``supports``, its cost and its lowering each ask for the same plan).
_PLANS: dict = {}
_PLANS_MAX = 20000


def _op_key(op: OpInfo) -> tuple:
    """What a plan depends on: the op's type, attributes (but those that only record
    decisions: the placement ones and the plan's own ``cnm_*``, which ``cnm_mapping`` writes
    before ``device_lowering`` asks for the same plan) and the dtype, shape and constness of its
    tensors (not the op's name: ops of one shape share their plan). Computed once per
    :class:`OpInfo` (frozen, and its attributes are never changed after it is made) and kept
    on it: the device's ``supports``, its ``price`` and the emitter's memo each ask."""
    hit = op.__dict__.get("_cnm_op_key")
    if hit is None:
        hit = op.__dict__["_cnm_op_key"] = _make_op_key(op)
    return hit


def _make_op_key(op: OpInfo) -> tuple:
    """:func:`_op_key`, computed."""
    ts = lambda t: (t.dtype, t.shape, t.const)  # noqa: E731
    attrs = sorted((k, v) for k, v in op.attrs.items()
                   if k not in ("device", "placement", "kernel") and not k.startswith("cnm_"))
    names = [t.name for t in op.inputs]
    return (op.op_type, repr(attrs), tuple(map(ts, op.inputs)), tuple(map(ts, op.outputs)),
            op.flops, tuple(names.index(n) for n in names))  # which inputs are one tensor


def _renamed(plan: CnmPlan, template: tuple, op: OpInfo) -> CnmPlan:
    """``plan`` (made for an op of the same shape) with ``op``'s input names: ``template`` holds
    ``(input position, how)`` per entry of ``plan.inputs``."""
    names = tuple(D.entry(op.inputs[k].name, how) for k, how in template)
    if names == plan.inputs:
        return plan
    # a copy with the other names (what dataclasses.replace gives, without its generic
    # keyword pass): the names change no other field, nor the cost and geometry it holds
    out = object.__new__(CnmPlan)
    out.__dict__.update(plan.__dict__)
    out.__dict__["inputs"] = names
    return out


def plan_op(op: OpInfo, max_dpus: int = DEFAULT_DPUS, tasklets: int = DEFAULT_TASKLETS,
            params: UpmemParams = DEFAULT_PARAMS, stack_bytes: int = STACK_BYTES,
            dpus: int | None = None, op_key: tuple | None = None) -> CnmPlan:
    """Choose the plan of ``op``: the DPU count (<= ``max_dpus``, or exactly ``dpus``) with the
    least modeled end-to-end time (:attr:`CostBreakdown.latency_s`); ties go to fewer DPUs.
    Memoized per op shape and arguments (plans are immutable; the search prices up to
    hundreds of DPU counts and column splits, and placement, lowering and every op of the same
    shape ask for the same plan). ``op_key``: :func:`_op_key` of ``op`` when the caller has it.

    Raises:
        CinmError: no DPU count gives a plan that fits (the message of the last failure).
    """
    return memoized(_PLANS, (max_dpus, tasklets, params_key(params), stack_bytes, dpus), op,
                    lambda: _search_plan(op, max_dpus, tasklets, params, stack_bytes, dpus),
                    op_key)


_PARAMS_KEYS: dict = {}


def params_key(params: UpmemParams) -> str:
    """``repr(params)``, the part of a plan memo's key naming the DPU generation, remembered
    per parameter object (every plan asked for repeats it; the repr of the dataclass is
    slow)."""
    hit = _PARAMS_KEYS.get(id(params))
    if hit is None or hit[0] is not params:
        if len(_PARAMS_KEYS) > 64:
            _PARAMS_KEYS.clear()
        hit = _PARAMS_KEYS[id(params)] = (params, repr(params))
    return hit[1]


def memoized(memo: dict, args: tuple, op: OpInfo, plan, op_key: tuple | None = None) -> CnmPlan:
    """``plan()`` (a :class:`CnmPlan` of ``op``, or CinmError), remembered in ``memo`` under
    ``op``'s signature (:func:`_op_key`, or ``op_key`` when the caller has it) and ``args``: an
    op of the same signature gets the same plan with its own input names, or the same failure
    naming it. Without the memo when an attribute cannot be part of a key."""
    try:
        key = (op_key or _op_key(op), *args)
        hit = memo.get(key)
    except TypeError:  # an attribute that cannot be a key: plan without the memo
        return plan()
    if hit is None:
        try:
            p = plan()
            hit = (p, _template(p.inputs, op))
        except CinmError as e:
            hit = (str(e), op.name)
        if len(memo) > _PLANS_MAX:
            memo.clear()
        memo[key] = hit
    if isinstance(hit[0], str):  # the failure of an op of the same shape: name this one
        message, name = hit
        raise CinmError(message.replace(repr(name), repr(op.name)) if name != op.name else message)
    return _renamed(hit[0], hit[1], op)


def _template(entries: tuple, op: OpInfo) -> tuple:
    """``(input position, how)`` per entry of a plan's ``inputs`` (:func:`.distribution.entry`
    records of ``op``'s input names): what :func:`_renamed` gives another op of that shape. An
    input named twice is known by its first position (``list.index``'s); each entry split
    once."""
    first: dict = {}
    for i, t in enumerate(op.inputs):
        first.setdefault(t.name, i)
    out = []
    for e in entries:
        name, how = D.split(e)
        out.append((first[name], how))
    return tuple(out)


def _cdivs(a, b):
    """``ceil(a / b)`` of integer arrays (or an array and an int)."""
    return -(-a // b)


def _matmul_tiles_array(kind: str, rows, n, es: int, tasklets: int, batched: bool) -> tuple:
    """:func:`_matmul_tiles` (our schedule) of integer arrays ``rows`` and ``n`` (>= 1);
    tests/test_cnm_mapping.py checks that they agree. Change both together."""
    per = 8 // math.gcd(8, es)
    n_pad = np.where((n > 1) | (kind == "gemm"), _cdivs(n, per) * per, 1)
    r_grp = np.ones_like(rows) if batched else np.clip(rows, 1, 4)
    nt = np.minimum(n_pad, _cdiv(64, per) * per)
    groups = _cdivs(rows, r_grp)
    narrow = np.where(n_pad > 1,
                      np.maximum(per, _cdivs(_cdivs(n_pad, _cdivs(tasklets, groups)), per) * per), 1)
    nt = np.where((rows < tasklets) & (groups * _cdivs(n_pad, nt) < tasklets), narrow, nt)
    return n_pad, r_grp, nt, _cdivs(n_pad, nt)


def _grid_array(units, col_blocks, rows: int, cols: int, batched: bool) -> tuple:
    """:func:`~onnx_cinm.paradigms.cnm.distribution.grid` of integer arrays ``units`` and
    ``col_blocks`` (the workgroups of one product): ``(whether the grid exists, row blocks,
    column blocks)``, both 1 where it does not; tests/test_cnm_mapping.py checks that they
    agree. Change both together."""
    dc = np.maximum(col_blocks, 1)
    dr = units // dc
    ok = (units % dc == 0) & ~((dc > 1) & (batched | (dc > cols))) & (dr <= max(rows, 1))
    return ok, np.where(ok, dr, 1), np.where(ok, dc, 1)


def _matmul_busiest_array(rows, tasklets: int, n_pad, r_grp, nt, tiles) -> tuple:
    """``(rows, columns)`` of :func:`_matmul_busiest` of integer arrays (``rows`` >= 1)."""
    units_t = _cdivs(_cdivs(rows, r_grp) * tiles, tasklets)
    few = rows < tasklets
    return (np.where(few, np.minimum(rows, r_grp), _cdivs(rows, tasklets)),
            np.where(few, np.minimum(n_pad, units_t * nt), n_pad))


def _recalled(memo: dict, key: tuple, combos):
    """The answer ``memo`` holds under ``key`` (whose first part is ``id(combos)``) for this very
    workgroup tuple ``combos``, or None (an id reused by another object is no hit)."""
    hit = memo.get(key)
    return hit[1] if hit is not None and hit[0] is combos else None


def _remember(memo: dict, key: tuple, combos, out):
    """Keep ``out`` in ``memo`` under ``key`` for the workgroups ``combos`` when they are a
    tuple (immutable: safe to know by identity while the memo holds it; at most 1,024 entries,
    then the memo starts afresh); return ``out``."""
    if isinstance(combos, tuple):
        if len(memo) > 1024:
            memo.clear()
        memo[key] = (combos, out)
    return out


def _matmul_floor_parts(combos, kind: str, rows: int, n: int, es: int, tasklets: int,
                        batched: bool, params: UpmemParams) -> tuple:
    """The parts of a matrix product's lower bounds (:func:`_floor_s`) that its K and its
    inputs' constness leave unchanged, one entry per workgroup of ``combos``: ``(whether the
    grid exists, whether A is scattered (more than one row block), A rows per DPU, the larger
    of the busiest DPU's outputs x padded columns and the busiest tasklet's
    issue-interval-weighted outputs (:func:`_matmul_busiest`), the launch's seconds, the
    result's gather seconds, and the DPU counts' send terms: ``(xfer_call_s + h2d_rank_s *
    ranks, the ranks' scatter bandwidth, the ranks' broadcast bandwidth)``)``.
    Remembered for a memo's own workgroup tuple (:func:`_workgroups`) with the other
    arguments: a network's layers repeat their output sizes (``rows x n``) with other K."""
    key = (id(combos), kind, rows, n, es, tasklets, batched, params_key(params))
    hit = _recalled(_MATMUL_FLOORS, key, combos)
    if hit is not None:
        return hit
    d, dc = _combos_arrays(combos)
    ok, dr, dcol = _grid_array(d, dc, rows, n, batched)
    rows_dpu = _cdivs(rows, dr)
    n_dpu = _cdivs(n, dcol)
    n_pad, r_grp, nt, tiles = _matmul_tiles_array(kind, rows_dpu, n_dpu, es, tasklets, batched)
    r_t, n_t = _matmul_busiest_array(rows_dpu, tasklets, n_pad, r_grp, nt, tiles)
    pr = params
    out = (ok, dr > 1, rows_dpu, np.maximum(rows_dpu * n_pad, pr.issue_interval * r_t * n_t),
           pr.launch_overhead_s_array(d),
           pr.push_s_array(_cdivs(rows_dpu * n_dpu * es, 8) * 8, d, to_dpu=False),
           (pr._calls_array(d, pr.h2d_rank_s),
            pr._ranks_bw_array(d, pr.h2d_serial_bps, pr.h2d_rank_bps),
            pr._ranks_bw_array(d, pr.h2d_serial_bps, pr.bcast_rank_bps)))
    for a in out[:-1] + out[-1]:
        a.flags.writeable = False  # read-only, like every memo's answer
    return _remember(_MATMUL_FLOORS, key, combos, out)


#: Memo of :func:`_matmul_floor_parts`: key -> (the workgroup tuple, its parts).
_MATMUL_FLOORS: dict = {}


def _ew_lists(combos, params: UpmemParams) -> tuple:
    """The parts of an elementwise op's lower bounds (:func:`_floor_s`) that depend on the DPU
    counts of ``combos`` alone, as lists of Python numbers (the values of the array methods of
    :class:`UpmemParams`): ``(DPUs, launch seconds, host->DPU and DPU->host transfer calls'
    seconds, host->DPU, DPU->host and broadcast bandwidths of the DPUs' ranks)``. Remembered
    for a memo's own workgroup tuple (:func:`_workgroups`): most ops share a dozen counts."""
    key = (id(combos), params_key(params))
    hit = _recalled(_EW_LISTS, key, combos)
    if hit is not None:
        return hit
    d, pr = _combos_arrays(combos)[0], params
    out = (d.tolist(), pr.launch_overhead_s_array(d).tolist(),
           pr._calls_array(d, pr.h2d_rank_s).tolist(), pr._calls_array(d, pr.d2h_rank_s).tolist(),
           pr._ranks_bw_array(d, pr.h2d_serial_bps, pr.h2d_rank_bps).tolist(),
           pr._ranks_bw_array(d, pr.d2h_serial_bps, pr.d2h_rank_bps).tolist(),
           pr._ranks_bw_array(d, pr.h2d_serial_bps, pr.bcast_rank_bps).tolist())
    return _remember(_EW_LISTS, key, combos, out)


#: Memo of :func:`_ew_lists`: key -> (the workgroup tuple, its lists).
_EW_LISTS: dict = {}


def _ew_transfers(combos, params: UpmemParams, n: int, unit: int, es: int, out_es: int,
                  streams: int) -> tuple:
    """The parts of an elementwise op's lower bounds (:func:`_floor_s`) that its size fixes,
    one entry per workgroup of ``combos``: ``(elements per DPU (its padded share of n >= 1
    elements in ``unit``-element words), seconds gathering the result (``out_es``-byte
    elements), seconds scattering its ``streams`` input streams (``es``-byte elements))``, in
    the operations of :meth:`UpmemParams.push_s_array` on the workgroups' DPU counts.
    Remembered for a memo's own workgroup tuple (:func:`_workgroups`) with the other
    arguments: a network's elementwise ops repeat their tensors' sizes."""
    key = (id(combos), params_key(params), n, unit, es, out_es, streams)
    hit = _recalled(_EW_TRANSFERS, key, combos)
    if hit is not None:
        return hit
    ds, _, calls_in, calls_out, bw_in, bw_out, _ = _ew_lists(combos, params)
    knee = params.host_knee_bytes
    small_in, large_in = params.h2d_host_small_bps, params.h2d_host_large_bps
    small_out, large_out = params.d2h_host_small_bps, params.d2h_host_large_bps
    n_dpus, push_out, push_in = [], [], []
    for i, d in enumerate(ds):
        per_dpu = -(-n // d)
        n_dpu = -(-per_dpu // unit) * unit  # _share of every count
        b = -(-(n_dpu * out_es) // 8) * 8  # the result gathered from each DPU
        head = min(b, knee)
        push_out.append(calls_out[i] + max(b * d / bw_out[i], d * (
            head / small_out + (b - head) / large_out)) if b > 0 else 0.0)
        b = streams * (-(-(n_dpu * es) // 8) * 8)  # the streams scattered to each
        head = min(b, knee)
        push_in.append(calls_in[i] + max(b * d / bw_in[i], d * (
            head / small_in + (b - head) / large_in)) if b > 0 else 0.0)
        n_dpus.append(n_dpu)
    return _remember(_EW_TRANSFERS, key, combos, (n_dpus, push_out, push_in))


#: Memo of :func:`_ew_transfers`: key -> (the workgroup tuple, its lists).
_EW_TRANSFERS: dict = {}


def _ew_broadcasts(combos, params: UpmemParams, bcast: int) -> list:
    """Seconds broadcasting ``bcast`` > 0 bytes to every DPU, one entry per workgroup of
    ``combos``, in the operations of :meth:`UpmemParams.broadcast_s_array`; remembered like
    :func:`_ew_transfers` (a normalization's Mul and Add broadcast the same bytes)."""
    key = (id(combos), params_key(params), bcast)
    hit = _recalled(_EW_BROADCASTS, key, combos)
    if hit is not None:
        return hit
    ds, _, calls_in, _, _, _, bw_bc = _ew_lists(combos, params)
    knee = params.host_knee_bytes
    small_in, large_in = params.h2d_host_small_bps, params.h2d_host_large_bps
    head = min(bcast, knee)
    out = [calls_in[i] + max(bcast * d / bw_bc[i], d * (
        head / small_in + (bcast - head) / large_in)) for i, d in enumerate(ds)]
    return _remember(_EW_BROADCASTS, key, combos, out)


#: Memo of :func:`_ew_broadcasts`: key -> (the workgroup tuple, its list).
_EW_BROADCASTS: dict = {}


def _floor_s(op: OpInfo, tasklets: int, params: UpmemParams, unit: tuple | None = None):
    """Lower bounds of the modeled latency of ``op``'s plans, as a function of a list of
    workgroups ``(dpus, column blocks)`` giving one bound (seconds) per workgroup, ``inf``
    for a grid a matrix product cannot have; or None for the kinds it does not cover (every
    term of :attr:`CostBreakdown.latency_s` is >= 0, so leaving terms out keeps a bound).
    Closed form, no plan: one launch (:meth:`UpmemParams.launch_overhead_s`), gathering each
    DPU's share of the result (:meth:`UpmemParams.push_s`), sending the inputs (an elementwise
    op's streams and broadcasts; Im2Col's input band; a matrix product's A rows when A is not
    a constant, scattered or broadcast as the grid has it: the other inputs only add bytes,
    and a transfer takes no less time for more bytes) and the kernel's instructions (the
    kernel takes at least one cycle per instruction of all tasklets and ``issue_interval``
    per instruction of the busiest; its DMA is left out): a matrix product's multiply-
    accumulates (:func:`_matvec_instr`) and output stores of each tasklet's rows and columns
    (:func:`_matmul_busiest`); Im2Col's windows per output row; an elementwise op's
    instructions per element of its share. A matrix product's workgroups are bounded in array
    operations (it has tens: DPU counts x column splits).
    ``unit``: :func:`_unit_geometry` of ``op`` when the caller has it."""
    dt = _dtype_name(op.inputs[0])
    es = _esize(dt)
    if unit is None:
        try:
            unit = _unit_geometry(op)
        except CinmError:
            return None
    kind, g = unit
    f, issue = params.frequency_hz, params.issue_interval
    if kind in ("gemv", "gemm", "simsearch"):
        rows, n, k, batched = g["rows"], g["n"], g["k"], g.get("b_batched", False)
        per_mac = k * _matvec_instr(dt, UNROLL) + 3  # instructions per output
        per = 8 // math.gcd(8, es)
        a_row = 0 if op.inputs[0].const else _cdiv(k, per) * per * es  # one padded A row, bytes

        knee, small, large = (params.host_knee_bytes, params.h2d_host_small_bps,
                              params.h2d_host_large_bps)

        def floor(combos: list) -> np.ndarray:
            d = _combos_arrays(combos)[0]
            ok, scattered, rows_dpu, most, launch, gather, (calls, bw, bw_bc) = \
                _matmul_floor_parts(combos, kind, rows, n, es, tasklets, batched, params)
            # max(x * per_mac, y * per_mac) is max(x, y) * per_mac (per_mac > 0, rounding is
            # monotone): the bound of the instructions of all tasklets and of the busiest one
            kernel = most * per_mac
            a_bytes = rows_dpu * a_row
            if a_row > 0 and rows > 0:  # every workgroup sends A (rows_dpu >= 1)
                # push_s_array's and broadcast_s_array's operations, their host part (the same
                # for both: bytes to the DPUs) and bytes x DPUs computed once
                head = np.minimum(a_bytes, knee)
                host = d * (head / small + (a_bytes - head) / large)
                moved = a_bytes * d
                send = np.where(scattered, calls + np.maximum(moved / bw, host),
                                calls + np.maximum(moved / bw_bc, host))
            else:
                send = np.where(scattered, params.push_s_array(a_bytes, d),
                                params.broadcast_s_array(a_bytes, d))
            out = launch + kernel / f + send + gather
            return np.where(ok, out, np.inf)
        return floor
    if kind == "im2col":
        conv = _op_im2col_conv(op, es)
        cg, ck_pad, oh, ow = conv[0], conv[2], conv[3], conv[4]
        n_img, chans, kh, sh, dh = cg["N"], cg["C"], cg["KH"], cg["SH"], cg["DH"]
        kw, sw, dw = cg["KW"], cg["SW"], cg["DW"]
        # a row's instructions: C * KH windows of KW taps (_cost_im2col's, the same ints)
        instr_row = chans * kh * (IM2COL_WIN_INSTR[0] * kw + IM2COL_WIN_INSTR[1])
        bounds: dict = {}  # DPUs that get work -> bound (the large counts give a few of them)

        def one(d: int) -> float:
            # the plan uses the DPUs that get work (make_plan): <= d; the split alone tells
            # how many. Its figures are _im2col_geometry's on that many DPUs, read straight
            # from their split: each gets NB x LB x CB output rows and NB x C x HB x WB inputs
            used = im2col_split(n_img, oh, ow, d)[3]
            hit = bounds.get(used)
            if hit is None:
                nb, lb, cb = im2col_split(n_img, oh, ow, used)[:3]
                rows = nb * lb * cb
                xs_bytes = _r8(nb * chans * im2col_halo(lb, kh, sh, dh)
                               * im2col_halo(cb, kw, sw, dw) * es) + 8
                kernel = max(rows * instr_row, issue * _cdiv(rows, tasklets) * instr_row)
                hit = bounds[used] = (params.launch_overhead_s(used) + kernel / f
                                      + params.push_s(xs_bytes, used)
                                      + params.push_s(_r8(rows * ck_pad * es), used,
                                                      to_dpu=False))
            return hit
        return lambda combos: [one(d) for d, _ in combos]
    if kind == "elementwise":
        instr = (g["streams"] + C.op_instructions(g["op"], dt) + 1 + 2 * g["wram_bcast"]
                 + C.LOOP_CONTROL / UNROLL)
        out_es = g.get("out_esize", es)
        unit = max(1, 8 // es) if 8 % es == 0 else 8  # W.share's, 8-byte words

        n, streams, bcast = max(g["n"], 1), g["streams"], g["bcast_bytes"]

        def floor_ew(combos: list) -> list:
            # every workgroup in Python floats: the same operations, in the same order, as the
            # array methods (push_s_array, broadcast_s_array, launch_overhead_s_array) of the
            # workgroups' DPU counts, so the same bounds; for a dozen workgroups the array
            # operations' fixed cost is most of the work. The transfers depend on the sizes
            # alone (_ew_transfers): ops of one size (a normalization's Mul, Add and Relu on
            # one tensor) share them
            launch = _ew_lists(combos, params)[1]
            n_dpus, push_out, push_in = _ew_transfers(combos, params, n, unit, es, out_es,
                                                      streams)
            bounds = [lo + nd * instr / f + po + pi
                      for lo, nd, po, pi in zip(launch, n_dpus, push_out, push_in)]
            if bcast:  # (a broadcast of no bytes takes no time: adds 0.0)
                bounds = [out + bc for out, bc in zip(bounds, _ew_broadcasts(combos, params,
                                                                            bcast))]
            return bounds
        return floor_ew
    return None


def _search_plan(op: OpInfo, max_dpus: int, tasklets: int, params: UpmemParams,
                 stack_bytes: int, dpus: int | None) -> CnmPlan:
    """The plan :func:`plan_op` chooses: of every workgroup (:func:`workgroups`), in their
    order, the first whose modeled latency is below the best before it by more than a relative
    1e-9. Planning every workgroup gives that plan; fewer are planned:

    * matrix products, Im2Col and elementwise ops have a closed-form lower bound per workgroup
      (:func:`_floor_s`): their workgroups are planned in the order of their bounds until the
      next bound exceeds the least latency found by more than a relative 1e-6, and the plan
      is chosen among those planned, in workgroup order, as above. A workgroup left out is
      slower than that least latency by more than 1e-6: it could only have been a best plan
      on the way, which the first plan within 1e-6 of the least latency replaces, so the
      choice is the same. A grid the product cannot have is not planned;
    * for the other kinds, every plan launches at least once and its other terms are >= 0, so
      a workgroup whose launch alone is no faster than the best plan so far cannot win and is
      not planned (row-norm plans may use fewer DPUs than asked, :func:`make_plan`, so theirs
      is checked after planning, by the DPUs they use).
    """
    if not op.inputs:
        raise CinmError(f"upmem: {op.op_type} {op.name!r} has no inputs")
    unit = _unit_geometry(op)
    combos = _workgroups(op, max_dpus, dpus, unit)
    floor = None if len(combos) < 2 else _floor_s(op, tasklets, params, unit)
    if floor is not None:
        bounds = floor(combos)
        if type(bounds) is not list:  # Python floats: compared often
            bounds = np.asarray(bounds, dtype=float).tolist()
        planned: dict = {}
        least = math.inf
        for i in sorted(range(len(combos)), key=bounds.__getitem__):
            if not bounds[i] <= least * (1 + 1e-6):  # the rest are larger (or no grid)
                break
            d, dc = combos[i]
            try:
                p = make_plan(op, d, tasklets, "cinm", params, stack_bytes, dc)
            except CinmError:
                continue
            least = min(least, p.cost().latency_s)
            planned[i] = p
        if not planned:  # the error planning every workgroup raises
            return _search_plan_all(op, max_dpus, tasklets, params, stack_bytes, combos)
        best, best_lat = None, 0.0
        for i in sorted(planned):
            lat = planned[i].cost().latency_s
            if best is None or lat < best_lat * (1 - 1e-9):
                best, best_lat = planned[i], lat
        return best
    shrinks = _KINDS.get(op.op_type) in ("im2col", "rownorm")
    best, best_lat, err = None, 0.0, None
    for d, dc in combos:
        if best is not None and not shrinks and params.launch_overhead_s(d) >= best_lat * (1 - 1e-9):
            continue
        try:
            p = make_plan(op, d, tasklets, "cinm", params, stack_bytes, dc)
        except CinmError as e:
            err = e
            continue
        if best is not None and params.launch_overhead_s(p.dpus) >= best_lat * (1 - 1e-9):
            continue
        lat = p.cost().latency_s
        if best is None or lat < best_lat * (1 - 1e-9):
            best, best_lat = p, lat
    if best is None:
        raise err
    return best


def _search_plan_all(op: OpInfo, max_dpus: int, tasklets: int, params: UpmemParams,
                     stack_bytes: int, combos: list) -> CnmPlan:
    """Plan every workgroup of ``combos``; raises the last failure if none fits."""
    err = None
    for d, dc in combos:
        try:
            make_plan(op, d, tasklets, "cinm", params, stack_bytes, dc)
        except CinmError as e:
            err = e
    raise err
