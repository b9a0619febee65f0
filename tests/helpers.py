"""Test helpers shared by all test modules (import as ``from helpers import ...``; ``tests/`` is
on ``sys.path`` because ``tests/conftest.py`` lives there and ``tests`` is not a package).

- :func:`assert_matches_ort` — the golden check as a test assertion.
- :func:`light_feeds`, :func:`load_pb` — inputs and expected outputs of the onnx wheel's
  ``backend/test/data/light`` models.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_cinm.golden import CheckReport, compare, random_inputs

__all__ = ["assert_matches_ort", "light_feeds", "load_pb", "LIGHT_DIR", "PPOCR_FILES"]

#: Where the light models live inside the installed onnx wheel.
LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"

#: PP-OCR models inside the ``rapidocr_onnxruntime`` 1.4.4 wheel (``<package>/models/``).
PPOCR_FILES = {
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
}


def assert_matches_ort(
    original,
    optimized,
    *,
    n: int = 2,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    feeds=None,
    check: bool = True,
) -> CheckReport:
    """Assert that ``optimized`` computes what ``original`` computes (stock ORT, no fusions).

    Parameters
    ----------
    original, optimized : onnx.ModelProto or path
    n, rtol, atol, seed, dims, shapes, feeds
        As in :func:`onnx_cinm.golden.compare` (``n`` defaults to 2 here).
    check : bool
        Also require ``onnx.checker.check_model(optimized, full_check=True)`` to pass.

    Returns
    -------
    CheckReport
        The passing report (for extra assertions on the error sizes).

    Raises
    ------
    AssertionError
        With the report's table when any output differs.
    """
    if check:
        target = optimized if isinstance(optimized, onnx.ModelProto) else os.fspath(optimized)
        onnx.checker.check_model(target, full_check=True)
    report = compare(original, optimized, n=n, rtol=rtol, atol=atol, seed=seed, dims=dims,
                     shapes=shapes, feeds=feeds)
    assert report.ok, f"{report.summary()}\n{report.table()}"
    return report


def light_feeds(model) -> dict[str, np.ndarray]:
    """Inputs for a light model the way ``onnx.backend.test.runner`` makes them.

    Every graph input that is not an initializer gets ``(arange(n) / n).astype(float32)``
    reshaped to its declared shape (unknown dims -> 1), n = number of elements. With these
    inputs the shipped ``light_<name>_output_<i>.pb`` files are the expected outputs.

    Parameters
    ----------
    model : onnx.ModelProto or path

    Returns
    -------
    dict[str, numpy.ndarray]
        One float32 array per real input (all nine light models have one: [1, 3, 224, 224]).
    """
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    inits = {t.name for t in proto.graph.initializer}
    shapes = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 1
                           for d in vi.type.tensor_type.shape.dim]
    return random_inputs(proto, shapes=shapes, fill="arange")


def load_pb(path) -> np.ndarray:
    """Read one serialized ``TensorProto`` file (e.g. ``light_vgg19_output_0.pb``) as numpy."""
    return numpy_helper.to_array(onnx.load_tensor(os.fspath(path)))
