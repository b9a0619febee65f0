"""UPMEM cost model: every expected number is worked out by hand from the published constants.

Constants used below (PrIM, Gomez-Luna et al. 2022; field notes upmem.md §1.5):
f = 350 MHz; one instruction per 11 cycles per tasklet; MRAM DMA 77 (read) / 61 (write) cycles
+ 0.5 cycle/byte; arithmetic throughput (MOPS at 350 MHz) INT32 add 58.56, mul 10.27, INT64 add
50.16, FLOAT add 4.91, mul 1.91, with a 6-instruction loop for INT32 add (5 of them load, store
and 3 loop control). Host transfers (issue 14's calibration, ``cost.UpmemParams``, every one
from a measurement on UPMEM hardware): one DPU 0.1865 GB/s to (PrIM raw logs) / 0.12 GB/s from;
a 64-DPU rank 1.82963 / 1.07288 GB/s; the host at most 16.0864 / 9.30122 GB/s for the first
64 KiB of every DPU's share and 26.5069 / 12.37644 GB/s for the rest; 5 us per call, 13.388 /
25.9018 us per rank; a launch 20 us + 40.75 us per rank.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from onnx_cinm.devices.upmem import cost as C
from onnx_cinm.devices.upmem import mapping
from onnx_cinm.devices.upmem.mapping import make_plan, plan_op
from onnx_cinm.graph import OpInfo, TensorInfo

F = 350e6


def _t(name, shape, dtype="int32"):
    return TensorInfo(name, np.dtype(dtype), tuple(shape), False)


def _va(n, dtype="int32"):
    return OpInfo("va", "Add", {}, (_t("a", [n], dtype), _t("b", [n], dtype)), (_t("y", [n], dtype),))


# -- instruction costs -------------------------------------------------------------------------

@pytest.mark.parametrize("op, dtype, want", [
    ("add", "int32", 1),      # 350 / 58.56 = 5.98 -> 6 instructions, minus the 5 of the loop
    ("sub", "int32", 1),      # 350 / 58.45 = 5.99 -> 6 - 5
    ("mul", "int32", 29),     # 350 / 10.27 = 34.08 -> 34 - 5: a mul_step sequence
    ("add", "int64", 2),      # 350 / 50.16 = 6.98 -> 7 - 5: add + add-with-carry
    ("mul", "int64", 132),    # 350 / 2.56 = 136.7 -> 137 - 5
    ("add", "float32", 66),   # 350 / 4.91 = 71.3 -> 71 - 5: software float
    ("mul", "float32", 178),  # 350 / 1.91 = 183.2 -> 183 - 5
    ("div", "float32", 1024),  # 350 / 0.34 = 1029.4 -> 1029 - 5
    ("add", "uint8", 1),      # narrow integers compute as 32-bit
])
def test_op_instructions_from_prim_throughput(op, dtype, want):
    assert C.op_instructions(op, dtype) == want


def test_unknown_op_has_no_cost():
    with pytest.raises(ValueError):
        C.op_instructions("fft", "int32")


# -- DMA ---------------------------------------------------------------------------------------

def test_dma_alpha_beta():
    p = C.UpmemParams()
    assert p.dma_cycles(2048) == 77 + 1024
    assert p.dma_cycles(8, write=True) == 61 + 4
    assert p.dma_cycles(1024) == 77 + 512


def test_stream_dma_splits_blocks_and_rounds_the_tail_to_8_bytes():
    p = C.UpmemParams()
    # 3000 B in 1024-B blocks: 2 x (77 + 512) + tail 952 B (already a multiple of 8): 77 + 476
    assert p.stream_dma_cycles(3000, 1024) == 2 * 589 + 553
    # 1001 B: one transfer rounded up to 1008 B
    assert p.stream_dma_cycles(1001, 2048, write=True) == 61 + 504
    assert p.stream_dma_cycles(0, 1024) == 0


# -- host transfers ----------------------------------------------------------------------------

def test_push_bandwidths_at_the_measured_points():
    p = C.UpmemParams()
    call, to_rank, from_rank = 5e-6, 13.388e-6, 25.9018e-6   # fixed per call / per rank
    assert p.push_s(10**6, 1) == pytest.approx(1e6 / 0.1865e9 + call + to_rank)
    assert p.push_s(10**6, 64) == pytest.approx(64e6 / 1.82963e9 + call + to_rank)
    assert p.push_s(10**6, 64, to_dpu=False) == pytest.approx(64e6 / 1.07288e9 + call + from_rank)
    # two full ranks transfer in parallel (128 MB at 3.66 GB/s: below the host's limit)
    assert p.push_s(10**6, 128) == pytest.approx(128e6 / (2 * 1.82963e9) + call + 2 * to_rank)
    # 8 DPUs: power law through (1, 0.1865 GB/s) and (64, 1.82963 GB/s)
    bw8 = 0.1865e9 * 8 ** (math.log(1.82963 / 0.1865) / math.log(64))
    assert p.push_s(10**6, 8) == pytest.approx(8e6 / bw8 + call + to_rank)
    assert p.broadcast_s(10**6, 64) == pytest.approx(64e6 / 16.88e9 + call + to_rank)
    assert p.serial_s(10**6, to_dpu=False) == pytest.approx(1e6 / 0.12e9 + call)


def test_the_host_limits_a_many_rank_transfer():
    """32 ranks could take 32 x 1.83 GB/s = 58.5 GB/s; the host moves the first 64 KiB of each
    DPU's 1 MB at 16.0864 GB/s and the rest at 26.5069 GB/s (UPMEM_1.txt), which is slower."""
    p = C.UpmemParams()
    host = 2048 * (65536 / 16.0864e9 + (10**6 - 65536) / 26.5069e9)
    assert host > 2048e6 / (32 * 1.82963e9)
    assert p.push_s(10**6, 2048) == pytest.approx(host + 5e-6 + 32 * 13.388e-6)


def test_ranks_and_launch_overhead():
    p = C.UpmemParams()
    assert [p.ranks(d) for d in (1, 64, 65, 2048)] == [1, 1, 2, 32]
    assert p.launch_overhead_s(2048) == pytest.approx(20e-6 + 32 * 40.75e-6)
    assert p.launch_overhead_s(256) == pytest.approx(183e-6)   # measured: empty launch, 4 ranks


def test_every_calibration_measurement_within_15_percent():
    """The model against each published measurement of ``upmem.measurements`` (the
    ``benchmarks/upmem_calibration.py`` table): within 15 % on every calibration row,
    including the issue's cases (32 ranks x 512 KiB: 24.3 / 11.8 GB/s; 4 ranks x 64 KiB:
    2351 / 4018 us; an empty launch on 4 ranks: 183 us; one DPU: 0.177-0.196 GB/s)."""
    from onnx_cinm.devices.upmem.measurements import MEASUREMENTS

    cal = [m for m in MEASUREMENTS if m.role == "calibration"]
    assert len(cal) >= 9
    for m in cal:
        assert abs(m.ratio() - 1) <= 0.15, (m.case, m.value, m.model(C.DEFAULT_PARAMS))
    by_case = {m.case: m for m in cal}
    # the figures quoted in issue 14, in the units it quotes them
    gbps = 2048 * 512 * 1024 / 1e9
    assert gbps / C.DEFAULT_PARAMS.push_s(512 * 1024, 2048) == pytest.approx(24.3, rel=0.15)
    assert gbps / C.DEFAULT_PARAMS.push_s(512 * 1024, 2048, False) == pytest.approx(11.8, rel=0.15)
    assert "empty dpu_launch on 4 ranks (256 DPUs)" in by_case


def test_the_old_uncapped_model_misses_the_measurements():
    """Regression (issue 14): host bandwidth that grows linearly with ranks, with no host limit,
    priced 32 ranks x 512 KiB at 199 GB/s instead of the measured 24.3 GB/s."""
    p = C.DEFAULT_PARAMS
    t = p.push_s(512 * 1024, 2048)
    assert 2048 * 512 * 1024 / t / 1e9 < 30
    # and the host-to-DPU time at 4 ranks (the old model: 674 us) is the measured 2351 us
    assert p.push_s(64 * 1024, 256) * 1e6 == pytest.approx(2351, rel=0.15)


# -- the pipeline rule -------------------------------------------------------------------------

def test_kernel_cycles_takes_the_binding_bound():
    # 16 tasklets x 100 instructions: the pipeline issues 1600 in 1600 cycles; one tasklet's
    # chain is 11 x 100 + its 50 DMA cycles = 1150; DMA 500
    c = C.kernel_cycles(C.KernelWork(16, 100, 1600, 500, 50))
    assert (c["total"], c["bound"]) == (1600, "compute")
    # 1 tasklet: 11 cycles per instruction, plus its own DMA waits: 1100 + 500
    c = C.kernel_cycles(C.KernelWork(1, 100, 100, 500, 500))
    assert (c["total"], c["bound"]) == (1600, "tasklet-chain")
    # 11 tasklets reach one instruction per cycle: 11 x 100 = 1100 both ways
    c = C.kernel_cycles(C.KernelWork(11, 100, 1100, 0, 0))
    assert c["total"] == 1100
    c = C.kernel_cycles(C.KernelWork(16, 10, 160, 5000, 400, serial_cycles=70))
    assert (c["total"], c["bound"]) == (5070, "dma")


# -- a whole kernel by hand: VA --------------------------------------------------------------

def test_va_int32_on_4_dpus_by_hand():
    """VA of N = 47,104 int32 on D = 4 DPUs, 16 tasklets.

    Per DPU n = 11,776 elements = 47,104 B per operand. Block: (65,536 - 2,048 reserved
    - 16 x 1,024 stack) / (16 tasklets x 2 buffers) = 1,472 B (= 368 elements), so 32 blocks
    per operand, 2 per tasklet.
    DMA: reads 2 x 32 x (77 + 736) = 52,032; writes 32 x (61 + 736) = 25,504; total 77,536.
    Pipeline: per element 2 loads + 1 add + 1 store + 3/8 loop control = 4.375 instructions
    (unrolled by 8), plus 12 per block: 11,776 x 4.375 + 32 x 12 = 51,904 < 77,536.
    One tasklet: 11 x (736 x 4.375 + 2 x 12) + 2 x (2 x 813 + 797) = 35,684 + 4,846 = 40,530.
    So the parallel phase is DMA-bound: 77,536 cycles; plus the start barrier (tasklet 0's
    mem_reset, then all 16 tasklets: 16 x 6 x 11 = 1,056): 78,592 cycles = 224.55 us at 350 MHz.
    """
    plan = plan_op(_va(47104), dpus=4)
    assert (plan.dpus, plan.tasklets, plan.block_bytes) == (4, 16, 1472)
    b = plan.cost()
    assert b.kernel_cycles == pytest.approx(78592)
    assert b.bound == "dma"
    assert b.kernel_s == pytest.approx(78592 / F)
    assert b.compute_s == pytest.approx(51904 / F)
    assert b.mram_bytes_per_dpu == 3 * 47104
    # roofline: 12 B per element at 2 B/cycle = 70,656 cycles; compute 1 add per element
    roof = plan.roofline()
    assert roof["dma_s"] == pytest.approx(70656 / F)
    assert roof["compute_s"] == pytest.approx(11776 / F)
    assert b.kernel_s / roof["bound_s"] == pytest.approx(78592 / 70656)
    # host: 2 operands of 47,104 B pushed to 4 DPUs, result pulled back
    p = C.UpmemParams()
    k = math.log(1.82963 / 0.1865) / math.log(64)
    assert b.host_in_s == pytest.approx(2 * 47104 * 4 / (0.1865e9 * 4 ** k) + 5e-6 + 13.388e-6)
    assert b.bytes_in == 2 * 47104 * 4 and b.bytes_out == 47104 * 4
    assert b.launch_s == pytest.approx(p.launch_s + p.launch_per_rank_s)


def test_va_int32_prim_default_by_hand():
    """The same VA under PrIM's default schedule: 1,024-B blocks (46 per operand per DPU), loops
    not unrolled: 2 + 1 + 1 + 3 = 7 instructions per element.
    Pipeline: 11,776 x 7 + 46 x 12 = 82,984. DMA: 2 x 46 x 589 + 46 x 573 = 80,546.
    Compute-bound: 82,984 cycles, + the start barrier 1,056."""
    b = make_plan(_va(47104), 4, 16, "prim").cost()
    assert b.kernel_cycles == pytest.approx(82984 + 1056)
    assert b.bound == "compute"


def test_float_is_emulated_and_compute_bound():
    """float32 VA per element: 2 loads + 66 (add) + 1 store + 3/8 = 69.375 instructions, far above
    the 6 DMA cycles per element: compute-bound at 11,776 x 69.375 + 32 x 12 = 817,344 cycles,
    + the start barrier 1,056."""
    b = plan_op(_va(47104, "float32"), dpus=4).cost()
    assert b.bound == "compute"
    assert b.kernel_cycles == pytest.approx(11776 * 69.375 + 32 * 12 + 1056)


def test_energy_is_an_estimate_with_stated_terms():
    # 2 DPUs busy 1 s at 0.12 W, idle 0.5 s at 0.03 W, 1e6 B at 20 pJ/B, host busy 0.1 s at 30 W
    assert C.energy_j(1.0, 2, 10**6, 0.1, 0.5) == pytest.approx(0.24 + 0.03 + 20e-6 + 3.0)


def test_reduce_with_tasklet_tree_by_hand():
    """RED: sum of N = 16,384 int32 on 1 DPU, 16 tasklets.

    65,536 B; one buffer per tasklet: (65,536 - 2,048 - 16,384) / 16 = 2,944 -> 2,048-B blocks,
    32 blocks, 2 per tasklet. Per element: load + add + 3/8 = 2.375 instructions.
    Pipeline: 16,384 x 2.375 + 32 x 12 = 39,296; DMA 32 x (77 + 1,024) = 35,232; one tasklet:
    11 x (1,024 x 2.375 + 24) + 2 x 1,101 = 29,218. Parallel phase: 39,296 (compute).
    Tree merge of one 4-byte partial per tasklet, as the kernel does it: a barrier (16 x 6 x 11
    = 1,056) ends the parallel phase; 4 levels, each the left tasklet of every pair combining
    (ld, ld, add, st = 4 instructions: max(pairs x 4, 11 x 4) = 44) and a barrier; then one
    8-byte MRAM write: 61 + 4 = 65. Merge: 5 x 1,056 + 4 x 44 + 65 = 5,521; with the start
    barrier (1,056) the serial part is 6,577. Total 45,873 cycles; the host gathers 8 bytes.
    """
    op = OpInfo("r", "Reduce", {"kind": "add", "axes": [0], "keepdims": 0},
                (_t("x", [16384]),), (_t("y", []),))
    p = plan_op(op, dpus=1)
    assert (p.block_bytes, p.merge) == (2048, "tree")
    b = p.cost()
    assert b.kernel_cycles == pytest.approx(45873)
    assert b.dpu_merge_s == pytest.approx(6577 / F)
    assert b.bytes_out == 8
    # PrIM's default: 1,024-B blocks (64), 1 + 1 + 3 = 5 instructions per element:
    # 16,384 x 5 + 64 x 12 = 82,688 (compute-bound; DMA 64 x 589 = 37,696); then one barrier
    # and each tasklet's partial written, the 16 writes in a row on the DMA engine (1,056 +
    # 16 x 65), and the start barrier (1,056); the host gathers 16 x 8 bytes.
    q = make_plan(op, 1, 16, "prim").cost()
    assert q.kernel_cycles == pytest.approx(82688 + 1056 + 16 * 65 + 1056)
    assert q.bytes_out == 16 * 8


def test_histogram_private_tree_vs_shared_mutex_by_hand():
    """HST: 16,384 int32 pixels, 256 bins over [0, 4096) (bin width 16: a shift), 1 DPU.

    Ours: 16 private histograms of 256 bins + 1 overflow slot (x == 4096), 1,032 B each; blocks
    (65,536 - 2,048 - 16 x (1,024 + 1,032)) / 16 = 1,912 B: 35 blocks (34 full, one of 528 B),
    3 per tasklet (1,434 elements). Per element: load 1 + bin (sub 1 + shift 1) + range check
    (one unsigned compare) 1 + address 1 + load/add/store 3 + 3/8 = 8.375.
    Pipeline 16,384 x 8.375 + 35 x 12 = 137,636; DMA 34 x (77 + 956) + (77 + 264) = 35,463;
    chain 11 x (1,434 x 8.375 + 36) + 3 x 1,033 = 135,602 -> 137,636.
    Serial: a barrier 1,056; a tree of 4 levels over 258 slots, each level's work striped over
    all tasklets: pairs x 258 x 4 = 8,256 + 4,128 + 2,064 + 1,032 (each >= 11 x ceil(work / 16))
    and a barrier each (4 x 1,056); the 1,032-B histogram to MRAM 61 + 516; zeroing 258 slots
    before the start barrier, unrolled: 16 tasklets x 258 x 1.375 = 5,676; the start barrier
    1,056: 1,056 + 15,480 + 4,224 + 577 + 5,676 + 1,056 = 28,069. Total 165,705.

    PrIM HST-L: one shared histogram; every update is a critical section of 8 instructions, and
    critical sections of different tasklets serialize at 11 cycles per instruction:
    16,384 x 8 x 11 = 1,441,792 cycles (the rest of the work, 16,384 x 15 + 64 x 12 = 246,528
    instructions, overlaps it); zeroing the 258 slots striped over the tasklets, not unrolled:
    max(258, 11 x 17) x (1 + 3) = 1,032; then a barrier and the 1,032-B MRAM write: 1,056 + 577,
    and the start barrier 1,056. Total 1,445,513: 8.7x slower.
    """
    op = OpInfo("h", "Histogram", {"bins": 256, "min": 0.0, "max": 4096.0},
                (_t("x", [16384]),), (_t("c", [256], "int64"),))
    p = plan_op(op, dpus=1)
    assert (p.block_bytes, p.merge) == (1912, "tree")
    assert p.cost().kernel_cycles == pytest.approx(165705)
    q = make_plan(op, 1, 16, "prim")
    assert (q.block_bytes, q.merge) == (1024, "mutex")
    assert q.cost().kernel_cycles == pytest.approx(1445513)


@pytest.mark.parametrize("dtype,bins,lo,hi,want", [
    ("int32", 256, 0.0, 4096.0, 4),          # PrIM HST: 12-bit pixels, 256 bins of 16
    ("int32", 64, -512.0, 512.0, 4),
    ("uint32", 2, 0.0, 8.0, 2),
    ("int64", 4, -2.0**31, 2.0**31, 30),
    ("int32", 4, -2.0**31, 2.0**31, None),   # max beyond int32: the unsigned compare would wrap
    ("int32", 37, -50.0, 60.0, None),        # width not a power of two
    ("int32", 3, 0.0, 12.0, 2),              # 3 bins of 4
    ("float32", 256, 0.0, 4096.0, None),     # float data: no shift
])
def test_histogram_shift_binning_applies_when_the_kernel_can_use_it(dtype, bins, lo, hi, want):
    assert mapping.hist_pow2_shift(dtype, bins, lo, hi) == want


def test_histogram_float_binning_is_costed_in_software_double():
    """The kernel bins non-power-of-two (and float) data in double: a conversion (costed as a
    float64 add, 350 / 3.32 - 5 = 100), two compares (20 each), sub (350 / 3.11 - 5 = 108), mul
    (350 / 0.53 - 5 = 655), div (350 / 0.16 - 5 = 2,183) and the cast (1): 3,087; the shift path
    is sub + shift + compare = 3."""
    assert mapping.hist_bin_instr("float32", False) == 100 + 2 * 20 + 108 + 655 + 2183 + 1
    assert mapping.hist_bin_instr("int32", True) == 3


def test_weights_stay_resident_and_the_load_is_charged_once():
    """Y[1, 32] = X[1, 64] @ W[64, 32] (int32, W constant) on one DPU: W is broadcast once at
    load as 32 K-rows of 64 x 4 = 256 B (8,192 B) and stays in MRAM; per inference only X moves.
    The load: the DPU program (60 ms, Cinnamon) + one broadcast of 8,192 B to one DPU at the
    one-DPU bandwidth (0.1865 GB/s) + 5 us per call + 13.388 us per rank."""
    t = lambda n, s, const=False: TensorInfo(n, np.dtype("int32"), s, const)  # noqa: E731
    op = OpInfo("fc", "Gemm", {}, (t("x", (1, 64)), t("w", (64, 32), True)), (t("y", (1, 32)),))
    plan = plan_op(op, dpus=1)
    b = plan.cost()
    assert b.resident_bytes == 8192
    assert b.load_s == pytest.approx(60e-3 + 5e-6 + 13.388e-6 + 8192 / 0.1865e9)
    assert b.load_j > 0
    attrs = plan.attrs()
    assert attrs["cnm_load_s"] == pytest.approx(b.load_s)
    # per inference: X (64 x 4 = 256 B) in, Y (32 x 4 B) out; W never again
    assert b.bytes_in == 256 and b.bytes_out == 128
    assert b.latency_s < b.load_s
    # the same product with W a runtime input pays W's transfer every inference
    op2 = OpInfo("fc", "Gemm", {}, (t("x", (1, 64)), t("w", (64, 32))), (t("y", (1, 32)),))
    b2 = plan_op(op2, dpus=1).cost()
    assert b2.resident_bytes == 0 and b2.bytes_in == 256 + 8192
    assert b2.load_s == pytest.approx(60e-3)


def _bench(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_calibration_benchmark_passes(capsys):
    assert _bench("upmem_calibration").main([]) == 0
    out = capsys.readouterr().out
    assert "MISS" not in out and "calibration: 17/17 within 15%" in out


def test_decoder_benchmark_keeps_the_weights_resident():
    """GPT-2 small's weight products at batch 1: 768x2304 + 768x768 + 768x3072 + 3072x768 =
    7,077,888 int32 weights = 28.3 MB go to MRAM once (padding may add a little); four DPU
    programs load once (4 x 60 ms); per inference they never move again."""
    from onnx_cinm import hostmodel

    r = _bench("upmem_decoder").layer("gpt2-small", 1, hostmodel.NOMINAL)
    weights = sum(x["weights_mb"] for x in r["layers"])
    assert 28.31 <= weights < 28.31 * 1.1
    assert r["load_s"] > 4 * 60e-3
    assert r["first_inf_s"] == pytest.approx(r["per_inf_s"] + r["load_s"])
    assert r["streamed_s"] > r["per_inf_s"]
    # break-even against the host: the load over the per-inference gain, when there is one
    gain = r["host_s"] - r["per_inf_s"]
    assert r["break_even"] == (math.ceil(r["load_s"] / gain) if gain > 0 else None)


def test_tail_elements_of_an_unrolled_block_pay_full_loop_control():
    """Regression (issue 14: the calibrated model moved LeNet's relu3 to 60 DPUs, where the model
    and the emulator disagreed). Relu of 120 int32 on 60 DPUs x 16 tasklets: 2 elements per DPU,
    one 8-byte block, so one tasklet works. Its loop runs the 2 elements as tail iterations (the
    loop is unrolled by 8): 2 x (load 1 + relu 2 + store 1 + loop control 3) + 12 per block = 26
    instructions; chain 11 x 26 + DMA (77 + 4) + (61 + 4) = 432 cycles; plus the start barrier
    16 x 6 x 11 = 1,056: 1,488 cycles (what the emulator counts for the generated kernel)."""
    op = OpInfo("r", "Relu", {}, (_t("x", [120]),), (_t("y", [120]),))
    b = make_plan(op, 60, 16).cost()
    assert b.kernel_cycles == pytest.approx(1488)


def test_the_devices_clock_sets_the_modeled_kernel_time():
    """One parameters class (issue 13): a device built with a 700 MHz clock models a kernel in
    the same cycles as the 350 MHz default and so in half the seconds, by hand
    ``cycles / 350e6`` and ``cycles / 700e6``; transfers and launches do not depend on the
    clock, so the end-to-end latency drops by exactly that half. (The device's parameters used
    to be a second class that the cost model never read.)"""
    from dataclasses import replace

    from onnx_cinm.devices.upmem import UpmemDevice

    op = _va(1 << 16)
    slow = UpmemDevice()
    fast = UpmemDevice(replace(slow.params, frequency_hz=700e6))
    opts = {"upmem_dpus": 1}
    a, b = slow.plan(op, opts).cost(), fast.plan(op, opts).cost()
    assert a.kernel_cycles == b.kernel_cycles > 0
    assert a.kernel_s == pytest.approx(a.kernel_cycles / 350e6, rel=1e-12)
    assert b.kernel_s == pytest.approx(a.kernel_cycles / 700e6, rel=1e-12)
    assert a.latency_s - b.latency_s == pytest.approx(a.kernel_cycles / 700e6, rel=1e-9)
    assert slow.cost(op, opts).latency_s == pytest.approx(a.latency_s, rel=1e-12)
    assert fast.cost(op, opts).latency_s == pytest.approx(b.latency_s, rel=1e-12)
    # the v1b generation is an instance of the same class, with its own clock
    assert slow.target({"upmem_target": "v1b"}).frequency_hz == 400e6
    assert type(slow.target({"upmem_target": "v1b"})) is type(slow.params)
