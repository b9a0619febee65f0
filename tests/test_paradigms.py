"""The paradigm level: cim and cnm code written against their array protocols, and the
``--stop-after paradigm`` level between placement and device. Expected numbers are computed by
hand in the comments."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.paradigms.cim import CrossbarArray, residency, schedule
from onnx_cinm.paradigms.cnm import NearMemoryArray, distribution, merge, workgroup


@dataclass(frozen=True)
class _OtherChip:
    """A second crossbar chip, not the memristor device's parameter class."""

    rows: int = 128
    cols: int = 32
    crossbars: int = 2
    write_latency_s: float = 1e-6
    write_energy_j: float = 1e-9
    mvm_latency_s: float = 1e-7
    mvm_energy_j: float = 1e-12
    adc_energy_j: float = 0.0
    clock_hz: float = 1e9
    periphery_energy_per_cycle_j: float = 0.0
    dac_energy_j: float = 0.0
    adc_latency_s: float = 0.0
    adcs_per_array: int = 0
    cell_area_mm2: float = 0.0
    adc_dac_area_mm2: float = 0.0
    periphery_area_mm2: float = 0.0
    folded: tuple = ()


def test_a_second_crossbar_chip_plans_through_the_protocol():
    chip = _OtherChip()
    assert isinstance(chip, CrossbarArray) and not isinstance(object(), CrossbarArray)
    p = schedule.plan(10, 200, 40, chip)
    # Kt = ceil(200/128) = 2, Nt = ceil(40/32) = 2: T = 4 > P = 2 -> serpentine
    assert (p.Kt, p.Nt, p.tiles) == (2, 2, 4)
    assert (p.writes_load, p.writes_per_inference, p.mvms) == (2, 2, 10 * 2 * 2)
    c = p.cost(chip)
    # 2 rounds, 1 with writes: 1 us + 2 rounds * 10 rows * 0.1 us = 3 us
    assert c.latency_s == pytest.approx(3e-6)
    # 2 writes * 1 nJ + 40 MVMs * 1 pJ
    assert c.energy_j == pytest.approx(2.04e-9)
    assert c.writes == 2
    # a chip need not say where its folded terms go (folded_into, optional): the array's
    from dataclasses import replace

    parts = p.cost(replace(chip, folded=("adc_dac",))).parts
    assert [q.folded for q in parts] == ["", "array", ""]


@pytest.mark.parametrize("tiles,const,P,expected", [
    ([1, 2], [True, True], 4, [(1, False), (2, False)]),          # 3 <= 4: all resident
    # 9 > 4: the knapsack fits one 2-tile kernel in P-1 = 3 (the first on ties); two stream
    # through the 2 left and evict each other
    ([2, 2, 5], [True, True, True], 4, [(2, False), (2, True), (2, True)]),
    ([1, 10], [True, True], 4, [(1, False), (3, False)]),          # one streams alone: serpentine
    # an activation operand is never pinned, even when everything would fit
    ([1, 2], [True, False], 8, [(1, False), (7, False)]),
])
def test_residency_allocation(tiles, const, P, expected):
    assert residency.allocate(tiles, const, P) == expected


def test_near_memory_rules_on_an_hbm_pim_like_array():
    # 16 FP16 lanes, 512 B of registers, 32-byte column accesses
    pim = NearMemoryArray(units=128, units_per_group=8, memory_bytes=64 << 20, scratch_bytes=512,
                          threads=1, lanes=16, align_bytes=32, block_max_bytes=32)
    # 1000 fp16 on 8 units: 125 each, rounded up to whole 32-byte words of 16 -> 128
    assert workgroup.share(1000, 8, 2, pim.align_bytes) == 128
    assert workgroup.scratch_block(pim, 1, 2) == 32                     # 256 free per buffer
    assert workgroup.scratch_block(pim, 1, 2, private_bytes=500) == 0   # 6 B: not one word
    assert workgroup.blocks(100, 32, 1) == (4, 4)
    assert workgroup.blocks(100, 32, 3) == (4, 2)
    with pytest.raises(ValueError, match="units"):
        NearMemoryArray(units=0, units_per_group=1, memory_bytes=1, scratch_bytes=1, threads=1)


def test_workgroups_grids_and_distribution():
    assert workgroup.unit_counts(2048, 5) == [1, 2, 4, 5]
    assert workgroup.grid_splits(12) == [1, 2, 4, 12]
    assert workgroup.workgroups(100, 4, grid=True) == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2),
                                                      (4, 4)]
    assert workgroup.workgroups(100, 4, units=3) == [(3, 1)]
    assert distribution.grid(8, 2, 100, 1, False) is None          # 2 column blocks of 1 column
    assert distribution.grid(8, 2, 100, 50, True) is None          # a batched B is not split
    assert distribution.grid(8, 2, 100, 50, False) == (4, 2, "grid")
    assert distribution.grid(4, 4, 1, 64, False) == (1, 4, "cols")
    assert distribution.grid_inputs(1, 4) == ("broadcast", "scatter")
    assert distribution.resident([(100, "scatter", True), (50, "broadcast", True),
                                  (30, "scatter", False)]) == (100, 50)
    assert distribution.memory_layout([("A", 16), ("B", 0), ("Y", 8)]) == [("A", 0, 16),
                                                                          ("Y", 16, 8)]
    assert distribution.split(distribution.entry("x:y", "scatter")) == ("x:y", "scatter")


def test_merge_rules():
    assert merge.rule("reduce") == "tree" and merge.rule("reduce", whole_rows=True) == "none"
    assert merge.rule("select") == "prefix" and merge.rule("gemm") == "none"
    # 5 threads: stride 1 pairs (0,1) (2,3); stride 2 (0,2); stride 4 (0,4)
    assert [merge.tree_pairs(5, s) for s in (1, 2, 4)] == [2, 1, 1]
    assert set(merge.MERGES) >= {"tree", "host", "mutex", "prefix", "handshake", "none"}


def _mm_relu():
    rng = np.random.default_rng(0)
    W = numpy_helper.from_array(rng.standard_normal((128, 96)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm0"),
             helper.make_node("Relu", ["Y"], ["Z"], name="relu0")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 128])],
                          [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [8, 96])], [W])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _plans(model):
    return {n.op_type: cinm.node_attrs(n) for n in model.graph.node if n.domain == cinm.DOMAIN}


def test_stop_after_paradigm_has_tiles_and_workgroups_but_no_device_plan():
    place = [("mm*", "memristor"), ("relu*", "upmem")]
    occ = {"cim_preset": "pcm-occ"}  # the figures below are for the CINM paper's chip
    par = _plans(optimize(_mm_relu(), place=place, check=0, stop_after="paradigm",
                          device_options=occ).model)
    dev = _plans(optimize(_mm_relu(), place=place, check=0, stop_after="device",
                          device_options=occ).model)
    placed = _plans(optimize(_mm_relu(), place=place, check=0, stop_after="placement",
                             device_options=occ).model)
    assert not any(k.startswith(("cim_", "cnm_")) for a in placed.values() for k in a)
    mm, relu = par["Gemm"], par["Relu"]
    # 128 x 96 on 64 x 64 tiles: 2 x 2 = 4 tiles = P (OCC's 4 crossbars): resident, written at
    # load; 8 rows x 4 tiles = 32 MVMs
    assert (mm["cim_tiles"], mm["cim_writes_load"], mm["cim_writes"],
            mm["cim_mvms"]) == (4, 4, 0, 32)
    assert mm["cim_resident"] == 1 and mm["cim_loop_order"] == "weight_stationary"
    # the Relu's 768 fp32 are scattered, nothing merges; per DPU: in and out regions of the
    # padded share (8-byte words of two fp32)
    d = relu["cnm_dpus"]
    share = -(-(-(-768 // d)) // 2) * 2
    assert relu["cnm_merge"] == "none" and len(relu["cnm_inputs"]) == 1
    assert relu["cnm_inputs"][0].endswith(b":scatter")  # strings attributes stay bytes
    assert relu["cnm_mram_bytes"] == 2 * share * 4
    for a in (mm, relu):   # no device-level figures yet
        assert "kernel" not in a and not any(k.endswith(("_latency_s", "_energy_j")) for k in a)
    # the device level writes the same paradigm plan, then cost and kernel paths
    for op in ("Gemm", "Relu"):
        assert {k: v for k, v in dev[op].items() if k in par[op]} == par[op]
        assert "kernel" in dev[op]
    assert dev["Gemm"]["cim_latency_s"] > 0 and dev["Relu"]["cnm_latency_s"] > 0


def test_paradigms_import_no_device_package():
    code = ("import sys\n"
            "import onnx_cinm.paradigms.cim.layout, onnx_cinm.paradigms.cim.residency\n"
            "import onnx_cinm.paradigms.cim.schedule, onnx_cinm.paradigms.cnm.distribution\n"
            "import onnx_cinm.paradigms.cnm.merge, onnx_cinm.paradigms.cnm.workgroup\n"
            "print(sorted(m for m in sys.modules if m.startswith('onnx_cinm.devices')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # not even the contract: graph types and Cost are below


@pytest.mark.parametrize("op_type,operand,a_shape,b_shape", [
    ("Gemm", "B", (1, 5, 7, 9), (9, 4)),        # a conv's product: shared batch axes
    ("Gemm", "B", (3, 1, 6, 9), (3, 9, 4)),     # grouped (B varies on axis 0), shared axis 1
    ("Gemm", "A", (5, 9), (2, 9, 4)),           # A programmed, batched B: Y^T streams B's columns
    ("Gemm", "A", (5, 9), (9, 4)),
    ("Gemv", "A", (5, 9), (9,)),
    ("Gemv", "B", (5, 9), (9,)),
])
def test_crossbar_layout_round_trip_equals_numpy(op_type, operand, a_shape, b_shape):
    """weights / stream_rows / unstream (one reshape and one transpose, unstream_plan) give
    numpy's matmul for every form a crossbar product takes (reference: numpy in float64)."""
    from onnx_cinm.paradigms.cim import layout

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    v = layout.view(op_type, operand, a_shape, b_shape)
    W, X = layout.weights(v, a, b), layout.stream_rows(v, a, b)
    assert W.shape == (v.G, v.K, v.N) and X.shape == (v.G, v.rows, v.K)
    np.testing.assert_allclose(layout.unstream(v, X @ W), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    shape, axes = layout.unstream_plan(v)
    assert sorted(axes) == list(range(len(shape)))
