"""The report: table, totals, PNG pictures and a self-contained HTML page naming every layer."""
from __future__ import annotations

import csv
import io
from html.parser import HTMLParser

import numpy as np
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper
from PIL import Image

from onnx_cinm import optimize, report
from onnx_cinm.cli import main
from onnx_cinm.dialects import cinm
from onnx_cinm.devices.memristor import LINK_BYTES_PER_S, LINK_J_PER_BYTE
from onnx_cinm.examples import get_example
from onnx_cinm.passes.cost_placement import evaluate_model
from onnx_cinm.text import si


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self.imgs, self.tags = [], [], []
        self._td = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "td":
            self._td = True
            self.cells.append("")
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag == "td":
            self._td = False

    def handle_data(self, data):
        if self._td:
            self.cells[-1] += data


@pytest.fixture(scope="module")
def lenet_opt():
    return optimize(get_example("lenet"), check=0, host_roofline="nominal").model


def test_report_files(lenet_opt, tmp_path):
    res = report.write_report(lenet_opt, tmp_path / "rep", {"host_roofline": "nominal"}, title="lenet")
    names = sorted(p.name for p in res["files"])
    assert names == ["graph.png", "layers.csv", "report.html", "time_energy.png", "wear.json"]
    for png in ("graph.png", "time_energy.png"):
        with Image.open(tmp_path / "rep" / png) as im:
            assert im.format == "PNG" and im.size == report.PNG_SIZE == (1200, 700)
    import matplotlib.image as mpimg
    assert mpimg.imread(str(tmp_path / "rep" / "graph.png")).shape[:2] == (700, 1200)

    p = _Collect()
    p.feed((tmp_path / "rep" / "report.html").read_text())
    layer_names = [n.name for n in lenet_opt.graph.node]
    for name in layer_names:
        assert name in p.cells, name
    assert len(p.imgs) == 2 and all(i["src"].startswith("data:image/png;base64,") for i in p.imgs)
    assert "script" not in p.tags and not any(i["src"].startswith("http") for i in p.imgs)

    rows = list(csv.DictReader(io.StringIO((tmp_path / "rep" / "layers.csv").read_text())))
    assert [r["layer"] for r in rows] == layer_names
    # per-layer figures of crossbar and DPU kernels are their plan attributes
    for node, row in zip(lenet_opt.graph.node, rows):
        at = cinm.node_attrs(node) if node.domain == cinm.DOMAIN else {}
        if "cim_latency_s" in at:
            assert float(row["latency_s"]) == pytest.approx(at["cim_latency_s"], rel=1e-6)
            assert int(row["writes"]) == at["cim_writes"] and row["device"] == "memristor"
        if "cnm_energy_j" in at:
            assert float(row["energy_j"]) == pytest.approx(at["cnm_energy_j"], rel=1e-6)
    # host rows: the nominal roofline by hand, e.g. the first Transpose moves bytes only
    t = res["totals"]
    assert t["latency_s"] == pytest.approx(sum(float(r["latency_s"]) + float(r["transfer_s"]) for r in rows))
    # the table's figures, the op's and its transfers' (trial s30: the CSV's latency_s, the
    # op's alone, read as contradicting the table's 68.2 ms)
    for r in rows:
        assert float(r["total_latency_s"]) == float(r["latency_s"]) + float(r["transfer_s"])
        assert float(r["total_energy_j"]) == float(r["energy_j"]) + float(r["transfer_j"])
    assert t["latency_s"] == pytest.approx(sum(float(r["total_latency_s"]) for r in rows))
    assert t["writes"] == sum(at.get("cim_writes", 0) for at in
                              (cinm.node_attrs(n) for n in lenet_opt.graph.node if n.domain == cinm.DOMAIN))
    text = report.table(res["rows"], t)
    assert "total:" in text and "conv2/Gemm" in text
    # the default table shows the cinm ops only: one line counts the others (conv1, the pools,
    # flatten), so what is shown adds up to the total
    host = [n.name for n in lenet_opt.graph.node if n.domain != cinm.DOMAIN]
    shown = report.table(res["rows"], t, cinm_only=True)
    assert "conv1" in text and not any(f" {n} " in shown for n in host)
    by_name = {r["layer"]: r for r in rows}
    lat = sum(float(by_name[n]["latency_s"]) + float(by_name[n]["transfer_s"]) for n in host)
    energy = sum(float(by_name[n]["energy_j"]) + float(by_name[n]["transfer_j"]) for n in host)
    assert f"{len(host)} host ops not shown ({si(lat, 's')}, {si(energy, 'J')}, in the total): " \
        "--all-nodes lists them" in shown
    assert len(host) >= 3 and lat > 0 and energy > 0
    assert "not shown" not in text  # every row listed: nothing to account for


def test_report_cli_and_optimize_report(tmp_path, capsys):
    model = tmp_path / "l.onnx"
    code = main(["optimize", "--example", "lenet", "-o", str(model), "--placement", "cost",
                 "--host-roofline", "nominal", "--report", str(tmp_path / "r1"), "--check", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and (tmp_path / "r1" / "report.html").is_file()
    assert "\r" not in err and "it/s" not in err and "pass/s" not in err  # no bar off a terminal
    code = main(["report", str(model), "-o", str(tmp_path / "r2"), "--host-roofline", "nominal"])
    out, _ = capsys.readouterr()
    assert code == 0 and "total:" in out and (tmp_path / "r2" / "graph.png").is_file()
    # default folder next to the model
    assert main(["report", str(model), "-q"]) == 0 and (tmp_path / "l.report" / "layers.csv").is_file()
    # bad input: one line, exit 1, nothing written
    code = main(["report", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "r3")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and not (tmp_path / "r3").exists()
    (tmp_path / "afile").write_text("x")
    assert main(["report", str(model), "-o", str(tmp_path / "afile")]) == 1
    assert (tmp_path / "afile").read_text() == "x"


def test_device_colours_are_declared_and_the_others_do_not_reuse_them():
    from onnx_cinm import devices
    from onnx_cinm.report import TRANSFER_COLOUR, _colour

    # the pictures' colours of the built-in devices (their Device.colour)
    seen: list = []
    assert [_colour(d, seen) for d in ("host", "memristor", "upmem")] == [
        "#7f7f7f", "#d62728", "#1f77b4"]
    declared = {d.colour for d in devices.all_devices() if d.colour} | {TRANSFER_COLOUR}
    # a device without a colour gets one of tab10's that no other has, the same one each time
    picked = [_colour(d, seen) for d in ("newchip", "otherchip", "newchip")]
    assert picked[0] == picked[2] != picked[1] and not declared & set(picked)


def _fan_out(k=512, n1=256, n2=128):
    """x[1, k] feeds two Gemms with constant weights; both results are graph outputs."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((k, n1)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((k, n2)).astype(np.float32), "W2")
    g = h.make_graph([h.make_node("Gemm", ["x", "W1"], ["y1"], name="g1"),
                      h.make_node("Gemm", ["x", "W2"], ["y2"], name="g2")], "fan_out",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, k])],
                     [h.make_tensor_value_info("y1", TP.FLOAT, [1, n1]),
                      h.make_tensor_value_info("y2", TP.FLOAT, [1, n2])], [w1, w2])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_report_transfers_are_the_cost_models_on_a_fan_out():
    """One activation read by two crossbar Gemms crosses the host<->crossbar link once (issue
    13: the report charged it to each reader, 2 x 2048 B instead of 2048 B)."""
    opts = {"host_roofline": "nominal"}
    m = optimize(_fan_out(), check=0, place=[("*", "memristor")], **opts).model
    devs = [cinm.node_attrs(n)["device"] for n in m.graph.node if n.domain == cinm.DOMAIN]
    assert devs == ["memristor", "memristor"]
    rows, totals = report.layers(m, opts)
    # by hand: x in once (1 x 512 float32 = 2048 B), y1 out (1024 B) and y2 out (512 B)
    nbytes = 4 * 512 + 4 * 256 + 4 * 128
    assert nbytes / LINK_BYTES_PER_S == pytest.approx(560e-9)
    assert sum(r.transfer_s for r in rows) == pytest.approx(nbytes / LINK_BYTES_PER_S, rel=1e-12)
    assert sum(r.transfer_j for r in rows) == pytest.approx(nbytes * LINK_J_PER_BYTE, rel=1e-12)
    assert sum(r.transfer_bytes for r in rows) == totals["transfer_bytes"] == nbytes
    # and the whole report adds up to what cost placement minimizes
    tot, _, _ = evaluate_model(m, opts)
    assert totals["transfer_s"] == pytest.approx(tot.transfer_s, rel=1e-12)
    assert sum(r.latency_s + r.transfer_s for r in rows) == pytest.approx(tot.latency_s, rel=1e-12)
    assert sum(r.energy_j + r.transfer_j for r in rows) == pytest.approx(tot.energy_j, rel=1e-12)
    assert totals["latency_s"] == pytest.approx(tot.latency_s, rel=1e-12)


@pytest.mark.parametrize("opts", [
    {},                                                                     # pcm-hermes, resident
    {"placement": "heuristic", "device_options": {"cim_preset": "pcm-occ"}},  # streamed kernels
])
def test_profile_bytes_of_crossbar_nodes_are_the_reports(tmp_path, opts):
    # report's bytes_moved (the plan: each input row once per column tile, each partial sum
    # once per row tile, cells written) and run --profile's differed: the simulator counted
    # X and Y once (LeNet's fc1 on 256 x 256 crossbars: 2080 B against 2560 B)
    from onnx_cinm import artifacts
    from onnx_cinm.runtime.session import InferenceSession

    res = optimize(get_example("lenet"), **opts)
    path = tmp_path / "l.onnx"
    artifacts.save(res.model, path)
    rows, _ = report.layers(res.model, report.options_from_plans(res.model))
    want = {r.name: r.bytes_moved for r in rows if r.device == "memristor"}
    sess = InferenceSession(str(path))
    sess.run(None, {"input": np.ones((1, 1, 28, 28), np.float32)})
    sess.run(None, {"input": np.ones((1, 1, 28, 28), np.float32)})
    got = {r["node"]: r["bytes_moved"] for r in sess.profile() if r["device"] == "memristor" and r["run"] == 1}
    assert got and got == {n.split(" ")[0]: b for n, b in want.items()} | {}
    if not opts:  # hand count: fc1 [1, 400] @ [400, 120], Kt = 2, Nt = 1, no writes
        assert got["fc1/Gemm"] == 4 * (400 * 1 + 120 * 2) == 2560


def test_time_energy_bars_are_one_collection_with_the_bars_of_axes_bar():
    """The time/energy picture drew a patch per bar (Axes.bar): 87244 patches for beats_blstm's
    21811 layers, 200 of the report's 208 s. One collection now; its rectangles are the ones
    Axes.bar makes (width 1 centred on each index, stacked on ``bottoms``), and the picture
    of a real model is the same PNG (measured: byte-identical on beats_blstm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own, extra = [3.0, 0.0, 1.5, 2.0], [0.5, 1.0, 0.0, 0.25]
    fig = plt.figure()
    ax = fig.add_subplot(1, 1, 1)
    report._bars(ax, own, [0.0] * 4, ["#ff0000"] * 4)
    report._bars(ax, extra, own, ["#c7c7c7"] * 4)
    got = [p.vertices[:4] for c in ax.collections for p in c.get_paths()]
    ref_ax = fig.add_subplot(2, 1, 1)
    ref = ref_ax.bar(range(4), own, width=1.0, linewidth=0).patches + \
        ref_ax.bar(range(4), extra, bottom=own, width=1.0, linewidth=0).patches
    plt.close(fig)
    assert len(ax.collections) == 2 and not ax.patches
    for verts, rect in zip(got, ref, strict=True):
        (x0, y0), w, hgt = rect.get_xy(), rect.get_width(), rect.get_height()
        np.testing.assert_allclose(sorted(map(tuple, verts)), sorted(
            [(x0, y0), (x0, y0 + hgt), (x0 + w, y0 + hgt), (x0 + w, y0)]))


def test_the_summary_splits_the_totals_by_device_as_report_does():
    """Trial s29: the summary gave the modeled totals only; where the energy goes (the host's
    Im2Col on nsfw) took a report. The split by device plus the transfers adds up to the
    totals, and each device's share is report's 'by device' figure."""
    from onnx_cinm import optimize, report
    from onnx_cinm.examples import get_example

    res = optimize(get_example("lenet"), check=0, host_roofline="nominal",
                   device_options={"cim_preset": "pcm-occ"})
    t = res.stats["placement"]["model_totals"]
    by = t["by_device"]
    assert set(by) == {"host", "memristor", "transfers"}
    assert sum(v[0] for v in by.values()) == pytest.approx(t["latency_s"], rel=1e-9)
    assert sum(v[1] for v in by.values()) == pytest.approx(t["energy_j"], rel=1e-9)
    _, totals = report.layers(res.model, report.options_from_plans(res.model))
    for dev, (s, j) in totals["by_device"].items():
        assert by[dev] == [pytest.approx(s, rel=1e-9), pytest.approx(j, rel=1e-9)]
    assert by["transfers"] == [pytest.approx(totals["transfer_s"], rel=1e-9),
                               pytest.approx(totals["transfer_j"], rel=1e-9)]


def test_report_prices_the_crossbar_link_the_model_was_optimized_with():
    """Reviewer s29: --cim-link-gbps was not recorded, so report (and run --profile's wear
    period) priced the transfers at the default 6.4 GB/s while optimize's summary used 3:
    46.0 us against 46.5 us on LeNet. The plans now record it."""
    from onnx_cinm import optimize, report
    from onnx_cinm.examples import get_example

    def totals(gbps):
        opts = {"cim_preset": "pcm-occ", **({"cim_link_gbps": gbps} if gbps else {})}
        res = optimize(get_example("lenet"), check=0, host_roofline="nominal", device_options=opts)
        return res.stats["placement"]["model_totals"], report.layers(
            res.model, report.options_from_plans(res.model))[1]

    slow, rep = totals(3.0)
    fast, _ = totals(None)
    assert slow["latency_s"] > fast["latency_s"]  # a slower link costs time
    assert rep["latency_s"] == pytest.approx(slow["latency_s"], rel=1e-12)
    assert rep["transfer_s"] == pytest.approx(slow["by_device"]["transfers"][0], rel=1e-12)
