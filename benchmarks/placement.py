"""Placement strategies side by side: modeled latency and energy of all-host, the paper heuristic
and cost placement (latency, energy, EDP objectives) on light ResNet50, PP-OCR det, the digits MLP
and a PrIM-style workload mix.

Every strategy is scored by one model (:func:`onnx_cinm.passes.cost_placement.evaluate_model`:
the devices' cost functions, the host roofline, transfers, per inference), so the columns compare.
``all-host`` is the heuristic with the hint ``*=host``. The PrIM mix is the sum of one run of
each PrIM workload at PrIM's sizes (``models/prim_workloads.py``: VA, GEMV, RED, HST, SEL, SCAN,
TRNS, MLP; int32), each placed on its own.

Target (checked, printed per row): cost placement for an objective is never worse on that
objective than the heuristic (when the heuristic keeps the constraints) or all-host, and never
breaks a constraint. With the default pooled crossbar residency the heuristic usually breaks it
(it keeps more tiles programmed than there are crossbars); ``--per-kernel-crossbars`` scores
everything the way the per-kernel plans assume instead, where the heuristic is admissible.

Chip presets (``--presets [NAMES]``): light ResNet50 and a transformer encoder
(paraphrase-MiniLM-L3-v2 from pip, at batch 1 and 64 tokens, fetched into ``--cache`` by
``benchmarks/real_models.py``'s ``fetch``) under cost placement on each crossbar chip preset
(``--cim-preset``): the share of the FLOPs placed on the crossbars, tile writes per inference,
modeled latency and energy per inference (the whole graph: host, devices, transfers), the
crossbars kept programmed and the chip's crossbar area (``CrossbarParams.chip_area_mm2``: the
arrays with their converters and periphery; '-' when the preset publishes none), next to
all-host.

Usage::

    python benchmarks/placement.py [--host-roofline nominal|GFLOPS,GBPS[,W]] [--json]
        [--per-kernel-crossbars] [--models resnet50,ppocr_det,digits,prim_mix]
    python benchmarks/placement.py --presets [pcm-hermes,pcm-occ,...] [--cache DIR]
        [--preset-models resnet50,minilm_l3] [--objective energy|latency|edp]

``--json`` prints one JSON list of ``{model, strategy, objective, latency_s, energy_j, writes,
transfers_bytes, violations}`` records instead of the table.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import onnx

from onnx_cinm.text import Column, si, table as text_table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

STRATEGIES = [("all-host", "heuristic", None), ("heuristic", "heuristic", None),
              ("cost", "cost", "latency"), ("cost", "cost", "energy"), ("cost", "cost", "edp")]


def _models(names: list[str]):
    """(name, [cinm-level ModelProto, ...]) per model; a mix has several parts."""
    from onnx_cinm import frontend
    from onnx_cinm.sweep import cinm_level

    for name in names:
        if name == "resnet50":
            path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
            yield name, [cinm_level(str(path))]
        elif name == "ppocr_det":
            spec = importlib.util.find_spec("rapidocr_onnxruntime")
            if spec is None or not spec.submodule_search_locations:
                print("ppocr_det skipped: pip install --no-deps rapidocr-onnxruntime==1.4.4", file=sys.stderr)
                continue
            path = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
            model = frontend.load_model(str(path))
            yield name, [cinm_level(model, {model.graph.input[0].name: [1, 3, 320, 320]})]
        elif name == "digits":
            from onnx_cinm.examples.digits import build_digits_mlp

            yield name, [cinm_level(build_digits_mlp().model)]
        elif name == "prim_mix":
            import prim_workloads

            yield name, [cinm_level(prim_workloads.build(w, "int32", "prim")) for w in prim_workloads.NAMES]
        else:
            raise SystemExit(f"unknown model '{name}'")


def _score(parts, strategy: str, objective: str | None, base: dict) -> dict:
    from onnx_cinm.passes import PassContext, PassManager
    from onnx_cinm.passes.cost_placement import evaluate_model

    tot = {"latency_s": 0.0, "energy_j": 0.0, "writes": 0, "transfers_bytes": 0, "violations": []}
    for part in parts:
        m = onnx.ModelProto()
        m.CopyFrom(part)
        opts = dict(base, placement=strategy)
        if objective:
            opts["objective"] = objective
        m = PassManager(pipeline=["placement"]).run(m, PassContext(options=opts))
        t, bad, _ = evaluate_model(m, opts)
        tot["latency_s"] += t.latency_s
        tot["energy_j"] += t.energy_j
        tot["writes"] += int(t.writes)
        tot["transfers_bytes"] += int(t.transfer_bytes)
        tot["violations"] += bad
    return tot


def run(names: list[str], base: dict) -> list[dict]:
    """Records of every (model, strategy, objective)."""
    records = []
    for name, parts in _models(names):
        for label, strategy, objective in STRATEGIES:
            opts = dict(base)
            if label == "all-host":
                opts["place"] = [("*", "host")]
            t0 = time.perf_counter()
            r = _score(parts, strategy, objective, opts)
            records.append({"model": name, "strategy": label, "objective": objective or "",
                            **r, "seconds": time.perf_counter() - t0})
    return records


def verdicts(records: list[dict]) -> list[str]:
    """One line per (model, objective) of cost placement: OK or MISS against the target."""
    out = []
    key = {"latency": "latency_s", "energy": "energy_j"}
    for rec in records:
        if rec["strategy"] != "cost":
            continue
        obj = rec["objective"]
        f = (lambda r: r["latency_s"] * r["energy_j"]) if obj == "edp" else (lambda r, k=key[obj]: r[k])
        others = [r for r in records if r["model"] == rec["model"] and r["strategy"] in ("all-host", "heuristic")]
        ok = not rec["violations"]
        for o in others:
            if o["strategy"] == "heuristic" and o["violations"]:
                continue  # an inadmissible baseline
            ok = ok and f(rec) <= f(o) * (1 + 1e-9)
        out.append(f"{rec['model']:10s} cost[{obj}]: {'OK' if ok else 'MISS'}")
    return out


def table(records: list[dict]) -> str:
    cols = ("model", "strategy", "objective", Column("latency", ">"), Column("energy", ">"),
            Column("EDP", ">"), Column("writes", ">"), Column("moved", ">"), "constraints")
    return text_table(cols, [
        (r["model"], r["strategy"], r["objective"], si(r["latency_s"], "s"), si(r["energy_j"], "J"),
         si(r["latency_s"] * r["energy_j"], "Js"), r["writes"], si(r["transfers_bytes"], "B"),
         "ok" if not r["violations"] else f"BREAKS {r['violations'][0]}"
         + (f" (+{len(r['violations']) - 1})" if len(r["violations"]) > 1 else ""))
        for r in records])


def _preset_models(names: list[str], cache: Path):
    """(name, cinm-level ModelProto) of the preset table's models."""
    from onnx_cinm.sweep import cinm_level

    for name in names:
        if name == "minilm_l3":
            import real_models

            path = real_models.fetch("minilm_l3", cache)
            yield name, cinm_level(str(path), dims=real_models.MODELS["minilm_l3"]["dims"])
        else:
            for label, parts in _models([name]):
                yield label, parts[0]


def preset_records(models: list[str], presets: list[str], base: dict, objective: str,
                   cache: Path) -> list[dict]:
    """One record per (model, preset) and an ``all-host`` one per model: ``flops_share``
    (FLOPs of the ops placed on the crossbars / all FLOPs), ``writes`` (tile writes per
    inference), ``latency_s``, ``energy_j`` (per inference, whole graph), ``kept`` (crossbar
    tiles kept programmed), ``crossbars``, ``chip_area_mm2`` (0: not published)."""
    from onnx_cinm import report
    from onnx_cinm.devices.memristor import PRESETS
    from onnx_cinm.passes import PassContext, PassManager

    sys.path.insert(0, str(ROOT / "benchmarks"))
    out = []
    for name, part in _preset_models(models, cache):
        for preset in ["all-host"] + presets:
            opts = dict(base, placement="cost", objective=objective)
            if preset == "all-host":
                opts.update(placement="heuristic", place=[("*", "host")])
            else:
                opts["cim_preset"] = preset
            m = onnx.ModelProto()
            m.CopyFrom(part)
            t0 = time.perf_counter()
            m = PassManager(pipeline=["placement"]).run(m, PassContext(options=opts))
            rows, tot = report.layers(m, opts)
            flops = sum(r.flops for r in rows)
            on_xbar = sum(r.flops for r in rows if r.device == "memristor")
            p = PRESETS.get(preset)
            out.append({"model": name, "preset": preset, "flops_share": on_xbar / flops if flops else 0.0,
                        "writes": int(tot["writes"]), "latency_s": tot["latency_s"],
                        "energy_j": tot["energy_j"], "violations": tot["violations"],
                        "kept": sum(1 for r in rows if r.device == "memristor" and r.writes == 0),
                        "crossbars": p.crossbars if p else 0,
                        "chip_area_mm2": p.chip_area_mm2 if p else 0.0,
                        "seconds": time.perf_counter() - t0})
    return out


def preset_table(records: list[dict]) -> str:
    cols = ("model", "preset", Column("FLOPs on xbars", ">"), Column("writes/inf", ">"),
            Column("latency", ">"), Column("energy", ">"), Column("xbar kernels resident", ">"),
            Column("chip", ">"), Column("xbar area", ">"), "constraints")
    return text_table(cols, [
        (r["model"], r["preset"], f"{100 * r['flops_share']:.1f}%", r["writes"],
         si(r["latency_s"], "s"), si(r["energy_j"], "J"),
         r["kept"] if r["preset"] != "all-host" else "",
         f"{r['crossbars']} xbars" if r["crossbars"] else "",
         f"{r['chip_area_mm2']:.4g} mm2" if r["chip_area_mm2"] else "-",
         "ok" if not r["violations"] else f"BREAKS {r['violations'][0]}")
        for r in records])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,ppocr_det,digits,prim_mix")
    ap.add_argument("--host-roofline", default=None,
                    help="GFLOPS,GBPS[,W] or 'nominal' (default: measured on this machine, cached)")
    ap.add_argument("--per-kernel-crossbars", action="store_true",
                    help="score without pooled crossbar residency (the plans' own view)")
    ap.add_argument("--json", action="store_true", help="print JSON records instead of the table")
    ap.add_argument("--presets", nargs="?", const="", default=None,
                    help="the chip-preset table instead: comma-separated presets (default all)")
    ap.add_argument("--preset-models", default="resnet50,minilm_l3")
    ap.add_argument("--objective", default="energy", choices=("energy", "latency", "edp"),
                    help="cost placement objective of the preset table")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "onnx-cinm" / "real-models"),
                    help="where real_models.py keeps the pip-fetched models")
    args = ap.parse_args(argv)
    base: dict = {"crossbar_residency": not args.per_kernel_crossbars}
    if args.host_roofline:
        base["host_roofline"] = args.host_roofline
    from onnx_cinm import hostmodel

    roof = hostmodel.get(args.host_roofline)
    if args.presets is not None:
        from onnx_cinm.devices.memristor import PRESETS

        names = args.presets.split(",") if args.presets else list(PRESETS)
        recs = preset_records(args.preset_models.split(","), names, base, args.objective,
                              Path(args.cache).expanduser())
        if args.json:
            print(json.dumps(recs, indent=1))
            return 0
        print(f"host roofline: {roof.flops_per_s / 1e9:.1f} GFLOP/s, {roof.bytes_per_s / 1e9:.1f} GB/s, "
              f"{roof.power_w:g} W ({roof.source}); cost placement, objective {args.objective}; "
              "per inference, whole graph")
        print(preset_table(recs))
        return 0
    records = run(args.models.split(","), base)
    if args.json:
        print(json.dumps([{k: r[k] for k in ("model", "strategy", "objective", "latency_s", "energy_j",
                                            "writes", "transfers_bytes", "violations")} for r in records],
                         indent=1))
        return 0
    print(f"host roofline: {roof.flops_per_s / 1e9:.1f} GFLOP/s, {roof.bytes_per_s / 1e9:.1f} GB/s, "
          f"{roof.power_w:g} W ({roof.source}); crossbar residency "
          f"{'per kernel' if args.per_kernel_crossbars else 'pooled over the crossbars'}")
    print(table(records))
    print()
    for line in verdicts(records):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
