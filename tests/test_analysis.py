"""Tests for onnx_cinm.analysis.tensor_infos reading a settled value_info instead of inferring.

Expected shapes are hand counts of the tiny graphs below, never taken from the code under test.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm.analysis import tensor_infos


def _model(value_info):
    """x[2, 3] -> MatMul(W[3, 4]) -> h -> Dropout (its mask output omitted) -> y;
    ``value_info`` for h as given."""
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Dropout", ["h"], ["y", ""])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w], value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_open_value_info_is_inferred_again():
    """A value_info that leaves a dim open (or no entry at all) is not taken as it is:
    inference sizes h from x[2, 3] @ W[3, 4]."""
    for value_info in ([helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, "n"])], []):
        infos = tensor_infos(_model(value_info))
        assert infos["h"].shape == (2, 4) and infos["y"].shape == (2, 4)
        assert infos["W"].const and infos["W"].shape == (3, 4)


def test_settled_value_info_is_read_as_it_is():
    """Every node output typed with all dims known: the infos are the value_info's, the same
    as inference gives (hand count: h and y are [2, 4] float32)."""
    settled = [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])]
    infos = tensor_infos(_model(settled))
    assert {k: (np.dtype(v.dtype).name, v.shape, v.const) for k, v in infos.items()} == {
        "x": ("float32", (2, 3), False), "h": ("float32", (2, 4), False),
        "y": ("float32", (2, 4), False), "W": ("float32", (3, 4), True)}
