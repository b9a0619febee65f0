"""PopCount kernel. See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import _ceil, _check_mram, _fit_block, _inputs, _K, _round_up, _Tensor, _write


def _emit_popcount(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    n = math.prod(shape)
    cap = max(per, _round_up(_ceil(n, dpus), per))
    _check_mram(cap * (es + 8), f"popcount of {n} elements on {dpus} DPUs")
    # buffers: a block of X and its int64 counts (8 / sizeof(T) times as large)
    blk = _fit_block(block, tasklets, 1 + 8 / es, cap=cap * es)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", shape, "int64")],
           dict(n=n, cap=cap, y_off=cap * es, instr=16))
    return _write(outdir, "popcount", k, {})

