"""ONNX backend conformance through ``onnx_cinm.backend.CinmBackend`` (issue 7, part 1).

The selection, the expected-failure list and the runner live in ``benchmarks/conformance.py``;
this test runs the same selection and requires every case to pass or to fail for its listed,
verified reason. Expected outputs come from onnx's test data, never from onnx-cinm.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from onnx_cinm.backend import CinmBackend, CinmBackendRep, cinm_provider_runner, onnxruntime_runner

_SPEC = importlib.util.spec_from_file_location(
    "onnx_cinm_conformance", Path(__file__).resolve().parents[1] / "benchmarks" / "conformance.py")
conformance = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = conformance  # dataclasses look their module up there
_SPEC.loader.exec_module(conformance)


@pytest.fixture(scope="module")
def outcomes():
    ort.set_default_logger_severity(4)
    try:
        return conformance.run_all(conformance.collect_cases())
    finally:
        ort.set_default_logger_severity(2)


def test_selection_passes_or_fails_for_its_listed_reason(outcomes):
    counts = conformance.summarize(outcomes)
    failed = [f"{o.case.name}: {o.message}" for o in outcomes if o.status == "failed"]
    assert not failed, f"{len(failed)} conformance failures:\n" + "\n".join(failed[:40])
    assert counts["passed"] + counts["expected_failures"] == counts["run"]
    # the selection really is the node suite of our ops plus the pytorch files (not a handful)
    suites = {o.case.suite for o in outcomes}
    assert suites == {"node", "node-frozen", "pytorch-converted", "pytorch-operator"}
    assert counts["run"] > 1000
    ops = {o.case.op for o in outcomes if o.status == "passed" and o.cinm_ops}
    assert {"Gemm", "MatMul", "Conv", "Add", "Relu", "ReduceSum", "TopK", "Transpose"} <= ops


def test_every_expected_failure_is_selected_and_has_a_reason(outcomes):
    names = {o.case.name for o in outcomes}
    for name, (kind, reason, evidence) in conformance.EXPECTED_FAILURES.items():
        assert name in names, f"{name} is listed as an expected failure but not selected"
        assert kind == "ort" and reason and evidence


def test_table_and_json_counts(outcomes):
    text = conformance.table(outcomes)
    assert text.splitlines()[0].split()[:3] == ["suite", "op", "cases"]
    assert "total" in text
    s = conformance.summarize(outcomes)
    assert set(s) == {"run", "passed", "expected_failures", "failed"}


def _gemm_model():
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
                         [numpy_helper.from_array(w, "w")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10), w


def test_backend_runs_the_optimized_model_through_a_pluggable_runner():
    model, w = _gemm_model()
    seen = []

    def runner(optimized):
        seen.append(optimized)
        return onnxruntime_runner(optimized)

    rep = CinmBackend.prepare(model, runner=runner)
    assert isinstance(rep, CinmBackendRep)
    assert seen and any(n.domain == "cinm" for n in seen[0].graph.node)
    x = np.array([[1, 2, 3, 4], [0, -1, 0, 1]], dtype=np.float32)
    (y,) = rep.run([x])
    np.testing.assert_allclose(y, x @ w, rtol=1e-6)
    (y2,) = rep.run({"x": x})
    np.testing.assert_allclose(y2, x @ w, rtol=1e-6)
    assert CinmBackend.supports_device("CPU") and not CinmBackend.supports_device("CUDA")


def test_backend_works_with_onnx_backend_test_runner():
    """onnx's own BackendTest harness accepts the backend (pytorch-operator addmm/mm cases)."""
    import unittest

    import onnx.backend.test

    bt = onnx.backend.test.BackendTest(CinmBackend, __name__)
    bt.include(r"^test_operator_(addmm|mm)_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(stream=open("/dev/null", "w"), verbosity=0).run(suite)
    ran = result.testsRun - len(result.skipped)
    assert ran == 2 and result.wasSuccessful(), (result.failures, result.errors)


# --- regression tests for bugs the conformance run found --------------------------------------

def test_regression_clip_with_min_only_is_lowered():
    """test_clip_default_min: Clip(x, min) without max failed cinm shape inference."""
    graph = h.make_graph([h.make_node("Clip", ["x", "lo"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, [3, 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [3, 4])],
                         [numpy_helper.from_array(np.array(0.25, np.float32), "lo")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    rep = CinmBackend.prepare(model)
    assert any(n.domain == "cinm" and n.op_type == "Clip" for n in rep.model.graph.node)
    np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, np.float32(0.25)))


def test_regression_reduce_mean_to_scalar_keeps_rank_0():
    """test_nllloss_NCd1_expanded: ReduceMean(keepdims=0) over all axes gave shape (1,), not ().

    The element-count constant of the lowering was made 1-D by np.ascontiguousarray.
    """
    graph = h.make_graph([h.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, [3, 2])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    x = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    (y,) = CinmBackend.prepare(model).run([x])
    assert y.shape == ()
    assert float(y) == pytest.approx(3.5)


def test_selection_through_the_cinm_execution_provider():
    """The same cases executed by the CINM execution provider (device nodes in their kernels:
    crossbar simulator, UPMEM model mode) instead of stock onnxruntime on the optimized model."""
    ort.set_default_logger_severity(4)
    try:
        outcomes = conformance.run_all(conformance.collect_cases(), cinm_provider_runner)
    finally:
        ort.set_default_logger_severity(2)
    counts = conformance.summarize(outcomes)
    failed = [f"{o.case.name}: {o.message}" for o in outcomes if o.status == "failed"]
    assert not failed, f"{len(failed)} failures through the provider:\n" + "\n".join(failed[:40])
    assert counts["passed"] + counts["expected_failures"] == counts["run"] > 1000


def test_a_value_fed_for_an_initializer_input_is_refused_not_ignored(capsys, tmp_path):
    """IR 3 style: W and B are initializers *and* graph inputs (overridable defaults). onnx-cinm
    compiles them as constants, so feeding them must fail loudly, not silently use the default."""
    from onnx_cinm.cli import main
    from onnx_cinm.errors import CinmError

    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.array([1.0, -1.0], np.float32)
    graph = h.make_graph([h.make_node("Gemm", ["x", "W", "B"], ["y"])], "g",
                         [h.make_tensor_value_info(n, TP.FLOAT, s)
                          for n, s in (("x", [1, 3]), ("W", [3, 2]), ("B", [2]))],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 2])],
                         [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    rep = CinmBackend.prepare(model)
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    (y,) = rep.run({"x": x})
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-6)  # the defaults, when nothing is fed
    with pytest.raises(CinmError, match="W are initializers"):
        rep.run({"x": x, "W": w * 2})
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-v"]) == 0
    assert "2 graph input(s) with initializers (W, B) are compiled as constants" in \
        capsys.readouterr().err
