"""Samsung HBM-PIM, the third device, added as one package (issue 13, acceptance item 1).

Expected figures are computed here by hand from the published constants (chips.md §3.1:
128 PCUs of 16 FP16 lanes at 300 MHz, 32 B per column, 1024 pins at 2.4 Gb/s = 307.2 GB/s,
8 mode-switch accesses of 45 ns, 3.9 pJ/bit over the interface, 1.56 pJ/bit in the banks) and
the kernel shapes the package documents, never read back from the cost model; numerical
results are compared with onnxruntime on the original model.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper

import onnx_cinm
from onnx_cinm import artifacts, devices, optimize
from onnx_cinm.cli import main
from onnx_cinm.dialects import cinm
from onnx_cinm.errors import CinmError
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession

CLOCK = 300e6
EXT_BW = 1024 * 2.4e9 / 8           # 307.2 GB/s per cube
CH_BW = EXT_BW / 16                 # one pseudo-channel: 64 pins
MODE_S = 8 * 45e-9                  # SB->AB (4) + AB->AB-PIM (1) + AB-PIM->AB (1) + AB->SB (2)
E_EXT, E_INT = 3.9e-12, 3.9e-12 * 0.4
CRF_B = 128                         # 4 bursts of 32 B per channel
# host: 50 GFLOP/s, 10 GB/s; the crossbars it competes with: the CINM paper's 4 x 64 x 64
NOMINAL = {"objective": "latency", "host_roofline": "nominal", "cim_preset": "pcm-occ"}
EPS16 = 2.0 ** -10


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def gemv_model(n=1024, dtype=np.float16):
    elem = TP.FLOAT16 if dtype == np.float16 else TP.FLOAT
    W = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    return _model([h.make_node("MatMul", ["W", "x"], ["y"], name="gemv")],
                  [h.make_tensor_value_info("x", elem, [n])],
                  [h.make_tensor_value_info("y", elem, [n])],
                  [numpy_helper.from_array(W, "W")]), W


def _cinm(model, name_prefix):
    return next(n for n in model.graph.node if n.domain == cinm.DOMAIN and n.name.startswith(name_prefix))


def _fp16_close(y, ref, k):
    """The documented tolerance: rtol 4 FP16 ulps, atol 4 eps16 sqrt(K) rms(ref)."""
    ref = ref.astype(np.float32)
    atol = 4 * EPS16 * math.sqrt(k) * float(np.sqrt(np.mean(ref ** 2)))
    err = np.abs(y.astype(np.float32) - ref)
    return bool(np.all(err <= atol + 4 * EPS16 * np.abs(ref))), float(err.max()), atol


def _session(path, mode="simulate"):
    return InferenceSession(str(path), provider_options=[{"hbm_pim_mode": mode}, {}])


# -- (1) float16: placed where cheapest, the program as hand-counted, simulated == onnxruntime --

def test_fp16_gemv_placed_by_cost_program_and_simulation(tmp_path):
    n = 1024
    m, W = gemv_model(n)
    r = optimize(m, placement="cost", device_options=NOMINAL)
    node = _cinm(r.model, "gemv")
    a = cinm.node_attrs(node)
    assert a["device"] == "hbm_pim", a["placement"]
    # by hand: 128 PCUs (8 rows each, one group), K = 1024 -> 8 tiles of 128 (4 per bank)
    triggers = 8 * 64 + 1 + 8                         # MACs, NOP, MOV of the 8 row partials
    host_bytes = 16 * CRF_B + (1 + 8) * 8 * 32 * 16 + 128 * 8 * 32   # CRF, GRF writes, partials
    assert host_bytes == 71680
    pim_s = MODE_S + host_bytes / EXT_BW + triggers / CLOCK
    pim_j = host_bytes * 8 * E_EXT + (triggers - 1) * 128 * 32 * 8 * E_INT
    assert (a["pim_pcus"], a["pim_grf_tiles"], a["pim_row_groups"], a["pim_triggers"]) == (128, 8, 1, 521)
    assert a["pim_latency_s"] == pytest.approx(pim_s, rel=1e-6)      # 2.33 us
    assert a["pim_energy_j"] == pytest.approx(pim_j, rel=1e-6)       # 28.8 uJ
    host_s = max(2 * n * n / 50e9, (2 * n * n + 2 * n + 2 * n) / 10e9)   # 210 us: bandwidth bound
    pim_total = pim_s + 2 * (2 * n) / EXT_BW                             # x in, y out
    assert pim_total < host_s / 50
    assert f"host +{(host_s - pim_total) * 1e6:.3g} us" in a["placement"]
    assert a["pim_resident_bytes"] == 2 * n * n and a["pim_load_s"] == pytest.approx(2 * n * n / EXT_BW)

    out = tmp_path / "gemv.onnx"
    artifacts.save(r.model, out)
    pim = artifacts.artifact_dir(out) / a["kernel"]
    doc = json.loads(pim.read_text())
    ops = [c["asm"].split()[0] for c in doc["crf"]]
    assert ops == ["MAC", "JUMP", "MAC", "JUMP", "JUMP", "NOP", "MOV", "JUMP", "EXIT"]
    # words by hand from the documented layout: opcode<<28 | dst<<25 | src0<<22 | src1<<19 | AAM<<15
    assert doc["crf"][0]["word"] == f"0x{3 << 28 | 5 << 25 | 4 << 22 | 2 << 19 | 1 << 15:08x}"
    assert doc["crf"][1]["word"] == f"0x{14 << 28 | 63 << 11 | 1:08x}"      # JUMP -1 x63
    assert doc["crf"][4]["word"] == f"0x{14 << 28 | 3 << 11 | 4:08x}"       # 4 tile pairs
    assert doc["counts"] == {"instructions": 9, "triggers_per_run": 521, "runs": 1,
                             "ab_pim_triggers": 521, "bank_accesses_per_run": 520,
                             "grf_a_loads_per_run": 8, "grf_writes_per_run": 72}
    Wl = np.load(pim.with_suffix(".W.npy"))
    assert Wl.dtype == np.float16 and Wl.shape == (128, 2, 1, 4, 8, 8, 16)
    rng = np.random.default_rng(1)
    for p, b, s, j, c, l in zip(*(rng.integers(0, k, 20) for k in (128, 2, 4, 8, 8, 16))):
        assert Wl[p, b, 0, s, j, c, l] == W[p * 8 + j, (2 * s + b) * 128 + c * 16 + l]

    sess = _session(out)
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(n).astype(np.float16)
        y = sess.run(None, {"x": x})[0]
        ok, err, atol = _fp16_close(y, run_onnxruntime(m, {"x": x})[0], n)
        assert y.dtype == np.float16 and ok, (err, atol)
        assert err > 0  # FP16 lane accumulation is not onnxruntime's: the model is not a copy
    prof = [p for p in sess.profile() if p["device"] == "hbm_pim"]
    assert len(prof) == 2 and prof[0]["mode"] == "simulate"
    assert prof[0]["latency_s"] == pytest.approx(pim_s, rel=1e-6)
    assert prof[0]["bytes_moved"] == host_bytes
    assert sess.load_profile()[0]["latency_s"] == pytest.approx(2 * n * n / EXT_BW)
    # model mode (the default): the reference body, charged the recorded plan
    y_model = _session(out, "model").run(None, {"x": x})[0]
    assert np.array_equal(y_model, run_onnxruntime(m, {"x": x})[0])


def test_fp16_gemm_batch_and_bias(tmp_path):
    rng = np.random.default_rng(2)
    K, N = 256, 192
    B = rng.standard_normal((K, N)).astype(np.float16)
    C = rng.standard_normal(N).astype(np.float16)
    m = _model([h.make_node("Gemm", ["a", "B", "C"], ["y"], name="fc")],
               [h.make_tensor_value_info("a", TP.FLOAT16, ["batch", K])],
               [h.make_tensor_value_info("y", TP.FLOAT16, ["batch", N])],
               [numpy_helper.from_array(B, "B"), numpy_helper.from_array(C, "C")])
    r = optimize(m, placement="cost", device_options=NOMINAL, dims={"batch": 3})
    a = cinm.node_attrs(_cinm(r.model, "fc"))
    assert a["device"] == "hbm_pim", a["placement"]
    # 192 rows need 24 PCUs (3 pseudo-channels, 8 rows each); K = 256: 2 tiles; 3 runs
    per_run = 2 * 64 + 1 + 8
    assert (a["pim_form"], a["pim_pcus"], a["pim_channels"], a["pim_runs"], a["pim_triggers"]) == \
        ("gemm_b", 24, 3, 3, 3 * per_run)
    out = tmp_path / "fc.onnx"
    artifacts.save(r.model, out)
    sess = _session(out)
    for batch in (3, 5):  # the planned batch and another one: the host loops over the rows
        x = rng.standard_normal((batch, K)).astype(np.float16)
        y = sess.run(None, {"a": x})[0]
        ok, err, atol = _fp16_close(y, run_onnxruntime(m, {"a": x})[0], K)
        assert y.shape == (batch, N) and ok, (err, atol)
    rec = sess.profile()[-1]
    host_bytes = 3 * CRF_B + 5 * (1 + 2) * 8 * 32 * 3 + 5 * 24 * 8 * 32
    assert rec["bytes_moved"] == host_bytes
    assert rec["latency_s"] == pytest.approx(MODE_S + host_bytes / (3 * CH_BW) + 5 * per_run / CLOCK)


def _eltwise_model(n):
    half = lambda name: h.make_tensor_value_info(name, TP.FLOAT16, [n])  # noqa: E731
    s = numpy_helper.from_array(np.array(0.5, np.float16), "s")
    return _model([h.make_node("Add", ["a", "b"], ["t"], name="add"),
                   h.make_node("Mul", ["t", "s"], ["u"], name="mul"),
                   h.make_node("Relu", ["u"], ["y"], name="relu")],
                  [half("a"), half("b")], [half("y")], [s])


def test_fp16_elementwise_chain(tmp_path):
    n = 1 << 20
    m = _eltwise_model(n)
    r = optimize(m, placement="cost", device_options=NOMINAL)
    attrs = {p: cinm.node_attrs(_cinm(r.model, p)) for p in ("add", "mul", "relu")}
    assert {p: a["device"] for p, a in attrs.items()} == dict.fromkeys(attrs, "hbm_pim")
    # 2^20 elements over 128 PCUs x 2 banks x 16 lanes: 256 columns per bank, 32 blocks of 8
    cols = n // (128 * 2 * 16)
    expect = {"add": (15, 6 * cols + 1, 16 * CRF_B),          # FILL, ADD, MOV per bank and block
              "mul": (11, 4 * cols + 1, 16 * CRF_B + 16 * 32),  # MUL with SRF_M, MOV; SRF write
              "relu": (11, 4 * cols + 1, 16 * CRF_B)}          # MOV with ReLU, MOV
    for p, (instr, trig, host) in expect.items():
        a = attrs[p]
        assert (a["pim_instructions"], a["pim_triggers"]) == (instr, trig), p
        assert a["pim_latency_s"] == pytest.approx(MODE_S + host / EXT_BW + trig / CLOCK), p
    out = tmp_path / "elt.onnx"
    artifacts.save(r.model, out)
    rng = np.random.default_rng(3)
    feeds = {k: (rng.standard_normal(n) * 100).astype(np.float16) for k in ("a", "b")}
    y = _session(out).run(None, feeds)[0]
    # each op rounds once in FP16, as onnxruntime does: bit-exact
    assert np.array_equal(y, run_onnxruntime(m, feeds)[0])


def test_small_elementwise_stays_on_host():
    r = optimize(_eltwise_model(64), placement="cost", device_options=NOMINAL)
    a = cinm.node_attrs(_cinm(r.model, "add"))
    # host: 3 x 128 B / 10 GB/s = 38 ns; HBM-PIM: the 360 ns of mode switches alone are more
    assert a["device"] == "host" and "hbm_pim +" in a["placement"], a["placement"]


# -- (2) float32: not placed by default; with hbm_pim_accept_float32, in FP16 --------------------

def test_float32_only_with_accept_float32(tmp_path):
    n = 1024
    m, _ = gemv_model(n, np.float32)
    r = optimize(m, placement="cost", device_options=NOMINAL)
    a = cinm.node_attrs(_cinm(r.model, "gemv"))
    assert a["device"] != "hbm_pim" and "hbm_pim" not in a["placement"]
    r = optimize(m, placement="cost", device_options=dict(NOMINAL, hbm_pim_accept_float32=True))
    a = cinm.node_attrs(_cinm(r.model, "gemv"))
    assert a["device"] == "hbm_pim" and a["pim_precision"] == "fp32 as fp16", a["placement"]
    out = tmp_path / "f32.onnx"
    artifacts.save(r.model, out)
    sess = _session(out)
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    y = sess.run(None, {"x": x})[0]
    ref = run_onnxruntime(m, {"x": x})[0]
    ok, err, atol = _fp16_close(y, ref, n)
    assert y.dtype == np.float32 and ok, (err, atol)
    assert not np.allclose(y, ref, rtol=1e-4, atol=1e-5)  # it really computed in FP16
    with pytest.raises(CinmError, match="hbm_pim_accept_float32='yes': expected true/false"):
        optimize(m, placement="cost", device_options=dict(NOMINAL, hbm_pim_accept_float32="yes"))
    # a hint without the option is refused, with the reason
    r = optimize(m, placement="heuristic", place=[("gemv*", "hbm_pim")], device_options=NOMINAL)
    a = cinm.node_attrs(_cinm(r.model, "gemv"))
    assert a["device"] != "hbm_pim" and "hbm_pim_accept_float32" in a["placement"]


# -- (3) no other module names it -------------------------------------------------------------

def test_no_other_module_names_the_device():
    root = Path(onnx_cinm.__file__).parent
    own = root / "devices" / "hbm_pim"
    pattern = re.compile(r"hbm_pim|hbm-pim|HbmPim|\bpim_\w+", re.IGNORECASE)
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if own not in p.parents
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
    assert (own / "__init__.py").exists()  # the test looks where the package is


# -- (4) its plan attributes go through the contract ------------------------------------------

def test_plan_attributes_declared(monkeypatch):
    dev = devices.get_device("hbm_pim")
    r = optimize(gemv_model(256)[0], placement="cost", device_options=NOMINAL, check=0)
    a = cinm.node_attrs(_cinm(r.model, "gemv"))
    written = {k for k in a if k.startswith("pim_")}
    assert written == set(dev.plan_attrs)
    assert all(cinm.PLAN_ATTRS[k] == cinm.ATTR_TYPES[t] for k, t in dev.plan_attrs.items())
    onnx.checker.check_model(r.model, full_check=True)  # the schema knows them
    original = dev.lower
    monkeypatch.setattr(dev, "lower", lambda items: [dict(p, pim_undeclared=1) for p in original(items)])
    with pytest.raises(CinmError, match="pim_undeclared.*does not declare"):
        optimize(gemv_model(256)[0], placement="cost", device_options=NOMINAL, check=0)


# -- the kernel file is what runs, written deterministically and only under the folder ---------

def test_kernel_executes_the_emitted_program(tmp_path):
    m, _ = gemv_model(256)
    r = optimize(m, placement="cost", device_options=NOMINAL, check=0)
    a1, a2 = tmp_path / "a.onnx", tmp_path / "b.onnx"
    man1, man2 = artifacts.save(r.model, a1), artifacts.save(r.model, a2)
    assert [k["files"] for k in man1["kernels"]] == [k["files"] for k in man2["kernels"]]
    node = _cinm(r.model, "gemv")
    attrs = cinm.node_attrs(node)
    dev = devices.get_device("hbm_pim")
    from onnx_cinm.analysis import op_info, tensor_infos
    op = op_info(node, tensor_infos(r.model))
    x = np.random.default_rng(5).standard_normal(256).astype(np.float16)
    W = numpy_helper.to_array(next(i for i in r.model.graph.initializer if i.name == node.input[0]))
    root = artifacts.artifact_dir(a1)
    good = dev.kernel(op, attrs, root, {}, "simulate")([W, x])[0][0]
    path = root / attrs["kernel"]
    doc = json.loads(path.read_text())
    mul = 2 << 28 | 5 << 25 | 4 << 22 | 2 << 19 | 1 << 15   # MUL instead of MAC: no accumulation
    doc["crf"][0]["word"] = f"0x{mul:08x}"
    path.write_text(json.dumps(doc))
    bad = dev.kernel(op, attrs, root, {}, "simulate")([W, x])[0][0]
    assert not np.allclose(bad.astype(np.float32), good.astype(np.float32), atol=1)
    doc["crf"][1]["word"] = f"0x{14 << 28 | 62 << 11 | 1:08x}"  # one MAC short of the stream
    path.write_text(json.dumps(doc))
    with pytest.raises(CinmError, match="trigger for EVEN_BANK met MAC"):
        dev.kernel(op, attrs, root, {}, "simulate")([W, x])
    with pytest.raises(CinmError, match="not hbm_pim/<stem>.pim"):
        dev.emit(op, dict(attrs, kernel="hbm_pim/../../evil.pim"), {}, tmp_path / "out")
    assert not (tmp_path / "evil.pim").exists()


def test_devices_command_lists_it(capsys):
    assert main(["devices"]) == 0
    text = capsys.readouterr().out
    part = text[text.index("hbm_pim (cnm)"):]
    assert "clock_hz = 300000000.0" in part and "pcus = 128" in part and "[unconfirmed]" in part


def test_constant_elementwise_operand_is_resident(tmp_path):
    n = 3000
    b = np.random.default_rng(6).standard_normal(n).astype(np.float16)
    m = _model([h.make_node("Add", ["x", "b"], ["y"], name="bias")],
               [h.make_tensor_value_info("x", TP.FLOAT16, [n])],
               [h.make_tensor_value_info("y", TP.FLOAT16, [n])], [numpy_helper.from_array(b, "b")])
    r = optimize(m, placement="cost", device_options=NOMINAL)
    a = cinm.node_attrs(_cinm(r.model, "bias"))
    assert a["device"] == "hbm_pim", a["placement"]
    # 3000 elements: 16 PCUs (2 pseudo-channels) of 2 banks x 8 columns x 16 lanes = 4096 slots;
    # the constant's region of 16 x 2 x 8 columns of 32 B stays in the banks, loaded once
    assert (a["pim_pcus"], a["pim_triggers"], a["pim_resident_bytes"]) == (16, 6 * 8 + 1, 8192)
    assert a["pim_load_s"] == pytest.approx(8192 / (2 * CH_BW))
    assert a["pim_load_j"] == pytest.approx(8192 * 8 * (E_EXT + E_INT))
    out = tmp_path / "bias.onnx"
    artifacts.save(r.model, out)
    x = np.random.default_rng(7).standard_normal(n).astype(np.float16)
    sess = _session(out)
    assert np.array_equal(sess.run(None, {"x": x})[0], run_onnxruntime(m, {"x": x})[0])
    assert sess.load_profile()[0]["latency_s"] == pytest.approx(8192 / (2 * CH_BW))


def out_nodes(path) -> list:
    """The cinm nodes of the model saved at ``path``."""
    return [n for n in onnx.load(str(path)).graph.node if n.domain == cinm.DOMAIN]


def test_compare_reports_fp16_accumulation_as_inexact_not_a_failure(tmp_path, capsys):
    """`compare` in hbm_pim_mode=simulate judged FP16-accumulated GEMVs by the float tolerance
    and failed (a float32-output fp16 MiniLM: 43,119 of 49,152 elements 'off' at a relative RMS
    error of 0.0018); the device says the kernel is inexact by design (Device.inexact), so
    compare reports error statistics and exits 0. In model mode it stays a verdict."""
    n = 256
    m, _ = gemv_model(n, np.float32)
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q", "--objective", "latency",
                 "--host-roofline", "nominal", "--hbm-pim-accept-float32",
                 "--cim-preset", "pcm-occ"]) == 0
    assert _session(out).inexact_kernels() == ["HBM-PIM FP16 accumulation"]
    assert _session(out, "model").inexact_kernels() == []
    capsys.readouterr()
    assert main(["compare", str(src), str(out), "--provider-option", "hbm_pim_mode=simulate"]) == 0
    text = capsys.readouterr().out
    assert "HBM-PIM FP16 accumulation: inexact by design" in text and "relative RMS error" in text
    assert main(["compare", str(src), str(out)]) == 0  # model mode: the reference body, exact
    text = capsys.readouterr().out
    assert "inexact by design" not in text
    # ... and the verdict says which device nodes it did not see in their arithmetic
    hbm = sum(cinm.node_attrs(n).get("device") == "hbm_pim" for n in out_nodes(out))
    assert hbm >= 1
    body = "its reference body" if hbm == 1 else "their reference bodies"
    assert (f"device nodes in their kernels, except {hbm} hbm_pim node{'s' * (hbm != 1)} run by "
            f"onnxruntime as {body} and charged by the device's cost model, whose device "
            "arithmetic is not in this comparison") in text


def test_a_pcu_count_off_the_channel_grid_is_an_option_error(capsys):
    """hbm_pim_pcus=12 passed the option checks and then turned the device off op by op (the
    reason only in node attributes); it is an error where options are checked."""
    m, _ = gemv_model(64, np.float16)
    with pytest.raises(CinmError, match="hbm_pim_pcus=12: expected a multiple of 8"):
        optimize(m, device_options={"hbm_pim_pcus": 12})
    with pytest.raises(SystemExit) as e:  # a usage error, as other bad flag values
        main(["optimize", "--example", "lenet", "-o", "/nonexistent/x.onnx", "--hbm-pim-pcus", "12"])
    assert e.value.code == 2
    assert "hbm_pim_pcus=12: expected a multiple of 8" in capsys.readouterr().err


def test_compare_fails_an_fp16_overflow_even_when_inexact_by_design(tmp_path, capsys):
    """A float32 constant beyond FP16's range (MiniLM's -3.4e38 attention mask) overflowed to
    Inf in simulate mode, and compare, reporting error statistics, exited 0 with a relative RMS
    error of 0."""
    n = 4096
    c = numpy_helper.from_array(np.array(-3.0e38, np.float32), "c")
    m = _model([h.make_node("Mul", ["x", "c"], ["y"], name="mul")],
               [h.make_tensor_value_info("x", TP.FLOAT, [n])],
               [h.make_tensor_value_info("y", TP.FLOAT, [n])], [c])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(m, src)
    assert main(["optimize", str(src), "-o", str(out), "-q", "--hbm-pim-accept-float32",
                 "--place", "mul*=hbm_pim"]) == 0
    assert cinm.node_attrs(_cinm(onnx.load(out), "mul"))["device"] == "hbm_pim"
    capsys.readouterr()
    x = tmp_path / "x.npy"
    np.save(x, np.full(n, 1e-3, np.float32))   # y = -3e35: finite in float32, -inf in FP16
    assert main(["compare", str(src), str(out), "--input", f"x={x}",
                 "--provider-option", "hbm_pim_mode=simulate"]) == 1
    assert "FAILED: y: non-finite values where onnxruntime's are finite" in capsys.readouterr().out


def test_the_pin_rate_reads_back_as_given(tmp_path):
    """A FLOAT attribute is float32: the plan's 2.4 Gb/s read back as 2.4000000953674316 in the
    recorded options (and priced the simulated runs with it)."""
    m, _ = gemv_model(256)
    for rate in (None, 2.1):
        opts = dict(NOMINAL, **({} if rate is None else {"hbm_pim_pin_gbps": rate}))
        r = optimize(m, placement="cost", device_options=opts, check=0)
        a = cinm.node_attrs(_cinm(r.model, "gemv"))
        assert a["device"] == "hbm_pim"
        want = 2.4 if rate is None else rate
        assert a["pim_pin_gbps"] == repr(want)
        plans = [(n.name, n.op_type, cinm.node_attrs(n)) for n in r.model.graph.node if n.domain == cinm.DOMAIN]
        assert devices.get_device("hbm_pim").recorded_options(plans)["hbm_pim_pin_gbps"] == want
