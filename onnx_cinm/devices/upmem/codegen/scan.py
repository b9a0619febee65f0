"""Scan kernel (PrIM SCAN-SSA): CumSum. See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (_check_mram, _fit_block, _inputs, instr_per_elem, _inverse_gather, _K,
                     _perm_gather, _round_up, _rows_layout, _Tensor, _write)


def _emit_scan(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    if not shape or math.prod(shape) == 0:
        raise ValueError(f"scan: needs a non-empty tensor of rank >= 1, got {list(shape)}")
    axis = int(params.get("axis", 0)) % len(shape)
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    # every tasklet's piece is CT elements (a multiple of 8 bytes): C_CAP = tasklets * CT
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, [axis], dpus, per * tasklets)
    CT = c_cap // tasklets
    TB = min(_round_up(row_cap, per), max(per, 256 // es))
    row_pad = _round_up(row_cap, TB)
    tot_off = row_cap * c_cap * es
    ofs_off = tot_off + tasklets * row_pad * es
    _check_mram(ofs_off + tasklets * row_pad * es, f"scan {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * TB * es, cap=CT * es)
    pshape, pstride = _perm_gather(shape, perm)
    ishape, istride = _inverse_gather(shape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", shape, dtype)],
           dict(axis=axis, exclusive=int(params.get("exclusive", 0)),
                reverse=int(params.get("reverse", 0)), O=O, L=L, DC=DC, row_cap=row_cap,
                row_pad=row_pad, c_cap=c_cap, CT=CT, TB=TB, tot_off=tot_off, ofs_off=ofs_off,
                pshape=pshape, pstride=pstride, ishape=ishape, istride=istride,
                instr=instr_per_elem(dtype, "add")))
    return _write(outdir, "scan", k, {"axis": axis, "exclusive": k.exclusive,
                                      "reverse": k.reverse, "dpus_requested": dpus})

