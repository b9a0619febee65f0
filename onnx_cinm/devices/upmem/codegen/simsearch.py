"""SimSearch kernel: top-k rows by dot product or cosine. See
:mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations


from .common import (_ceil, _check_mram, elem_instr, _fit_block, _inputs, _K, _max_tasklets,
                     _round_up, _Tensor, _write)


def _emit_simsearch(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if dtype != "float32" or len(shapes) != 2 or len(shapes[0]) != 2 or len(shapes[1]) != 2 \
            or shapes[0][1] != shapes[1][1]:
        raise ValueError(f"simsearch: float32 Q[Nq, d] and D[Nd, d], got {dtype} {shapes}")
    metric = params.get("metric", "dot")
    if metric not in ("dot", "cos"):
        raise ValueError(f"simsearch: metric must be dot or cos, got {metric!r}")
    (NQ, DIM), (ND, _) = shapes
    kk = int(params["k"])
    if not 1 <= kk <= min(ND, 256):
        raise ValueError(f"simsearch: k={kk} must be in 1..min({ND}, 256)")
    es = 4
    per = 2
    DIM_pad = _round_up(DIM, per)
    KP = _round_up(kk, per)
    ND_cap = max(1, _ceil(ND, dpus))
    used = _ceil(ND, ND_cap)
    q_off = ND_cap * DIM_pad * es
    v_off = q_off + NQ * DIM_pad * es
    i_off = v_off + NQ * KP * es
    _check_mram(i_off + NQ * KP * 8, f"simsearch {shapes} on {dpus} DPUs")
    tasklets = _max_tasklets(tasklets, KP * (es + 8) + 2 * 8)
    blk = _fit_block(block, tasklets, 2, fixed=tasklets * KP * (es + 8), cap=DIM_pad * es)
    ins = _inputs(["Q", "D"], shapes, [dtype] * 2, consts, outdir)
    # per multiply-accumulate: 2 WRAM loads, mul, add (mapping's matrix-product model)
    mac = 2 + elem_instr("mul", dtype) + elem_instr("add", dtype)
    k = _K(kind, dtype, used, tasklets, blk, ins,
           [_Tensor("values", (NQ, kk), dtype), _Tensor("indices", (NQ, kk), "int64")],
           dict(NQ=NQ, ND=ND, DIM=DIM, DIM_pad=DIM_pad, ND_cap=ND_cap, k=kk, KP=KP, q_off=q_off,
                v_off=v_off, i_off=i_off, metric=metric, instr=mac))
    return _write(outdir, "simsearch", k, {"k": kk, "metric": metric, "dpus_requested": dpus})

