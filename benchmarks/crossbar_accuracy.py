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

4. accuracy over time on each chip preset (``--presets``, the default too): the digits MLP and
   a small CNN trained here in numpy on the same digits (conv 3x3 x 8, ReLU, 2x2 max-pool,
   dense 72 -> 10), each optimized with its products on the preset's crossbars and run through
   the execution provider by :class:`onnx_cinm.runtime.evaluate.Evaluator` (what
   ``onnx-cinm evaluate`` runs) in the preset's ``device`` data path, at 1 s, 1 h, 1 day and
   1 year after programming, with and without global drift compensation; mean and min/max over
   ``--seeds`` seeds, next to the published trend the device should follow (:data:`TRENDS`).
   Then the device model alone (:func:`float_drift_reference`): the CNN's float weights drifted
   directly for a year, without and with one compensation factor per layer, which tells what
   the drift law does from what the crossbar simulation adds.

``--plot FILE.png`` draws table 4: one panel per model and preset, accuracy against the time
after programming (log scale), with and without drift compensation, bars from min to max over
the seeds, the onnxruntime accuracy of the original as a dotted line.

Usage: ``python benchmarks/crossbar_accuracy.py [--seeds 5] [--json] [--tables quant,presets]
[--plot FILE.png]``.
Tables 1-3 take about 5 s (most of it training the MLP); table 4 a few minutes on 2 busy cores.
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


#: The published trend each device model should follow over time, and its source.
TRENDS = {
    "pcm-joshi2020": (
        "PCM: accuracy falls with time without compensation; global drift compensation "
        "recovers most of it. Joshi et al., Nat. Commun. 11:2473 (2020): ResNet-32 on PCM "
        "hardware above 93.5 % over one day with compensation, while without it mean "
        "conductances shrink to 0.66-0.77 in a day (field notes chips.md 2.1, 2.8); a two-layer "
        "MNIST perceptron on simulated PCM: 9.14 % error after five years of drift with "
        "standard hardware-aware training (AICAS 2025, 'Drift-aware regularization for "
        "long-term stability in PCM based neural network implementations', TU Dresden)"),
    "pcm-hermes-1dev": (
        "PCM (HERMES devices): the same trend as above, with drift exponents of 0.02-0.13 "
        "(chips.md 2.2); HERMES reports near-software accuracy with its calibration "
        "(chips.md 2.8)"),
    "rram-wan2022": (
        "RRAM (Wan et al., Nature 2022): no conductance drift law, so compensation changes "
        "nothing; the programming spread widens from 1 s to 1 day (chips.md 2.4), so accuracy "
        "dips by then and stays; NeuRRAM measured 99.0 % on MNIST with 4-bit weights "
        "(chips.md 2.8)"),
}
TIMES = (("1 s", 1.0), ("1 h", 3600.0), ("1 d", 86400.0), ("1 y", 365.25 * 86400.0))


def _patches(X):
    """``X`` ``[n, 64]`` (8x8 images) -> the 3x3 patches ``[n, 36, 9]`` of the CNN's conv."""
    img = X.reshape(len(X), 8, 8)
    return np.stack([img[:, i:i + 3, j:j + 3].reshape(len(X), 9)
                     for i in range(6) for j in range(6)], axis=1)


def cnn_predict(params, X) -> np.ndarray:
    """Classes ``[n]`` of images ``X`` (``[n, 64]`` or ``[n, 1, 8, 8]``) by the CNN of
    :func:`train_cnn` with ``params = (Wc, bc, Wd, bd)``, in float64 numpy."""
    Wc, bc, Wd, bd = (np.asarray(p, np.float64) for p in params)
    n = len(X)
    a1 = np.maximum(_patches(np.asarray(X, np.float64).reshape(n, 64)) @ Wc + bc, 0)
    pooled = a1.reshape(n, 3, 2, 3, 2, 8).max(axis=(2, 4))
    return (pooled.transpose(0, 3, 1, 2).reshape(n, 72) @ Wd + bd).argmax(axis=1)


def float_drift_reference(params, X, y, device_model: str, t_s: float, seeds: int):
    """Accuracy of the CNN with its float weights drifted directly, no crossbar: each weight
    times ``((t + t0) / t0)^-nu``, ``nu`` drawn per weight from its magnitude over its column's
    largest (the device's per-column mapping) by :func:`physics.drift_exponents`, and with global
    compensation one :func:`physics.gdc_factor` per layer. No tiles, slices, quantization, ADC
    or other effect: what the device model alone does. Returns ``(off, on)``, lists over seeds."""
    from onnx_cinm.sim.crossbar import physics

    model = physics.DEVICE_MODELS[device_model]
    off, on = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        drifted, factors = [], []
        for k, p in enumerate(params):
            p = np.asarray(p, np.float64)
            if k % 2 == 0:  # the weights Wc, Wd; biases stay digital
                x = np.abs(p) / np.where(np.abs(p).max(axis=0) > 0, np.abs(p).max(axis=0), 1.0)
                dp = physics.drift(p, physics.drift_exponents(x, model, rng), t_s, model)
                factors.append(physics.gdc_factor(p, dp))
                p = dp
            drifted.append(p)
        off.append(float(np.mean(cnn_predict(drifted, X) == y)))
        comp = [p * factors[k // 2] if k % 2 == 0 else p for k, p in enumerate(drifted)]
        on.append(float(np.mean(cnn_predict(comp, X) == y)))
    return off, on


def train_cnn(X_train, y_train, epochs: int = 40, seed: int = 0):
    """A small CNN on 8x8 digits, trained with numpy (SGD with momentum, cross-entropy):
    conv 3x3 (1 -> 8 channels, no padding) + ReLU -> 2x2 max-pool -> flatten (channel-major,
    as ONNX's Flatten) -> dense 72 -> 10. ``X_train`` float32 ``[N, 64]`` in [0, 1]. Returns
    ``(Wc [9, 8], bc [8], Wd [72, 10], bd [10])``."""
    rng = np.random.default_rng(seed)
    n = len(X_train)
    cols = _patches(X_train)
    Wc = rng.standard_normal((9, 8)) * np.sqrt(2 / 9)
    bc = np.zeros(8)
    Wd = rng.standard_normal((72, 10)) * np.sqrt(2 / 72)
    bd = np.zeros(10)
    params = [Wc, bc, Wd, bd]
    vel = [np.zeros_like(p) for p in params]
    onehot = np.eye(10)[y_train]
    for _ in range(epochs):
        order = rng.permutation(n)
        for lo in range(0, n, 32):
            idx = order[lo:lo + 32]
            b = len(idx)
            z1 = cols[idx] @ Wc + bc                           # [b, 36, 8]
            a1 = np.maximum(z1, 0).reshape(b, 3, 2, 3, 2, 8)
            pooled = a1.max(axis=(2, 4))                      # [b, 3, 3, 8]
            mask = a1 == pooled[:, :, None, :, None, :]
            flat = pooled.transpose(0, 3, 1, 2).reshape(b, 72)  # channel-major
            logits = flat @ Wd + bd
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            dl = (p - onehot[idx]) / b
            dflat = dl @ Wd.T
            dpool = dflat.reshape(b, 8, 3, 3).transpose(0, 2, 3, 1)
            da1 = (mask * dpool[:, :, None, :, None, :]).reshape(b, 36, 8)
            dz1 = da1 * (z1 > 0)
            grads = [cols[idx].reshape(-1, 9).T @ dz1.reshape(-1, 8), dz1.sum(axis=(0, 1)),
                     flat.T @ dl, dl.sum(axis=0)]
            for prm, v, g in zip(params, vel, grads):
                v *= 0.9
                v -= 0.05 * g
                prm += v
    return [p.astype(np.float32) for p in params]


def cnn_model(Wc, bc, Wd, bd):
    """The trained CNN as ONNX: input ``X`` float32 ``[batch, 1, 8, 8]``, output ``logits``
    ``[batch, 10]`` (Conv, Relu, MaxPool, Flatten, Gemm; opset 17)."""
    from onnx import TensorProto, helper

    W = Wc.T.reshape(8, 1, 3, 3)  # Wc[di * 3 + dj, f] -> W[f, 0, di, dj]
    nodes = [helper.make_node("Conv", ["X", "Wc", "bc"], ["c"], name="conv", kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "Wd", "bd"], ["logits"], name="dense")]
    g = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((W, "Wc"), (bc, "bc"), (Wd, "Wd"),
                                                     (bd, "bd"))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def digits_cnn(seed: int = 0):
    """``(model, X_test [450, 1, 8, 8], y_test, params)``: the CNN trained on the MLP's split of
    scikit-learn's digits (``train_test_split(X / 16, y, test_size=0.25, random_state=0)``) and
    its float32 ``(Wc, bc, Wd, bd)``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
    params = train_cnn(X_tr, y_tr, seed=seed)
    return (cnn_model(*params), X_te.astype(np.float32).reshape(-1, 1, 8, 8),
            y_te.astype(np.int64), params)


#: The device effects of table 4: the ``device`` mode's own (which leaves out MNSIM's unsourced
#: ``stuck`` cells, :data:`onnx_cinm.devices.memristor.nonideal.NAMED`) but IR drop, which does
#: not change with time and whose first-order model builds a rows x columns current map per
#: input row (minutes per configuration on 256 x 256 tiles)
TIME_EFFECTS = ("prog", "drift", "read1f", "gdc")


def preset_table(seeds: int, records: list, tmp: Path, effects=TIME_EFFECTS) -> None:
    """Table 4: accuracy at :data:`TIMES` with and without drift compensation, per preset and
    model, through :class:`~onnx_cinm.runtime.evaluate.Evaluator` (data path ``device`` with
    ``effects``); appends records."""
    import onnxruntime as ort

    from onnx_cinm import artifacts
    from onnx_cinm.devices.memristor.presets import PRESETS
    from onnx_cinm.pipeline import optimize
    from onnx_cinm.runtime.evaluate import Evaluator, summarize
    from onnx_cinm.sim.crossbar.physics import DEVICE_MODELS

    d = build_digits_mlp()
    cnn, Xc, yc, cnn_params = digits_cnn()
    models = {"digits MLP": (d.model, {"X": d.X_test}, d.y_test),
              "digits CNN": (cnn, {"X": Xc}, yc)}
    seen_trends = []
    for model_name, (model, data, labels) in models.items():
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        out = ref.run(None, data)
        pred = out[0] if out[0].dtype.kind in "iu" else out[0].argmax(axis=1)
        exact = float(np.mean(pred.reshape(-1) == labels))
        print(f"\n{model_name}: {len(labels)} test images, onnxruntime on the original "
              f"{100 * exact:.2f} %; each preset's device data path (--cim-mode device "
              f"--cim-effects {','.join(effects)}), {seeds} seeds, accuracy % mean [min, max]")
        head = f"{'preset':<13} {'device model':<16} {'compensation':<12}" + "".join(
            f"{label:>21}" for label, _ in TIMES)
        print(head + "\n" + "-" * len(head))
        for name, chip in PRESETS.items():
            t = time.perf_counter()
            res = optimize(model, check=0, place=[("Gemm", "memristor")],
                           device_options={"cim_preset": name}, dims={"batch": 256})
            path = tmp / f"{model_name.replace(' ', '_')}_{name}.onnx"
            artifacts.save(res.model, path)
            ev = Evaluator(str(path), data, labels,
                           options={"cim_mode": "device", "cim_effects": tuple(effects)})
            recs = [ev.run(p) for p in ev.points(times=[v for _, v in TIMES], seeds=seeds)]
            summ = {(s["value"], s["compensation"]): s for s in summarize(recs)}
            for comp in (False, True):
                cells = "".join(
                    f"{_cell(summ[v, comp]):>21}" for _, v in TIMES)
                print(f"{name:<13} {chip.device_model:<16} {'on' if comp else 'off':<12}{cells}")
            first, last = TIMES[0][1], TIMES[-1][1]
            fresh, off, on = (100 * summ[first, False]["mean"], 100 * summ[last, False]["mean"],
                              100 * summ[last, True]["mean"])
            if abs(on - off) < 0.05:
                recovered = "compensation changes nothing (no drift)"
            elif fresh - off > 0.5:
                recovered = f"compensation recovers {100 * (on - off) / (fresh - off):.0f} % of the loss"
            else:
                recovered = "no loss to recover"
            print(f"{'':<13} {TIMES[-1][0]} vs {TIMES[0][0]}: {off - fresh:+.1f} points without "
                  f"compensation, {on - fresh:+.1f} with; {recovered}")
            if chip.device_model not in seen_trends:
                seen_trends.append(chip.device_model)
            records += [{"table": "presets", "model": model_name, "preset": name,
                         "device_model": chip.device_model, "exact": exact, **r} for r in recs]
            records.append({"table": "presets-wall", "model": model_name, "preset": name,
                            "wall_s": time.perf_counter() - t})
    # the device model alone, on the CNN's float weights: tells the device physics from the
    # crossbar simulation (docs/crossbar-presets.md, "Drift and its compensation")
    ref_seeds = max(seeds, 40)
    print(f"\ndigits CNN, float weights drifted directly (no crossbar, drift only, {TIMES[-1][0]}, "
          f"{ref_seeds} seeds): accuracy % mean without / with one compensation factor per layer")
    for dm in (dm for dm in seen_trends if DEVICE_MODELS[dm].drifts):
        off, on = float_drift_reference(cnn_params, Xc, yc, dm, TIMES[-1][1], ref_seeds)
        print(f"  {dm:<16} {100 * np.mean(off):.1f} / {100 * np.mean(on):.1f}")
        records.append({"table": "float-drift-reference", "model": "digits CNN",
                        "device_model": dm, "time_s": TIMES[-1][1], "off": off, "on": on})
    print("\npublished trends:")
    for dm in seen_trends:
        print(f"  {dm}: {TRENDS.get(dm, 'no published trend recorded')}")


def plot_presets(records: list, path: Path) -> None:
    """Write table 4 as a PNG to ``path``: a grid of panels (rows: models, columns: presets),
    accuracy (%) against time after programming (s, log x), compensation off and on, bars from
    min to max over seeds, the exact (onnxruntime) accuracy dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from onnx_cinm.runtime.evaluate import summarize

    rows = [r for r in records if r["table"] == "presets"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, axes = plt.subplots(len(models), len(presets), figsize=(3.2 * len(presets), 2.8 * len(models)),
                             squeeze=False, sharex=True, sharey="row")
    for i, model in enumerate(models):
        for j, preset in enumerate(presets):
            ax = axes[i][j]
            recs = [r for r in rows if r["model"] == model and r["preset"] == preset]
            summ = summarize(recs)
            for comp, style in ((False, "o-"), (True, "s--")):
                ss = sorted((s for s in summ if s["compensation"] is comp), key=lambda s: s["value"])
                t = np.array([s["value"] for s in ss])
                m = 100 * np.array([s["mean"] for s in ss])
                err = [m - 100 * np.array([s["min"] for s in ss]),
                       100 * np.array([s["max"] for s in ss]) - m]
                ax.errorbar(t, m, yerr=err, fmt=style, capsize=2, markersize=4,
                            label=f"compensation {'on' if comp else 'off'}")
            ax.axhline(100 * recs[0]["exact"], color="grey", linestyle=":", label="onnxruntime")
            ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{model}, {preset}", fontsize=9)
            if i == len(models) - 1:
                ax.set_xlabel("time after programming (s)")
            if j == 0:
                ax.set_ylabel("accuracy (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cell(s: dict) -> str:
    return f"{100 * s['mean']:.1f} [{100 * s['min']:.1f}, {100 * s['max']:.1f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="noise seeds per noise level")
    ap.add_argument("--json", action="store_true", help="print records as JSON")
    ap.add_argument("--tables", default="quant,presets",
                    help="which tables: quant (1-3), presets (4), or both")
    ap.add_argument("--effects", default=",".join(TIME_EFFECTS),
                    help="device effects of table 4 (add irdrop for IR drop: much slower)")
    ap.add_argument("--plot", type=Path, metavar="FILE.png",
                    help="also draw table 4 (accuracy against time, per model and preset)")
    args = ap.parse_args(argv)
    if args.plot and "presets" not in args.tables.split(","):
        ap.error("--plot draws table 4: add presets to --tables")
    if args.plot and not args.plot.parent.is_dir():
        ap.error(f"--plot: folder '{args.plot.parent}' does not exist")
    tables = set(args.tables.split(","))
    records = []
    if "quant" in tables:
        quant_tables(args, records)
    if "presets" in tables:
        with tempfile.TemporaryDirectory() as tmp:
            if args.json:
                import contextlib
                import io

                with contextlib.redirect_stdout(io.StringIO()):
                    preset_table(args.seeds, records, Path(tmp), args.effects.split(","))
            else:
                preset_table(args.seeds, records, Path(tmp), args.effects.split(","))
    if args.plot:
        plot_presets(records, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        print(json.dumps(records, indent=1))
    return 0


def quant_tables(args, records: list) -> None:
    """Tables 1-3 (quantization, read noise, variants of q8) on the digits MLP's kernels."""
    d = build_digits_mlp()
    layers, classes = mlp_layers(d.model)
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
        return
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


if __name__ == "__main__":
    raise SystemExit(main())
