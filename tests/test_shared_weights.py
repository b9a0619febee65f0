"""A weight used through ``Identity`` nodes (or stored twice under two names) is one initializer:
stored once in the optimized model, and its crossbar kernels share one tile set (the finding on
chython-rxnmap: 54 ``Identity`` nodes of shared layer weights became 54 copies, an 85 MB model
written as 643 MB).

Tile counts by hand on pcm-occ (64 x 64 crossbars, P = 4): W[128, 128] is Kt = Nt = 2, T = 4
tiles; one set fits P, so it is programmed once at load and written 0 times per inference.
Outputs are checked against onnxruntime on the original model.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.passes import PassContext
from onnx_cinm.passes.shared_weights import share_weights
from onnx_cinm.runtime.session import InferenceSession

OCC = {"cim_preset": "pcm-occ"}
W_BYTES = 128 * 128 * 4


def _model(rng, *, copy=True):
    """X[8,128] @ Identity(W) -> Relu -> @ Identity(Identity(W)) -> Relu -> @ Wc, where Wc is a
    byte-identical copy of W under another name (with ``copy``; else W itself)."""
    w = (rng.standard_normal((128, 128)) / np.sqrt(128)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    if copy:
        inits.append(numpy_helper.from_array(w.copy(), "Wc"))
    nodes = [helper.make_node("Identity", ["W"], ["W_1"], name="id1"),
             helper.make_node("Identity", ["W"], ["W_2a"], name="id2a"),
             helper.make_node("Identity", ["W_2a"], ["W_2"], name="id2b"),
             helper.make_node("MatMul", ["X", "W_1"], ["h1"], name="mm1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "W_2"], ["h2"], name="mm2"),
             helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
             helper.make_node("MatMul", ["r2", "Wc" if copy else "W"], ["Y"], name="mm3")]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 128])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, 128])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _plans(res):
    return [(name, a) for name, _op, dev, a in res.stats["device_lowering"]["plans"]
            if dev == "memristor"]


def _size(path):
    return sum(f.stat().st_size for f in [path, *artifacts.artifact_dir(path).rglob("*")] if f.is_file())


def test_identity_uses_and_copies_of_a_weight_share_one_tile_set(tmp_path):
    model = _model(np.random.default_rng(0))
    res = optimize(model, place=[("mm*", "memristor")], device_options=OCC)
    assert res.stats["share_weights"] == {"identities": 3, "merged": 1}
    floats = [t for t in res.model.graph.initializer if t.data_type == TensorProto.FLOAT
              and list(t.dims) == [128, 128]]
    assert [t.name for t in floats] == ["W"]
    plans = _plans(res)
    got = [(a["cim_tiles"], a["cim_writes_load"], a["cim_writes"], a.get("cim_tile_owner"))
           for _, a in plans]
    owner = plans[0][0]
    assert got == [(4, 4, 0, None), (4, 0, 0, owner), (4, 0, 0, owner)]
    path = tmp_path / "out.onnx"
    artifacts.save(res.model, path)
    # the weight's 64 KiB once (three copies before: > 3 x 64 KiB), plus the kernels' text
    assert W_BYTES < _size(path) < 2 * W_BYTES
    feeds = random_inputs(model, seed=1)
    ref = run_onnxruntime(model, feeds)[0]
    got = InferenceSession(path).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_pinned_identities_stay():
    # Identity(W) as a graph output keeps its name; an Identity of an initializer that is also
    # a graph input (a value the caller may override) is not a constant and stays too
    model = _model(np.random.default_rng(1), copy=False)
    g = model.graph
    g.output.append(helper.make_tensor_value_info("W_1", TensorProto.FLOAT, [128, 128]))
    g.initializer.append(numpy_helper.from_array(np.ones((1,), np.float32), "S"))
    g.input.append(helper.make_tensor_value_info("S", TensorProto.FLOAT, [1]))
    g.node.append(helper.make_node("Identity", ["S"], ["S_1"], name="ids"))
    g.output.append(helper.make_tensor_value_info("S_1", TensorProto.FLOAT, [1]))
    feeds = {"X": np.random.default_rng(2).standard_normal((8, 128)).astype(np.float32),
             "S": np.array([3.0], np.float32)}
    ref = run_onnxruntime(model, feeds)
    ctx = PassContext()
    share_weights(model, ctx)
    # id2a and id2b go (mm2 reads W); id1 is a graph output: it stays; ids reads no constant
    assert ctx.stats["share_weights"] == {"identities": 2, "merged": 0}
    kept = {n.name: list(n.input) for n in g.node if n.op_type == "Identity"}
    assert kept == {"id1": ["W"], "ids": ["S"]}
    assert [n.input[1] for n in g.node if n.op_type == "MatMul"] == ["W", "W", "W"]
    for got, want in zip(run_onnxruntime(model, feeds), ref):
        np.testing.assert_array_equal(got, want)


def test_merged_counts_the_copies_and_leaves_other_initializers_alone():
    """One byte-identical copy (B of A) among unread initializers, one of them also a graph
    input: the pass merges B into A (merged 1) and deletes nothing else (unused weights are
    fold_constants' business, graph inputs the user's)."""
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    inits = [numpy_helper.from_array(w, "A"), numpy_helper.from_array(w.copy(), "B"),
             numpy_helper.from_array(np.zeros(3, np.float32), "unused"),
             numpy_helper.from_array(np.zeros(5, np.float32), "opt_in")]
    f = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph([helper.make_node("MatMul", ["X", "A"], ["m"]),
                           helper.make_node("MatMul", ["m", "B"], ["Y"])], "g",
                          [f("X", [4, 4]), f("opt_in", [5])], [f("Y", [4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ctx = PassContext()
    share_weights(m, ctx)
    assert ctx.stats["share_weights"] == {"identities": 0, "merged": 1}
    assert [t.name for t in m.graph.initializer] == ["A", "unused", "opt_in"]
    assert [list(n.input) for n in m.graph.node] == [["X", "A"], ["m", "A"]]
