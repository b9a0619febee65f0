"""Chip presets: the published numbers (recomputed here from the abstracts' figures, chips.md §1),
a source for every constant, and the CLI/docs listing what PRESETS holds."""
import csv
import html
import io
import re
from pathlib import Path

import onnx
import pytest

from onnx_cinm.devices.memristor import (DEFAULT, PCM_HERMES, PCM_OCC, PRESETS, RERAM_ISAAC,
                                         RRAM_NEURRAM)
from onnx_cinm.sim.crossbar.physics import DEVICE_MODELS
from onnx_cinm.text import si
from onnx_cinm.devices.memristor.presets import CrossbarParams

DOC = Path(__file__).resolve().parents[1] / "docs" / "crossbar-presets.md"


def test_hermes_numbers_from_the_abstracts():
    # Le Gallo et al. 2023: 64 cores of 256 x 256; 63.1 TOPS at 9.76 TOPS/W (one-phase, 8-bit);
    # one MVM = 2 * 256 * 256 ops -> 131072 / (63.1e12 / 64) s and 131072 / 9.76e12 J
    assert (PCM_HERMES.rows, PCM_HERMES.cols, PCM_HERMES.crossbars) == (256, 256, 64)
    assert PCM_HERMES.mvm_latency_s == pytest.approx(132.9e-9, rel=1e-3)
    assert PCM_HERMES.mvm_energy_j == pytest.approx(13.43e-9, rel=1e-3)
    assert PCM_HERMES.adc_latency_s == pytest.approx(76.8e-9)  # 256 LSB x 300 ps
    assert (PCM_HERMES.weight_bits, PCM_HERMES.dac_bits, PCM_HERMES.adc_bits) == (8, 8, 8)
    assert DEVICE_MODELS[PCM_HERMES.device_model].g_max_us == 10.35  # aihwkit Hermes, 1 device


def test_neurram_numbers():
    # 48 cores x 65,536 cells = 3.1 M cells (chips.md §1.6); 4-bit weights (Wan et al. 2022)
    assert RRAM_NEURRAM.rows * RRAM_NEURRAM.cols * RRAM_NEURRAM.crossbars == 3_145_728
    assert RRAM_NEURRAM.weight_bits == 4
    assert RRAM_NEURRAM.mvm_energy_j == pytest.approx(256 * 1.45e-12)  # Accelergy per column


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_constant_has_a_source(name):
    p = PRESETS[name]
    default = CrossbarParams()
    skip = {"name", "dtypes", "min_macs", "technology", "sources", "unverified"}
    changed = [f for f in p.__dataclass_fields__ if f not in skip
               and getattr(p, f) != getattr(default, f)]
    missing = [f for f in changed if not p.source(f)]
    assert not missing, missing
    assert set(p.unverified) <= {k for k, _ in p.sources}
    assert p.device_model in DEVICE_MODELS
    assert p.min_macs == p.rows * p.cols


def test_default_is_hermes_and_occ_is_unchanged():
    assert next(iter(PRESETS)) == "pcm-hermes" and DEFAULT is PCM_HERMES
    assert PRESETS["pcm-occ"] == PCM_OCC
    assert (PCM_OCC.rows, PCM_OCC.crossbars, PCM_OCC.write_latency_s) == (64, 4, 2.5e-6)


def test_cli_and_docs_list_the_presets():
    from onnx_cinm.cli import _parser
    from onnx_cinm.devices import get_device
    from onnx_cinm.sweep import keys

    opt = _parser()._subparsers._group_actions[0].choices["optimize"]
    action = next(a for a in opt._actions if "--cim-preset" in a.option_strings)
    # the flag is generated from the option; unset, the device's own preset (pcm-hermes) applies
    assert list(action.choices) == list(PRESETS) and action.default is None
    assert get_device("memristor").params is PCM_HERMES and "default pcm-hermes" in action.help
    assert keys()["crossbar.preset"]("rram-neurram") == {"cim_preset": "rram-neurram"}
    assert keys()["cim.preset"]("rram-neurram") == {"cim_preset": "rram-neurram"}
    text = DOC.read_text()
    for name in PRESETS:
        assert f"`{name}`" in text


def test_breakdown_by_hand_isaac():
    """4 x 300 @ 300 x 200 on reram-isaac (Kt = 3, Nt = 2: 6 tiles on 4 crossbars, serpentine:
    2 writes, 24 MVMs, 2 rounds of which 1 writes), each part from the preset's sources."""
    from onnx_cinm.paradigms.cim.schedule import plan

    p = plan(4, 300, 200, RERAM_ISAAC)
    assert (p.writes_per_inference, p.mvms, p.rounds, p.write_rounds) == (2, 24, 2, 1)
    c = p.cost(RERAM_ISAAC)
    parts = {q.term: q for q in c.parts}
    # array: 2 writes x 676,000/32 pJ (PUMA) + 24 MVMs x 128 x 128 x 0.1 pJ (NVSim cell read)
    assert parts["array"].energy_j == pytest.approx(2 * 21.125e-9 + 24 * 1.6384e-9)
    # ADC/DAC: 4 rows x 3 k-tiles x 200 columns conversions x 1.67 pJ + 4 x 300 x 2 drives x 0.42 pJ
    assert parts["adc_dac"].energy_j == pytest.approx(2400 * 1.67e-12 + 2400 * 0.42e-12)
    assert parts["periphery"].energy_j == 0.0  # ISAAC's ADCs carry it
    # latency: 1 write round x 351/32 us + 2 rounds x 4 rows x 100 ns; one ADC converts 128
    # columns x 1/1.2 GHz = 106.7 ns > 100 ns: the whole MVM time is conversion
    assert c.latency_s == pytest.approx(351e-6 / 32 + 8 * 100e-9)
    assert parts["adc_dac"].latency_s == pytest.approx(8 * 100e-9)
    assert parts["array"].latency_s == pytest.approx(351e-6 / 32)
    # area: the 4 crossbars it streams through, each 25 + 1221.25 + 30 um^2
    assert parts["array"].area_mm2 == pytest.approx(4 * 25e-6)
    assert parts["adc_dac"].area_mm2 == pytest.approx(4 * 1221.25e-6)
    assert parts["periphery"].area_mm2 == pytest.approx(4 * 30e-6)
    assert sum(q.energy_j for q in c.parts) == pytest.approx(c.energy_j, rel=1e-12)
    assert sum(q.latency_s for q in c.parts) == pytest.approx(c.latency_s, rel=1e-12)


def test_breakdown_by_hand_hermes_and_occ():
    from onnx_cinm.paradigms.cim.schedule import plan

    # HERMES: 10 x 256 @ 256 x 256, one tile, resident: 10 MVMs of 132.9 ns, 76.8 ns of each
    # converting (256 ADCs, one conversion each); energy and area only as wholes (array)
    c = plan(10, 256, 256, PCM_HERMES).cost(PCM_HERMES)
    parts = {q.term: q for q in c.parts}
    assert parts["adc_dac"].latency_s == pytest.approx(10 * 76.8e-9)
    assert parts["array"].latency_s == pytest.approx(10 * (131072 / (63.1e12 / 64) - 76.8e-9))
    assert parts["array"].energy_j == pytest.approx(10 * 131072 / 9.76e12) == c.energy_j
    assert parts["array"].area_mm2 == pytest.approx(0.62)
    assert PCM_HERMES.folded == ("adc_dac", "periphery")
    assert PCM_HERMES.chip_area_mm2 == pytest.approx(64 * 0.62)
    # OCC: 1 x 64 @ 64 x 64 resident: 1 MVM (1 us, 0.2 pJ) + 1000 busy cycles x 2.1 nJ periphery
    c = plan(1, 64, 64, PCM_OCC).cost(PCM_OCC)
    parts = {q.term: q for q in c.parts}
    assert parts["array"].energy_j == pytest.approx(0.2e-12)
    assert parts["periphery"].energy_j == pytest.approx(1000 * 2.1e-9)
    assert parts["adc_dac"].energy_j == 0.0 and c.latency_s == parts["array"].latency_s == 1e-6


def test_default_chip_programs_lenet_once_and_runs_its_products(tmp_path):
    """Under the default preset and cost placement, LeNet's matrix products fit (tiles by
    hand: conv2 150x16 -> 1, fc1 400x120 -> 2, fc2 120x10 -> 1) and run on the crossbars,
    programmed once at load (conv1 stays its Conv on the host, cheaper than an Im2Col feeding
    a crossbar: restore_host_ops); the plan's parts add up to its totals, and the report reads
    them back."""
    from onnx_cinm import artifacts, optimize, report
    from onnx_cinm.dialects import cinm
    from onnx_cinm.examples import get_example

    res = optimize(get_example("lenet"), host_roofline="nominal", check=0)
    plans = {n.name: cinm.node_attrs(n) for n in res.model.graph.node
             if n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device") == "memristor"}
    assert {k: a["cim_tiles"] for k, a in plans.items()} == \
        {"conv2/Gemm": 1, "fc1/Gemm": 2, "fc2/Gemm": 1}
    assert [n.op_type for n in res.model.graph.node][0] == "Conv"
    assert all(a["cim_writes"] == 0 and a["cim_preset"] == "pcm-hermes" for a in plans.values())
    assert sum(a["cim_writes_load"] for a in plans.values()) == 4
    for a in plans.values():
        assert sum(a["cim_energy_parts_j"]) == pytest.approx(a["cim_energy_j"], rel=1e-6)
        assert sum(a["cim_latency_parts_s"]) == pytest.approx(a["cim_latency_s"], rel=1e-6)
        assert sum(a["cim_area_parts_mm2"]) == pytest.approx(0.62 * a["cim_tiles"], rel=1e-6)
    path = tmp_path / "l.onnx"
    artifacts.save(res.model, path)
    rows, totals = report.layers(res.model, report.options_from_plans(res.model))
    fc1 = next(r for r in rows if r.name == "fc1/Gemm")
    assert [p.term for p in fc1.parts] == ["array", "adc_dac", "periphery"]
    assert sum(p.energy_j for p in fc1.parts) == pytest.approx(fc1.energy_j, rel=1e-6)
    assert totals["by_part"]["array"][1] == pytest.approx(
        sum(a["cim_energy_j"] for a in plans.values()), rel=1e-6)
    # pcm-hermes publishes its ADCs' and periphery's energy only inside its TOPS/W: the
    # report names them as inside the array's figure, never as a free 0% / 0 J
    assert [p.folded for p in fc1.parts] == ["", "array", "array"]
    assert report._parts_text(fc1) == "array 100% (with adc_dac, periphery)"
    assert [v[2] for v in totals["by_part"].values()] == [False, True, True]
    assert "adc_dac" in report._totals_line(totals) and " 0 J" not in report._totals_line(totals)
    csv_rows = list(csv.DictReader(io.StringIO(
        report.render_report(res.model, report.options_from_plans(res.model))["files"][
            "layers.csv"].decode())))
    # the page names the roofline the host ops were priced with: the recorded nominal one
    html_page = report.render_report(res.model, report.options_from_plans(res.model))["files"][
        "report.html"].decode()
    assert "host: the roofline 50 GFLOP/s, 10 GB/s, 30 W (nominal)" in html_page
    assert "measured roofline" not in html_page
    fc1_csv = next(r for r in csv_rows if r["layer"] == "fc1/Gemm")
    assert fc1_csv["adc_dac_energy_j"] == fc1_csv["adc_dac_area_mm2"] == ""
    assert float(fc1_csv["adc_dac_latency_s"]) == pytest.approx(fc1.parts[1].latency_s)
    assert float(fc1_csv["array_energy_j"]) == pytest.approx(fc1.parts[0].energy_j)


def test_occ_converters_are_counted_in_its_periphery():
    """OCC publishes one mixed-signal energy per CIM cycle and no converter figure (field notes
    crossbar.md §1.4): pcm-occ's ADC/DAC part is inside its periphery's, so report and the
    crossbar table name it there ('-', never a free 0 J), and the shares are of the parts
    published: cells (writes x 200 pJ + MVMs x 0.2 pJ) and periphery (busy cycles x 2.1 nJ)."""
    from onnx_cinm import optimize, report
    from onnx_cinm.examples import get_example

    assert PRESETS["pcm-occ"].folded == ("adc_dac",)
    assert PRESETS["pcm-occ"].folded_into == "periphery"
    res = optimize(get_example("lenet"), host_roofline="nominal", check=0,
                   device_options={"cim_preset": "pcm-occ"})
    rows, totals = report.layers(res.model, report.options_from_plans(res.model))
    xbar = [r for r in rows if r.parts]
    assert xbar
    for r in xbar:
        assert [p.folded for p in r.parts] == ["", "periphery", ""]
        a = next(n for n in res.model.graph.node if n.name == r.name)
        at = {x.name: onnx.helper.get_attribute_value(x) for x in a.attribute}
        writes, mvms = at["cim_writes"], at["cim_mvms"]
        busy_s = writes * 2.5e-6 + mvms * 1e-6  # OCC 'Write' 2.5 us, 'Read' 1 us
        e_cells, e_peri = writes * 2e-10 + mvms * 2e-13, busy_s * 1e9 * 2.1e-9
        # (the plan attributes hold float32)
        assert r.parts[0].energy_j == pytest.approx(e_cells, rel=1e-6)
        assert r.parts[2].energy_j == pytest.approx(e_peri, rel=1e-6)
        tot = e_cells + e_peri
        assert report._parts_text(r) == (f"array {100 * e_cells / tot:.0f}%, "
                                         f"periphery {100 * e_peri / tot:.0f}% (with adc_dac)")
    assert totals["by_part"]["adc_dac"][2] and not totals["by_part"]["periphery"][2]
    table = res.device_tables()
    assert ("pcm-occ publishes adc_dac energy and area only inside the periphery's figures: "
            "they are counted under E periph") in " ".join(table.split())
    kernel_row = next(line for line in table.splitlines() if line.lstrip().startswith(xbar[0].name))
    # E adc/dac '-', then E periph, the kernel's periphery energy
    assert re.search(r"\s-\s+" + re.escape(si(xbar[0].parts[2].energy_j, "J")) + r"\s", kernel_row)


def test_report_gives_published_parts_their_share():
    """reram-isaac publishes its ADC, DAC and periphery energy apart: no part is folded, and
    each part's percentage is its energy over the op's (computed here from the parts)."""
    from onnx_cinm import optimize, report
    from onnx_cinm.examples import get_example

    res = optimize(get_example("lenet"), host_roofline="nominal", check=0,
                   device_options={"cim_preset": "reram-isaac"})
    rows, _ = report.layers(res.model, report.options_from_plans(res.model))
    xbar = [r for r in rows if r.parts]
    assert xbar and all(not p.folded for r in xbar for p in r.parts)
    r = xbar[0]
    tot = sum(p.energy_j for p in r.parts)
    assert report._parts_text(r) == ", ".join(
        f"{p.term} {100 * p.energy_j / tot:.0f}%" for p in r.parts)
    assert r.parts[1].energy_j > 0  # ISAAC's ADCs cost energy of their own


def test_a_plan_without_preset_is_read_as_the_old_default():
    """Models written before the default changed carry no cim_preset: they were compiled for
    pcm-occ, and the report must price them with it, not with the new default."""
    from onnx_cinm.devices import get_device

    dev = get_device("memristor")
    attrs = {"cim_rows": 64, "cim_cols": 64, "cim_crossbars": 4, "cim_loop_order": "weight_stationary"}
    assert dev.recorded_options([("n", "Gemm", attrs)])["cim_preset"] == "pcm-occ"
    assert dev.recorded_options([("n", "Gemm", dict(attrs, cim_preset="reram-isaac"))])[
        "cim_preset"] == "reram-isaac"


def test_placement_benchmark_preset_table():
    """benchmarks/placement.py --presets on the digits MLP: on the default chip its three
    matrix products (one tile each) are resident and carry every Gemm FLOP, no tile is written
    per inference, and the chip's crossbar area is 64 cores x 0.62 mm^2."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "benchmarks" / "placement.py"
    spec = importlib.util.spec_from_file_location("placement_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    recs = mod.preset_records(["digits"], ["pcm-hermes"], {"host_roofline": "nominal"}, "energy",
                              Path("."))
    host, hermes = recs
    assert host["preset"] == "all-host" and host["flops_share"] == 0.0
    # Gemm FLOPs by hand: 2 x (64 x 64 + 64 x 32 + 32 x 10) = 13,056; the rest (3 bias adds of
    # 106 elements, 2 ReLUs of 96, a Softmax of 10) is a few hundred: share between 0.97 and 1
    assert 0.97 < hermes["flops_share"] < 1.0
    assert hermes["writes"] == 0 and hermes["kept"] == 3
    assert hermes["chip_area_mm2"] == pytest.approx(64 * 0.62)
    assert hermes["energy_j"] < host["energy_j"]
    sys.modules.pop("placement_bench", None)


def _parts(cost):
    return {q.term: q for q in cost.parts}


def test_the_presets_own_size_gives_its_published_figures():
    """--cim-size at a preset's own array changes nothing (the default is untouched)."""
    from onnx_cinm.devices.memristor import params_from_options
    from onnx_cinm.devices.memristor.presets import resize

    for p in PRESETS.values():
        assert resize(p, p.rows, p.cols) is p
        same = params_from_options({"cim_preset": p.name, "cim_rows": p.rows, "cim_cols": p.cols})
        assert same is p and not same.scaled_from
    assert params_from_options({}) is PCM_HERMES


@pytest.mark.parametrize("size", [64, 256])
def test_isaac_resized_by_hand(size):
    """reram-isaac (published 128 x 128, one ADC per array) at half and double its size: one
    resident tile, 10 MVMs. By hand from the preset's sources (chips.md §1.2):
    cells 25 um^2 and 128 x 128 x 0.1 pJ per MVM scale per cell; one ADC per 128 columns
    (1200 um^2; 64 columns: still 1 ADC, 256: 2 ADCs) converting 1.67 pJ per column in 1/1.2 ns;
    128 DACs 170/8 um^2 scale per row at 0.42 pJ per drive; shift-and-add 30 um^2 per
    (rows + cols) = 256; the MVM is all conversion (128 x 0.83 ns > 100 ns): 100 ns x columns
    per ADC / 128; a tile write 351/32 us per 128 rows and 676,000/32 pJ per 16,384 cells."""
    from onnx_cinm.devices.memristor import params_from_options
    from onnx_cinm.paradigms.cim.schedule import plan

    p = params_from_options({"cim_preset": "reram-isaac", "cim_rows": size, "cim_cols": size})
    assert p.scaled_from == (128, 128) and (p.rows, p.cols) == (size, size)
    cells = size * size / (128 * 128)
    adcs, per_adc = {64: (1, 64), 256: (2, 128)}[size]
    assert p.adcs_per_array == adcs
    c = plan(10, size, size, p).cost(p)
    parts = _parts(c)
    assert parts["array"].energy_j == pytest.approx(10 * size * size * 0.1e-12)
    assert parts["adc_dac"].energy_j == pytest.approx(10 * size * (1.67e-12 + 0.42e-12))
    assert parts["periphery"].energy_j == 0.0
    assert c.latency_s == pytest.approx(10 * 100e-9 * per_adc / 128)
    assert parts["adc_dac"].latency_s == pytest.approx(c.latency_s)
    assert parts["array"].area_mm2 == pytest.approx(25e-6 * cells)
    assert parts["adc_dac"].area_mm2 == pytest.approx(adcs * 1200e-6 + 170e-6 / 8 * size / 128)
    assert parts["periphery"].area_mm2 == pytest.approx(30e-6 * 2 * size / 256)
    load = plan(10, size, size, p).cost(p, load=True)
    assert load.latency_s == pytest.approx(351e-6 / 32 * size / 128)
    assert load.energy_j == pytest.approx(676_000e-12 / 32 * cells)


@pytest.mark.parametrize("size", [128, 512])
def test_hermes_folded_total_scaled_per_cell(size):
    """pcm-hermes publishes its core's energy (9.76 TOPS/W) and area (1.59 TOPS/mm^2) only as
    wholes: both scale per cell; one ADC per column (256 per 256 columns) keeps each MVM at
    131,072 / (63.1e12 / 64) s with 76.8 ns converting."""
    from onnx_cinm.devices.memristor import params_from_options
    from onnx_cinm.paradigms.cim.schedule import plan

    p = params_from_options({"cim_rows": size, "cim_cols": size})  # the default preset
    cells = size * size / 65536
    c = plan(1, size, size, p).cost(p)
    parts = _parts(c)
    assert parts["array"].energy_j == pytest.approx(131072 / 9.76e12 * cells) == c.energy_j
    assert parts["array"].area_mm2 == pytest.approx(0.62 * cells)
    assert c.latency_s == pytest.approx(131072 / (63.1e12 / 64))
    assert parts["adc_dac"].latency_s == pytest.approx(76.8e-9)
    assert p.adcs_per_array == size and p.min_macs == size * size


@pytest.mark.parametrize("size", [32, 128])
def test_occ_periphery_per_edge_and_neurram_per_column(size):
    """pcm-occ (64 x 64): its 2.1 nJ per busy cycle of periphery scales with the array's edge
    (rows + cols) / 128, the 0.2 pJ MVM and 200 pJ tile write per cell, the 2.5 us write per
    row; the 1 us MVM has no published conversion part and stays. rram-neurram: 256 x (1.2 +
    0.25) pJ of neuron energy per MVM goes with the columns."""
    from onnx_cinm.devices.memristor import params_from_options
    from onnx_cinm.paradigms.cim.schedule import plan

    p = params_from_options({"cim_preset": "pcm-occ", "cim_rows": size, "cim_cols": size})
    c = plan(1, size, size, p).cost(p)
    parts = _parts(c)
    assert parts["periphery"].energy_j == pytest.approx(1000 * 2.1e-9 * 2 * size / 128)
    assert parts["array"].energy_j == pytest.approx(0.2e-12 * size * size / 4096)
    assert c.latency_s == pytest.approx(1e-6)
    assert p.write_latency_s == pytest.approx(2.5e-6 * size / 64)
    assert p.write_energy_j == pytest.approx(200e-12 * size * size / 4096)
    n = params_from_options({"cim_preset": "rram-neurram", "cim_rows": 256, "cim_cols": size})
    assert n.mvm_energy_j == pytest.approx(size * 1.45e-12)
    assert n.adc_energy_j == 0.3e-12  # per conversion: the plan counts one per column


def test_optimize_table_says_figures_are_scaled(tmp_path, capsys):
    """optimize's and report's tables say when the crossbar size is not the preset's own; at
    the preset's own size they do not."""
    from onnx_cinm.cli import main

    common = ["optimize", "--example", "lenet", "--check", "0", "--host-roofline", "nominal"]
    note = "(crossbar figures scaled from 256x256, pcm-hermes's published array, to 64x64"
    assert main(common + ["--cim-size", "64x64", "-o", str(tmp_path / "a.onnx")]) == 0
    assert note in capsys.readouterr().out
    assert main(["report", str(tmp_path / "a.onnx"), "-o", str(tmp_path / "a.report")]) == 0
    assert note in capsys.readouterr().out
    assert html.escape(note) in (tmp_path / "a.report" / "report.html").read_text()
    assert main(common + ["--cim-size", "256x256", "-o", str(tmp_path / "b.onnx")]) == 0
    out = capsys.readouterr().out
    assert "crossbars of 256x256" in out and "scaled from" not in out
    assert main(["report", str(tmp_path / "b.onnx"), "-o", str(tmp_path / "b.report")]) == 0
    assert "scaled from" not in capsys.readouterr().out


def test_a_resized_chip_at_its_own_size_is_itself():
    """Review: resize() refused any call on an already resized chip, so a device built on
    resize(...) failed when its plan asked for the size it already had."""
    from onnx_cinm.devices.memristor import presets

    small = presets.resize(presets.PCM_HERMES, 64, 64)
    assert presets.resize(small, 64, 64) is small
    with pytest.raises(ValueError, match="already resized from 256x256"):
        presets.resize(small, 128, 128)
