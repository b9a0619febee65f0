"""The crossbar path end to end: cim_tiling plans -> .xbar kernels in out.cinm/ -> the execution
provider running them in the simulator.

Expected write counts are worked out from the formulas in the comments (Kt = ceil(K/64),
Nt = ceil(N/64), T = G*Kt*Nt; weight-stationary: T at load and 0 per inference when T <= P,
else P at load and T - P per inference; naive: M*Nt*Kt per inference, one row per write).
Expected numbers come from numpy / onnxruntime on the original model.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.cli import main
from onnx_cinm.dialects import cinm
from onnx_cinm.errors import CinmError
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession


def _matmul_model(M, K, N, *, const="B", bias=False, seed=0):
    """Y = X @ W (+ b) with W constant (const="B"), W @ X (const="A") or X1 @ X2 (const=None)."""
    rng = np.random.default_rng(seed)
    inits, inputs = [], []
    if const == "B":
        inputs.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, K]))
        inits.append(numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W"))
        nodes = [helper.make_node("MatMul", ["X", "W"], ["P"], name="mm")]
    elif const == "A":
        inputs.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, [K, N]))
        inits.append(numpy_helper.from_array(rng.standard_normal((M, K)).astype(np.float32), "W"))
        nodes = [helper.make_node("MatMul", ["W", "X"], ["P"], name="mm")]
    else:
        inputs += [helper.make_tensor_value_info("X1", TensorProto.FLOAT, [M, K]),
                   helper.make_tensor_value_info("X2", TensorProto.FLOAT, [K, N])]
        nodes = [helper.make_node("MatMul", ["X1", "X2"], ["P"], name="mm")]
    out = "P"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["P", "b"], ["Y"], name="bias"))
        out = "Y"
    g = helper.make_graph(nodes, "mm", inputs,
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [M, N])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


#: the CINM paper's chip (64 x 64 x 4), which the expected figures of these tests are for
OCC = {"cim_preset": "pcm-occ"}


def _crossbar_node(model):
    (node,) = [n for n in model.graph.node
               if n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device") == "memristor"]
    return cinm.node_attrs(node)


def _run(tmp_path, result, feeds, runs=2):
    path = tmp_path / "out.onnx"
    artifacts.save(result.model, path)
    sess = InferenceSession(path)
    outs = [sess.run(None, feeds) for _ in range(runs)]
    recs = [r for r in sess.profile() if r["device"] == "memristor"]
    return outs, recs, sess


# (M, K, N, P, order) -> (tiles, writes at load, writes per inference), from the formulas
CASES = [
    # K=100, N=70: Kt=2, Nt=2, T=4 <= P=4: all 4 at load, 0 per inference
    ((5, 100, 70, 4, "weight_stationary"), (4, 4, 0)),
    # K=200, N=130: Kt=4, Nt=3, T=12 > 4: 4 at load, 12-4=8 per inference
    ((7, 200, 130, 4, "weight_stationary"), (12, 4, 8)),
    # same, P=5: 5 at load, 7 per inference
    ((7, 200, 130, 5, "weight_stationary"), (12, 5, 7)),
    # M=1, K=300, N=65: Kt=5, Nt=2, T=10 > 4
    ((1, 300, 65, 4, "weight_stationary"), (10, 4, 6)),
    # K=10 < 64, N=64: a single tile
    ((8, 10, 64, 1, "weight_stationary"), (1, 1, 0)),
    # naive: M*Nt*Kt per inference, nothing at load: 7*3*4 = 84
    ((7, 200, 130, 4, "naive"), (12, 0, 84)),
    # naive, M=1, K=100 N=70: 1*2*2 = 4
    ((1, 100, 70, 4, "naive"), (4, 0, 4)),
]


@pytest.mark.parametrize("case,expected", CASES)
def test_plan_attributes_and_simulated_writes(tmp_path, case, expected):
    M, K, N, P, order = case
    tiles, w_load, w_inf = expected
    model = _matmul_model(M, K, N, bias=True)
    res = optimize(model, place=[("mm*", "memristor")],
                   device_options={"cim_preset": "pcm-occ", "cim_crossbars": P,
                                   "cim_loop_order": order})
    at = _crossbar_node(res.model)
    assert (at["cim_tiles"], at["cim_writes_load"], at["cim_writes"]) == (tiles, w_load, w_inf)
    assert (at["cim_M"], at["cim_K"], at["cim_N"], at["cim_crossbars"]) == (M, K, N, P)
    assert at["cim_mvms"] == M * tiles
    assert at["kernel"].startswith("memristor/") and at["kernel"].endswith(".xbar")
    feeds = random_inputs(model, seed=3)
    (ref,) = run_onnxruntime(model, feeds)
    outs, recs, sess = _run(tmp_path, res, feeds, runs=3)
    for (got,) in outs:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # the simulator's counters equal the formulas, on every inference (serpentine keeps P resident)
    assert [r["writes"] for r in recs] == [w_inf] * 3
    (k,) = [d for d in sess._device_nodes if d.device == "memristor"]
    assert k.kernel.load_metrics["tile_writes"] == w_load


def test_programmed_operand_a_and_activation_pair(tmp_path):
    # constant left operand: Y = W[96, 80] @ X[80, 50] -> W^T programmed (K=80, N=96)
    model = _matmul_model(96, 80, 50, const="A")
    res = optimize(model, place=[("mm*", "memristor")], device_options=OCC)
    at = _crossbar_node(res.model)
    assert at["cim_operand"] == "A" and (at["cim_K"], at["cim_N"], at["cim_M"]) == (80, 96, 50)
    feeds = random_inputs(model, seed=1)
    (ref,) = run_onnxruntime(model, feeds)
    (out,), _, _ = _run(tmp_path, res, feeds, runs=1)
    np.testing.assert_allclose(out[0], ref, rtol=1e-4, atol=1e-4)

    # two activations X1[8, 100] @ X2[100, 300]: programming X2 takes Kt*Nt = 2*5 = 10 tiles,
    # programming X1^T takes 2*1 = 2 -> A is programmed, every inference (nothing resident)
    model = _matmul_model(8, 100, 300, const=None)
    res = optimize(model, place=[("mm*", "memristor")], device_options=OCC)
    at = _crossbar_node(res.model)
    assert at["cim_operand"] == "A" and at["cim_tiles"] == 2
    assert (at["cim_writes_load"], at["cim_writes"], at["cim_resident"]) == (0, 2, 0)
    assert "both operands are activations" in at["placement"]
    feeds = random_inputs(model, seed=2)
    (ref,) = run_onnxruntime(model, feeds)
    outs, recs, _ = _run(tmp_path, res, feeds, runs=2)
    np.testing.assert_allclose(outs[1][0], ref, rtol=1e-4, atol=1e-4)
    assert [r["writes"] for r in recs] == [2, 2]


def test_activation_pair_not_chosen_by_the_heuristic():
    res = optimize(_matmul_model(8, 100, 300, const=None), placement="heuristic")
    node = next(n for n in res.model.graph.node if n.op_type == "Gemm")
    at = cinm.node_attrs(node)
    assert at["device"] != "memristor" and "memristor unless asked" in at["placement"]


def test_manifest_hashes_and_stale_kernel(tmp_path):
    model = _matmul_model(4, 100, 70)
    res = optimize(model, place=[("mm*", "memristor")])
    path = tmp_path / "m.onnx"
    manifest = artifacts.save(res.model, path)
    root = tmp_path / "m.cinm"
    (kernel,) = manifest["kernels"]
    # one file: the weights stay in the model, which the .xbar file names (issue 16)
    assert [f["path"] for f in kernel["files"]] == [kernel["kernel"]]
    on_disk = json.loads((root / "manifest.json").read_text())
    assert on_disk == manifest
    node = next(n for n in res.model.graph.node if n.op_type == "Gemm")
    assert f"weight W 1 100 70 model:{node.input[1]}" in (root / kernel["kernel"]).read_text()
    InferenceSession(path)  # fresh: fine
    xbar = root / kernel["kernel"]
    xbar.write_text(xbar.read_text().replace("BARRIER", "BARRIER ", 1))
    with pytest.raises(CinmError, match="stale"):
        InferenceSession(path)
    xbar.unlink()
    with pytest.raises(CinmError, match="missing"):
        InferenceSession(path)


@pytest.mark.parametrize("const", ["B", "A"])
def test_weights_are_stored_once(const, tmp_path):
    """Issue 16: the crossbar kernels used to copy their weights into ``.npy`` sidecars beside
    the model that already held them (494 MB twice on VGG19). The output model plus its
    kernel folder must not be larger than the input plus what the plans add (the ``.xbar``
    text, the manifest and the nodes' plan attributes, 64 KiB here), and the kernel reads the
    weights from the model: a 512 x 512 crossbar Gemm (1 MiB of weights) under a weight name
    with a space and a ``#`` (a comment in a ``.xbar`` file), checked against numpy."""
    model = _matmul_model(4, 512, 512, const=const, bias=const == "B")
    for init in model.graph.initializer:
        if init.name == "W":
            init.name = "my W #1"
    for node in model.graph.node:
        node.input[:] = ["my W #1" if n == "W" else n for n in node.input]
    src = tmp_path / "in.onnx"
    onnx.save(model, str(src))
    res = optimize(src, place=[("mm*", "memristor")], check=0,
                   device_options={"cim_preset": "pcm-occ"})
    out = tmp_path / "out.onnx"
    artifacts.save(res.model, out)
    folder = [p for p in (tmp_path / "out.cinm").rglob("*") if p.is_file()]
    assert folder and all(p.suffix in (".xbar", ".json") for p in folder)
    total = out.stat().st_size + sum(p.stat().st_size for p in folder)
    assert total <= src.stat().st_size + sum(p.stat().st_size for p in folder) + 64 * 1024
    feeds = random_inputs(res.model, seed=1)
    W = numpy_helper.to_array(model.graph.initializer[0])
    (x,) = feeds.values()
    want = x @ W if const == "B" else W @ x
    if const == "B":
        want = want + numpy_helper.to_array(model.graph.initializer[1])
    sess = InferenceSession(out)
    assert [r["device"] for r in sess.profile()] == []
    got = sess.run(None, feeds)[0]
    assert any(r["device"] == "memristor" for r in sess.profile())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_resave_replaces_and_all_host_removes_the_kernel_folder(tmp_path):
    model = _matmul_model(4, 100, 70)
    path = tmp_path / "m.onnx"
    artifacts.save(optimize(model, place=[("mm*", "memristor")]).model, path)
    assert (tmp_path / "m.cinm" / "manifest.json").is_file()
    artifacts.save(optimize(model, place=[("*", "host")]).model, path)
    assert not (tmp_path / "m.cinm").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    (tmp_path / "m.cinm").mkdir()  # not ours: refused, nothing written
    (tmp_path / "m.cinm" / "notes.txt").write_text("mine")
    with pytest.raises(CinmError, match="not an onnx-cinm kernel folder"):
        artifacts.save(optimize(model, place=[("mm*", "memristor")]).model, path)
    assert (tmp_path / "m.cinm" / "notes.txt").read_text() == "mine"


def test_cli_report_and_loop_order(tmp_path, capsys):
    model = _matmul_model(8, 200, 130)
    src = tmp_path / "in.onnx"
    onnx.save(model, src)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--place", "mm*=memristor",
                 "--cim-preset", "pcm-occ"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.strip().startswith("mm"))
    # one kernel alone on P=4 crossbars; T = 4*3 = 12 > 4: 4 writes at load, 8 per inference,
    # MVMs 8*12 = 96
    assert row.split()[3:8] == ["4", "12", "4", "8", "96"]
    assert main(["optimize", str(src), "-o", str(out), "--place", "mm*=memristor",
                 "--cim-loop-order", "naive", "--cim-crossbars", "2", "--cim-size", "128x128",
                 "--cim-preset", "pcm-occ"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.strip().startswith("mm"))
    # 128x128: Kt=2, Nt=2, T=4; naive: 8*2*2 = 32 writes per inference, none at load
    assert row.split()[3:8] == ["2", "4", "0", "32", "32"]
    assert "crossbars of 128x128 shared by the model, naive order" in text
    with pytest.raises(SystemExit) as exc:
        main(["optimize", str(src), "-o", str(out), "--cim-size", "64"])
    assert exc.value.code == 2


def _chain(M, dims, seed=0):
    """X[M, dims[0]] @ W0[dims[0], dims[1]] @ W1[dims[1], dims[2]] ..., constant weights."""
    rng = np.random.default_rng(seed)
    nodes, inits, cur = [], [], "X"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"Y{i}"], name=f"mm{i}"))
        cur = f"Y{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, dims[0]])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [M, dims[-1]])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# dims -> per kernel (tiles, writes at load, writes per inference, crossbars, shared), P = 4
SHARING = [
    # tiles 1 and 1*2 = 2: 3 <= 4, everything resident
    ([64, 64, 128], [(1, 1, 0, 1, 0), (2, 2, 0, 2, 0)]),
    # tiles 2, 2, 5 = 9 > 4: the most tiles fitting P-1 = 3 crossbars is one kernel of 2 (the
    # first); the other two stream through the 2 left and evict each other: 2 and 5 per inference
    ([64, 128, 64, 320], [(2, 2, 0, 2, 0), (2, 0, 2, 2, 1), (5, 0, 5, 2, 1)]),
    # tiles 1 and 10: pin the 1; the 10 streams alone through 3 crossbars, serpentine: 3 at
    # load, 10 - 3 = 7 per inference
    ([64, 64, 640], [(1, 1, 0, 1, 0), (10, 3, 7, 3, 0)]),
]


@pytest.mark.parametrize("dims,expected", SHARING)
def test_kernels_share_the_crossbars(tmp_path, dims, expected):
    model = _chain(8, dims)
    res = optimize(model, place=[("mm*", "memristor")], device_options=OCC)
    plans = [a for *_, a in res.stats["cim_tiling"]["plans"]]
    got = [(a["cim_tiles"], a["cim_writes_load"], a["cim_writes"], a["cim_crossbars"],
            a["cim_shared"]) for a in plans]
    assert got == expected
    feeds = random_inputs(model, seed=0)
    (ref,) = run_onnxruntime(model, feeds)
    outs, recs, sess = _run(tmp_path, res, feeds, runs=3)
    np.testing.assert_allclose(outs[-1][0], ref, rtol=1e-4, atol=1e-4)
    per_run = [sum(r["writes"] for r in recs if r["run"] == k) for k in range(3)]
    assert per_run == [sum(e[2] for e in expected)] * 3
    assert sum(r["writes"] for r in sess.load_profile()) == sum(e[1] for e in expected)


def test_crossbar_table_shows_long_kernel_names_whole(tmp_path, capsys):
    """A fresh user's finding: the optimize summary's crossbar table cut names at 30 characters,
    so 20 of a detector's 22 rows read '/model/model/conv/conv_net/con'."""
    model = _matmul_model(8, 128, 128)
    long = "/model/model/conv/conv_net/conv_block_3/layer_7/mm"
    model.graph.node[0].name = long
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--check",
                 "0", "--place", "*=memristor", "--cim-preset", "pcm-occ"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith(long)]
    assert len(rows) == 1 and rows[0].split()[0] == f"{long}/Gemm"
