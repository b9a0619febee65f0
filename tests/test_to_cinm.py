"""Pass to_cinm (and placement on its result): structure and numbers on tiny models.

Expected numbers come from stock onnxruntime on the original model (helpers.assert_matches_ort).
"""
import math

import numpy as np
import onnx
import pytest
from helpers import assert_matches_ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.passes import PassContext, PassManager
from onnx_cinm.passes.placement import placement
from onnx_cinm.passes.to_cinm import to_cinm
from onnx_cinm.runtime import InferenceSession

rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)


def _lower(m, **options):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    ctx = PassContext(options={"placement": "heuristic", **options})  # cost placement is the default
    out = placement(to_cinm(out, ctx), ctx)
    del out.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out, strict_mode=True), ctx


def _ops(m):
    return [(n.domain + "." if n.domain else "") + n.op_type for n in m.graph.node]


def _conv(xshape, wshape, bias, **attrs):
    inits = [nh.from_array(rng.standard_normal(wshape).astype(np.float32), "W")]
    ins = ["x", "W"]
    if bias:
        inits.append(nh.from_array(rng.standard_normal(wshape[0]).astype(np.float32), "B"))
        ins.append("B")
    return _model([h.make_node("Conv", ins, ["y"], **attrs)],
                  [h.make_tensor_value_info("x", TP.FLOAT, ["N"] + list(xshape[1:]))],
                  [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)


CONVS = [
    ((2, 3, 9, 8), (4, 3, 3, 3), True, {}),
    ((2, 3, 9, 8), (4, 3, 3, 2), False, dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])),
    ((1, 6, 7, 7), (6, 1, 3, 3), True, dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    ((1, 6, 7, 7), (4, 3, 3, 3), True, dict(group=2, strides=[2, 2])),
    ((1, 6, 7, 7), (12, 1, 3, 3), False, dict(group=6, auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 6, 8, 7), (4, 6, 2, 3), True, dict(auto_pad="SAME_LOWER")),
    ((1, 6, 8, 7), (4, 6, 2, 3), True, dict(auto_pad="VALID")),
    ((2, 3, 11), (5, 3, 3), True, dict(strides=[2], pads=[1, 2])),  # 1-D
    ((2, 4, 11), (4, 2, 3), True, dict(group=2)),  # 1-D grouped
]


@pytest.mark.parametrize("xshape,wshape,bias,attrs", CONVS)
def test_conv_becomes_im2col_gemm(xshape, wshape, bias, attrs):
    m = _conv(xshape, wshape, bias, **attrs)
    out, ctx = _lower(m)
    ops = _ops(out)
    assert "Conv" not in ops and ops[0] == "cinm.Im2Col" and ops.count("cinm.Gemm") == 1
    assert ctx.stats["to_cinm"]["lowered"]["Conv"] == 1
    assert_matches_ort(m, out, shapes={"x": list(xshape)})
    # a symbolic batch stays symbolic
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("xshape,wshape,bias,attrs", [CONVS[0], CONVS[3]])
def test_conv_of_one_repeated_weight_value_lowers_to_the_same_numbers(xshape, wshape, bias, attrs,
                                                                      shared):
    """A weight of one value repeated (the light models') skips the transpose: the Gemm's
    weight is exactly the filled matrix (the initializer renamed when nothing else reads it,
    else a copy beside it), and the result is onnxruntime's on the original."""
    m = _conv(xshape, wshape, bias, **attrs)
    m.graph.initializer[0].CopyFrom(nh.from_array(np.full(wshape, -0.375, np.float32), "W"))
    if shared:  # W read by a graph output too
        m.graph.output.append(h.make_tensor_value_info("W", TP.FLOAT, list(wshape)))
    out, _ = _lower(m)
    [w] = [t for t in out.graph.initializer if t.name.endswith("_W_gemm")]
    g = attrs.get("group", 1)
    assert nh.to_array(w).size == math.prod(wshape) and (nh.to_array(w) == np.float32(-0.375)).all()
    assert list(w.dims)[-2:] == [math.prod(wshape[1:]), wshape[0] // g]
    kept = {t.name: nh.to_array(t) for t in out.graph.initializer if t.name == "W"}
    assert list(kept) == (["W"] if shared else [])
    if shared:
        assert kept["W"].shape == wshape and (kept["W"] == np.float32(-0.375)).all()
    assert_matches_ort(m, out, shapes={"x": list(xshape)})


def test_conv_with_runtime_weights_gets_explicit_reshapes():
    m = _model([h.make_node("Conv", ["x", "w"], ["y"], group=2)],
               [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 5, 5]),
                h.make_tensor_value_info("w", TP.FLOAT, [6, 2, 3, 3])],
               [h.make_tensor_value_info("y", TP.FLOAT, None)])
    out, _ = _lower(m)
    assert "cinm.Im2Col" in _ops(out)
    assert_matches_ort(m, out)


@pytest.mark.parametrize("ashape,bshape,expect", [
    ((4, 5), (5, 3), "Gemm"), ((2, 4, 5), (5, 3), "Gemm"), ((2, 4, 5), (2, 5, 3), "Gemm"),
    ((4, 5), (5,), "Gemv"), ((5,), (5, 3), None), ((5,), (5,), "Gemv"), ((2, 3, 4, 5), (5,), "Gemm"),
    ((5,), (2, 5, 3), "Gemm"),
])
@pytest.mark.parametrize("b_const", [True, False])
def test_matmul_every_rank(ashape, bshape, expect, b_const):
    b = rng.standard_normal(bshape).astype(np.float32)
    inputs = [h.make_tensor_value_info("a", TP.FLOAT, list(ashape))]
    inits = [nh.from_array(b, "b")] if b_const else []
    if not b_const:
        inputs.append(h.make_tensor_value_info("b", TP.FLOAT, list(bshape)))
    m = _model([h.make_node("MatMul", ["a", "b"], ["y"])], inputs,
               [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    out, _ = _lower(m)
    if expect is None:  # vector times matrix: Gemv with the folded transpose when B is constant
        expect = "Gemv" if b_const else "Gemm"
    assert f"cinm.{expect}" in _ops(out) and "MatMul" not in _ops(out)
    assert_matches_ort(m, out)


def test_reduce_cumsum_topk_transpose_elementwise():
    nodes = [h.make_node("ReduceSum", ["x", "ax"], ["r1"], keepdims=0),
             h.make_node("ReduceMean", ["x"], ["r2"], axes=[-1]),
             h.make_node("ReduceMax", ["x"], ["r3"]),
             h.make_node("ReduceProd", ["x"], ["r4"], axes=[1], keepdims=1),
             h.make_node("CumSum", ["x", "one"], ["c1"], exclusive=1, reverse=1),
             h.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1, largest=0),
             h.make_node("Transpose", ["x"], ["tr"]),
             h.make_node("Add", ["x", "x"], ["s1"]), h.make_node("Relu", ["s1"], ["s2"]),
             h.make_node("Clip", ["s2", "", "cm"], ["s3"]), h.make_node("Max", ["x", "s3"], ["s4"]),
             h.make_node("LeakyRelu", ["s4"], ["s5"], alpha=0.3)]
    outs = ["r1", "r2", "r3", "r4", "c1", "tv", "ti", "tr", "s5"]
    inits = [nh.from_array(np.array([0, 2], np.int64), "ax"), nh.from_array(np.array(1, np.int64), "one"),
             nh.from_array(np.array([2], np.int64), "k"), nh.from_array(np.float32(0.3), "cm")]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 5])],
               [h.make_tensor_value_info(o, TP.INT64 if o == "ti" else TP.FLOAT, None) for o in outs], inits)
    out, ctx = _lower(m)
    lowered = ctx.stats["to_cinm"]["lowered"]
    assert sum(lowered.values()) == len(nodes)
    reduces = [n for n in out.graph.node if n.op_type == "Reduce"]
    assert [cinm.node_attrs(n)["axes"] for n in reduces] == [[0, 2], [2], [0, 1, 2], [1]]
    assert [cinm.node_attrs(n)["kind"] for n in reduces] == ["add", "add", "max", "mul"]
    assert_matches_ort(m, out, shapes={"x": [3, 4, 5]})


def test_shape_path_and_unsupported_ops_stay_on_host():
    # Shape -> Gather -> Mul (shape arithmetic) must not become cinm; Erf alone (not in Gelu's
    # pattern) has no cinm form.
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Mul", ["s", "two"], ["s2"]),
             h.make_node("Erf", ["x"], ["y"]),
             h.make_node("Identity", ["s2"], ["z"])]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
               [h.make_tensor_value_info("y", TP.FLOAT, None), h.make_tensor_value_info("z", TP.INT64, None)],
               [nh.from_array(np.array(2, np.int64), "two")])
    out, ctx = _lower(m)
    assert _ops(out) == ["Shape", "Mul", "Erf", "Identity"]
    assert ctx.stats["to_cinm"]["kept"]["Mul"] == {"shape computation": 1}
    assert_matches_ort(m, out)


def test_placement_heuristic_and_reasons():
    # a big constant-weight Gemm goes to the crossbar, a tiny one and elementwise to UPMEM,
    # a float64 op to the host (no device supports it).
    w_big = rng.standard_normal((256, 128)).astype(np.float32)
    w_small = rng.standard_normal((128, 2)).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "wb"], ["h1"]), h.make_node("Relu", ["h1"], ["h2"]),
             h.make_node("MatMul", ["h2", "ws"], ["y"]), h.make_node("Relu", ["d"], ["dy"])]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["N", 256]),
                       h.make_tensor_value_info("d", TP.DOUBLE, [3])],
               [h.make_tensor_value_info("y", TP.FLOAT, None), h.make_tensor_value_info("dy", TP.DOUBLE, None)],
               [nh.from_array(w_big, "wb"), nh.from_array(w_small, "ws")])
    out, _ = _lower(m, cim_preset="pcm-occ")  # "big": more than one 64 x 64 tile of the paper's chip
    placed = {n.output[0]: cinm.node_attrs(n) for n in out.graph.node}
    assert placed["h1"]["device"] == "memristor" and "32768 MACs" in placed["h1"]["placement"]
    assert placed["h2"]["device"] == "upmem"
    assert placed["y"]["device"] == "upmem" and "256 MACs" in placed["y"]["placement"]
    assert placed["dy"]["device"] == "host"
    assert_matches_ort(m, out)


def test_placement_hints_first_match_wins_and_fall_back():
    w = rng.standard_normal((256, 128)).astype(np.float32)
    m = _model([h.make_node("MatMul", ["x", "w"], ["h1"], name="fc1"), h.make_node("Relu", ["h1"], ["y"], name="act")],
               [h.make_tensor_value_info("x", TP.FLOAT, ["N", 256])], [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(w, "w")])
    work = onnx.ModelProto()
    work.CopyFrom(m)
    ctx = PassContext(options={"placement": "heuristic",
                               "place": [("fc1*", "upmem"), ("Gemm", "host"), ("Relu", "memristor")]})
    out = placement(to_cinm(work, ctx), ctx)
    placed = {n.op_type: cinm.node_attrs(n) for n in out.graph.node}
    assert placed["Gemm"]["device"] == "upmem" and placed["Gemm"]["placement"].startswith("hint fc1*=upmem")
    # Relu cannot run on a crossbar: the hint falls back to the heuristic and says so
    assert placed["Relu"]["device"] == "upmem" and "not possible" in placed["Relu"]["placement"]
    # Gemm=host matched the Gemm, but fc1*=upmem came first: shadowed, not unmatched (issue 12)
    st = ctx.stats["placement"]
    assert st["unused_hints"] == [] and st["shadowed_hints"] == [("Gemm=host", ["fc1*=upmem"])]
    assert [(h, [n for n, _ in nodes]) for h, nodes in st["refused_hints"]] == \
        [("Relu=memristor", ["act/Relu"])]


@pytest.mark.parametrize("place", [(), (("*", "host"),)])
def test_a_contrib_op_before_a_cinm_op_stays_on_the_host(place):
    """com.microsoft.Gelu's output has no type for onnx's inference: the cinm Transpose after it
    stays untyped instead of crashing optimize (it crashed with AttributeError, exit 3)."""
    from onnx_cinm import optimize

    g = h.make_graph([h.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
                      h.make_node("Transpose", ["g"], ["y"], perm=[0, 2, 1])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["N", 8, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
                     ir_version=10)
    res = optimize(m, place=list(place), dims={"N": 3})
    assert res.check is not None and res.check.ok
    assert [n.op_type for n in res.model.graph.node] == ["Gelu", "Transpose"]
    x = rng.standard_normal((3, 4, 8)).astype(np.float32)
    y = InferenceSession(res.model).run(None, {"x": x})[0]
    gelu = 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))
    np.testing.assert_allclose(y, gelu.transpose(0, 2, 1), rtol=1e-5, atol=1e-6)


def _dynamic_quant_matmul(w_lo=-64, w_hi=64, k=256, n=128):
    """onnxruntime's dynamic quantization pattern: DynamicQuantizeLinear + MatMulInteger + scales.
    Weights in [-64, 64) are the quantizer's reduce_range: onnxruntime's u8s8 kernels are exact
    there (full-range int8 can saturate int16 pair sums on x86 without VNNI)."""
    w = rng.integers(w_lo, w_hi, (k, n)).astype(np.int8)
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             h.make_node("MatMulInteger", ["xq", "Wq", "xzp", "wzp"], ["acc"], name="mmi"),
             h.make_node("Cast", ["acc"], ["accf"], to=TP.FLOAT),
             h.make_node("Mul", ["xs", "ws"], ["sc"]), h.make_node("Mul", ["accf", "sc"], ["y"])]
    inits = [nh.from_array(w, "Wq"), nh.from_array(np.array(3, np.int8), "wzp"),
             nh.from_array(np.array(0.02, np.float32), "ws")]
    return _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", k])],
                  [h.make_tensor_value_info("y", TP.FLOAT, ["batch", "seq", n])], inits, opset=13), w


@pytest.mark.parametrize("device", ["memristor", "upmem"])
def test_matmul_integer_becomes_an_exact_int32_gemm_on_a_device(device, tmp_path):
    from onnx_cinm import artifacts, optimize

    m, _ = _dynamic_quant_matmul()
    res = optimize(m, place=[("*Gemm", device)], device_options={"cim_preset": "pcm-occ"},
                   dims={"batch": 2, "seq": 16}, check=2)
    assert res.check.ok and res.check.max_abs_err == 0  # exact: integer arithmetic
    gemm = next(n for n in res.model.graph.node if n.domain == "cinm" and n.op_type == "Gemm")
    assert cinm.node_attrs(gemm)["device"] == device  # int32: int8 weights in cells, or DPUs
    assert "MatMulInteger" not in [n.op_type for n in res.model.graph.node]
    assert res.device_flops_share > 0.95  # it was 0%: MatMulInteger stayed on the host
    artifacts.save(res.model, tmp_path / "opt.onnx")
    sess = InferenceSession(str(tmp_path / "opt.onnx"))
    for shape in ((1, 3, 256), (4, 7, 256)):  # other batch sizes than planned
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], run_onnxruntime(m, {"x": x})[0])


def test_matmul_integer_with_full_range_weights_is_exact_int32_math():
    """Full-range int8 weights: the lowered model computes (xq - xzp) @ (W - wzp) exactly; the
    assertion is numpy's exact product (onnxruntime's u8s8 kernel may saturate here)."""
    from onnx_cinm import optimize

    m, w = _dynamic_quant_matmul(-127, 128)
    res = optimize(m, placement="heuristic", dims={"batch": 1, "seq": 8}, check=0)
    probe = onnx.ModelProto()
    probe.CopyFrom(res.model)
    probe.graph.output.extend([h.make_tensor_value_info(n, t, None) for n, t in
                               (("acc", TP.INT32), ("xq", TP.UINT8), ("xzp", TP.UINT8))])
    x = rng.standard_normal((1, 8, 256)).astype(np.float32)
    _, acc, xq, xzp = run_onnxruntime(probe, {"x": x})
    exact = (xq.astype(np.int64) - int(xzp)) @ (w.astype(np.int64) - 3)
    np.testing.assert_array_equal(acc, exact)


def test_conv_integer_becomes_im2col_and_an_int32_gemm(tmp_path):
    from onnx_cinm import artifacts, optimize

    w = rng.integers(0, 255, (8, 3, 3, 3)).astype(np.uint8)
    inits = [nh.from_array(w, "W"), nh.from_array(np.array(7, np.uint8), "xzp"),
             nh.from_array(np.array(120, np.uint8), "wzp")]
    m = _model([h.make_node("ConvInteger", ["x", "W", "xzp", "wzp"], ["y"], pads=[1, 1, 1, 1], name="ci")],
               [h.make_tensor_value_info("x", TP.UINT8, ["N", 3, 10, 10])],
               [h.make_tensor_value_info("y", TP.INT32, ["N", 8, 10, 10])], inits, opset=13)
    res = optimize(m, placement="heuristic", dims={"N": 2}, check=2)
    assert res.check.ok and res.check.max_abs_err == 0
    assert [n.op_type for n in res.model.graph.node if n.domain == "cinm"] == ["Im2Col", "Gemm"]
    # the zero-padded border of x - 7 is the border ConvInteger pads with its zero point 7
    x = rng.integers(0, 255, (2, 3, 10, 10)).astype(np.uint8)
    xp = np.pad(x.astype(np.int64) - 7, ((0, 0), (0, 0), (1, 1), (1, 1)))
    wi = w.astype(np.int64) - 120
    exact = np.zeros((2, 8, 10, 10), np.int64)
    for i in range(3):
        for j in range(3):
            exact += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + 10, j:j + 10], wi[:, :, i, j])
    artifacts.save(res.model, tmp_path / "opt.onnx")
    np.testing.assert_array_equal(InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"x": x})[0], exact)


@pytest.mark.parametrize("with_bn", [False, True])
def test_filled_conv_weight_is_lowered_without_reading_it(monkeypatch, with_bn):
    """A Conv weight fold_constants filled with one value (a light model's ConstantOfShape)
    reaches to_cinm as known through normalize and fold_batchnorm (PassContext.fills; with a
    BatchNormalization of equal per-channel parameters, the folded weight of one value that
    fold_batchnorm made): the Gemm weight is that value broadcast, written without the Conv
    weight's bytes being read back, and the model computes what onnxruntime computes."""
    nodes = [h.make_node("ConstantOfShape", ["w_shape"], ["w"],
                         value=h.make_tensor("v", TP.FLOAT, [1], [0.3])),
             h.make_node("Conv", ["x", "w"], ["c" if with_bn else "y"], pads=[1, 1, 1, 1])]
    inits = [nh.from_array(np.array([4, 3, 3, 3], np.int64), "w_shape")]
    if with_bn:
        for name, v in (("scale", 1.5), ("shift", 0.25), ("mean", -0.5), ("var", 0.8)):
            inits.append(nh.from_array(np.full(4, v, np.float32), name))
        nodes.append(h.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["y"]))
    model = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6])],
                   [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    value = 0.3
    if with_bn:  # numpy's fold: float64 products rounded to float32
        value = np.float64(np.float32(0.3)) * 1.5 / np.sqrt(np.float64(np.float32(0.8)) +
                                                            np.float64(np.float32(1e-5)))
    read = []
    to_array = nh.to_array
    monkeypatch.setattr(nh, "to_array", lambda t, *a: read.append(tuple(t.dims)) or to_array(t, *a))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ctx = PassContext()
    out = PassManager(pipeline=["fold_constants", "normalize", "fold_batchnorm", "to_cinm"]).run(out, ctx)
    gemm = next(n for n in out.graph.node if n.op_type == "Gemm")
    assert (4, 3, 3, 3) not in read, read  # the one 4-D tensor: the Conv weight
    monkeypatch.undo()
    w = nh.to_array(next(t for t in out.graph.initializer if t.name == gemm.input[1]))
    assert w.shape == (27, 4) and w.tobytes() == np.full((27, 4), value, np.float32).tobytes()
    assert_matches_ort(model, out, n=2, atol=1e-5)


def test_a_filled_conv_weight_becomes_its_gemm_matrix_as_the_copy_would_be():
    """The Conv weights fold_constants filled with one value (two Convs; a third reads the
    second's weight too) are lowered as known fills: the first Gemm matrix of each is that
    initializer renamed, reshaped and moved, not copied. The model written and the origins
    restore_host_ops reads are the same, byte for byte, as when the weights are read back
    (no fills known: the copy path); the origins then hold a FillWeight of each weight."""
    from onnx_cinm.rewrite import FillWeight

    def filled(name, dims, v):
        return [h.make_node("ConstantOfShape", [f"{name}_shape"], [name],
                            value=h.make_tensor("v", TP.FLOAT, [1], [v]))], \
            [nh.from_array(np.array(dims, np.int64), f"{name}_shape")]

    n1, i1 = filled("w1", [4, 3, 3, 3], 0.25)
    n2, i2 = filled("w2", [5, 4, 1, 1], -1.5)
    nodes = n1 + n2 + [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                       h.make_node("Relu", ["c1"], ["r"]),
                       h.make_node("Conv", ["r", "w2"], ["c2"]),
                       h.make_node("Conv", ["r", "w2"], ["c3"]),
                       h.make_node("Add", ["c2", "c3"], ["y"])]
    inits = [nh.from_array(np.arange(4, dtype=np.float32), "b1")] + i1 + i2
    model = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6])],
                   [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    ctx = PassContext()
    front = PassManager(pipeline=["fold_constants", "normalize", "fold_batchnorm"]).run(model, ctx)
    weights = {t.name: t.SerializeToString() for t in front.graph.initializer}
    assert {"w1", "w2"} <= set(weights)
    got, want = onnx.ModelProto(), onnx.ModelProto()
    got.CopyFrom(front)
    want.CopyFrom(front)
    fills = PassContext(fills={"w1": (TP.FLOAT, (4, 3, 3, 3), np.float32(0.25).tobytes()),
                               "w2": (TP.FLOAT, (5, 4, 1, 1), np.float32(-1.5).tobytes())})
    plain = PassContext()
    got = to_cinm(got, fills)
    want = to_cinm(want, plain)
    assert got.SerializeToString() == want.SerializeToString()
    assert got.graph.initializer[0].name == "b1"  # kept, in its place
    held = [(name, t) for _, w, _ in fills.origins for name, t in w.items()]
    assert sorted(name for name, t in held if isinstance(t, FillWeight)) == ["w1", "w2", "w2"]
    assert [(n, p.SerializeToString(), k) for p, w, k in fills.origins for n in w] == \
        [(n, p.SerializeToString(), k) for p, w, k in plain.origins for n in w]
    for (name, t), (_, ref) in zip(held, [(n, t) for _, w, _ in plain.origins for n, t in w.items()]):
        tensor = t.tensor() if isinstance(t, FillWeight) else t
        assert tensor.SerializeToString() == ref.SerializeToString()
        if name in weights:
            assert tensor.SerializeToString() == weights[name]
    assert_matches_ort(model, got, n=2, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_a_clip_with_one_bound_runs_on_the_dpus_as_onnxruntime_clips(dtype, tmp_path):
    """A Clip giving only min, or only max (the other input absent or named ""), has the bound
    it leaves out written as ONNX's default (lowest / max of the type): the UPMEM kernel took it
    for ambiguous and refused it ("cannot tell min from max"), and -inf still clips to the
    float's lowest as onnxruntime does."""
    from onnx_cinm import artifacts, optimize

    tp = TP.FLOAT if dtype == np.float32 else TP.INT32
    nodes = [h.make_node("Clip", ["x", "lo"], ["a"], name="only_min"),
             h.make_node("Clip", ["x", "", "hi"], ["b"], name="only_max")]
    inits = [nh.from_array(np.array(-3, dtype), "lo"), nh.from_array(np.array(5, dtype), "hi")]
    m = _model(nodes, [h.make_tensor_value_info("x", tp, ["n", 64])],
               [h.make_tensor_value_info(o, tp, ["n", 64]) for o in ("a", "b")], inits, opset=13)
    res = optimize(m, place=[("only_*", "upmem")], dims={"n": 4}, check=1)
    assert res.check.ok
    clips = [n for n in res.model.graph.node if n.op_type == "Clip"]
    assert [(n.domain, cinm.node_attrs(n)["device"]) for n in clips] == [("cinm", "upmem")] * 2
    assert all(len(n.input) == 3 and all(n.input) for n in clips)
    artifacts.save(res.model, tmp_path / "opt.onnx")
    sess = InferenceSession(str(tmp_path / "opt.onnx"))
    x = (rng.standard_normal((4, 64)) * 10).astype(dtype)
    if dtype == np.float32:
        x[0, :3] = [-np.inf, np.inf, np.nan]
    want = run_onnxruntime(m, {"x": x})
    assert np.nanmin(want[0]) == -3 and np.nanmax(want[1]) == 5  # both bounds bite
    if dtype == np.float32:  # the bound left out is the type's lowest / max, not an infinity
        big = np.finfo(np.float32).max
        assert want[0][0, 1] == big and want[1][0, 0] == -big
    for got, ref in zip(sess.run(None, {"x": x}), want):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("strategy", ["cost", "heuristic"])
def test_a_hint_may_name_the_onnx_op_type_a_cinm_op_was_lowered_from(strategy):
    """``MatMul=upmem`` matched nothing (a trial: the warning, exit 0 and no op on the DPUs):
    hints matched the cinm op types (Gemm) and names only. They now match the source node's op
    type too: every cinm op a Conv became (Im2Col, Gemm) and the Gemm a MatMul became, and
    nothing lowered from another op type (the Relu)."""
    w = rng.standard_normal((64, 32)).astype(np.float32)
    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = _model([h.make_node("Conv", ["x", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                h.make_node("Relu", ["c"], ["r"], name="act"),
                h.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
                h.make_node("MatMul", ["f", "w"], ["y"], name="fc")],
               [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4, 4])],
               [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(w, "w"), nh.from_array(k, "k"),
                nh.from_array(np.array([2, 64], np.int64), "shape")])
    out, ctx = _lower(m, placement=strategy, place=[("MatMul", "upmem"), ("Conv", "upmem")])
    placed = {n.name: cinm.node_attrs(n)["device"] for n in out.graph.node if n.domain == "cinm"}
    assert placed == {"conv/Im2Col": "upmem", "conv/Gemm": "upmem", "act/Relu": placed["act/Relu"],
                      "fc/Gemm": "upmem"}
    notes = {n.name: cinm.node_attrs(n)["placement"] for n in out.graph.node if n.domain == "cinm"}
    assert notes["fc/Gemm"].startswith("hint MatMul=upmem")
    assert notes["conv/Gemm"].startswith("hint Conv=upmem")
    assert not notes["act/Relu"].startswith("hint")
    assert ctx.stats["placement"]["unused_hints"] == []
    assert_matches_ort(m, out)


def test_a_hint_naming_a_fusions_anchor_type_does_not_take_the_fused_op():
    """A tanh GELU is fused into one cinm Gelu anchored on its Tanh: ``Tanh=host`` took the Gelu
    too (its recorded source type was the anchor's). It now takes the plain Tanh only; the
    Gelu answers to its own type."""
    c = float(np.sqrt(2 / np.pi))
    consts = {"k3": 3.0, "a": 0.044715, "c": c, "one": 1.0, "half": 0.5}
    nodes = [h.make_node("Pow", ["x", "k3"], ["p"]), h.make_node("Mul", ["p", "a"], ["pa"]),
             h.make_node("Add", ["x", "pa"], ["s"]), h.make_node("Mul", ["s", "c"], ["sc"]),
             h.make_node("Tanh", ["sc"], ["t"], name="gelu_tanh"),
             h.make_node("Add", ["t", "one"], ["t1"]), h.make_node("Mul", ["x", "t1"], ["xt"]),
             h.make_node("Mul", ["xt", "half"], ["g"]),
             h.make_node("Tanh", ["g"], ["y"], name="plain_tanh")]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [4, 64])],
               [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    out, ctx = _lower(m, place=[("Tanh", "host"), ("Gelu", "upmem")])
    notes = {n.op_type: cinm.node_attrs(n)["placement"] for n in out.graph.node
             if n.domain == "cinm"}
    assert set(notes) == {"Gelu", "Tanh"}  # the GELU fused, the last Tanh lowered alone
    assert notes["Tanh"].startswith("hint Tanh=host") and notes["Gelu"].startswith("hint Gelu=upmem")
    assert_matches_ort(m, out)
