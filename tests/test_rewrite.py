"""onnx_cinm.rewrite: rules of pattern, check and replacement on onnx_ir's use-def links."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper as h, numpy_helper

from onnx_cinm.errors import CinmError
from onnx_cinm.passes.graph_names import Names
from onnx_cinm.rewrite import Builder, Edit, Rule, apply, ir
from onnx_cinm.rewrite import plain as ir_plain


def _double_by_add_model() -> onnx.ModelProto:
    """y = x * two (a graph output, and read inside an If branch); z = If(c: y + 1 | y - 1);
    w = x * x (a Mul the rule refuses: no constant operand)."""
    f = TensorProto.FLOAT
    then = h.make_graph([h.make_node("Add", ["y", "one"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", f, [3])])
    other = h.make_graph([h.make_node("Sub", ["y", "one"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", f, [3])])
    nodes = [h.make_node("Mul", ["x", "two"], ["y"], name="double"),
             h.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other, name="branch"),
             h.make_node("Mul", ["x", "x"], ["w"], name="square")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f, [3]),
                                  h.make_tensor_value_info("c", TensorProto.BOOL, [])],
                     [h.make_tensor_value_info(n, f, [3]) for n in ("y", "z", "w")],
                     [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                      numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _check_double(edit: Edit, node):
    two = edit.constant(node.inputs[1].name)
    if two is None:
        return "no constant operand"
    return "the constant is not 2" if float(two) != 2.0 else True


def _double_as_add(edit: Edit, node, _):
    b = Builder(edit, node)
    x, y = node.inputs[0].name, node.outputs[0].name
    b.node(h.make_node, "Add", [x, x], [y], "sum")
    return b.nodes


def test_a_rule_rewires_consumers_in_subgraphs_and_graph_outputs():
    model = _double_by_add_model()
    x = np.array([1.5, -2.0, 3.25], np.float32)
    edit = Edit(model, Names(model.graph).fresh)
    done, kept = apply(edit, [Rule(frozenset({"Mul"}), _check_double, _double_as_add)])
    out = edit.commit()
    assert done == {"Mul": 1}
    assert kept == {"Mul": {"no constant operand": 1}}
    assert [n.op_type for n in out.graph.node] == ["Add", "If", "Mul"]
    assert out.graph.node[0].name == "double/Add"  # <node name>/<op>
    # 'two' is read by nobody now: deleted; 'one' is read inside both branches: kept
    assert [t.name for t in out.graph.initializer] == ["one"]
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for c, z in ((True, x * 2 + 1), (False, x * 2 - 1)):
        y, zz, w = sess.run(None, {"x": x, "c": np.array(c)})
        np.testing.assert_array_equal(y, x * 2)  # numpy: x + x == 2 x exactly
        np.testing.assert_array_equal(zz, z)
        np.testing.assert_array_equal(w, x * x)


def test_commit_writes_back_into_the_same_model_and_keeps_other_weights():
    model = _double_by_add_model()
    one = model.graph.initializer[1]
    edit = Edit(model, Names(model.graph).fresh)
    apply(edit, [Rule(frozenset({"Mul"}), _check_double, _double_as_add)])
    assert edit.commit() is model
    assert model.graph.initializer[0] == one and model.graph.initializer[0].raw_data == one.raw_data


def test_a_model_onnx_ir_cannot_read_is_a_one_line_error():
    sparse = h.make_sparse_tensor(numpy_helper.from_array(np.array([1.5], np.float32), "v"),
                                  numpy_helper.from_array(np.array([2], np.int64), "i"), [4])
    g = h.make_graph([h.make_node("Constant", [], ["y"], sparse_value=sparse)], "g", [],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(CinmError) as err:
        Edit(model, Names(model.graph).fresh)
    assert "\n" not in str(err.value) and "Sparse tensors are not supported" in str(err.value)


def test_a_rewrite_does_not_import_sympy_and_symbolic_dims_still_work():
    """onnx_ir imports sympy eagerly (0.6 s of CPU per process), and its op schemas;
    rewrite.py defers them, and they still work when asked for."""
    code = ("import sys\n"
            "from onnx_cinm.examples import get_example\n"
            "from onnx_cinm.passes import PassContext, get_pass\n"
            "ctx = PassContext()\n"
            "model = get_pass('to_cinm')(get_pass('fold_batchnorm')(get_example('lenet'), ctx), ctx)\n"
            "assert ctx.stats['to_cinm']['lowered'], ctx.stats\n"
            "assert 'sympy.core' not in sys.modules, 'sympy was imported'\n"
            "assert sys.modules['onnx_ir.schemas'].__spec__ is None, 'schemas were imported'\n"
            "import onnx_ir as ir\n"
            "import sympy\n"
            "assert (ir.SymbolicDim('n') + 1).value == 'n + 1'\n"
            "assert str(sympy.Max(sympy.Symbol('a'), 2)) == 'Max(2, a)'\n"
            "assert ir.schemas.OpSignature.__name__ == 'OpSignature'\n"
            "from onnx_ir.schemas import OpSignature\n"
            "assert sys.modules['onnx_ir.schemas'].__spec__ is not None\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_map_typed_outputs_onnx_ir_cannot_read_are_kept_as_they_were():
    """ZipMap's seq(map(int64, float)) output: onnx_ir 1.1 refuses map types; Edit hides the
    type while it reads the graph and puts it back (regression: optimize failed on sklearn
    classifiers with 'Map types are not supported yet')."""
    zipmap_type = h.make_sequence_type_proto(h.make_map_type_proto(TensorProto.INT64,
                                                                   h.make_tensor_type_proto(TensorProto.FLOAT, [])))
    g = h.make_graph([h.make_node("Relu", ["x"], ["p"], name="relu"),
                      h.make_node("ZipMap", ["p"], ["z"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])],
                     "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                     [h.make_value_info("z", zipmap_type)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 3)])
    before = model.SerializeToString(deterministic=True)
    edit = Edit(model, Names(model.graph).fresh)
    assert [n.op_type for n in edit.graph] == ["Relu", "ZipMap"]
    assert edit.commit().SerializeToString(deterministic=True) == before


def _graph_as_read(graph) -> tuple:
    """What the rewrites see of an ``ir.Graph``: its nodes (in order, with domain, op type,
    name, overload, doc string, metadata and attributes as onnx_ir serializes them), where
    each value a node reads comes from (a graph input, an initializer, a node's output), each
    value's uses, the graph's inputs, outputs and initializers (each one's TensorProto)."""
    nodes = list(graph)
    where = {}
    for k, v in enumerate(graph.inputs):
        where[id(v)] = ("input", k)
    for name, v in ir_plain(graph.initializers).items():
        where.setdefault(id(v), ("initializer", name))
    for k, n in enumerate(nodes):
        for j, v in enumerate(n.outputs):
            where[id(v)] = ("node", k, j)

    def uses(v):
        return sorted((nodes.index(u), i) for u, i in v.uses())

    read = [(n.domain, n.op_type, n.name, n.overload, n.doc_string, dict(n.metadata_props),
             [ir.serde.serialize_attribute(a).SerializeToString() for a in n.attributes.values()],
             [None if v is None else (where.get(id(v)), v.name, uses(v)) for v in n.inputs],
             [(v.name, uses(v), v.is_graph_output()) for v in n.outputs])
            for n in nodes]
    inits = [(name, v.const_value.raw if hasattr(v.const_value, "raw") else v.const_value.numpy().tolist(),
              v.is_graph_input(), uses(v)) for name, v in ir_plain(graph.initializers).items()]
    return (read, inits, [(v.name, uses(v)) for v in graph.inputs],
            [where.get(id(v)) for v in graph.outputs], graph.name, graph.doc_string)


def _plain_model() -> onnx.ModelProto:
    """A model the rewrite opens itself: nodes out of order, an unnamed one, an omitted
    optional input and output, an initializer that is also a graph input (a default), a graph
    output that is a graph input, string, float, ints and tensor attributes, doc strings."""
    f = TensorProto.FLOAT
    nodes = [h.make_node("Relu", ["m"], ["r"]),  # reads m, written further on
             h.make_node("Mul", ["x", "w"], ["m"], name="mul", doc_string="scaled"),
             h.make_node("Clip", ["r", "", "hi"], ["c"], name="clip"),
             h.make_node("Dropout", ["c"], ["d", ""], name="drop"),
             h.make_node("LeakyRelu", ["d"], ["l"], name="leaky", alpha=0.25),
             h.make_node("Conv", ["img", "k"], ["conv"], name="conv", auto_pad="SAME_UPPER",
                         kernel_shape=[3, 3], strides=[1, 1]),
             h.make_node("Constant", [], ["t"], name="const",
                         value=numpy_helper.from_array(np.array([1.0, 2.0], np.float32)))]
    g = h.make_graph(nodes, "plain", [h.make_tensor_value_info("x", f, [2]),
                                      h.make_tensor_value_info("w", f, [2]),
                                      h.make_tensor_value_info("img", f, [1, 1, 4, 4])],
                     [h.make_tensor_value_info(n, f, None) for n in ("l", "conv", "t", "x", "m")],
                     [numpy_helper.from_array(np.array([3.0, 3.0], np.float32), "w"),
                      numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
                      numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "k")],
                     doc_string="a plain graph")
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_edit_opens_a_plain_graph_as_onnx_ir_reads_it():
    """Edit builds a plain main graph itself (``_open_graph``: no value_info, types or
    functions read); the rewrites see the same graph as in onnx_ir's reading of it, which
    the model of anything else (a subgraph) still gets."""
    from onnx_cinm.rewrite import _open_graph, _read_graph

    model = _plain_model()
    before = model.SerializeToString(deterministic=True)
    opened, protos = _open_graph(model)
    assert protos == model.graph.node[:]
    assert _graph_as_read(opened) == _graph_as_read(_read_graph(model))
    assert model.SerializeToString(deterministic=True) == before
    assert _open_graph(_double_by_add_model()) is None  # the If's branches: onnx_ir's
    branching = _double_by_add_model()
    edit = Edit(branching, Names(branching.graph).fresh)
    assert [n.op_type for n in edit.graph] == ["Mul", "If", "Mul"]
    for mutate in (lambda g: g.node.add(op_type="Relu", input=["x"], output=["m"]),  # twice
                   lambda g: g.node.add(op_type="Relu", input=["nowhere"], output=["q"]),
                   lambda g: g.initializer.add().CopyFrom(g.initializer[0]),
                   lambda g: g.metadata_props.add(key="k", value="v")):
        odd = _plain_model()
        mutate(odd.graph)
        assert _open_graph(odd) is None


def test_add_initializer_writes_fills_and_views_of_bytes_as_numpy_would():
    """A broadcast fill, a view of a whole bytes object (reshaped, as ``to_array`` of raw_data
    gives), a strided view and an offset view of bytes all store numpy's C-order bytes."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from onnx_cinm.rewrite import add_initializer

    raw = np.arange(12, dtype=np.float32).tobytes()
    cases = {
        "fill": np.broadcast_to(np.float32(2.5), (3, 4)),
        "whole": np.frombuffer(raw, np.float32).reshape(4, 3),
        "strided": np.frombuffer(raw, np.float32).reshape(3, 4).T,
        "offset": np.frombuffer(raw, np.float32)[2:],
        "scalar": np.broadcast_to(np.int64(-3), ()),
    }
    g = onnx.GraphProto()
    for name, array in cases.items():
        add_initializer(g, array, name)
    for t in g.initializer:
        want = cases[t.name]
        got = numpy_helper.to_array(t)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32,
                                   np.uint64, np.uint32, np.int8, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_tensor_array_reads_what_numpy_helper_reads(dtype, shape):
    """Over raw_data and over the typed fields: numpy_helper's dtype, shape, bytes and flags."""
    from onnx_cinm.rewrite import tensor_array

    array = (np.arange(int(np.prod(shape))).reshape(shape) * 7 - 5).astype(dtype)
    raw = numpy_helper.from_array(array, "raw")
    kind = h.np_dtype_to_tensor_dtype(np.dtype(dtype))
    typed = h.make_tensor("typed", kind, shape, array.reshape(-1).tolist())
    for tensor in (raw, typed):
        got, want = tensor_array(tensor), numpy_helper.to_array(tensor)
        assert got.dtype == want.dtype and got.shape == want.shape == shape
        assert got.tobytes() == want.tobytes() == array.tobytes()
        assert got.flags.writeable == want.flags.writeable


def _fill_weight_model(doc: str = "") -> onnx.ModelProto:
    """y = MatMul(x [2, 3], W [3, 4]), W 0.5 repeated in raw_data (``doc``: its doc_string)."""
    w = numpy_helper.from_array(np.full((3, 4), 0.5, np.float32), "W")
    if doc:
        w.doc_string = doc
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def _transpose_and_slice(edit: Edit, node, _):
    """The MatMul as MatMul(x, Transpose(W^T)), plus Identity(W[:2]): two constants made from
    W as :meth:`Edit.constant` gives it (a fill: one value broadcast)."""
    b = Builder(edit, node)
    w = edit.constant("W")
    wt = edit.const("W_T", w.T)
    part = edit.const("W_part", w[:2])
    t = b.node(h.make_node, "Transpose", [wt], None, "t", perm=[1, 0])
    b.node(h.make_node, "MatMul", [node.inputs[0].name, t], ["y"], "mm")
    b.node(h.make_node, "Identity", [part], None, "part")
    return b.nodes


@pytest.mark.parametrize("doc", ["", "a field add_initializer does not write"])
def test_commit_writes_a_fill_constant_as_its_value_repeated_to_its_own_size(doc):
    """A constant made from a fill weight (``fills``: not read back) is written as the value's
    bytes repeated over its own dims, with no other field: the transpose copied from W's
    initializer, the slice (8 of W's 12 elements) written afresh; both handed on as fills."""
    model = _fill_weight_model(doc)
    half = np.float32(0.5).tobytes()
    edit = Edit(model, Names(model.graph).fresh, fills={"W": (TensorProto.FLOAT, (3, 4), half)})
    apply(edit, [Rule(frozenset({"MatMul"}), lambda e, n: True, _transpose_and_slice)])
    edit.commit()
    tensors = {t.name: t for t in model.graph.initializer}
    assert set(tensors) == {"W_T", "W_part"}
    for name, dims in (("W_T", [4, 3]), ("W_part", [2, 4])):
        t = tensors[name]
        assert list(t.dims) == dims and t.data_type == TensorProto.FLOAT
        assert t.raw_data == np.full(dims, 0.5, np.float32).tobytes()
        assert sorted(f.name for f, _ in t.ListFields()) == ["data_type", "dims", "name", "raw_data"]
    assert edit.current_fills() == {"W_T": (TensorProto.FLOAT, (4, 3), half),
                                    "W_part": (TensorProto.FLOAT, (2, 4), half)}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(["y"], {"x": x})[0],
                                  np.repeat(x.sum(axis=1, keepdims=True) * 0.5, 4, axis=1))


def test_commit_writes_what_onnx_ir_serializes_and_a_node_changed_in_place_as_it_is_now():
    """commit writes back the NodeProto a node was read or built from only where onnx_ir's own
    serializer (the reference) gives the same bytes: nodes with an explicit empty domain or
    name, a trailing empty output, an attribute doc string, a tensor or graph attribute are
    written as onnx_ir writes them; a node whose input was changed in place says so."""
    f = TensorProto.FLOAT
    quirky = h.make_node("Relu", ["x"], ["r"], domain="")  # explicit "" domain, no name
    doc = h.make_node("LeakyRelu", ["r"], ["l"], name="doc", alpha=0.5)
    doc.attribute[0].doc_string = "slope"
    split = h.make_node("Split", ["l"], ["s0", "s1", ""], name="split", axis=0, num_outputs=3)
    const = h.make_node("Constant", [], ["k"], name="k",
                        value=numpy_helper.from_array(np.ones(2, np.float32), "v"))
    then = h.make_graph([h.make_node("Add", ["s0", "k"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", f, [2])])
    other = h.make_graph([h.make_node("Sub", ["s0", "k"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", f, [2])])
    branch = h.make_node("If", ["c"], ["z"], name="branch", then_branch=then, else_branch=other)
    nodes = [quirky, doc, split, const, h.make_node("Mul", ["s1", "two"], ["y"], name="double"),
             branch, h.make_node("Neg", ["s1"], ["n"], name="neg")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f, [6]),
                                  h.make_tensor_value_info("c", TensorProto.BOOL, [])],
                     [h.make_tensor_value_info(n, f, [2]) for n in ("y", "z", "n")],
                     [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    edit = Edit(model, Names(model.graph).fresh)
    apply(edit, [Rule(frozenset({"Mul"}), _check_double, _double_as_add)])
    neg = next(n for n in edit.graph if n.name == "neg")
    neg.replace_input_with(0, next(n for n in edit.graph if n.name == "split").outputs[0])
    want = [ir.serde.serialize_node(n).SerializeToString() for n in edit.graph]
    out = edit.commit()
    assert [n.SerializeToString() for n in out.graph.node] == want
    assert list(out.graph.node[-1].input) == ["s0"] and list(out.graph.node[2].output) == ["s0", "s1"]


def _relu_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    g = h.make_graph([h.make_node("Relu", ["x"], ["r"], name="relu"),
                      h.make_node("Neg", ["r"], ["y"], name="neg")], "g",
                     [h.make_tensor_value_info("x", f, [4])],
                     [h.make_tensor_value_info(n, f, [4]) for n in ("r", "y")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_recast_attributes_are_the_ir_nodes_own():
    """Edit.recast writes the new attributes through rewrite.plain (the dict under onnx_ir's
    Attributes): onnx_ir's own reads see them, the old ones gone, and its serialization of the
    node writes them (an onnx_ir whose Attributes kept its items elsewhere fails here)."""
    model = _relu_model()
    model.graph.node[0].attribute.extend([h.make_attribute("stale", 3)])
    edit = Edit(model, Names(model.graph).fresh)
    relu = next(iter(edit.graph))
    proto = h.make_node("LeakyRelu", ["x"], ["r"], name="relu/LeakyRelu", alpha=0.25,
                        doc_string="recast")
    edit.recast(relu, proto)
    assert list(relu.attributes) == ["alpha"] and "stale" not in relu.attributes
    assert relu.attributes.get_float("alpha") == 0.25 and len(relu.attributes) == 1
    written = ir.serde.serialize_node(relu)
    assert (written.op_type, written.name) == ("LeakyRelu", "relu/LeakyRelu")
    assert [(a.name, a.type, a.f) for a in written.attribute] == \
        [("alpha", onnx.AttributeProto.FLOAT, 0.25)]


@pytest.mark.parametrize("staged", [False, True])
def test_recast_changes_the_node_in_place_or_builds_it_after_other_nodes(staged):
    """A 1:1 replacement (Builder.recast: the same inputs and outputs) changes the node in
    place: the same ir node, its place, its consumers and graph output, recorded in origins
    under its new name. After another node was built (staged: Identity, then LeakyRelu on its
    output) it is built and linked in as any other replacement."""
    model = _relu_model()
    original = onnx.NodeProto()
    original.CopyFrom(model.graph.node[0])
    edit = Edit(model, Names(model.graph).fresh)
    relu = next(iter(edit.graph))

    def leaky(edit, node, _):
        b = Builder(edit, node)
        x = b.node(h.make_node, "Identity", ["x"], None, "copy") if staged else "x"
        return b.recast(h.make_node, "LeakyRelu", [x], ["r"], alpha=0.0)

    done, _ = apply(edit, [Rule(frozenset({"Relu"}), lambda e, n: True, leaky)])
    assert done == {"Relu": 1}
    assert (next(iter(edit.graph)) is relu) != staged
    out = edit.commit()
    assert [(n.op_type, n.name) for n in out.graph.node] == \
        ([("Identity", "relu/Identity")] if staged else []) + \
        [("LeakyRelu", "relu/LeakyRelu"), ("Neg", "neg")]
    assert [(p, w, names) for p, w, names in edit.origins] == \
        [(original, {}, ["relu/Identity", "relu/LeakyRelu"] if staged else ["relu/LeakyRelu"])]
    x = np.array([-1.5, 0.0, 2.0, -0.25], np.float32)
    r, y = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    np.testing.assert_array_equal(y, -np.maximum(x, 0))


def _fill_graph(write_now: bool):
    """An int64 initializer, then four fills (two alike in a row, one of another value, one of
    another size), then a float one; the fills appended by add_unwritten (``write_now``
    False, records returned) or add_initializer (True)."""
    from onnx_cinm.rewrite import add_initializer, add_unwritten, repeated

    g = onnx.GraphProto()
    g.initializer.append(numpy_helper.from_array(np.arange(3, dtype=np.int64), "first"))
    records = {}
    for name, v, shape in (("a", 0.5, (40, 30)), ("b", 0.5, (40, 30)), ("c", -1.0, (40, 30)),
                           ("d", 0.5, (2000,))):
        fill = repeated(np.array([v], np.float32), shape)
        if write_now:
            add_initializer(g, fill, name)
        else:
            records[name] = add_unwritten(g, fill, name)
    g.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "last"))
    return g, records


def test_write_unwritten_writes_what_add_initializer_would():
    """add_unwritten appends a fill's entry without bytes; write_unwritten fills them in where
    they stand: the graph serializes to the bytes of one built by add_initializer, each entry
    holding its value repeated (numpy's np.full), and the records are used up. With names,
    only those are written and the other records stay."""
    from onnx_cinm.rewrite import write_unwritten

    g, records = _fill_graph(write_now=False)
    assert [t.HasField("raw_data") for t in g.initializer] == [True, False, False, False, False, True]
    assert records["c"] == (TensorProto.FLOAT, (40, 30), np.float32(-1.0).tobytes())
    write_unwritten(g, records, {"b", "unknown"})
    assert set(records) == {"a", "c", "d"}
    assert [t.HasField("raw_data") for t in g.initializer] == [True, False, True, False, False, True]
    write_unwritten(g, records)
    assert records == {}
    want, _ = _fill_graph(write_now=True)
    assert g.SerializeToString() == want.SerializeToString()
    got = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for name, v, shape in (("a", 0.5, (40, 30)), ("b", 0.5, (40, 30)), ("c", -1.0, (40, 30)),
                           ("d", 0.5, (2000,))):
        np.testing.assert_array_equal(got[name], np.full(shape, v, np.float32))


def test_write_unwritten_leaves_an_entry_that_no_longer_matches():
    """A record whose initializer has data now, or other dims, is not written over (an entry
    of that name made afresh): dropped, the tensor left as it is."""
    from onnx_cinm.rewrite import write_unwritten

    g, records = _fill_graph(write_now=False)
    tensors = {t.name: t for t in g.initializer}
    tensors["a"].float_data.extend([2.0] * 1200)  # typed data: another tensor now
    del tensors["c"].dims[:]
    tensors["c"].dims.extend([1200])
    write_unwritten(g, records)
    assert records == {}
    assert not tensors["a"].HasField("raw_data") and not tensors["c"].HasField("raw_data")
    np.testing.assert_array_equal(numpy_helper.to_array(tensors["a"]), np.full((40, 30), 2.0, np.float32))
    np.testing.assert_array_equal(numpy_helper.to_array(tensors["b"]), np.full((40, 30), 0.5, np.float32))
