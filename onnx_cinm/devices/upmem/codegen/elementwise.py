"""Elementwise kernels (PrIM VA): binary ops with numpy broadcasting, unary ops. See
:mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .common import (BINARY, broadcast_shape, broadcast_strides, _c_float, _c_lit, _ceil, _check_mram, _COST_OP,
                     _DRY, elem_instr, _fit_block, GELU, _inputs, instr_per_elem, _K,
                     math_helpers_for, _round_up, _SOFT_DOUBLE_INSTR, _Tensor, TRANSCENDENTAL,
                     UNARY, _write)


def _binary_expr(op: str, dtype: str) -> tuple[str, str, int]:
    """C expression of ``op(a, b)``, its doc, instructions per element."""
    flt = dtype == "float32"
    if op in ("Add", "Sub", "Mul"):
        sym = {"Add": "+", "Sub": "-", "Mul": "*"}[op]
        cls = {"Add": "add", "Sub": "sub", "Mul": "mul"}[op]
        e = f"a {sym} b" if flt else f"(T)((UT)a {sym} (UT)b)"  # wrap around, as numpy does
        return e, f"A {sym} B", instr_per_elem(dtype, cls)
    if op == "Div":
        if flt:
            return "a / b", "A / B", instr_per_elem(dtype, "div")
        # C truncation (as onnxruntime); x / 0 -> 0 and MIN / -1 -> MIN instead of a trap
        if dtype.startswith("u"):
            return "b == 0 ? (T)0 : a / b", "A / B (truncating; x / 0 = 0)", instr_per_elem(dtype, "div")
        return ("b == 0 ? (T)0 : (b == -1 ? (T)(0 - (UT)a) : a / b)",
                "A / B (truncating; x / 0 = 0)", instr_per_elem(dtype, "div"))
    if op in ("Max", "Min"):
        sym = ">" if op == "Max" else "<"
        if flt:  # NaN in either operand gives NaN (onnxruntime's Max/Min; a != a is isnan)
            return (f"(a {sym} b || a != a) ? a : b", f"{op.lower()}(A, B), NaN if either is NaN",
                    instr_per_elem(dtype, "cmp"))
        return f"a {sym} b ? a : b", f"{op.lower()}(A, B)", instr_per_elem(dtype, "cmp")
    raise ValueError(f"no UPMEM kernel for binary op {op!r}; expected one of {BINARY}")



def _unary_expr(op: str, dtype: str, params: dict) -> tuple[str, str, int]:
    flt = dtype == "float32"
    cmp = instr_per_elem(dtype, "cmp")
    unsigned = dtype.startswith("u")
    if op == "Relu":
        if flt:  # Relu(NaN) = NaN, as onnxruntime (a > 0 would map NaN to 0)
            return ("a < 0.0f ? 0.0f : a", "max(X, 0), NaN stays NaN", cmp)
        return ("a > 0 ? a : (T)0", "max(X, 0)", cmp)
    if op == "Abs":
        if unsigned:
            return "a", "|X|", 1
        return ("a < 0 ? -a : a" if flt else "a < 0 ? (T)(0 - (UT)a) : a"), "|X|", cmp
    if op == "Neg":
        if flt:
            return "-a", "-X", cmp
        return "(T)(0 - (UT)a)", "-X (wrapping)", instr_per_elem(dtype, "sub")
    if op == "LeakyRelu":
        if not flt:
            raise ValueError("LeakyRelu needs float32")
        al = _c_float(params.get("alpha", 0.01))
        return f"a < 0 ? {al} * a : a", f"X < 0 ? {al} * X : X", cmp + instr_per_elem(dtype, "mul")
    if op == "HardSigmoid":
        if not flt:
            raise ValueError("HardSigmoid needs float32")
        al, be = _c_float(params.get("alpha", 0.2)), _c_float(params.get("beta", 0.5))
        v = f"({al} * a + {be})"
        return (f"{v} < 0.0f ? 0.0f : ({v} > 1.0f ? 1.0f : {v})",
                f"clip({al} * X + {be}, 0, 1)",
                2 * cmp + instr_per_elem(dtype, "mul") + instr_per_elem(dtype, "add"))
    if op == "Clip":
        # ONNX Clip: min applied first, then max (so min > max gives max). A bound that is
        # absent or at the type's limit is left out (the comparison would be always false,
        # which -Wtype-limits rejects).
        lo_v, hi_v = params.get("min"), params.get("max")
        e, doc = "a", "X"
        if flt:
            lo_ok, hi_ok = lo_v is not None, hi_v is not None
        else:
            info = np.iinfo(np.dtype(dtype))
            lo_ok = lo_v is not None and lo_v > info.min
            hi_ok = hi_v is not None and hi_v < info.max
        if lo_ok:
            lo = _c_lit(lo_v, dtype)
            e, doc = f"(a < {lo} ? {lo} : a)", f"max(X, {lo})"
        if hi_ok:
            hi = _c_lit(hi_v, dtype)
            e, doc = f"({e} > {hi} ? {hi} : {e})", f"min({doc}, {hi})"
        return e, doc, 2 * cmp
    if op in TRANSCENDENTAL:
        if not flt:
            raise ValueError(f"{op} needs float32")
        return TRANSCENDENTAL[op] + (_SOFT_DOUBLE_INSTR,)
    if op == "Gelu":
        if not flt:
            raise ValueError("Gelu needs float32")
        expr, doc, cop = GELU[params.get("approximate", "none")]
        return expr, doc, elem_instr(cop, dtype)
    raise ValueError(f"no UPMEM kernel for unary op {op!r}; expected one of {UNARY}")



def _emit_binary(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)



def _emit_unary(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)



def _emit_elementwise(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    op = params.get("op")
    nin = 2 if kind == "binary" else 1
    if len(shapes) != nin:
        raise ValueError(f"{kind} {op}: expected {nin} input shape(s), got {len(shapes)}")
    if kind == "binary":
        expr, doc, instr = _binary_expr(op, dtype)
        out_shape = broadcast_shape(*shapes)
    else:
        expr, doc, instr = _unary_expr(op, dtype, params)
        out_shape = shapes[0]
    es = np.dtype(dtype).itemsize
    n = math.prod(out_shape)
    per = 8 // math.gcd(8, es)                       # elements per 8 bytes
    cap = max(per, _round_up(_ceil(n, dpus), per))   # elements per DPU, 8-byte multiple
    if _DRY.get():  # check_emittable (no constants given: the inputs cannot refuse): the checks
        _check_mram((nin + 1) * cap * es, f"{op} of {n} elements on {dpus} DPUs")
        _fit_block(block, tasklets, nin, cap=cap * es)
        return []   # that _write would return, without the template context it does not read
    names = ["A", "B"] if nin == 2 else ["X"]
    ins = _inputs(names, shapes, [dtype] * nin, consts, outdir)
    for t in ins:
        t.bstrides = broadcast_strides(t.shape, out_shape)
    # per element: a WRAM load per input, the operation, a store (mapping's elementwise model)
    cop = GELU[params.get("approximate", "none")][2] if op == "Gelu" else _COST_OP[op]
    instr = nin + elem_instr(cop, dtype) + 1
    _check_mram((nin + 1) * cap * es, f"{op} of {n} elements on {dpus} DPUs")
    blk = _fit_block(block, tasklets, nin, cap=cap * es)
    k = _K(kind, dtype, dpus, tasklets, blk, ins, [_Tensor("Y", out_shape, dtype)],
           dict(op=op, expr=expr, expr_doc=doc, instr=instr, n=n, cap=cap, cap_bytes=cap * es,
                out_shape=out_shape, math=math_helpers_for(expr)))
    return _write(outdir, "elementwise", k, {"op": op, "params": {
        x: params[x] for x in ("alpha", "beta", "min", "max", "approximate")
        if params.get(x) is not None}})

