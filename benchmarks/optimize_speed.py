"""Side-by-side wall time of ``onnx-cinm optimize --check 0`` and ``onnxsim`` on light CNNs.

Both run as command-line programs in fresh processes (so both pay interpreter start-up), on the
same model files from the onnx wheel, alternating, ``--repeat`` times each; the table shows the
medians and their ratio (onnx-cinm / onnxsim; below 1 means onnx-cinm is faster).

    pip install -e '.[bench]'
    python benchmarks/optimize_speed.py [--repeat 3] [--models resnet50 densenet121 vgg19] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def _time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and model")
    ap.add_argument("--models", nargs="+", default=["resnet50", "densenet121", "vgg19"])
    ap.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    args = ap.parse_args()
    cinm_exe = shutil.which("onnx-cinm") or sys.exit("onnx-cinm is not on PATH (pip install -e .)")
    sim_exe = shutil.which("onnxsim") or sys.exit("onnxsim is not on PATH (pip install -e '.[bench]')")
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for short in args.models:
            model = LIGHT_DIR / f"light_{short}.onnx"
            if not model.exists():
                sys.exit(f"no light model '{short}' in {LIGHT_DIR}")
            times = {"onnx-cinm": [], "onnxsim": []}
            for k in range(args.repeat):
                times["onnx-cinm"].append(_time([cinm_exe, "optimize", str(model), "-o",
                                                 f"{tmp}/c{k}.onnx", "--check", "0", "-q"]))
                times["onnxsim"].append(_time([sim_exe, str(model), f"{tmp}/s{k}.onnx", "0"]))
            med = {tool: statistics.median(ts) for tool, ts in times.items()}
            records.append({"model": short, "onnx_cinm_s": med["onnx-cinm"], "onnxsim_s": med["onnxsim"],
                            "ratio": med["onnx-cinm"] / med["onnxsim"], "repeat": args.repeat})
            if not args.json:
                print(f"{short:12s} onnx-cinm {med['onnx-cinm']:7.2f} s   onnxsim {med['onnxsim']:7.2f} s"
                      f"   ratio {records[-1]['ratio']:.2f}", flush=True)
    if args.json:
        print(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
