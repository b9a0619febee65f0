"""Histogram kernel (PrIM HST-S, HST-L's mutex for comparison). See
:mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .. import mapping as _mapping
from .common import (_c_lit, _ceil, _check_mram, elem_instr, _fit_block, _inputs, _K,
                     _max_tasklets, _round_up, _TARGET, _Tensor, _write)


def _c_double(v: float) -> str:
    v = float(np.float32(v))  # the attribute is a float32 (ONNX AttributeProto.FLOAT)
    if math.isinf(v):
        return "(-__builtin_inf())" if v < 0 else "__builtin_inf()"
    return f"({v!r})"



def _emit_histogram(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    bins = int(params["bins"])
    if not 1 <= bins <= 8192:
        raise ValueError(f"histogram: bins={bins}, the kernel handles 1..8192")
    lo, hi = float(params["min"]), float(params["max"])
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    N = math.prod(shape)
    cap = max(per, _round_up(_ceil(N, dpus), per))
    shift = _mapping.hist_pow2_shift(dtype, bins, lo, hi)
    # the integer path keeps one overflow slot (x == max) after the bins
    bins_pad = _round_up(bins + (1 if shift is not None else 0), 2)
    # private histograms: fewer tasklets when they would not fit (a choice HST-L avoids with
    # a shared histogram and mutexes)
    merge = params.get("merge", "tree")
    if merge not in ("tree", "mutex"):
        raise ValueError(f"histogram: merge={merge!r}; expected 'tree' or 'mutex' (PrIM HST-L)")
    blk0 = max(8, min(_TARGET.get().dma_max, block) // 8 * 8)
    if merge == "mutex":   # one shared histogram
        tasklets = _max_tasklets(tasklets, min(blk0, cap * es), fixed=bins_pad * 4)
        blk = _fit_block(block, tasklets, 1, fixed=bins_pad * 4, cap=cap * es)
    else:
        tasklets = _max_tasklets(tasklets, bins_pad * 4 + min(blk0, cap * es))
        blk = _fit_block(block, tasklets, 1, fixed=tasklets * bins_pad * 4, cap=cap * es)
    _check_mram(cap * es + bins_pad * 4, f"histogram of {N} elements on {dpus} DPUs")
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    # per element, as the mapping's histogram model: ld, bin + range check, address, ld/add/st
    instr = 1 + _mapping.hist_bin_instr(dtype, shift is not None)
    if merge == "tree":
        instr += 1 + 3   # the count's address, ld/add/st (under the mutex: MUTEX_CS_INSTR)
    flo, fhi = float(np.float32(lo)), float(np.float32(hi))
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("counts", (bins,), "int64")],
           dict(N=N, cap=cap, bins=bins, bins_pad=bins_pad, h_off=cap * es, lo=lo, hi=hi,
                lo_c=_c_double(lo), hi_c=_c_double(hi), instr=instr, shift=shift,
                lo_i=_c_lit(int(flo) if shift is not None else 0, dtype),
                span=(int(fhi) - int(flo) if shift is not None else 0),
                add_instr=elem_instr("add", "int32"), merge=merge,
                cs_instr=_mapping.MUTEX_CS_INSTR))
    return _write(outdir, "histogram", k, {"bins": bins, "min": lo, "max": hi, "merge": merge})

