"""The protobuf wire format helpers (onnx_cinm.protowire), against protobuf's documented
encoding and protobuf's own parser."""
import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import protowire


def _assert_head_is_the_graph_without_initializers(model: onnx.ModelProto) -> None:
    """write_streamed's first part is protobuf's own serialization of ``model`` without its
    initializers, and the whole file reads back as ``model``."""
    out = io.BytesIO()
    first = protowire.write_streamed(out, model)
    head = onnx.ModelProto()
    head.CopyFrom(model)
    del head.graph.initializer[:]
    assert out.getvalue()[:first] == head.SerializeToString()
    assert onnx.ModelProto.FromString(out.getvalue()) == model


@pytest.mark.parametrize("n,encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"),
                                       (150, b"\x96\x01"),  # protobuf's encoding guide example
                                       (300, b"\xac\x02"), (2**31 - 1, b"\xff\xff\xff\xff\x07")])
def test_varint_matches_the_documented_encoding(n, encoded):
    assert protowire.varint(n) == encoded
    assert protowire.read_varint(memoryview(b"\x05" + encoded), 1) == (n, 1 + len(encoded))


def _model():
    big = np.arange(2048, dtype=np.float32).reshape(32, 64)
    w = numpy_helper.from_array(big, "w")                               # raw_data, 8192 bytes
    b = helper.make_tensor("b", TensorProto.FLOAT, [64], np.ones(64).tolist())  # float_data
    s = numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "s")  # raw_data, 16 bytes
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y0"]),
                           helper.make_node("Add", ["y0", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                          [w, b, s])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_initializer_raw_sizes_read_from_the_bytes():
    model = _model()
    buf = memoryview(model.SerializeToString())
    # by hand: 32 x 64 float32 = 8192 bytes; b holds float_data (no raw_data); 2 int64 = 16
    assert protowire.initializer_raw_sizes(buf, 3) == [8192, None, 16]
    assert protowire.initializer_raw_sizes(buf, 4) == [None] * 4  # count mismatch: unknown
    assert protowire.initializer_raw_sizes(memoryview(b"\x0a\xff"), 1) == [None]  # cut off


def test_write_streamed_reads_back_as_the_same_model():
    model = _model()
    out = io.BytesIO()
    protowire.write_streamed(out, model)
    back = onnx.ModelProto.FromString(out.getvalue())
    assert back == model
    assert [t.name for t in back.graph.initializer] == ["w", "b", "s"]


def test_copy_except_leaves_one_field_out():
    model = _model()
    graph = protowire.copy_except(model.graph, "initializer")
    assert len(graph.initializer) == 0 and len(model.graph.initializer) == 3
    expected = onnx.GraphProto()
    expected.CopyFrom(model.graph)
    del expected.initializer[:]
    assert graph == expected


def test_write_streamed_is_protobufs_encoding_piece_by_piece():
    """The file is protobuf's own encoding of the model without its initializers, then of a
    model holding just each initializer in its graph (one tensor with a doc_string, which
    protobuf writes after raw_data, goes out with raw_data last: it reads back the same)."""
    model = _model()  # w and s are small, written whole; big (80 kB) field by field
    model.graph.initializer.append(numpy_helper.from_array(np.arange(2e4, dtype=np.float32), "big"))
    doc = numpy_helper.from_array(np.arange(3, dtype=np.int32), "d")
    doc.doc_string = "after raw_data"
    model.graph.initializer.append(doc)
    out = io.BytesIO()
    protowire.write_streamed(out, model)
    head = onnx.ModelProto()
    head.CopyFrom(model)
    del head.graph.initializer[:]
    pieces = [onnx.ModelProto(graph=onnx.GraphProto(initializer=[t])).SerializeToString()
              for t in model.graph.initializer[:4]]
    expected = head.SerializeToString() + b"".join(pieces)
    assert out.getvalue()[:len(expected)] == expected
    assert onnx.ModelProto.FromString(out.getvalue()) == model


def test_copy_except_into_a_field_of_another_message():
    model = _model()
    head = onnx.ModelProto()
    assert protowire.copy_except(model.graph, "initializer", into=head.graph) is head.graph
    assert head.graph == protowire.copy_except(model.graph, "initializer")


@pytest.mark.parametrize("nodes", [True, False])
def test_write_streamed_head_of_a_graph_of_initializers_only(nodes):
    """A graph that holds nothing but its initializers still goes out as a (then empty) graph
    field in the model's first part, as protobuf encodes the model without them."""
    model = _model() if nodes else onnx.ModelProto(
        ir_version=8, graph=onnx.GraphProto(initializer=[numpy_helper.from_array(
            np.arange(3, dtype=np.float32), "w")]))
    _assert_head_is_the_graph_without_initializers(model)


@pytest.mark.parametrize("later", [None, "doc_string", "external_data", "metadata_props",
                                   "data_location", "empty raw_data", "float_data"])
def test_write_streamed_small_tensor_with_fields_after_raw_data(later):
    """A small tensor goes out as protobuf's own serialization only when raw_data is its last
    field; with any field numbered after raw_data set it goes out with raw_data moved last
    (and without raw_data, as it serializes): built here from protobuf's encoding of the
    tensor without raw_data, then raw_data's key (field 9, wire type 2), length and bytes."""
    t = numpy_helper.from_array(np.arange(5, dtype=np.float32), "t")
    if later == "doc_string":
        t.doc_string = "after"
    elif later == "external_data":
        t.external_data.add(key="k", value="v")
    elif later == "metadata_props":
        t.metadata_props.add(key="k", value="v")
    elif later == "data_location":
        t.data_location = onnx.TensorProto.DEFAULT
    elif later == "empty raw_data":
        t = onnx.TensorProto(name="t", data_type=onnx.TensorProto.FLOAT, dims=[0], raw_data=b"")
    elif later == "float_data":
        t = onnx.TensorProto(name="t", data_type=onnx.TensorProto.FLOAT, dims=[2],
                             float_data=[1.0, 2.0])
    model = onnx.ModelProto(ir_version=8, graph=onnx.GraphProto(name="g", initializer=[t]))
    out = io.BytesIO()
    first = protowire.write_streamed(out, model)
    if t.HasField("raw_data"):
        raw = t.raw_data
        meta = onnx.TensorProto()
        meta.CopyFrom(t)
        meta.ClearField("raw_data")
        body = meta.SerializeToString() + b"\x4a" + bytes([len(raw)]) + raw
    else:
        body = t.SerializeToString()
    inner = b"\x2a" + bytes([len(body)]) + body  # GraphProto.initializer: field 5
    assert out.getvalue()[first:] == b"\x3a" + bytes([len(inner)]) + inner  # ModelProto.graph: 7
    assert onnx.ModelProto.FromString(out.getvalue()) == model


@pytest.mark.parametrize("fields", ["name dims type", "segment", "doc_string after raw_data"])
def test_write_streamed_large_tensor_field_by_field(fields):
    """A tensor over 64 KiB goes out as its fields but raw_data, then raw_data: with raw_data
    its last field, the very bytes protobuf encodes a model holding just that tensor with
    (fields in number order); a field numbered after it (doc_string) goes before it."""
    t = numpy_helper.from_array(np.arange(20000, dtype=np.float32).reshape(100, 200), "big")
    if fields == "segment":
        t.segment.begin, t.segment.end = 0, 3  # a message field before raw_data
    elif fields == "doc_string after raw_data":
        t.doc_string = "after"
    model = onnx.ModelProto(ir_version=8, graph=onnx.GraphProto(name="g", initializer=[t]))
    out = io.BytesIO()
    first = protowire.write_streamed(out, model)
    piece = onnx.ModelProto(graph=onnx.GraphProto(initializer=[t])).SerializeToString()
    if fields == "doc_string after raw_data":  # protobuf puts doc_string (12) after raw_data (9)
        assert out.getvalue()[first:] != piece and len(out.getvalue()) - first == len(piece)
    else:
        assert out.getvalue()[first:] == piece
    assert onnx.ModelProto.FromString(out.getvalue()) == model


def test_write_streamed_head_with_every_graph_and_model_field():
    """The first part is protobuf's own encoding of the model without its initializers, with
    every GraphProto field set (strings, an empty one too, and repeated messages) and model
    fields numbered before and after the graph's (doc_string; opset_import, metadata_props,
    functions)."""
    model = _model()
    g = model.graph
    g.name = ""  # set, though empty: written as such
    g.doc_string = "the graph, ünïcode"
    g.value_info.append(helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, 64]))
    g.quantization_annotation.add(tensor_name="y0").quant_parameter_tensor_names.add(
        key="SCALE_TENSOR", value="s")
    g.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5], dtype=np.float32), "sp"),
        numpy_helper.from_array(np.array([3], dtype=np.int64)), [4]))
    for f in g.DESCRIPTOR.fields:  # every field this onnx has (metadata_props since 1.16)
        if f.name == "metadata_props":
            g.metadata_props.add(key="k", value="v")
    model.doc_string = "before the graph"
    model.metadata_props.add(key="after", value="the graph")
    model.functions.append(helper.make_function("dom", "F", ["a"], ["b"],
                                                [helper.make_node("Relu", ["a"], ["b"])],
                                                [helper.make_opsetid("", 17)]))
    _assert_head_is_the_graph_without_initializers(model)


def test_write_streamed_head_through_a_copy_when_a_graph_field_is_not_spelled_out(monkeypatch):
    """A graph field the field-by-field encoding does not spell out (none in onnx.proto today:
    a newer one that is neither a message nor a string) sends the graph through a copy: the
    same first part."""
    model = _model()
    model.graph.doc_string = "g"
    model.metadata_props.add(key="after", value="the graph")
    head = onnx.ModelProto()
    head.CopyFrom(model)
    del head.graph.initializer[:]
    monkeypatch.setattr(protowire, "_without_initializers", lambda graph: None)
    out = io.BytesIO()
    first = protowire.write_streamed(out, model)
    assert out.getvalue()[:first] == head.SerializeToString()
    assert onnx.ModelProto.FromString(out.getvalue()) == model
