"""The HBM-PIM kernel artifact: ``<stem>.pim`` (JSON) and its FP16 weights sidecar.

``<stem>.pim`` holds, for one node: the CRF program (32-bit words with their assembly text, at
most 32), the host command stream of one run (:func:`~.program.walk`: broadcast GRF writes and
AB-PIM triggers with their column addresses, as affine forms over loop variables), the setup and
teardown (mode switches, CRF/SRF writes, the read-back), the geometry, the per-bank data layout
and the counts (instructions, triggers per run and per inference, GRF_A loads, bank accesses).
``<stem>.W.npy`` holds a GEMV's weights in float16, laid out per PCU and bank
(:func:`~.program.gemv_weights`). Both are written deterministically (sorted keys, no times).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...errors import CinmError
from . import program
from .program import PimPlan, decode

FORMAT = "onnx-cinm hbm_pim kernel"
VERSION = 1


def kernel_path(root, rel: str) -> Path:
    """``root / rel`` for a kernel path ``hbm_pim/<stem>.pim`` that stays inside ``root``.
    Raises CinmError otherwise."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or len(p.parts) != 2 or p.parts[0] != "hbm_pim" \
            or p.suffix != ".pim":
        raise CinmError(f"hbm_pim: kernel path '{rel}' is not hbm_pim/<stem>.pim")
    return Path(root) / p


def describe(plan: PimPlan, form: str, precision: str, node: str) -> dict:
    """The JSON document of ``plan`` (``form``: which input is the matrix, see
    :func:`onnx_cinm.devices.hbm_pim.gemv_form`)."""
    c = plan.counts()
    crf = [{"pc": i, "word": f"0x{w:08x}", "asm": decode(w).text()} for i, w in enumerate(plan.crf)]
    setup = ["SB->AB: 4 reserved-row accesses", f"write CRF: 4 bursts of 8 instructions "
             f"({len(plan.crf)} used) to {plan.channels} pseudo-channels"]
    if plan.scalar >= 0:
        slot = "SRF_A[8]" if plan.op == "ADD" else "SRF_M[0]"
        setup.append(f"write SRF: {slot} <- input {plan.scalar} (a scalar), rounded to FP16")
    setup.append("AB->AB-PIM: write PIM_OP_MODE")
    if plan.op == "GEMV":
        sizes = {"M": plan.M, "K": plan.K, "runs": plan.runs, "tiles": plan.tiles,
                 "groups": plan.groups}
        out = plan.groups * (plan.tiles // 2) * 64
        layout = {"weights": {
            "shape": [plan.pcus, 2, plan.groups, plan.tiles // 2, 8, 8, 16], "dtype": "float16",
            "element": "[p, b, g, s, j, c, l] = W[(g*pcus + p)*8 + j, (2*s + b)*128 + c*16 + l]",
            "bank_column": "(g*tiles/2 + s)*64 + j*8 + c in bank b of PCU p"},
            "partials": f"GRF_B[j] of row group g -> even bank column {out} + g*8 + j; the host "
                        "reads them and sums the 16 lanes"}
        teardown = ["AB-PIM->AB", "AB->SB",
                    f"read {plan.pcus} x {plan.groups} x 8 partial-sum columns of 32 B per run"]
        per_run_loads = plan.groups * plan.tiles
    else:
        sizes = {"n": plan.n, "cols": plan.cols, "scalar": plan.scalar,
                 "resident_inputs": list(plan.resident)}
        two = plan.op in ("ADD", "MUL") and plan.scalar < 0
        regions = {"input A": [0, plan.cols]}
        if two:
            regions["input B"] = [plan.cols, 2 * plan.cols]
        res = (2 if two else 1) * plan.cols
        regions["result"] = [res, res + plan.cols]
        layout = {"operands": "element e = ((p*2 + b)*cols + col)*16 + l: PCU p, bank b "
                              "(0 even, 1 odd), column col of the region, lane l",
                  "regions": regions}
        teardown = ["AB-PIM->AB", "AB->SB", f"read the result region ({plan.n} elements)"]
        per_run_loads = 0
    return {
        "format": FORMAT, "version": VERSION, "node": node, "op": plan.op, "form": form,
        "precision": precision,
        "geometry": {"pcus": plan.pcus, "channels": plan.channels, "lanes": 16, "grf_a": 8,
                     "grf_b": 8, "srf": 16, "crf_entries": 32, "bank_columns": plan.bank_cols},
        "sizes": sizes, "crf": crf, "setup": setup, "stream": list(plan.stream),
        "teardown": teardown, "layout": layout,
        "counts": {"instructions": len(plan.crf), "triggers_per_run": c["triggers"],
                   "runs": plan.runs, "ab_pim_triggers": plan.runs * c["triggers"],
                   "bank_accesses_per_run": c["bank_accesses"],
                   "grf_a_loads_per_run": per_run_loads,
                   "grf_writes_per_run": c["grf_writes"]},
    }


def write(plan: PimPlan, form: str, precision: str, node: str, path: Path,
          weights: np.ndarray | None) -> list[Path]:
    """Write ``path`` (the ``.pim`` document) and, for a GEMV, ``<stem>.W.npy`` with
    ``weights`` (``W[M, K]``, any float dtype: rounded to float16 and laid out). Returns the
    paths written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = describe(plan, form, precision, node)
    out = [path]
    if plan.op == "GEMV":
        side = path.with_suffix(".W.npy")
        doc["layout"]["weights"]["file"] = side.name
        np.save(side, program.gemv_weights(plan, weights), allow_pickle=False)
        out.append(side)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return sorted(out)


def read(path: Path) -> dict:
    """The ``.pim`` document at ``path``. Raises CinmError if it is missing or not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CinmError(f"hbm_pim: cannot read kernel '{path}': {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CinmError(f"hbm_pim: '{path}' is not a version-{VERSION} HBM-PIM kernel")
    return doc
