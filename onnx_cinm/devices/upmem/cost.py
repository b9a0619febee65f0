"""UPMEM cost model: cycles, seconds, bytes and (estimated) joules of one DPU kernel launch.

Every device constant below names its source. Sources (ids as in ``shared/field-notes/upmem.md``):

* **PrIM** -- Gomez-Luna et al., "Benchmarking a New Paradigm: Experimental Analysis and
  Characterization of a Real Processing-in-Memory System", IEEE Access 10:52565 (2022),
  arXiv:2105.03814, §3 (its microbenchmarks ``Arithmetic-Throughput``, ``MRAM-Latency``,
  ``CPU-DPU``) and Table 1 (system), as summarised in ``shared/field-notes/upmem.md`` §1.1 and
  §1.5. We cite sections and microbenchmarks, not figure numbers, except the arithmetic
  throughput figure the notes name (Fig. 4). Values the notes mark "(recalled -- verify against
  the PDF)" are marked *recalled* here.
* **uPIMulator** -- Hyun et al., HPCA 2024, defaults of ``VIA-Research/uPIMulator`` (11-cycle
  revolver scheduling, 14 pipeline stages).
* **SDK** -- UPMEM SDK documentation 2025.1.0 (WRAM 64 KB, DMA 8..2048 B, <= 24 tasklets).

The model (field notes §4.3, stated here in full so a reader can redo every number by hand):

* **Pipeline.** One tasklet issues at most one instruction every ``issue_interval`` = 11 cycles,
  the DPU at most one per cycle. A kernel whose tasklets execute ``I_t`` instructions each, with
  ``T`` tasklets, needs at least ``sum_t I_t`` cycles (pipeline bound) and at least
  ``11 * max_t I_t`` cycles (one tasklet's chain); so >= 11 tasklets reach 1 instruction/cycle.
* **Instructions per element** come from PrIM's measured arithmetic throughput (Fig. 4): its
  microbenchmark loop runs ``f / MOPS`` instructions per element at f = 350 MHz; the loop is one
  WRAM load, the operation, one WRAM store and 3 loop-control instructions (index update,
  compare-and-branch; PrIM §3 counts 6 instructions for INT32 ADD), so the operation itself
  costs ``round(350 / MOPS) - 5`` instructions: INT32 add 1, INT32 mul 29 (a ``mul_step``
  sequence), INT64 add 2, FLOAT add 66 (software emulated), ...
* **MRAM DMA.** A transfer of ``b`` bytes occupies the DPU's DMA engine ``alpha + beta * b``
  cycles, alpha = 77 (read) / 61 (write), beta = 0.5 cycles/byte (PrIM §3, MRAM-Latency). Transfers
  of one DPU are serialized; DMA and the pipeline overlap across tasklets, so
  ``kernel = max(DMA total, pipeline bound, slowest tasklet chain) + serial sections``.
* **Host transfers** (calibrated on measured UPMEM servers; ``benchmarks/upmem_calibration.py``
  prints every measurement next to the model): a parallel ``dpu_push_xfer`` of ``b`` bytes to
  each of ``d`` DPUs on ``r = ceil(d / 64)`` ranks takes
  ``call + r * per_rank + max(b * d / (ranks' bandwidth), host_s(b, d))``: a fixed cost per
  call, a fixed cost per rank (the host thread and the transposition set-up of every rank),
  and the bytes at the slower of what the ranks take (a rank partly used gets a power law
  between one DPU and a full rank) and what the host can move in total, which saturates far
  below linear scaling in ranks (32 ranks move 24.3 GB/s to the DPUs, not 32 x a rank's) and
  is lower for small per-DPU chunks. Broadcasts use the same shape. The constants, and which measurement each one comes from, are listed in
  :class:`UpmemParams`.
* **Launch** ``launch_s + launch_per_rank_s * ranks`` (an empty launch on 4 ranks: 183 us) and
  **program load** (``program_load_s`` per DPU program, charged once per kernel, not per
  inference: 40-80 ms, Cinnamon's measurement).
* **Energy** constants are *estimates* (no published table gives them); they are parameters,
  marked as such.

Units: cycles (DPU clock), seconds, bytes, joules.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

#: Clock at which PrIM measured the arithmetic throughputs below, Hz (PrIM Table 1: 350 MHz).
PRIM_FREQUENCY_HZ = 350e6

#: PrIM Fig. 4 (via field notes §1.5, *recalled*): arithmetic throughput in MOPS of one DPU with
#: >= 11 tasklets, by (dtype class, operation).
PRIM_MOPS = {
    ("int32", "add"): 58.56, ("int32", "sub"): 58.45, ("int32", "mul"): 10.27, ("int32", "div"): 11.27,
    ("int64", "add"): 50.16, ("int64", "sub"): 50.16, ("int64", "mul"): 2.56, ("int64", "div"): 1.40,
    ("float32", "add"): 4.91, ("float32", "sub"): 4.59, ("float32", "mul"): 1.91, ("float32", "div"): 0.34,
    ("float64", "add"): 3.32, ("float64", "sub"): 3.11, ("float64", "mul"): 0.53, ("float64", "div"): 0.16,
}

#: Non-arithmetic instructions of PrIM's throughput loop: WRAM load, WRAM store and 3 loop-control
#: instructions (PrIM §3: the INT32 ADD loop is 6 instructions, one of them the add).
PRIM_LOOP_BODY = 5
#: Loop-control instructions per iteration (index update, compare, branch), part of the 5 above.
LOOP_CONTROL = 3


def _from_mops(dt: str, op: str) -> int:
    return round(PRIM_FREQUENCY_HZ / 1e6 / PRIM_MOPS[(dt, op)]) - PRIM_LOOP_BODY


#: Instructions of one operation (excluding loads, stores and loop control), by dtype class.
#: add/sub/mul/div: derived from PRIM_MOPS (see the module docstring). Others:
#:   - int32 max/min/compare: compare-and-branch + move = 2 (field notes §4.3 "compare+select ~ 2");
#:     int64: twice the words = 4 (estimate, by analogy with add 1 -> 2);
#:   - float compare/max/min: 10 (estimate: the soft-float comparison is an integer compare of the
#:     sign-magnitude words plus fix-ups, far cheaper than an add);
#:   - relu/abs/neg: int32 2 (compare-branch + move/negate), int64 4, float 2 (sign-bit test);
#:   - shift/and (bin index by a power of two, predicates): 1 for 32-bit, 2 for 64-bit;
#:   - popcount: 1 per 32-bit word (estimate: the DPU ISA has a count-ones instruction);
#:   - exp/log/sqrt/sigmoid/tanh: 20 float operations (estimate: a polynomial of ~10 mul+add).
#:   - expf, erf, gelu, gelu_tanh: the float32 helpers of the generated kernels (``_common.j2``
#:     ``emu_expf``/``emu_erff``/``emu_gelu``/``emu_gelu_tanh``), counted operation by operation
#:     in :data:`FLOAT_HELPER_OPS` and priced with PrIM's measured float add/mul/div; a float
#:     compare or float<->int conversion costs a float compare (10, estimate above), an integer
#:     bit operation 1.
#: Operations of the float32 helpers of the generated kernels, counted in their C source
#: (``templates/upmem/_common.j2``): ``emu_expf`` (Cody-Waite reduction by ln 2, Taylor to r^7,
#: 2^k by exponent bits in two steps), ``emu_erff`` (Abramowitz & Stegun 7.1.26, one expf),
#: ``emu_gelu`` (x / 2 * (1 + erf(x / sqrt 2))), ``emu_gelu_tanh`` (tanh by one expf).
FLOAT_HELPER_OPS = {
    "expf": {"mul": 12, "add": 10, "cmp": 6, "int": 8},
    "erf": {"expf": 1, "div": 1, "mul": 8, "add": 6, "cmp": 2, "int": 2},
    "gelu": {"erf": 1, "mul": 3, "add": 1},
    "gelu_tanh": {"expf": 1, "div": 1, "mul": 6, "add": 3, "cmp": 2},
}


def op_instructions(op: str, dtype: str) -> int:
    """Instructions one ``op`` costs on one element of ``dtype`` on a DPU (no loads/stores/loop).

    Args:
        op: ``add sub mul div max min cmp relu abs neg shift popcount exp log sqrt sigmoid tanh
            leakyrelu hardsigmoid clip expf erf gelu gelu_tanh``.
        dtype: a numpy dtype name (``int8`` .. ``uint64``, ``float32``, ``float64``, ``bool``).
    Returns:
        instructions (int). Narrow integers cost as int32 (the DPU is a 32-bit core).
    """
    dt = dtype_class(dtype)
    if op in ("add", "sub", "mul", "div"):
        return _from_mops(dt, op)
    wide = dt in ("int64", "float64")
    flt = dt in ("float32", "float64")
    if op in ("max", "min", "cmp"):
        return 10 * (2 if wide else 1) if flt else (4 if wide else 2)
    if op in ("relu", "abs", "neg"):
        return 2 if flt else (4 if wide else 2)
    if op in ("shift", "and"):
        return 2 if wide else 1
    if op == "popcount":
        return 2 if wide else 1
    if op in ("exp", "log", "sqrt", "sigmoid", "tanh"):
        return 10 * (_from_mops(dt if flt else "float32", "mul") + _from_mops(dt if flt else "float32", "add"))
    if op in ("leakyrelu", "hardsigmoid", "clip"):
        return op_instructions("mul", dtype) + op_instructions("max", dtype) + op_instructions("min", dtype)
    if op in FLOAT_HELPER_OPS:
        return sum(n * (1 if what == "int" else op_instructions(what, "float32"))
                   for what, n in FLOAT_HELPER_OPS[op].items())
    raise ValueError(f"no instruction cost for op {op!r}")


def dtype_class(dtype: str) -> str:
    """``int32`` for integers up to 32 bits (and bool), ``int64``, ``float32`` or ``float64``."""
    d = str(dtype)
    if d in ("float32", "float16", "bfloat16"):
        return "float32"
    if d == "float64":
        return "float64"
    if d in ("int64", "uint64"):
        return "int64"
    return "int32"


#: Arrays of :class:`UpmemParams` that depend on an array of DPU counts and a few figures only
#: (ranks, the ranks' bandwidths), by those figures and the counts: the mapping's lower bounds
#: (``mapping._floor_s``) ask for the same counts (powers of two up to 2048) for every op.
_D_ARRAYS: dict = {}


def _d_array(what: tuple, dpus, make):
    """``make()``, an array computed from the integer array ``dpus`` and the figures named in
    ``what``, remembered under both (read-only: the callers only compute new arrays from it)."""
    key = (what, dpus.dtype.str, dpus.shape, dpus.tobytes())
    hit = _D_ARRAYS.get(key)
    if hit is None:
        if len(_D_ARRAYS) > 1024:
            _D_ARRAYS.clear()
        hit = np.asarray(make())
        hit.flags.writeable = False
        _D_ARRAYS[key] = hit
    return hit


#: :meth:`UpmemParams._ranks_bw` by ``(DPUs, one, rank, DPUs per rank)``.
_RANKS_BW: dict = {}

#: :meth:`UpmemParams._bw_exponent` by ``(one, rank, DPUs per rank)``: a pure function of the
#: three numbers (a handful of pairs per DPU generation), so shared by every parameter object.
_BW_EXPONENTS: dict = {}


@dataclass(frozen=True)
class UpmemParams:
    """The UPMEM device's parameters, one DPU generation (:data:`TARGETS`): what the cost model,
    the mapping, the mapping search, the code generator and the device read (nothing else
    writes these figures down). Each with its unit and source.

    Attributes:
        name: the generation (option ``upmem_target``): ``v1a`` or ``v1b``.
        dpus: DPUs a kernel may use at most unless option ``upmem_dpus`` says otherwise: 2048
            (our default: 32 ranks, the largest power of two of PrIM's system).
        max_dpus: DPUs of the largest system a kernel is generated for: 2,560 (PrIM Table 1:
            2,560 DPUs, 2,556 of them working).
        tasklets: tasklets per DPU unless option ``upmem_tasklets`` says otherwise: 16
            (>= 11 fill the pipeline, PrIM §3; our choice).
        dtypes: element types the DPU kernels handle (integers natively; float32 emulated in
            software; ``codegen.DTYPES``).
        frequency_hz: DPU clock, Hz (350e6 on the 2,556-DPU system; PrIM Table 1).
        issue_interval: cycles between two instructions of one tasklet: 11 (PrIM §3;
            uPIMulator ``num_revolver_scheduling_cycles = 11``).
        dma_alpha_read, dma_alpha_write: fixed MRAM->WRAM / WRAM->MRAM DMA cost, cycles:
            77 / 61 (PrIM §3, MRAM-Latency microbenchmark).
        dma_beta: DMA cost per byte, cycles/byte: 0.5 (PrIM §3, MRAM-Latency; 2 B/cycle = 700 MB/s peak).
        dma_min, dma_max: DMA size limits, bytes: 8 and 2048, multiples of 8 (SDK ``mram.h``).
        wram_bytes: WRAM per DPU, bytes (65,536; SDK; PrIM Table 1).
        mram_bytes: MRAM per DPU, bytes (64 MiB; SDK; PrIM Table 1).
        max_tasklets: most tasklets per DPU: 24 (SDK ``dpu.lds`` asserts NR_TASKLETS <= 24).
        dpus_per_rank: DPUs per rank: 64 (8 chips x 8 DPUs; PrIM §2, field notes §1.1).
        h2d_serial_bps: CPU->DPU bandwidth of one DPU, bytes/s: 0.1865e9, the middle of the
            0.177-0.196 GB/s PrIM's repository raw logs show for 4-8 MiB (CPU-DPU
            microbenchmark, as quoted in issue 14; the paper's 0.33 GB/s is not what its logs
            show). *Quoted*, not re-read here.
        d2h_serial_bps: DPU->CPU bandwidth of one DPU, bytes/s: 0.12e9 (PrIM §3 via field notes
            §1.5, *recalled*, **unverified**: no raw log seen).
        h2d_rank_bps, d2h_rank_bps: parallel transfer bandwidth of one full rank (64 DPUs),
            bytes/s: 1.82963e9 / 1.07288e9, solved from an UPMEM server moving 64 KiB to (from)
            each of 256 DPUs on 4 ranks in 2351 us (4018 us) (issue 14, *quoted*: the log was
            not re-read here), given the fixed costs below. PrIM's 6.68 / 4.74 GB/s per rank
            (field notes §1.5) are not used: they disagree with these server measurements.
        h2d_host_small_bps, h2d_host_large_bps, d2h_host_small_bps, d2h_host_large_bps: the
            most the host moves over all ranks at once, bytes/s, for the first
            ``host_knee_bytes`` of every DPU's share and for the rest: 16.0864e9 / 26.5069e9
            to the DPUs, 9.30122e9 / 12.37644e9 from them. Solved, with the per-rank costs
            below, from three sizes of one sweep on 32 ranks x 64 DPUs
            (Loremkang/upmem-sdk-light ``results/UPMEM_1.txt``, the SDK's ``dpu_push_xfer``):
            send 0.56379 / 8.77697 / 44.2215 ms and receive 1.05933 / 15.2639 / 91.1763 ms at
            1 / 64 / 512 KiB per DPU (24.3 GB/s to and 11.8 GB/s from the DPUs at 512 KiB).
            The host moves small per-DPU chunks less efficiently than large ones; the knee at
            64 KiB is a measured size of that sweep (a fitting choice, *not* a hardware
            constant); the other sizes of the sweep are held out and printed by
            ``benchmarks/upmem_calibration.py``.
        host_knee_bytes: see above: 65,536.
        bcast_rank_bps: ``dpu_broadcast_to`` one rank, bytes delivered/s: 16.88e9 (PrIM §3,
            CPU-DPU, *recalled*, **unverified**), host-limited like a push.
        xfer_call_s: fixed host cost of one transfer call, seconds: 5e-6 (*estimate*,
            **unverified**: PrIM's 8-byte transfers are latency bound at microseconds).
        h2d_rank_s, d2h_rank_s: fixed cost per rank of one parallel transfer, seconds: 13.388e-6
            / 25.9018e-6, the intercept of the same 32-rank sweep minus ``xfer_call_s``, over
            32 ranks.
        launch_s: fixed cost of one ``dpu_launch(DPU_SYNCHRONOUS)``, seconds: 20e-6
            (*estimate*, **unverified**: the split between the fixed and the per-rank part).
        launch_per_rank_s: launch cost per rank (boot and poll every rank), seconds: 40.75e-6,
            so that an empty launch on 4 ranks costs the measured 183 us (issue 14, *quoted*).
        program_load_s: ``dpu_load`` of one DPU program on the allocated DPUs, seconds: 60e-3,
            the middle of the 40-80 ms Cinnamon measured (as quoted in issue 14, *quoted*);
            charged once per kernel (``CostBreakdown.load_s``), never per inference.
        host_merge_bps: host-side merge throughput (summing partials, compacting), bytes/s read:
            5e9 (*estimate*: one core streaming through memory).
        dpu_power_w: power of one busy DPU, watts: 0.12 (*estimate*: no per-DPU power figure in our
            sources; PrIM measured energy only on its 640-DPU system and reports ratios).
        dpu_idle_power_w: power of an allocated DPU waiting for the host, watts: 0.03 (*estimate*).
        host_xfer_j_per_byte: energy per byte moved between host and MRAM, joules: 20e-12
            (*estimate*: the order of a DDR4 DIMM access per byte; no UPMEM figure published).
        host_power_w: host CPU power while it merges or drives transfers, watts: 30 (*estimate*).
    """

    name: str = "v1a"
    dpus: int = 2048
    max_dpus: int = 2560
    tasklets: int = 16
    dtypes: tuple = ("float32", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "bool")
    frequency_hz: float = 350e6
    issue_interval: int = 11
    dma_alpha_read: float = 77.0
    dma_alpha_write: float = 61.0
    dma_beta: float = 0.5
    dma_min: int = 8
    dma_max: int = 2048
    wram_bytes: int = 65536
    mram_bytes: int = 64 * 2**20
    max_tasklets: int = 24
    dpus_per_rank: int = 64
    h2d_serial_bps: float = 0.1865e9
    d2h_serial_bps: float = 0.12e9
    h2d_rank_bps: float = 1.82963e9
    d2h_rank_bps: float = 1.07288e9
    h2d_host_small_bps: float = 16.0864e9
    h2d_host_large_bps: float = 26.5069e9
    d2h_host_small_bps: float = 9.30122e9
    d2h_host_large_bps: float = 12.37644e9
    host_knee_bytes: int = 65536
    bcast_rank_bps: float = 16.88e9
    xfer_call_s: float = 5e-6
    h2d_rank_s: float = 13.388e-6
    d2h_rank_s: float = 25.9018e-6
    launch_s: float = 20e-6
    launch_per_rank_s: float = 40.75e-6
    program_load_s: float = 60e-3
    host_merge_bps: float = 5e9
    dpu_power_w: float = 0.12
    dpu_idle_power_w: float = 0.03
    host_xfer_j_per_byte: float = 20e-12
    host_power_w: float = 30.0

    # -- DMA -----------------------------------------------------------------------------------
    def dma_cycles(self, nbytes: int, write: bool = False) -> float:
        """Cycles one ``mram_read`` (or ``mram_write``) of ``nbytes`` occupies the DMA engine:
        ``alpha + 0.5 * nbytes`` (PrIM §3, MRAM-Latency)."""
        return (self.dma_alpha_write if write else self.dma_alpha_read) + self.dma_beta * nbytes

    def stream_dma_cycles(self, nbytes: int, block: int, write: bool = False) -> float:
        """Cycles to stream ``nbytes`` through MRAM in DMA transfers of ``block`` bytes (the last
        one shorter, rounded up to 8 bytes)."""
        if nbytes <= 0:
            return 0.0
        full, rest = divmod(nbytes, block)
        c = full * self.dma_cycles(block, write)
        if rest:
            c += self.dma_cycles(-(-rest // 8) * 8, write)
        return c

    # -- host <-> DPU ----------------------------------------------------------------------------
    def _rank_bw(self, d: int, one: float, rank: float) -> float:
        """Bandwidth of a parallel transfer to ``d`` DPUs of one rank: a power law through
        ``one`` (1 DPU) and ``rank`` (64 DPUs), bytes/s (interpolation between PrIM's points)."""
        if d <= 0:
            return one
        return one * min(d, self.dpus_per_rank) ** self._bw_exponent(one, rank)

    def _bw_exponent(self, one: float, rank: float) -> float:
        """The exponent of :meth:`_rank_bw`'s power law, ``log(rank / one) / log(64)``, computed
        once per pair of bandwidths (every transfer the mapping prices asks for it)."""
        key = (one, rank, self.dpus_per_rank)
        k = _BW_EXPONENTS.get(key)
        if k is None:
            k = _BW_EXPONENTS[key] = math.log(rank / one) / math.log(self.dpus_per_rank)
        return k

    def _ranks_bw(self, dpus: int, one: float, rank: float) -> float:
        """Bandwidth of ``dpus`` DPUs' ranks working in parallel: full ranks at ``rank``, a
        partial one on the power law (:meth:`_rank_bw`), bytes/s. A pure function of the four
        numbers, remembered by them (every transfer priced asks; a few DPU counts recur)."""
        key = (dpus, one, rank, self.dpus_per_rank)
        bw = _RANKS_BW.get(key)
        if bw is None:
            if len(_RANKS_BW) > 4096:
                _RANKS_BW.clear()
            full, rest = divmod(dpus, self.dpus_per_rank)
            bw = _RANKS_BW[key] = full * rank + (self._rank_bw(rest, one, rank) if rest else 0.0)
        return bw

    def _host_s(self, bytes_per_dpu: float, dpus: int, to_dpu: bool) -> float:
        """Seconds the host needs to move ``bytes_per_dpu`` to (from) each of ``dpus`` DPUs
        at its own limit, whatever the ranks could take: the first ``host_knee_bytes`` of
        every share at the small-chunk bandwidth, the rest at the large-chunk one."""
        small, large = ((self.h2d_host_small_bps, self.h2d_host_large_bps) if to_dpu
                        else (self.d2h_host_small_bps, self.d2h_host_large_bps))
        head = min(bytes_per_dpu, self.host_knee_bytes)
        return dpus * (head / small + (bytes_per_dpu - head) / large)

    def ranks(self, dpus: int) -> int:
        """Ranks spanned by ``dpus`` DPUs (64 per rank)."""
        return max(1, -(-dpus // self.dpus_per_rank))

    def push_s(self, bytes_per_dpu: int, dpus: int, to_dpu: bool = True) -> float:
        """Seconds of a parallel ``dpu_prepare_xfer`` + ``dpu_push_xfer`` moving ``bytes_per_dpu``
        to (or from) each of ``dpus`` DPUs: ``xfer_call_s + ranks * h2d_rank_s`` (or
        ``d2h_rank_s``) plus the bytes at the slower of the ranks' bandwidth and the host's
        limit (:meth:`_host_s`)."""
        if bytes_per_dpu <= 0 or dpus <= 0:
            return 0.0
        # _ranks_bw (its memo read here first), _host_s and ranks inline, in their operations:
        # the cost model and the lower bounds price thousands of transfers per network
        if to_dpu:
            one, rank, per_rank = self.h2d_serial_bps, self.h2d_rank_bps, self.h2d_rank_s
            small, large = self.h2d_host_small_bps, self.h2d_host_large_bps
        else:
            one, rank, per_rank = self.d2h_serial_bps, self.d2h_rank_bps, self.d2h_rank_s
            small, large = self.d2h_host_small_bps, self.d2h_host_large_bps
        dpr = self.dpus_per_rank
        bw = _RANKS_BW.get((dpus, one, rank, dpr))
        if bw is None:
            bw = self._ranks_bw(dpus, one, rank)
        head = min(bytes_per_dpu, self.host_knee_bytes)
        move = max(bytes_per_dpu * dpus / bw,
                   dpus * (head / small + (bytes_per_dpu - head) / large))
        return self.xfer_call_s + per_rank * max(1, -(-dpus // dpr)) + move

    def broadcast_s(self, nbytes: int, dpus: int) -> float:
        """Seconds of ``dpu_broadcast_to`` of ``nbytes`` to each of ``dpus`` DPUs (bytes
        delivered at the ranks' broadcast bandwidth, host-limited like a push)."""
        if nbytes <= 0 or dpus <= 0:
            return 0.0
        # inline like push_s
        dpr = self.dpus_per_rank
        bw = _RANKS_BW.get((dpus, self.h2d_serial_bps, self.bcast_rank_bps, dpr))
        if bw is None:
            bw = self._ranks_bw(dpus, self.h2d_serial_bps, self.bcast_rank_bps)
        head = min(nbytes, self.host_knee_bytes)
        move = max(nbytes * dpus / bw, dpus * (head / self.h2d_host_small_bps
                                               + (nbytes - head) / self.h2d_host_large_bps))
        return self.xfer_call_s + self.h2d_rank_s * max(1, -(-dpus // dpr)) + move

    def serial_s(self, nbytes: int, to_dpu: bool = True) -> float:
        """Seconds of one serial ``dpu_copy_to`` / ``dpu_copy_from`` of ``nbytes`` (one DPU)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.h2d_serial_bps if to_dpu else self.d2h_serial_bps) + self.xfer_call_s

    def launch_overhead_s(self, dpus: int) -> float:
        """Seconds of one synchronous launch beyond the kernel itself: ``launch_s +
        launch_per_rank_s * ranks`` (183 us on 4 ranks, measured)."""
        return self.launch_s + self.launch_per_rank_s * max(1, -(-dpus // self.dpus_per_rank))

    # -- the same over arrays: many workgroups at once ------------------------------------------
    # :meth:`push_s`, :meth:`broadcast_s` and :meth:`launch_overhead_s` of numpy arrays of byte
    # and DPU counts (the mapping's lower bounds rank every workgroup of an op in a few array
    # operations, ``mapping._floor_s``); tests/test_cnm_mapping.py checks that they agree with
    # the scalar methods. Change both together.
    def ranks_array(self, dpus):
        """:meth:`ranks` of an integer array (read-only: remembered per array of counts)."""
        dpr = self.dpus_per_rank
        return _d_array(("ranks", dpr), dpus, lambda: np.maximum(1, -(-dpus // dpr)))

    def _ranks_bw_array(self, dpus, one: float, rank: float):
        """:meth:`_ranks_bw` of an integer array (read-only: remembered per array of counts)."""
        dpr = self.dpus_per_rank

        def make():
            full, rest = np.divmod(dpus, dpr)
            k = self._bw_exponent(one, rank)
            return full * rank + np.where(rest > 0, one * np.maximum(rest, 1) ** k, 0.0)
        return _d_array(("bw", one, rank, dpr), dpus, make)

    def _host_s_array(self, bytes_per_dpu, dpus, to_dpu: bool):
        small, large = ((self.h2d_host_small_bps, self.h2d_host_large_bps) if to_dpu
                        else (self.d2h_host_small_bps, self.d2h_host_large_bps))
        head = np.minimum(bytes_per_dpu, self.host_knee_bytes)
        return dpus * (head / small + (bytes_per_dpu - head) / large)

    def push_s_array(self, bytes_per_dpu, dpus, to_dpu: bool = True):
        """:meth:`push_s` of arrays (``dpus`` >= 1), seconds."""
        if to_dpu:
            one, rank, per_rank = self.h2d_serial_bps, self.h2d_rank_bps, self.h2d_rank_s
        else:
            one, rank, per_rank = self.d2h_serial_bps, self.d2h_rank_bps, self.d2h_rank_s
        move = np.maximum(bytes_per_dpu * dpus / self._ranks_bw_array(dpus, one, rank),
                          self._host_s_array(bytes_per_dpu, dpus, to_dpu))
        return np.where(bytes_per_dpu > 0, self._calls_array(dpus, per_rank) + move, 0.0)

    def _calls_array(self, dpus, per_rank: float):
        """``xfer_call_s + per_rank * ranks`` of an integer array: the part of a transfer that
        depends on the DPU counts alone (read-only: remembered per array of counts)."""
        return _d_array(("calls", self.xfer_call_s, per_rank, self.dpus_per_rank), dpus,
                        lambda: self.xfer_call_s + per_rank * self.ranks_array(dpus))

    def broadcast_s_array(self, nbytes, dpus):
        """:meth:`broadcast_s` of arrays (``dpus`` >= 1), seconds."""
        move = np.maximum(nbytes * dpus / self._ranks_bw_array(dpus, self.h2d_serial_bps,
                                                               self.bcast_rank_bps),
                          self._host_s_array(nbytes, dpus, True))
        return np.where(nbytes > 0, self._calls_array(dpus, self.h2d_rank_s) + move, 0.0)

    def launch_overhead_s_array(self, dpus):
        """:meth:`launch_overhead_s` of an integer array, seconds (read-only: remembered per
        array of counts)."""
        return _d_array(("launch", self.launch_s, self.launch_per_rank_s, self.dpus_per_rank),
                        dpus, lambda: self.launch_s + self.launch_per_rank_s
                        * self.ranks_array(dpus))


DEFAULT_PARAMS = UpmemParams()

#: Selectable DPU generations (option ``upmem_target``), by :attr:`UpmemParams.name`. ``v1a``:
#: the chips of PrIM's 2,556-DPU system (350 MHz, 24 tasklets, 64 KB WRAM): :data:`DEFAULT_PARAMS`.
#: ``v1b``: the newer chip,
#: at most 16 tasklets (``DPU_NR_THREADS_V1B``) and 63,488 B of WRAM (``DPU_WRAM_SIZE_V1B``),
#: upmem/llvm-project ``DPUCharacteristics.h`` as the DPU linker driver uses them
#: (``clang/lib/Driver/ToolChains/DPURTE.cpp`` passes them as ``--defsym``), and 400 MHz (SDK
#: documentation 2025.1 chip table, field notes upmem.md §1.1). Host transfers and per-operation
#: instruction counts are the v1A measurements: no v1B system has published figures (*unverified*
#: for v1B).
TARGETS = {
    "v1a": DEFAULT_PARAMS,
    "v1b": replace(DEFAULT_PARAMS, name="v1b", frequency_hz=400e6, wram_bytes=63488,
                   max_tasklets=16),
}


@dataclass(frozen=True)
class KernelWork:
    """What one DPU does in one launch: the input to :func:`kernel_cycles`.

    Attributes:
        tasklets: tasklets per DPU (1..``UpmemParams.max_tasklets``).
        instr_per_tasklet: instructions of the busiest tasklet in the parallel phase.
        instr_total: instructions of all tasklets together in the parallel phase.
        dma_cycles: DMA-engine cycles of the DPU in the parallel phase (all tasklets).
        dma_cycles_per_tasklet: DMA cycles of the busiest tasklet (its own chain).
        serial_cycles: cycles of phases where tasklets wait on each other (critical sections,
            handshakes, barriers, tree merges); added, not overlapped.
        serial_dma_cycles: DMA cycles in those serial phases (added to DMA, not overlapped).
    """

    tasklets: int
    instr_per_tasklet: float
    instr_total: float
    dma_cycles: float
    dma_cycles_per_tasklet: float
    serial_cycles: float = 0.0
    serial_dma_cycles: float = 0.0


@dataclass(frozen=True)
class PhasedWork:
    """One launch whose tasklets meet at barriers of all tasklets: the work between two
    barriers (a phase) cannot overlap the work of the next one, so every phase is bounded on
    its own (:func:`kernel_cycles`) and the phases add up, as the emulator closes a phase at
    every barrier. The barriers themselves are the caller's serial cycles.

    Attributes:
        phases: ``((count, KernelWork), ...)``: each distinct phase and how many times it runs.
    """

    phases: tuple


def kernel_cycles(w: KernelWork | PhasedWork, params: UpmemParams = DEFAULT_PARAMS) -> dict:
    """Cycles of one DPU kernel, with the bound that decided it.

    ``parallel = max(instr_total, issue_interval * instr_per_tasklet + dma_per_tasklet, dma)``:
    the pipeline issues at most one instruction per cycle, one tasklet at most one every 11
    cycles and it waits for its own DMAs, the DMA engine serves one transfer at a time.
    ``total = parallel + serial_cycles + serial_dma_cycles``.

    A :class:`PhasedWork` sums its phases' figures (each phase counted as often as it runs);
    its bound is the bound of the phase that takes the most cycles in all.

    Returns:
        ``{"compute": pipeline-bound cycles, "chain": slowest tasklet chain, "dma": DMA cycles,
        "parallel": max of the three, "serial": serial cycles, "total": cycles, "bound": name}``.
    """
    if isinstance(w, PhasedWork):
        keys = ("compute", "chain", "dma", "parallel", "serial", "total")
        out = dict.fromkeys(keys, 0.0)
        heaviest, bound = -1.0, "none"
        for count, work in w.phases:
            c = kernel_cycles(work, params)
            for k in keys:
                out[k] += count * c[k]
            if count * c["total"] > heaviest:
                heaviest, bound = count * c["total"], c["bound"]
        out["bound"] = bound
        return out
    compute = float(w.instr_total)
    chain = params.issue_interval * w.instr_per_tasklet + w.dma_cycles_per_tasklet
    dma = float(w.dma_cycles)
    parallel = max(compute, chain, dma)
    bound = "dma" if parallel == dma else ("compute" if parallel == compute else "tasklet-chain")
    serial = w.serial_cycles + w.serial_dma_cycles
    return {"compute": compute, "chain": chain, "dma": dma, "parallel": parallel,
            "serial": serial, "total": parallel + serial, "bound": bound}


@dataclass(frozen=True)
class CostBreakdown:
    """Modeled cost of one op on UPMEM, one inference, split by where the time goes.

    Times in seconds, energies in joules, bytes in bytes, cycles in DPU cycles.

    Attributes:
        dpus, tasklets: the workgroup the numbers are for.
        kernel_cycles: cycles of the DPU kernel(s) (all launches; the slowest DPU).
        compute_s: pipeline-bound part of the kernel (instructions at <= 1 per cycle), seconds.
        dma_s: MRAM<->WRAM DMA time of the kernel, seconds.
        kernel_s: the kernel as modeled (max of compute, tasklet chain and DMA, plus the serial
            in-DPU sections such as the WRAM merge tree), seconds.
        dpu_merge_s: the serial in-DPU merge/synchronisation part of ``kernel_s``, seconds.
        host_in_s: CPU->DPU transfers (scatter and broadcast), seconds.
        host_out_s: DPU->CPU transfers of results (and their assembly on the host, e.g. the
            compaction of variable-length selections), seconds.
        partials_out_s: DPU->CPU transfers of partial results to be merged, seconds.
        merge_s: host-side merge of per-DPU partial results, seconds.
        launch_s: launch overheads, seconds.
        load_s: one-time cost: the DPU program load plus the transfer of constant inputs
            (weights) kept resident in MRAM across
            inferences, seconds (not part of ``latency_s``).
        resident_bytes: bytes of those constant inputs over all DPUs.
        bytes_in, bytes_out: bytes moved host->DPUs and DPUs->host (including padding).
        mram_bytes_per_dpu: MRAM footprint of one DPU, bytes.
        launches: kernel launches.
        bound: what limits the kernel: ``dma``, ``compute`` or ``tasklet-chain``.
        energy_j: modeled energy per inference, joules (*estimate*, see :class:`UpmemParams`).
        load_j: modeled energy of the one-time load (``load_s``), joules (*estimate*).
    """

    dpus: int
    tasklets: int
    kernel_cycles: float
    compute_s: float
    dma_s: float
    kernel_s: float
    dpu_merge_s: float
    host_in_s: float
    host_out_s: float
    partials_out_s: float
    merge_s: float
    launch_s: float
    load_s: float
    resident_bytes: int
    bytes_in: int
    bytes_out: int
    mram_bytes_per_dpu: int
    launches: int
    bound: str
    energy_j: float = 0.0
    load_j: float = 0.0
    notes: tuple = field(default=())

    @property
    def latency_s(self) -> float:
        """End-to-end seconds: transfers in, launches, kernel, partials and results out, merge."""
        return (self.host_in_s + self.launch_s + self.kernel_s + self.host_out_s
                + self.partials_out_s + self.merge_s)

    @property
    def inter_dpu_s(self) -> float:
        """PrIM's "Inter-DPU" figure: gathering the partial results and merging them, seconds."""
        return self.partials_out_s + self.merge_s

    @property
    def kernel_and_merge_s(self) -> float:
        """PrIM's "DPU kernel + inter-DPU" figure, seconds."""
        return self.kernel_s + self.inter_dpu_s

    def as_dict(self) -> dict:
        d = asdict(self)
        d["latency_s"] = self.latency_s
        d["inter_dpu_s"] = self.inter_dpu_s
        return d


def energy_j(kernel_s: float, dpus: int, bytes_moved: int, host_busy_s: float, idle_s: float,
             params: UpmemParams = DEFAULT_PARAMS) -> float:
    """Energy, joules (*estimate*): busy DPUs x ``dpu_power_w`` x kernel seconds, allocated DPUs
    x ``dpu_idle_power_w`` while the host transfers or merges, bytes x ``host_xfer_j_per_byte``,
    host power while it is busy."""
    return (dpus * params.dpu_power_w * kernel_s + dpus * params.dpu_idle_power_w * idle_s
            + bytes_moved * params.host_xfer_j_per_byte + params.host_power_w * host_busy_s)
