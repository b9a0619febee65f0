"""The golden check (onnx_cinm.golden): input generation, the ORT oracle, and compare().

Expected values are computed with numpy from the test's own weights, never by the code under
test.
"""
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm.errors import CheckFailed, CinmError
from onnx_cinm.golden import (DEFAULT_FIRST_DIM, DEFAULT_OTHER_DIM, CheckReport, compare,
                              random_inputs, run_onnxruntime)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, t, shape):
    return h.make_tensor_value_info(name, t, shape)


W = np.random.default_rng(42).standard_normal((6, 5)).astype(np.float32)
B = np.random.default_rng(43).standard_normal(5).astype(np.float32)


def _linear(w=W, b=B, out="y"):
    """y[batch, 5] = x[batch, 6] @ w + b."""
    return _model(
        [h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Add", ["t", "b"], [out])],
        [_vi("x", TP.FLOAT, ["batch", 6])], [_vi(out, TP.FLOAT, ["batch", 5])],
        [nh.from_array(w, "w"), nh.from_array(b, "b")])


def _unary(ops, dtype=TP.FLOAT, out_dtype=None, shape=("batch", 7)):
    """A chain of single-input ops on x."""
    nodes, cur = [], "x"
    for i, op in enumerate(ops):
        nxt = "y" if i == len(ops) - 1 else f"t{i}"
        nodes.append(h.make_node(op, [cur], [nxt]))
        cur = nxt
    return _model(nodes, [_vi("x", dtype, list(shape))],
                  [_vi("y", out_dtype if out_dtype is not None else dtype, list(shape))])


# ---------------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def many_inputs():
    inputs = [
        _vi("f", TP.FLOAT, ["batch", 3, "h"]),
        _vi("d", TP.DOUBLE, [2, 2]),
        _vi("half", TP.FLOAT16, [4]),
        _vi("i32", TP.INT32, [2, "n"]),
        _vi("i8", TP.INT8, [500]),
        _vi("u8", TP.UINT8, [500]),
        _vi("u64", TP.UINT64, [50]),
        _vi("flag", TP.BOOL, [200]),
        _vi("anon", TP.INT64, [None, None]),  # dims with neither value nor name
        _vi("w", TP.FLOAT, [2]),  # also an initializer: not a real input
    ]
    outputs = [_vi(vi.name + "_o", vi.type.tensor_type.elem_type, None) for vi in inputs]
    nodes = [h.make_node("Identity", [vi.name], [vi.name + "_o"]) for vi in inputs]
    g = h.make_graph(nodes, "g", inputs, outputs, [nh.from_array(np.ones(2, np.float32), "w")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_random_inputs_default_shapes_and_dtypes(many_inputs):
    f = random_inputs(many_inputs)
    assert "w" not in f  # initializer-backed input skipped
    assert set(f) == {"f", "d", "half", "i32", "i8", "u8", "u64", "flag", "anon"}
    assert f["f"].shape == (DEFAULT_FIRST_DIM, 3, DEFAULT_OTHER_DIM) == (1, 3, 8)
    assert f["i32"].shape == (2, 8)
    assert f["anon"].shape == (1, 8)
    expected = {"f": np.float32, "d": np.float64, "half": np.float16, "i32": np.int32,
                "i8": np.int8, "u8": np.uint8, "u64": np.uint64, "flag": np.bool_,
                "anon": np.int64}
    for name, dt in expected.items():
        assert f[name].dtype == dt, name


def test_random_inputs_values_signed_and_ranges(many_inputs):
    f = random_inputs(many_inputs, dims={"batch": 50, "h": 20})
    x = f["f"]
    assert (x < 0).any() and (x > 0).any()            # standard normal: signed
    assert abs(float(x.mean())) < 0.1 and 0.9 < float(x.std()) < 1.1
    i8 = f["i8"].astype(int)
    assert i8.min() >= -10 and i8.max() <= 10 and i8.min() < 0  # signed ints reach negatives
    assert set(np.unique(i8)) == set(range(-10, 11))  # both ends included
    u8 = f["u8"].astype(int)
    # unsigned: the whole byte for uint8, up to 16 bits wider (issue 12: 0..10 left bits unset)
    assert u8.min() >= 0 and u8.max() <= 255 and u8.max() > 128
    assert f["u64"].max() <= 0xFFFF
    assert f["flag"].any() and (~f["flag"]).any()


def test_random_inputs_dims_shapes_and_seed(many_inputs):
    f = random_inputs(many_inputs, dims={"batch": 3, "h": 5, "n": 4, "unused": 9},
                      shapes={"anon": [2, 3]})
    assert f["f"].shape == (3, 3, 5)
    assert f["i32"].shape == (2, 4)
    assert f["anon"].shape == (2, 3)
    again = random_inputs(many_inputs, dims={"batch": 3, "h": 5, "n": 4}, shapes={"anon": [2, 3]})
    for k in f:
        np.testing.assert_array_equal(f[k], again[k])
    other = random_inputs(many_inputs, seed=1, dims={"batch": 3, "h": 5, "n": 4})
    assert not np.array_equal(f["f"], other["f"])


def test_random_inputs_arange_fill_is_the_onnx_runner_rule(many_inputs):
    f = random_inputs(many_inputs, fill="arange", dims={"h": 4})
    np.testing.assert_array_equal(f["f"], (np.arange(12) / 12).reshape(1, 3, 4).astype(np.float32))
    np.testing.assert_array_equal(f["u8"], np.arange(500).astype(np.uint8))


def test_random_inputs_errors(many_inputs):
    with pytest.raises(CinmError, match="not a graph input"):
        random_inputs(many_inputs, shapes={"nope": [1]})
    with pytest.raises(CinmError, match="not a graph input"):
        random_inputs(many_inputs, shapes={"w": [2]})  # initializer
    with pytest.raises(CinmError, match="rank"):
        random_inputs(many_inputs, shapes={"f": [1, 2]})
    with pytest.raises(CinmError, match="fill"):
        random_inputs(many_inputs, fill="noise")

    seq = h.make_tensor_sequence_value_info("s", TP.FLOAT, [2])
    g = h.make_graph([h.make_node("SequenceLength", ["s"], ["n"])], "g", [seq],
                     [_vi("n", TP.INT64, [])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(CinmError, match="sequence") as e:
        random_inputs(m)
    assert "\n" not in str(e.value)

    bf = _model([h.make_node("Identity", ["x"], ["y"])], [_vi("x", TP.BFLOAT16, [2])],
                [_vi("y", TP.BFLOAT16, [2])])
    with pytest.raises(CinmError, match="BFLOAT16"):
        random_inputs(bf)

    norank = h.make_model(h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g",
                                       [h.make_tensor_value_info("x", TP.FLOAT, None)],
                                       [h.make_tensor_value_info("y", TP.FLOAT, None)]),
                          opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(CinmError, match="unknown rank"):
        random_inputs(norank)
    assert random_inputs(norank, shapes={"x": [2, 2]})["x"].shape == (2, 2)


# ---------------------------------------------------------------------------------- running
def test_run_onnxruntime_matches_numpy():
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    (y,) = run_onnxruntime(_linear(), {"x": x, "unused": x})
    np.testing.assert_allclose(y, x @ W + B, rtol=1e-5, atol=1e-6)


def test_run_onnxruntime_from_path_with_external_data(tmp_path):
    w = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    m = _linear(w=w)
    path = tmp_path / "m.onnx"
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.onnx.data", size_threshold=0)
    assert (tmp_path / "m.onnx.data").exists()
    x = np.ones((2, 6), np.float32)
    (y,) = run_onnxruntime(path, {"x": x})
    np.testing.assert_allclose(y, x @ w + B, rtol=1e-5, atol=1e-6)
    (y2,) = run_onnxruntime(str(path), {"x": x})
    np.testing.assert_array_equal(y, y2)


def test_run_onnxruntime_errors_are_one_line(tmp_path):
    # Add of float and int64: the checker is not asked, ORT refuses at load time
    g = h.make_graph([h.make_node("Add", ["x", "k"], ["y"])], "g", [_vi("x", TP.FLOAT, [2])],
                     [_vi("y", TP.FLOAT, [2])], [nh.from_array(np.ones(2, np.int64), "k")])
    bad = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(CinmError) as e:
        run_onnxruntime(bad, {"x": np.ones(2, np.float32)})
    assert "\n" not in str(e.value) and "onnxruntime" in str(e.value)
    with pytest.raises(CinmError, match="no value given"):
        run_onnxruntime(_linear(), {})
    with pytest.raises(CinmError) as e:  # wrong rank at run time
        run_onnxruntime(_linear(), {"x": np.ones((2, 2, 6), np.float32)})
    assert "\n" not in str(e.value)
    with pytest.raises(CinmError, match="not found"):
        run_onnxruntime(tmp_path / "missing.onnx", {})


# ---------------------------------------------------------------------------------- compare
def test_identical_models_pass():
    r = compare(_linear(), _linear(), n=3, dims={"batch": 4})
    assert isinstance(r, CheckReport)
    assert r.ok and r.runs == 3
    assert [(o.name, o.ok, o.max_abs_err, o.max_rel_err) for o in r.outputs] == [("y", True, 0.0, 0.0)]
    assert re.fullmatch(r"check: 3 runs, 1 output, max abs err 0, max rel err 0: OK", r.summary())
    assert "y" in r.table() and "ok" in r.table()
    assert r.raise_if_failed() is r


def test_changed_weight_is_detected_with_the_numpy_error():
    w2 = W.copy()
    w2[2, 3] += 1e-2
    r = compare(_linear(), _linear(w=w2), n=3, dims={"batch": 4})
    assert not r.ok
    (o,) = r.outputs
    assert not o.ok and o.mismatched > 0 and o.elements == 3 * 4 * 5
    # expected: only column 3 changes, by 1e-2 * x[:, 2]
    xs = [random_inputs(_linear(), seed=s, dims={"batch": 4})["x"] for s in range(3)]
    expected_abs = max(float(np.abs(x[:, 2]).max()) * 1e-2 for x in xs)
    ref_col = [x.astype(np.float64) @ W[:, 3].astype(np.float64) + B[3] for x in xs]
    expected_rel = max(float((np.abs(x[:, 2]) * 1e-2 / np.abs(c)).max()) for x, c in zip(xs, ref_col))
    assert o.max_abs_err == pytest.approx(expected_abs, rel=1e-3)
    assert o.max_rel_err == pytest.approx(expected_rel, rel=1e-2)
    assert "FAILED" in r.summary() and "y:" in r.summary()
    assert "\n" not in r.summary()
    with pytest.raises(CheckFailed):
        r.raise_if_failed()


def test_change_below_tolerance_passes_and_tolerances_are_honoured():
    w2 = W.copy()
    w2[0, 0] += 1e-7
    assert compare(_linear(), _linear(w=w2), n=2).ok
    w3 = W.copy()
    w3[0, 0] += 1e-2
    assert compare(_linear(), _linear(w=w3), n=2, atol=1.0).ok


def test_nan_and_inf_positions():
    # Sqrt of a standard-normal input: NaN wherever x < 0, in both models -> equal
    r = compare(_unary(["Sqrt"]), _unary(["Sqrt"]), n=2, dims={"batch": 10})
    assert r.ok
    # reference sqrt(|x|) has no NaN, candidate sqrt(x) has: infinite error, failure
    r = compare(_unary(["Abs", "Sqrt"]), _unary(["Sqrt"]), n=1, dims={"batch": 10})
    assert not r.ok and r.outputs[0].max_abs_err == float("inf")
    # Inf: 1/(x*0) gives +-Inf with the sign of x; same-signed Inf equal, opposite not
    def recip_of_zeroed(neg):
        zero = nh.from_array(np.zeros(1, np.float32), "z")
        nodes = [h.make_node("Neg", ["x"], ["xn"])] if neg else []
        nodes += [h.make_node("Mul", ["xn" if neg else "x", "z"], ["t0"]),
                  h.make_node("Reciprocal", ["t0"], ["y"])]
        return _model(nodes, [_vi("x", TP.FLOAT, ["batch", 7])], [_vi("y", TP.FLOAT, ["batch", 7])],
                      [zero])
    x = random_inputs(recip_of_zeroed(False), dims={"batch": 10})["x"]
    (y,) = run_onnxruntime(recip_of_zeroed(False), {"x": x})
    assert np.isinf(y).all() and (np.sign(y) == np.sign(x)).all()  # the premise, by numpy
    assert compare(recip_of_zeroed(False), recip_of_zeroed(False), dims={"batch": 10}).ok
    assert not compare(recip_of_zeroed(False), recip_of_zeroed(True), dims={"batch": 10}).ok


def test_mismatched_output_names_shapes_dtypes_are_failures_not_exceptions():
    r = compare(_linear(), _linear(out="z"))
    assert not r.ok
    notes = {o.name: o.note for o in r.outputs}
    assert notes == {"y": "missing in candidate", "z": "not in reference"}

    narrow = _model([h.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", TP.FLOAT, ["batch", 6])],
                    [_vi("y", TP.FLOAT, ["batch", 4])], [nh.from_array(W[:, :4], "w")])
    r = compare(_linear(), narrow)
    assert not r.ok and "shape" in r.outputs[0].note

    as_double = _model(
        [h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Add", ["t", "b"], ["t2"]),
         h.make_node("Cast", ["t2"], ["y"], to=TP.DOUBLE)],
        [_vi("x", TP.FLOAT, ["batch", 6])], [_vi("y", TP.DOUBLE, ["batch", 5])],
        [nh.from_array(W, "w"), nh.from_array(B, "b")])
    r = compare(_linear(), as_double)
    assert not r.ok and "dtype" in r.outputs[0].note

    other_input = _model([h.make_node("MatMul", ["q", "w"], ["t"]), h.make_node("Add", ["t", "b"], ["y"])],
                         [_vi("q", TP.FLOAT, ["batch", 6])], [_vi("y", TP.FLOAT, ["batch", 5])],
                         [nh.from_array(W, "w"), nh.from_array(B, "b")])
    r = compare(_linear(), other_input)
    assert not r.ok and r.problems and "q" in r.problems[0]


def test_integer_outputs_are_exact():
    def argmax(plus):
        nodes = [h.make_node("ArgMax", ["x"], ["a" if plus else "y"], axis=1, keepdims=0)]
        inits = []
        if plus:
            nodes.append(h.make_node("Add", ["a", "one"], ["y"]))
            inits = [nh.from_array(np.array(1, np.int64), "one")]
        return _model(nodes, [_vi("x", TP.FLOAT, ["batch", 7])], [_vi("y", TP.INT64, ["batch"])],
                      inits)
    assert compare(argmax(False), argmax(False), n=2).ok
    r = compare(argmax(False), argmax(True), n=2, atol=10.0, rtol=10.0)  # tolerances ignored
    assert not r.ok and r.outputs[0].max_abs_err == 1.0


def test_candidate_that_does_not_load_raises_checkfailed():
    g = h.make_graph([h.make_node("Add", ["x", "k"], ["y"])], "g", [_vi("x", TP.FLOAT, ["batch", 6])],
                     [_vi("y", TP.FLOAT, ["batch", 6])], [nh.from_array(np.ones(6, np.int64), "k")])
    bad = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(CheckFailed, match="candidate"):
        compare(_linear(), bad)


def test_compare_with_given_feeds():
    x = np.zeros((2, 6), np.float32)
    b2 = B.copy()
    b2[0] += 1.0
    r = compare(_linear(), _linear(b=b2), feeds=[{"x": x}])
    assert r.runs == 1 and not r.ok
    assert r.outputs[0].max_abs_err == pytest.approx(1.0)
    assert r.outputs[0].mismatched == 2  # one column, two rows


def _needs_long_input():
    """A reflect Pad of 6 per side on an input [1, seq], inside an If, then a MatMul by a 16x4
    weight: onnxruntime runs it only when seq > 6 (a reflect pad must be shorter than the axis),
    and the If nests its error message once."""
    w = nh.from_array(np.arange(64, dtype=np.float32).reshape(16, 4) / 64, "W")
    pads = nh.from_array(np.array([0, 6, 0, 6], np.int64), "pads")
    branch = h.make_graph([h.make_node("Pad", ["x", "pads"], ["p"], mode="reflect")], "then", [],
                          [_vi("p", TP.FLOAT, None)])
    nodes = [h.make_node("Constant", [], ["c"], value=nh.from_array(np.array(True))),
             h.make_node("If", ["c"], ["padded"], then_branch=branch, else_branch=branch),
             h.make_node("Slice", ["padded", "zero", "sixteen", "one"], ["s"]),
             h.make_node("MatMul", ["s", "W"], ["y"])]
    inits = [w, pads] + [nh.from_array(np.array([v], np.int64), n)
                         for n, v in (("zero", 0), ("sixteen", 16), ("one", 1))]
    return _model(nodes, [_vi("x", TP.FLOAT, [1, "seq"])], [_vi("y", TP.FLOAT, [1, 4])], inits)


def test_reference_that_cannot_run_raises_reference_failed_in_one_short_line():
    from onnx_cinm.errors import ReferenceFailed

    m = _needs_long_input()
    with pytest.raises(ReferenceFailed) as e:
        compare(m, m, dims={"seq": 4})
    msg = str(e.value)
    assert "\n" not in msg and "[ONNXRuntimeError]" not in msg
    assert msg.startswith("onnxruntime failed to run the model: Pad node ")  # the innermost node
    assert msg.endswith("(inputs: x [1, 4])")
    assert compare(m, m, dims={"seq": 9}).ok


def test_optimize_skips_the_check_when_the_original_cannot_run_and_says_why(tmp_path, capsys):
    from onnx_cinm import optimize
    from onnx_cinm.cli import main

    m = _needs_long_input()
    res = optimize(m, check_dims={"seq": 4})
    assert res.check is None and "Pad node" in res.check_skipped
    assert "check: skipped (the original does not run on the random inputs" in res.summary()
    res = optimize(m, check_dims={"seq": 12})
    assert res.check is not None and res.check.ok and res.check_skipped is None
    # the CLI: a warning naming the remedies, exit 0, the model written
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q",
                 "--dim", "seq=4"]) == 0
    err = capsys.readouterr().err
    assert "warning: golden check skipped" in err and "--dim NAME=SIZE" in err
    assert (tmp_path / "o.onnx").exists()
    # compare cannot judge either: an error with the remedies, exit 1
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--dim",
                 "seq=4"]) == 1
    assert "--input NAME=FILE.npy" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--dim",
                 "seq=10"]) == 0


def test_a_symbolic_name_gets_one_size_in_every_input():
    """Silero's input is [batch, sequence] and its state [2, batch, 128]: 'batch' must not be 1
    in one input and 8 in the other."""
    from onnx_cinm.golden import check_dim_names, symbolic_dims

    m = _model([h.make_node("Identity", ["x"], ["y"]), h.make_node("Identity", ["s"], ["t"])],
               [_vi("x", TP.FLOAT, ["batch", "seq"]), _vi("s", TP.FLOAT, [2, "batch", 4])],
               [_vi("y", TP.FLOAT, ["batch", "seq"]), _vi("t", TP.FLOAT, [2, "batch", 4])])
    feeds = random_inputs(m)
    assert feeds["x"].shape == (DEFAULT_FIRST_DIM, DEFAULT_OTHER_DIM)
    assert feeds["s"].shape == (2, DEFAULT_FIRST_DIM, 4)  # batch as in x, though not on axis 0
    assert random_inputs(m, dims={"seq": 5})["s"].shape == (2, 1, 4)
    assert symbolic_dims(m) == ["batch", "seq"]
    with pytest.raises(CinmError, match="named 'sequence' .*named ones: batch, seq"):
        check_dim_names(m, {"sequence": 512})


def test_sets_the_original_cannot_run_are_skipped_and_the_others_judged():
    """ConstantOfShape of a random int64 input: negative sizes fail in onnxruntime for some
    seeds; those sets are skipped and named, the rest still compared."""
    m = _model([h.make_node("ConstantOfShape", ["k"], ["c"],
                            value=nh.from_array(np.array([1.0], np.float32))),
                h.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
               [_vi("k", TP.INT64, [1])], [_vi("y", TP.FLOAT, [])])
    seeds_ok = [s for s in range(6) if random_inputs(m, seed=s)["k"][0] >= 0]
    assert 0 < len(seeds_ok) < 6  # both kinds among the six sets
    rep = compare(m, m, n=6)
    assert rep.ok and rep.runs == len(seeds_ok) and len(rep.skipped) == 6 - len(seeds_ok)
    assert "skipped: the original does not run on them" in rep.summary()
