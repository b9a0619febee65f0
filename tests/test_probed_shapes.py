"""Sizes onnx's shape inference leaves open, taken from one onnxruntime run at the planned sizes
(:func:`onnx_cinm.pipeline._probe_open_shapes`), and onnxruntime's int8 LSTM counted.

Expected FLOPs and crossbar rows are counted by hand from the test models' shapes; outputs are
compared with stock onnxruntime on the original model.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import analysis, artifacts, frontend, optimize
from onnx_cinm.errors import CinmError
from onnx_cinm.golden import run_onnxruntime


def _computed_pad():
    """x[N, 4, H, W] -> Pad by pads computed from Shape(x) (H // 3 and W // 3 on each side;
    the 1-D Transpose on the way is arithmetic neither onnx nor the shape folder evaluates, as
    in TF-exported ResNets) -> Conv 3x3, 8 channels -> y[N, 8, H + 2 (H // 3) - 2, ...]."""
    w = nh.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    inits = [w, nh.from_array(np.array([2], np.int64), "two"), nh.from_array(np.array([4], np.int64), "four"),
             nh.from_array(np.array([3], np.int64), "three"),
             nh.from_array(np.array([0, 0], np.int64), "zeros")]
    n = h.make_node
    nodes = [n("Shape", ["x"], ["s"]), n("Slice", ["s", "two", "four"], ["hw"]),
             n("Div", ["hw", "three"], ["p"]), n("Transpose", ["p"], ["pt"], perm=[0]),
             n("Concat", ["zeros", "pt", "zeros", "pt"], ["pads"], axis=0),
             n("Pad", ["x", "pads"], ["xp"]), n("Conv", ["xp", "w"], ["y"], name="conv")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _flops(batch: int, hw: int) -> int:
    """2 x (4 channels x 3 x 3) per output element of the Conv (y[batch, 8, out, out], out =
    hw + 2 (hw // 3) - 2); the pads arithmetic is shape bookkeeping, folded at the planned
    sizes (0)."""
    out = hw + 2 * (hw // 3) - 2
    return 2 * (4 * 3 * 3) * (batch * 8 * out * out)


SIZES = {"N": 2, "H": 6, "W": 6}


def test_dims_inference_leaves_open_are_sized_by_one_run_and_the_model_stays_dynamic(tmp_path):
    """Planned at N=2, H=W=6 the padded tensor's dims were all anonymous (pads of unknown
    value), taken as 1 (so the Conv's rows too); one onnxruntime run at those sizes gives them their sizes.
    The saved model still runs at N=3, H=W=9 (other pads) and matches onnxruntime on the
    original."""
    from onnx_cinm.runtime import InferenceSession

    m = _computed_pad()
    planned = onnx.ModelProto()
    planned.CopyFrom(m)
    frontend.set_planned_dims(planned, SIZES)
    xp = analysis.tensor_infos(planned)["xp"].shape  # what inference alone says at those sizes
    assert len(xp) == 4 and not any(isinstance(d, int) for d in xp)

    res = optimize(m, dims=SIZES, place=[("*", "memristor")])
    assert res.flops_total == _flops(2, 6) == 73_728
    assert res.anonymous_dims == {} and "taken as 1" not in res.summary()
    rows = {n.name: h.get_attribute_value(a) for n in res.model.graph.node if n.domain == "cinm"
            for a in n.attribute if a.name == "cim_M"}
    assert rows == {"conv/Gemm": 2 * 8 * 8}  # im2col rows: N x output pixels
    assert analysis.tensor_infos(res.model)["xp"].shape == (2, 4, 10, 10)
    assert res.check.ok
    # the sizes live in the record, not in the graph's types
    for vi in (*res.model.graph.value_info, *res.model.graph.output):
        if vi.name in ("xp", "y"):
            assert not vi.type.tensor_type.shape.dim[0].HasField("dim_value")
    artifacts.save(res.model, tmp_path / "p.onnx")
    x = np.random.default_rng(1).standard_normal((3, 4, 9, 9)).astype(np.float32)
    got = InferenceSession(tmp_path / "p.onnx").run(None, {"x": x})[0]
    assert got.shape == (3, 8, 13, 13)  # pads of 3 at 9 x 9
    np.testing.assert_allclose(got, run_onnxruntime(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_asked_at_other_sizes_the_probed_shapes_do_not_apply():
    """The record holds the shapes at the planned sizes: at other sizes the padded dims are
    open again (taken as 1), never the planned run's."""
    res = optimize(_computed_pad(), dims=SIZES, check=0)
    assert frontend.probed_shapes(res.model)["xp"] == (TP.FLOAT, (2, 4, 10, 10))
    shape = analysis.tensor_infos(res.model, dims={"N": 5, "H": 6, "W": 6})["xp"].shape
    assert len(shape) == 4 and not any(isinstance(d, int) for d in shape)


def test_an_unsized_batch_is_probed_at_1_as_it_is_planned():
    """N unsized (a batch: axis 0 of the input alone) is planned at 1, and the run sizing the
    open dims runs at 1 too (a fresh user, s35: PyTorch's open_nsfw planned every convolution
    after its computed Pad at M = 1 without --dim, 252 MFLOP against 2.17 GFLOP with --dim
    batch=1): the same FLOPs and crossbar rows as N=1 given, the summary still saying N was
    taken as 1."""
    res = optimize(_computed_pad(), dims={"H": 6, "W": 6}, check=0, place=[("*", "memristor")])
    given = optimize(_computed_pad(), dims={"N": 1, "H": 6, "W": 6}, check=0,
                     place=[("*", "memristor")])
    # the Conv's as with N=1; the pads' Div (2 elements) stays in the graph with N open
    # (Shape(x) is not a constant there), computed at run time: 2 FLOPs more
    assert given.flops_total == _flops(1, 6) and res.flops_total == _flops(1, 6) + 2
    assert frontend.probed_shapes(res.model)["xp"] == (TP.FLOAT, (1, 4, 10, 10))
    rows = lambda r: {n.name: h.get_attribute_value(a) for n in r.model.graph.node  # noqa: E731
                      for a in n.attribute if a.name == "cim_M"}
    assert rows(res) == rows(given) == {"conv/Gemm": 8 * 8}
    assert res.anonymous_dims == {} and "symbolic dims taken as 1: N" in res.summary()


def test_without_sizes_the_summary_says_the_open_dims_count_one_and_how_to_size_them():
    """H unsized (not a batch: a run at 1 is no size the model was made for): no run at the
    planned sizes, so the padded dims count 1 (and the Conv nothing) and the summary says so
    plainly and names the fix."""
    res = optimize(_computed_pad(), dims={"N": 1, "W": 6}, check=0)
    assert res.anonymous_dims and frontend.probed_shapes(res.model) == {}
    assert res.flops_total < _flops(1, 6)
    text = res.summary()
    assert "FLOPs and plans count these dims as 1" in text
    assert "--overwrite-input-shape" in text and "--dim NAME=SIZE" in text


def test_a_malformed_probed_shapes_record_is_a_one_line_error():
    m = _computed_pad()
    m.metadata_props.add(key=frontend.PROBED_SHAPES_KEY, value='{"xp": [1, -2]}')
    with pytest.raises(CinmError, match="metadata 'onnx_cinm.probed_shapes' is malformed"):
        analysis.tensor_infos(m)


def _int8_lstm(seq="seq", batch="batch", n_in=3, hidden=4, acts=None):
    """X[seq, batch, 3] -> com.microsoft DynamicQuantizeLSTM (one direction, 4 units; W
    [1, 3, 16] and R [1, 4, 16] int8; ``acts``: its activations) -> Y[seq, 1, batch, 4] ->
    MatMul by [4, 6]. onnx has no schema for the contrib op: Y's shape is known only from a
    run."""
    rng = np.random.default_rng(0)
    g4 = 4 * hidden
    inits = [nh.from_array(rng.integers(-100, 100, (1, n_in, g4)).astype(np.int8), "W"),
             nh.from_array(rng.integers(-100, 100, (1, hidden, g4)).astype(np.int8), "R"),
             nh.from_array(rng.standard_normal((1, 2 * g4)).astype(np.float32), "B"),
             nh.from_array(np.array([0.01], np.float32), "w_scale"),
             nh.from_array(np.array([0], np.int8), "w_zp"),
             nh.from_array(np.array([0.02], np.float32), "r_scale"),
             nh.from_array(np.array([0], np.int8), "r_zp"),
             nh.from_array(rng.standard_normal((hidden, 6)).astype(np.float32), "w2")]
    nodes = [h.make_node("DynamicQuantizeLSTM", ["x", "W", "R", "B", "", "", "", "", "w_scale", "w_zp",
                                                 "r_scale", "r_zp"], ["Y"], domain="com.microsoft",
                         hidden_size=hidden, name="lstm", **({"activations": acts} if acts else {})),
             h.make_node("MatMul", ["Y", "w2"], ["z"], name="proj")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [seq, batch, n_in])],
                     [h.make_tensor_value_info("z", TP.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
                        ir_version=10)


def test_onnxruntimes_int8_lstm_is_counted_listed_and_what_follows_is_sized():
    """By hand at seq 5, batch 2: per step, row and direction the LSTM does 2 x 16 x (3 + 4)
    MACs-as-FLOPs plus (3 x 4 + 5) x 4 for the gates; the projection 2 x 4 x (5 x 1 x 2 x 6).
    It was 0 FLOPs (unknown op) and the projection's shape unknown. A HardSigmoid gate keeps
    the LSTM whole on the host (the recurrent rule lowers Sigmoid/Tanh/Relu only)."""
    lstm = 5 * 2 * 1 * (2 * 16 * (3 + 4) + (3 * 4 + 5) * 4)
    proj = 2 * 4 * (5 * 1 * 2 * 6)
    assert (lstm, proj) == (2920, 480)
    acts = ["HardSigmoid", "Tanh", "Tanh"]
    res = optimize(_int8_lstm(acts=acts), dims={"seq": 5, "batch": 2})
    assert res.flops_total == lstm + proj
    assert res.host_flops["DynamicQuantizeLSTM"] == lstm
    assert res.check.ok
    line = next(li for li in res.summary().splitlines() if li.startswith("left on host"))
    assert f"DynamicQuantizeLSTM x1, {100 * lstm / (lstm + proj):.1f}% of FLOPs " \
           f"(activations {acts} (supported: Sigmoid, Tanh, Relu))" in line
    assert analysis.tensor_infos(res.model)["Y"].shape == (5, 1, 2, 4)
    x = np.random.default_rng(2).standard_normal((5, 2, 3)).astype(np.float32)
    assert run_onnxruntime(_int8_lstm(acts=acts), {"x": x})[0].shape == (5, 1, 2, 6)  # onnxruntime runs it


def test_left_on_host_gives_a_share_only_where_every_node_of_the_type_stayed():
    """The pads' Div is kept ('shape computation'); with the Conv's Relu there are lowered
    ones too, so no FLOP share is claimed for the kept ones (it would be the lowered Relus')."""
    m = _computed_pad()
    m.graph.node.append(h.make_node("Relu", ["y"], ["r"]))
    m.graph.node.append(h.make_node("Div", ["r", "half"], ["d"]))
    m.graph.initializer.append(nh.from_array(np.array(0.5, np.float32), "half"))
    m.graph.output[0].name = "d"
    res = optimize(m, dims=SIZES, check=0, place=[("*", "host")])
    line = next(li for li in res.summary().splitlines() if li.startswith("left on host"))
    assert "Div x1 (shape computation)" in line


# ------------------------------------------------------------------ sized by the given data
K8, N8, VOCAB = 256, 128, 300


def _unique_encoder():
    """ids[n] (int64 tokens) -> Unique -> Gather rows of a float table [300, 256] -> Reshape to
    a shape Compress filtered (data-sized: onnx knows neither the rank nor the dims) ->
    DynamicQuantizeLinear -> MatMulInteger with a constant int8 weight [256, 128] -> y int32:
    the structure of a quantized text encoder (USE-multilingual's embedding lookup). The rows
    of the product are the distinct tokens of the data."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.standard_normal((VOCAB, K8)).astype(np.float32), "table"),
             nh.from_array(rng.integers(-127, 128, (K8, N8)).astype(np.int8), "w"),
             nh.from_array(np.array(0, np.int8), "wzp"),
             nh.from_array(np.array(0, np.int64), "zero")]
    n = h.make_node
    nodes = [n("Unique", ["ids"], ["u", "", "", ""], sorted=1),
             n("Gather", ["table", "u"], ["rows"], axis=0),
             n("Shape", ["rows"], ["s"]), n("Greater", ["s", "zero"], ["keep"]),
             n("Compress", ["s", "keep"], ["s2"], axis=0), n("Reshape", ["rows", "s2"], ["x"]),
             n("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             n("MatMulInteger", ["xq", "w", "xzp", "wzp"], ["y"], name="mmi")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", TP.INT64, ["n"])],
                     [h.make_tensor_value_info("y", TP.INT32, ["m", N8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_given_inputs_size_a_weight_stationary_product_after_a_unique(tmp_path):
    """With the user's arrays for every input, the probe sizes the rows the data gives (what
    a Unique leaves, through a Reshape of a computed shape): the int8 product becomes a
    crossbar Gemm, its FLOPs 2 M K N with M the distinct tokens (numpy's count); the compiled
    model still runs, exactly, on other data. Random inputs size nothing after the Unique."""
    model = _unique_encoder()
    ids = np.array([5, 9, 5, 17, 250, 9, 3, 42, 17, 17, 8, 99, 100, 7, 1, 2, 64] * 3, np.int64)
    m = len(np.unique(ids))  # 14
    res = optimize(model, inputs={"ids": ids}, place=[("mmi*", "memristor")])
    gemms = [nd for nd in res.model.graph.node if nd.op_type == "Gemm" and nd.domain == "cinm"]
    assert [frontend_dev(nd) for nd in gemms] == ["memristor"]
    assert res.flops_on_devices == 2 * m * K8 * N8
    path = tmp_path / "enc.onnx"
    artifacts.save(res.model, path)
    from onnx_cinm.runtime import InferenceSession

    other = np.array([3, 3, 299, 0, 12], np.int64)
    (y,) = InferenceSession(str(path)).run(None, {"ids": other})
    (want,) = run_onnxruntime(model, {"ids": other})
    np.testing.assert_array_equal(y, want)
    # random ids: one draw's distinct count is no size to plan at, the product stays unsized
    rand = optimize(model, dims={"n": len(ids)}, check=0)
    assert rand.flops_on_devices == 0
    assert not any(nd.domain == "cinm" for nd in rand.model.graph.node)


def frontend_dev(node):
    from onnx_cinm.dialects import cinm

    return cinm.node_attrs(node).get("device")


def test_a_graph_output_declared_with_an_open_dim_is_sized_by_the_probe():
    """madmom's notes RNN declares its output ``[output_0_dim_0]`` (rank 1) where onnxruntime
    gives ``[T, 88]``: inference keeps the declared type, and the probe's shape was never
    applied to a graph output, so the summary warned "could not size output_0_dim_0" with
    every input given. Here: x[T, 4] @ w[4, 3] -> Squeeze (no axes) -> y declared ["odim"];
    at T = 5 onnxruntime gives y [5, 3]."""
    w = nh.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                      h.make_node("Squeeze", ["m"], ["y"], name="sq")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["T", 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["odim"])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    assert run_onnxruntime(m, {"x": x})[0].shape == (5, 3)
    res = optimize(m, inputs={"x": x})
    assert res.anonymous_dims == {}
    assert "could not size" not in res.summary()
    assert analysis.tensor_infos(res.model)["y"].shape == (5, 3)
