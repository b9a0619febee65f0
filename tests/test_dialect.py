"""The cinm domain: reference bodies run in stock onnxruntime and equal numpy; schemas infer shapes."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm.dialects import cinm

OPSETS = [13, 17, 18, 21]


def _vi(name, t, shape):
    return h.make_tensor_value_info(name, t, shape)


def _build(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, [_vi(o, TP.UNDEFINED, None) for o in outputs], list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    cinm.attach_functions(m)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    by_name = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in m.graph.output:
        o.CopyFrom(by_name[o.name])
    return m


def _run(m, feeds):
    # A fresh, schema-free check: the model must be valid for any onnx consumer.
    onnx.checker.check_model(m, full_check=True)
    return ort.InferenceSession(m.SerializeToString()).run(None, feeds)


def _im2col_numpy(x, ks, st, pads, dl):
    r = len(ks)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[a], pads[r + a]) for a in range(r)])
    outs = [(xp.shape[2 + a] - dl[a] * (ks[a] - 1) - 1) // st[a] + 1 for a in range(r)]
    n, c = x.shape[:2]
    y = np.zeros([n] + outs + [c * int(np.prod(ks))], x.dtype)
    for o in np.ndindex(*outs):
        sl = tuple(slice(o[a] * st[a], o[a] * st[a] + dl[a] * (ks[a] - 1) + 1, dl[a]) for a in range(r))
        y[(slice(None),) + o] = xp[(slice(None), slice(None)) + sl].reshape(n, c * int(np.prod(ks)))
    return y


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("ks,st,pads,dl,shape", [
    ([3, 2], [2, 1], [1, 0, 1, 1], [1, 2], (2, 3, 7, 6)),
    ([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], (1, 4, 3, 3)),
    ([3], [2], [2, 1], [3], (2, 2, 11)),
])
def test_im2col_matches_numpy_and_infers_shape(opset, ks, st, pads, dl, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    node = cinm.make_node("Im2Col", ["x"], ["y"], kernel_shape=ks, strides=st, pads=pads, dilations=dl)
    m = _build([node], [_vi("x", TP.FLOAT, ["N"] + list(shape[1:]))], ["y"], opset=opset)
    (y,) = _run(m, {"x": x})
    ref = _im2col_numpy(x, ks, st, pads, dl)
    np.testing.assert_array_equal(y, ref)
    dims = [d.dim_value or d.dim_param for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["N"] + list(ref.shape[1:])


def _specials(x, rng):
    """x with NaN, +Inf and -Inf at a few random places (what the NaN/Inf check feeds)."""
    x = x.copy()
    flat = x.reshape(-1)
    at = rng.choice(flat.size, 3 * max(1, flat.size // 40), replace=False)
    flat[at[0::3]], flat[at[1::3]], flat[at[2::3]] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("ks,st,pads,dl,shape,groups", [
    ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], (2, 5, 9, 8), 1),       # same padding
    ([3, 3], [2, 2], [0, 1, 2, 0], [1, 1], (1, 4, 10, 9), 2),       # stride 2, asymmetric pads
    ([2, 3], [3, 2], [1, 2, 0, 1], [2, 3], (3, 6, 12, 13), 3),      # dilation, stride > kernel
    ([7, 7], [2, 2], [3, 3, 3, 3], [1, 1], (1, 3, 16, 15), 1),      # ResNet's stem at a small size
    ([1, 1], [2, 2], [0, 0, 0, 0], [1, 1], (2, 8, 7, 7), 4),        # strided 1x1 (downsampling)
    ([4], [3], [0, 2], [2], (2, 6, 17), 2),                         # 1-D
    ([2, 1, 3], [1, 2, 1], [1, 0, 0, 0, 1, 2], [2, 1, 1], (1, 4, 5, 6, 4), 2),  # 3-D
    ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], (0, 3, 6, 6), 1),        # empty batch
])
def test_im2col_equals_numpy_on_geometries_groups_and_nan_inf(opset, ks, st, pads, dl, shape, groups):
    """Im2Col equals an independently computed numpy im2col, bit for bit and NaN/Inf where
    numpy has them, on strides, dilations, asymmetric pads, ranks 1-3 and an empty batch; each
    group's column block (the grouped Conv lowering reshapes the columns to [.., G, C/G*k])
    equals the im2col of that group's channels alone."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    node = cinm.make_node("Im2Col", ["x"], ["y"], kernel_shape=ks, strides=st, pads=pads, dilations=dl)
    m = _build([node], [_vi("x", TP.FLOAT, ["N"] + list(shape[1:]))], ["y"], opset=opset)
    sess = ort.InferenceSession(m.SerializeToString())
    onnx.checker.check_model(m, full_check=True)
    for feed in (x, _specials(x, rng) if x.size else x):
        (y,) = sess.run(None, {"x": feed})
        ref = _im2col_numpy(feed, ks, st, pads, dl)
        assert y.shape == ref.shape
        np.testing.assert_array_equal(y, ref)  # NaN matches NaN, +-Inf matches itself
        cg = shape[1] // groups
        per_group = y.reshape(y.shape[:-1] + (groups, cg * int(np.prod(ks))))
        for g in range(groups):
            np.testing.assert_array_equal(
                per_group[..., g, :], _im2col_numpy(feed[:, g * cg:(g + 1) * cg], ks, st, pads, dl))
    if x.size:
        assert np.isnan(y).any() and np.isinf(y).any()  # the specials did reach the output


@pytest.mark.parametrize("opset", OPSETS)
def test_every_op_matches_numpy(opset):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    c = rng.standard_normal((3,)).astype(np.float32)
    v = rng.standard_normal(5).astype(np.float32)
    u = np.array([0, 1, 255, 7, 128], np.uint8)
    mk = cinm.make_node
    nodes = [
        mk("Gemm", ["a", "b"], ["g1"]), mk("Gemm", ["a", "b", "c"], ["g2"]), mk("Gemv", ["a", "v"], ["gv"]),
        mk("Reduce", ["a"], ["r1"], kind="max", axes=[1], keepdims=0),
        mk("Reduce", ["a"], ["r2"], kind="add", axes=[0, 1], keepdims=1),
        mk("Reduce", ["a"], ["r3"], kind="mul", axes=[0], keepdims=0),
        mk("Reduce", ["a"], ["r4"], kind="min", axes=[1], keepdims=1),
        mk("TopK", ["a"], ["tv", "ti"], k=2, axis=1),
        mk("TopK", ["a"], ["sv1", "si1"], k=3, axis=0, largest=0),
        mk("Scan", ["a"], ["sc"], axis=1, exclusive=1, reverse=1),
        mk("Scan", ["a"], ["sc2"], axis=0),
        mk("Transpose", ["a"], ["tr"], perm=[1, 0]),
        mk("Histogram", ["a"], ["hi"], bins=4, min=-1.0, max=1.0),
        mk("SimSearch", ["a", "a"], ["cv", "ci"], k=2, metric="cos"),
        mk("SimSearch", ["a", "b_t"], ["dv", "di"], k=1),
        mk("MergePartial", ["a"], ["mp"], kind="max"),
        mk("LeakyRelu", ["a"], ["lr"], alpha=0.2), mk("Relu", ["a"], ["re"]),
        mk("HardSigmoid", ["a"], ["hs"], alpha=0.25, beta=0.4),
        mk("Clip", ["a", "", "cmax"], ["cl"]), mk("Sub", ["a", "v"], ["sb"]), mk("Max", ["a", "v"], ["mx"]),
        mk("PopCount", ["u"], ["pc"]),
    ]
    outs = ["g1", "g2", "gv", "r1", "r2", "r3", "r4", "tv", "ti", "sv1", "si1", "sc", "sc2", "tr", "hi",
            "cv", "ci", "dv", "di", "mp", "lr", "re", "hs", "cl", "sb", "mx", "pc"]
    inits = [nh.from_array(b, "b"), nh.from_array(c, "c"), nh.from_array(np.float32(0.5), "cmax"),
             nh.from_array(np.ascontiguousarray(b.T), "b_t")]
    m = _build(nodes, [_vi("a", TP.FLOAT, [4, 5]), _vi("u", TP.UINT8, [5]), _vi("v", TP.FLOAT, [5])], outs,
               inits, opset)
    r = dict(zip(outs, _run(m, {"a": a, "u": u, "v": v})))
    np.testing.assert_allclose(r["g1"], a @ b, rtol=1e-5)
    np.testing.assert_allclose(r["g2"], a @ b + c, rtol=1e-5)
    np.testing.assert_allclose(r["gv"], a @ v, rtol=1e-5)
    np.testing.assert_array_equal(r["r1"], a.max(1))
    np.testing.assert_allclose(r["r2"], a.sum(keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(r["r3"], a.prod(0), rtol=1e-5)
    np.testing.assert_array_equal(r["r4"], a.min(1, keepdims=True))
    np.testing.assert_array_equal(r["tv"], -np.sort(-a, 1)[:, :2])
    np.testing.assert_array_equal(r["ti"], np.argsort(-a, 1, kind="stable")[:, :2])
    np.testing.assert_array_equal(r["sv1"], np.sort(a, 0)[:3])
    np.testing.assert_allclose(r["sc"], np.cumsum(a[:, ::-1], 1)[:, ::-1] - a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["sc2"], np.cumsum(a, 0), rtol=1e-5)
    np.testing.assert_array_equal(r["tr"], a.T)
    np.testing.assert_array_equal(r["hi"], np.histogram(a, 4, (-1, 1))[0])
    an = a / np.linalg.norm(a, axis=1, keepdims=True)
    np.testing.assert_array_equal(r["ci"], np.argsort(-(an @ an.T), 1, kind="stable")[:, :2])
    np.testing.assert_array_equal(r["di"][:, 0], np.argmax(a @ b, 1))
    np.testing.assert_array_equal(r["mp"], a.max(0))
    np.testing.assert_allclose(r["lr"], np.where(a > 0, a, 0.2 * a), rtol=1e-6)
    np.testing.assert_array_equal(r["re"], np.maximum(a, 0))
    np.testing.assert_allclose(r["hs"], np.clip(0.25 * a + 0.4, 0, 1), rtol=1e-6)
    np.testing.assert_array_equal(r["cl"], np.minimum(a, 0.5))
    np.testing.assert_array_equal(r["sb"], a - v)
    np.testing.assert_array_equal(r["mx"], np.maximum(a, v))
    np.testing.assert_array_equal(r["pc"], [0, 1, 8, 3, 1])
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
    assert shapes["tv"] == [4, 2] and shapes["sv1"] == [3, 5] and shapes["cv"] == [4, 2]
    assert shapes["hi"] == [4] and shapes["r2"] == [1, 1] and shapes["g2"] == [4, 3]


def test_histogram_edges_follow_numpy():
    x = np.array([-1.0, 1.0, 0.0, 2.0, -3.0, 0.9999, 0.25], np.float32)
    m = _build([cinm.make_node("Histogram", ["x"], ["h"], bins=8, min=-1.0, max=1.0)],
               [_vi("x", TP.FLOAT, [7])], ["h"])
    (hist,) = _run(m, {"x": x})
    np.testing.assert_array_equal(hist, np.histogram(x, 8, (-1.0, 1.0))[0])


def test_popcount_wide_types():
    x = np.array([0, 2**64 - 1, 2**63, 12345678901234], np.uint64)
    m = _build([cinm.make_node("PopCount", ["x"], ["y"])], [_vi("x", TP.UINT64, [4])], ["y"])
    (y,) = _run(m, {"x": x})
    np.testing.assert_array_equal(y, [bin(int(v)).count("1") for v in x])


def test_unknown_variant_and_missing_attribute_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        cinm.overload_of("Reduce", {"kind": "xor"}, 1)
    with pytest.raises(ValueError, match="kernel_shape"):
        cinm.make_node("Im2Col", ["x"], ["y"], strides=[1], pads=[0, 0], dilations=[1])
    with pytest.raises(ValueError, match="opset"):
        cinm.build_function("Gemm", "", 11)


def test_attach_functions_is_idempotent_and_declares_domain():
    m = _build([cinm.make_node("Gemm", ["a", "a"], ["y"], device="crossbar")], [_vi("a", TP.FLOAT, [3, 3])], ["y"])
    cinm.attach_functions(m)
    assert [(f.name, f.overload) for f in m.functions] == [("Gemm", "")]
    assert sum(o.domain == "cinm" for o in m.opset_import) == 1
    assert m.ir_version >= 10


#: one value for every attribute an overload may read, none of them its default
_VARIANT_ATTRS = {"y_perm": [1, 0], "onnx_gemm": 1, "kind": "max", "kernel_shape": [3, 3],
                  "metric": "cos", "approximate": "tanh", "div_sqrt2": 1}


@pytest.mark.parametrize("op", sorted(cinm.OPS))
def test_only_the_ops_of_attr_overloads_read_attributes(op):
    """attach_functions reads the attributes of the ATTR_OVERLOADS ops alone: every other op's
    overload is the same with any attributes as with none (at every arity), and each op of the
    set has an attribute that changes it (Gemm: onnx_gemm with a bias, y_perm; Reduce and
    MergePartial: their kind; Im2Col: the spatial rank; SimSearch: the metric; Gelu: the
    approximation; Scan: only kind add is valid, any other raises)."""
    changed = False
    for n_in in (1, 2, 3):
        plain = cinm.overload_of(op, {"kind": "add"}, n_in) if op in ("Reduce", "MergePartial") \
            else cinm.overload_of(op, {}, n_in)
        try:
            other = cinm.overload_of(op, _VARIANT_ATTRS, n_in)
        except ValueError:
            other = None
        changed |= other != plain
    assert changed == (op in cinm.ATTR_OVERLOADS)


class _Reads(dict):
    """A dict that records the keys asked for."""

    def __init__(self, *args):
        super().__init__(*args)
        self.asked = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.asked.add(key)
        return super().__contains__(key)


@pytest.mark.parametrize("op", sorted(cinm.ATTR_OVERLOADS))
def test_overloads_read_only_the_overload_attrs(op):
    """overload_of asks for no attribute outside OVERLOAD_ATTRS (attach_functions converts
    only those of a planned op), and a planned Gemm with a bias, onnx_gemm and y_perm among
    its plan attributes gets the gemm_perm body."""
    for n_in in (1, 2, 3):
        attrs = _Reads({**_VARIANT_ATTRS, "kind": "add", "approximate": "none",
                        "device": "crossbar", "plan_tiles": [4, 4]})
        cinm.overload_of(op, attrs, n_in)
        assert attrs.asked <= cinm.OVERLOAD_ATTRS
    planned = cinm.make_node("Gemm", ["a", "a", "b"], ["y"], device="crossbar", onnx_gemm=1,
                             y_perm=[1, 0], placement="cost", cim_rows=64)
    m = _build([planned], [_vi("a", TP.FLOAT, [3, 3]), _vi("b", TP.FLOAT, [3])], ["y"])
    cinm.attach_functions(m)
    assert m.graph.node[0].overload == "gemm_perm"


def test_make_node_writes_what_onnx_helper_writes():
    """cinm.make_node builds its attributes itself for the common kinds: byte for byte what
    onnx.helper.make_node writes, for those and the rest (numpy scalars, bools, floats and
    strings lists, None left out)."""
    attrs = {"kernel_shape": [3, 3], "strides": (1, 2), "pads": [0, 0, 1, 1], "dilations": [1, 1],
             "device": "crossbar", "placement": "hint: ü", "cim_rows": np.int64(64), "cim_x": True,
             "cim_f": 0.1, "cim_fs": [0.5, 2], "cim_ss": ["a", "b"], "cim_big": 2**40, "kernel": None}
    got = cinm.make_node("Im2Col", ["x"], ["y"], name="n", **attrs)
    want = h.make_node("Im2Col", ["x"], ["y"], name="n", domain="cinm", **attrs)
    assert got.SerializeToString() == want.SerializeToString()
    unnamed = cinm.make_node("Relu", ["x"], ["y"])
    assert unnamed.SerializeToString() == h.make_node("Relu", ["x"], ["y"], domain="cinm").SerializeToString()


def test_no_cinm_attribute_is_a_graph():
    """all_nodes does not look for subgraphs in cinm nodes: no op, placement or plan
    attribute a cinm schema declares (or a device may declare) is of a graph type."""
    graphs = {onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS}
    declared = [t for spec in cinm.OPS.values() for t, _ in spec.attrs.values()]
    declared += list(cinm.PLACEMENT_ATTRS.values()) + list(cinm.ATTR_TYPES.values())
    assert declared and not graphs & set(declared)


def test_node_attrs_reads_every_kind_as_onnx_helper_does():
    """node_attrs equals onnx.helper.get_attribute_value for every plain kind, strings decoded
    (STRINGS stay bytes, as the helper gives them)."""
    node = h.make_node("X", [], [], i=3, ints=[1, -2], f=0.1, fs=[0.5, 1e-7], s="ab",
                       ss=["a", "b"], t=nh.from_array(np.zeros(2, np.float32)))
    want = {a.name: h.get_attribute_value(a) for a in node.attribute}
    want["s"] = want["s"].decode()
    got = cinm.node_attrs(node)
    assert got == want and isinstance(got["f"], float) and got["ss"] == [b"a", b"b"]


_REFERENCE_AFTER = """
import sys
import numpy as np
import onnx
from onnx import helper
import onnx_cinm.dialects.cinm
before = "onnx.reference" in sys.modules
from onnx.reference import ReferenceEvaluator
g = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["b"])], "g",
                      [helper.make_tensor_value_info("a", 1, [2])],
                      [helper.make_tensor_value_info("b", 1, [2])])
out = ReferenceEvaluator(helper.make_model(g)).run(None, {"a": np.array([2, 3], np.float32)})
cinm = sum(s.domain == "cinm" for s in onnx.defs.get_all_schemas_with_history())
print(before, out[0].tolist(), cinm == len(onnx_cinm.dialects.cinm.OPS))
"""


def test_onnx_reference_still_imports_after_registration():
    """The dialect does not import onnx.reference (20 ms of every start-up); importing it
    after the cinm schemas are registered works (it would refuse cinm.Mul next to Mul), runs
    a model, and leaves onnx.defs listing the cinm schemas."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _REFERENCE_AFTER], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "False [4.0, 9.0] True", res.stderr


_REFERENCE_WHILE_REGISTERED = """
import onnx
import onnx_cinm.dialects.cinm
gone = []
real = onnx.defs.deregister_schema
onnx.defs.deregister_schema = lambda name, version, domain: gone.append((domain, name)) or \
    real(name, version, domain)
import onnx.reference.op_run  # what a ReferenceEvaluator imports, in this or another thread
print(gone, onnx.defs.has("Gemm", "cinm"))
"""


def test_onnx_reference_import_leaves_the_cinm_schemas_registered():
    """Importing onnx.reference after the dialect (the first ReferenceEvaluator of a run, in
    any thread) takes no cinm schema out of onnx.defs: another thread inferring shapes at that
    moment still finds them (a lazy import that deregistered them all failed its inference)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _REFERENCE_WHILE_REGISTERED], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[] True"


_BATCHED = """
import onnx
from onnx_cinm import dialects, devices
from onnx_cinm.dialects import cinm
devices.all_devices()
syncs = []
real = cinm.register_schemas
cinm.register_schemas = lambda: syncs.append(1) or real()
def has(op, name):
    return name in onnx.defs.get_schema(op, cinm.VERSION, cinm.DOMAIN).attributes
with dialects.declarations_batched():
    dialects.declare_plan_attrs({"zz_a": "int"})
    dialects.declare_plan_attrs({"zz_b": "floats"})
    assert syncs == [] and not has("Gemm", "zz_a")
assert syncs == [1]
assert all(has(op, name) for op in cinm.OPS for name in ("zz_a", "zz_b"))
dialects.declare_plan_attrs({"zz_c": "string"})
assert syncs == [1, 1] and has("Relu", "zz_c")
print("ok")
"""


def test_batched_plan_attribute_declarations_reach_the_schemas_once():
    """The device registry declares every built-in device's plan attributes in one batch: the
    op schemas are registered again once at its end (not once per device), and then hold every
    attribute declared in it; a declaration outside a batch reaches them at once."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _BATCHED], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.parametrize("elem", [TP.FLOAT, TP.INT32])
@pytest.mark.parametrize("a,b,c", [
    ([1, 56, 56, 288], [288, 128], None), ([1, 56, 56, 288], [288, 128], [128]),
    ([4, 64], [64, 10], [1, 10]), ([3, 1, 5, 6], [2, 6, 7], None), ([2, 5, 6], [3, 1, 6, 7], [7]),
    ([1, 2, 9, 9, 12], [2, 1, 12, 4], [2, 1, 1, 4]), ([8, 0, 3], [3, 5], None),
    ([5, 6], [6, 7], [2, 5, 7]), ([5, 6], [6, 7], [3, 7]), ([5, 6], [4, 7], None),
    ([2, 5, 6], [3, 6, 7], None), ([5, 6], [6, 7], [5, 1]), (["n", 5, 6], [6, 7], None),
    ([None, 6], [6, 7], [7]), ([6], [6, 7], None), ([5, 6], [6], None)])
def test_gemm_output_types_are_onnxs_inference_of_its_body(elem, a, b, c):
    """The output type output_types gives a cinm Gemm is what onnx's own inference of the
    Gemm's reference body (MatMul, then Add of the bias) gives those input types, whatever
    the shapes: broadcast batch dims, a bias of any broadcast shape, symbolic or unknown
    dims, K that differ, ranks below 2 (None where onnx's inference fails)."""
    shapes = [s for s in (a, b, c) if s is not None]
    types = {f"i{k}": h.make_tensor_type_proto(elem, s) for k, s in enumerate(shapes)}
    node = cinm.make_node("Gemm", list(types), ["y"])
    body = cinm.build_function("Gemm", "bias" if c is not None else "", 18)
    try:
        expected = onnx.shape_inference.infer_function_output_types(body, list(types.values()), [])
    except Exception:  # noqa: BLE001 - onnx's inference rejects the shapes
        expected = None
    got = cinm.output_types(node, types)
    assert (None if got is None else [t.SerializeToString() for t in got]) == \
        (None if expected is None else [t.SerializeToString() for t in expected])
