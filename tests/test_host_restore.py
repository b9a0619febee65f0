"""A node ``to_cinm`` lowered goes back to the original op when its cinm ops all stay on the host,
or when the original on the host costs less than the lowered ops as placed (fsmn_vad: each
grouped Conv became Im2Col + Gemm on 128 single-column crossbar tiles, 4.44 ms / 82.2 mJ
modeled against 2.24 ms / 67.3 mJ for the original on the host).

References: onnxruntime on the original model (outputs, compared exactly: the restored op is
the original's), and cost placement of the original with nothing lowered (``lower_ops=()``),
an independent path (no to_cinm, no restore) to "the original model on the host".
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime


def _grouped_conv(groups=128, k=20, t=98, seed=0):
    """fsmn_vad's memory block: X[1, G, T, 1] -> depthwise Conv (G groups, kernel k x 1,
    same padding) -> Add X."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((groups, 1, k, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["X", "W"], ["c"], name="conv", group=groups,
                              kernel_shape=[k, 1], pads=[k - 1, 0, 0, 0]),
             helper.make_node("Add", ["c", "X"], ["Y"], name="add")]
    g = helper.make_graph(nodes, "fsmn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, groups, t, 1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, groups, t, 1])],
                          [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _softmax_mean():
    """Softmax over axis 0 (lowered as Transpose, Softmax, Transpose) then ReduceMean over axis
    1 (Reduce add, Div): small work, which cost placement leaves on the host."""
    g = helper.make_graph([helper.make_node("Softmax", ["X"], ["S"], name="sm", axis=0),
                           helper.make_node("ReduceMean", ["S"], ["Y"], name="rm", axes=[1], keepdims=1)],
                          "sm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 6])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _exact(res, model):
    onnx.checker.check_model(res.model, full_check=True)
    assert not {v.name for v in res.model.graph.value_info} - \
        {o for n in res.model.graph.node for o in n.output}  # no stale intermediate values
    feeds = random_inputs(model, seed=3)
    for got, want in zip(run_onnxruntime(res.model, feeds), run_onnxruntime(model, feeds)):
        np.testing.assert_array_equal(got, want)


def test_lowered_nodes_left_on_the_host_are_the_originals_again():
    model = _softmax_mean()
    lowered = optimize(model, check=0, skip=["restore_host_ops"]).model
    assert [n.op_type for n in lowered.graph.node] == ["Transpose", "Softmax", "Transpose", "Reduce", "Div"]
    res = optimize(model, check=0)
    assert [(n.op_type, n.domain) for n in res.model.graph.node] == [("Softmax", ""), ("ReduceMean", "")]
    assert res.stats["restore_host_ops"] == {"restored": {"Softmax": 1, "ReduceMean": 1}, "cheaper": 0}
    _exact(res, model)


def test_a_grouped_conv_cheaper_on_the_host_keeps_the_conv():
    model = _grouped_conv()
    res = optimize(model, check=0)
    assert [n.op_type for n in res.model.graph.node] == ["Conv", "Add"]
    # the Conv's Gemm was placed on a device
    # and came back because the Conv on the host costs less
    assert res.stats["restore_host_ops"] == {"restored": {"Conv": 1}, "cheaper": 1}
    _exact(res, model)
    # the original on the host, priced with nothing lowered
    ref = optimize(model, check=0, device_options={"lower_ops": ()}).stats["placement"]
    st = res.stats["placement"]
    host = st["baselines"]["all-host"]
    assert host.latency_s == pytest.approx(ref["totals"].latency_s, rel=1e-9)
    assert host.energy_j == pytest.approx(ref["totals"].energy_j, rel=1e-9)
    assert st["totals"].energy_j <= host.energy_j * (1 + 1e-12)
    # lowered and placed as to_cinm made it, the objective was worse than the Conv on the host
    lowered = optimize(model, check=0, skip=["restore_host_ops"]).stats["placement"]
    assert lowered["totals"].energy_j > host.energy_j


def test_stop_after_placement_shows_the_restored_op():
    res = optimize(_softmax_mean(), check=0, stop_after="placement")
    assert [n.op_type for n in res.model.graph.node] == ["Softmax", "ReduceMean"]


def test_a_hinted_group_keeps_its_lowering():
    # the user placed it: the hint stays visible in the placement reason of its cinm ops
    res = optimize(_softmax_mean(), check=0, place=[("sm*", "host")])
    assert [n.op_type for n in res.model.graph.node] == ["Transpose", "Softmax", "Transpose", "ReduceMean"]


def test_a_qdq_conv_is_not_put_back_on_dequantized_values_its_lowering_dropped(tmp_path):
    """onnxruntime's QDQ format: Conv reads DequantizeLinear outputs; its lowering reads the
    integer operands and drops those DequantizeLinear nodes, so restoring the Conv would read
    values no node makes. The optimized model must load and match onnxruntime."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    f32, qdq = tmp_path / "f32.onnx", tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), f32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = 4

        def get_next(self):
            self.left -= 1
            return {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} if self.left >= 0 else None

    quantize_static(str(f32), str(qdq), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    original = onnx.load(qdq)
    assert "DequantizeLinear" in {n.op_type for n in original.graph.node}
    res = optimize(original, check=0)
    onnx.checker.check_model(res.model, full_check=True)
    feeds = random_inputs(original, seed=3)
    np.testing.assert_array_equal(run_onnxruntime(res.model, feeds)[0], run_onnxruntime(original, feeds)[0])


def test_a_conv_far_cheaper_on_its_crossbar_is_not_priced_again(monkeypatch):
    """A 3x3 conv of 64 -> 64 channels on 56 x 56: its original on the host costs more than
    its lowered ops plus every transfer they touch, so restore_host_ops prices no trial with
    it put back: no whole-graph evaluation at all (the original all-host is the sum of its
    nodes' host costs, :func:`evaluate_on_host`; the model as placed is priced from the
    problem placement built)."""
    from onnx_cinm.passes import cost_placement

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["X", "W"], ["Y"], name="conv", pads=[1, 1, 1, 1])],
                          "c", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64, 56, 56])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 64, 56, 56])],
                          [numpy_helper.from_array(w, "W")])
    import sys

    calls = []  # the modules calling evaluate_model (the written model's totals count too)
    real = cost_placement.evaluate_model
    monkeypatch.setattr(cost_placement, "evaluate_model", lambda *a, **k: calls.append(
        sys._getframe(1).f_globals["__name__"]) or real(*a, **k))
    res = optimize(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), check=0)
    assert res.stats["restore_host_ops"]["restored"] == {}
    assert {cinm_dev for _, _, cinm_dev, _ in res.placements} >= {"memristor"}
    assert calls.count("onnx_cinm.passes.host_restore") == 0


def test_the_all_host_totals_without_a_problem_are_those_of_the_problem():
    """``evaluate_on_host`` sums the host costs of a model whose ops all run on the host, with no
    problem built: its totals must equal, bit for bit, those ``evaluate_model`` gives the same
    model (every cinm op of a lowered conv + add with no device, so on the host), its fixed
    choices those of that problem's non-cinm nodes, and its latency the sum of the host
    roofline of each node, priced one by one here."""
    from onnx_cinm import devices
    from onnx_cinm.analysis import op_info, tensor_infos
    from onnx_cinm.dialects import cinm
    from onnx_cinm.passes.cost_placement import evaluate_model, evaluate_on_host

    model = optimize(_grouped_conv(groups=8, k=3, t=16), check=0, stop_after="cinm").model
    nodes = list(model.graph.node)
    assert any(n.domain == cinm.DOMAIN for n in nodes) and any(n.domain != cinm.DOMAIN for n in nodes)
    infos = tensor_infos(model)
    tot, fixed = evaluate_on_host(nodes, {}, infos)
    ref, bad, prob = evaluate_model(model, {}, infos)
    assert bad == [] and tot == ref
    assert fixed == prob.fixed and fixed.keys() == {i for i, n in enumerate(nodes) if n.domain != cinm.DOMAIN}
    host = devices.get_device("host")
    assert tot.latency_s == pytest.approx(sum(host.cost(op_info(n, infos), {}).latency_s for n in nodes),
                                          rel=1e-12)
    assert tot.transfer_bytes == 0 and tot.energy_j > 0


def test_the_model_as_placed_is_priced_from_the_placement_problem_only_while_it_is_that_model():
    """restore_host_ops prices the model as placed from the problem the placement pass built
    (``ctx.placed``) instead of building it again: that must give exactly the totals of a
    problem built afresh for the placed model (``evaluate_model``), and nothing for another
    model (a copy: other node objects) or other options."""
    from onnx_cinm.passes import DEFAULT_PIPELINE, PassContext, PassManager
    from onnx_cinm.passes.cost_placement import evaluate_model

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((16, 64, 1, 1)) * 0.05).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["X", "W1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "W2"], ["Y"], name="conv2")],
        "c", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 16, 56, 56])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    ctx = PassContext()
    upto = DEFAULT_PIPELINE[:DEFAULT_PIPELINE.index("placement") + 1]
    placed = PassManager(pipeline=upto).run(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), ctx)
    infos = ctx.tensor_infos(placed)
    tot, prob = ctx.placed.priced(placed, ctx.options, dict(infos))
    fresh, _, _ = evaluate_model(placed, ctx.options, infos)
    assert vars(tot) == vars(fresh) and tot.transfer_bytes > 0
    assert {ch.device for ch in prob.assign.values()} >= {"memristor", "host"}
    copy = onnx.ModelProto()
    copy.CopyFrom(placed)
    assert ctx.placed.priced(copy, ctx.options, infos) is None
    assert ctx.placed.priced(placed, {**ctx.options, "objective": "latency"}, infos) is None


_AFTER = ("fold_layouts", "cim_tiling", "cnm_mapping", "device_lowering")


def _inferences(monkeypatch, model, forget_after_restore=False, **options):
    """Optimize ``model``; count the whole-graph shape inferences each pass runs through its
    context (:meth:`PassContext.tensor_infos`). ``forget_after_restore``: drop the context's
    infos after ``restore_host_ops`` whatever it did (as before it kept them), so the passes
    after it infer afresh. Returns the result and ``Counter({pass: inferences})``."""
    from collections import Counter

    from onnx_cinm import analysis, passes

    passes._load_all()
    current, calls, real = [None], Counter(), analysis.tensor_infos

    def counting(*a, **k):
        calls[current[0]] += 1
        return real(*a, **k)

    monkeypatch.setattr(analysis, "tensor_infos", counting)
    for name, (fn, doc) in list(passes._REGISTRY.items()):
        def wrapped(m, ctx, fn=fn, name=name):
            current[0] = name
            try:
                return fn(m, ctx)
            finally:
                current[0] = None
                if forget_after_restore and name == "restore_host_ops":
                    ctx.forget_infos()
        monkeypatch.setitem(passes._REGISTRY, name, (wrapped, doc))
    return optimize(model, check=0, **options), calls


def test_nothing_restored_keeps_the_placements_tensor_infos(monkeypatch):
    """With nothing to restore, the passes after restore_host_ops reuse the infos the
    placement inferred, and the model is the one fresh inferences give."""
    from onnx_cinm.examples import get_example

    model = get_example("lenet")
    res, calls = _inferences(monkeypatch, model, placement="heuristic")
    assert res.stats["restore_host_ops"]["restored"] == {}
    assert res.stats["device_lowering"]["nodes"]  # the passes after it had nodes to plan
    assert sum(calls[p] for p in _AFTER) == 0, calls
    fresh, fresh_calls = _inferences(monkeypatch, model, forget_after_restore=True,
                                     placement="heuristic")
    assert sum(fresh_calls[p] for p in _AFTER) == 1, fresh_calls
    assert fresh.model.SerializeToString() == res.model.SerializeToString()


def test_a_restore_makes_the_passes_after_it_infer_again(monkeypatch):
    """Restoring rewrites the graph: the infos from before are dropped and inferred again for
    the device nodes left (the grouped Conv goes back to the host, a MatMul after it stays on
    its crossbar)."""
    model = _grouped_conv()
    g = model.graph
    w2 = np.random.default_rng(1).standard_normal((98, 256)).astype(np.float32)
    g.initializer.extend([numpy_helper.from_array(w2, "W2"),
                          numpy_helper.from_array(np.array([128, 98], np.int64), "shape")])
    g.node[-1].output[0] = "a"
    g.node.extend([helper.make_node("Reshape", ["a", "shape"], ["r"], name="reshape"),
                   helper.make_node("MatMul", ["r", "W2"], ["Y"], name="mm")])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, [128, 256]))
    res, calls = _inferences(monkeypatch, model)
    assert res.stats["restore_host_ops"]["restored"] == {"Conv": 1}
    assert res.stats["device_lowering"]["nodes"] == {"memristor": 1}
    assert sum(calls[p] for p in _AFTER) == 1, calls
    _exact(res, model)


def test_the_all_host_totals_take_the_placement_problems_host_costs_for_its_nodes(monkeypatch):
    """``evaluate_on_host`` takes the host choice of every node the placement's problem
    (``ctx.placed``) holds from it instead of pricing it again (a cinm op's host candidate
    whatever device it was placed on, another node's fixed choice): the totals must be those
    priced node by node without it, no node priced, a node the problem does not hold (a
    copy) priced, and under other options (a slower host roofline) nothing taken from it,
    every node priced."""
    from onnx_cinm.dialects import cinm
    from onnx_cinm.passes import (
        DEFAULT_PIPELINE,
        PassContext,
        PassManager,
        cost_placement,
    )

    ctx = PassContext()
    upto = DEFAULT_PIPELINE[:DEFAULT_PIPELINE.index("placement") + 1]
    placed = PassManager(pipeline=upto).run(_grouped_conv(groups=8, k=3, t=16), ctx)
    infos = ctx.tensor_infos(placed)
    nodes = list(placed.graph.node)
    outside = sum(n.domain != cinm.DOMAIN for n in nodes)
    assert 0 < outside < len(nodes)
    assert any(cinm.node_attrs(n).get("device", "host") != "host" for n in nodes)
    priced = []
    real = cost_placement.op_info
    monkeypatch.setattr(cost_placement, "op_info", lambda n, i: priced.append(n.name) or real(n, i))
    reused = cost_placement.evaluate_on_host(nodes, ctx.options, infos, ctx.placed)
    assert priced == []
    assert reused == cost_placement.evaluate_on_host(nodes, ctx.options, infos)
    assert len(priced) == len(nodes)
    priced.clear()
    copy = onnx.NodeProto.FromString(nodes[-1].SerializeToString())
    assert cost_placement.evaluate_on_host([*nodes[:-1], copy], ctx.options, infos,
                                           ctx.placed) == reused
    assert priced == [copy.name]
    # restore_host_ops's infos: a copy with the lowered nodes' weights added. A name no node
    # reads changes nothing; a node one of whose tensors gets an info the placement had not is
    # priced again, it alone
    priced.clear()
    more = {**infos, "not_read_by_any_node": infos[nodes[0].output[0]]}
    assert cost_placement.evaluate_on_host(nodes, ctx.options, more, ctx.placed) == reused
    assert priced == []
    name = nodes[-1].output[0]
    fewer = {k: v for k, v in infos.items() if k != name}
    placed_fewer = cost_placement.Placed(ctx.placed.problem, fewer, ctx.placed.options)
    assert cost_placement.evaluate_on_host(nodes, ctx.options, infos, placed_fewer) == reused
    assert priced == [n.name for n in nodes if name in (*n.input, *n.output)]
    slow_opts = {**ctx.options, "host_roofline": "0.001,0.001"}  # GFLOP/s, GB/s
    priced.clear()
    slow = cost_placement.evaluate_on_host(nodes, slow_opts, infos, ctx.placed)
    assert len(priced) == len(nodes)
    assert slow[0].latency_s > 100 * reused[0].latency_s


def test_a_filled_grouped_conv_cheaper_on_the_host_gets_its_weight_back():
    """fsmn_vad's block with a weight of one value (ConstantOfShape, as the light models'):
    to_cinm makes that initializer its Gemm matrix without copying it and holds a FillWeight
    of it; the Conv put back on the host reads the weight as it was, of the value repeated."""
    groups, k, t = 128, 20, 98
    nodes = [helper.make_node("ConstantOfShape", ["W_shape"], ["W"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.125])),
             helper.make_node("Conv", ["X", "W"], ["c"], name="conv", group=groups,
                              kernel_shape=[k, 1], pads=[k - 1, 0, 0, 0]),
             helper.make_node("Add", ["c", "X"], ["Y"], name="add")]
    g = helper.make_graph(nodes, "fsmn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, groups, t, 1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, groups, t, 1])],
                          [numpy_helper.from_array(np.array([groups, 1, k, 1], np.int64), "W_shape")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, check=0)
    assert [n.op_type for n in res.model.graph.node] == ["Conv", "Add"]
    assert res.stats["restore_host_ops"] == {"restored": {"Conv": 1}, "cheaper": 1}
    [w] = res.model.graph.initializer
    assert (w.name, list(w.dims), w.data_type) == ("W", [groups, 1, k, 1], TensorProto.FLOAT)
    assert w.raw_data == np.full((groups, 1, k, 1), 0.125, np.float32).tobytes()
    _exact(res, model)


def test_rewritten_reasons_leave_a_hinted_ops_text_as_it_was():
    """restore_host_ops rewrites cost placement's reasons for the model it leaves; an op a hint
    placed keeps the hint's text (the user's choice, not the cost model's)."""
    from onnx_cinm.dialects import cinm as _cinm
    from onnx_cinm.passes.host_restore import _rewrite_reasons

    g = onnx.helper.make_graph([
        _cinm.make_node("Relu", ["x"], ["a"], name="hinted", device="upmem",
                        placement="hint Relu=upmem: 1 us"),
        _cinm.make_node("Relu", ["a"], ["b"], name="costed", device="host",
                        placement="cost[energy]: host 1 us"),
        onnx.helper.make_node("Relu", ["b"], ["y"], name="std")], "g", [], [])
    _rewrite_reasons(g, {"hinted": "cost[energy]: new", "costed": "cost[energy]: new",
                         "std": "cost[energy]: new"})
    texts = [{a.name: a.s.decode() for a in n.attribute}.get("placement") for n in g.node]
    assert texts == ["hint Relu=upmem: 1 us", "cost[energy]: new", None]
