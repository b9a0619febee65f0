"""The host's cost of views and metadata ops: what onnxruntime moves for them, not a full copy.

Expected figures by hand from the nominal roofline (50 GFLOP/s, 10 GB/s, 30 W,
:data:`onnx_cinm.hostmodel.NOMINAL`): onnxruntime's Reshape, Squeeze, Unsqueeze, Flatten and
Identity share their input's buffer, Shape and Size write a few int64s, an Add reads two
tensors and writes one.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper

from onnx_cinm import devices
from onnx_cinm.analysis import op_info, tensor_infos

BW, W = 10e9, 30.0


def _model():
    x = h.make_tensor_value_info("x", TP.FLOAT, [23, 1024])
    outs = ["s", "n", "r", "sq", "us", "f", "i", "a"]
    nodes = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        h.make_node("Size", ["x"], ["n"], name="size"),
        h.make_node("Reshape", ["x", "shp"], ["r"], name="reshape"),
        h.make_node("Unsqueeze", ["x", "ax"], ["u"], name="unsq"),
        h.make_node("Squeeze", ["u", "ax"], ["sq"], name="squeeze"),
        h.make_node("Unsqueeze", ["x", "ax"], ["us"], name="unsq2"),
        h.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
        h.make_node("Identity", ["x"], ["i"], name="identity"),
        h.make_node("Add", ["x", "x"], ["a"], name="add"),
    ]
    inits = [numpy_helper.from_array(np.array([23, 4, 256], np.int64), "shp"),
             numpy_helper.from_array(np.array([0], np.int64), "ax")]
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info(o, TP.UNDEFINED, None) for o in outs],
                     inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(m)


@pytest.mark.parametrize("name,nbytes", [
    ("shape", 2 * 8),             # the [2] int64 shape, not the 94 kB tensor it describes
    ("size", 8),                  # one int64
    ("reshape", 0), ("unsq", 0), ("squeeze", 0), ("flatten", 0), ("identity", 0),
    ("add", 3 * 23 * 1024 * 4),   # two float inputs read, one written: 282,624 B
])
def test_host_charges_the_bytes_an_op_moves(name, nbytes):
    m = _model()
    infos = tensor_infos(m)
    node = next(n for n in m.graph.node if n.name == name)
    c = devices.get_device("host").cost(op_info(node, infos), {"host_roofline": "nominal"})
    flops_s = op_info(node, infos).flops / 50e9
    assert c.latency_s == pytest.approx(max(flops_s, nbytes / BW), abs=1e-15)
    assert c.energy_j == pytest.approx(max(flops_s, nbytes / BW) * W, abs=1e-13)


def test_shape_costs_nanoseconds_not_the_tensor_it_reads():
    """The finding: a Shape of a [23, 1024] float tensor was charged 28.3 us (its input and
    output at 10 GB/s); it writes 16 bytes: 1.6 ns, 48 nJ."""
    m = _model()
    infos = tensor_infos(m)
    node = next(n for n in m.graph.node if n.name == "shape")
    c = devices.get_device("host").cost(op_info(node, infos), {"host_roofline": "nominal"})
    assert c.latency_s == pytest.approx(1.6e-9)
    assert c.energy_j == pytest.approx(48e-9)


def test_shape_with_an_uninferred_output_counts_the_input_rank():
    """rxnmap's ``Shape_2`` outputs have no inferred shape: a Shape of a rank-3 tensor writes at
    most 3 int64s (24 B, 2.4 ns), not 0 and not the tensor."""
    from onnx_cinm.graph import OpInfo, TensorInfo

    op = OpInfo("s", "Shape", {}, (TensorInfo("x", np.dtype(np.float32), (1, 23, 1024)),),
                (TensorInfo("s", None, None),))
    c = devices.get_device("host").cost(op, {"host_roofline": "nominal"})
    assert c.latency_s == pytest.approx(24 / BW)


def test_a_scan_is_priced_with_its_body_times_its_length():
    """The host priced a Scan at its inputs' bytes alone: a GRU over time, 30 % of a model's
    FLOPs, cost 307 ns (trial s31). Body per step, by hand: MatMul [1, 64] x [64, 64] =
    2 * 64 * 64 = 8192 FLOPs, Add of 64 = 64: 8256; the scan input has 10 steps: 82,560."""
    body = h.make_graph(
        [h.make_node("MatMul", ["x_t", "w"], ["y"]), h.make_node("Add", ["y", "s_in"], ["s_out"]),
         h.make_node("Identity", ["s_out"], ["o_t"])], "body",
        [h.make_tensor_value_info("s_in", TP.FLOAT, [1, 64]),
         h.make_tensor_value_info("x_t", TP.FLOAT, [1, 64])],
        [h.make_tensor_value_info("s_out", TP.FLOAT, [1, 64]),
         h.make_tensor_value_info("o_t", TP.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")])
    g = h.make_graph([h.make_node("Scan", ["s0", "xs"], ["s", "os"], name="scan", body=body,
                                  num_scan_inputs=1)], "g",
                     [h.make_tensor_value_info("s0", TP.FLOAT, [1, 64]),
                      h.make_tensor_value_info("xs", TP.FLOAT, [10, 1, 64])],
                     [h.make_tensor_value_info("s", TP.FLOAT, [1, 64]),
                      h.make_tensor_value_info("os", TP.FLOAT, [10, 1, 64])])
    m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    op = op_info(m.graph.node[0], tensor_infos(m))
    assert op.flops == 10 * 8256
    # nominal roofline: 82,560 FLOPs at 50 GFLOP/s (1.65 us) against the bytes read and
    # written (s0 256 B, xs 2,560 B, s 256 B, os 2,560 B: 563 ns at 10 GB/s): FLOPs bound it
    cost = devices.get_device("host").cost(op, {"host_roofline": "nominal"})
    assert cost.latency_s == pytest.approx(82_560 / 50e9)
    assert cost.energy_j == pytest.approx(82_560 / 50e9 * W)
