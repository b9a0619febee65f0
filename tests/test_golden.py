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
    # the tolerance it failed against is named (the defaults for float32)
    assert f"max abs err {expected_abs:.3g} beyond atol {o.atol:.3g} + rtol {o.rtol:.3g}" in r.summary()
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


def test_optimize_refuses_sizes_the_original_cannot_run_at_and_writes_nothing(tmp_path, capsys):
    """A reflect Pad of 6 needs seq >= 7: at --dim seq=4 no input runs (onnxruntime's shape
    error), so a model planned there would describe an impossible configuration: exit 1, one
    line naming the size and the node, nothing written. At seq=12 the check runs."""
    from onnx_cinm import optimize
    from onnx_cinm.cli import main

    m = _needs_long_input()
    with pytest.raises(CinmError, match=r"^the original cannot run at seq=4: .*Pad node"):
        optimize(m, dims={"seq": 4})
    res = optimize(m, dims={"seq": 12})
    assert res.check is not None and res.check.ok and res.check_skipped is None
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q",
                 "--dim", "seq=4"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "cannot run at seq=4" in err and "Pad node" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    # compare cannot judge either: an error with the remedies, exit 1
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx"), "--dim",
                 "seq=4"]) == 1
    assert "--input NAME=FILE.npy" in capsys.readouterr().err


def _fixed_batch_reshape():
    """x [batch, 4] @ W, then a Reshape to the hard-coded [1, 2, 2] (an exporter that traced
    batch 1, as khmersm's 'node_view' does): runs at batch 1 only."""
    w = nh.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "W")
    shape = nh.from_array(np.array([1, 2, 2], np.int64), "shape")
    return _model([h.make_node("MatMul", ["x", "W"], ["h"]),
                   h.make_node("Reshape", ["h", "shape"], ["y"], name="fix")],
                  [_vi("x", TP.FLOAT, ["batch", 4])], [_vi("y", TP.FLOAT, [1, 2, 2])],
                  [w, shape])


def test_optimize_refuses_a_batch_a_hard_coded_reshape_cannot_take(tmp_path, capsys):
    from onnx_cinm import optimize
    from onnx_cinm.cli import main

    m = _fixed_batch_reshape()
    x = np.ones((4, 4), np.float32)
    with pytest.raises(Exception, match="cannot be reshaped"):  # onnxruntime itself, at batch 4
        run_onnxruntime(m, {"x": x})
    assert optimize(m, dims={"batch": 1}).check.ok
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--dim", "batch=4"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert re.match(r"onnx-cinm: error: the original cannot run at batch=4: .*Reshape node 'fix'", err)
    assert "onnxruntime_src" not in err  # onnxruntime's C++ assertion, not the user's business
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    # with the check disabled the user asked for no run of the original: planned as asked
    assert optimize(m, dims={"batch": 4}, check=0).check is None


def test_optimize_still_skips_a_check_whose_failure_depends_on_the_values():
    """Gather indices computed from the random float input fall out of range: not a shape
    error (another draw could run), so the check is skipped with that said, not refused."""
    nodes = [h.make_node("Mul", ["x", "hundred"], ["s"]), h.make_node("Abs", ["s"], ["a"]),
             h.make_node("Cast", ["a"], ["i"], to=TP.INT64),
             h.make_node("Gather", ["table", "i"], ["y"])]
    inits = [nh.from_array(np.array(100, np.float32), "hundred"),
             nh.from_array(np.arange(3, dtype=np.float32), "table")]
    m = _model(nodes, [_vi("x", TP.FLOAT, [2])], [_vi("y", TP.FLOAT, [2])], inits)
    from onnx_cinm import optimize

    res = optimize(m)
    assert res.check is None and "Gather node" in res.check_skipped
    assert "not a shape error" in res.check_skipped


def test_optimize_skips_a_shape_error_an_integer_input_drawn_at_random_may_cause():
    """Expand(x [3, 4], s int64 [2]): the check draws s in [-10, 10], not a shape x expands to
    (onnxruntime: "invalid expand shape"), yet s = [3, 4] runs: the sizes are not to blame, so
    the check is skipped, not the model refused. Given s, the check runs (onnxruntime on the
    original: y == x broadcast to [3, 4])."""
    from onnx_cinm import optimize
    from onnx_cinm.golden import random_inputs

    m = _model([h.make_node("Expand", ["x", "s"], ["y"])],
               [_vi("x", TP.FLOAT, [3, 4]), _vi("s", TP.INT64, [2])], [_vi("y", TP.FLOAT, ["a", "b"])])
    with pytest.raises(Exception, match="invalid expand shape"):  # the draw itself fails
        run_onnxruntime(m, random_inputs(m, seed=0))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = np.array([3, 4], np.int64)
    np.testing.assert_array_equal(run_onnxruntime(m, {"x": x, "s": s})[0], x)
    res = optimize(m)
    assert res.check is None
    assert "integer input s" in res.check_skipped and "invalid expand shape" in res.check_skipped
    # the model written says it went unchecked, and report says so (trial s30: nothing in the
    # model marked it, and -q printed nothing)
    from onnx_cinm import frontend, report

    assert frontend.check_skipped(res.model) == res.check_skipped[:400]
    notes = report.layers(res.model)[1]["notes"]
    assert any(n.startswith("(UNCHECKED: optimize could not check this model") for n in notes)
    unchecked = res.model
    res = optimize(unchecked, inputs={"x": x, "s": s})  # checked now: the old record goes
    assert res.check_skipped is None and res.check.ok
    assert frontend.check_skipped(res.model) is None
    # only s given: x (float) is drawn, s is the user's: a shape error is the sizes' again
    with pytest.raises(CinmError, match="given --input arrays"):
        optimize(m, inputs={"s": np.array([5, 4], np.int64)})


@pytest.mark.parametrize("message, shape", [
    ("Reshape node 'v': The input tensor cannot be reshaped to the requested shape.", True),
    ("Add node '': Attempting to broadcast an axis by a dimension other than 1. 2 by 4", True),
    ("MatMul node '': matmul_helper.h:59 Compute MatMul dimension mismatch", True),
    ("Conv node '': Invalid input shape: {3}", True),
    ("MaxPool node '': Calculated output dimension is negative.", True),
    ("Pad node '': Pad reflect: pre-pad (6) exceeds maximum allowed (3) for axis 1.", True),
    # a recurrence's input width (madmom's GRU at a --dim the weights do not take, trial s30)
    ("GRU node '': Input W must have shape {1,6,5}. Actual:{1,6,3}", True),
    ("Conv node 'y': Input channels C is not equal to kernel channels * group. C: 4 kernel "
     "channels: 3 group: 1", True),
    ("Gather node '': indices element out of data bounds, idx=7", False),
    ("ConstantOfShape node '': Tensor shape.Size() must be >= 0", False),
])
def test_shape_errors_are_told_from_value_errors_by_onnxruntimes_message(message, shape):
    """The messages as onnxruntime words them (each seen from a one-node model at a wrong size
    or a bad value, onnxruntime 1.x CPU)."""
    from onnx_cinm.golden import is_shape_error

    assert is_shape_error(message) is shape


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


# --- meaningful check inputs and verdicts (issue: the check could pass on nothing) -------------
def _bert_like(vocab=100, hidden=16):
    """Word and token-type embeddings (Gather), an additive attention mask, a MatMul, Softmax."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "wemb"),
             nh.from_array(rng.standard_normal((2, hidden)).astype(np.float32), "temb"),
             nh.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "W"),
             nh.from_array(np.array(-10000.0, np.float32), "neg"),
             nh.from_array(np.array(1.0, np.float32), "one"),
             nh.from_array(np.array([-1], np.int64), "ax")]
    nodes = [h.make_node("Cast", ["input_ids"], ["ids32"], to=TP.INT32),
             h.make_node("Gather", ["wemb", "ids32"], ["e1"]),
             h.make_node("Gather", ["temb", "token_type_ids"], ["e2"]),
             h.make_node("Add", ["e1", "e2"], ["e"]),
             h.make_node("MatMul", ["e", "W"], ["q"]),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=TP.FLOAT),
             h.make_node("Sub", ["one", "mf"], ["inv"]),
             h.make_node("Mul", ["inv", "neg"], ["bias"]),
             h.make_node("Unsqueeze", ["bias", "ax"], ["b3"]),
             h.make_node("Add", ["q", "b3"], ["s"]),
             h.make_node("Softmax", ["s"], ["y"], axis=1)]
    ins = [_vi(n, TP.INT64, ["batch", "seq"]) for n in ("input_ids", "token_type_ids", "attention_mask")]
    return _model(nodes, ins, [_vi("y", TP.FLOAT, ["batch", "seq", hidden])], inits, opset=13)


def test_index_inputs_are_drawn_within_their_tables():
    from onnx_cinm.golden import index_ranges

    m = _bert_like()
    assert index_ranges(m) == {"input_ids": (0, 100), "token_type_ids": (0, 2), "attention_mask": (0, 2)}
    for seed in range(3):
        feeds = random_inputs(m, seed=seed, dims={"batch": 4, "seq": 64})
        assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 100
        assert set(np.unique(feeds["token_type_ids"])) <= {0, 1}
        assert set(np.unique(feeds["attention_mask"])) == {0, 1}
        assert feeds["input_ids"].dtype == np.int64
    # the check now runs (it was always skipped: ids out of the embedding table)
    from onnx_cinm import optimize

    res = optimize(m, dims={"batch": 2, "seq": 12})
    assert res.check is not None and res.check.ok and not res.check.meaningless
    onehot = _model([h.make_node("OneHot", ["k", "depth", "vals"], ["y"])],
                    [_vi("k", TP.INT64, [5])], [_vi("y", TP.FLOAT, [5, 7])],
                    [nh.from_array(np.array(7, np.int64), "depth"),
                     nh.from_array(np.array([0, 1], np.float32), "vals")])
    assert index_ranges(onehot) == {"k": (0, 7)}


def _graph_model():
    """A message-passing layer as graph networks export it (MiniMol, trial s30): node features
    h[num_nodes, 4] (a computed table), edge_index[2, num_edges] whose rows select source and
    target nodes (a Gather of a row, then the indices of a Gather), batch[num_nodes] the graph
    of each node (ScatterElements' indices into num_graphs rows)."""
    W = nh.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "W")
    row0 = nh.from_array(np.array(0, np.int64), "row0")
    nodes = [h.make_node("MatMul", ["feat", "W"], ["h"]),
             h.make_node("Gather", ["edge_index", "row0"], ["src"], axis=0),
             h.make_node("Gather", ["h", "src"], ["msg"], axis=0),
             h.make_node("ReduceSum", ["msg", "ax0"], ["m"], keepdims=1),
             h.make_node("Unsqueeze", ["batch", "ax1"], ["b2"]),
             h.make_node("Shape", ["h"], ["hshape"]),
             h.make_node("Expand", ["b2", "hshape"], ["bx"]),
             h.make_node("Mul", ["pool0", "zero"], ["pool"]),
             h.make_node("ScatterElements", ["pool", "bx", "h"], ["pooled"], axis=0, reduction="add"),
             h.make_node("Add", ["pooled", "m"], ["y"])]
    inits = [W, row0, nh.from_array(np.array([1], np.int64), "ax1"),
             nh.from_array(np.array([0], np.int64), "ax0"),
             nh.from_array(np.array(0, np.float32), "zero")]
    ins = [_vi("feat", TP.FLOAT, ["num_nodes", 4]), _vi("edge_index", TP.INT64, [2, "num_edges"]),
           _vi("batch", TP.INT64, ["num_nodes"]), _vi("pool0", TP.FLOAT, ["num_graphs", 4])]
    return _model(nodes, ins, [_vi("y", TP.FLOAT, ["num_graphs", 4])], inits, opset=17)


def test_graph_indices_are_drawn_within_the_nodes_and_graphs():
    """edge_index indexes the num_nodes rows of a computed tensor, batch the num_graphs rows:
    drawn in [-10, 10] they fell outside (onnxruntime refused the run, the check was skipped);
    each is now drawn within the size its table has at the drawn sizes."""
    from onnx_cinm import optimize
    from onnx_cinm.golden import index_ranges

    m = _graph_model()
    assert index_ranges(m, {"num_nodes": 5, "num_edges": 9, "num_graphs": 3}) == {
        "edge_index": (0, 5), "batch": (0, 3)}
    for dims in ({"num_nodes": 5, "num_edges": 9, "num_graphs": 3}, {}):
        feeds = random_inputs(m, seed=1, dims=dims)
        n_nodes, n_graphs = feeds["feat"].shape[0], feeds["pool0"].shape[0]
        assert 0 <= feeds["edge_index"].min() and feeds["edge_index"].max() < n_nodes
        assert 0 <= feeds["batch"].min() and feeds["batch"].max() < n_graphs
    res = optimize(m, dims={"num_nodes": 6, "num_edges": 10, "num_graphs": 2})
    assert res.check is not None and res.check.ok and res.check_skipped is None
    assert res.check_special is not None and res.check_special.ok


def test_gathernd_index_tuples_are_drawn_within_every_axis_they_address():
    """A GatherND index [4, 2] addresses data[50, 20] on both axes: each value below 20, the
    smaller (reviewer s30: drawn below 50, the check ran into 'invalid index found')."""
    from onnx_cinm import optimize
    from onnx_cinm.golden import index_ranges

    data = nh.from_array(np.random.default_rng(0).standard_normal((50, 20)).astype(np.float32), "data")
    m = _model([h.make_node("GatherND", ["data", "idx"], ["g"]),
                h.make_node("Unsqueeze", ["g", "ax"], ["g2"]),
                h.make_node("MatMul", ["g2", "w"], ["y"])],
               [_vi("idx", TP.INT64, [4, 2])], [_vi("y", TP.FLOAT, [4, 8])],
               [data, nh.from_array(np.ones((1, 8), np.float32), "w"),
                nh.from_array(np.array([1], np.int64), "ax")], opset=17)
    assert index_ranges(m) == {"idx": (0, 20)}
    res = optimize(m)
    assert res.check is not None and res.check.ok and res.check_skipped is None


def test_the_nan_inf_check_keeps_the_given_integer_inputs():
    """With every input given (--input), the NaN/Inf check put NaN/Inf into the given float
    arrays but drew the integer ones anew: random indices outside the user's node table, so
    the check was skipped ('indices element out of data bounds')."""
    from onnx_cinm import optimize
    from onnx_cinm.golden import compare_special

    m = _graph_model()
    rng = np.random.default_rng(0)
    given = {"feat": rng.standard_normal((7, 4)).astype(np.float32),
             "edge_index": rng.integers(0, 7, (2, 12)).astype(np.int64),
             "batch": np.array([0, 0, 1, 1, 1, 2, 2], np.int64),
             "pool0": np.zeros((3, 4), np.float32)}
    special = compare_special(m, m, given=given)
    assert special is not None and special.ok
    res = optimize(m, inputs=given)
    assert res.special_skipped is None and res.check_special is not None and res.check_special.ok


def _log_model():
    return _model([h.make_node("Log", ["x"], ["y"])], [_vi("x", TP.FLOAT, [4, 8])],
                  [_vi("y", TP.FLOAT, [4, 8])])


def test_a_reference_that_is_nan_everywhere_is_not_ok():
    m = _model([h.make_node("Log", ["x"], ["l"]), h.make_node("Mul", ["l", "zero"], ["y"])],
               [_vi("x", TP.FLOAT, [4, 8])], [_vi("y", TP.FLOAT, [4, 8])],
               [nh.from_array(np.array(np.nan, np.float32), "zero")])
    rep = compare(m, m, n=2)
    assert rep.ok and rep.meaningless == ["the reference 'y' is NaN/Inf everywhere"]
    assert ": NOT MEANINGFUL (the reference 'y' is NaN/Inf everywhere; give valid inputs" in rep.summary()
    assert "OK" not in rep.summary()
    # partly NaN (Log of 4 negative inputs of 32, at most a quarter): judged on the rest, and
    # the summary says so
    x = np.linspace(0.5, 2.0, 32, dtype=np.float32).reshape(4, 8)
    x.flat[:4] *= -1
    rep = compare(_log_model(), _log_model(), feeds=[{"x": x}])
    assert not rep.meaningless and rep.summary().endswith(
        "OK on the finite elements (NaN/Inf in the reference, matched: y: 4 of 32)")
    # random normal inputs: about half negative, over a quarter NaN: proves nothing
    rep = compare(_log_model(), _log_model(), n=1)
    assert rep.outputs[0].ref_nonfinite > 8
    assert rep.meaningless == [f"the reference 'y' is NaN/Inf in {rep.outputs[0].ref_nonfinite} "
                               "of 32 elements"]


def test_a_constant_reference_is_not_ok(tmp_path, capsys):
    from onnx_cinm.cli import main

    m = _model([h.make_node("Mul", ["x", "zero"], ["y"])], [_vi("x", TP.FLOAT, [4, 8])],
               [_vi("y", TP.FLOAT, [4, 8])], [nh.from_array(np.array(0, np.float32), "zero")])
    rep = compare(m, m, n=2)
    assert rep.meaningless == ["the reference 'y' is 0 everywhere"]
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 0
    assert "warning: golden check not meaningful: the reference 'y' is 0 everywhere" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx")]) == 1
    assert "NOT MEANINGFUL" in capsys.readouterr().out


def test_optimize_run_and_compare_take_real_inputs_from_npz(tmp_path, capsys):
    from onnx_cinm.cli import main

    m = _bert_like()
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 100, (2, 5))
    np.savez(tmp_path / "feeds.npz", input_ids=ids, token_type_ids=np.zeros((2, 5), np.int64),
             attention_mask=np.ones((2, 5), np.int64))
    np.save(tmp_path / "ids.npy", ids)
    assert main(["optimize", str(src), "-o", str(out), "--input", str(tmp_path / "feeds.npz")]) == 0
    assert "check: 1 run, 1 output" in capsys.readouterr().out  # one run: every input was given
    assert main(["run", str(out), "--input", str(tmp_path / "feeds.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as got:
        np.testing.assert_allclose(got["y"], run_onnxruntime(m, dict(np.load(tmp_path / "feeds.npz")))[0],
                                   rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--input", f"input_ids={tmp_path / 'ids.npy'}"]) == 0
    assert main(["optimize", str(src), "-o", str(out), "--input", f"nope={tmp_path / 'ids.npy'}"]) == 1
    assert "--input 'nope' is not an input of the model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a usage error
        main(["run", str(out), "--input", str(tmp_path / "feeds.npz"),
              "--input", f"input_ids={tmp_path / 'ids.npy'}"])
    assert e.value.code == 2
    assert "--input given twice for 'input_ids'" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert main(["run", str(out), "--input", str(tmp_path / "bad.npz")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx-cinm: error: cannot read inputs from") and "\n" not in err
# --- tolerances follow the dtype (issue 17 #5) ------------------------------------------------

def test_default_tolerance_is_four_ulps_of_coarse_floats_and_onnxsims_for_float32():
    from onnx_cinm.golden import default_tolerance

    assert default_tolerance(np.float32) == (1e-4, 1e-5)   # onnxsim's defaults
    assert default_tolerance(np.float64) == (1e-4, 1e-5)
    assert default_tolerance(np.float16) == (4 * 2.0**-10, 4 * 2.0**-10)  # 0.00390625
    assert default_tolerance(np.int32) == (1e-4, 1e-5)     # integers: exact anyway


def _half_gemm(alpha):
    rng = np.random.default_rng(17)
    w = rng.standard_normal((32, 64)).astype(np.float16)
    b = rng.standard_normal(32).astype(np.float16)
    return _model([h.make_node("Gemm", ["x", "w", "b"], ["y"], alpha=alpha, beta=0.7, transB=1)],
                  [_vi("x", TP.FLOAT16, [4, 64])], [_vi("y", TP.FLOAT16, [4, 32])],
                  [nh.from_array(w, "w"), nh.from_array(b, "b")])


def test_float16_one_ulp_differences_pass_the_default_check_only():
    """Folding alpha into B moves float16 results by an ulp (0.0039 near 4..8); the default
    check judges float16 by its own resolution, a tolerance given explicitly is kept."""
    folded = _half_gemm(1.0)
    w = nh.to_array(folded.graph.initializer[0]).astype(np.float32)
    folded.graph.initializer[0].CopyFrom(nh.from_array((w * np.float32(0.3)).astype(np.float16), "w"))
    r = compare(_half_gemm(0.3), folded, n=3)
    assert r.max_abs_err > 0  # the rounding really differs
    assert r.ok, r.summary()
    # rtol 4 ulps; atol at least that, widened by the Gemm's reduction (accumulation_atol)
    assert r.outputs[0].rtol == 2.0**-8 and r.outputs[0].atol >= 2.0**-8
    assert "float16 0.00390625/" in r.table()
    strict = compare(_half_gemm(0.3), folded, n=3, rtol=1e-4, atol=1e-5)
    assert not strict.ok and "rtol 0.0001, atol 1e-05" in strict.table()


def test_optimize_accepts_a_float16_conv_with_batchnorm_by_default():
    """The default --check-rtol 1e-4 refused correct float16 models (issue 17 #5)."""
    from onnx_cinm import optimize

    rng = np.random.default_rng(5)
    t = lambda name, shape, lo=0.0: nh.from_array(  # noqa: E731
        (rng.standard_normal(shape) + lo).astype(np.float16) if not lo else
        (np.abs(rng.standard_normal(shape)) + lo).astype(np.float16), name)
    m = _model([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                h.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["y"])],
               [_vi("x", TP.FLOAT16, [1, 4, 10, 10])], [_vi("y", TP.FLOAT16, [1, 8, 10, 10])],
               [t("w", (8, 4, 3, 3)), t("s", (8,)), t("bb", (8,)), t("mu", (8,)),
                t("var", (8,), 0.5)])
    res = optimize(m, check=3)
    assert res.check.ok and res.check.max_abs_err > 0
    with pytest.raises(CheckFailed, match=r"beyond atol 1e-05 \+ rtol 0\.0001 .*--check-atol"):
        optimize(m, check=3, check_rtol=1e-4, check_atol=1e-5)


# --- the NaN/Inf check (issue 12 #5) ----------------------------------------------------------

def _relu_model(nan_to_zero=False):
    """y = Relu(x); or the same on finite x but NaN -> 0 (what a NaN-dropping kernel did)."""
    nodes = [h.make_node("Relu", ["x"], ["r" if nan_to_zero else "y"])]
    if nan_to_zero:
        nodes += [h.make_node("IsNaN", ["x"], ["nan"]),
                  h.make_node("Where", ["nan", "zero", "r"], ["y"])]
    return _model(nodes, [_vi("x", TP.FLOAT, ["batch", 40])], [_vi("y", TP.FLOAT, ["batch", 40])],
                  [nh.from_array(np.array(0, np.float32), "zero")] if nan_to_zero else [])


def test_special_fill_puts_nan_and_both_infinities_in_float_inputs_only(many_inputs):
    feeds = random_inputs(_relu_model(), fill="special", dims={"batch": 3})
    x = feeds["x"]
    assert np.isnan(x).sum() == 4 and (x == np.inf).sum() == 4 and (x == -np.inf).sum() == 4
    assert np.isfinite(x).sum() == 120 - 12
    assert random_inputs(_relu_model(), fill="special", dims={"batch": 3}).keys() == feeds.keys()
    for name, a in random_inputs(many_inputs, fill="special").items():
        if a.dtype.kind != "f":
            assert a.dtype == object or np.all(np.isfinite(a.astype(np.float64)))


def test_nan_inf_check_is_separate_and_catches_what_the_ordinary_check_cannot():
    from onnx_cinm.golden import compare_special

    ref, dropped = _relu_model(), _relu_model(nan_to_zero=True)
    assert compare(ref, dropped, n=3).ok  # no NaN in ordinary inputs: looks right
    r = compare_special(ref, dropped)
    assert not r.ok and r.outputs[0].mismatched > 0 and r.max_abs_err == float("inf")
    assert compare_special(ref, ref).ok
    ints = _model([h.make_node("Neg", ["i"], ["y"])], [_vi("i", TP.INT32, [3])],
                  [_vi("y", TP.INT32, [3])])
    assert compare_special(ints, ints) is None  # nothing to inject


def test_optimize_runs_the_nan_inf_check_after_the_ordinary_one():
    from onnx_cinm import optimize

    res = optimize(_linear(), check=2)
    assert res.check.ok and res.check_special is not None and res.check_special.ok
    assert res.check_special.runs == 1
    assert "NaN/Inf check: 1 run" in res.summary()


# --- tolerances that fit the arithmetic: a long reduction widens the default atol -------------
def _k_model(w, dtype=TP.FLOAT, k=4096, n=64):
    if dtype == TP.DOUBLE:  # the same product, accumulated in float64 and rounded once
        nodes = [h.make_node("Cast", ["x"], ["xd"], to=TP.DOUBLE),
                 h.make_node("MatMul", ["xd", "W"], ["yd"]), h.make_node("Cast", ["yd"], ["y"], to=TP.FLOAT)]
        w = w.astype(np.float64)
    else:
        nodes = [h.make_node("MatMul", ["x", "W"], ["y"])]
    return _model(nodes, [_vi("x", TP.FLOAT, [256, k])], [_vi("y", TP.FLOAT, [256, n])], [nh.from_array(w, "W")])


def test_reduction_length_and_accumulation_atol_by_hand():
    from onnx_cinm.golden import accumulation_atol, reduction_length

    w = np.random.default_rng(5).standard_normal((4096, 64)).astype(np.float32)
    assert reduction_length(_k_model(w)) == 4096
    conv = _model([h.make_node("Conv", ["x", "W"], ["y"])], [_vi("x", TP.FLOAT, [1, 3, 8, 8])],
                  [_vi("y", TP.FLOAT, [1, 4, 6, 6])],
                  [nh.from_array(np.ones((4, 3, 3, 3), np.float32), "W")])
    assert reduction_length(conv) == 27
    red = _model([h.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], [_vi("x", TP.FLOAT, [5, 300])],
                 [_vi("y", TP.FLOAT, [5])], [nh.from_array(np.array([1], np.int64), "ax")])
    assert reduction_length(red) == 300
    # an LSTM over T = 300 steps of 40 inputs and 256 units: 300 x (40 + 256); batch-first: the
    # steps are axis 1 of X
    for layout, x_shape in ((0, [300, 2, 40]), (1, [2, 300, 40])):
        lstm = _model([h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=256, layout=layout)],
                      [_vi("x", TP.FLOAT, x_shape)],
                      [_vi("y", TP.FLOAT, [300, 1, 2, 256] if layout == 0 else [2, 300, 1, 256])],
                      [nh.from_array(np.zeros((1, 1024, 40), np.float32), "W"),
                       nh.from_array(np.zeros((1, 1024, 256), np.float32), "R")])
        assert reduction_length(lstm) == 300 * (40 + 256)
    # steps of a symbolic length: its size where the check knows it (the arrays compared)
    lstm = _model([h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=256)],
                  [_vi("x", TP.FLOAT, ["T", 2, 40])], [_vi("y", TP.FLOAT, ["T", 1, 2, 256])],
                  [nh.from_array(np.zeros((1, 1024, 40), np.float32), "W"),
                   nh.from_array(np.zeros((1, 1024, 256), np.float32), "R")])
    assert reduction_length(lstm) == 1 * (40 + 256)
    assert reduction_length(lstm, {"T": 300}) == 300 * (40 + 256)
    ref = np.array([3.0, -4.0], np.float32)  # rms sqrt(12.5)
    assert accumulation_atol(ref, 4096) == pytest.approx(4 * 2.0 ** -23 * 64 * np.sqrt(12.5))
    assert accumulation_atol(ref, 1) == 0 and accumulation_atol(np.array([np.nan], np.float32), 99) == 0


def test_a_long_reduction_in_another_order_passes_and_a_real_error_does_not():
    """float64 accumulation vs onnxruntime's float32 GEMM over K = 4096: both correct, apart by
    rounding only. The fixed atol 1e-5 called that a mismatch (about 15 of 16384 elements, near
    zero, per run); the K-aware default does not,
    yet an error of 0.05 in one weight is still caught."""
    w = np.random.default_rng(5).standard_normal((4096, 64)).astype(np.float32)
    ref, exact = _k_model(w), _k_model(w, TP.DOUBLE)
    assert not compare(ref, exact, n=2, rtol=1e-4, atol=1e-5).ok  # the old fixed tolerance
    rep = compare(ref, exact, n=2)
    assert rep.ok, rep.summary()
    assert 1e-5 < rep.outputs[0].atol < 0.01
    bad = w.copy()
    bad[0, 0] += 0.05
    assert not compare(ref, _k_model(bad, TP.DOUBLE), n=2).ok


def test_optimize_refuses_given_inputs_the_original_cannot_run(tmp_path, capsys):
    """A float64 array for a float32 input was reported as 'check skipped (... random inputs)'
    and the model written; the inputs were the user's, so it is an error naming them."""
    from onnx_cinm.cli import main

    m = _bert_like()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "bad.npz", input_ids=np.zeros((2, 5), np.float64),
             token_type_ids=np.zeros((2, 5), np.int64), attention_mask=np.ones((2, 5), np.int64))
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--input", str(tmp_path / "bad.npz")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx-cinm: error: --input 'input_ids' holds float64, but the model's "
                          "input is int64")
    assert "\n" not in err and not (tmp_path / "o.onnx").exists()


def test_an_ok_with_a_large_relative_error_says_why():
    """'check ... max rel err 1.3: OK' alarmed a user: the largest relative error sits on an
    element that cancels to near 0, judged by the K-widened atol; the summary now says so."""
    w = np.random.default_rng(5).standard_normal((4096, 64)).astype(np.float32)
    rep = compare(_k_model(w), _k_model(w, TP.DOUBLE), n=2)
    (out,) = rep.outputs
    assert rep.ok and out.max_rel_err > out.rtol and out.k == 4096
    # the element of the largest relative error is one whose error atol covers
    assert out.max_rel_err * out.rel_err_ref <= out.atol
    assert rep.summary().endswith(
        f": OK ('y' max rel err {out.max_rel_err:.2g} is at an element of |reference| "
        f"{out.rel_err_ref:.2g}; elements below |reference| {out.atol / 1e-4:.3g} are judged by "
        f"atol {out.atol:.2g} (rounding of a sum of 4096 terms), not rtol 0.0001)")
    same = compare(_k_model(w), _k_model(w), n=1)
    assert same.summary().endswith(": OK")  # nothing to explain


def test_the_printed_tolerances_show_the_dtype_default_and_each_widened_atol():
    """Trial: compare printed 'float32 0.0001/4.56499e-05' while --help says the default atol
    is 1e-5. The header now prints the dtype's 1e-05 and, apart, the output whose atol was
    widened for its K = 4096 sum, with the value accumulation_atol gives by hand."""
    w = np.random.default_rng(5).standard_normal((4096, 64)).astype(np.float32)
    rep = compare(_k_model(w), _k_model(w, TP.DOUBLE), n=1)
    (out,) = rep.outputs
    # the check's input set (seed 0) and its output, by numpy
    y = random_inputs(_k_model(w), seed=0)["x"].astype(np.float64) @ w.astype(np.float64)
    want = 4 * 2.0 ** -23 * 64 * np.sqrt(np.mean(y ** 2))
    assert out.k == 4096 and out.atol == pytest.approx(want, rel=1e-3)
    assert rep.tolerances() == ("rtol/atol by dtype: float32 0.0001/1e-05; atol widened: "
                                f"y {want:.3g} (rounding of a sum of 4096 terms)")
    assert rep.table().splitlines()[0].endswith(rep.tolerances())


def test_the_widened_atol_names_the_rule_that_set_it():
    """Trial s23: a QDQ output with a 160-long sum and one quantization step 0.0181 printed
    'atol widened: s 0.0181 (rounding of a sum of 160 terms)', though 4 eps sqrt(160) rms
    (hand: 4 * 2^-23 * 12.6 * 1 = 6.0e-6 for an rms of 1) is below the 1e-5 default: the step
    set the atol. And its note called an element of |reference| 1.1 'near 0'."""
    from onnx_cinm.golden import CheckReport, OutputCheck, _compare_arrays

    ref = np.array([1.1, -1.0, 0.9, 1.0], np.float32)  # rms 1.0025
    cand = ref + np.float32(0.015)                      # rel err 0.015 / 0.9 = 0.0167 > rtol
    rec = OutputCheck("s")
    _compare_arrays(rec, ref, cand, None, None, k=160, step=0.0181)
    assert rec.ok and rec.atol == pytest.approx(0.0181) and rec.widened_by == "step"
    rep = CheckReport(ok=True, runs=1, outputs=[rec])
    assert rep.tolerances() == ("rtol/atol by dtype: float32 0.0001/1e-05; atol widened: "
                                "s 0.0181 (one quantization step)")
    note = rec.rel_err_note()
    assert note == ("'s' max rel err 0.017 is at an element of |reference| 0.9; elements below "
                    "|reference| 181 are judged by atol 0.018 (one quantization step), not rtol "
                    "0.0001")
    # the same output without a step and a sum long enough: 4 * 2^-23 * 1000 * rms = 4.78e-4
    rec = OutputCheck("s")
    _compare_arrays(rec, ref, ref, None, None, k=10 ** 6, step=0.0)
    rms = np.sqrt(np.mean(ref.astype(np.float64) ** 2))
    assert rec.widened_by == "sum" and rec.atol == pytest.approx(4 * 2.0 ** -23 * 1000 * rms)
    assert rec.widened_text() == "rounding of a sum of 1000000 terms"
    # a step smaller than that sum's atol: the sum sets it
    rec = OutputCheck("s")
    _compare_arrays(rec, ref, ref, None, None, k=10 ** 6, step=1e-4)
    assert rec.widened_by == "sum"
    # --rtol 0: every element is judged by atol alone (|0.015| <= atol 0.02 by hand)
    rec = OutputCheck("s")
    _compare_arrays(rec, ref, cand, 0.0, 0.02)
    assert rec.ok and rec.rel_err_note() == ("'s' max rel err 0.017 is at an element of "
                                             "|reference| 0.9; every element is judged by atol "
                                             "0.02 (rtol 0)")


def _concat_rows(names):
    """Inputs ``[d, 4]`` for each dim name in ``names`` concatenated on axis 1: onnxruntime
    runs it only when every input has as many rows (the dims must be equal)."""
    inputs = [_vi(f"x{i}", TP.FLOAT, [d, 4]) for i, d in enumerate(names)]
    return _model([h.make_node("Concat", [vi.name for vi in inputs], ["y"], axis=1, name="cat")],
                  inputs, [_vi("y", TP.FLOAT, [names[0], 4 * len(names)])])


def test_a_dim_left_unsized_that_runs_at_one_is_a_skipped_check_not_a_refusal(tmp_path):
    """A reviewer, s27: x[N, S] + c[1, 3] runs only at S in (1, 3). With N=3 given and S left
    unsized, the check draws S=8 (off axis 0) and fails, but the model as planned takes S=1,
    where the original runs (numpy's broadcast below): the check is skipped with the hint, not
    the sizes refused, and the model written runs at S=1 as onnxruntime runs the original."""
    from onnx_cinm import optimize

    cc = np.arange(3, dtype=np.float32).reshape(1, 3)
    ww = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    model = _model([h.make_node("Add", ["x", "c"], ["s"]), h.make_node("MatMul", ["s", "w"], ["m"]),
                    h.make_node("Relu", ["m"], ["y"])],
                   [_vi("x", TP.FLOAT, ["N", "S"])], [_vi("y", TP.FLOAT, ["N", 4])],
                   [nh.from_array(cc, "c"), nh.from_array(ww, "w")])
    res = optimize(model, dims={"N": 3})
    assert res.check is None and res.check_skipped.endswith("; at S=3 it runs")
    x = np.linspace(-1, 1, 3, dtype=np.float32).reshape(3, 1)
    np.testing.assert_allclose(run_onnxruntime(res.model, {"x": x})[0],
                               np.maximum((x + cc) @ ww, 0), rtol=1e-6, atol=1e-6)


def test_a_model_that_runs_neither_at_the_drawn_sizes_nor_at_one_is_refused(tmp_path, capsys):
    """Trial s28: MTCNN's pnet (N, M1, M2 symbolic) optimized without --dim was planned at a
    1x1 image (every kernel 1xKxN), the check skipped, exit 0. A 9x9 Conv without padding runs
    on no image below 9x9: neither at the check's draw (8 off axis 0) nor at 1, the size plans
    take a dim without one; refused, naming the dims, nothing written. With sizes it runs."""
    from onnx_cinm import optimize
    from onnx_cinm.cli import main

    w = np.ones((2, 1, 9, 9), np.float32) / 81
    model = _model([h.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[9, 9])],
                   [_vi("x", TP.FLOAT, ["N", 1, "H", "W"])], [_vi("y", TP.FLOAT, ["N", 2, "OH", "OW"])],
                   [nh.from_array(w, "w")])
    with pytest.raises(CinmError, match=r"does not run with N, H, W at 1, the size plans take a dim "
                                        r"without one, nor at the sizes the check drew .*; give "
                                        r"their sizes: --dim N=SIZE --dim H=SIZE --dim W=SIZE$"):
        optimize(model)
    onnx.save(model, tmp_path / "conv9.onnx")
    assert main(["optimize", str(tmp_path / "conv9.onnx"), "-o", str(tmp_path / "o.onnx"), "-q"]) == 1
    assert "Traceback" not in capsys.readouterr().err and not (tmp_path / "o.onnx").exists()
    res = optimize(model, dims={"H": 12, "W": 10})
    assert res.check is not None and res.check.ok


def test_optimize_refuses_given_sizes_that_conflict_even_with_a_dim_left_unsized(tmp_path, capsys):
    """Trial s24b finding 3: [a, 4] and [b, 4] concatenated on axis 1 need a == b. With a=3 and
    b unsized, the check draws b=1 and fails, but b=3 runs (onnxruntime, against numpy's
    concatenate): refused, naming b and the size that runs (a fresh user, s27: deepcut's two
    batch dims, one given, was written with exit 0 and planned at b=1, a model that cannot
    run). With a=3, b=5 the sizes given conflict: refused, and so they are when a third dim c
    is left unsized (no size of c runs), with nothing written."""
    from onnx_cinm import optimize
    from onnx_cinm.cli import main

    two = _concat_rows(["a", "b"])
    x0, x1 = np.ones((3, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run_onnxruntime(two, {"x0": x0, "x1": x1})[0],
                                  np.concatenate([x0, x1], axis=1))
    with pytest.raises(CinmError, match=r"^the original does not run at a=3 with b left unsized "
                                        r"\(a shape error: .*Concat.*\); at b=3 it runs: give that "
                                        r"size too, --dim b=3$"):
        optimize(two, dims={"a": 3})
    assert optimize(two, dims={"a": 3, "b": 3}).check.ok
    with pytest.raises(CinmError, match=r"^the original cannot run at a=3, b=5: .*Concat node 'cat'"):
        optimize(two, dims={"a": 3, "b": 5})
    three = _concat_rows(["a", "b", "c"])
    with pytest.raises(CinmError, match=r"^the original cannot run at a=3, b=5 \(c drawn, or at "
                                        r"each size given: a shape error every time\): .*Concat"):
        optimize(three, dims={"a": 3, "b": 5})
    with pytest.raises(CinmError, match=r"with c left unsized .*; at c=3 it runs: give that size "
                                        r"too, --dim c=3$"):
        optimize(three, dims={"a": 3, "b": 3})  # c=3 runs: the draw, not the sizes, failed
    onnx.save(three, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q",
                 "--dim", "a=3", "--dim", "b=3"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--dim c=3" in err
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q",
                 "--dim", "a=3", "--dim", "b=5"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "cannot run at a=3, b=5" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def _widening_matmul():
    """x [n, 4] @ W [4, 256] -> y [n, 256] (float32): at n rows the input takes 16 n bytes and
    y 1024 n bytes."""
    w = nh.from_array(np.ones((4, 256), np.float32), "W")
    return _model([h.make_node("MatMul", ["x", "W"], ["y"])], [_vi("x", TP.FLOAT, ["n", 4])],
                  [_vi("y", TP.FLOAT, ["n", 256])], [w])


def test_optimize_refuses_sizes_whose_tensors_exceed_physical_memory_before_any_run(
        tmp_path, capsys, monkeypatch):
    """Trial s24b finding 1 (a --dim typo took all 23 GB and was OOM-killed): with physical
    memory pretended 500 kB, n=1000 needs 16 000 B of input + 1 024 000 B for y (hand count,
    1.04 MB): refused before onnxruntime runs at all, one line naming the dim and the tensor,
    nothing written. n=100 (1 600 + 102 400 B) fits and is checked; where the system does not
    tell its memory, or with the check off, nothing is refused."""
    from onnx_cinm import golden, optimize, pipeline
    from onnx_cinm.cli import main

    m = _widening_matmul()
    monkeypatch.setattr(pipeline, "_physical_memory", lambda: 500_000)
    assert golden.input_nbytes(m, {"n": 1000}) == {"x": 16_000}
    ran = []
    real_compare = golden.compare
    monkeypatch.setattr(golden, "compare", lambda *a, **k: ran.append(1) or real_compare(*a, **k))
    with pytest.raises(CinmError, match=r"^one onnxruntime run at n=1000 needs at least 1\.04 MB "
                                        r"of memory \(inputs 16 kB \+ tensor 'y' 1\.02 MB\), more "
                                        r"than this machine's 500 kB"):
        optimize(m, dims={"n": 1000})
    assert not ran
    # with the check off nothing runs the original: planned at the sizes asked
    assert optimize(m, dims={"n": 1000}, check=0).check is None and not ran
    assert optimize(m, dims={"n": 100}).check.ok and ran
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q",
                 "--dim", "n=1000"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "n=1000" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    monkeypatch.setattr(pipeline, "_physical_memory", lambda: None)
    assert optimize(m, dims={"n": 1000}).check.ok


@pytest.mark.parametrize("who", ["original", "candidate"])
def test_optimize_refuses_sizes_onnxruntime_runs_out_of_memory_at(who, tmp_path, capsys, monkeypatch):
    """Under a memory limit onnxruntime throws std::bad_alloc (trial s24b: "Transpose node
    'node_permute_3': std::bad_alloc"): out of memory at these sizes, refused with exit 1 and
    nothing written, never skipped as "may depend on the values drawn". (The failure is
    simulated: a real one would need the memory.)"""
    from onnx_cinm import golden, optimize
    from onnx_cinm.cli import main
    from onnx_cinm.errors import ReferenceFailed

    text = "onnxruntime failed to run the model: MatMul node 'mm': std::bad_alloc (inputs: x [7, 4])"
    error = ReferenceFailed(text) if who == "original" else CheckFailed(f"candidate model: {text}")

    def oom(*a, **k):
        raise error
    monkeypatch.setattr(golden, "compare", oom)
    m = _widening_matmul()
    with pytest.raises(CinmError, match=r"^onnxruntime ran out of memory running the original at "
                                        r"n=7 .*: out of memory at these sizes"):
        optimize(m, dims={"n": 7})
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--dim", "n=7"]) == 1
    err = capsys.readouterr().err
    assert "out of memory at these sizes" in err and "values drawn" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_is_out_of_memory_by_onnxruntime_wording():
    from onnx_cinm.golden import is_out_of_memory

    assert is_out_of_memory("Transpose node 'node_permute_3': std::bad_alloc")
    assert is_out_of_memory("Failed to allocate memory for requested buffer of size 8000000000")
    assert not is_out_of_memory("Gather node 'g': indices element out of data bounds, idx=7")
    assert not is_out_of_memory("Concat node 'cat': Axis 0 has mismatched dimensions of 1 and 3")


@pytest.mark.parametrize("quantized", [True, False])
def test_a_failed_check_of_a_runtime_quantizing_model_does_not_advise_wider_tolerances(
        quantized, monkeypatch):
    """Trial s28b: an int8 GRU (DynamicQuantizeLinear) at batch 4 failed the check by 0.19 on
    random inputs and was told to widen the tolerance, as for float rounding; with real inputs
    it passed with error 0. A model that quantizes at run time is pointed at real inputs; a
    float model keeps the tolerance hint. (The check's report is stubbed: a real last-bit
    flip before a quantizer cannot be produced on demand.)"""
    from onnx_cinm import optimize, pipeline
    from onnx_cinm.golden import OutputCheck, _compare_arrays

    nodes = [h.make_node("Relu", ["x"], ["r"])]
    if quantized:
        nodes += [h.make_node("DynamicQuantizeLinear", ["r"], ["q", "s", "z"]),
                  h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    else:
        nodes += [h.make_node("Neg", ["r"], ["y"])]
    model = _model(nodes, [_vi("x", TP.FLOAT, [2, 4])], [_vi("y", TP.FLOAT, [2, 4])])

    def failing(*args, **kwargs):  # one float output off by far more than rounding
        rec = OutputCheck("y")
        ref = np.linspace(-1, 1, 8, dtype=np.float32)
        _compare_arrays(rec, ref, ref + np.float32(0.2), None, None)
        return CheckReport(ok=False, runs=1, outputs=[rec])

    monkeypatch.setattr(pipeline.golden, "compare", failing)
    with pytest.raises(CheckFailed) as e:
        optimize(model)
    msg = str(e.value)
    assert msg.startswith("the optimized model does not match the original: ")
    if quantized:
        assert "the model quantizes at run time (DynamicQuantizeLinear: one scale" in msg
        assert "check on real inputs (--input NAME=FILE.npy" in msg and "widen the" not in msg
    else:
        assert "if that is float rounding" in msg and "quantizes at run time" not in msg


def test_run_warns_of_a_model_optimize_could_not_check(tmp_path, capsys):
    """Expand(x, s) with s drawn at random: optimize skips its check and records why; run warns
    before its outputs (unless -q)."""
    from onnx_cinm import artifacts, optimize
    from onnx_cinm.cli import main

    m = _model([h.make_node("Expand", ["x", "s"], ["y"])],
               [_vi("x", TP.FLOAT, [3, 4]), _vi("s", TP.INT64, [2])], [_vi("y", TP.FLOAT, ["a", "b"])])
    artifacts.save(optimize(m).model, tmp_path / "o.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((3, 4), np.float32), s=np.array([3, 4], np.int64))
    assert main(["run", str(tmp_path / "o.onnx"), "--input", str(tmp_path / "in.npz")]) == 0
    err = capsys.readouterr().err
    assert "warning: optimize could not check this model against its original: " in err
    assert "invalid expand shape" in err


def test_a_size_a_position_table_refuses_is_not_blamed_on_the_token_ids():
    """ids[1, seq] -> word table -> + a position table of 16 rows: at seq=20 no input runs
    (a broadcast error). The ids are drawn within the word table, so they cannot be what
    fails: the size is refused, not the check skipped with an unchecked model written (trial
    s30b: MiniLM at sequence=100, its position table 64 long)."""
    from onnx_cinm import optimize

    m = _model([h.make_node("Gather", ["words", "input_ids"], ["e"]),
                h.make_node("Add", ["e", "pos"], ["y"])],
               [_vi("input_ids", TP.INT64, [1, "seq"])], [_vi("y", TP.FLOAT, [1, "seq", 8])],
               [nh.from_array(np.ones((100, 8), np.float32), "words"),
                nh.from_array(np.ones((1, 16, 8), np.float32), "pos")])
    with pytest.raises(CinmError, match="the original cannot run at seq=20"):
        optimize(m, dims={"seq": 20})
    res = optimize(m, dims={"seq": 16})
    assert res.check is not None and res.check.ok


def test_the_argmax_rows_of_a_float_output_are_counted_by_hand():
    """compare prints, for a float output whose last axis has two or more entries, in how many
    rows the candidate's largest value sits where the reference's does (top-1 of class
    scores): hand-made rows, two of three agreeing; a last axis of one entry has no rows."""
    from onnx_cinm.golden import OutputCheck, _compare_arrays

    ref = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.0, 0.0, 1.0]], np.float32)
    cand = np.array([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5], [0.0, 0.1, 0.9]], np.float32)
    rec = OutputCheck("y")
    _compare_arrays(rec, ref, cand, None, None)
    _compare_arrays(rec, ref[:1], cand[:1], None, None)  # a second run: its row adds
    assert (rec.argmax_rows, rec.argmax_same) == (4, 3)
    one = OutputCheck("z")
    _compare_arrays(one, ref[:, :1], cand[:, :1], None, None)
    assert (one.argmax_rows, one.argmax_same) == (0, 0)


def test_an_empty_input_array_is_refused_for_a_comparison():
    """A batch of 0 leaves nothing to compare, and onnxruntime 1.32 aborts the process on an
    LSTM given one (SIGABRT, no message: a trial's optimize and compare): refused in one line
    where arrays are compared, accepted where they only feed a run."""
    from onnx_cinm.golden import check_given_inputs

    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n", 3])])
    m = h.make_model(g)
    empty = {"x": np.zeros((0, 3), np.float32)}
    check_given_inputs(m, empty)  # a run may take it
    with pytest.raises(CinmError, match=r"^--input 'x' has shape \[0, 3\]: a dimension of size 0 "
                       "leaves nothing to compute or compare"):
        check_given_inputs(m, empty, empty_ok=False)


def test_compare_widens_atol_for_the_steps_of_the_arrays_compared():
    """compare(feeds=...) with no dims: an LSTM of symbolic length T (64 units) run on 300-step
    arrays is judged with k = 300 x (4 + 64), the sizes of the arrays, not 1 x (4 + 64) (the
    CLI passes them as dims; a Python caller need not)."""
    from onnx_cinm.golden import accumulation_atol, compare, run_onnxruntime

    rng = np.random.default_rng(0)
    m = _model([h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=64)],
               [_vi("x", TP.FLOAT, ["T", 2, 4])], [_vi("y", TP.FLOAT, ["T", 1, 2, 64])],
               [nh.from_array(rng.standard_normal((1, 256, 4)).astype(np.float32), "W"),
                nh.from_array(rng.standard_normal((1, 256, 64)).astype(np.float32), "R")])
    x = rng.standard_normal((300, 2, 4)).astype(np.float32)
    report = compare(m, m, feeds=[{"x": x}])
    k = 300 * (4 + 64)
    y = run_onnxruntime(m, {"x": x})[0]
    assert accumulation_atol(y, k) > 1e-5  # wide enough to be the atol the check keeps
    assert report.ok and report.outputs[0].k == k and report.outputs[0].widened_by == "sum"
    assert report.outputs[0].atol == pytest.approx(accumulation_atol(y, k))


def test_run_refuses_an_empty_array_into_an_lstm_onnxruntime_runs(tmp_path, capsys):
    """An LSTM with HardSigmoid gates stays an ONNX LSTM in onnxruntime, which aborts the
    process on a batch of 0: run refuses the array in one line (exit 1); a model without a
    recurrent op still runs it."""
    from onnx_cinm import artifacts, optimize
    from onnx_cinm.cli import main

    rng = np.random.default_rng(0)
    m = _model([h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3,
                            activations=["HardSigmoid", "Tanh", "Tanh"])],
               [_vi("x", TP.FLOAT, [5, "N", 4])], [_vi("y", TP.FLOAT, [5, 1, "N", 3])],
               [nh.from_array(rng.standard_normal((1, 12, 4)).astype(np.float32), "W"),
                nh.from_array(rng.standard_normal((1, 12, 3)).astype(np.float32), "R")])
    out = tmp_path / "l.onnx"
    artifacts.save(optimize(m, check=0).model, out)
    x0 = tmp_path / "x0.npy"
    np.save(x0, np.zeros((5, 0, 4), np.float32))
    assert main(["run", str(out), "--input", f"x={x0}"]) == 1
    assert "'x' has shape [5, 0, 4]: a dimension of size 0" in capsys.readouterr().err
    relu = _model([h.make_node("Relu", ["x"], ["y"])], [_vi("x", TP.FLOAT, [5, "N", 4])],
                  [_vi("y", TP.FLOAT, [5, "N", 4])], [])
    out = tmp_path / "r.onnx"
    artifacts.save(optimize(relu, check=0).model, out)
    assert main(["run", str(out), "--input", f"x={x0}"]) == 0


def test_onnxruntime_all_level_runs_in_a_child_that_may_crash(tmp_path, monkeypatch):
    # onnxruntime 1.32's ORT_ENABLE_ALL optimizers segfaulted on a QDQ model its own
    # quantize_static made (trial s36): optimize died with exit 139 and no word, for a figure
    # given only for scale. The session now runs in a child process: its outputs are those of
    # the same session in this process, and a crash is one CinmError naming the signal.
    import onnxruntime as ort

    from onnx_cinm import golden

    rng = np.random.default_rng(4)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["y"]),
                      h.make_node("Tanh", ["y"], ["t"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [3, 8])],
                     [h.make_tensor_value_info("t", TP.FLOAT, [3, 4])],
                     [nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
                      nh.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    here = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for given in (model, str(tmp_path / "m.onnx")):
        child = golden._run_in_child(given, feeds, "ORT_ENABLE_ALL")
        assert len(child) == 1 and np.array_equal(child[0], here[0])
    monkeypatch.setattr(golden, "_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(CinmError, match=r"ORT_ENABLE_ALL session crashed \(SIGSEGV\)"):
        golden.onnxruntime_self_difference(model, feeds)
