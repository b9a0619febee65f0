"""Tests for onnx_cinm.frontend: loading (and every way it can fail), atomic saving, external
data, shape inference and input-shape overrides. Expected values come from onnxruntime on the
original model (``golden.run_onnxruntime``, ``ORT_DISABLE_ALL``)."""
from __future__ import annotations

import os
import stat
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import frontend
from onnx_cinm.errors import CinmError
from onnx_cinm.golden import run_onnxruntime


def _model(nodes, inputs, outputs, initializers=None, opset=13, ir_version=10, **graph_kw):
    graph = helper.make_graph(
        nodes, "test", inputs, outputs,
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
        **graph_kw)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def _relu_model(opset=13):
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], opset=opset)


def _weights_model():
    """y = x @ w + b; w is float32 [64, 64] (16 KiB), b float32 [64] (256 bytes)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                   helper.make_node("Add", ["m", "b"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
                  {"w": w, "b": b})


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _assert_cinm_error(path, *fragments):
    with pytest.raises(CinmError) as info:
        frontend.load_model(path)
    message = str(info.value)
    assert "\n" not in message and message
    for fragment in fragments:
        assert fragment in message
    return message


# --- load_model errors ---------------------------------------------------------------------


def test_load_missing_file(tmp_path):
    _assert_cinm_error(tmp_path / "nope.onnx", "no such file")


def test_load_directory(tmp_path):
    _assert_cinm_error(tmp_path, "is a directory")


def test_load_empty_file(tmp_path):
    _assert_cinm_error(_write(tmp_path / "e.onnx", b""), "is empty")


@pytest.mark.parametrize("data", [os.urandom(4096), b"this is a text file\n" * 20],
                         ids=["random", "text"])
def test_load_not_protobuf(tmp_path, data):
    _assert_cinm_error(_write(tmp_path / "r.onnx", data), "not an ONNX model")


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.999])
def test_load_truncated(tmp_path, light_model_paths, fraction):
    data = light_model_paths["resnet50"].read_bytes()
    _assert_cinm_error(_write(tmp_path / "t.onnx", data[: int(len(data) * fraction)]))


def test_load_no_graph(tmp_path):
    model = onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 13)])
    _assert_cinm_error(_write(tmp_path / "g.onnx", model.SerializeToString()), "has no graph")


@pytest.mark.parametrize("opset", [8, 99])
def test_load_unsupported_opset(tmp_path, opset):
    path = _write(tmp_path / "o.onnx", _relu_model(opset).SerializeToString())
    _assert_cinm_error(path, f"unsupported opset {opset}")


def test_load_unknown_domain(tmp_path):
    model = _relu_model()
    model.graph.node.append(helper.make_node("Gemv", ["y"], ["z"], domain="cinm"))
    path = _write(tmp_path / "d.onnx", model.SerializeToString())
    _assert_cinm_error(path, "domain 'cinm'", "no opset_import")


def test_load_checker_failure_is_one_line(tmp_path):
    model = _relu_model()
    model.graph.node.append(helper.make_node("Relu", ["undefined"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4]))
    _assert_cinm_error(_write(tmp_path / "c.onnx", model.SerializeToString()),
                       "not a valid ONNX model")


def test_load_refuses_a_declared_shape_overflowing_int64_naming_its_dims(tmp_path):
    # 2**40 * 2**40 = 2**80 > 2**63 - 1; the dim parameter and the -1 (an exporter's
    # "unknown") count 1 and are named as written
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, "n", -1, 2**40])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    _assert_cinm_error(_write(tmp_path / "o.onnx", model.SerializeToString()),
                       "graph input 'x' has shape [1099511627776, 'n', -1, 1099511627776], whose "
                       "element count overflows int64")


def test_load_takes_a_declared_shape_at_the_int64_limit(tmp_path):
    # 2**62 * 1 (a -1) * 1 (a dim parameter) * 1 (a dim without a value) <= 2**63 - 1
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**62, -1, "n", None])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**62, -1, "n", None])])
    loaded = frontend.load_model(_write(tmp_path / "l.onnx", model.SerializeToString()))
    assert [d.dim_value for d in loaded.graph.input[0].type.tensor_type.shape.dim] == \
        [2**62, -1, 0, 0]


def _external_model(tmp_path, location="w.data"):
    """Save the weights model with its tensors in ``location`` (relative to tmp_path)."""
    model = _weights_model()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location=location,
              size_threshold=0)
    return tmp_path / "m.onnx"


def test_load_external_data_missing(tmp_path):
    path = _external_model(tmp_path)
    os.remove(tmp_path / "w.data")
    _assert_cinm_error(path, "external data file 'w.data'", "not found")


def test_load_external_data_truncated(tmp_path):
    path = _external_model(tmp_path)
    with open(tmp_path / "w.data", "r+b") as handle:
        handle.truncate(100)
    _assert_cinm_error(path, "too short")


@pytest.mark.parametrize("location", ["../w.data", "sub/../../w.data", "/tmp/w.data"])
def test_load_external_data_escaping(tmp_path, location):
    model = _weights_model()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="w.data",
              size_threshold=0)
    saved = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path = _write(tmp_path / "escape.onnx", saved.SerializeToString())
    _assert_cinm_error(path, "not a relative path inside the model's folder")


# --- load_model success --------------------------------------------------------------------


def test_load_external_data_relative_to_model_folder(tmp_path, monkeypatch):
    path = _external_model(tmp_path)
    monkeypatch.chdir("/")
    model = frontend.load_model(path)
    expected = _weights_model()
    for got, want in zip(model.graph.initializer, expected.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))
        assert got.data_location == TensorProto.DEFAULT


def test_load_light_vgg19_is_fast(light_model_paths):
    start = time.perf_counter()
    model = frontend.load_model(light_model_paths["vgg19"])
    assert time.perf_counter() - start < 0.5
    assert model.graph.node


def test_load_accepts_pathlike_and_str(light_model_paths):
    path = light_model_paths["squeezenet"]
    assert frontend.load_model(path) == frontend.load_model(str(path))


# --- save_model ----------------------------------------------------------------------------


def _feeds(batch=3):
    return {"x": np.random.default_rng(1).standard_normal((batch, 64)).astype(np.float32)}


def test_save_roundtrip_leaves_no_temporaries(tmp_model_dir):
    model = _weights_model()
    target = tmp_model_dir / "out.onnx"
    frontend.save_model(model, target)
    assert sorted(os.listdir(tmp_model_dir)) == ["out.onnx"]
    loaded = frontend.load_model(target)
    np.testing.assert_array_equal(run_onnxruntime(loaded, _feeds())[0],
                                  run_onnxruntime(model, _feeds())[0])
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_save_external_data(tmp_model_dir):
    model = _weights_model()
    before = model.SerializeToString()
    target = tmp_model_dir / "big.onnx"
    frontend.save_model(model, target, external_data_threshold_bytes=1000)
    assert model.SerializeToString() == before  # the caller's model is not modified
    assert sorted(os.listdir(tmp_model_dir)) == ["big.onnx", "big.onnx.data"]
    assert os.path.getsize(target) < 2000
    header = onnx.load(target, load_external_data=False)
    external = [t for t in header.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert [t.name for t in external] == ["w"]  # b (256 bytes) stays inline
    offset = {e.key: e.value for e in external[0].external_data}["offset"]
    assert int(offset) % 4096 == 0
    # onnxruntime reads it from the path, and load_model brings the weights back
    np.testing.assert_array_equal(run_onnxruntime(str(target), _feeds())[0],
                                  run_onnxruntime(model, _feeds())[0])
    loaded = frontend.load_model(target)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]),
                                  numpy_helper.to_array(model.graph.initializer[0]))


def test_save_overwrites_its_own_input_with_external_data(tmp_model_dir):
    target = tmp_model_dir / "m.onnx"
    frontend.save_model(_weights_model(), target, external_data_threshold_bytes=1000)
    model = frontend.load_model(target)
    frontend.save_model(model, target, external_data_threshold_bytes=1000)
    reloaded = frontend.load_model(target)
    np.testing.assert_array_equal(run_onnxruntime(reloaded, _feeds())[0],
                                  run_onnxruntime(_weights_model(), _feeds())[0])


def test_save_missing_folder(tmp_path):
    with pytest.raises(CinmError, match="does not exist") as info:
        frontend.save_model(_relu_model(), tmp_path / "no" / "such" / "m.onnx")
    assert "\n" not in str(info.value)


def test_save_onto_a_directory_cleans_up(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(CinmError, match="cannot write") as info:
        frontend.save_model(_relu_model(), tmp_path / "taken")
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == ["taken"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores folder permissions")
def test_save_unwritable_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(CinmError, match="cannot write"):
            frontend.save_model(_relu_model(), folder / "m.onnx")
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("threshold", [1_800_000_000, 1000])
def test_save_failure_keeps_old_file_and_removes_temporaries(tmp_model_dir, monkeypatch,
                                                             threshold):
    target = tmp_model_dir / "m.onnx"
    frontend.save_model(_relu_model(), target)
    old = target.read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(frontend.os, "replace", failing_replace)
    with pytest.raises(CinmError, match="No space left on device"):
        frontend.save_model(_weights_model(), target, external_data_threshold_bytes=threshold)
    assert target.read_bytes() == old
    assert os.listdir(tmp_model_dir) == ["m.onnx"]


# --- infer_shapes ---------------------------------------------------------------------------


def _reshape_chain_model(dims):
    """Reshape(X, Concat(Unsqueeze(Gather(Shape(X), 0)), [16])) on X of shape ``dims``.

    Opset 17: Reshape-13's shape inference ignores propagated data, Reshape-14's uses it.
    """
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "sixteen"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
                   "sixteen": np.array([16], np.int64)}, opset=17)


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_infer_shapes_data_propagation():
    model = frontend.infer_shapes(_reshape_chain_model(["batch", 4, 4]))
    assert _dims(model.graph.output[0]) == ["batch", 16]


def test_infer_shapes_strict_error_is_cinm_error():
    model = _model([helper.make_node("Add", ["a", "b"], ["c"])],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
                   [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    with pytest.raises(CinmError, match="shape inference failed") as info:
        frontend.infer_shapes(model, strict=True)
    assert "\n" not in str(info.value)
    frontend.infer_shapes(model, strict=False)  # lenient: no error


def test_infer_shapes_gives_reshape_of_runtime_shape_a_rank():
    # Reshape(x, Concat(Shape(x)[:2], [-1])): onnx alone infers nothing for y, not even a rank
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], end=2),
        helper.make_node("Concat", ["s", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
        helper.make_node("Transpose", ["y"], ["z"], perm=[0, 2, 1]),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["N", 8, "H", "W"])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                   {"minus_one": np.array([-1], np.int64)})
    plain = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert not plain.graph.output[0].type.tensor_type.HasField("shape")
    frontend.infer_shapes(model)
    assert len(model.graph.output[0].type.tensor_type.shape.dim) == 3


def test_infer_shapes_keeps_weights_and_ignores_their_size():
    model = _weights_model()
    weights = [t.SerializeToString() for t in model.graph.initializer]
    frontend.infer_shapes(model)
    assert [t.SerializeToString() for t in model.graph.initializer] == weights
    assert _dims(model.graph.output[0]) == ["N", 64]
    assert [v.name for v in model.graph.value_info] == ["m"]
    assert [i.name for i in model.graph.input] == ["x"]


def _static_chain_model():
    """x[2, 64] -> MatMul(w[64, 64]) -> Add(b[64]) -> Relu -> y; shape [2, 1] kept small."""
    rng = np.random.default_rng(1)
    return _model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                   helper.make_node("Add", ["m", "b"], ["a"]),
                   helper.make_node("Relu", ["a"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                  {"b": rng.standard_normal(64).astype(np.float32),
                   "w": rng.standard_normal((64, 64)).astype(np.float32),
                   "s": np.int64([2, 1])})


def test_keep_inferred_types_leaves_what_a_fresh_inference_does():
    """Entries out of node order and one of a tensor no node writes: the same model as
    deleting value_info and inferring afresh (onnx's own inference is the reference)."""
    fresh = _static_chain_model()
    frontend.infer_shapes(fresh, strict=False)
    kept = _static_chain_model()
    kept.graph.value_info.extend([helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 64]),
                                  helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
                                  helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 64])])
    assert frontend.keep_inferred_types(kept)
    assert [v.name for v in fresh.graph.value_info] == ["m", "a"]
    assert [t.name for t in fresh.graph.initializer] == ["w", "b", "s"]  # small ones last
    assert kept.SerializeToString() == fresh.SerializeToString()


@pytest.mark.parametrize("entry", [
    None,  # an output with no entry: inference has something to add
    helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", 64]),  # a dim without a size
    helper.make_tensor_value_info("m", TensorProto.FLOAT, None),  # no shape
])
def test_keep_inferred_types_refuses_what_inference_would_change(entry):
    model = _static_chain_model()
    model.graph.value_info.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 64]))
    if entry is not None:
        model.graph.value_info.append(entry)
    before = model.SerializeToString()
    assert not frontend.keep_inferred_types(model)
    assert model.SerializeToString() == before


def test_keep_inferred_types_refuses_a_graph_computing_shapes():
    """Shape arithmetic may be sized by the passes' analysis beyond onnx's inference: a graph
    with a Shape node is inferred afresh, even when every entry is static."""
    model = _model([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model.graph.value_info.append(helper.make_tensor_value_info("s", TensorProto.INT64, [2]))
    before = model.SerializeToString()
    assert not frontend.keep_inferred_types(model)
    assert model.SerializeToString() == before


def test_infer_shapes_through_a_file_above_the_protobuf_limit(monkeypatch):
    monkeypatch.setattr(frontend, "PROTOBUF_LIMIT", 10)  # every model counts as > 2 GiB
    model = frontend.infer_shapes(_reshape_chain_model(["batch", 4, 4]))
    assert _dims(model.graph.output[0]) == ["batch", 16]


# --- overwrite_input_shapes / parse_shape_spec ---------------------------------------------


def test_overwrite_input_shapes_bakes_dims_and_reinference_refreshes_outputs():
    model = frontend.infer_shapes(_reshape_chain_model(["batch", 4, 4]))
    frontend.overwrite_input_shapes(model, {"x": [2, 4, 4]})
    assert _dims(model.graph.input[0]) == [2, 4, 4]
    frontend.infer_shapes(model)
    assert _dims(model.graph.output[0]) == [2, 16]
    out = run_onnxruntime(model, {"x": np.ones((2, 4, 4), np.float32)})[0]
    assert out.shape == (2, 16)


def test_overwrite_input_shapes_skips_initializer_inputs(light_model_paths):
    model = frontend.load_model(light_model_paths["squeezenet"])
    frontend.overwrite_input_shapes(model, {"data_0": [1, 3, 224, 224]})
    with pytest.raises(CinmError, match="no input 'conv1_w_0'"):
        frontend.overwrite_input_shapes(model, {"conv1_w_0": [64, 3, 3, 3]})


@pytest.mark.parametrize("shapes, fragment", [
    ({"nope": [1, 4]}, "has no input 'nope'"),
    ({"x": [1, 4, 4, 1]}, "has rank 3, got 4 dimensions"),
    ({"x": [0, 4, 4]}, "must be positive"),
])
def test_overwrite_input_shapes_errors(shapes, fragment):
    with pytest.raises(CinmError, match=fragment) as info:
        frontend.overwrite_input_shapes(_reshape_chain_model(["batch", 4, 4]), shapes)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("data_0:1,3,224,224", ("data_0", [1, 3, 224, 224])),
    ("input:0:1,2", ("input:0", [1, 2])),
    ("gpu_0/data_0:7", ("gpu_0/data_0", [7])),
])
def test_parse_shape_spec(text, expected):
    assert frontend.parse_shape_spec(text) == expected


@pytest.mark.parametrize("text", ["x", ":1,2", "x:", "x:1,,2", "x:1,a", "x:1,-3", "x:0"])
def test_parse_shape_spec_errors(text):
    with pytest.raises(CinmError, match="bad shape spec") as info:
        frontend.parse_shape_spec(text)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_model_above_2gib_round_trip(tmp_model_dir):
    # field notes §5 #11: > 2 GiB must go through paths and external data, never one protobuf
    from onnx_cinm.passes import PassContext, get_pass

    rows, columns = 210_000, 1000  # float32 -> 840 MB per tensor, 2.5 GB in all
    arrays = {f"w{i}": np.arange(rows * columns, dtype=np.float32).reshape(rows, columns) * (i + 1)
              for i in range(3)}
    model = _model([helper.make_node("Gather", [name, "idx"], [f"g{i}"])
                    for i, name in enumerate(arrays)]
                   + [helper.make_node("Sum", ["g0", "g1", "g2"], ["y"])],
                   [helper.make_tensor_value_info("idx", TensorProto.INT64, ["k"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k", columns])])
    for name, array in arrays.items():
        tensor = model.graph.initializer.add()
        tensor.name, tensor.data_type = name, TensorProto.FLOAT
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.tobytes()
    target = tmp_model_dir / "big.onnx"
    frontend.save_model(model, target)  # above 2 GiB: external data whatever the threshold
    assert os.path.getsize(target) < 10_000
    assert os.path.getsize(tmp_model_dir / "big.onnx.data") >= 3 * 4 * rows * columns
    loaded = frontend.load_model(target)
    ctx = PassContext()
    for name in ["canonicalize_opset", "fold_constants"]:
        loaded = get_pass(name)(loaded, ctx)
    assert _dims(loaded.graph.output[0]) == ["k", columns]
    frontend.save_model(loaded, tmp_model_dir / "again.onnx")
    idx = np.array([0, 7, rows - 1], np.int64)
    expected = sum(array[idx] for array in arrays.values())
    got = run_onnxruntime(str(tmp_model_dir / "again.onnx"), {"idx": idx})[0]
    np.testing.assert_array_equal(got, expected)


def test_save_model_streams_initializers_and_reads_back_exactly(tmp_path):
    """save_model writes the weights one initializer at a time (no serialization of the whole
    model); the file must parse back to exactly the model, initializer order included."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"w{k}")
             for k, s in enumerate([(300, 200), (3,), (1,), (64, 64, 3)])]
    inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "shape"))
    g = helper.make_graph([helper.make_node("Add", ["x", "w1"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], inits,
                          doc_string="streamed")
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.metadata_props.add(key="k", value="v")
    frontend.save_model(model, tmp_path / "m.onnx")
    back = onnx.load(str(tmp_path / "m.onnx"))
    assert back.SerializeToString() == model.SerializeToString()
    assert [t.name for t in back.graph.initializer] == ["w0", "w1", "w2", "w3", "shape"]


# --- load_model parses the file once ---------------------------------------------------------


def _big_weights_model(rows=256):
    """y = x @ w; w float32 [rows, 64] (more elements than frontend.WEIGHTLESS_MAX_ELEMENTS)."""
    w = np.arange(rows * 64, dtype=np.float32).reshape(rows, 64)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])], {"w": w})


def test_load_parses_the_file_once(tmp_path, monkeypatch):
    """One protobuf parse of the file; the checker gets the model without the large weight (it
    parsed the whole file again before: a second copy of every weight, in C++)."""
    path = tmp_path / "big.onnx"
    onnx.save(_big_weights_model(), path)
    parses, checked = [], []
    real_parse, real_load, real_check = (onnx.load_model_from_string, onnx.load_model,
                                         onnx.checker.check_model)
    monkeypatch.setattr(onnx, "load_model_from_string",
                        lambda data, *a, **k: parses.append(len(data)) or real_parse(data, *a, **k))
    monkeypatch.setattr(onnx, "load_model", lambda *a, **k: parses.append(a) or real_load(*a, **k))
    monkeypatch.setattr(onnx.checker, "check_model",
                        lambda m, *a, **k: checked.append(m) or real_check(m, *a, **k))
    model = frontend.load_model(path)
    assert parses == [path.stat().st_size]
    assert len(checked) == 1 and isinstance(checked[0], onnx.ModelProto)
    assert checked[0].ByteSize() < 1024  # the 64 KiB weight is not in it
    assert [t.name for t in checked[0].graph.initializer] == []
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                                  np.arange(256 * 64, dtype=np.float32).reshape(256, 64))


def test_load_big_tensor_short_raw_data_is_refused(tmp_path):
    """The checker's rule for the weights it no longer sees: raw_data at least elements x itemsize."""
    model = _big_weights_model()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    path = _write(tmp_path / "short.onnx", model.SerializeToString())
    _assert_cinm_error(path, "not a valid ONNX model", "tensor name: w",
                       "raw_data size (65532 bytes) is too small", "65536 bytes required")


def test_load_big_tensor_two_value_fields_is_refused(tmp_path):
    model = _big_weights_model()
    model.graph.initializer[0].float_data.append(1.0)
    path = _write(tmp_path / "two.onnx", model.SerializeToString())
    _assert_cinm_error(path, "not a valid ONNX model", "one and only one value field")


def test_load_big_tensor_checked_by_onnx_still(tmp_path):
    """A large weight of a type the frontend does not check itself (strings) still goes to the
    checker: a STRING tensor in raw_data is refused as before."""
    model = _big_weights_model()
    tensor = model.graph.initializer[0]
    tensor.data_type = TensorProto.STRING
    path = _write(tmp_path / "str.onnx", model.SerializeToString())
    _assert_cinm_error(path, "not a valid ONNX model", "STRING data")


def test_load_big_external_tensor_short_length_is_refused(tmp_path):
    model = _big_weights_model()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="w.data",
              size_threshold=0)
    saved = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    for entry in saved.graph.initializer[0].external_data:
        if entry.key == "length":
            entry.value = "1000"
    path = _write(tmp_path / "ext.onnx", saved.SerializeToString())
    _assert_cinm_error(path, "raw_data size (1000 bytes) is too small")


def test_subgraphs_are_an_ifs_branches_and_no_cinm_ops():
    """An If's two branches, in attribute order (make_node sorts them: else, then); a cinm op
    (dozens of plan attributes, none a graph: its schema declares none) has no body, and
    neither has a node without graphs."""
    def branch(name):
        return helper.make_graph([helper.make_node("Identity", ["x"], [name])], name, [],
                                 [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("t"), else_branch=branch("e"))
    assert [g.name for g in frontend.subgraphs(node)] == ["e", "t"]
    planned = helper.make_node("Gemm", ["a", "b"], ["y"], domain="cinm", device="upmem",
                               plan_tiles=[4, 4], plan_cost=1.5)
    assert frontend.subgraphs(planned) == []
    assert frontend.subgraphs(helper.make_node("Relu", ["x"], ["r"])) == []
    graph = helper.make_graph([planned, node], "g", [], [])
    assert [g.name for g in frontend.iter_graphs(graph)] == ["g", "e", "t"]


def test_save_reports_a_failed_flush_and_leaves_no_file(tmp_path, monkeypatch):
    """The model's fsync runs in a thread (frontend.stage_model): its error still fails the
    save, as one line, with nothing left behind."""
    import errno

    def fail(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(CinmError, match=r"cannot write '.*m\.onnx': Input/output error"):
        frontend.save_model(_relu_model(), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_a_patched_staged_model_is_placed_without_fdatasync(tmp_path, monkeypatch):
    """Where os has no fdatasync (macOS), placing a patched model flushes the patch with
    fsync: the file holds the patched bytes, nothing else is left."""
    monkeypatch.delattr(os, "fdatasync", raising=False)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    _stage_patch_and_place(tmp_path)
    assert len(synced) == 2  # the staging thread's flush, then the patch's


def _stage_patch_and_place(tmp_path, absent: bool = False) -> None:
    """Stage a model whose doc_string is marker-A, patch it to marker-B (first a patch of bytes
    it does not hold, when ``absent``: refused), place it: the file is that model's bytes."""
    model = _relu_model()
    model.doc_string = "marker-A"
    staged = frontend.stage_model(model, tmp_path / "m.onnx")
    try:
        if absent:
            assert not staged.patch(b"absent-1", b"absent-2")
        assert staged.patch(b"marker-A", b"marker-B")
        staged.place()
    finally:
        staged.discard()
    model.doc_string = "marker-B"
    assert (tmp_path / "m.onnx").read_bytes() == model.SerializeToString()
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_staged_model_patch_needs_one_occurrence(tmp_path):
    _stage_patch_and_place(tmp_path, absent=True)


def test_load_refuses_a_cinm_op_with_a_graph_attribute(tmp_path):
    """No cinm op takes a graph (its schema declares none), so the walks before the checker do
    not look inside one (frontend.subgraphs); load refuses such a node itself, in one line,
    before any of those walks: the external data of a tensor inside that body, pointing out of
    the model's folder, is never read (nor its location taken for checked)."""
    import onnx_cinm.dialects.cinm  # noqa: F401  (the cinm schemas, for the checker)

    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (tmp_path / "m").mkdir()
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4],
                         data_location=TensorProto.EXTERNAL)
    weight.external_data.add(key="location", value="../secret.bin")
    body = helper.make_graph([helper.make_node("Identity", ["w"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])], [weight])
    node = helper.make_node("Relu", ["x"], ["y"], domain="cinm", body=body)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                     helper.make_opsetid("cinm", 1)])
    (tmp_path / "m" / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(CinmError, match=r"^'.*m\.onnx': cinm op Relu writing 'y' has a graph "
                                        r"attribute; no cinm op takes one$"):
        frontend.load_model(tmp_path / "m" / "m.onnx")
    with pytest.raises(CinmError, match="has a graph attribute"):
        frontend.validate_structure(model)


def test_without_initializers_copies_the_graph_once_into_the_same_bytes():
    """The weightless copies (strip_weights, the checker's and the external-data skeletons)
    copy the graph straight into the copy: the same bytes as a graph built apart and copied
    in, also for a model whose graph has nothing but initializers or nothing at all (the graph
    field present all the same)."""
    from onnx_cinm.protowire import copy_except

    def twice(model):
        skeleton = copy_except(model, "graph")
        skeleton.graph.CopyFrom(copy_except(model.graph, "initializer"))
        return skeleton

    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    full = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w], doc_string="d"),
        opset_imports=[helper.make_opsetid("", 13)])
    only_weights = onnx.ModelProto(ir_version=8)
    only_weights.graph.initializer.append(w)
    for model in (full, only_weights, onnx.ModelProto(ir_version=8)):
        copied = frontend._without_initializers(model)
        assert copied.HasField("graph") and not len(copied.graph.initializer)
        assert copied.SerializeToString() == twice(model).SerializeToString()


def test_strip_weights_keeps_the_small_initializers_in_order_and_moves_the_large():
    """strip_weights appends the small initializers at once: the same bytes as one at a
    time, in the model's order, interleaved with large ones (by hand: a [2] and a [3] tensor
    kept, a 2,000-element one moved to the inputs, one already an input left as it is)."""
    def tensor(name, n):
        return numpy_helper.from_array(np.arange(n, dtype=np.float32), name)

    inits = [tensor("a", 2), tensor("big", 2000), tensor("b", 3), tensor("in", 1500)]
    graph = helper.make_graph(
        [helper.make_node("Sum", ["x", "a", "b"], ["y"]), helper.make_node("Sum", ["big"], ["z"]),
         helper.make_node("Sum", ["in"], ["v"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("in", TensorProto.FLOAT, [1500])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yzv"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    skeleton, moved = frontend.strip_weights(model)
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    del expected.graph.initializer[:]
    for t in (inits[0], inits[2]):  # one at a time
        expected.graph.initializer.append(t)
    expected.graph.input.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, [2000]))
    assert moved == {"big"}
    assert skeleton.SerializeToString() == expected.SerializeToString()
