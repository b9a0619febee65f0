"""If branches compiled into cinm ops on devices (:mod:`onnx_cinm.passes.control_flow`) and run
by the execution provider (``_IfKernel``): a hand-built If with a different Gemm per branch, and
Silero VAD, whose LSTM sits in an If of its decoder."""
from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.runtime import InferenceSession

K, N, ROWS = 128, 64, 16
_RNG = np.random.default_rng(11)
W1 = _RNG.standard_normal((K, N)).astype(np.float32)
B1 = _RNG.standard_normal(N).astype(np.float32)
W2 = _RNG.standard_normal((K, N)).astype(np.float32)


def _if_model() -> onnx.ModelProto:
    """y = If(c, then: Gemm(x, W1, B1), else: MatMul(x, W2)), x[n, 128] -> y[n, 64]; the
    weights are initializers of the main graph the branches read. At n = 16 each product is
    131,072 MACs, above the heuristic's one tile of work (65,536), so it goes to the crossbar."""
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", N])  # noqa: E731
    then = helper.make_graph([helper.make_node("Gemm", ["x", "W1", "B1"], ["t"], name="then_gemm")],
                             "then", [], [out("t")])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "W2"], ["e"], name="else_matmul")],
                              "else", [], [out("e")])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="pick")],
        "if_gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [out("y")],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "B1"),
         numpy_helper.from_array(W2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _branch_cinm(model: onnx.ModelProto) -> dict:
    """``{branch name: [(op, device, kernel)]}`` of the If's cinm nodes."""
    node = next(n for n in model.graph.node if n.op_type == "If")
    out = {}
    for a in node.attribute:
        out[a.name] = [(n.op_type, cinm.node_attrs(n).get("device"), cinm.node_attrs(n).get("kernel"))
                       for n in cinm.all_nodes(a.g) if n.domain == cinm.DOMAIN]
    return out


@pytest.fixture(scope="module")
def compiled_if(tmp_path_factory):
    res = optimize(_if_model(), placement="heuristic", dims={"n": ROWS})
    path = tmp_path_factory.mktemp("if") / "o.onnx"
    artifacts.save(res.model, path)
    return res, path


def test_each_branch_gemm_is_a_device_kernel_of_its_own(compiled_if):
    res, path = compiled_if
    assert res.check.ok
    branches = _branch_cinm(res.model)
    assert [(op, dev) for op, dev, _ in branches["then_branch"]] == [("Gemm", "memristor")]
    assert [(op, dev) for op, dev, _ in branches["else_branch"]] == [("Gemm", "memristor")]
    # kernel files prefixed by the branch's path (node 0, then/else), all in the manifest
    kernels = sorted(k for b in branches.values() for _, _, k in b)
    assert kernels == ["memristor/if0000e_0000_else_matmul_Gemm.xbar",
                       "memristor/if0000t_0000_then_gemm_Gemm.xbar"]
    manifest = artifacts.load_manifest(artifacts.artifact_dir(path))
    assert sorted(k["kernel"] for k in manifest["kernels"]) == kernels
    # both branches multiply [16, 128] by [128, 64]: 2 * 16 * 128 * 64 FLOPs (the bias add of the
    # then-Gemm is inside the cinm Gemm, not counted), all on the crossbar, whichever ran
    assert res.flops_total == 2 * ROWS * K * N and res.flops_exact
    assert res.device_flops_share == 1.0
    line = next(li for li in res.summary().splitlines() if li.startswith("control flow:"))
    assert line == "control flow: If x1; 2 of 2 If branches compiled (2 cinm ops: 2 on devices)"


@pytest.mark.parametrize("cond", [True, False])
def test_the_provider_runs_the_branch_the_condition_picks(compiled_if, cond):
    _, path = compiled_if
    x = np.random.default_rng(3).standard_normal((ROWS, K)).astype(np.float32)
    feed = {"x": x, "c": np.array(cond)}
    sess = InferenceSession(str(path))
    (y,) = sess.run(None, feed)
    want = x @ W1 + B1 if cond else x @ W2  # numpy, independent of onnx-cinm
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    (ref,) = ort.InferenceSession(_if_model().SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    branch, gemm = ("then", "then_gemm/Gemm") if cond else ("else", "else_matmul/Gemm")
    rows = [(r["node"], r["device"], r["mode"]) for r in sess.profile()]
    assert rows == [(f"pick[{branch}] {gemm}", "memristor", "simulate")]
    # a batch other than the planned one runs too (the branch's shapes stayed symbolic)
    (y3,) = sess.run(None, {"x": x[:3], "c": np.array(cond)})
    np.testing.assert_allclose(y3, want[:3], rtol=1e-4, atol=1e-4)


def test_both_branches_load_their_kernels_once(compiled_if):
    _, path = compiled_if
    sess = InferenceSession(str(path))
    assert sorted(r["node"] for r in sess.load_profile()) == ["pick[else] else_matmul/Gemm",
                                                              "pick[then] then_gemm/Gemm"]
    assert sess.partitions() == [("memristor", 1), ("memristor", 1)]


def test_an_if_without_device_nodes_stays_in_its_host_partition(tmp_path):
    res = optimize(_if_model(), placement="heuristic", dims={"n": ROWS}, place=[("*", "host")])
    assert {dev for b in _branch_cinm(res.model).values() for _, dev, _ in b} == {"host"}
    assert res.device_flops_share == 0.0
    artifacts.save(res.model, tmp_path / "h.onnx")
    sess = InferenceSession(str(tmp_path / "h.onnx"))
    assert sess.partitions() == [("host", 1)]
    x = np.ones((2, K), np.float32)
    (y,) = sess.run(None, {"x": x, "c": np.array(False)})
    np.testing.assert_allclose(y, x @ W2, rtol=1e-5, atol=1e-4)
    assert [r["node"] for r in sess.profile()] == ["host partition 0"]


# --------------------------------------------------------------------------- Silero VAD
def _speech(batch: int, seed: int) -> dict:
    """Silero's inputs for ``batch`` clips of 512 samples at 16 kHz: two voiced tones with a
    syllable-rate envelope plus noise (not zeros: the LSTM state and the VAD output move)."""
    rng = np.random.default_rng(seed)
    t = np.arange(512) / 16000.0
    x = np.stack([0.3 * np.sin(2 * np.pi * (180 + 40 * b) * t)
                  + 0.2 * np.sin(2 * np.pi * (720 + 90 * b) * t) * np.sin(2 * np.pi * 4 * t)
                  + 0.05 * rng.standard_normal(512) for b in range(batch)]).astype(np.float32)
    return {"input": x, "state": (0.1 * rng.standard_normal((2, batch, 128))).astype(np.float32),
            "sr": np.array(16000, np.int64)}


@pytest.mark.parametrize("batch", [1, 4])
def test_silero_vad_decoder_lstm_runs_on_crossbars_inside_its_if(batch, silero_dir, tmp_path):
    path = silero_dir / "silero_vad_16k_op15.onnx"
    feed = _speech(batch, seed=batch)
    res = optimize(str(path), placement="heuristic", dims={"batch": batch, "sequence": 512},
                   inputs=feed)
    assert res.check.ok, res.summary()
    # the LSTM (inside /model/decoder/If_1, both branches) became crossbar Gemms: input
    # projection and the one recurrent step of a 512-sample clip
    node = next(n for n in res.model.graph.node if n.name == "/model/decoder/If_1")
    for a in node.attribute:
        ops = [(n.op_type, cinm.node_attrs(n)["device"]) for n in cinm.all_nodes(a.g)
               if n.domain == cinm.DOMAIN]
        assert ops == [("Gemm", "memristor")] * 2, a.name
        assert not any(n.op_type == "LSTM" for n in cinm.all_nodes(a.g))
    assert res.device_flops_share >= 0.9 and res.flops_exact, res.summary()
    assert "(If branches: those the given --input arrays take)" in res.summary()
    out = tmp_path / "s.onnx"
    artifacts.save(res.model, out)
    sess = InferenceSession(str(out))
    got = sess.run(None, feed)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5)
    assert 0.0 < float(ref[0].min()) and float(np.abs(ref[1]).max()) > 0.01  # not a zero run
    rows = {r["node"]: r["device"] for r in sess.profile()}
    assert rows["/model/decoder/If_1[then] /model/decoder/rnn/LSTM/Gemm"] == "memristor"
    assert rows["/model/decoder/If_1[then] /model/decoder/rnn/LSTM/Gemm_1"] == "memristor"


def test_compare_cli_on_silero_planned_at_batch_1_run_at_batch_4(silero_dir, tmp_path, capsys):
    from onnx_cinm.cli import main

    src = silero_dir / "silero_vad_16k_op15.onnx"
    out = tmp_path / "s.onnx"
    np.savez(tmp_path / "b1.npz", **_speech(1, seed=1))
    np.savez(tmp_path / "b4.npz", **_speech(4, seed=4))
    assert main(["optimize", str(src), "-o", str(out), "--placement", "heuristic", "--dim",
                 "batch=1", "--dim", "sequence=512", "--input", str(tmp_path / "b1.npz")]) == 0
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--input", str(tmp_path / "b4.npz")]) == 0
    assert "check: 1 run, 2 outputs" in capsys.readouterr().out


def _nested_model() -> onnx.ModelProto:
    """y = MatMul(x, W1) named 'mm' in the main graph, then If(c, then: If(d, then: MatMul(h, W2)
    named 'mm' too, else: MatMul(h, W1)), else: Relu(h)) on h = the main MatMul's output: a
    nested If, and a branch node named like a main-graph node (its lowering makes the same
    names)."""
    vi = lambda name, shape=None: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    inner_then = helper.make_graph([helper.make_node("MatMul", ["h", "W2"], ["it"], name="mm")],
                                   "inner_then", [], [vi("it", ["n", K])])
    inner_else = helper.make_graph([helper.make_node("MatMul", ["h", "W3"], ["ie"], name="mm3")],
                                   "inner_else", [], [vi("ie", ["n", K])])
    outer_then = helper.make_graph(
        [helper.make_node("If", ["d"], ["ot"], then_branch=inner_then, else_branch=inner_else,
                          name="inner")], "outer_then", [], [vi("ot", ["n", K])])
    outer_else = helper.make_graph([helper.make_node("Relu", ["h"], ["oe"], name="relu")],
                                   "outer_else", [], [vi("oe", ["n", K])])
    rng = np.random.default_rng(5)
    ws = {n: rng.standard_normal((K, K)).astype(np.float32) / 8 for n in ("W0", "W2", "W3")}
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W0"], ["h"], name="mm"),
         helper.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else,
                          name="outer")],
        "nested", [vi("x", ["n", K]), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("d", TensorProto.BOOL, [])],
        [vi("y", ["n", K])], [numpy_helper.from_array(w, k) for k, w in ws.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), ws


def test_nested_ifs_compile_and_run_every_path(tmp_path):
    model, ws = _nested_model()
    res = optimize(model, placement="heuristic", dims={"n": ROWS})
    onnx.checker.check_model(res.model, full_check=True)  # names stay unique (SSA)
    outer = next(n for n in res.model.graph.node if n.op_type == "If")
    inner = next(n for a in outer.attribute if a.name == "then_branch" for n in a.g.node
                 if n.op_type == "If")
    kernels = sorted(cinm.node_attrs(n)["kernel"] for a in inner.attribute
                     for n in a.g.node if n.domain == cinm.DOMAIN)
    # the crossbars of all graphs are planned together after the branches merged back, so
    # the inner 'mm/Gemm', renamed 'mm/Gemm_1' then (below), names its kernel so too
    assert kernels == ["memristor/if0001t_if0000e_0000_mm3_Gemm.xbar",
                       "memristor/if0001t_if0000t_0000_mm_Gemm_1.xbar"]
    artifacts.save(res.model, tmp_path / "n.onnx")
    sess = InferenceSession(str(tmp_path / "n.onnx"))
    x = np.random.default_rng(6).standard_normal((ROWS, K)).astype(np.float32)
    h = x @ ws["W0"]
    # the inner 'mm' lowers to a node named like the main graph's 'mm/Gemm': renamed
    for c, d, want, row in [(True, True, h @ ws["W2"], "outer[then] inner[then] mm/Gemm_1"),
                            (True, False, h @ ws["W3"], "outer[then] inner[else] mm3/Gemm"),
                            (False, True, np.maximum(h, 0), None)]:
        before = len(sess.profile())
        (y,) = sess.run(None, {"x": x, "c": np.array(c), "d": np.array(d)})
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        rows = [r["node"] for r in sess.profile()[before:]]
        assert rows[0] == "mm/Gemm"
        assert (row in rows) if row else not any("inner[" in r for r in rows), rows


# --------------------------------------------------------------------------- reporting
# Per inference one branch of an If runs. The report, optimize's device tables and the run line
# count the branch that ran (the report: the one the planning probe took), and say so.
GEMM_FLOPS = 2 * ROWS * K * N  # one branch's product, multiplies and adds
# bytes a branch moves to and from the crossbar: x [16, 128] in, the [16, 64] result out (float32)
BRANCH_BYTES = 4 * ROWS * K + 4 * ROWS * N


@pytest.fixture(scope="module")
def compiled_then(tmp_path_factory):
    """The If model planned with the condition true: the probe sees the then-branch taken."""
    x = np.random.default_rng(8).standard_normal((ROWS, K)).astype(np.float32)
    res = optimize(_if_model(), placement="heuristic", dims={"n": ROWS},
                   inputs={"x": x, "c": np.array(True)})
    path = tmp_path_factory.mktemp("ifrep") / "o.onnx"
    artifacts.save(res.model, path)
    return res, path, x


def test_report_lists_both_branches_and_counts_the_one_the_probe_took(compiled_then, tmp_path):
    from onnx_cinm import frontend, report

    _, path, x = compiled_then
    model = frontend.load_model(str(path))
    assert frontend.if_taken(model) == {"pick": True}
    rows, totals = report.layers(model, report.options_from_plans(model))
    assert [(r.index, r.name, r.device, r.flops, r.counted) for r in rows] == [
        (0, "pick", "host", 0, True),
        ("0t0", "pick[then] then_gemm/Gemm", "memristor", GEMM_FLOPS, True),
        ("0e0", "pick[else] else_matmul/Gemm", "memristor", GEMM_FLOPS, False)]
    assert [r.transfer_bytes for r in rows] == [0, BRANCH_BYTES, BRANCH_BYTES]
    # the totals: the If and the then-branch, not the else-branch
    assert totals["transfer_bytes"] == BRANCH_BYTES
    assert totals["ifs"] == {"taken": 1, "both": 0}
    then = rows[1]
    assert totals["latency_s"] == pytest.approx(rows[0].latency_s + then.latency_s + then.transfer_s)
    assert totals["by_device"]["memristor"][1] == pytest.approx(then.energy_j)
    # the crossbar simulator running the then-branch charges the energy the cost model reports
    sess = InferenceSession(str(path))
    sess.run(None, {"x": x, "c": np.array(True)})
    (rec,) = sess.profile()
    assert rec["node"] == then.name and rec["energy_j"] == pytest.approx(then.energy_j, rel=1e-6)
    text = report.table(rows, totals)
    assert "total (one branch per If, the one the planning probe took (1 If on the path a run " \
        "takes, nested ones included; the other branch: rows marked 'not counted'))" in text
    line = next(li for li in text.splitlines() if "pick[else]" in li)
    assert report.NOT_COUNTED in line
    out = report.write_report(model, tmp_path / "rep", report.options_from_plans(model))
    csv_rows = list(csv.DictReader(io.StringIO((tmp_path / "rep" / "layers.csv").read_text())))
    assert [(r["index"], r["layer"], r["counted"]) for r in csv_rows] == [
        ("0", "pick", "1"), ("0t0", "pick[then] then_gemm/Gemm", "1"),
        ("0e0", "pick[else] else_matmul/Gemm", "0")]
    assert len(out["files"]) == 5  # layers.csv, 2 PNGs, report.html, wear.json


def test_report_without_a_probed_branch_sums_both_and_says_upper_bound(compiled_then):
    from onnx_cinm import frontend, report

    model = onnx.ModelProto()
    model.CopyFrom(compiled_then[0].model)
    frontend.set_if_taken(model, {})  # a model whose planning probe saw no condition
    rows, totals = report.layers(model, report.options_from_plans(model))
    assert all(r.counted for r in rows)
    assert totals["transfer_bytes"] == 2 * BRANCH_BYTES
    assert totals["ifs"] == {"taken": 0, "both": 1}
    assert "total (UPPER BOUND: both branches summed of 1 If whose branch the planning probe " \
        "did not see)" in report.table(rows, totals)


def test_optimize_crossbar_table_counts_the_taken_branch_per_inference(compiled_then):
    res = compiled_then[0]
    lines = res.device_tables().splitlines()
    then = next(li for li in lines if li.startswith("pick[then] then_gemm/Gemm")).split()
    other = next(li for li in lines if li.startswith("pick[else] else_matmul/Gemm")).split()
    total = next(li for li in lines if li.startswith("total (2 kernels, 1 per inference)")).split()
    # [16, 128] x [128, 64] on 256x256 crossbars: one tile (one crossbar, one write at load),
    # 16 MVMs (one per row of x) per inference
    assert then[2:9] == ["B", "16x128x64", "1", "1", "1", "0", "16"]
    assert other[2:9] == ["B", "16x128x64", "1", "1", "1", "(0)", "(16)"]  # not per inference
    at = total.index("inference)") + 1
    # load-time columns (crossbars, tiles, writes at load) count both kernels, per-inference
    # ones (writes, MVMs, latency) the then-kernel only
    assert total[at:at + 7] == ["2", "2", "2", "0", "16", *then[9:11]]
    assert "per-inference totals: one branch per If, the one the planning probe took (1 If on the path a " \
        "run takes, nested ones included; the other branch: its kernels count at load only)" in res.device_tables()


def test_run_line_counts_what_ran_and_labels_both_branches(compiled_then, tmp_path, capsys):
    from onnx_cinm.cli import main

    _, path, x = compiled_then
    np.savez(tmp_path / "in.npz", x=x, c=np.array(False))
    assert main(["run", str(path), "--input", str(tmp_path / "in.npz"), "--profile"]) == 0
    out = capsys.readouterr().out
    assert ("  partitions: 0 host partitions (0 nodes), memristor 1 node ran; the model holds 0 "
            "host partitions (0 nodes), memristor 2 nodes over both branches of the 1 If the "
            "provider runs") in out
    assert "profile: 1 rows, over 1 run(s): 0 host partitions (0 nodes), memristor 1 node" in out
    assert "pick[else] else_matmul/Gemm" in out and "pick[then]" not in out.split("profile:")[1]
    assert "partitions memristor 2 (both branches of each If the provider runs)" in out


def test_silero_report_and_run_line_count_the_branch_that_ran(silero_dir, tmp_path, capsys):
    """Silero VAD at batch 1: the decoder's LSTM (two crossbar Gemms per branch of
    /model/decoder/If_1) is in the report, counted once; the run line agrees with the profile."""
    from onnx_cinm import report
    from onnx_cinm.cli import main

    feed = _speech(1, seed=1)
    res = optimize(str(silero_dir / "silero_vad_16k_op15.onnx"), placement="heuristic",
                   dims={"batch": 1, "sequence": 512}, inputs=feed)
    path = tmp_path / "s.onnx"
    artifacts.save(res.model, path)
    rows, totals = report.layers(res.model, report.options_from_plans(res.model))
    gemms = {r.name: r for r in rows if r.device == "memristor" and not isinstance(r.index, int)}
    assert sorted(gemms) == [f"/model/decoder/If_1[{b}] /model/decoder/{rnn}/LSTM/{g}"
                             for b, rnn in (("else", "rnn_1"), ("then", "rnn"))
                             for g in ("Gemm", "Gemm_1")]
    # one LSTM step of one row: [1, 128] x [128, 4 gates x 128] each
    assert {r.flops for r in gemms.values()} == {2 * 128 * 4 * 128}
    counted = {n for n, r in gemms.items() if r.counted}
    assert counted == {n for n in gemms if "[then]" in n}
    sess = InferenceSession(str(path))
    sess.run(None, feed)
    ran = [r for r in sess.profile() if r["device"] == "memristor"]
    assert {r["node"] for r in ran if "[" in r["node"]} == counted  # the probe's branch ran
    # the report's crossbar energy per inference is the simulator's for this run
    assert totals["by_device"]["memristor"][1] == pytest.approx(sum(r["energy_j"] for r in ran),
                                                               rel=1e-6)
    assert main(["run", str(path), "--profile"]) == 0
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.startswith("  partitions: "))
    head = next(li for li in out.splitlines() if li.startswith("profile: "))
    counts = r"(\d+) host partitions \((\d+) nodes"
    # the same host partitions and nodes as the profile's head, and 2 + 2 crossbar nodes ran
    assert re.search(counts, line).groups() == re.search(counts, head).groups()
    ran_text, whole = line.split(" ran; the model holds ")
    assert "memristor 4 nodes" in ran_text and "memristor 6 nodes" in whole


def test_report_of_a_malformed_branch_record_is_a_one_line_error(compiled_then, tmp_path, capsys):
    from onnx_cinm import frontend
    from onnx_cinm.cli import main

    model = onnx.ModelProto()
    model.CopyFrom(compiled_then[0].model)
    frontend.set_if_taken(model, {})
    model.metadata_props.add(key=frontend.IF_TAKEN_KEY, value='{"pick": "yes"}')
    path = tmp_path / "bad.onnx"
    artifacts.save(model, path)
    assert main(["report", str(path), "-o", str(tmp_path / "rep")]) != 0
    err = capsys.readouterr().err.strip()
    assert "metadata 'onnx_cinm.if_taken' is malformed" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "rep").exists()  # nothing half-written


def test_nested_ifs_report_counts_the_probed_path():
    """c true, d false: the path outer[then] inner[else] runs; inner[then] and outer[else]
    (a Relu on the DPUs) are listed, not counted, in the report and the crossbar table."""
    from onnx_cinm import report

    model, _ = _nested_model()
    x = np.random.default_rng(9).standard_normal((ROWS, K)).astype(np.float32)
    res = optimize(model, placement="heuristic", dims={"n": ROWS},
                   inputs={"x": x, "c": np.array(True), "d": np.array(False)})
    rows, totals = report.layers(res.model, report.options_from_plans(res.model))
    assert [(r.index, r.name, r.counted) for r in rows] == [
        (0, "mm/Gemm", True), (1, "outer", True), ("1t0", "outer[then] inner", True),
        ("1t0t0", "outer[then] inner[then] mm/Gemm_1", False),
        ("1t0e0", "outer[then] inner[else] mm3/Gemm", True),
        ("1e0", "outer[else] relu/Relu", False)]
    assert totals["ifs"] == {"taken": 2, "both": 0}
    # [16, 128] x [128, 128]: 2 * 16 * 128 * 128 FLOPs per product; two products run
    assert sum(r.flops for r in rows if r.counted) == 2 * (2 * ROWS * K * K)
    total = next(li for li in res.device_tables().splitlines() if li.startswith("total ("))
    # three kernels loaded (one tile each), two run per inference: 2 x 16 MVMs
    assert total.split()[5:11] == ["inference)", "3", "3", "3", "0", "32"]


# --------------------------------------------------------------------------- one crossbar budget
# Both branches' kernels are loaded, so their resident tiles share the chip with each other (and
# the main graph's). On 64x64 crossbars each branch's [128, 64] weight is 2 x 1 = 2 tiles.
TILES = (K // 64) * (N // 64)
SMALL = {"cim_rows": 64, "cim_cols": 64}


@pytest.mark.parametrize("cond", [True, False])
def test_branch_kernels_share_the_chip_and_the_taken_one_keeps_its_tiles(cond, tmp_path):
    """3 crossbars for 2 + 2 tiles: not all resident. The knapsack pins whole kernels in P - 1 = 2
    crossbars: the kernel of the branch the probe took (the other saves no write per
    inference); the other streams alone through the 3 - 2 = 1 left: 1 tile kept there at load,
    T - 1 = 1 written per inference when it runs."""
    from onnx_cinm import report

    x = np.random.default_rng(12).standard_normal((ROWS, K)).astype(np.float32)
    res = optimize(_if_model(), placement="heuristic", dims={"n": ROWS},
                   inputs={"x": x, "c": np.array(cond)}, device_options={**SMALL, "cim_crossbars": 3})
    assert TILES == 2 and res.stats["lowered_together"] == {"memristor": 2}
    node = next(n for n in res.model.graph.node if n.op_type == "If")
    plans = {a.name: cinm.node_attrs(a.g.node[0]) for a in node.attribute}
    ran, other = ("then_branch", "else_branch") if cond else ("else_branch", "then_branch")
    def got(a):
        return (a["cim_crossbars"], a["cim_resident"], a["cim_shared"], a["cim_writes_load"],
                a["cim_writes"], a["cim_device_crossbars"])

    assert got(plans[ran]) == (2, 1, 0, 2, 0, 3)
    assert got(plans[other]) == (1, 0, 0, 1, 1, 3)
    lines = res.device_tables().splitlines()
    total = next(li for li in lines if li.startswith("total (2 kernels, 1 per inference)")).split()
    at = total.index("inference)") + 1
    assert total[at:at + 4] == ["3", "4", "3", "0"]  # crossbars in use, tiles, writes@load, /inf
    streamed = f"pick[{other.removesuffix('_branch')}] " + \
        ("else_matmul/Gemm" if cond else "then_gemm/Gemm")
    assert f"(crossbars: 3 in use of the chip's 3, 2 kept by resident kernels, 1 streamed " \
        f"through by 1 kernel ({streamed}))" in lines
    rows, totals = report.layers(res.model, report.options_from_plans(res.model))
    assert totals["writes"] == 0 and totals["violations"] == []
    assert [r.writes for r in rows if not r.counted] == [1]
    # the streamed kernel computes what numpy does, whichever branch runs
    artifacts.save(res.model, tmp_path / "o.onnx")
    sess = InferenceSession(str(tmp_path / "o.onnx"))
    for c, want in ((True, x @ W1 + B1), (False, x @ W2)):
        (y,) = sess.run(None, {"x": x, "c": np.array(c)})
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_kernels_planned_apart_are_flagged_against_the_chip():
    """A model whose branches hold 2 + 2 resident tiles, judged on a chip of 3 crossbars (each
    branch alone fits: only the sum does not), and its crossbar table when the plans record
    3 crossbars for the chip (as plans made one branch at a time did)."""
    from onnx_cinm import report

    model = onnx.ModelProto()
    model.CopyFrom(optimize(_if_model(), placement="heuristic", dims={"n": ROWS},
                            device_options={**SMALL, "cim_crossbars": 8}).model)
    opts = {**report.options_from_plans(model), "cim_crossbars": 3}
    _, totals = report.layers(model, opts)
    assert totals["violations"] == [("memristor: 4 tiles kept programmed by the main graph and "
                                     "its If branches > 3 crossbars")]
    node = next(n for n in model.graph.node if n.op_type == "If")
    for a in node.attribute:
        for att in a.g.node[0].attribute:
            if att.name == "cim_device_crossbars":
                att.i = 3
    from onnx_cinm import devices

    plans = [(n.name, n.op_type, cinm.node_attrs(n)) for a in node.attribute for n in a.g.node]
    text = devices.get_device("memristor").summary(plans)
    assert "(crossbars: 4 in use of the chip's 3, 4 kept by resident kernels; EXCEEDS the " \
        "chip's 3 crossbars (plans made apart: compile again))" in text


def test_sweep_counts_the_kernels_inside_if_branches(tmp_path, capsys):
    """Sweep rows on 64x64 crossbars, 2, 3 and 8 of them: the branch kernels are placed and
    counted (before, the sweep priced the main graph only: the If alone, no crossbar, no
    write, no byte). Writes per inference by hand: 2 crossbars leave P - 1 = 1 for pinning, too
    few for a 2-tile kernel, so both kernels stream through the 2 crossbars, evicting each
    other: all 2 tiles written per run; 3 crossbars pin the taken branch's kernel (0 writes);
    8 hold both."""
    from onnx_cinm import frontend, report, sweep
    from onnx_cinm.cli import main

    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--set", "crossbar.count=2,3,8", "--set",
                 "crossbar.size=64x64", "--dim", f"n={ROWS}", "--placement", "heuristic",
                 "--executor", "serial", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(If branches: the one the planning probe took counted)" in text
    rows = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert [(r["crossbar.count"], r["writes"], r["transfer_bytes"], r["devices"], r["branches"],
             r["violations"]) for r in rows] == [
        (p, w, str(BRANCH_BYTES), "memristor:2", "taken", "") for p, w in
        (("2", "2"), ("3", "0"), ("8", "0"))]
    # the same figures as optimize's model reported (the branch the same probe took)
    cinm_model = sweep.cinm_level(_if_model(), dims={"n": ROWS})
    taken = frontend.if_taken(cinm_model)
    assert set(taken) == {"pick"}
    for r in rows:
        opts = {**SMALL, "cim_crossbars": int(r["crossbar.count"])}
        res = optimize(_if_model(), placement="heuristic", dims={"n": ROWS}, check=0,
                       device_options=opts)
        assert frontend.if_taken(res.model) == taken
        _, totals = report.layers(res.model, report.options_from_plans(res.model))
        assert float(r["energy_j"]) == pytest.approx(totals["energy_j"], rel=1e-12)
        assert float(r["latency_s"]) == pytest.approx(totals["latency_s"], rel=1e-12)
    # without the probe's record both branches count: an upper bound, twice the writes and bytes
    frontend.set_if_taken(cinm_model, {})
    row = sweep.evaluate(cinm_model, {"placement": "heuristic", **SMALL, "cim_crossbars": 2})
    assert (row["writes"], row["transfer_bytes"], row["branches"]) == (4, 2 * BRANCH_BYTES,
                                                                       "upper bound")


def test_unnamed_ifs_each_record_the_branch_they_took():
    """Two unnamed Ifs, the second on Not(c): the record of the taken branches was keyed by the
    node name, so both shared the key '' and one If's branch was counted for both (review
    finding). Each If now gets a name of its own and its own entry."""
    from onnx_cinm import frontend

    m = _if_model()
    first = m.graph.node[0]
    first.name = ""
    second = onnx.NodeProto()
    second.CopyFrom(first)
    second.input[0], second.output[0] = "nc", "y2"
    m.graph.node.extend([helper.make_node("Not", ["c"], ["nc"]), second])
    m.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["n", N]))
    x = np.random.default_rng(0).standard_normal((16, K)).astype(np.float32)
    res = optimize(m, dims={"n": 16}, inputs={"x": x, "c": np.array(True)}, check=1)
    ifs = [n for n in res.model.graph.node if n.op_type == "If"]
    taken = frontend.if_taken(res.model)
    assert len({n.name for n in ifs}) == 2 and all(n.name for n in ifs)
    assert [taken[n.name] for n in ifs] == [True, False]
    assert res.check.ok


# --------------------------------------------------------------------------- baselines
def test_the_baselines_price_the_branch_a_run_takes():
    """The all-host and heuristic lines sum the main graph's and the taken branch's costs, as
    the plan's figure does: the all-host baseline equals the figure of the same model placed
    with every op on the host (a separate run, its totals priced after the passes), and the
    cost placement (crossbar for a 16x128x64 product) beats it. Before, the baselines were the
    main graph's alone (the If node: 0 s), so the plan looked worse than all-host."""
    x = np.random.default_rng(3).standard_normal((ROWS, K)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "c": np.array(cond)}
        res = optimize(_if_model(), dims={"n": ROWS}, inputs=feeds)
        host = optimize(_if_model(), dims={"n": ROWS}, inputs=feeds, place=[("*", "host")])
        st, ref = res.stats["placement"], host.stats["placement"]["model_totals"]
        base = st["baselines"]["all-host"]
        assert ref["latency_s"] > 0 and ref["energy_j"] > 0
        assert base.latency_s == pytest.approx(ref["latency_s"], rel=1e-9)
        assert base.energy_j == pytest.approx(ref["energy_j"], rel=1e-9)
        # the branch's product alone on the host (50 GFLOP/s nominal roofline): a floor
        assert base.latency_s >= 2 * ROWS * K * N / 50e9
        assert st["model_totals"]["energy_j"] < base.energy_j
        # the heuristic puts the product on the crossbar as well: priced with the branch too
        assert st["baselines"]["heuristic"].energy_j < base.energy_j
        assert st["baselines"]["heuristic"].latency_s > 0


#: The framing conv of an STFT in each branch of an If (as Silero VAD's ``stft``): x*x[1, L] padded
#: on the right by L/8 (then) or L/16 (else), the pad computed from Shape(x), so onnx's
#: inference leaves the padded length anonymous (``unk__N``); Conv of 130 filters of 128 taps,
#: stride 64.
STFT_L, STFT_KW, STFT_S, STFT_CO = 512, 128, 64, 130
STFT_W = np.random.default_rng(5).standard_normal((STFT_CO, 1, STFT_KW)).astype(np.float32)


def _stft_if_model() -> onnx.ModelProto:
    def branch(tag, div):
        nodes = [
            helper.make_node("Mul", ["x", "x"], [f"{tag}_x2"]),  # x2[1, L]: a planned dim
            helper.make_node("Shape", ["x"], [f"{tag}_s"], start=1, end=2),
            helper.make_node("Div", [f"{tag}_s", div], [f"{tag}_p"]),
            helper.make_node("Concat", ["zeros3", f"{tag}_p"], [f"{tag}_pads"], axis=0),
            helper.make_node("Pad", [f"{tag}_x2", f"{tag}_pads"], [f"{tag}_xp"], mode="reflect"),
            helper.make_node("Unsqueeze", [f"{tag}_xp", "ax1"], [f"{tag}_u"]),
            helper.make_node("Conv", [f"{tag}_u", "W"], [f"{tag}_y"], kernel_shape=[STFT_KW],
                             strides=[STFT_S]),
        ]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(
            f"{tag}_y", TensorProto.FLOAT, [1, STFT_CO, None])])

    i64 = lambda v, name: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "d8"),
                          else_branch=branch("e", "d16"), name="pick")], "if_stft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "L"]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, STFT_CO, None])],
        [numpy_helper.from_array(STFT_W, "W"), i64([0, 0, 0], "zeros3"), i64([8], "d8"),
         i64([16], "d16"), i64([1], "ax1")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_an_untaken_branch_kernel_is_emitted_at_the_shape_it_was_planned_at(tmp_path, capsys):
    """The else branch, which the probe does not take, has an Im2Col whose input length onnx
    leaves anonymous outside the branch: it was placed on UPMEM at its planned length but emitted
    at length 1 ('im2col: empty output' at save). Now both branches' kernels are written at the
    planned lengths and the model matches onnxruntime whichever branch runs."""
    from onnx_cinm.cli import main

    src, out = tmp_path / "stft.onnx", tmp_path / "o.onnx"
    onnx.save(_stft_if_model(), src)
    x = np.random.default_rng(6).standard_normal((1, STFT_L)).astype(np.float32)
    for cond in (True, False):
        np.savez(tmp_path / f"{cond}.npz", x=x, c=np.array(cond))
    assert main(["optimize", str(src), "-o", str(out), "--placement", "heuristic", "-q",
                 "--input", str(tmp_path / "True.npz")]) == 0
    model = onnx.load(out)
    node = next(n for n in model.graph.node if n.op_type == "If")
    shapes = {}
    for branch, div in (("then_branch", 8), ("else_branch", 16)):
        g = next(a.g for a in node.attribute if a.name == branch)
        (im2col,) = [n for n in g.node if n.domain == cinm.DOMAIN and n.op_type == "Im2Col"]
        at = cinm.node_attrs(im2col)
        assert at["device"] == "upmem"
        manifest = json.loads((out.with_suffix(".cinm") / at["kernel"] / "kernel.json").read_text())
        padded = STFT_L + STFT_L // div  # hand count: 576 (then), 544 (else)
        frames = (padded - STFT_KW) // STFT_S + 1  # 8, 7
        shapes[branch] = ([i["shape"] for i in manifest["inputs"]],
                          [o["shape"] for o in manifest["outputs"]])
        assert shapes[branch] == ([[1, 1, padded]], [[1, frames, STFT_KW]])
        # the input's planned dim keeps its name in the body (the model still runs at other L)
        dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in g.value_info}
        assert dims[f"{branch[0]}_x2"] == [1, "L"]
    capsys.readouterr()
    ref = ort.InferenceSession(src.read_bytes(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(str(out))
    for cond, frames in ((True, 8), (False, 7)):
        feed = {"x": x, "c": np.array(cond)}
        (want,) = ref.run(None, feed)
        (got,) = sess.run(None, feed)
        assert got.shape == want.shape == (1, STFT_CO, frames)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        branch = "then" if cond else "else"
        assert (f"pick[{branch}] {branch[0]}_y/Im2Col", "upmem") in \
            [(r["node"], r["device"]) for r in sess.profile()]
        assert main(["compare", str(src), str(out), "--input", str(tmp_path / f"{cond}.npz")]) == 0
        assert "check: 1 run, 1 output" in capsys.readouterr().out


def test_a_hint_naming_a_branch_ops_source_type_holds_in_optimize_and_sweep(tmp_path, capsys):
    """``--place MatMul=upmem`` on an If whose else branch holds the MatMul: optimize placed it
    on the DPUs but warned the hint matched nothing (the main graph and the then branch did not
    match it), and the sweep's branches never knew their ops' source types (every row on the
    crossbars, and a note that sweeping upmem.dpus changed nothing). The then branch's Gemm
    is no MatMul: it stays where the heuristic puts it."""
    from onnx_cinm.cli import main

    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    common = ["--dim", f"n={ROWS}", "--placement", "heuristic", "--place", "MatMul=upmem"]
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--check", "0", "-q",
                 *common]) == 0
    assert "matched no cinm op" not in capsys.readouterr().err
    placed = _branch_cinm(onnx.load(str(tmp_path / "o.onnx")))
    assert [d for _, d, _ in placed["then_branch"]] == ["memristor"]
    assert [d for _, d, _ in placed["else_branch"]] == ["upmem"]
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--set", "upmem.dpus=64,256", "--workers", "1",
                 "-o", str(out), *common]) == 0  # worker processes: the types reach them
    err = capsys.readouterr().err
    assert "changed nothing" not in err and "matched no cinm op" not in err
    rows = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert [r["devices"] for r in rows] == ["memristor:1 upmem:1"] * 2


def test_node_by_node_judges_the_branch_kernels_with_their_if(compiled_if):
    # a device node in an If branch runs inside its If's kernel: it is judged with the If's
    # outputs (onnxruntime runs the If, its branch's reference bodies, on the provider's
    # inputs), and a wrong branch kernel shows as the If off (golden.compare_node_by_node)
    from onnx_cinm import golden

    res, path = compiled_if
    branch = [n for b in _branch_cinm(res.model).values() for n in b]
    runner = InferenceSession(path).as_runner()
    feeds = {"x": np.ones((ROWS, K), np.float32), "c": np.array(True)}
    check = golden.compare_node_by_node(path, runner, [feeds])
    assert check.total == check.judged == len(branch) == 2 and not check.unjudged
    assert not check.nodes and not check.host_off  # no device node in the main graph

    class Wrong:
        input_names, output_names, exact = runner.input_names, runner.output_names, True

        def run_keeping(self, f):
            kept = runner.run_keeping(f)
            kept["y"] = kept["y"] + np.float32(0.5)
            return kept

    check = golden.compare_node_by_node(path, Wrong(), [feeds])
    ((label, op, device, outs),) = check.host_off
    assert (label, op, device) == ("pick", "ai.onnx.If", "host")
    assert outs[0].mismatched == outs[0].elements == ROWS * N
    assert "first host node off is ai.onnx.If 'pick' on host" in check.summary()
