"""TopK kernel. See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (_check_mram, _fit_block, _inputs, instr_per_elem, _inverse_gather, _K,
                     _max_tasklets, _perm_gather, _round_up, _rows_layout, _TARGET, _Tensor,
                     _write)


def _topk_better(dtype: str, largest: int) -> str:
    """C expression: does candidate ``(a, ia)`` rank before ``(b, ib)``? Ties go to the lower
    index (ONNX). For floats NaN ranks as the largest value, equal to another NaN, as in
    onnxruntime's TopK (first when largest=1, last when largest=0)."""
    if dtype != "float32":
        cmp, eq = ("a > b" if largest else "a < b"), "a == b"
    else:
        cmp = "(a > b || (a != a && b == b))" if largest else "(a < b || (a == a && b != b))"
        eq = "(a == b || (a != a && b != b))"
    return f"{cmp} || ({eq} && ia < ib)"



def _emit_topk(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    if not shape:
        raise ValueError("topk: needs rank >= 1")
    axis = int(params.get("axis", -1)) % len(shape)
    kk = int(params["k"])
    largest = 1 if int(params.get("largest", 1)) else 0
    if not 1 <= kk <= shape[axis]:
        raise ValueError(f"topk: k={kk} must be in 1..{shape[axis]} (the axis length)")
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    KP = _round_up(kk, per)
    # every tasklet keeps a sorted list of KP values and int64 indices in WRAM: fewer tasklets
    # for a large k; ValueError when one list does not fit (k ~ 5000 float32, ~ 4000 int64)
    try:
        tasklets = _max_tasklets(tasklets, KP * (es + 8) + 4 + 64)
    except ValueError:
        raise ValueError(f"topk: k={kk}: a candidate list of {KP * (es + 8)} bytes does not fit "
                         f"in {_TARGET.get().wram_bytes} B of WRAM") from None
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, [axis], dpus, per)
    v_off = row_cap * c_cap * es
    i_off = v_off + row_cap * KP * es
    _check_mram(i_off + row_cap * KP * 8, f"topk {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * (KP * (es + 8) + 4), cap=c_cap * es)
    pshape, pstride = _perm_gather(shape, perm)
    yshape = tuple(kk if a == axis else d for a, d in enumerate(shape))
    ishape, istride = _inverse_gather(yshape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins,
           [_Tensor("values", yshape, dtype), _Tensor("indices", yshape, "int64")],
           dict(k=kk, axis=axis, largest=largest, better=_topk_better(dtype, largest), KP=KP, O=O, L=L, DC=DC, row_cap=row_cap,
                c_cap=c_cap, v_off=v_off, i_off=i_off, pshape=pshape, pstride=pstride,
                ishape=ishape, istride=istride, instr=2 * instr_per_elem(dtype, "cmp")))
    return _write(outdir, "topk", k, {"k": kk, "axis": axis, "largest": largest,
                                      "dpus_requested": dpus})

