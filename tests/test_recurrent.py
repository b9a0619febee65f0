"""LSTM, GRU and RNN lowered to cinm Gemms (input projection of all steps + one per step over
the shared recurrent weight) with the gate math on the host (issue 11, finding 5).

Expected outputs come from onnxruntime on the original (whole) op; expected node and tile
counts are worked out in the comments.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.runtime.session import InferenceSession

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _model(op, S, batch, size, hidden, *, direction="forward", layout=0, bias=True,
           init=False, clip=None, peep=False, lbr=0, seq_lens=False, acts=None, seed=0,
           seq_dim=None):
    """One ``op`` node over X ([S, batch, size], or [batch, S, size] with layout 1) with random
    weights; graph outputs Y, Y_h (and Y_c for LSTM); initial states as graph inputs."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    G = GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    xs = [seq_dim or S, batch, size] if layout == 0 else [batch, seq_dim or S, size]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, xs)]
    inits = [numpy_helper.from_array(rand(dirs, G * hidden, size), "W"),
             numpy_helper.from_array(rand(dirs, G * hidden, hidden), "R")]
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        inits.append(numpy_helper.from_array(rand(dirs, 2 * G * hidden), "B"))
        names[3] = "B"
    if seq_lens:
        inits.append(numpy_helper.from_array(np.full(batch, S, np.int32), "lens"))
        names[4] = "lens"
    state = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    if init:
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, state))
        names[5] = "h0"
        if op == "LSTM":
            inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, state))
            names[6] = "c0"
    if peep:
        inits.append(numpy_helper.from_array(rand(dirs, 3 * hidden), "P"))
        names[7] = "P"
    n_in = {"LSTM": 8, "GRU": 6, "RNN": 6}[op]
    names = names[:n_in]
    while names and not names[-1]:
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    attrs = {"hidden_size": hidden, "direction": direction}
    if layout:
        attrs["layout"] = 1
    if clip is not None:
        attrs["clip"] = clip
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    if acts:
        attrs["activations"] = acts
    node = helper.make_node(op, names, outs, name="rnn", **attrs)
    ys = [seq_dim or S, dirs, batch, hidden] if layout == 0 else [batch, seq_dim or S, dirs, hidden]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ys)] + [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, state) for o in outs[1:]]
    g = helper.make_graph([node], "rnn", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value or 3 for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _gemms(model):
    return [n for n in model.graph.node if n.domain == cinm.DOMAIN and n.op_type == "Gemm"]


CASES = [
    # (op, S, batch, size, hidden, options)
    ("LSTM", 5, 2, 7, 6, {}),
    ("LSTM", 4, 3, 5, 8, {"direction": "reverse", "init": True}),
    ("LSTM", 3, 2, 4, 5, {"direction": "bidirectional", "init": True, "peep": True}),
    ("LSTM", 6, 1, 3, 4, {"clip": 0.7, "bias": False, "seq_lens": True}),
    ("LSTM", 4, 2, 5, 3, {"layout": 1, "direction": "bidirectional", "init": True}),
    ("LSTM", 1, 2, 5, 3, {"acts": ["Sigmoid", "Relu", "Tanh"]}),
    ("GRU", 5, 2, 7, 6, {"lbr": 0}),
    ("GRU", 5, 3, 4, 6, {"lbr": 1, "init": True}),
    ("GRU", 4, 2, 3, 5, {"lbr": 0, "direction": "bidirectional", "init": True, "clip": 0.5}),
    ("GRU", 3, 2, 3, 4, {"lbr": 1, "direction": "reverse", "layout": 1, "bias": False}),
    ("RNN", 6, 2, 5, 7, {}),
    ("RNN", 4, 3, 3, 4, {"direction": "bidirectional", "init": True, "clip": 1.0,
                         "acts": ["Relu", "Tanh"]}),
]


@pytest.mark.parametrize("op,S,batch,size,hidden,opts", CASES)
def test_lowered_recurrent_op_matches_onnxruntime(op, S, batch, size, hidden, opts):
    model = _model(op, S, batch, size, hidden, **opts)
    onnx.checker.check_model(model, full_check=True)
    feeds = _feeds(model)
    if opts.get("layout"):
        # onnxruntime runs no batch-first recurrent op: the reference is the same op (same
        # weights) with layout 0 on transposed inputs, its outputs transposed back
        ref_model = _model(op, S, batch, size, hidden, **{**opts, "layout": 0})
        t = {"X": (1, 0, 2), "h0": (1, 0, 2), "c0": (1, 0, 2)}
        refs = run_onnxruntime(ref_model, {k: v.transpose(t[k]) for k, v in feeds.items()})
        refs = [refs[0].transpose(2, 0, 1, 3)] + [r.transpose(1, 0, 2) for r in refs[1:]]
    else:
        refs = run_onnxruntime(model, feeds)
    res = optimize(model, stop_after="cinm", check=0 if opts.get("layout") else 1)
    types = {n.op_type for n in res.model.graph.node}
    assert op not in types
    dirs = 2 if opts.get("direction") == "bidirectional" else 1
    # per direction: 1 input projection + S recurrent Gemms (GRU linear_before_reset=0: 2S)
    per_step = 2 if op == "GRU" and not opts.get("lbr") else 1
    assert len(_gemms(res.model)) == dirs * (1 + per_step * S)
    got = run_onnxruntime(res.model, feeds)
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_recurrent_weight_is_one_initializer_shared_by_the_steps():
    model = _model("LSTM", 6, 2, 5, 8)
    res = optimize(model, stop_after="cinm")
    gemms = _gemms(res.model)
    # the input projection reads W^T [5, 32]; the 6 step Gemms all read one R^T [8, 32]
    assert len(gemms) == 7
    assert len({g.input[1] for g in gemms[1:]}) == 1
    inits = {i.name: i for i in res.model.graph.initializer}
    assert list(inits[gemms[1].input[1]].dims) == [8, 32]
    assert list(inits[gemms[0].input[1]].dims) == [5, 32]


@pytest.mark.parametrize("opts", [{}, {"peep": True, "init": True, "direction": "bidirectional"}])
def test_input_forget_couples_the_gates_as_onnxruntime(opts):
    # input_forget = 1: onnxruntime takes the forget gate as 1 - i_t
    model = _model("LSTM", 4, 2, 3, 5, **opts)
    model.graph.node[0].attribute.append(helper.make_attribute("input_forget", 1))
    res = optimize(model, stop_after="cinm")
    assert "LSTM" not in [n.op_type for n in res.model.graph.node]
    feeds = _feeds(model)
    for g, r in zip(run_onnxruntime(res.model, feeds), run_onnxruntime(model, feeds)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_sequence_lens_at_run_time_is_kept_whole_with_the_reason():
    model = _model("LSTM", 4, 2, 3, 4)
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    node = model.graph.node[0]
    node.input.extend([""] * (5 - len(node.input)))
    node.input[4] = "lens"
    res = optimize(model, stop_after="cinm", check=0)
    assert [n.op_type for n in res.model.graph.node] == ["LSTM"]
    assert any("sequence_lens given at run time" in r for r in res.stats["to_cinm"]["kept"]["LSTM"])


@pytest.mark.parametrize("op,opts", [
    ("LSTM", {"direction": "bidirectional", "init": True, "peep": True, "clip": 0.8}),
    ("GRU", {"lbr": 0, "direction": "reverse"}),
    ("GRU", {"lbr": 1, "init": True}),
    ("RNN", {}),
])
def test_dynamic_length_hoists_the_input_projection_and_scans_the_steps(op, opts):
    # length T unknown: one cinm Gemm per direction (the input projection of all steps), the
    # steps in a Scan per direction; the model runs at any length, as onnxruntime's op does
    model = _model(op, 4, 2, 5, 6, seq_dim="T", **opts)
    res = optimize(model)
    dirs = 2 if opts.get("direction") == "bidirectional" else 1
    assert [n.op_type for n in res.model.graph.node if n.op_type in ("Scan", op)] == ["Scan"] * dirs
    assert len(_gemms(res.model)) == dirs
    for S in (1, 3, 7):
        rng = np.random.default_rng(S)
        feeds = {vi.name: rng.standard_normal(
            [S if d.dim_param == "T" else d.dim_value for d in vi.type.tensor_type.shape.dim]
        ).astype(np.float32) for vi in model.graph.input}
        for g, r in zip(run_onnxruntime(res.model, feeds), run_onnxruntime(model, feeds)):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_the_scans_of_a_dynamic_length_are_not_called_the_models_control_flow():
    # a bidirectional LSTM of dynamic length: two Scans the compiler made (one per direction);
    # the summary said "control flow: Scan x2; the 38 nodes of their bodies run on the host as
    # they are", as for a model's own If/Loop/Scan. One recurrence, said as such.
    res = optimize(_model("LSTM", 4, 2, 5, 6, seq_dim="T", direction="bidirectional"))
    assert [n.op_type for n in res.model.graph.node].count("Scan") == 2
    lines = res.summary().splitlines()
    assert not [ln for ln in lines if ln.startswith("control flow:")]
    assert [ln.split(";")[0] for ln in lines if ln.startswith("recurrences")] == [
        "recurrences of a dynamic length: LSTM x1"]


def test_a_long_sequence_runs_in_a_scan(monkeypatch):
    # above MAX_UNROLL steps the steps are not unrolled: input projection + a Scan
    from onnx_cinm.passes import recurrent

    monkeypatch.setattr(recurrent, "MAX_UNROLL", 4)
    model = _model("GRU", 5, 2, 3, 4, lbr=1)
    res = optimize(model)
    assert [n.op_type for n in res.model.graph.node if n.op_type in ("Scan", "GRU")] == ["Scan"]
    assert len(_gemms(res.model)) == 1 and res.check.ok


def test_a_sized_length_above_the_limit_says_so_not_that_it_is_unrolled(monkeypatch):
    # notes_brnn at --dim T=300: the summary said "recurrences of a dynamic length ... (sized
    # with --dim, the steps are unrolled into cinm ops too)" though T was sized; 300 > 256
    from onnx_cinm.passes import recurrent

    monkeypatch.setattr(recurrent, "MAX_UNROLL", 4)
    res = optimize(_model("GRU", 5, 2, 3, 4, seq_dim="T", lbr=1), dims={"T": 5})
    assert [n.op_type for n in res.model.graph.node].count("Scan") == 1
    lines = [ln for ln in res.summary().splitlines() if ln.startswith("recurrences")]
    assert lines == [("recurrences GRU x1: length 5 exceeds the unroll limit of 4 steps: steps "
                      "run in a Scan on the host (a fixed limit); their input projections are "
                      "cinm ops")]


def test_dynamic_length_sized_by_dim_is_unrolled():
    model = _model("GRU", 5, 2, 3, 4, seq_dim="T", lbr=1)
    res = optimize(model, stop_after="cinm", dims={"T": 5})
    assert len(_gemms(res.model)) == 1 + 5


def test_a_model_unrolled_for_a_length_refuses_another_in_one_line(tmp_path):
    # planned at T = 5, N = 2: the steps are 5 Split outputs, so T is fixed (recorded), the
    # batch N is not. Another batch runs and matches onnxruntime; T = 7 used to fail inside
    # onnxruntime ("Cannot split using values in 'split' attribute ... Input shape={7,2,24}")
    from onnx_cinm import frontend
    from onnx_cinm.errors import CinmError

    model = _model("LSTM", 5, "N", 4, 6, seq_dim="T")
    res = optimize(model, dims={"T": 5, "N": 2}, placement="heuristic")
    assert frontend.unrolled_dims(res.model) == {"T": 5}
    path = tmp_path / "lstm.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(str(path))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 4)).astype(np.float32)
    for g, r in zip(sess.run(None, {"X": x}), run_onnxruntime(model, {"X": x})):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    with pytest.raises(CinmError, match=r"^model '.*lstm.onnx' was unrolled for T=5 \(input 'X' "
                       r"has T=7\); re-optimize with --dim T=7, or without sizing T"):
        sess.run(None, {"X": np.zeros((7, 3, 4), np.float32)})


def test_run_at_another_length_than_unrolled_is_a_one_line_error(tmp_path, capsys):
    from onnx_cinm.cli import main

    res = optimize(_model("GRU", 4, 2, 3, 5, seq_dim="T", lbr=1), dims={"T": 4})
    artifacts.save(res.model, tmp_path / "gru.onnx")
    assert main(["run", str(tmp_path / "gru.onnx"), "--dim", "T=6"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was unrolled for T=4 (input 'X' has T=6)" in err
    assert "Split" not in err


def test_lstm_on_crossbars_programs_r_once(tmp_path):
    # LSTM hidden 32, input 16, S = 10, batch 2 on pcm-occ (64 x 64, P = 4). W^T [16, 128]:
    # Kt = 1, Nt = 2 -> 2 tiles; R^T [32, 128]: 2 tiles, one tile set for the 10 step Gemms.
    # Sets 2 + 2 = 4 <= P: all resident, 4 writes at load, none per inference (as 11 separate
    # kernels: 22 tiles > 4, all streaming, 22 writes every inference).
    model = _model("LSTM", 10, 2, 16, 32)
    res = optimize(model, place=[("*", "memristor")], device_options={"cim_preset": "pcm-occ"})
    plans = [a for _, _, dev, a in res.stats["device_lowering"]["plans"] if dev == "memristor"]
    assert len(plans) == 11
    assert sum(a["cim_writes_load"] for a in plans) == 4
    assert sum(a["cim_writes"] for a in plans) == 0
    assert sorted({a.get("cim_tile_users", 1) for a in plans}) == [1, 10]
    path = tmp_path / "lstm.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    feeds = _feeds(model)
    refs = run_onnxruntime(model, feeds)
    for g, r in zip(sess.run(None, feeds), refs):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    assert sum(r["writes"] for r in sess.load_profile()) == 4
    assert sum(r["writes"] for r in sess.profile() if r["device"] == "memristor") == 0


def test_length_computed_by_a_reshape_is_unrolled_at_the_planned_size():
    # a CRNN's sequence: X[T, 2, 4, 2] reshaped to [T, 2, 8] by a shape computed from Shape(X)
    # (onnx shape inference cannot tell it). Planned at T = 5, the rule evaluates the shape:
    # 1 input projection + 5 step Gemms, the check (at T = 5) passes, and the FLOPs are the
    # LSTM's: input projection 2*5*2*8*16 = 2560 plus 5 steps of 2*2*4*16 = 256 each.
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", 2, 4, 2])
    inits = [numpy_helper.from_array(np.array([0, 1], np.int64), "idx"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(rng.standard_normal((1, 16, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 16, 4)).astype(np.float32), "R")]
    nodes = [helper.make_node("Shape", ["X"], ["shp"]),
             helper.make_node("Gather", ["shp", "idx"], ["tb"], axis=0),
             helper.make_node("Concat", ["tb", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["X", "target"], ["seq"]),
             helper.make_node("LSTM", ["seq", "W", "R"], ["Y"], name="lstm", hidden_size=4)]
    g = helper.make_graph(nodes, "crnn", [x],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    res = optimize(model, dims={"T": 5}, placement="heuristic")
    assert res.check is not None and res.check.ok
    assert not [n for n in res.model.graph.node if n.op_type == "LSTM"]
    gemms = _gemms(res.model)
    assert len(gemms) == 6
    from onnx_cinm import frontend
    assert frontend.unrolled_dims(res.model) == {"T": 5}  # through the Reshape
    # the Gemm FLOPs (the gate math adds a few hundred elementwise FLOPs on top)
    assert 2560 + 5 * 256 <= res.flops_total < 2560 + 5 * 256 + 1000


def test_an_if_chosen_by_a_shape_is_not_shape_computation():
    # If(cond = Shape(x)[0] == 4) returns x * 2 (then) or x (else): its output is data, read
    # from the outer scope by the bodies, though its only input is on the shape path. The Relu
    # after it is work for a device, not "shape computation" (Silero VAD's decoder Conv was).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n0"], axis=0),
             helper.make_node("Equal", ["n0", "four"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    inits = [two, numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(4, np.int64), "four")]
    g = helper.make_graph(nodes, "ifshape", [x],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, stop_after="cinm", check=0)
    assert "Relu" not in res.stats["to_cinm"]["kept"]
    assert [n.op_type for n in res.model.graph.node if n.domain == cinm.DOMAIN] == ["Relu"]


def test_compare_skips_the_nan_check_of_a_lowered_lstm(tmp_path, capsys):
    # onnxruntime's LSTM turns a NaN input into finite outputs, the lowered gate math keeps
    # NaN: `compare` says why it skips the NaN/Inf check instead of failing it (it used to
    # report "stateN: 246 of 256 elements off" on Silero VAD)
    from onnx_cinm.cli import main

    model = _model("LSTM", 3, 2, 4, 5, init=True)
    onnx.save(model, tmp_path / "m.onnx")
    res = optimize(model, placement="heuristic")
    artifacts.save(res.model, tmp_path / "o.onnx")
    assert main(["compare", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx")]) == 0
    out = capsys.readouterr().out
    assert "NaN/Inf check skipped: onnxruntime's LSTM kernels clamp" in out


def test_onnx_node_cases_with_frozen_weights_match_their_expected_outputs():
    # onnx's own LSTM/GRU/RNN node cases (expected outputs from onnx's test data, layout 1 ones
    # included, which onnxruntime cannot run) with W, R, B, P frozen as initializers: all lowered
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [tc for tc in load_model_tests(kind="node")
                 if any(n.op_type in GATES for n in tc.model.graph.node)]
    assert len(cases) >= 18
    for tc in cases:
        m = onnx.ModelProto()
        m.CopyFrom(tc.model)
        ins, outs = tc.data_sets[0]
        names = [i.name for i in m.graph.input]
        keep = {names[0], "initial_h", "initial_c"}
        m.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in zip(names, ins)
                                   if n not in keep)
        inputs = [i for i in m.graph.input if i.name in keep]
        del m.graph.input[:]
        m.graph.input.extend(inputs)
        res = optimize(m, check=0, stop_after="cinm")
        assert not res.stats["to_cinm"]["kept"], tc.name
        got = run_onnxruntime(res.model, {n: a for n, a in zip(names, ins) if n in keep})
        for g, e in zip(got, outs):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=tc.name)


def test_optimize_summary_says_the_nan_check_of_a_lowered_lstm_was_skipped(tmp_path, capsys):
    # `optimize` used to print nothing about the skipped NaN/Inf check (only with -v): the
    # summary reads as if the check ran in full
    from onnx_cinm.cli import main

    onnx.save(_model("LSTM", 3, 2, 4, 5, init=True), tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--placement", "heuristic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    skipped = [ln.strip() for ln in lines if ln.strip().startswith("NaN/Inf check: skipped (")]
    assert len(skipped) == 1
    assert "onnxruntime's LSTM kernels clamp the inputs of their activations" in skipped[0]


def _rows(text: str, prefix: str) -> list[list[str]]:
    """The lines of ``text`` that start with ``prefix`` (after indentation), split at runs
    of two or more spaces (the table's column gaps)."""
    import re

    return [re.split(r"\s{2,}", ln.strip()) for ln in text.splitlines()
            if ln.strip().startswith(prefix)]


def test_the_steps_of_an_unrolled_recurrence_share_one_row_in_optimize_run_and_report(
        tmp_path, capsys):
    # beats_blstm at T=201 printed 1213 crossbar rows in optimize (1200 identical steps over one
    # tile set), 1818 profile rows, 1223 report lines. Here an RNN of 5 steps, all its Gemms
    # pinned to crossbars: the input projection rnn/Gemm [5x3x4] and one Gemm per step
    # [1x4x4] over the one recurrent weight R, rnn/Gemm_1 programming its tiles and
    # rnn/Gemm_2.._5 reading them ('=').
    from onnx_cinm import report
    from onnx_cinm.cli import main

    model = _model("RNN", 5, 1, 3, 4, seed=0)
    model.graph.node[0].name = "rnn"
    onnx.save(model, tmp_path / "rnn.onnx")
    out = str(tmp_path / "o.onnx")
    steps = [f"rnn/Gemm_{k}" for k in range(2, 6)]

    def cli(*argv) -> str:
        assert main(list(argv)) == 0
        return capsys.readouterr().out

    args = ("optimize", str(tmp_path / "rnn.onnx"), "-o", out, "--place", "rnn/*=memristor",
            "--check", "0")
    folded, every = cli(*args), cli(*args, "-v")
    # optimize: the 4 steps on the shared tiles in one row, the tile owner and the projection apart
    def kernels(text):  # the crossbar table's rows (-v also lists the placements)
        return [r for r in _rows(text, "rnn/") if r[1] == "B"]

    assert [r[0] for r in kernels(folded)] == ["rnn/Gemm", "rnn/Gemm_1", "rnn/Gemm_2 x4"]
    assert kernels(folded)[2][1:] == kernels(every)[2][1:]
    assert kernels(folded)[2][3] == "=1"  # on the tiles of rnn/Gemm_1
    assert [r[0] for r in kernels(every)] == ["rnn/Gemm", "rnn/Gemm_1", *steps]
    assert _rows(folded, "total (6 kernels)") == _rows(every, "total (6 kernels)")
    assert "6 kernels in 3 rows" in folded and "kernels in" not in every

    # run --profile: every step's modeled figures are the same (tile ownership is paid at
    # load), so the 5 steps fold; the folded row's modeled latency is 5 steps' sum
    prof = cli("run", out, "--profile", "--random", "2")
    prof_all = cli("run", out, "--profile", "--random", "2", "--all-nodes")
    step = _rows(prof_all, "rnn/Gemm_1")[0]
    row = _rows(prof, "rnn/Gemm_1 x5")[0]
    assert len(_rows(prof_all, "rnn/Gemm_")) == 5 and not [r for r in _rows(prof_all, "rnn/Gemm") if " x" in r[0]]
    assert row[1:4] == step[1:4]  # op, device, mode
    # modeled latency and energy: '133 ns' and '13.4 nJ' a step -> 665 ns and 67 nJ
    lat, en = (float(v.split()[0]) for v in step[5:7])
    assert float(row[5].split()[0]) == pytest.approx(5 * lat, rel=0.01)
    assert float(row[6].split()[0]) == pytest.approx(5 * en, rel=0.01)
    assert _rows(prof, "total memristor")[0][2:] == _rows(prof_all, "total memristor")[0][2:]

    # report: the step rows the cost model charges alike fold; the totals line is the same
    rep = cli("report", out, "-o", str(tmp_path / "rep"))
    # a row per node (what --all-nodes prints of the cinm ops), without drawing the pictures again
    opt = onnx.load(out)
    rep_all = report.table(*report.layers(opt, report.options_from_plans(opt)), cinm_only=True,
                           fold=False)
    every_gemm = [r for r in _rows(rep_all, "") if len(r) > 2 and r[1].startswith("rnn/Gemm")]
    assert len(every_gemm) == 6
    shown = [r for r in _rows(rep, "") if len(r) > 2 and r[1].startswith("rnn/Gemm")]
    assert sum(int(r[1].split(" x")[1]) if " x" in r[1] else 1 for r in shown) == 6
    assert len(shown) < 6
    flops = {r[1]: int(r[4]) for r in every_gemm}  # 2 x 4 x 4 a step, 2 x 5 x 3 x 4 the projection
    assert flops["rnn/Gemm"] == 120 and all(flops[s] == 32 for s in steps)
    assert sum(int(r[4]) for r in shown) == 120 + 5 * 32
    # the folded row's index cell lists its nodes' indices, host ops stand between them: not a range
    folded_row = next(r for r in shown if " x" in r[1])
    idx = [int(r[0]) for r in every_gemm if r[1] in steps or r[1] == "rnn/Gemm_1"]
    idx = idx[-int(folded_row[1].split(" x")[1]):]
    assert any(b - a > 1 for a, b in zip(idx, idx[1:]))
    assert folded_row[0] == (",".join(map(str, idx)) if len(idx) <= 3
                             else f"{idx[0]},{idx[1]},...,{idx[-1]}")
    assert _rows(rep, "total:") == _rows(rep_all, "total:")


def test_a_device_whose_summary_predates_fold_still_prints_its_table(tmp_path, capsys,
                                                                     monkeypatch):
    # a plugin written before Device.summary took fold= (a new chip is a new package: its
    # summary(plans, counted) must keep working); it is called without fold and lists every plan
    from onnx_cinm.cli import main
    from onnx_cinm.devices import get_device

    model = _model("RNN", 5, 1, 3, 4, seed=0)
    model.graph.node[0].name = "rnn"
    onnx.save(model, tmp_path / "rnn.onnx")
    dev = get_device("memristor")
    seen = []

    def summary(plans, counted=None):  # no fold=: a TypeError if it were passed
        seen.append(len(plans))
        return "old plugin table"

    monkeypatch.setattr(dev, "summary", summary)
    assert main(["optimize", str(tmp_path / "rnn.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "--place", "rnn/*=memristor", "--check", "0"]) == 0
    assert "old plugin table" in capsys.readouterr().out
    assert seen == [6]  # the projection and the 5 steps, none folded away


def test_optimizing_an_unrolled_model_at_another_length_says_so_in_one_line(tmp_path, capsys):
    """An optimized model unrolled for T=4, optimized again on arrays (or a --dim) of T=6,
    failed inside onnxruntime ("Split ... Invalid value in 'split'"): now the message run gives,
    pointing to the original model, before any pass."""
    from onnx_cinm.cli import main

    res = optimize(_model("GRU", 4, 2, 3, 5, seq_dim="T", lbr=1), dims={"T": 4})
    artifacts.save(res.model, tmp_path / "gru.onnx")
    np.save(tmp_path / "x6.npy", np.zeros((6, 2, 3), np.float32))
    for extra, given in ((["--input", f"X={tmp_path / 'x6.npy'}"], "input 'X'"),
                         (["--dim", "T=6"], "--dim")):
        code = main(["optimize", str(tmp_path / "gru.onnx"), "-o", str(tmp_path / "again.onnx"),
                     "-q", *extra])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1, err
        assert (f"model '{tmp_path / 'gru.onnx'}' was unrolled for T=4 ({given} has T=6); "
                "re-optimize the original model with --dim T=6, or without sizing T") in err
        assert "Split" not in err and not (tmp_path / "again.onnx").exists()
    # at its own length it still optimizes again
    np.save(tmp_path / "x4.npy", np.random.default_rng(1).standard_normal((4, 2, 3))
            .astype(np.float32))
    assert main(["optimize", str(tmp_path / "gru.onnx"), "-o", str(tmp_path / "again.onnx"),
                 "-q", "--input", f"X={tmp_path / 'x4.npy'}"]) == 0


def test_dim_and_input_that_disagree_on_an_unrolled_length_are_one_line(tmp_path, capsys):
    """A fresh user, s27: --dim T=5 with an --input X of T=6 unrolled the GRU for 5 steps and
    then the check fed the 6-step array: onnxruntime's raw 'Split' error. Now one line naming
    both values, exit 1, nothing written. An --input alone sizing T says it fixed the length
    (a note, as with --dim), and the model written runs at that length only."""
    from onnx_cinm.cli import main

    src = tmp_path / "gru.onnx"
    onnx.save(_model("GRU", 5, 2, 3, 4, seq_dim="T", lbr=1), src)
    rng = np.random.default_rng(0)
    for t in (5, 6):
        np.save(tmp_path / f"x{t}.npy", rng.standard_normal((t, 2, 3)).astype(np.float32))
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--dim", "T=5",
                 "--input", f"X={tmp_path / 'x6.npy'}"]) == 1
    got = capsys.readouterr()
    assert got.err == ("onnx-cinm: error: --dim T=5 and --input 'X' (T=6) disagree: the recurrence "
                       "was unrolled for T=5, so the array cannot run in the optimized model; drop "
                       "the --dim or give an array with T=5\n")
    assert not out.exists() and not (tmp_path / "o.cinm").exists()
    assert main(["optimize", str(src), "-o", str(out), "--input", f"X={tmp_path / 'x5.npy'}"]) == 0
    err = capsys.readouterr().err
    assert err == ("onnx-cinm: note: the recurrences were unrolled for T=5 (sized by --input 'X'): "
                   "the model runs only at that length (optimize without sizing T for a Scan that "
                   "runs at any)\n")
    x = np.load(tmp_path / "x5.npy")
    got = InferenceSession(str(out)).run(None, {"X": x})
    for g, r in zip(got, run_onnxruntime(onnx.load(src), {"X": x})):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    # --check 0 feeds no array: the disagreement is a warning, and the model is written
    # unrolled for T=5 (a reviewer, s27: it was refused as if the array were run)
    assert main(["optimize", str(src), "-o", str(out), "--dim", "T=5", "--check", "0",
                 "--input", f"X={tmp_path / 'x6.npy'}"]) == 0
    assert ("--dim T=5 and --input 'X' (T=6) differ: planned at T=5, the array not run "
            "(--check 0)") in capsys.readouterr().err
    got = InferenceSession(str(out)).run(None, {"X": x})
    for g, r in zip(got, run_onnxruntime(onnx.load(src), {"X": x})):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_the_crossbar_table_of_folded_rows_keeps_the_presets_note():
    """An unrolled LSTM's kernels fold into 'xN' rows; the note that pcm-hermes publishes its
    ADCs' and periphery's energy only inside the array's figures must still follow the table
    whole (the fold note once shadowed it: the summary printed the note's letters joined by
    'and', or lost the line)."""
    res = optimize(_model("LSTM", 4, 1, 128, 128), check=0, host_roofline="nominal",
                   placement="heuristic")
    text = res.device_tables()
    assert " x3 " in text and "kernels in 3 rows" in text
    assert ("(pcm-hermes publishes adc_dac and periphery energy and area only inside the "
            "array's figures") in text
    assert "publishes (" not in text
