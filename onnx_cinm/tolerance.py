"""The golden check's default tolerances (:func:`default_tolerance`), apart from the check so the
check's report (:mod:`onnx_cinm.checkreport`) reads them without loading it.

:mod:`onnx_cinm.golden` re-exports every name here and documents the tolerances (its module
docstring). Imports numpy alone.
"""
from __future__ import annotations

import numpy as np

#: The float32 default tolerances (onnxsim's ``--check-rtol``/``--check-atol`` defaults).
DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5
#: Units in the last place (at magnitude 1) a default tolerance allows at least, per dtype.
TOLERANCE_ULPS = 4


def default_tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` of the check for an output of ``dtype`` when none are given: the float32
    defaults (1e-4, 1e-5), or ``TOLERANCE_ULPS * eps(dtype)`` for both when that is larger
    (float16: 0.0039; bfloat16: 0.031). Integers, bools and strings are compared exactly
    whatever the tolerance."""
    dt = np.dtype(dtype)
    if dt.kind not in "fc":
        return DEFAULT_RTOL, DEFAULT_ATOL
    eps = float(np.finfo(dt).eps)  # complex: the eps of its parts
    wide = TOLERANCE_ULPS * eps
    return max(DEFAULT_RTOL, wide), max(DEFAULT_ATOL, wide)
