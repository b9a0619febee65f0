"""Matrix-product kernels (PrIM GEMV, MLP): gemm, gemv and the MLP layer. See
:mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (broadcast_shape, broadcast_strides, _ceil, _check_mram, _DRY, elem_instr,
                     _fit_block, _inputs, _K, _round_up, _TARGET, _Tensor, _write)


def _emit_gemm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    bias = len(shapes) == 3
    relu = bool(params.get("relu", kind == "mlp"))
    if kind == "gemv":
        if len(shapes[0]) != 2 or len(shapes[1]) != 1 or shapes[0][1] != shapes[1][0]:
            raise ValueError(f"gemv: expected A[M, K], x[K], got {shapes}")
        M, K = shapes[0]
        ashape, bshape, yshape = (M, K), (K, 1), (M, 1)
        cshape = (M, 1) if bias else None
        names, out_shape = ["A", "x", "c"], (M,)
        if bias and shapes[2] != (M,):
            raise ValueError(f"gemv: bias must be [M] = [{M}], got {shapes[2]}")
    else:
        if len(shapes) not in (2, 3) or len(shapes[0]) < 2 or len(shapes[1]) < 2:
            raise ValueError(f"{kind}: expected A[..., M, K], B[..., K, N] (, C), got {shapes}")
        ashape, bshape = shapes[0], shapes[1]
        if ashape[-1] != bshape[-2]:
            raise ValueError(f"{kind}: inner dims differ: A{list(ashape)} @ B{list(bshape)}")
        M, K, N = ashape[-2], ashape[-1], bshape[-1]
        batch = broadcast_shape(ashape[:-2], bshape[:-2])
        yshape = batch + (M, N)
        cshape = shapes[2] if bias else None
        if bias:
            if broadcast_shape(cshape, yshape) != yshape:
                raise ValueError(f"{kind}: C{list(cshape)} does not broadcast to Y{list(yshape)}")
        names, out_shape = ["A", "B", "C"], yshape
    M, K = ashape[-2], ashape[-1]
    N = bshape[-1]
    batch = yshape[:-2]
    G = math.prod(batch)
    GB = math.prod(bshape[:-2])
    b_batched = GB > 1
    es = np.dtype(dtype).itemsize
    per = 8 // math.gcd(8, es)
    rows = G * M
    # DPU grid: DR row blocks x DC column blocks (the cnm mapping's cnm_grid), else all rows
    grid = params.get("grid")
    DR, DC = (int(grid[0]), int(grid[1])) if grid else (min(dpus, rows), 1)
    if DR < 1 or DC < 1 or DR * DC > _TARGET.get().max_dpus or (DC > 1 and b_batched) or DC > max(N, 1):
        raise ValueError(f"{kind}: no {DR} x {DC} DPU grid for {rows} rows x {N} columns"
                         + (" with a batched B" if b_batched and DC > 1 else ""))
    K_pad = _round_up(K, per)
    row_cap = max(1, _ceil(rows, DR))
    N_cap = _round_up(_ceil(N, DC), per)
    if not grid:  # our own choice: no DPU without rows; a given grid is kept as planned
        DR = _ceil(rows, row_cap)
    R = 1 if b_batched else min(4, row_cap)
    NT = min(N_cap, _round_up(64, per))
    if params.get("prim_tiles"):   # PrIM's GEMV for comparison: one row and one column per item
        R, NT = 1, per
    groups = _ceil(row_cap, R)
    if not params.get("prim_tiles") and row_cap < tasklets and groups * _ceil(N_cap, NT) < tasklets:
        # few rows (a layer at batch 1): narrower column tiles so that every tasklet works
        NT = max(per, _round_up(_ceil(N_cap, _ceil(tasklets, groups)), per))
    # a dry run (check_emittable) gives no constants: its inputs cannot refuse, nor be read
    ins = None if _DRY.get() else _inputs(names[:len(shapes)], shapes, [dtype] * len(shapes),
                                          consts, outdir)
    # per-DPU MRAM layout, bytes (8-aligned)
    y_off = row_cap * K_pad * es
    c_off = y_off + row_cap * N_cap * es
    rb_off = c_off + (row_cap * N_cap * es if bias else 0)
    b_off = rb_off + (row_cap * 8 if b_batched else 0)
    _check_mram(b_off + GB * N_cap * K_pad * es,
                f"{kind} {list(ashape)} @ {list(bshape)} on a {DR} x {DC} DPU grid")
    blk = _fit_block(block, tasklets, R + 1, fixed=tasklets * (R * NT * es + 8), cap=K_pad * es)
    if ins is None:  # a dry run: the checks passed; what _write would return, without the
        return []    # template context it does not read
    a_bstride = [s * M * K for s in broadcast_strides(ashape[:-2], batch)]
    b_bstride = [s * K * N for s in broadcast_strides(bshape[:-2], batch)]
    # per multiply-accumulate: 2 WRAM loads, mul, add (mapping's matrix-product model)
    mac = 2 + elem_instr("mul", dtype) + elem_instr("add", dtype)
    doc = (f"Y{list(yshape)} = A{list(ashape)} @ B{list(bshape)}" + (f" + C{list(cshape)}" if bias else "")
           + (", then ReLU" if relu else "") + f" ({dtype}; integer products wrap around)")
    k = _K(kind, dtype, DR * DC, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(doc=doc, M=M, K=K, N=N, G=G, GB=GB, rows=rows, row_cap=row_cap, K_pad=K_pad,
                N_cap=N_cap, DR=DR, DC=DC, R=R, NT=NT, y_off=y_off, c_off=c_off, rb_off=rb_off,
                b_off=b_off, bias=bias, relu=relu, b_batched=b_batched, batch=batch,
                a_bstride=a_bstride, b_bstride=b_bstride, y_shape=yshape,
                c_strides=broadcast_strides(cshape, yshape) if bias else (), instr=mac,
                n_comp=1 if N == 1 else N_cap))
    return _write(outdir, "gemm", k, {"relu": relu, "bias": bias, "grid": [DR, DC],
                                      "dpus_requested": dpus})

