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
from onnx_cinm.golden import run_onnxruntime


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
    # the way to size them, for the CLI and for this API (the hint named only the CLI flag)
    assert "--dim batch=SIZE (Python: optimize(..., dims={'batch': SIZE}))" in res.summary()
    sized = optimize(m, placement="heuristic", check=0, dims={"batch": 2, "height": 8, "width": 8})
    assert "taken as 1" not in sized.summary()
    # fixed by --overwrite-input-shape: said as --dim says its sizes (s35 trial)
    static = optimize(m, input_shapes={"images": [1, 3, 8, 8]}, check=0)
    assert "taken as 1" not in static.summary()
    assert " (at batch=1, height=8, width=8)" in static.summary()


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


def _attention_block(heads=4, width=64, table=128, dtype=np.float32):
    """x[batch, seq, width] + a position table cut to the sequence (``Slice(ids, 0,
    Shape(x)[1])``, which onnx's shape inference leaves anonymous), then one attention layer whose
    heads come from ``Reshape(q, Concat(Shape(q)[:2], [heads, -1]))`` and go back through
    ``Reshape [0, 0, -1]``: the pattern of exported transformers (MiniLM, BERT)."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return nh.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype), name)

    def i64(name, value):
        return nh.from_array(np.array(value, dtype=np.int64), name)

    inits = [w("wq", width, width), w("wk", width, width), w("wv", width, width), w("wo", width, width),
             w("pos", table, width), i64("ids", np.arange(table)[None]), i64("zero", [0]), i64("two", [2]),
             i64("one", 1), i64("ax0", [0]), i64("ax1", [1]), i64("heads", [heads, -1]),
             i64("flat", [0, 0, -1])]
    n = h.make_node
    nodes = [n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "one"], ["seq"]),
             n("Unsqueeze", ["seq", "ax0"], ["seq1"]),
             n("Slice", ["ids", "zero", "seq1", "ax1"], ["pid"]),
             n("Gather", ["pos", "pid"], ["p"]), n("Add", ["x", "p"], ["xp"]),
             n("Shape", ["xp"], ["s"]), n("Slice", ["s", "zero", "two"], ["bs"]),
             n("Concat", ["bs", "heads"], ["hshape"], axis=0)]
    for t in "qkv":
        nodes += [n("MatMul", ["xp", f"w{t}"], [t]), n("Reshape", [t, "hshape"], [f"{t}h"])]
    nodes += [n("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]), n("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
              n("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
              n("MatMul", ["qt", "kt"], ["scores"]), n("Softmax", ["scores"], ["probs"], axis=-1),
              n("MatMul", ["probs", "vt"], ["ctx"]), n("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ct", "flat"], ["c"]), n("MatMul", ["c", "wo"], ["y"])]
    elem = nh.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = h.make_graph(nodes, "attention", [h.make_tensor_value_info("x", elem, ["batch", "seq", width])],
                     [h.make_tensor_value_info("y", elem, ["batch", "seq", width])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _attention_flops(seq, batch=1, width=64, heads=4):
    """By hand: four width x width projections, scores and context (heads x seq x seq x
    width/heads MACs each), the position Add (1 per element), Softmax (5 per element)."""
    projections = 4 * 2 * batch * seq * width * width
    attention = 2 * 2 * batch * heads * seq * seq * (width // heads)
    return projections + attention + batch * seq * width + 5 * batch * heads * seq * seq


def test_anonymous_dims_behind_shape_arithmetic_are_sized():
    """onnx leaves the Slice bounded by Shape(x)[1] anonymous (unk__0); at batch 1 the Add
    broadcasts 1 against it, so batch, the head width and the Reshape [0, 0, -1] width were
    all planned as 1: 200448 FLOPs instead of 280320, scores' K of 1."""
    from onnx_cinm import analysis

    res = optimize(_attention_block(), dims={"batch": 1, "seq": 8}, placement="heuristic")
    assert res.flops_total == _attention_flops(8) == 280_320
    infos = analysis.tensor_infos(res.model)
    assert infos["ctx"].shape == (1, 4, 8, 16) and infos["c"].shape == (1, 8, 64)
    assert res.anonymous_dims == {} and "could not size" not in res.summary()
    assert res.check.ok


def test_a_matmul_takes_its_reduction_length_from_its_constant_operand():
    """Without sizes the Reshape [0, 0, -1] width cannot be computed; the output projection's
    K is then the constant weight's 64 rows, not 1 (24804 FLOPs before). The head width stays
    unknown without sizes (taken as 1: scores and context count 2 * 2 * 4 heads instead of
    x 16), and the summary names the dims it could not size."""
    res = optimize(_attention_block(), placement="heuristic", check=0)
    assert res.flops_total == _attention_flops(1) - 2 * 2 * 4 * (16 - 1) == 32_868
    assert "dims left unsized (taken as 1; most follow from the unsized inputs' dims): " in res.summary()


def test_the_summary_names_a_dim_shape_inference_cannot_size():
    """NonZero's count is data-dependent: no size makes it known, so the summary says so."""
    w = nh.from_array(np.ones((2, 8), np.float32), "w")
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Cast", ["nz"], ["f"], to=TP.FLOAT),
             h.make_node("Transpose", ["f"], ["ft"]), h.make_node("MatMul", ["ft", "w"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [4, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], [w])
    res = optimize(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10), check=0)
    dim, tensor = next(iter(res.anonymous_dims.items()))
    assert tensor == "nz" and dim.startswith("unk__")
    assert f"dims shape inference could not size (taken as 1): {dim} (of 'nz')" in res.summary()


def test_compare_after_overwrite_input_shape_needs_no_dim(tmp_path, capsys):
    """The baked-in shape sizes the original's symbolic dims: compare drew the original's
    inputs at height = width = 8 and the optimized model refused them."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--overwrite-input-shape",
                 "images:2,3,16,16"]) == 0
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--rtol", "1e-3", "--atol", "1e-3"]) == 0
    assert "2x32x8x8" in capsys.readouterr().out


def test_compare_after_overwrite_input_shape_with_one_name_for_two_dims(tmp_path, capsys):
    """Height and width both named '?' (PP-OCR's classifier, as exported) and baked to 8 x 24:
    the name sized both dims alike, so compare drew 8 x 8 and the optimized model refused it
    (a reviewer's finding); the baked shape is now drawn whole."""
    m = _dynamic_convnet()
    for d, name in zip(m.graph.input[0].type.tensor_type.shape.dim, ["?", None, "?", "?"]):
        if name:
            d.dim_param = name
    m.graph.output[0].type.tensor_type.shape.Clear()
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--overwrite-input-shape",
                 "images:1,3,8,24"]) == 0
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--rtol", "1e-3", "--atol", "1e-3"]) == 0
    printed = capsys.readouterr().out
    assert "1x32x4x12" in printed and "NaN/Inf check: 1 run" in printed


def _two_inputs():
    """a[batch, n] + b[batch, n] -> Relu."""
    nodes = [h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(x, TP.FLOAT, ["batch", "n"]) for x in "ab"],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["batch", "n"])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_run_draws_the_missing_inputs_at_the_given_arrays_sizes(tmp_path, capsys):
    """Planned at n=4, run --input a=[3, 16] drew b at [1, 4] and onnxruntime refused the Add."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_two_inputs(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--dim", "n=4"]) == 0
    np.savez(tmp_path / "part.npz", a=np.ones((3, 16), np.float32))
    capsys.readouterr()
    assert main(["run", str(out), "--input", str(tmp_path / "part.npz")]) == 0
    assert "output y: float32 [3, 16]" in capsys.readouterr().out


def test_run_at_other_sizes_says_the_modeled_figures_are_the_planned_ones(tmp_path, capsys):
    """The profile's modeled figures come from the plans made at the planned sizes: a run at
    other sizes printed them as if they were this run's."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--placement", "heuristic",
                 "--dim", "height=32", "--dim", "width=32"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--profile"]) == 0
    assert "note: this run had" not in capsys.readouterr().out
    assert main(["run", str(out), "--profile", "--dim", "batch=2", "--dim", "height=8"]) == 0
    text = capsys.readouterr().out
    assert ("note: this run had batch=2, height=8, but the model was planned at batch=1, "
            "height=32: the modeled figures") in text
    assert "optimize again with --dim batch=2 --dim height=8 to cost these" in text


def test_run_takes_an_unsized_dim_at_the_size_it_was_planned_at(tmp_path, capsys):
    """optimize without --dim plans every symbolic dim at 1; run drew height and width at 8
    (the random inputs' default off axis 0) and then noted that its run was not the planned
    one. The Convs keep the size (pad 1, then stride 2 of 1 -> 1)."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--placement", "heuristic"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--profile"]) == 0
    text = capsys.readouterr().out
    assert "output y: float32 [1, 32, 1, 1]" in text
    assert "note: this run had" not in text
    assert main(["run", str(out), "--dim", "height=8"]) == 0  # a size given still wins
    assert "output y: float32 [1, 32, 4, 1]" in capsys.readouterr().out


def test_run_of_a_model_too_small_at_its_planned_sizes(tmp_path, capsys):
    """A 3x3 Conv without padding cannot run at height = width = 1 (the sizes optimize planned
    at without --dim): run says so and runs at the random inputs' sizes (8: 8 - 3 + 1 = 6);
    --dim height=1 itself is a one-line error, not the numpy kernel's ValueError."""
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["batch", 3, "height", "width"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["batch", 4, "h", "w"])], [w])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--check", "0"]) == 0
    capsys.readouterr()
    assert main(["run", str(out)]) == 0
    got = capsys.readouterr()
    assert "output y: float32 [1, 4, 6, 6]" in got.out
    assert got.err.startswith("onnx-cinm: note: the model does not run with batch, height, width "
                              "at 1, the size its plans took (node 'conv/Im2Col' on host failed")
    assert main(["run", str(out), "--dim", "height=1"]) == 1
    # the random inputs' sizes do not run either (height 1 given): the error alone, no note
    # blaming the sizes before it (trial s36b: a note before an unrolled model's length error)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("onnx-cinm: error: node 'conv/Im2Col' on host "
                                               "failed: Im2Col: ")


def test_a_dim_given_arrays_size_otherwise_is_said(tmp_path, capsys):
    """run/compare fed the [1, 3, 8, 8] array and ignored --dim height=16 without a word;
    optimize planned at 16 and checked at 8, silently too."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32))
    feed = ["--input", f"images={tmp_path / 'x.npy'}"]
    assert main(["optimize", str(src), "-o", str(out), "--dim", "height=16"] + feed) == 0
    assert capsys.readouterr().err.strip() == (
        "onnx-cinm: warning: --dim height=16 and --input 'images' (height=8) differ: planned at "
        "height=16, checked on the array at height=8")
    # -q prints nothing but errors (its help): not this warning either (a fresh user, s27)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--dim", "height=16"] + feed) == 0
    assert capsys.readouterr() == ("", "")
    for cmd in (["run", str(out)], ["compare", str(src), str(out)]):
        assert main(cmd + feed + ["--dim", "height=16"]) == 1
        assert capsys.readouterr().err.strip() == (
            "onnx-cinm: error: --dim height=16 conflicts with --input 'images', whose height is 8; "
            "drop the --dim or give an array of that size")
        assert main(cmd + feed + ["--dim", "height=8"]) == 0  # agreeing sizes: nothing to say
        assert capsys.readouterr().err == ""


def test_the_labeled_archive_evaluate_takes_feeds_run_and_compare(tmp_path, capsys):
    """run --input data.npz refused evaluate's archive: "--input 'labels' is not an input"."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", images=x, labels=np.array([3, 1]))
    np.save(tmp_path / "labels.npy", np.array([3, 1]))
    np.save(tmp_path / "x.npy", x)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--check", "0"]) == 0
    capsys.readouterr()
    note = (f"onnx-cinm: note: --input {tmp_path / 'data.npz'}: array 'labels' is not an input "
            "of the model (a labeled data set's labels, as evaluate takes them); ignored")
    assert main(["run", str(out), "--input", str(tmp_path / "data.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    assert capsys.readouterr().err.strip() == note
    want = run_onnxruntime(_dynamic_convnet(), {"images": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], want, rtol=1e-4, atol=1e-4)
    assert main(["compare", str(src), str(out), "--input", str(tmp_path / "data.npz")]) == 0
    assert capsys.readouterr().err.strip() == note
    # named explicitly, it is an input the model does not have: still refused
    assert main(["run", str(out), "--input", f"images={tmp_path / 'data.npz'}"]) == 1
    capsys.readouterr()
    assert main(["run", str(out), "--input", f"images={tmp_path / 'x.npy'}",
                 "--input", f"labels={tmp_path / 'labels.npy'}"]) == 1
    assert "is not an input of the model" in capsys.readouterr().err


def test_given_arrays_of_the_wrong_dtype_or_shape_are_one_clear_line(tmp_path, capsys):
    """compare --input with a float64 array printed onnxruntime's raw 'Unexpected input data
    type' and advised --dim."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--check", "0"]) == 0
    np.save(tmp_path / "x64.npy", np.zeros((1, 3, 8, 8)))
    np.save(tmp_path / "x4.npy", np.zeros((1, 4, 8, 8), np.float32))
    capsys.readouterr()
    for cmd in (["compare", str(src), str(out)], ["run", str(out)],
                ["optimize", str(src), "-o", str(tmp_path / "o2.onnx")]):
        assert main(cmd + ["--input", f"images={tmp_path / 'x64.npy'}"]) == 1
        err = capsys.readouterr().err
        assert err.strip() == ("onnx-cinm: error: --input 'images' holds float64, but the model's "
                               "input is float32 (convert it, e.g. numpy's a.astype(np.float32))")
        assert main(cmd + ["--input", f"images={tmp_path / 'x4.npy'}"]) == 1
        assert "--input 'images' has shape [1, 4, 8, 8], but the model's input is [batch, 3, height, width]" \
            in capsys.readouterr().err


def test_the_report_shows_the_planned_sizes_and_whole_names_and_reasons(tmp_path, capsys):
    """A fresh user's report: shapes 'unk__0x8x64' where the model records its sizes, layer
    names cut at 30 characters, reasons cut mid-text."""
    m = _attention_block()
    for node in m.graph.node:  # exporter-style long names
        node.name = f"/model/encoder/layer.0/attention/self/{node.op_type}_{node.output[0]}"
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--placement", "heuristic",
                 "--dim", "batch=1", "--dim", "seq=8"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "-o", str(tmp_path / "rep"), "--all-nodes"]) == 0
    text = capsys.readouterr().out
    assert "unk__" not in text
    rows = {line.split()[1]: line for line in text.splitlines() if "/model/encoder/" in line}
    name = "/model/encoder/layer.0/attention/self/Reshape_c"
    assert name in rows and " 1x8x64 " in rows[name]
    row = rows["/model/encoder/layer.0/attention/self/MatMul_scores/Gemm"]
    assert " 1x4x8x8 " in row
    placed = next(n for n in onnx.load(out).graph.node if n.name.endswith("MatMul_scores/Gemm"))
    why = next(h.get_attribute_value(a).decode() for a in placed.attribute if a.name == "placement")
    assert len(why) > 120 and row.rstrip().endswith(why)


def test_output_folders_are_created_but_never_a_chain_of_them(tmp_path, capsys):
    """report -o a/b/c created a/ and a/b/ while optimize -o a/b/c.onnx refused: every output
    folder is created only when its parent exists."""
    src = tmp_path / "m.onnx"
    onnx.save(_dynamic_convnet(), src)
    deep = tmp_path / "a" / "b" / "rep"
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--check", "0"]) == 0
    capsys.readouterr()
    for cmd in (["report", str(tmp_path / "o.onnx"), "-o", str(deep)],
                ["optimize", str(src), "-o", str(tmp_path / "o2.onnx"), "--report", str(deep)]):
        assert main(cmd) == 1
        assert capsys.readouterr().err.strip() == (
            f"onnx-cinm: error: cannot write the report into '{deep}': folder '{deep.parent}' "
            "does not exist")
        assert not (tmp_path / "a").exists() and not (tmp_path / "o2.onnx").exists()
    assert main(["report", str(tmp_path / "o.onnx"), "-o", str(tmp_path / "rep"), "-q"]) == 0
    assert (tmp_path / "rep" / "report.html").is_file()


def test_hbm_pim_takes_the_same_products_at_batch_one_as_at_batch_two():
    """FP16 MiniLM on HBM-PIM got 19 ops at batch 1 and 34 at batch 2: at batch 1 the Add
    broadcasting 1 against the anonymous position dim left batch, heads and widths unsized,
    and a product of unknown K is not an HBM-PIM GEMV. The only op that may differ is the
    position Add, which broadcasts at batch 2 (HBM-PIM takes same shapes or a scalar)."""
    from onnx_cinm.dialects import cinm

    m = _attention_block(width=256, dtype=np.float16)
    on = {}
    for batch in (1, 2):
        res = optimize(m, dims={"batch": batch, "seq": 32}, check=0, place=[("*", "hbm_pim")])
        on[batch] = {n.name: cinm.node_attrs(n) for n in res.model.graph.node if n.domain == "cinm"}
        assert res.flops_total == _attention_flops(32, batch, width=256)
    products = {b: sorted(k for k, a in on[b].items() if a["device"] == "hbm_pim" and k.endswith("Gemm"))
                for b in on}
    assert products[1] == products[2] == ["k/Gemm", "q/Gemm", "v/Gemm", "y/Gemm"]
    assert on[1]["xp/Add"]["device"] == "hbm_pim"
    assert on[2]["xp/Add"]["device"] == "host" and "broadcasting" in on[2]["xp/Add"]["placement"]


def test_optimize_plans_at_the_sizes_of_the_given_arrays():
    """optimize --input drew the check at the arrays' sizes but planned at 1."""
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    res = optimize(_dynamic_convnet(), inputs={"images": x}, placement="heuristic")
    assert res.flops_total == _flops_at(16)
    assert frontend.planned_dims(res.model) == {"batch": 1, "height": 16, "width": 16}
    assert res.check.ok and res.check.runs == 1
    res = optimize(_dynamic_convnet(), inputs={"images": x}, dims={"height": 8}, check=0)
    assert frontend.planned_dims(res.model) == {"batch": 1, "height": 8, "width": 16}


def test_profile_rows_say_whether_their_figures_are_this_runs_or_the_plans(tmp_path, capsys):
    """Trial finding 6: planned at batch 1, run at 8, one table held crossbar rows simulated at
    batch 8 and UPMEM 'model' rows at batch 1. Each row now carries its basis: 'run' rows
    change with the run's batch, 'plan' rows do not, and the note names both sizes."""
    from onnx_cinm.runtime.session import InferenceSession

    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_dynamic_convnet(), src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--placement", "heuristic",
                 "--dim", "batch=1", "--dim", "height=16", "--dim", "width=16"]) == 0
    rows = {}
    for batch in (1, 8):
        sess = InferenceSession(str(out))
        x = np.random.default_rng(0).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        sess.run(None, {"images": x})
        rows[batch] = {r["node"]: r for r in sess.profile() if r["device"] != "host"}
    bases = {r["device"]: r["basis"] for r in rows[8].values()}
    assert bases == {"memristor": "run", "upmem": "plan"}
    for node, r in rows[8].items():
        if r["basis"] == "plan":  # the plan's figure whatever the batch
            assert r["latency_s"] == rows[1][node]["latency_s"]
        else:  # counted on 8 times the rows of activations
            assert r["latency_s"] > rows[1][node]["latency_s"]
    np.save(tmp_path / "x8.npy", np.zeros((8, 3, 16, 16), np.float32))
    capsys.readouterr()
    assert main(["run", str(out), "--input", f"images={tmp_path / 'x8.npy'}", "--profile"]) == 0
    text = capsys.readouterr().out
    gemm = next(ln for ln in text.splitlines() if ln.startswith("conv1/Gemm"))
    im2col = next(ln for ln in text.splitlines() if ln.startswith("conv1/Im2Col"))
    assert " run " in gemm and " plan " in im2col
    assert ("run: counted on this run's inputs, at their sizes (batch=8); plan: the plan's "
            "figures, at the sizes the model was planned at (batch=1)") in text
    assert "the modeled figures of upmem (basis 'plan') are for the planned sizes; those of " \
           "memristor (basis 'run') were counted on this run's inputs" in text


def test_a_programmed_activation_at_another_batch_is_planned_again(tmp_path):
    """The scores product (two activations) on crossbars programs q at every inference, in
    [batch * heads] groups. Planned at batch 1 and run at batch 2 it failed in the simulator
    ('W: sidecar shape (8, 8, 16) != declared (4, 8, 16)'), then was refused in one line; now
    the kernel plans that shape again (trial s29, Kokoro): batch 2 and another seq give
    onnxruntime's result on the original, and the profile record names both shapes."""
    from onnx_cinm import artifacts
    from onnx_cinm.golden import run_onnxruntime
    from onnx_cinm.runtime import InferenceSession

    res = optimize(_attention_block(), dims={"batch": 1, "seq": 8}, check=0,
                   place=[("scores*", "memristor")])
    node = next(n for n in res.model.graph.node if n.output[0] == "scores")
    assert {a.name: h.get_attribute_value(a) for a in node.attribute}["device"] == b"memristor"
    artifacts.save(res.model, tmp_path / "att.onnx")
    sess = InferenceSession(tmp_path / "att.onnx")
    rng = np.random.default_rng(1)
    for shape in ((2, 8, 64), (1, 8, 64), (1, 12, 64)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0],
                                   run_onnxruntime(_attention_block(), {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)
    again = [r.get("replanned") for r in sess.profile() if r["node"] == node.name]
    assert again == [[[4, 16, 8], [8, 16, 8]], None, [[4, 16, 8], [4, 16, 12]]]
