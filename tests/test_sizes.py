"""Planning at the sizes a model runs at: ``--dim NAME=SIZE`` reaches FLOPs, placement, tiling and
mapping, the model records the sizes, and ``run``/``compare`` use them by default.

Expected FLOPs and crossbar rows are counted by hand from the test model's shapes.
"""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import frontend, optimize
from onnx_cinm.cli import main
from onnx_cinm.errors import CinmError


def _dynamic_convnet():
    """images[batch, 3, height, width] -> Conv 3x3 (16) -> Relu -> Conv 3x3 stride 2 (32)."""
    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w1")
    w2 = nh.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w2")
    nodes = [h.make_node("Conv", ["images", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             h.make_node("Relu", ["c1"], ["r1"], name="relu"),
             h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("images", TP.FLOAT, ["batch", 3, "height", "width"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["batch", 32, "h2", "w2"])], [w1, w2])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _flops_at(hw: int, batch: int = 1) -> int:
    conv1 = 2 * (3 * 3 * 3) * 16 * hw * hw * batch
    relu = 16 * hw * hw * batch
    out2 = (hw + 2 - 3) // 2 + 1  # stride 2, pads 1
    conv2 = 2 * (16 * 3 * 3) * 32 * out2 ** 2 * batch
    return conv1 + relu + conv2


def _cim_rows(model) -> dict:
    return {n.name: h.get_attribute_value(a) for n in model.graph.node if n.domain == "cinm"
            for a in n.attribute if a.name == "cim_M"}


def test_dims_reach_flops_and_plans_as_a_static_shape_would():
    m = _dynamic_convnet()
    sized = optimize(m, dims={"height": 64, "width": 64}, placement="heuristic", check=0)
    static = optimize(m, input_shapes={"images": [1, 3, 64, 64]}, placement="heuristic", check=0)
    assert sized.flops_total == static.flops_total == _flops_at(64) == 13_041_664
    # crossbar rows are the im2col rows: 64*64 output pixels for conv1, 32*32 for conv2
    assert _cim_rows(sized.model) == _cim_rows(static.model) == {"conv1/Gemm": 64 * 64, "conv2/Gemm": 32 * 32}
    assert sized.placements == static.placements
    # the model stays dynamic and records the sizes it was planned for
    dims = sized.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "", "height", "width"]
    assert frontend.planned_dims(sized.model) == {"height": 64, "width": 64}
    line = next(li for li in sized.summary().splitlines() if li.startswith("FLOPs"))
    assert "at height=64, width=64" in line and "taken as 1: batch" in line


def test_without_sizes_the_summary_names_every_dim_taken_as_one():
    m = _dynamic_convnet()
    res = optimize(m, placement="heuristic", check=0)
    assert res.flops_total == _flops_at(1)
    assert "symbolic dims taken as 1: batch, height, width" in res.summary()
    static = optimize(m, input_shapes={"images": [1, 3, 8, 8]}, check=0)
    assert "taken as 1" not in static.summary() and " (at " not in static.summary()


def test_a_batch_size_scales_flops():
    res = optimize(_dynamic_convnet(), dims={"batch": 4, "height": 16, "width": 16}, check=0)
    assert res.flops_total == _flops_at(16, batch=4)
    assert "taken as 1" not in res.summary()


def test_run_and_compare_use_the_recorded_sizes(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--placement", "heuristic",
                 "--dim", "height=32", "--dim", "width=32"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--random", "1"]) == 0
    assert "output y: float32 [1, 32, 16, 16]" in capsys.readouterr().out
    assert main(["run", str(out), "--random", "1", "--dim", "height=8", "--dim", "width=8"]) == 0
    assert "output y: float32 [1, 32, 4, 4]" in capsys.readouterr().out
    assert main(["compare", str(src), str(out), "--rtol", "1e-3", "--atol", "1e-3"]) == 0
    assert "1x32x16x16" in capsys.readouterr().out


def test_a_malformed_size_record_is_a_one_line_error(tmp_path):
    m = _dynamic_convnet()
    for bad in ("[1, 2]", '{"height": -3}', '{"height": "64"}', "not json", '{"height": true}'):
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m2.metadata_props.add(key=frontend.PLANNED_DIMS_KEY, value=bad)
        with pytest.raises(CinmError, match="metadata 'onnx_cinm.planned_dims' is malformed"):
            frontend.planned_dims(m2)
    frontend.set_planned_dims(m, {"width": 3, "height": 2})
    frontend.set_planned_dims(m, {"height": 5})
    assert [(p.key, json.loads(p.value)) for p in m.metadata_props] == [(frontend.PLANNED_DIMS_KEY, {"height": 5})]
    frontend.set_planned_dims(m, {})
    assert not m.metadata_props


def test_a_typo_in_dims_is_refused_even_without_the_check():
    with pytest.raises(CinmError, match="no input has a symbolic dimension named 'hieght'"):
        optimize(_dynamic_convnet(), dims={"hieght": 64}, check=0)


def test_sweep_plans_at_the_given_sizes():
    from onnx_cinm import sweep

    sets = sweep.parse_sets(["placement.strategy=heuristic", "cim.preset=pcm-occ"])
    one = sweep.run(_dynamic_convnet(), sets, executor="serial")[1][0]
    big = sweep.run(_dynamic_convnet(), sets, executor="serial", dims={"height": 64, "width": 64})[1][0]
    static = sweep.run(_dynamic_convnet(), sets, executor="serial",
                       input_shapes={"images": [1, 3, 64, 64]})[1][0]
    assert big["latency_s"] == pytest.approx(static["latency_s"], rel=1e-12)
    assert big["energy_j"] == pytest.approx(static["energy_j"], rel=1e-12)
    assert big["latency_s"] > 5 * one["latency_s"]  # 4096 output pixels instead of 1 (and fixed costs)


def test_a_crossbar_product_with_an_unsized_weight_or_group_dim_stays_off_the_crossbars(tmp_path):
    """Attention scores q[batch, 12, seq, 32] @ k[b2, 12, 32, s2] with b2, s2 unsized: planned at
    1, the programmed operand's kernel declared (1, 32, 1) tiles and the provider then refused
    the run ('sidecar shape (12, 32, 64) != declared (1, 32, 64)' on a real MiniLM). It is now
    refused at placement with the reason; sized, it runs on the crossbars."""
    from onnx_cinm import artifacts
    from onnx_cinm.golden import run_onnxruntime
    from onnx_cinm.runtime import InferenceSession

    g = h.make_graph([h.make_node("MatMul", ["q", "k"], ["y"])], "g",
                     [h.make_tensor_value_info("q", TP.FLOAT, ["batch", 12, "seq", 32]),
                      h.make_tensor_value_info("k", TP.FLOAT, ["b2", 12, 32, "s2"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    res = optimize(m, dims={"batch": 1, "seq": 64}, place=[("*", "memristor")])
    (gemm,) = [n for n in res.model.graph.node if n.domain == "cinm"]
    attrs = {a.name: h.get_attribute_value(a) for a in gemm.attribute}
    assert attrs["device"] != b"memristor"
    assert b"a weight or group dim unknown at planning time" in attrs["placement"]
    res = optimize(m, dims={"batch": 1, "seq": 64, "b2": 1, "s2": 64}, place=[("*", "memristor")])
    (gemm,) = [n for n in res.model.graph.node if n.domain == "cinm"]
    assert {a.name: h.get_attribute_value(a) for a in gemm.attribute}["device"] == b"memristor"
    artifacts.save(res.model, tmp_path / "att.onnx")
    rng = np.random.default_rng(3)
    feeds = {"q": rng.standard_normal((1, 12, 64, 32)).astype(np.float32),
             "k": rng.standard_normal((1, 12, 32, 64)).astype(np.float32)}
    np.testing.assert_allclose(InferenceSession(tmp_path / "att.onnx").run(None, feeds)[0],
                               run_onnxruntime(m, feeds)[0], rtol=1e-4, atol=1e-4)
