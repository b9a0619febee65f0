"""A check whose reference is mostly NaN/Inf proves nothing and is not reported OK.

The finding: caustic_gnn with random inputs at --dim sizes had NaN in 72 of 150 elements of
each output's reference, and the check said "OK on the finite elements". The model here:
``y = Log(x)``; NaN exactly where ``x < 0`` (counted with numpy on the inputs).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper as h

from onnx_cinm import golden


def _log_model():
    g = h.make_graph([h.make_node("Log", ["x"], ["y"])], "log",
                     [h.make_tensor_value_info("x", TP.FLOAT, [150])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [150])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _x(n_negative):
    x = np.linspace(0.5, 2.0, 150).astype(np.float32)
    x[:n_negative] *= -1
    return x


def test_mostly_nan_reference_is_not_meaningful():
    x = _x(76)
    with np.errstate(invalid="ignore"):
        nan = int(np.isnan(np.log(x.astype(np.float64))).sum())
    assert nan == 76  # more than a quarter of 150 (37.5)
    rep = golden.compare(_log_model(), _log_model(), feeds=[{"x": x}])
    assert rep.ok and rep.outputs[0].ref_nonfinite == nan
    assert rep.meaningless == ["the reference 'y' is NaN/Inf in 76 of 150 elements"]
    assert "NOT MEANINGFUL" in rep.summary() and "--input" in rep.summary()
    assert "not meaningful" in rep.table()


def test_few_nan_leave_the_check_meaningful():
    x = _x(37)  # 37 of 150: under a quarter
    rep = golden.compare(_log_model(), _log_model(), feeds=[{"x": x}])
    assert rep.meaningless == []
    assert "OK on the finite elements" in rep.summary() and "y: 37 of 150" in rep.summary()
