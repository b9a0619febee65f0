#!/usr/bin/env python3
"""Write the example models to a directory.

Writes every bundled example (``onnx_cinm.examples.EXAMPLES``: lenet, mlp) as ``<name>.onnx``
and, unless ``--skip-digits``, the trained scikit-learn digits MLP as ``digits_mlp.onnx`` plus
its test set ``digits_test.npz`` (``X`` float32 [450, 64], ``y`` int64 [450], ``sklearn_accuracy``).
Each model is checked with ``onnx.checker.check_model(full_check=True)`` before it is written.

Usage::

    python models/build_models.py --out build/models
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from onnx_cinm.errors import CinmError
from onnx_cinm.examples import EXAMPLES

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "models"


def _write(model: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(model, full_check=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    onnx.save(model, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the onnx-cinm example models (bundled examples + trained digits MLP).")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        choices=sorted(EXAMPLES) + ["digits_mlp"],
                        help="build only these models (default: all)")
    parser.add_argument("--skip-digits", action="store_true",
                        help="do not train the digits MLP (needs scikit-learn and skl2onnx)")
    args = parser.parse_args(argv)

    wanted = set(args.only) if args.only else set(EXAMPLES) | {"digits_mlp"}
    if args.skip_digits:
        wanted.discard("digits_mlp")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name in sorted(EXAMPLES):
            if name not in wanted:
                continue
            path = args.out / f"{name}.onnx"
            _write(EXAMPLES[name](), path)
            print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB)")
        if "digits_mlp" in wanted:
            from onnx_cinm.examples.digits import build_digits_mlp

            t0 = time.perf_counter()
            model, X_test, y_test, acc = build_digits_mlp()
            path = args.out / "digits_mlp.onnx"
            _write(model, path)
            npz = args.out / "digits_test.npz"
            np.savez(npz, X=X_test, y=y_test, sklearn_accuracy=np.float64(acc))
            print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB; scikit-learn test "
                  f"accuracy {acc:.2%}; trained in {time.perf_counter() - t0:.1f} s)")
            print(f"wrote {npz} (X {X_test.dtype}{list(X_test.shape)}, y {y_test.dtype}"
                  f"{list(y_test.shape)})")
    except CinmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
