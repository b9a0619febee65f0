"""onnxruntime's contrib int8 LSTM (com.microsoft DynamicQuantizeLSTM) lowered to the LSTM form
with int32 cinm Gemms (issue 11). Expected outputs come from onnxruntime on the original op
(its reference session on one thread: see ``golden.THREAD_DEPENDENT``); the weights are
quantized here with numpy."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession


def _quant(w: np.ndarray, signed: bool, per_channel: bool):
    """``w [dirs, K, N]`` quantized as onnxruntime's quantizer does: int8 symmetric (zero point
    0) or uint8 asymmetric with one zero point for the whole tensor (the kernel requires it),
    scale per direction or per output channel."""
    if signed:
        s = np.abs(w).max(axis=1) / 127 if per_channel else np.abs(w).max(axis=(1, 2)) / 127
        sb = s[:, None, :] if per_channel else s[:, None, None]
        return np.round(w / sb).astype(np.int8), s.astype(np.float32), np.zeros(s.shape, np.int8)
    lo, hi = min(w.min(), 0.0), max(w.max(), 0.0)
    s = np.full(w.shape[0], (hi - lo) / 255, np.float32)
    z = np.full(w.shape[0], np.round(-lo / s[0]), np.uint8)
    q = np.clip(np.round(w / s[0]) + z[0], 0, 255).astype(np.uint8)
    if per_channel:
        s, z = np.repeat(s[:, None], w.shape[2], 1), np.repeat(z[:, None], w.shape[2], 1)
    return q, s, z


def _model(S, batch, size, hidden, direction="forward", signed=True, per_channel=False,
           init=False, peep=False, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g4 = 4 * hidden
    W, ws, wz = _quant((rng.standard_normal((dirs, size, g4)) * 0.5).astype(np.float32), signed, per_channel)
    R, rs, rz = _quant((rng.standard_normal((dirs, hidden, g4)) * 0.5).astype(np.float32), signed, per_channel)
    B = (rng.standard_normal((dirs, 2 * g4)) * 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((W, "W"), (R, "R"), (B, "B"), (ws, "ws"), (wz, "wz"), (rs, "rs"), (rz, "rz"))]
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [S, batch, size])]
    names = ["X", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"]
    if peep:
        inits.append(numpy_helper.from_array((rng.standard_normal((dirs, 3 * hidden)) * 0.5).astype(np.float32), "P"))
        names[7] = "P"
    if init:
        ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hidden])
                for n in ("h0", "c0")]
        names[5:7] = ["h0", "c0"]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["Y", "Y_h", "Y_c"], domain="com.microsoft",
                            hidden_size=hidden, direction=direction, name="qlstm", **attrs)
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [S, dirs, batch, hidden])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hidden]) for n in ("Y_h", "Y_c")]
    g = helper.make_graph([node], "qlstm", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)], ir_version=8)


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in model.graph.input}


def _ort(model, feeds, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


CASES = [  # (S, batch, size, hidden, options)
    (5, 1, 7, 6, {}),
    (5, 3, 7, 6, {"signed": False, "per_channel": True}),
    (4, 1, 5, 8, {"direction": "bidirectional", "per_channel": True, "init": True}),
    (4, 3, 5, 8, {"direction": "bidirectional", "signed": False}),
    (3, 2, 4, 5, {"direction": "reverse", "init": True}),
    (4, 2, 3, 4, {"peep": True, "clip": 0.8}),
    (3, 1, 3, 4, {"input_forget": 1, "direction": "bidirectional"}),
]


@pytest.mark.parametrize("S,batch,size,hidden,opts", CASES)
def test_int8_lstm_lowered_matches_onnxruntime(S, batch, size, hidden, opts):
    """The products are int32 cinm Gemms (per direction: 1 over X + S over H); onnxruntime
    on one thread computes the same integers and the same float32 rescaling and gate math,
    so the outputs agree bit for bit. With peepholes onnxruntime adds ``P * C`` before the
    bias, the lowering after it: last-bit differences only."""
    model = _model(S, batch, size, hidden, **opts)
    feeds = _feeds(model)
    refs = _ort(model, feeds, 1)
    res = optimize(model, stop_after="cinm")
    assert res.check.ok
    assert not [n for n in res.model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    gemms = [n for n in res.model.graph.node if n.domain == cinm.DOMAIN and n.op_type == "Gemm"]
    dirs = 2 if opts.get("direction") == "bidirectional" else 1
    assert len(gemms) == dirs * (1 + S)
    inits = {t.name: t for t in res.model.graph.initializer}
    # the weight operand is the model's int8/uint8 weight minus its zero point, as int32
    assert all(inits[g.input[1]].data_type == TensorProto.INT32 for g in gemms)
    for got, ref in zip(run_onnxruntime(res.model, feeds), refs):
        if opts.get("peep"):
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("place", ["memristor", "upmem"])
def test_int8_lstm_on_devices_matches_onnxruntime(tmp_path, place):
    model = _model(4, 3, 5, 8, direction="bidirectional", per_channel=True)
    feeds = _feeds(model)
    res = optimize(model, place=[("*", place)])
    assert res.check.ok and "DynamicQuantizeLSTM" not in res.host_flops
    path = tmp_path / "q.onnx"
    artifacts.save(res.model, path)
    for got, ref in zip(InferenceSession(path).run(None, feeds), _ort(model, feeds, 1)):
        np.testing.assert_array_equal(got, ref)


def test_onnxruntime_on_two_threads_quantizes_batch_parts_apart():
    """Why the reference runs on one thread: with 3 rows, 6 hidden units and 2 threads,
    onnxruntime quantizes H of rows {0, 1} and {2} on their own ranges; one thread (and the
    lowering) quantizes all 3 rows together. Batch 1 is the same either way."""
    model = _model(5, 3, 7, 6)
    feeds = _feeds(model)
    one, two = _ort(model, feeds, 1), _ort(model, feeds, 2)
    assert not np.array_equal(one[0], two[0])
    single = _model(5, 1, 7, 6)
    f1 = _feeds(single)
    np.testing.assert_array_equal(_ort(single, f1, 1)[0], _ort(single, f1, 2)[0])


def test_unrolled_int8_lstm_steps_share_one_weight_copy(tmp_path, monkeypatch):
    """An LSTM quantized by onnxruntime's own quantizer (``quantize_dynamic``: a
    DynamicQuantizeLSTM) and unrolled: its S step kernels program the same recurrent weights
    (one tile set) and hold one simulator copy of them between them, not one each (three
    768-wide layers of 80 steps held 4.6 GB). Hand count: two weight arrays, the input
    weights ``[size, 4h]`` and the recurrent ones ``[h, 4h]``, float64 (the simulator's exact
    integer data path), so ``8 * 4h * (size + h)`` bytes; and one int8 form of each for the
    product kernel; the simulator's integer checks run once per array (two). Outputs bit for
    bit onnxruntime's on the quantized model."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from onnx_cinm.sim.crossbar import simulator

    S, size, hidden = 6, 5, 8
    rng = np.random.default_rng(3)
    w = [(rng.standard_normal(s) * 0.5).astype(np.float32)
         for s in ((1, 4 * hidden, size), (1, 4 * hidden, hidden), (1, 8 * hidden))]
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"],
                            hidden_size=hidden, name="lstm")
    g = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [S, 1, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [S, 1, 1, hidden])],
        [numpy_helper.from_array(a, n) for a, n in zip(w, "WRB")])
    float_path, q_path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              float_path)
    quantize_dynamic(float_path, q_path, weight_type=QuantType.QInt8)
    model = onnx.load(q_path)
    assert [n.op_type for n in model.graph.node] == ["DynamicQuantizeLSTM"]
    res = optimize(model, place=[("*", "memristor")])
    path = tmp_path / "o.onnx"
    artifacts.save(res.model, path)
    checks = []
    real_check = simulator._check_integer
    monkeypatch.setattr(simulator, "_check_integer",
                        lambda prog, r, arr: checks.append(r.kind) or real_check(prog, r, arr))
    sess = InferenceSession(path)
    assert checks == ["weight", "weight"]
    kernels = [d.kernel for d in sess._device_nodes if getattr(d.kernel, "_sim", None)]
    assert len(kernels) == 1 + S
    held = {a.__array_interface__["data"][0]: a for k in kernels for a in k._sim.const.values()}
    assert len(held) == 2
    assert sum(a.nbytes for a in held.values()) == 8 * 4 * hidden * (size + hidden)
    feeds = {"X": rng.standard_normal((S, 1, size)).astype(np.float32)}
    np.testing.assert_array_equal(sess.run(None, feeds)[0], _ort(model, feeds, 1)[0])
    int8 = [v for k, v in sess._kernels._ort.items() if k[0] == "intW"]
    assert len(int8) == 2
