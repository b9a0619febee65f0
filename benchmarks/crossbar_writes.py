"""Crossbar writes of the CINM/OCC kernels and light ResNet50: naive (m, n, k) vs weight-stationary.

Every kernel is an ONNX model compiled by ``onnx_cinm.optimize`` twice (``cim_loop_order`` naive
and weight_stationary); the figures are the ``cim_*`` plan attributes the ``device_lowering`` pass
wrote, and ``writes_sim`` is what the crossbar simulator counted running the emitted ``.xbar``
files for two inferences through the execution provider (mean per inference, steady state:
both directions of a serpentine schedule), which must equal ``writes_opt``.

- ``writes_naive``: tile writes per inference of the naive order (a write before every use, one
  input vector per write: CINM's lowering);
- ``writes_opt``: weight-stationary with residency (tiles programmed at load stay; with more
  tiles than crossbars, ``T - P`` per inference);
- ``writes_lower_bound``: ``max(0, T - P)`` with ``T`` the tiles of all the model's kernels:
  an inference uses every tile and at most ``P`` can be resident when it starts. With several
  kernels sharing the ``P`` crossbars the optimizer pins whole kernels, so it may stay up to
  ``P`` writes above this bound (the layers run in a fixed order, so the last kernel's
  tiles left in the crossbars are never the first kernel's);
- ``mvms``, ``latency_*_s``, ``energy_*_j``: per inference, OCC's PCM cost model (field notes
  crossbar.md §1.4): the kernels are compiled for the CINM paper's chip, ``--preset pcm-occ``
  (64 x 64 x 4), not the device's default, unless ``--preset`` says otherwise.

Kernels (CINM, arXiv 2301.07486; OCC's benchmark set): matmul 8x1024 @ 1024x256 and
16x1024 @ 1024x128; mv 4096x2048 and 16384x512 (``A x`` with constant ``A``); conv-as-GEMM
25088x16 @ 16x256 and 6272x64 @ 64x256; a 3-layer MLP (batch 16, 1024-1024-1024-10), summed over
its layers; light ResNet50 (onnx wheel), summed over its crossbar kernels.

Speed: the median wall time of light ResNet50 through the execution provider (crossbar nodes in
the simulator, ideal mode; the rest in onnxruntime, UPMEM nodes in model mode) next to stock
onnxruntime on the original model, in the same process, and the simulator's own share; and the
simulator's time on ResNet50's crossbar nodes next to the same matrix products done alone by the
fastest kernel available (numpy or onnxruntime, per product), interleaved in the same run.

Usage: ``python benchmarks/crossbar_writes.py [--crossbars P] [--runs N] [--no-resnet] [--json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs
from onnx_cinm.runtime.session import InferenceSession

KERNELS = {
    "matmul_8x1024x256": [(8, 1024, 256)],
    "matmul_16x1024x128": [(16, 1024, 128)],
    "mv_4096x2048": "mv:4096x2048",
    "mv_16384x512": "mv:16384x512",
    "conv_25088x16x256": [(25088, 16, 256)],
    "conv_6272x64x256": [(6272, 64, 256)],
    "mlp3_b16_1024": [(16, 1024, 1024), (16, 1024, 1024), (16, 1024, 10)],
}


def _chain_model(layers, seed=0) -> onnx.ModelProto:
    """X[M, K0] @ W0 @ W1 ... with constant weights (a ReLU between layers, as in an MLP)."""
    rng = np.random.default_rng(seed)
    M, K = layers[0][0], layers[0][1]
    nodes, inits, cur = [], [], "X"
    for i, (_, k, n) in enumerate(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"P{i}"], name=f"layer{i}"))
        cur = f"P{i}"
        if i + 1 < len(layers):
            nodes.append(helper.make_node("Relu", [cur], [f"R{i}"], name=f"relu{i}"))
            cur = f"R{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [M, layers[-1][2]])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _mv_model(rows: int, cols: int, seed=0) -> onnx.ModelProto:
    """y = A x with a constant A[rows, cols] (MatMul A[M, K] b[K] -> cinm.Gemv)."""
    rng = np.random.default_rng(seed)
    A = numpy_helper.from_array(rng.standard_normal((rows, cols)).astype(np.float32), "A")
    g = helper.make_graph([helper.make_node("MatMul", ["A", "x"], ["y"], name="mv")], "mv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [cols])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows])], [A])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


#: The crossbar chip preset the kernels are compiled for (``--preset``).
PRESET = "pcm-occ"


def _plans(model, order: str, P: int | None) -> list[dict]:
    opts = {"cim_loop_order": order, "cim_preset": PRESET}
    if P:
        opts["cim_crossbars"] = P
    hints = [] if isinstance(model, (str, Path)) else [("layer*", "memristor"), ("mv", "memristor"),
                                                          ("relu*", "host")]
    # the paper heuristic: every large matmul with constant weights on the crossbars
    res = optimize(model, check=0, device_options=opts, place=hints, placement="heuristic")
    return res, [a for _, _, dev, a in res.stats.get("device_lowering", {}).get("plans", [])
                 if dev == "memristor"]


def _simulated_writes(res, workdir: Path, runs: int = 2) -> float:
    path = workdir / "k.onnx"
    artifacts.save(res.model, path)
    sess = InferenceSession(path)
    feeds = random_inputs(res.model, seed=0)
    for _ in range(runs):
        sess.run(None, feeds)
    xb = [r for r in sess.profile() if r["device"] == "memristor"]
    return sum(r["writes"] for r in xb) / runs


def _crossbars(P: int | None) -> int:
    from onnx_cinm.devices import get_device

    return P or get_device("memristor").preset(PRESET).crossbars


def record(kernel: str, model, P: int | None, workdir: Path) -> dict:
    """One benchmark record for ``model`` (see the module docstring for the fields)."""
    res_opt, opt = _plans(model, "weight_stationary", P)
    _, naive = _plans(model, "naive", P)
    if not opt:
        raise SystemExit(f"{kernel}: no node went to the crossbars")
    first = opt[0]
    rec = {"kernel": kernel, "M": first["cim_M"], "K": first["cim_K"], "N": opt[-1]["cim_N"],
           "kernels": len(opt), "tiles": sum(a["cim_tiles"] for a in opt),
           "writes_naive": sum(a["cim_writes"] for a in naive),
           "writes_opt": sum(a["cim_writes"] for a in opt),
           "writes_lower_bound": max(0, sum(a["cim_tiles"] for a in opt) - _crossbars(P)),
           "writes_load": sum(a["cim_writes_load"] for a in opt),
           "mvms": sum(a["cim_mvms"] for a in opt),
           "latency_naive_s": sum(a["cim_latency_s"] for a in naive),
           "latency_opt_s": sum(a["cim_latency_s"] for a in opt),
           "energy_naive_j": sum(a["cim_energy_j"] for a in naive),
           "energy_opt_j": sum(a["cim_energy_j"] for a in opt)}
    rec["writes_sim"] = _simulated_writes(res_opt, workdir)
    return rec


def resnet_speed(path: Path, runs: int, workdir: Path) -> dict:
    """Median wall time of light ResNet50 through the provider vs onnxruntime on the original
    (see ``runtime_overhead.measure``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runtime_overhead import measure

    feeds = random_inputs(onnx.load(str(path), load_external_data=False), seed=0)
    return measure(path, feeds, runs, workdir, "light_resnet50")


def simulator_speed(path: Path, feeds: dict, runs: int) -> dict:
    """The crossbar simulator next to the bare matrix products it computes, in one process.

    Runs the optimized model at ``path`` once through the provider with ``matmul=numpy`` (the
    simulator's own product path for every crossbar node; under ``auto`` the products of
    Im2Col patches run as onnxruntime convolutions, which ``runtime_overhead.py`` times),
    keeping the inputs of every crossbar node; then, interleaved ``runs`` times under the session's BLAS limit: every
    crossbar kernel on its inputs (the simulator with its layout glue), and each node's product
    ``A @ B`` (+ bias) alone through numpy (into an output array kept across rounds, as the
    simulator and onnxruntime's arena keep theirs) and through onnxruntime's MatMul. Each of the
    three runs the whole sequence of products on its own: timing the two kernels back to back
    on one product would give the second its operands already in the cache (on light
    SqueezeNet that made the per-product "fastest" half of either kernel's own total).
    Returns medians in seconds: ``simulator_s``, ``numpy_s``, ``onnxruntime_s``,
    ``fastest_s`` (per product the faster kernel's time in its own sequence, summed) and
    ``ratio`` (simulator / fastest), plus the ``config``.
    """
    import onnxruntime as ort

    # matmul=numpy: every crossbar product through the simulator's own product path (under
    # "auto" a product of Im2Col patches runs as one onnxruntime convolution, which no
    # kernel of the simulator computes: runtime_overhead.py measures that path)
    sess = InferenceSession(path, providers=["CinmExecutionProvider", "CPUExecutionProvider"],
                            provider_options=[{"matmul": "numpy"}, {}])
    captured = []
    for d in sess._device_nodes:  # noqa: SLF001 - a benchmark may look inside
        if d.device == "memristor":
            inner = d.kernel

            def rec(ins, _k=inner, _n=d.node):
                captured.append((_k, _n, list(ins)))
                return _k(ins)
            d.kernel = rec
    sess.run(None, feeds)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = max(sess.configuration()["blas_threads"], 1)
    f = TensorProto.FLOAT
    mm = ort.InferenceSession(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], "mm",
        [helper.make_tensor_value_info("A", f, None), helper.make_tensor_value_info("B", f, None)],
        [helper.make_tensor_value_info("Y", f, None)]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString(), so,
        providers=["CPUExecutionProvider"])
    prods = [(np.ascontiguousarray(ins[0], np.float32), np.ascontiguousarray(ins[1], np.float32),
              None if len(ins) < 3 or ins[2] is None else np.asarray(ins[2], np.float32))
             for _, _, ins in captured]
    outs = [np.matmul(A, B) for A, B, _ in prods]  # numpy's outputs, kept across rounds
    times: dict = {"simulator": [], "numpy": [], "onnxruntime": [], "fastest": []}
    with sess._kernels.active():  # noqa: SLF001 - the same BLAS limit as the provider's runs
        for _ in range(runs + 1):  # the first round warms up (and lets "auto" choose)
            t = time.perf_counter()
            for k, _, ins in captured:
                k(ins)
            sim = time.perf_counter() - t
            per_np, per_ort = [], []
            for (A, B, C), Y in zip(prods, outs):
                t = time.perf_counter()
                np.matmul(A, B, out=Y)
                if C is not None:
                    Y += C
                per_np.append(time.perf_counter() - t)
            for A, B, C in prods:
                t = time.perf_counter()
                Y = mm.run(None, {"A": A, "B": B})[0]
                if C is not None:
                    Y += C
                per_ort.append(time.perf_counter() - t)
            times["simulator"].append(sim)
            times["numpy"].append(sum(per_np))
            times["onnxruntime"].append(sum(per_ort))
            times["fastest"].append(sum(min(a, b) for a, b in zip(per_np, per_ort)))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    return {"runs": runs, "products": len(prods), "simulator_s": med["simulator"],
            "numpy_s": med["numpy"], "onnxruntime_s": med["onnxruntime"],
            "fastest_s": med["fastest"], "ratio": med["simulator"] / med["fastest"],
            "config": sess.configuration()}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crossbars", type=int, default=None, help="P (default: the preset's, 4)")
    ap.add_argument("--preset", default="pcm-occ", help="crossbar chip preset (default pcm-occ, "
                    "the CINM paper's)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of light ResNet50")
    ap.add_argument("--no-resnet", action="store_true", help="skip light ResNet50")
    ap.add_argument("--json", action="store_true", help="print the records as JSON")
    args = ap.parse_args(argv)
    global PRESET
    PRESET = args.preset
    recs, speed = [], None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, spec in KERNELS.items():
            if isinstance(spec, str):
                rows, cols = map(int, spec.split(":")[1].split("x"))
                model = _mv_model(rows, cols)
            else:
                model = _chain_model(spec)
            recs.append(record(name, model, args.crossbars, work))
            if not args.json:
                print(f"  {name} done", file=sys.stderr)
        if not args.no_resnet:
            light = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light/light_resnet50.onnx"
            recs.append(record("light_resnet50", str(light), args.crossbars, work))
            speed = resnet_speed(light, args.runs, work)
            feeds = random_inputs(onnx.load(str(light), load_external_data=False), seed=0)
            speed["products"] = simulator_speed(work / "light_resnet50.onnx", feeds, args.runs)
    if args.json:
        print(json.dumps({"kernels": recs, "speed": speed}, indent=1))
        return recs
    hdr = (f"{'kernel':20} {'tiles':>6} {'naive':>9} {'opt':>6} {'sim':>7} {'bound':>6} {'load':>5} "
           f"{'ratio':>7} {'lat naive':>10} {'lat opt':>10} {'E naive':>10} {'E opt':>10}")
    print("tile writes per inference (steady state); latency s, energy J per inference")
    print(hdr)
    for r in recs:
        ratio = r["writes_naive"] / r["writes_opt"] if r["writes_opt"] else float("inf")
        print(f"{r['kernel']:20} {r['tiles']:6d} {r['writes_naive']:9d} {r['writes_opt']:6d} "
              f"{r['writes_sim']:7.1f} {r['writes_lower_bound']:6d} {r['writes_load']:5d} {ratio:7.1f} "
              f"{r['latency_naive_s']:10.3e} {r['latency_opt_s']:10.3e} "
              f"{r['energy_naive_j']:10.3e} {r['energy_opt_j']:10.3e}")
    if speed:
        print(f"\nlight ResNet50, median of {speed['runs']}: provider (crossbar simulator + onnxruntime) "
              f"{speed['provider_s'] * 1e3:.0f} ms, onnxruntime on the original "
              f"{speed['onnxruntime_s'] * 1e3:.0f} ms, ratio {speed['ratio']:.1f}x "
              f"(simulator {speed['simulator_s'] * 1e3:.0f} ms: median per run)")
        p = speed["products"]
        print(f"crossbar products of light ResNet50 ({p['products']} nodes), median of {p['runs']} "
              f"interleaved: simulator {p['simulator_s'] * 1e3:.0f} ms, numpy alone "
              f"{p['numpy_s'] * 1e3:.0f} ms, onnxruntime alone {p['onnxruntime_s'] * 1e3:.0f} ms, "
              f"fastest per product {p['fastest_s'] * 1e3:.0f} ms: ratio {p['ratio']:.2f} "
              f"(BLAS threads {p['config']['blas_threads']}, products {p['config']['matmul']})")
    return recs


if __name__ == "__main__":
    main()
