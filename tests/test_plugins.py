"""Devices as plugins: a package outside onnx_cinm adds a device through the entry-point group
``onnx_cinm.devices``, and cost placement uses it where it is cheapest.

The plugin is ``tests/plugins/hbm_pim_device`` (its own ``pyproject.toml``). We make it
discoverable the way pip would, without installing anything into the venv: a
``hbm_pim_device-0.1.0.dist-info`` folder (METADATA + the ``entry_points.txt`` written from the
plugin's own ``pyproject.toml``) on ``PYTHONPATH`` next to the package's source folder, in a fresh
interpreter (the registry loads plugins once per process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

PLUGIN = Path(__file__).resolve().parent / "plugins" / "hbm_pim_device"

SCRIPT = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    from onnx import TensorProto as TP, helper as h, numpy_helper
    from onnx_cinm import devices, optimize
    from onnx_cinm.analysis import op_info, tensor_infos
    from onnx_cinm.dialects import cinm

    out = {"names": devices.device_names(), "errors": devices.plugin_errors()}

    def gemv_model(n):
        W = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "W")
        g = h.make_graph([h.make_node("MatMul", ["W", "x"], ["y"], name="gemv")], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, [n])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [n])], [W])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)

    def add_model(n):
        g = h.make_graph([h.make_node("Add", ["a", "b"], ["y"], name="add")], "g",
                         [h.make_tensor_value_info("a", TP.FLOAT, [n]), h.make_tensor_value_info("b", TP.FLOAT, [n])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [n])])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)

    for key, model in (("gemv", gemv_model(1024)), ("add", add_model(64))):
        r = optimize(model, placement="cost", check=1, stop_after="placement",
                     device_options={"objective": "latency", "host_roofline": "nominal",
                                     # the paper's 4 small crossbars: the 1024 x 1024 Gemv streams
                                     "cim_preset": "pcm-occ"})
        node = next(n for n in r.model.graph.node if n.domain == cinm.DOMAIN)
        op = op_info(node, tensor_infos(r.model))
        costs = {}
        for d in devices.all_devices():
            if d.name == "host" or not d.supports(op):
                continue
            c = d.cost(op, {})
            extra = 0.0
            if d.name == "toy_pim":  # x in, y out over the HBM interface (its transfer_cost)
                extra = sum(d.transfer_cost(t.numel * 4, to).latency_s
                            for t, to in ((op.inputs[1] if key == "gemv" else op.inputs[0], True),
                                          (op.outputs[0], False)))
                if key == "add":
                    extra += d.transfer_cost(op.inputs[1].numel * 4, True).latency_s
            costs[d.name] = [c.latency_s, extra]
        out[key] = {"op_type": node.op_type, "device": cinm.node_attrs(node)["device"],
                    "reason": cinm.node_attrs(node)["placement"], "flops": op.flops,
                    "in_bytes": sum(t.numel * 4 for t in op.inputs), "out_bytes": op.outputs[0].numel * 4,
                    "costs": costs, "check": r.check.ok}
    # what the plugin declares reaches the CLI, sweeps and report with no edit above
    from onnx_cinm import report, sweep
    from onnx_cinm.cli.args import _parser, _pass_options
    parser = _parser()
    args = parser.parse_args(["optimize", "--example", "mlp", "-o", "x.onnx",
                              "--toy-pim-launch", "3e-6s"])
    out["flag"] = _pass_options(args, parser)["toy_pim_launch_s"]
    out["sweep"] = sweep.keys()["toy.launch"]("1min")
    out["colour"] = report._colour("toy_pim", [])
    print(json.dumps(out))
''')


def _site(tmp_path: Path, broken: bool) -> Path:
    """A folder with the plugin's dist-info (entry points from its pyproject.toml)."""
    meta = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    site = tmp_path / "site"
    info = site / f"hbm_pim_device-{meta['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    eps = meta["entry-points"]["onnx_cinm.devices"]
    lines = ["[onnx_cinm.devices]"] + [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    if broken:  # a second, broken plugin must not stop the good one or the built-ins
        bad = site / "broken_device-0.1.dist-info"
        bad.mkdir()
        (bad / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-device\nVersion: 0.1\n")
        (bad / "entry_points.txt").write_text("[onnx_cinm.devices]\nbroken = no_such_module_xyz:Device\n")
    return site


def _run(tmp_path: Path, broken: bool = True):
    site = _site(tmp_path, broken)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(PLUGIN)]))
    env.pop("ONNX_CINM_HOST_ROOFLINE", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_plugin_registers_and_wins_where_cheapest(tmp_path):
    out, err = _run(tmp_path)
    assert out["names"][:3] == ["host", "memristor", "upmem"] and "toy_pim" in out["names"]
    # the broken plugin: one line, named, the rest loaded
    assert len(out["errors"]) == 1 and "broken" in out["errors"][0]
    assert [line for line in err.splitlines() if "broken" in line] == [
        f"onnx-cinm: warning: {out['errors'][0]}"]

    g = out["gemv"]
    assert g["op_type"] == "Gemv" and g["check"]
    # hand figures: host roofline "nominal" is 50 GFLOP/s, 10 GB/s
    host_s = max(g["flops"] / 50e9, (g["in_bytes"] + g["out_bytes"]) / 10e9)
    # the plugin's model by hand: 128 units x 16 lanes x 2 x 300 MHz; 1.23 TB/s from the banks,
    # 2 us launch; x in and y out over 307 GB/s
    pim_s = 2e-6 + max(g["flops"] / (128 * 16 * 2 * 300e6), (g["in_bytes"] + g["out_bytes"]) / 1.23e12) \
        + (4096 + 4096) / 307e9
    assert abs(sum(g["costs"]["toy_pim"]) - pim_s) < 1e-12
    assert pim_s < host_s and pim_s < g["costs"]["upmem"][0]
    assert g["device"] == "toy_pim", g["reason"]
    assert "host +" in g["reason"] and "upmem +" in g["reason"]

    a = out["add"]
    host_s = (2 * 64 * 4 + 64 * 4) / 10e9   # 76.8 ns: bandwidth bound
    assert host_s < sum(a["costs"]["toy_pim"])  # 2 us launch dominates
    assert a["device"] == "host", a["reason"]

    # its declarations: the colour, a flag with a unit (3e-6 s) and a sweep key (1 min = 60 s)
    assert out["colour"] == "#17becf"
    assert out["flag"] == 3e-6 and out["sweep"] == {"toy_pim_launch_s": 60.0}


def test_builtins_without_plugins(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", "from onnx_cinm import devices; "
                        "print(devices.device_names(), devices.plugin_errors())"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "['host', 'memristor', 'upmem', 'hbm_pim'] []"


def _device(name="chip", colour="", aliases=(), prefix="chip"):
    """A minimal device class with one option ``<prefix>_size`` carrying ``aliases``."""
    from dataclasses import dataclass, make_dataclass

    from onnx_cinm.devices import Cost, Device, Support
    from onnx_cinm.options import option

    @dataclass(frozen=True)
    class Params:
        n: int = 1

    opts = make_dataclass("Opts", [("size", "int | None", option(None, help="size",
                                                                   aliases=aliases))],
                          frozen=True)
    attrs = dict(name=name, paradigm="cnm", option_prefix=prefix, Options=opts, colour=colour,
                 params=Params(), supports=lambda self, op: Support(False, "no"),
                 cost=lambda self, op, options: Cost(0.0, 0.0, 0, 0))
    return type("Chip", (Device,), attrs)()


def test_the_contract_checks_colours_and_alias_flags():
    import pytest

    from onnx_cinm.devices.base import Registry, check_device
    from onnx_cinm.options import Alias

    check_device(_device(colour="#00aaFF", aliases=(Alias(flag="--chip-big", const=4),)))
    with pytest.raises(TypeError, match=r"device 'chip': colour 'red' is not '#rrggbb'"):
        check_device(_device(colour="red"))
    # a device's flags stay under its prefix, so they cannot take a pass's or another's flag
    with pytest.raises(TypeError, match=r"option alias flags \['--size'\] do not start with "
                                        r"'--chip-'"):
        check_device(_device(aliases=(Alias(flag="--size"),)))
    reg = Registry()
    reg.register(_device(aliases=(Alias(sweep="array.size"),)))
    with pytest.raises(ValueError, match=r"device 'other': option aliases \['array.size'\] are "
                                         r"taken by device 'chip'"):
        reg.register(_device("other", prefix="other", aliases=(Alias(sweep="array.size"),)))
