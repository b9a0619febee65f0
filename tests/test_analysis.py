"""Tests for onnx_cinm.analysis.tensor_infos reading a settled value_info instead of inferring.

Expected shapes are hand counts of the tiny graphs below, never taken from the code under test.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import frontend
from onnx_cinm.analysis import inference_adds_nothing, keep_static_types, open_tensors, tensor_infos


def _model(value_info):
    """x[2, 3] -> MatMul(W[3, 4]) -> h -> Dropout (its mask output omitted) -> y;
    ``value_info`` for h as given."""
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Dropout", ["h"], ["y", ""])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w], value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_open_value_info_is_inferred_again():
    """A value_info that leaves a dim open (or no entry at all) is not taken as it is:
    inference sizes h from x[2, 3] @ W[3, 4]."""
    for value_info in ([helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, "n"])], []):
        infos = tensor_infos(_model(value_info))
        assert infos["h"].shape == (2, 4) and infos["y"].shape == (2, 4)
        assert infos["W"].const and infos["W"].shape == (3, 4)


def test_settled_value_info_is_read_as_it_is():
    """Every node output typed with all dims known: the infos are the value_info's, the same
    as inference gives (hand count: h and y are [2, 4] float32)."""
    settled = [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])]
    infos = tensor_infos(_model(settled))
    assert {k: (np.dtype(v.dtype).name, v.shape, v.const) for k, v in infos.items()} == {
        "x": ("float32", (2, 3), False), "h": ("float32", (2, 4), False),
        "y": ("float32", (2, 4), False), "W": ("float32", (3, 4), True)}


def test_settled_check_and_inference_agree_on_which_value_info_is_settled():
    """inference_adds_nothing (normalize's question) and tensor_infos read the same rule: a
    value_info typing every node output with all dims known is taken as it is (hand counts as
    above), one leaving a dim open, negative or an element type unknown is not."""
    def infos_of(model):
        return {k: (np.dtype(v.dtype).name, v.shape) for k, v in tensor_infos(model).items()}

    settled = _model([helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])])
    assert inference_adds_nothing(settled)
    assert infos_of(settled)["h"] == ("float32", (2, 4))
    for h in ([2, "n"], [2, -1], None):
        model = _model([helper.make_tensor_value_info("h", TensorProto.FLOAT, h)])
        assert not inference_adds_nothing(model)
        if h != [2, -1]:  # (onnx keeps the declared -1: the dim stays unknown)
            assert infos_of(model)["h"] == ("float32", (2, 4))  # inferred: x[2, 3] @ W[3, 4]
    untyped = _model([helper.make_tensor_value_info("h", TensorProto.UNDEFINED, [2, 4])])
    assert not inference_adds_nothing(untyped)
    assert not inference_adds_nothing(_model([]))


def test_a_sequence_in_the_value_info_is_not_a_settled_tensor():
    """A model inferred with a sequence among its node outputs (SequenceConstruct's) types it
    in value_info as a sequence, not a tensor: read as settled, that name had no info and
    tensor_infos raised KeyError (optimize: 'internal error'). It is inferred instead: y =
    SequenceAt(s, 0) is x, float32 [2, 2] (hand count), and optimize writes the model."""
    import subprocess
    import sys

    import onnx

    graph = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
         helper.make_node("SequenceAt", ["s", "i"], ["y"]),
         helper.make_node("MatMul", ["y", "W"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.array(0, np.int64), "i"),
         numpy_helper.from_array(np.ones((2, 2), np.float32), "W")])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert {v.name for v in model.graph.value_info} == {"s", "y"}
    assert not inference_adds_nothing(model)
    infos = tensor_infos(model)
    assert (np.dtype(infos["y"].dtype).name, infos["y"].shape) == ("float32", (2, 2))
    assert "s" not in infos
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "seq.onnx")
        done = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "optimize", str(Path(tmp) / "seq.onnx"),
                               "-o", str(Path(tmp) / "out.onnx"), "-q", "--check", "1"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert (Path(tmp) / "out.onnx").exists()


def test_infos_made_directly_are_the_dataclass_instances():
    """_collect makes its TensorInfos without the dataclass __init__: the same fields, equal,
    the same hash and repr, its computed properties working; and the dataclass still has
    exactly the four fields it fills (a new field would be left out)."""
    import dataclasses

    from onnx_cinm.analysis import _tensor_info
    from onnx_cinm.graph import TensorInfo

    assert [f.name for f in dataclasses.fields(TensorInfo)] == ["name", "dtype", "shape", "const"]
    for args in (("w", np.dtype(np.float32), (3, 4), True), ("h", None, None, False),
                 ("x", np.dtype(np.int8), ("batch", 4), False)):
        made, built = _tensor_info(*args), TensorInfo(*args)
        assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
        assert (made.static_shape, made.numel, made.nbytes) == \
            (built.static_shape, built.numel, built.nbytes)
    assert _tensor_info("w", np.dtype(np.float32), (3, 4), True).nbytes == 48  # 12 x 4 bytes


def test_open_tensors_one_inference_or_all_of_tensor_infos():
    """What the planning probe asks: which tensors inference leaves unsized. Hand counts:
    Relu(x[2, 3]) is [2, 3], sized by one inference, so nothing is open; Reshape(x, s) with
    the target shape s a graph input has no known dims, so it stays open (tensor_infos
    answers, its dims unknown); with x[batch, 3] and batch planned at 4, Relu's output is
    [4, 3]: bound before inference, nothing open."""
    def model(x_dims):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims),
                  helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    assert open_tensors(model([2, 3]), ["r"]) == []
    assert open_tensors(model([2, 3]), ["r", "y"]) == ["y"]
    planned = model(["batch", 3])
    assert open_tensors(planned, ["r"]) == ["r"]  # batch has no size: open
    frontend.set_planned_dims(planned, {"batch": 4})
    assert open_tensors(planned, ["r"]) == []
    assert tensor_infos(planned)["r"].shape == (4, 3)


def test_open_tensors_lists_names_only_when_some_node_output_is_open():
    """The planning probe hands its names as a callable: listing them walks every node and
    what each reads, which a model whose every node output one inference sizes never needs.
    Hand counts as above: Relu(x[2, 3]) -> r [2, 3], Reshape(r, s) by a graph input's values
    -> y with no known dims; the answers equal those of the list."""
    def model(reshape):
        nodes = [helper.make_node("Relu", ["x"], ["r"])]
        if reshape:
            nodes.append(helper.make_node("Reshape", ["r", "s"], ["y"]))
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("y" if reshape else "r", TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    listed = []

    def names(*asked):
        def listing():
            listed.append(asked)
            return list(asked)
        return listing

    assert open_tensors(model(False), names("r")) == [] == open_tensors(model(False), ["r"])
    assert listed == []  # every node output sized: not listed
    assert open_tensors(model(True), names("r")) == [] == open_tensors(model(True), ["r"])
    assert open_tensors(model(True), names("r", "y")) == ["y"] == \
        open_tensors(model(True), ["r", "y"])
    assert listed == [("r",), ("r", "y")]  # y open: listed, once each


def test_all_sized_judges_each_type_once_as_dim_by_dim():
    """_all_sized judges a type once by its bytes: the same answers as reading every dim of
    every name's type. Types by hand: two names share [2, 3]; a dim named n (sized only with
    n planned), an unnamed dim, a negative dim, no shape, a sequence type; a constant
    counts as sized, an undeclared name not; the first declaration wins (an input before
    value_info)."""
    from onnx_cinm.analysis import _all_sized

    def vi(name, dims, elem=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, elem, dims)

    seq = helper.make_value_info("q", helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    negative = vi("m", [2, 3])
    negative.type.tensor_type.shape.dim[0].dim_value = -1
    graph = helper.make_graph(
        [], "g", [vi("a", [2, 3]), vi("f", ["n"])],
        [vi("c", None)],
        value_info=[vi("b", [2, 3]), vi("d", ["n", 3]), vi("e", [None, 3]), negative, seq,
                    vi("f", [4])])

    def by_dims(names, dims):  # every dim of every name's first declaration
        types = {}
        for v in (*graph.input, *graph.value_info, *graph.output):
            types.setdefault(v.name, v.type)
        for name in names:
            if name == "w":
                continue
            t = types.get(name)
            if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
                return False
            if not all(d.HasField("dim_value") and d.dim_value >= 0 or d.dim_param in dims
                       for d in t.tensor_type.shape.dim):
                return False
        return True

    cases = [["a", "b"], ["a", "b", "w"], ["d"], ["e"], ["m"], ["c"], ["q"], ["f"], ["x"],
             ["a", "d", "b"], ["b", "e", "a"]]
    for dims in ({}, {"n": 5}):
        for names in cases:
            assert _all_sized(graph, {"w": (1, (2,))}, dims, names) == by_dims(names, dims), \
                (names, dims)
    assert _all_sized(graph, {}, {"n": 5}, ["a", "b", "d", "f"])  # f: the input's [n]
    assert not _all_sized(graph, {}, {}, ["a", "b", "d"])


def test_static_types_kept_for_the_next_pass_and_read_back():
    """Types inference gave every node output, all dims known, are written into the model
    (PassContext.tensor_infos does it for the next pass): h [2, 4] and y [2, 4] float32 by
    hand count; read back as they are (no inference: a model with an h entry of another,
    impossible shape shows which way tensor_infos went), and equal to what inference gives.
    Nothing is written at planned sizes or when a dim is open."""
    model = _model([])
    infos = tensor_infos(model)
    assert keep_static_types(model, infos)
    assert {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in model.graph.value_info} == {"h": [2, 4]}  # y is a typed graph output
    assert {k: (v.dtype, v.shape) for k, v in tensor_infos(model).items()} == \
        {k: (v.dtype, v.shape) for k, v in infos.items()}
    model.graph.value_info[0].type.tensor_type.shape.dim[1].dim_value = 5  # read back: not inferred
    assert tensor_infos(model)["h"].shape == (2, 5)

    planned = _model([])
    frontend.set_planned_dims(planned, {"n": 3})
    assert not keep_static_types(planned, tensor_infos(planned)) and not planned.graph.value_info
    open_ = _model([])
    open_.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert not keep_static_types(open_, tensor_infos(open_)) and not open_.graph.value_info


def test_op_info_reads_each_field_once_and_counts_as_node_flops():
    """op_info's record of hand-built nodes: the tensors by name (an unknown one as a record
    of its name alone, an omitted optional input left out), the attributes, and the FLOPs
    counted by hand (op_info hands the names it read to node_flops' body)."""
    from onnx_cinm.analysis import node_flops, op_info
    from onnx_cinm.graph import TensorInfo

    f32 = np.dtype(np.float32)
    infos = {"a": TensorInfo("a", f32, (7, 3)), "b": TensorInfo("b", f32, (7, 5), True),
             "y": TensorInfo("y", f32, (3, 5)), "x": TensorInfo("x", f32, (1, 2, 5, 5)),
             "w": TensorInfo("w", f32, (4, 2, 3, 3), True), "z": TensorInfo("z", f32, (1, 4, 3, 3))}
    gemm = helper.make_node("Gemm", ["a", "b", ""], ["y"], name="g", transA=1)
    conv = helper.make_node("Conv", ["x", "w", "bias"], ["z"], name="c", kernel_shape=[3, 3])
    g, c = op_info(gemm, infos), op_info(conv, infos)
    assert (g.name, g.op_type, g.attrs) == ("g", "Gemm", {"transA": 1})
    assert [t.name for t in g.inputs] == ["a", "b"] and g.outputs == (infos["y"],)
    assert g.flops == 2 * 7 * 3 * 5  # A^T[3, 7] @ B[7, 5]: K = 7 (transA), 3 x 5 outputs
    assert c.inputs[2] == TensorInfo("bias", None, None, False)  # not in the infos
    assert c.attrs == {"kernel_shape": [3, 3]}
    assert c.flops == 2 * (2 * 3 * 3) * (4 * 3 * 3)  # C/group * k per output element
    assert (g.flops, c.flops) == (node_flops(gemm, infos), node_flops(conv, infos))


def test_open_tensors_from_the_opset_conversions_inference():
    """The planning probe of an opset-9 model asks with the inference canonicalize_opset runs
    to convert it (conversion_inference): the same answers as its own first inference, hand
    counts as above (Relu(x[2, 3]) sized, Reshape by a graph input's values open); with
    planned dims the probe's own inference runs (the conversion's has no sizes bound)."""
    from onnx_cinm.passes.canonicalize import conversion_inference

    def model(x_dims):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims),
                  helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])

    calls = []

    def first(m):
        def inference():
            calls.append(m)
            return conversion_inference(m)[3]
        return inference

    static = model([2, 3])
    assert open_tensors(static, ["r"], first(static)) == [] == open_tensors(static, ["r"])
    assert open_tensors(static, ["r", "y"], first(static)) == ["y"] == \
        open_tensors(static, ["r", "y"])
    assert len(calls) == 2
    planned = model(["batch", 3])
    frontend.set_planned_dims(planned, {"batch": 4})
    assert open_tensors(planned, ["r"], first(planned)) == []
    assert len(calls) == 2  # not asked: the conversion's inference leaves batch open


def test_op_info_records_are_the_dataclass_instances():
    """op_info makes its OpInfo without the dataclass __init__: equal to the constructor's, the
    same repr, the dataclass still has exactly the six fields it fills; the flops of the ops
    counted by one lookup are hand counts (Relu 1 and Softmax 5 per output element of 3 x 4,
    ReduceSum its 12 input elements, an op of unknown output 0)."""
    import dataclasses

    from onnx_cinm.analysis import op_info
    from onnx_cinm.graph import OpInfo, TensorInfo

    assert [f.name for f in dataclasses.fields(OpInfo)] == \
        ["name", "op_type", "attrs", "inputs", "outputs", "flops"]
    f32 = np.dtype(np.float32)
    infos = {"x": TensorInfo("x", f32, (3, 4)), "y": TensorInfo("y", f32, (3, 4)),
             "r": TensorInfo("r", f32, (1, 4))}
    cases = [(helper.make_node("Relu", ["x"], ["y"], name="relu"), 12),
             (helper.make_node("Softmax", ["x"], ["y"], axis=1), 60),
             (helper.make_node("ReduceSum", ["x", ""], ["r"], keepdims=1), 12),
             (helper.make_node("Relu", ["x"], ["unknown"]), 0)]
    for node, flops in cases:
        got = op_info(node, infos)
        want = OpInfo(node.name, node.op_type, {a.name: a.i for a in node.attribute},
                      tuple(infos.get(n, TensorInfo(n, None, None, False)) for n in node.input if n),
                      tuple(infos.get(n, TensorInfo(n, None, None, False)) for n in node.output if n),
                      flops)
        assert got == want and repr(got) == repr(want), node.op_type


def test_collect_reads_each_distinct_type_once_with_the_same_infos():
    """_collect reads a type once per distinct one: tensors of one type get the same (hand
    written) dtype and shape, a dim_param is sized by ``dims`` or kept as its name, a negative
    dim is '?', a sequence-typed entry gives no info and a later entry of a name is not read."""
    from onnx_cinm.analysis import _collect

    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    g = helper.make_graph([], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
                          value_info=[helper.make_tensor_value_info("c", TensorProto.INT64, ["n", -1]),
                                      helper.make_tensor_value_info("d", TensorProto.INT64, ["n", -1]),
                                      helper.make_tensor_value_info("e", TensorProto.INT64, ["m"]),
                                      seq,
                                      helper.make_tensor_value_info("a", TensorProto.INT8, [9])])
    infos = _collect(g, {"w": (TensorProto.FLOAT16, (4,))}, dims={"n": 5})
    got = {k: (v.dtype, v.shape, v.const) for k, v in infos.items()}
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    assert got == {"a": (f32, (2, 3), False), "c": (i64, (5, "?"), False),
                   "d": (i64, (5, "?"), False), "e": (i64, ("m",), False),
                   "b": (f32, (2, 3), False), "w": (np.dtype(np.float16), (4,), True)}


def test_op_info_tensors_known_or_not():
    """op_info's tensors: every input and output named and known comes as the infos
    themselves (its shortcut); an empty (omitted) name is left out and an unknown tensor gets
    a record of its name with nothing known, each in node order (the general path), whichever
    way the node's tensors mix."""
    from onnx_cinm.analysis import _tensor_info, op_info

    a = _tensor_info("a", np.dtype(np.float32), (2, 3), False)
    w = _tensor_info("w", np.dtype(np.float32), (3, 4), True)
    y = _tensor_info("y", np.dtype(np.float32), (2, 4), False)
    infos = {"a": a, "w": w, "y": y}
    full = op_info(helper.make_node("MatMul", ["a", "w"], ["y"]), infos)
    assert full.inputs == (a, w) and full.inputs[0] is a and full.outputs[0] is y
    part = op_info(helper.make_node("Clip", ["a", "", "lo"], ["z"]), infos)
    assert part.inputs[0] is a and len(part.inputs) == 2 and len(part.outputs) == 1
    for made, name in ((part.inputs[1], "lo"), (part.outputs[0], "z")):
        assert made == _tensor_info(name, None, None, False)
