"""Im2Col kernel: the patch matrix of a convolution. See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .. import mapping as _mapping
from .common import (_ceil, _check_mram, _DRY, _fit_block, _inputs, _K, _round_up, _TARGET,
                     _Tensor, _write)


def _emit_im2col(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    ks = list(params["kernel_shape"])
    if len(ks) not in (1, 2) or len(shape) != 2 + len(ks):
        raise ValueError(f"im2col: 1-D or 2-D kernels on X[N, C, *S], got X{list(shape)}, kernel {ks}")
    g = _mapping.im2col_dims(shape, ks, params["strides"], params["pads"], params["dilations"])
    N, C, H, W, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, HP, WP, OH, OW = (
        g[k] for k in ("N", "C", "H", "W", "KH", "KW", "SH", "SW", "DH", "DW", "PT", "PL", "PB",
                       "PR", "HP", "WP", "OH", "OW"))
    if OH < 1 or OW < 1:
        raise ValueError("im2col: empty output")
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    win = _round_up((KW - 1) * DW * es + es, 8) + 8
    dma_max = _TARGET.get().dma_max
    if win > dma_max:
        raise ValueError(f"im2col: a kernel row spans {win} bytes (> {dma_max}, one DMA)")
    CK = C * KH * KW
    CK_pad = _round_up(CK, per)
    rows = N * OH * OW
    # each DPU: NB images x a tile of LB output lines x CB columns, and only the HB x WB padded
    # input rows and columns (per image and channel) the tile reads (mapping.im2col_split:
    # the cost model's split)
    NB, LB, CB, used = _mapping.im2col_split(N, OH, OW, dpus)
    HB = _mapping.im2col_halo(LB, KH, SH, DH)
    WB = _mapping.im2col_halo(CB, KW, SW, DW)
    row_cap = NB * LB * CB
    xp_off = row_cap * CK_pad * es
    xs_elems = _round_up(NB * C * HB * WB, per) + per  # the last window may reach 8 bytes past
    _check_mram(xp_off + xs_elems * es, f"im2col {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * win, cap=CK_pad * es)
    if _DRY.get():  # check_emittable: nothing below can refuse (no constants are given)
        return []   # that _write would return, without the template context it does not read
    yshape = (N, OH, OW, CK) if params.get("rank", len(params["kernel_shape"])) == 2 else (N, OW, CK)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, used, tasklets, blk, ins, [_Tensor("Y", yshape, dtype)],
           dict(N=N, C=C, H=H, W=W, HP=HP, WP=WP, PT=PT, PL=PL, OH=OH, OW=OW, KH=KH, KW=KW,
                SH=SH, SW=SW, DH=DH, DW=DW, pads=[PT, PL, PB, PR], CK=CK, CK_pad=CK_pad, rows=rows,
                row_cap=row_cap, xp_off=xp_off, xs_elems=xs_elems, win=win, NB=NB, LB=LB, CB=CB,
                HB=HB, WB=WB, BANDS=_ceil(OH, LB), CBLOCKS=_ceil(OW, CB)))
    return _write(outdir, "im2col", k, {"kernel_shape": list(params["kernel_shape"]),
                                        "strides": list(params["strides"]),
                                        "pads": list(params["pads"]),
                                        "dilations": list(params["dilations"]),
                                        "dpus_requested": dpus})

