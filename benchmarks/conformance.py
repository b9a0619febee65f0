"""ONNX backend conformance of onnx-cinm: onnx's own test cases run through ``CinmBackend``.

Every selected case is compiled by ``onnx_cinm.optimize`` (check off) and executed with stock
onnxruntime on the optimized model (``onnx_cinm.backend.CinmBackend``); its outputs are compared
with the expected outputs that ship with onnx, at the case's own ``rtol``/``atol``.

Selection
---------
- every node case (generated in memory by onnx >= 1.23, ``load_model_tests(kind="node")``) whose
  graph holds an op of :data:`SELECTED_OPS` -- the op's own cases and every ``_expanded``
  function body that uses it (LayerNormalization, attention, losses ...);
- the same node cases with their non-first inputs frozen as initializers (:func:`frozen_variant`);
- ``pytorch-converted`` and ``pytorch-operator`` cases (files in the onnx wheel) whose graph
  holds an op of :data:`SELECTED_OPS`.

A case either passes, or is listed in :data:`EXPECTED_FAILURES` with its reason. Reasons of kind
``"ort"`` claim that stock onnxruntime cannot run the *original* model either; that claim is
checked on every run (a case whose original does run is reported as failed, so the list cannot
go stale silently).

Usage::

    python benchmarks/conformance.py            # table per op, then the expected failures
    python benchmarks/conformance.py --json     # {"run", "passed", "expected_failures", "failed"}
    python benchmarks/conformance.py -v         # one line per case
    python benchmarks/conformance.py --runner cinm   # execute with the CINM execution provider
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_cinm.text import Column, table as text_table

#: Op types ``to_cinm`` lowers (MatMul, Gemm, Conv, elementwise, Reduce*, CumSum, TopK,
#: Transpose) or the frontend passes rewrite (BatchNormalization folding, Gemm/Reduce
#: normalization, Softmax/LogSoftmax/Hardmax opset lifting). A case is selected when its main
#: graph holds at least one of them.
SELECTED_OPS = frozenset({
    "Gemm", "MatMul", "Conv", "BatchNormalization",
    "Add", "Sub", "Mul", "Div", "Max", "Min",
    "Relu", "Abs", "Neg", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid",
    "Clip", "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceMean",
    "CumSum", "TopK", "Transpose", "Softmax", "LogSoftmax", "Hardmax",
})

_ORT = "ort"      # stock onnxruntime cannot run the original model either (checked at run time)
_NO_KERNEL = "Could not find an implementation for "

#: case name -> (kind, reason, evidence). Kind "ort": running the *original* model in stock
#: onnxruntime must fail with an error containing ``evidence``; checked on every run. The frozen
#: variant of a listed case (``<name>_frozen``) inherits the entry.
EXPECTED_FAILURES: dict[str, tuple[str, str, str]] = {
    "test_max_int16": (_ORT, "onnxruntime 1.32 has no int16 Max kernel", _NO_KERNEL + "Max(13)"),
    "test_max_uint16": (_ORT, "onnxruntime 1.32 has no uint16 Max kernel", _NO_KERNEL + "Max(13)"),
    "test_min_int16": (_ORT, "onnxruntime 1.32 has no int16 Min kernel", _NO_KERNEL + "Min(13)"),
    "test_min_uint16": (_ORT, "onnxruntime 1.32 has no uint16 Min kernel", _NO_KERNEL + "Min(13)"),
    "test_top_k_uint64": (_ORT, "onnxruntime 1.32 has no uint64 TopK-24 kernel",
                          _NO_KERNEL + "TopK(24)"),
    "test_reduce_max_empty_set_bool": (
        _ORT, "onnxruntime 1.32 refuses ReduceMax of a bool tensor over an empty set at run time",
        "ReduceMax is not defined for empty set with bool type"),
    "test_attention_3d_causal_bf16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Expand-13 kernel", _NO_KERNEL + "Expand(13)"),
    "test_attention_4d_causal_bf16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Expand-13 kernel", _NO_KERNEL + "Expand(13)"),
    "test_attention_4d_padded_kv_bf16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Add-14 kernel", _NO_KERNEL + "Add(14)"),
    "test_attention_4d_causal_padded_kv_bf16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Add-14 kernel", _NO_KERNEL + "Add(14)"),
    "test_attention_4d_attn_mask_causal_bf16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Add-14 kernel", _NO_KERNEL + "Add(14)"),
    "test_celu_bfloat16_expanded": (
        _ORT, "onnxruntime 1.32 has no bfloat16 Div-14 kernel", _NO_KERNEL + "Div(14)"),
    "test_range_bfloat16_type_positive_delta_expanded": (
        _ORT, "onnxruntime 1.32's Python API cannot take bfloat16 input arrays",
        "can't be converted to MLDataType"),
    "test_swiglu_expanded": (_ORT, "onnxruntime 1.32 has no Swish-24 kernel", "Swish(24)"),
    "test_swiglu_alpha_expanded": (_ORT, "onnxruntime 1.32 has no Swish-24 kernel", "Swish(24)"),
    "test_swiglu_float16_expanded": (_ORT, "onnxruntime 1.32 has no float16 Swish-24 kernel",
                                     "Swish(24)"),
}


@dataclass
class Case:
    """One conformance case: a model and its (inputs, expected outputs) sets."""

    name: str
    suite: str          # "node", "pytorch-converted", "pytorch-operator"
    op: str             # op type the case is filed under
    model: onnx.ModelProto
    data_sets: list = field(default_factory=list)
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass
class Outcome:
    """What happened to one case."""

    case: Case
    status: str         # "passed", "xfail", "failed"
    message: str = ""
    cinm_ops: int = 0
    seconds: float = 0.0


def _load_node_cases() -> list[Case]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np_err = np.seterr(all="ignore")
        try:
            generated = load_model_tests(kind="node")
        finally:
            np.seterr(**np_err)
    cases = []
    for tc in generated:
        ops = [n.op_type for n in tc.model.graph.node
               if n.op_type in SELECTED_OPS and n.domain in ("", "ai.onnx")]
        if ops:
            cases.append(Case(tc.name, "node", ops[0], tc.model, list(tc.data_sets), tc.rtol,
                              tc.atol))
    return cases


def _load_file_cases(kind: str) -> list[Case]:
    from onnx.backend.test.loader import load_model_tests

    cases = []
    for tc in load_model_tests(kind=kind):
        model = onnx.load(os.path.join(tc.model_dir, "model.onnx"))
        ops = [n.op_type for n in model.graph.node if n.op_type in SELECTED_OPS]
        if not ops:
            continue
        data_sets = []
        for folder in sorted(glob.glob(os.path.join(tc.model_dir, "test_data_set_*"))):
            def read(prefix: str) -> list[np.ndarray]:
                files = sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")),
                               key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
                return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]
            data_sets.append((read("input"), read("output")))
        cases.append(Case(tc.name, kind, ops[0], model, data_sets, tc.rtol, tc.atol))
    return cases


def frozen_variant(case: Case) -> Case | None:
    """The case with every graph input but the first turned into an initializer (its test value).

    onnx's node cases feed weights, ``axes``, ``k`` and CumSum's ``axis`` as graph inputs, so
    ``to_cinm`` sees them as run-time values and keeps e.g. every opset-18 Reduce and every TopK
    on the host. Freezing them exercises the constant-operand paths (transposed Gemv weights,
    reshaped Conv weights, constant axes and k) on the same official data. None when the case
    has one input, several data sets, or a non-tensor input.
    """
    inits = {t.name for t in case.model.graph.initializer}
    inputs = [i for i in case.model.graph.input if i.name not in inits]
    if len(inputs) < 2 or len(case.data_sets) != 1:
        return None
    values, expected = case.data_sets[0]
    if len(values) != len(inputs) or any(not isinstance(v, np.ndarray) for v in values):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    del model.graph.input[:]
    model.graph.input.extend([inputs[0]])
    for info, value in zip(inputs[1:], values[1:]):
        model.graph.initializer.append(numpy_helper.from_array(value, info.name))
    return Case(case.name + "_frozen", case.suite + "-frozen", case.op, model,
                [([values[0]], expected)], case.rtol, case.atol)


def collect_cases() -> list[Case]:
    """The selected cases: node cases holding a :data:`SELECTED_OPS` op, their frozen variants
    (:func:`frozen_variant`), then the pytorch ones."""
    node = _load_node_cases()
    frozen = [f for f in map(frozen_variant, node) if f is not None]
    return node + frozen + _load_file_cases("pytorch-converted") + \
        _load_file_cases("pytorch-operator")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {line}"[:240]


def _compare(case: Case, outputs, expected) -> None:
    if len(outputs) != len(expected):
        raise AssertionError(f"{len(outputs)} outputs, expected {len(expected)}")
    for i, (got, want) in enumerate(zip(outputs, expected)):
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype:
            raise AssertionError(f"output {i}: dtype {got.dtype}, expected {want.dtype}")
        if got.shape != want.shape:
            raise AssertionError(f"output {i}: shape {got.shape}, expected {want.shape}")
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, equal_nan=True,
                                       err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"output {i}")


def _run(case: Case, runner) -> int:
    """Run ``case`` through ``CinmBackend``; return its cinm op count, raise on any mismatch."""
    from onnx_cinm.backend import CinmBackend

    rep = CinmBackend.prepare(case.model, runner=runner)
    for inputs, expected in case.data_sets:
        _compare(case, rep.run(inputs), expected)
    return sum(1 for n in rep.model.graph.node if n.domain == "cinm")


def _original_error(case: Case) -> str | None:
    """Stock onnxruntime's error on the *original* model, or None when it runs and matches."""
    from onnx_cinm.backend import onnxruntime_runner

    try:
        session = onnxruntime_runner(case.model)
        names = [i.name for i in session.get_inputs()]
        for inputs, expected in case.data_sets:
            feeds = dict(zip(names, (np.asarray(x) for x in inputs)))
            _compare(case, session.run(None, feeds), expected)
    except Exception as e:  # noqa: BLE001 - any failure of ORT on the original is what we check
        return _first_line(e)
    return None


def expected_failure(case: Case) -> tuple[str, str, str] | None:
    """The :data:`EXPECTED_FAILURES` entry of ``case``; a frozen variant inherits its source's."""
    return EXPECTED_FAILURES.get(case.name) or (
        EXPECTED_FAILURES.get(case.name.removesuffix("_frozen"))
        if case.suite.endswith("-frozen") else None)


def run_case(case: Case, runner=None) -> Outcome:
    """Run one case and classify it as passed, xfail (expected, reason verified) or failed.

    ``runner`` executes the optimized model (default: stock onnxruntime; see
    ``onnx_cinm.backend.RUNNERS``).
    """
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cinm_ops = _run(case, runner)
            error = None
        except Exception as e:  # noqa: BLE001 - every failure is reported, one line
            cinm_ops, error = 0, e
    seconds = time.perf_counter() - t0
    expected = expected_failure(case)
    if error is None:
        if expected:
            return Outcome(case, "failed", "passes but is listed as an expected failure", cinm_ops,
                           seconds)
        return Outcome(case, "passed", "", cinm_ops, seconds)
    if expected is None:
        return Outcome(case, "failed", _first_line(error), cinm_ops, seconds)
    kind, reason, evidence = expected
    if kind == _ORT:
        original = _original_error(case)
        if original is None or evidence not in original:
            return Outcome(case, "failed", f"listed as '{reason}', but onnxruntime on the original "
                           f"says {original or 'nothing (it runs)'}; through onnx-cinm: "
                           f"{_first_line(error)}", cinm_ops, seconds)
    return Outcome(case, "xfail", reason, cinm_ops, seconds)


def run_all(cases: list[Case], runner=None) -> list[Outcome]:
    """:func:`run_case` for every case, in this process.

    The whole selection takes about 40 s on one core. It is not split over forked workers:
    a fork taken while onnxruntime's thread pools hold their locks can deadlock the child.
    """
    return [run_case(case, runner) for case in cases]


def summarize(outcomes: list[Outcome]) -> dict:
    """``{run, passed, expected_failures, failed}`` counts."""
    counts = Counter(o.status for o in outcomes)
    return {"run": len(outcomes), "passed": counts["passed"],
            "expected_failures": counts["xfail"], "failed": counts["failed"]}


def table(outcomes: list[Outcome]) -> str:
    """A per-op table, then every expected failure and failure with its reason."""
    rows: dict[tuple[str, str], Counter] = {}
    for o in outcomes:
        c = rows.setdefault((o.case.suite, o.case.op), Counter())
        c[o.status] += 1
        c["lowered"] += o.cinm_ops > 0
        c["seconds"] += o.seconds
    head = ("suite", "op") + tuple(Column(t, ">") for t in ("cases", "passed", "xfail", "failed",
                                                              "with cinm ops", "s"))
    lines = []
    for (suite, op), c in sorted(rows.items()):
        n = c["passed"] + c["xfail"] + c["failed"]
        lines.append((suite, op, n, c["passed"], c["xfail"], c["failed"], c["lowered"],
                      f"{c['seconds']:.2f}"))
    s = summarize(outcomes)
    total = ("total", "", s["run"], s["passed"], s["expected_failures"], s["failed"],
             sum(o.cinm_ops > 0 for o in outcomes), f"{sum(o.seconds for o in outcomes):.2f}")
    text = [text_table(head, lines, totals=[total])]
    for status, title in (("xfail", "expected failures"), ("failed", "FAILED")):
        listed = [o for o in outcomes if o.status == status]
        if listed:
            text.append(f"\n{title}:")
            text.extend(f"  {o.case.name}: {o.message}" for o in listed)
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    """Run the selection; print the table (or JSON); exit 1 if any case failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print only the counts as JSON")
    p.add_argument("-k", metavar="SUBSTRING", help="run only cases whose name contains this")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    p.add_argument("--runner", default="onnxruntime", choices=["onnxruntime", "cinm"],
                   help="what executes the optimized model: stock onnxruntime (default) or the "
                        "CINM execution provider (device nodes in their kernels)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # the failures are reported here, one line each
    cases = collect_cases()
    if args.k:
        cases = [c for c in cases if args.k in c.name]
    from onnx_cinm.backend import RUNNERS

    outcomes = run_all(cases, RUNNERS[args.runner])
    if args.verbose and not args.json:
        for o in outcomes:
            print(f"{o.status:7s} {o.case.suite:18s} {o.case.name} {o.message}")
    if args.json:
        print(json.dumps(summarize(outcomes)))
    else:
        print(table(outcomes))
        print(f"\n{time.perf_counter() - t0:.1f} s")
    return 1 if summarize(outcomes)["failed"] else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
