"""What the passes share instead of redoing: the tensor infos of the annotating passes
(placement, cim_tiling, cnm_mapping, device_lowering), inferred once per pipeline run, with the
same result as inferring them in every pass; option specs computed once per declaration."""
from __future__ import annotations

import onnx
import pytest

from onnx_cinm import examples, options
from onnx_cinm.passes import PassContext, PassManager, pass_options

ANNOTATING = ["placement", "cim_tiling", "cnm_mapping", "device_lowering"]


def _to_cinm(name: str):
    model = examples.get_example(name)
    ctx = PassContext(options={"cim_preset": "pcm-occ"})
    model = PassManager(stop_after="cinm").run(model, ctx)
    return model, ctx


def _inferences(monkeypatch) -> list:
    calls: list = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("example", ["lenet", "mlp"])
def test_annotating_passes_infer_shapes_once(monkeypatch, example):
    """The four annotating passes ran onnx shape inference once each (4 per optimize); they
    now share one inference, and write exactly the model they wrote with an inference each."""
    shared, ctx = _to_cinm(example)
    fresh, ctx_fresh = _to_cinm(example)
    calls = _inferences(monkeypatch)
    PassManager(pipeline=ANNOTATING).run(shared, ctx)
    assert len(calls) == 1
    for name in ANNOTATING:  # one pass per manager run: the manager forgets nothing in between,
        ctx_fresh.forget_infos()  # so forget by hand to infer afresh in every pass
        PassManager(pipeline=[name]).run(fresh, ctx_fresh)
    assert len(calls) - 1 >= 3  # every pass with nodes of its level inferred on its own
    assert shared.SerializeToString(deterministic=True) == fresh.SerializeToString(deterministic=True)
    assert any(a.name == "device" for n in shared.graph.node for a in n.attribute)


def test_a_rewriting_pass_makes_the_infos_stale(monkeypatch):
    """After a pass that may change shapes (to_cinm), the next annotating pass infers again."""
    model = examples.get_example("lenet")
    ctx = PassContext(options={"cim_preset": "pcm-occ"})
    model = PassManager(stop_after="fold_batchnorm").run(model, ctx)
    ctx.tensor_infos(model)  # cached before to_cinm rewrites the graph
    calls = _inferences(monkeypatch)
    PassManager(pipeline=["to_cinm", "placement"]).run(model, ctx)
    assert len(calls) == 2  # to_cinm's own and placement's, not the stale cache


def test_option_specs_are_computed_once(monkeypatch):
    """``specs`` read the type hints of every field on every call (placement called it per op,
    seconds on DenseNet121); now once per declaration, and each caller gets its own dict."""
    cls = pass_options.PlacementOptions
    first = options.specs(cls, "", "placement")
    hints = []
    real = options.typing.get_type_hints
    monkeypatch.setattr(options.typing, "get_type_hints", lambda *a, **k: hints.append(1) or real(*a, **k))
    second = options.specs(cls, "", "placement")
    assert hints == [] and second == first and second is not first
    second.clear()
    assert options.specs(cls, "", "placement") == first


@pytest.mark.parametrize("check, copied", [("0", False), ("1", True)])
def test_cli_optimize_rewrites_the_loaded_model_in_place(tmp_path, monkeypatch, check, copied):
    """``onnx-cinm optimize --check 0`` loaded the model, then optimize() copied it (a second copy
    of every weight, held to the end); now optimize() loads it and rewrites that one. With a
    check the original is still needed, so the passes work on a copy."""
    from onnx_cinm import artifacts, frontend
    from onnx_cinm.cli import main

    path = tmp_path / "mlp.onnx"
    onnx.save(examples.get_example("mlp"), path)
    loaded, saved = [], []
    real_load, real_save = frontend.load_model, artifacts.save
    monkeypatch.setattr(frontend, "load_model", lambda p: loaded.append(real_load(p)) or loaded[-1])
    monkeypatch.setattr(artifacts, "save", lambda m, *a, **k: saved.append(m) or real_save(m, *a, **k))
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--check", check,
                 "--cim-preset", "pcm-occ", "-q"]) == 0
    assert len(loaded) == 1 and len(saved) == 1
    assert (saved[0] is not loaded[0]) == copied


def test_normalize_transposes_constant_weights_without_a_session(monkeypatch):
    """A Gemm with transB on a constant weight: the transposed weight is computed by numpy, not
    by an onnxruntime session (which held the weight, its transpose and the returned copy at
    once), and it is exactly W.T; the model computes what onnxruntime computes on the original."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnx_cinm.golden import run_onnxruntime
    from onnx_cinm.passes import canonicalize

    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 32)).astype(np.float32)  # [N, K]: transB
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    want = run_onnxruntime(model, {"x": x})[0]
    sessions = []
    real = canonicalize._run_nodes
    monkeypatch.setattr(canonicalize, "_run_nodes", lambda *a: sessions.append(a) or real(*a))
    out = canonicalize.normalize(model, PassContext())
    assert sessions == []
    (gemm,) = out.graph.node
    assert [a.name for a in gemm.attribute] == []
    (bt,) = [t for t in out.graph.initializer if t.name == gemm.input[1]]
    np.testing.assert_array_equal(numpy_helper.to_array(bt), w.T)
    assert [t.name for t in out.graph.initializer] == [gemm.input[1]]  # w itself is gone
    np.testing.assert_allclose(run_onnxruntime(out, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, perm", [((300, 130), [1, 0]), ((129, 1), None), ((1, 1000), [1, 0]),
                                         ((5,), [0]), ((2, 3, 4), [2, 0, 1]), ((2, 3, 4), None)])
def test_constant_transpose_matches_numpy(shape, perm):
    """The folded Transpose (tiled for matrices, partial tiles included) is numpy's transpose,
    C-ordered."""
    import numpy as np
    from onnx import helper, numpy_helper

    from onnx_cinm.passes.canonicalize import _transpose_value

    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    node = helper.make_node("Transpose", ["a"], ["b"], **({"perm": perm} if perm else {}))
    got = _transpose_value(node, numpy_helper.from_array(a, "a"))
    np.testing.assert_array_equal(got, np.transpose(a, perm))
    assert got.flags.c_contiguous


@pytest.mark.parametrize("fill, shape, perm", [(0.02, (300, 130), [1, 0]), (-0.0, (2, 3, 4), [2, 0, 1]),
                                               (7, (3, 5), None)])
def test_a_splat_weight_is_filled_and_transposed_without_arrays(fill, shape, perm):
    """A ConstantOfShape weight (the light models') read transposed by a Gemm folds to the
    value numpy fills and transposes, bit for bit (-0.0 stays -0.0), the transposed one
    stored as the very bytes of the fill (no array filled or permuted)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from onnx_cinm.passes import PassContext
    from onnx_cinm.passes.canonicalize import _transpose_value, fold_constants
    from onnx_cinm.rewrite import is_splat

    value = np.array([fill], np.float32 if isinstance(fill, float) else np.int64)
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    fill_node = helper.make_node("ConstantOfShape", ["s"], ["w"], value=numpy_helper.from_array(value))
    g = helper.make_graph([fill_node], "g", [], [helper.make_tensor_value_info("w", elem, None)],
                          [numpy_helper.from_array(np.array(shape, np.int64), "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    fold_constants(model, PassContext())  # w: an initializer now, as after the light models' fold
    want = np.full(shape, value[0])
    [w] = [t for t in model.graph.initializer if t.name == "w"]
    assert numpy_helper.to_array(w).tobytes() == want.tobytes()
    # then a Transpose of it (normalize's, for a Gemm's transB) folds by the splat path
    model.graph.node.append(helper.make_node("Transpose", ["w"], ["wt"], **({"perm": perm} if perm else {})))
    model.graph.output[0].name = "wt"
    fold_constants(model, PassContext())
    [t] = [t for t in model.graph.initializer if t.name == "wt"]
    want_t = np.transpose(want, perm)
    got = numpy_helper.to_array(t)
    assert got.dtype == want_t.dtype and got.shape == want_t.shape
    assert got.tobytes() == np.ascontiguousarray(want_t).tobytes()
    assert [i.name for i in model.graph.initializer] == ["wt"]  # w renamed: nothing else read it
    # w read by something else too (a graph output): kept as it is, its transpose added
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], **({"perm": perm} if perm else {}))], "g", [],
        [helper.make_tensor_value_info("wt", elem, None), helper.make_tensor_value_info("w", elem, None)],
        [numpy_helper.from_array(want, "w")]), opset_imports=[helper.make_opsetid("", 17)])
    fold_constants(model, PassContext())
    got = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert sorted(got) == ["w", "wt"] and got["w"].shape == want.shape
    assert got["wt"].shape == want_t.shape and got["wt"].tobytes() == want_t.tobytes()
    # the splat check itself: one differing element (at the end, past the first chunk), or
    # -0.0 among 0.0, is not a splat
    big = np.zeros(1 << 20, np.float32)
    assert is_splat(big)
    big[-1] = -0.0
    assert not is_splat(big)
    node = helper.make_node("Transpose", ["a"], ["b"])
    a = np.full((3, 4), 1.5, np.float32)
    np.testing.assert_array_equal(_transpose_value(node, numpy_helper.from_array(a, "a")), a.T)


def test_fold_layouts_keeps_the_shared_infos(monkeypatch):
    """fold_layouts drops the Transpose after each crossbar Gemm (the Gemm writes that tensor
    itself, same shape): the passes after it reuse the infos instead of inferring every shape
    again, and write exactly the model they write when each infers afresh."""
    pipeline = ["placement", "fold_layouts", "cim_tiling", "cnm_mapping", "device_lowering"]
    shared, ctx = _to_cinm("lenet")
    fresh, ctx_fresh = _to_cinm("lenet")
    for c in (ctx, ctx_fresh):  # the paper's rule puts both convolutions on the crossbars
        c.options["placement"] = "heuristic"
    calls = _inferences(monkeypatch)
    PassManager(pipeline=pipeline).run(shared, ctx)
    assert ctx.stats["fold_layouts"]["folded"] == 2  # lenet's two convolutions
    assert len(calls) == 1
    for name in pipeline:
        ctx_fresh.forget_infos()
        PassManager(pipeline=[name]).run(fresh, ctx_fresh)
    assert len(calls) - 1 >= 4
    assert shared.SerializeToString(deterministic=True) == fresh.SerializeToString(deterministic=True)


@pytest.mark.parametrize("example", ["lenet", "mlp"])
def test_optimize_keeps_the_passes_types_instead_of_a_final_inference(monkeypatch, example):
    """The passes' last tensor infos are of the written graph, every type static: optimize
    keeps them rather than inferring the whole graph once more, and writes the very model the
    final inference wrote (that inference, forced, is the reference)."""
    from onnx_cinm import frontend, pipeline

    model = examples.get_example(example)
    static = {vi.name: [2] + [d.dim_value for d in vi.type.tensor_type.shape.dim[1:]]
              for vi in model.graph.input}  # the batch dim sized: every shape static
    kept = []
    real = frontend.keep_inferred_types
    monkeypatch.setattr(frontend, "keep_inferred_types", lambda m: kept.append(real(m)) or kept[-1])
    fast = pipeline.optimize(model, check=0, totals=False, input_shapes=static)
    assert kept == [True]
    monkeypatch.setattr(frontend, "keep_inferred_types", lambda m: False)
    calls = _inferences(monkeypatch)
    slow = pipeline.optimize(model, check=0, totals=False, input_shapes=static)
    assert calls  # the final inference ran
    assert fast.model.SerializeToString() == slow.model.SerializeToString()


def test_optimize_infers_afresh_after_a_pass_that_changes_shapes(monkeypatch):
    """Stopped after to_cinm (it rewrites the graph; no annotating pass read the shapes after
    it), the passes' infos are not current: the final inference runs."""
    from onnx_cinm import frontend, pipeline

    asked = []
    monkeypatch.setattr(frontend, "keep_inferred_types", lambda m: asked.append(1) or True)
    calls = []
    real = frontend.infer_shapes
    monkeypatch.setattr(frontend, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    pipeline.optimize(examples.get_example("lenet"), check=0, stop_after="cinm")
    assert not asked and calls


def _static(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every symbolic input dim (the examples' batch) sized 2."""
    for vi in model.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.dim_value = 2
    return model


@pytest.mark.parametrize("name", ["lenet", "mlp", "light_squeezenet"])
def test_to_cinm_hands_on_the_types_onnx_infers(monkeypatch, light_model_paths, name):
    """to_cinm types the tensors between the ops it added (analysis.type_node_outputs), so
    placement reads its infos without inferring the whole graph: every node output is typed,
    each as onnx's own inference of the lowered graph (value_info emptied) types it, and the
    placement that follows runs no inference of its own."""
    from onnx_cinm import analysis

    if name.startswith("light_"):
        model = onnx.load(light_model_paths[name.removeprefix("light_")])
    else:
        model = _static(examples.get_example(name))
    ctx = PassContext(options={"cim_preset": "pcm-occ"})
    model = PassManager(stop_after="cinm").run(model, ctx)
    fresh = onnx.ModelProto()
    fresh.CopyFrom(model)
    del fresh.graph.value_info[:]
    fresh = onnx.shape_inference.infer_shapes(fresh, strict_mode=True)
    reference = {v.name: v.type for v in (*fresh.graph.value_info, *fresh.graph.output)}
    handed = {v.name: v.type for v in (*model.graph.value_info, *model.graph.output)}
    outputs = [o for n in model.graph.node for o in n.output if o]
    assert any(n.domain == "cinm" for n in model.graph.node)
    assert all(o in handed for o in outputs)
    for o in outputs:
        assert handed[o] == reference[o], o
    infos = analysis.tensor_infos(fresh, infer=False)
    calls = _inferences(monkeypatch)
    assert {k: (v.dtype, v.shape) for k, v in ctx.tensor_infos(model).items()} == \
        {k: (v.dtype, v.shape) for k, v in infos.items()}
    assert not calls


def test_to_cinm_leaves_an_open_dim_to_inference():
    """With the batch dim symbolic (lenet as written) no type is handed on: a fresh inference
    numbers open dims itself, so the new tensors stay untyped for it."""
    model = examples.get_example("lenet")
    model = PassManager(stop_after="cinm").run(model, PassContext(options={"cim_preset": "pcm-occ"}))
    typed = {v.name for v in (*model.graph.value_info, *model.graph.output)}
    assert any(o not in typed for n in model.graph.node for o in n.output)


def _value_info_model(declared: list, reshape: bool = False) -> onnx.ModelProto:
    """x[2, 64] (Reshape by a runtime shape first when ``reshape``) -> MatMul(w[64, 64]) -> m
    -> Relu -> y, with value_info typing m (or the reshaped r) ``declared``, as an exporter or
    a trace writes it."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    first = "r" if reshape else "x"
    nodes = [helper.make_node("MatMul", [first, "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])]
    if reshape:
        nodes.insert(0, helper.make_node("Reshape", ["x", "shape"], ["r"]))
        inputs.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    typed = helper.make_tensor_value_info("r" if reshape else "m", TensorProto.FLOAT, declared)
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(w, "w")], value_info=[typed])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _dims(model: onnx.ModelProto) -> dict:
    """{value_info name: dims, None for a dim without a value}."""
    return {v.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}


def test_optimize_infers_afresh_over_a_wrong_value_info_entry_of_the_input():
    """The input's value_info types m [2, 32] where x[2, 64] @ w[64, 64] is [2, 64]: inference
    keeps typed entries, so the passes' types carry it; the written model has m as numpy
    computes it and passes onnx's full check (it failed it when the passes' types were kept)."""
    import numpy as np

    from onnx_cinm import pipeline

    model = _value_info_model([2, 32])
    written = pipeline.optimize(model, check=0, totals=False).model
    assert _dims(written)["m"] == list(np.zeros((2, 64)).dot(np.zeros((64, 64))).shape)
    onnx.checker.check_model(written, full_check=True)


def test_optimize_does_not_keep_a_traced_size_inference_leaves_open():
    """A trace typed r = Reshape(x, shape) [2, 64]; the shape is a runtime input, so a fresh
    inference of the model without that entry leaves r's rows (and so m's) open: the written
    model leaves them open too, not sized by the trace (m's columns: w's 64)."""
    from onnx_cinm import pipeline

    model = _value_info_model([2, 64], reshape=True)
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    fresh = _dims(onnx.shape_inference.infer_shapes(bare))
    assert fresh["r"][0] is None and fresh["m"][0] is None  # onnx leaves the rows open
    written = _dims(pipeline.optimize(model, check=0, totals=False).model)
    assert written["r"][0] is None and written["m"] == [None, 64]


@pytest.mark.parametrize("value", [7, 0.25, "upmem", [1, 2, 3], [0.5, 1e-12, float("inf")],
                                   ["x", "y_é"], [1, 2.5], (3, 4)])
def test_plan_attributes_are_the_protos_make_attribute_builds(value):
    """A plan's attributes written directly (ints, floats, strings, lists of one of them) are
    byte for byte what onnx.helper.make_attribute builds, and so is its fallback (a mixed list,
    a tuple)."""
    from onnx import helper

    from onnx_cinm.passes.device_lowering import _add_attribute

    node = onnx.NodeProto(op_type="Gemm")
    _add_attribute(node, "a", value)
    assert node.attribute[0].SerializeToString() == \
        helper.make_attribute("a", value).SerializeToString()
