"""Tensors crossing between the models the execution provider cuts out of an optimized one (host
partitions, If branches) keep the shapes the whole model knows: a Resize whose ``sizes`` is
computed (``Shape -> Slice -> Concat``) in one host partition and read in another, after a
crossbar product, must load and run as onnxruntime runs the original.

Expected outputs come from stock onnxruntime on the original model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime import InferenceSession

C, H, W, OUT = 3, 16, 64, 24  # input [n, 3, 16, 64]; the product's weights [64, 64]
_RNG = np.random.default_rng(5)
WEIGHTS = _RNG.standard_normal((W, W)).astype(np.float32)


def _sizes_nodes(x: str) -> list:
    """``sizes = Concat(Shape(x)[:2], [24, 24])``: int64 [4], computed at run time."""
    return [helper.make_node("Shape", [x], ["shape"]),
            helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
            helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0)]


def _consts() -> list:
    return [numpy_helper.from_array(WEIGHTS, "Wt"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([OUT, OUT], np.int64), "hw"),
            numpy_helper.from_array(np.array([-1, C, H, W], np.int64), "chw")]


def _resize_model() -> onnx.ModelProto:
    """y = Resize(Reshape(MatMul(x, Wt), [-1, 3, 16, 64]), sizes = Concat(Shape(x)[:2],
    [24, 24])), cubic; x [n, 3, 16, 64] with a dynamic n, so ``sizes`` cannot be folded: it is
    made before the product (which the crossbar runs) and read after it, in the next host
    partition, where the Reshape gives the Resize's input its rank (4) whatever the partition
    declares for the product: onnx's Resize checks ``sizes`` has as many elements."""
    nodes = _sizes_nodes("x") + [
        helper.make_node("MatMul", ["x", "Wt"], ["p"], name="proj"),
        helper.make_node("Reshape", ["p", "chw"], ["r"]),
        helper.make_node("Resize", ["r", "", "", "sizes"], ["y"], mode="cubic", name="up")]
    g = helper.make_graph(
        nodes, "resize_after_crossbar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, OUT, OUT])], _consts())
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _if_resize_model() -> onnx.ModelProto:
    """y = If(c, then: Resize(Reshape(MatMul(x, Wt)), sizes), else: Resize(Reshape(x), sizes))
    with ``sizes`` computed in the main graph (as above) and captured by both branches; the
    then-branch's product runs on the crossbar, so the provider runs each branch as a model of
    its own whose input ``sizes`` crosses from the main graph (both give [n, 3, 24, 24])."""
    def out(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "Wt"], ["tp"], name="then_proj"),
         helper.make_node("Reshape", ["tp", "chw"], ["tr"]),
         helper.make_node("Resize", ["tr", "", "", "sizes"], ["t"], mode="linear", name="then_up")],
        "then", [], [out("t")])
    other = helper.make_graph(
        [helper.make_node("Reshape", ["x", "chw"], ["er"]),
         helper.make_node("Resize", ["er", "", "", "sizes"], ["e"], mode="linear", name="else_up")],
        "else", [], [out("e")])
    nodes = _sizes_nodes("x") + [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="pick")]
    g = helper.make_graph(
        nodes, "resize_in_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, H, W]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, OUT, OUT])], _consts())
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _declared(model: onnx.ModelProto, name: str) -> list | None:
    """The dims ``model`` declares for ``name`` (value_info), None when it has no shape."""
    for vi in model.graph.value_info:
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                    for d in vi.type.tensor_type.shape.dim]
    return None


@pytest.fixture(scope="module")
def resize_opt(tmp_path_factory):
    original = _resize_model()
    res = optimize(original, place=[("proj*", "memristor")], dims={"n": 2})
    path = tmp_path_factory.mktemp("resize") / "o.onnx"
    artifacts.save(res.model, path)
    return original, res, path


def test_computed_resize_sizes_cross_a_crossbar_product_and_run_as_onnxruntime(resize_opt):
    original, res, path = resize_opt
    assert res.check.ok
    # the split the test is about: sizes made in host partition 0, the product on the crossbar,
    # the Resize in host partition 1 reading sizes across the boundary
    assert _declared(res.model, "sizes") == [4]
    sess = InferenceSession(path)
    kinds = [k for k, _ in sess.partitions()]
    assert kinds == ["host", "memristor", "host"], kinds
    # planned at n = 2: the boundary keeps n symbolic (declared [n, 3, 16, 64], as the model
    # does), so the provider runs the model at other sizes too
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, C, H, W)).astype(np.float32)
        (want,) = run_onnxruntime(original, {"x": x})
        (got,) = sess.run(None, {"x": x})
        assert got.shape == want.shape == (n, C, OUT, OUT)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_captured_resize_sizes_reach_an_if_branch_with_their_shape(tmp_path):
    original = _if_resize_model()
    res = optimize(original, place=[("*then_proj*", "memristor")], dims={"n": 2}, check=0)
    path = tmp_path / "o.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    assert ("memristor", 1) in sess.partitions()  # the If runs in the provider, not in a partition
    for n, c in ((1, True), (3, True), (2, False)):
        x = np.random.default_rng(n).standard_normal((n, C, H, W)).astype(np.float32)
        feeds = {"x": x, "c": np.array(c)}
        (want,) = run_onnxruntime(original, feeds)
        (got,) = sess.run(None, feeds)
        assert got.shape == want.shape == (n, C, OUT, OUT)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def _declared_output_model(chain: bool) -> onnx.ModelProto:
    """p = x @ W on the crossbar, y = Sigmoid(p) on the host (``chain``: y = Tanh(Sigmoid(p)
    @ W2), a second product between them), x [n, 8] with a dynamic n and p also a graph output
    the exporter declares [1, 4]: onnxruntime runs the original at any n (it only warns), and
    onnx's shape inference carries that [1, 4] into the value_info of the tensors after p."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"], name="mm"),
             helper.make_node("Sigmoid", ["p"], ["q" if chain else "y"], name="act")]
    if chain:
        nodes += [helper.make_node("MatMul", ["q", "W2"], ["r"], name="mm2"),
                  helper.make_node("Tanh", ["r"], ["y"], name="act2")]
    g = helper.make_graph(
        nodes, "declared_output", [helper.make_tensor_value_info("x", f, ["n", 8])],
        [helper.make_tensor_value_info("y", f, ["n", 4]),
         helper.make_tensor_value_info("p", f, [1, 4])],
        [numpy_helper.from_array(rng.integers(-3, 4, (8, 4)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("chain", [False, True])
def test_a_graph_output_declared_for_batch_1_runs_at_batch_2_as_onnxruntime(chain, tmp_path):
    original = _declared_output_model(chain)
    res = optimize(original, place=[("mm*", "memristor"), ("act*", "host")], check=0)
    path = tmp_path / "o.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    assert [k for k, _ in sess.partitions()] == ["memristor", "host"] * (1 + chain)
    for n in (1, 2, 3, 1):
        x = np.random.default_rng(n).integers(-4, 5, (n, 8)).astype(np.float32)
        want = run_onnxruntime(original, {"x": x})
        got = sess.run(None, {"x": x})
        assert [a.shape for a in got] == [a.shape for a in want] == [(n, 4), (n, 4)]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
