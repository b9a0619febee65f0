"""Long differential-fuzzing run: ``tests/test_fuzz.py`` with many more examples.

Runs the eight hypothesis properties of ``tests/test_fuzz.py`` (Gemm, MatMul, Conv, Reduce,
elementwise, CumSum/TopK/Transpose/Softmax, chains, and the UPMEM emulate path) under the
``long`` profile: a random seed unless ``--seed`` is given, ``--examples`` split evenly over the
eight properties. Every example also runs on an empty batch, a batch of 3 and NaN/Inf/extreme
inputs; the emulate property builds generated C (about a second per kernel), so ``-k emulate``
with a few hundred examples is a run of its own. Prints the
examples compared, compared with at least one cinm op in the optimized model, and rejected
(onnxruntime has no kernel for the original) per property, the time,
and pytest's failure report with the minimized failing example, if any.

Usage::

    python benchmarks/fuzz.py --examples 5000 [--seed 1234]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_PROPERTIES = 8


def main(argv: list[str] | None = None) -> int:
    """Run the long fuzzing profile; exit status 0 when no example mismatched."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=5000, help="total examples (default 5000)")
    p.add_argument("--seed", type=int, help="hypothesis seed (default: random)")
    p.add_argument("-k", metavar="EXPR", help="pytest -k expression to run some properties only")
    args = p.parse_args(argv)
    os.environ["ONNX_CINM_FUZZ_PROFILE"] = "long"
    os.environ["ONNX_CINM_FUZZ_EXAMPLES"] = str(math.ceil(args.examples / N_PROPERTIES))
    import pytest

    pytest_args = [str(ROOT / "tests" / "test_fuzz.py"), "-q", "-p", "no:cacheprovider",
                   "-p", "no:warnings", "-k", args.k or "test_fuzz_", "--rootdir", str(ROOT)]
    if args.seed is not None:
        pytest_args.append(f"--hypothesis-seed={args.seed}")
    t0 = time.perf_counter()
    status = pytest.main(pytest_args)
    seconds = time.perf_counter() - t0
    module = sys.modules.get("test_fuzz")
    run = getattr(module, "EXAMPLES_RUN", {})
    rejected = getattr(module, "EXAMPLES_REJECTED", {})
    lowered = getattr(module, "EXAMPLES_LOWERED", {})
    from onnx_cinm.text import Column, table

    print()
    print(table(("property",) + tuple(Column(t, ">") for t in ("compared", "with cinm", "rejected")),
                [(n, run.get(n, 0), lowered.get(n, 0), rejected.get(n, 0))
                 for n in sorted(set(run) | set(rejected))],
                totals=[("total", sum(run.values()), sum(lowered.values()), sum(rejected.values()))]))
    print(f"{seconds:.1f} s, seed {args.seed if args.seed is not None else 'random'}, "
          f"{'no mismatches' if status == 0 else 'FAILURES (see above)'}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
