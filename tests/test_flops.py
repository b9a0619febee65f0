"""FLOPs accounting (onnx_cinm.analysis): recurrent, quantized and Einsum ops, and control-flow
bodies, each against a count done by hand from the test model's shapes; and the summary's
per-op-type share of what stays on the host."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import optimize
from onnx_cinm.analysis import body_flops, node_flops, tensor_infos

rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)


def _lstm_model(op="LSTM", gates=4, seq=7, batch=3, n_in=10, hidden=5, dirs=1):
    w = nh.from_array(rng.standard_normal((dirs, gates * hidden, n_in)).astype(np.float32), "W")
    r = nh.from_array(rng.standard_normal((dirs, gates * hidden, hidden)).astype(np.float32), "R")
    direction = "bidirectional" if dirs == 2 else "forward"
    node = h.make_node(op, ["x", "W", "R"], ["y"], hidden_size=hidden, direction=direction, name="rnn")
    return _model([node], [h.make_tensor_value_info("x", TP.FLOAT, ["seq", "batch", n_in])],
                  [h.make_tensor_value_info("y", TP.FLOAT, None)], [w, r])


def test_recurrent_ops_count_their_matrix_products_every_step():
    # the ops kept whole (to_cinm skipped: at a planned length it lowers them into Gemms)
    # LSTM: 7 steps x 3 rows; per step 2*(4*5)*(10+5) MACs-as-FLOPs + (3*4+5)*5 gate math
    res = optimize(_lstm_model(), dims={"seq": 7, "batch": 3}, check=0, skip=["to_cinm"])
    assert res.flops_total == 7 * 3 * (2 * 20 * 15 + 17 * 5) == 14_385
    assert res.host_flops["LSTM"] == res.flops_total
    # GRU, bidirectional: two directions, 3 gates
    res = optimize(_lstm_model("GRU", 3, dirs=2), dims={"seq": 7, "batch": 3}, check=0,
                   skip=["to_cinm"])
    assert res.flops_total == 2 * 7 * 3 * (2 * 15 * 15 + 14 * 5) == 21_840
    res = optimize(_lstm_model("RNN", 1), dims={"seq": 4, "batch": 1}, check=0, skip=["to_cinm"])
    assert res.flops_total == 4 * (2 * 5 * 15 + 8 * 5) == 760
    # lowered: the same matrix products as cinm Gemms, 7*3*2*20*15 = 12600 FLOPs on devices
    res = optimize(_lstm_model(), dims={"seq": 7, "batch": 3}, check=0, placement="heuristic")
    assert res.flops_on_devices == 12_600 and "LSTM" not in res.host_flops


def test_einsum_counts_its_index_space():
    m = _model([h.make_node("Einsum", ["a", "b"], ["c"], equation="bij,bjk->bik")],
               [h.make_tensor_value_info("a", TP.FLOAT, [2, 3, 4]),
                h.make_tensor_value_info("b", TP.FLOAT, [2, 4, 5])],
               [h.make_tensor_value_info("c", TP.FLOAT, [2, 3, 5])])
    infos = tensor_infos(m)
    assert node_flops(m.graph.node[0], infos) == 2 * (2 * 3 * 4 * 5)  # a batched matmul
    m.graph.node[0].attribute[0].s = b"bij,bjk"  # implicit output "ik": b and j are summed
    assert node_flops(m.graph.node[0], infos) == 2 * (2 * 3 * 4 * 5)
    t = _model([h.make_node("Einsum", ["a"], ["c"], equation="bij->bji")],
               [h.make_tensor_value_info("a", TP.FLOAT, [2, 3, 4])],
               [h.make_tensor_value_info("c", TP.FLOAT, [2, 4, 3])])
    assert node_flops(t.graph.node[0], tensor_infos(t)) == 0  # a transpose moves data only


def test_quantized_matmul_and_conv_count_like_their_float_forms():
    a = h.make_tensor_value_info("a", TP.UINT8, [6, 8])
    inits = [nh.from_array(np.array(0.1, np.float32), "s"), nh.from_array(np.array(3, np.uint8), "z"),
             nh.from_array(rng.integers(0, 255, (8, 4)).astype(np.uint8), "B")]
    m = _model([h.make_node("QLinearMatMul", ["a", "s", "z", "B", "s", "z", "s", "z"], ["y"])], [a],
               [h.make_tensor_value_info("y", TP.UINT8, [6, 4])], inits)
    assert node_flops(m.graph.node[0], tensor_infos(m)) == 2 * 8 * 6 * 4
    x = h.make_tensor_value_info("x", TP.UINT8, [1, 2, 5, 5])
    w = nh.from_array(rng.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8), "W")
    m = _model([h.make_node("QLinearConv", ["x", "s", "z", "W", "s", "z", "s", "z"], ["y"])], [x],
               [h.make_tensor_value_info("y", TP.UINT8, [1, 3, 3, 3])], inits[:2] + [w])
    assert node_flops(m.graph.node[0], tensor_infos(m)) == 2 * (2 * 3 * 3) * (3 * 3 * 3)


def _loop_model(trip: int | None):
    """y = x @ W applied ``trip`` times in a Loop (a constant trip count, or a graph input)."""
    wt = nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("MatMul", ["v_in", "W"], ["v_out"])], "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("v_in", TP.FLOAT, [4, 8])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("v_out", TP.FLOAT, [4, 8])])
    inputs = [h.make_tensor_value_info("x", TP.FLOAT, [4, 8])]
    inits = [wt]
    if trip is None:
        inputs.append(h.make_tensor_value_info("M", TP.INT64, []))
    else:
        inits.append(nh.from_array(np.array(trip, np.int64), "M"))
    loop = h.make_node("Loop", ["M", ""], ["y"], body=body)
    return _model([loop], inputs, [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])], inits)


def test_loop_bodies_count_times_a_constant_trip_count():
    res = optimize(_loop_model(5), check=0)
    assert res.flops_total == 5 * (2 * 8 * 4 * 8) and res.flops_exact
    assert res.host_flops["Loop"] == res.flops_total
    assert "estimate" not in res.summary()
    dyn = optimize(_loop_model(None), check=0)
    assert dyn.flops_total == 2 * 8 * 4 * 8 and not dyn.flops_exact  # the body once
    assert "FLOPs on devices: none of 512 FLOP (estimate: control flow known only at run time)" in dyn.summary()


def test_if_counts_its_larger_branch():
    then = h.make_graph([h.make_node("MatMul", ["x", "W"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", TP.FLOAT, [4, 8])])
    other = h.make_graph([h.make_node("Relu", ["x"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", TP.FLOAT, [4, 8])])
    m = _model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
               [h.make_tensor_value_info("c", TP.BOOL, []), h.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
               [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])],
               [nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")])
    infos = tensor_infos(m)
    assert body_flops(m.graph.node[0], infos, {}) == (2 * 8 * 4 * 8, False)


def test_the_summary_names_the_host_op_types_with_their_share():
    lstm = _lstm_model()
    # a Softmax not over the last axis stays on the host (over the last one it goes to UPMEM)
    lstm.graph.node.append(h.make_node("Softmax", ["y"], ["p"], axis=2))
    lstm.graph.output[0].CopyFrom(h.make_tensor_value_info("p", TP.FLOAT, None))
    res = optimize(lstm, dims={"seq": 7, "batch": 3}, check=0, placement="heuristic",
                   skip=["to_cinm"])  # the LSTM kept whole
    sm = 5 * 7 * 3 * 5  # Softmax: 5 FLOPs per output element of y[7, 1, 3, 5]
    assert res.flops_total == 14_385 + sm
    line = next(li for li in res.summary().splitlines() if li.startswith("FLOPs on host"))
    assert line == f"FLOPs on host by op type: LSTM {100 * 14_385 / (14_385 + sm):.1f}%, " \
                   f"Softmax {100 * sm / (14_385 + sm):.1f}%"


def test_totals_false_leaves_the_summary_figures_out_and_writes_the_same_model():
    """optimize -q (totals=False) counts no FLOPs (figures only the summary prints); the model
    it returns is byte for byte the one a counted run returns."""
    model = _loop_model(5)  # random weights: one model for both runs
    counted = optimize(model, check=0)
    assert counted.flops_total == 5 * (2 * 8 * 4 * 8)  # hand count: 5 trips of a 4x8 @ 8x8
    quiet = optimize(model, check=0, totals=False)
    assert (quiet.flops_total, quiet.flops_on_devices, quiet.flops_exact) == (0, 0, False)
    assert not quiet.host_flops and not quiet.cinm_by_device and not quiet.placements
    assert quiet.anonymous_dims == {}
    assert quiet.model.SerializeToString() == counted.model.SerializeToString()
    # its summary says the figures were not counted rather than print zeros as figures
    text = quiet.summary()
    assert "cinm ops per device, FLOPs: not counted (optimize(totals=False))" in text
    assert "FLOP " not in text and "0 cinm ops" not in text and "per device: none" not in text
    assert "FLOPs on devices: " in counted.summary()


def test_flops_line_gives_the_devices_share_of_the_modeled_energy_and_time(tmp_path, capsys):
    # trial s36: 'FLOPs on devices: 97.6%' read as the work's share where the host spent
    # 99.5% of the modeled energy. LeNet: the share must agree with the cost placement line's
    # own split (memristor 1.38 uJ of 587 uJ: 0.24%; 13.6 us of 43.8 us: 31%)
    import re

    from onnx_cinm.cli import main

    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "l.onnx"), "--check", "0"]) == 0
    text = "\n".join(x.strip() for x in capsys.readouterr().out.splitlines())
    flops = next(x for x in text.splitlines() if x.startswith("FLOPs on devices"))
    e, t = map(float, re.search(r"modeled on devices: ([\d.]+)% of the energy, ([\d.]+)% of "
                                r"the time$", flops).groups())
    cost = next(x for x in text.splitlines() if x.startswith("cost placement"))
    units = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0}

    def value(s):
        num, unit = re.fullmatch(r"([\d.]+) ?([num]?)[sJ]", s).groups()
        return float(num) * units[unit]

    total_t, total_e = map(value, re.search(r"modeled ([\d.]+ ?\w?s), ([\d.]+ ?\w?J)", cost).groups())
    dev_t, dev_e = map(value, re.search(r"memristor ([\d.]+ ?\w?s) / ([\d.]+ ?\w?J)", cost).groups())
    # (the share is printed to 2 significant digits, the figures to 3: within 5%)
    assert e == pytest.approx(100 * dev_e / total_e, rel=0.05)
    assert t == pytest.approx(100 * dev_t / total_t, rel=0.05)
