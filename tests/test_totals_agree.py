"""optimize, sweep and report print the same per-inference totals for the same model.

The finding: LeNet's optimize and sweep said 172 us, 864 uJ while its report said 167 us,
713 uJ. The search priced the graph before ``fold_layouts`` folded the two conv outputs'
Transposes into their crossbar Gemms, so its totals still paid for two host Transposes that
the written model does not run. Their price by hand on the nominal host roofline (10 GB/s,
30 W): each reads and writes its tensor, [6, 28, 28] and [16, 10, 10] float32:
2 x (4704 + 1600) x 4 B = 50,432 B, 5.0432 us, 151.296 uJ. Since ``restore_host_ops`` puts
conv1 back as the host Conv (cheaper than its Im2Col feeding a crossbar), only conv2's
Transpose is folded: 2 x 1600 x 4 B = 12,800 B, 1.28 us, 38.4 uJ.
"""
from __future__ import annotations

import csv
import re

import pytest

from onnx_cinm import optimize
from onnx_cinm.cli import main
from onnx_cinm.examples import get_example

TRANSPOSES_S = 2 * (16 * 10 * 10) * 4 / 10e9  # conv2's output [16, 10, 10], read and written


def _totals(text: str, prefix: str) -> tuple[str, str]:
    m = re.search(prefix + r"(\S+ \w?s), (\S+ \w?J)", text)
    assert m, text
    return m.group(1), m.group(2)


def test_optimize_sweep_and_report_print_the_same_totals(tmp_path, capsys):
    out = tmp_path / "lenet_opt.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(out), "--check", "0"]) == 0
    opt = _totals(capsys.readouterr().out, r"cost placement \(energy\): modeled ")
    assert main(["report", str(out), "-o", str(tmp_path / "rep")]) == 0
    rep = _totals(capsys.readouterr().out, r"\ntotal: ")
    assert main(["sweep", "--example", "lenet", "--set", "placement.objective=energy",
                 "-o", str(tmp_path / "sw"), "--executor", "serial"]) == 0
    sw = next(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    rows = list(csv.DictReader(open(tmp_path / "rep" / "layers.csv")))
    energy = sum(float(r["energy_j"]) + float(r["transfer_j"]) for r in rows)
    latency = sum(float(r["latency_s"]) + float(r["transfer_s"]) for r in rows)
    assert opt == rep
    assert float(sw["energy_j"]) == pytest.approx(energy, rel=1e-9)
    assert float(sw["latency_s"]) == pytest.approx(latency, rel=1e-9)
    assert not any(r["op"] == "Transpose" for r in rows)  # folded into the Gemms


def test_search_totals_differ_by_the_folded_transposes():
    res = optimize(get_example("lenet"), check=0)
    assert res.stats["restore_host_ops"]["restored"] == {"Conv": 1}
    st = res.stats["placement"]
    assert st["totals"].latency_s - st["model_totals"]["latency_s"] == pytest.approx(TRANSPOSES_S)
    assert st["totals"].energy_j - st["model_totals"]["energy_j"] == pytest.approx(TRANSPOSES_S * 30)


def test_sweep_of_a_branch_whose_transpose_folds_prices_what_optimize_writes():
    """A crossbar Conv inside an If branch: fold_layouts folds the Transpose after its Gemm.
    The sweep's row must equal optimize's totals of the written model (the branch's rewritten
    nodes; copying them back one by one left a stale duplicate node counted twice)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnx_cinm import sweep

    c = 32
    w = np.random.default_rng(0).standard_normal((c, c, 3, 3)).astype(np.float32)
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, 32, 32])  # noqa: E731
    then_g = helper.make_graph([helper.make_node("Conv", ["X", "W"], ["t"], name="ct", pads=[1, 1, 1, 1]),
                                helper.make_node("Relu", ["t"], ["to"], name="tr")], "then", [], [vi("to")])
    else_g = helper.make_graph([helper.make_node("Relu", ["X"], ["e"], name="er")], "else", [], [vi("e")])
    nodes = [helper.make_node("ReduceSum", ["X"], ["s"], name="rs", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["Y"], name="if", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "m", [vi("X")], [vi("Y")],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(-1e9, np.float32), "zero")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, check=0)
    assert res.stats["fold_layouts"]["folded"] >= 1
    want = res.stats["placement"]["model_totals"]
    cm, origins, _ = sweep._cinm_level(model, None, None)
    row = sweep.evaluate(cm, {}, origins)
    assert row["latency_s"] == pytest.approx(want["latency_s"], rel=1e-12)
    assert row["energy_j"] == pytest.approx(want["energy_j"], rel=1e-12)


def test_verbose_placement_line_and_summary_say_which_graph_they_price(tmp_path, capsys):
    """A fresh user, s27: optimize -v's 'placement:' line (the search's figures) and the
    summary's 'cost placement' line showed LeNet at different figures with nothing telling
    them apart. The -v line prices the graph as placed (conv1 lowered, conv2's Transpose
    still there), the summary the model written; the baselines are the search's too."""
    res = optimize(get_example("lenet"), check=0)
    st = res.stats["placement"]
    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"), "--check", "0",
                 "-v"]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("placement: cost[energy]"))
    assert "modeled for the graph as placed, before the passes after placement rewrite it" in line
    assert "(the summary's 'cost placement' line prices the model written)" in line
    assert st["model_totals"]["latency_s"] < st["totals"].latency_s  # the search saw more
    written = _totals(out, r"cost placement \(energy\): modeled ")
    assert f"{written[0]}, {written[1]}, 0 tile writes/inference for the model written" in out
    assert "baselines, priced on the graph as placement saw it" in out



@pytest.mark.parametrize("example", ["lenet", "mlp"])
def test_flops_of_the_written_model_read_afresh(example):
    """optimize counts the written model's FLOPs with the passes' last tensor infos (those
    fold_layouts kept for LeNet after dropping conv2's Transpose); the written model, parsed
    back from its bytes and counted with infos read from it alone, gives the same figures.
    (Its totals: the report reads them afresh, test_optimize_sweep_and_report_...)"""
    import onnx

    from onnx_cinm.pipeline import _flops

    res = optimize(get_example(example), check=0)
    fresh = onnx.ModelProto.FromString(res.model.SerializeToString())
    total, on_dev, by_dev, _, host = _flops(fresh)[:5]
    assert total > 0 and on_dev > 0
    assert (res.flops_total, res.flops_on_devices, res.host_flops) == (total, on_dev, host)
