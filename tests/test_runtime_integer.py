"""Issue 16: integer crossbar products in onnxruntime's integer kernels.

``MatrixKernels.int_matmul`` / ``int_conv`` must give exactly numpy's int64 products (wrapped
to int32) whichever kernel computes them, and a whole quantized model must give the same
integers on every kernel choice as the simulator's own float64 data path (``matmul=numpy``),
and onnxruntime's numbers on the original model.
"""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime import InferenceSession
from onnx_cinm.sim import blas

rng = np.random.default_rng(16)


def _wrap32(a):
    return a.astype(np.int64).astype(np.int32)


# (X range, W range): int8 activations, uint8 ones, uint8 minus a zero point (as a ConvInteger
# lowers them), int8 weights, uint8 weights minus a zero point, and operands that fit no uint8
# kernel (numpy computes them)
RANGES = [((-128, 128), (-128, 128)), ((0, 256), (-127, 128)), ((-17, 239), (-120, 136)),
          ((-300, 300), (-128, 128)), ((-128, 128), (-1000, 1000))]


@pytest.mark.parametrize("xr,wr", RANGES)
def test_integer_products_are_numpys_int64_products_on_every_kernel(xr, wr):
    # K = 700: int8 x uint8 sums pass 2**24, where a float32 product is no longer exact
    W = rng.integers(*wr, (700, 37)).astype(np.float64)  # integers as the simulator holds them
    for X in (rng.integers(*xr, (50, 700)).astype(np.int32),
              rng.integers(*xr, (700, 50)).astype(np.int32).T):  # a transposed view
        want = _wrap32(X.astype(np.int64) @ W.astype(np.int64))
        for mode in blas.MATMULS:
            for const in (True, False):
                k = blas.MatrixKernels(1, mode)
                for _ in range(2):  # the deciding call and a decided one
                    out = np.full((50, 37), 7, np.int32)
                    k.int_matmul(X, W, out, const=const)
                    np.testing.assert_array_equal(out, want)
                if mode == "auto":
                    assert k.describe()["chosen"].get("int 50x700x37") in (
                        None if xr[1] - xr[0] > 256 or wr[1] - wr[0] > 256 else "numpy",
                        "onnxruntime")


def test_integer_products_wrap_as_int32_sums_do():
    # 70000 x 255 x 127 passes 2**31: onnxruntime's int32 sums and the simulator's float64
    # ones wrapped to int32 agree (numpy's int64 product, wrapped)
    X = np.full((2, 70000), 255, np.int32)
    W = np.full((70000, 3), 127.0)
    want = _wrap32(X.astype(np.int64) @ W.astype(np.int64))
    assert (X.astype(np.int64) @ W.astype(np.int64)).max() > 2**31 and want.max() < 0
    for mode in blas.MATMULS:
        out = np.empty((2, 3), np.int32)
        blas.MatrixKernels(1, mode).int_matmul(X, W, out, const=True)
        np.testing.assert_array_equal(out, want)


# int_matmul at its extremes, (X, W): the largest byte products (pairs of them overflow int16),
# sums past 2**31 (int32 wraps), activations below zero and weights spanning 256 values (zero
# points), int8 x int8
EXTREMES = {
    "x255 w-128": (np.full((3, 4096), 255), np.full((4096, 5), -128)),
    "x255 w127": (np.full((3, 4096), 255), np.full((4096, 5), 127)),
    "x-255..0 w127": (rng.integers(-255, 1, (7, 999)), np.full((999, 9), 127)),
    "wrap K=70000": (np.full((2, 70000), 255), np.full((70000, 3), 127)),
    "wrap K=70000 w-128": (np.full((2, 70000), 255), np.full((70000, 3), -128)),
    "w-120..135": (rng.integers(0, 256, (5, 300)), rng.integers(-120, 136, (300, 6))),
    "x-128..127": (rng.integers(-128, 128, (5, 300)), rng.integers(-128, 128, (300, 6))),
}


@pytest.mark.parametrize("int8w", [True, False])
def test_integer_kernels_at_their_extremes_on_both_weight_forms(monkeypatch, int8w):
    """Both forms onnxruntime gets int8 weights in (int8, where its uint8 x int8 product is
    exact on the CPU; uint8 with a zero point elsewhere) give numpy's int64 products, wrapped
    to int32, at the extremes; so does a grouped, padded ConvInteger of activations below
    zero (uint8 weights either way)."""
    monkeypatch.setattr(blas, "INT8_WEIGHTS", int8w)
    k = blas.MatrixKernels(1, "onnxruntime")
    for name, (X, W) in EXTREMES.items():
        X = X.astype(np.int32)
        want = _wrap32(X.astype(np.int64) @ W.astype(np.int64))
        form = k._int_weights(W, const=False)[0].dtype
        assert form == (np.int8 if int8w and W.min() >= -128 and W.max() <= 127 else np.uint8)
        for const in (False, True):
            out = np.full(want.shape, 7, np.int32)
            k.int_matmul(X, W.astype(np.float64) if const else W, out, const=const)
            np.testing.assert_array_equal(out, want, err_msg=f"{name} const={const}")
    x = rng.integers(-200, 56, (1, 4, 6, 6)).astype(np.int32)
    W = rng.integers(-128, 128, (2, 2 * 9, 3)).astype(np.float64)
    geo = ((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    Y = k.int_conv(x, W, geo, groups=2)(x)
    np.testing.assert_array_equal(Y, _wrap32(_patches_by_hand(x, W, geo, 2)))


def _saturating_u8s8(A, B):
    """``A @ B`` as a uint8 x int8 kernel without VNNI sums it (``vpmaddubsw`` then
    ``vpmaddwd``): each pair of byte products saturated to int16, the pair sums added in int32
    (wrapping)."""
    p = A.astype(np.int64)[:, :, None] * B.astype(np.int64)[None]
    if p.shape[1] % 2:
        p = np.concatenate([p, np.zeros_like(p[:, :1])], axis=1)
    pairs = np.clip(p[:, 0::2] + p[:, 1::2], -2**15, 2**15 - 1)
    return pairs.sum(axis=1).astype(np.int32)


class _SaturatingSession:
    """Stands for onnxruntime on a CPU whose uint8 x int8 MatMulInteger saturates."""

    def __init__(self, model_bytes, *args, **kwargs):
        import onnx

        g = onnx.load_from_string(model_bytes).graph
        self.inits = {t.name: nh.to_array(t) for t in g.initializer}

    def run(self, _outputs, feeds):
        f = {**self.inits, **feeds}
        return [_saturating_u8s8(f["A"], f["B"])]


def test_int8_weights_are_measured_once_and_refused_where_onnxruntime_saturates(monkeypatch):
    """The first product that could take int8 weights asks onnxruntime, once per process,
    whether its uint8 x int8 product is exact (the CPU flags do not tell which kernel it
    picks); where pairs of byte products saturate, as without VNNI, the probe's worst case
    shows it and the weights go as uint8, with exact products."""
    import onnxruntime as ort

    # the probe agrees with onnxruntime on one pair of byte products past int16, here
    mm = h.make_model(h.make_graph(
        [h.make_node("MatMulInteger", ["A", "B"], ["Y"])], "g",
        [h.make_tensor_value_info("A", TP.UINT8, [4, 2]), h.make_tensor_value_info("B", TP.INT8, [2, 3])],
        [h.make_tensor_value_info("Y", TP.INT32, None)]),
        opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    (pair,) = run_onnxruntime(mm, {"A": np.full((4, 2), 255, np.uint8), "B": np.full((2, 3), -128, np.int8)})
    assert blas._int8_product_is_exact() is bool((pair == 2 * 255 * -128).all())
    monkeypatch.setattr(ort, "InferenceSession", _SaturatingSession)
    assert blas._int8_product_is_exact() is False
    # the fake really saturates the probe's worst case, and only past int16
    A, B = np.full((1, 4), 255, np.uint8), np.full((4, 1), -128, np.int8)
    assert _saturating_u8s8(A, B)[0, 0] == 2 * -2**15 != 4 * 255 * -128
    assert _saturating_u8s8(A[:, :2] // 2, B[:2] // 2)[0, 0] == 2 * 127 * -64
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(blas, "INT8_WEIGHTS", None)
    monkeypatch.setattr(blas, "_int8_product_is_exact", lambda: calls.append(1) or False)
    X, W = np.full((3, 4096), 255, np.int32), np.full((4096, 5), -128)
    k = blas.MatrixKernels(1, "onnxruntime")
    assert k._int_weights(np.full((4, 2), 300), const=False) is None and calls == []
    for _ in range(3):
        out = np.empty((3, 5), np.int32)
        k.int_matmul(X, W, out)
        np.testing.assert_array_equal(out, np.full((3, 5), 4096 * 255 * -128))
    assert calls == [1] and blas.INT8_WEIGHTS is False
    assert k._int_weights(W, const=False)[0].dtype == np.uint8


def _patches_by_hand(x, W, geometry, G):
    """Y[n, G*Ng, *O] of a grouped convolution, cut patch by patch (zero padding)."""
    (kh, kw), (sh, sw), pads, (dh, dw) = geometry
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, C = x.shape[:2]
    Cg, Ng = C // G, W.shape[2]
    O = ((xp.shape[2] - dh * (kh - 1) - 1) // sh + 1, (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1)
    Y = np.zeros((n, G * Ng) + O, np.int64)
    for i in range(O[0]):
        for j in range(O[1]):
            win = xp[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            for g in range(G):
                patch = win[:, g * Cg:(g + 1) * Cg].reshape(n, -1)
                Y[:, g * Ng:(g + 1) * Ng, i, j] = patch @ W[g].astype(np.int64)
    return Y


@pytest.mark.parametrize("G", [1, 3])
def test_integer_convolution_of_patches_is_their_exact_product(G):
    """``int_conv`` is the product of Im2Col's patches (channel-major, then kernel position)
    with the integer weights, per group, exactly: padding contributes zeros though the input
    is fed shifted to uint8. ``"numpy"`` never convolves; an input spanning more than 256
    values is declined per call (None); a weight of the wrong height is a ValueError."""
    x = rng.integers(-40, 216, (2, 6, 9, 8)).astype(np.int32)  # uint8 minus zero point 40
    W = rng.integers(-120, 136, (G, 6 // G * 2 * 3, 5)).astype(np.float64)
    geometry = ((2, 3), (2, 1), (1, 0, 0, 2), (1, 2))  # kernel, strides, pads, dilations
    want = _wrap32(_patches_by_hand(x, W, geometry, G))
    f = blas.MatrixKernels(1, "onnxruntime").int_conv(x, W, geometry, groups=G)
    np.testing.assert_array_equal(f(x), want)
    out = np.empty(want.shape, np.int32)
    assert f(x, out) is out
    np.testing.assert_array_equal(out, want)
    assert f(x * 2) is None  # -80..430: no uint8 with a zero point holds it
    assert blas.MatrixKernels(1, "numpy").int_conv(x, W, geometry, groups=G) is None
    auto = blas.MatrixKernels(1, "auto")
    f = auto.int_conv(x, W, geometry, groups=G)
    key = "int conv 2x6x9x8 k2x3 s2x1 p1x0x0x2 d1x2 ->" + str(5 * G) + (f" g{G}" if G > 1 else "")
    assert auto.describe()["chosen"][key] == ("numpy" if f is None else "onnxruntime")
    if f is not None:
        np.testing.assert_array_equal(f(x), want)
    with pytest.raises(ValueError, match="do not fit"):
        blas.MatrixKernels(1, "onnxruntime").int_conv(x, W[:, 1:], geometry, groups=G)


def test_integer_convolution_choice_is_timed_on_a_slice_of_bounded_patches(monkeypatch):
    """As for float convolutions (``TIMING_BYTES``): ``"auto"`` times ``int_conv`` against
    the numpy route on the first output rows of one image whose patches fit the bound, and
    the convolution it returns still gives the whole input's exact product."""
    x = rng.integers(-40, 216, (3, 4, 50, 8)).astype(np.int32)
    W = rng.integers(-120, 136, (1, 4 * 9, 6)).astype(np.float64)
    geometry = ((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    monkeypatch.setattr(blas, "TIMING_BYTES", 36 * 8 * 4 * 5)  # five output rows of one image
    given = []
    real = blas._patch_product
    monkeypatch.setattr(blas, "_patch_product",
                        lambda x, *a: given.append(x.shape) or real(x, *a))
    auto = blas.MatrixKernels(1, "auto")
    f = auto.int_conv(x, W, geometry)
    # five output rows of a 3x3 kernel with one row of padding: six input rows
    assert given == [(1, 4, 6, 8)]
    assert auto.describe()["chosen"]["int conv 3x4x50x8 k3x3 s1x1 p1x1x1x1 ->6"] == \
        ("numpy" if f is None else "onnxruntime")
    if f is not None:
        np.testing.assert_array_equal(f(x), _wrap32(_patches_by_hand(x, W, geometry, 1)))


def _qlinear_convs():
    """Two QLinearConvs (int8 weights in -64..64, where onnxruntime's own kernels are exact on
    every x86 CPU), the first with a bias and per-channel scales, the second 1x1."""
    w1 = rng.integers(-64, 65, (8, 3, 3, 3)).astype(np.int8)
    w2 = rng.integers(-64, 65, (6, 8, 1, 1)).astype(np.int8)
    f = lambda a, n: nh.from_array(np.asarray(a, np.float32), n)
    u = lambda a, n: nh.from_array(np.asarray(a, np.uint8), n)
    inits = [f(0.03, "x_s"), u(17, "x_zp"), nh.from_array(w1, "W1"),
             f(rng.uniform(0.005, 0.02, 8), "w1_s"), nh.from_array(np.zeros(8, np.int8), "w1_zp"),
             f(0.21, "y1_s"), u(100, "y1_zp"),
             nh.from_array(rng.integers(-3000, 3000, 8).astype(np.int32), "b1"),
             nh.from_array(w2, "W2"), f(0.011, "w2_s"), nh.from_array(np.array(0, np.int8), "w2_zp"),
             f(0.4, "y2_s"), u(120, "y2_zp")]
    nodes = [h.make_node("QLinearConv", ["x", "x_s", "x_zp", "W1", "w1_s", "w1_zp", "y1_s", "y1_zp",
                                         "b1"], ["y1"], pads=[1, 1, 1, 1], name="qc1"),
             h.make_node("QLinearConv", ["y1", "y1_s", "y1_zp", "W2", "w2_s", "w2_zp", "y2_s",
                                         "y2_zp"], ["y"], name="qc2")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.UINT8, [1, 3, 12, 10])],
                     [h.make_tensor_value_info("y", TP.UINT8, [1, 6, 12, 10])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=10)


def test_quantized_convs_on_crossbars_give_the_simulators_integers_on_every_kernel(tmp_path):
    """A QLinearConv model on the crossbars: the integer Gemms over the patches run as
    ConvIntegers of the Im2Cols' inputs (``matmul=onnxruntime``: the Im2Col then costs no wall
    time) with the same outputs as the simulator's own data path (``numpy``) and as
    onnxruntime on the original model, and the same counters."""
    original = _qlinear_convs()
    res = optimize(original, place=[("*Gemm", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "q.onnx")
    sessions = {m: InferenceSession(tmp_path / "q.onnx", provider_options=[{"matmul": m}, {}])
                for m in blas.MATMULS}
    for seed in range(2):
        x = np.random.default_rng(seed).integers(0, 256, (1, 3, 12, 10)).astype(np.uint8)
        want = run_onnxruntime(original, {"x": x})[0]
        assert len(np.unique(want)) > 20
        for s in sessions.values():
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)
    prof = {m: s.profile() for m, s in sessions.items()}
    keys = ("node", "writes", "latency_s", "energy_j", "bytes_moved", "basis")
    gemms = {m: [tuple(r[k] for k in keys) for r in p if r["op_type"] == "Gemm"]
             for m, p in prof.items()}
    assert len(gemms["numpy"]) == 4 and gemms["numpy"] == gemms["onnxruntime"] == gemms["auto"]
    im2col = [r for r in prof["onnxruntime"] if r["op_type"] == "Im2Col"]
    assert len(im2col) == 4 and all(r["wall_s"] == 0 for r in im2col)
    assert all(r["wall_s"] > 0 for r in prof["numpy"] if r["op_type"] == "Im2Col")
    chosen = sessions["onnxruntime"].configuration()["chosen"]
    assert not chosen and not sessions["numpy"].configuration()["chosen"]


def test_integer_matmul_on_crossbars_matches_numpys_int64_product_on_every_kernel(tmp_path):
    """MatMulInteger with uint8 weights and a zero point, K = 2048 (sums past 2**24): every
    kernel choice gives numpy's int64 product."""
    k, n = 2048, 40
    w = rng.integers(0, 256, (k, n)).astype(np.uint8)
    m = h.make_model(h.make_graph(
        [h.make_node("MatMulInteger", ["x", "W", "xz", "wz"], ["y"], name="mmi")], "g",
        [h.make_tensor_value_info("x", TP.UINT8, [6, k])],
        [h.make_tensor_value_info("y", TP.INT32, [6, n])],
        [nh.from_array(w, "W"), nh.from_array(np.array(3, np.uint8), "xz"),
         nh.from_array(np.array(131, np.uint8), "wz")]),
        opset_imports=[h.make_opsetid("", 13)], ir_version=10)
    res = optimize(m, place=[("*", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "m.onnx")
    x = rng.integers(0, 256, (6, k)).astype(np.uint8)
    want = (x.astype(np.int64) - 3) @ (w.astype(np.int64) - 131)
    assert np.abs(want).max() > 2**24 or np.abs(x.astype(np.int64) @ w.astype(np.int64)).max() > 2**24
    for mode in blas.MATMULS:
        s = InferenceSession(tmp_path / "m.onnx", provider_options=[{"matmul": mode}, {}])
        for _ in range(2):
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)


def _grouped_qconv(group, c, m_out):
    """A QLinearConv of ``group`` groups, ``c`` uint8 channels of 9x10 in, ``m_out`` out (3x3,
    pads 1, strides 2x1)."""
    w = rng.integers(-64, 65, (m_out, c // group, 3, 3)).astype(np.int8)
    inits = [nh.from_array(np.array(0.03, np.float32), "x_s"), nh.from_array(np.array(17, np.uint8), "x_zp"),
             nh.from_array(w, "W"), nh.from_array(rng.uniform(0.005, 0.02, m_out).astype(np.float32), "w_s"),
             nh.from_array(np.zeros(m_out, np.int8), "w_zp"),
             nh.from_array(np.array(0.21, np.float32), "y_s"), nh.from_array(np.array(100, np.uint8), "y_zp"),
             nh.from_array(rng.integers(-3000, 3000, m_out).astype(np.int32), "bias")]
    node = h.make_node("QLinearConv", ["x", "x_s", "x_zp", "W", "w_s", "w_zp", "y_s", "y_zp", "bias"],
                       ["y"], pads=[1, 1, 1, 1], strides=[2, 1], group=group, name="qconv")
    m = h.make_model(h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.UINT8, [1, c, 9, 10])],
                                  [h.make_tensor_value_info("y", TP.UINT8, [1, m_out, 5, 10])], inits),
                     opset_imports=[h.make_opsetid("", 13)], ir_version=10)
    return m


@pytest.mark.parametrize("group,c,m_out", [(2, 6, 8), (4, 4, 4)])  # grouped; depthwise
def test_grouped_quantized_conv_runs_as_one_grouped_integer_convolution(tmp_path, group, c, m_out):
    """A grouped QLinearConv lowers to Im2Col -> Reshape -> Transpose (the patches split into
    groups) -> Gemm: the provider runs the two views in numpy and, under
    ``matmul=onnxruntime``, the whole chain as one grouped ConvInteger of the Im2Col's input
    (the Im2Col and the views then take no wall time), with onnxruntime's outputs on the
    original model and the simulator's counters on every kernel."""
    m = _grouped_qconv(group, c, m_out)
    res = optimize(m, place=[("*Gemm", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "g.onnx")
    sessions = {mode: InferenceSession(tmp_path / "g.onnx", provider_options=[{"matmul": mode}, {}])
                for mode in blas.MATMULS}
    x = rng.integers(0, 256, (1, c, 9, 10)).astype(np.uint8)
    want = run_onnxruntime(m, {"x": x})[0]
    assert len(np.unique(want)) > 10
    for s in sessions.values():
        for _ in range(2):
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)
        # Im2Col, the two views splitting the groups (numpy kernels, no host partition of
        # their own), the Gemm, the two views merging them back
        assert s.partitions()[:7] == [("host", 2), ("host-numpy", 1), ("host-numpy", 1),
                                      ("host-numpy", 1), ("memristor", 1), ("host-numpy", 1),
                                      ("host-numpy", 1)]
    prof = {mode: s.profile() for mode, s in sessions.items()}
    # the Im2Col and the views after it, in the graph
    chain, made = [], {n.input[0]: n for n in res.model.graph.node if n.input}
    node = next(n for n in res.model.graph.node if n.op_type == "Im2Col")
    while node.op_type != "Gemm":
        chain.append(node.name)
        node = made[node.output[0]]
    assert len(chain) == 3
    fused = [r for r in prof["onnxruntime"] if r["node"] in chain]
    assert len(fused) == 6 and all(r["wall_s"] == 0 for r in fused)
    assert all(r["wall_s"] > 0 for r in prof["numpy"] if r["node"] in chain)
    keys = ("node", "writes", "latency_s", "energy_j", "bytes_moved", "basis")
    gemms = {mode: [tuple(r[k] for k in keys) for r in p if r["op_type"] == "Gemm"]
             for mode, p in prof.items()}
    assert len(gemms["numpy"]) == 2 and gemms["numpy"] == gemms["onnxruntime"] == gemms["auto"]


def test_plugin_from_patches_without_groups_is_never_asked_for_a_grouped_convolution(
        tmp_path, monkeypatch):
    """A plugin device written before ``Device.from_patches`` took ``groups`` (its override has
    no such parameter) still runs a grouped convolution: the provider does not offer it the
    grouped patches (it raised TypeError while building the session), so the Im2Col and the
    views run in numpy, with onnxruntime's outputs. A TypeError raised inside an override that
    does take ``groups`` is the plugin's bug and reaches the caller."""
    from onnx_cinm import devices
    from onnx_cinm.devices.memristor import MemristorDevice

    asked = []

    class OldSignature(MemristorDevice):
        def from_patches(self, kernel, geometry, activation=None):
            asked.append(geometry)
            return super().from_patches(kernel, geometry, activation)

    class Broken(MemristorDevice):
        def from_patches(self, kernel, geometry, activation=None, groups=1):
            raise TypeError("the plugin's own bug")

    m = _grouped_qconv(2, 6, 8)
    res = optimize(m, place=[("*Gemm", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "g.onnx")
    x = rng.integers(0, 256, (1, 6, 9, 10)).astype(np.uint8)
    want = run_onnxruntime(m, {"x": x})[0]
    monkeypatch.setitem(devices._registry.devices, "memristor", OldSignature())
    s = InferenceSession(tmp_path / "g.onnx", provider_options=[{"matmul": "onnxruntime"}, {}])
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)
    assert asked == []
    chain = [r for r in s.profile() if r["op_type"] in ("Im2Col", "Reshape", "Transpose")]
    assert "Im2Col" in {r["op_type"] for r in chain}
    assert all(r["wall_s"] > 0 for r in chain)  # run, not fused into the product
    monkeypatch.setitem(devices._registry.devices, "memristor", Broken())
    with pytest.raises(TypeError, match="the plugin's own bug"):
        InferenceSession(tmp_path / "g.onnx", provider_options=[{"matmul": "onnxruntime"}, {}])


def test_integer_product_of_two_activations_gives_the_same_integers_and_counts(tmp_path):
    """Attention's Q @ K^T with both operands activations (the crossbar programs one at every
    inference): every kernel choice gives numpy's int64 product and the same counters (the
    programming included) as the simulator's own data path."""
    m = h.make_model(h.make_graph(
        [h.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["y"], name="qk")], "g",
        [h.make_tensor_value_info("a", TP.UINT8, [2, 96, 80]),
         h.make_tensor_value_info("b", TP.UINT8, [2, 80, 96])],
        [h.make_tensor_value_info("y", TP.INT32, [2, 96, 96])],
        [nh.from_array(np.array(3, np.uint8), "azp"), nh.from_array(np.array(250, np.uint8), "bzp")]),
        opset_imports=[h.make_opsetid("", 13)], ir_version=10)
    res = optimize(m, place=[("*", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "qk.onnx")
    # two runs of other values: the second's counters are recalled from the first's (the
    # simulator of an activation-programmed node starts afresh at every run), its products not
    feeds = [(rng.integers(0, 256, (2, 96, 80)).astype(np.uint8),
              rng.integers(0, 256, (2, 80, 96)).astype(np.uint8)) for _ in range(2)]
    counts = {}
    for mode in blas.MATMULS:
        s = InferenceSession(tmp_path / "qk.onnx", provider_options=[{"matmul": mode}, {}])
        for a, b in feeds:
            want = (a.astype(np.int64) - 3) @ (b.astype(np.int64) - 250)
            np.testing.assert_array_equal(s.run(None, {"a": a, "b": b})[0], want)
        counts[mode] = [(r["writes"], r["latency_s"], r["energy_j"], r["bytes_moved"])
                        for r in s.profile() if r["op_type"] == "Gemm"]
        if mode == "auto":  # the products went through the integer kernels' choice
            assert "int 96x80x96" in s.configuration()["chosen"]
    assert counts["numpy"][0][0] > 0 and len(counts["numpy"]) == 2
    assert counts["numpy"] == counts["onnxruntime"] == counts["auto"]


@pytest.mark.parametrize("transposed", [False, True])
def test_kernel_choice_of_a_large_product_is_timed_on_its_first_rows(monkeypatch, transposed):
    """Issue 16 (first run of large int8 models): past ``TIMING_MACS`` multiply-adds, the
    ``"auto"`` choice times both routes on the first ``max(TIMING_MIN_ROWS, TIMING_MACS //
    (K*N))`` rows, then computes the whole product once on the chosen route: every numpy
    call while deciding has that many rows but the one whole product, and the results are
    numpy's int64 product (integers) or a float64 product within float32 rounding, the same
    bits on the next call (one kernel per shape)."""
    monkeypatch.setattr(blas, "TIMING_MACS", 64 * 40 * 24)  # 64 rows of this product
    monkeypatch.setattr(blas, "TIMING_MIN_ROWS", 16)
    seen = []
    for name in ("_np_matmul", "_np_int_matmul"):
        real = getattr(blas, name)
        monkeypatch.setattr(blas, name, lambda X, W, out, real=real: (seen.append(X.shape[0]),
                                                                      real(X, W, out))[1])
    M, K, N = 300, 40, 24
    Xi = rng.integers(-100, 120, (M, K)).astype(np.int32)
    Wi = rng.integers(-128, 128, (K, N)).astype(np.int8)
    k = blas.MatrixKernels(1, "auto")
    out = np.empty((M, N), np.int32)
    k.int_matmul(Xi, Wi, out, const=True)
    np.testing.assert_array_equal(out, Xi.astype(np.int64) @ Wi.astype(np.int64))
    assert seen[:5] == [64] * 5  # a warm-up and four timed rounds on 64 rows
    assert seen[5:] in ([], [M])  # then the whole product, on numpy's route if it won
    assert k.describe()["chosen"]["int 300x40x24"] == ("numpy" if seen[5:] else "onnxruntime")

    seen.clear()
    X = rng.standard_normal((M, K)).astype(np.float32)
    W = rng.standard_normal((K, N)).astype(np.float32)
    make = (lambda: np.empty((N, M), np.float32).T) if transposed else \
        (lambda: np.empty((M, N), np.float32))
    out, again = make(), make()
    k.matmul(X, W, out)
    k.matmul(X, W, again)
    np.testing.assert_allclose(out, X.astype(np.float64) @ W.astype(np.float64),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, again)
    chosen = k.describe()["chosen"][f"300x40x24{'T' if transposed else ''}"]
    # a warm-up and three timed runs on 64 rows, then the whole product twice if numpy won
    assert seen == [64] * 4 + ([M, M] if chosen == "numpy" else [])


def test_integer_weights_are_checked_at_session_creation_not_per_run(tmp_path, monkeypatch):
    """Two MatMulInteger nodes over one weight (the steps of an unrolled int8 recurrence): the
    kernels' simulators check the weights' integers when the session is made, and a run checks
    none again (the probe that reads each program's data path before its first run takes the
    kernel's checked weights: an unrolled int8 LSTM re-checked a weight per step); both
    products are numpy's int64 ones."""
    from onnx_cinm.sim.crossbar import simulator

    k, n = 64, 24
    w = rng.integers(0, 256, (k, n)).astype(np.uint8)
    nodes = [h.make_node("MatMulInteger", ["x", "W", "xz", "wz"], ["y1"], name="step1"),
             h.make_node("MatMulInteger", ["x2", "W", "xz", "wz"], ["y2"], name="step2")]
    m = h.make_model(h.make_graph(
        nodes, "g", [h.make_tensor_value_info("x", TP.UINT8, [3, k]),
                     h.make_tensor_value_info("x2", TP.UINT8, [3, k])],
        [h.make_tensor_value_info("y1", TP.INT32, [3, n]), h.make_tensor_value_info("y2", TP.INT32, [3, n])],
        [nh.from_array(w, "W"), nh.from_array(np.array(3, np.uint8), "xz"),
         nh.from_array(np.array(131, np.uint8), "wz")]),
        opset_imports=[h.make_opsetid("", 13)], ir_version=10)
    res = optimize(m, place=[("*", "memristor")], check=0)
    artifacts.save(res.model, tmp_path / "m.onnx")
    checked = []
    real = simulator._check_integer
    monkeypatch.setattr(simulator, "_check_integer",
                        lambda prog, r, arr: (checked.append(r.kind), real(prog, r, arr))[1])
    s = InferenceSession(tmp_path / "m.onnx", provider_options=[{"matmul": "onnxruntime"}, {}])
    assert "weight" in checked
    checked.clear()
    x, x2 = (rng.integers(0, 256, (3, k)).astype(np.uint8) for _ in range(2))
    y1, y2 = s.run(None, {"x": x, "x2": x2})
    wz = w.astype(np.int64) - 131
    np.testing.assert_array_equal(y1, (x.astype(np.int64) - 3) @ wz)
    np.testing.assert_array_equal(y2, (x2.astype(np.int64) - 3) @ wz)
    assert checked == []
