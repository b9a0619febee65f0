"""Reduction kernel (PrIM RED): add mul max min over axes. See
:mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (_check_mram, elem_instr, _fit_block, _inputs, instr_per_elem, _K, _limits,
                     _perm_gather, REDUCE, _round_up, _rows_layout, _Tensor, _write)


def _combine(kind: str, dtype: str) -> tuple[str, str, int]:
    """C expression combining ``a`` and ``b``, the identity, instructions per element."""
    flt = dtype == "float32"
    lo, hi = _limits(dtype)
    if kind == "add":
        return ("a + b" if flt else "(T)((UT)a + (UT)b)"), "(T)0", instr_per_elem(dtype, "add")
    if kind == "mul":
        return ("a * b" if flt else "(T)((UT)a * (UT)b)"), "(T)1", instr_per_elem(dtype, "mul")
    if kind == "max":
        return "a > b ? a : b", lo, instr_per_elem(dtype, "cmp")
    if kind == "min":
        return "a < b ? a : b", hi, instr_per_elem(dtype, "cmp")
    raise ValueError(f"reduce kind must be one of {REDUCE}, got {kind!r}")



def _emit_reduce(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    (shape,) = shapes
    rk = params.get("reduce", "add")
    axes = list(params.get("axes", range(len(shape))))
    keepdims = int(params.get("keepdims", 1))
    if math.prod(shape) == 0:
        raise ValueError("reduce: empty input")
    expr, ident, instr = _combine(rk, dtype)
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    perm, O, L, DR, DC, row_cap, c_cap = _rows_layout(shape, axes, dpus, per)
    nd = len(shape)
    axes_n = sorted({a % nd for a in axes}) if nd else []
    out_shape = tuple((1 if a in axes_n else shape[a]) for a in range(nd)) if keepdims else \
        tuple(shape[a] for a in range(nd) if a not in axes_n)
    GR = min(_round_up(row_cap, per), max(per, 256 // es))
    row_pad = _round_up(row_cap, GR)
    merge = params.get("merge", "tree")
    if merge not in ("tree", "host"):
        raise ValueError(f"reduce: merge={merge!r}; expected 'tree' or 'host' (PrIM's default)")
    p_off = row_cap * c_cap * es
    _check_mram(p_off + row_pad * es * (tasklets if merge == "host" else 1),
                f"reduce {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1, fixed=tasklets * GR * es, cap=c_cap * es)
    pshape, pstride = _perm_gather(shape, perm)
    ins = _inputs(["X"], shapes, [dtype], consts, outdir)
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(reduce=rk, axes=axes_n, O=O, L=L, DR=DR, DC=DC, row_cap=row_cap, row_pad=row_pad,
                c_cap=c_cap, p_off=p_off, GR=GR, expr=expr, ident=ident,
                instr=1 + elem_instr(rk, dtype), op_instr=elem_instr(rk, dtype), merge=merge,
                pshape=pshape, pstride=pstride))
    return _write(outdir, "reduce", k, {"reduce": rk, "axes": axes_n, "keepdims": keepdims,
                                        "dpus_requested": dpus, "merge": merge})

