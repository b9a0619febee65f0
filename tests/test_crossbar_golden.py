"""Golden runs through the crossbar simulator: every matrix product placed on the crossbars runs
its emitted ``.xbar`` file (ideal mode) inside the execution provider, the rest in onnxruntime
(UPMEM nodes in model mode), and the outputs match stock onnxruntime on the original model.

The light CNNs have one constant per weight tensor, so all 1000 logits are exactly equal and
huge (9.5e9 for SqueezeNet, 1.3e19 for ResNet50, on the shipped input rule): the final Softmax
turns one ulp of difference between two logits into a one-hot output, and which columns a
BLAS kernel rounds alike is not something any reordered sum can promise. Those models are
therefore compared at their logits (the final Softmax removed from the original before it is
compiled), with the foundation's tolerances (rtol 1e-4, atol 1e-5). Placement is the paper
heuristic, which puts every large matmul with constant weights on the crossbars.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import light_feeds

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs, run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession

LIGHT = ["alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "zfnet512"]


def _through_simulator(tmp_path, model_or_path, **kw):
    # the paper's heuristic on the paper's chip (pcm-occ): its 64 x 64 tiles take many kernels
    kw.setdefault("device_options", {"cim_preset": "pcm-occ"})
    res = optimize(model_or_path, check=0, placement="heuristic", **kw)
    path = tmp_path / "opt.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    n_xbar = sum(1 for kind, _ in sess.partitions() if kind == "memristor")
    return sess, n_xbar


def _assert_close(sess, original, feeds, rtol=1e-4, atol=1e-5):
    ref = run_onnxruntime(original, feeds)
    got = sess.run(None, feeds)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def _logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its final Softmax (if it ends in one): the graph output becomes the
    Softmax's input."""
    out = model.graph.output[0]
    (i, last), = [(i, n) for i, n in enumerate(model.graph.node) if out.name in n.output]
    if last.op_type == "Softmax":
        del model.graph.node[i]
        out.name = last.input[0]
    return model


@pytest.mark.parametrize("short", LIGHT)
def test_light_cnn_through_the_simulator(short, light_model_paths, tmp_path):
    path = next(p for k, p in light_model_paths.items() if short in k)
    original = _logits(onnx.load(str(path)))
    sess, n_xbar = _through_simulator(tmp_path, original)
    assert n_xbar >= 3
    _assert_close(sess, original, light_feeds(original))
    # two random inputs: the second inference runs the capacity-limited kernels backward
    for seed in (0, 1):
        _assert_close(sess, original, random_inputs(original, seed=seed))
    recs = [r for r in sess.profile() if r["device"] == "memristor"]
    assert all(r["mode"] == "simulate" and r["latency_s"] > 0 for r in recs)


@pytest.mark.slow
def test_light_vgg19_through_the_simulator(light_model_paths, tmp_path):
    path = next(p for k, p in light_model_paths.items() if "vgg19" in k)
    original = _logits(onnx.load(str(path)))
    sess, n_xbar = _through_simulator(tmp_path, original)
    assert n_xbar >= 16
    _assert_close(sess, original, random_inputs(original, seed=0))


def test_digits_mlp_through_the_simulator(digits_mlp, tmp_path):
    model, x_test, y_test, accuracy = digits_mlp
    sess, n_xbar = _through_simulator(tmp_path, model)
    assert n_xbar >= 1
    feeds = {"X": x_test.astype(np.float32)}
    ref = run_onnxruntime(model, feeds)
    got = sess.run(None, feeds)
    np.testing.assert_array_equal(got[0], ref[0])  # the predicted labels
    assert float(np.mean(got[0].reshape(-1) == y_test)) == pytest.approx(accuracy)
    for r, g in zip(ref[1:], got[1:]):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which,min_xbar", [("det", 10), ("rec", 10), ("cls", 3)])
def test_ppocr_through_the_simulator(which, min_xbar, ppocr_model_paths, ppocr_input_shapes,
                                     tmp_path):
    sess, n_xbar = _through_simulator(tmp_path, str(ppocr_model_paths[which]))
    assert n_xbar >= min_xbar
    original = onnx.load(str(ppocr_model_paths[which]))
    feeds = random_inputs(original, seed=0, shapes={"x": ppocr_input_shapes[which]})
    _assert_close(sess, original, feeds)


def test_digits_mlp_quantized_crossbars_keep_accuracy(digits_mlp, tmp_path):
    """q8 (8-bit weights with per-channel scales, 8-bit DAC/ADC) through the whole product path:
    optimize --cim-mode q8, the emitted files, the simulator: within 1 point of fp32."""
    model, x_test, y_test, accuracy = digits_mlp
    res = optimize(model, check=0, placement="heuristic",
                   device_options={"cim_mode": "q8", "cim_preset": "pcm-occ"})
    path = tmp_path / "q8.onnx"
    artifacts.save(res.model, path)
    assert "mode quantized" in next((tmp_path / "q8.cinm" / "memristor").glob("*.xbar")).read_text()
    sess = InferenceSession(path)
    feeds = {"X": x_test.astype(np.float32)}
    got, ref = sess.run(None, feeds), run_onnxruntime(model, feeds)
    q8 = float(np.mean(got[0].reshape(-1) == y_test))
    assert abs(q8 - accuracy) <= 0.01, (q8, accuracy)
    # the quantized data path really ran: the probabilities moved, by less than 8-bit noise
    diff = np.abs(got[1] - ref[1]).max()
    assert 1e-6 < diff < 0.2, diff
