"""Crossbar writes of the CINM/OCC kernels: naive (m, n, k) vs weight-stationary (k, n, m).

Prints a table (or, with ``--json``, a list of records) per kernel: tile counts, writes per
inference for the naive order (a write before every use, one vector per write: CINM's lowering)
and for the weight-stationary order with residency, the lower bound ``max(0, T - P)`` for a
steady inference, writes at load, MVMs, and the modeled latency and energy of one inference of
each order. Every figure comes from :func:`onnx_cinm.devices.memristor.schedule.plan` (the
simulator's counters equal them; ``tests/test_crossbar_sim.py``).

Kernels (CINM, arXiv 2301.07486, and OCC's benchmark set, field notes crossbar.md §1.4):
matmul 8x1024 @ 1024x256 and 16x1024 @ 1024x128; mv 4096x2048 and 16384x512 (a Gemv ``A x`` with
constant ``A``: programmed as ``A^T``, one streamed vector); conv-as-GEMM 25088x16 @ 16x256 and
6272x64 @ 64x256; a 3-layer MLP (batch 16, 1024-1024-1024-10), summed over its layers.

Usage: ``python benchmarks/crossbar_writes.py [--crossbars P] [--preset pcm-occ|reram-isaac]
[--json]``. Light ResNet50 is not covered yet (it needs the ``cim_tiling`` pass over a model).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from onnx_cinm.devices.memristor import PRESETS
from onnx_cinm.devices.memristor.schedule import plan

KERNELS = {
    "matmul_8x1024x256": [(8, 1024, 256)],
    "matmul_16x1024x128": [(16, 1024, 128)],
    "mv_4096x2048": [(1, 2048, 4096)],
    "mv_16384x512": [(1, 512, 16384)],
    "conv_25088x16x256": [(25088, 16, 256)],
    "conv_6272x64x256": [(6272, 64, 256)],
    "mlp3_b16_1024": [(16, 1024, 1024), (16, 1024, 1024), (16, 1024, 10)],
}


def record(kernel: str, layers, params) -> dict:
    rec = {"kernel": kernel, "M": layers[0][0], "K": layers[0][1], "N": layers[-1][2],
           "tiles": 0, "writes_naive": 0, "writes_opt": 0, "writes_lower_bound": 0,
           "writes_load": 0, "mvms": 0, "latency_naive_s": 0.0, "latency_opt_s": 0.0,
           "energy_naive_j": 0.0, "energy_opt_j": 0.0}
    for M, K, N in layers:
        ws, nv = plan(M, K, N, params), plan(M, K, N, params, "naive")
        cw, cn = ws.cost(params), nv.cost(params)
        rec["tiles"] += ws.tiles
        rec["writes_naive"] += nv.writes_per_inference
        rec["writes_opt"] += ws.writes_per_inference
        rec["writes_lower_bound"] += ws.writes_lower_bound
        rec["writes_load"] += ws.writes_load
        rec["mvms"] += ws.mvms
        rec["latency_naive_s"] += cn.latency_s
        rec["latency_opt_s"] += cw.latency_s
        rec["energy_naive_j"] += cn.energy_j
        rec["energy_opt_j"] += cw.energy_j
    return rec


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crossbars", type=int, default=None, help="P (default: the preset's, 4)")
    ap.add_argument("--preset", default="pcm-occ", choices=sorted(PRESETS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    params = PRESETS[args.preset]
    if args.crossbars:
        params = replace(params, crossbars=args.crossbars)
    recs = [record(k, layers, params) for k, layers in KERNELS.items()]
    if args.json:
        print(json.dumps(recs, indent=1))
        return recs
    print(f"preset {params.name}, {params.rows}x{params.cols} tiles, P={params.crossbars}; writes per "
          "inference (steady state), tile writes")
    hdr = (f"{'kernel':22} {'tiles':>6} {'naive':>9} {'opt':>6} {'bound':>6} {'load':>5} "
           f"{'ratio':>7} {'lat naive':>10} {'lat opt':>10} {'E naive':>10} {'E opt':>10}")
    print(hdr)
    for r in recs:
        ratio = r["writes_naive"] / r["writes_opt"] if r["writes_opt"] else float("inf")
        print(f"{r['kernel']:22} {r['tiles']:6d} {r['writes_naive']:9d} {r['writes_opt']:6d} "
              f"{r['writes_lower_bound']:6d} {r['writes_load']:5d} {ratio:7.1f} "
              f"{r['latency_naive_s']:10.3e} {r['latency_opt_s']:10.3e} "
              f"{r['energy_naive_j']:10.3e} {r['energy_opt_j']:10.3e}")
    return recs


if __name__ == "__main__":
    main()
