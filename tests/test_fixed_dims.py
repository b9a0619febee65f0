"""optimize says which symbolic input dims its compiled plans fix (finding: rxnmap planned at
seq_len=23 failed only at run time on seq_len=67, its attention operands programmed onto
crossbars sized for 23). The crossbar kernels now plan such an operand again at a run's shape
(trial s29, Kokoro), so they fix no dim; a device whose kernel fixes an operand
(``Device.fixed_operands``) is still warned about.

The model: ``K = X @ Wk`` (constant weights: the crossbars hold Wk, X streams) and
``S = X @ K^T`` whose programmed operand ``K^T`` [64, seq] is an activation.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP, helper as h, numpy_helper

from onnx_cinm import optimize
from onnx_cinm.cli import main


def _attention(path=None):
    rng = np.random.default_rng(0)
    x = h.make_tensor_value_info("x", TP.FLOAT, ["seq", 64])
    y = h.make_tensor_value_info("s", TP.FLOAT, ["seq", "seq"])
    nodes = [h.make_node("MatMul", ["x", "wk"], ["k"], name="proj"),
             h.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[1, 0]),
             h.make_node("MatMul", ["x", "kt"], ["s"], name="scores")]
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "wk")
    m = h.make_model(h.make_graph(nodes, "att", [x], [y], [w]),
                     opset_imports=[h.make_opsetid("", 17)])
    if path is not None:
        onnx.save(m, path)
    return m


def _on_crossbars(res):
    return {n for n, _, dev, _ in res.placements if dev == "memristor"}


def test_activation_operand_on_crossbars_fixes_no_dim():
    res = optimize(_attention(), place=[("scores", "memristor"), ("proj", "memristor")],
                   dims={"seq": 8}, check=0)
    on = _on_crossbars(res)
    assert any("scores" in n for n in on) and any("proj" in n for n in on)
    assert res.fixed_dims == {}
    assert "dims fixed" not in res.summary()


def test_a_device_kernel_that_fixes_an_operand_is_warned_about(monkeypatch):
    """A device whose compiled kernel takes its programmed operand at the planned shape alone
    (here the crossbar device made to say so) fixes the dim that operand follows."""
    from onnx_cinm import devices

    dev = devices.get_device("memristor")
    monkeypatch.setattr(type(dev), "fixed_operands", lambda self, op_type, attrs:
                        (1,) if attrs.get("cim_operand") == "B" else (0,))
    res = optimize(_attention(), place=[("scores", "memristor"), ("proj", "memristor")],
                   dims={"seq": 8}, check=0)
    assert list(res.fixed_dims) == ["seq"]
    assert len(res.fixed_dims["seq"]) == 1 and "scores" in res.fixed_dims["seq"][0]
    assert "dims fixed at the planned sizes: seq=8" in res.summary()


def test_weights_on_crossbars_fix_nothing():
    res = optimize(_attention(), place=[("scores", "host"), ("proj", "memristor")],
                   dims={"seq": 8}, check=0)
    assert any("proj" in n for n in _on_crossbars(res))
    assert res.fixed_dims == {}
    assert "dims fixed" not in res.summary()


def test_cli_runs_at_another_seq(tmp_path, capsys):
    """No warning at optimize, and the run at seq=9 of a model planned at seq=8 gives
    onnxruntime's result on the original (it was refused)."""
    from onnx_cinm.golden import run_onnxruntime

    src = tmp_path / "att.onnx"
    model = _attention(src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--dim", "seq=8",
                 "--place", "scores=memristor", "--check", "0"]) == 0
    assert "runs only at" not in capsys.readouterr().err
    x = np.random.default_rng(0).standard_normal((9, 64)).astype(np.float32)
    np.save(tmp_path / "x9.npy", x)
    assert main(["run", str(tmp_path / "o.onnx"), "--input", f"x={tmp_path / 'x9.npy'}",
                 "-o", str(tmp_path / "y.npz")]) == 0
    got = np.load(tmp_path / "y.npz")["s"]
    np.testing.assert_allclose(got, run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-3)
