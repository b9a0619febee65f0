"""The crossbar schedule (paradigms/cim/schedule.py): counts derived by hand from the formulas.

Every expected number below is worked out in the comment next to it from the definitions in the
module docstring (Kt = ceil(K/rows), Nt = ceil(N/cols), T = G*Kt*Nt, MVMs = G*M*Kt*Nt, ...).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from onnx_cinm.devices import Cost
from onnx_cinm.devices.memristor import PCM_OCC, PRESETS, RERAM_ISAAC
from onnx_cinm.paradigms.cim.schedule import plan, tile_cells

P1 = replace(PCM_OCC, crossbars=1)


def test_occ_worked_example():
    # field notes §3: M=N=K=256, T=64, P=1 -> naive (OCC tiles M by 64) 4*4*4 = 64, WS 4*4 = 16
    naive = plan(256, 256, 256, P1, "naive", m_block=64)
    ws = plan(256, 256, 256, P1)
    assert (naive.Kt, naive.Nt, naive.Mt) == (4, 4, 4)
    assert naive.writes_per_inference == 64
    assert ws.writes_cold == 16
    # WS with P=1 and 16 tiles: 1 at load, 15 per inference (the bound T-P), 16 in a cold run
    assert (ws.writes_load, ws.writes_per_inference, ws.writes_lower_bound) == (1, 15, 15)
    assert naive.mvms == ws.mvms == 256 * 16


def test_awkward_shapes_weight_stationary():
    # K=100, N=70 on 64x64: Kt=2, Nt=2, T=4; P=4 -> fits, written once at load
    p = plan(5, 100, 70, PCM_OCC)
    assert (p.Kt, p.Nt, p.tiles, p.resident) == (2, 2, 4, True)
    assert (p.writes_load, p.writes_per_inference) == (4, 0)
    assert p.cell_writes_load == 100 * 70  # 64*64 + 64*6 + 36*64 + 36*6
    assert tile_cells(100, 70, 64, 64) == [4096, 384, 2304, 216]
    assert p.mvms == 5 * 4 and p.adc_conversions == 5 * 2 * 70
    assert p.rounds == 1 and p.write_rounds == 0


def test_capacity_limited():
    # K=200, N=130: Kt=4, Nt=3, T=12 > P=4 -> load 4, per inference 8, rounds 3 (2 with writes)
    p = plan(7, 200, 130, PCM_OCC)
    assert (p.tiles, p.resident, p.writes_load, p.writes_per_inference) == (12, False, 4, 8)
    assert p.writes_per_inference == p.writes_lower_bound
    assert (p.rounds, p.write_rounds) == (3, 2)
    cells = tile_cells(200, 130, 64, 64)
    assert sum(cells) == 200 * 130
    assert p.cell_writes_load == sum(cells[:4])
    assert p.cell_writes_per_inference == ((200 * 130 - sum(cells[-4:])) + (200 * 130 - sum(cells[:4]))) // 2
    # P=5 does not divide T=12: rounds ceil(12/5)=3, 7 writes per inference
    q = plan(7, 200, 130, PCM_OCC, crossbars=5)
    assert (q.writes_load, q.writes_per_inference, q.rounds, q.write_rounds) == (5, 7, 3, 2)


def test_m1_k_small_single_tile():
    # M=1, K=10 < 64, N=3: a single partial tile
    p = plan(1, 10, 3, P1)
    assert (p.Kt, p.Nt, p.tiles, p.writes_load, p.writes_per_inference) == (1, 1, 1, 1, 0)
    assert p.cell_writes_load == 30 and p.mvms == 1 and p.adc_conversions == 3
    n = plan(1, 10, 3, P1, "naive")
    assert n.writes_per_inference == 1 and n.Mt == 1


def test_naive_counts():
    # M=9, K=130, N=65: Kt=3, Nt=2; naive m_block=1: Mt=9, writes 9*2*3 = 54; m_block=4: Mt=3 -> 18
    assert plan(9, 130, 65, PCM_OCC, "naive").writes_per_inference == 54
    n4 = plan(9, 130, 65, PCM_OCC, "mnk", m_block=4)
    assert (n4.Mt, n4.writes_per_inference, n4.writes_load) == (3, 18, 0)
    assert n4.cell_writes_per_inference == 3 * 130 * 65


def test_groups():
    # grouped conv: G=3 groups of K=27, N=8 -> T=3 tiles; P=4 -> resident
    p = plan(50, 27, 8, PCM_OCC, groups=3)
    assert (p.tiles, p.resident, p.writes_load, p.mvms) == (3, True, 3, 3 * 50)
    assert plan(50, 27, 8, PCM_OCC, "naive", groups=3).writes_per_inference == 3 * 50


def test_cost_formulas():
    # P=1, M=2, K=N=64: T=1, resident: per inference 2 MVMs, no writes
    p = plan(2, 64, 64, P1)
    c = p.cost(P1)
    assert isinstance(c, Cost) and c.writes == 0
    assert c.latency_s == pytest.approx(2 * 1e-6)
    assert c.energy_j == pytest.approx(2 * 2e-13 + 2 * 1e-6 * 1e9 * 2.1e-9)
    load = p.cost(P1, load=True)
    assert load.writes == 1 and load.latency_s == pytest.approx(2.5e-6)
    assert load.energy_j == pytest.approx(2e-10 + 2.5e-6 * 1e9 * 2.1e-9)
    # naive, P=1, M=2, K=128, N=64: Kt=2, writes 2*1*2=4, MVMs 4 -> OCC's serial sum
    n = plan(2, 128, 64, P1, "naive")
    assert n.cost(P1).latency_s == pytest.approx(4 * 2.5e-6 + 4 * 1e-6)
    # capacity-limited, P=4, K=N=192 (T=9), M=3: rounds 3, write rounds 2
    w = plan(3, 192, 192, PCM_OCC)
    assert w.cost(PCM_OCC).latency_s == pytest.approx(2 * 2.5e-6 + 3 * 3 * 1e-6)
    assert w.cost(PCM_OCC).writes == 5
    # bytes: inputs M*K*Nt + outputs M*N*Kt + cells, fp32
    assert p.bytes_moved == 4 * (2 * 64 * 1 + 2 * 64 * 1 + 0)


def test_reram_preset_and_errors():
    assert PRESETS["reram-isaac"] is RERAM_ISAAC and RERAM_ISAAC.rows == 128
    p = plan(4, 300, 200, RERAM_ISAAC)  # Kt=3, Nt=2
    assert p.tiles == 6 and p.writes_per_inference == 2
    # + DAC drives: each of the 4 x 300 inputs drives its row in each of Nt = 2 column tiles,
    # 0.42 pJ each (ISAAC's 1-bit DAC, chips.md §1.2)
    assert p.cost(RERAM_ISAAC).energy_j == pytest.approx(
        2 * RERAM_ISAAC.write_energy_j + 24 * RERAM_ISAAC.mvm_energy_j + 4 * 3 * 200 * 1.67e-12
        + 4 * 300 * 2 * 0.42e-12)
    with pytest.raises(ValueError, match="loop order"):
        plan(1, 1, 1, PCM_OCC, "kmn")
    with pytest.raises(ValueError, match="K must be"):
        plan(1, 0, 1, PCM_OCC)


def test_benchmark_targets(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "crossbar_writes.py"
    spec = importlib.util.spec_from_file_location("crossbar_writes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    recs = {r["kernel"]: r for r in mod.main(["--json", "--no-resnet"])}
    capsys.readouterr()
    for r in recs.values():
        if r["kernels"] == 1 or r["tiles"] <= 4:  # the bound is reached
            assert r["writes_opt"] == r["writes_lower_bound"], r
        else:  # kernels pinned whole: within P = 4 writes of the bound
            assert r["writes_lower_bound"] <= r["writes_opt"] <= r["writes_lower_bound"] + 4, r
        assert r["writes_sim"] == r["writes_opt"]  # the simulator counted what the plan says
    for k in ("matmul_8x1024x256", "matmul_16x1024x128"):
        assert recs[k]["writes_naive"] >= 7 * recs[k]["writes_opt"]
    # 8 x 1024 @ 1024 x 256: Kt=16, Nt=4, T=64, P=4: naive 8*64 = 512, opt 64-4 = 60
    assert (recs["matmul_8x1024x256"]["writes_naive"], recs["matmul_8x1024x256"]["writes_opt"]) == (512, 60)


def test_cells_prefix_matches_the_tile_enumeration():
    # the closed form must equal summing the enumerated tiles (groups stacked in (g, k, n) order)
    from onnx_cinm.paradigms.cim.schedule import cells_prefix

    for K, N, R, C, G in [(200, 130, 64, 64, 1), (100, 70, 64, 64, 3), (64, 64, 64, 64, 2),
                          (1, 1, 64, 64, 1), (513, 257, 128, 128, 2), (25088, 4096, 64, 64, 1)]:
        tiles = tile_cells(K, N, R, C) * G
        for count in sorted({c for c in (0, 1, 2, 3, 5, len(tiles) // 3, len(tiles) - 1, len(tiles))
                             if c <= len(tiles)}):
            assert cells_prefix(count, K, N, R, C) == sum(tiles[:count]), (K, N, R, C, G, count)


def test_plan_memo_key_of_options():
    """The crossbar plans' memo key: each plan option's value in order (None: not given), a
    list option (``cim_effects``) as a tuple, so that the key hashes and equal options meet."""
    from onnx_cinm.devices.memristor import _PLAN_OPTIONS, _options_key

    assert _options_key({}) == (None,) * len(_PLAN_OPTIONS)
    opts = {"cim_rows": 64, "cim_effects": ["drift", "noise"], "objective": "latency"}
    key = _options_key(opts)
    assert key == tuple(tuple(opts[k]) if isinstance(opts.get(k), list) else opts.get(k)
                        for k in _PLAN_OPTIONS)
    assert ("drift", "noise") in key and hash(key) == hash(_options_key(dict(opts)))
