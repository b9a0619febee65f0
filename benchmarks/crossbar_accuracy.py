"""Digits-MLP test accuracy on simulated crossbars: fp32 (ideal) vs quantized modes, side by side.

The MLP of :func:`onnx_cinm.examples.digits.build_digits_mlp` (64-64-32-10, scikit-learn, 450
test images) runs with its three MatMuls as emitted ``.xbar`` kernels (64 x 64 crossbars, 4 of
them, weight-stationary) in :class:`onnx_cinm.sim.crossbar.CrossbarSimulator`; bias, ReLU and
argmax run in numpy. Every mode is a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode`
(definitions and sources in that module). Tables:

1. accuracy (%) by ``weight_bits`` (rows; ``cell_bits`` 2, differential, 8-bit DAC) and
   ``adc_bits`` (columns; 0 = ideal ADC);
2. read noise: ``noise_sigma`` on top of q8 (8-bit weights, DAC, ADC), mean and min/max over
   ``--seeds`` seeds;
3. DAC bits, cell bits, and differential pairs vs offset encoding, on q8.

Usage: ``python benchmarks/crossbar_accuracy.py [--seeds 5] [--json]``. About 5 s (most of it
training the MLP).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from onnx import numpy_helper

from onnx_cinm.devices.memristor import PCM_OCC
from onnx_cinm.devices.memristor.codegen import emit_kernel
from onnx_cinm.devices.memristor.nonideal import Q8
from onnx_cinm.paradigms.cim.schedule import plan
from onnx_cinm.examples.digits import build_digits_mlp
from onnx_cinm.sim.crossbar import CrossbarSimulator
from onnx_cinm.sim.crossbar.mode import CrossbarMode


def mlp_layers(model):
    """``[(W [K, N], bias [N])]`` of the MatMul/Add pairs, and the class labels."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type == "MatMul":
            layers.append([inits[node.input[1]], None])
        elif node.op_type == "Add":
            layers[-1][1] = inits[node.input[1]]
    return layers, inits["classes"]


def accuracy(layers, classes, X, y, mode, outdir: Path) -> float:
    """Test accuracy in [0, 1] with every MatMul run as a ``.xbar`` kernel in ``mode``."""
    h = X
    for i, (W, b) in enumerate(layers):
        pl = plan(h.shape[0], W.shape[0], W.shape[1], PCM_OCC, "weight_stationary")
        path = emit_kernel(pl, PCM_OCC, W, outdir, f"layer{i}", mode=mode)[0]
        out, _ = CrossbarSimulator(path).run({"X": h})
        h = out["Y"][0] + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0)
    return float((classes[h.argmax(axis=1)] == y).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="noise seeds per noise level")
    ap.add_argument("--json", action="store_true", help="print records as JSON")
    args = ap.parse_args(argv)
    d = build_digits_mlp()
    layers, classes = mlp_layers(d.model)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(table, mode, **keys):
            t = time.perf_counter()
            acc = accuracy(layers, classes, d.X_test, d.y_test, mode, Path(tmp))
            rec = {"table": table, **keys, "mode": None if mode is None else mode.__dict__,
                   "accuracy": acc, "wall_s": time.perf_counter() - t}
            records.append(rec)
            return acc

        fp32 = run("fp32", None)
        wbits, abits = (8, 6, 5, 4, 3), (0, 8, 6, 5, 4)
        grid = {(w, a): run("bits", CrossbarMode("quantized", weight_bits=w, cell_bits=2,
                                                 adc_bits=a), weight_bits=w, adc_bits=a)
                for w in wbits for a in abits}
        sigmas = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
        noise = {s: [run("noise", replace(Q8, noise_sigma=s, seed=k), noise_sigma=s, seed=k)
                     for k in range(args.seeds if s else 1)] for s in sigmas}
        other = {}
        for label, m in [("q8", Q8), ("dac 0 (ideal)", replace(Q8, dac_bits=0)),
                         ("dac 6", replace(Q8, dac_bits=6)), ("dac 4", replace(Q8, dac_bits=4)),
                         ("cell_bits 1", replace(Q8, cell_bits=1)),
                         ("cell_bits 4", replace(Q8, cell_bits=4)),
                         ("cell_bits 8 (no slicing)", replace(Q8, cell_bits=8)),
                         ("offset (differential off)", replace(Q8, differential=False)),
                         ("offset, adc_range 0.5", replace(Q8, differential=False, adc_range=0.5)),
                         ("adc_range 0.5", replace(Q8, adc_range=0.5))]:
            other[label] = run("other", m, label=label)
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    print(f"digits MLP, {len(d.y_test)} test images; scikit-learn {100 * d.accuracy:.2f} %, "
          f"ideal crossbars {100 * fp32:.2f} %\n")
    print("accuracy % by weight_bits (rows) and adc_bits (columns; 0 = ideal ADC); cell_bits 2, "
          "differential, dac_bits 8")
    print("weight_bits " + "".join(f"{'adc ' + str(a):>9}" for a in abits))
    for w in wbits:
        print(f"{w:>11} " + "".join(f"{100 * grid[w, a]:>9.2f}" for a in abits))
    print(f"\nread noise on q8 (8-bit weights, DAC, ADC), {args.seeds} seeds")
    print(f"{'noise_sigma':>11} {'mean %':>8} {'min %':>8} {'max %':>8}")
    for s, accs in noise.items():
        a = 100 * np.array(accs)
        print(f"{s:>11} {a.mean():>8.2f} {a.min():>8.2f} {a.max():>8.2f}")
    print("\nvariants of q8")
    for label, a in other.items():
        print(f"{label:>26} {100 * a:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
