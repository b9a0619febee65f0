"""A model with no op the devices run (luscinia's LightGBM export: a 194 MB TreeEnsembleClassifier,
Identity, Cast, ZipMap) took 3 min 12 s to optimize, 43 s of it in to_cinm opening a graph it
had nothing to lower in, and its summary said "FLOPs on devices: 0.0% of 1 FLOP"."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnx_cinm import optimize
from onnx_cinm.analysis import MAX_LISTED_ATTR, op_info
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.passes import PassContext
from onnx_cinm.passes import to_cinm as to_cinm_module


def _trees(n_nodes=3):
    """X[1, 2] -> one regression tree (a root split on feature 0 at 0.5, two leaves of
    1.0 and 2.0, ``n_nodes`` = 3) -> Y[1, 1], then Cast to float64."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["y"], name="trees", domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_values=[0.5, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    g = helper.make_graph([tree, helper.make_node("Cast", ["y"], ["Y"], name="cast", to=TensorProto.DOUBLE)],
                          "trees", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [1, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def test_to_cinm_does_not_open_a_graph_with_nothing_to_lower(monkeypatch):
    def boom(model):
        raise AssertionError("the graph was opened for rewriting")

    monkeypatch.setattr(to_cinm_module, "_Rewriter", boom)
    ctx = PassContext()
    model = _trees()
    assert to_cinm_module.to_cinm(model, ctx) is model
    assert ctx.stats["to_cinm"] == {"lowered": {}, "kept": {}}
    assert [n.op_type for n in model.graph.node] == ["TreeEnsembleRegressor", "Cast"]


def test_summary_says_no_op_runs_on_a_device():
    model = _trees()
    res = optimize(model, check=0)
    line = next(x for x in res.summary().splitlines() if x.startswith("FLOPs on devices"))
    assert line.endswith("; no op of this model is one a device runs "
                         "(TreeEnsembleRegressor x1, Cast x1 run on the host)")
    assert line.startswith("FLOPs on devices: none of ") and "%" not in line
    # x0 <= 0.5 takes the left leaf (1.0), else the right one (2.0): by hand
    feeds = {"X": np.array([[0.25, 9.0]], np.float32)}
    assert run_onnxruntime(res.model, feeds)[0].tolist() == [[1.0]]
    feeds = {"X": np.array([[0.75, -9.0]], np.float32)}
    assert run_onnxruntime(res.model, feeds)[0].tolist() == [[2.0]]


def test_long_attribute_lists_of_standard_ops_stay_out_of_op_info():
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["y"], domain="ai.onnx.ml", n_targets=1,
                            nodes_values=[0.0] * (MAX_LISTED_ATTR + 1), nodes_modes=["LEAF"])
    assert op_info(node, {}).attrs == {"n_targets": 1, "nodes_modes": [b"LEAF"]}
