"""The check node by node of a failed comparison with the CINM provider (golden.compare_node_by_node).

An int8 model quantized at run time (onnxruntime's own ``quantize_dynamic`` of a small
attention block: DynamicQuantizeLinear before every product) with its Softmax and Tanh on
emulated DPUs: the DPU kernels' ``expf``/``tanhf`` round otherwise than onnxruntime's
vectorized ones, a few float32 ulps, and the DynamicQuantizeLinear after them moves such
values by whole int8 steps, so the outputs differ end to end (a trial: a correct int8
attention model failed ``compare``). Every expected number is onnxruntime's (the node's
reference body on the provider's inputs, the original model's outputs) or a count of the
model's nodes.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, golden
from onnx_cinm.dialects import cinm
from onnx_cinm.pipeline import optimize
from onnx_cinm.runtime.session import InferenceSession

S, D = 16, 64


def _attention(path) -> None:
    """A float attention block and feed-forward with a Tanh, quantized by onnxruntime."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [w("Wq", (D, D)), w("Wk", (D, D)), w("Wv", (D, D)), w("Wo", (D, D)),
             w("W1", (D, 4 * D)), w("W2", (4 * D, D)),
             numpy_helper.from_array(np.array(1 / np.sqrt(D), np.float32), "sc")]
    N = helper.make_node
    nodes = [N("MatMul", ["x", "Wq"], ["q"]), N("MatMul", ["x", "Wk"], ["k"]),
             N("MatMul", ["x", "Wv"], ["v"]), N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             N("MatMul", ["q", "kt"], ["s0"]), N("Mul", ["s0", "sc"], ["s"]),
             N("Softmax", ["s"], ["p"], axis=-1), N("MatMul", ["p", "v"], ["a"]),
             N("MatMul", ["a", "Wo"], ["o"]), N("Add", ["o", "x"], ["r"]),
             N("MatMul", ["r", "W1"], ["h"]), N("Tanh", ["h"], ["t"]),
             N("MatMul", ["t", "W2"], ["y"])]
    graph = helper.make_graph(
        nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", S, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", S, D])], inits)
    float_path = str(path) + ".float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)
    quantize_dynamic(float_path, str(path), weight_type=QuantType.QInt8)


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    """``(original path, optimized path, provider session in upmem emulate mode)``."""
    folder = tmp_path_factory.mktemp("node_by_node")
    original = folder / "attn_int8.onnx"
    _attention(original)
    res = optimize(str(original), dims={"batch": 2}, check=0,
                   place=[("Softmax", "upmem"), ("Tanh", "upmem")])
    out = folder / "opt.onnx"
    artifacts.save(res.model, out)
    sess = InferenceSession(out, provider_options=[{"upmem_mode": "emulate",
                                                    "graph_optimization": "disable_all",
                                                    "matmul": "onnxruntime"}, {}])
    return original, out, sess


def _device_nodes(path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.domain == cinm.DOMAIN
            and cinm.node_attrs(n).get("device", "host") != "host"]


def test_every_device_node_agrees_and_the_quantizer_explains_the_failure(attention):
    original, optimized, sess = attention
    nodes = _device_nodes(optimized)
    assert {cinm.node_attrs(n)["device"] for n in nodes} == {"memristor", "upmem"}
    # end to end, without the check node by node: the emulated DPUs' last bits, moved by
    # DynamicQuantizeLinear, put outputs beyond tolerance
    plain = golden.compare(str(original), sess.as_runner(), n=2, dims={"batch": 2})
    assert not plain.ok and plain.nodes is None
    report = golden.compare(str(original), sess.as_runner(), n=2, dims={"batch": 2},
                            stepwise=str(optimized))
    check = report.nodes
    assert report.ok and check.ok and report.outputs[0].by_node
    assert check.total == len(nodes) and not check.unjudged and not check.off
    assert check.quantizers == ["DynamicQuantizeLinear"]
    judged = {label: (op, device) for label, op, device, _ in check.nodes}
    assert ("cinm.Tanh", "upmem") in judged.values() and ("cinm.Softmax", "upmem") in judged.values()
    # each device node within a few float32 ulps of onnxruntime's (values below 10 here)
    worst = max(o.max_abs_err for *_, outs in check.nodes for o in outs)
    assert 0 < worst < 1e-5
    assert "OK node by node" in report.summary() and "DynamicQuantizeLinear" in report.summary()


class _Wrong:
    """The provider's runner, but one node's output as kept is 0.01 off (a wrong kernel)."""

    def __init__(self, runner, name: str):
        self.runner, self.name = runner, name
        self.input_names, self.output_names = runner.input_names, runner.output_names
        self.exact = True

    def run(self, feeds):
        return self.runner.run(feeds)

    def run_keeping(self, feeds):
        kept = self.runner.run_keeping(feeds)
        kept[self.name] = kept[self.name] + np.float32(0.01)
        return kept


def test_a_device_node_off_is_named_and_the_failure_stands(attention):
    original, optimized, sess = attention
    tanh = next(n for n in _device_nodes(optimized) if n.op_type == "Tanh")
    report = golden.compare(str(original), _Wrong(sess.as_runner(), tanh.output[0]), n=2,
                            dims={"batch": 2}, stepwise=str(optimized))
    assert not report.ok and not report.nodes.ok
    ((label, op, device, outs),) = report.nodes.off
    assert (op, device) == ("cinm.Tanh", "upmem")
    assert outs[0].max_abs_err == pytest.approx(0.01, rel=1e-3)
    assert outs[0].mismatched == outs[0].elements == 2 * 2 * S * 4 * D  # 2 runs of [2, 16, 256]
    assert f"first device node off is cinm.Tanh '{label}' on upmem" in report.summary()


def test_run_keeping_holds_what_run_returns_and_the_device_nodes_outputs(attention):
    original, optimized, sess = attention
    feeds = golden.random_inputs(str(original), seed=3, dims={"batch": 2})
    (y,) = sess.run(None, feeds)
    kept = sess.run_keeping(feeds)
    np.testing.assert_array_equal(kept["y"], y)
    tanh = next(n for n in _device_nodes(optimized) if n.op_type == "Tanh")
    t = kept[tanh.output[0]]
    assert t.shape == (2, S, 4 * D) and np.abs(t).max() <= 1.0  # a Tanh's range


def test_agreeing_nodes_explain_nothing_without_a_runtime_quantizer():
    from onnx_cinm.checkreport import NodeCheck, OutputCheck

    agree = NodeCheck(total=1, nodes=[("n", "cinm.Gemm", "memristor", [OutputCheck("y")])],
                      rewrite="")
    assert not agree.ok and "grows in the nodes after them" in agree.summary()
    agree.quantizers = ["DynamicQuantizeLinear"]
    assert agree.ok
    agree.rewrite = None  # onnxruntime on the optimized model not compared with the original
    assert not agree.ok
    agree.total, agree.rewrite, agree.unjudged = 2, "", ["im2col"]  # one more, not judged
    assert not agree.ok and "not judged" in agree.summary()


def test_a_host_node_changed_in_the_optimized_model_fails(attention, tmp_path):
    # trial s36b: the inputs of a host Sub swapped in the optimized model: every node computes
    # what it says on its inputs, so node by node alone passed 'OK node by node' with every
    # output element off. onnxruntime on the optimized model is now compared with the original
    # too: the rewrite is off, and the failure stands
    original, optimized, _ = attention
    model = onnx.load(str(optimized))
    sub = next(n for n in model.graph.node if n.op_type == "Sub" and n.domain == "")
    sub.input[0], sub.input[1] = sub.input[1], sub.input[0]
    bad = tmp_path / "swapped.onnx"
    artifacts.save(model, bad)
    sess = InferenceSession(bad, provider_options=[{"upmem_mode": "emulate",
                                                    "graph_optimization": "disable_all",
                                                    "matmul": "onnxruntime"}, {}])
    report = golden.compare(str(original), sess.as_runner(), n=2, dims={"batch": 2},
                            stepwise=str(bad))
    assert not report.ok and report.nodes is not None and not report.nodes.ok
    assert not report.nodes.off and not report.nodes.host_off  # each node as it says
    assert report.nodes.rewrite.startswith("check: 2 runs") and "FAILED" in report.nodes.rewrite
    assert "onnxruntime on the optimized model differs from the original itself" in report.summary()


def test_each_value_is_judged_at_its_own_scale():
    # an adversarial review: a UPMEM Tanh returning -tanh(x) passed on values of size 1e-7
    # (a fixed atol of 1e-5), and the DynamicQuantizeLinear after it scaled them to whole int8
    # steps. The atol is now the float32 default (1e-5) times the value's largest magnitude
    # when below 1, and at least the rounding of the model's longest sum (k terms)
    small = np.array([3e-7, -1e-7], np.float32)
    assert golden._node_atol(small, 1) == pytest.approx(1e-5 * 3e-7)
    assert golden._node_atol(np.array([5.0, -2.0], np.float32), 1) == pytest.approx(1e-5)
    assert golden._node_atol(np.zeros(3, np.float32), 1) == pytest.approx(1e-5)
    assert golden._node_atol(np.array([1, 2], np.int32), 1) is None
    ones = np.ones(4, np.float32)  # rms 1: ACCUMULATION_SIGMAS * eps * sqrt(k)
    assert golden._node_atol(ones, 10_000) == pytest.approx(
        golden.ACCUMULATION_SIGMAS * float(np.finfo(np.float32).eps) * 100)


def test_a_branch_reads_the_providers_value_as_its_if_does():
    # an adversarial review: an If whose branch quantized a UPMEM Tanh's output read
    # onnxruntime's own recomputation of it, not the provider's, and failed a correct model;
    # a value the branches read from the main graph is fed like the If's own inputs
    f = TensorProto.FLOAT
    then = helper.make_graph([helper.make_node("Relu", ["t"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", f, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["t"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", f, [2])])
    g = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]),
                           helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                          "g", [helper.make_tensor_value_info("x", f, [2]),
                                helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", f, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert golden._reads(model.graph.node[1]) == ["c", "t", "t"]
    fed = golden._reading_fed(model, {"t": np.zeros(2, np.float32)}, {})
    branches = {a.name: a.g.node[0].input[0] for a in fed.graph.node[1].attribute}
    assert branches == {"then_branch": "t" + golden.PROVIDER_SUFFIX,
                        "else_branch": "t" + golden.PROVIDER_SUFFIX}
    assert [i.name for i in fed.graph.input][-1] == "t" + golden.PROVIDER_SUFFIX
