"""Crossbar kernels over the same weights share one tile set (issue 11, finding 4): programmed
once, counted once in the residency, one weight sidecar for all of them.

Every test names its chip preset (pcm-occ: 64 x 64 crossbars, P = 4). Expected counts are
worked out by hand in the comments (Kt = ceil(K/64), Nt = ceil(N/64), T = Kt*Nt; a tile set
that fits is programmed once at load and never per inference; a set streaming alone through
``P_s`` crossbars writes ``P_s`` at load and ``T - P_s`` per use per inference); outputs are
checked against onnxruntime on the original model.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.paradigms.cim import residency
from onnx_cinm.runtime.session import InferenceSession

OCC = {"cim_preset": "pcm-occ"}


def _shared_gemms(M, K, N, uses, *, other=None, seed=0):
    """``uses`` Gemm(X_i, W, transB=1) + b_i over one W[N, K] (a chain: X_{i+1} = Y_i when
    N == K, else every Gemm reads X), then, with ``other = (K2, N2)``, one MatMul over a
    second weight W2[N, K2] fed by the last output."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32), "W")]
    nodes, outs, cur = [], [], "X"
    for i in range(uses):
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), f"b{i}"))
        nodes.append(helper.make_node("Gemm", [cur, "W", f"b{i}"], [f"Y{i}"], name=f"gemm{i}",
                                      transB=1))
        if N == K:
            cur = f"Y{i}"
        else:
            outs.append(f"Y{i}")
    last, width = f"Y{uses - 1}", N
    if other is not None:
        k2, n2 = other
        assert k2 == N
        inits.append(numpy_helper.from_array(rng.standard_normal((k2, n2)).astype(np.float32), "W2"))
        nodes.append(helper.make_node("MatMul", [last, "W2"], ["Z"], name="mm_other"))
        last, width = "Z", n2
    outs = [o for o in outs if o != f"Y{uses - 1}"] + [last]
    out_vi = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [M, width if o == last else N])
              for o in outs]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, K])],
                          out_vi, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _plans(res):
    return [(name, a) for name, _op, dev, a in res.stats["device_lowering"]["plans"]
            if dev == "memristor"]


def _run(tmp_path, res, model, runs=2):
    path = tmp_path / "out.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    feeds = random_inputs(model, seed=1)
    refs = run_onnxruntime(model, feeds)
    for _ in range(runs):
        got = sess.run(None, feeds)
        for g, r in zip(got, refs):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    recs = [r for r in sess.profile() if r["device"] == "memristor"]
    per_run = [sum(r["writes"] for r in recs if r["run"] == k) for k in range(runs)]
    return per_run, sum(r["writes"] for r in sess.load_profile()), path


def test_three_gemms_over_one_weight_program_it_once(tmp_path):
    # W is 128 x 128 on 64 x 64 crossbars: Kt = Nt = 2, T = 4 tiles <= P = 4. As one tile set
    # it fits: 4 writes at load, 0 per inference, for all three Gemms. (Planned as three
    # kernels, 12 tiles > 4 crossbars: nothing fitted P - 1 = 3, all three streamed and each
    # wrote its 4 tiles every inference: 12 writes per inference, 0 at load.)
    model = _shared_gemms(8, 128, 128, 3)
    res = optimize(model, place=[("gemm*", "memristor")], device_options=OCC)
    plans = _plans(res)
    assert len(plans) == 3
    got = [(a["cim_tiles"], a["cim_writes_load"], a["cim_writes"], a["cim_crossbars"],
            a["cim_shared"], a.get("cim_tile_users"), a.get("cim_tile_owner")) for _, a in plans]
    owner = plans[0][0]
    assert got == [(4, 4, 0, 4, 0, 3, None), (4, 0, 0, 4, 0, 3, owner), (4, 0, 0, 4, 0, 3, owner)]
    # cost placement counts the set once too: the hints break no crossbar budget (it used
    # to warn "12 tiles kept programmed > 4 crossbars")
    assert res.stats["placement"]["violations"] == []
    per_run, load, path = _run(tmp_path, res, model)
    assert per_run == [0, 0] and load == 4
    # one copy of the weight: each of the three kernel files names the same tensor of the model
    folder = artifacts.artifact_dir(path) / "memristor"
    assert not list(folder.glob("*.npy"))
    sources = {next(line.split()[-1] for line in x.read_text().splitlines()
                    if line.startswith("weight ")) for x in folder.glob("*.xbar")}
    assert len(list(folder.glob("*.xbar"))) == 3 and len(sources) == 1
    assert next(iter(sources)).startswith("model:")


def test_a_streaming_tile_set_is_loaded_once(tmp_path):
    # W[192, 128] read by two Gemms: K = 128, N = 192: Kt = 2, Nt = 3, T = 6; then W2[192, 64]:
    # Kt = 3, Nt = 1, T = 3. Sets {6 tiles x 2 uses, 3 tiles}: 9 > 4, so the knapsack fills
    # P - 1 = 3 crossbars: only the 3-tile set fits (pinned: 3 at load, 0 per inference); the
    # 6-tile set streams alone through the 1 crossbar left, serpentine: its first kernel loads
    # 1 tile, and each of its two kernels writes 6 - 1 = 5 per inference.
    model = _shared_gemms(4, 128, 192, 2, other=(192, 64))
    res = optimize(model, place=[("gemm*", "memristor"), ("mm*", "memristor")], device_options=OCC)
    got = [(a["cim_tiles"], a["cim_writes_load"], a["cim_writes"], a["cim_crossbars"],
            a["cim_shared"]) for _, a in _plans(res)]
    assert got == [(6, 1, 5, 1, 0), (6, 0, 5, 1, 0), (3, 3, 0, 3, 0)]
    per_run, load, _ = _run(tmp_path, res, model, runs=3)
    assert per_run == [10, 10, 10] and load == 4


def test_cost_placement_pins_a_shared_set_once():
    # an LSTM (hidden 64, input 64, 20 steps) on pcm-occ with P = 5: W^T [64, 256] and R^T
    # [64, 256] are 4 tiles each, 8 > 5. Pinning R (20 uses, saves 80 writes) beats W (1 use):
    # R keeps 4 crossbars, W streams alone through the 1 left: 1 write at load, 4 - 1 = 3 per
    # inference. Every kernel lands on the crossbars.
    from test_recurrent import _model

    res = optimize(_model("LSTM", 20, 1, 64, 64), device_options={**OCC, "cim_crossbars": 5},
                   check=0)
    plans = _plans(res)
    assert len(plans) == 21
    assert (sum(a["cim_writes_load"] for _, a in plans), sum(a["cim_writes"] for _, a in plans)) == (5, 3)
    assert res.stats["placement"]["violations"] == []


def test_the_knapsack_values_a_set_by_its_uses():
    # capacity 3: a 3-tile set used once saves 3 writes per inference, a 2-tile set used by
    # three kernels saves 2 * 3 = 6: pin the second. Counted per kernel (uses 1), the first.
    assert residency.pin([3, 2], [True, True], 3, [1, 3]) == {1}
    assert residency.pin([3, 2], [True, True], 3) == {0}
    # allocate: the pinned set keeps its 2 crossbars, the other streams alone through 4 - 2
    assert residency.allocate([3, 2], [True, True], 4, [1, 3]) == [(2, False), (2, False)]


@pytest.mark.parametrize("order", ["naive"])
def test_naive_order_shares_nothing(order):
    # the naive order keeps no tile: every kernel writes its own tiles, one row at a time:
    # M * Nt * Kt = 8 * 2 * 2 = 32 per kernel, none at load, no tile set recorded
    model = _shared_gemms(8, 128, 128, 2)
    res = optimize(model, place=[("gemm*", "memristor")],
                   device_options={**OCC, "cim_loop_order": order})
    got = [(a["cim_writes_load"], a["cim_writes"], a.get("cim_tile_owner")) for _, a in _plans(res)]
    assert got == [(0, 32, None), (0, 32, None)]


def test_kernels_on_another_kernels_tiles_are_priced_alike_from_the_memo():
    """The plan of a kernel on its tile set's owner's tiles is kept in the memo entry (an
    unrolled recurrence's steps are hundreds of them, priced again per polishing move): a
    second optimize in the process, memo warm, writes the plans a cold memo writes, and the
    users program nothing at load (the owner programs the 2 x 2 = 4 tiles of W[128, 128])."""
    from onnx_cinm.devices.memristor import _PLANS

    model = _shared_gemms(4, 128, 128, 3)
    _PLANS.clear()
    cold = _plans(optimize(model, check=0, device_options=OCC))
    warm = _plans(optimize(model, check=0, device_options=OCC))
    assert warm == cold
    users = [a for _, a in cold if a.get("cim_tile_owner")]
    assert len(users) == 2 and all(a["cim_writes_load"] == 0 for a in users)
    owner = [a for _, a in cold if not a.get("cim_tile_owner")]
    assert len(owner) == 1 and owner[0]["cim_writes_load"] == 4
