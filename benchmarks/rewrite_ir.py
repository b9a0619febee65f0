"""Side-by-side: onnx-graphsurgeon vs onnx_ir as the graph IR the passes rewrite (issue 13).

Three measurements, in one run, printed as tables:

(a) round trip: ``import_onnx`` + ``export_onnx`` (graphsurgeon) vs ``ir.from_proto`` +
    ``ir.to_proto`` (onnx_ir) on the model ``to_cinm`` sees (the frontend passes' output) of a
    light VGG19 and of DenseNet121; median of ``--repeat`` runs, and the ratio gs / ir.
(b) a representative rewrite, the ``to_cinm`` lowering of MatMul/Gemm -> ``cinm.Gemm`` and
    Conv -> ``cinm.Im2Col`` + ``cinm.Gemm`` + ``Transpose`` (constant weights reshaped in numpy):
    find the nodes, build the replacements, rewire the uses, drop the dead weights; timed as
    import + rewrite + export. Each rewritten model is checked in onnxruntime against the
    original (the cinm ops run as their local-function reference bodies).
(c) fidelity of a round trip through each IR: local functions (the cinm reference bodies of a
    model optimized with ``stop_after='placement'``, with overloads and attribute references),
    node attributes of every type, external data (saved with ``save_as_external_data``, round
    tripped, compared byte for byte), ``value_info``, model and node ``metadata_props``.

Models: "light VGG19" is built here (VGG19's topology -- 16 conv3x3 + 5 max-pools + 3 FC -- with
the channel counts divided by 4 and 1024-wide FC layers, 224 x 224 input, about 35 MB of
weights); DenseNet121 is ``light_densenet121.onnx`` of the onnx wheel (its weights are
``ConstantOfShape`` and are folded by the frontend, about 32 MB).

    pip install 'onnx-graphsurgeon>=0.6.1,<0.7'   # compared here, no longer a dependency
    OMP_NUM_THREADS=1 python benchmarks/rewrite_ir.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

try:  # not a dependency of onnx-cinm any more (this benchmark is why)
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.logger import G_LOGGER
except ImportError:
    sys.exit("this benchmark compares against onnx-graphsurgeon: pip install 'onnx-graphsurgeon>=0.6.1,<0.7'")

from onnx_cinm import pipeline  # noqa: E402
from onnx_cinm.dialects import cinm  # noqa: E402
from onnx_cinm.passes import PassContext, PassManager  # noqa: E402

G_LOGGER.severity = G_LOGGER.ERROR  # its skipped-attribute warnings show in table (c)
LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
FRONTEND = ["canonicalize_opset", "fold_constants", "normalize", "fold_batchnorm"]


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------

def light_vgg19(div: int = 4, fc: int = 1024) -> onnx.ModelProto:
    """VGG19 (Simonyan & Zisserman 2014, configuration E): 2-2-4-4-4 conv3x3/pad 1 + Relu per
    stage, a 2x2 max-pool after each stage, then FC-FC-FC with Relu; channels 64..512 divided by
    ``div``, FC widths ``fc``, ``fc``, 1000. Opset 17, input ``x`` [1, 3, 224, 224]."""
    rng = np.random.default_rng(0)
    nodes, inits, x, cin = [], [], "x", 3
    for stage, (reps, ch) in enumerate(zip([2, 2, 4, 4, 4], [64, 128, 256, 512, 512])):
        c = ch // div
        for r in range(reps):
            n = f"conv{stage + 1}_{r + 1}"
            inits += [numpy_helper.from_array((rng.standard_normal((c, cin, 3, 3)) *
                                               np.sqrt(2 / (cin * 9))).astype(np.float32), f"{n}_w"),
                      numpy_helper.from_array((rng.standard_normal(c) * 0.01).astype(np.float32), f"{n}_b")]
            nodes += [helper.make_node("Conv", [x, f"{n}_w", f"{n}_b"], [n], name=n, pads=[1, 1, 1, 1],
                                       kernel_shape=[3, 3]),
                      helper.make_node("Relu", [n], [f"{n}_relu"], name=f"{n}_relu")]
            x, cin = f"{n}_relu", c
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{stage + 1}"], kernel_shape=[2, 2],
                                      strides=[2, 2], name=f"pool{stage + 1}"))
        x = f"pool{stage + 1}"
    nodes.append(helper.make_node("Flatten", [x], ["flat"], name="flatten"))
    x, fin = "flat", cin * 7 * 7
    for i, fout in enumerate([fc, fc, 1000]):
        n = f"fc{i + 6}"
        inits += [numpy_helper.from_array((rng.standard_normal((fin, fout)) *
                                           np.sqrt(2 / fin)).astype(np.float32), f"{n}_w"),
                  numpy_helper.from_array(np.zeros(fout, np.float32), f"{n}_b")]
        nodes.append(helper.make_node("Gemm", ["flat" if i == 0 else x, f"{n}_w", f"{n}_b"], [n], name=n))
        x, fin = n, fout
        if i < 2:
            nodes.append(helper.make_node("Relu", [n], [f"{n}_relu"], name=f"{n}_relu"))
            x = f"{n}_relu"
    g = helper.make_graph(nodes, "light_vgg19",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1000])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def frontend(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as ``to_cinm`` sees it: after the frontend passes."""
    return PassManager(pipeline=FRONTEND).run(model, PassContext())


def models() -> dict[str, onnx.ModelProto]:
    dense = onnx.load(str(LIGHT_DIR / "light_densenet121.onnx"))
    return {"light VGG19": frontend(light_vgg19()), "DenseNet121": frontend(dense)}


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) or numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


# ---------------------------------------------------------------------------------------------
# (b) the rewrite, once per IR
# ---------------------------------------------------------------------------------------------

def _conv_params(attrs: dict, wshape) -> tuple | None:
    """(kernel_shape, strides, pads, dilations) of a group-1 Conv with explicit pads, or None."""
    if attrs.get("group", 1) != 1 or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    r = len(wshape) - 2
    return (list(attrs.get("kernel_shape", wshape[2:])), list(attrs.get("strides", [1] * r)),
            list(attrs.get("pads", [0] * (2 * r))), list(attrs.get("dilations", [1] * r)))


def rewrite_gs(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = gs.import_onnx(model)
    for node in list(graph.nodes):
        if node.op in ("MatMul", "Gemm") and node.domain in (None, "", "ai.onnx"):
            if node.op == "Gemm" and any(node.attrs.get(k, d) != d for k, d in
                                         (("transA", 0), ("transB", 0), ("alpha", 1.0), ("beta", 1.0))):
                continue
            out = node.outputs[0]
            ins = list(node.inputs)
            node.outputs.clear()
            node.inputs.clear()
            graph.nodes.append(gs.Node("Gemm", name=f"{node.name}/Gemm", domain=cinm.DOMAIN,
                                       inputs=ins, outputs=[out]))
        elif node.op == "Conv" and isinstance(node.inputs[1], gs.Constant):
            w = node.inputs[1].values
            p = _conv_params(node.attrs, w.shape)
            if p is None:
                continue
            ks, st, pads, dl = p
            m, r = w.shape[0], len(w.shape) - 2
            x, out = node.inputs[0], node.outputs[0]
            bias = node.inputs[2:3]
            cols = gs.Variable(f"{node.name}_cols", dtype=x.dtype)
            gemm = gs.Variable(f"{node.name}_gemm", dtype=x.dtype)
            wm = gs.Constant(f"{node.name}_W_gemm", np.ascontiguousarray(w.reshape(m, -1).T))
            node.outputs.clear()
            node.inputs.clear()
            graph.nodes += [
                gs.Node("Im2Col", name=f"{node.name}/Im2Col", domain=cinm.DOMAIN, inputs=[x], outputs=[cols],
                        attrs={"kernel_shape": ks, "strides": st, "pads": pads, "dilations": dl}),
                gs.Node("Gemm", name=f"{node.name}/Gemm", domain=cinm.DOMAIN, inputs=[cols, wm, *bias],
                        outputs=[gemm]),
                gs.Node("Transpose", name=f"{node.name}/Transpose", inputs=[gemm], outputs=[out],
                        attrs={"perm": [0, r + 1] + list(range(1, r + 1))})]
    graph.cleanup().toposort()
    return gs.export_onnx(graph)


def rewrite_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    m = ir.from_proto(model)
    graph = m.graph
    for node in list(graph):
        if node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx"):
            a = node.attributes
            if node.op_type == "Gemm" and any(a[k].value != d for k, d in
                                              (("transA", 0), ("transB", 0), ("alpha", 1.0), ("beta", 1.0))
                                              if k in a):
                continue
            new = ir.Node(cinm.DOMAIN, "Gemm", list(node.inputs), name=f"{node.name}/Gemm")
            ir.convenience.replace_nodes_and_values(graph, node, [node], [new], node.outputs, new.outputs)
        elif node.op_type == "Conv" and node.inputs[1].const_value is not None:
            w = node.inputs[1].const_value.numpy()
            attrs = {k: v.value for k, v in node.attributes.items()}
            p = _conv_params(attrs, w.shape)
            if p is None:
                continue
            ks, st, pads, dl = p
            mm, r = w.shape[0], len(w.shape) - 2
            x = node.inputs[0]
            wm = ir.Value(name=f"{node.name}_W_gemm",
                          const_value=ir.tensor(np.ascontiguousarray(w.reshape(mm, -1).T)))
            graph.register_initializer(wm)
            im = ir.Node(cinm.DOMAIN, "Im2Col", [x], name=f"{node.name}/Im2Col",
                         attributes=[ir.AttrInt64s("kernel_shape", ks), ir.AttrInt64s("strides", st),
                                     ir.AttrInt64s("pads", pads), ir.AttrInt64s("dilations", dl)])
            gemm = ir.Node(cinm.DOMAIN, "Gemm", [im.outputs[0], wm, *node.inputs[2:3]], name=f"{node.name}/Gemm")
            tr = ir.Node("", "Transpose", gemm.outputs, name=f"{node.name}/Transpose",
                         attributes=[ir.AttrInt64s("perm", [0, r + 1] + list(range(1, r + 1)))])
            im.outputs[0].name, gemm.outputs[0].name = f"{node.name}_cols", f"{node.name}_gemm"
            ir.convenience.replace_nodes_and_values(graph, node, [node], [im, gemm, tr],
                                                    node.outputs, tr.outputs)
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        graph.initializers.pop(name)
    return ir.to_proto(m)


def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _check_rewrite(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> str:
    """Max abs difference of the rewritten model vs the original in onnxruntime, or 'FAIL ...'."""
    cinm.attach_functions(rewritten)
    n_cinm = sum(1 for n in rewritten.graph.node if n.domain == cinm.DOMAIN)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    feeds = {}
    for i in original.graph.input:
        dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    try:
        want = ort.InferenceSession(original.SerializeToString(), so).run(None, feeds)
        got = ort.InferenceSession(rewritten.SerializeToString(), so).run(None, feeds)
    except Exception as e:  # noqa: BLE001 -- report, do not stop the benchmark
        return f"FAIL ({str(e).splitlines()[0][:60]})"
    return f"{n_cinm} cinm ops, max|diff| {max(float(np.abs(a - b).max()) for a, b in zip(want, got)):.1e}"


# ---------------------------------------------------------------------------------------------
# (c) fidelity
# ---------------------------------------------------------------------------------------------

def fidelity_model() -> onnx.ModelProto:
    """The digits-sized MLP example optimized to the placement level (cinm ops, plan attributes,
    local functions with overloads and attribute references), plus a node with an attribute of
    every type, value_info, and model and node metadata_props."""
    from onnx_cinm.examples import get_example

    res = pipeline.optimize(get_example("lenet"), stop_after="placement", check=0)
    model = res.model
    g = model.graph
    t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "t")
    sub = helper.make_graph([helper.make_node("Identity", ["sx"], ["sy"])], "sub",
                            [helper.make_tensor_value_info("sx", TensorProto.FLOAT, [1])],
                            [helper.make_tensor_value_info("sy", TensorProto.FLOAT, [1])])
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"])
    node = helper.make_node("AllAttrs", [g.input[0].name], ["all_attrs_out"], name="all_attrs",
                            domain="test.attrs", f=1.25, i=-7, s="text", t=t, g=sub, floats=[0.5, 2.0],
                            ints=[1, -2, 3], strings=["a", "b"], tensors=[t, t], graphs=[sub, sub])
    node.attribute.extend([helper.make_attribute("tp", tp), helper.make_attribute("tps", [tp, tp])])
    node.metadata_props.add(key="node_note", value="kept?")
    node.doc_string = "a node with every attribute type"
    g.node.append(node)
    g.output.append(helper.make_tensor_value_info("all_attrs_out", TensorProto.FLOAT, None))
    model.opset_import.append(helper.make_opsetid("test.attrs", 1))
    model.metadata_props.add(key="model_note", value="kept?")
    model.doc_string = "fidelity model"
    return model


def sparse_attrs(rt) -> str:
    """Round trip a node with SPARSE_TENSOR and SPARSE_TENSORS attributes (no standard op but
    Constant's sparse_value uses them)."""
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.5], np.float32), "sv"),
                                       numpy_helper.from_array(np.array([2], np.int64), "si"), [4])
    node = helper.make_node("SparseAttrs", ["x"], ["y"], name="n", domain="test.attrs",
                            sparse_tensor=sparse, sparse_tensors=[sparse, sparse])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.attrs", 1)])
    try:
        out = rt(model)
    except Exception as e:  # noqa: BLE001
        c = e
        while c.__cause__ is not None:
            c = c.__cause__
        return f"raises {type(c).__name__}: {str(c).split('.')[0][:40]}"
    kept = {a.name for a in out.graph.node[0].attribute}
    return "kept" if kept == {"sparse_tensor", "sparse_tensors"} else f"dropped ({len(kept)} of 2 kept)"


def _by_name(items, key=lambda x: x.name) -> dict:
    return {key(x): x for x in items}


def _fn_bytes(f: onnx.FunctionProto) -> bytes:
    g = onnx.FunctionProto()
    g.CopyFrom(f)
    if not g.overload:
        g.ClearField("overload")
    return g.SerializeToString(deterministic=True)


def fidelity(rt, model: onnx.ModelProto) -> dict[str, str]:
    """What a round trip ``rt`` keeps of ``model``: {item: "kept" | what changed}."""
    try:
        out = rt(model)
    except Exception as e:  # noqa: BLE001
        return {"round trip": f"raises {type(e).__name__}: {str(e).splitlines()[0][:70]}"}
    res = {}
    # local functions: every function kept bit for bit (names, overloads, bodies, ref attrs);
    # an explicitly empty overload and an unset one are the same function
    want = _by_name(model.functions, lambda f: (f.domain, f.name, f.overload))
    got = _by_name(out.functions, lambda f: (f.domain, f.name, f.overload))
    lost = len(set(want) - set(got))
    differ = sum(1 for k in set(want) & set(got) if _fn_bytes(want[k]) != _fn_bytes(got[k]))
    res["local functions"] = (f"kept ({len(want)})" if not lost and not differ and len(got) == len(want)
                              else f"{lost} of {len(want)} lost (by name+overload), {differ} changed")
    # the overload a cinm node calls
    ov = {n.name: n.overload for n in model.graph.node}
    bad = sum(1 for n in out.graph.node if n.name in ov and n.overload != ov[n.name])
    res["node overloads"] = "kept" if not bad else f"{bad} nodes lost theirs"
    # attributes of every type
    a_in = _by_name(next(n for n in model.graph.node if n.name == "all_attrs").attribute)
    node_out = next((n for n in out.graph.node if n.name == "all_attrs"), None)
    a_out = _by_name(node_out.attribute) if node_out is not None else {}
    changed = [k for k in a_in if k not in a_out or a_in[k].SerializeToString(deterministic=True)
               != a_out[k].SerializeToString(deterministic=True)]
    res["attributes (11 types)"] = "kept" if not changed else f"changed/lost: {', '.join(changed)}"
    plan = [(n.name, a.name) for n in model.graph.node for a in n.attribute if n.domain == cinm.DOMAIN]
    out_nodes = _by_name(out.graph.node)
    res["cinm plan attributes"] = ("kept" if all(n in out_nodes and any(a.name == an for a in out_nodes[n].attribute)
                                                 for n, an in plan) else "lost")
    # value_info
    vi_in, vi_out = _by_name(model.graph.value_info), _by_name(out.graph.value_info)
    lost_vi = [k for k in vi_in if k not in vi_out or vi_in[k].type != vi_out[k].type]
    res["value_info"] = f"kept ({len(vi_in)})" if not lost_vi else f"{len(lost_vi)} of {len(vi_in)} lost/changed"
    res["model metadata_props"] = ("kept" if list(model.metadata_props) == list(out.metadata_props)
                                   else f"{len(out.metadata_props)} of {len(model.metadata_props)} kept")
    res["node metadata_props"] = ("kept" if node_out is not None and
                                  list(node_out.metadata_props) == list(next(
                                      n for n in model.graph.node if n.name == "all_attrs").metadata_props)
                                  else "lost")
    res["doc strings"] = ("kept" if out.doc_string == model.doc_string and node_out is not None
                          and node_out.doc_string == "a node with every attribute type" else "lost")
    init_in, init_out = _by_name(model.graph.initializer), _by_name(out.graph.initializer)
    res["initializers (bytes)"] = ("kept" if set(init_in) == set(init_out) and all(
        np.array_equal(numpy_helper.to_array(init_in[k]), numpy_helper.to_array(init_out[k]))
        and numpy_helper.to_array(init_in[k]).dtype == numpy_helper.to_array(init_out[k]).dtype
        for k in init_in) else "changed")
    res["node order"] = ("kept" if [n.name for n in model.graph.node] == [n.name for n in out.graph.node]
                         else "changed")
    res["whole model, bit for bit"] = ("identical" if model.SerializeToString(deterministic=True)
                                       == out.SerializeToString(deterministic=True) else "differs")
    return res


def external_data(rt_path, model: onnx.ModelProto, tmp: Path) -> str:
    """Save ``model`` with external data, round trip the file through ``rt_path(src, dst)``,
    reload and compare every initializer's values and the bytes of the data file."""
    src, dst = tmp / "src" / "m.onnx", tmp / "dst" / "m.onnx"
    src.parent.mkdir(exist_ok=True)
    dst.parent.mkdir(exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model(save_as_external_data=True) turns the tensors it saves external
    onnx.save_model(copy, str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.data", size_threshold=256)
    try:
        rt_path(src, dst)
    except Exception as e:  # noqa: BLE001
        return f"raises {type(e).__name__}: {str(e).splitlines()[0][:60]}"
    a = onnx.load(str(src))
    b = onnx.load(str(dst))
    ext_b = sum(1 for t in onnx.load(str(dst), load_external_data=False).graph.initializer
                if t.data_location == TensorProto.EXTERNAL)
    ia, ib = _by_name(a.graph.initializer), _by_name(b.graph.initializer)
    same = set(ia) == set(ib) and all(np.array_equal(numpy_helper.to_array(ia[k]), numpy_helper.to_array(ib[k]))
                                      for k in ia)
    files = sorted(p.name for p in dst.parent.iterdir())
    return (f"values {'equal' if same else 'DIFFER'}, {ext_b} of {len(ia)} tensors external "
            f"after, files {files}")


def _gs_rt(model):
    return gs.export_onnx(gs.import_onnx(model))


def _gs_rt_path(src: Path, dst: Path) -> None:
    # gs has no file API: load (with the data), round trip, save as external again
    onnx.save_model(_gs_rt(onnx.load(str(src))), str(dst), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.data", size_threshold=256)


def _ir_rt(model):
    return ir.to_proto(ir.from_proto(model))


def _ir_rt_path(src: Path, dst: Path) -> None:
    # the data stays on disk until saved (ir.ExternalTensor is lazy)
    ir.save(ir.load(str(src)), str(dst), external_data="m.data")


# ---------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement (median shown)")
    args = ap.parse_args()
    print(f"onnx-graphsurgeon {gs.__version__}, onnx_ir {ir.__version__}, onnx {onnx.__version__}; "
          f"median of {args.repeat}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}\n")
    rows = []
    for name, model in models().items():
        n = len(model.graph.node)
        rt_gs, _ = _median(lambda: _gs_rt(model), args.repeat)
        rt_ir, _ = _median(lambda: _ir_rt(model), args.repeat)
        rw_gs, out_gs = _median(lambda: rewrite_gs(model), args.repeat)
        rw_ir, out_ir = _median(lambda: rewrite_ir(model), args.repeat)
        rows.append((name, n, weight_bytes(model), rt_gs, rt_ir, rw_gs, rw_ir,
                     _check_rewrite(model, out_gs), _check_rewrite(model, out_ir)))
    print("(a) round trip (import + export) and (b) rewrite (import + MatMul/Gemm/Conv lowering + export), ms")
    print(f"{'model':<13} {'nodes':>5} {'weights':>8}  {'rt gs':>7} {'rt ir':>7} {'gs/ir':>5}  "
          f"{'rw gs':>7} {'rw ir':>7} {'gs/ir':>5}")
    for name, n, wb, a, b, c, d, _, _ in rows:
        print(f"{name:<13} {n:>5} {wb / 1e6:>6.1f}MB  {a * 1e3:>7.1f} {b * 1e3:>7.1f} {a / b:>5.2f}  "
              f"{c * 1e3:>7.1f} {d * 1e3:>7.1f} {c / d:>5.2f}")
    print("\nrewritten model vs original in onnxruntime:")
    for name, *_, cg, ci in rows:
        print(f"  {name:<13} gs: {cg}; ir: {ci}")
    model = fidelity_model()
    print("\n(c) fidelity of a round trip (lenet optimized to placement + a node with every attribute type)")
    fg, fi = fidelity(_gs_rt, model), fidelity(_ir_rt, model)
    width = max(map(len, list(fg) + list(fi)))
    print(f"{'item':<{width}}  {'onnx-graphsurgeon':<45} onnx_ir")
    for k in dict.fromkeys(list(fg) + list(fi)):
        print(f"{k:<{width}}  {fg.get(k, '-'):<45} {fi.get(k, '-')}")
    print(f"{'sparse tensor attributes':<{width}}  {sparse_attrs(_gs_rt):<45} {sparse_attrs(_ir_rt)}")
    with tempfile.TemporaryDirectory() as tmp:
        plain = fidelity_model()
        plain.graph.node.remove(next(n for n in plain.graph.node if n.name == "all_attrs"))
        del plain.graph.output[-1]
        for label, fn in (("onnx-graphsurgeon", _gs_rt_path), ("onnx_ir", _ir_rt_path)):
            d = Path(tmp) / label
            d.mkdir()
            print(f"external data, {label}: {external_data(fn, plain, d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
