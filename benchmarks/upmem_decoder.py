"""Transformer decoder layers on UPMEM with the weights resident in MRAM.

LLM decoding is GEMV-heavy: at batch 1 every token multiplies a vector by every weight matrix
of the layer. UPMEM suits it when the weights stay in MRAM across inferences (tokens): then only
the activations move per inference. This benchmark plans the weight products of one decoder
layer under the calibrated cost model (``onnx_cinm.devices.upmem.cost``) and prints, per model
and batch size:

* ``per-inf``: modeled seconds per inference with the weights resident (activations scattered
  or broadcast, kernel, results gathered, launch) -- what a token costs once loaded;
* ``load``: the one-time cost: every kernel's DPU program (``program_load_s``, 40-80 ms per
  Cinnamon, 60 ms taken) and the weights pushed to MRAM;
* ``1st inf``: the first inference, load included (``per-inf + load``);
* ``streamed``: per inference if the weights were pushed every time instead (the programs
  still loaded once);
* ``host``: the same products on the host CPU's roofline (``hostmodel.NOMINAL``: 50 GFLOP/s,
  10 GB/s -- fixed figures, *not* a measurement of this machine; ``--host measured`` probes
  this machine instead);
* ``break-even``: the number of inferences after which loading the weights once pays off
  against running the layer on the host: ``ceil(load / (host - per-inf))`` ("never" if the
  host is faster per inference).

Models (weights int32, as PrIM's GEMV; the DPU has no fast float): GPT-2 small (d = 768, 12
heads, MLP 3072: QKV 768x2304, attention output 768x768, fc 768x3072, proj 3072x768) and a
LLaMA-7B-shaped block (d = 4096, MLP 11008: q, k, v, o 4096x4096; gate, up 4096x11008;
down 11008x4096). Attention over the KV cache (per-token, data dependent) and the norms are
left on the host in both columns and not counted.

Assumption (stated, not modeled): each product's kernel keeps its own DPU program loaded (a
kernel set loaded once, or each product on its own DPUs); reloading a program between kernels
on the same DPUs would cost ``program_load_s`` per launch.

Usage: ``python benchmarks/upmem_decoder.py [--batches 1,4,16] [--host nominal|measured]
[--json FILE]``
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from onnx_cinm import hostmodel
from onnx_cinm.devices.upmem.mapping import plan_op
from onnx_cinm.graph import OpInfo, TensorInfo

#: (model, [(layer name, K, N)])
MODELS = {
    "gpt2-small": [("qkv", 768, 2304), ("attn_out", 768, 768), ("fc", 768, 3072),
                   ("proj", 3072, 768)],
    "llama-7b-block": [("q", 4096, 4096), ("k", 4096, 4096), ("v", 4096, 4096),
                       ("o", 4096, 4096), ("gate", 4096, 11008), ("up", 4096, 11008),
                       ("down", 11008, 4096)],
}
DTYPE = "int32"


def product(name: str, batch: int, k: int, n: int) -> OpInfo:
    """``Y[batch, n] = X[batch, k] @ W[k, n]`` with the weight ``W`` constant (int32)."""
    t = lambda nm, shape, const=False: TensorInfo(nm, np.dtype(DTYPE), tuple(shape), const)  # noqa: E731
    return OpInfo(name, "Gemm", {}, (t("x", (batch, k)), t("w", (k, n), True)),
                  (t("y", (batch, n)),), flops=2 * batch * k * n)


def layer(model: str, batch: int, host) -> dict:
    """Per-inference, load, streamed and host seconds of one decoder layer's products."""
    per_inf = load = streamed = host_s = 0.0
    rows = []
    es = np.dtype(DTYPE).itemsize
    for name, k, n in MODELS[model]:
        plan = plan_op(product(name, batch, k, n))
        b = plan.cost()
        pr = plan.params
        weights = b.load_s - pr.program_load_s          # the resident weights' one-time push
        per_inf += b.latency_s
        load += b.load_s
        streamed += b.latency_s + weights
        h = host.latency_s(2 * batch * k * n, (batch * k + k * n + batch * n) * es)
        host_s += h
        rows.append({"layer": name, "K": k, "N": n, "dpus": plan.dpus, "grid": plan.g.get("grid"),
                     "per_inf_s": b.latency_s, "kernel_s": b.kernel_s, "load_s": b.load_s,
                     "weights_mb": b.resident_bytes / 1e6, "host_s": h})
    gain = host_s - per_inf
    even = math.ceil(load / gain) if gain > 0 else None
    return {"model": model, "batch": batch, "per_inf_s": per_inf, "load_s": load,
            "first_inf_s": per_inf + load, "streamed_s": streamed, "host_s": host_s,
            "break_even": even, "layers": rows}


def _ms(v: float) -> str:
    return f"{v * 1e3:9.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16", help="batch sizes, comma separated")
    ap.add_argument("--host", choices=("nominal", "measured"), default="nominal",
                    help="host roofline: fixed nominal figures (default) or this machine's")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        if any(b < 1 for b in batches):
            raise ValueError
    except ValueError:
        print(f"upmem_decoder: --batches {args.batches!r}: expected positive integers", file=sys.stderr)
        return 1
    host = hostmodel.NOMINAL if args.host == "nominal" else hostmodel.get()
    print(f"host roofline: {host.flops_per_s / 1e9:.0f} GFLOP/s, {host.bytes_per_s / 1e9:.1f} GB/s "
          f"({host.source}); times in ms per decoder layer (weight products only)")
    head = (f"{'model':15s} {'batch':>5s} {'per-inf':>9s} {'load':>9s} {'1st inf':>9s} "
            f"{'streamed':>9s} {'host':>9s} {'break-even':>10s}")
    print(head)
    print("-" * len(head))
    out = []
    for model in MODELS:
        for batch in batches:
            r = layer(model, batch, host)
            out.append(r)
            even = "never" if r["break_even"] is None else f"{r['break_even']} inf"
            print(f"{model:15s} {batch:5d} {_ms(r['per_inf_s'])} {_ms(r['load_s'])} "
                  f"{_ms(r['first_inf_s'])} {_ms(r['streamed_s'])} {_ms(r['host_s'])} {even:>10s}")
    print("per-inf: weights resident in MRAM; load: DPU programs + weights, once; 1st inf: "
          "per-inf + load; streamed: weights pushed every inference; break-even: inferences "
          "after which the one-time load has paid off against the host")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
