"""Issue 16: a Concat of crossbar convolutions' outputs, run by the provider in place: each
convolution writes its part straight into the Concat's buffer, which becomes the Concat's
result (light SqueezeNet's fire modules: eight Concats of two convolutions each)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.runtime import session as session_mod
from onnx_cinm.runtime.session import InferenceSession


def _fire(batch):
    """x [batch, 4, 9, 7] -> conv 3x3 (pad 1) -> Relu -> a [.., 6, ..]; x -> conv 1x1 -> b
    [.., 5, ..]; Concat(a, b, axis 1) -> MaxPool 2x2 -> y: a fire module's expand half."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["a"], name="relu1"),
             helper.make_node("Conv", ["x", "W2"], ["b"], name="conv2"),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
             helper.make_node("MaxPool", ["cat"], ["y"], kernel_shape=[2, 2], name="pool")]
    g = helper.make_graph(nodes, "fire",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 9, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _session(tmp_path, batch, matmul: str = "onnxruntime"):
    original = _fire(batch)
    res = optimize(original, place=[("conv*/Gemm", "memristor"), ("conv*/Im2Col", "upmem"),
                                    ("relu1", "upmem")])
    path = tmp_path / f"fire{batch}.onnx"
    artifacts.save(res.model, path)
    return original, InferenceSession(path, provider_options=[{"matmul": matmul}, {}])


def test_convolutions_write_their_parts_into_the_concat(tmp_path, monkeypatch):
    """At batch 1 both convolutions (one with its Relu) write into the Concat's buffer and the
    Concat returns it without copying: the model's output equals onnxruntime's on the
    original, on three input sets, and the Concat is a provider step, not a host partition."""
    filled = []
    real = session_mod._fills
    monkeypatch.setattr(session_mod, "_fills", lambda *a: filled.append(real(*a)) or filled[-1])
    original, sess = _session(tmp_path, 1)
    assert [d.into is not None for d in sess._device_nodes if d.node.op_type == "Gemm"] == \
        [True, True]
    assert sess.partitions().count(("host", 1)) == 1  # the MaxPool alone
    for seed in range(3):
        feeds = random_inputs(original, seed=seed)
        np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(original, feeds)[0],
                                   rtol=1e-5, atol=1e-5)
    assert filled == [True] * 3
    cats = [r for r in sess.profile() if r["op_type"] == "Concat"]
    assert [(r["device"], r["mode"]) for r in cats] == [("host", "numpy")] * 3


def test_a_symbolic_batch_is_in_place_at_the_runs_of_batch_one(tmp_path, monkeypatch):
    """A model of a symbolic batch ``N``: the Concat is the provider's, in place at the runs
    of batch 1 and concatenated by numpy at batch 3, onnxruntime's numbers at both."""
    filled = []
    real = session_mod._fills
    monkeypatch.setattr(session_mod, "_fills", lambda *a: filled.append(real(*a)) or filled[-1])
    original, sess = _session(tmp_path, "N")
    assert sum(d.into is not None for d in sess._device_nodes) == 2
    for batch in (1, 3, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 9, 7)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0],
                                   run_onnxruntime(original, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert filled == [True, True]  # the two runs at batch 1; at 3 no buffer to fill


def test_a_part_written_elsewhere_is_copied(tmp_path):
    """Under matmul "numpy" the crossbar products take the materialized patches (no
    convolution to write into the buffer): the Concat copies its parts, the same numbers."""
    original, sess = _session(tmp_path, 1, matmul="numpy")
    for seed in range(2):
        feeds = random_inputs(original, seed=seed)
        np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(original, feeds)[0],
                                   rtol=1e-5, atol=1e-5)


def test_at_batch_two_the_parts_are_not_contiguous_and_onnxruntime_concatenates(tmp_path):
    """At batch 2 a channel Concat's parts are not contiguous blocks of its output: the Concat
    stays in its host partition (with the MaxPool), and the result is onnxruntime's."""
    original, sess = _session(tmp_path, 2)
    assert not any(d.into for d in sess._device_nodes)
    assert ("host", 2) in sess.partitions()
    feeds = random_inputs(original, seed=0)
    np.testing.assert_allclose(sess.run(None, feeds)[0], run_onnxruntime(original, feeds)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["ok", "order", "gap", "copy", "dtype"])
def test_fills_is_true_only_for_the_buffers_own_consecutive_slices(case):
    buf = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 6, 4)
    parts = [buf[:, :2], buf[:, 2:]]
    if case == "order":
        parts = parts[::-1]
    elif case == "gap":
        parts = [buf[:, :2], buf[:, 3:]]
    elif case == "copy":
        parts = [buf[:, :2].copy(), buf[:, 2:]]
    elif case == "dtype":
        parts = [buf[:, :2].view(np.int32), buf[:, 2:]]
    assert session_mod._fills(buf, parts, 1) == (case == "ok")
    assert not session_mod._fills(np.asfortranarray(np.ones((2, 3), np.float32)),
                                  [np.ones((2, 3), np.float32)], 0)  # not C-contiguous
    # whatever _fills says, the Concat's result is its parts one after the other, by hand
    got = session_mod._concat(parts + [buf], {"axis": 1})[0]
    want = np.array([[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]],
                     [[16, 17, 18, 19], [20, 21, 22, 23]]], np.float32).reshape(1, 6, 4)
    want = {"ok": want, "order": np.concatenate([want[:, 2:], want[:, :2]], axis=1),
            "gap": np.concatenate([want[:, :2], want[:, 3:]], axis=1), "copy": want}.get(case)
    if want is not None:
        np.testing.assert_array_equal(got, want)
    else:  # int32 bits of the first part next to float32 values: numpy's promotion of both
        assert got.shape == (1, 6, 4) and got.dtype == np.float64
