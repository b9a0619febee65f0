"""Row-wise kernels: softmax and layernorm (whole rows per tasklet, or rows split over tasklets).
See :mod:`onnx_cinm.devices.upmem.codegen`."""
from __future__ import annotations

import math

import numpy as np

from .. import mapping as _mapping
from .common import (_c_float, _check_mram, _fit_block, _inputs, _K, _round_up, _TARGET, _Tensor,
                     _UNROLL, _write)


def _emit_softmax(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)



def _emit_layernorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    return _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params)



def _emit_rownorm(kind, dtype, shapes, dpus, tasklets, block, outdir, consts, params):
    if dtype != "float32":
        raise ValueError(f"{kind}: float32 only, got {dtype}")
    shape = shapes[0]
    if not shape or math.prod(shape) == 0:
        raise ValueError(f"{kind}: needs a non-empty X of rank >= 1, got {list(shape)}")
    ln = kind == "layernorm"
    axis = int(params.get("axis", -1)) % len(shape) if ln else len(shape) - 1
    R, L = _mapping.rownorm_rows(shape, axis)
    if ln:
        if len(shapes) not in (2, 3) or any(math.prod(s) != L for s in shapes[1:]):
            raise ValueError(f"layernorm: Scale (and B) of {L} elements, got {shapes[1:]}")
    elif len(shapes) != 1:
        raise ValueError(f"softmax: one input, got {len(shapes)}")
    es = 4
    row_bytes = _round_up(L * es, 8)
    row_cap, used = _mapping.rownorm_split(R, dpus)
    nparams = len(shapes) - 1
    y_off = row_cap * row_bytes
    s_off = 2 * y_off
    _check_mram(s_off + nparams * row_bytes, f"{kind} {list(shape)} on {dpus} DPUs")
    blk = _fit_block(block, tasklets, 1 + nparams, cap=row_bytes)
    (i1, i2, i3), i_row = _mapping.rownorm_instr(kind, dtype, nparams > 1)
    lanes = params.get("lanes")
    if lanes is None:  # the mapping's choice for this workgroup and block
        lanes = _mapping.rownorm_lanes(kind, dtype, row_cap, L, tasklets, blk, nparams,
                                       _UNROLL.get(), _TARGET.get())
    lanes = int(lanes)
    if not 1 <= lanes <= tasklets:
        raise ValueError(f"{kind}: lanes={lanes} tasklets per row; expected 1..{tasklets}")
    split = {}
    if lanes > 1:
        sl, _ = _mapping.rownorm_slices(L, lanes, es)
        c1, c2 = _mapping.rownorm_combine_instr(kind, dtype, lanes)
        split = dict(slice=sl, c1=c1, c2=c2, lane_instr=_mapping.ROWNORM_LANE_INSTR)
    # one block holds a whole row (whole-row kernel) or a whole slice (split kernel)
    one = (split["slice"] * es if split else row_bytes) <= blk
    names = ["X", "Scale", "B"][:len(shapes)]
    ins = _inputs(names, shapes, [dtype] * len(shapes), consts, outdir)
    eps = float(np.float32(params.get("epsilon", 1e-5)))
    k = _K(kind, dtype, used, tasklets, blk, ins, [_Tensor("Y", shape, dtype)],
           dict(R=R, L=L, row_bytes=row_bytes, row_cap=row_cap, y_off=y_off, s_off=s_off,
                nparams=nparams, one=one, i1=i1, i2=i2, i3=i3, i_row=i_row,
                eps=_c_float(eps), inv_l=_c_float(1.0 / L), lanes=lanes, **split,
                math=frozenset({"emu_expf"}) if kind == "softmax" else frozenset({"emu_sqrt"})))
    return _write(outdir, "rownorm", k, {"axis": axis, "dpus_requested": dpus, "lanes": lanes,
                                         **({"epsilon": eps} if ln else {})})

