"""Crossbar wear and lifetime (paradigms.cim.wear, Device.wear, optimize/report/run lines).

Expected figures are hand-computed from the plans' tile counts (checked against the tile
counts test_tile_sharing.py derives by hand) and the presets' endurance (presets.py:
pcm-occ 3.2e7 writes per cell, rram-neurram 1e6)."""
from __future__ import annotations

import json
import math

import pytest

from onnx_cinm import optimize, pipeline, report
from onnx_cinm.paradigms.cim import wear as cim_wear

from test_tile_sharing import OCC, _shared_gemms


def test_wear_figures_by_hand():
    # 10 tile writes per inference over 2 crossbars: 5 writes per cell per inference; a cell
    # enduring 1e6 writes lasts 2e5 inferences, 2e5 * 1 ms = 200 s back to back
    w = cim_wear.wear(10, 2, 1e6, 1e-3)
    assert w.per_cell == 5.0 and w.inferences == 2e5 and w.seconds == pytest.approx(200.0)
    assert w.short
    none = cim_wear.wear(0, 0, 1e6, 1e-3)
    assert none.per_cell == 0 and math.isinf(none.inferences) and not none.short
    assert none.figures()["lifetime_s"] is None
    # reviewer s28: 1 tile write per inference over 3 streamed crossbars rewrites one of them
    # every inference (a kernel streaming alone keeps its serpentine order): 1 per cell, not 1/3;
    # trial T F5: for the same reason 10 writes round-robin over 4 crossbars write crossbars
    # 0, 1, 2, 3, 0, 1, 2, 3, 0, 1 in every inference: crossbars 0 and 1 take 3, not 10 / 4
    assert cim_wear.writes_per_cell(1, 3) == 1.0 and cim_wear.writes_per_cell(10, 4) == 3.0
    assert cim_wear.writes_per_cell(8, 4) == 2.0 and cim_wear.writes_per_cell(256, 52) == 5.0
    assert cim_wear.writes_per_cell(0, 3) == 0.0 and cim_wear.writes_per_cell(3, 4, 10.0) == 10.0
    assert cim_wear.wear(1, 3, 3.2e7, 1e-3).inferences == 3.2e7


def test_objective_and_budget_leave_the_heuristic_placement_alone(tmp_path):
    """Reviewer s28: --objective latency changed what --placement heuristic wrote (LeNet on
    pcm-occ: 18 tile writes per inference, not 15), though the help gives the objective and the
    budget to cost placement only (and optimize warns so)."""
    from onnx_cinm.examples import get_example

    base = dict(placement="heuristic", check=0, device_options={"cim_preset": "pcm-occ"})
    plain = optimize(get_example("lenet"), **base).model.SerializeToString()
    for extra in (dict(objective="latency"), dict(objective="edp"),
                  dict(constraints={"max_writes_per_cell": 1.0})):
        assert optimize(get_example("lenet"), **base, **extra).model.SerializeToString() == plain


def test_note_threshold_is_one_year():
    # 1 write per cell per inference, endurance 1e6: 1e6 inferences; at 31.5576 s each that is
    # 3.15576e7 s, exactly a year (365.25 days): not short; a hair faster is short
    year = 365.25 * 86400
    assert cim_wear.SHORT_LIFETIME_S == year
    assert not cim_wear.wear(4, 4, 1e6, year / 1e6).short
    assert cim_wear.wear(4, 4, 1e6, year / 1e6 * 0.999).short
    with pytest.raises(ValueError):
        cim_wear.wear(1, 1, 0.0, 1.0)


def test_duration_units():
    assert cim_wear.duration(90) == "1.5 min"
    assert cim_wear.duration(2 * 365.25 * 86400) == "2 years"
    assert cim_wear.duration(0.5) == "0.5 s"


def _streaming():
    # as test_tile_sharing: on pcm-occ's 4 crossbars of 64x64, W2's 3 tiles are pinned and W's
    # 6 tiles stream through the 1 crossbar left; its two Gemms write 5 tiles each: 10 tile
    # writes per inference, all on that one crossbar
    model = _shared_gemms(4, 128, 192, 2, other=(192, 64))
    return optimize(model, place=[("gemm*", "memristor"), ("mm*", "memristor")],
                    device_options=OCC)


def test_streaming_plan_wear_and_summary_line():
    res = _streaming()
    w = pipeline.device_wear(res.model, 1e-3)["memristor"]
    f = w.figures
    # 10 writes per cell per inference; 3.2e7 / 10 = 3.2e6 inferences; at 1 ms: 3200 s
    assert (f["tile_writes_per_inference"], f["streamed_crossbars"]) == (10, 1)
    assert f["writes_per_cell_per_inference"] == 10.0 and f["endurance_writes"] == 3.2e7
    assert f["lifetime_inferences"] == pytest.approx(3.2e6)
    assert f["lifetime_s"] == pytest.approx(3200.0) and f["short"]
    # 6 + 3 tiles streamed and kept; the note names cost placement's budget
    assert "--max-writes-per-cell 0 writes the cells only at load" in w.note
    assert ("--max-writes-per-cell 3.2e+07 --lifetime-inferences N holds these most-written "
            "cells to their endurance over N inferences") in w.note
    # the summary's line sits under the crossbar table, at the model's modeled latency
    tables = res.device_tables()
    period = res.stats["placement"]["model_totals"]["latency_s"]
    line = next(x for x in tables.splitlines() if x.startswith("wear (pcm-occ"))
    assert "10 writes per cell per inference" in line and "3.2e+06 inferences" in line
    assert cim_wear.duration(3.2e6 * period) in line
    assert tables.splitlines()[-1].startswith("note: the crossbars wear out")


def test_rram_endurance_shortens_the_lifetime():
    model = _shared_gemms(4, 128, 192, 2, other=(192, 64))
    res = optimize(model, place=[("gemm*", "memristor"), ("mm*", "memristor")],
                   device_options={"cim_preset": "rram-neurram", "cim_rows": 64, "cim_cols": 64,
                                   "cim_crossbars": 4})
    f = pipeline.device_wear(res.model, 1.0)["memristor"].figures
    # same tiling as on pcm-occ (64x64, 4 crossbars): 10 writes per cell, endurance 1e6
    assert f["writes_per_cell_per_inference"] == 10.0
    assert f["lifetime_inferences"] == pytest.approx(1e5) and f["lifetime_s"] == pytest.approx(1e5)


def test_resident_plan_says_load_only(tmp_path):
    # W 128x128 on 64x64 crossbars: 4 tiles on 4 crossbars, written once at load
    res = optimize(_shared_gemms(8, 128, 128, 3), place=[("gemm*", "memristor")],
                   device_options=OCC)
    w = pipeline.device_wear(res.model)["memristor"]
    assert w.figures["writes_per_cell_per_inference"] == 0
    assert w.figures["lifetime_inferences"] is None and not w.figures["short"]
    assert "written only at load (4 tile writes)" in w.line and w.note == ""
    files = report.write_report(res.model, tmp_path / "rep")["files"]
    data = json.loads((tmp_path / "rep" / "wear.json").read_text())
    assert data["memristor"]["tile_writes_per_inference"] == 0
    assert any(p.name == "wear.json" for p in files)


def test_report_wear_json_of_a_streaming_plan(tmp_path):
    res = _streaming()
    out = report.write_report(res.model, tmp_path / "rep")
    data = json.loads((tmp_path / "rep" / "wear.json").read_text())["memristor"]
    # back to back at the report's modeled latency per inference
    assert data["seconds_per_inference"] == out["totals"]["latency_s"]
    assert data["lifetime_s"] == pytest.approx(3.2e6 * out["totals"]["latency_s"])
    assert "written only at load" not in (tmp_path / "rep" / "report.html").read_text()
    assert "10 writes per cell per inference" in (tmp_path / "rep" / "report.html").read_text()


def test_no_crossbar_no_wear():
    res = optimize(_shared_gemms(8, 128, 128, 1), place=[("*", "host")], device_options=OCC)
    assert pipeline.device_wear(res.model) == {}


def test_the_notes_advice_keeps_the_cells_written_at_load_only():
    # what the note proposes, on the model of _streaming without hints: a budget of 0 writes
    # per cell writes the cells at load only
    model = _shared_gemms(4, 128, 192, 2, other=(192, 64))
    res = optimize(model, device_options=OCC, constraints={"max_writes_per_cell": 0.0})
    w = pipeline.device_wear(res.model)
    assert all(x.figures["writes_per_cell_per_inference"] == 0 for x in w.values())


@pytest.mark.parametrize("lifetime", [1e5, 1e7, 1e9])
def test_the_endurance_budget_bounds_the_cells_the_wear_line_reports(lifetime):
    """Reviewer s28: with --max-writes-per-cell 3.2e7 --lifetime-inferences 1e7 on pcm-occ
    placement accepted a plan whose wear line said 'worn out after 5.33e+06 inferences': the
    budget divided the writes by all 4 crossbars, the wear line by the 2 streamed ones. The
    budget now counts the most-written cells too: whatever placement keeps on the crossbars
    lasts the inferences budgeted (3.2e7 writes per cell over `lifetime` inferences)."""
    model = _shared_gemms(4, 128, 192, 2, other=(192, 64))
    res = optimize(model, device_options=OCC, check=0,
                   constraints={"max_writes_per_cell": 3.2e7, "lifetime_inferences": lifetime})
    assert not res.stats["placement"]["violations"]
    for w in pipeline.device_wear(res.model).values():
        f = w.figures
        assert f["lifetime_inferences"] is None or f["lifetime_inferences"] >= lifetime * (1 - 1e-9)
        assert lifetime * f["writes_per_cell_per_inference"] <= 3.2e7 * (1 + 1e-9)


def test_run_profile_wear_line_at_other_sizes_and_under_q(tmp_path, capsys):
    """Reviewer s28: `run --profile --dim batch=64` printed the plans' wear (at batch 1) as if it
    were the run's, and `-q` still printed the note. LeNet on pcm-occ streams 12 tile writes
    per inference over 2 crossbars (the wear line says so; hand: 3.2e7 / 6 = 5.33e6)."""
    from onnx_cinm.cli import main
    from onnx_cinm.examples import get_example
    import onnx

    onnx.save(get_example("lenet"), tmp_path / "lenet.onnx")
    out = str(tmp_path / "o.onnx")
    assert main(["optimize", str(tmp_path / "lenet.onnx"), "-o", out, "--cim-preset", "pcm-occ",
                 "--check", "0"]) == 0
    summary = capsys.readouterr().out
    assert main(["run", out, "--profile"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # trial s30: the whole model's modeled figures (host and transfers included), as the
    # summary printed them for the model written
    clause = summary.split("cost placement (energy): ")[1].split(" for the model written")
    model_line = next(x for x in lines if x.startswith("model (the plans' figures"))
    assert model_line.endswith(": " + clause[0] + clause[1].split(";")[0])
    i = next(k for k, x in enumerate(lines) if x.startswith("wear (pcm-occ"))
    assert "6 writes per cell per inference; worn out after 5.33e+06 inferences" in lines[i]
    assert "as planned" not in lines[i] and lines[i + 1].startswith("note: the crossbars wear out")
    # trial s29: run timed the lifetime at the crossbar kernels' own latency (11.9 ms where
    # optimize and report said 44.3 ms); now all three take the model's modeled latency
    from onnx_cinm import report
    m = onnx.load(out)
    assert lines[i] == report.layers(m, report.options_from_plans(m))[1]["wear"]["memristor"].line
    assert lines[i].endswith("per inference (the model's modeled latency)")
    assert main(["run", out, "--profile", "--dim", "batch=64", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("wear (pcm-occ"))
    assert lines[i].endswith(" (the plans' figures, at batch=1 as planned, not this run's batch=64)")
    model_line = next(x for x in lines if x.startswith("model (the plans' figures"))
    assert "; at batch=1 as planned, not this run's batch=64): modeled " in model_line
    # a model never optimized has no plans: no such line (reviewer s30)
    assert main(["run", str(tmp_path / "lenet.onnx"), "--profile"]) == 0
    assert "model (the plans' figures" not in capsys.readouterr().out
    assert not any(x.startswith("note: the crossbars") for x in lines)


def test_lifetime_without_a_budget_is_a_warning(tmp_path, capsys):
    """Trial s28b: --lifetime-inferences 1e8 alone was accepted and changed nothing, silently."""
    from onnx_cinm.cli import main

    out = str(tmp_path / "o.onnx")
    assert main(["optimize", "--example", "lenet", "-o", out, "--check", "0",
                 "--lifetime-inferences", "1e8"]) == 0
    assert ("warning: --lifetime-inferences is the span of the --max-writes-per-cell budget; "
            "without that budget it changes nothing") in capsys.readouterr().err
    assert main(["optimize", "--example", "lenet", "-o", out, "--check", "0",
                 "--lifetime-inferences", "1e8", "--max-writes-per-cell", "3.2e7"]) == 0
    out_text, err = capsys.readouterr()
    assert "--lifetime-inferences is the span" not in err
    # the summary says the budget bound the placement (trial s28b: all ops went to the host
    # and nothing said why)
    assert "; within the endurance budget of 3.2e+07 writes per cell over 1e+08 inference(s)" \
        in out_text


def test_streaming_kernels_continue_one_round_robin_over_the_pool(tmp_path):
    # two products of activations (an attention's, batch 3: 3 groups of one 64 x 64 tile each)
    # stream through the shared pool of pcm-hermes's 64 crossbars. Each kernel's tiles used to
    # start at the pool's first crossbar, so crossbars 0-2 took 2 writes per inference while
    # the wear line said 1 (trial s36); now the second continues where the first stopped:
    # crossbars 0-2 and 3-5, 1 write per cell per inference, 6 crossbars in use (hand counts)
    import re

    import onnx
    from onnx import TensorProto, helper

    from onnx_cinm import artifacts

    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "y"], ["t"], name="first"),
         helper.make_node("MatMul", ["t", "z"], ["u"], name="second")], "attn",
        [helper.make_tensor_value_info(n, f, [3, 64, 64]) for n in "xyz"],
        [helper.make_tensor_value_info("u", f, [3, 64, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, place=[("MatMul", "memristor")], check=1)
    artifacts.save(res.model, tmp_path / "o.onnx")
    xbars = {}
    for node in res.model.graph.node:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        if a.get(b"device", a.get("device")) in (b"memristor", "memristor"):
            text = (tmp_path / "o.cinm" / a["kernel"].decode()).read_text()
            xbars[node.name.split("/")[0]] = sorted(
                {int(m) for m in re.findall(r"^PROGRAM (\d+) ", text, re.M)})
            assert a["cim_shared"] == 1 and a["cim_crossbars"] == 64
    assert xbars == {"first": [0, 1, 2], "second": [3, 4, 5]}
    w = pipeline.device_wear(res.model, 1e-3)["memristor"]
    assert w.figures["writes_per_cell_per_inference"] == 1.0
    tables = res.device_tables()
    assert "6 tile writes/inference land on 6 of the 64 streamed crossbars" in tables
    assert "(crossbars: 6 in use of the chip's 64, 0 kept by resident kernels, 6 of a pool " \
           "of 64 streamed through by 2 kernels" in tables
