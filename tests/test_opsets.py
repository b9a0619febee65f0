"""The whole pipeline on one small model stamped with every opset from 9 to the newest onnx knows."""
import numpy as np
import onnx
import pytest
from helpers import assert_matches_ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import optimize

NEWEST = onnx.defs.onnx_opset_version()


def _model(opset):
    rng = np.random.default_rng(opset)
    w = nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    fc = nh.from_array(rng.standard_normal((8 * 6 * 6, 10)).astype(np.float32), "fc")
    shape = nh.from_array(np.array([0, -1], np.int64), "flat")
    reduce = (h.make_node("ReduceSum", ["p", "ax"], ["s"], keepdims=0) if opset >= 13
              else h.make_node("ReduceSum", ["p"], ["s"], axes=[1], keepdims=0))
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Reshape", ["r", "flat"], ["f"]), h.make_node("MatMul", ["f", "fc"], ["p"]),
             h.make_node("Softmax", ["p"], ["y"]), reduce]
    inits = [w, fc, shape] + ([nh.from_array(np.array([1], np.int64), "ax")] if opset >= 13 else [])
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["batch", 3, 6, 6])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["batch", 10]),
                      h.make_tensor_value_info("s", TP.FLOAT, ["batch"])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=7 if opset < 13 else 10)


@pytest.mark.parametrize("opset", sorted({9, 10, 11, 12, 13, 15, 17, 18, 19, 21, 23, 25, NEWEST}))
def test_every_opset(opset):
    m = _model(opset)
    try:
        import onnxruntime as ort

        ort.InferenceSession(m.SerializeToString())
    except Exception as e:  # the installed onnxruntime does not know this opset yet
        pytest.skip(f"onnxruntime cannot run opset {opset}: {str(e).splitlines()[0][:80]}")
    result = optimize(m, check=2, skip=["restore_host_ops"])  # the lowering, kept on the host too
    assert {n.op_type for n in result.model.graph.node if n.domain == "cinm"} >= {"Im2Col", "Gemm", "Reduce"}
    assert_matches_ort(m, result.model, dims={"batch": 3})
    assert result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
