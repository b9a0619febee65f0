"""The UPMEM cost model held against published measurements of real UPMEM hardware.

For every row of :data:`onnx_cinm.devices.upmem.measurements.MEASUREMENTS` (host<->DPU
transfers on 1 DPU, 4 ranks and 32 ranks, an empty launch, PrIM's arithmetic throughput and
MRAM DMA), prints the measured figure, the cost model's figure for the same case
(``onnx_cinm.devices.upmem.cost.DEFAULT_PARAMS``) and their ratio.
Calibration rows must lie within 15 % (``ok``); held-out rows (sizes of the same sweeps that
were not used to fit anything) show where the model is off. Exit status 1 if a calibration
row misses the target.

Usage: ``python benchmarks/upmem_calibration.py [--json FILE]``
"""
from __future__ import annotations

import argparse
import json
import sys

from onnx_cinm.devices.upmem.cost import DEFAULT_PARAMS
from onnx_cinm.devices.upmem.measurements import MEASUREMENTS, TOLERANCE
from onnx_cinm.text import Column, table as text_table


def rows(params=DEFAULT_PARAMS) -> list[dict]:
    """One dict per measurement: case, unit, measured, model, ratio, role, source, ok."""
    out = []
    for m in MEASUREMENTS:
        model = m.model(params)
        ratio = model / m.value
        out.append({"case": m.case, "unit": m.unit, "measured": m.value, "model": model,
                    "ratio": ratio, "role": m.role, "source": m.source,
                    "ok": abs(ratio - 1) <= TOLERANCE})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    table = rows()
    lines = []
    for role in ("calibration", "held-out"):
        lines.append((f"-- {role} rows" + (f" (target: ratio within 1 +- {TOLERANCE:.2f})"
                                           if role == "calibration" else " (not fitted; reported only)"),))
        for r in (r for r in table if r["role"] == role):
            verdict = ("ok" if r["ok"] else "MISS") if role == "calibration" else (
                "within" if r["ok"] else "outside")
            lines.append((r["case"], r["unit"], f"{r['measured']:.4g}", f"{r['model']:.4g}",
                          f"{r['ratio']:.3f}", verdict, r["source"]))
    print(text_table((Column("case", width=66, fit=66), Column("unit", ">"), Column("measured", ">"),
                      Column("model", ">"), Column("ratio", ">"), "verdict", "source"), lines))
    cal = [r for r in table if r["role"] == "calibration"]
    worst = max(cal, key=lambda r: abs(r["ratio"] - 1))
    print(f"calibration: {sum(r['ok'] for r in cal)}/{len(cal)} within {TOLERANCE:.0%}; "
          f"worst ratio {worst['ratio']:.3f} ({worst['case']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0 if all(r["ok"] for r in cal) else 1


if __name__ == "__main__":
    sys.exit(main())
