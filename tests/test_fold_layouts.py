"""A device Gemm written in its consumer's layout (``cinm.Gemm`` ``y_perm``, pass ``fold_layouts``).

``to_cinm`` lowers a Conv to ``Im2Col -> Gemm -> Transpose`` (the product is ``[N, *O, M]``);
on the crossbars the Transpose is folded into the Gemm, whose kernel writes NCHW itself. The
references here are independent of the code under test: a direct convolution in numpy
(float64, one kernel position at a time), numpy's transpose, and onnxruntime on the original
model.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, devices, optimize
from onnx_cinm.analysis import op_info, tensor_infos
from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession

OCC = {"cim_preset": "pcm-occ"}  # the CINM paper's 64 x 64 crossbars


def _conv_ref(x, w, b, strides, pads, dilations):
    """Direct 2-D convolution in float64: for every kernel position, the strided window of the
    zero-padded input times that position's weights (pads ``[top, left, bottom, right]``)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilations[0], j * dilations[1]
            win = xp[:, :, r0:r0 + (oh - 1) * strides[0] + 1:strides[0],
                     c0:c0 + (ow - 1) * strides[1] + 1:strides[1]]
            y += np.einsum("nchw,mc->nmhw", win, w[:, :, i, j])
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def _conv_model(n, c, h, wd, m, k, strides, pads, dilations, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c) + k).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    inits = [numpy_helper.from_array(w, "W")] + ([numpy_helper.from_array(b, "B")] if bias else [])
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if bias else []), ["Y"], name="conv",
                            strides=list(strides), pads=list(pads), dilations=list(dilations))
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                         [n, c, h, wd])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w, b


def _compile(model, tmp_path, **kw):
    kw.setdefault("device_options", OCC)
    res = optimize(model, check=0, placement="heuristic", **kw)
    path = tmp_path / "opt.onnx"
    artifacts.save(res.model, path)
    return res, path


def _gemms(model):
    return [n for n in model.graph.node if n.domain == cinm.DOMAIN and n.op_type == "Gemm"]


# (batch, channels, H, W, M, kernel, strides, pads, dilations, bias)
CONVS = [
    (1, 3, 9, 9, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True),      # a 3x3 stem
    (1, 16, 7, 7, 70, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True),     # 1x1: Im2Col is a view
    (1, 5, 10, 6, 66, (3, 1), (2, 1), (2, 0, 1, 0), (2, 1), False),    # strided, dilated, no bias
    (2, 4, 8, 8, 64, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), True),      # batch 2
]


@pytest.mark.parametrize("case", CONVS, ids=["3x3", "1x1", "strided-dilated", "batch2"])
def test_conv_gemm_writes_nchw_and_equals_numpy(case, tmp_path):
    n, c, h, wd, m, k, st, pads, dl, bias = case
    model, w, b = _conv_model(n, c, h, wd, m, k, st, pads, dl, bias)
    res, path = _compile(model, tmp_path, place=[("conv*", "memristor")])
    g = res.model.graph
    assert [nd.op_type for nd in g.node if nd.domain in ("", "ai.onnx")] == []  # no Transpose
    (gemm,) = _gemms(res.model)
    at = cinm.node_attrs(gemm)
    assert at["device"] == "memristor" and at["y_perm"] == [0, 3, 1, 2]
    assert gemm.output[0] == "Y"
    x = np.random.default_rng(1).standard_normal((n, c, h, wd)).astype(np.float32)
    sess = InferenceSession(path)
    (y,) = sess.run(None, {"X": x})
    ref = _conv_ref(x, w, b, st, pads, dl)
    assert y.shape == ref.shape and y.dtype == np.float32 and y.flags.c_contiguous
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # batch 1: the simulator wrote Y^T = W^T X^T (a product marked T), the NCHW result itself;
    # batch 2 is not one transposed matrix: the plain product, permuted by one copy
    rows = n * ref.shape[2] * ref.shape[3]
    chosen = sess.configuration()["chosen"]
    label = f"{rows}x{c * k[0] * k[1]}x{m}" + ("T" if n == 1 else "")
    products = [key for key in chosen if not key.startswith("conv ")]
    # the product of the patches, unless it ran as a convolution of X (matmul=auto may choose
    # that by timing, in either layout; then the timing alone computed the product)
    if [v.startswith("onnxruntime") for key, v in chosen.items() if key.startswith("conv ")] \
            == [True]:
        assert set(products) <= {label}
    else:
        assert products == [label]
    # and stock onnxruntime runs the Gemm's reference body (MatMul, Add, Transpose) to the
    # same numbers as the original Conv
    np.testing.assert_allclose(run_onnxruntime(res.model, {"X": x})[0],
                               run_onnxruntime(model, {"X": x})[0], rtol=1e-5, atol=1e-5)


def _squeezenet_like(seed=0):
    """conv 3x3/2 -> relu -> maxpool -> fire (squeeze 1x1, expand 1x1 | expand 3x3, concat)
    -> relu -> conv 1x1 -> global average pool: SqueezeNet's layer pattern, small."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv(name, x, cin, cout, k, **at):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32),
            f"{name}_w"))
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32),
                                             f"{name}_b"))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_y"],
                                      name=name, **at))
        nodes.append(helper.make_node("Relu", [f"{name}_y"], [f"{name}_r"], name=f"{name}_relu"))
        return f"{name}_r"

    t = conv("conv1", "data", 3, 32, 3, strides=[2, 2])
    nodes.append(helper.make_node("MaxPool", [t], ["pool1"], kernel_shape=[3, 3], strides=[2, 2]))
    s = conv("squeeze", "pool1", 32, 16, 1)
    e1 = conv("expand1", s, 16, 64, 1)
    e3 = conv("expand3", s, 16, 64, 3, pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("Concat", [e1, e3], ["fire"], axis=1))
    t = conv("conv10", "fire", 128, 100, 1)
    nodes.append(helper.make_node("GlobalAveragePool", [t], ["out"]))
    g = helper.make_graph(nodes, "squeezenet_like",
                          [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 33, 33])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_squeezenet_like_graph_has_no_transpose_after_a_gemm(tmp_path):
    model = _squeezenet_like()
    res, path = _compile(model, tmp_path)
    g = res.model.graph
    gemms = _gemms(res.model)
    assert len(gemms) == 5 and all(cinm.node_attrs(n)["device"] == "memristor" for n in gemms)
    assert all(cinm.node_attrs(n)["y_perm"] == [0, 3, 1, 2] for n in gemms)
    assert not [n for n in g.node if n.op_type == "Transpose"]
    assert res.stats["fold_layouts"] == {"folded": 5}
    onnx.checker.check_model(res.model, full_check=True)
    x = np.random.default_rng(2).standard_normal((1, 3, 33, 33)).astype(np.float32)
    sess = InferenceSession(path)
    # the host partitions hold no Transpose either
    assert not [n for p in sess._parts for n in p.nodes if n.op_type == "Transpose"]  # noqa: SLF001
    np.testing.assert_allclose(sess.run(None, {"data": x})[0],
                               run_onnxruntime(model, {"data": x})[0], rtol=1e-4, atol=1e-5)


def _matmul_then(reader_ops, seed=0):
    """X[80, 96] @ W[96, 72] -> Transpose [1, 0] (-> also Relu when ``reader_ops`` says so)."""
    w = np.random.default_rng(seed).standard_normal((96, 72)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["P"], name="mm"),
             helper.make_node("Transpose", ["P"], ["T"], name="tr", perm=[1, 0])]
    outs = [helper.make_tensor_value_info("T", TensorProto.FLOAT, None)]
    if "relu" in reader_ops:
        nodes.append(helper.make_node("Relu", ["P"], ["R"], name="relu"))
        outs.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "mmt", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [80, 96])],
                          outs, [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w


def test_matmul_transpose_folds_into_a_crossbar_gemm(tmp_path):
    model, w = _matmul_then(())
    res, path = _compile(model, tmp_path, place=[("mm*", "memristor"), ("tr", "host")])
    (gemm,) = _gemms(res.model)
    assert cinm.node_attrs(gemm)["y_perm"] == [1, 0]
    assert not [n for n in res.model.graph.node if n.op_type == "Transpose"]
    x = np.random.default_rng(3).standard_normal((80, 96)).astype(np.float32)
    (y,) = InferenceSession(path).run(None, {"X": x})
    assert y.shape == (72, 80) and y.flags.c_contiguous
    np.testing.assert_allclose(y, (x.astype(np.float64) @ w).T, rtol=1e-4, atol=1e-4)


def test_permuted_gemm_with_the_left_operand_programmed(tmp_path):
    """W[72, 96] @ X[96, 80] programs W (operand A): the simulator's rows are Y^T, which with
    y_perm [1, 0] is the node's result as it stands."""
    w = np.random.default_rng(5).standard_normal((72, 96)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["W", "X"], ["P"], name="mm"),
                           helper.make_node("Transpose", ["P"], ["T"], name="tr", perm=[1, 0])],
                          "wx", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [96, 80])],
                          [helper.make_tensor_value_info("T", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res, path = _compile(model, tmp_path, place=[("mm*", "memristor"), ("tr", "host")])
    (gemm,) = _gemms(res.model)
    at = cinm.node_attrs(gemm)
    assert at["cim_operand"] == "A" and at["y_perm"] == [1, 0]
    x = np.random.default_rng(6).standard_normal((96, 80)).astype(np.float32)
    (y,) = InferenceSession(path).run(None, {"X": x})
    assert y.shape == (80, 72) and y.flags.c_contiguous
    np.testing.assert_allclose(y, (w.astype(np.float64) @ x).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("why", ["two readers", "gemm on host", "gemm on upmem"])
def test_transpose_stays_when_it_cannot_fold(why, tmp_path):
    model, _ = _matmul_then(("relu",) if why == "two readers" else ())
    dev = {"two readers": "memristor", "gemm on host": "host", "gemm on upmem": "upmem"}[why]
    res, _ = _compile(model, tmp_path, place=[("mm*", dev), ("tr", "host"), ("relu", "host")])
    (gemm,) = _gemms(res.model)
    assert cinm.node_attrs(gemm)["device"] == dev and "y_perm" not in cinm.node_attrs(gemm)
    assert [n.op_type for n in res.model.graph.node if n.op_type == "Transpose"] == ["Transpose"]
    assert res.stats["fold_layouts"] == {"folded": 0}


@pytest.mark.parametrize("bias", [False, True])
def test_gemm_y_perm_reference_body_is_the_permuted_product(bias):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    c = rng.standard_normal(3).astype(np.float32)
    names = ["A", "B"] + (["C"] if bias else [])
    node = cinm.make_node("Gemm", names, ["Y"], y_perm=[0, 3, 1, 2])
    vals = dict(zip(names, (a, b, c)))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                        for k, v in vals.items()],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    m = cinm.attach_functions(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert m.graph.node[0].overload == ("bias_perm" if bias else "perm")
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [2, 3, 5, 6]
    onnx.checker.check_model(m, full_check=True)
    (y,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, vals)
    want = np.einsum("nhwk,km->nmhw", a.astype(np.float64), b.astype(np.float64))
    if bias:
        want += c[None, :, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_only_a_device_that_writes_the_layout_takes_a_permuted_gemm():
    model, _ = _matmul_then(())
    res = optimize(model, check=0, placement="heuristic", device_options=OCC,
                   place=[("mm*", "memristor"), ("tr", "host")])
    (gemm,) = _gemms(res.model)
    info = op_info(gemm, tensor_infos(res.model))
    assert devices.get_device("memristor").writes_permuted(info, [1, 0])
    assert not devices.get_device("upmem").writes_permuted(info, [1, 0])
    s = devices.get_device("upmem").supports(info)
    assert not s and "y_perm" in s.reason
