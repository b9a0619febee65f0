"""Transpose kernel (PrIM TRNS). See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (_ceil, _check_mram, _fit_block, _inputs, _K, _max_tasklets, _round_up,
                     _TARGET, _Tensor, TRANSPOSE_CHUNK_BYTES, _transpose_groups, _write)


def _emit_transpose(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    perm = [int(p) % max(1, len(shape)) for p in params.get("perm", range(len(shape))[::-1])]
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"transpose: perm {perm} is not a permutation of {len(shape)} axes")
    groups = _transpose_groups(perm)
    if groups is None:
        raise ValueError(f"transpose: perm {perm} is not a swap of two adjacent axis groups")
    lead, na, nb, _ = groups
    G = math.prod(shape[:lead])
    A = math.prod(shape[lead:lead + na])
    B = math.prod(shape[lead + na:lead + na + nb])
    E = math.prod(shape[lead + na + nb:])
    es = np.dtype(dtype).itemsize
    # a trailing run longer than one 8-aligned DMA (<= dma_max bytes) is moved in NC chunks of
    # EC elements (1 KB; the last one padded): each chunk is transposed as if it were its own run
    dma_max = _TARGET.get().dma_max
    EC = E
    if (8 // math.gcd(8, E * es)) * E * es > dma_max:
        EC = TRANSPOSE_CHUNK_BYTES // es
    NC = _ceil(E, EC)
    u = EC * es                      # bytes per unit of EC elements
    q = 8 // math.gcd(8, u)          # units per 8-byte-aligned run
    blk = _fit_block(block, tasklets, 2, cap=None)
    m = max(1, math.isqrt(max(1, blk // (q * q * u))))
    BW = min(q * m, _round_up(B, q))
    AC = min(A, max(1, _ceil(G * A, dpus))) if A else 1
    AW = min(q * m, _round_up(AC, q))
    while AW * BW * u > max(blk, q * q * u) or BW * u > dma_max or AW * u > dma_max:
        if BW >= AW and BW > q:
            BW -= q
        elif AW > q:
            AW -= q
        else:
            break
    blk_used = _round_up(AW * BW * u, 8)
    # two sub-tile buffers per tasklet: fewer tasklets when a long run makes them large
    tasklets = _max_tasklets(tasklets, 2 * blk_used)
    AC_pad, B_pad = _round_up(AC, AW), _round_up(B, BW)
    NA = _ceil(A, AC) if A else 1
    units = G * NC * NA
    US = _ceil(units, dpus)
    used = _ceil(units, US)
    tile = AC_pad * B_pad * EC * es
    _check_mram(2 * US * tile, f"transpose {list(shape)} on {dpus} DPUs")
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    yshape = tuple(shape[p] for p in perm)
    k = _K(kind, dtype, used, tasklets, blk_used, ins, [_Tensor("Y", yshape, dtype)],
           dict(perm=perm, G=G, A=A, B=B, E=E, EC=EC, NC=NC, AC=AC, AC_pad=AC_pad, B_pad=B_pad,
                AW=AW, BW=BW,
                NA=NA, units=units, US=US, out_off=US * tile, instr=4))
    return _write(outdir, "transpose", k, {"perm": perm, "dpus_requested": dpus})

