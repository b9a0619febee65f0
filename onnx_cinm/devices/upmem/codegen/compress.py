"""Compress kernel (PrIM SEL). See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (_ceil, _check_mram, elem_instr, _fit_block, _inputs, _K, _round_up, _Tensor,
                     _UNROLL, _write)


def _emit_compress(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if len(shapes) != 2 or math.prod(shapes[0]) != math.prod(shapes[1]):
        raise ValueError(f"compress: expected X and a mask of as many elements, got {shapes}")
    es = np.dtype(dtype).itemsize
    N = math.prod(shapes[0])
    TL = max(8, _round_up(_ceil(N, dpus * tasklets), 8))  # elements per tasklet, 8 of them = 8 mask bytes
    cap = TL * tasklets
    m_off = cap * es
    y_off = m_off + cap
    _check_mram(y_off + cap * es, f"compress of {N} elements on {dpus} DPUs")
    # buffers: X block, staging block, mask block (BLOCK / sizeof(T) bytes); >= 8 mask bytes
    blk = _fit_block(max(block, 8 * es), tasklets, 2 + 1 / es,
                     fixed=tasklets * 2 * _UNROLL.get() * es, cap=TL * es)
    blk = max(blk, 8 * es) // (8 * es) * (8 * es)
    ins = _inputs(["X", "mask"], shapes, [dtype, "bool"], consts, outdir)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", None, dtype)],
           dict(N=N, cap=cap, TL=TL, m_off=m_off, y_off=y_off,
                # ld x, ld mask, st, the mask test, the index add (mapping's select model)
                instr=1 + 1 + 1 + elem_instr("and", "int32") + elem_instr("add", "int32")))
    return _write(outdir, "compress", k, {})

