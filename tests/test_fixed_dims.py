"""optimize says which symbolic input dims its compiled plans fix (finding: rxnmap planned at
seq_len=23 failed only at run time on seq_len=67, its attention operands programmed onto
crossbars sized for 23).

The model: ``K = X @ Wk`` (constant weights: the crossbars hold Wk, X streams) and
``S = X @ K^T`` whose programmed operand ``K^T`` [64, seq] is an activation. Placed on the
crossbars by hints, ``S``'s program fixes ``seq``; ``K``'s does not.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
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


def test_activation_operand_on_crossbars_fixes_its_dim():
    res = optimize(_attention(), place=[("scores", "memristor"), ("proj", "memristor")],
                   dims={"seq": 8}, check=0)
    on = _on_crossbars(res)
    assert any("scores" in n for n in on) and any("proj" in n for n in on)
    assert list(res.fixed_dims) == ["seq"]
    assert len(res.fixed_dims["seq"]) == 1 and "scores" in res.fixed_dims["seq"][0]
    assert "dims fixed at the planned sizes: seq=8" in res.summary()


def test_weights_on_crossbars_fix_nothing():
    res = optimize(_attention(), place=[("scores", "host"), ("proj", "memristor")],
                   dims={"seq": 8}, check=0)
    assert any("proj" in n for n in _on_crossbars(res))
    assert res.fixed_dims == {}
    assert "dims fixed" not in res.summary()


def test_cli_warns(tmp_path, capsys):
    src = tmp_path / "att.onnx"
    _attention(src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--dim", "seq=8",
                 "--place", "scores=memristor", "--check", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning: the compiled model runs only at seq=8" in err
    # and the run at another seq fails as the warning said (at seq=8 it runs)
    np.save(tmp_path / "x8.npy", np.ones((8, 64), np.float32))
    np.save(tmp_path / "x9.npy", np.ones((9, 64), np.float32))
    assert main(["run", str(tmp_path / "o.onnx"), "--input", f"x={tmp_path / 'x8.npy'}"]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "o.onnx"), "--input", f"x={tmp_path / 'x9.npy'}"]) != 0
    assert "fixed to the planned sizes" in capsys.readouterr().err
