"""Bundled examples, the digits MLP, models/build_models.py, and the shared model fixtures."""
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper as nh

from helpers import assert_matches_ort, light_feeds, load_pb
from onnx_cinm.errors import CinmError
from onnx_cinm.examples import EXAMPLES, get_example
from onnx_cinm.golden import random_inputs, run_onnxruntime

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------- examples
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_is_valid_and_runs(name):
    m = get_example(name)
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 10 and [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    (inp,) = m.graph.input
    assert inp.type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 3):
        feeds = random_inputs(m, dims={"batch": batch})
        (y,) = run_onnxruntime(m, feeds)
        assert y.shape == (batch, 10) and y.dtype == np.float32
        assert np.isfinite(y).all()
        if name == "lenet":
            np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=0, atol=1e-5)


def test_examples_are_deterministic_and_unknown_names_are_listed():
    for name in EXAMPLES:
        assert get_example(name).SerializeToString() == get_example(name).SerializeToString()
    with pytest.raises(CinmError, match="lenet.*mlp"):
        get_example("resnet")


def _weights(m):
    return {t.name: nh.to_array(t).astype(np.float64) for t in m.graph.initializer}


def test_mlp_equals_numpy():
    m = get_example("mlp")
    w = _weights(m)
    x = random_inputs(m, dims={"batch": 5})["input"]
    h = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
    h = np.maximum(h @ w["fc2.weight"] + w["fc2.bias"], 0)
    expected = h @ w["fc3.weight"] + w["fc3.bias"]
    (y,) = run_onnxruntime(m, {"input": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def _conv(x, w, b, pad):
    """NCHW cross-correlation, stride 1, with numpy (float64)."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(x, w.shape[2:], axis=(2, 3))  # N C H W kh kw
    return np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]


def _pool(x):
    n, c, hh, ww = x.shape
    return x.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))


def test_lenet_equals_numpy():
    m = get_example("lenet")
    w = _weights(m)
    x = random_inputs(m, dims={"batch": 2})["input"]
    a = _pool(np.maximum(_conv(x.astype(np.float64), w["conv1.weight"], w["conv1.bias"], 2), 0))
    a = _pool(np.maximum(_conv(a, w["conv2.weight"], w["conv2.bias"], 0), 0))
    a = a.reshape(2, -1)
    a = np.maximum(a @ w["fc1.weight"].T + w["fc1.bias"], 0)
    z = a @ w["fc2.weight"] + w["fc2.bias"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    (y,) = run_onnxruntime(m, {"input": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------- digits
def test_digits_mlp_accuracy_matches_sklearn(digits_mlp):
    model, X_test, y_test, sk_acc = digits_mlp
    onnx.checker.check_model(model, full_check=True)
    assert X_test.dtype == np.float32 and X_test.shape == (450, 64)
    assert y_test.dtype == np.int64 and y_test.shape == (450,)
    labels, probs = run_onnxruntime(model, {"X": X_test})
    assert probs.shape == (450, 10)
    ort_acc = float((labels == y_test).mean())
    assert abs(ort_acc - sk_acc) <= 0.005
    assert sk_acc > 0.95
    assert_matches_ort(model, model, feeds=[{"X": X_test}])


# ---------------------------------------------------------------------------------- script
def test_build_models_script(tmp_model_dir, capsys):
    spec = importlib.util.spec_from_file_location("build_models", REPO / "models" / "build_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    assert mod.main(["--out", str(tmp_model_dir), "--skip-digits"]) == 0
    printed = capsys.readouterr().out
    for name in EXAMPLES:
        path = tmp_model_dir / f"{name}.onnx"
        assert path.is_file() and str(path) in printed
        onnx.checker.check_model(str(path), full_check=True)
    assert not (tmp_model_dir / "digits_mlp.onnx").exists()


# ---------------------------------------------------------------------------------- fixtures
def test_light_model_fixture_layout(light_model_paths, light_expected_paths):
    assert len(light_model_paths) == 9
    for name, path in light_model_paths.items():
        assert path.name == f"light_{name}.onnx"
        assert [p.name for p in light_expected_paths[name]] == [f"light_{name}_output_0.pb"]


@pytest.mark.parametrize("name", ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2",
                                  "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"])
def test_light_model_reproduces_shipped_output(name, light_model_paths, light_expected_paths):
    path = light_model_paths[name]
    feeds = light_feeds(path)
    (x,) = feeds.values()
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    outs = run_onnxruntime(path, feeds)
    expected = [load_pb(p) for p in light_expected_paths[name]]
    assert len(outs) == len(expected) == 1
    for got, want in zip(outs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ppocr_fixtures(ppocr_model_paths, ppocr_input_shapes):
    assert set(ppocr_model_paths) == set(ppocr_input_shapes) == {"det", "rec", "cls"}
    for key, path in ppocr_model_paths.items():
        m = onnx.load(str(path))
        (inp,) = m.graph.input
        assert inp.name == "x"
        assert len(inp.type.tensor_type.shape.dim) == len(ppocr_input_shapes[key]) == 4
    # the small one runs at its shape
    cls = ppocr_model_paths["cls"]
    feeds = random_inputs(cls, shapes={"x": ppocr_input_shapes["cls"]})
    (y,) = run_onnxruntime(cls, feeds)
    assert y.shape == (1, 2)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, atol=1e-5)


def test_digits_writer_writes_the_model_and_its_test_set(digits_mlp, tmp_path, monkeypatch, capsys):
    """The README's first command: the model and the labeled test set, as the builder made them
    (the builder itself is the fixture's: training again would take seconds)."""
    import numpy as np
    import onnx

    from onnx_cinm.examples import digits

    monkeypatch.setattr(digits, "build_digits_mlp", lambda: digits_mlp)
    model, data = tmp_path / "d.onnx", tmp_path / "d.npz"
    assert digits.main([str(model), str(data)]) == 0
    assert onnx.load(str(model)).graph.name == "digits_mlp"
    with np.load(data) as z:
        assert np.array_equal(z["X"], digits_mlp.X_test) and z["X"].dtype == np.float32
        assert np.array_equal(z["labels"], digits_mlp.y_test) and z["labels"].shape == (450,)
    assert "written:" in capsys.readouterr().out


def test_digits_writer_without_skl2onnx_is_one_line(tmp_path, monkeypatch, capsys):
    """A fresh install without the test extra: one line naming the missing package and the
    remedy, exit 1, nothing written (it was a traceback from ``python -c``)."""
    import sys

    from onnx_cinm.examples import digits

    monkeypatch.setitem(sys.modules, "skl2onnx", None)  # import skl2onnx -> ImportError
    assert digits.main([str(tmp_path / "d.onnx"), str(tmp_path / "d.npz")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("onnx-cinm: error: the digits model needs scikit-learn and skl2onnx "
                          "(skl2onnx is missing); pip install 'onnx-cinm[test]'")
    assert list(tmp_path.iterdir()) == []
