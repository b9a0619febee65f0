"""The host roofline prices a lookup by the rows it reads, not by its whole table (trial s30:
a BERT's word-embedding Gather was priced as reading 30,522 x 384 float32, 4.7 ms of a 7.2 ms
model)."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import optimize, report


def test_an_embedding_lookup_reads_its_rows_not_its_table():
    table = nh.from_array(np.ones((3000, 64), np.float32), "table")
    g = h.make_graph([h.make_node("Gather", ["table", "ids"], ["e"], name="embed")], "g",
                     [h.make_tensor_value_info("ids", TP.INT64, [1, 32])],
                     [h.make_tensor_value_info("e", TP.FLOAT, [1, 32, 64])], [table])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    res = optimize(m, check=0, host_roofline="nominal")
    rows, _ = report.layers(res.model, report.options_from_plans(res.model))
    (row,) = [r for r in rows if r.op == "Gather"]
    # by hand: 32 rows of 64 float32 read (8192 B), 32 int64 indices (256 B), 8192 B written;
    # the nominal roofline moves 10 GB/s (a Gather computes nothing)
    assert row.latency_s == pytest.approx((8192 + 256 + 8192) / 10e9)
