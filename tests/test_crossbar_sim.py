"""The .xbar simulator: numbers equal A @ B (+C), counters equal the hand formulas, errors name lines."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from onnx_cinm.devices.memristor import PCM_OCC, RERAM_ISAAC
from onnx_cinm.devices.memristor.codegen import emit_kernel
from onnx_cinm.paradigms.cim.schedule import plan
from onnx_cinm.sim.crossbar import CrossbarSimulator, XbarError, parse

SHAPES = [  # M, K, N, P, groups
    (7, 200, 130, 4, 1),   # K, N not multiples of 64; T=12 > P
    (1, 10, 3, 1, 1),      # M=1, K<64, a single tile
    (9, 130, 65, 4, 1),    # T=6 > P=4, P does not divide T
    (5, 100, 70, 4, 1),    # T=4 fits
    (33, 27, 8, 2, 3),     # grouped, T=3 > P=2
]


def _kernel(tmp_path, M, K, N, P, G, order, m_block=1, bias=True, seed=0, params=PCM_OCC,
            shared=False):
    rng = np.random.default_rng(seed)
    prm = replace(params, crossbars=P)
    pl = plan(M, K, N, prm, order, groups=G, m_block=m_block, shared=shared)
    W = rng.standard_normal((G, K, N)).astype(np.float32)
    C = rng.standard_normal(N).astype(np.float32) if bias else None
    paths = emit_kernel(pl, prm, W, tmp_path, f"k{M}_{K}_{N}_{order}", bias=C)
    A = rng.standard_normal((G, M, K)).astype(np.float32)
    ref = np.einsum("gmk,gkn->gmn", A.astype(np.float64), W.astype(np.float64))
    if bias:
        ref = ref + C
    return pl, prm, paths, A, ref


@pytest.mark.parametrize("order,m_block", [("weight_stationary", 1), ("naive", 1), ("naive", 4)])
@pytest.mark.parametrize("M,K,N,P,G", SHAPES)
def test_simulator_matches_numpy_and_formulas(tmp_path, M, K, N, P, G, order, m_block):
    pl, prm, paths, A, ref = _kernel(tmp_path, M, K, N, P, G, order, m_block)
    sim = CrossbarSimulator(paths[0])
    assert sim.load_counters.tile_writes == pl.writes_load
    assert sim.load_counters.cell_writes == pl.cell_writes_load
    runs = []
    for _ in range(3):  # forward, backward, forward (serpentine)
        out, c = sim.run({"X": A})
        np.testing.assert_allclose(out["Y"], ref, rtol=1e-5, atol=1e-4 * np.sqrt(K))
        runs.append(c)
    cost = pl.cost(prm)
    for c in runs:
        assert c.tile_writes == pl.writes_per_inference
        assert c.mvms == pl.mvms == G * M * pl.Kt * pl.Nt
        assert c.adc_conversions == pl.adc_conversions == G * M * pl.Kt * N
        assert c.latency_s == pytest.approx(cost.latency_s, rel=1e-12)
    assert (runs[0].cell_writes + runs[1].cell_writes) // 2 == pl.cell_writes_per_inference
    assert runs[1].energy_j == pytest.approx(cost.energy_j, rel=1e-12)
    if order == "naive":
        assert runs[0].tile_writes == G * -(-M // m_block) * pl.Nt * pl.Kt
        assert runs[0].tile_writes_skipped == 0


def test_weight_stationary_resident_and_wear(tmp_path):
    # T = 2*2 = 4 tiles on P=4: written once at load, never again; each used cell written once
    pl, prm, paths, A, ref = _kernel(tmp_path, 50, 100, 70, 4, 1, "weight_stationary")
    sim = CrossbarSimulator(paths[0])
    for _ in range(4):
        out, c = sim.run({"X": A})
        assert c.tile_writes == 0 and c.tile_writes_skipped == 4 and c.max_cell_writes == 1
    # capacity-limited, P=1, T=4: each inference writes 3 tiles into the one crossbar
    pl, prm, paths, A, ref = _kernel(tmp_path, 5, 100, 70, 1, 1, "weight_stationary")
    sim = CrossbarSimulator(paths[0])
    for r in range(3):
        out, c = sim.run({"X": A})
        assert c.tile_writes == 3
    # cell (0, 0) holds part of every tile: 1 (load) + 3 * 3 writes
    assert c.max_cell_writes == 1 + 3 * 3


def test_occ_example_and_large_m(tmp_path):
    # field notes §3: M=N=K=256, 64x64, P=1: naive (M tiled by 64) 64 writes, WS 16 cold
    pl, prm, paths, A, ref = _kernel(tmp_path, 256, 256, 256, 1, 1, "naive", m_block=64, bias=False)
    out, c = CrossbarSimulator(paths[0]).run({"X": A})
    assert c.tile_writes == 64
    pl, prm, paths, A, ref = _kernel(tmp_path, 256, 256, 256, 1, 1, "weight_stationary", bias=False)
    sim = CrossbarSimulator(paths[0])
    out, c = sim.run({"X": A})
    assert sim.load_counters.tile_writes + c.tile_writes == 16
    # conv-as-GEMM shaped: 25088 rows stream without a Python loop per row (naive too)
    pl, prm, paths, A, ref = _kernel(tmp_path, 25088, 16, 256, 4, 1, "naive", bias=False)
    out, c = CrossbarSimulator(paths[0]).run({"X": A})
    assert c.tile_writes == 25088 * 4 and len(Path(paths[0]).read_text().splitlines()) < 60
    np.testing.assert_allclose(out["Y"], ref, rtol=1e-5, atol=1e-4)


def test_reram_preset_costs(tmp_path):
    pl, prm, paths, A, ref = _kernel(tmp_path, 3, 300, 200, 4, 1, "weight_stationary",
                                     params=RERAM_ISAAC)
    out, c = CrossbarSimulator(paths[0]).run({"X": A})
    assert c.energy_j == pytest.approx(pl.cost(prm).energy_j)
    np.testing.assert_allclose(out["Y"], ref, rtol=1e-5, atol=1e-3)


GOOD = """XBAR 1
crossbars 1
rows 2
cols 2
dtype float32
mode ideal
input X 1 3
weight W 1 3 2 w.npy
output Y 1 2
LOAD
END
RUN
PROGRAM 0 W 0 0 0
MVM 0 X 0 0
ACC Y 0 0 0
BARRIER
READ Y
END
"""


@pytest.mark.parametrize("edit,line,msg", [
    (("XBAR 1", "XBAR 2"), 1, "version 2"),
    (("rows 2", "rows two"), 3, "integer"),
    (("mode ideal", "mode noisy"), 6, "mode"),
    (("PROGRAM 0 W 0 0 0", "PROGRAM 1 W 0 0 0"), 13, "crossbar 1 out of range"),
    (("PROGRAM 0 W 0 0 0", "PROGRAM 0 W 0 2 0"), 13, "outside W"),
    (("MVM 0 X 0 0", "MVN 0 X 0 0"), 14, "unknown command"),
    (("ACC Y 0 0 0", "ACC Z 0 0 0"), 15, "unknown region"),
    (("ACC Y 0 0 0", "ACC W 0 0 0"), 15, "is a weight"),
    (("BARRIER\nREAD Y\nEND\n", "BARRIER\n"), 16, "missing END"),
    (("mode ideal\n", ""), 9, "lacks 'mode'"),
    (("RUN\nPROGRAM", "RUN\nFOR ROWS 2\nPROGRAM"), 19, "must end with BARRIER"),
])
def test_malformed_files_name_the_line(edit, line, msg):
    bad = GOOD.replace(*edit)
    with pytest.raises(XbarError, match=rf"^k\.xbar:{line}: .*{msg}"):
        parse(bad, "k.xbar")


def test_runtime_errors_name_the_line(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((1, 3, 2), np.float32))
    (tmp_path / "k.xbar").write_text(GOOD.replace("MVM 0 X 0 0", "MVM 0 X 0 1"))
    sim = CrossbarSimulator(tmp_path / "k.xbar")
    with pytest.raises(XbarError, match=r"k\.xbar:14: MVM streams group 0 k tile 1"):
        sim.run({"X": np.ones((4, 3), np.float32)})
    (tmp_path / "k.xbar").write_text(GOOD)
    out, c = CrossbarSimulator(tmp_path / "k.xbar").run({"X": np.ones((4, 3), np.float32)})
    assert c.tile_writes == 1 and c.mvms == 4
    with pytest.raises(XbarError, match=r"k\.xbar:7: input X"):
        CrossbarSimulator(tmp_path / "k.xbar").run({"X": np.ones((4, 5), np.float32)})
    np.save(tmp_path / "w.npy", np.ones((3, 2), np.float32))
    with pytest.raises(XbarError, match=r"k\.xbar:8: W: sidecar shape"):
        CrossbarSimulator(tmp_path / "k.xbar")


def test_doc_worked_example(tmp_path):
    doc = (Path(__file__).parents[1] / "docs" / "xbar-format.md").read_text()
    text = doc.split("## Worked example")[1].split("```")[1]
    (tmp_path / "example.xbar").write_text(text)
    np.save(tmp_path / "example.W.npy", np.array([[[1, 2], [3, 4], [5, 6]]], np.float32))
    sim = CrossbarSimulator(tmp_path / "example.xbar")
    assert (sim.load_counters.tile_writes, sim.load_counters.cell_writes) == (1, 4)
    X = np.array([[1, 1, 1], [1, 0, -1]], np.float32)
    out, c = sim.run({"X": X})
    np.testing.assert_array_equal(out["Y"][0], [[9, 12], [-4, -4]])
    assert (c.tile_writes, c.tile_writes_skipped, c.cell_writes, c.mvms, c.adc_conversions) == \
        (1, 1, 2, 4, 8)
    assert c.latency_s == pytest.approx(6.5e-6)
    assert c.energy_j == pytest.approx(1.36502008e-5)
    out, c2 = sim.run({"X": X})
    assert (c2.tile_writes, c2.cell_writes) == (1, 4)
    out, c3 = sim.run({"X": X})
    np.testing.assert_array_equal(out["Y"][0], [[9, 12], [-4, -4]])
    assert c3.max_cell_writes == 4


@pytest.mark.parametrize("order,m_block,quantized", [("weight_stationary", 1, False),
                                                     ("naive", 4, False),
                                                     ("weight_stationary", 1, True)])
def test_output_arrays_are_reused_only_when_free(tmp_path, order, m_block, quantized):
    """Issue 16: an inference reuses the last one's output array when nobody holds it (no
    fresh pages to fault in per inference) and never writes one the caller still holds. A
    reused array holds the last inference's values, so the products, the partial sums of a
    quantized kernel and the bias must not add to them: after an inference on other inputs,
    the result equals numpy's (ideal) or that of a simulator whose outputs are all held
    (quantized, the same file and inferences)."""
    from onnx_cinm.devices.memristor.nonideal import Q8

    rng = np.random.default_rng(3)
    prm = replace(PCM_OCC, crossbars=4)
    M, K, N = 9, 130, 65
    pl = plan(M, K, N, prm, order, m_block=m_block)
    W = rng.standard_normal((1, K, N)).astype(np.float32)
    C = rng.standard_normal(N).astype(np.float32)
    path = emit_kernel(pl, prm, W, tmp_path, "k", bias=C, mode=Q8 if quantized else None)[0]
    A1, A2 = (rng.standard_normal((1, M, K)).astype(np.float32) for _ in range(2))
    sim = CrossbarSimulator(path)
    held = sim.run({"X": A1})[0]["Y"]
    first = held.copy()
    sim.run({"X": A2 * 3})  # not held: its array is free for the next inference
    out = sim.run({"X": A2})[0]["Y"]
    np.testing.assert_array_equal(held, first)  # the held output was never written
    assert not np.shares_memory(out, held)
    if quantized:
        fresh = CrossbarSimulator(path)  # the same inferences (serpentine order), all held
        kept = [fresh.run({"X": x})[0]["Y"] for x in (A1, A2 * 3, A2)]
        np.testing.assert_array_equal(out, kept[-1])
    else:
        ref = np.einsum("gmk,gkn->gmn", A2.astype(np.float64), W.astype(np.float64)) + C
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.sqrt(K))
    again = sim.run({"X": A1})[0]["Y"]
    np.testing.assert_allclose(again, first, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("order,m_block,P,G,shared", [
    ("weight_stationary", 1, 4, 1, False), ("naive", 4, 4, 1, False),
    ("weight_stationary", 1, 1, 1, False), ("weight_stationary", 1, 4, 3, False),
    ("weight_stationary", 1, 16, 1, False),  # fits: fixed
    ("weight_stationary", 1, 4, 1, True)])  # a streaming pool's: fixed, tiles written each time
def test_counting_without_data_matches_a_full_run(tmp_path, order, m_block, P, G, shared):
    """Issue 16: ``run(data=False)`` (for a caller computing the data path itself) advances
    the counters, tiles and wear as a full run does, inference by inference (serpentine and
    capacity-limited files included; from the third, a file that programs no tile per
    inference recalls its counters, :meth:`CrossbarSimulator._count_steady`), and ``affine()``
    names the plain product only after an inference with data and only for files that compute
    exactly ``X @ W + b``."""
    _, _, paths, A, _ = _kernel(tmp_path, 9, 130, 65, P, G, order, m_block, shared=shared)
    full, counted = CrossbarSimulator(paths[0]), CrossbarSimulator(paths[0])
    assert not shared or counted.prog.header["order"] == "fixed"
    assert counted.affine() is None  # nothing seen yet
    stand_in = np.broadcast_to(np.float32(0), A.shape)  # shapes only
    recalled, recall = [], counted._count_steady
    counted._count_steady = lambda *a: recalled.append(recall(*a)) or recalled[-1]
    recalls = counted.prog.header["order"] != "serpentine" and order != "naive"
    for r in range(6):
        c_full = full.run({"X": A})[1].as_dict()
        if r == 0:  # the first inference with data tells the data path
            c_count = counted.run({"X": A})[1].as_dict()
        else:
            recalled.clear()
            c_count = counted.run({"X": stand_in}, data=False)[1].as_dict()
            # recalled from the third on, capacity-limited files (tiles written each time) too
            assert (recalled[-1:] != [None] and recalled != []) == (recalls and r >= 2)
        assert c_count == c_full
        np.testing.assert_array_equal(counted.wear, full.wear)
        assert counted.tags == full.tags and counted.inferences == full.inferences
    # a FOR ROWS block (the naive order's row blocks) is not read as a plain product
    assert counted.affine() == (None if order == "naive" else ("X", "W", "C", "Y"))


def test_affine_is_none_for_quantized_and_data_false_refuses_them(tmp_path):
    from onnx_cinm.devices.memristor.nonideal import Q8

    prm = replace(PCM_OCC, crossbars=4)
    pl = plan(9, 130, 65, prm, "weight_stationary")
    W = np.ones((1, 130, 65), np.float32)
    path = emit_kernel(pl, prm, W, tmp_path, "q", bias=None, mode=Q8)[0]
    sim = CrossbarSimulator(path)
    X = np.ones((1, 9, 130), np.float32)
    sim.run({"X": X})
    assert sim.affine() is None
    with pytest.raises(ValueError, match="ideal kernels only"):
        sim.run({"X": X}, data=False)
    ideal = emit_kernel(pl, prm, W, tmp_path, "i", bias=None)[0]
    sim = CrossbarSimulator(ideal)
    sim.run({"X": X})
    assert sim.affine() == ("X", "W", None, "Y")


@pytest.mark.parametrize("P,G,bias", [(8, 1, True), (16, 2, False), (4, 1, True)])
def test_steady_inferences_equal_the_walked_ones(tmp_path, P, G, bias):
    """Issue 16: an inference that programs no tile and is one product per group plus a bias
    is computed directly once seen (``_run_steady``); its outputs, counters, tiles and wear are
    those of a simulator that walks the program every time, at every row count in turn, and
    a capacity-limited file (tiles written at every inference) never takes that path."""
    paths = _kernel(tmp_path, 9, 130, 65, P, G, "weight_stationary", bias=bias)[2]
    fast, walked = CrossbarSimulator(paths[0]), CrossbarSimulator(paths[0])
    walked._note_steady = lambda *a: None  # never steady: every inference walks the program
    rng = np.random.default_rng(1)
    for rows in (9, 9, 9, 4, 9, 4, 4):
        X = rng.standard_normal((G, rows, 130)).astype(np.float32)
        out_f, c_f = fast.run({"X": X})
        out_w, c_w = walked.run({"X": X})
        np.testing.assert_array_equal(out_f["Y"], out_w["Y"])
        assert c_f.as_dict() == c_w.as_dict()
        np.testing.assert_array_equal(fast.wear, walked.wear)
        assert fast.tags == walked.tags
    # the last product against numpy's, in float64
    want = np.einsum("gmk,gkn->gmn", X.astype(np.float64), fast.const["W"].astype(np.float64))
    if bias:
        want = want + fast.const["C"]
    np.testing.assert_allclose(out_f["Y"], want, rtol=1e-5, atol=1e-4 * np.sqrt(130))
    # 9x130 by 130x65 on 64x64 crossbars: 3 x 2 tiles per group, resident only when they fit
    assert bool(fast._steady) == (P >= 6 * G)
