"""Issue 16: a residual connection's Add (then Relu) after a crossbar convolution, added by the
convolution's own onnxruntime session as onnxruntime fuses them in a whole model (light
ResNet50's 16 Sum+Relu host partitions took 0.4-0.8 ms each), or by its host partition when
the convolution does not run in onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession


def _block(relu: bool = True, op: str = "Add", batch: int = 1):
    """x [batch, 8, 9, 9] -> conv 3x3 -> Relu -> conv 3x3 -> c2; op(c2, x) [-> Relu] -> y: a
    ResNet basic block."""
    rng = np.random.default_rng(5)
    w1, w2 = ((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node(op, ["c2", "x"], ["s" if relu else "y"], name="add")]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"], name="relu2"))
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 8, 9, 9])  # noqa: E731
    g = helper.make_graph(nodes, "block", [vi("x")], [vi("y")],
                          [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(tmp_path, original, matmul: str):
    res = optimize(original, place=[("conv*/Gemm", "memristor"), ("conv*/Im2Col", "upmem"),
                                    ("relu1", "upmem")])
    path = tmp_path / "block.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path, provider_options=[{"matmul": matmul}, {}])
    for seed in range(3):
        feeds = random_inputs(original, seed=seed)
        np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(original, feeds)[0],
                                   rtol=1e-5, atol=1e-5)
    return sess


@pytest.mark.parametrize("relu,op,batch", [(True, "Add", 1), (False, "Sum", 1), (True, "Add", 2)])
def test_the_convolution_adds_the_residual_and_applies_the_relu(tmp_path, relu, op, batch):
    """The Add (or two-input Sum) and its Relu run inside conv2's convolution: the same numbers
    as onnxruntime on the original, the partition recorded with no wall time of its own and
    not a step of its own; conv1's model-mode Relu is still charged (in place, wall 0)."""
    sess = _run(tmp_path, _block(relu, op, batch), "onnxruntime")
    attached = [d for d in sess._device_nodes if d.residual is not None]
    assert [d.label for d in attached] == ["conv2/Gemm"]
    part = attached[0].residual[0]
    assert attached[0].residual[1:] == ("x", "Relu" if relu else None)
    assert part not in sess._steps
    rows = [r for r in sess.profile() if r["node"] == part.label]
    assert len(rows) == 3 and all(r["wall_s"] == 0.0 for r in rows)
    assert {r["op_type"] for r in rows} == {f"{len(part.nodes)} in conv"}
    # conv2's weights live in its residual session alone; conv1 keeps its plain one
    convs = [k for k in sess._kernels._ort if k[0] == "conv"]
    assert sorted(k[-1] == "residual" for k in convs) == [False, True]


def test_without_a_convolution_the_partition_adds_it(tmp_path):
    """Under matmul "numpy" the products take the materialized patches: the convolution adds
    nothing, and the partition runs after conv2, in its step (a wall time of its own)."""
    sess = _run(tmp_path, _block(), "numpy")
    part = next(d for d in sess._device_nodes if d.residual is not None).residual[0]
    rows = [r for r in sess.profile() if r["node"] == part.label]
    assert len(rows) == 3 and all(r["wall_s"] > 0 for r in rows)


def test_a_residual_made_after_the_convolution_is_not_attached(tmp_path):
    """Add(c2, c3) where c3 is a convolution of c2's own input run after conv2 (graph order):
    c3 is not there when conv2 runs, so the Add stays a host partition of its own."""
    rng = np.random.default_rng(6)
    w1, w2, w3 = ((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["c1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Conv", ["c1", "W3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
             helper.make_node("Add", ["c2", "c3"], ["y"], name="add")]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 9, 9])  # noqa: E731
    original = helper.make_model(helper.make_graph(
        nodes, "g", [vi("x")], [vi("y")],
        [numpy_helper.from_array(w, f"W{i + 1}") for i, w in enumerate((w1, w2, w3))]),
        opset_imports=[helper.make_opsetid("", 17)])
    sess = _run(tmp_path, original, "onnxruntime")
    # conv3 runs last, so only it may add c2 (made before it); conv2 never adds c3
    assert [(d.label, d.residual[1]) for d in sess._device_nodes if d.residual] == \
        [("conv3/Gemm", "c2")]


def test_the_im2col_computed_inside_the_convolution_is_named_and_explained(tmp_path):
    """An Im2Col whose convolution took its product from the Im2Col's input has no wall time of
    its own: its records name that convolution (``fused_into``) and the profile's table says
    why its row reads 0 s; run through numpy products the Im2Col runs itself: no such record,
    no such note."""
    from onnx_cinm.runtime import profile

    sess = _run(tmp_path, _block(), "onnxruntime")
    recs = [r for r in sess.profile() if r["node"] == "conv1/Im2Col"]
    assert len(recs) == 3 and all(r["wall_s"] == 0.0 and r["fused_into"] == "conv1/Gemm"
                                  for r in recs)
    assert "computed inside the convolution's own kernel (conv1/Gemm's" in \
        profile.table(sess.profile())
    sess = _run(tmp_path, _block(), "numpy")
    assert not any(r.get("fused_into") for r in sess.profile())
    assert "computed inside the convolution's own kernel" not in profile.table(sess.profile())
